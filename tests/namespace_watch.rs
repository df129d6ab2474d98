//! The metadata watch of Namespaces behind the rollout modes (docs/policy.md §9), against the fake API
//! server: the labels it publishes, and what it keeps when the API server misbehaves.

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use modelgate::cache::watch::WatchBackoff;
use modelgate::namespaces::watch::{NamespaceWatch, NamespaceWatchConfig};
use modelgate::namespaces::{MODE_LABEL, Mode, NamespaceLabels, NamespaceStore, Namespaces};
use serde_json::{Value, json};
use support::fake_apiserver::{FakeApiServer, NAMESPACES};

async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    for _ in 0..400 {
        if check() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("timed out waiting for: {what}");
}

fn namespace(name: &str, labels: Value) -> Value {
    json!({"metadata": {"name": name, "labels": labels}})
}

fn config() -> NamespaceWatchConfig {
    NamespaceWatchConfig {
        backoff: WatchBackoff::Exponential {
            min: Duration::from_millis(20),
            max: Duration::from_millis(200),
        },
        watch_timeout: Some(5),
        watch_metrics: Default::default(),
    }
}

fn mode_of(store: &NamespaceStore, ns: &str) -> Mode {
    store.view().mode(ns, Mode::Enforce).mode
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn labels_follow_the_cluster_and_survive_an_unreachable_list() {
    let server = FakeApiServer::start(&[]).await;
    server.apply(NAMESPACES, namespace("team-a", json!({MODE_LABEL: "warn"})));
    server.apply(NAMESPACES, namespace("plain", json!({"team": "x"})));
    // The files' state: team-b off. The list is refused (RBAC not granted yet).
    let mut files = Namespaces::default();
    let off = BTreeMap::from([(MODE_LABEL.to_string(), "off".to_string())]);
    files.set("team-b", NamespaceLabels::from_labels(&off));
    let store = Arc::new(NamespaceStore::new(files));
    server.fail_lists(NAMESPACES, Some(403));
    let watch = NamespaceWatch::spawn(server.client(), store.clone(), config());
    eventually("several list attempts", || {
        server.counts(NAMESPACES).lists >= 3
    })
    .await;
    assert!(!watch.is_listed());
    assert_eq!(
        mode_of(&store, "team-b"),
        Mode::Off,
        "the files' labels stay"
    );
    assert_eq!(mode_of(&store, "team-a"), Mode::Enforce);

    // RBAC granted: the cluster's labels replace the files'.
    server.fail_lists(NAMESPACES, None);
    eventually("listed", || watch.is_listed()).await;
    assert_eq!(mode_of(&store, "team-a"), Mode::Warn);
    assert_eq!(mode_of(&store, "team-b"), Mode::Enforce);
    assert_eq!(store.view().len(), 1, "only labelled namespaces are kept");

    // Events: a label added, changed, a namespace deleted.
    server.apply(NAMESPACES, namespace("plain", json!({MODE_LABEL: "audit"})));
    eventually("plain audited", || mode_of(&store, "plain") == Mode::Audit).await;
    server.apply(NAMESPACES, namespace("team-a", json!({})));
    eventually("team-a unlabelled", || {
        mode_of(&store, "team-a") == Mode::Enforce
    })
    .await;
    server.delete(NAMESPACES, None, "plain");
    eventually("plain deleted", || store.view().is_empty()).await;

    // The watch expires and the history is compacted: a relist, then events again. While the
    // relist is refused, the last labels stay in use.
    server.apply(NAMESPACES, namespace("team-c", json!({MODE_LABEL: "off"})));
    eventually("team-c off", || mode_of(&store, "team-c") == Mode::Off).await;
    server.fail_lists(NAMESPACES, Some(500));
    server.compact();
    server.expire_watches();
    let lists = server.counts(NAMESPACES).lists;
    eventually("a refused relist", || {
        server.counts(NAMESPACES).lists > lists + 1
    })
    .await;
    assert_eq!(mode_of(&store, "team-c"), Mode::Off);
    server.fail_lists(NAMESPACES, None);
    server.apply(NAMESPACES, namespace("team-d", json!({MODE_LABEL: "warn"})));
    eventually("team-d warn", || mode_of(&store, "team-d") == Mode::Warn).await;
    assert_eq!(mode_of(&store, "team-c"), Mode::Off);

    let counts = server.counts(NAMESPACES);
    assert_eq!(counts.metadata_only, counts.lists + counts.watches);
    drop(watch);
}

/// A watch request answered with HTTP 410 (its resourceVersion compacted away) leads to a fresh
/// list, as for the cache kinds, rather than the same watch retried forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_refused_with_http_410_relists() {
    let server = FakeApiServer::start(&[]).await;
    server.apply(NAMESPACES, namespace("old", json!({MODE_LABEL: "off"})));
    let store = Arc::new(NamespaceStore::new(Namespaces::default()));
    let watch = NamespaceWatch::spawn(server.client(), store.clone(), config());
    eventually("listed", || watch.is_listed()).await;
    assert_eq!(mode_of(&store, "old"), Mode::Off);
    let lists = server.counts(NAMESPACES).lists;

    // Changes the watch does not see, then history it cannot resume from.
    server.set_partitioned(true);
    server.delete(NAMESPACES, None, "old");
    server.apply(NAMESPACES, namespace("new", json!({MODE_LABEL: "warn"})));
    server.compact();
    server.set_http_410(true);
    server.drop_watches();
    server.set_partitioned(false);

    eventually("the relist replaced the labels", || {
        mode_of(&store, "old") == Mode::Enforce && mode_of(&store, "new") == Mode::Warn
    })
    .await;
    assert!(server.counts(NAMESPACES).lists > lists);
    drop(watch);
}
