//! Lookup cost against the size of the cluster state (docs/policy.md §5: "a lookup makes no API call and
//! costs O(log n) or better in the number of caches, PVCs and nodes"). Run with
//! `cargo bench --bench cache_lookup`.
//!
//! A state of size `n` holds `n` caches (half cluster-wide, half spread over 100 namespaces, under
//! 1 000 organisations), `n` PVCs (one per cache, in the namespace of its users) and `n / 20`
//! Nodes (at least 4) in two node groups; every cache is downloaded on four nodes of group `gpu`.
//! Each size is measured for a full hit (PVC, status, node group, pinned nodes), a hit on a file
//! deep under a cache, a hit with a nodeSelector, a namespace-scope hit, a `pvc-missing` miss and
//! a `no-match` miss; `rebuild` is building the whole index (the first list), `change` what one
//! changed object costs the watch: the snapshot cloned, one PVC removed or one Node relabelled,
//! the snapshot dropped.

use std::collections::BTreeMap;
use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use k8s_openapi::api::core::v1::{NodeSelectorRequirement, NodeSelectorTerm};
use modelgate::cache::{CacheEntry, CacheIndex, CacheScope, LookupRequest, PvcPhase, PvcState};

/// (caches and PVCs, Nodes).
const SIZES: [(usize, usize); 3] = [(10, 4), (1_000, 50), (100_000, 5_000)];

fn node_type(value: &str) -> NodeSelectorTerm {
    NodeSelectorTerm {
        match_expressions: Some(vec![NodeSelectorRequirement {
            key: "node-type".into(),
            operator: "In".into(),
            values: Some(vec![value.into()]),
        }]),
        match_fields: None,
    }
}

fn node_name(i: usize) -> String {
    format!("node-{i:05}")
}

/// The objects of a state of size `n`, in the order the watch would insert them.
/// Node names and labels.
type Nodes = Vec<(String, BTreeMap<String, String>)>;

fn state(n: usize, nodes: usize) -> (Vec<CacheEntry>, Nodes) {
    let gpu_nodes = nodes / 2;
    let caches = (0..n)
        .map(|i| {
            let scope = if i % 2 == 0 {
                CacheScope::Cluster
            } else {
                CacheScope::Namespace(format!("team-{}", i % 100))
            };
            let on: Vec<String> = (0..4).map(|k| node_name((i + k) % gpu_nodes)).collect();
            let on: Vec<&str> = on.iter().map(String::as_str).collect();
            CacheEntry::new(
                scope,
                &format!("cache-{i}"),
                &format!("hf://org-{}/model-{i}", i % 1_000),
                &["gpu"],
            )
            .downloaded_on(&on)
        })
        .collect();
    let nodes = (0..nodes)
        .map(|i| {
            let kind = if i < gpu_nodes { "gpu" } else { "cpu" };
            let labels = [
                ("node-type", kind.to_string()),
                ("zone", format!("zone-{}", i % 3)),
                ("kubernetes.io/hostname", node_name(i)),
            ];
            let labels = labels.map(|(k, v)| (k.to_string(), v)).into();
            (node_name(i), labels)
        })
        .collect();
    (caches, nodes)
}

fn index_of(caches: &[CacheEntry], nodes: &[(String, BTreeMap<String, String>)]) -> CacheIndex {
    let mut index = CacheIndex::new();
    for e in caches {
        index.upsert_cache(e.clone());
    }
    for (name, labels) in nodes {
        index.upsert_node(name.as_str(), labels.clone());
    }
    index.upsert_node_group("gpu", Some(vec![node_type("gpu")]));
    index.upsert_node_group("cpu", Some(vec![node_type("cpu")]));
    let bound = PvcState::provisioned(PvcPhase::Bound);
    for i in 0..caches.len() {
        index.upsert_pvc(
            format!("team-{}", (i + 1) % 100),
            format!("cache-{i}-gpu"),
            bound.clone(),
        );
    }
    // team-1's own cache, cache-1, is used in team-1 too.
    index.upsert_pvc("team-1", "cache-1-gpu", bound);
    index
}

fn lookups(c: &mut Criterion) {
    let mut group = c.benchmark_group("lookup");
    let gpu: &[(&str, &str)] = &[("node-type", "gpu")];
    for (n, nodes) in SIZES {
        let (caches, node_list) = state(n, nodes);
        let index = index_of(&caches, &node_list);
        // cache-0 is cluster-wide with its PVC in team-1; cache-1 lives in team-1 and has its
        // PVC there; cache-2 has its PVC in team-3 only.
        let exact = LookupRequest::new("team-1", "hf://org-0/model-0");
        let deep = LookupRequest::new(
            "team-1",
            "hf://org-0/model-0/snapshots/0123456789abcdef/config.json",
        );
        let selected = LookupRequest {
            node_selector: Some(gpu),
            ..exact
        };
        let namespaced = LookupRequest::new("team-1", "hf://org-1/model-1/tokenizer.json");
        let pvc_missing = LookupRequest::new("team-1", "hf://org-2/model-2");
        let no_match = LookupRequest::new(
            "team-1",
            "hf://org-0/model-0-evil/snapshots/0123456789abcdef/config.json",
        );
        assert!(index.lookup(&exact).hit().is_some());
        assert!(index.lookup(&deep).hit().is_some());
        assert!(index.lookup(&selected).hit().is_some());
        assert_eq!(
            index.lookup(&namespaced).hit().unwrap().cache.name,
            "cache-1"
        );
        assert_eq!(
            index.lookup(&pvc_missing).reason(),
            Some(modelgate::cache::MissReason::PvcMissing)
        );
        assert_eq!(
            index.lookup(&no_match).reason(),
            Some(modelgate::cache::MissReason::NoMatch)
        );
        for (name, req) in [
            ("hit", exact),
            ("hit-deep", deep),
            ("hit-node-selector", selected),
            ("hit-namespace", namespaced),
            ("pvc-missing", pvc_missing),
            ("no-match", no_match),
        ] {
            group.bench_with_input(BenchmarkId::new(name, n), &req, |b, req| {
                b.iter(|| index.lookup(black_box(req)))
            });
        }
    }
    group.finish();
}

fn rebuild(c: &mut Criterion) {
    let mut group = c.benchmark_group("rebuild");
    group.sample_size(10);
    for (n, nodes) in SIZES {
        let state = state(n, nodes);
        group.bench_with_input(BenchmarkId::from_parameter(n), &state, |b, (c, nd)| {
            b.iter(|| index_of(black_box(c), black_box(nd)))
        });
    }
    group.finish();
}

fn change(c: &mut Criterion) {
    let mut group = c.benchmark_group("change");
    for (n, nodes) in SIZES {
        let (caches, node_list) = state(n, nodes);
        let index = index_of(&caches, &node_list);
        group.bench_with_input(BenchmarkId::new("pvc-deleted", n), &index, |b, index| {
            b.iter(|| {
                let mut next = index.clone();
                assert!(next.remove_pvc("team-1", "cache-0-gpu"));
                next
            })
        });
        let (name, labels) = &node_list[0];
        let mut relabelled = labels.clone();
        relabelled.insert("zone".into(), "elsewhere".into());
        group.bench_with_input(
            BenchmarkId::new("node-relabelled", n),
            &index,
            |b, index| {
                b.iter(|| {
                    let mut next = index.clone();
                    next.upsert_node(name.as_str(), relabelled.clone());
                    next
                })
            },
        );
    }
    group.finish();
}

criterion_group!(benches, lookups, rebuild, change);
criterion_main!(benches);
