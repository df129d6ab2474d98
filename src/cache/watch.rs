//! The cluster watch: keeps the published index in step with the cluster's `LocalModelCache`,
//! `LocalModelNamespaceCache`, `LocalModelNodeGroup`, `PersistentVolumeClaim` and `Node` objects.
//!
//! One task per kind runs a kube-runtime [`watcher`] (list, then watch from the list's
//! resourceVersion, cluster-wide; [`metadata_watcher`] for the kinds read by metadata only, see
//! [`Kind::reading`]) and keeps that kind's converted objects. Every kind goes through the same
//! path ([`watch_kind`]: the loop and event rules of [`crate::reflector`], with the kind's
//! conversion from [`super::reflect`]): adding one is a [`Kind`]
//! variant, its conversion, and nothing here. An event that changes nothing the index keeps
//! (a Node's status, a PVC's resize, a cache's download progress) is dropped there. A kind task
//! records the keys of the objects that did change; a publisher task applies just those to the
//! index (the cluster's objects under the static `--caches` ones) and publishes it to the
//! [`CacheStore`], at most once per debounce interval however many events arrive. The index is
//! persistent: publishing is a clone that shares everything, and a change copies only the path
//! to what it changed. An admission only loads the published `Arc`: it never waits for the watch
//! and never calls the API server.
//!
//! Rules (see also `docs/model-cache.md`):
//! - **Synced** (the store's flag, and `modelgate_cache_synced`): a kind is synced once its first
//!   list has arrived, or, for a custom resource, once its collection answered 404 (CRD not
//!   installed: logged once, counted as empty, retried in the background with backoff). PVCs and
//!   Nodes must list: until they have, every lookup is a `not-synced` miss, since a hit cannot be
//!   proven without them. The store is marked synced
//!   after the first publish that contains every kind's first list. Until then lookups are
//!   misses with a warning.
//! - **Ready** ([`Readiness`], for `/readyz`): synced, or `--cache-sync-timeout` has passed.
//!   After the timeout the server takes traffic but the store stays unsynced, so resolution is
//!   a miss with the "not synced" warning, until every kind has listed; then it resolves.
//!   Resolving against a partial set (say cluster caches without the namespace caches that
//!   would win) would mount the wrong model, a miss only loses the cache.
//! - Errors and dropped watches back off and reconnect; the last known objects stay published.
//!   A `410 Gone` (watch ERROR event, or HTTP 410 when the watch starts) leads to a fresh list,
//!   which replaces the kind's objects only once it is complete.
//! - Once synced, the store stays synced: later errors keep the last known state.
//! - Objects are bounded when converted, namespace caches past `--max-caches-per-namespace` or
//!   `--max-namespace-caches` are ignored, and what is left out is counted and logged at a
//!   bounded rate ([`super::reflect`], docs/model-cache.md, "Bounds"). A deletion that frees a
//!   place an ignored cache is owed ends the kind's stream, so that the kind is listed again
//!   (at most once per `cap_relist_interval`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use kube::api::DynamicObject;
use kube::core::PartialObjectMeta;
use kube::runtime::watcher::{self, Event, watcher};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use super::cluster::{Kind, KindObjects, ObjectKey, Reading, apply_change};
use super::list::{ClusterCacheError, api, from_metadata, is_not_found};
pub use super::reflect::caps::CacheLimits;
use super::reflect::{KindRules, KindShared, Prepared, Preparer};
use super::store::release_freed_memory;
use super::{CacheIndex, CacheMetrics, CacheStore};
use crate::reflector::{self, Failure, Watched};
pub use crate::reflector::{WatchBackoff, WatchMetrics};

