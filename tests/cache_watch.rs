//! The cluster cache watch against a fake API server that speaks the list/watch protocol
//! (tests/support/fake_apiserver.rs). Resolution is checked end to end: real AdmissionReview
//! bodies through `admission::review`, against `store.view()`, as `serve` does.
//!
//! Every wait is a poll with a 10 s deadline; nothing sleeps for a fixed time, except the one
//! check that something does not happen (nothing published for events that change nothing).

#[path = "common/cli.rs"]
mod cli;
mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use base64::Engine;
use modelgate::admission::{self, Context, Webhook};
use modelgate::cache::watch::WatchBackoff;
use modelgate::cache::{CacheIndex, CacheMetrics, CacheStore, CacheWatch, CacheWatchConfig};
use modelgate::config::PolicyConfig;
use serde_json::{Value, json};
use support::fake_apiserver::{
    ALL, CACHES, FakeApiServer, NAMESPACE_CACHES, NODE_GROUPS, NODES, PVCS,
};

/// The custom resources, all installed.
const CRDS: [&str; 3] = [CACHES, NAMESPACE_CACHES, NODE_GROUPS];

fn config() -> CacheWatchConfig {
    CacheWatchConfig {
        sync_timeout: Duration::from_secs(30),
        debounce: Duration::from_millis(10),
        backoff: WatchBackoff::Exponential {
            min: Duration::from_millis(10),
            max: Duration::from_millis(100),
        },
        watch_timeout: None,
        watch_metrics: Default::default(),
        cap_relist_interval: Duration::from_millis(100),
        ..CacheWatchConfig::default()
    }
}

async fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Downloaded on gpu-1, which [`routable`] makes a Node of the group `workers`.
fn ns_cache(ns: &str, name: &str, uri: &str) -> Value {
    json!({
        "metadata": {"name": name, "namespace": ns},
        "spec": {"sourceModelUri": uri, "modelSize": "1Gi", "nodeGroups": ["workers"]},
        "status": {"nodeStatus": {"gpu-1": "NodeDownloaded"}}
    })
}

fn cluster_cache(name: &str, uri: &str) -> Value {
    json!({
        "metadata": {"name": name},
        "spec": {"sourceModelUri": uri, "modelSize": "1Gi", "nodeGroups": ["workers"]},
        "status": {"nodeStatus": {"gpu-1": "NodeDownloaded"}}
    })
}

/// What a hit needs besides the cache: the Node gpu-1 of group `workers` and the PVC
/// `<cache>-workers` of every cache these tests use, in every namespace they use.
fn routable(server: &FakeApiServer) {
    server.apply(
        NODES,
        json!({"metadata": {"name": "gpu-1", "labels": {"node-type": "gpu", "kubernetes.io/hostname": "gpu-1"}}, "spec": {}}),
    );
    let caches = [
        "shared",
        "mine",
        "other",
        "old",
        "new",
        "private",
        "static",
        "cluster-only",
        "fine",
    ];
    for ns in ["team-a", "team-b", "team-c", "x"] {
        for cache in caches {
            server.apply(
                PVCS,
                json!({"metadata": {"name": format!("{cache}-workers"), "namespace": ns},
                       "spec": {"accessModes": ["ReadWriteOnce"]}, "status": {"phase": "Bound"}}),
            );
        }
    }
}

fn node_group() -> Value {
    json!({
        "metadata": {"name": "workers"},
        "spec": {"storageLimit": "100Gi", "persistentVolumeSpec": {
            "capacity": {"storage": "100Gi"}, "local": {"path": "/models"},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "node-type", "operator": "In", "values": ["gpu"]}]}
            ]}}
        }}
    })
}

static UID: AtomicUsize = AtomicUsize::new(0);

fn pod_review(namespace: &str, model_uri: &str) -> Vec<u8> {
    let uid = UID.fetch_add(1, Ordering::Relaxed);
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": format!("uid-{uid}"),
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
            "object": {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"generateName": "predictor-", "annotations": {"modelgate.io/model-uri": model_uri}},
                "spec": {"containers": [{"name": "kserve-container", "image": "vllm"}]}
            }
        }
    })
    .to_string()
    .into_bytes()
}

