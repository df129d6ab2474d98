//! `serve` end to end against a cluster: the real binary, a kubeconfig pointing at the fake API
//! server, and a verifying TLS client. Proves the wiring of the cluster-state watch into the
//! server: `/readyz` waits for the caches, PVCs and Nodes; a cache added in the cluster changes
//! what `/mutate` answers for a pod of that namespace; a deleted PVC makes the next pod a
//! `pvc-missing` miss within seconds; a node turning `NodeDownloaded` gets the next pod pinned to
//! it; a KServe-managed pod never gets `modelgate-model`; no admission makes an API request but
//! the one read of a claim the watch has not delivered yet; and the prep on claims.

mod common;
mod support;

use std::time::Duration;

use common::*;
use hyper::StatusCode;
use serde_json::{Value, json};
// modelgate's own CRD is installed with it (docs/exceptions.md): without it the watch would
// retry its list in the background, and count among the API requests.
use support::fake_apiserver::{
    CACHES, EXCEPTIONS, FakeApiServer, NAMESPACE_CACHES, NAMESPACES, NODE_GROUPS, NODES, PVCS,
};

fn ns_cache(ns: &str, name: &str, uri: &str, downloaded: &[&str]) -> Value {
    let status: serde_json::Map<String, Value> = ["gpu-1", "gpu-2"]
        .iter()
        .map(|n| {
            let s = if downloaded.contains(n) {
                "NodeDownloaded"
            } else {
                "NodeDownloading"
            };
            (n.to_string(), json!(s))
        })
        .collect();
    json!({
        "metadata": {"name": name, "namespace": ns},
        "spec": {"sourceModelUri": uri, "modelSize": "1Gi", "nodeGroups": ["workers"]},
        "status": {"nodeStatus": status}
    })
}

/// A pod as KServe's InferenceService controller makes it: its own label and KServe's
/// source-URI annotation.
fn kserve_pod_review(uid: &str, ns: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": ns, "operation": "CREATE", "userInfo": {"username": "u"},
            "object": {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"generateName": "llama-predictor-", "namespace": ns,
                             "labels": {"serving.kserve.io/inferenceservice": "llama"},
                             "annotations": {"internal.serving.kserve.io/storage-initializer-sourceuri": "hf://org/llama"}},
                "spec": {"containers": [{"name": "kserve-container", "image": "vllm"}]}}
        }
    }))
    .unwrap()
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

/// The pod of `review` with the answer's patch applied.
fn patched(review: &[u8], answer: &Answer) -> Value {
    use base64::Engine;
    let review: Value = serde_json::from_slice(review).unwrap();
    let mut object = review["request"]["object"].clone();
    let response = &answer.json()["response"];
    let b64 = response["patch"].as_str().expect("a patch");
    let patch: json_patch::Patch = serde_json::from_slice(
        &base64::engine::general_purpose::STANDARD
            .decode(b64)
            .unwrap(),
    )
    .unwrap();
    json_patch::patch(&mut object, &patch).unwrap();
    object
}

fn model_cache_annotation(review: &[u8], answer: &Answer) -> String {
    patched(review, answer)["metadata"]["annotations"]["modelgate.io/model-cache"]
        .as_str()
        .expect("the model-cache annotation is set")
        .to_string()
}

/// The hostnames the pod is pinned to (its first term's last requirement,
/// `kubernetes.io/hostname In`), if any.
fn pinned_nodes(pod: &Value) -> Option<Value> {
    let pin = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"][0]["matchExpressions"]
        .as_array()?
        .last()?
        .clone();
    (pin["key"] == "kubernetes.io/hostname").then(|| pin["values"].clone())
}

