//! docs/policy.md §5: resolve the pod's model URI against node-local caches and mount it, or record
//! why not. The decision is the index's ([`CacheIndex::lookup`]); this module reads the pod's
//! inputs, short-circuits what needs no lookup (opted out, KServe-managed, not synced) and turns
//! the answer into patch operations and warnings.

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, NodeSelectorTerm};
use serde::Serialize;

use super::Change;
use super::view::{NodeSelectorRequirementView, NodeSelectorTermView, VolumeMountView, VolumeView};
use super::workload::{ContainerList, Workload};
use crate::cache::{
    CacheIndex, HOSTNAME_LABEL, Hit, Lookup, LookupRequest, MAX_MODEL_URI_LEN, Miss, MissReason,
    Placement, Resolved,
};
use crate::config::PolicyConfig;
use crate::patch::{FieldPath, Fields, PatchBuilder};

pub use crate::cache::index::storage_key;

pub const MODEL_URI: &str = "modelgate.io/model-uri";
pub const KSERVE_SOURCE_URI: &str = "internal.serving.kserve.io/storage-initializer-sourceuri";
pub const NODE_GROUP: &str = "modelgate.io/node-group";
pub const KSERVE_NODE_GROUP: &str = "serving.kserve.io/nodegroup";
pub const DISABLE: &str = "modelgate.io/disable-model-cache";
pub const KSERVE_DISABLE: &str = "serving.kserve.io/disable-localmodel";
pub const MODEL_CACHE: &str = "modelgate.io/model-cache";
pub const RESOLVED_URI: &str = "modelgate.io/resolved-uri";
pub const REASON: &str = "modelgate.io/model-cache-reason";
pub const VOLUME: &str = "modelgate-model";
/// Labels of pods that KServe's own pod mutator routes (it mounts `/mnt/models` itself).
pub const KSERVE_MANAGED_LABELS: [&str; 2] = [
    "serving.kserve.io/inferenceservice",
    "internal.serving.kserve.io/localmodel",
];

/// What a pod is told when the cluster state has not been listed yet.
pub(crate) const NOT_SYNCED_WARNING: &str =
    "model caches are not synced yet: model cache lookup treated as a miss (not-synced)";

/// Where the caches come from for this request.
#[derive(Clone, Copy)]
pub enum Caches<'a> {
    Ready(&'a CacheIndex),
    /// The cluster state has not been listed yet: every resolution is a `not-synced` miss, with
    /// a warning. The index is there to count it.
    NotSynced(&'a CacheIndex),
}

impl<'a> Caches<'a> {
    pub(crate) fn index(self) -> &'a CacheIndex {
        match self {
            Caches::Ready(i) | Caches::NotSynced(i) => i,
        }
    }
}

/// Resolves the pod's model and patches accordingly; returns what that changes (the caller
/// keeps it only when the patch grew) and how the model was resolved. `warnings` gets the notes
/// that describe no change.
pub(crate) fn apply(
    w: &Workload,
    cfg: &PolicyConfig,
    caches: Caches,
    patch: &mut PatchBuilder,
    warnings: &mut Vec<String>,
) -> Option<(Change, Resolved)> {
    let model_uri = w
        .annotation(MODEL_URI)
        .or_else(|| w.annotation(KSERVE_SOURCE_URI))?;
    let index = caches.index();
    let early = if w.has_annotation(DISABLE) || w.has_annotation(KSERVE_DISABLE) {
        Some(MissReason::OptedOut)
    } else if KSERVE_MANAGED_LABELS.iter().any(|l| w.has_label(l)) {
        Some(MissReason::KserveManaged)
    } else if matches!(caches, Caches::NotSynced(_)) {
        warnings.push(NOT_SYNCED_WARNING.into());
        Some(MissReason::NotSynced)
    } else {
        None
    };
    let answer = match early {
        Some(reason) => Lookup::Miss(Miss::because(reason)),
        None => {
            // The selector's pairs, borrowed from the body (sorted by key, one per key).
            let node_selector: Option<Vec<(&str, &str)>> = w
                .spec
                .node_selector
                .as_ref()
                .map(|s| s.pairs().iter().map(|(k, v)| (&**k, &**v)).collect());
            index.lookup(&LookupRequest {
                namespace: w.namespace,
                model_uri,
                node_group: w
                    .annotation(NODE_GROUP)
                    .or_else(|| w.annotation(KSERVE_NODE_GROUP)),
                node_selector: node_selector.as_deref(),
                layout: cfg.cache_layout,
            })
        }
    };
    let resolved = answer.resolved();
    let change = match answer {
        Lookup::Hit(h) => {
            let source = hit(w, cfg, &h, patch, warnings);
            // Both texts fit a warning whole, with the cache's name intact (the longer template
            // is "model  served from ", 19 bytes besides the URI and the source).
            let uri = super::shorten_uri(
                model_uri,
                super::MAX_WARNING_LEN.saturating_sub(19 + source.len()),
            );
            let warning = format!("model {uri} served from {source}");
            Some(Change::mount(uri.into_owned(), source.to_owned()).warned(warning))
        }
        Lookup::Miss(m) => {
            miss(w, m.reason, patch);
            let change = Change::record_miss(model_uri, m.reason);
            Some(match (&m.cache, &m.missing) {
                (Some(cache), Some(missing)) => {
                    change.warned(miss_warning(m.reason, cache.describe(), model_uri, missing))
                }
                _ if m.reason == MissReason::UriTooLong => change.warned(format!(
                    "{}: the model URI has {} bytes, more than {MAX_MODEL_URI_LEN}: not looked up",
                    m.reason,
                    model_uri.len()
                )),
                _ if m.reason == MissReason::UriNotNormal => change.warned(format!(
                    "{}: the model URI {} has an empty, '.' or '..' path segment (or an encoded \
                     '/'): not looked up",
                    m.reason,
                    super::shorten_uri(model_uri, super::MAX_WARNING_LEN.saturating_sub(120))
                )),
                _ => change,
            })
        }
    };
    change.map(|c| (c, resolved))
}

