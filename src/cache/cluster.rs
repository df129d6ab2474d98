//! The cache objects as the cluster serves them: the three kinds, their conversion into index
//! entries, and a one-time list (`review --from-cluster`). The continuous watch is in
//! [`super::watch`].
//!
//! Objects are read as `DynamicObject`s and converted one by one, so a single object whose spec
//! does not decode is skipped with a warning instead of failing the whole list of its kind.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::NodeSelectorTerm;
use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use serde::de::DeserializeOwned;

use super::objects::{LocalModelCacheSpec, LocalModelNamespaceCacheSpec, LocalModelNodeGroupSpec};
use super::{
    CacheEntry, CacheIndex, LocalModelCache, LocalModelNamespaceCache, LocalModelNodeGroup,
    node_group_terms,
};

/// The three watched kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// `LocalModelCache` (cluster-scoped).
    Cache,
    /// `LocalModelNamespaceCache` (namespaced, watched in all namespaces).
    NamespaceCache,
    /// `LocalModelNodeGroup` (cluster-scoped).
    NodeGroup,
}

impl Kind {
    pub const ALL: [Kind; 3] = [Kind::Cache, Kind::NamespaceCache, Kind::NodeGroup];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Cache => "LocalModelCache",
            Kind::NamespaceCache => "LocalModelNamespaceCache",
            Kind::NodeGroup => "LocalModelNodeGroup",
        }
    }

    /// Group, version, kind and plural, as the derived types declare them.
    pub fn api_resource(self) -> ApiResource {
        match self {
            Kind::Cache => ApiResource::erase::<LocalModelCache>(&()),
            Kind::NamespaceCache => ApiResource::erase::<LocalModelNamespaceCache>(&()),
            Kind::NodeGroup => ApiResource::erase::<LocalModelNodeGroup>(&()),
        }
    }

    /// The kind's objects in every namespace.
    pub(crate) fn api(self, client: kube::Client) -> Api<DynamicObject> {
        Api::all_with(client, &self.api_resource())
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One cluster object, converted once on arrival.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Converted {
    Cache(CacheEntry),
    NodeGroup {
        name: String,
        terms: Option<Vec<NodeSelectorTerm>>,
    },
}

impl Converted {
    pub(crate) fn insert_into(&self, index: &mut CacheIndex) {
        match self {
            Converted::Cache(entry) => index.upsert_cache(entry.clone()),
            Converted::NodeGroup { name, terms } => index.upsert_node_group(name, terms.clone()),
        }
    }
}

/// The identity of an object within its kind: namespace (empty for cluster-scoped) and name.
pub(crate) type ObjectKey = (String, String);

pub(crate) fn object_key(obj: &DynamicObject) -> ObjectKey {
    (
        obj.metadata.namespace.clone().unwrap_or_default(),
        obj.metadata.name.clone().unwrap_or_default(),
    )
}

/// `kind ns/name` (or `kind name`) for log lines.
pub(crate) fn describe(kind: Kind, key: &ObjectKey) -> String {
    match key {
        (ns, name) if ns.is_empty() => format!("{kind} {name}"),
        (ns, name) => format!("{kind} {ns}/{name}"),
    }
}

fn spec<T: DeserializeOwned>(obj: &mut DynamicObject) -> Result<T, String> {
    let spec = obj
        .data
        .get_mut("spec")
        .map(std::mem::take)
        .ok_or("has no spec")?;
    serde_json::from_value(spec).map_err(|e| format!("spec does not decode: {e}"))
}

/// Converts an object of `kind` into what the index keeps; the error says why it is unusable.
pub(crate) fn convert(kind: Kind, mut obj: DynamicObject) -> Result<Converted, String> {
    if obj.metadata.name.as_deref().unwrap_or("").is_empty() {
        return Err("has no metadata.name".into());
    }
    let metadata = std::mem::take(&mut obj.metadata);
    let entry = match kind {
        Kind::Cache => {
            let spec: LocalModelCacheSpec = spec(&mut obj)?;
            CacheEntry::from(&LocalModelCache { metadata, spec })
        }
        Kind::NamespaceCache => {
            if metadata.namespace.as_deref().unwrap_or("").is_empty() {
                return Err("has no metadata.namespace".into());
            }
            let spec: LocalModelNamespaceCacheSpec = spec(&mut obj)?;
            CacheEntry::from(&LocalModelNamespaceCache { metadata, spec })
        }
        Kind::NodeGroup => {
            let spec: LocalModelNodeGroupSpec = spec(&mut obj)?;
            let group = LocalModelNodeGroup { metadata, spec };
            return Ok(Converted::NodeGroup {
                terms: node_group_terms(&group),
                name: group.metadata.name.unwrap_or_default(),
            });
        }
    };
    if entry.source_model_uri.is_empty() {
        return Err("spec.sourceModelUri is empty".into());
    }
    Ok(Converted::Cache(entry))
}

/// The index to publish: the cluster's objects, then the `--caches` objects, which replace a
/// cluster object of the same kind, namespace and name.
pub(crate) fn build_index<'a>(
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

/// Why the cluster's caches could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ClusterCacheError {
    #[error(
        "cannot reach the cluster (kubeconfig or in-cluster configuration): {0}; \
         --no-cluster resolves against --caches only"
    )]
    Client(#[source] kube::Error),
    #[error("cannot list {kind}: {source}")]
    List {
        kind: Kind,
        #[source]
        source: kube::Error,
    },
    #[error("cannot start the runtime for the cluster client: {0}")]
    Runtime(#[source] std::io::Error),
}

/// A 404 on a kind's collection: its CustomResourceDefinition is not installed.
pub(crate) fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

/// What a one-time list found.
#[derive(Debug)]
pub struct Listed {
    /// The cluster's objects merged with the static ones.
    pub index: CacheIndex,
    /// Kinds whose CRD is not installed, and objects skipped as unusable, for the user.
    pub notes: Vec<String>,
}

/// Lists the three kinds once, in pages of 500, and merges `static_index` over them.
pub async fn list_once(
    client: kube::Client,
    static_index: &CacheIndex,
) -> Result<Listed, ClusterCacheError> {
    let mut objects = Vec::new();
    let mut notes = Vec::new();
    for kind in Kind::ALL {
        let api = kind.api(client.clone());
        let mut params = ListParams::default().limit(500);
        loop {
            let page = match api.list(&params).await {
                Ok(page) => page,
                Err(e) if is_not_found(&e) => {
                    notes.push(format!("{kind}: the CRD is not installed; none listed"));
                    break;
                }
                Err(source) => return Err(ClusterCacheError::List { kind, source }),
            };
            for obj in page.items {
                let key = object_key(&obj);
                match convert(kind, obj) {
                    Ok(c) => objects.push(c),
                    Err(why) => notes.push(format!("{} skipped: {why}", describe(kind, &key))),
                }
            }
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(token) => params = params.continue_token(&token),
                None => break,
            }
        }
    }
    Ok(Listed {
        index: build_index(static_index, &objects),
        notes,
    })
}