/// The cluster-cache flags `serve` flattens into its arguments.
#[derive(clap::Args, Clone, Debug)]
#[command(next_help_heading = "Model caches from the cluster")]
pub struct ClusterCacheArgs {
    /// Do not watch the cluster's cache objects; resolve against --caches only.
    #[arg(long, env = "MODELGATE_NO_CLUSTER", action = clap::ArgAction::SetTrue,
          value_parser = clap::builder::BoolishValueParser::new())]
    pub no_cluster: bool,

    /// How long /readyz waits for the first list of each watched kind (the three cache kinds,
    /// PVCs, Nodes, ModelgateExceptions; e.g. 30s, 500ms, 2m). After it, requests are admitted with `not-synced`
    /// model cache misses and a warning until synced.
    #[arg(long, env = "MODELGATE_CACHE_SYNC_TIMEOUT", default_value = "30s",
          value_parser = parse_sync_timeout)]
    pub cache_sync_timeout: Duration,

    /// The most LocalModelNamespaceCache objects kept per namespace: past it, the newest are
    /// ignored (counted in modelgate_cache_skipped_total, warned once per namespace).
    #[arg(long, env = "MODELGATE_MAX_CACHES_PER_NAMESPACE",
          default_value_t = CacheLimits::DEFAULT_PER_NAMESPACE,
          value_parser = parse_cap)]
    pub max_caches_per_namespace: usize,

    /// The most LocalModelNamespaceCache objects kept over all namespaces: past it, the newest
    /// are ignored (counted, warned once).
    #[arg(long, env = "MODELGATE_MAX_NAMESPACE_CACHES",
          default_value_t = CacheLimits::DEFAULT_TOTAL,
          value_parser = parse_cap)]
    pub max_namespace_caches: usize,

    /// The most ModelgateException objects kept per namespace: past it, the newest are
    /// ignored (counted in modelgate_cache_skipped_total, warned once per namespace). Every
    /// admission in a namespace reads that namespace's exceptions.
    #[arg(long, env = "MODELGATE_MAX_EXCEPTIONS_PER_NAMESPACE",
          default_value_t = CacheLimits::DEFAULT_EXCEPTIONS.per_namespace,
          value_parser = parse_cap)]
    pub max_exceptions_per_namespace: usize,

    /// The most ModelgateException objects kept over all namespaces: past it, the newest are
    /// ignored (counted, warned once).
    #[arg(long, env = "MODELGATE_MAX_EXCEPTIONS",
          default_value_t = CacheLimits::DEFAULT_EXCEPTIONS.total,
          value_parser = parse_cap)]
    pub max_exceptions: usize,

    /// How often each ModelgateException's status (in force, or why not) is compared with what
    /// it should be and written where it differs (e.g. 10s, 1m); 0 writes none.
    #[arg(long, env = "MODELGATE_EXCEPTION_STATUS_INTERVAL", default_value = "10s",
          value_parser = parse_sync_timeout)]
    pub exception_status_interval: Duration,
}

/// A cap: a whole number from 1 to 10 000 000.
fn parse_cap(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if (1..=10_000_000).contains(&n) => Ok(n),
        _ => Err(format!("`{s}` is not a whole number from 1 to 10000000")),
    }
}

impl ClusterCacheArgs {
    pub fn watch_config(&self, watch_metrics: WatchMetrics) -> CacheWatchConfig {
        CacheWatchConfig {
            sync_timeout: self.cache_sync_timeout,
            watch_metrics,
            limits: self.limits(),
            exception_limits: CacheLimits {
                per_namespace: self.max_exceptions_per_namespace,
                total: self.max_exceptions,
            },
            ..CacheWatchConfig::default()
        }
    }

    /// The caps on namespace caches the flags set.
    pub fn limits(&self) -> CacheLimits {
        CacheLimits {
            per_namespace: self.max_caches_per_namespace,
            total: self.max_namespace_caches,
        }
    }

    /// Starts the cache source `serve` uses: the cluster watch over `static_index`, or the static
    /// index alone under `--no-cluster`. The client comes from the in-cluster configuration or
    /// the current kubeconfig context. Must be called from within a Tokio runtime.
    pub async fn start(
        &self,
        static_index: CacheIndex,
        metrics: CacheMetrics,
        watch_metrics: WatchMetrics,
    ) -> Result<CacheSource, ClusterCacheError> {
        if self.no_cluster {
            return Ok(CacheSource::fixed(static_index, metrics));
        }
        let client = kube::Client::try_default()
            .await
            .map_err(ClusterCacheError::Client)?;
        let watch = CacheWatch::spawn(
            client,
            static_index,
            metrics,
            self.watch_config(watch_metrics),
        );
        Ok(CacheSource {
            store: watch.store().clone(),
            readiness: watch.readiness(),
            watch: Some(watch),
        })
    }
}

