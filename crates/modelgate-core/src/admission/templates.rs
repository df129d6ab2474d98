//! The pod templates of an object of the workload-kind table (docs/policy.md §11, §12), judged at
//! apply time as their pods will be: found where the kind's row says, in one pass over the
//! object's text, each template then decoded on its own into the views the rules read.
//!
//! - A complete template is mutated in memory (§3–§5) and then validated (§6), in the
//!   namespace's mode; a model URI that would miss its cache gives one warning with the reason.
//! - A partial template is judged only on the fields it carries; its findings are warnings,
//!   but for one whose lists pass what an object the API server stores can hold: the object
//!   itself cannot be stored, and is denied as too large (`view::metered`).
//! - Every finding names the template's own path (`spec.workerGroupSpecs[1].template.spec…`).
//! - An absent template is skipped; nothing is ever patched.

use std::borrow::Cow;
use std::fmt;

use serde::Deserialize;
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

use super::{Context, DECODE_ADVICE, Decision, MAX_WARNING_LEN, Request, Webhook, judge, mode};
use crate::cache::CacheIndex;
use crate::kinds::{Completeness, KindEntry, Shape, Step};
use crate::namespaces::Mode;
use crate::patch::{FieldPath, apply};
use crate::policy::view::{self, ObjectMetaView, Str};
use crate::policy::{self, Denial, Mutation, Rule, Violation, Workload};

/// One template found in an object: which of the row's template paths found it, where (the
/// key or index its path took at each `*` and `[*]`: the rest of the path is the row's), and
/// its text. A few dozen bytes, borrowing from the object's text: an object of many small
/// templates holds little more than its text ([`Found::path`] is built when it is needed).
pub(crate) struct Found<'a> {
    pub(crate) template: usize,
    choices: Box<[Seg<'a>]>,
    pub(crate) raw: &'a RawValue,
}

/// One step of a path in an object: a member's key (borrowed unless it held an escape) or an
/// element's index.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Seg<'a> {
    Key(Cow<'a, str>),
    Index(usize),
}

impl Found<'_> {
    /// Where the template is in the object: the row's path with the keys and indices taken.
    pub(crate) fn path(&self, entry: &KindEntry) -> FieldPath {
        let mut choices = self.choices.iter();
        let mut path = FieldPath::root();
        for step in &entry.templates[self.template].steps {
            path = match step {
                Step::Key(k) => path.key(k.clone()),
                Step::EveryElement | Step::EveryValue => match choices.next() {
                    Some(Seg::Key(k)) => path.key(k.to_string()),
                    Some(Seg::Index(i)) => path.index(*i),
                    None => path,
                },
            };
        }
        path
    }
}

/// What the judgment reads of an object of a table kind.
#[derive(Default)]
pub(crate) struct Located<'a> {
    pub(crate) kind: Option<Str<'a>>,
    pub(crate) metadata: Option<ObjectMetaView<'a>>,
    pub(crate) templates: Vec<Found<'a>>,
}

/// Finds the templates of `entry` in the object `text`, with the object's `kind` and
/// `metadata`, in one pass (a template path that continues below another template reads that
/// template's text again). A path that meets `null`, a missing key or a value of another type
/// finds nothing there.
pub(crate) fn locate<'a>(entry: &KindEntry, text: &'a str) -> Result<Located<'a>, String> {
    located_within_bound(entry, text).map_err(|failure| match failure {
        Unlocated::Syntax(message) => message,
        Unlocated::TooLarge(failure) => format!("metadata.{}: {}", failure.path, failure.message),
    })
}

/// Why an object's templates could not be found.
enum Unlocated {
    /// Not JSON, or not an object where the row says one is.
    Syntax(String),
    /// Its metadata's maps hold more entries than an object the API server stores can.
    TooLarge(view::DecodeFailure),
}

/// [`locate`], within the bound of one object for what it keeps besides the templates' text
/// (the object's `metadata`: `view::metered`).
fn located_within_bound<'a>(entry: &KindEntry, text: &'a str) -> Result<Located<'a>, Unlocated> {
    let mut located = Located::default();
    let walk = Walk {
        entry,
        active: (0..entry.templates.len()).map(|t| (t, 0)).collect(),
        at: Vec::new(),
        root: true,
        out: &mut located,
    };
    let mut de = serde_json::Deserializer::from_str(text);
    let (walked, too_large) = view::metered(|| walk.deserialize(&mut de));
    if let Some(too_large) = too_large {
        return Err(Unlocated::TooLarge(too_large));
    }
    walked
        .and_then(|()| de.end())
        .map_err(|e| Unlocated::Syntax(without_position(&e)))?;
    Ok(located)
}

