//! The admission policy of docs/policy.md §3–§6, as pure functions: a decoded workload and the
//! configuration in, a patch and warnings or a denial out. No I/O, no clock, no globals.
//!
//! - [`nonroot`]: non-root, numeric users (§3)
//! - [`cache_prep`]: the `model-cache-prep` init container (§4)
//! - [`model_cache`]: model URI resolution against node-local caches (§5)
//! - [`validate`]: what is denied (§6)
//! - [`identity_webhooks`]: the skip annotations of the identity webhooks, for the prep
//! - [`root_equivalent`]: containers that reach uid 0 whatever their uid, warned of

pub(crate) mod cache_prep;
pub(crate) mod identity_webhooks;
pub mod model_cache;
mod nonroot;
pub(crate) mod root_equivalent;
mod validate;
pub mod view;
mod workload;

use std::borrow::Cow;
use std::fmt;

pub use model_cache::Caches;
pub use nonroot::SET_BY_POLICY;
pub(crate) use nonroot::{POD_FIELDS, container_entry, pod_entry};
pub use root_equivalent::Findings;
pub use validate::{Checks, Denial, Violation};
pub(crate) use validate::{EphemeralScope, StoredEphemeral};
pub(crate) use workload::ContainerList;
pub(crate) use workload::Workload;

use crate::cache::{MissReason, Resolved};
use crate::config::{PREP_CONTAINER, PolicyConfig};
use crate::patch::{FieldPath, PatchBuilder};

/// The longest warning the API server passes on whole, in bytes (it truncates longer ones).
pub const MAX_WARNING_LEN: usize = 256;

/// The most entries a list that grows with the request names (docs/policy.md §7): the violations in a
/// denial's message, the warnings of an answer, the facts of an audit annotation. The rest are
/// counted, never listed.
pub const MAX_LISTED: usize = 20;

/// The first [`MAX_LISTED`] of `items`, separated by `sep`, then `<sep>… and <n> more` when there
/// were more. Only the listed ones are rendered.
pub(crate) fn write_listed<T: fmt::Display>(
    out: &mut impl fmt::Write,
    items: impl ExactSizeIterator<Item = T>,
    sep: &str,
) -> fmt::Result {
    let total = items.len();
    for (i, item) in items.take(MAX_LISTED).enumerate() {
        if i > 0 {
            out.write_str(sep)?;
        }
        write!(out, "{item}")?;
    }
    if total > MAX_LISTED {
        write!(out, "{sep}… and {} more", total - MAX_LISTED)?;
    }
    Ok(())
}

/// [`write_listed`] into a new string.
pub(crate) fn listed<T: fmt::Display>(
    items: impl ExactSizeIterator<Item = T>,
    sep: &str,
) -> String {
    let mut out = String::new();
    // Writing into a `String` cannot fail.
    let _ = write_listed(&mut out, items, sep);
    out
}

/// `uri` cut in the middle (`hf://org/…/model.safetensors`) to at most `room` bytes, so that a
/// warning naming a cache keeps the cache's name whole: the URI is what gives way.
pub(crate) fn shorten_uri(uri: &str, room: usize) -> Cow<'_, str> {
    const ELLIPSIS: &str = "…";
    if uri.len() <= room {
        return Cow::Borrowed(uri);
    }
    let keep = room.saturating_sub(ELLIPSIS.len());
    let mut head = keep.div_ceil(2);
    while !uri.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = uri.len() - (keep - head);
    while !uri.is_char_boundary(tail) {
        tail += 1;
    }
    Cow::Owned(format!("{}{ELLIPSIS}{}", &uri[..head], &uri[tail..]))
}

/// The rule of docs/policy.md that a change or a violation comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Rule {
    /// §3: non-root, numeric users (and the uid/gid ranges of §6).
    NonRoot,
    /// §4: the `model-cache-prep` init container and the fsGroup it relies on.
    CachePrep,
    /// §5: model URI resolution against node-local caches.
    ModelCache,
    /// §6: the object does not decode as the kind the request names.
    Schema,
    /// A container that can reach uid 0 whatever its uid (`privileged: true`), with the
    /// validation rules in docs/policy.md. Only warned of, never patched nor denied: Pod
    /// Security `baseline` is what refuses it.
    RootEquivalent,
}

