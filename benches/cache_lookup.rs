//! Lookup cost against the number of caches in the index (SPEC.md §5: "a lookup makes no API call
//! and costs O(log n) or better"). Run with `cargo bench --bench cache_lookup`.
//!
//! The index holds `n` caches, half cluster-wide and half spread over 100 namespaces, under 1 000
//! organisations. Each size is measured for an exact hit, a hit on a file deep under a cache, a
//! namespace-scope hit, and a miss; `rebuild` is what one debounced publish of the watch costs.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use modelgate::cache::{CacheEntry, CacheIndex, CacheScope};

const SIZES: [usize; 3] = [10, 1_000, 100_000];

fn entries(n: usize) -> Vec<CacheEntry> {
    (0..n)
        .map(|i| CacheEntry {
            scope: if i % 2 == 0 {
                CacheScope::Cluster
            } else {
                CacheScope::Namespace(format!("team-{}", i % 100))
            },
            name: format!("cache-{i}"),
            source_model_uri: format!("hf://org-{}/model-{i}", i % 1_000),
            node_groups: vec!["workers".into()],
        })
        .collect()
}

fn index_of(entries: &[CacheEntry]) -> CacheIndex {
    let mut index = CacheIndex::new();
    for e in entries {
        index.upsert_cache(e.clone());
    }
    index.upsert_node_group("workers", None);
    index
}

fn lookups(c: &mut Criterion) {
    let mut group = c.benchmark_group("lookup");
    for n in SIZES {
        let index = index_of(&entries(n));
        // cache-0 is cluster-wide, cache-1 lives in team-1.
        let exact = "hf://org-0/model-0";
        let deep = "hf://org-0/model-0/snapshots/0123456789abcdef/config.json";
        let namespaced = "hf://org-1/model-1/tokenizer.json";
        let miss = "hf://org-0/model-0-evil/snapshots/0123456789abcdef/config.json";
        assert!(index.lookup("team-1", exact, None).is_some());
        assert!(index.lookup("team-1", deep, None).is_some());
        assert!(index.lookup("team-1", namespaced, None).is_some());
        assert!(index.lookup("team-1", miss, None).is_none());
        for (name, uri) in [
            ("exact", exact),
            ("deep", deep),
            ("namespace", namespaced),
            ("miss", miss),
        ] {
            group.bench_with_input(BenchmarkId::new(name, n), &uri, |b, uri| {
                b.iter(|| index.lookup(black_box("team-1"), black_box(uri), None))
            });
        }
    }
    group.finish();
}

fn rebuild(c: &mut Criterion) {
    let mut group = c.benchmark_group("rebuild");
    group.sample_size(10);
    for n in SIZES {
        let entries = entries(n);
        group.bench_with_input(BenchmarkId::from_parameter(n), &entries, |b, entries| {
            b.iter(|| index_of(black_box(entries)))
        });
    }
    group.finish();
}

criterion_group!(benches, lookups, rebuild);
criterion_main!(benches);
