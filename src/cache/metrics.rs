//! The cache's Prometheus metrics, registered by the server in its own registry.
//!
//! | metric | labels | meaning |
//! |---|---|---|
//! | `modelgate_cache_objects` | `kind` | objects in the published index, also `PersistentVolumeClaim` and `Node` |
//! | `modelgate_cache_lookups_total` | `result` = `namespace`, `cluster`, `miss`; `reason` = `none` or the miss reason of docs/policy.md §5 | model URI resolutions, counted per `/mutate` admission that resolved one |
//! | `modelgate_cache_synced` | `kind` | 1 once the kind's first list arrived (or its CRD is absent), else 0 |
//! | `modelgate_cache_watch_restarts_total` | `kind` | list/watch failures and relists of the kind |
//! | `modelgate_cache_skipped_total` | `kind`; `reason` = a [`SkipReason`] | objects left out (or kept with parts left out) when converted, and objects ignored past a cap: one per object each time it is converted or offered (docs/model-cache.md, "Bounds") |
//!
//! Lookups are counted where their answer is used: the admission's summary says how its model
//! URI was resolved ([`Resolved`]), and the server's metrics count it through the
//! [`LookupCounters`] resolved here once. A miss decided before a lookup (`opted-out`,
//! `kserve-managed`, `not-synced`) is counted alike. The index itself counts nothing, so the
//! offline commands and the validator's replay of a mutation are not counted.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::CacheIndex;
use super::cluster::Kind;
use super::{MissReason, Resolved, SkipReason};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SkipLabels {
    kind: &'static str,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LookupLabels {
    result: &'static str,
    reason: &'static str,
}

/// The `modelgate_cache_lookups_total` series, resolved once so that counting a lookup is one
/// atomic increment.
#[derive(Clone, Debug)]
pub struct LookupCounters {
    namespace: Counter,
    cluster: Counter,
    misses: [Counter; MissReason::ALL.len()],
}

impl LookupCounters {
    /// Counts one resolution of a model URI.
    pub fn record(&self, resolved: Resolved) {
        match resolved {
            Resolved::Namespace => self.namespace.inc(),
            Resolved::Cluster => self.cluster.inc(),
            Resolved::Miss(reason) => self.misses[reason as usize].inc(),
        };
    }
}

/// The cache metrics. Cloning shares the series.
#[derive(Clone, Debug)]
pub struct CacheMetrics {
    objects: Family<KindLabel, Gauge>,
    lookups: Family<LookupLabels, Counter>,
    synced: Family<KindLabel, Gauge>,
    watch_restarts: Family<KindLabel, Counter>,
    skipped: Family<SkipLabels, Counter>,
}

impl Default for CacheMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl CacheMetrics {
    /// Every series exists from the start (at 0), so dashboards and alerts see them before the
    /// first event.
    pub fn new() -> Self {
        let m = CacheMetrics {
            objects: Family::default(),
            lookups: Family::default(),
            synced: Family::default(),
            watch_restarts: Family::default(),
            skipped: Family::default(),
        };
        for kind in Kind::ALL {
            let label = KindLabel { kind: kind.name() };
            drop(m.objects.get_or_create(&label));
            drop(m.synced.get_or_create(&label));
            drop(m.watch_restarts.get_or_create(&label));
            for reason in SkipReason::ALL {
                if skip_applies(kind, reason) {
                    m.skipped_counter(kind, reason);
                }
            }
        }
        m.lookup_counters();
        m
    }