impl Rule {
    pub const ALL: [Rule; 5] = [
        Rule::NonRoot,
        Rule::CachePrep,
        Rule::ModelCache,
        Rule::Schema,
        Rule::RootEquivalent,
    ];

    /// A stable name for reports and labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Rule::NonRoot => "non-root",
            Rule::CachePrep => "cache-prep",
            Rule::ModelCache => "model-cache",
            Rule::Schema => "schema",
            Rule::RootEquivalent => "root-equivalent",
        }
    }

    /// The rule never changes an object nor denies one: its findings are warnings only (so
    /// counts of what would be patched or denied leave it out).
    pub fn warns_only(self) -> bool {
        matches!(self, Rule::RootEquivalent)
    }

    /// The section of docs/policy.md that states the rule.
    pub fn section(self) -> &'static str {
        match self {
            Rule::NonRoot => "§3",
            Rule::CachePrep => "§4",
            Rule::ModelCache => "§5",
            Rule::Schema | Rule::RootEquivalent => "§6",
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One thing the mutation changes, with the rule it comes from. What it does is kept as data
/// and put in words only when a report asks ([`Change::description`]): `enforce` never needs
/// the words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    pub rule: Rule,
    what: What,
    /// The warning the change gets when it is applied, for the changes a user must hear about.
    pub applied_warning: Option<String>,
}

/// What a change does, as the data its description is rendered from.
#[derive(Clone, Debug, PartialEq, Eq)]
enum What {
    /// `set <path>=<value>`
    Set { path: FieldPath, value: Scalar },
    /// `replace model-cache-prep by the canonical one for this pod`
    ReplacePrep,
    /// `inject model-cache-prep`
    InjectPrep,
    /// `add model-cache-prep to <annotation>` (an identity webhook's skip annotation)
    SkipPrepIn { annotation: &'static str },
    /// `mount <uri> from <cache>` (the URI shortened as the warning shows it)
    Mount { uri: String, source: String },
    /// `record a model cache miss for <uri> (modelgate.io/model-cache: miss, …: <reason>)`
    RecordMiss { uri: String, reason: MissReason },
}

impl fmt::Display for What {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            What::Set { path, value } => write!(f, "set {path}={value}"),
            What::ReplacePrep => write!(
                f,
                "replace {PREP_CONTAINER} by the canonical one for this pod"
            ),
            What::InjectPrep => write!(f, "inject {PREP_CONTAINER}"),
            What::SkipPrepIn { annotation } => write!(f, "add {PREP_CONTAINER} to {annotation}"),
            What::Mount { uri, source } => write!(f, "mount {uri} from {source}"),
            What::RecordMiss { uri, reason } => write!(
                f,
                "record a model cache miss for {uri} ({}: miss, {}: {reason})",
                model_cache::MODEL_CACHE,
                model_cache::REASON
            ),
        }
    }
}

/// A value the policy sets in a security context.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Scalar {
    Bool(bool),
    Int(i64),
}

impl fmt::Display for Scalar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scalar::Bool(b) => write!(f, "{b}"),
            Scalar::Int(n) => write!(f, "{n}"),
        }
    }
}

impl serde::Serialize for Scalar {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match *self {
            Scalar::Bool(b) => s.serialize_bool(b),
            Scalar::Int(n) => s.serialize_i64(n),
        }
    }
}

impl Change {
    fn new(rule: Rule, what: What) -> Self {
        Change {
            rule,
            what,
            applied_warning: None,
        }
    }

    /// `set <path>=<value>`.
    pub(crate) fn set(rule: Rule, path: FieldPath, value: Scalar) -> Self {
        Change::new(rule, What::Set { path, value })
    }

    /// `add model-cache-prep to <annotation>`.
    pub(crate) fn skip_prep_in(annotation: &'static str) -> Self {
        Change::new(Rule::CachePrep, What::SkipPrepIn { annotation })
    }