/// A Kubernetes-style duration (`30s`, `500ms`, `2m`, `1m30s`), at most 24 hours.
pub fn parse_sync_timeout(s: &str) -> Result<Duration, String> {
    let d = crate::duration::parse_duration(s)?;
    if d > Duration::from_secs(24 * 3600) {
        return Err(format!("`{s}` is longer than 24h"));
    }
    Ok(d)
}

/// What `serve` resolves against: the store its admissions read and the readiness for `/readyz`.
/// Keep it alive as long as the server runs: dropping it stops the watch.
pub struct CacheSource {
    pub store: Arc<CacheStore>,
    pub readiness: Readiness,
    pub watch: Option<CacheWatch>,
}

impl CacheSource {
    /// Static caches only: synced and ready from the start.
    pub fn fixed(index: CacheIndex, metrics: CacheMetrics) -> Self {
        metrics.set_objects(&index);
        for kind in Kind::ALL {
            metrics.set_synced(kind, true);
        }
        CacheSource {
            store: Arc::new(CacheStore::fixed(index)),
            readiness: Readiness::ready(),
            watch: None,
        }
    }
}

/// Whether the caches allow the server to report ready (see the module docs). Cheap to clone
/// and to ask.
#[derive(Clone, Debug)]
pub struct Readiness(watch::Receiver<bool>);

impl Readiness {
    /// Always ready (static caches).
    pub fn ready() -> Self {
        Readiness(watch::channel(true).1)
    }

    pub fn is_ready(&self) -> bool {
        *self.0.borrow()
    }

    /// Waits until ready.
    pub async fn wait(&mut self) {
        // An error means the watch is gone; its last word stands.
        let _ = self.0.wait_for(|ready| *ready).await;
    }
}

/// Tuning of the watch; `Default` is what production uses.
#[derive(Clone, Debug)]
pub struct CacheWatchConfig {
    /// `--cache-sync-timeout`: after it, [`Readiness`] is ready even if not synced.
    pub sync_timeout: Duration,
    /// Events arriving within this interval cost one publish.
    pub debounce: Duration,
    pub backoff: WatchBackoff,
    /// `timeoutSeconds` of each watch request (kube-runtime's 290 s when `None`).
    pub watch_timeout: Option<u32>,
    /// Where each kind's watch says how current it is.
    pub watch_metrics: WatchMetrics,
    /// The caps on namespace caches (`--max-caches-per-namespace`, `--max-namespace-caches`).
    pub limits: CacheLimits,
    /// The caps on exceptions (`--max-exceptions-per-namespace`, `--max-exceptions`).
    pub exception_limits: CacheLimits,
    /// The shortest time between two relists that look for the namespace caches a deletion
    /// made room for (objects ignored past a cap are not held, so a list finds them).
    pub cap_relist_interval: Duration,
}

impl Default for CacheWatchConfig {
    fn default() -> Self {
        CacheWatchConfig {
            sync_timeout: Duration::from_secs(30),
            debounce: Duration::from_millis(100),
            backoff: WatchBackoff::Default,
            watch_timeout: None,
            watch_metrics: WatchMetrics::default(),
            limits: CacheLimits::default(),
            exception_limits: CacheLimits::DEFAULT_EXCEPTIONS,
            cap_relist_interval: Duration::from_secs(30),
        }
    }
}

/// State shared by the kind tasks and the publisher.
struct Shared {
    kinds: [KindState; Kind::ALL.len()],
    /// Set by a kind task when its objects or its synced flag changed.
    dirty: Notify,
    publishes: AtomicU64,
}

#[derive(Default)]
struct KindState {
    objects: Mutex<KindObjects>,
    /// The keys whose objects changed since the publisher last took them (a key changed
    /// twice is there twice: applying it again is harmless, and a list of 100 000 keys is
    /// handed over as it is, without a hash table).
    changed: Mutex<Vec<ObjectKey>>,
    synced: AtomicBool,
}

