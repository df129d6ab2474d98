//! The in-memory index of model caches: the one place a model URI is matched (SPEC.md §5).
//!
//! Caches are keyed by their source URI with one trailing `/` stripped. A lookup walks the model
//! URI's prefixes that end at a `/` boundary, longest first, and probes a hash map for each, so
//! its cost depends on the URI's length and not on the number of caches. The namespace scope is
//! searched completely before the cluster scope.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use k8s_openapi::api::core::v1::NodeSelectorTerm;

use super::metrics::{LookupCounters, LookupResult};

/// Which scope a cache comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CacheScope {
    Namespace(String),
    Cluster,
}

/// One cache object as the index keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheEntry {
    pub scope: CacheScope,
    pub name: String,
    /// `spec.sourceModelUri` exactly as written (the storage key hashes this).
    pub source_model_uri: String,
    pub node_groups: Vec<String>,
}

impl CacheEntry {
    pub fn kind(&self) -> &'static str {
        match self.scope {
            CacheScope::Namespace(_) => "LocalModelNamespaceCache",
            CacheScope::Cluster => "LocalModelCache",
        }
    }
}

/// The answer to a lookup: the winning cache and the node group whose volume holds the model.
#[derive(Clone, Debug, PartialEq)]
pub struct CacheMatch {
    pub cache: Arc<CacheEntry>,
    pub node_group: String,
    /// `persistentVolumeSpec.nodeAffinity.required.nodeSelectorTerms` of that node group, if any.
    pub required_node_terms: Option<Arc<[NodeSelectorTerm]>>,
}

/// Strips one trailing `/`, as matching requires for both URIs.
pub fn trim_uri(uri: &str) -> &str {
    uri.strip_suffix('/').unwrap_or(uri)
}

/// Caches of one scope (one namespace, or the cluster).
#[derive(Clone, Debug, Default)]
struct Scope {
    /// trimmed source URI → caches with that URI, ordered by name.
    by_uri: HashMap<String, BTreeMap<String, Arc<CacheEntry>>>,
    /// name → trimmed source URI, to find the old entry on update and delete.
    uri_of: HashMap<String, String>,
}

impl Scope {
    fn upsert(&mut self, entry: CacheEntry) {
        self.remove(&entry.name);
        let key = trim_uri(&entry.source_model_uri).to_string();
        self.uri_of.insert(entry.name.clone(), key.clone());
        self.by_uri
            .entry(key)
            .or_default()
            .insert(entry.name.clone(), Arc::new(entry));
    }

    fn remove(&mut self, name: &str) -> bool {
        let Some(key) = self.uri_of.remove(name) else {
            return false;
        };
        if let Some(set) = self.by_uri.get_mut(&key) {
            set.remove(name);
            if set.is_empty() {
                self.by_uri.remove(&key);
            }
        }
        true
    }

    fn len(&self) -> usize {
        self.uri_of.len()
    }

    /// Longest matching cache URI first, then the smallest name; a cache that does not serve the
    /// node group (the requested one, or else any at all) is skipped.
    fn lookup(
        &self,
        model_uri: &str,
        node_group: Option<&str>,
    ) -> Option<(Arc<CacheEntry>, String)> {
        let model = trim_uri(model_uri);
        for prefix in prefixes_longest_first(model) {
            let Some(set) = self.by_uri.get(prefix) else {
                continue;
            };
            for entry in set.values() {
                let group = match node_group {
                    Some(g) => entry.node_groups.iter().find(|n| *n == g),
                    None => entry.node_groups.first(),
                };
                if let Some(group) = group {
                    return Some((entry.clone(), group.clone()));
                }
            }
        }
        None
    }
}

/// The prefixes `p` of `uri` for which `uri == p` or `uri` starts with `p + "/"`.
fn prefixes_longest_first(uri: &str) -> impl Iterator<Item = &str> {
    std::iter::once(uri).chain(uri.rmatch_indices('/').map(move |(i, _)| &uri[..i]))
}