/// `serve` with a kubeconfig pointing at `api`, listening on free ports, JSON logs at `info`,
/// plus `args` and `env`.
async fn serve_against(
    api: &FakeApiServer,
    pki: &TestPki,
    args: &[&str],
    env: &[(&str, &str)],
) -> ServerProcess {
    let kubeconfig = pki.dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig);
    let mut all: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    all.extend(pki.tls_args());
    let mut cmd = serve_command_against(&kubeconfig, &all);
    cmd.envs(env.iter().copied());
    tokio::task::spawn_blocking(move || ServerProcess::spawn(cmd))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_waits_for_the_cluster_caches_and_resolves_against_them() {
    let api = FakeApiServer::start(&[CACHES, NAMESPACE_CACHES, NODE_GROUPS, EXCEPTIONS]).await;
    // The node group `workers`, its two Nodes, and the PVC KServe made in team-a.
    api.apply(
        NODE_GROUPS,
        json!({"metadata": {"name": "workers"}, "spec": {"persistentVolumeSpec": {
            "local": {"path": "/models"},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "node-type", "operator": "In", "values": ["gpu"]}]}]}}}}}),
    );
    for node in ["gpu-1", "gpu-2"] {
        api.apply(
            NODES,
            json!({"metadata": {"name": node, "labels": {"node-type": "gpu", "kubernetes.io/hostname": node}}, "spec": {}}),
        );
    }
    api.apply(
        PVCS,
        json!({"metadata": {"name": "mine-workers", "namespace": "team-a"},
               "spec": {"accessModes": ["ReadOnlyMany"]}, "status": {"phase": "Bound"}}),
    );
    // Namespace caches and Nodes cannot be listed yet: serve must not say ready.
    api.fail_lists(NAMESPACE_CACHES, Some(500));
    api.fail_lists(NODES, Some(403));
    let pki = TestPki::new();
    let server = serve_against(&api, &pki, &["--cache-sync-timeout=5m"], &[]).await;

    let (status, body) = server.probe_get("/readyz").await.unwrap();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(body.contains("model caches not synced"), "{body}");

    api.fail_lists(NAMESPACE_CACHES, None);
    // Still not ready: the Nodes have not listed (RBAC not yet granted, say).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (status, _) = server.probe_get("/readyz").await.unwrap();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    api.fail_lists(NODES, None);
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
    let review = pod_review("u1", "team-a");
    let answer = conn.post_json("/mutate", review.clone()).await.unwrap();
    assert_eq!(model_cache_annotation(&review, &answer), "miss");

    // Polls /mutate with a team-a pod until `done` holds for the patched pod; returns it and how
    // long it took.
    let mut n = 0;
    let mut until = async |conn: &mut Conn, ns: &str, done: &dyn Fn(&Value) -> bool| {
        let started = std::time::Instant::now();
        for _ in 0..200 {
            n += 1;
            let review = pod_review(&format!("w{n}"), ns);
            let answer = conn.post_json("/mutate", review.clone()).await.unwrap();
            let pod = patched(&review, &answer);
            if done(&pod) {
                return (pod, started.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("not reached within 10 s; logs:\n{}", server.logs());
    };
    let annotation = |pod: &Value, key: &str| pod["metadata"]["annotations"][key].clone();

    // A namespace cache appears in the cluster, downloaded on gpu-1: team-a resolves from it
    // and the pod is pinned to gpu-1.
    api.apply(
        NAMESPACE_CACHES,
        ns_cache("team-a", "mine", "hf://org/llama", &["gpu-1"]),
    );
    let (pod, _) = until(&mut conn, "team-a", &|p| {
        annotation(p, "modelgate.io/model-cache") == "namespace/team-a/mine"
    })
    .await;
    assert_eq!(pinned_nodes(&pod), Some(json!(["gpu-1"])));

    // gpu-2 finishes its download: the next pod may land on either.
    api.apply(
        NAMESPACE_CACHES,
        ns_cache("team-a", "mine", "hf://org/llama", &["gpu-1", "gpu-2"]),
    );
    until(&mut conn, "team-a", &|p| {
        pinned_nodes(p) == Some(json!(["gpu-1", "gpu-2"]))
    })
    .await;

    // A KServe-managed pod is KServe's to route: no modelgate-model, §3 still applies.
    let review = kserve_pod_review("k1", "team-a");
    let answer = conn.post_json("/mutate", review.clone()).await.unwrap();
    let pod = patched(&review, &answer);
    assert_eq!(
        annotation(&pod, "modelgate.io/model-cache-reason"),
        "kserve-managed"
    );
    assert!(pod["spec"].get("volumes").is_none(), "{pod}");
    assert_eq!(pod["spec"]["securityContext"]["runAsNonRoot"], true);

    // No admission calls the API server.
    let requests = api.requests();
    for i in 0..50 {
        let review = pod_review(&format!("b{i}"), "team-b");
        let answer = conn.post_json("/mutate", review.clone()).await.unwrap();
        assert_eq!(model_cache_annotation(&review, &answer), "miss");
    }
    assert_eq!(api.requests(), requests, "admissions made API requests");

    // The PVC is deleted: the next pods are pvc-missing misses, within seconds.
    api.delete(PVCS, Some("team-a"), "mine-workers");
    let (pod, took) = until(&mut conn, "team-a", &|p| {
        annotation(p, "modelgate.io/model-cache-reason") == "pvc-missing"
    })
    .await;
    assert!(took < Duration::from_secs(5), "{took:?}");
    assert_eq!(annotation(&pod, "modelgate.io/model-cache"), "miss");
    assert!(pod["spec"].get("volumes").is_none(), "{pod}");

    let (_, metrics) = server.probe_get("/metrics").await.unwrap();
    assert!(
        metrics.contains("modelgate_cache_synced{kind=\"LocalModelNamespaceCache\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("modelgate_cache_lookups_total{result=\"namespace\",reason=\"none\"}"),
        "{metrics}"
    );
    for reason in ["pvc-missing", "kserve-managed", "no-match"] {
        let series =
            format!("modelgate_cache_lookups_total{{result=\"miss\",reason=\"{reason}\"}} ");
        let line = metrics.lines().find(|l| l.starts_with(&series)).unwrap();
        assert!(!line.ends_with(" 0"), "{line}");
    }
    assert!(
        metrics.contains("modelgate_cache_synced{kind=\"Node\"} 1"),
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

/// The value of the series `name{watch="<watch>"}` in a scrape.
fn watch_gauge(scrape: &str, name: &str, watch: &str) -> f64 {
    let series = format!("{name}{{watch=\"{watch}\"}} ");
    scrape
        .lines()
        .find_map(|l| l.strip_prefix(&series))
        .unwrap_or_else(|| panic!("no series {series} in:\n{scrape}"))
        .trim()
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_is_not_ready_until_the_namespaces_are_listed() {
    let api = FakeApiServer::start(&[CACHES, NAMESPACE_CACHES, NODE_GROUPS, EXCEPTIONS]).await;
    api.apply(
        NAMESPACES,
        namespace("team-a", json!({"modelgate.io/mode": "off"})),
    );
    // RBAC on namespaces not granted yet: the caches list, the Namespaces do not.
    api.fail_lists(NAMESPACES, Some(403));
    let pki = TestPki::new();
    // Shorter than the wait below: the caches' timeout must not make it ready.
    let server = serve_against(&api, &pki, &["--cache-sync-timeout=1s"], &[]).await;

    // Every watch's series exist from the start.
    let (_, scrape) = server.probe_get("/metrics").await.unwrap();
    for watch in [
        "LocalModelCache",
        "LocalModelNamespaceCache",
        "LocalModelNodeGroup",
        "PersistentVolumeClaim",
        "Node",
        "Namespace",
    ] {
        watch_gauge(
            &scrape,
            "modelgate_watch_last_progress_timestamp_seconds",
            watch,
        );
        watch_gauge(
            &scrape,
            "modelgate_watch_last_failure_timestamp_seconds",
            watch,
        );
    }

    // The caches sync (and their timeout passes); the Namespaces still decide readiness.
    let mut body = String::new();
    for _ in 0..100 {
        let (status, b) = server.probe_get("/readyz").await.unwrap();
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{b}");
        body = b;
        if body.trim() == "not ready: namespaces not listed" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(body.trim(), "not ready: namespaces not listed");
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let (status, body) = server.probe_get("/readyz").await.unwrap();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body.trim(), "not ready: namespaces not listed");
    let (_, scrape) = server.probe_get("/metrics").await.unwrap();
    let failed = "modelgate_watch_last_failure_timestamp_seconds";
    let progressed = "modelgate_watch_last_progress_timestamp_seconds";
    assert!(watch_gauge(&scrape, failed, "Namespace") > 0.0, "{scrape}");
    assert_eq!(watch_gauge(&scrape, progressed, "Namespace"), 0.0);
    assert!(watch_gauge(&scrape, progressed, "LocalModelCache") > 0.0);
    assert_eq!(watch_gauge(&scrape, failed, "LocalModelCache"), 0.0);

    api.fail_lists(NAMESPACES, None);
    let mut ready = false;
    for _ in 0..200 {
        if let Ok((StatusCode::OK, _)) = server.probe_get("/readyz").await {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(ready, "ready once listed; logs:\n{}", server.logs());
    let (_, scrape) = server.probe_get("/metrics").await.unwrap();
    assert!(watch_gauge(&scrape, progressed, "Namespace") > 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_follows_namespace_mode_labels_without_a_restart() {
    let api = FakeApiServer::start(&[CACHES, NAMESPACE_CACHES, NODE_GROUPS, EXCEPTIONS]).await;
    api.apply(NAMESPACES, namespace("team-a", json!({})));
    api.apply(
        NAMESPACES,
        namespace("team-b", json!({"modelgate.io/mode": "audit"})),
    );
    let pki = TestPki::new();
    let server = serve_against(&api, &pki, &[], &[("MODELGATE_DEFAULT_MODE", "warn")]).await;
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

/// A pod of `team-a` whose model cache volume is the claim `claim`.
fn claim_pod_review(uid: &str, claim: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "team-a", "operation": "CREATE", "userInfo": {"username": "u"},
            "object": {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": format!("web-{uid}"), "namespace": "team-a"},
                "spec": {
                    "volumes": [{"name": "model-cache", "persistentVolumeClaim": {"claimName": claim}}],
                    "containers": [{"name": "c", "image": "vllm",
                                    "volumeMounts": [{"name": "model-cache", "mountPath": "/cache"}]}]}}
        }
    }))
    .unwrap()
}

fn claim(name: &str, spec: Value, annotations: Value, phase: &str) -> Value {
    json!({"metadata": {"name": name, "namespace": "team-a", "annotations": annotations},
           "spec": spec, "status": {"phase": phase}})
}

/// The prep on claims through `serve` (docs/policy.md, "Claims whose volume the tenant
/// picked"): the claim watch tells a claim the PV controller bound from one bound by name; a
/// claim the watch has not delivered yet (a StatefulSet creates it just before the pod) is read
/// once with a GET and gets the prep; one that does not exist gets none; each read is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_judges_the_claim_under_the_cache_and_reads_one_its_watch_has_not_delivered() {
    let api = FakeApiServer::start(&[CACHES, NAMESPACE_CACHES, NODE_GROUPS, EXCEPTIONS]).await;
    api.apply(
        PVCS,
        claim(
            "data-old",
            json!({"volumeName": "pvc-1234", "storageClassName": "fast"}),
            json!({"pv.kubernetes.io/bound-by-controller": "yes"}),
            "Bound",
        ),
    );
    api.apply(
        PVCS,
        claim(
            "static",
            json!({"volumeName": "nfs-export-root", "storageClassName": ""}),
            json!({}),
            "Bound",
        ),
    );
    let pki = TestPki::new();
    let server = serve_against(&api, &pki, &[], &[]).await;
    let mut ready = false;
    for _ in 0..200 {
        if let Ok((StatusCode::OK, _)) = server.probe_get("/readyz").await {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(ready, "not ready; logs:\n{}", server.logs());
    let config = client_config(pki.ca.cert_pem(), Proto::H2, None);
    let mut conn = connect(server.webhook, config, Proto::H2).await.unwrap();
    let prep = |pod: &Value| {
        pod["spec"]["initContainers"]
            .as_array()
            .is_some_and(|a| a.iter().any(|c| c["name"] == "model-cache-prep"))
    };
    let warnings = |answer: &Answer| answer.json()["response"]["warnings"].to_string();

    let review = claim_pod_review("1", "data-old");
    let answer = conn.post_json("/mutate", review.clone()).await.unwrap();
    assert!(prep(&patched(&review, &answer)), "{}", answer.json());

    let review = claim_pod_review("2", "static");
    let answer = conn.post_json("/mutate", review.clone()).await.unwrap();
    assert!(!prep(&patched(&review, &answer)), "{}", answer.json());
    assert!(
        warnings(&answer).contains("claim static names its volume"),
        "{}",
        answer.json()
    );
    assert_eq!(
        api.counts(PVCS).gets,
        0,
        "claims the watch has are not read"
    );

    // The StatefulSet order: the claim exists, but the watch has not delivered it.
    api.set_partitioned(true);
    api.apply(
        PVCS,
        claim(
            "data-web-0",
            json!({"storageClassName": "fast"}),
            json!({}),
            "Pending",
        ),
    );
    let review = claim_pod_review("3", "data-web-0");
    let answer = conn.post_json("/mutate", review.clone()).await.unwrap();
    assert!(prep(&patched(&review, &answer)), "{}", answer.json());
    assert_eq!(api.counts(PVCS).gets, 1);

    let review = claim_pod_review("4", "never-made");
    let answer = conn.post_json("/mutate", review.clone()).await.unwrap();
    assert!(!prep(&patched(&review, &answer)), "{}", answer.json());
    assert!(
        warnings(&answer).contains("claim never-made does not exist"),
        "{}",
        answer.json()
    );
    assert_eq!(api.counts(PVCS).gets, 2);

    let (_, metrics) = server.probe_get("/metrics").await.unwrap();
    for (result, n) in [("found", 1), ("not_found", 1), ("timeout", 0), ("busy", 0)] {
        let series = format!("modelgate_claim_reads_total{{result=\"{result}\"}} {n}");
        assert!(metrics.lines().any(|l| l == series), "{series}\n{metrics}");
    }
}

fn exception(ns: &str, name: &str, created: &str, expires: &str) -> Value {
    json!({
        "metadata": {"name": name, "namespace": ns, "creationTimestamp": created},
        "spec": {"reason": "vendor image runs as root", "expires": expires,
                 "rules": ["non-root"], "selector": {"matchLabels": {"app": name}},
                 "images": ["registry.example/vendor@sha256:0123"]},
    })
}

fn rfc3339(at: std::time::SystemTime) -> String {
    let secs = at.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    k8s_openapi::jiff::Timestamp::from_second(secs as i64)
        .unwrap()
        .to_string()
}

/// `status` of the exception `ns/name` once it says `in_force`, within 15 s.
async fn status_once(api: &FakeApiServer, ns: &str, name: &str, in_force: bool) -> Value {
    let mut last = Value::Null;
    for _ in 0..300 {
        last = api
            .object(EXCEPTIONS, ns, name)
            .map_or(Value::Null, |o| o["status"].clone());
        if last["inForce"] == json!(in_force) {
            return last;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{ns}/{name}: status never had inForce {in_force}; last {last}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_writes_whether_each_exception_is_in_force_and_why_not() {
    let api = FakeApiServer::start(&[CACHES, NAMESPACE_CACHES, NODE_GROUPS, EXCEPTIONS]).await;
    let open = json!({"modelgate.io/inject": "enabled", "modelgate.io/exceptions": "allowed"});
    api.apply(NAMESPACES, namespace("team-a", open.clone()));
    api.apply(
        NAMESPACES,
        namespace("team-b", json!({"modelgate.io/inject": "enabled"})),
    );
    let now = std::time::SystemTime::now();
    let created = rfc3339(now - Duration::from_secs(60));
    let later = rfc3339(now + Duration::from_secs(30 * 86_400));
    // Expires in 8 s: in force, then expired without any change to the object.
    let soon = rfc3339(now + Duration::from_secs(8));
    api.apply(EXCEPTIONS, exception("team-a", "vendor", &created, &later));
    api.apply(EXCEPTIONS, exception("team-a", "short", &created, &soon));
    api.apply(EXCEPTIONS, exception("team-b", "vendor", &created, &later));
    let pki = TestPki::new();
    let server = serve_against(&api, &pki, &["--exception-status-interval=200ms"], &[]).await;

    let in_force = status_once(&api, "team-a", "vendor", true).await;
    assert_eq!(in_force["reason"], json!(format!("in force until {later}")));
    let closed = status_once(&api, "team-b", "vendor", false).await;
    assert!(
        closed["reason"]
            .as_str()
            .unwrap()
            .contains("namespace team-b is not open for exceptions"),
        "{closed}"
    );
    status_once(&api, "team-a", "short", true).await;
    let short = status_once(&api, "team-a", "short", false).await;
    assert_eq!(short["reason"], json!(format!("expired at {soon}")));

    // Opening the namespace puts its exception in force, with no change to the exception.
    api.apply(NAMESPACES, namespace("team-b", open));
    status_once(&api, "team-b", "vendor", true).await;

    // Only changes are written: three first statuses and two changes, however many intervals.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let writes = api.counts(EXCEPTIONS).status_patches;
    assert_eq!(writes, 5, "status patches: {writes}");
    let (_, scrape) = server.probe_get("/metrics").await.unwrap();
    assert!(
        scrape.contains("modelgate_exception_status_writes_total{result=\"written\"} 5"),
        "{scrape}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exception_status_that_cannot_be_written_is_logged_once_and_admissions_go_on() {
    let api = FakeApiServer::start(&[CACHES, NAMESPACE_CACHES, NODE_GROUPS, EXCEPTIONS]).await;
    api.apply(
        NAMESPACES,
        namespace(
            "team-a",
            json!({"modelgate.io/inject": "enabled", "modelgate.io/exceptions": "allowed"}),
        ),
    );
    let now = std::time::SystemTime::now();
    let created = rfc3339(now - Duration::from_secs(60));
    let later = rfc3339(now + Duration::from_secs(30 * 86_400));
    api.apply(EXCEPTIONS, exception("team-a", "vendor", &created, &later));
    api.forbid_status_patches(true);
    let pki = TestPki::new();
    let server = serve_against(&api, &pki, &["--exception-status-interval=100ms"], &[]).await;
    let mut tries = 0;
    for _ in 0..100 {
        tries = api.counts(EXCEPTIONS).status_patches;
        if tries >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(tries >= 3, "tried again every interval: {tries}");
    let config = client_config(pki.ca.cert_pem(), Proto::H2, None);
    let mut conn = connect(server.webhook, config, Proto::H2).await.unwrap();
    let answer = conn
        .post_json("/mutate", pod_review("u-1", "team-a"))
        .await
        .unwrap();
    assert_eq!(answer.json()["response"]["allowed"], json!(true));
    let logs = server.logs();
    let logged = logs
        .lines()
        .filter(|l| l.contains("cannot write the ModelgateException's status"))
        .count();
    assert_eq!(logged, 1, "{logs}");
    assert!(logs.contains("forbidden"), "{logs}");
    api.forbid_status_patches(false);
    status_once(&api, "team-a", "vendor", true).await;
}
