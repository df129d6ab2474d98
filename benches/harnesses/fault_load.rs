//! Load with faults, bounded in time, loopback only. See docs/reliability.md.
//!
//! ```sh
//! cargo build --release && cargo run --release --example fault_load -- --minutes 3
//! ```
//!
//! Two `modelgate serve` instances (the binary next to this example's target directory, or
//! `--bin`) watch the model caches of a fake Kubernetes API server. A client sends AdmissionReviews
//! at a fixed rate, each on a new TLS connection, to the instances whose `/readyz` says ready (as
//! the API server reaches the endpoints of a Service). Meanwhile, in one run:
//!
//! - the cache objects change all the time through the fake API server;
//! - the serving certificate rotates twice (the symlink swap of a mounted Secret);
//! - the fake API server goes away for 30 s and comes back;
//! - instance A gets SIGTERM; B takes over.
//!
//! It prints requests sent, answered and failed, latency percentiles per window, the certificates
//! the client saw, and the RSS of each instance at the start and end.

#[path = "../../tests/support/fake_apiserver.rs"]
#[allow(dead_code)]
mod fake_apiserver;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use fake_apiserver::{CACHES, FakeApiServer, NAMESPACE_CACHES, NODE_GROUPS};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use modelgate::cli::certs::Authority;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{Value, json};

struct Args {
    minutes: f64,
    rate: u32,
    outage: Duration,
    bin: PathBuf,
}

fn args() -> Args {
    let mut a = Args {
        minutes: 3.0,
        rate: 40,
        outage: Duration::from_secs(30),
        bin: std::env::current_exe()
            .unwrap()
            .parent()
            .unwrap()
            .parent()
            .unwrap()
            .join("modelgate"),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--minutes" => a.minutes = value().parse().expect("--minutes"),
            "--rate" => a.rate = value().parse().expect("--rate"),
            "--outage-seconds" => a.outage = Duration::from_secs(value().parse().expect("s")),
            "--bin" => a.bin = value().into(),
            other => panic!("unknown flag {other}; flags: --minutes --rate --outage-seconds --bin"),
        }
    }
    assert!(
        a.bin.is_file(),
        "{} not found: build it first (cargo build --release) or pass --bin",
        a.bin.display()
    );
    a
}

// ---------------------------------------------------------------------------------------------
// Certificates: a mounted Secret's layout, swapped by symlink

fn secret_version(dir: &Path, version: &str, ca: &Authority) {
    let pair = ca
        .issue_server(&["localhost".into(), "127.0.0.1".into()], 2)
        .unwrap();
    let data = dir.join(version);
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("tls.crt"), &pair.cert_pem).unwrap();
    std::fs::write(data.join("tls.key"), &pair.key_pem).unwrap();
    let tmp = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(version, &tmp).unwrap();
    std::fs::rename(&tmp, dir.join("..data")).unwrap();
    for f in ["tls.crt", "tls.key"] {
        let link = dir.join(f);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(Path::new("..data").join(f), &link).unwrap();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The serve instances

struct Instance {
    name: &'static str,
    child: Child,
    webhook: SocketAddr,
    probe: SocketAddr,
}

fn spawn(name: &'static str, bin: &Path, certs: &Path, kubeconfig: &Path) -> Instance {
    let mut child = Command::new(bin)
        .arg("serve")
        .args([
            "--listen=127.0.0.1:0",
            "--probe-listen=127.0.0.1:0",
            "--log-format=json",
            "--shutdown-grace=5s",
            "--cache-sync-timeout=10s",
        ])
        .arg(format!("--tls-cert={}", certs.join("tls.crt").display()))
        .arg(format!("--tls-key={}", certs.join("tls.key").display()))
        .env("KUBECONFIG", kubeconfig)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn modelgate serve");
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut warned = 0;
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            let v: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
            if v["message"] == "listening" {
                let _ = tx.send((
                    v["listener"].as_str().unwrap_or("").to_string(),
                    v["addr"]
                        .as_str()
                        .unwrap_or("")
                        .parse::<SocketAddr>()
                        .unwrap(),
                ));
            }
            if (v["level"] == "WARN" || v["level"] == "ERROR") && warned < 20 {
                warned += 1;
                eprintln!("[{name}] {line}");
            }
        }
    });
    let (mut webhook, mut probe) = (None, None);
    while webhook.is_none() || probe.is_none() {
        let (which, addr) = rx.recv_timeout(Duration::from_secs(30)).expect("listening");
        if which == "webhook" {
            webhook = Some(addr)
        } else {
            probe = Some(addr)
        }
    }
    Instance {
        name,
        child,
        webhook: webhook.unwrap(),
        probe: probe.unwrap(),
    }
}

fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

async fn ready(probe: SocketAddr) -> bool {
    let Ok(Ok(tcp)) = tokio::time::timeout(
        Duration::from_secs(1),
        tokio::net::TcpStream::connect(probe),
    )
    .await
    else {
        return false;
    };
    let Ok((mut sender, conn)) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await
    else {
        return false;
    };
    tokio::spawn(conn);
    let req = hyper::Request::get("/readyz")
        .header("host", "probe")
        .body(Full::new(Bytes::new()))
        .unwrap();
    matches!(
        tokio::time::timeout(Duration::from_secs(1), sender.send_request(req)).await,
        Ok(Ok(r)) if r.status() == 200
    )
}

// ---------------------------------------------------------------------------------------------
// The client

#[derive(Default)]
struct Tally {
    sent: AtomicU64,
    answered: AtomicU64,
    failed: AtomicU64,
    /// (seconds since start, latency in ms) of every answered request.
    latencies: Mutex<Vec<(f64, f64)>>,
    /// SHA-256-free fingerprint (first bytes of the DER) of every leaf certificate seen.
    certs: Mutex<BTreeSet<Vec<u8>>>,
    failures: Mutex<Vec<String>>,
}

fn review(i: u64) -> Vec<u8> {
    let model = ["hf://org/llama/7b", "gs://team/model", "hf://org/other"][(i % 3) as usize];
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": format!("load-{i}"),
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "team-a",
            "operation": "CREATE",
            "object": {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"generateName": "w-", "namespace": "team-a",
                             "annotations": {"modelgate.io/model-uri": model}},
                "spec": {
                    "containers": [{"name": "main", "image": "vllm",
                                    "volumeMounts": [{"name": "model-cache", "mountPath": "/models"}]}],
                    "volumes": [{"name": "model-cache", "persistentVolumeClaim": {"claimName": "c"}}]
                }
            }
        }
    }))
    .unwrap()
}

async fn one_request(
    addr: SocketAddr,
    tls: Arc<rustls::ClientConfig>,
    i: u64,
) -> Result<Vec<u8>, String> {
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let tls = tokio_rustls::TlsConnector::from(tls)
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    let leaf = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.to_vec())
        .unwrap_or_default();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(|e| format!("http: {e}"))?;
    tokio::spawn(conn);
    let req = hyper::Request::post("/mutate?timeout=10s")
        .header("host", "localhost")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(review(i))))
        .unwrap();
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| format!("request: {e}"))?;
    let status = resp.status();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("body: {e}"))?
        .to_bytes();
    let v: Value = serde_json::from_slice(&body).map_err(|e| format!("not JSON: {e}"))?;
    if status != 200
        || v["response"]["uid"] != format!("load-{i}")
        || v["response"]["allowed"] != true
    {
        return Err(format!("{status}: {v}"));
    }
    Ok(leaf)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx]
}

// ---------------------------------------------------------------------------------------------

fn namespace_cache(name: &str, uri: &str) -> Value {
    json!({"metadata": {"name": name, "namespace": "team-a"},
           "spec": {"sourceModelUri": uri, "nodeGroups": ["workers"], "modelSize": "1Gi"}})
}

