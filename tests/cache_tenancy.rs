//! What one namespace's users can do to the others through the model cache state: the attacks
//! of the review (docs/security.md, "Model caches: what a namespace can do to the others"), made
//! as a tenant makes them — `LocalModelNamespaceCache` objects and pods of their own namespace —
//! through the watch: the real `serve` binary, a kubeconfig pointing at the fake API server
//! (tests/support/fake_apiserver.rs), a verifying TLS client. Each test measures what the
//! review measured: serve's peak RSS (`VmHWM`) and another namespace's admissions during the
//! attack.
//!
//! The tests here are the fast shapes (seconds each, on the debug build the test command
//! makes). `tenant_attacks_benchmark` (ignored) runs them at the review's sizes on a release
//! build, with figures in docs/benchmarks.md ("Tenants and the cache index"):
//!
//! ```sh
//! cargo test --release --test cache_tenancy -- --ignored --nocapture
//! MODELGATE_BENCH_BIN=/path/to/other/modelgate cargo test --release --test cache_tenancy -- --ignored --nocapture
//! ```

mod common;
mod support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::*;
use hyper::StatusCode;
use modelgate::cache::{MAX_MODEL_URI_LEN, MAX_NAME_LEN, MAX_NODE_GROUPS};
use serde_json::{Value, json};
use support::fake_apiserver::{
    CACHES, FakeApiServer, NAMESPACE_CACHES, NAMESPACES, NODE_GROUPS, NODES, PVCS,
};

// ---------------------------------------------------------------------------------------------
// The cluster and the server

/// An RFC 3339 time `seconds` after a fixed day: the caches' creation times, which decide
/// which are the newest past a cap.
fn at(seconds: u64) -> String {
    let t = k8s_openapi::jiff::Timestamp::from_second(1_790_000_000 + seconds as i64).unwrap();
    t.to_string()
}

fn ns_cache(ns: &str, name: &str, uri: &str, created: u64) -> Value {
    json!({
        "metadata": {"name": name, "namespace": ns, "creationTimestamp": at(created)},
        "spec": {"sourceModelUri": uri, "modelSize": "1Gi", "nodeGroups": ["gpu"]},
        "status": {"nodeStatus": {"gpu-1": "NodeDownloaded"}}
    })
}

fn pvc(ns: &str, name: &str) -> Value {
    json!({"metadata": {"name": name, "namespace": ns},
           "spec": {"accessModes": ["ReadWriteOnce"]}, "status": {"phase": "Bound"}})
}

/// A fake API server with the node group `gpu` (Nodes labelled `node-type: gpu`), its Node
/// gpu-1, and team-good's cache `good` of `hf://org/good` (downloaded on gpu-1) with its PVC:
/// a team-good pod asking for that model is a hit.
async fn cluster() -> FakeApiServer {
    let api = FakeApiServer::start(&[CACHES, NAMESPACE_CACHES, NODE_GROUPS]).await;
    api.apply(
        NODE_GROUPS,
        json!({"metadata": {"name": "gpu"}, "spec": {"persistentVolumeSpec": {
            "local": {"path": "/models"},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "node-type", "operator": "In", "values": ["gpu"]}]}]}}}}}),
    );
    api.apply(
        NODES,
        json!({"metadata": {"name": "gpu-1", "labels": {"node-type": "gpu", "kubernetes.io/hostname": "gpu-1"}}, "spec": {}}),
    );
    api.apply(
        NAMESPACE_CACHES,
        ns_cache("team-good", "good", "hf://org/good", 0),
    );
    api.apply(PVCS, pvc("team-good", "good-gpu"));
    for ns in ["team-good", "team-evil", "team-evil-2"] {
        api.apply(NAMESPACES, json!({"metadata": {"name": ns}}));
    }
    api
}

/// The binary measured: this build's, or `MODELGATE_BENCH_BIN` (another build, to compare).
fn binary() -> String {
    std::env::var("MODELGATE_BENCH_BIN").unwrap_or_else(|_| bin().to_string())
}

/// `serve` against `api` (as tests/serve_cluster.rs starts it), with `env` set, ready.
async fn serve(api: &FakeApiServer, pki: &TestPki, env: &[(&str, &str)]) -> ServerProcess {
    let kubeconfig = pki.dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig);
    let mut cmd = Command::new(binary());
    cmd.arg("serve")
        .args([
            "--listen=127.0.0.1:0",
            "--probe-listen=127.0.0.1:0",
            "--log-format=json",
            "--cache-sync-timeout=5m",
        ])
        .args(pki.tls_args())
        .env("RUST_LOG", "info")
        .env("KUBECONFIG", &kubeconfig)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let server = tokio::task::spawn_blocking(move || ServerProcess::spawn(cmd))
        .await
        .unwrap();
    wait_ready(&server, Duration::from_secs(120)).await;
    server
}