/// All caches modelgate knows, by scope, plus the node groups' required node terms.
#[derive(Clone, Debug, Default)]
pub struct CacheIndex {
    namespaces: HashMap<String, Scope>,
    cluster: Scope,
    node_groups: HashMap<String, Option<Arc<[NodeSelectorTerm]>>>,
    /// Counts every lookup by result (the server's `modelgate_cache_lookups_total`).
    counters: Option<LookupCounters>,
}

impl CacheIndex {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn upsert_cache(&mut self, entry: CacheEntry) {
        match &entry.scope {
            CacheScope::Cluster => self.cluster.upsert(entry),
            CacheScope::Namespace(ns) => {
                self.namespaces.entry(ns.clone()).or_default().upsert(entry)
            }
        }
    }

    pub fn remove_cache(&mut self, scope: &CacheScope, name: &str) -> bool {
        match scope {
            CacheScope::Cluster => self.cluster.remove(name),
            CacheScope::Namespace(ns) => {
                let Some(s) = self.namespaces.get_mut(ns) else {
                    return false;
                };
                let removed = s.remove(name);
                if s.len() == 0 {
                    self.namespaces.remove(ns);
                }
                removed
            }
        }
    }

    pub fn upsert_node_group(&mut self, name: &str, required_terms: Option<Vec<NodeSelectorTerm>>) {
        self.node_groups
            .insert(name.to_string(), required_terms.map(Arc::from));
    }

    pub fn remove_node_group(&mut self, name: &str) -> bool {
        self.node_groups.remove(name).is_some()
    }

    /// Adds every cache and node group of `other`, replacing those of the same scope and name.
    pub fn merge(&mut self, other: &CacheIndex) {
        let scopes = other.namespaces.values().chain([&other.cluster]);
        for entry in scopes.flat_map(|s| s.by_uri.values().flat_map(BTreeMap::values)) {
            self.upsert_cache(CacheEntry::clone(entry));
        }
        for (name, terms) in &other.node_groups {
            self.node_groups.insert(name.to_string(), terms.clone());
        }
    }

    /// From now on every [`lookup`](Self::lookup) is counted in `counters`.
    pub fn count_lookups(&mut self, counters: LookupCounters) {
        self.counters = Some(counters);
    }

    /// Number of namespace caches, cluster caches and node groups.
    pub fn counts(&self) -> (usize, usize, usize) {
        let ns = self.namespaces.values().map(Scope::len).sum();
        (ns, self.cluster.len(), self.node_groups.len())
    }

