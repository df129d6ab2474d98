//! `serve` watching a large cluster state: memory, time to ready, the CPU a steady stream of
//! watch events costs, and how fast a PVC deletion reaches the published index. See
//! docs/benchmarks.md ("Routing" and "Cluster-state churn").
//!
//! ```sh
//! cargo build --release && cargo run --release --example watch_scale -- --caches 100000
//! ```
//!
//! Flags: `--caches N` (default 100 000), `--bin PATH` (another build of `modelgate`, to
//! compare), `--seconds S` (each CPU window, default 20), `--rate R` (events a second in the
//! streams, default 20).
//!
//! A fake Kubernetes API server (tests/support/fake_apiserver.rs) holds the cluster state of
//! benches/cache_lookup.rs at size `n`: `n` caches (half cluster-wide, half over 100 namespaces)
//! with a status of four `NodeDownloaded` nodes each, `n` PVCs, `n / 20` Nodes in two node
//! groups. One `modelgate serve` (the release binary, or `--bin`) watches it through a
//! kubeconfig. The example prints the time until `/readyz` answers 200, serve's RSS (VmRSS) and
//! peak (VmHWM) then; serve's CPU time (utime + stime from /proc/PID/stat, so other work on the
//! machine does not count) over three windows: idle, a stream of no-op Node updates (a new
//! resourceVersion and annotation, labels as they were: a kubelet's heartbeat as a metadata
//! watch sees it), and a stream of real changes (a PVC's phase and a cache's downloaded node, in
//! turn); the time from deleting a PVC until `/metrics` counts one PVC less (the next
//! admission's answer is a `pvc-missing` miss from then on), three times; and the RSS and peak
//! at the end.

#[path = "../../tests/support/fake_apiserver.rs"]
#[allow(dead_code)]
mod fake_apiserver;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use fake_apiserver::{CACHES, FakeApiServer, NAMESPACE_CACHES, NODE_GROUPS, NODES, PVCS};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix(field)?
                .trim()
                .strip_suffix(" kB")?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

/// One plain-HTTP GET on the probe listener: status code and body.
async fn get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n");
    s.write_all(request.as_bytes()).await.ok()?;
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.ok()?;
    let text = String::from_utf8_lossy(&out).to_string();
    let code = text.split(' ').nth(1)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string())?;
    Some((code, body))
}

/// serve's CPU seconds so far (utime + stime, at the kernel's 100 ticks a second).
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name, which is in parentheses and may hold spaces.
    let rest = &stat[stat.rfind(')').map_or(0, |i| i + 2)..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line, 12 and 13 after the name.
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}

/// serve's CPU, in percent of one core, while `event` is called `rate` times a second for
/// `seconds`.
async fn cpu_during(pid: u32, seconds: u64, rate: u32, mut event: impl FnMut(u64)) -> f64 {
    let start = Instant::now();
    let cpu = cpu_seconds(pid);
    let mut tick = tokio::time::interval(Duration::from_secs(1) / rate.max(1));
    let mut i = 0;
    while start.elapsed() < Duration::from_secs(seconds) {
        tick.tick().await;
        if rate > 0 {
            event(i);
            i += 1;
        }
    }
    (cpu_seconds(pid) - cpu) / start.elapsed().as_secs_f64() * 100.0
}

