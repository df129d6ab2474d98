//! The cluster state as the cluster serves it: the watched kinds (KServe's three cache kinds,
//! PersistentVolumeClaims, Nodes) and their conversion into index entries. The one-time list
//! and the continuous watch that read them are the `modelgate` package's.
//!
//! Objects are read as `DynamicObject`s and converted one by one, so a single object whose spec
//! does not decode is skipped with a warning instead of failing the whole list of its kind.

use std::collections::HashMap;

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, NodeSelectorTerm, PersistentVolumeClaim};
use kube::core::{ApiResource, DynamicObject, ObjectMeta};
use serde::de::DeserializeOwned;

use super::bounds::{MAX_NAME_LEN, MAX_REASON_LEN, bound_node_groups, clip};
use super::index::{CacheStatus, MAX_MODEL_URI_LEN, PvcState, trim_uri};
use super::objects::{
    LocalModelCacheSpec, LocalModelCacheStatus, LocalModelNamespaceCacheSpec,
    LocalModelNodeGroupSpec, pvc_state,
};
use super::{
    CacheEntry, CacheIndex, CacheScope, CacheStorage, LocalModelCache, LocalModelNamespaceCache,
    LocalModelNodeGroup, node_group_terms,
};

/// The watched kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// `LocalModelCache` (cluster-scoped).
    Cache,
    /// `LocalModelNamespaceCache` (namespaced, watched in all namespaces).
    NamespaceCache,
    /// `LocalModelNodeGroup` (cluster-scoped).
    NodeGroup,
    /// `PersistentVolumeClaim` (watched whole in all namespaces: the phase is in `status`).
    Pvc,
    /// `Node` (metadata only: name and labels).
    Node,
    /// `ModelgateException` (namespaced, watched in all namespaces; docs/exceptions.md).
    Exception,
}

/// How a kind is read: whole objects, or their metadata only (`PartialObjectMetadata`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reading {
    Whole,
    Metadata,
}