    /// `mount <uri> from <source>`.
    pub(crate) fn mount(uri: String, source: String) -> Self {
        Change::new(Rule::ModelCache, What::Mount { uri, source })
    }

    /// `record a model cache miss for <uri> (…)`, the URI shortened so that `would …` fits a
    /// warning whole.
    pub(crate) fn record_miss(uri: &str, reason: MissReason) -> Self {
        let fixed = What::RecordMiss {
            uri: String::new(),
            reason,
        }
        .to_string()
        .len();
        let room = MAX_WARNING_LEN.saturating_sub("would ".len() + fixed);
        let uri = shorten_uri(uri, room).into_owned();
        Change::new(Rule::ModelCache, What::RecordMiss { uri, reason })
    }

    /// The model mount a template's pods would get if created now, as its warning says: a
    /// template is not routed (its pods are, each when it is created).
    pub(crate) fn foreseen(mut self) -> Self {
        if let What::Mount { uri, source } = &self.what {
            const TEXT: &str = "pods created now would mount model  from ";
            let uri = shorten_uri(
                uri,
                MAX_WARNING_LEN.saturating_sub(TEXT.len() + source.len()),
            );
            self.applied_warning = Some(format!(
                "pods created now would mount model {uri} from {source}"
            ));
        }
        self
    }

    pub(crate) fn warned(mut self, warning: impl Into<String>) -> Self {
        self.applied_warning = Some(warning.into());
        self
    }

    /// What the patch does, as a phrase that reads after "would" (`set
    /// spec.securityContext.runAsNonRoot=true`, `inject model-cache-prep`, `mount hf://org/m
    /// from LocalModelCache m`).
    pub fn description(&self) -> String {
        self.what.to_string()
    }

    /// The change records a model cache miss.
    pub fn is_miss(&self) -> bool {
        matches!(self.what, What::RecordMiss { .. })
    }

    /// The change as a dry run reports it: `would set spec.securityContext.runAsNonRoot=true`.
    pub fn would(&self) -> String {
        format!("would {}", self.what)
    }
}

/// The result of the mutating pass: the patch, what it changes rule by rule, and the notes
/// that describe no change (a mount skipped, caches not synced yet).
#[derive(Debug, Default)]
pub(crate) struct Mutation {
    pub patch: PatchBuilder,
    /// One entry per change the patch makes; empty exactly when the patch is.
    pub changes: Vec<Change>,
    pub notes: Vec<String>,
    /// How the model URI was resolved, when the pod names one.
    pub model_cache: Option<Resolved>,
    /// A miss the user should hear about before the pods run (a cache matched but a check
    /// failed, with what is missing; or the caches are not synced): what a controller's
    /// template is warned of (docs/policy.md §11). Its text is also among the changes' or the notes.
    pub miss_warning: Option<String>,
}

impl Mutation {
    /// The warnings of the mutation as applied: the changes that announce themselves, then
    /// the notes (as the answer in `enforce` gives them).
    #[cfg(test)]
    pub(crate) fn warnings(&self) -> Vec<String> {
        self.changes
            .iter()
            .filter_map(|c| c.applied_warning.clone())
            .chain(self.notes.iter().cloned())
            .collect()
    }
}