impl KindState {
    fn objects(&self) -> MutexGuard<'_, KindObjects> {
        self.objects.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn changed(&self) -> MutexGuard<'_, Vec<ObjectKey>> {
        self.changed.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Shared {
    fn kind(&self, kind: Kind) -> &KindState {
        &self.kinds[kind.index()]
    }
}

/// The running watch. Dropping it stops its tasks; the store keeps the last published index.
pub struct CacheWatch {
    store: Arc<CacheStore>,
    readiness: Readiness,
    shared: Arc<Shared>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for CacheWatch {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl CacheWatch {
    /// Starts watching every kind with `client` and publishing, merged with `static_index`
    /// (whose objects replace cluster objects of the same kind, namespace and name), into a new
    /// unsynced store. Must be called from within a Tokio runtime.
    pub fn spawn(
        client: kube::Client,
        static_index: CacheIndex,
        metrics: CacheMetrics,
        config: CacheWatchConfig,
    ) -> Self {
        let initial = static_index.clone();
        metrics.set_objects(&initial);
        for kind in Kind::ALL {
            metrics.set_synced(kind, false);
        }
        let store = Arc::new(CacheStore::unsynced(initial));
        let (ready_tx, ready_rx) = watch::channel(false);
        let ready_tx = Arc::new(ready_tx);
        let shared = Arc::new(Shared {
            kinds: Default::default(),
            dirty: Notify::new(),
            publishes: AtomicU64::new(0),
        });
        let mut tasks: Vec<JoinHandle<()>> = Kind::ALL
            .into_iter()
            .map(|kind| {
                tokio::spawn(watch_kind(
                    kind,
                    client.clone(),
                    shared.clone(),
                    metrics.clone(),
                    config.clone(),
                ))
            })
            .collect();
        tasks.push(tokio::spawn(publish(
            shared.clone(),
            store.clone(),
            Arc::new(static_index),
            metrics,
            ready_tx.clone(),
            config.debounce,
        )));
        let (timeout_store, timeout) = (store.clone(), config.sync_timeout);
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep(timeout).await;
            if !timeout_store.is_synced() {
                warn!(
                    timeout = ?timeout,
                    "model caches not synced within --cache-sync-timeout: ready, admitting with \
                     model cache misses and a warning until they sync"
                );
                ready_tx.send_replace(true);
            }
        }));
        CacheWatch {
            store,
            readiness: Readiness(ready_rx),
            shared,
            tasks,
        }
    }

    /// The store admissions read (`store.view()`).
    pub fn store(&self) -> &Arc<CacheStore> {
        &self.store
    }

    pub fn readiness(&self) -> Readiness {
        self.readiness.clone()
    }

    /// How many indexes have been published so far.
    pub fn publishes(&self) -> u64 {
        self.shared.publishes.load(Ordering::Acquire)
    }
}

/// The longest a publish waits after the first event of a batch: a change is published within
/// a second, whatever the last batch cost.
const MAX_WAIT: Duration = Duration::from_millis(500);