fn without_position(e: &serde_json::Error) -> String {
    let message = e.to_string();
    let position = format!(" at line {} column {}", e.line(), e.column());
    message
        .strip_suffix(&position)
        .unwrap_or(&message)
        .to_string()
}

/// The walk at one value: the template paths still under way, each as (template, next step),
/// and the keys and indices that led here.
struct Walk<'e, 'o, 'a> {
    entry: &'e KindEntry,
    active: Vec<(usize, usize)>,
    at: Vec<Seg<'a>>,
    root: bool,
    out: &'o mut Located<'a>,
}

impl Walk<'_, '_, '_> {
    fn step(&self, (template, at): (usize, usize)) -> Option<&Step> {
        self.entry.templates[template].steps.get(at)
    }

    /// The paths that go on into the member `key`.
    fn going_into_key(&self, key: &str) -> Vec<(usize, usize)> {
        self.active
            .iter()
            .filter(|&&a| match self.step(a) {
                Some(Step::Key(k)) => k == key,
                Some(Step::EveryValue) => true,
                _ => false,
            })
            .map(|&(t, at)| (t, at + 1))
            .collect()
    }

    fn going_into_elements(&self) -> Vec<(usize, usize)> {
        self.active
            .iter()
            .filter(|&&a| self.step(a) == Some(&Step::EveryElement))
            .map(|&(t, at)| (t, at + 1))
            .collect()
    }
}

impl<'de: 'a, 'a> DeserializeSeed<'de> for Walk<'_, '_, 'a> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        let (ends, go_on): (Vec<_>, Vec<_>) = self
            .active
            .iter()
            .copied()
            .partition(|&a| self.step(a).is_none());
        if ends.is_empty() {
            return d.deserialize_any(self);
        }
        let raw = <&'de RawValue>::deserialize(d)?;
        if raw.get() == "null" {
            return Ok(());
        }
        for (template, _) in ends {
            // Only what the row's path does not say: the keys and indices at its wildcards.
            let steps = &self.entry.templates[template].steps;
            let choices = steps
                .iter()
                .zip(&self.at)
                .filter(|(step, _)| !matches!(step, Step::Key(_)))
                .map(|(_, seg)| seg.clone())
                .collect();
            self.out.templates.push(Found {
                template,
                choices,
                raw,
            });
        }
        if !go_on.is_empty() {
            let mut de = serde_json::Deserializer::from_str(raw.get());
            Walk {
                active: go_on,
                root: false,
                ..self
            }
            .deserialize(&mut de)
            .map_err(de::Error::custom)?;
        }
        Ok(())
    }
}

impl<'de: 'a, 'a> Visitor<'de> for Walk<'_, '_, 'a> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            if self.root && key == "kind" {
                self.out.kind = map.next_value()?;
                continue;
            }
            if self.root && key == "metadata" {
                self.out.metadata = map.next_value()?;
                continue;
            }
            let active = self.going_into_key(&key);
            if active.is_empty() {
                map.next_value::<IgnoredAny>()?;
                continue;
            }
            let mut at = Vec::with_capacity(self.at.len() + 1);
            at.extend(self.at.iter().cloned());
            at.push(Seg::Key(key));
            map.next_value_seed(Walk {
                entry: self.entry,
                active,
                at,
                root: false,
                out: &mut *self.out,
            })?;
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let active = self.going_into_elements();
        if active.is_empty() {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            return Ok(());
        }
        let mut i = 0;
        loop {
            let mut at = Vec::with_capacity(self.at.len() + 1);
            at.extend(self.at.iter().cloned());
            at.push(Seg::Index(i));
            let walk = Walk {
                entry: self.entry,
                active: active.clone(),
                at,
                root: false,
                out: &mut *self.out,
            };
            if seq.next_element_seed(walk)?.is_none() {
                return Ok(());
            }
            i += 1;
        }
    }

    // Anything else holds no template.
    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_none<E>(self) -> Result<(), E> {
        Ok(())
    }
}

