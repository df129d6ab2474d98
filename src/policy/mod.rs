//! The admission policy of SPEC.md §3–§6, as pure functions: a decoded workload and the
//! configuration in, a patch and warnings or a denial out. No I/O, no clock, no globals.
//!
//! - [`nonroot`]: non-root, numeric users (§3)
//! - [`cache_prep`]: the `model-cache-prep` init container (§4)
//! - [`model_cache`]: model URI resolution against node-local caches (§5)
//! - [`validate`]: what is denied (§6)

pub mod cache_prep;
pub mod model_cache;
pub mod nonroot;
pub mod validate;
pub mod workload;

use serde_json::Value;

pub use model_cache::Caches;
pub use validate::{Checks, Denial, Violation};
pub use workload::Workload;

use crate::config::{PREP_CONTAINER, PolicyConfig};
use crate::patch::PatchBuilder;

/// The result of the mutating pass.
#[derive(Debug, Default)]
pub struct Mutation {
    pub patch: PatchBuilder,
    pub warnings: Vec<String>,
}

/// Pod or Job CREATE: the whole policy. Ranges are checked first so that no patch is ever built
/// from an invalid uid.
pub fn mutate_create(w: &Workload, cfg: &PolicyConfig, caches: Caches) -> Result<Mutation, Denial> {
    validate::validate(w, cfg, Checks::RangesOnly)?;
    let mut m = Mutation::default();
    let prep_managed = cache_prep::is_managed(w, cfg);

    // 1. The pod's security context, in one operation so later ones find it in place.
    let identity = nonroot::pod_identity(w, cfg, prep_managed);
    let fs_group = cache_prep::fs_group_to_set(w, cfg);
    let mut fields = serde_json::Map::new();
    if identity.run_as_non_root {
        fields.insert("runAsNonRoot".into(), Value::Bool(true));
    }
    if let Some(uid) = identity.run_as_user {
        fields.insert("runAsUser".into(), uid.into());
    }
    if let Some(gid) = identity.run_as_group {
        fields.insert("runAsGroup".into(), gid.into());
    }
    if let Some(gid) = fs_group {
        fields.insert("fsGroup".into(), gid.into());
    }
    m.patch.set_fields(
        &w.spec_path.key("securityContext"),
        w.pod_security().is_some(),
        fields,
    );

    // 2. Containers, edited in place at their current indices.
    nonroot::container_fixes(w, prep_managed, &mut m.patch, &mut m.warnings);

    // 3. The model cache: annotations, volume, mounts, node affinity.
    model_cache::apply(w, cfg, caches, &mut m.patch, &mut m.warnings);

    // 4. The prep container last: inserting it at the front shifts the init containers.
    if prep_managed {
        let uid = identity.run_as_user.or(w.pod_run_as_user());
        let fs_group = fs_group.or(w.pod_fs_group());
        let volume = cache_prep::cache_volume_name(w, cfg);
        let canonical = cache_prep::canonical(cfg, volume, uid, fs_group);
        let init = w.spec.init_containers.as_deref().unwrap_or_default();
        let init_path = w.spec_path.key("initContainers");
        let value = serde_json::to_value(&canonical).expect("a Container always serializes");
        match init.iter().position(|c| c.name == PREP_CONTAINER) {
            Some(i) if cache_prep::is_canonical_at(w, i, &canonical) => {}
            Some(i) => {
                m.patch.replace(&init_path.index(i), value);
                m.warnings.push(
                    "model-cache-prep init container replaced by the canonical one for this pod"
                        .into(),
                );
            }
            None if w.spec.init_containers.is_none() => {
                m.patch.add(&init_path, Value::Array(vec![value]))
            }
            None => m.patch.add(&init_path.index(0), value),
        }
    }
    Ok(m)
}

/// Pod UPDATE of the `ephemeralcontainers` subresource: only the ephemeral containers' own
/// security contexts change.
pub fn mutate_ephemeral(w: &Workload, cfg: &PolicyConfig) -> Result<Mutation, Denial> {
    validate::validate(w, cfg, Checks::RangesOnly)?;
    let mut m = Mutation::default();
    nonroot::ephemeral_fixes(w, cfg, &mut m.patch, &mut m.warnings);
    Ok(m)
}

/// The validating webhook's decision.
pub fn validate(w: &Workload, cfg: &PolicyConfig) -> Result<(), Denial> {
    validate::validate(w, cfg, Checks::All)
}