async fn wait_ready(server: &ServerProcess, limit: Duration) -> Duration {
    let started = Instant::now();
    while started.elapsed() < limit {
        if let Ok((StatusCode::OK, _)) = server.probe_get("/readyz").await {
            return started.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("not ready within {limit:?}; logs:\n{}", server.logs());
}

fn pid(server: &ServerProcess) -> u32 {
    server.child.id()
}

/// Resets the process's peak RSS (`VmHWM`) to its current RSS, to measure the peak of what
/// follows.
fn reset_peak(pid: u32) {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").unwrap();
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// The value of a series (the whole line up to the value) in a scrape, 0 when absent.
async fn metric(server: &ServerProcess, series: &str) -> f64 {
    let (_, scrape) = server.probe_get("/metrics").await.unwrap();
    scrape
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map_or(0.0, |v| v.trim().parse().unwrap())
}

fn skipped(reason: &str) -> String {
    format!(
        "modelgate_cache_skipped_total{{kind=\"LocalModelNamespaceCache\",reason=\"{reason}\"}}"
    )
}

// ---------------------------------------------------------------------------------------------
// Admissions

static UID: AtomicUsize = AtomicUsize::new(0);

/// A pod of `ns` asking for `model_uri`, with `selector` as its nodeSelector.
fn pod_review(ns: &str, model_uri: &str, selector: &[(String, String)]) -> Vec<u8> {
    let uid = UID.fetch_add(1, Ordering::Relaxed);
    let selector: serde_json::Map<String, Value> = selector
        .iter()
        .map(|(k, v)| (k.clone(), json!(v)))
        .collect();
    let mut spec = json!({"containers": [{"name": "c", "image": "vllm"}]});
    if !selector.is_empty() {
        spec["nodeSelector"] = Value::Object(selector);
    }
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": format!("u{uid}"),
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": ns, "operation": "CREATE", "userInfo": {"username": "u"},
            "object": {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"generateName": "llm-", "namespace": ns,
                             "annotations": {"modelgate.io/model-uri": model_uri}},
                "spec": spec}
        }
    }))
    .unwrap()
}

/// `pairs` nodeSelector pairs that gpu-1 does not satisfy (labels it does not have).
fn unsatisfiable(pairs: usize) -> Vec<(String, String)> {
    (0..pairs)
        .map(|i| (format!("example.com/label-{i:02}"), "x".repeat(40)))
        .collect()
}

/// How `/mutate` resolved the pod: `modelgate.io/model-cache`, the reason, the warnings.
#[derive(Debug)]
struct Resolution {
    cache: String,
    reason: String,
    warnings: Vec<String>,
}

fn resolution(review: &[u8], status: StatusCode, body: &[u8]) -> Resolution {
    use base64::Engine;
    assert_eq!(status, StatusCode::OK);
    let answer: Value = serde_json::from_slice(body).unwrap();
    let response = &answer["response"];
    let review: Value = serde_json::from_slice(review).unwrap();
    let mut pod = review["request"]["object"].clone();
    let b64 = response["patch"].as_str().expect("a patch");
    let patch: json_patch::Patch = serde_json::from_slice(
        &base64::engine::general_purpose::STANDARD
            .decode(b64)
            .unwrap(),
    )
    .unwrap();
    json_patch::patch(&mut pod, &patch).unwrap();
    let annotation = |k: &str| {
        pod["metadata"]["annotations"][k]
            .as_str()
            .unwrap_or("")
            .to_string()
    };
    Resolution {
        cache: annotation("modelgate.io/model-cache"),
        reason: annotation("modelgate.io/model-cache-reason"),
        warnings: response["warnings"]
            .as_array()
            .map(|w| w.iter().map(|s| s.as_str().unwrap().to_string()).collect())
            .unwrap_or_default(),
    }
}

/// An HTTP/2 connection over TLS, as the API server keeps one, with `TCP_NODELAY` as the API
/// server's Go client sets it (without it, each request's second frame waits for a delayed
/// acknowledgement: 40 ms per admission that would measure the client, not `serve`).
struct Conn {
    sender: hyper::client::conn::http2::SendRequest<Body>,
    authority: String,
}

