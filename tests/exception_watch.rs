//! `ModelgateException`s through a real list/watch of the fake API server
//! (tests/support/fake_apiserver.rs), as `serve` watches them with the caches
//! (docs/exceptions.md): the readiness waits for their list, a new exception is honoured once
//! the watch delivers it, a deleted one no longer is, and an admission makes no API call. The
//! `expires` of each one held is exported as `modelgate_exception_expiry_timestamp_seconds`.

mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use modelgate::admission::{self, Context, Webhook};
use modelgate::cache::watch::WatchBackoff;
use modelgate::cache::{CacheIndex, CacheMetrics, CacheStore, CacheWatch, CacheWatchConfig};
use modelgate::config::PolicyConfig;
use modelgate::exceptions::{NAMESPACE_LABEL, parse_time};
use modelgate::namespaces::{NamespaceLabels, Namespaces};
use prometheus_client::registry::Registry;
use serde_json::{Value, json};
use support::fake_apiserver::{CACHES, EXCEPTIONS, FakeApiServer, NAMESPACE_CACHES, NODE_GROUPS};

const VENDOR: &str = "registry.example/vendor@sha256:abc";

fn config() -> CacheWatchConfig {
    CacheWatchConfig {
        sync_timeout: Duration::from_secs(30),
        debounce: Duration::from_millis(10),
        backoff: WatchBackoff::Exponential {
            min: Duration::from_millis(10),
            max: Duration::from_millis(100),
        },
        watch_timeout: None,
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

fn exception(name: &str) -> Value {
    json!({
        "metadata": {"name": name, "namespace": "team-a",
                     "creationTimestamp": "2026-11-20T00:00:00Z"},
        "spec": {"reason": "vendor image runs as root until 2.0",
                 "expires": "2027-01-01T00:00:00Z", "rules": ["non-root"],
                 "selector": {"matchLabels": {"app": "vendor"}}, "images": [VENDOR]}
    })
}

fn root_pod_review() -> Vec<u8> {
    json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "u-1",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "team-a", "operation": "CREATE", "userInfo": {"username": "alice"},
            "object": {"apiVersion": "v1", "kind": "Pod",
                       "metadata": {"name": "p", "labels": {"app": "vendor"}},
                       "spec": {"containers": [{"name": "vendor", "image": VENDOR,
                                                "securityContext": {"runAsUser": 0}}]}}
        }
    })
    .to_string()
    .into_bytes()
}

/// `/mutate` of a pod whose container runs as uid 0: allowed only under an exception. Returns
/// `allowed` and the audit annotation `exception`.
fn admit(store: &CacheStore, namespaces: &Namespaces) -> (bool, Option<String>) {
    let policy = PolicyConfig::default();
    let view = store.view();
    let ctx = Context {
        config: &policy,
        caches: view.caches(),
        namespaces,
        now: parse_time("2026-12-01T00:00:00Z"),
    };
    let outcome = admission::review(Webhook::Mutate, &root_pod_review(), &ctx);
    let body: Value = serde_json::from_slice(&outcome.body).unwrap();
    let response = &body["response"];
    (
        response["allowed"] == true,
        response["auditAnnotations"]["exception"]
            .as_str()
            .map(str::to_string),
    )
}

/// The `modelgate_exception_expiry_timestamp_seconds` samples of `registry`.
fn expiry_samples(registry: &Registry) -> Vec<String> {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
    text.lines()
        .filter(|l| l.starts_with("modelgate_exception_expiry_timestamp_seconds{"))
        .map(str::to_string)
        .collect()
}

/// The sample of the exception `team-a/name`, which expires at 2027-01-01T00:00:00Z.
fn expiry_sample(name: &str) -> String {
    let expires = parse_time("2027-01-01T00:00:00Z").unwrap();
    format!(
        r#"modelgate_exception_expiry_timestamp_seconds{{namespace="team-a",name="{name}"}} {expires}"#
    )
}

fn open_team_a() -> Namespaces {
    let mut namespaces = Namespaces::default();
    let labels = BTreeMap::from([(NAMESPACE_LABEL.to_string(), "allowed".to_string())]);
    namespaces.set("team-a", NamespaceLabels::from_labels(&labels));
    namespaces
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exceptions_are_watched_like_the_caches() {
    let server = FakeApiServer::start(&[CACHES, NAMESPACE_CACHES, NODE_GROUPS, EXCEPTIONS]).await;
    server.apply(EXCEPTIONS, exception("vendor-root"));
    // Until the exceptions are listed, the server is not ready.
    server.fail_lists(EXCEPTIONS, Some(500));
    let metrics = CacheMetrics::new();
    let mut registry = Registry::default();
    metrics.register(&mut registry);
    let watch = CacheWatch::spawn(server.client(), CacheIndex::new(), metrics, config());
    let readiness = watch.readiness();
    let store = watch.store().clone();
    eventually("a list of the exceptions attempted", || {
        server.counts(EXCEPTIONS).lists > 0
    })
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !readiness.is_ready(),
        "ready before the exceptions were listed"
    );
    server.fail_lists(EXCEPTIONS, None);
    eventually("ready", || readiness.is_ready()).await;
    assert!(store.is_synced());

    let open = open_team_a();
    eventually("the listed exception honoured", || {
        admit(&store, &open) == (true, Some("vendor-root".into()))
    })
    .await;
    // The same exception in a namespace that is not open: nothing.
    assert_eq!(admit(&store, Namespaces::none()), (false, None));
    // Its expiry is exported with the index that holds it.
    assert_eq!(expiry_samples(&registry), [expiry_sample("vendor-root")]);

    // No API call per admission.
    let before = server.requests();
    for _ in 0..20 {
        assert!(admit(&store, &open).0);
    }
    assert_eq!(
        server.requests(),
        before,
        "an admission called the API server"
    );

    // Deleted: no longer honoured. Created again under another name: honoured again.
    server.delete(EXCEPTIONS, Some("team-a"), "vendor-root");
    eventually("the deleted exception forgotten", || {
        admit(&store, &open) == (false, None)
    })
    .await;
    server.apply(EXCEPTIONS, exception("vendor-root-2"));
    eventually("the new exception honoured", || {
        admit(&store, &open) == (true, Some("vendor-root-2".into()))
    })
    .await;
    // The deleted one's series is gone, the new one's is there.
    assert_eq!(expiry_samples(&registry), [expiry_sample("vendor-root-2")]);
    // One that the CRD would refuse (an empty selector) is never honoured, whatever the watch
    // delivers.
    server.delete(EXCEPTIONS, Some("team-a"), "vendor-root-2");
    let mut broad = exception("broad");
    broad["spec"]["selector"] = json!({});
    server.apply(EXCEPTIONS, broad);
    eventually("no exception left", || {
        admit(&store, &open) == (false, None)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(admit(&store, &open), (false, None));
    assert!(expiry_samples(&registry).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_crd_the_watch_is_ready_with_no_exception() {
    let server = FakeApiServer::start(&[CACHES, NAMESPACE_CACHES, NODE_GROUPS]).await;
    let watch = CacheWatch::spawn(
        server.client(),
        CacheIndex::new(),
        CacheMetrics::new(),
        config(),
    );
    let readiness = watch.readiness();
    eventually("ready without the exception CRD", || readiness.is_ready()).await;
    assert_eq!(admit(watch.store(), &open_team_a()), (false, None));
}
