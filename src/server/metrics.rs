//! Prometheus metrics, encoded by `prometheus-client` (OpenMetrics text) at `/metrics` on the
//! probe listener.
//!
//! Label values are bounded: `kind` is a workload kind modelgate judges (`Pod`, `Job`, the
//! controllers), `other` or `none` (the body could not be read), `operation` one of the four
//! admission operations or `none`, so a client cannot grow the series without limit.
//!
//! Every family has its series from the start, at 0 (see [`Metrics::new`]): an alert's
//! `rate()` sees the first event, and an absent series means a failed scrape.
//!
//! The `process_*` metrics (CPU, memory, file descriptors, start time) come from
//! [`super::process_metrics`], registered here so that every `/metrics` carries them.

use std::sync::OnceLock;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::admission::{PolicyResult, Summary, Webhook};
use crate::cache::metrics::LookupCounters;
use crate::kinds::WorkloadKind;
use crate::namespaces::Mode;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub webhook: &'static str,
    pub kind: &'static str,
    pub operation: &'static str,
    pub allowed: bool,
    pub mutated: bool,
    pub dry_run: bool,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DurationLabels {
    pub webhook: &'static str,
    pub kind: &'static str,
    pub operation: &'static str,
    pub dry_run: bool,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ExceptionLabels {
    pub namespace: String,
    pub name: String,
}

/// The most `modelgate_exception_uses_total` series: past it, the uses of exceptions not seen
/// yet are counted under `namespace="_other", name="_other"` (docs/operations.md). Exceptions
/// are granted by hand and expire within `--max-exception-days`: a cluster has a handful.
pub const MAX_EXCEPTION_SERIES: usize = 500;
/// The label values of the uses past [`MAX_EXCEPTION_SERIES`].
pub const OTHER_EXCEPTIONS: &str = "_other";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PolicyResultLabels {
    pub webhook: &'static str,
    pub mode: &'static str,
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub result: &'static str,
}

/// Every `reason` of `modelgate_admission_errors_total` (docs/operations.md, "Metrics").
pub const ADMISSION_ERROR_REASONS: [&str; 10] = [
    "invalid_json",
    "invalid_review",
    "payload_too_large",
    "unsupported_media_type",
    "deadline_exceeded",
    "body_stalled",
    "body_too_slow",
    "body_budget_exhausted",
    "too_many_requests",
    "body_read_error",
];

/// Every `reason` of `modelgate_connections_dropped_total` (docs/operations.md, "Metrics").
pub const CONNECTION_DROP_REASONS: [&str; 14] = [
    "tls_handshake_timeout",
    "tls_handshake_failed",
    "no_request",
    "idle_timeout",
    "stalled",
    "timeout",
    "header_too_large",
    "bad_request",
    "h2_enhance_your_calm",
    "h2_protocol_error",
    "h2_frame_size_error",
    "h2_compression_error",
    "h2_flow_control_error",
    "h2_other_error",
];

/// Every `reason` of `modelgate_probe_connections_dropped_total` (docs/operations.md,
/// "Metrics"): `evicted` is a connection closed to make room for a new one at
/// `--probe-max-connections`.
pub const PROBE_CONNECTION_DROP_REASONS: [&str; 7] = [
    "evicted",
    "no_request",
    "idle_timeout",
    "stalled",
    "timeout",
    "header_too_large",
    "bad_request",
];

/// Seconds: the pipeline takes tens of microseconds, reading a large body much longer.
const DURATION_BUCKETS: [f64; 16] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];

pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    duration: Family<DurationLabels, Histogram>,
    errors: Family<ReasonLabels, Counter>,
    policy_results: Family<PolicyResultLabels, Counter>,
    tls_reloads: Family<ResultLabels, Counter>,
    cert_expiry: Gauge,
    inflight: Gauge,
    connections_dropped: Family<ReasonLabels, Counter>,
    accept_paused: Counter,
    open_connections: Gauge,
    buffered_body_bytes: Gauge,
    probe_connections_dropped: Family<ReasonLabels, Counter>,
    probe_open_connections: Gauge,
    /// `modelgate_cache_lookups_total`, registered by the cache metrics, counted here from each
    /// admission's summary.
    cache_lookups: Option<LookupCounters>,
    /// The series of `requests`, `duration` and `policy_results`, each kept at its first use.
    series: SeriesCache,
    /// `modelgate_exception_uses_total`, and the series it has (bounded).
    exception_uses: Family<ExceptionLabels, Counter>,
    exception_series: std::sync::Mutex<std::collections::HashSet<(String, String)>>,
}

