//! `serve` end to end against a cluster: the real binary, a kubeconfig pointing at the fake API
//! server, and a verifying TLS client. Proves the wiring of the cache watch into the server:
//! `/readyz` waits for the caches, and a cache added in the cluster changes what `/mutate`
//! answers for a pod of that namespace, with no API request on the admission path.

mod common;
mod support;

use std::process::Command;
use std::time::Duration;

use common::*;
use hyper::StatusCode;
use serde_json::{Value, json};
use support::fake_apiserver::{CACHES, FakeApiServer, NAMESPACE_CACHES, NAMESPACES, NODE_GROUPS};

fn ns_cache(ns: &str, name: &str, uri: &str) -> Value {
    json!({
        "metadata": {"name": name, "namespace": ns},
        "spec": {"sourceModelUri": uri, "modelSize": "1Gi", "nodeGroups": ["workers"]}
    })
}

fn pod_review(uid: &str, ns: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": ns, "operation": "CREATE", "userInfo": {"username": "u"},
            "object": {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"generateName": "llm-", "namespace": ns,
                             "annotations": {"modelgate.io/model-uri": "hf://org/llama"}},
                "spec": {"containers": [{"name": "c", "image": "vllm"}]}}
        }
    }))
    .unwrap()
}

fn model_cache_annotation(answer: &Answer) -> String {
    use base64::Engine;
    let response = &answer.json()["response"];
    let b64 = response["patch"].as_str().expect("a patch");
    let patch: Vec<Value> = serde_json::from_slice(
        &base64::engine::general_purpose::STANDARD
            .decode(b64)
            .unwrap(),
    )
    .unwrap();
    patch
        .iter()
        .find(|op| op["path"] == "/metadata/annotations/modelgate.io~1model-cache")
        .map(|op| op["value"].as_str().unwrap().to_string())
        .expect("the model-cache annotation is set")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_waits_for_the_cluster_caches_and_resolves_against_them() {
    let api = FakeApiServer::start(&[CACHES, NAMESPACE_CACHES, NODE_GROUPS]).await;
    // Namespace caches cannot be listed yet: serve must not say ready.
    api.fail_lists(NAMESPACE_CACHES, Some(500));
    let pki = TestPki::new();
    let kubeconfig = pki.dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig);
    let mut cmd = Command::new(bin());
    cmd.arg("serve")
        .args([
            "--listen=127.0.0.1:0",
            "--probe-listen=127.0.0.1:0",
            "--log-format=json",
        ])
        .arg("--cache-sync-timeout=5m")
        .args(pki.tls_args())
        .env("KUBECONFIG", &kubeconfig)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env("RUST_LOG", "info")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let server = tokio::task::spawn_blocking(move || ServerProcess::spawn(cmd))
        .await
        .unwrap();

    let (status, body) = server.probe_get("/readyz").await.unwrap();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body.trim(), "not ready: model caches not synced");

    api.fail_lists(NAMESPACE_CACHES, None);
    let ready = async {
        for _ in 0..200 {
            if let Ok((StatusCode::OK, _)) = server.probe_get("/readyz").await {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    };
    assert!(
        ready.await,
        "ready once every kind has listed; logs:\n{}",
        server.logs()
    );

    let config = client_config(pki.ca.cert_pem(), Proto::H2, None);
    let mut conn = connect(server.webhook, config, Proto::H2).await.unwrap();
    let answer = conn
        .post_json("/mutate", pod_review("u1", "team-a"))
        .await
        .unwrap();
    assert_eq!(model_cache_annotation(&answer), "miss");

    // A namespace cache appears in the cluster: team-a resolves from it, team-b does not.
    api.apply(
        NAMESPACE_CACHES,
        ns_cache("team-a", "mine", "hf://org/llama"),
    );
    let mut resolved = String::new();
    for i in 0..200 {
        let answer = conn
            .post_json("/mutate", pod_review(&format!("w{i}"), "team-a"))
            .await
            .unwrap();
        resolved = model_cache_annotation(&answer);
        if resolved != "miss" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(resolved, "namespace/team-a/mine");
    let requests = api.requests();
    for i in 0..50 {
        let answer = conn
            .post_json("/mutate", pod_review(&format!("b{i}"), "team-b"))
            .await
            .unwrap();
        assert_eq!(model_cache_annotation(&answer), "miss");
    }
    assert_eq!(api.requests(), requests, "admissions made API requests");

    let (_, metrics) = server.probe_get("/metrics").await.unwrap();
    assert!(
        metrics.contains("modelgate_cache_synced{kind=\"LocalModelNamespaceCache\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("modelgate_cache_lookups_total{result=\"namespace\"}"),
        "{metrics}"
    );
}

fn namespace(name: &str, labels: Value) -> Value {
    json!({"metadata": {"name": name, "labels": labels}})
}

/// What `/mutate` answered: the mode the decision was made in shows in its shape.
fn shape(answer: &Answer) -> &'static str {
    let response = &answer.json()["response"];
    let warnings = response["warnings"].as_array().cloned().unwrap_or_default();
    match (response.get("patch").is_some(), warnings.first()) {
        (true, _) => "patched",
        (false, Some(w)) if w.as_str().unwrap_or("").starts_with("would ") => "warned",
        (false, _) if response.get("auditAnnotations").is_some() => "audited",
        (false, _) => "untouched",
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_follows_namespace_mode_labels_without_a_restart() {
    let api = FakeApiServer::start(&[CACHES, NAMESPACE_CACHES, NODE_GROUPS]).await;
    api.apply(NAMESPACES, namespace("team-a", json!({})));
    api.apply(
        NAMESPACES,
        namespace("team-b", json!({"modelgate.io/mode": "audit"})),
    );
    let pki = TestPki::new();
    let kubeconfig = pki.dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig);
    let mut cmd = Command::new(bin());
    cmd.arg("serve")
        .args([
            "--listen=127.0.0.1:0",
            "--probe-listen=127.0.0.1:0",
            "--log-format=json",
        ])
        .args(pki.tls_args())
        .env("KUBECONFIG", &kubeconfig)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env("MODELGATE_DEFAULT_MODE", "warn")
        .env("RUST_LOG", "info")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let server = tokio::task::spawn_blocking(move || ServerProcess::spawn(cmd))
        .await
        .unwrap();
    let config = client_config(pki.ca.cert_pem(), Proto::H2, None);
    let mut conn = connect(server.webhook, config, Proto::H2).await.unwrap();
    let mut n = 0;
    // Polls `/mutate` for a pod of `ns` until its answer has `want`'s shape; the time it took.
    let mut wait_for = async |ns: &str, want: &str| -> Duration {
        let started = std::time::Instant::now();
        let mut last = "";
        while started.elapsed() < Duration::from_secs(30) {
            n += 1;
            let answer = conn
                .post_json("/mutate", pod_review(&format!("u{n}"), ns))
                .await
                .unwrap();
            last = shape(&answer);
            if last == want {
                return started.elapsed();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!(
            "{ns}: still {last}, not {want}, after 30 s; logs:\n{}",
            server.logs()
        );
    };
    // Listed: team-a has no label (--default-mode warn), team-b is labelled audit.
    wait_for("team-a", "warned").await;
    wait_for("team-b", "audited").await;

    // The break-glass of docs/rollout.md, and back: each label change is seen within moments.
    let mut seen = Vec::new();
    for (labels, want) in [
        (json!({"modelgate.io/mode": "enforce"}), "patched"),
        (json!({"modelgate.io/mode": "off"}), "untouched"),
        (json!({"modelgate.io/mode": "audit"}), "audited"),
        (json!({}), "warned"),
    ] {
        api.apply(NAMESPACES, namespace("team-a", labels));
        seen.push(wait_for("team-a", want).await);
    }
    eprintln!("label changes seen after {seen:?}");
    // team-b was never touched by those events.
    wait_for("team-b", "audited").await;

    // A namespace deleted and labels gone: back to --default-mode.
    api.delete(NAMESPACES, None, "team-b");
    wait_for("team-b", "warned").await;

    let counts = api.counts(NAMESPACES);
    assert!(counts.lists >= 1 && counts.watches >= 1, "{counts:?}");
    assert_eq!(
        counts.metadata_only,
        counts.lists + counts.watches,
        "Namespaces are only ever requested as metadata"
    );
    let (_, metrics) = server.probe_get("/metrics").await.unwrap();
    for line in [
        r#"modelgate_policy_results_total{webhook="mutate",mode="enforce",result="patched"}"#,
        r#"modelgate_policy_results_total{webhook="mutate",mode="off",result="unchanged"}"#,
        r#"modelgate_policy_results_total{webhook="mutate",mode="warn",result="would_patch"}"#,
        r#"modelgate_policy_results_total{webhook="mutate",mode="audit",result="would_patch"}"#,
    ] {
        assert!(metrics.contains(line), "{line} missing:\n{metrics}");
    }
}