/// `pvc-missing: LocalModelCache llama matches hf://org/llama but PVC team-b/llama-gpu does not
/// exist`: the reason first, the URI shortened so that the rest stays whole.
pub(crate) fn miss_warning(
    reason: MissReason,
    cache: &str,
    model_uri: &str,
    missing: &str,
) -> String {
    let fixed = reason.as_str().len() + 2 + cache.len() + " matches ".len() + " but ".len();
    let uri = super::shorten_uri(
        model_uri,
        super::MAX_WARNING_LEN.saturating_sub(fixed + missing.len()),
    );
    format!("{reason}: {cache} matches {uri} but {missing}")
}

fn set_annotation(w: &Workload, patch: &mut PatchBuilder, key: &str, value: &str) {
    if w.annotation(key) == Some(value) {
        return;
    }
    if !w.has_metadata {
        patch.add(
            &w.meta_path,
            Fields(&[("annotations", Fields(&[(key, value)]))]),
        );
    } else {
        patch.set_in_map(&w.annotations_path(), w.annotations.is_some(), key, value);
    }
}

/// Sets both annotations, in one object when the map is missing so the second has a parent.
fn set_annotations(w: &Workload, patch: &mut PatchBuilder, mut pairs: [(&str, &str); 2]) {
    if !w.has_metadata || w.annotations.is_none() {
        pairs.sort();
        let both = Fields(&pairs);
        if w.has_metadata {
            patch.add(&w.annotations_path(), both);
        } else {
            patch.add(&w.meta_path, Fields(&[("annotations", both)]));
        }
    } else {
        for (key, value) in pairs {
            set_annotation(w, patch, key, value);
        }
    }
}