/// Applies the kinds' changes to the index and publishes it whenever a kind task marks it
/// dirty, once per `debounce`.
async fn publish(
    shared: Arc<Shared>,
    store: Arc<CacheStore>,
    static_index: Arc<CacheIndex>,
    metrics: CacheMetrics,
    ready: Arc<watch::Sender<bool>>,
    debounce: Duration,
) {
    // The index as last published. Each batch is applied to it, copying only the paths to what
    // changed (the snapshot admissions hold keeps sharing the rest), so a change costs in
    // proportion to itself: an event that changes one PVC is a few microseconds at any size.
    let mut index = Some(static_index.as_ref().clone());
    // A first list of 100 000 objects takes a few hundred milliseconds to apply: waiting up to
    // four times as long as the last batch took (within MAX_WAIT) keeps a relist storm from
    // occupying the core that answers admissions.
    let mut last_batch = Duration::ZERO;
    loop {
        shared.dirty.notified().await;
        tokio::time::sleep(debounce.max(last_batch.saturating_mul(4).min(MAX_WAIT))).await;
        // Read before the changes: a kind's objects are in place before its flag is set.
        let synced = shared
            .kinds
            .iter()
            .all(|k| k.synced.load(Ordering::Acquire));
        let pending = shared.kinds.iter().any(|k| !k.changed().is_empty());
        let newly_synced = synced && !store.is_synced();
        if !pending && !newly_synced {
            continue;
        }
        let work = index
            .take()
            .unwrap_or_else(|| static_index.as_ref().clone());
        let (statics, kinds) = (static_index.clone(), shared.clone());
        let (target, gauges) = (store.clone(), metrics.clone());
        let started = tokio::time::Instant::now();
        // On a blocking thread: a first list or a relist is a large batch.
        let published = tokio::task::spawn_blocking(move || {
            let mut index = work;
            let mut applied = 0;
            for kind in Kind::ALL {
                applied += apply_changes(&mut index, &statics, kind, kinds.kind(kind));
            }
            gauges.set_objects(&index);
            let counts = index.counts();
            target.publish(index.clone());
            kinds.publishes.fetch_add(1, Ordering::AcqRel);
            // A large batch replaced many nodes of the previous snapshot, freed here (unless an
            // admission still reads it): hand those pages back. A small batch frees a few
            // nodes, not worth the walk of the heaps.
            if applied >= 1_000 {
                release_freed_memory();
            }
            (index, counts)
        })
        .await;
        last_batch = started.elapsed();
        let (next, c) = match published {
            Ok(done) => done,
            Err(e) => {
                // The batch's changes went with the index: start over from every object.
                warn!("publishing the model cache index failed: {e}; rebuilding it");
                for kind in Kind::ALL {
                    let state = shared.kind(kind);
                    let keys: Vec<_> = state.objects().keys().cloned().collect();
                    state.changed().extend(keys);
                }
                shared.dirty.notify_one();
                continue;
            }
        };
        index = Some(next);
        debug!(
            namespace_caches = c.namespace_caches,
            cluster_caches = c.cluster_caches,
            node_groups = c.node_groups,
            pvcs = c.pvcs,
            nodes = c.nodes,
            "model cache index published"
        );
        if synced && !store.is_synced() {
            store.set_synced(true);
            ready.send_replace(true);
            info!(
                namespace_caches = c.namespace_caches,
                cluster_caches = c.cluster_caches,
                node_groups = c.node_groups,
                pvcs = c.pvcs,
                nodes = c.nodes,
                "model caches, PVCs and Nodes synced from the cluster"
            );
        }
    }
}

/// Applies the changes one kind's task has recorded since the last batch; returns how many.
fn apply_changes(
    index: &mut CacheIndex,
    statics: &CacheIndex,
    kind: Kind,
    state: &KindState,
) -> usize {
    // Keys first, then their objects: a key is recorded after its object is in place, so each
    // object read here is at least as new as the change that recorded it.
    let keys = std::mem::take(&mut *state.changed());
    for key in &keys {
        let current = state.objects().get(key).cloned();
        apply_change(index, statics, kind, key, current.as_deref());
    }
    keys.len()
}

/// The kind's list-then-watch stream, whole objects or metadata only, as `DynamicObject`s.
fn kind_stream(
    kind: Kind,
    client: kube::Client,
    config: watcher::Config,
) -> BoxStream<'static, Result<Event<DynamicObject>, watcher::Error>> {
    match kind.reading() {
        Reading::Whole => watcher(api(kind, client), config).boxed(),
        // An Api of PartialObjectMeta makes metadata-only requests.
        Reading::Metadata => watcher(
            kube::Api::<PartialObjectMeta<DynamicObject>>::all_with(client, &kind.api_resource()),
            config,
        )
        .map(|item| {
            item.map(|event| match event {
                Event::Init => Event::Init,
                Event::InitApply(o) => Event::InitApply(from_metadata(o)),
                Event::InitDone => Event::InitDone,
                Event::Apply(o) => Event::Apply(from_metadata(o)),
                Event::Delete(o) => Event::Delete(from_metadata(o)),
            })
        })
        .boxed(),
    }
}

/// `events` converted by a [`Preparer`]: each object once, bounded, capped. The stream ends
/// (so that the reflector's loop starts a new one, which lists) when the caps ask for a relist.
fn prepared_stream(
    events: BoxStream<'static, Result<Event<DynamicObject>, watcher::Error>>,
    shared: Arc<KindShared>,
) -> BoxStream<'static, Result<Event<Prepared>, watcher::Error>> {
    struct State {
        events: BoxStream<'static, Result<Event<DynamicObject>, watcher::Error>>,
        preparer: Preparer,
        ready: std::collections::VecDeque<Event<Prepared>>,
        shared: Arc<KindShared>,
    }
    let state = State {
        events,
        preparer: Preparer::new(shared.clone()),
        ready: Default::default(),
        shared,
    };
    futures::stream::unfold(state, |mut s| async move {
        loop {
            if let Some(event) = s.ready.pop_front() {
                return Some((Ok(event), s));
            }
            let next = match s.preparer.relist_at() {
                Some(at) => tokio::select! {
                    next = s.events.next() => next,
                    () = tokio::time::sleep_until(at.into()) => {
                        s.shared.relisting();
                        return None;
                    }
                },
                None => s.events.next().await,
            };
            match next {
                None => return None,
                Some(Err(e)) => return Some((Err(e), s)),
                Some(Ok(event)) => s.ready.extend(s.preparer.event(event)),
            }
        }
    })
    .boxed()
}