/// What the mutating webhook answers for a pod in `namespace` asking for `model_uri`: the
/// `modelgate.io/model-cache` annotation it sets (`namespace/<ns>/<name>`, `cluster/<name>` or
/// `miss`), and the warnings.
fn resolve(store: &CacheStore, namespace: &str, model_uri: &str) -> (String, Vec<String>) {
    let policy = PolicyConfig::default();
    let view = store.view();
    let ctx = Context {
        config: &policy,
        caches: view.caches(),
        namespaces: modelgate::namespaces::Namespaces::none(),
        now: None,
    };
    let outcome = admission::review(Webhook::Mutate, &pod_review(namespace, model_uri), &ctx);
    assert_eq!(outcome.http_status, 200);
    let body: Value = serde_json::from_slice(&outcome.body).unwrap();
    let response = &body["response"];
    assert_eq!(response["allowed"], true, "{response}");
    let patch = base64::engine::general_purpose::STANDARD
        .decode(response["patch"].as_str().unwrap())
        .unwrap();
    let ops: Vec<Value> = serde_json::from_slice(&patch).unwrap();
    let cache = ops
        .iter()
        .find(|op| {
            op["path"]
                .as_str()
                .unwrap()
                .ends_with("modelgate.io~1model-cache")
        })
        .map(|op| op["value"].as_str().unwrap().to_string())
        .unwrap_or_else(|| panic!("no model-cache annotation in {ops:?}"));
    let warnings = response["warnings"]
        .as_array()
        .map(|w| w.iter().map(|s| s.as_str().unwrap().to_string()).collect())
        .unwrap_or_default();
    (cache, warnings)
}

fn resolution(store: &CacheStore, namespace: &str, model_uri: &str) -> String {
    resolve(store, namespace, model_uri).0
}

fn metrics_text(metrics: &CacheMetrics) -> String {
    let mut registry = prometheus_client::registry::Registry::default();
    metrics.register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    text
}

/// A fake server with the CRDs of `installed`, the node group `workers` and the cluster cache
/// `shared` for `hf://org/llama`.
async fn seeded(installed: &[&str]) -> FakeApiServer {
    let server = FakeApiServer::start(installed).await;
    routable(&server);
    server.apply(NODE_GROUPS, node_group());
    server.apply(CACHES, cluster_cache("shared", "hf://org/llama"));
    server
}

/// A seeded fake server with every CRD, and a watch that has synced with it.
async fn synced(config: CacheWatchConfig) -> (FakeApiServer, CacheWatch, CacheMetrics) {
    let server = seeded(&CRDS).await;
    let metrics = CacheMetrics::new();
    let watch = CacheWatch::spawn(server.client(), CacheIndex::new(), metrics.clone(), config);
    let readiness = watch.readiness();
    eventually("ready", || readiness.is_ready()).await;
    assert!(watch.store().is_synced());
    for plural in ALL {
        eventually("the watches are open", || server.open_watches(plural) == 1).await;
    }
    (server, watch, metrics)
}

#[tokio::test]
async fn a_namespace_cache_resolves_in_its_namespace_only_moves_on_update_and_goes_on_delete() {
    let (server, watch, _) = synced(config()).await;
    let store = watch.store();
    assert_eq!(
        resolution(store, "team-a", "hf://org/llama/v1"),
        "cluster/shared"
    );

    server.apply(
        NAMESPACE_CACHES,
        ns_cache("team-a", "mine", "hf://org/llama"),
    );
    eventually("team-a's cache is used", || {
        resolution(store, "team-a", "hf://org/llama/v1") == "namespace/team-a/mine"
    })
    .await;
    assert_eq!(
        resolution(store, "team-b", "hf://org/llama/v1"),
        "cluster/shared"
    );
    let (_, warnings) = resolve(store, "team-a", "hf://org/llama/v1");
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("served from LocalModelNamespaceCache team-a/mine")),
        "{warnings:?}"
    );

    // An update moves it to another model.
    server.apply(
        NAMESPACE_CACHES,
        ns_cache("team-a", "mine", "hf://org/mistral"),
    );
    eventually("the update is seen", || {
        resolution(store, "team-a", "hf://org/mistral/7b") == "namespace/team-a/mine"
    })
    .await;
    assert_eq!(
        resolution(store, "team-a", "hf://org/llama/v1"),
        "cluster/shared"
    );
    assert_eq!(resolution(store, "team-b", "hf://org/mistral/7b"), "miss");

    server.delete(NAMESPACE_CACHES, Some("team-a"), "mine");
    eventually("the delete is seen", || {
        resolution(store, "team-a", "hf://org/mistral/7b") == "miss"
    })
    .await;
    let c = store.view().index.counts();
    assert_eq!(
        (c.namespace_caches, c.cluster_caches, c.node_groups),
        (0, 1, 1)
    );
}

