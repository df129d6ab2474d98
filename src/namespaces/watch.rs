//! The metadata-only watch of the cluster's Namespaces that keeps a [`NamespaceStore`] current,
//! so that `kubectl label ns X modelgate.io/mode=off --overwrite` takes effect within moments,
//! without a restart (docs/policy.md §9).
//!
//! Only object metadata is requested (`PartialObjectMetadata`): labels are all that is read.
//! The first list replaces whatever the store held (the `--caches` files' Namespaces); later
//! events update it one namespace at a time. It runs on the loop every watch shares
//! ([`crate::reflector`], with the rules of [`super::reflect`]): errors back off and reconnect,
//! keeping the last known labels; a failed list keeps the previous state, so an API server
//! outage never turns every namespace back to `--default-mode`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::watcher::{self, Event, watcher};
use tokio::task::JoinHandle;
use tracing::{info, warn};

use super::reflect::NamespaceRules;
use super::{NamespaceStore, Namespaces};
use crate::reflector::{self, Failure, WatchBackoff, WatchMetrics, Watched};

/// Tuning of the watch; `Default` is what production uses.
#[derive(Clone, Debug)]
pub struct NamespaceWatchConfig {
    pub backoff: WatchBackoff,
    /// `timeoutSeconds` of each watch request (kube-runtime's 290 s when `None`).
    pub watch_timeout: Option<u32>,
    /// Where the watch says how current it is (series `watch="Namespace"`).
    pub watch_metrics: WatchMetrics,
}

/// The `watch` label of the Namespace watch's series.
pub const WATCH_NAME: &str = "Namespace";

impl Default for NamespaceWatchConfig {
    fn default() -> Self {
        NamespaceWatchConfig {
            backoff: WatchBackoff::Default,
            watch_timeout: None,
            watch_metrics: WatchMetrics::default(),
        }
    }
}

/// The running watch; dropping it stops it (the store keeps the last labels).
pub struct NamespaceWatch {
    listed: Arc<AtomicBool>,
    task: JoinHandle<()>,
}

impl Drop for NamespaceWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl NamespaceWatch {
    /// Starts watching with `client`, publishing into `store`. Must be called from within a
    /// Tokio runtime.
    pub fn spawn(
        client: kube::Client,
        store: Arc<NamespaceStore>,
        config: NamespaceWatchConfig,
    ) -> Self {
        let listed = Arc::new(AtomicBool::new(false));
        let api: Api<PartialObjectMeta<Namespace>> = Api::all(client);
        let task = tokio::spawn(run(api, store, config, listed.clone()));
        NamespaceWatch { listed, task }
    }

    /// Whether the first list has arrived (before it, `--default-mode` applies everywhere).
    pub fn is_listed(&self) -> bool {
        self.listed.load(Ordering::Acquire)
    }

    /// Asks [`NamespaceWatch::is_listed`] from elsewhere (`/readyz`), without the watch.
    pub fn listed(&self) -> impl Fn() -> bool + Send + Sync + 'static {
        let listed = self.listed.clone();
        move || listed.load(Ordering::Acquire)
    }
}

/// The Namespace watch on the shared loop of [`crate::reflector`]: every change publishes the
/// labels whole.
struct NamespaceWatched {
    api: Api<PartialObjectMeta<Namespace>>,
    config: watcher::Config,
    store: Arc<NamespaceStore>,
    current: Mutex<Namespaces>,
    listed: Arc<AtomicBool>,
}

impl Watched for NamespaceWatched {
    type Rules = NamespaceRules;

    fn name(&self) -> String {
        "Namespaces".into()
    }

    fn stream(
        &self,
    ) -> BoxStream<'static, Result<Event<PartialObjectMeta<Namespace>>, watcher::Error>> {
        watcher(self.api.clone(), self.config.clone()).boxed()
    }

    fn objects(&self) -> &Mutex<Namespaces> {
        &self.current
    }

    fn listed(&mut self, labelled: usize) {
        if !self.listed.swap(true, Ordering::AcqRel) {
            info!(
                labelled,
                "namespaces listed: modes and Pod Security levels known"
            );
        }
    }

    fn changed(&mut self, _names: Vec<String>) {
        let current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        self.store.publish(current.clone());
    }

    fn failed(&mut self, e: &watcher::Error) -> Failure {
        if reflector::relists(e) {
            return Failure::Expected;
        }
        warn!(
            "Namespaces: {e}; retrying, the last known labels stay in use (needs RBAC \
             list/watch on namespaces)"
        );
        Failure::Broken
    }
}

async fn run(
    api: Api<PartialObjectMeta<Namespace>>,
    store: Arc<NamespaceStore>,
    config: NamespaceWatchConfig,
    listed: Arc<AtomicBool>,
) {
    let watched = NamespaceWatched {
        api,
        config: watcher::Config {
            timeout: config.watch_timeout,
            ..watcher::Config::default()
        },
        current: Mutex::new((*store.view()).clone()),
        store,
        listed,
    };
    let health = config.watch_metrics.health(WATCH_NAME);
    reflector::run(watched, NamespaceRules, &config.backoff, health).await;
}