    /// Adds the four families to the server's registry.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "modelgate_cache_objects",
            "Model cache objects in the published index, by kind",
            self.objects.clone(),
        );
        // prometheus-client appends `_total` to counters.
        registry.register(
            "modelgate_cache_lookups",
            "Model cache resolutions, by result (namespace, cluster, miss) and miss reason \
             (none for a hit)",
            self.lookups.clone(),
        );
        registry.register(
            "modelgate_cache_synced",
            "1 once the first list of the kind has arrived (or its CRD is not installed), else 0",
            self.synced.clone(),
        );
        registry.register(
            "modelgate_cache_watch_restarts",
            "Restarts of the kind's list/watch after an error, and relists",
            self.watch_restarts.clone(),
        );
        registry.register(
            "modelgate_cache_skipped",
            "Objects left out when converted (or kept with parts left out), and objects ignored \
             past a cap, by kind and reason",
            self.skipped.clone(),
        );
    }

    fn skipped_counter(&self, kind: Kind, reason: SkipReason) -> Counter {
        self.skipped
            .get_or_create(&SkipLabels {
                kind: kind.name(),
                reason: reason.as_str(),
            })
            .clone()
    }

    /// Counts `n` objects of `kind` left out (or trimmed, or ignored) for `reason`.
    pub(crate) fn skipped(&self, kind: Kind, reason: SkipReason, n: u64) {
        if n > 0 {
            self.skipped_counter(kind, reason).inc_by(n);
        }
    }

    /// The handles that count `modelgate_cache_lookups_total` (the server's metrics keep them).
    pub fn lookup_counters(&self) -> LookupCounters {
        let get = |result, reason| {
            self.lookups
                .get_or_create(&LookupLabels { result, reason })
                .clone()
        };
        LookupCounters {
            namespace: get("namespace", "none"),
            cluster: get("cluster", "none"),
            misses: MissReason::ALL.map(|r| get("miss", r.as_str())),
        }
    }

    pub(crate) fn set_objects(&self, index: &CacheIndex) {
        let c = index.counts();
        for (kind, n) in [
            (Kind::NamespaceCache, c.namespace_caches),
            (Kind::Cache, c.cluster_caches),
            (Kind::NodeGroup, c.node_groups),
            (Kind::Pvc, c.pvcs),
            (Kind::Node, c.nodes),
            (Kind::Exception, index.exception_count()),
        ] {
            self.objects
                .get_or_create(&KindLabel { kind: kind.name() })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    pub(crate) fn set_synced(&self, kind: Kind, synced: bool) {
        self.synced
            .get_or_create(&KindLabel { kind: kind.name() })
            .set(i64::from(synced));
    }

    pub(crate) fn watch_restarted(&self, kind: Kind) {
        self.watch_restarts
            .get_or_create(&KindLabel { kind: kind.name() })
            .inc();
    }
}

/// Whether objects of `kind` can be skipped for `reason` (the series that exist from the start).
fn skip_applies(kind: Kind, reason: SkipReason) -> bool {
    match reason {
        SkipReason::Unusable => true,
        SkipReason::UriTooLong | SkipReason::NodeGroupsTrimmed | SkipReason::NodeStatusTrimmed => {
            matches!(kind, Kind::Cache | Kind::NamespaceCache)
        }
        SkipReason::OverNamespaceCap | SkipReason::OverTotalCap => kind == Kind::NamespaceCache,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::{CacheEntry, CacheScope};

    #[test]
    fn exposes_every_series_and_counts_each_resolution() {
        let metrics = CacheMetrics::new();
        let mut registry = Registry::default();
        metrics.register(&mut registry);

        let mut index = CacheIndex::new();
        index.upsert_cache(
            CacheEntry::new(
                CacheScope::Namespace("team-a".into()),
                "mine",
                "hf://org/m",
                &["workers"],
            )
            .downloaded_on(&["n1"]),
        );
        index.upsert_node_group("workers", None);
        index.upsert_node(
            "n1",
            [("kubernetes.io/hostname".to_string(), "n1".to_string())].into(),
        );
        let bound = crate::cache::PvcState::provisioned(crate::cache::PvcPhase::Bound);
        index.upsert_pvc("team-a", "mine-workers", bound);
        let counters = metrics.lookup_counters();
        metrics.set_objects(&index);
        metrics.set_synced(Kind::Cache, true);
        metrics.watch_restarted(Kind::NodeGroup);
        let lookup = |ns, uri| {
            let answer = index.lookup(&crate::cache::LookupRequest::new(ns, uri));
            counters.record(answer.resolved());
            answer
        };
        assert!(lookup("team-a", "hf://org/m").hit().is_some());
        assert_eq!(
            lookup("team-b", "hf://org/m").reason(),
            Some(MissReason::NoMatch)
        );
        assert_eq!(
            lookup("team-b", "hf://org/n").reason(),
            Some(MissReason::NoMatch)
        );
        counters.record(Resolved::Miss(MissReason::NotSynced));

        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for line in [
            r#"modelgate_cache_objects{kind="LocalModelNamespaceCache"} 1"#,
            r#"modelgate_cache_objects{kind="LocalModelCache"} 0"#,
            r#"modelgate_cache_objects{kind="PersistentVolumeClaim"} 1"#,
            r#"modelgate_cache_objects{kind="Node"} 1"#,
            r#"modelgate_cache_lookups_total{result="namespace",reason="none"} 1"#,
            r#"modelgate_cache_lookups_total{result="cluster",reason="none"} 0"#,
            r#"modelgate_cache_lookups_total{result="miss",reason="no-match"} 2"#,
            r#"modelgate_cache_lookups_total{result="miss",reason="not-synced"} 1"#,
            r#"modelgate_cache_lookups_total{result="miss",reason="pvc-missing"} 0"#,
            r#"modelgate_cache_synced{kind="Node"} 0"#,
            r#"modelgate_cache_synced{kind="LocalModelCache"} 1"#,
            r#"modelgate_cache_synced{kind="LocalModelNodeGroup"} 0"#,
            r#"modelgate_cache_watch_restarts_total{kind="LocalModelNodeGroup"} 1"#,
            r#"modelgate_cache_watch_restarts_total{kind="LocalModelCache"} 0"#,
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
        }
    }
}