/// Patches the pod for a hit; returns the cache that serves the model, as a warning names it.
fn hit<'h>(
    w: &Workload,
    cfg: &PolicyConfig,
    h: &'h Hit,
    patch: &mut PatchBuilder,
    warnings: &mut Vec<String>,
) -> &'h str {
    // Read before the annotations are set: whether an earlier pass already routed this pod.
    let routed_before = w.annotation(MODEL_CACHE).is_some_and(|v| v != "miss");
    let resolved_uri = h.resolved_uri();
    let sub_path = h.volume_sub_path_in(&resolved_uri);
    set_annotations(
        w,
        patch,
        [
            (MODEL_CACHE, h.cache.reference()),
            (RESOLVED_URI, &resolved_uri),
        ],
    );
    if w.has_annotation(REASON) {
        patch.remove(&w.annotations_path().key(REASON));
    }

    let volume = ModelVolume {
        name: VOLUME,
        persistent_volume_claim: ClaimRef {
            claim_name: &h.pvc,
            read_only: true,
        },
    };
    let volumes = w.spec_path.key("volumes");
    let existing = w.spec.volumes();
    match existing.iter().position(|v| v.name() == VOLUME) {
        Some(i) if is_model_volume(&existing[i], &h.pvc) => {}
        Some(i) => patch.replace(&volumes.index(i), volume),
        None => patch.push_to(&volumes, w.spec.volumes.is_some(), volume),
    }

    // The same mount for every container: serialised once.
    let mount = serde_json::value::to_raw_value(&ModelMount {
        mount_path: &cfg.model_mount_path,
        name: VOLUME,
        read_only: true,
        sub_path,
    })
    .expect("a mount serialises to JSON");
    for c in w
        .containers()
        .into_iter()
        .filter(|c| c.list == ContainerList::Regular)
    {
        let mounts_path = c.path(w).key("volumeMounts");
        let mounts = c.volume_mounts.unwrap_or_default();
        if let Some(other) = mounts
            .iter()
            .find(|vm| vm.mount_path() == cfg.model_mount_path && vm.name() != VOLUME)
        {
            warnings.push(format!(
                "container {} already mounts {} at {}: model not mounted there",
                c.name,
                other.name(),
                cfg.model_mount_path
            ));
            continue;
        }
        match mounts.iter().position(|vm| vm.name() == VOLUME) {
            Some(i) => {
                if !is_model_mount(&mounts[i], &cfg.model_mount_path, sub_path) {
                    patch.replace(&mounts_path.index(i), &mount);
                }
            }
            None => patch.push_to(&mounts_path, c.volume_mounts.is_some(), &mount),
        }
    }

    if let Some(p) = &h.placement
        && !add_pinned_terms(w, p, patch)
    {
        require_node_terms(w, &placement_terms(p), routed_before, patch);
    }
    h.cache.describe()
}

/// The volume a hit adds (keys in the order the API server writes them).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ModelVolume<'a> {
    name: &'static str,
    persistent_volume_claim: ClaimRef<'a>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ClaimRef<'a> {
    claim_name: &'a str,
    read_only: bool,
}

/// The read-only mount of the model a hit adds to each regular container.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ModelMount<'a> {
    mount_path: &'a str,
    name: &'static str,
    read_only: bool,
    sub_path: &'a str,
}

/// Whether `v` is exactly the volume a hit writes (`persistentVolumeClaim` `pvc`, read-only, no
/// other source), so that a second pass leaves it alone.
fn is_model_volume(v: &VolumeView, pvc: &str) -> bool {
    let claim = v.persistent_volume_claim.as_ref();
    v.sources.len() == 1
        && claim.and_then(|c| c.claim_name.as_deref()) == Some(pvc)
        && claim.and_then(|c| c.read_only) == Some(true)
}

/// Whether `m` is exactly the mount a hit writes: `mountPath`, `subPath`, read-only, and none of
/// a mount's other fields.
fn is_model_mount(m: &VolumeMountView, mount_path: &str, sub_path: &str) -> bool {
    m.mount_path() == mount_path
        && m.sub_path.as_deref() == Some(sub_path)
        && m.read_only == Some(true)
        && m.sub_path_expr.is_none()
        && m.mount_propagation.is_none()
        && m.recursive_read_only.is_none()
}

/// The node pin of a hit (a `NodeSelectorRequirement`, its fields in k8s-openapi's order).
#[derive(Serialize)]
struct Pin<'a> {
    key: &'static str,
    operator: &'static str,
    values: &'a [String],
}

/// [`require_node_terms`] for a pod without required node terms (the usual case), the group's
/// terms copied from their text in the index with the pin written into each; false (nothing
/// done) when the pod has terms or the group's text is not there.
fn add_pinned_terms(w: &Workload, p: &Placement, patch: &mut PatchBuilder) -> bool {
    let affinity = w.spec.affinity.as_ref();
    let node_affinity = affinity.and_then(|a| a.node_affinity.as_ref());
    let selector = node_affinity.and_then(|n| n.required.as_ref());
    if selector.is_some_and(|s| !s.terms().is_empty()) {
        return false;
    }
    let base = w.spec_path.key("affinity");
    let (path, open, close): (FieldPath, &[u8], &[u8]) = if affinity.is_none() {
        (
            base,
            b"{\"nodeAffinity\":{\"requiredDuringSchedulingIgnoredDuringExecution\":{\"nodeSelectorTerms\":",
            b"}}}",
        )
    } else if node_affinity.is_none() {
        (
            base.key("nodeAffinity"),
            b"{\"requiredDuringSchedulingIgnoredDuringExecution\":{\"nodeSelectorTerms\":",
            b"}}",
        )
    } else if selector.is_none() {
        (
            base.keys([
                "nodeAffinity",
                "requiredDuringSchedulingIgnoredDuringExecution",
            ]),
            b"{\"nodeSelectorTerms\":",
            b"}",
        )
    } else {
        (
            base.keys([
                "nodeAffinity",
                "requiredDuringSchedulingIgnoredDuringExecution",
                "nodeSelectorTerms",
            ]),
            b"",
            b"",
        )
    };
    let pin = Pin {
        key: HOSTNAME_LABEL,
        operator: "In",
        values: &p.hostnames,
    };
    patch.add_json(&path, |json| {
        json.extend_from_slice(open);
        let written = p.pinned_terms.write(json, &pin);
        json.extend_from_slice(close);
        written
    })
}