fn cluster_cache(name: &str, uri: &str) -> Value {
    json!({"metadata": {"name": name},
           "spec": {"sourceModelUri": uri, "nodeGroups": ["workers"], "modelSize": "1Gi"}})
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = args();
    let total = Duration::from_secs_f64(args.minutes * 60.0);
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    std::fs::create_dir_all(&certs).unwrap();
    let ca = Authority::new("fault-load CA", 2).unwrap();
    secret_version(&certs, "..v1", &ca);

    // The fake API server with the three cache kinds and a few objects.
    let api = FakeApiServer::start(&[CACHES, NAMESPACE_CACHES, NODE_GROUPS]).await;
    api.apply(
        NODE_GROUPS,
        json!({"metadata": {"name": "workers"},
        "spec": {"storageLimit": "100Gi", "persistentVolumeSpec": {
            "capacity": {"storage": "100Gi"}, "local": {"path": "/models"},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "node-type", "operator": "In", "values": ["gpu"]}]}
            ]}}}}}),
    );
    api.apply(CACHES, cluster_cache("llama", "hf://org/llama"));
    api.apply(NAMESPACE_CACHES, namespace_cache("team", "gs://team/model"));
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: fake\nclusters:\n- name: fake\n  cluster:\n    server: http://{}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\nusers:\n- name: fake\n  user: {{}}\n",
            api.addr()
        ),
    )
    .unwrap();

    let mut a = spawn("A", &args.bin, &certs, &kubeconfig);
    let mut b = spawn("B", &args.bin, &certs, &kubeconfig);
    for inst in [&a, &b] {
        let end = Instant::now() + Duration::from_secs(30);
        while !ready(inst.probe).await {
            assert!(Instant::now() < end, "{} never became ready", inst.name);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    println!(
        "fault_load: {} min at {} req/s; instances A {} and B {} ready",
        args.minutes, args.rate, a.webhook, b.webhook
    );

    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca.cert_pem().as_bytes()).unwrap())
        .unwrap();
    let tls = Arc::new(
        rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth(),
    );

    // Endpoints: the instances whose /readyz is 200, polled every 100 ms.
    let endpoints: Arc<Mutex<Vec<SocketAddr>>> = Arc::new(Mutex::new(vec![a.webhook, b.webhook]));
    let instances = [(a.webhook, a.probe), (b.webhook, b.probe)];
    let poller = {
        let endpoints = endpoints.clone();
        tokio::spawn(async move {
            loop {
                let mut ready_now = Vec::new();
                for (webhook, probe) in instances {
                    if ready(probe).await {
                        ready_now.push(webhook);
                    }
                }
                *endpoints.lock().unwrap() = ready_now;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };

    let started = Instant::now();
    let tally = Arc::new(Tally::default());

    // Cache objects change all the time.
    let churn = {
        let api = api.clone();
        tokio::spawn(async move {
            let mut n = 0u64;
            loop {
                n += 1;
                let uri = if n.is_multiple_of(2) {
                    "gs://team/model"
                } else {
                    "gs://team/model/v2"
                };
                api.apply(NAMESPACE_CACHES, namespace_cache("team", uri));
                if n.is_multiple_of(3) {
                    // The one applied just before (n - 1 is never a multiple of 3).
                    api.delete(CACHES, None, &format!("churn-{}", (n - 1) % 50));
                } else {
                    let name = format!("churn-{}", n % 50);
                    api.apply(CACHES, cluster_cache(&name, &format!("hf://org/churn-{n}")));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };

    // The load: a fixed rate, round-robin over the ready endpoints.
    let load = {
        let tally = tally.clone();
        let endpoints = endpoints.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / args.rate as f64));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut inflight = tokio::task::JoinSet::new();
            let mut i = 0u64;
            while started.elapsed() < total {
                tick.tick().await;
                while inflight.try_join_next().is_some() {}
                let ready_now = endpoints.lock().unwrap().clone();
                if ready_now.is_empty() {
                    continue;
                }
                let addr = ready_now[(i as usize) % ready_now.len()];
                i += 1;
                let (tally, tls) = (tally.clone(), tls.clone());
                tally.sent.fetch_add(1, Ordering::Relaxed);
                inflight.spawn(async move {
                    let t0 = Instant::now();
                    match one_request(addr, tls, i).await {
                        Ok(leaf) => {
                            tally.answered.fetch_add(1, Ordering::Relaxed);
                            let at = started.elapsed().as_secs_f64();
                            let ms = t0.elapsed().as_secs_f64() * 1e3;
                            tally.latencies.lock().unwrap().push((at, ms));
                            tally.certs.lock().unwrap().insert(leaf);
                        }
                        Err(e) => {
                            tally.failed.fetch_add(1, Ordering::Relaxed);
                            let at = started.elapsed().as_secs_f64();
                            tally
                                .failures
                                .lock()
                                .unwrap()
                                .push(format!("{at:.1}s {addr}: {e}"));
                        }
                    }
                });
            }
            while inflight.join_next().await.is_some() {}
        })
    };

    // The faults, at fixed points of the run.
    let at = |f: f64| started + total.mul_f64(f);
    let mut events = Vec::new();
    let log = |events: &mut Vec<String>, what: String| {
        let line = format!("{:6.1}s  {what}", started.elapsed().as_secs_f64());
        println!("{line}");
        events.push(line);
    };
    // RSS "at start": after a warm-up at full load.
    tokio::time::sleep_until(at(0.1).into()).await;
    let rss_start = [rss_kib(a.child.id()), rss_kib(b.child.id())];
    log(
        &mut events,
        format!(
            "RSS after warm-up: A {:?} KiB, B {:?} KiB",
            rss_start[0], rss_start[1]
        ),
    );
    tokio::time::sleep_until(at(0.15).into()).await;
    secret_version(&certs, "..v2", &ca);
    log(
        &mut events,
        "certificate rotated (symlink swap to ..v2)".into(),
    );
    tokio::time::sleep_until(at(0.25).into()).await;
    api.take_down();
    log(&mut events, "fake API server taken down".into());
    tokio::time::sleep(args.outage).await;
    api.bring_back().await;
    log(
        &mut events,
        format!("fake API server back after {:?}", args.outage),
    );
    tokio::time::sleep_until(at(0.55).into()).await;
    secret_version(&certs, "..v3", &ca);
    log(
        &mut events,
        "certificate rotated (symlink swap to ..v3)".into(),
    );
    tokio::time::sleep_until(at(0.65).into()).await;
    let rss_a_end = rss_kib(a.child.id());
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(a.child.id().to_string())
        .status();
    log(&mut events, "SIGTERM to instance A".into());
    let exit_a = tokio::task::spawn_blocking(move || {
        let status = a.child.wait();
        (a, status)
    });
    let (_a, status_a) = exit_a.await.unwrap();
    log(&mut events, format!("instance A exited: {:?}", status_a));

    load.await.unwrap();
    let rss_b_end = rss_kib(b.child.id());
    churn.abort();
    poller.abort();
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(b.child.id().to_string())
        .status();
    let _ = b.child.wait();

    // The report.
    let sent = tally.sent.load(Ordering::Relaxed);
    let answered = tally.answered.load(Ordering::Relaxed);
    let failed = tally.failed.load(Ordering::Relaxed);
    println!("\n## Result\n");
    println!("| sent | answered | failed |\n|---|---|---|\n| {sent} | {answered} | {failed} |\n");
    for f in tally.failures.lock().unwrap().iter().take(20) {
        println!("- failure: {f}");
    }
    let certs_seen = tally.certs.lock().unwrap().len();
    println!(
        "Distinct serving certificates seen by the client: {certs_seen} (3 expected: initial + 2 rotations)\n"
    );
    println!(
        "| window | requests | p50 ms | p90 ms | p99 ms | max ms |\n|---|---|---|---|---|---|"
    );
    let lat = tally.latencies.lock().unwrap();
    let window = (total.as_secs_f64() / 6.0).max(10.0);
    let mut start = 0.0;
    while start < total.as_secs_f64() {
        let mut w: Vec<f64> = lat
            .iter()
            .filter(|(t, _)| *t >= start && *t < start + window)
            .map(|(_, ms)| *ms)
            .collect();
        w.sort_by(|x, y| x.partial_cmp(y).unwrap());
        println!(
            "| {:.0}–{:.0} s | {} | {:.2} | {:.2} | {:.2} | {:.2} |",
            start,
            start + window,
            w.len(),
            percentile(&w, 0.5),
            percentile(&w, 0.9),
            percentile(&w, 0.99),
            w.last().copied().unwrap_or(f64::NAN)
        );
        start += window;
    }
    let growth = |s: Option<u64>, e: Option<u64>| match (s, e) {
        (Some(s), Some(e)) => format!(
            "{s} KiB → {e} KiB ({:+.1}%)",
            (e as f64 / s as f64 - 1.0) * 100.0
        ),
        _ => "n/a".into(),
    };
    println!(
        "\nRSS A (start → before SIGTERM): {}",
        growth(rss_start[0], rss_a_end)
    );
    println!("RSS B (start → end): {}", growth(rss_start[1], rss_b_end));
    println!("\nEvents:");
    for e in &events {
        println!("- {e}");
    }
    if failed > 0 || certs_seen < 3 {
        std::process::exit(1);
    }
}