async fn connection(server: &ServerProcess, pki: &TestPki) -> Conn {
    use hyper_util::rt::{TokioExecutor, TokioIo};
    let config = client_config(pki.ca.cert_pem(), Proto::H2, None);
    let tcp = tokio::net::TcpStream::connect(server.webhook)
        .await
        .unwrap();
    tcp.set_nodelay(true).unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let tls = tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await
        .unwrap();
    let (sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(conn);
    Conn {
        sender,
        authority: format!("localhost:{}", server.webhook.port()),
    }
}

impl Conn {
    async fn post(&mut self, path: &str, body: Vec<u8>) -> (StatusCode, Vec<u8>) {
        use http_body_util::BodyExt;
        let req = hyper::Request::post(format!("https://{}{path}", self.authority))
            .header("content-type", "application/json")
            .body(full(body))
            .unwrap();
        self.sender.ready().await.unwrap();
        let resp = self.sender.send_request(req).await.unwrap();
        let status = resp.status();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        (status, body.to_vec())
    }
}

async fn resolve(
    conn: &mut Conn,
    ns: &str,
    uri: &str,
    selector: &[(String, String)],
) -> Resolution {
    let review = pod_review(ns, uri, selector);
    let (status, body) = conn.post("/mutate", review.clone()).await;
    resolution(&review, status, &body)
}

/// Polls `/mutate` with a pod of `ns` until `done` holds for its resolution; how long it took.
async fn until(
    conn: &mut Conn,
    ns: &str,
    uri: &str,
    limit: Duration,
    done: impl Fn(&Resolution) -> bool,
) -> Duration {
    let started = Instant::now();
    loop {
        let r = resolve(conn, ns, uri, &[]).await;
        if done(&r) {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < limit,
            "{ns} {uri}: still {r:?} after {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Latencies of one client's admissions, sorted.
struct Latencies(Vec<Duration>);

impl Latencies {
    fn quantile(&self, q: f64) -> Duration {
        let i = ((self.0.len() as f64 - 1.0) * q).round() as usize;
        self.0[i]
    }

    fn describe(&self, over: Duration) -> String {
        format!(
            "{} admissions ({:.0}/s), p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
            self.0.len(),
            self.0.len() as f64 / over.as_secs_f64(),
            self.quantile(0.5).as_secs_f64() * 1e3,
            self.quantile(0.99).as_secs_f64() * 1e3,
            self.0.last().unwrap().as_secs_f64() * 1e3
        )
    }
}

/// For `duration`: `attackers` clients each sending team-evil pods of `evil_selector` in a
/// loop, and one team-good client sending pods that must stay hits. Returns the attackers'
/// and team-good's latencies; checks every team-good answer.
async fn under_attack(
    server: &ServerProcess,
    pki: &TestPki,
    attackers: usize,
    evil_selector: Vec<(String, String)>,
    duration: Duration,
) -> (Latencies, Latencies) {
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for _ in 0..attackers {
        let mut conn = connection(server, pki).await;
        let (stop, selector) = (stop.clone(), evil_selector.clone());
        tasks.push(tokio::spawn(async move {
            let mut took = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let started = Instant::now();
                // Without a selector: a pod that matches no cache, what any pod costs.
                let uri = if selector.is_empty() {
                    "hf://org/none"
                } else {
                    "hf://org/evil"
                };
                let r = resolve(&mut conn, "team-evil", uri, &selector).await;
                took.push(started.elapsed());
                assert_eq!(r.cache, "miss", "{r:?}");
            }
            took
        }));
    }
    let mut good = connection(server, pki).await;
    let mut good_took = Vec::new();
    let started = Instant::now();
    while started.elapsed() < duration {
        let t = Instant::now();
        let r = resolve(&mut good, "team-good", "hf://org/good", &[]).await;
        good_took.push(t.elapsed());
        assert_eq!(r.cache, "namespace/team-good/good", "{r:?}");
    }
    stop.store(true, Ordering::Relaxed);
    let mut evil_took = Vec::new();
    for t in tasks {
        evil_took.extend(t.await.unwrap());
    }
    evil_took.sort();
    good_took.sort();
    (Latencies(evil_took), Latencies(good_took))
}

// ---------------------------------------------------------------------------------------------
// The CRDs

fn crd_spec(file: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("manifests/crds")
        .join(file);
    let text = std::fs::read_to_string(&path).unwrap();
    let chart = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("charts/modelgate/files/crds")
        .join(file);
    assert_eq!(
        std::fs::read_to_string(chart).unwrap(),
        text,
        "{file}: the chart's copy differs"
    );
    let crd: Value = serde_saphyr::from_str(&text).unwrap();
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"].clone()
}

#[test]
fn the_crds_have_kserve_s_shape_and_modelgate_s_bounds_as_schema_limits() {
    for (file, namespaced) in [
        ("localmodelnamespacecaches.serving.kserve.io.yaml", true),
        ("localmodelcaches.serving.kserve.io.yaml", false),
    ] {
        let spec = crd_spec(file);
        let p = &spec["properties"];
        // The bounds the conversion applies are the API server's limits too.
        assert_eq!(
            p["sourceModelUri"]["maxLength"],
            json!(MAX_MODEL_URI_LEN),
            "{file}"
        );
        assert_eq!(
            p["nodeGroups"]["maxItems"],
            json!(MAX_NODE_GROUPS),
            "{file}"
        );
        assert_eq!(
            p["nodeGroups"]["items"]["maxLength"],
            json!(MAX_NAME_LEN),
            "{file}"
        );
        let required: Vec<&str> = spec["required"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r.as_str().unwrap())
            .collect();
        if namespaced {
            // KServe's shape: pvcRef, and nodeGroups optional (exactly one of the two).
            assert_eq!(required, ["sourceModelUri", "modelSize"]);
            assert_eq!(p["pvcRef"]["maxLength"], json!(MAX_NAME_LEN));
            assert_eq!(
                spec["oneOf"],
                json!([{"required": ["nodeGroups"]}, {"required": ["pvcRef"]}])
            );
        } else {
            // KServe's cluster kind requires nodeGroups and has no pvcRef.
            assert_eq!(required, ["sourceModelUri", "modelSize", "nodeGroups"]);
            assert!(p.get("pvcRef").is_none());
        }
    }
    // KServe's shared-PVC sample uses only fields the namespace kind declares.
    let spec = crd_spec("localmodelnamespacecaches.serving.kserve.io.yaml");
    let sample = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/kserve/shared-pvc-status.yaml"),
    )
    .unwrap();
    let docs = modelgate::documents::read_documents("shared-pvc-status.yaml", &sample).unwrap();
    let cache = docs
        .iter()
        .find(|d| d.value["kind"] == "LocalModelNamespaceCache")
        .expect("the sample's namespace cache");
    for field in cache.value["spec"].as_object().unwrap().keys() {
        assert!(spec["properties"].get(field).is_some(), "spec.{field}");
    }
    assert!(cache.value["spec"].get("pvcRef").is_some());
}

// ---------------------------------------------------------------------------------------------
// The attacks, fast

/// Finding 1: `nodeGroups: ["gpu"] × 150 000` and pods whose nodeSelector no gpu node
/// satisfies. Each admission built one reason per listed group with the whole selector (40
/// pairs: 3.6 s and 1.5 GB per admission in a release build; 4 such clients took another
/// namespace from ~4 000 to 11 admissions a second). Now the groups are deduplicated and
/// capped when the object is converted, and the warning is built within its bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_listing_one_group_150_000_times_costs_nobody_anything() {
    let api = cluster().await;
    let groups = vec!["gpu"; 150_000];
    let mut evil = ns_cache("team-evil", "evil", "hf://org/evil", 1);
    evil["spec"]["nodeGroups"] = json!(groups);
    api.apply(NAMESPACE_CACHES, evil);
    api.apply(PVCS, pvc("team-evil", "evil-gpu"));
    let pki = TestPki::new();
    let server = serve(&api, &pki, &[]).await;
    let pid = pid(&server);
    let mut conn = connection(&server, &pki).await;
    let selector = unsatisfiable(40);
    let r = resolve(&mut conn, "team-evil", "hf://org/evil", &selector).await;
    assert_eq!(r.reason, "node-group-mismatch", "{r:?}");
    assert!(
        r.warnings.iter().all(|w| w.len() <= 600),
        "{:?}",
        r.warnings.iter().map(String::len).collect::<Vec<_>>()
    );
    assert!(metric(&server, &skipped("node-groups-trimmed")).await >= 1.0);
    let over = Duration::from_secs(2);
    let (_, alone) = under_attack(&server, &pki, 0, vec![], over).await;
    // The same load of pods that do not ask for a model, for what any pod costs.
    let (plain, _) = under_attack(&server, &pki, 4, vec![], over).await;
    let warm = status_kib(pid, "VmRSS:");
    reset_peak(pid);
    let (evil, good) = under_attack(&server, &pki, 4, selector, over).await;
    let peak = status_kib(pid, "VmHWM:");
    eprintln!(
        "team-good alone: {}\n4 clients of plain team-evil pods: {}\nattackers: {}\n\
         team-good: {}\nRSS {:.1} MiB warm, peak {:.1} MiB",
        alone.describe(over),
        plain.describe(over),
        evil.describe(over),
        good.describe(over),
        mib(warm),
        mib(peak)
    );
    // The review's figures, on a release build: 3.6 s and 1.5 GB per attacking admission
    // (60 ms with one pair). Here a debug build, with the other tests of this file running
    // beside it: an attacking pod costs what any pod costs (milliseconds), and team-good's
    // admissions go on. The bounds are loose for a loaded machine, and far below the
    // attack's seconds.
    assert!(
        peak.saturating_sub(warm) < 32 * 1024,
        "peak {peak} KiB, warm {warm} KiB"
    );
    assert!(
        evil.quantile(0.5) < Duration::from_millis(100),
        "{}",
        evil.describe(over)
    );
    assert!(
        good.quantile(0.5) < Duration::from_millis(100)
            && *good.0.last().unwrap() < Duration::from_secs(1),
        "{}",
        good.describe(over)
    );
}

/// Finding 2: a `sourceModelUri` longer than a looked-up model URI can be was stored (twice):
/// 100 of 1 MB held 250 MB. Now such an object is rejected when converted, counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caches_whose_uri_can_never_match_are_never_stored() {
    // At the start (the list: the review's crash loop) and then as they come (the watch).
    const LISTED: usize = 40;
    const WATCHED: usize = 40;
    let big = |i: usize| {
        let uri = format!("hf://org/{i}/{}", "x".repeat(1 << 20));
        ns_cache("team-evil", &format!("big-{i}"), &uri, 10)
    };
    let api = cluster().await;
    for i in 0..LISTED {
        api.apply(NAMESPACE_CACHES, big(i));
    }
    let pki = TestPki::new();
    let server = serve(&api, &pki, &[]).await;
    let pid = pid(&server);
    let listed = (status_kib(pid, "VmRSS:"), status_kib(pid, "VmHWM:"));
    assert_eq!(
        metric(&server, &skipped("uri-too-long")).await,
        LISTED as f64
    );
    let mut conn = connection(&server, &pki).await;
    let warm = status_kib(pid, "VmRSS:");
    reset_peak(pid);
    for i in LISTED..LISTED + WATCHED {
        api.apply(NAMESPACE_CACHES, big(i));
    }
    let started = Instant::now();
    while metric(&server, &skipped("uri-too-long")).await < (LISTED + WATCHED) as f64 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{}",
            server.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The next admissions of every namespace are as before.
    let r = resolve(&mut conn, "team-good", "hf://org/good", &[]).await;
    assert_eq!(r.cache, "namespace/team-good/good");
    let kept = metric(
        &server,
        "modelgate_cache_objects{kind=\"LocalModelNamespaceCache\"}",
    )
    .await;
    assert_eq!(kept, 1.0, "only team-good's cache is kept");
    let after = status_kib(pid, "VmRSS:");
    let peak = status_kib(pid, "VmHWM:");
    eprintln!(
        "{LISTED} caches of 1 MiB URIs listed: RSS {:.1} MiB once ready, peak {:.1} MiB; \
         {WATCHED} more watched: RSS {:.1} → {:.1} MiB, peak {:.1} MiB",
        mib(listed.0),
        mib(listed.1),
        mib(warm),
        mib(after),
        mib(peak)
    );
    // Stored, they held twice their size (160 MiB); a list page of them held ~3.5 times its
    // size until the allocator was next used as much (100 of them: 350 MiB, then 260 MiB
    // steady). Now a page is 25 objects, and what a list decoded is handed back once it is done.
    assert!(listed.0 < 80 * 1024, "RSS {} KiB once ready", listed.0);
    assert!(listed.1 < 200 * 1024, "peak {} KiB at the list", listed.1);
    // Watched, each event is decoded and dropped: what stays is the buffers of decoding one
    // (the same ~20 MiB for 10, 30 or 90 of them).
    assert!(
        after.saturating_sub(warm) < 40 * 1024,
        "RSS {warm} → {after} KiB"
    );
}