/// The group's required node terms, each ANDed with `kubernetes.io/hostname In [<hostnames of
/// the downloaded nodes>]`, the pin last in each term's `matchExpressions`.
fn placement_terms(p: &crate::cache::Placement) -> Vec<NodeSelectorTerm> {
    let pin = NodeSelectorRequirement {
        key: HOSTNAME_LABEL.into(),
        operator: "In".into(),
        values: Some(p.hostnames.clone()),
    };
    let group_terms = match &p.required_terms {
        Some(terms) if !terms.is_empty() => terms.to_vec(),
        _ => vec![NodeSelectorTerm::default()],
    };
    group_terms
        .into_iter()
        .map(|mut t| {
            t.match_expressions
                .get_or_insert_default()
                .push(pin.clone());
            t
        })
        .collect()
}

fn miss(w: &Workload, reason: MissReason, patch: &mut PatchBuilder) {
    set_annotations(w, patch, [(MODEL_CACHE, "miss"), (REASON, reason.as_str())]);
    if w.has_annotation(RESOLVED_URI) {
        patch.remove(&w.annotations_path().key(RESOLVED_URI));
    }
    // Mounts first (their indices do not move when a volume goes), highest index first.
    for c in w.containers() {
        let mounts = c.volume_mounts.unwrap_or_default();
        for (i, _) in mounts
            .iter()
            .enumerate()
            .rev()
            .filter(|(_, vm)| vm.name() == VOLUME)
        {
            patch.remove(&c.path(w).key("volumeMounts").index(i));
        }
    }
    let volumes = w.spec.volumes();
    for (i, _) in volumes
        .iter()
        .enumerate()
        .rev()
        .filter(|(_, v)| v.name() == VOLUME)
    {
        patch.remove(&w.spec_path.key("volumes").index(i));
    }
}

/// Does `term` already require everything `required` requires?
fn implies(term: &NodeSelectorTermView, required: &NodeSelectorTerm) -> bool {
    implies_besides(term, required, None)
}

/// [`implies`], leaving out the `matchExpressions` requirement at `own_pin` in `term` and the
/// pin (the last `matchExpressions` requirement) of `required`: the rest of the term is in place.
fn implies_besides(
    term: &NodeSelectorTermView,
    required: &NodeSelectorTerm,
    own_pin: Option<usize>,
) -> bool {
    fn contains(
        have: &[NodeSelectorRequirementView],
        skip: Option<usize>,
        need: &[NodeSelectorRequirement],
    ) -> bool {
        need.iter().all(|n| {
            have.iter()
                .enumerate()
                .any(|(i, h)| Some(i) != skip && same_requirement(h, n))
        })
    }
    let need_expressions = required.match_expressions.as_deref().unwrap_or_default();
    let need_expressions = match own_pin {
        Some(_) => &need_expressions[..need_expressions.len().saturating_sub(1)],
        None => need_expressions,
    };
    contains(
        term.match_expressions.as_deref().unwrap_or_default(),
        own_pin,
        need_expressions,
    ) && contains(
        term.match_fields.as_deref().unwrap_or_default(),
        None,
        required.match_fields.as_deref().unwrap_or_default(),
    )
}

/// The node pin an earlier pass of modelgate wrote into `term`: its last `matchExpressions`
/// requirement `kubernetes.io/hostname In` (modelgate appends its pin after the user's
/// requirements).
fn own_pin(term: &NodeSelectorTermView) -> Option<usize> {
    term.match_expressions
        .as_deref()?
        .iter()
        .rposition(|r| r.key() == HOSTNAME_LABEL && r.operator() == "In")
}