/// Every `kind` label value: the workload kinds, then `none` (no kind) and `other`; a kind's
/// index here is its slot in [`SeriesCache`].
const KIND_LABELS: [&str; WORKLOAD_KINDS + 2] = {
    let mut labels = ["none"; WORKLOAD_KINDS + 2];
    let mut i = 0;
    while i < WORKLOAD_KINDS {
        labels[i] = WorkloadKind::ALL[i].as_str();
        i += 1;
    }
    labels[WORKLOAD_KINDS + 1] = "other";
    labels
};
const WORKLOAD_KINDS: usize = WorkloadKind::ALL.len();

/// Every `operation` label value, indexed as [`KIND_LABELS`].
const OPERATION_LABELS: [&str; 5] = ["CREATE", "UPDATE", "DELETE", "CONNECT", "none"];

const WEBHOOKS: [Webhook; 2] = [Webhook::Mutate, Webhook::Validate];

fn webhook_index(webhook: Webhook) -> usize {
    match webhook {
        Webhook::Mutate => 0,
        Webhook::Validate => 1,
    }
}

fn kind_index(kind: &str) -> usize {
    match kind {
        "" => WORKLOAD_KINDS,
        kind => KIND_LABELS[..WORKLOAD_KINDS]
            .iter()
            .position(|k| *k == kind)
            .unwrap_or(WORKLOAD_KINDS + 1),
    }
}

fn operation_index(operation: &str) -> usize {
    OPERATION_LABELS[..4]
        .iter()
        .position(|o| *o == operation)
        .unwrap_or(4)
}

/// The label set of a duration series, as the index of its slot.
#[derive(Clone, Copy)]
struct DurationSlot(usize);

const DURATION_SLOTS: usize = WEBHOOKS.len() * KIND_LABELS.len() * OPERATION_LABELS.len() * 2;
const REQUEST_SLOTS: usize = DURATION_SLOTS * 4;
const POLICY_SLOTS: usize = WEBHOOKS.len() * Mode::ALL.len() * PolicyResult::ALL.len();

/// The results a webhook gives in a namespace mode (docs/policy.md §9): `/validate` never patches, and
/// `off` leaves every object unchanged. Each of these series is exported from the start.
pub fn results_of(webhook: Webhook, mode: Mode) -> &'static [PolicyResult] {
    use PolicyResult::{Denied, Patched, Unchanged, WouldDeny, WouldPatch};
    match (webhook, mode) {
        (_, Mode::Off) => &[Unchanged],
        (Webhook::Mutate, Mode::Enforce) => &[Patched, Denied, Unchanged],
        (Webhook::Validate, Mode::Enforce) => &[Denied, Unchanged],
        (Webhook::Mutate, Mode::Warn | Mode::Audit) => &[WouldPatch, WouldDeny, Unchanged],
        (Webhook::Validate, Mode::Warn | Mode::Audit) => &[WouldDeny, Unchanged],
    }
}

/// The `(allowed, mutated)` label pairs of a webhook's answers: `/validate` never patches.
fn answers(webhook: Webhook) -> &'static [(bool, bool)] {
    match webhook {
        Webhook::Mutate => &[(true, true), (true, false), (false, false)],
        Webhook::Validate => &[(true, false), (false, false)],
    }
}

impl DurationSlot {
    fn new(webhook: Webhook, kind: usize, operation: usize, dry_run: bool) -> Self {
        let slot = (webhook_index(webhook) * KIND_LABELS.len() + kind) * OPERATION_LABELS.len();
        DurationSlot((slot + operation) * 2 + usize::from(dry_run))
    }

    fn labels(self) -> DurationLabels {
        let i = self.0;
        let operation = (i / 2) % OPERATION_LABELS.len();
        let kind = (i / 2 / OPERATION_LABELS.len()) % KIND_LABELS.len();
        let webhook = i / 2 / OPERATION_LABELS.len() / KIND_LABELS.len();
        DurationLabels {
            webhook: WEBHOOKS[webhook].as_str(),
            kind: KIND_LABELS[kind],
            operation: OPERATION_LABELS[operation],
            dry_run: i % 2 == 1,
        }
    }

    fn request(self, allowed: bool, mutated: bool) -> usize {
        self.0 * 4 + usize::from(allowed) * 2 + usize::from(mutated)
    }
}

