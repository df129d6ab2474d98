//! The metadata-only watch of the cluster's Namespaces that keeps a [`NamespaceStore`] current,
//! so that `kubectl label ns X modelgate.io/mode=off --overwrite` takes effect within moments,
//! without a restart (SPEC.md §9).
//!
//! Only object metadata is requested (`PartialObjectMetadata`): labels are all that is read.
//! The first list replaces whatever the store held (the `--caches` files' Namespaces); later
//! events update it one namespace at a time. Errors back off and reconnect, keeping the last
//! known labels; a failed list keeps the previous state, so an API server outage never turns
//! every namespace back to `--default-mode`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::watcher::{self, Event, watcher};
use tokio::task::JoinHandle;
use tracing::{info, warn};

use super::{NamespaceLabels, NamespaceStore, Namespaces};
use crate::cache::watch::WatchBackoff;

/// Tuning of the watch; `Default` is what production uses.
#[derive(Clone, Debug)]
pub struct NamespaceWatchConfig {
    pub backoff: WatchBackoff,
    /// `timeoutSeconds` of each watch request (kube-runtime's 290 s when `None`).
    pub watch_timeout: Option<u32>,
}

impl Default for NamespaceWatchConfig {
    fn default() -> Self {
        NamespaceWatchConfig {
            backoff: WatchBackoff::Default,
            watch_timeout: None,
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
}

fn labels_of(ns: &PartialObjectMeta<Namespace>) -> Option<NamespaceLabels> {
    NamespaceLabels::from_labels(ns.metadata.labels.iter().flatten())
}

fn name_of(ns: &PartialObjectMeta<Namespace>) -> &str {
    ns.metadata.name.as_deref().unwrap_or_default()
}

async fn run(
    api: Api<PartialObjectMeta<Namespace>>,
    store: Arc<NamespaceStore>,
    config: NamespaceWatchConfig,
    listed: Arc<AtomicBool>,
) {
    let wc = watcher::Config {
        timeout: config.watch_timeout,
        ..watcher::Config::default()
    };
    // As for the cache kinds: only progress resets the backoff (the watcher's Init before each
    // list attempt must not), so a list refused for lack of RBAC is not retried in a tight loop.
    let mut backoff = config.backoff.build();
    let mut current = (*store.view()).clone();
    let mut stream = watcher(api, wc).boxed();
    let mut listing: Option<Namespaces> = None;
    while let Some(item) = stream.next().await {
        let changed = match item {
            Ok(Event::Init) => {
                listing = Some(Namespaces::default());
                false
            }
            Ok(Event::InitApply(ns)) => {
                listing
                    .get_or_insert_default()
                    .set(name_of(&ns), labels_of(&ns));
                false
            }
            Ok(Event::InitDone) => {
                current = listing.take().unwrap_or_default();
                if !listed.swap(true, Ordering::AcqRel) {
                    info!(
                        labelled = current.len(),
                        "namespaces listed: modes and Pod Security levels known"
                    );
                }
                true
            }
            Ok(Event::Apply(ns)) => {
                current.set(name_of(&ns), labels_of(&ns));
                true
            }
            Ok(Event::Delete(ns)) => {
                current.remove(name_of(&ns));
                true
            }
            Err(e) => {
                listing = None;
                warn!(
                    "Namespaces: {e}; retrying, the last known labels stay in use (needs RBAC \
                     list/watch on namespaces)"
                );
                tokio::time::sleep(backoff.next().unwrap_or_default()).await;
                continue;
            }
        };
        if changed {
            backoff.reset();
            store.publish(current.clone());
        }
    }
}
