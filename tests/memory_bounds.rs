//! Memory is bounded by the flags, never by the body (docs/security.md, "Memory: bounded by
//! the flags, not the body"), against the real `serve` binary over TLS, with the bodies of the
//! finding that set the bound:
//!
//! - a 7 MB Deployment whose template has 380 000 volumes (one `/validate` took `serve` from
//!   17.5 to 359 MB), and a 6.5 MB Pod of 370 000 containers with a model cache hit (its
//!   `/mutate` built a 64 MB patch before refusing it): each is denied as too large, naming the
//!   list, and `serve`'s peak RSS (`VmHWM`) grows by little more than the body;
//! - five clients sending such bodies in a loop (the finding: 469 MB, past the chart's 256 Mi)
//!   while the API server's client sends a small admission: the peak stays under the chart's
//!   limit and every small admission is answered right, within a second.
//!
//! The same run against another binary (a release build, before and after a change) is an
//! ignored test that only prints its figures (docs/benchmarks.md, "Hostile input"):
//! `MODELGATE_MEMORY_BENCH_BIN=target/release/modelgate cargo test --test memory_bounds --
//! --ignored --nocapture`.

mod common;

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::admissions::*;
use common::*;
use hyper::StatusCode;
use serde_json::{Value, json};

/// The chart's memory limit (256Mi).
const CHART_MEMORY_LIMIT_KIB: u64 = 256 * 1024;
/// The finding's shapes.
const VOLUMES: usize = 380_000;
const CONTAINERS: usize = 370_000;
/// Tests run one at a time (they compete for the CPUs and measure one process's memory).
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const MARKER: &str = "\"memory-bounds-marker\"";

/// The body of `review` with the value at `pointer` a list of `n` elements made by `element`
/// (written as text: a `Value` of 380 000 elements is slow to build in a debug test).
fn with_list(
    mut review: Value,
    pointer: &str,
    n: usize,
    element: impl Fn(usize) -> String,
) -> Bytes {
    *review.pointer_mut(pointer).expect(pointer) = serde_json::from_str(MARKER).unwrap();
    let text = review.to_string();
    let mut list = String::with_capacity(n * 20);
    list.push('[');
    for i in 0..n {
        if i > 0 {
            list.push(',');
        }
        list.push_str(&element(i));
    }
    list.push(']');
    Bytes::from(text.replacen(MARKER, &list, 1))
}

/// The LLM serving pod as a Deployment's template, with 380 000 volumes: 7.2 MB, as the
/// finding's 7.1 MB (`--max-body-bytes` is 7 MiB).
fn deployment_of_volumes() -> Bytes {
    let mut review = llm_review();
    let request = &mut review["request"];
    let pod = request["object"].take();
    request["kind"] = json!({"group": "apps", "version": "v1", "kind": "Deployment"});
    request["resource"] = json!({"group": "apps", "version": "v1", "resource": "deployments"});
    request["object"] = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "llm", "namespace": "team-a"},
        "spec": {"selector": {"matchLabels": {"app": "llama3"}},
                 "template": {"metadata": pod["metadata"], "spec": pod["spec"]}},
    });
    with_list(
        review,
        "/request/object/spec/template/spec/volumes",
        VOLUMES,
        |i| format!(r#"{{"name":"v{i}"}}"#),
    )
}