impl Kind {
    pub const ALL: [Kind; 6] = [
        Kind::Cache,
        Kind::NamespaceCache,
        Kind::NodeGroup,
        Kind::Pvc,
        Kind::Node,
        Kind::Exception,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Cache => "LocalModelCache",
            Kind::NamespaceCache => "LocalModelNamespaceCache",
            Kind::NodeGroup => "LocalModelNodeGroup",
            Kind::Pvc => "PersistentVolumeClaim",
            Kind::Node => "Node",
            Kind::Exception => crate::exceptions::KIND,
        }
    }

    /// Position in [`Kind::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// Group, version, kind and plural, as the types declare them.
    pub fn api_resource(self) -> ApiResource {
        match self {
            Kind::Cache => ApiResource::erase::<LocalModelCache>(&()),
            Kind::NamespaceCache => ApiResource::erase::<LocalModelNamespaceCache>(&()),
            Kind::NodeGroup => ApiResource::erase::<LocalModelNodeGroup>(&()),
            Kind::Pvc => ApiResource::erase::<PersistentVolumeClaim>(&()),
            Kind::Node => ApiResource::erase::<Node>(&()),
            Kind::Exception => {
                use crate::exceptions::{GROUP, KIND, PLURAL, VERSION};
                ApiResource::from_gvk_with_plural(
                    &kube::core::GroupVersionKind::gvk(GROUP, VERSION, KIND),
                    PLURAL,
                )
            }
        }
    }

    pub fn reading(self) -> Reading {
        match self {
            Kind::Node => Reading::Metadata,
            _ => Reading::Whole,
        }
    }

    /// A kind whose absence (404 on its collection) means "not installed, none exist": the
    /// custom resources. Core kinds always exist.
    pub fn is_custom(self) -> bool {
        matches!(
            self,
            Kind::Cache | Kind::NamespaceCache | Kind::NodeGroup | Kind::Exception
        )
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One cluster object, converted once on arrival.
#[derive(Clone, Debug, PartialEq)]
pub enum Converted {
    /// Shared with every index built from it.
    Cache(Arc<CacheEntry>),
    NodeGroup {
        name: String,
        terms: Option<Vec<NodeSelectorTerm>>,
    },
    /// Namespace and name are shared with the watch's key and with every index.
    Pvc {
        namespace: Arc<str>,
        name: Arc<str>,
        state: PvcState,
    },
    Node {
        name: Arc<str>,
        labels: BTreeMap<String, String>,
    },
    /// Shared with every index built from it.
    Exception(Arc<crate::exceptions::Exception>),
}

impl Converted {
    pub(crate) fn insert_into(&self, index: &mut CacheIndex) {
        match self {
            Converted::Cache(entry) => index.upsert_cache(entry.clone()),
            Converted::NodeGroup { name, terms } => index.upsert_node_group(name, terms.clone()),
            Converted::Pvc {
                namespace,
                name,
                state,
            } => index.upsert_pvc(namespace.clone(), name.clone(), state.clone()),
            Converted::Node { name, labels } => index.upsert_node(name.clone(), labels.clone()),
            Converted::Exception(e) => index.upsert_exception(e.clone()),
        }
    }

    /// The key of a PVC or Node, sharing the converted object's strings (there may be 100 000
    /// PVCs: one copy of each name, not three).
    pub fn shared_key(&self) -> Option<ObjectKey> {
        match self {
            Converted::Pvc {
                namespace, name, ..
            } => Some((namespace.clone(), name.clone())),
            Converted::Node { name, .. } => Some((no_namespace(), name.clone())),
            _ => None,
        }
    }
}

/// The identity of an object within its kind: namespace (empty for cluster-scoped) and name.
pub type ObjectKey = (Arc<str>, Arc<str>);

pub fn object_key(obj: &DynamicObject) -> ObjectKey {
    let namespace = match obj.metadata.namespace.as_deref() {
        None | Some("") => no_namespace(),
        Some(ns) => Arc::from(ns),
    };
    (
        namespace,
        Arc::from(obj.metadata.name.as_deref().unwrap_or_default()),
    )
}

/// The namespace of a cluster-scoped object's key: one shared empty string rather than an
/// allocation per Node and cluster cache.
fn no_namespace() -> Arc<str> {
    static EMPTY: std::sync::OnceLock<Arc<str>> = std::sync::OnceLock::new();
    EMPTY.get_or_init(|| Arc::from("")).clone()
}

/// `kind ns/name` (or `kind name`) for log lines.
pub fn describe(kind: Kind, key: &ObjectKey) -> String {
    match key {
        (ns, name) if ns.is_empty() => format!("{kind} {name}"),
        (ns, name) => format!("{kind} {ns}/{name}"),
    }
}

/// Why an object, or part of one, is left out: the `reason` label of
/// `modelgate_cache_skipped_total` (docs/model-cache.md, "Bounds").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SkipReason {
    /// Left out: `spec.sourceModelUri` is longer than the lookup limit
    /// ([`MAX_MODEL_URI_LEN`]), so no model URI that is looked up can match it.
    UriTooLong,
    /// Left out: it cannot be used (does not decode, lacks a field routing needs, names
    /// nothing that can exist).
    Unusable,
    /// Kept without some of its node groups: duplicates, those past
    /// [`MAX_NODE_GROUPS`](super::bounds::MAX_NODE_GROUPS), names too long for an object.
    NodeGroupsTrimmed,
    /// Kept without some `status.nodeStatus` entries: names too long for a Node,
    /// `NodeDownloaded` entries past [`MAX_DOWNLOADED_NODES`](super::bounds::MAX_DOWNLOADED_NODES).
    NodeStatusTrimmed,
    /// Ignored: its namespace holds as many older caches as its cap allows (`serve`'s
    /// `--max-caches-per-namespace`).
    OverNamespaceCap,
    /// Ignored: the namespace caches of all namespaces reached their cap
    /// (`--max-namespace-caches`).
    OverTotalCap,
}

impl SkipReason {
    pub const ALL: [SkipReason; 6] = [
        SkipReason::UriTooLong,
        SkipReason::Unusable,
        SkipReason::NodeGroupsTrimmed,
        SkipReason::NodeStatusTrimmed,
        SkipReason::OverNamespaceCap,
        SkipReason::OverTotalCap,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            SkipReason::UriTooLong => "uri-too-long",
            SkipReason::Unusable => "unusable",
            SkipReason::NodeGroupsTrimmed => "node-groups-trimmed",
            SkipReason::NodeStatusTrimmed => "node-status-trimmed",
            SkipReason::OverNamespaceCap => "over-namespace-cap",
            SkipReason::OverTotalCap => "over-total-cap",
        }
    }
}

/// An object left out at conversion: why, for the metric and for the log (at most
/// [`MAX_REASON_LEN`] bytes: a decoding error may quote the object).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejected {
    pub reason: SkipReason,
    pub why: String,
}

impl Rejected {
    fn unusable(why: impl AsRef<str>) -> Self {
        Rejected {
            reason: SkipReason::Unusable,
            why: clip(why.as_ref(), MAX_REASON_LEN),
        }
    }
}

impl std::fmt::Display for Rejected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.why)
    }
}

impl From<&str> for Rejected {
    fn from(why: &str) -> Self {
        Rejected::unusable(why)
    }
}

/// What a conversion left out of an object it kept.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Trimmed {
    /// Node groups left out of `spec.nodeGroups`.
    pub node_groups: usize,
    /// Entries left out of `status.nodeStatus` that routing could have used.
    pub node_status: usize,
}

