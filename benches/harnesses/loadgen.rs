//! End-to-end load harness: `serve` against the physical floor of its own transport.
//!
//! ```text
//! cargo run --release --example loadgen                   # the full run (about a minute)
//! cargo run --release --example loadgen -- --requests 2000 --concurrency 1,64 --no-rss
//! ```
//!
//! One run:
//! 1. makes a CA and a `localhost` certificate in a temporary directory with the project's own
//!    certificate code ([`modelgate::cli::certs::ensure_dev_certs`]);
//! 2. starts two child processes (this same executable, re-executed):
//!    - `serve`: exactly `modelgate serve` (this example calls [`modelgate::cli::main`], as the
//!      binary does) with `--no-cluster --caches benches/reviews/caches.json`, on loopback;
//!      its log (one line per admission) goes to a file, as a container's log would;
//!    - `floor`: the same TLS and HTTP stack ([`modelgate::server::serve_router`]: same rustls
//!      configuration, same hyper-util auto builder, same axum router shape, same tokio runtime)
//!      whose `/mutate` reads the body and answers a fixed AdmissionReview without parsing it
//!      (the answer `serve` gives for the same review, computed once at start, so both send the
//!      same bytes);
//! 3. drives both with the same client (hyper over tokio-rustls, kept-alive connections): for
//!    HTTP/1.1, one connection per concurrent request; for HTTP/2, one connection carrying all
//!    concurrent streams (as the API server's Go client does), or `--h2-connections N` sharing
//!    them (serve allows 16 streams per connection); at each concurrency, floor and serve
//!    alternate so that other load on the machine hits both alike (`--protocols h1` or `h2`
//!    measures one protocol only);
//! 4. prints requests/s, p50, p99, p99.9 and the ratios to the floor, and both servers' peak RSS
//!    (`VmHWM` in `/proc/<pid>/status`);
//! 5. starts `serve` again with the cluster state of benches/cache_lookup.rs at 100 000 (100 000
//!    caches with status, 100 000 PVCs, 5 000 Nodes) and reports its RSS once it serves.
//!
//! `--review NAME` picks the review in benches/reviews (default `llm-serving-pod`, as written);
//! a name ending in `-compact` sends that review without whitespace, the bytes the API server
//! sends (`llm-serving-pod-compact`).
//!
//! With `--go-client PATH`, steps 3 to 5 are replaced by running PATH, the Go load generator of
//! `tests/apiserver/src/apiserver/cmd/loadgen` (kube-apiserver's own webhook client), against the
//! two servers: `PATH -serve URL -floor URL -ca FILE -review FILE -serve-pid PID -floor-pid PID`
//! followed by the words of `--go-args`; its output (its own header and a markdown table) is
//! printed as it comes, then both servers' peak RSS. `--requests`, `--warmup`, `--max-seconds`,
//! `--protocols` and `--concurrency` do not apply: the Go client's own flags (`-rounds`,
//! `-seconds`, `-warmup`, `-workers`) go in `--go-args`.
//!
//! Bounded in count (`--requests` per measurement, after `--warmup`) and in time
//! (`--max-seconds` per measurement); loopback only. It is a command, not a test: nothing here
//! fails because the machine is slow.

use std::io::Write as _;
use std::net::{SocketAddr, TcpListener as StdListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use modelgate::admission::{self, Context, Webhook};
use modelgate::config::PolicyConfig;
use modelgate::policy::Caches;
use modelgate::server::tls::TlsFiles;
use rustls::pki_types::ServerName;
use rustls::pki_types::pem::PemObject;
use tokio_rustls::TlsConnector;

#[path = "support/compact_json.rs"]
mod compact_json;

const REVIEWS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/reviews");

// serve runs as this program re-executed (`loadgen serve …`): give it the binary's allocator
// (src/main.rs) so that what is measured is what ships.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    match std::env::args().nth(1).as_deref() {
        // The child processes.
        Some("serve") => modelgate::cli::main(),
        Some("floor") => match floor_main() {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("floor: {e:#}");
                ExitCode::FAILURE
            }
        },
        _ => match driver_main() {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("loadgen: {e:#}");
                ExitCode::FAILURE
            }
        },
    }
}

