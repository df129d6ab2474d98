//! `serve` watching a large cluster state: memory, time to ready, and how fast a PVC deletion
//! reaches the published index. See docs/benchmarks.md ("Routing").
//!
//! ```sh
//! cargo build --release && cargo run --release --example watch_scale -- --caches 100000
//! ```
//!
//! A fake Kubernetes API server (tests/support/fake_apiserver.rs) holds the cluster state of
//! benches/cache_lookup.rs at size `n`: `n` caches (half cluster-wide, half over 100 namespaces)
//! with a status of four `NodeDownloaded` nodes each, `n` PVCs, `n / 20` Nodes in two node
//! groups. One `modelgate serve` (the release binary, or `--bin`) watches it through a
//! kubeconfig. The example prints the time until `/readyz` answers 200, serve's RSS (VmRSS) and
//! peak (VmHWM) then, the time from deleting one PVC until `/metrics` counts one PVC less (the
//! next admission's answer is a `pvc-missing` miss from then on), and the RSS after that rebuild.

#[path = "../tests/support/fake_apiserver.rs"]
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
            other => anyhow::bail!("unknown flag {other}; flags: --caches N, --bin PATH"),
        }
    }
    anyhow::ensure!(bin.is_file(), "{}: build it first", bin.display());
    let nodes = (n / 20).max(4);
    let gpu_nodes = nodes / 2;

    let api = FakeApiServer::start(&[CACHES, NAMESPACE_CACHES, NODE_GROUPS]).await;
    api.apply(NODE_GROUPS, group("gpu"));
    api.apply(NODE_GROUPS, group("cpu"));
    for i in 0..nodes {
        let kind = if i < gpu_nodes { "gpu" } else { "cpu" };
        api.apply(
            NODES,
            json!({"metadata": {"name": format!("node-{i:05}"), "labels": {
                "node-type": kind, "zone": format!("zone-{}", i % 3),
                "kubernetes.io/hostname": format!("node-{i:05}")}}, "spec": {}}),
        );
    }
    for i in 0..n {
        let status: serde_json::Map<String, Value> = (0..4)
            .map(|k| {
                (
                    format!("node-{:05}", (i + k) % gpu_nodes),
                    json!("NodeDownloaded"),
                )
            })
            .collect();
        let mut cache = json!({
            "metadata": {"name": format!("cache-{i}")},
            "spec": {"sourceModelUri": format!("hf://org-{}/model-{i}", i % 1000),
                     "modelSize": "10Gi", "nodeGroups": ["gpu"]},
            "status": {"nodeStatus": status, "copies": {"available": 4, "total": 4}}
        });
        if i % 2 == 0 {
            api.apply(CACHES, cache);
        } else {
            cache["metadata"]["namespace"] = json!(format!("team-{}", i % 100));
            api.apply(NAMESPACE_CACHES, cache);
        }
        api.apply(
            PVCS,
            json!({"metadata": {"name": format!("cache-{i}-gpu"), "namespace": format!("team-{}", (i + 1) % 100)},
                   "spec": {"accessModes": ["ReadOnlyMany"]}, "status": {"phase": "Bound"}}),
        );
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

    let (_, metrics) = get(probe, "/metrics").await.expect("metrics");
    let before = pvc_count(&metrics).expect("the PVC gauge");
    let deleted = Instant::now();
    api.delete(PVCS, Some("team-1"), "cache-0-gpu");
    let seen = loop {
        let (_, metrics) = get(probe, "/metrics").await.expect("metrics");
        if pvc_count(&metrics) == Some(before - 1) {
            break deleted.elapsed();
        }
        anyhow::ensure!(
            deleted.elapsed() < Duration::from_secs(120),
            "never published"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = kib(pid, "VmRSS:");
    println!(
        "serve watching {n} caches, {n} PVCs, {nodes} Nodes: ready after {:.1} s; RSS {:.1} MiB \
         (peak {:.1} MiB); a PVC deletion published after {:.2} s; RSS 2 s later {:.1} MiB",
        ready.as_secs_f64(),
        rss as f64 / 1024.0,
        hwm as f64 / 1024.0,
        seen.as_secs_f64(),
        after as f64 / 1024.0,
    );
    let _ = child.kill();
    let _ = child.wait();
    Ok(())
}