/// The LLM serving pod (a model cache hit with `benches/reviews/caches.json`) with 370 000
/// containers.
fn pod_of_containers() -> Bytes {
    with_list(
        llm_review(),
        "/request/object/spec/containers",
        CONTAINERS,
        |i| format!(r#"{{"name":"c{i}"}}"#),
    )
}

fn caches() -> String {
    concat!(env!("CARGO_MANIFEST_DIR"), "/benches/reviews/caches.json").to_string()
}

/// `bin serve` as the tests start it (JSON logs, ephemeral ports, no cluster), with the
/// reference caches, so that the LLM pod is a cache hit.
fn serve(bin: &str, pki: &TestPki) -> ServerProcess {
    let mut cmd = Command::new(bin);
    cmd.arg("serve")
        .args([
            "--listen=127.0.0.1:0",
            "--probe-listen=127.0.0.1:0",
            "--log-format=json",
            "--no-cluster",
        ])
        .arg(format!("--caches={}", caches()))
        .args(pki.tls_args())
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    ServerProcess::spawn(cmd)
}

/// What one run measured.
#[derive(Debug)]
struct Measured {
    /// VmRSS once ready and warmed up (one small admission per webhook).
    warm_kib: u64,
    /// One `/validate` of the Deployment alone: the answer, its time, VmHWM after it.
    deployment: (Value, Duration, u64),
    /// One `/mutate` of the Pod alone.
    pod: (Value, Duration, u64),
    /// Five clients sending both in a loop: VmHWM after, and the statuses they got.
    concurrent_kib: u64,
    statuses: Vec<(StatusCode, u64)>,
    /// The API server's small admissions meanwhile.
    small: ClientReport,
}

async fn post(addr: std::net::SocketAddr, ca: &str, path: &str, body: Bytes) -> (Value, Duration) {
    let mut conn = connect(addr, client_config(ca, Proto::H1, None), Proto::H1)
        .await
        .expect("connect");
    let started = Instant::now();
    let answer = conn.post_json(path, body).await.expect("an answer");
    let took = started.elapsed();
    assert_eq!(
        answer.status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    (answer.json(), took)
}

/// The finding's measurements against `bin`: each body alone, then `clients` clients sending
/// them (or `loop_bodies`, when given) in a loop for `attack` while the API server's client
/// sends the LLM pod to `/mutate`.
async fn measure(
    bin: &str,
    clients: usize,
    attack: Duration,
    loop_bodies: Vec<(&'static str, Bytes)>,
) -> Measured {
    let (deployment_body, pod_body) = (deployment_of_volumes(), pod_of_containers());
    let loop_bodies = match loop_bodies.is_empty() {
        true => vec![
            ("/validate?timeout=10s", deployment_body.clone()),
            ("/mutate?timeout=10s", pod_body.clone()),
        ],
        false => loop_bodies,
    };
    assert!(deployment_body.len() < 7 << 20 && pod_body.len() < 7 << 20);
    let pki = TestPki::new();
    let server = serve(bin, &pki);
    let pid = server.child.id();
    let ca = pki.ca.cert_pem().to_string();
    let addr = server.webhook;
    let expected = {
        let review = with_uid(&llm_review(), "reference");
        let body = Bytes::from(serde_json::to_vec(&review).unwrap());
        post(addr, &ca, "/validate", body.clone()).await;
        post(addr, &ca, "/mutate", body).await.0
    };
    let warm_kib = status_kib(pid, "VmRSS:");
    let (answer, took) = post(addr, &ca, "/validate", deployment_body.clone()).await;
    let deployment = (answer, took, status_kib(pid, "VmHWM:"));
    let (answer, took) = post(addr, &ca, "/mutate", pod_body.clone()).await;
    let pod = (answer, took, status_kib(pid, "VmHWM:"));

    let small = ApiServerClient::start(addr, ca.clone(), expected, 1, Duration::from_secs(5));
    let stop = Arc::new(AtomicBool::new(false));
    let counts: Arc<[AtomicU64; 4]> = Arc::new(Default::default());
    let mut senders = Vec::new();
    for c in 0..clients {
        let (stop, counts, ca) = (stop.clone(), counts.clone(), ca.clone());
        let (path, body) = loop_bodies[c % loop_bodies.len()].clone();
        senders.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let Ok(mut conn) =
                    connect(addr, client_config(&ca, Proto::H1, None), Proto::H1).await
                else {
                    continue;
                };
                while !stop.load(Ordering::Relaxed) {
                    let Ok(answer) = conn.post_json(path, body.clone()).await else {
                        break;
                    };
                    let slot = match answer.status {
                        StatusCode::OK => 0,
                        StatusCode::TOO_MANY_REQUESTS => 1,
                        StatusCode::SERVICE_UNAVAILABLE => 2,
                        _ => 3,
                    };
                    counts[slot].fetch_add(1, Ordering::Relaxed);
                    if answer.connection_close {
                        break;
                    }
                }
            }
        }));
    }
    tokio::time::sleep(attack).await;
    stop.store(true, Ordering::Relaxed);
    let small = tokio::task::spawn_blocking(move || small.finish())
        .await
        .unwrap();
    for s in senders {
        let _ = tokio::time::timeout(Duration::from_secs(30), s).await;
    }
    let statuses = [
        StatusCode::OK,
        StatusCode::TOO_MANY_REQUESTS,
        StatusCode::SERVICE_UNAVAILABLE,
        StatusCode::IM_A_TEAPOT,
    ]
    .into_iter()
    .zip(counts.iter().map(|c| c.load(Ordering::Relaxed)))
    .collect();
    Measured {
        warm_kib,
        deployment,
        pod,
        concurrent_kib: status_kib(pid, "VmHWM:"),
        statuses,
        small,
    }
}