// ---------------------------------------------------------------------------------------------
// The floor server: `loadgen floor LISTEN CERT KEY REVIEW CACHES`.

fn floor_main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(2).collect();
    let [listen, cert, key, review, caches] = args.as_slice() else {
        bail!("usage: loadgen floor LISTEN CERT KEY REVIEW CACHES");
    };
    let listen: SocketAddr = listen.parse().context("LISTEN")?;
    // The answer serve gives to this review, computed once: the floor sends the same bytes.
    let body = std::fs::read(review).with_context(|| review.clone())?;
    let (index, _) = modelgate::cache::load_files(&[PathBuf::from(caches)])?;
    let config = PolicyConfig::default();
    let ctx = Context {
        config: &config,
        caches: Caches::Ready(&index),
        namespaces: modelgate::namespaces::Namespaces::none(),
        now: None,
    };
    let fixed = Bytes::from(admission::review(Webhook::Mutate, &body, &ctx).body);
    drop(index);

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let answer = move |req: Request| {
            let fixed = fixed.clone();
            async move {
                // Read the body (transport work serve also does) but do not parse it.
                if req.into_body().collect().await.is_err() {
                    return StatusCode::BAD_REQUEST.into_response();
                }
                (
                    StatusCode::OK,
                    [(header::CONTENT_TYPE, "application/json")],
                    Body::from(fixed),
                )
                    .into_response()
            }
        };
        let app = Router::new()
            .route("/mutate", post(answer.clone()))
            .route("/validate", post(answer))
            .route("/healthz", get(|| async { "ok\n" }))
            .fallback(|| async { StatusCode::NOT_FOUND });
        let listener = tokio::net::TcpListener::bind(listen).await?;
        let (_stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let tls = TlsFiles {
            cert: cert.into(),
            key: key.into(),
            client_ca: None,
        };
        modelgate::server::serve_router(listener, tls, app, Duration::from_secs(10), stop_rx)
            .await?;
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------------
// The driver.

struct Options {
    requests: usize,
    warmup: usize,
    max_seconds: u64,
    concurrency: Vec<usize>,
    review: String,
    rss: bool,
    caches_100k: usize,
    /// A command to run serve under (`valgrind --tool=callgrind`), split at spaces.
    serve_prefix: Vec<String>,
    /// The same for the floor, for its instruction count next to serve's.
    floor_prefix: Vec<String>,
    /// `RUST_LOG` for serve (default: unset, so serve's own default `info`: one line per
    /// admission); `warn` measures serve without the admission line.
    serve_log: Option<String>,
    /// The Go load generator to run instead of this program's own client: kube-apiserver's
    /// own client code (tests/apiserver).
    go_client: Option<PathBuf>,
    /// Further arguments for it, split at spaces.
    go_args: Vec<String>,
    /// The protocols measured, in order.
    protocols: Vec<Proto>,
    /// HTTP/2 connections the concurrent streams are spread over (serve allows 16 streams per
    /// connection by default, so 64 streams need 4 connections to be in flight at once).
    h2_connections: usize,
}

fn parse_options() -> anyhow::Result<Options> {
    let mut o = Options {
        requests: 20_000,
        warmup: 1_000,
        max_seconds: 20,
        concurrency: vec![1, 16, 64],
        review: "llm-serving-pod".into(),
        rss: true,
        caches_100k: 100_000,
        serve_prefix: Vec::new(),
        floor_prefix: Vec::new(),
        serve_log: None,
        go_client: None,
        go_args: Vec::new(),
        protocols: vec![Proto::H1, Proto::H2],
        h2_connections: 1,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--requests" => o.requests = value()?.parse()?,
            "--warmup" => o.warmup = value()?.parse()?,
            "--max-seconds" => o.max_seconds = value()?.parse()?,
            "--concurrency" => {
                o.concurrency = value()?
                    .split(',')
                    .map(str::parse)
                    .collect::<Result<_, _>>()?
            }
            "--review" => o.review = value()?,
            "--caches-count" => o.caches_100k = value()?.parse()?,
            "--no-rss" => o.rss = false,
            "--serve-prefix" => {
                o.serve_prefix = value()?.split_whitespace().map(String::from).collect()
            }
            "--floor-prefix" => {
                o.floor_prefix = value()?.split_whitespace().map(String::from).collect()
            }
            "--serve-log" => o.serve_log = Some(value()?),
            "--go-client" => o.go_client = Some(value()?.into()),
            "--go-args" => o.go_args = value()?.split_whitespace().map(String::from).collect(),
            "--protocols" => {
                o.protocols = value()?
                    .split(',')
                    .map(|p| match p {
                        "h1" | "http/1.1" => Ok(Proto::H1),
                        "h2" => Ok(Proto::H2),
                        other => Err(anyhow::anyhow!("--protocols: {other} is not h1 or h2")),
                    })
                    .collect::<Result<_, _>>()?
            }
            "--h2-connections" => o.h2_connections = value()?.parse()?,
            "-h" | "--help" => {
                println!(
                    "usage: loadgen [--requests N] [--warmup N] [--max-seconds S] \
                     [--concurrency 1,16,64] [--protocols h1,h2] [--h2-connections N] \
                     [--review NAME] [--caches-count N] [--no-rss] \
                     [--serve-prefix 'valgrind --tool=callgrind'] [--floor-prefix '…'] \
                     [--serve-log RUST_LOG] \
                     [--go-client PATH [--go-args 'ARGS']]\n\
                     NAME is a file in benches/reviews without .json (default llm-serving-pod)"
                );
                std::process::exit(0);
            }
            other => bail!("unknown argument {other} (try --help)"),
        }
    }
    anyhow::ensure!(
        o.requests > 0 && !o.concurrency.contains(&0) && o.h2_connections > 0,
        "--requests, --concurrency and --h2-connections must be positive"
    );
    Ok(o)
}

