//! Model caches: the cluster state routing needs (KServe's cache objects with their status,
//! PVCs, Nodes) and the index that answers lookups (SPEC.md §5).
//!
//! The index is filled from files (`--caches`) and, in `serve`, from the cluster's watch
//! ([`watch`]; `review --from-cluster` lists once, [`cluster`]). It is the only place a model URI
//! is matched against caches. Files and cluster objects go through the same conversion
//! ([`cluster::convert`]), so both read the same fields the same way.

pub mod cluster;
pub mod index;
pub mod metrics;
pub mod objects;
pub mod store;
pub mod watch;

pub use cluster::{ClusterCacheError, Kind};
pub use index::{
    CacheEntry, CacheIndex, CacheScope, CacheStatus, CacheStorage, Hit, Lookup, LookupRequest,
    Miss, MissReason, Placement, PvcPhase, PvcState,
};
pub use metrics::CacheMetrics;
pub use objects::{LocalModelCache, LocalModelNamespaceCache, LocalModelNodeGroup};
pub use store::{CacheStore, CacheView};
pub use watch::{CacheSource, CacheWatch, CacheWatchConfig, ClusterCacheArgs, Readiness};

use anyhow::{Context, anyhow, bail};
use serde_json::Value;

use crate::documents::{Document, read_documents};

const GROUP_VERSION: &str = "serving.kserve.io/v1alpha1";

const CORE_VERSION: &str = "v1";

impl From<&LocalModelCache> for CacheEntry {
    fn from(c: &LocalModelCache) -> Self {
        CacheEntry {
            scope: CacheScope::Cluster,
            name: c.metadata.name.clone().unwrap_or_default(),
            source_model_uri: c.spec.source_model_uri.clone(),
            storage_key: index::storage_key(&c.spec.source_model_uri),
            storage: CacheStorage::NodeGroups(c.spec.node_groups.clone()),
            status: c.status.as_ref().map(|s| s.to_index()).unwrap_or_default(),
        }
    }
}

impl From<&LocalModelNamespaceCache> for CacheEntry {
    fn from(c: &LocalModelNamespaceCache) -> Self {
        CacheEntry {
            scope: CacheScope::Namespace(c.metadata.namespace.clone().unwrap_or_default()),
            name: c.metadata.name.clone().unwrap_or_default(),
            source_model_uri: c.spec.source_model_uri.clone(),
            storage_key: index::storage_key(&c.spec.source_model_uri),
            storage: match &c.spec.pvc_ref {
                Some(pvc) => CacheStorage::PvcRef(pvc.clone()),
                None => CacheStorage::NodeGroups(c.spec.node_groups.clone()),
            },
            status: c.status.as_ref().map(|s| s.to_index()).unwrap_or_default(),
        }
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
        _ => None,
    }
}

