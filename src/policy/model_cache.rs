//! SPEC.md §5: resolve the pod's model URI against node-local caches and mount it.

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::workload::{ContainerList, Workload};
use crate::cache::{CacheIndex, CacheMatch, CacheScope, index::trim_uri};
use crate::config::PolicyConfig;
use crate::patch::{FieldPath, PatchBuilder};

pub const MODEL_URI: &str = "modelgate.io/model-uri";
pub const KSERVE_SOURCE_URI: &str = "internal.serving.kserve.io/storage-initializer-sourceuri";
pub const NODE_GROUP: &str = "modelgate.io/node-group";
pub const KSERVE_NODE_GROUP: &str = "serving.kserve.io/nodegroup";
pub const DISABLE: &str = "modelgate.io/disable-model-cache";
pub const KSERVE_DISABLE: &str = "serving.kserve.io/disable-localmodel";
pub const MODEL_CACHE: &str = "modelgate.io/model-cache";
pub const RESOLVED_URI: &str = "modelgate.io/resolved-uri";
pub const VOLUME: &str = "modelgate-model";

/// Where the caches come from for this request.
#[derive(Clone, Copy)]
pub enum Caches<'a> {
    Ready(&'a CacheIndex),
    /// The cluster's caches have not been listed yet: every lookup is a miss, with a warning.
    NotSynced,
}