/// A child server, killed when dropped.
struct Server {
    name: &'static str,
    child: Child,
    addr: SocketAddr,
    /// Stop it with SIGTERM (twice: the second cuts serve's grace period short) so that a
    /// profiler it runs under writes its output.
    graceful: bool,
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.graceful {
            for _ in 0..2 {
                let _ = Command::new("kill")
                    .args(["-TERM", &self.child.id().to_string()])
                    .status();
                std::thread::sleep(Duration::from_millis(500));
            }
            let _ = self.child.wait();
            return;
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    fn status_kib(&self, field: &str) -> Option<u64> {
        proc_status_kib(self.child.id(), field)
    }
}

/// CPU time (ns) all threads of a process have run, from `/proc/<pid>/task/*/schedstat`;
/// unlike wall time it does not depend on what else the machine runs.
fn cpu_ns(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

fn proc_status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|line| {
        let rest = line.strip_prefix(field)?.strip_prefix(':')?;
        rest.trim().strip_suffix("kB")?.trim().parse().ok()
    })
}

fn free_port() -> anyhow::Result<SocketAddr> {
    Ok(StdListener::bind("127.0.0.1:0")?.local_addr()?)
}

fn log_file(dir: &Path, name: &str) -> anyhow::Result<std::fs::File> {
    Ok(std::fs::File::create(dir.join(format!("{name}.log")))?)
}

fn spawn_serve(
    dir: &Path,
    name: &'static str,
    certs: &modelgate::cli::certs::DevCerts,
    caches: &Path,
    prefix: &[String],
    log: Option<&str>,
) -> anyhow::Result<Server> {
    let addr = free_port()?;
    let probe = free_port()?;
    let mut command = this_executable(prefix)?;
    let child = command
        .args(["serve", "--no-cluster", "--listen"])
        .arg(addr.to_string())
        .arg("--probe-listen")
        .arg(probe.to_string())
        .arg("--tls-cert")
        .arg(&certs.cert)
        .arg("--tls-key")
        .arg(&certs.key)
        .arg("--caches")
        .arg(caches)
        .env_remove("RUST_LOG")
        .envs(log.map(|filter| ("RUST_LOG", filter)))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log_file(dir, name)?)
        .spawn()
        .context("cannot start serve")?;
    Ok(Server {
        name,
        child,
        addr,
        graceful: !prefix.is_empty(),
    })
}