fn spec<T: DeserializeOwned>(obj: &mut DynamicObject) -> Result<T, Rejected> {
    let spec = obj
        .data
        .get_mut("spec")
        .map(std::mem::take)
        .ok_or("has no spec")?;
    serde_json::from_value(spec)
        .map_err(|e| Rejected::unusable(format!("spec does not decode: {e}")))
}

fn status(obj: &mut DynamicObject) -> Result<Option<LocalModelCacheStatus>, Rejected> {
    match obj.data.get_mut("status").map(std::mem::take) {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(status) => serde_json::from_value(status)
            .map(Some)
            .map_err(|e| Rejected::unusable(format!("status does not decode: {e}"))),
    }
}

/// A cache's status as the index keeps it, and how many entries routing could use were left
/// out.
fn cache_status(status: Option<LocalModelCacheStatus>) -> (CacheStatus, usize) {
    match status {
        None => (CacheStatus::default(), 0),
        Some(s) => s.to_index_bounded(),
    }
}

/// Converts an object of `kind` into what the index keeps; the error says why it is unusable.
pub fn convert(kind: Kind, obj: DynamicObject) -> Result<Converted, Rejected> {
    convert_bounded(kind, obj).map(|(converted, _)| converted)
}

/// [`convert`], with what was left out of a kept object. Every part of a cache that the index
/// keeps is bounded here (docs/model-cache.md, "Bounds"): a `sourceModelUri` longer than the
/// lookup limit rejects the object (it is never stored), node groups are deduplicated and
/// capped, `status.nodeStatus` is capped, a `pvcRef` that no PVC can have rejects it.
pub fn convert_bounded(
    kind: Kind,
    mut obj: DynamicObject,
) -> Result<(Converted, Trimmed), Rejected> {
    if obj.metadata.name.as_deref().unwrap_or("").is_empty() {
        return Err("has no metadata.name".into());
    }
    let metadata = std::mem::take(&mut obj.metadata);
    let name = |m: ObjectMeta| m.name.unwrap_or_default();
    let mut trimmed = Trimmed::default();
    let entry = match kind {
        Kind::Cache => {
            let spec: LocalModelCacheSpec = spec(&mut obj)?;
            check_uri(&spec.source_model_uri)?;
            let (groups, dropped) = bound_node_groups(spec.node_groups);
            let (status, status_dropped) = cache_status(status(&mut obj)?);
            trimmed = Trimmed {
                node_groups: dropped,
                node_status: status_dropped,
            };
            CacheEntry::from_parts(
                CacheScope::Cluster,
                name(metadata),
                spec.source_model_uri,
                CacheStorage::NodeGroups(groups),
                status,
            )
        }
        Kind::NamespaceCache => {
            let Some(namespace) = metadata.namespace.clone().filter(|ns| !ns.is_empty()) else {
                return Err("has no metadata.namespace".into());
            };
            let spec: LocalModelNamespaceCacheSpec = spec(&mut obj)?;
            check_uri(&spec.source_model_uri)?;
            let storage = match (spec.pvc_ref, spec.node_groups.is_empty()) {
                (Some(_), false) => {
                    return Err("sets both spec.pvcRef and spec.nodeGroups (exactly one)".into());
                }
                (Some(p), true) if p.is_empty() => return Err("spec.pvcRef is empty".into()),
                (Some(p), true) if p.len() > MAX_NAME_LEN => {
                    return Err(Rejected::unusable(format!(
                        "spec.pvcRef has {} bytes, more than {MAX_NAME_LEN}: no PVC has that name",
                        p.len()
                    )));
                }
                (Some(p), true) => CacheStorage::PvcRef(p),
                (None, _) => {
                    let (groups, dropped) = bound_node_groups(spec.node_groups);
                    trimmed.node_groups = dropped;
                    CacheStorage::NodeGroups(groups)
                }
            };
            let (status, status_dropped) = cache_status(status(&mut obj)?);
            trimmed.node_status = status_dropped;
            CacheEntry::from_parts(
                CacheScope::Namespace(namespace),
                name(metadata),
                spec.source_model_uri,
                storage,
                status,
            )
        }
        Kind::NodeGroup => {
            let spec: LocalModelNodeGroupSpec = spec(&mut obj)?;
            let group = LocalModelNodeGroup { metadata, spec };
            return Ok((
                Converted::NodeGroup {
                    terms: node_group_terms(&group),
                    name: name(group.metadata),
                },
                trimmed,
            ));
        }
        Kind::Pvc => {
            if metadata.namespace.as_deref().unwrap_or("").is_empty() {
                return Err("has no metadata.namespace".into());
            }
            let state = pvc_state(&metadata, &obj.data);
            return Ok((
                Converted::Pvc {
                    namespace: metadata.namespace.clone().unwrap_or_default().into(),
                    state,
                    name: name(metadata).into(),
                },
                trimmed,
            ));
        }
        Kind::Exception => {
            let created = metadata
                .creation_timestamp
                .as_ref()
                .map(|t| t.0.as_second());
            let spec = obj.data.get("spec").unwrap_or(&serde_json::Value::Null);
            let exception = crate::exceptions::Exception::from_parts(
                metadata.name.as_deref(),
                metadata.namespace.as_deref(),
                created,
                spec,
            )
            .map_err(Rejected::unusable)?;
            let exception = crate::exceptions::Exception {
                status: crate::exceptions::Status::from_object(obj.data.get("status")),
                ..exception
            };
            return Ok((Converted::Exception(Arc::new(exception)), trimmed));
        }
        Kind::Node => {
            return Ok((
                Converted::Node {
                    labels: metadata.labels.clone().unwrap_or_default(),
                    name: name(metadata).into(),
                },
                trimmed,
            ));
        }
    };
    Ok((Converted::Cache(Arc::new(entry)), trimmed))
}

