//! Resident memory of `serve` holding `--max-connections` connections (the memory
//! formula of docs/security.md).
//!
//! ```text
//! cargo run --example connection_cap_rss                           # serve as built with this example (debug)
//! cargo run --release --example connection_cap_rss                 # the release profile
//! cargo run --example connection_cap_rss -- --bin target/debug/modelgate --connections 1024 --scenarios h1,h2-full
//! ```
//!
//! Each scenario starts a fresh `serve` (this executable re-executed as `serve`, with the
//! binary's allocator, or `--bin PATH`) with `--max-connections C`, `--no-cluster`, and timeouts
//! long enough that nothing is closed while it is measured; warms it up with one request per
//! protocol; reads its `VmRSS` (the base); opens the connections; waits a second; and reads
//! `VmRSS` and `VmHWM` again, `modelgate_open_connections` to check that the server still
//! holds them all, and the bytes queued in the kernel buffers of the server's sockets
//! (`/proc/net/tcp`, receive and send queues; socket memory is charged to the container's
//! memory cgroup, not to RSS):
//!
//! - `h1`: C TLS HTTP/1.1 connections, each after one `/mutate` of the LLM pod review
//!   (benches/reviews/llm-serving-pod.json), kept alive and idle: kube-apiserver's connections
//!   after a burst (it speaks HTTP/1.1 only to webhooks);
//! - `tls`: C TLS connections (ALPN `http/1.1`) with the handshake done and no request yet;
//! - `h1-full`: C TLS HTTP/1.1 connections, each with a request head of nearly 8 KiB and half of
//!   a 1 MiB body sent: the 4 that get an in-flight slot stall on the missing half, the others
//!   wait for a slot: what an HTTP/1.1 client can make the server hold (the body beyond hyper's
//!   8 KiB read buffer stays in the server's kernel receive buffer, then in the client's);
//! - `h2`: C HTTP/2 connections, each after one `/mutate`, idle;
//! - `h2-full`: the formula's worst case for HTTP/2, written as raw frames: C connections, each
//!   with `--max-concurrent-streams` (16) streams whose headers decode to nearly
//!   `--max-header-list-bytes` (8 KiB) and whose bodies (content-length 1 MiB) have sent one
//!   16 KiB DATA frame each: 256 KiB per connection, the whole h2 connection window, which stays
//!   buffered while the streams wait for one of the 4 in-flight slots.
//!
//! It is a measuring command, not a test: it prints figures and fails only when the server does
//! not hold the connections.

use std::net::{SocketAddr, TcpListener as StdListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

// serve runs as this program re-executed (`connection_cap_rss serve …`): give it the binary's
// allocator (src/main.rs) so that what is measured is what ships.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const REVIEW: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/benches/reviews/llm-serving-pod.json"
);
/// Connections opening at once.
const OPENING: usize = 64;

fn main() -> ExitCode {
    if std::env::args().nth(1).as_deref() == Some("serve") {
        return modelgate::cli::main();
    }
    match driver() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("connection_cap_rss: {e:#}");
            ExitCode::FAILURE
        }
    }
}

struct Options {
    connections: usize,
    scenarios: Vec<String>,
    bin: Option<PathBuf>,
}

fn options() -> anyhow::Result<Options> {
    let mut o = Options {
        connections: 1024,
        scenarios: ["tls", "h1", "h1-full", "h2", "h2-full"]
            .map(String::from)
            .to_vec(),
        bin: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            "--connections" => o.connections = value()?.parse()?,
            "--scenarios" => o.scenarios = value()?.split(',').map(String::from).collect(),
            "--bin" => o.bin = Some(value()?.into()),
            _ => bail!(
                "usage: connection_cap_rss [--connections N] [--scenarios tls,h1,h1-full,h2,h2-full] [--bin PATH]"
            ),
        }
    }
    Ok(o)
}