/// This executable, run under `prefix` (a profiler's command line) when one is given.
fn this_executable(prefix: &[String]) -> anyhow::Result<Command> {
    let exe = std::env::current_exe()?;
    Ok(match prefix {
        [] => Command::new(&exe),
        [program, args @ ..] => {
            let mut c = Command::new(program);
            c.args(args).arg(&exe);
            c
        }
    })
}

fn spawn_floor(
    dir: &Path,
    certs: &modelgate::cli::certs::DevCerts,
    review: &Path,
    caches: &Path,
    prefix: &[String],
) -> anyhow::Result<Server> {
    let addr = free_port()?;
    let mut command = this_executable(prefix)?;
    let child = command
        .arg("floor")
        .arg(addr.to_string())
        .arg(&certs.cert)
        .arg(&certs.key)
        .arg(review)
        .arg(caches)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log_file(dir, "floor")?)
        .spawn()
        .context("cannot start the floor server")?;
    Ok(Server {
        name: "floor",
        child,
        addr,
        graceful: !prefix.is_empty(),
    })
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Proto {
    H1,
    H2,
}

impl Proto {
    fn name(self) -> &'static str {
        match self {
            Proto::H1 => "http/1.1",
            Proto::H2 => "h2",
        }
    }
}

/// A client for one server and protocol.
#[derive(Clone)]
struct Client {
    tls: TlsConnector,
    addr: SocketAddr,
    proto: Proto,
}

type ReqBody = Full<Bytes>;

enum Conn {
    H1(hyper::client::conn::http1::SendRequest<ReqBody>),
    H2(hyper::client::conn::http2::SendRequest<ReqBody>),
}

impl Client {
    fn new(ca: &Path, addr: SocketAddr, proto: Proto) -> anyhow::Result<Client> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in rustls::pki_types::CertificateDer::pem_file_iter(ca)? {
            roots.add(cert?)?;
        }
        let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
        config.alpn_protocols = vec![match proto {
            Proto::H1 => b"http/1.1".to_vec(),
            Proto::H2 => b"h2".to_vec(),
        }];
        Ok(Client {
            tls: TlsConnector::from(Arc::new(config)),
            addr,
            proto,
        })
    }

    async fn connect(&self) -> anyhow::Result<Conn> {
        let tcp = tokio::net::TcpStream::connect(self.addr).await?;
        tcp.set_nodelay(true)?;
        let name = ServerName::try_from("localhost")?;
        let tls = self.tls.connect(name, tcp).await?;
        let io = TokioIo::new(tls);
        Ok(match self.proto {
            Proto::H1 => {
                let (send, conn) = hyper::client::conn::http1::handshake(io).await?;
                tokio::spawn(conn);
                Conn::H1(send)
            }
            Proto::H2 => {
                let (send, conn) =
                    hyper::client::conn::http2::handshake(TokioExecutor::new(), io).await?;
                tokio::spawn(conn);
                Conn::H2(send)
            }
        })
    }

    /// Connections for `concurrency` requests in flight; for h2, streams spread round-robin
    /// over `h2_connections` connections.
    async fn connections(
        &self,
        concurrency: usize,
        h2_connections: usize,
    ) -> anyhow::Result<Vec<Conn>> {
        let mut conns = Vec::new();
        match self.proto {
            Proto::H1 => {
                for _ in 0..concurrency {
                    conns.push(self.connect().await?);
                }
            }
            Proto::H2 => {
                let mut sends = Vec::new();
                for _ in 0..h2_connections.min(concurrency) {
                    let Conn::H2(send) = self.connect().await? else {
                        unreachable!()
                    };
                    sends.push(send);
                }
                for i in 0..concurrency {
                    conns.push(Conn::H2(sends[i % sends.len()].clone()));
                }
            }
        }
        Ok(conns)
    }
}