/// A cache's `sourceModelUri` is not empty and can match a model URI that is looked up: one
/// trailing `/` aside, it is no longer than [`MAX_MODEL_URI_LEN`] (the model URI must continue
/// it, and a longer model URI is never looked up). Checked before anything is built from it.
fn check_uri(uri: &str) -> Result<(), Rejected> {
    if uri.is_empty() {
        return Err("spec.sourceModelUri is empty".into());
    }
    if trim_uri(uri).len() > MAX_MODEL_URI_LEN {
        return Err(Rejected {
            reason: SkipReason::UriTooLong,
            why: format!(
                "spec.sourceModelUri has {} bytes, more than {MAX_MODEL_URI_LEN}: no model URI \
                 that is looked up can match it",
                uri.len()
            ),
        });
    }
    Ok(())
}

/// The index to publish: the cluster's objects, then the `--caches` objects, which replace a
/// cluster object of the same kind, namespace and name.
pub fn build_index<'a>(
    static_index: &CacheIndex,
    objects: impl IntoIterator<Item = &'a Converted>,
) -> CacheIndex {
    let mut index = CacheIndex::new();
    for object in objects {
        object.insert_into(&mut index);
    }
    index.merge(static_index);
    index
}

/// Brings one cluster object's change into an index made by [`build_index`] (the cluster's
/// objects under the static ones), at the cost of that object alone: `current` is the object as
/// converted now, `None` once it is gone. An object the static index has stays the static one.
/// Returns whether the index changed.
pub fn apply_change(
    index: &mut CacheIndex,
    statics: &CacheIndex,
    kind: Kind,
    key: &ObjectKey,
    current: Option<&Converted>,
) -> bool {
    let (namespace, name) = (&*key.0, &*key.1);
    let scope = || match kind {
        Kind::NamespaceCache => CacheScope::Namespace(namespace.to_string()),
        _ => CacheScope::Cluster,
    };
    let from_files = match kind {
        Kind::Cache | Kind::NamespaceCache => statics.has_cache(&scope(), name),
        Kind::NodeGroup => statics.has_node_group(name),
        Kind::Pvc => statics.has_pvc(namespace, name),
        Kind::Node => statics.has_node(name),
        Kind::Exception => statics.has_exception(namespace, name),
    };
    if from_files {
        return false;
    }
    match current {
        Some(object) => object.insert_into(index),
        None => {
            let _ = match kind {
                Kind::Cache | Kind::NamespaceCache => index.remove_cache(&scope(), name),
                Kind::NodeGroup => index.remove_node_group(name),
                Kind::Pvc => index.remove_pvc(namespace, name),
                Kind::Node => index.remove_node(name),
                Kind::Exception => index.remove_exception(namespace, name),
            };
        }
    }
    true
}