/// Whether an UPDATE changed any template (compared as JSON values, so that key order does not
/// count); without an old object to compare with, or one that cannot be read, it counts as
/// changed. Texts that differ are compared in their [`canonical`] form, never as trees.
pub(crate) fn changed(
    entry: &KindEntry,
    object: Option<&RawValue>,
    old: Option<&RawValue>,
) -> bool {
    fn templates_in<'a>(entry: &KindEntry, raw: Option<&'a RawValue>) -> Option<Vec<Found<'a>>> {
        Some(locate(entry, raw?.get()).ok()?.templates)
    }
    let (Some(new), Some(old)) = (templates_in(entry, object), templates_in(entry, old)) else {
        return true;
    };
    new.len() != old.len()
        || new.iter().zip(&old).any(|(new, old)| {
            let (new_text, old_text) = (new.raw.get(), old.raw.get());
            (new.template, &new.choices) != (old.template, &old.choices)
                || (new_text != old_text
                    && canonical(new_text).is_none_or(|n| Some(n) != canonical(old_text)))
        })
}

/// The text of a JSON value in one form per value, as `serde_json::Value` compares values:
/// object members sorted by key, each key once (its last value), no whitespace, strings and
/// numbers as serde_json writes them (`1` and `1.0` stay apart, as in a `Value`). Holds the
/// canonical text of the members of the objects open at a time (at most about twice the
/// text), never a tree.
pub(super) fn canonical(text: &str) -> Option<String> {
    let mut de = serde_json::Deserializer::from_str(text);
    let out = Canonical.deserialize(&mut de).ok()?;
    de.end().ok()?;
    Some(out)
}

/// Reads one value into its [`canonical`] text.
#[derive(Clone, Copy)]
struct Canonical;