/// The first 16 hex digits of SHA-256 of the cache's `sourceModelUri` as written.
pub fn storage_key(source_model_uri: &str) -> String {
    let digest = Sha256::digest(source_model_uri.as_bytes());
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// What a hit resolves to.
#[derive(Debug, PartialEq)]
pub struct Resolution {
    pub cache_ref: String,
    pub pvc: String,
    pub sub_path: String,
    pub resolved_uri: String,
}

pub fn resolve(m: &CacheMatch, model_uri: &str) -> Resolution {
    let cache = &m.cache;
    let key = storage_key(&cache.source_model_uri);
    let rest = &trim_uri(model_uri)[trim_uri(&cache.source_model_uri).len()..];
    let pvc = format!("{}-{}", cache.name, m.node_group);
    let sub_path = format!("models/{key}{rest}");
    Resolution {
        cache_ref: match &cache.scope {
            CacheScope::Namespace(ns) => format!("namespace/{ns}/{}", cache.name),
            CacheScope::Cluster => format!("cluster/{}", cache.name),
        },
        resolved_uri: format!("pvc://{pvc}/{sub_path}"),
        pvc,
        sub_path,
    }
}

pub fn apply(
    w: &Workload,
    cfg: &PolicyConfig,
    caches: Caches,
    patch: &mut PatchBuilder,
    warnings: &mut Vec<String>,
) {
    if w.has_annotation(DISABLE) || w.has_annotation(KSERVE_DISABLE) {
        return;
    }
    let Some(model_uri) = w
        .annotation(MODEL_URI)
        .or_else(|| w.annotation(KSERVE_SOURCE_URI))
    else {
        return;
    };
    let node_group = w
        .annotation(NODE_GROUP)
        .or_else(|| w.annotation(KSERVE_NODE_GROUP));
    let found = match caches {
        Caches::Ready(index) => index.lookup(w.namespace, model_uri, node_group),
        Caches::NotSynced => {
            warnings.push(
                "model caches are not synced yet: model cache lookup treated as a miss".into(),
            );
            None
        }
    };
    match found {
        Some(m) => hit(w, cfg, model_uri, &m, patch, warnings),
        None => miss(w, patch),
    }
}

fn set_annotation(w: &Workload, patch: &mut PatchBuilder, key: &str, value: &str) {
    if w.annotation(key) == Some(value) {
        return;
    }
    if !w.has_metadata {
        patch.add(&w.meta_path, json!({ "annotations": { key: value } }));
    } else {
        patch.set_in_map(
            &w.annotations_path(),
            w.annotations.is_some(),
            key,
            Value::String(value.into()),
        );
    }
}

fn hit(
    w: &Workload,
    cfg: &PolicyConfig,
    model_uri: &str,
    m: &CacheMatch,
    patch: &mut PatchBuilder,
    warnings: &mut Vec<String>,
) {
    let r = resolve(m, model_uri);
    // Both annotations in one object when the map is missing, so the second add has a parent.
    if !w.has_metadata || w.annotations.is_none() {
        let both = json!({ MODEL_CACHE: r.cache_ref, RESOLVED_URI: r.resolved_uri });
        if w.has_metadata {
            patch.add(&w.annotations_path(), both);
        } else {
            patch.add(&w.meta_path, json!({ "annotations": both }));
        }
    } else {
        set_annotation(w, patch, MODEL_CACHE, &r.cache_ref);
        set_annotation(w, patch, RESOLVED_URI, &r.resolved_uri);
    }

    let volume = json!({ "name": VOLUME, "persistentVolumeClaim": { "claimName": r.pvc, "readOnly": true } });
    let volumes = w.spec_path.key("volumes");
    let existing = w.raw_spec.get("volumes").and_then(Value::as_array);
    match existing.and_then(|vs| vs.iter().position(|v| v["name"] == VOLUME)) {
        Some(i) if existing.unwrap()[i] == volume => {}
        Some(i) => patch.replace(&volumes.index(i), volume),
        None => patch.push_to(&volumes, existing.is_some(), volume),
    }

    let mount = json!({ "name": VOLUME, "mountPath": cfg.model_mount_path, "subPath": r.sub_path, "readOnly": true });
    for c in w
        .containers()
        .into_iter()
        .filter(|c| c.list == ContainerList::Regular)
    {
        let mounts_path = c.path.key("volumeMounts");
        let mounts = c.volume_mounts.map(Vec::as_slice).unwrap_or_default();
        if let Some(other) = mounts
            .iter()
            .find(|vm| vm.mount_path == cfg.model_mount_path && vm.name != VOLUME)
        {
            warnings.push(format!(
                "container {} already mounts {} at {}: model not mounted there",
                c.name, other.name, cfg.model_mount_path
            ));
            continue;
        }
        match mounts.iter().position(|vm| vm.name == VOLUME) {
            Some(i) => {
                let current = serde_json::to_value(&mounts[i]).unwrap_or(Value::Null);
                if current != mount {
                    patch.replace(&mounts_path.index(i), mount.clone());
                }
            }
            None => patch.push_to(&mounts_path, c.volume_mounts.is_some(), mount.clone()),
        }
    }

    if let Some(terms) = &m.required_node_terms {
        require_node_terms(w, terms, patch);
    }

    let source = match &m.cache.scope {
        CacheScope::Namespace(ns) => format!("{} {ns}/{}", m.cache.kind(), m.cache.name),
        CacheScope::Cluster => format!("{} {}", m.cache.kind(), m.cache.name),
    };
    warnings.push(format!("model {model_uri} served from {source}"));
}

fn miss(w: &Workload, patch: &mut PatchBuilder) {
    if w.annotation(MODEL_CACHE) != Some("miss") {
        set_annotation(w, patch, MODEL_CACHE, "miss");
    }
    if w.has_annotation(RESOLVED_URI) {
        patch.remove(&w.annotations_path().key(RESOLVED_URI));
    }
    // Mounts first (their indices do not move when a volume goes), highest index first.
    for c in w.containers() {
        let mounts = c.volume_mounts.map(Vec::as_slice).unwrap_or_default();
        for (i, _) in mounts
            .iter()
            .enumerate()
            .rev()
            .filter(|(_, vm)| vm.name == VOLUME)
        {
            patch.remove(&c.path.key("volumeMounts").index(i));
        }
    }
    let volumes = w.spec.volumes.as_deref().unwrap_or_default();
    for (i, _) in volumes
        .iter()
        .enumerate()
        .rev()
        .filter(|(_, v)| v.name == VOLUME)
    {
        patch.remove(&w.spec_path.key("volumes").index(i));
    }
}

/// Does `term` already require everything some node-group term requires?
fn implies(term: &Value, required: &Value) -> bool {
    ["matchExpressions", "matchFields"].iter().all(|k| {
        let have = term.get(*k).and_then(Value::as_array);
        required
            .get(*k)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .all(|r| have.is_some_and(|h| h.contains(r)))
    })
}

/// `term AND required`: the requirement lists concatenated, other fields of `term` kept.
fn and_terms(term: &Value, required: &Value) -> Value {
    let mut out = term.clone();
    for k in ["matchExpressions", "matchFields"] {
        if let Some(extra) = required
            .get(k)
            .and_then(Value::as_array)
            .filter(|a| !a.is_empty())
        {
            let list = out
                .as_object_mut()
                .map(|o| o.entry(k).or_insert_with(|| Value::Array(vec![])));
            if let Some(Value::Array(a)) = list {
                a.extend(extra.iter().cloned());
            }
        }
    }
    out
}

/// Adds the node group's required terms to the pod's required node affinity. Terms are ORed, so
/// `(T1 or T2) and (P1 or P2)` becomes every `Ti and Pj`; a term that already implies some `Pj`
/// is kept as it is, which makes a second pass a no-op.
fn require_node_terms(
    w: &Workload,
    terms: &[k8s_openapi::api::core::v1::NodeSelectorTerm],
    patch: &mut PatchBuilder,
) {
    let required: Vec<Value> = terms
        .iter()
        .filter_map(|t| serde_json::to_value(t).ok())
        .collect();
    if required.is_empty() {
        return;
    }
    let affinity = w.raw_spec.get("affinity");
    let node_affinity = affinity.and_then(|a| a.get("nodeAffinity"));
    let selector =
        node_affinity.and_then(|n| n.get("requiredDuringSchedulingIgnoredDuringExecution"));
    let current = selector
        .and_then(|s| s.get("nodeSelectorTerms"))
        .and_then(Value::as_array)
        .filter(|a| !a.is_empty());
    let merged: Vec<Value> = match current {
        None => required.clone(),
        Some(current) => {
            if current
                .iter()
                .all(|t| required.iter().any(|r| implies(t, r)))
            {
                return;
            }
            current
                .iter()
                .flat_map(|t| {
                    if required.iter().any(|r| implies(t, r)) {
                        vec![t.clone()]
                    } else {
                        required.iter().map(|r| and_terms(t, r)).collect()
                    }
                })
                .collect()
        }
    };
    let base: FieldPath = w.spec_path.key("affinity");
    let terms = Value::Array(merged);
    let is_obj = |v: Option<&Value>| v.is_some_and(Value::is_object);
    if !is_obj(affinity) {
        patch.add(&base, json!({ "nodeAffinity": { "requiredDuringSchedulingIgnoredDuringExecution": { "nodeSelectorTerms": terms } } }));
    } else if !is_obj(node_affinity) {
        patch.add(&base.key("nodeAffinity"), json!({ "requiredDuringSchedulingIgnoredDuringExecution": { "nodeSelectorTerms": terms } }));
    } else if !is_obj(selector) {
        patch.add(
            &base.keys([
                "nodeAffinity",
                "requiredDuringSchedulingIgnoredDuringExecution",
            ]),
            json!({ "nodeSelectorTerms": terms }),
        );
    } else {
        patch.add(
            &base.keys([
                "nodeAffinity",
                "requiredDuringSchedulingIgnoredDuringExecution",
                "nodeSelectorTerms",
            ]),
            terms,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn storage_key_is_16_hex_digits_of_sha256_of_the_uri_as_written() {
        // sha256("hf://org/m") computed independently with `printf %s hf://org/m | sha256sum`.
        assert_eq!(storage_key("hf://org/m"), "5df9d7cea3b612c3");
        assert_ne!(storage_key("hf://org/m/"), storage_key("hf://org/m"));
    }

    #[test]
    fn and_terms_concatenates_and_implies_detects_it() {
        let t = json!({"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]});
        let p = json!({"matchExpressions": [{"key": "node-type", "operator": "In", "values": ["gpu"]}]});
        let both = and_terms(&t, &p);
        assert_eq!(both["matchExpressions"].as_array().unwrap().len(), 2);
        assert!(implies(&both, &p));
        assert!(!implies(&t, &p));
    }
}