/// The pod's requirement `have` is the requirement `need` (values in the same order, as
/// k8s-openapi's equality compares them).
fn same_requirement(have: &NodeSelectorRequirementView, need: &NodeSelectorRequirement) -> bool {
    let have_values = have.values.as_deref().unwrap_or_default();
    let need_values = need.values.as_deref().unwrap_or_default();
    have.key() == need.key
        && have.operator() == need.operator
        && have.values.is_some() == need.values.is_some()
        && have_values.len() == need_values.len()
        && have_values.iter().zip(need_values).all(|(h, n)| **h == **n)
}

/// Appends `required`'s requirements to the term at `term_path` (which holds `term`); with
/// `own_pin`, the pin modelgate wrote there is removed first (`required`'s own pin, its last
/// `matchExpressions` requirement, takes its place at the end).
fn and_into(
    term_path: &FieldPath,
    term: &NodeSelectorTermView,
    required: &NodeSelectorTerm,
    own_pin: Option<usize>,
    patch: &mut PatchBuilder,
) {
    let lists = [
        (
            "matchExpressions",
            term.match_expressions.is_some(),
            required.match_expressions.as_deref(),
        ),
        (
            "matchFields",
            term.match_fields.is_some(),
            required.match_fields.as_deref(),
        ),
    ];
    for (key, exists, extra) in lists {
        let list = term_path.key(key);
        let extra = extra.unwrap_or_default();
        if key == "matchExpressions"
            && let Some(p) = own_pin
        {
            // The stale pin goes; the new one is appended after the rest, so that it stays the
            // term's last `kubernetes.io/hostname In` (how a later pass recognises it).
            patch.remove(&list.index(p));
            for e in extra {
                patch.append(&list, e);
            }
            continue;
        }
        if extra.is_empty() {
            continue;
        }
        if exists {
            for e in extra {
                patch.append(&list, e);
            }
        } else {
            patch.add(&list, extra);
        }
    }
}