fn pvc_count(metrics: &str) -> Option<u64> {
    metrics.lines().find_map(|l| {
        l.strip_prefix(r#"modelgate_cache_objects{kind="PersistentVolumeClaim"} "#)?
            .parse()
            .ok()
    })
}

fn group(name: &str) -> Value {
    json!({"metadata": {"name": name}, "spec": {"storageLimit": "100Gi", "persistentVolumeSpec": {
        "capacity": {"storage": "100Gi"}, "local": {"path": "/models"},
        "nodeAffinity": {"required": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "node-type", "operator": "In", "values": [name]}]}]}}}}})
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let mut n = 100_000usize;
    let mut seconds = 20u64;
    let mut rate = 20u32;
    let mut bin = std::env::current_exe()?
        .parent()
        .and_then(|p| p.parent())
        .map(|p| p.join("modelgate"))
        .unwrap_or_default();
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--caches" => n = it.next().unwrap_or_default().parse()?,
            "--bin" => bin = PathBuf::from(it.next().unwrap_or_default()),
            "--seconds" => seconds = it.next().unwrap_or_default().parse()?,
            "--rate" => rate = it.next().unwrap_or_default().parse()?,
            other => anyhow::bail!(
                "unknown flag {other}; flags: --caches N, --bin PATH, --seconds S, --rate R"
            ),
        }
    }
    anyhow::ensure!(bin.is_file(), "{}: build it first", bin.display());
    let nodes = (n / 20).max(4);
    let gpu_nodes = nodes / 2;

    let api = FakeApiServer::start(&[CACHES, NAMESPACE_CACHES, NODE_GROUPS]).await;
    api.apply(NODE_GROUPS, group("gpu"));
    api.apply(NODE_GROUPS, group("cpu"));
    let node = |i: usize, heartbeat: u64| {
        let kind = if i < gpu_nodes { "gpu" } else { "cpu" };
        json!({"metadata": {"name": format!("node-{i:05}"), "labels": {
            "node-type": kind, "zone": format!("zone-{}", i % 3),
            "kubernetes.io/hostname": format!("node-{i:05}")},
            "annotations": {"heartbeat": heartbeat.to_string()}}, "spec": {}})
    };
    for i in 0..nodes {
        api.apply(NODES, node(i, 0));
    }
    let cache_of = |i: usize, downloaded: usize| {
        let status: serde_json::Map<String, Value> = (0..downloaded)
            .map(|k| {
                (
                    format!("node-{:05}", (i + k) % gpu_nodes),
                    json!("NodeDownloaded"),
                )
            })
            .collect();
        json!({
            "metadata": {"name": format!("cache-{i}")},
            "spec": {"sourceModelUri": format!("hf://org-{}/model-{i}", i % 1000),
                     "modelSize": "10Gi", "nodeGroups": ["gpu"]},
            "status": {"nodeStatus": status, "copies": {"available": downloaded, "total": 4}}
        })
    };
    let pvc_of = |i: usize, phase: &str| {
        json!({"metadata": {"name": format!("cache-{i}-gpu"), "namespace": format!("team-{}", (i + 1) % 100)},
               "spec": {"accessModes": ["ReadOnlyMany"]}, "status": {"phase": phase}})
    };
    for i in 0..n {
        let mut cache = cache_of(i, 4);
        if i.is_multiple_of(2) {
            api.apply(CACHES, cache);
        } else {
            cache["metadata"]["namespace"] = json!(format!("team-{}", i % 100));
            api.apply(NAMESPACE_CACHES, cache);
        }
        api.apply(PVCS, pvc_of(i, "Bound"));
    }

    let dir = tempfile::tempdir()?;
    let certs = modelgate::cli::certs::ensure_dev_certs(dir.path())?;
    let kubeconfig = dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig);
    let started = Instant::now();
    let mut child = Command::new(&bin)
        .args([
            "serve",
            "--listen=127.0.0.1:0",
            "--probe-listen=127.0.0.1:0",
            "--log-format=json",
            "--cache-sync-timeout=10m",
        ])
        .arg(format!("--tls-cert={}", certs.cert.display()))
        .arg(format!("--tls-key={}", certs.key.display()))
        .env("KUBECONFIG", &kubeconfig)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    let pid = child.id();
    let stderr = child.stderr.take().expect("piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let v: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
            if v["message"] == "listening" && v["listener"] == "probe" {
                let _ = tx.send(v["addr"].as_str().unwrap_or("").parse::<SocketAddr>());
            }
        }
    });
    let probe = rx.recv_timeout(Duration::from_secs(60))??;
    loop {
        if let Some((200, _)) = get(probe, "/readyz").await {
            break;
        }
        anyhow::ensure!(started.elapsed() < Duration::from_secs(600), "not ready");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let ready = started.elapsed();
    // Let the allocator settle as it does between admissions.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (rss, hwm) = (kib(pid, "VmRSS:"), kib(pid, "VmHWM:"));

    // CPU: idle, no-op Node updates, real changes (cluster caches are the even ones).
    let idle = cpu_during(pid, seconds, 0, |_| {}).await;
    let no_op = cpu_during(pid, seconds, rate, |i| {
        api.apply(NODES, node(i as usize % nodes, i + 1));
    })
    .await;
    let real = cpu_during(pid, seconds, rate, |i| {
        let i = i as usize;
        if i.is_multiple_of(2) {
            // A PVC goes Lost and back (each a change routing sees).
            let phase = if (i / 2).is_multiple_of(2) {
                "Lost"
            } else {
                "Bound"
            };
            api.apply(PVCS, pvc_of((i / 4 * 2 + 2) % n, phase));
        } else {
            // A cluster cache's download reaches one more node, or goes back.
            let downloaded = if (i / 2).is_multiple_of(2) { 5 } else { 4 };
            api.apply(CACHES, cache_of((i / 4 * 2 + 2) % n, downloaded));
        }
    })
    .await;

    let mut latencies = Vec::new();
    for (ns, name) in [
        ("team-1", "cache-0-gpu"),
        ("team-3", "cache-2-gpu"),
        ("team-5", "cache-4-gpu"),
    ] {
        let (_, metrics) = get(probe, "/metrics").await.expect("metrics");
        let before = pvc_count(&metrics).expect("the PVC gauge");
        let deleted = Instant::now();
        api.delete(PVCS, Some(ns), name);
        let seen = loop {
            let (_, metrics) = get(probe, "/metrics").await.expect("metrics");
            if pvc_count(&metrics) == Some(before - 1) {
                break deleted.elapsed();
            }
            anyhow::ensure!(
                deleted.elapsed() < Duration::from_secs(120),
                "never published"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        latencies.push(format!("{:.2}", seen.as_secs_f64()));
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (after, peak) = (kib(pid, "VmRSS:"), kib(pid, "VmHWM:"));
    println!(
        "serve watching {n} caches, {n} PVCs, {nodes} Nodes: ready after {:.1} s; RSS {:.1} MiB \
         (peak {:.1} MiB); CPU (% of a core, from /proc): idle {idle:.2}, {rate} no-op Node \
         updates/s {no_op:.2}, {rate} real changes/s {real:.2}; a PVC deletion published after \
         {} s; at the end RSS {:.1} MiB, peak {:.1} MiB",
        ready.as_secs_f64(),
        rss as f64 / 1024.0,
        hwm as f64 / 1024.0,
        latencies.join(", "),
        after as f64 / 1024.0,
        peak as f64 / 1024.0,
    );
    let _ = child.kill();
    let _ = child.wait();
    Ok(())
}