impl<'de> DeserializeSeed<'de> for Canonical {
    type Value = String;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<String, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Canonical {
    type Value = String;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<String, A::Error> {
        let mut members: Vec<(Cow<'de, str>, String)> = Vec::new();
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            members.push((key, map.next_value_seed(Canonical)?));
        }
        crate::keyed::sort_keeping_last(&mut members);
        let mut out = String::from("{");
        for (i, (key, value)) in members.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(&json_text(key.as_ref()));
            out.push(':');
            out.push_str(value);
        }
        out.push('}');
        Ok(out)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<String, A::Error> {
        let mut out = String::from("[");
        while let Some(element) = seq.next_element_seed(Canonical)? {
            if out.len() > 1 {
                out.push(',');
            }
            out.push_str(&element);
        }
        out.push(']');
        Ok(out)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
        Ok(json_text(v))
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<String, E> {
        Ok(json_text(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<String, E> {
        Ok(json_text(v))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<String, E> {
        Ok(json_text(v))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<String, E> {
        Ok(json_text(v))
    }
    fn visit_unit<E: de::Error>(self) -> Result<String, E> {
        Ok("null".into())
    }
}

/// A scalar as serde_json writes it (writing a scalar cannot fail).
fn json_text(v: impl serde::Serialize) -> String {
    serde_json::to_string(&v).unwrap_or_default()
}

/// A decoded template, borrowing from the object's text (or from the mutated copy).
enum TemplateView<'a> {
    Template(view::PodTemplateOf<'a, view::InitContainerView<'a>>),
    Spec(view::PodSpecView<'a>),
}

impl<'a> TemplateView<'a> {
    fn decode(shape: Shape, text: &'a str) -> Result<Self, view::DecodeFailure> {
        match shape {
            Shape::PodTemplateSpec => view::decode_pod_template(text).map(TemplateView::Template),
            Shape::PodSpec => view::decode_pod_spec(text).map(TemplateView::Spec),
        }
    }

    /// The pod the rules judge, `None` for a template without a spec (nothing to judge).
    fn workload<'w>(
        &'w self,
        at: &FieldPath,
        namespace: &'w str,
        restricted_namespace: bool,
        claims: &'w CacheIndex,
        exceptions: crate::exceptions::InScope<'w>,
    ) -> Option<Workload<'w>> {
        let (metadata, spec, spec_path) = match self {
            TemplateView::Template(t) => (t.metadata.as_ref(), t.spec.as_ref()?, at.key("spec")),
            TemplateView::Spec(s) => (None, s, at.clone()),
        };
        Some(Workload {
            namespace,
            restricted_namespace,
            claims: Some(claims),
            prep_withheld: Default::default(),
            annotations: metadata.and_then(|m| m.annotations.as_ref()),
            object_annotations: None,
            labels: metadata.and_then(|m| m.labels.as_ref()),
            has_metadata: metadata.is_some(),
            spec,
            meta_path: at.key("metadata"),
            spec_path,
            exceptions,
            waivers: Default::default(),
        })
    }
}

/// The denial of a template that does not decode as its shape, naming the field (or of one
/// whose lists hold more elements than an object the API server stores can, naming the list).
fn undecodable(entry: &KindEntry, at: &FieldPath, failure: view::DecodeFailure) -> Denial {
    let inner = if failure.path == "." {
        String::new()
    } else {
        format!(".{}", failure.path)
    };
    if failure.too_large {
        return mode::too_large(&format!("{at}{inner}"), &failure);
    }
    let field = policy::shorten_uri(&format!("{at}{inner}"), MAX_WARNING_LEN).into_owned();
    Denial::single(
        Rule::Schema,
        field,
        format!(
            "cannot be decoded as a {}: {}",
            entry.kind,
            policy::shorten_uri(&failure.message, MAX_WARNING_LEN)
        ),
        DECODE_ADVICE,
    )
}

/// What judging every template gave.
#[derive(Default)]
struct Findings {
    /// Of complete templates: the denial the object gets.
    violations: Vec<Violation>,
    /// Of complete templates: model URIs that would miss their cache.
    miss_warnings: Vec<String>,
    /// Of partial templates: warnings, never denials (but for one too large to be stored,
    /// whose violation is among `violations`).
    partial: Vec<Violation>,
}

/// The decision for a CREATE or UPDATE of an object of a table kind (docs/policy.md §11, §12).
pub(super) fn decide(
    webhook: Webhook,
    req: &Request,
    entry: &KindEntry,
    object: Option<&RawValue>,
    ctx: &Context,
) -> Decision {
    if webhook == Webhook::Mutate {
        // Never patched: the pods are mutated when they are created.
        return Decision::allow();
    }
    let create = req.operation == "CREATE" && req.sub_resource.is_none();
    let update = req.operation == "UPDATE" && req.sub_resource.is_none();
    if !(create || update) || ctx.config.is_exempt(&req.namespace) {
        return Decision::allow();
    }
    let Some(object) = object else {
        return Decision::invalid(format!(
            "request.object is missing on {} of a {}",
            req.operation, entry.kind
        ));
    };
    let located = located(entry, object);
    let from = super::namespace_of(
        &req.namespace,
        located.as_ref().ok().and_then(object_namespace),
    );
    let (located, from_object) = match from {
        super::NamespaceOf::Mismatch(denial) => (Err(denial), false),
        super::NamespaceOf::Object => (located, true),
        super::NamespaceOf::Request => (located, false),
    };
    let namespace = match &located {
        Ok(l) if from_object => object_namespace(l).unwrap_or_default(),
        _ => req.namespace.as_str(),
    };
    let name = located.as_ref().ok().and_then(|l| {
        let meta = l.metadata.as_ref()?;
        meta.name
            .as_deref()
            .filter(|n| !n.is_empty())
            .or(meta.generate_name.as_deref())
            .map(str::to_string)
    });
    let unchanged = || update && !changed(entry, Some(object), req.old_object.as_deref());
    if ctx.config.is_exempt(namespace) || unchanged() {
        let mut d = Decision::allow();
        d.object_namespace = Some(namespace.to_string());
        d.object_name = name;
        return d;
    }
    let ns_mode = ctx.namespaces.mode(namespace, ctx.config.default_mode);
    let mut decision = if ns_mode.mode == Mode::Off {
        mode::off()
    } else {
        let scope = Scope {
            namespace,
            restricted: ctx
                .namespaces
                .enforces_restricted(namespace, ctx.config.pod_security_default),
            enforce: ns_mode.mode == Mode::Enforce,
            ctx,
            exceptions: super::exceptions_in(ctx, namespace),
            used: Default::default(),
        };
        let findings = located
            .as_ref()
            .map_err(Clone::clone)
            .map(|l| judge_all(entry, l, &scope));
        let (verdict, warnings) = match findings {
            Err(denial) => (Err(denial), Vec::new()),
            Ok(f) => {
                // One warning per miss: templates of one object that name the same model (a
                // head and its workers) would all say the same.
                let mut warnings: Vec<String> = Vec::new();
                for w in f.miss_warnings {
                    if !warnings.contains(&w) {
                        warnings.push(w);
                    }
                }
                warnings.extend(f.partial.iter().map(partial_warning));
                let verdict = if f.violations.is_empty() {
                    Ok(Mutation::default())
                } else {
                    Err(Denial {
                        violations: f.violations,
                    })
                };
                (verdict, warnings)
            }
        };
        let mut d = mode::answer(ns_mode, verdict);
        if matches!(d.mode, Some(Mode::Enforce | Mode::Warn)) {
            d.warnings.extend(warnings);
        }
        super::note_exceptions(&mut d, scope.used.into_inner());
        d
    };
    decision.object_namespace = Some(namespace.to_string());
    decision.object_name = name;
    decision
}

/// A partial template's finding, as the warning it gives.
fn partial_warning(v: &Violation) -> String {
    format!(
        "{v} (a partial template: not denied here, but a pod that keeps it is denied when it is \
         created)"
    )
}

/// The object's templates found, or the denial that it is not an object of its kind.
/// The namespace the object's metadata names, if any.
fn object_namespace<'l>(l: &'l Located) -> Option<&'l str> {
    l.metadata
        .as_ref()
        .and_then(|m| m.namespace.as_deref())
        .filter(|n| !n.is_empty())
}

fn located<'a>(entry: &KindEntry, object: &'a RawValue) -> Result<Located<'a>, Denial> {
    let fail =
        |field: &str, problem: String| Denial::single(Rule::Schema, field, problem, DECODE_ADVICE);
    let text = object.get();
    if !text.trim_start().starts_with('{') {
        return Err(fail(
            "request.object",
            format!("cannot be decoded as a {}: not an object", entry.kind),
        ));
    }
    let located = located_within_bound(entry, text).map_err(|failure| {
        let message = match failure {
            Unlocated::Syntax(message) => message,
            // Only the object's metadata is decoded here.
            Unlocated::TooLarge(failure) => {
                return mode::too_large(&format!("metadata.{}", failure.path), &failure);
            }
        };
        fail(
            "request.object",
            format!(
                "cannot be decoded as a {}: {}",
                entry.kind,
                policy::shorten_uri(&message, MAX_WARNING_LEN)
            ),
        )
    })?;
    if let Some(found) = located.kind.as_deref()
        && found != entry.kind
    {
        return Err(fail(
            "request.object.kind",
            format!(
                "the object is a {found}, but the request is for a {}",
                entry.kind
            ),
        ));
    }
    Ok(located)
}

/// Where an object's templates are judged: its namespace and what that namespace asks.
struct Scope<'s, 'c> {
    namespace: &'s str,
    /// Pod Security `restricted` is enforced there.
    restricted: bool,
    /// The mutation is enforced there (`enforce` mode), so its pods are patched.
    enforce: bool,
    ctx: &'s Context<'c>,
    /// The exceptions in force in the namespace, and those the templates used (each once).
    exceptions: crate::exceptions::InScope<'c>,
    used: std::cell::RefCell<Vec<crate::exceptions::ExceptionUse>>,
}

impl Scope<'_, '_> {
    fn note_uses(&self, w: &Workload) {
        if self.exceptions.is_empty() {
            return;
        }
        let mut used = self.used.borrow_mut();
        for u in super::uses(w) {
            if !used.contains(&u) {
                used.push(u);
            }
        }
    }
}

/// Every template judged, each by its completeness.
fn judge_all(entry: &KindEntry, located: &Located, scope: &Scope) -> Findings {
    let mut findings = Findings::default();
    for found in &located.templates {
        let partial = entry.templates[found.template].completeness == Completeness::Partial;
        match judge_one(entry, found, scope) {
            Ok(miss) => findings.miss_warnings.extend(miss),
            Err(r) if partial && !r.unstorable => findings.partial.extend(r.denial.violations),
            Err(r) => findings.violations.extend(r.denial.violations),
        }
    }
    findings
}

/// Why a template is refused: the denial its pods would get, or that its lists pass what an
/// object the API server stores can hold (`unstorable`: refused whatever the template's
/// completeness, since the object itself cannot be stored).
struct Refused {
    denial: Denial,
    unstorable: bool,
}

impl From<Denial> for Refused {
    fn from(denial: Denial) -> Self {
        Refused {
            denial,
            unstorable: false,
        }
    }
}

/// One template, by its row's shape and completeness: `Ok` with a cache-miss warning, if any,
/// or why it is refused.
fn judge_one(entry: &KindEntry, found: &Found, scope: &Scope) -> Result<Option<String>, Refused> {
    let Scope {
        namespace,
        restricted,
        enforce,
        ctx,
        exceptions,
        ..
    } = *scope;
    let template = &entry.templates[found.template];
    let shape = template.shape;
    let at = found.path(entry);
    let decoded = TemplateView::decode(shape, found.raw.get()).map_err(|f| Refused {
        unstorable: f.too_large,
        denial: undecodable(entry, &at, f),
    })?;
    let Some(workload) =
        decoded.workload(&at, namespace, restricted, ctx.caches.index(), exceptions)
    else {
        return Ok(None);
    };
    scope.note_uses(&workload);
    if template.completeness == Completeness::Partial {
        return Ok(policy::validate_present(&workload, ctx.config).map(|()| None)?);
    }
    // The template as its pods will be created: mutated in memory, then judged.
    let mutation = judge(Webhook::Mutate, None, &workload, ctx)?;
    if mutation.patch.is_empty() {
        let miss = mutation.miss_warning;
        return Ok(judge(Webhook::Validate, None, &workload, ctx).map(|_| miss)?);
    }
    // Only the patch and the miss are kept: the account of the changes goes now.
    let Mutation {
        patch,
        miss_warning: miss,
        ..
    } = { mutation };
    let patch = patch.into_patch();
    // Its pods would be denied for the size of their patch where the mutation is enforced
    // (elsewhere they are not patched at all); nothing is left to apply then.
    if enforce && let Some(denial) = mode::patch_too_large(&patch, &workload.spec_path.to_string())
    {
        return Err(denial.into());
    }
    // Applied to the template's text, opening only what the patch touches (never a tree of the
    // whole template). A patch that passed its bound was not built to the end (where it is not
    // enforced, the template is judged as it came, as its pods will be created); one that does
    // not apply would be a bug, and judging the template as it came is the honest fallback.
    let Some(patched) = apply::apply(found.raw.get(), &patch, &at.pointer()) else {
        return Ok(judge(Webhook::Validate, None, &workload, ctx).map(|_| miss)?);
    };
    // The template as it came is judged no more: its views go before the patched one's come.
    drop(workload);
    drop(decoded);
    drop(patch);
    let decoded = TemplateView::decode(shape, &patched).map_err(|f| undecodable(entry, &at, f))?;
    match decoded.workload(&at, namespace, restricted, ctx.caches.index(), exceptions) {
        Some(workload) => Ok(judge(Webhook::Validate, None, &workload, ctx).map(|_| miss)?),
        None => Ok(miss),
    }
}

/// A template of an object, as `audit` evaluates it: through the pods made from it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TemplateAt<'a> {
    /// Its path in messages (`spec.workerGroupSpecs[1].template`).
    pub path: String,
    /// Its JSON pointer (`/spec/workerGroupSpecs/1/template`).
    pub pointer: String,
    pub shape: Shape,
    pub completeness: Completeness,
    /// Its text, as in the object.
    pub text: &'a str,
}

