//! Model caches: the cluster state routing needs (KServe's cache objects with their status,
//! PVCs, Nodes) and the index that answers lookups (docs/policy.md §5).
//!
//! The index is filled from files (`--caches`) and, in `serve`, from the cluster's watch (both in
//! the `modelgate` package). It is the only place a model URI is matched against caches. Files
//! and cluster objects go through the same conversion ([`cluster::convert`]), so both read the
//! same fields the same way.

pub mod bounds;
pub mod cluster;
pub(crate) mod index;
pub(crate) mod objects;
pub(crate) mod pmap;

pub use bounds::{MAX_DOWNLOADED_NODES, MAX_NAME_LEN, MAX_NODE_GROUPS};
pub use cluster::{Kind, Rejected, SkipReason, Trimmed};
pub use index::{
    CacheEntry, CacheIndex, CacheScope, CacheStatus, CacheStorage, HOSTNAME_LABEL, Hit, Lookup,
    LookupRequest, MAX_MODEL_URI_LEN, Miss, MissReason, PinnedTerms, Placement, PvcPhase, PvcState,
    Resolved,
};
pub use objects::{LocalModelCache, LocalModelNamespaceCache, LocalModelNodeGroup};

use anyhow::{Context, anyhow, bail};
use serde_json::Value;

const GROUP_VERSION: &str = "serving.kserve.io/v1alpha1";

pub const CORE_VERSION: &str = "v1";

impl From<&LocalModelCache> for CacheEntry {
    fn from(c: &LocalModelCache) -> Self {
        CacheEntry::from_parts(
            CacheScope::Cluster,
            c.metadata.name.clone().unwrap_or_default(),
            c.spec.source_model_uri.clone(),
            CacheStorage::NodeGroups(c.spec.node_groups.clone()),
            c.status.as_ref().map(|s| s.to_index()).unwrap_or_default(),
        )
    }
}

impl From<&LocalModelNamespaceCache> for CacheEntry {
    fn from(c: &LocalModelNamespaceCache) -> Self {
        CacheEntry::from_parts(
            CacheScope::Namespace(c.metadata.namespace.clone().unwrap_or_default()),
            c.metadata.name.clone().unwrap_or_default(),
            c.spec.source_model_uri.clone(),
            match &c.spec.pvc_ref {
                Some(pvc) => CacheStorage::PvcRef(pvc.clone()),
                None => CacheStorage::NodeGroups(c.spec.node_groups.clone()),
            },
            c.status.as_ref().map(|s| s.to_index()).unwrap_or_default(),
        )
    }
}

/// The kind a document is, when it is one of the objects routing reads.
fn routing_kind(api_version: &str, kind: &str) -> Option<Kind> {
    match (api_version, kind) {
        (GROUP_VERSION, "LocalModelCache") => Some(Kind::Cache),
        (GROUP_VERSION, "LocalModelNamespaceCache") => Some(Kind::NamespaceCache),
        (GROUP_VERSION, "LocalModelNodeGroup") => Some(Kind::NodeGroup),
        (CORE_VERSION, "PersistentVolumeClaim") => Some(Kind::Pvc),
        (CORE_VERSION, "Node") => Some(Kind::Node),
        (crate::exceptions::API_VERSION, crate::exceptions::KIND) => Some(Kind::Exception),
        _ => None,
    }
}

/// The required node terms of a node group's persistent volume, if it has any.
pub(crate) fn node_group_terms(
    g: &LocalModelNodeGroup,
) -> Option<Vec<k8s_openapi::api::core::v1::NodeSelectorTerm>> {
    g.spec
        .persistent_volume_spec
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required
        .as_ref()
        .map(|r| r.node_selector_terms.clone())
}

impl CacheIndex {
    /// Adds one object routing reads (a cache, node group, PVC or Node), or a
    /// `ModelgateException`, given as JSON. Objects of other kinds are refused.
    pub fn insert_object(&mut self, value: &Value) -> anyhow::Result<()> {
        let api_version = value
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or("");
        let kind = value.get("kind").and_then(Value::as_str).unwrap_or("");
        let Some(kind) = routing_kind(api_version, kind) else {
            if kind == crate::exceptions::KIND {
                bail!(
                    "expected apiVersion {}, found `{api_version}` (kind `{kind}`)",
                    crate::exceptions::API_VERSION
                );
            }
            if kind.starts_with("LocalModel") && api_version != GROUP_VERSION {
                bail!("expected apiVersion {GROUP_VERSION}, found `{api_version}` (kind `{kind}`)");
            }
            bail!(
                "expected LocalModelCache, LocalModelNamespaceCache, LocalModelNodeGroup \
                 ({GROUP_VERSION}), PersistentVolumeClaim or Node (v1), found `{api_version}` \
                 kind `{kind}`"
            );
        };
        let name = value
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("");
        if name.is_empty() {
            bail!("{kind} has no metadata.name");
        }
        // The same conversion as for the cluster's objects, so files and cluster agree.
        let object =
            serde::Deserialize::deserialize(value).with_context(|| format!("{kind} {name}"))?;
        cluster::convert(kind, object)
            .map_err(|why| anyhow!("{kind} {name}: {why}"))?
            .insert_into(self);
        Ok(())
    }
}