/// Converted objects of one kind, by key.
pub type KindObjects = HashMap<ObjectKey, std::sync::Arc<Converted>>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::{CacheScope, CacheStorage};
    use serde_json::json;

    fn dynamic(v: serde_json::Value) -> DynamicObject {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn plural_names_match_the_crds() {
        let plurals: Vec<_> = Kind::ALL[..3]
            .iter()
            .map(|k| k.api_resource().plural)
            .collect();
        assert_eq!(
            plurals,
            [
                "localmodelcaches",
                "localmodelnamespacecaches",
                "localmodelnodegroups"
            ]
        );
        assert!(
            Kind::ALL
                .iter()
                .filter(|k| k.is_custom() && **k != Kind::Exception)
                .all(|k| k.api_resource().api_version == "serving.kserve.io/v1alpha1")
        );
        let e = Kind::Exception.api_resource();
        assert_eq!(
            (e.api_version.as_str(), e.plural.as_str(), e.kind.as_str()),
            (
                "modelgate.io/v1alpha1",
                "modelgateexceptions",
                "ModelgateException"
            )
        );
        let core: Vec<_> = [Kind::Pvc, Kind::Node]
            .iter()
            .map(|k| (k.api_resource().api_version, k.api_resource().plural))
            .collect();
        assert_eq!(
            core,
            [
                ("v1".to_string(), "persistentvolumeclaims".to_string()),
                ("v1".to_string(), "nodes".to_string())
            ]
        );
        assert!(Kind::ALL.iter().enumerate().all(|(i, k)| k.index() == i));
        assert_eq!(Kind::Node.reading(), Reading::Metadata);
        assert_eq!(Kind::Pvc.reading(), Reading::Whole);
    }

    #[test]
    fn converts_each_kind_and_skips_unusable_objects() {
        let c = convert(
            Kind::NamespaceCache,
            dynamic(json!({
                "metadata": {"name": "m", "namespace": "team-a", "resourceVersion": "7"},
                "spec": {"sourceModelUri": "hf://org/m", "nodeGroups": ["workers"], "modelSize": "1Gi"}
            })),
        )
        .unwrap();
        assert_eq!(
            c,
            Converted::Cache(Arc::new(CacheEntry::new(
                CacheScope::Namespace("team-a".into()),
                "m",
                "hf://org/m",
                &["workers"]
            )))
        );
        // Status: node statuses as KServe's controller writes them; pvcRef with a Ready condition.
        let c = convert(
            Kind::NamespaceCache,
            dynamic(json!({
                "metadata": {"name": "m", "namespace": "team-a"},
                "spec": {"sourceModelUri": "hf://org/m", "pvcRef": "shared"},
                "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "ImportSucceeded"}],
                           "copies": {"total": 1, "available": 1}}
            })),
        )
        .unwrap();
        let Converted::Cache(entry) = c else {
            panic!("{c:?}")
        };
        assert_eq!(entry.storage, CacheStorage::PvcRef("shared".into()));
        assert!(entry.status.import_ready);
        let c = convert(
            Kind::Cache,
            dynamic(json!({
                "metadata": {"name": "m"},
                "spec": {"sourceModelUri": "hf://org/m", "nodeGroups": ["workers"]},
                "status": {"nodeStatus": {"n1": "NodeDownloaded", "n2": "NodeDownloading"},
                           "copies": {"total": 2, "available": 1}}
            })),
        )
        .unwrap();
        let Converted::Cache(entry) = c else {
            panic!("{c:?}")
        };
        assert_eq!(
            entry.status.node("n1"),
            Some(&crate::cache::index::NodeState::Downloaded)
        );
        assert_eq!(entry.status.nodes().count(), 2);
        // PVCs keep phase and deletion mark; Nodes their labels (from metadata only).
        let c = convert(
            Kind::Pvc,
            dynamic(json!({
                "metadata": {"name": "llama-gpu", "namespace": "team-a",
                             "deletionTimestamp": "2026-11-30T00:00:00Z"},
                "spec": {"accessModes": ["ReadOnlyMany"]},
                "status": {"phase": "Bound"}
            })),
        )
        .unwrap();
        assert_eq!(
            c,
            Converted::Pvc {
                namespace: "team-a".into(),
                name: "llama-gpu".into(),
                state: PvcState {
                    phase: crate::cache::PvcPhase::Bound,
                    deleting: true,
                    ..PvcState::default()
                }
            }
        );
        let c = convert(
            Kind::Node,
            dynamic(json!({"metadata": {"name": "n1", "labels": {"node-type": "gpu"}}})),
        )
        .unwrap();
        assert_eq!(
            c,
            Converted::Node {
                name: "n1".into(),
                labels: [("node-type".to_string(), "gpu".to_string())].into()
            }
        );
        let g = convert(
            Kind::NodeGroup,
            dynamic(json!({
                "metadata": {"name": "workers"},
                "spec": {"persistentVolumeSpec": {"nodeAffinity": {"required": {"nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "node-type", "operator": "In", "values": ["gpu"]}]}
                ]}}}}
            })),
        )
        .unwrap();
        let Converted::NodeGroup { name, terms } = g else {
            panic!("{g:?}")
        };
        assert_eq!(name, "workers");
        assert_eq!(terms.unwrap().len(), 1);

        for (kind, obj, why) in [
            (
                Kind::Cache,
                json!({"metadata": {"name": "x"}}),
                "has no spec",
            ),
            (
                Kind::Cache,
                json!({"metadata": {"name": "x"}, "spec": {"nodeGroups": "workers"}}),
                "spec does not decode",
            ),
            (
                Kind::Cache,
                json!({"metadata": {"name": "x"}, "spec": {"sourceModelUri": ""}}),
                "sourceModelUri is empty",
            ),
            (
                Kind::NamespaceCache,
                json!({"metadata": {"name": "x"}, "spec": {"sourceModelUri": "hf://m"}}),
                "no metadata.namespace",
            ),
            (
                Kind::NodeGroup,
                json!({"metadata": {}, "spec": {}}),
                "no metadata.name",
            ),
            (
                Kind::NamespaceCache,
                json!({"metadata": {"name": "x", "namespace": "a"},
                       "spec": {"sourceModelUri": "hf://m", "pvcRef": "p", "nodeGroups": ["g"]}}),
                "both spec.pvcRef and spec.nodeGroups",
            ),
            (
                Kind::Cache,
                json!({"metadata": {"name": "x"}, "spec": {"sourceModelUri": "hf://m"},
                       "status": {"nodeStatus": ["n1"]}}),
                "status does not decode",
            ),
            (
                Kind::Pvc,
                json!({"metadata": {"name": "x"}}),
                "no metadata.namespace",
            ),
        ] {
            let e = convert(kind, dynamic(obj)).unwrap_err();
            assert!(e.why.contains(why), "{e}");
            assert_eq!(e.reason, SkipReason::Unusable);
        }
    }

    #[test]
    fn objects_are_bounded_at_conversion_and_what_is_left_out_is_said() {
        let cache = |spec: serde_json::Value, status: serde_json::Value| {
            convert_bounded(
                Kind::NamespaceCache,
                dynamic(json!({"metadata": {"name": "m", "namespace": "team-a"},
                               "spec": spec, "status": status})),
            )
        };
        // A URI no looked-up model URI can match is never stored: the object is rejected.
        let limit = MAX_MODEL_URI_LEN;
        let long = format!("hf://{}", "x".repeat(limit));
        let e = cache(
            json!({"sourceModelUri": long, "nodeGroups": ["g"]}),
            json!(null),
        )
        .unwrap_err();
        assert_eq!(e.reason, SkipReason::UriTooLong);
        assert!(e.why.len() < 200, "{e}");
        let megabyte = format!("hf://{}", "x".repeat(1 << 20));
        let e = convert(
            Kind::Cache,
            dynamic(json!({"metadata": {"name": "m"}, "spec": {"sourceModelUri": megabyte}})),
        )
        .unwrap_err();
        assert_eq!(e.reason, SkipReason::UriTooLong);
        // At the limit (one trailing slash aside) it is kept.
        let at_limit = format!("hf://{}/", "x".repeat(limit - 5));
        let (c, trimmed) = cache(
            json!({"sourceModelUri": at_limit, "nodeGroups": ["g"]}),
            json!(null),
        )
        .unwrap();
        assert_eq!(trimmed, Trimmed::default());
        let Converted::Cache(entry) = c else { panic!() };
        assert_eq!(&*entry.source_model_uri, at_limit);

        // nodeGroups deduplicated and capped; the count of what was dropped.
        let groups: Vec<String> = std::iter::repeat_n("gpu".to_string(), 150_000)
            .chain((0..20).map(|i| format!("g{i}")))
            .collect();
        let (c, trimmed) = cache(
            json!({"sourceModelUri": "hf://m", "nodeGroups": groups}),
            json!(null),
        )
        .unwrap();
        let Converted::Cache(entry) = c else { panic!() };
        assert_eq!(entry.node_groups().len(), crate::cache::MAX_NODE_GROUPS);
        assert_eq!(entry.node_groups()[0], "gpu");
        assert_eq!(trimmed.node_groups, 150_020 - crate::cache::MAX_NODE_GROUPS);

        // nodeStatus: a name no Node can have is left out, and counted.
        let status =
            json!({"nodeStatus": {"n1": "NodeDownloaded", "n".repeat(300): "NodeDownloaded"}});
        let (_, trimmed) = cache(
            json!({"sourceModelUri": "hf://m", "nodeGroups": ["g"]}),
            status,
        )
        .unwrap();
        assert_eq!(trimmed.node_status, 1);

        // A pvcRef no PVC can have is unusable; a decoding error quoting a megabyte is clipped.
        let e = cache(
            json!({"sourceModelUri": "hf://m", "pvcRef": "p".repeat(254)}),
            json!(null),
        )
        .unwrap_err();
        assert_eq!(e.reason, SkipReason::Unusable);
        assert!(e.why.contains("no PVC has that name"), "{e}");
        let e = cache(
            json!({"sourceModelUri": "hf://m", "nodeGroups": "x".repeat(1 << 20)}),
            json!(null),
        )
        .unwrap_err();
        assert_eq!(e.reason, SkipReason::Unusable);
        assert!(
            e.why.len() <= crate::cache::bounds::MAX_REASON_LEN,
            "{}",
            e.why.len()
        );
        assert!(e.why.starts_with("spec does not decode"), "{e}");
        assert_eq!(
            SkipReason::ALL.map(SkipReason::as_str),
            [
                "uri-too-long",
                "unusable",
                "node-groups-trimmed",
                "node-status-trimmed",
                "over-namespace-cap",
                "over-total-cap"
            ]
        );
    }

    #[test]
    fn updates_that_change_nothing_routing_keeps_convert_to_equal_values() {
        let same = |kind, a: serde_json::Value, b: serde_json::Value| {
            convert(kind, dynamic(a)).unwrap() == convert(kind, dynamic(b)).unwrap()
        };
        // A cache's download progresses: copies, conditions, a node from pending to
        // downloading; NodeDownloaded stays on n1 alone.
        let cache = |n2: &str, available: i64, extra: serde_json::Value| {
            json!({
                "metadata": {"name": "m", "resourceVersion": available.to_string()},
                "spec": {"sourceModelUri": "hf://org/m", "nodeGroups": ["g"], "modelSize": "1Gi"},
                "status": {"nodeStatus": {"n1": "NodeDownloaded", "n2": n2},
                           "copies": {"available": available, "total": 2}, "conditions": extra}
            })
        };
        assert!(same(
            Kind::Cache,
            cache("NodeDownloadPending", 1, json!([])),
            cache(
                "NodeDownloading",
                1,
                json!([{"type": "Progressing", "status": "True"}])
            )
        ));
        // n2 finished, or failed: a change.
        for n2 in ["NodeDownloaded", "NodeDownloadError"] {
            assert!(!same(
                Kind::Cache,
                cache("NodeDownloading", 1, json!([])),
                cache(n2, 1, json!([]))
            ));
        }
        // A Node's status, annotations and resourceVersion (what a metadata watch sees of its
        // heartbeats); its labels are what counts.
        let node = |rv: &str, zone: &str| {
            json!({"metadata": {"name": "n1", "resourceVersion": rv, "labels": {"zone": zone},
                                "annotations": {"node.alpha.kubernetes.io/ttl": rv}}})
        };
        assert!(same(Kind::Node, node("1", "a"), node("2", "a")));
        assert!(!same(Kind::Node, node("1", "a"), node("2", "b")));
        // A PVC resized, relabelled; its phase and deletion mark are what counts.
        let pvc = |size: &str, phase: &str| {
            json!({"metadata": {"name": "c", "namespace": "a", "labels": {"size": size}},
                   "spec": {"resources": {"requests": {"storage": size}}},
                   "status": {"phase": phase, "capacity": {"storage": size}}})
        };
        assert!(same(Kind::Pvc, pvc("1Gi", "Bound"), pvc("2Gi", "Bound")));
        assert!(!same(Kind::Pvc, pvc("1Gi", "Bound"), pvc("1Gi", "Lost")));
    }

    /// One pseudo-random object of `kind` among a few names, or `None` (deleted).
    fn random_object(kind: Kind, r: &mut impl FnMut(u64) -> u64) -> (ObjectKey, Option<Converted>) {
        let name = format!("o{}", r(6));
        let namespace = format!("ns{}", r(3));
        let labels = |r: &mut dyn FnMut(u64) -> u64| -> BTreeMap<String, String> {
            let mut labels = BTreeMap::from([("kubernetes.io/hostname".into(), name.clone())]);
            for (k, values) in [("node-type", ["gpu", "cpu"]), ("zone", ["a", "b"])] {
                if r(4) > 0 {
                    labels.insert(k.into(), values[r(2) as usize].into());
                }
            }
            labels
        };
        let key: ObjectKey = match kind {
            Kind::NamespaceCache | Kind::Pvc | Kind::Exception => {
                (namespace.as_str().into(), name.as_str().into())
            }
            _ => ("".into(), name.as_str().into()),
        };
        if r(5) == 0 {
            return (key, None);
        }
        let uri = format!("hf://org/m{}", r(3));
        let groups: Vec<&str> = ["g0", "g1"].into_iter().filter(|_| r(2) == 0).collect();
        let downloaded: Vec<String> = (0..r(3)).map(|_| format!("o{}", r(6))).collect();
        let downloaded: Vec<&str> = downloaded.iter().map(String::as_str).collect();
        let object = match kind {
            Kind::Cache => Converted::Cache(Arc::new(
                CacheEntry::new(CacheScope::Cluster, &name, &uri, &groups)
                    .downloaded_on(&downloaded),
            )),
            Kind::NamespaceCache => Converted::Cache(Arc::new(
                CacheEntry::new(CacheScope::Namespace(namespace), &name, &uri, &groups)
                    .downloaded_on(&downloaded),
            )),
            Kind::NodeGroup => Converted::NodeGroup {
                name: format!("g{}", r(2)),
                terms: (r(3) > 0).then(|| {
                    vec![NodeSelectorTerm {
                        match_expressions: Some(vec![
                            k8s_openapi::api::core::v1::NodeSelectorRequirement {
                                key: "node-type".into(),
                                operator: "In".into(),
                                values: Some(vec![["gpu", "cpu"][r(2) as usize].into()]),
                            },
                        ]),
                        match_fields: None,
                    }]
                }),
            },
            Kind::Pvc => Converted::Pvc {
                namespace: key.0.clone(),
                name: key.1.clone(),
                state: PvcState {
                    phase: [crate::cache::PvcPhase::Bound, crate::cache::PvcPhase::Lost]
                        [r(2) as usize],
                    deleting: r(4) == 0,
                    ..PvcState::default()
                },
            },
            Kind::Node => Converted::Node {
                name: key.1.clone(),
                labels: labels(r),
            },
            Kind::Exception => {
                let rule = ["non-root", "cache-prep"][r(2) as usize];
                let app = format!("a{}", r(2));
                Converted::Exception(Arc::new(
                    crate::exceptions::Exception::from_parts(
                        Some(&name),
                        Some(&namespace),
                        None,
                        &serde_json::json!({"reason": "r", "expires": "2030-01-01T00:00:00Z",
                        "rules": [rule],
                        "selector": {"matchLabels": {"app": app}}}),
                    )
                    .unwrap(),
                ))
            }
        };
        // A node group's name is its key.
        let key = match &object {
            Converted::NodeGroup { name, .. } => ("".into(), name.as_str().into()),
            _ => key,
        };
        (key, Some(object))
    }

    #[test]
    fn changes_applied_one_by_one_give_the_index_a_rebuild_gives() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut r = move |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        // Files holding some objects of the same names as the cluster's.
        let mut statics = CacheIndex::new();
        for kind in Kind::ALL {
            for _ in 0..2 {
                if let (_, Some(object)) = random_object(kind, &mut r) {
                    object.insert_into(&mut statics);
                }
            }
        }
        let mut objects: [KindObjects; 6] = Default::default();
        let mut index = build_index(&statics, std::iter::empty());
        let mut published = Vec::new();
        for step in 0..3_000 {
            let kind = Kind::ALL[r(6) as usize];
            let (key, object) = random_object(kind, &mut r);
            match object {
                Some(o) => objects[kind.index()].insert(key.clone(), Arc::new(o)),
                None => objects[kind.index()].remove(&key),
            };
            let current = objects[kind.index()].get(&key).map(|c| &**c);
            apply_change(&mut index, &statics, kind, &key, current);
            if step % 100 == 0 {
                // Snapshots taken along the way must not move as the index goes on changing.
                published.push((index.clone(), objects.clone()));
            }
        }
        for (snapshot, objects) in published.iter().chain([&(index, objects)]) {
            let rebuilt = build_index(
                &statics,
                objects.iter().flat_map(|o| o.values().map(|c| &**c)),
            );
            assert_eq!(snapshot.counts(), rebuilt.counts());
            assert!(
                *snapshot == rebuilt,
                "incremental index differs from a rebuild"
            );
        }
    }

    #[test]
    fn static_objects_replace_cluster_objects_of_the_same_name() {
        let cache = |uri| CacheEntry::new(CacheScope::Cluster, "shared", uri, &["g"]);
        let cluster = [
            Converted::Cache(Arc::new(cache("hf://cluster").downloaded_on(&["n1"]))),
            Converted::NodeGroup {
                name: "g".into(),
                terms: None,
            },
            Converted::Node {
                name: "n1".into(),
                labels: [("kubernetes.io/hostname".into(), "n1".into())].into(),
            },
            Converted::Pvc {
                namespace: "x".into(),
                name: "shared-g".into(),
                state: PvcState::provisioned(crate::cache::PvcPhase::Bound),
            },
        ];
        let mut files = CacheIndex::new();
        files.upsert_cache(cache("hf://file").downloaded_on(&["n1"]));
        let index = build_index(&files, &cluster);
        let c = index.counts();
        assert_eq!(
            (c.cluster_caches, c.node_groups, c.nodes, c.pvcs),
            (1, 1, 1, 1)
        );
        let lookup = |uri| index.lookup(&crate::cache::LookupRequest::new("x", uri));
        assert_eq!(
            lookup("hf://cluster").reason(),
            Some(crate::cache::MissReason::NoMatch)
        );
        assert!(lookup("hf://file").hit().is_some());
    }
}