/// The templates of `object` (a JSON text of the kind of `entry`), in the order found; an
/// error says why the object cannot be read.
pub fn templates_of<'a>(entry: &KindEntry, object: &'a str) -> Result<Vec<TemplateAt<'a>>, String> {
    let located = locate(entry, object)?;
    Ok(located
        .templates
        .into_iter()
        .map(|f| {
            let template = &entry.templates[f.template];
            let at = f.path(entry);
            TemplateAt {
                path: at.to_string(),
                pointer: at.pointer(),
                shape: template.shape,
                completeness: template.completeness,
                text: f.raw.get(),
            }
        })
        .collect())
}

/// What the partial templates of `object` say that their pods would be denied for (docs/policy.md
/// §12: findings that are warnings, never denials), each named by its path.
pub fn partial_findings(
    entry: &KindEntry,
    object: &str,
    namespace: &str,
    ctx: &Context,
) -> Vec<Violation> {
    let Ok(located) = locate(entry, object) else {
        return Vec::new();
    };
    let scope = Scope {
        namespace,
        restricted: ctx
            .namespaces
            .enforces_restricted(namespace, ctx.config.pod_security_default),
        // Partial templates are judged on their fields alone, never mutated.
        enforce: false,
        ctx,
        exceptions: super::exceptions_in(ctx, namespace),
        used: Default::default(),
    };
    let mut out = Vec::new();
    for found in &located.templates {
        let template = &entry.templates[found.template];
        if template.completeness != Completeness::Partial {
            continue;
        }
        if let Err(refused) = judge_one(entry, found, &scope) {
            out.extend(refused.denial.violations);
        }
    }
    out
}