fn max(latencies: &[Duration]) -> Duration {
    latencies.iter().copied().max().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_findings_bodies_are_denied_as_too_large_within_the_chart_s_memory() {
    let _one_at_a_time = SERIAL.lock().await;
    let m = measure(bin(), 5, Duration::from_secs(6), Vec::new()).await;
    eprintln!("{m:#?}");
    let message = |answer: &Value| {
        assert_eq!(answer["response"]["allowed"], false, "{answer}");
        assert_eq!(answer["response"]["status"]["code"], 403, "{answer}");
        answer["response"]["status"]["message"]
            .as_str()
            .unwrap()
            .to_string()
    };
    for (answer, list) in [
        (&m.deployment.0, "spec.template.spec.volumes"),
        (&m.pod.0, "spec.containers"),
    ] {
        let message = message(answer);
        assert!(
            message.starts_with(&format!(
                "{list}: the pod has more list elements than an object the API server stores \
                 can hold"
            )),
            "{message}"
        );
        assert!(message.contains("alone holds at most 314572"), "{message}");
    }
    // Each alone: the body arrives in parts (a buffer of up to twice its size) and is counted
    // without building its views; nothing grows with its 380 000 elements beyond that.
    for (what, (_, took, hwm)) in [("Deployment", &m.deployment), ("Pod", &m.pod)] {
        let grew = hwm.saturating_sub(m.warm_kib);
        assert!(
            grew < 48 * 1024,
            "{what}: VmHWM {hwm} KiB, {grew} KiB above the warm RSS {} KiB",
            m.warm_kib
        );
        // A debug build, on a loaded machine: the release build takes a tenth of this.
        assert!(*took < Duration::from_secs(10), "{what}: {took:?}");
    }
    // Five clients sending them in a loop: within the chart's limit (the debug build's base
    // is twice the release build's), and the API server's small admissions all answered right,
    // each within a second.
    assert!(
        m.concurrent_kib < CHART_MEMORY_LIMIT_KIB,
        "VmHWM {} KiB",
        m.concurrent_kib
    );
    assert!(m.statuses[0].1 > 0, "{:?}", m.statuses);
    assert!(m.small.failures.is_empty(), "{:?}", m.small.failures);
    assert!(m.small.latencies.len() > 5, "{:?}", m.small.latencies);
    assert!(
        max(&m.small.latencies) < Duration::from_secs(1),
        "slowest small admission {:?}, p99 {:?}",
        max(&m.small.latencies),
        m.small.p99()
    );
}

/// An ephemeral-container update (`kubectl debug`) whose `oldObject` holds 370 000 ephemeral
/// containers (no API server sends one: the stored pod could not hold them), at about the size
/// of the finding's bodies: the old object is read within the bound of one object, as the
/// object is, so it is counted and never decoded into views; the update is judged as without
/// it (the whole pod), and the peak RSS grows as it does for the finding's bodies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ephemeral_update_with_a_huge_old_object_is_decided_within_the_bound() {
    let _one_at_a_time = SERIAL.lock().await;
    let mut review = llm_review();
    let request = &mut review["request"];
    request["operation"] = json!("UPDATE");
    request["subResource"] = json!("ephemeralcontainers");
    request["name"] = json!("llama-server");
    let mut pod = request["object"].take();
    pod["metadata"]["name"] = json!("llama-server");
    pod["spec"]["securityContext"] = json!({"runAsNonRoot": true, "runAsUser": 1000});
    request["oldObject"] = pod.clone();
    request["oldObject"]["spec"]["ephemeralContainers"] = json!([]);
    pod["spec"]["ephemeralContainers"] =
        json!([{"name": "debugger", "image": "busybox", "securityContext": {"runAsUser": 0}}]);
    request["object"] = pod;
    let body = with_list(
        review,
        "/request/oldObject/spec/ephemeralContainers",
        CONTAINERS,
        |i| format!(r#"{{"name":"e{i}"}}"#),
    );
    assert!(
        body.len() > 5 << 20 && body.len() < 7 << 20,
        "{}",
        body.len()
    );
    // Each webhook alone, on a fresh `serve`.
    for path in ["/mutate", "/validate"] {
        let pki = TestPki::new();
        let server = serve(bin(), &pki);
        let pid = server.child.id();
        let ca = pki.ca.cert_pem().to_string();
        let small = Bytes::from(serde_json::to_vec(&llm_review()).unwrap());
        post(server.webhook, &ca, "/mutate", small.clone()).await;
        post(server.webhook, &ca, "/validate", small).await;
        let warm = status_kib(pid, "VmRSS:");
        let (answer, took) = post(server.webhook, &ca, path, body.clone()).await;
        assert_eq!(answer["response"]["allowed"], false, "{path}: {answer}");
        assert_eq!(
            answer["response"]["status"]["message"]
                .as_str()
                .unwrap()
                .split(". ")
                .next(),
            Some(
                "spec.ephemeralContainers[0].securityContext.runAsUser: 0 is outside 1..2147483647"
            ),
            "{path}: {answer}"
        );
        let hwm = status_kib(pid, "VmHWM:");
        let grew = hwm.saturating_sub(warm);
        assert!(
            grew < 48 * 1024,
            "{path}: VmHWM {hwm} KiB, {grew} KiB above the warm RSS {warm} KiB"
        );
        assert!(took < Duration::from_secs(10), "{path}: {took:?}");
        eprintln!("{path}: {took:?}, VmHWM {hwm} KiB ({grew} KiB above the warm RSS)");
    }
}

/// The benchmark of docs/benchmarks.md ("Hostile input"): the same run against
/// `MODELGATE_MEMORY_BENCH_BIN` (a release build, before and after a change), printing the
/// figures only (a binary from before this bound allows or answers otherwise).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark: MODELGATE_MEMORY_BENCH_BIN=path, --ignored --nocapture"]
async fn memory_of_the_findings_bodies_benchmark() {
    let _one_at_a_time = SERIAL.lock().await;
    let bin = std::env::var("MODELGATE_MEMORY_BENCH_BIN").unwrap_or_else(|_| bin().to_string());
    let seconds = std::env::var("MODELGATE_MEMORY_BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    // MODELGATE_MEMORY_BENCH_SHAPES=shape:kind:webhook,…: the clients send these shapes of
    // benches/harnesses/cost_probe.rs (at about 7 MB) instead of the finding's bodies.
    let shapes = std::env::var("MODELGATE_MEMORY_BENCH_SHAPES").unwrap_or_default();
    let loop_bodies: Vec<(&'static str, Bytes)> = shapes
        .split(',')
        .filter(|s| !s.is_empty())
        .map(|s| {
            let [shape, kind, webhook] = s.split(':').collect::<Vec<_>>()[..] else {
                panic!("shape:kind:webhook, not {s}");
            };
            let path = match webhook {
                "mutate" => "/mutate?timeout=10s",
                _ => "/validate?timeout=10s",
            };
            (path, probe_body(shape, 7_000_000, kind))
        })
        .collect();
    if !loop_bodies.is_empty() {
        println!("clients send: {shapes}");
    }
    let m = measure(&bin, 5, Duration::from_secs(seconds), loop_bodies).await;
    let summary = |a: &Value| {
        let r = &a["response"];
        format!(
            "allowed={} {}",
            r["allowed"],
            r["status"]["message"]
                .as_str()
                .unwrap_or_default()
                .chars()
                .take(90)
                .collect::<String>()
        )
    };
    println!("binary: {bin}");
    println!("warm RSS: {} MiB", m.warm_kib / 1024);
    for (what, (answer, took, hwm)) in [
        ("Deployment, 380 000 volumes, /validate", &m.deployment),
        ("Pod, 370 000 containers, cache hit, /mutate", &m.pod),
    ] {
        println!(
            "{what}: {:.0} ms, peak RSS {} MiB: {}",
            took.as_secs_f64() * 1e3,
            hwm / 1024,
            summary(answer)
        );
    }
    println!(
        "5 clients for {seconds} s: peak RSS {} MiB, answers {:?}; small admissions: {} answered, {} failed, p99 {:?}, slowest {:?}",
        m.concurrent_kib / 1024,
        m.statuses,
        m.small.latencies.len(),
        m.small.failures.len(),
        m.small.p99(),
        max(&m.small.latencies)
    );
}

/// The hostile shapes of `benches/harnesses/cost_probe.rs` at about 7 MB (the default `--max-body-bytes`
/// is 7 MiB), each as a Pod and as a Deployment, each sent alone to `/mutate` and `/validate` of
/// a fresh `serve` (`MODELGATE_MEMORY_BENCH_BIN`, else the debug build): its peak RSS above the
/// warm one, and the slowest answer. Prints the figures of docs/benchmarks.md ("Hostile input").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark: MODELGATE_MEMORY_BENCH_BIN=path, --ignored --nocapture; needs the cost_probe example"]
async fn memory_of_every_hostile_shape_benchmark() {
    let _one_at_a_time = SERIAL.lock().await;
    let bin = std::env::var("MODELGATE_MEMORY_BENCH_BIN").unwrap_or_else(|_| bin().to_string());
    let bytes: usize = std::env::var("MODELGATE_MEMORY_BENCH_BYTES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(7_000_000);
    let probe = probe();
    let list = Command::new(&probe)
        .arg("list")
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "{}: {e} (cargo build --example cost_probe)",
                probe.display()
            )
        });
    println!("binary: {bin}, bodies of about {bytes} bytes");
    for shape in String::from_utf8(list.stdout).unwrap().lines() {
        for kind in ["pod", "deployment"] {
            let body = probe_body(shape, bytes, kind);
            let pki = TestPki::new();
            let server = serve(&bin, &pki);
            let pid = server.child.id();
            let ca = pki.ca.cert_pem().to_string();
            let small = Bytes::from(serde_json::to_vec(&llm_review()).unwrap());
            post(server.webhook, &ca, "/mutate", small.clone()).await;
            post(server.webhook, &ca, "/validate", small).await;
            let warm = status_kib(pid, "VmRSS:");
            let mut answers = Vec::new();
            let mut slowest = Duration::ZERO;
            for webhook in ["/mutate", "/validate"] {
                let mut conn = connect(
                    server.webhook,
                    client_config(&ca, Proto::H1, None),
                    Proto::H1,
                )
                .await
                .unwrap();
                let started = Instant::now();
                let answer = conn.post_json(webhook, body.clone()).await.unwrap();
                slowest = slowest.max(started.elapsed());
                let summary = match answer.status {
                    StatusCode::OK => {
                        let r = &answer.json()["response"];
                        match r["allowed"].as_bool() {
                            Some(true) if r.get("patch").is_some() => "patched".to_string(),
                            Some(true) => "allowed".to_string(),
                            _ => {
                                let m = r["status"]["message"].as_str().unwrap_or_default();
                                let why = if m.contains("more list elements") {
                                    "too large"
                                } else if m.contains("their patch") {
                                    "patch too large"
                                } else {
                                    "denied"
                                };
                                why.to_string()
                            }
                        }
                    }
                    status => status.to_string(),
                };
                answers.push(format!("{webhook} {summary}"));
            }
            let peak = status_kib(pid, "VmHWM:");
            println!(
                "| {shape} | {kind} | {:.1} MB | +{} MiB | {:.0} ms | {} |",
                body.len() as f64 / 1e6,
                peak.saturating_sub(warm) / 1024,
                slowest.as_secs_f64() * 1e3,
                answers.join(", ")
            );
        }
    }
}

/// `examples/cost_probe` (built by `cargo build --example cost_probe`).
fn probe() -> std::path::PathBuf {
    std::env::current_exe()
        .unwrap()
        .parent()
        .and_then(|deps| deps.parent())
        .unwrap()
        .join("examples/cost_probe")
}

/// A review of one of `benches/harnesses/cost_probe.rs`'s shapes, about `bytes` long.
fn probe_body(shape: &str, bytes: usize, kind: &str) -> Bytes {
    let out = Command::new(probe())
        .args([shape, &bytes.to_string(), kind, "body"])
        .output()
        .unwrap_or_else(|e| panic!("cost_probe: {e} (cargo build --example cost_probe)"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Bytes::from(out.stdout)
}