/// Sets `fields` in the security context at `object` (one operation when it does not exist
/// yet) and records one change per field, `set <path>.<field>=<value>`.
fn set_security_fields(
    m: &mut Mutation,
    object: &FieldPath,
    exists: bool,
    fields: Vec<(&'static str, Scalar, Rule)>,
) {
    set_security_fields_but(m, object, exists, fields, &[]);
}

/// [`set_security_fields`], where the fields named in `already` are reported as set but left
/// out of the patch: modelgate's MutatingAdmissionPolicy set them (docs/policy.md §13, "The
/// MAP").
fn set_security_fields_but(
    m: &mut Mutation,
    object: &FieldPath,
    exists: bool,
    fields: Vec<(&'static str, Scalar, Rule)>,
    already: &[&str],
) {
    let mut members = Vec::with_capacity(fields.len());
    for (key, value, rule) in fields {
        m.changes.push(Change::set(rule, object.key(key), value));
        if !already.contains(&key) {
            members.push((key, value));
        }
    }
    // In key order, as the API server would write the object.
    members.sort_by_key(|(key, _)| *key);
    m.patch.set_fields(object, exists, &members);
}

/// Pod or Job CREATE: the whole policy. Ranges are checked first so that no patch is ever built
/// from an invalid uid.
pub(crate) fn mutate_create(
    w: &Workload,
    cfg: &PolicyConfig,
    caches: Caches,
) -> Result<Mutation, Denial> {
    validate::validate(w, cfg, Checks::RangesOnly)?;
    let mut m = Mutation::default();
    let prep_managed = cache_prep::is_managed(w, cfg);

    // 1. The pod's security context, in one operation so later ones find it in place. What
    // modelgate's MutatingAdmissionPolicy set already (its annotation) is reported as set here,
    // so that the answer is the same whether it ran first or not (docs/policy.md §13).
    let mut mark = nonroot::SetByPolicy::read(w);
    let identity = nonroot::pod_identity(w, cfg, prep_managed);
    let by_policy = mark
        .as_mut()
        .map(|mark| mark.pod_fields(w, cfg, prep_managed))
        .unwrap_or_default();
    let fs_group = cache_prep::fs_group_to_set(w, cfg);
    let mut fields = Vec::new();
    let mut already = Vec::new();
    let [non_root, user, group] = nonroot::POD_FIELDS;
    if identity.run_as_non_root || by_policy.run_as_non_root {
        fields.push((non_root, Scalar::Bool(true), Rule::NonRoot));
        already.extend(by_policy.run_as_non_root.then_some(non_root));
    }
    if let Some(uid) = identity.run_as_user.or(by_policy.run_as_user) {
        fields.push((user, Scalar::Int(uid), Rule::NonRoot));
        already.extend(by_policy.run_as_user.map(|_| user));
    }
    if let Some(gid) = identity.run_as_group.or(by_policy.run_as_group) {
        fields.push((group, Scalar::Int(gid), Rule::NonRoot));
        already.extend(by_policy.run_as_group.map(|_| group));
    }
    if let Some(gid) = fs_group {
        fields.push(("fsGroup", Scalar::Int(gid), Rule::CachePrep));
    }
    set_security_fields_but(
        &mut m,
        &w.spec_path.key("securityContext"),
        w.pod_security().is_some(),
        fields,
        &already,
    );

    // 2. Containers, edited in place at their current indices.
    nonroot::container_fixes(w, prep_managed, mark.as_mut(), &mut m.patch, &mut m.changes);

    // 3. The model cache: annotations, volume, mounts, node affinity, on a Pod only. A
    // template's pods are routed each when it is created, against the state of that moment (a
    // Job's can come hours later, when the nodes a pin named are gone or hold another model):
    // the template only hears which model its pods would mount now.
    let before = m.patch.len();
    let mut not_applied = PatchBuilder::default();
    let patch = match w.is_template() {
        true => &mut not_applied,
        false => &mut m.patch,
    };
    let resolved = model_cache::apply(w, cfg, caches, patch, &mut m.notes);
    let resolved = resolved.map(|(change, lookup)| match w.is_template() {
        true => (change.foreseen(), lookup),
        false => (change, lookup),
    });
    if let Some((change, lookup)) = resolved {
        m.model_cache = Some(lookup);
        if change.is_miss() {
            m.miss_warning = change.applied_warning.clone().or_else(|| {
                (lookup == Resolved::Miss(MissReason::NotSynced))
                    .then(|| model_cache::NOT_SYNCED_WARNING.to_string())
            });
        }
        if m.patch.len() > before {
            m.changes.push(change);
        } else if let Some(warning) = change.applied_warning {
            // Already in place (a second pass): still say where the model comes from.
            m.notes.push(warning);
        }
    }

    // 4. The prep container last: inserting it at the front shifts the init containers.
    m.notes.extend(cache_prep::withheld_warning(w, cfg));
    m.notes.extend(cache_prep::assumed_claim_note(w, cfg));
    if prep_managed {
        let uid = identity.run_as_user.or(w.pod_run_as_user());
        let fs_group = fs_group.or(w.pod_fs_group());
        let volume = cache_prep::cache_volume_name(w, cfg);
        let command = cache_prep::canonical_command(cfg, uid, fs_group);
        let canonical = cache_prep::canonical(cfg, volume, &command);
        let init = w.spec.init_containers();
        let init_path = w.spec_path.key("initContainers");
        match init
            .iter()
            .position(|c| c.container.name() == PREP_CONTAINER)
        {
            Some(i) if cache_prep::is_canonical_at(w, i, &canonical) => {}
            Some(i) => {
                m.patch.replace(&init_path.index(i), &canonical);
                m.changes.push(
                    Change::new(Rule::CachePrep, What::ReplacePrep).warned(format!(
                        "{PREP_CONTAINER} init container replaced by the canonical one for this pod"
                    )),
                );
            }
            None => {
                if w.spec.init_containers.is_none() {
                    m.patch.add(&init_path, [&canonical]);
                } else {
                    m.patch.add(&init_path.index(0), &canonical);
                }
                m.changes
                    .push(Change::new(Rule::CachePrep, What::InjectPrep));
            }
        }
        // The identity webhooks that add credentials to every container must leave it alone.
        identity_webhooks::skip_prep(w, &mut m);
    }
    // The MAP's annotation goes: what it lists is reported above as this pass's own.
    let marked = mark.is_some();
    if let Some(mark) = mark {
        m.notes.extend(mark.untrusted_warning());
        m.patch.remove(&nonroot::SetByPolicy::path());
    }
    debug_assert!(
        marked || m.patch.is_empty() == m.changes.is_empty(),
        "{m:?}"
    );
    Ok(m)
}

/// Pod UPDATE of the `ephemeralcontainers` subresource: only the ephemeral containers' own
/// security contexts change, those of the containers `scope` judges.
pub(crate) fn mutate_ephemeral(
    w: &Workload,
    cfg: &PolicyConfig,
    scope: EphemeralScope,
) -> Result<Mutation, Denial> {
    validate::validate_in(w, cfg, Checks::RangesOnly, scope)?;
    let mut m = Mutation::default();
    nonroot::ephemeral_fixes(w, cfg, scope, &mut m);
    debug_assert_eq!(m.patch.is_empty(), m.changes.is_empty(), "{m:?}");
    Ok(m)
}

/// The claim `serve` reads from the API server before it decides again, when the cluster state
/// it watches does not have it yet ([`cache_prep::claim_to_read`]).
pub(crate) fn claim_to_read<'a>(w: &Workload<'a>, cfg: &PolicyConfig) -> Option<&'a str> {
    cache_prep::claim_to_read(w, cfg)
}

/// A partial template's findings (docs/policy.md §12): only what its own fields say.
pub(crate) fn validate_present(w: &Workload, cfg: &PolicyConfig) -> Result<(), Denial> {
    validate::validate(w, cfg, Checks::Present)
}

/// The validating webhook's decision on a Pod UPDATE of the main resource: only the prep
/// container's image is judged (the rest was judged at creation and cannot change).
pub(crate) fn validate_pod_update(w: &Workload, old_object: Option<&str>) -> Result<(), Denial> {
    cache_prep::prep_unchanged(w, old_object)
}

/// The validating webhook's decision; `ephemeral_update` (which containers it judges) for a Pod
/// UPDATE of the `ephemeralcontainers` subresource.
pub(crate) fn validate(
    w: &Workload,
    cfg: &PolicyConfig,
    ephemeral_update: Option<EphemeralScope>,
) -> Result<(), Denial> {
    match ephemeral_update {
        Some(scope) => validate::validate_in(w, cfg, Checks::EphemeralUpdate, scope),
        None => validate::validate(w, cfg, Checks::All),
    }
}

#[cfg(test)]
mod tests;