/// Handles on the per-admission series, each looked up in its family once and then kept: a
/// family lookup hashes the whole label set and takes the family's lock, which every request
/// shares. A handle shares its value with the family's series, so `/metrics` reads what they
/// count. The series of a Pod CREATE (the admission a cluster sends most) and every policy
/// result are created with the metrics ([`Metrics::new`]); others appear at their first use.
struct SeriesCache {
    requests: Box<[OnceLock<Counter>]>,
    duration: Box<[OnceLock<Histogram>]>,
    policy_results: Box<[OnceLock<Counter>]>,
}

impl SeriesCache {
    fn new() -> Self {
        fn slots<M>(n: usize) -> Box<[OnceLock<M>]> {
            (0..n).map(|_| OnceLock::new()).collect()
        }
        SeriesCache {
            requests: slots(REQUEST_SLOTS),
            duration: slots(DURATION_SLOTS),
            policy_results: slots(POLICY_SLOTS),
        }
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

pub fn kind_label(kind: &str) -> &'static str {
    KIND_LABELS[kind_index(kind)]
}

pub fn operation_label(operation: &str) -> &'static str {
    OPERATION_LABELS[operation_index(operation)]
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "modelgate_admission_requests",
            "AdmissionReviews answered by the pipeline (HTTP 200 and 400)",
            requests.clone(),
        );
        let duration: Family<DurationLabels, Histogram> =
            Family::new_with_constructor(|| Histogram::new(DURATION_BUCKETS));
        registry.register(
            "modelgate_admission_duration_seconds",
            "Time from the request's arrival to its answer, body reading included",
            duration.clone(),
        );
        let errors = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "modelgate_admission_errors",
            "Admission requests that could not be reviewed, by reason",
            errors.clone(),
        );
        let policy_results = Family::<PolicyResultLabels, Counter>::default();
        registry.register(
            "modelgate_policy_results",
            "Pod and Job admissions the policy judged, by webhook, namespace mode (docs/policy.md §9) \
             and result (patched, denied, unchanged, would_patch, would_deny)",
            policy_results.clone(),
        );
        let exception_uses = Family::<ExceptionLabels, Counter>::default();
        registry.register(
            "modelgate_exception_uses",
            "Answers that used a ModelgateException, by its namespace and name (docs/exceptions.md)",
            exception_uses.clone(),
        );
        // Exported from the start (at 0), so that the family and its labels are known before
        // the first use.
        exception_uses
            .get_or_create(&ExceptionLabels {
                namespace: OTHER_EXCEPTIONS.to_string(),
                name: OTHER_EXCEPTIONS.to_string(),
            })
            .inc_by(0);
        let tls_reloads = Family::<ResultLabels, Counter>::default();
        registry.register(
            "modelgate_tls_reloads",
            "Loads of the serving certificate pair (the first one included), by result",
            tls_reloads.clone(),
        );
        let cert_expiry = Gauge::default();
        registry.register(
            "modelgate_tls_certificate_expiry_timestamp_seconds",
            "notAfter of the serving certificate in use, as a Unix timestamp",
            cert_expiry.clone(),
        );
        let inflight = Gauge::default();
        registry.register(
            "modelgate_inflight_requests",
            "Admission requests being handled",
            inflight.clone(),
        );
        let connections_dropped = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "modelgate_connections_dropped",
            "Webhook connections refused or closed by the server (limits, timeouts, protocol errors), by reason",
            connections_dropped.clone(),
        );
        let accept_paused = Counter::default();
        registry.register(
            "modelgate_accept_paused",
            "Times the webhook listener stopped accepting because --max-connections connections were open (new connections wait in the listen backlog)",
            accept_paused.clone(),
        );
        let open_connections = Gauge::default();
        registry.register(
            "modelgate_open_connections",
            "Webhook connections open (TLS handshake included)",
            open_connections.clone(),
        );
        let buffered_body_bytes = Gauge::default();
        registry.register(
            "modelgate_buffered_body_bytes",
            "Bytes held by request bodies that arrived in more than one part, against --max-buffered-body-bytes",
            buffered_body_bytes.clone(),
        );
        let probe_connections_dropped = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "modelgate_probe_connections_dropped",
            "Probe listener connections closed by the server (evicted at --probe-max-connections, timeouts, oversized heads), by reason",
            probe_connections_dropped.clone(),
        );
        let probe_open_connections = Gauge::default();
        registry.register(
            "modelgate_probe_open_connections",
            "Probe listener connections open, against --probe-max-connections",
            probe_open_connections.clone(),
        );
        registry.register_collector(Box::new(super::process_metrics::ProcessCollector::new()));
        // The series alerts and dashboards read exist at 0 from the start: a counter that
        // appears only at its first increment has no rate() for that first one, and an
        // absent series cannot be told from a scrape that failed.
        for reason in ADMISSION_ERROR_REASONS {
            drop(errors.get_or_create(&ReasonLabels { reason }));
        }
        for reason in CONNECTION_DROP_REASONS {
            drop(connections_dropped.get_or_create(&ReasonLabels { reason }));
        }
        for reason in PROBE_CONNECTION_DROP_REASONS {
            drop(probe_connections_dropped.get_or_create(&ReasonLabels { reason }));
        }
        for result in ["success", "failure"] {
            drop(tls_reloads.get_or_create(&ResultLabels { result }));
        }
        let metrics = Metrics {
            registry,
            requests,
            duration,
            errors,
            policy_results,
            tls_reloads,
            cert_expiry,
            inflight,
            connections_dropped,
            accept_paused,
            open_connections,
            buffered_body_bytes,
            probe_connections_dropped,
            probe_open_connections,
            cache_lookups: None,
            series: SeriesCache::new(),
            exception_uses,
            exception_series: Default::default(),
        };
        // The per-admission families, at 0 from the start too: every policy result, and the
        // requests and durations of a Pod CREATE (not dry run), so that each family has its
        // series per webhook. The other kinds and operations appear at their first admission:
        // at 9 kinds × 5 operations × the label pairs they would be hundreds of series.
        let pod = kind_index(WorkloadKind::Pod.as_str());
        let create = operation_index("CREATE");
        for webhook in WEBHOOKS {
            for mode in Mode::ALL {
                for &result in results_of(webhook, mode) {
                    metrics.policy_result(webhook, mode, result);
                }
            }
            let slot = DurationSlot::new(webhook, pod, create, false);
            metrics.duration_series(slot);
            for &(allowed, mutated) in answers(webhook) {
                metrics.request_series(slot, allowed, mutated);
            }
        }
        metrics
    }

    /// The series of `modelgate_admission_requests_total` for `slot` and the answer's labels.
    fn request_series(&self, slot: DurationSlot, allowed: bool, mutated: bool) -> &Counter {
        self.series.requests[slot.request(allowed, mutated)].get_or_init(|| {
            let DurationLabels {
                webhook,
                kind,
                operation,
                dry_run,
            } = slot.labels();
            self.requests.get_or_create_owned(&RequestLabels {
                webhook,
                kind,
                operation,
                allowed,
                mutated,
                dry_run,
            })
        })
    }

    /// The series of `modelgate_admission_duration_seconds` for `slot`.
    fn duration_series(&self, slot: DurationSlot) -> &Histogram {
        self.series.duration[slot.0]
            .get_or_init(|| self.duration.get_or_create_owned(&slot.labels()))
    }

    /// The series of `modelgate_policy_results_total` for the labels.
    fn policy_result(&self, webhook: Webhook, mode: Mode, result: PolicyResult) -> &Counter {
        let mode_index = Mode::ALL.iter().position(|m| *m == mode).unwrap_or(0);
        let result_index = PolicyResult::ALL
            .iter()
            .position(|r| *r == result)
            .unwrap_or(0);
        let slot = (webhook_index(webhook) * Mode::ALL.len() + mode_index)
            * PolicyResult::ALL.len()
            + result_index;
        self.series.policy_results[slot].get_or_init(|| {
            self.policy_results
                .get_or_create_owned(&PolicyResultLabels {
                    webhook: webhook.as_str(),
                    mode: mode.as_str(),
                    result: result.as_str(),
                })
        })
    }

    /// Records a request the pipeline answered.
    pub fn admission(&self, webhook: Webhook, summary: &Summary, seconds: f64) {
        let slot = DurationSlot::new(
            webhook,
            kind_index(&summary.kind),
            operation_index(&summary.operation),
            summary.dry_run,
        );
        let mutated = summary.patch_operations > 0;
        self.request_series(slot, summary.allowed, mutated).inc();
        self.observe_slot(slot, seconds);
        if let (Some(mode), Some(result)) = (summary.mode, summary.result) {
            self.policy_result(webhook, mode, result).inc();
        }
        if let (Some(counters), Some(resolved)) = (&self.cache_lookups, summary.model_cache) {
            counters.record(resolved);
        }
        if let Some(reason) = summary.error {
            self.error(reason);
        }
        for name in &summary.exceptions {
            self.exception_used(&summary.namespace, name);
        }
    }

    /// Counts one use of the exception `namespace/name`, within [`MAX_EXCEPTION_SERIES`].
    pub fn exception_used(&self, namespace: &str, name: &str) {
        let key = (namespace.to_string(), name.to_string());
        let labels = {
            let mut seen = self
                .exception_series
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if seen.contains(&key) || seen.len() < MAX_EXCEPTION_SERIES {
                seen.insert(key.clone());
                ExceptionLabels {
                    namespace: key.0,
                    name: key.1,
                }
            } else {
                ExceptionLabels {
                    namespace: OTHER_EXCEPTIONS.to_string(),
                    name: OTHER_EXCEPTIONS.to_string(),
                }
            }
        };
        self.exception_uses.get_or_create(&labels).inc();
    }

    /// Records the duration of a request; `kind` and `operation` are label values
    /// ([`kind_label`], [`operation_label`]).
    pub fn observe(
        &self,
        webhook: Webhook,
        kind: &'static str,
        operation: &'static str,
        dry_run: bool,
        seconds: f64,
    ) {
        let kind = KIND_LABELS
            .iter()
            .position(|k| *k == kind)
            .unwrap_or(WORKLOAD_KINDS + 1);
        let operation = operation_index(operation);
        self.observe_slot(
            DurationSlot::new(webhook, kind, operation, dry_run),
            seconds,
        );
    }

    fn observe_slot(&self, slot: DurationSlot, seconds: f64) {
        self.duration_series(slot).observe(seconds);
    }

    pub fn error(&self, reason: &'static str) {
        self.errors.get_or_create(&ReasonLabels { reason }).inc();
    }

    pub fn tls_reloaded(&self, ok: bool, not_after_unix: Option<i64>) {
        let result = if ok { "success" } else { "failure" };
        self.tls_reloads
            .get_or_create(&ResultLabels { result })
            .inc();
        if let Some(ts) = not_after_unix {
            self.cert_expiry.set(ts);
        }
    }

    /// Counts a request as in flight until the guard drops.
    pub fn inflight(&self) -> InflightGuard {
        self.inflight.inc();
        InflightGuard(self.inflight.clone())
    }

    /// Counts a connection the server refused or closed; `reason` is one of a fixed set
    /// (see `server::ConnectionEnd`).
    pub fn connection_dropped(&self, reason: &'static str) {
        self.connections_dropped
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    /// Counts a pause of the accept loop at `--max-connections`.
    pub fn accept_paused(&self) {
        self.accept_paused.inc();
    }

    /// Counts a connection as open until the guard drops.
    pub fn open_connection(&self) -> InflightGuard {
        self.open_connections.inc();
        InflightGuard(self.open_connections.clone())
    }

    /// Counts a probe listener connection the server closed; `reason` is one of
    /// [`PROBE_CONNECTION_DROP_REASONS`].
    pub fn probe_connection_dropped(&self, reason: &'static str) {
        self.probe_connections_dropped
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    /// Counts a probe listener connection as open until the guard drops.
    pub fn probe_open_connection(&self) -> InflightGuard {
        self.probe_open_connections.inc();
        InflightGuard(self.probe_open_connections.clone())
    }

    /// The gauge of the bytes held by bodies read in parts (`modelgate_buffered_body_bytes`).
    pub fn buffered_body_bytes(&self) -> Gauge {
        self.buffered_body_bytes.clone()
    }

    /// The registry, for other parts of the program to add their metrics (full names, with the
    /// `modelgate_` prefix) before the server starts.
    pub fn registry_mut(&mut self) -> &mut Registry {
        &mut self.registry
    }

    /// Counts each admission's model URI resolution in `counters`
    /// ([`CacheMetrics::lookup_counters`](crate::cache::CacheMetrics::lookup_counters)).
    pub fn count_cache_lookups(&mut self, counters: LookupCounters) {
        self.cache_lookups = Some(counters);
    }

    /// The exposition text (OpenMetrics).
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

pub struct InflightGuard(Gauge);

impl Drop for InflightGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Content type of [`Metrics::encode`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_admission_counts_its_model_resolution_once() {
        use crate::cache::{CacheMetrics, MissReason, Resolved};
        let mut m = Metrics::new();
        let cache = CacheMetrics::new();
        cache.register(m.registry_mut());
        m.count_cache_lookups(cache.lookup_counters());
        let resolved = |r| Summary {
            kind: "Pod".into(),
            model_cache: r,
            ..Default::default()
        };
        m.admission(Webhook::Mutate, &resolved(Some(Resolved::Namespace)), 0.001);
        m.admission(
            Webhook::Mutate,
            &resolved(Some(Resolved::Miss(MissReason::PvcMissing))),
            0.001,
        );
        m.admission(
            Webhook::Mutate,
            &resolved(Some(Resolved::Miss(MissReason::PvcMissing))),
            0.001,
        );
        m.admission(Webhook::Validate, &resolved(None), 0.001);
        let text = m.encode().unwrap();
        for line in [
            r#"modelgate_cache_lookups_total{result="namespace",reason="none"} 1"#,
            r#"modelgate_cache_lookups_total{result="cluster",reason="none"} 0"#,
            r#"modelgate_cache_lookups_total{result="miss",reason="pvc-missing"} 2"#,
            r#"modelgate_cache_lookups_total{result="miss",reason="no-match"} 0"#,
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
        }
    }

    #[test]
    fn exception_uses_are_counted_by_name_within_a_bounded_number_of_series() {
        let m = Metrics::new();
        m.admission(
            Webhook::Validate,
            &Summary {
                namespace: "team-a".into(),
                exceptions: vec!["vendor-root".into()],
                ..Default::default()
            },
            0.001,
        );
        m.exception_used("team-a", "vendor-root");
        for i in 0..MAX_EXCEPTION_SERIES + 10 {
            m.exception_used("team-b", &format!("e{i}"));
        }
        let text = m.encode().unwrap();
        assert!(
            text.contains(
                r#"modelgate_exception_uses_total{namespace="team-a",name="vendor-root"} 2"#
            ),
            "{text}"
        );
        assert!(
            text.contains(r#"modelgate_exception_uses_total{namespace="_other",name="_other"} 11"#),
            "{text}"
        );
        let series = text
            .lines()
            .filter(|l| l.starts_with("modelgate_exception_uses_total{"))
            .count();
        assert_eq!(series, MAX_EXCEPTION_SERIES + 1);
    }

    #[test]
    fn every_known_reason_is_exported_at_zero_before_it_happens() {
        let text = Metrics::new().encode().unwrap();
        let series = |name: &str, label: &str, values: &[&str]| {
            for value in values {
                let line = format!(r#"{name}{{{label}="{value}"}} 0"#);
                assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
            }
        };
        series(
            "modelgate_admission_errors_total",
            "reason",
            &ADMISSION_ERROR_REASONS,
        );
        series(
            "modelgate_connections_dropped_total",
            "reason",
            &CONNECTION_DROP_REASONS,
        );
        series(
            "modelgate_tls_reloads_total",
            "result",
            &["success", "failure"],
        );
        // The lists are the documented ones, so a reason added to the code and the docs
        // without its series here, or dropped from one, is caught.
        let docs = include_str!("../../docs/operations.md");
        let documented = |metric: &str| -> Vec<String> {
            let row = docs
                .lines()
                .find(|l| l.starts_with(&format!("| `{metric}`")))
                .unwrap_or_else(|| panic!("{metric} not in docs/operations.md"));
            let meaning = row.rsplit(" | ").next().unwrap_or_default();
            let meaning = meaning.split(" ([").next().unwrap_or_default();
            meaning
                .split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_string)
                .collect()
        };
        assert_eq!(
            documented("modelgate_admission_errors_total"),
            ADMISSION_ERROR_REASONS
        );
        assert_eq!(
            documented("modelgate_connections_dropped_total"),
            CONNECTION_DROP_REASONS
        );
    }

    #[test]
    fn every_series_slot_carries_its_own_labels() {
        let mut seen = std::collections::HashSet::new();
        for webhook in WEBHOOKS {
            for kind in KIND_LABELS {
                for operation in OPERATION_LABELS {
                    for dry_run in [false, true] {
                        let slot = DurationSlot::new(
                            webhook,
                            KIND_LABELS.iter().position(|k| *k == kind).unwrap(),
                            operation_index(operation),
                            dry_run,
                        );
                        assert!(slot.0 < DURATION_SLOTS);
                        assert!(seen.insert(slot.0), "two label sets share a slot");
                        let want = DurationLabels {
                            webhook: webhook.as_str(),
                            kind,
                            operation,
                            dry_run,
                        };
                        assert_eq!(slot.labels(), want);
                        for (allowed, mutated) in [(false, false), (true, false), (true, true)] {
                            assert!(slot.request(allowed, mutated) < REQUEST_SLOTS);
                        }
                    }
                }
            }
        }
        assert_eq!(kind_label(""), "none");
        assert_eq!(kind_label("Pod"), "Pod");
        assert_eq!(operation_label("CONNECT"), "CONNECT");
    }

    #[test]
    fn kept_series_count_in_the_exposition_each_under_its_labels() {
        let m = Metrics::new();
        let admission = |kind: &str, dry_run, patch_operations| Summary {
            kind: kind.into(),
            operation: "CREATE".into(),
            allowed: true,
            dry_run,
            patch_operations,
            mode: Some(Mode::Warn),
            result: Some(PolicyResult::WouldPatch),
            ..Default::default()
        };
        for _ in 0..3 {
            m.admission(Webhook::Mutate, &admission("Pod", false, 2), 0.001);
        }
        m.admission(Webhook::Mutate, &admission("Pod", true, 2), 0.001);
        m.admission(Webhook::Validate, &admission("Service", false, 0), 0.001);
        m.observe(Webhook::Mutate, "none", "none", false, 0.001);
        let text = m.encode().unwrap();
        for want in [
            r#"modelgate_admission_requests_total{webhook="mutate",kind="Pod",operation="CREATE",allowed="true",mutated="true",dry_run="false"} 3"#,
            r#"modelgate_admission_requests_total{webhook="mutate",kind="Pod",operation="CREATE",allowed="true",mutated="true",dry_run="true"} 1"#,
            r#"modelgate_admission_requests_total{webhook="validate",kind="other",operation="CREATE",allowed="true",mutated="false",dry_run="false"} 1"#,
            r#"modelgate_admission_duration_seconds_count{webhook="mutate",kind="Pod",operation="CREATE",dry_run="false"} 3"#,
            r#"modelgate_admission_duration_seconds_count{webhook="mutate",kind="none",operation="none",dry_run="false"} 1"#,
            r#"modelgate_policy_results_total{webhook="mutate",mode="warn",result="would_patch"} 4"#,
            r#"modelgate_policy_results_total{webhook="validate",mode="warn",result="would_patch"} 1"#,
        ] {
            assert!(text.lines().any(|l| l == want), "{want} missing in\n{text}");
        }
        assert!(
            !text.contains(r#"kind="CronJob""#),
            "a kind's series appears at its first admission"
        );
    }

    /// The table of [`results_of`] is what the pipeline gives: every result of a pod to
    /// patch, one to deny and one already compliant, through both webhooks in every mode.
    #[test]
    fn the_exported_policy_results_are_those_the_pipeline_gives() {
        use crate::admission::{self, Context};
        use crate::config::PolicyConfig;
        use crate::namespaces::Namespaces;
        use crate::policy::Caches;
        let pod = |spec: serde_json::Value| {
            serde_json::json!({
                "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                "request": {
                    "uid": "u", "namespace": "team", "operation": "CREATE",
                    "kind": {"group": "", "version": "v1", "kind": "Pod"},
                    "resource": {"group": "", "version": "v1", "resource": "pods"},
                    "userInfo": {"username": "alice"},
                    "object": {"apiVersion": "v1", "kind": "Pod",
                               "metadata": {"name": "p", "namespace": "team"}, "spec": spec},
                }
            })
            .to_string()
        };
        let bodies = [
            pod(serde_json::json!({"containers": [{"name": "c", "image": "x"}]})),
            pod(serde_json::json!({"securityContext": {"runAsUser": 0},
                                   "containers": [{"name": "c", "image": "x"}]})),
            pod(serde_json::json!({
                "securityContext": {"runAsNonRoot": true, "runAsUser": 1000, "runAsGroup": 1000},
                "containers": [{"name": "c", "image": "x"}]
            })),
        ];
        let index = crate::cache::CacheIndex::new();
        let mut given = std::collections::BTreeSet::new();
        for mode in Mode::ALL {
            let config = PolicyConfig {
                default_mode: mode,
                ..PolicyConfig::default()
            };
            let ctx = Context {
                config: &config,
                caches: Caches::Ready(&index),
                namespaces: Namespaces::none(),
                now: None,
            };
            for webhook in WEBHOOKS {
                for body in &bodies {
                    let summary = admission::review(webhook, body.as_bytes(), &ctx).summary;
                    assert_eq!(summary.mode, Some(mode), "{body}");
                    let result = summary.result.expect("a judged pod has a result");
                    given.insert((webhook.as_str(), mode.as_str(), result.as_str()));
                }
            }
        }
        let mut table = std::collections::BTreeSet::new();
        for webhook in WEBHOOKS {
            for mode in Mode::ALL {
                for result in results_of(webhook, mode) {
                    table.insert((webhook.as_str(), mode.as_str(), result.as_str()));
                }
            }
        }
        assert_eq!(given, table);

        let text = Metrics::new().encode().unwrap();
        let exported: std::collections::BTreeSet<_> = text
            .lines()
            .filter(|l| l.starts_with("modelgate_policy_results_total{"))
            .map(str::to_string)
            .collect();
        let want: std::collections::BTreeSet<_> = table
            .iter()
            .map(|(webhook, mode, result)| {
                format!(
                    r#"modelgate_policy_results_total{{webhook="{webhook}",mode="{mode}",result="{result}"}} 0"#
                )
            })
            .collect();
        assert_eq!(exported, want);
        for webhook in ["mutate", "validate"] {
            let line = format!(
                r#"modelgate_admission_duration_seconds_count{{webhook="{webhook}",kind="Pod",operation="CREATE",dry_run="false"}} 0"#
            );
            assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
        }
        for (webhook, allowed, mutated) in [
            ("mutate", true, true),
            ("mutate", true, false),
            ("mutate", false, false),
            ("validate", true, false),
            ("validate", false, false),
        ] {
            let line = format!(
                r#"modelgate_admission_requests_total{{webhook="{webhook}",kind="Pod",operation="CREATE",allowed="{allowed}",mutated="{mutated}",dry_run="false"}} 0"#
            );
            assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
        }
    }

    #[test]
    fn exposition_names_and_labels() {
        let m = Metrics::new();
        assert!(
            m.encode()
                .unwrap()
                .contains("modelgate_accept_paused_total 0"),
            "exported before the first pause, for the alert's rate"
        );
        let summary = Summary {
            kind: "Pod".into(),
            operation: "CREATE".into(),
            allowed: true,
            patch_operations: 3,
            ..Default::default()
        };
        m.admission(Webhook::Mutate, &summary, 0.00002);
        m.error("payload_too_large");
        m.tls_reloaded(true, Some(1_900_000_000));
        let guard = m.inflight();
        m.connection_dropped("idle_timeout");
        m.accept_paused();
        let conn = m.open_connection();
        let text = m.encode().unwrap();
        drop(guard);
        drop(conn);
        for want in [
            r#"modelgate_admission_requests_total{webhook="mutate",kind="Pod",operation="CREATE",allowed="true",mutated="true",dry_run="false"} 1"#,
            r#"modelgate_admission_duration_seconds_bucket{le="0.0001",webhook="mutate",kind="Pod",operation="CREATE",dry_run="false"} 1"#,
            r#"modelgate_admission_errors_total{reason="payload_too_large"} 1"#,
            r#"modelgate_tls_reloads_total{result="success"} 1"#,
            "modelgate_tls_certificate_expiry_timestamp_seconds 1900000000",
            "modelgate_inflight_requests 1",
            r#"modelgate_connections_dropped_total{reason="idle_timeout"} 1"#,
            "modelgate_accept_paused_total 1",
            "modelgate_open_connections 1",
            "modelgate_buffered_body_bytes 0",
            "process_cpu_seconds_total ",
            "process_resident_memory_bytes ",
            "process_open_fds ",
            "process_start_time_seconds ",
        ] {
            assert!(text.contains(want), "missing {want} in\n{text}");
        }
        assert!(
            m.encode()
                .unwrap()
                .contains("modelgate_inflight_requests 0")
        );
        assert_eq!(kind_label("Deployment"), "Deployment");
        assert_eq!(kind_label("CronJob"), "CronJob");
        assert_eq!(kind_label("Service"), "other");
        assert_eq!(operation_label("PATCH"), "none");
    }
}