struct Serve {
    child: Child,
    addr: SocketAddr,
    probe: SocketAddr,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> anyhow::Result<SocketAddr> {
    Ok(StdListener::bind("127.0.0.1:0")?.local_addr()?)
}

fn spawn_serve(
    o: &Options,
    certs: &modelgate::cli::certs::DevCerts,
    log: &Path,
) -> anyhow::Result<Serve> {
    let (addr, probe) = (free_port()?, free_port()?);
    let mut command = match &o.bin {
        Some(bin) => Command::new(bin),
        None => Command::new(std::env::current_exe()?),
    };
    let child = command
        .args(["serve", "--no-cluster", "--log-format=json"])
        .arg(format!("--listen={addr}"))
        .arg(format!("--probe-listen={probe}"))
        .arg("--tls-cert")
        .arg(&certs.cert)
        .arg("--tls-key")
        .arg(&certs.key)
        .arg(format!("--max-connections={}", o.connections))
        // Nothing is closed while it is measured.
        .args([
            "--idle-timeout=600s",
            "--header-read-timeout=600s",
            "--body-progress-timeout=30s",
            "--min-body-bytes-per-second=1",
        ])
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log)?)
        .spawn()
        .context("cannot start serve")?;
    Ok(Serve { child, addr, probe })
}

fn status_kib(pid: u32, field: &str) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .with_context(|| format!("{field} in /proc/{pid}/status"))
}

/// GET on the probe listener: the body, if the status is 200.
async fn probe_get(probe: SocketAddr, path: &str) -> Option<String> {
    let mut tcp = TcpStream::connect(probe).await.ok()?;
    tcp.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .ok()?;
    let mut out = String::new();
    tcp.read_to_string(&mut out).await.ok()?;
    let (head, body) = out.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200").then(|| body.to_string())
}

/// Bytes in the receive and send queues of the sockets whose local port is `port`
/// (`/proc/net/tcp`: `tx_queue:rx_queue` in hex).
fn kernel_queues(port: u16) -> (u64, u64) {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    let (mut rx, mut tx) = (0, 0);
    for line in table.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        let Some(local_port) = f
            .get(1)
            .and_then(|a| a.rsplit_once(':'))
            .and_then(|(_, p)| u16::from_str_radix(p, 16).ok())
        else {
            continue;
        };
        if local_port != port {
            continue;
        }
        if let Some((t, r)) = f.get(4).and_then(|q| q.split_once(':')) {
            tx += u64::from_str_radix(t, 16).unwrap_or(0);
            rx += u64::from_str_radix(r, 16).unwrap_or(0);
        }
    }
    (rx, tx)
}

fn dropped(metrics: &str) -> Vec<&str> {
    metrics
        .lines()
        .filter(|l| {
            l.starts_with("modelgate_connections_dropped_total")
                || l.starts_with("modelgate_admission_errors_total")
                || l.starts_with("modelgate_inflight_requests")
        })
        .collect()
}

fn open_connections(metrics: &str) -> Option<u64> {
    metrics.lines().find_map(|l| {
        l.strip_prefix("modelgate_open_connections ")
            .and_then(|v| v.trim().parse().ok())
    })
}

fn tls_config(ca: &Path, alpn: &[u8]) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_file(ca).context("CA")?)?;
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![alpn.to_vec()];
    Ok(Arc::new(config))
}

async fn tls(
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
) -> anyhow::Result<TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    Ok(TlsConnector::from(config)
        .connect(ServerName::try_from("localhost")?, tcp)
        .await?)
}

fn mutate(addr: SocketAddr, body: &Bytes, h2: bool) -> Request<Full<Bytes>> {
    let builder = Request::post(if h2 {
        format!("https://localhost:{}/mutate?timeout=10s", addr.port())
    } else {
        "/mutate?timeout=10s".to_string()
    });
    let builder = if h2 {
        builder
    } else {
        builder.header("host", format!("localhost:{}", addr.port()))
    };
    builder
        .header("content-type", "application/json")
        .body(Full::new(body.clone()))
        .unwrap()
}

/// What one connection leaves open: dropped at the end of the scenario.
type Held = Box<dyn std::any::Any + Send>;