/// Adds the node group's required terms to the pod's required node affinity. Terms are ORed, so
/// `(T1 or T2) and (P1 or P2)` becomes every `Ti and Pj`. A term that already implies some `Pj`
/// is kept as it is, which makes a second pass a no-op. Terms are extended in place and copied
/// with JSON Patch `copy`, so their fields unknown to this code survive.
///
/// On a pod an earlier pass routed (`routed_before`), the node pin that pass wrote is replaced
/// rather than ANDed: the downloaded nodes may have changed between the passes, and two pins
/// would admit only the nodes in both lists, perhaps none.
fn require_node_terms(
    w: &Workload,
    required: &[NodeSelectorTerm],
    routed_before: bool,
    patch: &mut PatchBuilder,
) {
    if required.is_empty() {
        return;
    }
    let affinity = w.spec.affinity.as_ref();
    let node_affinity = affinity.and_then(|a| a.node_affinity.as_ref());
    let selector = node_affinity.and_then(|n| n.required.as_ref());
    let base: FieldPath = w.spec_path.key("affinity");
    let selector_path = base.keys([
        "nodeAffinity",
        "requiredDuringSchedulingIgnoredDuringExecution",
    ]);
    let terms_path = selector_path.key("nodeSelectorTerms");
    let current = selector.map(|s| s.terms()).unwrap_or_default();
    if current.is_empty() {
        let selector_value = Fields(&[("nodeSelectorTerms", required)]);
        let node_affinity_value = Fields(&[(
            "requiredDuringSchedulingIgnoredDuringExecution",
            &selector_value,
        )]);
        if affinity.is_none() {
            patch.add(&base, Fields(&[("nodeAffinity", &node_affinity_value)]));
        } else if node_affinity.is_none() {
            patch.add(&base.key("nodeAffinity"), &node_affinity_value);
        } else if selector.is_none() {
            patch.add(&selector_path, &selector_value);
        } else {
            patch.add(&terms_path, required);
        }
        return;
    }
    // Copies first, from the terms as received; then the in-place extensions.
    let mut appended = current.len();
    let mut in_place = Vec::new();
    for (i, term) in current.iter().enumerate() {
        if required.iter().any(|r| implies(term, r)) {
            continue;
        }
        let pin = own_pin(term).filter(|_| routed_before);
        if let Some(p) = pin
            && let Some(r) = required.iter().find(|r| implies_besides(term, r, pin))
        {
            // Only the pin is stale: its node list is replaced, the rest of the term kept (no
            // copy of this term follows, so the order of operations does not matter here).
            let new_pin = r.match_expressions.as_deref().and_then(|e| e.last());
            if let Some(new_pin) = new_pin {
                patch.replace(
                    &terms_path.index(i).key("matchExpressions").index(p),
                    new_pin,
                );
            }
            continue;
        }
        for r in &required[1..] {
            patch.copy_to_end(&terms_path.index(i), &terms_path);
            and_into(&terms_path.index(appended), term, r, pin, patch);
            appended += 1;
        }
        in_place.push((i, term, pin));
    }
    for (i, term, pin) in in_place {
        and_into(&terms_path.index(i), term, &required[0], pin, patch);
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    #[test]
    fn storage_key_is_16_hex_digits_of_sha256_of_the_uri_as_written() {
        // sha256("hf://org/m") computed independently with `printf %s hf://org/m | sha256sum`.
        assert_eq!(storage_key("hf://org/m"), "5df9d7cea3b612c3");
        assert_ne!(storage_key("hf://org/m/"), storage_key("hf://org/m"));
    }

    #[test]
    fn pinned_terms_are_the_terms_serialised_with_the_pin() {
        let term = |v: Value| -> NodeSelectorTerm { serde_json::from_value(v).unwrap() };
        let zone = json!({"key": "zone", "operator": "In", "values": ["a", "b\"\n"]});
        let name = json!({"key": "metadata.name", "operator": "NotIn", "values": []});
        let cases = [
            None,
            Some(vec![]),
            Some(vec![term(json!({}))]),
            Some(vec![term(json!({"matchExpressions": [zone]}))]),
            Some(vec![term(json!({"matchExpressions": []}))]),
            Some(vec![term(json!({"matchFields": [name]}))]),
            Some(vec![
                term(
                    json!({"matchExpressions": [zone, {"key": "gpu", "operator": "Exists"}],
                            "matchFields": [name]}),
                ),
                term(json!({"matchFields": []})),
            ]),
        ];
        for terms in cases {
            for hostnames in [vec![], vec!["n-1".to_string(), "é\\".to_string()]] {
                let placement = crate::cache::Placement {
                    node_group: "g".into(),
                    pinned_terms: crate::cache::PinnedTerms::of(terms.as_deref()),
                    required_terms: terms.clone().map(Into::into),
                    hostnames,
                };
                let expected = serde_json::to_vec(&placement_terms(&placement)).unwrap();
                let pin = Pin {
                    key: HOSTNAME_LABEL,
                    operator: "In",
                    values: &placement.hostnames,
                };
                let mut written = Vec::new();
                assert!(placement.pinned_terms.write(&mut written, &pin));
                assert_eq!(
                    String::from_utf8(written).unwrap(),
                    String::from_utf8(expected).unwrap(),
                    "{terms:?}"
                );
            }
        }
    }

    #[test]
    fn implies_needs_every_requirement() {
        let term = |v: Value| -> NodeSelectorTerm { serde_json::from_value(v).unwrap() };
        let implied = |have: Value, need: &NodeSelectorTerm| {
            let text = have.to_string();
            let view: NodeSelectorTermView = serde_json::from_str(&text).unwrap();
            implies(&view, need)
        };
        let zone = json!({"key": "zone", "operator": "In", "values": ["a"]});
        let gpu = json!({"key": "node-type", "operator": "In", "values": ["gpu"]});
        let p = term(json!({"matchExpressions": [gpu]}));
        assert!(implied(json!({"matchExpressions": [zone, gpu]}), &p));
        assert!(!implied(json!({"matchExpressions": [zone]}), &p));
        assert!(implied(json!({}), &term(json!({}))));
        // Values compare as lists, and an absent list is not an empty one.
        let gpu_tpu = json!({"key": "node-type", "operator": "In", "values": ["tpu", "gpu"]});
        assert!(!implied(json!({"matchExpressions": [gpu_tpu]}), &p));
        let exists = term(json!({"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}));
        let empty = json!({"key": "gpu", "operator": "Exists", "values": []});
        assert!(!implied(json!({"matchExpressions": [empty]}), &exists));
        let absent = json!({"key": "gpu", "operator": "Exists"});
        assert!(implied(json!({"matchExpressions": [absent]}), &exists));
    }
}