/// Finding 2, the count: nothing capped a namespace or the total. Now the newest past
/// `--max-caches-per-namespace` or `--max-namespace-caches` are ignored, counted, warned once;
/// a deletion makes room for the oldest ignored one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_a_cap_the_newest_caches_are_ignored_counted_and_warned_once() {
    let api = cluster().await;
    // team-evil's caches, each with its own model, created one second apart.
    for i in 0..20 {
        api.apply(
            NAMESPACE_CACHES,
            ns_cache(
                "team-evil",
                &format!("e{i:02}"),
                &format!("hf://org/e{i:02}"),
                100 + i,
            ),
        );
        api.apply(PVCS, pvc("team-evil", &format!("e{i:02}-gpu")));
    }
    let pki = TestPki::new();
    let server = serve(
        &api,
        &pki,
        &[
            ("MODELGATE_MAX_CACHES_PER_NAMESPACE", "5"),
            ("MODELGATE_MAX_NAMESPACE_CACHES", "8"),
        ],
    )
    .await;
    let mut conn = connection(&server, &pki).await;
    let hit = |ns: &str, name: &str| format!("namespace/{ns}/{name}");
    // The five oldest of team-evil are kept, the newest fifteen are not.
    for i in 0..20 {
        let r = resolve(&mut conn, "team-evil", &format!("hf://org/e{i:02}"), &[]).await;
        let want = if i < 5 {
            hit("team-evil", &format!("e{i:02}"))
        } else {
            "miss".into()
        };
        assert_eq!(r.cache, want, "e{i:02}: {r:?}");
    }
    assert_eq!(metric(&server, &skipped("over-namespace-cap")).await, 15.0);
    // team-evil-2 fills the total: its two oldest fit (1 + 5 + 2 = 8), team-good keeps its own.
    for i in 0..4 {
        api.apply(
            NAMESPACE_CACHES,
            ns_cache(
                "team-evil-2",
                &format!("f{i}"),
                &format!("hf://org/f{i}"),
                200 + i,
            ),
        );
    }
    let total = skipped("over-total-cap");
    let started = Instant::now();
    while metric(&server, &total).await < 2.0 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{}",
            server.logs()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let r = resolve(&mut conn, "team-good", "hf://org/good", &[]).await;
    assert_eq!(r.cache, hit("team-good", "good"));
    // Warned once per namespace, once for the total, however often the objects change.
    for _ in 0..3 {
        api.apply(
            NAMESPACE_CACHES,
            ns_cache("team-evil", "e19", "hf://org/e19", 119),
        );
    }
    // A deletion makes room: the oldest ignored cache (e05) is kept after a relist.
    api.delete(NAMESPACE_CACHES, Some("team-evil"), "e00");
    api.apply(PVCS, pvc("team-evil", "e05-gpu"));
    let took = until(
        &mut conn,
        "team-evil",
        "hf://org/e05",
        Duration::from_secs(20),
        |r| r.cache == hit("team-evil", "e05"),
    )
    .await;
    eprintln!("the oldest ignored cache kept {took:?} after a deletion");
    let logs = server.logs();
    let warned = |needle: &str| logs.lines().filter(|l| l.contains(needle)).count();
    assert_eq!(warned("in namespace team-evil:"), 1, "{logs}");
    assert_eq!(warned("--max-namespace-caches=8"), 1, "{logs}");
    assert_eq!(warned("in namespace team-good"), 0);
}

