//! The pod templates of an object of the workload-kind table (SPEC.md §11, §12), judged at
//! apply time as their pods will be: found where the kind's row says, in one pass over the
//! object's text, each template then decoded on its own into the views the rules read.
//!
//! - A complete template is mutated in memory (§3–§5) and then validated (§6), in the
//!   namespace's mode; a model URI that would miss its cache gives one warning with the reason.
//! - A partial template is judged only on the fields it carries; its findings are warnings.
//! - Every finding names the template's own path (`spec.workerGroupSpecs[1].template.spec…`).
//! - An absent template is skipped; nothing is ever patched.

use std::borrow::Cow;
use std::fmt;

use serde::Deserialize;
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

use super::kinds::{Completeness, KindEntry, Shape, Step};
use super::{Context, DECODE_ADVICE, Decision, MAX_WARNING_LEN, Request, Webhook, judge, mode};
use crate::namespaces::Mode;
use crate::patch::{FieldPath, Patch};
use crate::policy::view::{self, ObjectMetaView, Str};
use crate::policy::{self, Denial, Mutation, Rule, Violation, Workload};

/// One template found in an object: where it is, which of the row's template paths found it,
/// and its text.
pub(crate) struct Found<'a> {
    pub(crate) path: FieldPath,
    pub(crate) template: usize,
    pub(crate) raw: &'a RawValue,
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
    let mut located = Located::default();
    let walk = Walk {
        entry,
        active: (0..entry.templates.len()).map(|t| (t, 0)).collect(),
        at: FieldPath::root(),
        root: true,
        out: &mut located,
    };
    let mut de = serde_json::Deserializer::from_str(text);
    walk.deserialize(&mut de)
        .and_then(|()| de.end())
        .map_err(|e| without_position(&e))?;
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