    /// Resolves `model_uri` for a pod in `namespace`: that namespace's caches first, then the
    /// cluster's. Caches of other namespaces are never considered.
    pub fn lookup(
        &self,
        namespace: &str,
        model_uri: &str,
        node_group: Option<&str>,
    ) -> Option<CacheMatch> {
        let found = self
            .namespaces
            .get(namespace)
            .and_then(|s| s.lookup(model_uri, node_group))
            .or_else(|| self.cluster.lookup(model_uri, node_group));
        if let Some(counters) = &self.counters {
            counters.record(match &found {
                Some((c, _)) if c.scope == CacheScope::Cluster => LookupResult::Cluster,
                Some(_) => LookupResult::Namespace,
                None => LookupResult::Miss,
            });
        }
        let (cache, node_group) = found?;
        let required_node_terms = self.node_groups.get(&node_group).cloned().flatten();
        Some(CacheMatch {
            cache,
            node_group,
            required_node_terms,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache(scope: CacheScope, name: &str, uri: &str, groups: &[&str]) -> CacheEntry {
        CacheEntry {
            scope,
            name: name.into(),
            source_model_uri: uri.into(),
            node_groups: groups.iter().map(|g| g.to_string()).collect(),
        }
    }

    fn ns(n: &str) -> CacheScope {
        CacheScope::Namespace(n.into())
    }

    fn hit(
        idx: &CacheIndex,
        namespace: &str,
        uri: &str,
        group: Option<&str>,
    ) -> Option<(String, String)> {
        idx.lookup(namespace, uri, group).map(|m| {
            let who = match &m.cache.scope {
                CacheScope::Namespace(n) => format!("{n}/{}", m.cache.name),
                CacheScope::Cluster => format!("cluster/{}", m.cache.name),
            };
            (who, m.node_group)
        })
    }

    #[test]
    fn prefixes_stop_at_slash_boundaries() {
        let p: Vec<_> = prefixes_longest_first("gs://b/model/v1").collect();
        assert_eq!(
            p,
            ["gs://b/model/v1", "gs://b/model", "gs://b", "gs:/", "gs:"]
        );
    }

    #[test]
    fn equal_or_slash_prefix_matches_and_lookalike_does_not() {
        let mut idx = CacheIndex::new();
        idx.upsert_cache(cache(CacheScope::Cluster, "m", "gs://b/model", &["g"]));
        assert!(hit(&idx, "a", "gs://b/model", None).is_some());
        assert!(hit(&idx, "a", "gs://b/model/sub/dir", None).is_some());
        assert_eq!(hit(&idx, "a", "gs://b/model-evil", None), None);
        assert_eq!(hit(&idx, "a", "gs://b/mode", None), None);
        // Case-sensitive.
        assert_eq!(hit(&idx, "a", "gs://b/Model", None), None);
    }

    #[test]
    fn one_trailing_slash_is_ignored_on_both_sides() {
        let mut idx = CacheIndex::new();
        idx.upsert_cache(cache(CacheScope::Cluster, "m", "s3://b/m/", &["g"]));
        assert!(hit(&idx, "a", "s3://b/m", None).is_some());
        assert!(hit(&idx, "a", "s3://b/m/", None).is_some());
        assert!(hit(&idx, "a", "s3://b/m/x", None).is_some());
        // Only one slash is stripped.
        let mut idx = CacheIndex::new();
        idx.upsert_cache(cache(CacheScope::Cluster, "m", "s3://b/m//", &["g"]));
        assert_eq!(hit(&idx, "a", "s3://b/m", None), None);
    }

    #[test]
    fn own_namespace_beats_cluster_even_when_cluster_is_longer() {
        let mut idx = CacheIndex::new();
        idx.upsert_cache(cache(CacheScope::Cluster, "long", "hf://org/m/v1", &["g"]));
        idx.upsert_cache(cache(ns("team-a"), "short", "hf://org", &["g"]));
        assert_eq!(
            hit(&idx, "team-a", "hf://org/m/v1", None).unwrap().0,
            "team-a/short"
        );
        // Another namespace never sees team-a's cache.
        assert_eq!(
            hit(&idx, "team-b", "hf://org/m/v1", None).unwrap().0,
            "cluster/long"
        );
        assert_eq!(hit(&idx, "team-b", "hf://org/other", None), None);
    }

    #[test]
    fn longest_uri_then_smallest_name_wins() {
        let mut idx = CacheIndex::new();
        idx.upsert_cache(cache(CacheScope::Cluster, "a-short", "hf://org", &["g"]));
        idx.upsert_cache(cache(CacheScope::Cluster, "z-long", "hf://org/m", &["g"]));
        idx.upsert_cache(cache(CacheScope::Cluster, "b-long", "hf://org/m/", &["g"]));
        assert_eq!(
            hit(&idx, "x", "hf://org/m/f", None).unwrap().0,
            "cluster/b-long"
        );
        assert_eq!(
            hit(&idx, "x", "hf://org/n", None).unwrap().0,
            "cluster/a-short"
        );
    }

    #[test]
    fn node_group_filters_and_defaults_to_the_first() {
        let mut idx = CacheIndex::new();
        idx.upsert_cache(cache(CacheScope::Cluster, "a", "hf://m", &["cpu", "gpu"]));
        idx.upsert_cache(cache(CacheScope::Cluster, "b", "hf://m", &["tpu"]));
        assert_eq!(
            hit(&idx, "x", "hf://m", None).unwrap(),
            ("cluster/a".into(), "cpu".into())
        );
        assert_eq!(
            hit(&idx, "x", "hf://m", Some("gpu")).unwrap(),
            ("cluster/a".into(), "gpu".into())
        );
        assert_eq!(
            hit(&idx, "x", "hf://m", Some("tpu")).unwrap(),
            ("cluster/b".into(), "tpu".into())
        );
        assert_eq!(hit(&idx, "x", "hf://m", Some("arm")), None);
        // A cache without node groups cannot be mounted from anywhere.
        let mut idx = CacheIndex::new();
        idx.upsert_cache(cache(CacheScope::Cluster, "a", "hf://m", &[]));
        assert_eq!(hit(&idx, "x", "hf://m", None), None);
    }

    #[test]
    fn a_skipped_namespace_cache_falls_back_to_the_cluster() {
        let mut idx = CacheIndex::new();
        idx.upsert_cache(cache(ns("t"), "mine", "hf://m", &["cpu"]));
        idx.upsert_cache(cache(CacheScope::Cluster, "shared", "hf://m", &["gpu"]));
        assert_eq!(
            hit(&idx, "t", "hf://m", Some("gpu")).unwrap().0,
            "cluster/shared"
        );
    }

    #[test]
    fn update_moves_and_delete_removes() {
        let mut idx = CacheIndex::new();
        idx.upsert_cache(cache(ns("t"), "c", "hf://a", &["g"]));
        assert!(hit(&idx, "t", "hf://a", None).is_some());
        idx.upsert_cache(cache(ns("t"), "c", "hf://b", &["g"]));
        assert_eq!(hit(&idx, "t", "hf://a", None), None);
        assert!(hit(&idx, "t", "hf://b", None).is_some());
        assert!(idx.remove_cache(&ns("t"), "c"));
        assert_eq!(hit(&idx, "t", "hf://b", None), None);
        assert_eq!(idx.counts(), (0, 0, 0));
        assert!(!idx.remove_cache(&ns("t"), "c"));
    }

    #[test]
    fn merge_adds_and_overrides_by_scope_and_name() {
        let mut idx = CacheIndex::new();
        idx.upsert_cache(cache(ns("t"), "c", "hf://old", &["g"]));
        idx.upsert_cache(cache(CacheScope::Cluster, "kept", "hf://kept", &["g"]));
        idx.upsert_node_group("g", None);
        let mut other = CacheIndex::new();
        other.upsert_cache(cache(ns("t"), "c", "hf://new", &["g"]));
        other.upsert_cache(cache(ns("u"), "c", "hf://u", &["g"]));
        other.upsert_node_group("g", Some(vec![NodeSelectorTerm::default()]));
        idx.merge(&other);
        assert_eq!(idx.counts(), (2, 1, 1));
        assert_eq!(hit(&idx, "t", "hf://old", None), None);
        assert_eq!(hit(&idx, "t", "hf://new", None).unwrap().0, "t/c");
        assert_eq!(hit(&idx, "u", "hf://u", None).unwrap().0, "u/c");
        assert_eq!(hit(&idx, "x", "hf://kept", None).unwrap().0, "cluster/kept");
        let m = idx.lookup("t", "hf://new", None).unwrap();
        assert_eq!(
            m.required_node_terms,
            Some(Arc::from(vec![NodeSelectorTerm::default()]))
        );
    }

    #[test]
    fn node_group_terms_come_with_the_match() {
        let mut idx = CacheIndex::new();
        idx.upsert_cache(cache(CacheScope::Cluster, "c", "hf://m", &["workers"]));
        let term = NodeSelectorTerm::default();
        idx.upsert_node_group("workers", Some(vec![term.clone()]));
        let m = idx.lookup("x", "hf://m", None).unwrap();
        assert_eq!(m.required_node_terms, Some(Arc::from(vec![term])));
    }
}