/// The required node terms of a node group's persistent volume, if it has any.
pub fn node_group_terms(
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
    /// Adds one object routing reads (a cache, node group, PVC or Node) given as JSON. Objects of
    /// other kinds are refused.
    pub fn insert_object(&mut self, value: &Value) -> anyhow::Result<()> {
        let api_version = value
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or("");
        let kind = value.get("kind").and_then(Value::as_str).unwrap_or("");
        let Some(kind) = routing_kind(api_version, kind) else {
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

    /// Adds every object routing reads of the given documents (caches, node groups, PVCs,
    /// Nodes) and returns the origins of the documents skipped because they are none of those (a
    /// file may hold the workloads too). Such an object that does not decode is an error naming
    /// the file and document.
    pub fn insert_documents(&mut self, docs: &[Document]) -> anyhow::Result<Vec<String>> {
        let mut skipped = Vec::new();
        for d in docs {
            let api_version = d.value.get("apiVersion").and_then(Value::as_str);
            let kind = d.value.get("kind").and_then(Value::as_str).unwrap_or("");
            let core = api_version == Some(CORE_VERSION)
                && matches!(kind, "PersistentVolumeClaim" | "Node");
            let kserve = api_version.is_none_or(|a| a.starts_with("serving.kserve.io/"))
                && kind.starts_with("LocalModel");
            if !core && !kserve {
                skipped.push(format!("{} ({kind})", d.origin));
                continue;
            }
            self.insert_object(&d.value)
                .with_context(|| d.origin.clone())?;
        }
        Ok(skipped)
    }

    /// Loads `--caches` files (YAML or JSON, multi-document or `List`); returns the index and the
    /// documents skipped as not cache objects.
    pub fn load_files<P: AsRef<std::path::Path>>(
        paths: &[P],
    ) -> anyhow::Result<(Self, Vec<String>)> {
        let mut index = CacheIndex::new();
        let mut skipped = Vec::new();
        for p in paths {
            let p = p.as_ref();
            let text = std::fs::read_to_string(p)
                .with_context(|| format!("{}: cannot read", p.display()))?;
            let docs = read_documents(&p.display().to_string(), &text)?;
            skipped.extend(index.insert_documents(&docs)?);
        }
        Ok((index, skipped))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loads_kserve_readme_objects() {
        let text = r#"
apiVersion: serving.kserve.io/v1alpha1
kind: LocalModelCache
metadata: {name: llama3-8b}
spec: {sourceModelUri: "hf://meta-llama/Meta-Llama-3-8B", modelSize: 10Gi, nodeGroups: [workers]}
---
apiVersion: serving.kserve.io/v1alpha1
kind: LocalModelNodeGroup
metadata: {name: workers}
spec:
  storageLimit: 100Gi
  persistentVolumeSpec:
    capacity: {storage: 100Gi}
    local: {path: /models}
    nodeAffinity:
      required:
        nodeSelectorTerms:
        - matchExpressions: [{key: node-type, operator: In, values: [gpu]}]
---
apiVersion: serving.kserve.io/v1alpha1
kind: LocalModelNamespaceCache
metadata: {name: mine, namespace: team-a}
spec: {sourceModelUri: "hf://meta-llama/Meta-Llama-3-8B", nodeGroups: [workers]}
status: {nodeStatus: {gpu-1: NodeDownloading}}
"#;
        let state = r#"
apiVersion: v1
kind: Node
metadata: {name: gpu-1, labels: {node-type: gpu}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: llama3-8b-workers, namespace: team-b}
status: {phase: Bound}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: mine-workers, namespace: team-a}
"#;
        let uri = "hf://meta-llama/Meta-Llama-3-8B";
        let docs = read_documents("caches.yaml", text).unwrap();
        let mut idx = CacheIndex::new();
        idx.insert_documents(&docs).unwrap();
        let c = idx.counts();
        assert_eq!(
            (c.namespace_caches, c.cluster_caches, c.node_groups),
            (1, 1, 1)
        );
        // Files are the whole truth: without the PVC, the miss names it.
        let Lookup::Miss(m) = idx.lookup(&LookupRequest::new("team-b", uri)) else {
            panic!("a miss without the PVC")
        };
        assert_eq!(m.reason, MissReason::PvcMissing);
        assert_eq!(
            m.missing.as_deref(),
            Some("PVC team-b/llama3-8b-workers does not exist")
        );
        idx.insert_documents(&read_documents("state.yaml", state).unwrap())
            .unwrap();
        let Lookup::Miss(m) = idx.lookup(&LookupRequest::new("team-b", uri)) else {
            panic!("a miss without status")
        };
        assert_eq!(m.reason, MissReason::NotDownloaded);
        let mut cache = text.split("---").next().unwrap().to_string();
        cache.push_str("status: {nodeStatus: {gpu-1: NodeDownloaded}}\n");
        idx.insert_documents(&read_documents("status.yaml", &cache).unwrap())
            .unwrap();
        let h = idx.lookup(&LookupRequest::new("team-b", uri));
        let h = h.hit().expect("a hit with PVC, Node and status");
        assert_eq!(h.cache.name, "llama3-8b");
        let p = h.placement.as_ref().unwrap();
        assert_eq!(p.nodes, ["gpu-1"]);
        assert_eq!(
            p.required_terms.as_ref().unwrap()[0]
                .match_expressions
                .as_ref()
                .unwrap()[0]
                .key,
            "node-type"
        );
        // team-a's own cache wins there, and is still downloading.
        let Lookup::Miss(m) = idx.lookup(&LookupRequest::new("team-a", uri)) else {
            panic!("team-a's cache is downloading")
        };
        assert_eq!(
            (m.reason, m.cache.unwrap().name.as_str()),
            (MissReason::NotDownloaded, "mine")
        );
        assert_eq!(idx.counts().pvcs, 2);
        assert_eq!(idx.counts().nodes, 1);
    }

    #[test]
    fn refuses_other_kinds_and_missing_fields_with_the_origin() {
        let docs = read_documents(
            "c.yaml",
            "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n---\napiVersion: v1\nkind: Node\nmetadata: {}\n",
        )
        .unwrap();
        let e = format!(
            "{:#}",
            CacheIndex::new().insert_documents(&docs).unwrap_err()
        );
        assert_eq!(e, "c.yaml#2: Node has no metadata.name");
        let docs =
            read_documents("c.yaml", "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n").unwrap();
        assert_eq!(
            CacheIndex::new().insert_documents(&docs).unwrap(),
            ["c.yaml (Pod)"]
        );
        let docs = read_documents(
            "c.yaml",
            "apiVersion: serving.kserve.io/v1\nkind: LocalModelCache\nmetadata: {name: p}\n",
        )
        .unwrap();
        let e = format!(
            "{:#}",
            CacheIndex::new().insert_documents(&docs).unwrap_err()
        );
        assert!(
            e.starts_with("c.yaml: expected apiVersion serving.kserve.io/v1alpha1"),
            "{e}"
        );
        let docs = read_documents(
            "c.yaml",
            "apiVersion: serving.kserve.io/v1alpha1\nkind: LocalModelNamespaceCache\nmetadata: {name: p}\nspec: {sourceModelUri: x}\n",
        )
        .unwrap();
        let e = format!(
            "{:#}",
            CacheIndex::new().insert_documents(&docs).unwrap_err()
        );
        assert!(e.contains("has no metadata.namespace"), "{e}");
        let docs = read_documents(
            "c.yaml",
            "apiVersion: serving.kserve.io/v1alpha1\nkind: LocalModelCache\nmetadata: {name: p}\nspec: {}\n",
        )
        .unwrap();
        let e = format!(
            "{:#}",
            CacheIndex::new().insert_documents(&docs).unwrap_err()
        );
        assert!(e.contains("sourceModelUri"), "{e}");
    }
}