/// Finding 3: every change copied the list of the caches sharing its URI, so a burst of k
/// same-URI caches cost O(k²), and every other namespace's routing waited (30 000 took 6 s;
/// a bulk delete of them delayed another namespace's PVC deletion by 1.7 s). Now each change
/// is a path in a persistent map of that URI's caches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_same_uri_caches_does_not_hold_up_another_namespace() {
    const K: usize = 8_000;
    let api = cluster().await;
    let pki = TestPki::new();
    // One namespace may hold them all here: the caps are another test's.
    let server = serve(
        &api,
        &pki,
        &[("MODELGATE_MAX_CACHES_PER_NAMESPACE", "100000")],
    )
    .await;
    let mut conn = connection(&server, &pki).await;
    let burst = |from: u64| {
        (0..K).map(move |i| {
            ns_cache(
                "team-evil",
                &format!("s{i:05}"),
                "hf://org/same",
                from + i as u64,
            )
        })
    };
    // The burst, then team-good's PVC deleted: its pods must stop being routed to it soon.
    api.apply_all(NAMESPACE_CACHES, burst(10));
    api.delete(PVCS, Some("team-good"), "good-gpu");
    let created = until(
        &mut conn,
        "team-good",
        "hf://org/good",
        Duration::from_secs(30),
        |r| r.reason == "pvc-missing",
    )
    .await;
    let all_in = Instant::now();
    let objects = "modelgate_cache_objects{kind=\"LocalModelNamespaceCache\"}";
    while metric(&server, objects).await < (K + 1) as f64 {
        assert!(
            all_in.elapsed() < Duration::from_secs(30),
            "{}",
            server.logs()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let all_in = created + all_in.elapsed();
    // The bulk delete, then team-good's PVC back.
    let names: Vec<String> = (0..K).map(|i| format!("s{i:05}")).collect();
    api.delete_all(
        NAMESPACE_CACHES,
        names.iter().map(|n| (Some("team-evil"), n.as_str())),
    );
    api.apply(PVCS, pvc("team-good", "good-gpu"));
    let deleted = until(
        &mut conn,
        "team-good",
        "hf://org/good",
        Duration::from_secs(30),
        |r| r.cache == "namespace/team-good/good",
    )
    .await;
    eprintln!(
        "{K} same-URI caches: all published after {all_in:?}; another namespace's change seen \
         after {created:?} (created), {deleted:?} (deleted)"
    );
    assert!(all_in < Duration::from_secs(10), "{all_in:?}");
    // A debug build, 2 cores shared: O(k²) took seconds here; O(k log k) is the events' decoding.
    assert!(created < Duration::from_secs(5), "{created:?}");
    assert!(deleted < Duration::from_secs(5), "{deleted:?}");
}

/// Finding 4: every update of an object the index cannot use logged a WARN line. Now a kind
/// logs a few such lines a minute and counts the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn updates_of_an_unusable_object_are_logged_at_a_bounded_rate() {
    let api = cluster().await;
    let pki = TestPki::new();
    let server = serve(&api, &pki, &[]).await;
    let updates = (0..500).map(|i| {
        json!({"metadata": {"name": "broken", "namespace": "team-evil", "labels": {"n": i.to_string()}},
               "spec": {"sourceModelUri": "hf://org/x", "nodeGroups": "not-a-list"}})
    });
    api.apply_all(NAMESPACE_CACHES, updates);
    let started = Instant::now();
    while metric(&server, &skipped("unusable")).await < 500.0 {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{}",
            server.logs()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The metric is counted before the line is written, and the server's output is read by
    // another thread: wait for the first line to arrive, then count them all.
    let count = |logs: &str| {
        logs.lines()
            .filter(|l| l.contains("team-evil/broken"))
            .count()
    };
    let started = Instant::now();
    while count(&server.logs()) == 0 && started.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let logs = server.logs();
    let lines = count(&logs);
    assert!((1..=5).contains(&lines), "{lines} lines:\n{logs}");
}

// ---------------------------------------------------------------------------------------------
// The benchmark (ignored): the review's sizes

fn size(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The review's attacks at its sizes, each against a fresh `serve` (this build's, or
/// `MODELGATE_BENCH_BIN`): prints what docs/benchmarks.md records. Sizes:
/// `MODELGATE_BENCH_SAME_URI` (30 000), `MODELGATE_BENCH_BIG_URIS` (100),
/// `MODELGATE_BENCH_CACHES` (100 000), `MODELGATE_BENCH_LARGEST` (20 000), `MODELGATE_BENCH_PAIRS` (`1,10,40`: the attacking pods'
/// nodeSelector pairs), `MODELGATE_BENCH_ATTACKERS` (4); `MODELGATE_BENCH_PARTS` (`1,2,3`) picks
/// the parts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark: cargo test --release --test cache_tenancy -- --ignored --nocapture"]
async fn tenant_attacks_benchmark() {
    println!("binary: {}", binary());
    let pki = TestPki::new();

    let parts = std::env::var("MODELGATE_BENCH_PARTS").unwrap_or("1,2,3".into());
    let part = |p: &str| parts.split(',').any(|x| x == p);

    // 1. nodeGroups ["gpu"] × 150 000, pods of 1, 10 and 40 selector pairs.
    if part("1") {
        let api = cluster().await;
        let mut evil = ns_cache("team-evil", "evil", "hf://org/evil", 1);
        evil["spec"]["nodeGroups"] = json!(vec!["gpu"; 150_000]);
        api.apply(NAMESPACE_CACHES, evil);
        api.apply(PVCS, pvc("team-evil", "evil-gpu"));
        let server = serve(&api, &pki, &[]).await;
        let pid = pid(&server);
        let over = Duration::from_secs(5);
        let (_, alone) = under_attack(&server, &pki, 0, vec![], over).await;
        println!("1. team-good alone: {}", alone.describe(over));
        let attackers = size("MODELGATE_BENCH_ATTACKERS", 4);
        let pairs_list = std::env::var("MODELGATE_BENCH_PAIRS").unwrap_or("1,10,40".into());
        for pairs in pairs_list.split(',').map(|p| p.parse::<usize>().unwrap()) {
            let warm = status_kib(pid, "VmRSS:");
            reset_peak(pid);
            let (evil, good) =
                under_attack(&server, &pki, attackers, unsatisfiable(pairs), over).await;
            println!(
                "1. {pairs} pairs, {attackers} attackers: {}\n   team-good: {}\n   RSS {:.1} MiB, peak during the attack {:.1} MiB",
                evil.describe(over),
                good.describe(over),
                mib(warm),
                mib(status_kib(pid, "VmHWM:"))
            );
        }
    }

    // 2. caches of 1 MiB URIs; then many ordinary caches.
    if part("2") {
        let n = size("MODELGATE_BENCH_BIG_URIS", 100);
        let api = cluster().await;
        for i in 0..n {
            let uri = format!("hf://org/{i}/{}", "x".repeat(1 << 20));
            api.apply(
                NAMESPACE_CACHES,
                ns_cache("team-evil", &format!("big-{i}"), &uri, 10),
            );
        }
        let server = serve(&api, &pki, &[]).await;
        let pid = pid(&server);
        tokio::time::sleep(Duration::from_secs(3)).await;
        println!(
            "2. {n} caches of 1 MiB URIs: RSS {:.1} MiB steady, peak {:.1} MiB",
            mib(status_kib(pid, "VmRSS:")),
            mib(status_kib(pid, "VmHWM:"))
        );
    }
    if part("2") {
        let n = size("MODELGATE_BENCH_CACHES", 100_000);
        let api = cluster().await;
        api.apply_all(
            NAMESPACE_CACHES,
            (0..n).map(|i| {
                let ns = format!("team-{}", i % 100);
                ns_cache(
                    &ns,
                    &format!("c{i}"),
                    &format!("hf://org/m{i}"),
                    10 + i as u64,
                )
            }),
        );
        for (env, what) in [
            (vec![], "default caps"),
            (
                vec![("MODELGATE_MAX_NAMESPACE_CACHES", "10000000")],
                "total cap lifted",
            ),
        ] {
            let server = serve(&api, &pki, &env).await;
            let pid = pid(&server);
            tokio::time::sleep(Duration::from_secs(3)).await;
            let kept = metric(
                &server,
                "modelgate_cache_objects{kind=\"LocalModelNamespaceCache\"}",
            )
            .await;
            println!(
                "2. {n} caches over 100 namespaces ({what}): {kept} kept, RSS {:.1} MiB steady, peak {:.1} MiB",
                mib(status_kib(pid, "VmRSS:")),
                mib(status_kib(pid, "VmHWM:"))
            );
        }
    }

    // 2c. The largest caches the bounds keep whole: a 2 048-byte URI, 8 node groups of 253
    //     bytes, a 253-byte name; against as many ordinary ones.
    if part("2") {
        let n = size("MODELGATE_BENCH_LARGEST", 20_000);
        for largest in [false, true] {
            let api = cluster().await;
            api.apply_all(
                NAMESPACE_CACHES,
                (0..n).map(|i| {
                    let ns = format!("team-{}", i % 100);
                    if !largest {
                        return ns_cache(&ns, &format!("c{i}"), &format!("hf://org/m{i}"), 10);
                    }
                    let name = format!("c{i:06}-{}", "n".repeat(MAX_NAME_LEN - 8));
                    let uri = format!("hf://org/{i:06}/{}", "u".repeat(MAX_MODEL_URI_LEN - 16));
                    let mut c = ns_cache(&ns, &name, &uri, 10);
                    c["spec"]["nodeGroups"] = json!(
                        (0..MAX_NODE_GROUPS)
                            .map(|g| format!("{g}{}", "g".repeat(MAX_NAME_LEN - 1)))
                            .collect::<Vec<_>>()
                    );
                    c
                }),
            );
            let server = serve(&api, &pki, &[]).await;
            let pid = pid(&server);
            tokio::time::sleep(Duration::from_secs(3)).await;
            println!(
                "2c. {n} {} caches: RSS {:.1} MiB steady, peak {:.1} MiB",
                if largest { "largest" } else { "ordinary" },
                mib(status_kib(pid, "VmRSS:")),
                mib(status_kib(pid, "VmHWM:"))
            );
        }
    }

    // 3. k caches of one URI: from the list to synced, and a bulk delete of them against
    //    another namespace's PVC deletion.
    if part("3") {
        let k = size("MODELGATE_BENCH_SAME_URI", 30_000);
        let api = cluster().await;
        let caches = |from: u64| {
            (0..k).map(move |i| {
                ns_cache(
                    "team-evil",
                    &format!("s{i:05}"),
                    "hf://org/same",
                    from + i as u64,
                )
            })
        };
        api.apply_all(NAMESPACE_CACHES, caches(10));
        let started = Instant::now();
        let server = serve(
            &api,
            &pki,
            &[("MODELGATE_MAX_CACHES_PER_NAMESPACE", "100000")],
        )
        .await;
        println!(
            "3. {k} same-URI caches: list to ready {:?}",
            started.elapsed()
        );
        let mut conn = connection(&server, &pki).await;
        let names: Vec<String> = (0..k).map(|i| format!("s{i:05}")).collect();
        api.delete_all(
            NAMESPACE_CACHES,
            names.iter().map(|n| (Some("team-evil"), n.as_str())),
        );
        api.delete(PVCS, Some("team-good"), "good-gpu");
        let deleted = Instant::now();
        let mut routed_to_deleted = 0;
        loop {
            let r = resolve(&mut conn, "team-good", "hf://org/good", &[]).await;
            if r.reason == "pvc-missing" {
                break;
            }
            routed_to_deleted += 1;
        }
        println!(
            "3. bulk delete of them: team-good's PVC deletion seen after {:?}, {routed_to_deleted} \
             admissions routed to the deleted PVC meanwhile",
            deleted.elapsed()
        );
    }

    // 3b. `review --caches` of k same-URI caches, against k distinct ones.
    for k in [10_000, 20_000, 50_000].into_iter().filter(|_| part("3")) {
        for same in [true, false] {
            let dir = tempfile::tempdir().unwrap();
            let caches: Vec<Value> = (0..k)
                .map(|i| {
                    let uri = if same {
                        "hf://org/same".to_string()
                    } else {
                        format!("hf://org/m{i}")
                    };
                    let mut c = ns_cache("team-a", &format!("c{i:05}"), &uri, 0);
                    c["apiVersion"] = json!("serving.kserve.io/v1alpha1");
                    c["kind"] = json!("LocalModelNamespaceCache");
                    c
                })
                .collect();
            let file = dir.path().join("caches.json");
            std::fs::write(
                &file,
                json!({"apiVersion": "v1", "kind": "List", "items": caches}).to_string(),
            )
            .unwrap();
            let pod = dir.path().join("pod.json");
            std::fs::write(
                &pod,
                json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "p", "namespace": "team-a",
                             "annotations": {"modelgate.io/model-uri": "hf://org/same"}},
                "spec": {"containers": [{"name": "c", "image": "i"}]}})
                .to_string(),
            )
            .unwrap();
            let started = Instant::now();
            let out = Command::new(binary())
                .args(["review", "--caches"])
                .arg(&file)
                .arg(&pod)
                .output()
                .unwrap();
            assert!(out.status.code().is_some_and(|c| c <= 1), "{out:?}");
            println!(
                "3b. review --caches, {k} {} caches: {:.2} s",
                if same { "same-URI" } else { "distinct" },
                started.elapsed().as_secs_f64()
            );
        }
    }
}
