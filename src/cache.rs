//! Model caches: the cluster state routing needs (docs/policy.md §5). The index and the conversion of
//! objects into it are the core's ([`modelgate_core::cache`], re-exported here); this module adds
//! where the objects come from: `--caches` files ([`load_files`]), a one-time list of the cluster
//! ([`list`], `review --from-cluster`), and `serve`'s continuous watch ([`watch`]), published
//! through the [`store`] and counted in [`metrics`].

pub use modelgate_core::cache::*;

pub mod claims;
pub mod exception_status;
pub mod list;
pub mod metrics;
mod reflect;
pub mod store;
pub mod watch;

pub use list::ClusterCacheError;
pub use metrics::CacheMetrics;
pub use store::{CacheStore, CacheView};
pub use watch::{
    CacheSource, CacheWatch, CacheWatchConfig, ClusterCacheArgs, Readiness, WatchMetrics,
};

use anyhow::Context;
use serde_json::Value;

use crate::documents::{Document, read_documents};

/// Adds every object routing reads of the given documents (caches, node groups, PVCs,
/// Nodes) and the `ModelgateException`s, and returns the origins of the documents skipped because they are none of those (a
/// file may hold the workloads too). Such an object that does not decode is an error naming
/// the file and document.
pub fn insert_documents(index: &mut CacheIndex, docs: &[Document]) -> anyhow::Result<Vec<String>> {
    let mut skipped = Vec::new();
    for d in docs {
        let api_version = d.value.get("apiVersion").and_then(Value::as_str);
        let kind = d.value.get("kind").and_then(Value::as_str).unwrap_or("");
        let core =
            api_version == Some(CORE_VERSION) && matches!(kind, "PersistentVolumeClaim" | "Node");
        let kserve = api_version.is_none_or(|a| a.starts_with("serving.kserve.io/"))
            && kind.starts_with("LocalModel");
        // Exceptions come from the same files (docs/exceptions.md).
        let exception = modelgate_core::exceptions::is_exception(&d.value);
        if !core && !kserve && !exception {
            skipped.push(format!("{} ({kind})", d.origin));
            continue;
        }
        index
            .insert_object(&d.value)
            .with_context(|| d.origin.clone())?;
    }
    Ok(skipped)
}

/// Loads `--caches` files (YAML or JSON, multi-document or `List`); returns the index and the
/// documents skipped as not cache objects.
pub fn load_files<P: AsRef<std::path::Path>>(
    paths: &[P],
) -> anyhow::Result<(CacheIndex, Vec<String>)> {
    let mut index = CacheIndex::new();
    let mut skipped = Vec::new();
    for p in paths {
        let p = p.as_ref();
        let text =
            std::fs::read_to_string(p).with_context(|| format!("{}: cannot read", p.display()))?;
        let docs = read_documents(&p.display().to_string(), &text)?;
        skipped.extend(insert_documents(&mut index, &docs)?);
    }
    Ok((index, skipped))
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
metadata: {name: gpu-1, labels: {node-type: gpu, kubernetes.io/hostname: gpu-1}}
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
        insert_documents(&mut idx, &docs).unwrap();
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
        insert_documents(&mut idx, &read_documents("state.yaml", state).unwrap()).unwrap();
        let Lookup::Miss(m) = idx.lookup(&LookupRequest::new("team-b", uri)) else {
            panic!("a miss without status")
        };
        assert_eq!(m.reason, MissReason::NotDownloaded);
        let mut cache = text.split("---").next().unwrap().to_string();
        cache.push_str("status: {nodeStatus: {gpu-1: NodeDownloaded}}\n");
        insert_documents(&mut idx, &read_documents("status.yaml", &cache).unwrap()).unwrap();
        let h = idx.lookup(&LookupRequest::new("team-b", uri));
        let h = h.hit().expect("a hit with PVC, Node and status");
        assert_eq!(h.cache.name, "llama3-8b");
        let p = h.placement.as_ref().unwrap();
        assert_eq!(p.hostnames, ["gpu-1"]);
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
            insert_documents(&mut CacheIndex::new(), &docs).unwrap_err()
        );
        assert_eq!(e, "c.yaml#2: Node has no metadata.name");
        let docs =
            read_documents("c.yaml", "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n").unwrap();
        assert_eq!(
            insert_documents(&mut CacheIndex::new(), &docs).unwrap(),
            ["c.yaml (Pod)"]
        );
        let docs = read_documents(
            "c.yaml",
            "apiVersion: serving.kserve.io/v1\nkind: LocalModelCache\nmetadata: {name: p}\n",
        )
        .unwrap();
        let e = format!(
            "{:#}",
            insert_documents(&mut CacheIndex::new(), &docs).unwrap_err()
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
            insert_documents(&mut CacheIndex::new(), &docs).unwrap_err()
        );
        assert!(e.contains("has no metadata.namespace"), "{e}");
        let docs = read_documents(
            "c.yaml",
            "apiVersion: serving.kserve.io/v1alpha1\nkind: LocalModelCache\nmetadata: {name: p}\nspec: {}\n",
        )
        .unwrap();
        let e = format!(
            "{:#}",
            insert_documents(&mut CacheIndex::new(), &docs).unwrap_err()
        );
        assert!(e.contains("sourceModelUri"), "{e}");
    }
}