/// Sends one review and reads the whole answer; returns whether it was a 200.
async fn send(conn: &mut Conn, addr: SocketAddr, body: &Bytes) -> anyhow::Result<bool> {
    let builder = hyper::Request::post(format!("https://localhost:{}/mutate", addr.port()))
        .header(header::CONTENT_TYPE, "application/json");
    let response = match conn {
        Conn::H1(send) => {
            let req = builder
                .header(header::HOST, "localhost")
                .body(Full::new(body.clone()))?;
            send.ready().await?;
            send.send_request(req).await?
        }
        Conn::H2(send) => {
            let req = builder.body(Full::new(body.clone()))?;
            send.ready().await?;
            send.send_request(req).await?
        }
    };
    let ok = response.status() == StatusCode::OK;
    let answer = response.into_body().collect().await?.to_bytes();
    Ok(ok && !answer.is_empty())
}

struct Measured {
    /// CPU time per answered request, server and client (µs).
    server_cpu_us: f64,
    client_cpu_us: f64,
    requests: usize,
    errors: usize,
    seconds: f64,
    latencies: Vec<u64>,
    timed_out: bool,
}

impl Measured {
    fn rps(&self) -> f64 {
        self.requests as f64 / self.seconds
    }

    /// Latency at quantile `q`, in microseconds (nearest rank).
    fn quantile_us(&self, q: f64) -> f64 {
        if self.latencies.is_empty() {
            return f64::NAN;
        }
        let rank =
            ((q * self.latencies.len() as f64).ceil() as usize).clamp(1, self.latencies.len());
        self.latencies[rank - 1] as f64 / 1e3
    }
}

/// `total` requests over `conns`, one task per connection (stream, for h2), at most `limit`;
/// gives the connections back.
async fn drive(
    conns: Vec<Conn>,
    addr: SocketAddr,
    body: &Bytes,
    total: usize,
    limit: Duration,
) -> anyhow::Result<(Measured, Vec<Conn>)> {
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let deadline = start + limit;
    let mut tasks = Vec::new();
    for mut conn in conns {
        let next = next.clone();
        let body = body.clone();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::with_capacity(total / 8 + 1);
            let mut errors = 0usize;
            while next.fetch_add(1, Ordering::Relaxed) < total {
                let sent = Instant::now();
                if sent > deadline {
                    return (latencies, errors, true, conn);
                }
                match tokio::time::timeout(Duration::from_secs(10), send(&mut conn, addr, &body))
                    .await
                {
                    Ok(Ok(true)) => latencies.push(sent.elapsed().as_nanos() as u64),
                    _ => errors += 1,
                }
            }
            (latencies, errors, false, conn)
        }));
    }
    let mut measured = Measured {
        requests: 0,
        errors: 0,
        seconds: 0.0,
        server_cpu_us: 0.0,
        client_cpu_us: 0.0,
        latencies: Vec::with_capacity(total),
        timed_out: false,
    };
    let mut conns = Vec::new();
    for task in tasks {
        let (latencies, errors, timed_out, conn) = task.await?;
        conns.push(conn);
        measured.latencies.extend(latencies);
        measured.errors += errors;
        measured.timed_out |= timed_out;
    }
    measured.seconds = start.elapsed().as_secs_f64();
    measured.requests = measured.latencies.len();
    measured.latencies.sort_unstable();
    Ok((measured, conns))
}

