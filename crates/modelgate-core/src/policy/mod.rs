//! The admission policy of SPEC.md §3–§6, as pure functions: a decoded workload and the
//! configuration in, a patch and warnings or a denial out. No I/O, no clock, no globals.
//!
//! - [`nonroot`]: non-root, numeric users (§3)
//! - [`cache_prep`]: the `model-cache-prep` init container (§4)
//! - [`model_cache`]: model URI resolution against node-local caches (§5)
//! - [`validate`]: what is denied (§6)

mod cache_prep;
pub mod model_cache;
mod nonroot;
mod validate;
pub mod view;
mod workload;

use serde_json::Value;

use std::borrow::Cow;
use std::fmt;

pub use model_cache::Caches;
pub use validate::{Checks, Denial, Violation};
pub(crate) use workload::Workload;

use crate::cache::Resolved;
use crate::config::{PREP_CONTAINER, PolicyConfig};
use crate::patch::{FieldPath, PatchBuilder};

/// The longest warning the API server passes on whole, in bytes (it truncates longer ones).
pub const MAX_WARNING_LEN: usize = 256;

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

/// The rule of SPEC.md that a change or a violation comes from.
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
}

impl Rule {
    pub const ALL: [Rule; 4] = [
        Rule::NonRoot,
        Rule::CachePrep,
        Rule::ModelCache,
        Rule::Schema,
    ];

    /// A stable name for reports and labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Rule::NonRoot => "non-root",
            Rule::CachePrep => "cache-prep",
            Rule::ModelCache => "model-cache",
            Rule::Schema => "schema",
        }
    }

    /// The section of SPEC.md that states the rule.
    pub fn section(self) -> &'static str {
        match self {
            Rule::NonRoot => "§3",
            Rule::CachePrep => "§4",
            Rule::ModelCache => "§5",
            Rule::Schema => "§6",
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One thing the mutation changes, in words, with the rule it comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    pub rule: Rule,
    /// What the patch does, as a phrase that reads after "would" (`set
    /// spec.securityContext.runAsNonRoot=true`, `inject model-cache-prep`, `mount hf://org/m
    /// from LocalModelCache m`).
    pub description: String,
    /// The warning the change gets when it is applied, for the changes a user must hear about.
    pub applied_warning: Option<String>,
}

impl Change {
    pub fn new(rule: Rule, description: impl Into<String>) -> Self {
        Change {
            rule,
            description: description.into(),
            applied_warning: None,
        }
    }

    pub fn warned(mut self, warning: impl Into<String>) -> Self {
        self.applied_warning = Some(warning.into());
        self
    }

    /// The change as a dry run reports it: `would set spec.securityContext.runAsNonRoot=true`.
    pub fn would(&self) -> String {
        format!("would {}", self.description)
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
    fields: Vec<(&'static str, serde_json::Value, Rule)>,
) {
    let mut members = Vec::with_capacity(fields.len());
    let object_text = object.to_string();
    for (key, value, rule) in fields {
        // `object` is never the root, so `<object>.<key>` is the field's path.
        m.changes.push(Change::new(
            rule,
            format!("set {object_text}.{key}={value}"),
        ));
        members.push((key, value));
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

    // 1. The pod's security context, in one operation so later ones find it in place.
    let identity = nonroot::pod_identity(w, cfg, prep_managed);
    let fs_group = cache_prep::fs_group_to_set(w, cfg);
    let mut fields = Vec::new();
    if identity.run_as_non_root {
        fields.push(("runAsNonRoot", Value::Bool(true), Rule::NonRoot));
    }
    if let Some(uid) = identity.run_as_user {
        fields.push(("runAsUser", uid.into(), Rule::NonRoot));
    }
    if let Some(gid) = identity.run_as_group {
        fields.push(("runAsGroup", gid.into(), Rule::NonRoot));
    }
    if let Some(gid) = fs_group {
        fields.push(("fsGroup", gid.into(), Rule::CachePrep));
    }
    set_security_fields(
        &mut m,
        &w.spec_path.key("securityContext"),
        w.pod_security().is_some(),
        fields,
    );

    // 2. Containers, edited in place at their current indices.
    nonroot::container_fixes(w, prep_managed, &mut m.patch, &mut m.changes);

    // 3. The model cache: annotations, volume, mounts, node affinity.
    let before = m.patch.len();
    let resolved = model_cache::apply(w, cfg, caches, &mut m.patch, &mut m.notes);
    if let Some((change, lookup)) = resolved {
        m.model_cache = Some(lookup);
        if m.patch.len() > before {
            m.changes.push(change);
        } else if let Some(warning) = change.applied_warning {
            // Already in place (a second pass): still say where the model comes from.
            m.notes.push(warning);
        }
    }

    // 4. The prep container last: inserting it at the front shifts the init containers.
    if cache_prep::withheld_by_pod_security(w, cfg) {
        m.notes.push(cache_prep::withheld_warning(w));
    }
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
                    Change::new(
                        Rule::CachePrep,
                        format!("replace {PREP_CONTAINER} by the canonical one for this pod"),
                    )
                    .warned(format!(
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
                m.changes.push(Change::new(
                    Rule::CachePrep,
                    format!("inject {PREP_CONTAINER}"),
                ));
            }
        }
    }
    debug_assert_eq!(m.patch.is_empty(), m.changes.is_empty(), "{m:?}");
    Ok(m)
}

/// Pod UPDATE of the `ephemeralcontainers` subresource: only the ephemeral containers' own
/// security contexts change.
pub(crate) fn mutate_ephemeral(w: &Workload, cfg: &PolicyConfig) -> Result<Mutation, Denial> {
    validate::validate(w, cfg, Checks::RangesOnly)?;
    let mut m = Mutation::default();
    nonroot::ephemeral_fixes(w, cfg, &mut m);
    debug_assert_eq!(m.patch.is_empty(), m.changes.is_empty(), "{m:?}");
    Ok(m)
}

/// The validating webhook's decision.
pub(crate) fn validate(w: &Workload, cfg: &PolicyConfig) -> Result<(), Denial> {
    validate::validate(w, cfg, Checks::All)
}

#[cfg(test)]
mod tests;