#[tokio::test]
async fn a_dropped_watch_reconnects_from_its_resource_version_and_converges() {
    let (server, watch, _) = synced(config()).await;
    let store = watch.store();
    let before = server.counts(NAMESPACE_CACHES);
    assert_eq!(server.drop_watches(), ALL.len());
    server.apply(
        NAMESPACE_CACHES,
        ns_cache("team-a", "mine", "hf://org/llama"),
    );
    server.apply(CACHES, cluster_cache("other", "hf://org/other"));
    eventually("converged", || {
        resolution(store, "team-a", "hf://org/llama") == "namespace/team-a/mine"
            && resolution(store, "team-b", "hf://org/other/x") == "cluster/other"
    })
    .await;
    eventually("the watch is open again", || {
        server.open_watches(NAMESPACE_CACHES) == 1
    })
    .await;
    let after = server.counts(NAMESPACE_CACHES);
    assert!(after.watches > before.watches, "{before:?} {after:?}");
    assert_eq!(after.lists, before.lists, "resumed without a relist");
}

/// Deletes `old` and adds `new` where the watch cannot see it, then forgets the history: only a
/// fresh list can tell the watch that `old` is gone.
fn change_behind_the_watch(server: &FakeApiServer) {
    server.set_partitioned(true);
    server.delete(NAMESPACE_CACHES, Some("team-a"), "old");
    server.apply(NAMESPACE_CACHES, ns_cache("team-a", "new", "hf://org/new"));
    server.compact();
}

async fn relists_after_gone(http_410: bool) {
    let (server, watch, metrics) = synced(config()).await;
    let store = watch.store();
    server.apply(NAMESPACE_CACHES, ns_cache("team-a", "old", "hf://org/old"));
    eventually("old is seen", || {
        resolution(store, "team-a", "hf://org/old") == "namespace/team-a/old"
    })
    .await;
    let before = server.counts(NAMESPACE_CACHES);

    change_behind_the_watch(&server);
    server.set_http_410(http_410);
    if http_410 {
        // The watch ends; resuming from its resourceVersion answers HTTP 410.
        server.drop_watches();
    } else {
        // The server ends the watch with an ERROR event carrying a 410 Status.
        server.expire_watches();
    }
    server.set_partitioned(false);

    eventually("the relist replaced the objects", || {
        resolution(store, "team-a", "hf://org/old") == "miss"
            && resolution(store, "team-a", "hf://org/new") == "namespace/team-a/new"
    })
    .await;
    assert!(server.counts(NAMESPACE_CACHES).lists > before.lists);
    assert!(store.is_synced(), "stays synced through a relist");
    let text = metrics_text(&metrics);
    let restarts = text
        .lines()
        .find(|l| {
            l.starts_with(
                r#"modelgate_cache_watch_restarts_total{kind="LocalModelNamespaceCache"}"#,
            )
        })
        .unwrap();
    assert!(!restarts.ends_with(" 0"), "{restarts}");
}

#[tokio::test]
async fn a_410_error_event_leads_to_a_relist() {
    relists_after_gone(false).await;
}

#[tokio::test]
async fn an_http_410_on_the_watch_request_leads_to_a_relist() {
    relists_after_gone(true).await;
}

#[tokio::test]
async fn bookmarks_move_the_resource_version_so_a_reconnect_needs_no_relist() {
    let (server, _watch, _) = synced(config()).await;
    // The cluster caches move on; the other kinds' last resourceVersion is now behind.
    server.apply(CACHES, cluster_cache("other", "hf://org/other"));
    let before: Vec<_> = ALL.iter().map(|p| server.counts(p)).collect();
    server.send_bookmarks();
    server.compact();
    // Buffered events (the bookmark) are delivered before the stream ends.
    server.drop_watches();
    for (plural, before) in ALL.iter().zip(&before) {
        eventually("reconnected", || {
            server.counts(plural).watches > before.watches && server.open_watches(plural) == 1
        })
        .await;
        assert_eq!(
            server.counts(plural).lists,
            before.lists,
            "{plural} relisted"
        );
    }
}