/// One kind's watch, on the shared loop of [`crate::reflector`].
struct KindWatch {
    kind: Kind,
    client: kube::Client,
    config: watcher::Config,
    shared: Arc<Shared>,
    kind_shared: Arc<KindShared>,
    metrics: CacheMetrics,
    crd_missing: bool,
    listed: bool,
}

impl Watched for KindWatch {
    type Rules = KindRules;

    fn name(&self) -> String {
        self.kind.to_string()
    }

    fn stream(&self) -> BoxStream<'static, Result<Event<Prepared>, watcher::Error>> {
        prepared_stream(
            kind_stream(self.kind, self.client.clone(), self.config.clone()),
            self.kind_shared.clone(),
        )
    }

    fn objects(&self) -> &Mutex<KindObjects> {
        &self.shared.kind(self.kind).objects
    }

    fn listed(&mut self, n: usize) {
        let kind = self.kind;
        if self.crd_missing {
            info!("{kind}: the CRD is installed now; {n} objects listed");
            self.crd_missing = false;
        } else if !self.listed {
            info!("{kind}: {n} objects listed");
        } else {
            info!("{kind}: relisted, {n} objects");
        }
        self.listed = true;
        mark_synced(kind, self.shared.kind(kind), &self.metrics);
        // The store may become synced, changed objects or not.
        self.shared.dirty.notify_one();
        // A list decodes whole pages, and what it skipped (a cache too large to keep, one
        // past a cap) was freed on this task's thread: hand those pages back, or they stay
        // resident until the thread allocates as much again, which a watch rarely does.
        release_freed_memory();
    }

    fn changed(&mut self, keys: Vec<ObjectKey>) {
        let mut pending = self.shared.kind(self.kind).changed();
        if pending.is_empty() {
            *pending = keys;
        } else {
            pending.extend(keys);
        }
        drop(pending);
        self.shared.dirty.notify_one();
    }

    fn failed(&mut self, e: &watcher::Error) -> Failure {
        let kind = self.kind;
        self.metrics.watch_restarted(kind);
        match e {
            watcher::Error::InitialListFailed(err) if kind.is_custom() && is_not_found(err) => {
                if self.crd_missing {
                    debug!("{kind}: the CRD is still not installed");
                } else {
                    warn!(
                        "{kind}: the CRD is not installed (404); counted as empty and retried \
                         in the background"
                    );
                    self.crd_missing = true;
                }
                let state = self.shared.kind(kind);
                if !state.synced.load(Ordering::Acquire) {
                    mark_synced(kind, state, &self.metrics);
                    self.shared.dirty.notify_one();
                }
                Failure::Expected
            }
            e if reflector::relists(e) => Failure::Expected,
            _ => {
                warn!("{kind}: {e}; retrying, the last known objects stay in use");
                Failure::Broken
            }
        }
    }
}

/// Objects per list page: kube-runtime's 500, but 25 for namespace caches, which tenants
/// write and whose size only their CRD bounds. A page is decoded whole, at ~3.5 times its size:
/// 25 objects of etcd's 1.5 MiB at most (where a CRD without limits lets them be that large)
/// are a ~130 MiB peak, 100 of 1 MiB were 350 MiB. 50 000 ordinary caches are 2 000 pages.
fn list_page_size(kind: Kind) -> u32 {
    match kind {
        Kind::NamespaceCache => NAMESPACE_CACHE_PAGE,
        _ => 500,
    }
}

const NAMESPACE_CACHE_PAGE: u32 = 25;

