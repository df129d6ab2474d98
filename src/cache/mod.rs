//! Model caches: KServe's cache objects and the index that answers lookups (SPEC.md §5).
//!
//! The index is filled from files (`--caches`) and, in `serve`, from the cluster's watch
//! ([`watch`]; `review --from-cluster` lists once, [`cluster`]). It is the only place a model URI
//! is matched against caches.

pub mod cluster;
pub mod index;
pub mod metrics;
pub mod objects;
pub mod store;
pub mod watch;

pub use cluster::{ClusterCacheError, Kind};
pub use index::{CacheEntry, CacheIndex, CacheMatch, CacheScope};
pub use metrics::CacheMetrics;
pub use objects::{LocalModelCache, LocalModelNamespaceCache, LocalModelNodeGroup};
pub use store::{CacheStore, CacheView};
pub use watch::{CacheSource, CacheWatch, CacheWatchConfig, ClusterCacheArgs, Readiness};

use anyhow::{Context, anyhow, bail};
use serde_json::Value;

use crate::documents::{Document, read_documents};

const GROUP_VERSION: &str = "serving.kserve.io/v1alpha1";

impl From<&LocalModelCache> for CacheEntry {
    fn from(c: &LocalModelCache) -> Self {
        CacheEntry {
            scope: CacheScope::Cluster,
            name: c.metadata.name.clone().unwrap_or_default(),
            source_model_uri: c.spec.source_model_uri.clone(),
            node_groups: c.spec.node_groups.clone(),
        }
    }
}

impl From<&LocalModelNamespaceCache> for CacheEntry {
    fn from(c: &LocalModelNamespaceCache) -> Self {
        CacheEntry {
            scope: CacheScope::Namespace(c.metadata.namespace.clone().unwrap_or_default()),
            name: c.metadata.name.clone().unwrap_or_default(),
            source_model_uri: c.spec.source_model_uri.clone(),
            node_groups: c.spec.node_groups.clone(),
        }
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
    /// Adds one cache or node-group object given as JSON. Objects of other kinds are refused.
    pub fn insert_object(&mut self, value: &Value) -> anyhow::Result<()> {
        let api_version = value
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or("");
        let kind = value.get("kind").and_then(Value::as_str).unwrap_or("");
        if api_version != GROUP_VERSION {
            bail!("expected apiVersion {GROUP_VERSION}, found `{api_version}` (kind `{kind}`)");
        }
        let name = value
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("");
        if name.is_empty() {
            bail!("{kind} has no metadata.name");
        }
        let kind = match kind {
            "LocalModelCache" => Kind::Cache,
            "LocalModelNamespaceCache" => Kind::NamespaceCache,
            "LocalModelNodeGroup" => Kind::NodeGroup,
            other => bail!(
                "expected LocalModelCache, LocalModelNamespaceCache or LocalModelNodeGroup, found kind `{other}`"
            ),
        };
        // The same conversion as for the cluster's objects, so files and cluster agree.
        let object =
            serde::Deserialize::deserialize(value).with_context(|| format!("{kind} {name}"))?;
        cluster::convert(kind, object)
            .map_err(|why| anyhow!("{kind} {name}: {why}"))?
            .insert_into(self);
        Ok(())
    }

    /// Adds every cache object of the given documents and returns the origins of the documents
    /// skipped because they are not cache objects (a file may hold the workloads too). A cache
    /// object that does not decode is an error naming the file and document.
    pub fn insert_documents(&mut self, docs: &[Document]) -> anyhow::Result<Vec<String>> {
        let mut skipped = Vec::new();
        for d in docs {
            let api_version = d.value.get("apiVersion").and_then(Value::as_str);
            let kind = d.value.get("kind").and_then(Value::as_str).unwrap_or("");
            if api_version.is_some_and(|a| !a.starts_with("serving.kserve.io/"))
                || !kind.starts_with("LocalModel")
            {
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
"#;
        let docs = read_documents("caches.yaml", text).unwrap();
        let mut idx = CacheIndex::new();
        idx.insert_documents(&docs).unwrap();
        assert_eq!(idx.counts(), (1, 1, 1));
        let m = idx
            .lookup("team-b", "hf://meta-llama/Meta-Llama-3-8B", None)
            .unwrap();
        assert_eq!(m.cache.name, "llama3-8b");
        let terms = m.required_node_terms.unwrap();
        assert_eq!(
            terms[0].match_expressions.as_ref().unwrap()[0].key,
            "node-type"
        );
        assert_eq!(
            idx.lookup("team-a", "hf://meta-llama/Meta-Llama-3-8B", None)
                .unwrap()
                .cache
                .name,
            "mine"
        );
    }

    #[test]
    fn refuses_other_kinds_and_missing_fields_with_the_origin() {
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