/// The walk at one value: the template paths still under way, each as (template, next step).
struct Walk<'e, 'o, 'a> {
    entry: &'e KindEntry,
    active: Vec<(usize, usize)>,
    at: FieldPath,
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
            self.out.templates.push(Found {
                path: self.at.clone(),
                template,
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
            map.next_value_seed(Walk {
                entry: self.entry,
                active,
                at: self.at.key(key.into_owned()),
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
            let walk = Walk {
                entry: self.entry,
                active: active.clone(),
                at: self.at.index(i),
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
/// changed.
pub(crate) fn changed(
    entry: &KindEntry,
    object: Option<&RawValue>,
    old: Option<&RawValue>,
) -> bool {
    let templates = |raw: Option<&RawValue>| -> Option<Vec<(String, serde_json::Value)>> {
        let located = locate(entry, raw?.get()).ok()?;
        located
            .templates
            .iter()
            .map(|f| {
                let value = serde_json::from_str(f.raw.get()).ok()?;
                Some((format!("{}#{}", f.path, f.template), value))
            })
            .collect()
    };
    match (templates(object), templates(old)) {
        (Some(new), Some(old)) => new != old,
        _ => true,
    }
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
    ) -> Option<Workload<'w>> {
        let (metadata, spec, spec_path) = match self {
            TemplateView::Template(t) => (t.metadata.as_ref(), t.spec.as_ref()?, at.key("spec")),
            TemplateView::Spec(s) => (None, s, at.clone()),
        };
        Some(Workload {
            namespace,
            restricted_namespace,
            annotations: metadata.and_then(|m| m.annotations.as_ref()),
            labels: metadata.and_then(|m| m.labels.as_ref()),
            has_metadata: metadata.is_some(),
            spec,
            meta_path: at.key("metadata"),
            spec_path,
        })
    }
}

/// The denial of a template that does not decode as its shape, naming the field.
fn undecodable(entry: &KindEntry, at: &FieldPath, failure: view::DecodeFailure) -> Denial {
    let inner = if failure.path == "." {
        String::new()
    } else {
        format!(".{}", failure.path)
    };
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
    /// Of partial templates: warnings, never denials.
    partial: Vec<Violation>,
}

/// The decision for a CREATE or UPDATE of an object of a table kind (SPEC.md §11, §12).
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
    let namespace = match &located {
        Ok(l) => l
            .metadata
            .as_ref()
            .and_then(|m| m.namespace.as_deref())
            .filter(|n| !n.is_empty())
            .unwrap_or(req.namespace.as_str()),
        Err(_) => req.namespace.as_str(),
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
    let located = locate(entry, text).map_err(|message| {
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
}

/// Every template judged, each by its completeness.
fn judge_all(entry: &KindEntry, located: &Located, scope: &Scope) -> Findings {
    let mut findings = Findings::default();
    for found in &located.templates {
        let partial = entry.templates[found.template].completeness == Completeness::Partial;
        match judge_one(entry, found, scope) {
            Ok(miss) => findings.miss_warnings.extend(miss),
            Err(denial) if partial => findings.partial.extend(denial.violations),
            Err(denial) => findings.violations.extend(denial.violations),
        }
    }
    findings
}

/// One template, by its row's shape and completeness: `Ok` with a cache-miss warning, if any,
/// or the denial its pods would get.
fn judge_one(entry: &KindEntry, found: &Found, scope: &Scope) -> Result<Option<String>, Denial> {
    let Scope {
        namespace,
        restricted,
        enforce,
        ctx,
    } = *scope;
    let template = &entry.templates[found.template];
    let shape = template.shape;
    let decoded = TemplateView::decode(shape, found.raw.get())
        .map_err(|f| undecodable(entry, &found.path, f))?;
    let Some(workload) = decoded.workload(&found.path, namespace, restricted) else {
        return Ok(None);
    };
    if template.completeness == Completeness::Partial {
        return policy::validate_present(&workload, ctx.config).map(|()| None);
    }
    // The template as its pods will be created: mutated in memory, then judged.
    let mutation = judge(Webhook::Mutate, false, &workload, ctx)?;
    let miss = mutation.miss_warning.clone();
    if mutation.patch.is_empty() {
        return judge(Webhook::Validate, false, &workload, ctx).map(|_| miss);
    }
    let patch = mutation.patch.into_patch();
    // Its pods would be denied for the size of their patch where the mutation is enforced
    // (elsewhere they are not patched at all); nothing is left to apply then.
    if enforce
        && let Some(denial) =
            mode::patch_too_large(patch.as_bytes().len(), &workload.spec_path.to_string())
    {
        return Err(denial);
    }
    let Some(patched) = apply_to_template(&found.path, found.raw, &patch) else {
        // The patch was built against this very template; failing to apply it is a bug, and
        // judging the template as it came is the honest fallback.
        return judge(Webhook::Validate, false, &workload, ctx).map(|_| miss);
    };
    let decoded = TemplateView::decode(shape, patched.get())
        .map_err(|f| undecodable(entry, &found.path, f))?;
    match decoded.workload(&found.path, namespace, restricted) {
        Some(workload) => judge(Webhook::Validate, false, &workload, ctx).map(|_| miss),
        None => Ok(miss),
    }
}

/// The template with the mutation applied: the patch names fields from the object's root, so
/// each operation is moved under the template's own pointer first (on the decoded operations:
/// no tree of them is built).
fn apply_to_template(at: &FieldPath, raw: &RawValue, patch: &Patch) -> Option<Box<RawValue>> {
    use json_patch::PatchOperation as Op;
    use json_patch::jsonptr::PointerBuf;
    let prefix = at.pointer();
    let under = |pointer: &mut PointerBuf| -> Option<()> {
        let inner = pointer.as_str().strip_prefix(prefix.as_str())?;
        if !(inner.is_empty() || inner.starts_with('/')) {
            return None;
        }
        *pointer = PointerBuf::parse(inner).ok()?;
        Some(())
    };
    let mut operations = patch.try_operations().ok()?;
    for op in operations.0.iter_mut() {
        match op {
            Op::Add(o) => under(&mut o.path)?,
            Op::Remove(o) => under(&mut o.path)?,
            Op::Replace(o) => under(&mut o.path)?,
            Op::Test(o) => under(&mut o.path)?,
            Op::Move(o) => {
                under(&mut o.from)?;
                under(&mut o.path)?
            }
            Op::Copy(o) => {
                under(&mut o.from)?;
                under(&mut o.path)?
            }
        }
    }
    let mut template: serde_json::Value = serde_json::from_str(raw.get()).ok()?;
    json_patch::patch(&mut template, &operations).ok()?;
    serde_json::value::to_raw_value(&template).ok()
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
            TemplateAt {
                path: f.path.to_string(),
                pointer: f.path.pointer(),
                shape: template.shape,
                completeness: template.completeness,
                text: f.raw.get(),
            }
        })
        .collect())
}

/// What the partial templates of `object` say that their pods would be denied for (SPEC.md
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
    };
    let mut out = Vec::new();
    for found in &located.templates {
        let template = &entry.templates[found.template];
        if template.completeness != Completeness::Partial {
            continue;
        }
        if let Err(denial) = judge_one(entry, found, &scope) {
            out.extend(denial.violations);
        }
    }
    out
}