#[tokio::test]
async fn a_missing_crd_counts_as_empty_and_the_cache_appears_once_installed() {
    let server = seeded(&[CACHES, NODE_GROUPS]).await;
    let metrics = CacheMetrics::new();
    let started = Instant::now();
    let watch = CacheWatch::spawn(
        server.client(),
        CacheIndex::new(),
        metrics.clone(),
        config(),
    );
    let store = watch.store();
    let readiness = watch.readiness();
    eventually("ready without the CRD", || readiness.is_ready()).await;
    assert!(store.is_synced());
    let (cache, warnings) = resolve(store, "team-a", "hf://org/private/m");
    assert_eq!(cache, "miss");
    assert!(
        warnings.iter().all(|w| !w.contains("not synced")),
        "{warnings:?}"
    );
    assert_eq!(
        resolution(store, "team-a", "hf://org/llama"),
        "cluster/shared"
    );
    assert!(
        metrics_text(&metrics)
            .contains(r#"modelgate_cache_synced{kind="LocalModelNamespaceCache"} 1"#)
    );

    // Retried in the background, backing off (10, 20, 40, 80, then every 100 ms): about 8
    // lists in the first half second, where retrying at the minimum delay would make 50.
    eventually("retried", || server.counts(NAMESPACE_CACHES).lists >= 3).await;
    let window = Duration::from_millis(500);
    tokio::time::sleep(window.saturating_sub(started.elapsed())).await;
    let lists = server.counts(NAMESPACE_CACHES).lists;
    assert!(
        lists <= 12,
        "{lists} lists in {:?}: no backoff",
        started.elapsed()
    );

    server.install(NAMESPACE_CACHES);
    server.apply(
        NAMESPACE_CACHES,
        ns_cache("team-a", "private", "hf://org/private"),
    );
    eventually("the cache appears", || {
        resolution(store, "team-a", "hf://org/private/m") == "namespace/team-a/private"
    })
    .await;
    // And it is watched from then on.
    server.delete(NAMESPACE_CACHES, Some("team-a"), "private");
    eventually("the delete is seen", || {
        resolution(store, "team-a", "hf://org/private/m") == "miss"
    })
    .await;
}

#[tokio::test]
async fn not_ready_until_every_kind_has_listed() {
    let server = seeded(&CRDS).await;
    server.fail_lists(NODE_GROUPS, Some(500));
    let metrics = CacheMetrics::new();
    let watch = CacheWatch::spawn(
        server.client(),
        CacheIndex::new(),
        metrics.clone(),
        config(),
    );
    let store = watch.store();
    let readiness = watch.readiness();
    // The two other kinds list at once; the failing one is retried.
    eventually("retried", || server.counts(NODE_GROUPS).lists >= 3).await;
    assert!(server.counts(CACHES).lists >= 1 && server.counts(NAMESPACE_CACHES).lists >= 1);
    assert!(!readiness.is_ready());
    assert!(!store.is_synced());
    let (cache, warnings) = resolve(store, "team-a", "hf://org/llama");
    assert_eq!(cache, "miss");
    assert!(
        warnings.iter().any(|w| w.contains("not synced")),
        "{warnings:?}"
    );
    let text = metrics_text(&metrics);
    assert!(text.contains(r#"modelgate_cache_synced{kind="LocalModelNodeGroup"} 0"#));
    assert!(text.contains(r#"modelgate_cache_synced{kind="LocalModelCache"} 1"#));

    server.fail_lists(NODE_GROUPS, None);
    let mut waiting = watch.readiness();
    tokio::time::timeout(Duration::from_secs(10), waiting.wait())
        .await
        .expect("ready once the last kind listed");
    assert!(store.is_synced());
    assert_eq!(
        resolution(store, "team-a", "hf://org/llama"),
        "cluster/shared"
    );
}

#[tokio::test]
async fn after_the_sync_timeout_ready_with_misses_and_a_warning_until_synced() {
    let server = seeded(&CRDS).await;
    server.fail_lists(NAMESPACE_CACHES, Some(403));
    let timeout = Duration::from_millis(300);
    let started = Instant::now();
    let watch = CacheWatch::spawn(
        server.client(),
        CacheIndex::new(),
        CacheMetrics::new(),
        CacheWatchConfig {
            sync_timeout: timeout,
            ..config()
        },
    );
    let store = watch.store();
    let readiness = watch.readiness();
    eventually("ready after the timeout", || readiness.is_ready()).await;
    assert!(started.elapsed() >= timeout);
    assert!(!store.is_synced());
    // The cluster cache is known, but without the namespace caches that could win it is not
    // used: a miss with the warning.
    let (cache, warnings) = resolve(store, "team-a", "hf://org/llama");
    assert_eq!(cache, "miss");
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("model caches are not synced")),
        "{warnings:?}"
    );

    server.fail_lists(NAMESPACE_CACHES, None);
    eventually("synced late", || store.is_synced()).await;
    assert!(readiness.is_ready());
    assert_eq!(
        resolution(store, "team-a", "hf://org/llama"),
        "cluster/shared"
    );
}

#[tokio::test]
async fn not_ready_until_pvcs_and_nodes_have_listed_and_nodes_are_read_by_metadata_only() {
    for failing in [PVCS, NODES] {
        let server = seeded(&CRDS).await;
        server.fail_lists(failing, Some(403));
        let watch = CacheWatch::spawn(
            server.client(),
            CacheIndex::new(),
            CacheMetrics::new(),
            config(),
        );
        let store = watch.store();
        eventually("retried", || server.counts(failing).lists >= 3).await;
        assert!(!watch.readiness().is_ready(), "{failing}");
        let (cache, warnings) = resolve(store, "team-a", "hf://org/llama");
        assert_eq!(cache, "miss");
        assert!(
            warnings.iter().any(|w| w.contains("not synced")),
            "{warnings:?}"
        );
        server.fail_lists(failing, None);
        eventually("synced", || store.is_synced()).await;
        assert_eq!(
            resolution(store, "team-a", "hf://org/llama"),
            "cluster/shared"
        );
        let nodes = server.counts(NODES);
        assert_eq!(
            nodes.metadata_only,
            nodes.lists + nodes.watches,
            "{nodes:?}"
        );
        assert_eq!(server.counts(PVCS).metadata_only, 0);
    }
}

#[tokio::test]
async fn large_kinds_are_listed_in_pages() {
    let server = seeded(&CRDS).await;
    let seeded_pvcs = server.counts(PVCS);
    assert_eq!(seeded_pvcs.lists, 0);
    for i in 0..1_200 {
        server.apply(
            PVCS,
            json!({"metadata": {"name": format!("claim-{i}"), "namespace": "bulk"},
                   "status": {"phase": "Bound"}}),
        );
    }
    let watch = CacheWatch::spawn(
        server.client(),
        CacheIndex::new(),
        CacheMetrics::new(),
        config(),
    );
    let store = watch.store();
    eventually("synced", || store.is_synced()).await;
    // 36 seeded claims and 1 200 more, in pages of 500.
    assert_eq!(store.view().index.counts().pvcs, 36 + 1_200);
    assert_eq!(server.counts(PVCS).lists, 3);

    // Namespace caches, which tenants write, in pages of 25 (a page is decoded whole).
    let server = seeded(&CRDS).await;
    for i in 0..70 {
        server.apply(
            NAMESPACE_CACHES,
            ns_cache(&format!("team-{}", i % 3), &format!("c{i}"), "hf://org/m"),
        );
    }
    let watch = CacheWatch::spawn(
        server.client(),
        CacheIndex::new(),
        CacheMetrics::new(),
        config(),
    );
    let store = watch.store();
    eventually("synced", || store.is_synced()).await;
    assert_eq!(store.view().index.counts().namespace_caches, 70);
    assert_eq!(server.counts(NAMESPACE_CACHES).lists, 3);
}

#[tokio::test]
async fn pvc_deletion_and_node_status_changes_reach_the_next_admission() {
    let (server, watch, _) = synced(config()).await;
    let store = watch.store();
    assert_eq!(
        resolution(store, "team-b", "hf://org/llama"),
        "cluster/shared"
    );
    // The claim is being deleted (pvc-protection keeps it until unused), then gone.
    server.apply(
        PVCS,
        json!({"metadata": {"name": "shared-workers", "namespace": "team-b",
                            "deletionTimestamp": "2026-11-30T00:00:00Z"},
               "status": {"phase": "Bound"}}),
    );
    eventually("pvc-missing", || {
        resolve(store, "team-b", "hf://org/llama")
            .1
            .iter()
            .any(|w| w.contains("PVC team-b/shared-workers is being deleted"))
    })
    .await;
    server.delete(PVCS, Some("team-b"), "shared-workers");
    eventually("gone", || {
        resolve(store, "team-b", "hf://org/llama")
            .1
            .iter()
            .any(|w| w.contains("PVC team-b/shared-workers does not exist"))
    })
    .await;
    // The Node leaves the group (relabelled): nothing downloaded is left there.
    server.apply(
        NODES,
        json!({"metadata": {"name": "gpu-1", "labels": {"node-type": "cpu", "kubernetes.io/hostname": "gpu-1"}}}),
    );
    eventually("not-downloaded", || {
        let w = resolve(store, "team-a", "hf://org/llama").1;
        w.iter()
            .any(|w| w.starts_with("not-downloaded: LocalModelCache shared"))
    })
    .await;
}

#[tokio::test]
async fn static_caches_are_merged_and_replace_cluster_objects_of_the_same_name() {
    let server = seeded(&CRDS).await;
    server.apply(
        CACHES,
        cluster_cache("cluster-only", "hf://org/cluster-only"),
    );
    let mut files = CacheIndex::new();
    files
        .insert_object(&json!({
            "apiVersion": "serving.kserve.io/v1alpha1", "kind": "LocalModelCache",
            "metadata": {"name": "shared"},
            "spec": {"sourceModelUri": "hf://org/from-file", "nodeGroups": ["workers"]},
            "status": {"nodeStatus": {"gpu-1": "NodeDownloaded"}}
        }))
        .unwrap();
    files
        .insert_object(&json!({
            "apiVersion": "serving.kserve.io/v1alpha1", "kind": "LocalModelNamespaceCache",
            "metadata": {"name": "static", "namespace": "team-a"},
            "spec": {"sourceModelUri": "hf://org/static", "nodeGroups": ["workers"]},
            "status": {"nodeStatus": {"gpu-1": "NodeDownloaded"}}
        }))
        .unwrap();
    let watch = CacheWatch::spawn(server.client(), files, CacheMetrics::new(), config());
    let store = watch.store();
    // Before the first list the static caches are published, but not trusted.
    let c = store.view().index.counts();
    assert_eq!(
        (c.namespace_caches, c.cluster_caches, c.node_groups),
        (1, 1, 0)
    );
    eventually("synced", || store.is_synced()).await;
    assert_eq!(
        resolution(store, "team-a", "hf://org/static/x"),
        "namespace/team-a/static"
    );
    assert_eq!(
        resolution(store, "team-a", "hf://org/from-file"),
        "cluster/shared"
    );
    assert_eq!(resolution(store, "team-a", "hf://org/llama"), "miss");
    assert_eq!(
        resolution(store, "team-a", "hf://org/cluster-only"),
        "cluster/cluster-only"
    );
    // Deleting the cluster object does not remove the file's.
    server.delete(CACHES, None, "shared");
    server.delete(CACHES, None, "cluster-only");
    eventually("deletes seen", || {
        resolution(store, "team-a", "hf://org/cluster-only") == "miss"
    })
    .await;
    assert_eq!(
        resolution(store, "team-a", "hf://org/from-file"),
        "cluster/shared"
    );
}

#[tokio::test]
async fn an_object_that_does_not_decode_is_skipped_not_fatal() {
    let server = FakeApiServer::start(&CRDS).await;
    routable(&server);
    server.apply(NODE_GROUPS, node_group());
    server.apply(
        CACHES,
        json!({"metadata": {"name": "broken"}, "spec": {"nodeGroups": 7}}),
    );
    server.apply(CACHES, cluster_cache("fine", "hf://org/fine"));
    let watch = CacheWatch::spawn(
        server.client(),
        CacheIndex::new(),
        CacheMetrics::new(),
        config(),
    );
    let store = watch.store();
    eventually("synced", || store.is_synced()).await;
    assert_eq!(resolution(store, "x", "hf://org/fine"), "cluster/fine");
    // An update that breaks a good object removes it; fixing it brings it back.
    server.apply(CACHES, json!({"metadata": {"name": "fine"}, "spec": {}}));
    eventually("broken update removes", || {
        resolution(store, "x", "hf://org/fine") == "miss"
    })
    .await;
    server.apply(CACHES, cluster_cache("fine", "hf://org/fine"));
    eventually("fixed", || {
        resolution(store, "x", "hf://org/fine") == "cluster/fine"
    })
    .await;
}

#[tokio::test]
async fn a_burst_of_events_costs_few_publishes() {
    let (server, watch, metrics) = synced(CacheWatchConfig {
        debounce: Duration::from_millis(100),
        ..config()
    })
    .await;
    let before = watch.publishes();
    for i in 0..300 {
        server.apply(
            NAMESPACE_CACHES,
            ns_cache(
                &format!("team-{}", i % 7),
                &format!("m-{i}"),
                &format!("hf://org/m-{i}"),
            ),
        );
    }
    let store = watch.store();
    eventually("all 300 seen", || {
        store.view().index.counts().namespace_caches == 300
    })
    .await;
    let publishes = watch.publishes() - before;
    assert!(
        (1..=20).contains(&publishes),
        "{publishes} publishes for 300 events"
    );
    assert!(
        metrics_text(&metrics)
            .contains(r#"modelgate_cache_objects{kind="LocalModelNamespaceCache"} 300"#)
    );
}

/// The seeded cluster cache `shared` with gpu-1 downloaded and gpu-2 at `gpu_2`, `available`
/// copies and a resourceVersion the server bumps: what KServe's controller writes as the
/// download goes on.
fn shared_cache_status(gpu_2: &str, available: u32) -> Value {
    json!({
        "metadata": {"name": "shared"},
        "spec": {"sourceModelUri": "hf://org/llama", "modelSize": "1Gi", "nodeGroups": ["workers"]},
        "status": {"nodeStatus": {"gpu-1": "NodeDownloaded", "gpu-2": gpu_2},
                   "copies": {"available": available, "total": 2}}
    })
}

#[tokio::test]
async fn events_that_change_nothing_the_index_keeps_publish_nothing() {
    let (server, watch, _) = synced(config()).await;
    let store = watch.store();
    // A change that is published, so that counting starts after every publish of the sync.
    server.apply(CACHES, shared_cache_status("NodeDownloadPending", 1));
    eventually("gpu-2 pending", || {
        let request = modelgate::cache::LookupRequest::new("team-a", "hf://org/llama");
        let index = store.view().index;
        let hit = index.lookup(&request);
        hit.hit()
            .is_some_and(|h| h.cache.status.node("gpu-2").is_some())
    })
    .await;
    let before = watch.publishes();
    let snapshot = store.view().index;
    for i in 0..20u32 {
        // A kubelet's heartbeat as a metadata watch sees it: a new resourceVersion, annotations.
        server.apply(
            NODES,
            json!({"metadata": {"name": "gpu-1",
                                "labels": {"node-type": "gpu", "kubernetes.io/hostname": "gpu-1"},
                                "annotations": {"heartbeat": i.to_string()}}}),
        );
        // A PVC resized.
        server.apply(
            PVCS,
            json!({"metadata": {"name": "shared-workers", "namespace": "team-a"},
                   "spec": {"accessModes": ["ReadWriteOnce"],
                            "resources": {"requests": {"storage": format!("{}Gi", i + 1)}}},
                   "status": {"phase": "Bound", "capacity": {"storage": format!("{}Gi", i + 1)}}}),
        );
        // The download goes on without a node reaching NodeDownloaded.
        let state = ["NodeDownloadPending", "NodeDownloading"][i as usize % 2];
        server.apply(CACHES, shared_cache_status(state, 1 + i % 2));
    }
    // 30 debounce intervals: a publish for any of those events would have happened by now.
    let quiet_until = Instant::now() + Duration::from_millis(300);
    while Instant::now() < quiet_until {
        assert_eq!(
            watch.publishes(),
            before,
            "an event that changed nothing published"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(std::sync::Arc::ptr_eq(&snapshot, &store.view().index));
    // The watches did receive them: a real change of each kind after them is published.
    server.apply(CACHES, shared_cache_status("NodeDownloaded", 2));
    server.apply(
        PVCS,
        json!({"metadata": {"name": "shared-workers", "namespace": "team-a"},
               "status": {"phase": "Lost"}}),
    );
    server.apply(
        NODES,
        json!({"metadata": {"name": "gpu-3", "labels": {"node-type": "gpu"}}}),
    );
    eventually("the real changes", || {
        let index = store.view().index;
        index.counts().nodes == 2
            && resolve(store, "team-a", "hf://org/llama")
                .1
                .iter()
                .any(|w| w.contains("PVC team-a/shared-workers is Lost"))
    })
    .await;
    assert!(watch.publishes() > before);
}

#[tokio::test]
async fn a_burst_of_admissions_makes_no_request_to_the_api_server() {
    let (server, watch, _metrics) = synced(config()).await;
    server.apply(
        NAMESPACE_CACHES,
        ns_cache("team-a", "mine", "hf://org/mine"),
    );
    let store = watch.store();
    eventually("seen", || {
        resolution(store, "team-a", "hf://org/mine") == "namespace/team-a/mine"
    })
    .await;
    let requests = server.requests();
    let n = 3_000;
    let started = Instant::now();
    for i in 0..n {
        let (ns, uri) = match i % 3 {
            0 => ("team-a", "hf://org/mine/config.json"),
            1 => ("team-b", "hf://org/llama/tokenizer.json"),
            _ => ("team-c", "s3://elsewhere/model"),
        };
        let expected = ["namespace/team-a/mine", "cluster/shared", "miss"][i % 3];
        assert_eq!(resolution(store, ns, uri), expected);
    }
    let elapsed = started.elapsed();
    assert_eq!(
        server.requests(),
        requests,
        "admissions called the API server"
    );
    eprintln!(
        "{n} admissions in {elapsed:?} ({:?} each), 0 API requests",
        elapsed / n as u32
    );
}

#[tokio::test]
async fn review_from_cluster_lists_once_with_the_kubeconfig_context() {
    let server = FakeApiServer::start(&[CACHES, NODE_GROUPS]).await;
    routable(&server);
    server.apply(NODE_GROUPS, node_group());
    server.apply(CACHES, cluster_cache("shared", "hf://org/llama"));
    let dir = std::env::temp_dir().join(format!("modelgate-review-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join("kubeconfig");
    server.write_kubeconfig(&kubeconfig);
    let pods = dir.join("pods.yaml");
    std::fs::write(
        &pods,
        "apiVersion: v1\nkind: Pod\nmetadata: {name: a, namespace: team-a, annotations: {modelgate.io/model-uri: 'hf://org/llama'}}\nspec: {containers: [{name: c, image: i}]}\n\
         ---\napiVersion: v1\nkind: Pod\nmetadata: {name: b, namespace: team-b, annotations: {modelgate.io/model-uri: 'hf://org/llama'}}\nspec: {containers: [{name: c, image: i}]}\n",
    )
    .unwrap();
    let run = |kubeconfig: std::path::PathBuf, pods: std::path::PathBuf| {
        tokio::task::spawn_blocking(move || {
            let pods = pods.to_str().unwrap();
            cli::command(&["review", "--from-cluster", "-o", "patched-json", pods])
                .env("KUBECONFIG", &kubeconfig)
                .output()
                .unwrap()
        })
    };
    let out = run(kubeconfig.clone(), pods.clone()).await.unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let annotations: Vec<String> = stdout
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            v["metadata"]["annotations"]["modelgate.io/model-cache"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(annotations, ["cluster/shared", "cluster/shared"]);
    assert!(
        stderr.contains("note: --from-cluster: LocalModelNamespaceCache: the CRD is not installed"),
        "{stderr}"
    );
    // PVCs listed whole, Nodes by metadata only, each once.
    assert_eq!(server.counts(PVCS).lists, 1);
    assert_eq!(server.counts(NODES).lists, 1);
    assert_eq!(server.counts(CACHES).watches, 0, "listed once, no watch");

    // No cluster to reach: exit 2 and a message that says what to do.
    let out = run(dir.join("missing-kubeconfig"), pods).await.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("cannot reach the cluster"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}