async fn scenario(
    server_pid: u32,
    client: &Client,
    concurrency: usize,
    body: &Bytes,
    o: &Options,
) -> anyhow::Result<Measured> {
    let conns = client.connections(concurrency, o.h2_connections).await?;
    // Warm up on the same connections (TLS sessions, allocator, caches), then measure.
    let limit = Duration::from_secs(o.max_seconds);
    let (_, conns) = drive(conns, client.addr, body, o.warmup, limit).await?;
    let (server0, client0) = (cpu_ns(server_pid), cpu_ns(std::process::id()));
    let (mut measured, _) = drive(conns, client.addr, body, o.requests, limit).await?;
    let n = measured.requests.max(1) as f64;
    measured.server_cpu_us = (cpu_ns(server_pid) - server0) as f64 / 1e3 / n;
    measured.client_cpu_us = (cpu_ns(std::process::id()) - client0) as f64 / 1e3 / n;
    Ok(measured)
}

async fn wait_until_serving(client: &Client, within: Duration) -> anyhow::Result<Duration> {
    let start = Instant::now();
    loop {
        // A malformed review gets 400 from serve and 200 from the floor: either means serving.
        if let Ok(mut conn) = client.connect().await
            && tokio::time::timeout(
                Duration::from_secs(5),
                send(&mut conn, client.addr, &Bytes::from_static(b"{}")),
            )
            .await
            .is_ok_and(|answered| answered.is_ok())
        {
            return Ok(start.elapsed());
        }
        if start.elapsed() > within {
            bail!("{} did not answer within {within:?}", client.addr);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

fn mib(kib: Option<u64>) -> String {
    kib.map(|k| format!("{:.1} MiB", k as f64 / 1024.0))
        .unwrap_or_else(|| "?".into())
}

fn driver_main() -> anyhow::Result<()> {
    let o = parse_options()?;
    let dir = tempfile::tempdir()?;
    let certs = modelgate::cli::certs::ensure_dev_certs(&dir.path().join("certs"))?;
    // The servers and the Go client read the review from a file: the bytes this client sends.
    let body = Bytes::from(
        compact_json::read_review(Path::new(REVIEWS), &o.review)
            .with_context(|| format!("review {} in {REVIEWS}", o.review))?,
    );
    // Named after the review: the Go client's header names the file it sends.
    let review_path = dir.path().join(format!("{}.json", o.review));
    std::fs::write(&review_path, &body)?;
    let caches_path = Path::new(REVIEWS).join("caches.json");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());

    // The Go client prints its own header (the review, its rounds and seconds, the load);
    // this one's counts and limits do not apply to it.
    if o.go_client.is_none() {
        println!(
            "modelgate loadgen: review {} ({} bytes), {} requests per measurement after {} \
             warm-up, at most {} s each; {cpus} CPUs; load average before: {}",
            o.review,
            body.len(),
            o.requests,
            o.warmup,
            o.max_seconds,
            load_average()
        );
    }
    let serve = spawn_serve(
        dir.path(),
        "serve",
        &certs,
        &caches_path,
        &o.serve_prefix,
        o.serve_log.as_deref(),
    )?;
    let floor = spawn_floor(
        dir.path(),
        &certs,
        &review_path,
        &caches_path,
        &o.floor_prefix,
    )?;

    runtime.block_on(async {
        for server in [&floor, &serve] {
            let client = Client::new(&certs.ca, server.addr, Proto::H1)?;
            wait_until_serving(&client, Duration::from_secs(30))
                .await
                .with_context(|| server.name)?;
        }
        anyhow::Ok(())
    })?;
    if let Some(go) = &o.go_client {
        // kube-apiserver's client drives the same two servers.
        let url = |s: &Server| format!("https://localhost:{}/mutate", s.addr.port());
        let status = Command::new(go)
            .arg("-serve")
            .arg(url(&serve))
            .arg("-floor")
            .arg(url(&floor))
            .arg("-ca")
            .arg(&certs.ca)
            .arg("-review")
            .arg(&review_path)
            .arg("-serve-pid")
            .arg(serve.child.id().to_string())
            .arg("-floor-pid")
            .arg(floor.child.id().to_string())
            .args(&o.go_args)
            .status()
            .with_context(|| go.display().to_string())?;
        // What the Go client cannot see: the servers' memory.
        println!(
            "\npeak RSS (VmHWM): serve {}, floor {}",
            mib(serve.status_kib("VmHWM")),
            mib(floor.status_kib("VmHWM"))
        );
        drop(serve);
        drop(floor);
        anyhow::ensure!(status.success(), "{}: {status}", go.display());
        return Ok(());
    }
    let rows = runtime.block_on(async {
        let mut rows = Vec::new();
        for &proto in &o.protocols {
            for &c in &o.concurrency {
                let mut pair = Vec::new();
                for server in [&floor, &serve] {
                    let client = Client::new(&certs.ca, server.addr, proto)?;
                    let m = scenario(server.child.id(), &client, c, &body, &o).await?;
                    pair.push(m);
                }
                let serve_m = pair.pop().unwrap_or_else(|| unreachable!());
                let floor_m = pair.pop().unwrap_or_else(|| unreachable!());
                rows.push((proto, c, floor_m, serve_m));
            }
        }
        anyhow::Ok(rows)
    })?;
    let load_after = load_average();
    let serve_hwm = serve.status_kib("VmHWM");
    let floor_hwm = floor.status_kib("VmHWM");
    drop(serve);
    drop(floor);

    println!();
    println!(
        "| protocol | conc | server | req/s | p50 µs | p99 µs | p99.9 µs | req/s ÷ floor | p50 − floor µs | p99 ÷ floor | server CPU µs/req | client CPU µs/req | CPU-bound req/s ÷ floor |"
    );
    println!("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut out = std::io::stdout().lock();
    for (proto, c, f, s) in &rows {
        let c = match proto {
            Proto::H2 if o.h2_connections > 1 => {
                format!(
                    "{}×{}",
                    o.h2_connections.min(*c),
                    c.div_ceil(o.h2_connections)
                )
            }
            _ => c.to_string(),
        };
        for (name, m) in [("floor", f), ("serve", s)] {
            let note = match (m.errors, m.timed_out) {
                (0, false) => String::new(),
                (e, t) => format!(
                    " ({e} errors{})",
                    if t { ", stopped at --max-seconds" } else { "" }
                ),
            };
            // With the cores to themselves, server and client would share them: the
            // throughput the CPU allows is inversely proportional to their CPU per request.
            let cpu = |m: &Measured| m.server_cpu_us + m.client_cpu_us;
            let (ratio, dp50, rp99, rcpu) = if name == "serve" {
                (
                    format!("{:.2}", s.rps() / f.rps()),
                    format!("{:+.0}", s.quantile_us(0.5) - f.quantile_us(0.5)),
                    format!("{:.2}", s.quantile_us(0.99) / f.quantile_us(0.99)),
                    format!("{:.2}", cpu(f) / cpu(s)),
                )
            } else {
                Default::default()
            };
            writeln!(
                out,
                "| {} | {c} | {name}{note} | {:.0} | {:.0} | {:.0} | {:.0} | {ratio} | {dp50} | {rp99} | {:.1} | {:.1} | {rcpu} |",
                proto.name(),
                m.rps(),
                m.quantile_us(0.5),
                m.quantile_us(0.99),
                m.quantile_us(0.999),
                m.server_cpu_us,
                m.client_cpu_us,
            )?;
        }
    }
    drop(out);
    println!();
    println!(
        "peak RSS (VmHWM): serve {}, floor {}; load average after: {load_after}",
        mib(serve_hwm),
        mib(floor_hwm)
    );

    if o.rss {
        rss_with_many_caches(dir.path(), &certs, &body, o.caches_100k, &runtime)?;
    }
    Ok(())
}

/// Writes the cluster state of benches/cache_lookup.rs at size `n` — `n` caches (half
/// cluster-wide, half over 100 namespaces) each downloaded on four Nodes, `n` PVCs, `n / 20`
/// Nodes in two node groups — starts serve on it, sends a few reviews and reports its memory.
fn rss_with_many_caches(
    dir: &Path,
    certs: &modelgate::cli::certs::DevCerts,
    body: &Bytes,
    n: usize,
    runtime: &tokio::runtime::Runtime,
) -> anyhow::Result<()> {
    let path = dir.join("caches-many.json");
    let mut file = std::io::BufWriter::new(std::fs::File::create(&path)?);
    let nodes = (n / 20).max(4);
    let gpu_nodes = nodes / 2;
    write!(file, r#"{{"apiVersion":"v1","kind":"List","items":["#)?;
    for group in ["gpu", "cpu"] {
        write!(
            file,
            r#"{{"apiVersion":"serving.kserve.io/v1alpha1","kind":"LocalModelNodeGroup","metadata":{{"name":"{group}"}},"spec":{{"storageLimit":"100Gi","persistentVolumeSpec":{{"capacity":{{"storage":"100Gi"}},"local":{{"path":"/models"}},"nodeAffinity":{{"required":{{"nodeSelectorTerms":[{{"matchExpressions":[{{"key":"node-type","operator":"In","values":["{group}"]}}]}}]}}}}}}}}}},"#
        )?;
    }
    for i in 0..nodes {
        let kind = if i < gpu_nodes { "gpu" } else { "cpu" };
        write!(
            file,
            r#"{{"apiVersion":"v1","kind":"Node","metadata":{{"name":"node-{i:05}","labels":{{"node-type":"{kind}","zone":"zone-{}","kubernetes.io/hostname":"node-{i:05}"}}}}}},"#,
            i % 3
        )?;
    }
    for i in 0..n {
        let (kind, namespace) = if i % 2 == 0 {
            ("LocalModelCache", String::new())
        } else {
            (
                "LocalModelNamespaceCache",
                format!(r#","namespace":"team-{}""#, i % 100),
            )
        };
        let status: Vec<String> = (0..4)
            .map(|k| format!(r#""node-{:05}":"NodeDownloaded""#, (i + k) % gpu_nodes))
            .collect();
        write!(
            file,
            r#"{{"apiVersion":"serving.kserve.io/v1alpha1","kind":"{kind}","metadata":{{"name":"cache-{i}"{namespace}}},"spec":{{"sourceModelUri":"hf://org-{}/model-{i}","modelSize":"10Gi","nodeGroups":["gpu"]}},"status":{{"nodeStatus":{{{}}},"copies":{{"available":4,"total":4}}}}}},"#,
            i % 1000,
            status.join(",")
        )?;
        write!(
            file,
            r#"{{"apiVersion":"v1","kind":"PersistentVolumeClaim","metadata":{{"name":"cache-{i}-gpu","namespace":"team-{}"}},"status":{{"phase":"Bound"}}}}"#,
            (i + 1) % 100
        )?;
        if i + 1 < n {
            write!(file, ",")?;
        }
    }
    write!(file, "]}}")?;
    file.flush()?;
    drop(file);
    let size = std::fs::metadata(&path)?.len();

    let started = Instant::now();
    let serve = spawn_serve(dir, "serve-many", certs, &path, &[], None)?;
    let pid = serve.child.id();
    let (ready, errors) = runtime.block_on(async {
        let client = Client::new(&certs.ca, serve.addr, Proto::H1)?;
        wait_until_serving(&client, Duration::from_secs(120)).await?;
        let ready = started.elapsed();
        let mut conn = client.connect().await?;
        let mut errors = 0;
        for _ in 0..1000 {
            if !send(&mut conn, serve.addr, body).await? {
                errors += 1;
            }
        }
        anyhow::Ok((ready, errors))
    })?;
    println!(
        "serve with {n} caches, {n} PVCs, {nodes} Nodes ({:.1} MiB of JSON): serving after {:.2} s; \
         after 1 000 reviews ({errors} not 200): RSS {} (VmRSS), peak {} (VmHWM)",
        size as f64 / (1024.0 * 1024.0),
        ready.as_secs_f64(),
        mib(proc_status_kib(pid, "VmRSS")),
        mib(proc_status_kib(pid, "VmHWM")),
    );
    Ok(())
}