/// One connection of `scenario`, left open.
async fn open(scenario: &str, addr: SocketAddr, ca: &Path, body: &Bytes) -> anyhow::Result<Held> {
    match scenario {
        "tls" => Ok(Box::new(tls(addr, tls_config(ca, b"http/1.1")?).await?)),
        "h1" => {
            let io = TokioIo::new(tls(addr, tls_config(ca, b"http/1.1")?).await?);
            let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await?;
            let task = tokio::spawn(conn);
            let resp = sender.send_request(mutate(addr, body, false)).await?;
            anyhow::ensure!(resp.status() == 200, "HTTP {}", resp.status());
            resp.into_body().collect().await?;
            Ok(Box::new((sender, task)))
        }
        "h2" => {
            let io = TokioIo::new(tls(addr, tls_config(ca, b"h2")?).await?);
            let (mut sender, conn) =
                hyper::client::conn::http2::handshake(TokioExecutor::new(), io).await?;
            let task = tokio::spawn(conn);
            let resp = sender.send_request(mutate(addr, body, true)).await?;
            anyhow::ensure!(resp.status() == 200, "HTTP {}", resp.status());
            resp.into_body().collect().await?;
            Ok(Box::new((sender, task)))
        }
        "h2-full" => h2_full(addr, tls_config(ca, b"h2")?).await,
        "h1-full" => {
            let mut stream = tls(addr, tls_config(ca, b"http/1.1")?).await?;
            let out = format!(
                "POST /mutate?timeout=30s HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
                 Content-Length: 1048576\r\nX-Pad: {}\r\n\r\n",
                "a".repeat(7900)
            )
            .into_bytes();
            // Half the body, never the rest: the four requests that get a slot stall on it
            // (and keep their slots), the others wait for one. What the server does not read
            // stays in its kernel receive buffer, the rest in this client's send buffer.
            stream.write_all(&out).await?;
            let writing = tokio::spawn(async move {
                let _ = stream.write_all(&vec![b' '; 1 << 19]).await;
                stream
            });
            Ok(Box::new(writing))
        }
        other => bail!("unknown scenario {other}"),
    }
}

// Raw HTTP/2, written as tests/hostile_clients.rs writes it.
#[path = "../../tests/support/h2_frames.rs"]
mod frame;

const STREAMS: u32 = 16;
const DATA_PER_STREAM: usize = 16 * 1024;

/// 16 streams whose headers decode to just under 8 KiB, each with 16 KiB of a 1 MiB body sent.
async fn h2_full(addr: SocketAddr, config: Arc<rustls::ClientConfig>) -> anyhow::Result<Held> {
    let stream = tls(addr, config).await?;
    let (mut reader, mut writer) = tokio::io::split(stream);
    let mut out = frame::preface(&[]);
    writer.write_all(&out).await?;
    // The bodies below fill the connection window the server opens (256 KiB) with its first
    // WINDOW_UPDATE: read its frames up to that one (acknowledging its SETTINGS), then only
    // drain.
    let mut window_opened = false;
    while !window_opened {
        let mut head = [0u8; 9];
        reader.read_exact(&mut head).await?;
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let mut payload = vec![0u8; len];
        reader.read_exact(&mut payload).await?;
        let stream_id = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        match (head[3], head[4] & frame::ACK, stream_id) {
            (frame::SETTINGS, 0, 0) => {
                let mut ack = Vec::new();
                frame::frame(&mut ack, frame::SETTINGS, frame::ACK, 0, &[]);
                writer.write_all(&ack).await?;
            }
            (frame::WINDOW_UPDATE, _, 0) => window_opened = true,
            _ => {}
        }
    }
    let reading = tokio::spawn(async move {
        let mut buf = vec![0u8; 16 * 1024];
        while let Ok(n) = reader.read(&mut buf).await {
            if n == 0 {
                break;
            }
        }
        reader
    });
    out.clear();
    let mut block = vec![0x83, 0x87]; // :method POST, :scheme https
    frame::literal(&mut block, b":path", b"/mutate?timeout=30s");
    frame::literal(&mut block, b":authority", b"localhost");
    frame::literal(&mut block, b"content-type", b"application/json");
    frame::literal(&mut block, b"content-length", b"1048576");
    // Decoded size (RFC 7541 §4.1: name + value + 32 each) just under 8 KiB.
    frame::literal(&mut block, b"x-pad", &vec![b'a'; 7700]);
    let data = vec![b' '; DATA_PER_STREAM];
    for i in 0..STREAMS {
        let id = 1 + 2 * i;
        frame::frame(&mut out, frame::HEADERS, frame::END_HEADERS, id, &block);
        frame::frame(&mut out, frame::DATA, 0, id, &data);
    }
    writer.write_all(&out).await?;
    Ok(Box::new((writer, reading)))
}

