//! `serve` writes each `ModelgateException`'s `status` (docs/exceptions.md, "Status"): whether it
//! is in force now and, if not, why — expired, longer than `--max-exception-days` allows, or in a
//! namespace not open for exceptions. The decisions never read it: they decide at the moment of
//! use. The status is what `kubectl get mgex` shows a person.
//!
//! Every [`StatusWriterConfig::interval`] the writer compares, for each exception the published
//! index holds, the status it should have with the one the object holds, and patches the
//! `status` subresource where they differ (a JSON merge patch). So a status follows an expiry,
//! a namespace being opened or closed, and `--max-exception-days` within one interval, and the
//! writes are only the changes. Every replica writes the same status, so two replicas never
//! disagree; the second one's write is the same object. Nothing is written before the caches
//! and the namespaces are listed (a status computed from half a list would be wrong), and
//! exceptions read from `--caches` files (no creation time) are not the cluster's.
//!
//! Writes are counted in `modelgate_exception_status_writes_total{result}`; a failed write
//! (RBAC without `patch` on `modelgateexceptions/status`, an API server that does not answer)
//! is logged once per exception until it succeeds, and tried again at the next interval.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use kube::api::{Api, DynamicObject, Patch, PatchParams};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use super::CacheStore;
use super::cluster::Kind;
use crate::exceptions::Status;
use crate::namespaces::NamespaceStore;
use crate::server::metrics::ResultLabels;

/// How often the statuses are compared with what they should be.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(10);

/// How long a status written is trusted to arrive through the watch before it is written again
/// (someone else may have overwritten it meanwhile).
const REWRITE_AFTER: Duration = Duration::from_secs(60);

/// One write's time limit.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// The outcomes, each a series of `modelgate_exception_status_writes_total` from the start.
const RESULTS: [&str; 3] = ["written", "not_found", "failed"];

pub struct StatusWriterConfig {
    pub interval: Duration,
    /// `--max-exception-days`.
    pub max_days: u32,
}

/// What the writer reads: the published index, the namespaces, and whether both are listed.
pub struct Sources {
    pub caches: Arc<CacheStore>,
    pub namespaces: Arc<NamespaceStore>,
    pub ready: Box<dyn Fn() -> bool + Send + Sync>,
}

/// The writer's task; it stops when this is dropped.
pub struct StatusWriter {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for StatusWriter {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The counter of writes, registered in `registry`.
pub fn register(registry: &mut Registry) -> Family<ResultLabels, Counter> {
    let writes = Family::<ResultLabels, Counter>::default();
    registry.register(
        "modelgate_exception_status_writes",
        "Writes of a ModelgateException's status (whether it is in force, and why not), by result",
        writes.clone(),
    );
    for result in RESULTS {
        let _ = writes.get_or_create(&ResultLabels { result });
    }
    writes
}

impl StatusWriter {
    /// Starts the writer. Must be called from within a Tokio runtime.
    pub fn spawn(
        client: kube::Client,
        sources: Sources,
        config: StatusWriterConfig,
        writes: Family<ResultLabels, Counter>,
    ) -> StatusWriter {
        let task = tokio::spawn(async move {
            let mut state = WriterState {
                client,
                writes,
                written: HashMap::new(),
                failing: HashSet::new(),
            };
            let mut tick = tokio::time::interval(config.interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                if (sources.ready)() {
                    state.round(&sources, config.max_days).await;
                }
            }
        });
        StatusWriter { task }
    }
}

type Key = (Arc<str>, Arc<str>);

struct WriterState {
    client: kube::Client,
    writes: Family<ResultLabels, Counter>,
    /// The statuses written whose object has not shown them yet, and when.
    written: HashMap<Key, (Status, Instant)>,
    /// The exceptions whose last write failed (logged once until one succeeds).
    failing: HashSet<Key>,
}

impl WriterState {
    async fn round(&mut self, sources: &Sources, max_days: u32) {
        let index = sources.caches.view().index;
        let namespaces = sources.namespaces.view();
        let now = unix_now();
        let mut held = HashMap::with_capacity(self.written.len());
        for e in index.exceptions().filter(|e| e.created.is_some()) {
            let key: Key = (e.namespace.clone(), e.name.clone());
            let want = e.status_at(namespaces.exceptions_open(&e.namespace), now, max_days);
            if e.status.as_ref() == Some(&want) {
                continue;
            }
            if let Some((status, at)) = self.written.get(&key)
                && *status == want
                && at.elapsed() < REWRITE_AFTER
            {
                held.insert(key, (status.clone(), *at));
                continue;
            }
            if self.write(&key, &want).await {
                held.insert(key, (want, Instant::now()));
            }
        }
        // Only the writes still waiting for their object to show them are kept.
        self.written = held;
    }

    /// Patches the status of `key`; whether it was written.
    async fn write(&mut self, key: &Key, status: &Status) -> bool {
        let (namespace, name) = key;
        let api: Api<DynamicObject> = Api::namespaced_with(
            self.client.clone(),
            namespace,
            &Kind::Exception.api_resource(),
        );
        let patch = serde_json::json!({"status": status.to_json()});
        let outcome = tokio::time::timeout(
            WRITE_TIMEOUT,
            api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch)),
        )
        .await;
        let result = match outcome {
            Ok(Ok(_)) => {
                self.failing.remove(key);
                "written"
            }
            // Deleted meanwhile: the watch removes it.
            Ok(Err(kube::Error::Api(e))) if e.code == 404 => "not_found",
            Ok(Err(e)) => self.failed(key, &e.to_string()),
            Err(_) => self.failed(key, &format!("no answer in {WRITE_TIMEOUT:?}")),
        };
        self.writes.get_or_create(&ResultLabels { result }).inc();
        result == "written"
    }

    /// Logs a failed write, once per exception until a write of it succeeds.
    fn failed(&mut self, key: &Key, error: &str) -> &'static str {
        if self.failing.insert(key.clone()) {
            tracing::warn!(
                namespace = %key.0,
                exception = %key.1,
                error,
                "cannot write the ModelgateException's status (RBAC needs patch on \
                 modelgateexceptions/status); tried again every interval, logged once"
            );
        }
        "failed"
    }
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}