/// Watches one kind for as long as the task lives.
async fn watch_kind(
    kind: Kind,
    client: kube::Client,
    shared: Arc<Shared>,
    metrics: CacheMetrics,
    config: CacheWatchConfig,
) {
    let limits = match kind {
        Kind::Exception => config.exception_limits,
        _ => config.limits,
    };
    let kind_shared = Arc::new(KindShared::new(
        kind,
        metrics.clone(),
        limits,
        config.cap_relist_interval,
    ));
    let watched = KindWatch {
        kind,
        client,
        config: watcher::Config {
            timeout: config.watch_timeout,
            page_size: Some(list_page_size(kind)),
            ..watcher::Config::default()
        },
        shared,
        kind_shared,
        metrics,
        crd_missing: false,
        listed: false,
    };
    let health = config.watch_metrics.health(kind.name());
    reflector::run(watched, KindRules::new(kind), &config.backoff, health).await;
}

fn mark_synced(kind: Kind, state: &KindState, metrics: &CacheMetrics) {
    state.synced.store(true, Ordering::Release);
    metrics.set_synced(kind, true);
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        args: ClusterCacheArgs,
    }

    #[test]
    fn durations() {
        assert_eq!(parse_sync_timeout("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_sync_timeout("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_sync_timeout("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_sync_timeout("0"), Ok(Duration::ZERO));
        for bad in ["", "s", "-1s", "30 s", "3d", "25h", "99999999999999999999s"] {
            assert!(parse_sync_timeout(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn flags_and_defaults() {
        let cli = Cli::try_parse_from(["x"]).unwrap();
        assert!(!cli.args.no_cluster);
        assert_eq!(cli.args.cache_sync_timeout, Duration::from_secs(30));
        let cli = Cli::try_parse_from(["x", "--no-cluster", "--cache-sync-timeout", "5s"]).unwrap();
        assert!(cli.args.no_cluster);
        assert_eq!(
            cli.args.watch_config(WatchMetrics::default()).sync_timeout,
            Duration::from_secs(5)
        );
        let e = Cli::try_parse_from(["x", "--cache-sync-timeout", "soon"]).unwrap_err();
        assert!(e.to_string().contains("not a duration"), "{e}");
        // The caps (their environment variables are tested through `serve`:
        // tests/cache_tenancy.rs).
        assert_eq!(cli.args.limits(), CacheLimits::default());
        assert_eq!(
            (
                CacheLimits::default().per_namespace,
                CacheLimits::default().total
            ),
            (1_000, 20_000)
        );
        let cli = Cli::try_parse_from([
            "x",
            "--max-caches-per-namespace",
            "5",
            "--max-namespace-caches=8",
        ])
        .unwrap();
        assert_eq!(
            cli.args.watch_config(WatchMetrics::default()).limits,
            CacheLimits {
                per_namespace: 5,
                total: 8
            }
        );
        for bad in ["0", "-1", "x", "10000001"] {
            let flag = format!("--max-namespace-caches={bad}");
            let e = Cli::try_parse_from(["x", flag.as_str()]).unwrap_err();
            assert!(e.to_string().contains("whole number"), "{bad}: {e}");
        }
        // The environment, as the manifests set it. No other test reads these two variables.
        for (value, expected) in [("true", true), ("1", true), ("false", false), ("0", false)] {
            unsafe { std::env::set_var("MODELGATE_NO_CLUSTER", value) };
            unsafe { std::env::set_var("MODELGATE_CACHE_SYNC_TIMEOUT", "750ms") };
            let cli = Cli::try_parse_from(["x"]).unwrap();
            assert_eq!(cli.args.no_cluster, expected, "{value}");
            assert_eq!(cli.args.cache_sync_timeout, Duration::from_millis(750));
        }
        unsafe { std::env::remove_var("MODELGATE_NO_CLUSTER") };
        unsafe { std::env::remove_var("MODELGATE_CACHE_SYNC_TIMEOUT") };
    }

    #[tokio::test]
    async fn static_source_is_ready_and_synced() {
        let metrics = CacheMetrics::new();
        let source = CacheSource::fixed(CacheIndex::new(), metrics.clone());
        assert!(source.readiness.is_ready());
        assert!(source.store.is_synced());
        let mut registry = prometheus_client::registry::Registry::default();
        metrics.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains(r#"modelgate_cache_lookups_total{result="miss",reason="no-match"} 0"#)
        );
        assert!(text.contains(r#"modelgate_cache_synced{kind="LocalModelCache"} 1"#));
    }
}
