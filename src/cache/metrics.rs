//! The cache's Prometheus metrics, registered by the server in its own registry.
//!
//! | metric | labels | meaning |
//! |---|---|---|
//! | `modelgate_cache_objects` | `kind` | objects in the published index, also `PersistentVolumeClaim` and `Node` |
//! | `modelgate_cache_lookups_total` | `result` = `namespace`, `cluster`, `miss`; `reason` = `none` or the miss reason of docs/policy.md §5 | model URI resolutions, counted per `/mutate` admission that resolved one |
//! | `modelgate_cache_synced` | `kind` | 1 once the kind's first list arrived (or its CRD is absent), else 0 |
//! | `modelgate_cache_watch_restarts_total` | `kind` | list/watch failures and relists of the kind |
//! | `modelgate_cache_skipped_total` | `kind`; `reason` = a [`SkipReason`] | objects left out (or kept with parts left out) when converted, and objects ignored past a cap: one per object each time it is converted or offered (docs/model-cache.md, "Bounds") |
//! | `modelgate_exception_expiry_timestamp_seconds` | `namespace`, `name` | the `spec.expires` of each `ModelgateException` in the published index, Unix seconds: the soonest [`MAX_EXPIRY_SERIES`] |
//!
//! Lookups are counted where their answer is used: the admission's summary says how its model
//! URI was resolved ([`Resolved`]), and the server's metrics count it through the
//! [`LookupCounters`] resolved here once. A miss decided before a lookup (`opted-out`,
//! `kserve-managed`, `not-synced`) is counted alike. The index itself counts nothing, so the
//! offline commands and the validator's replay of a mutation are not counted.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};

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
struct ExceptionLabels {
    namespace: String,
    name: String,
}

/// The most `modelgate_exception_expiry_timestamp_seconds` series, as many as the uses counter
/// has: past it, only the exceptions that expire soonest are exported (ties by namespace, then
/// name), so that the ones an alert must see are never the ones left out.
pub const MAX_EXPIRY_SERIES: usize = 500;

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
    /// `modelgate_exception_expiry_timestamp_seconds`, and the series it exports now.
    exception_expiry: Family<ExceptionLabels, Gauge>,
    expiry_series: Arc<Mutex<HashSet<ExceptionLabels>>>,
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
            exception_expiry: Family::default(),
            expiry_series: Arc::default(),
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

    /// Adds the families to the server's registry.
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
        registry.register(
            "modelgate_exception_expiry_timestamp_seconds",
            "The spec.expires of each ModelgateException held, in Unix seconds, by its namespace \
             and name (the soonest 500; docs/exceptions.md)",
            self.exception_expiry.clone(),
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
        self.set_exception_expiries(index);
    }

    /// Exports the `expires` of the index's exceptions, the soonest [`MAX_EXPIRY_SERIES`], and
    /// drops the series of those no longer held (or no longer among the soonest).
    fn set_exception_expiries(&self, index: &CacheIndex) {
        let mut held: Vec<_> = index
            .exceptions()
            .map(|e| (e.expires, &*e.namespace, &*e.name))
            .collect();
        if held.len() > MAX_EXPIRY_SERIES {
            held.select_nth_unstable(MAX_EXPIRY_SERIES - 1);
            held.truncate(MAX_EXPIRY_SERIES);
        }
        let mut exported = self
            .expiry_series
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mut next = HashSet::with_capacity(held.len());
        for (expires, namespace, name) in held {
            let labels = ExceptionLabels {
                namespace: namespace.to_string(),
                name: name.to_string(),
            };
            self.exception_expiry.get_or_create(&labels).set(expires);
            exported.remove(&labels);
            next.insert(labels);
        }
        for gone in exported.drain() {
            self.exception_expiry.remove(&gone);
        }
        *exported = next;
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

    fn exception(namespace: &str, name: &str, expires: &str) -> Arc<crate::exceptions::Exception> {
        let object = serde_json::json!({
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"reason": "r", "expires": expires, "rules": ["non-root"],
                     "selector": {"matchLabels": {"app": "vendor"}}}
        });
        Arc::new(crate::exceptions::Exception::from_object(&object).unwrap())
    }

    fn expiry_lines(registry: &Registry) -> Vec<String> {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
        text.lines()
            .filter(|l| l.starts_with("modelgate_exception_expiry_timestamp_seconds{"))
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn exception_expiries_follow_the_index_within_a_bounded_number_of_series() {
        let metrics = CacheMetrics::new();
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let mut index = CacheIndex::new();
        metrics.set_objects(&index);
        assert!(expiry_lines(&registry).is_empty());

        index.upsert_exception(exception("team-a", "vendor-root", "2027-01-01T00:00:00Z"));
        index.upsert_exception(exception("team-b", "old", "2026-12-10T00:00:00Z"));
        metrics.set_objects(&index);
        let mut lines = expiry_lines(&registry);
        lines.sort();
        assert_eq!(
            lines,
            [
                r#"modelgate_exception_expiry_timestamp_seconds{namespace="team-a",name="vendor-root"} 1798761600"#,
                r#"modelgate_exception_expiry_timestamp_seconds{namespace="team-b",name="old"} 1796860800"#,
            ]
        );

        // Replaced, then removed: the series follows, then goes.
        index.upsert_exception(exception("team-b", "old", "2026-12-11T00:00:00Z"));
        index.remove_exception("team-a", "vendor-root");
        metrics.set_objects(&index);
        assert_eq!(
            expiry_lines(&registry),
            [
                r#"modelgate_exception_expiry_timestamp_seconds{namespace="team-b",name="old"} 1796947200"#
            ]
        );

        // Past the bound, the ones that expire latest are left out.
        for i in 0..MAX_EXPIRY_SERIES {
            index.upsert_exception(exception(
                "team-c",
                &format!("e{i}"),
                "2027-02-01T00:00:00Z",
            ));
        }
        metrics.set_objects(&index);
        let lines = expiry_lines(&registry);
        assert_eq!(lines.len(), MAX_EXPIRY_SERIES);
        assert!(lines.iter().any(|l| l.contains(r#"name="old""#)));
        index.remove_exception("team-b", "old");
        metrics.set_objects(&index);
        let lines = expiry_lines(&registry);
        assert_eq!(lines.len(), MAX_EXPIRY_SERIES);
        assert!(!lines.iter().any(|l| l.contains(r#"name="old""#)));
    }
}