async fn scenario(
    name: &str,
    o: &Options,
    certs: &modelgate::cli::certs::DevCerts,
    dir: &Path,
    body: &Bytes,
) -> anyhow::Result<()> {
    let serve = spawn_serve(o, certs, &dir.join(format!("serve-{name}.log")))?;
    let pid = serve.child.id();
    let ready = Instant::now() + Duration::from_secs(60);
    while probe_get(serve.probe, "/readyz").await.is_none() {
        anyhow::ensure!(Instant::now() < ready, "serve did not become ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Warm-up: one request per protocol, on connections closed again.
    for warm in ["h1", "h2"] {
        drop(open(warm, serve.addr, &certs.ca, body).await?);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let base = status_kib(pid, "VmRSS:")?;

    let started = Instant::now();
    let gate = Arc::new(tokio::sync::Semaphore::new(OPENING));
    let mut tasks = Vec::new();
    for _ in 0..o.connections {
        let (gate, name, addr, ca, body) = (
            gate.clone(),
            name.to_string(),
            serve.addr,
            certs.ca.clone(),
            body.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let _turn = gate.acquire().await?;
            open(&name, addr, &ca, &body).await
        }));
    }
    let mut held = Vec::new();
    let mut failed = Vec::new();
    for t in tasks {
        match t.await? {
            Ok(h) => held.push(h),
            Err(e) => failed.push(e.to_string()),
        }
    }
    let opening = started.elapsed();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss = status_kib(pid, "VmRSS:")?;
    let hwm = status_kib(pid, "VmHWM:")?;
    let metrics = probe_get(serve.probe, "/metrics").await.unwrap_or_default();
    let open_now = open_connections(&metrics);
    let (rx, tx) = kernel_queues(serve.addr.port());
    let per = (rss.saturating_sub(base)) as f64 / held.len().max(1) as f64;
    println!(
        "| {name} | {} | {:.1} MiB | {:.1} MiB | {:.1} MiB | {:.1} KiB | {:.1} MiB / {:.1} MiB | {} | {opening:.1?} |",
        held.len(),
        base as f64 / 1024.0,
        rss as f64 / 1024.0,
        hwm as f64 / 1024.0,
        per,
        rx as f64 / (1024.0 * 1024.0),
        tx as f64 / (1024.0 * 1024.0),
        open_now.map_or("?".into(), |n| n.to_string()),
    );
    for line in dropped(&metrics) {
        println!("  {name}: {line}");
    }
    if !failed.is_empty() {
        bail!(
            "{name}: {} connections failed, e.g. {:?}",
            failed.len(),
            &failed[..failed.len().min(3)]
        );
    }
    anyhow::ensure!(
        open_now == Some(o.connections as u64),
        "{name}: serve holds {open_now:?} connections of {}",
        o.connections
    );
    drop(held);
    Ok(())
}

fn driver() -> anyhow::Result<()> {
    let o = options()?;
    modelgate::server::limits::raise_open_files_limit().context("open-files limit")?;
    let dir = tempfile::tempdir()?;
    let certs = modelgate::cli::certs::ensure_dev_certs(&dir.path().join("certs"))?;
    let body = Bytes::from(std::fs::read(REVIEW).context(REVIEW)?);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    println!(
        "serve: {}; --max-connections={}; review {} bytes; {} build of this tool",
        o.bin
            .as_ref()
            .map_or("this executable re-executed".into(), |b| b
                .display()
                .to_string()),
        o.connections,
        body.len(),
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
    );
    println!(
        "| scenario | connections | base RSS | RSS holding them | peak (VmHWM) | per connection | kernel queues (receive / send) | open (metrics) | opening took |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    runtime.block_on(async {
        for name in &o.scenarios {
            scenario(name, &o, &certs, dir.path(), &body).await?;
        }
        anyhow::Ok(())
    })
}