/// [`list_once`] for synchronous callers (`review --from-cluster`), with the client of the current
/// kubeconfig context (or the in-cluster configuration).
pub fn list_once_blocking(static_index: &CacheIndex) -> Result<Listed, ClusterCacheError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(ClusterCacheError::Runtime)?;
    runtime.block_on(async {
        let client = kube::Client::try_default()
            .await
            .map_err(ClusterCacheError::Client)?;
        list_once(client, static_index).await
    })
}

/// Converted objects of one kind, by key.
pub(crate) type KindObjects = HashMap<ObjectKey, std::sync::Arc<Converted>>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::CacheScope;
    use serde_json::json;

    fn dynamic(v: serde_json::Value) -> DynamicObject {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn plural_names_match_the_crds() {
        let plurals: Vec<_> = Kind::ALL.iter().map(|k| k.api_resource().plural).collect();
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
                .all(|k| k.api_resource().api_version == "serving.kserve.io/v1alpha1")
        );
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
            Converted::Cache(CacheEntry {
                scope: CacheScope::Namespace("team-a".into()),
                name: "m".into(),
                source_model_uri: "hf://org/m".into(),
                node_groups: vec!["workers".into()],
            })
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
        ] {
            let e = convert(kind, dynamic(obj)).unwrap_err();
            assert!(e.contains(why), "{e}");
        }
    }

    #[test]
    fn static_objects_replace_cluster_objects_of_the_same_name() {
        let cluster = [
            Converted::Cache(CacheEntry {
                scope: CacheScope::Cluster,
                name: "shared".into(),
                source_model_uri: "hf://cluster".into(),
                node_groups: vec!["g".into()],
            }),
            Converted::NodeGroup {
                name: "g".into(),
                terms: None,
            },
        ];
        let mut files = CacheIndex::new();
        files.upsert_cache(CacheEntry {
            scope: CacheScope::Cluster,
            name: "shared".into(),
            source_model_uri: "hf://file".into(),
            node_groups: vec!["g".into()],
        });
        let index = build_index(&files, &cluster);
        assert_eq!(index.counts(), (0, 1, 1));
        assert!(index.lookup("x", "hf://cluster", None).is_none());
        assert!(index.lookup("x", "hf://file", None).is_some());
    }
}
