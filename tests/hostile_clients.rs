//! Hostile clients against the real `serve` binary over TLS. Each test runs one attack for a
//! few seconds while a well-behaved client keeps calling `/mutate` as kube-apiserver does (an
//! LLM-pod review at a time on each of four kept-alive HTTP/1.1 connections, opened before the
//! attack: the API server speaks HTTP/1.1 only to webhooks), then checks:
//!
//! - the well-behaved client got every answer, each identical to the answer before the attack
//!   (its uid aside), with p99 latency under half the chart's webhook timeout;
//! - the peak RSS of `serve` (VmHWM in /proc) stayed under 200 MiB;
//! - `serve` is ready afterwards and serves a new connection;
//! - the limit that stops the attack was counted (`modelgate_connections_dropped_total` or
//!   `modelgate_admission_errors_total`, by reason, or `modelgate_accept_paused_total`).
//!
//! At `--max-connections` the server stops accepting, and new connections wait in the kernel's
//! listen backlog (kube-apiserver does not retry a call whose connection is closed under it).
//! The attacks that reach the cap therefore also check, from `/metrics` sampled during the
//! attack, that the server never held more than the cap, and, from the client side, that no
//! connection was accepted and then closed at the cap, and that a new HTTP/1.1 client arriving
//! while the cap is full (the API server's connection beyond its pool) gets its answer.
//!
//! The attacks write raw HTTP/2 frames (helpers below), since a well-behaved client library
//! cannot send them. Tests run one at a time (they compete for the same CPUs otherwise).
//! docs/security.md lists each attack, its limit and the figures.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::admissions::*;
use common::*;
use hyper::StatusCode;
use modelgate::server::limits::DEFAULT_MAX_CONNECTIONS;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

const MAX_RSS_KIB: u64 = 200 * 1024;
/// Half the chart's webhook `timeoutSeconds` (5 s): an answer this late still reaches the API
/// server with room to spare on a loaded 2-core machine, while a starved client, waiting out
/// the whole attack, is far beyond it.
const MAX_P99: Duration = Duration::from_millis(2500);
/// How long each attack keeps going.
const ATTACK: Duration = Duration::from_secs(3);
/// The well-behaved client's requests in flight, one per HTTP/1.1 connection.
const LEGIT_IN_FLIGHT: usize = 4;
/// Its `?timeout=`, and how long it waits for an answer.
const LEGIT_TIMEOUT: Duration = Duration::from_secs(10);

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

// ---------------------------------------------------------------------------------------------
// Raw HTTP/2 frames and HPACK literals.

#[path = "support/h2_frames.rs"]
mod frame;

/// A TLS connection to the webhook listener, offering `proto` by ALPN.
async fn tls(t: &Target, proto: Proto) -> std::io::Result<TlsStream<TcpStream>> {
    tls_over(t, proto, TcpStream::connect(t.addr).await?).await
}

async fn tls_over(
    t: &Target,
    proto: Proto,
    tcp: TcpStream,
) -> std::io::Result<TlsStream<TcpStream>> {
    let config = match proto {
        Proto::H1 => t.h1.clone(),
        Proto::H2 => t.h2.clone(),
    };
    tokio_rustls::TlsConnector::from(config)
        .connect("localhost".try_into().unwrap(), tcp)
        .await
}

/// Reads and discards what the server sends until it closes; aborting the task drops the read
/// half (the connection closes once the write half is dropped too).
fn drain<R: tokio::io::AsyncRead + Unpin + Send + 'static>(
    mut reader: R,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n) = reader.read(&mut buf).await {
            if n == 0 {
                break;
            }
        }
    })
}

/// Whether the server closed `tcp` (EOF or reset), reading and discarding whatever it sent
/// (an attack connection's bytes are of no further use).
fn closed_by_server(tcp: &TcpStream) -> bool {
    let mut buf = [0u8; 16 * 1024];
    loop {
        match tcp.try_read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return false,
            Err(_) => return true,
        }
    }
}

/// How the attack connections that may meet the cap came out: established (TCP, or TLS where
/// the attack does a handshake), still waiting for the server when the attack gave up on them
/// (in the listen backlog, or their SYN dropped by the full backlog and retried), or failed.
/// At the cap nothing may fail: before the change, a connection beyond `--max-connections` was
/// accepted and closed at once.
#[derive(Default, Debug)]
struct Arrivals {
    established: usize,
    waited: usize,
    failed: Vec<String>,
}

impl Arrivals {
    fn count<T, E: std::fmt::Display>(
        &mut self,
        result: Result<Result<T, E>, tokio::time::error::Elapsed>,
    ) -> Option<T> {
        match result {
            Ok(Ok(t)) => {
                self.established += 1;
                Some(t)
            }
            Ok(Err(e)) => {
                self.failed.push(e.to_string());
                None
            }
            Err(_) => {
                self.waited += 1;
                None
            }
        }
    }

    fn assert_none_failed(&self, what: &str) {
        assert!(
            self.failed.is_empty(),
            "{what}: {} connections failed instead of waiting, e.g. {:?} ({} established, {} waited)",
            self.failed.len(),
            &self.failed[..self.failed.len().min(3)],
            self.established,
            self.waited
        );
    }
}

/// A well-behaved HTTP/1.1 client that opens a new connection while the cap is full, as
/// kube-apiserver does for a call beyond its pool of idle connections: it must wait, not fail,
/// and get the right answer once a slot frees.
struct Newcomer {
    started: Instant,
    answer: tokio::task::JoinHandle<Result<Answer, String>>,
    review: Value,
    expected: Value,
}

impl Newcomer {
    fn start(t: &Target, uid: &str) -> Newcomer {
        let review = with_uid(&llm_review(), uid);
        let body = serde_json::to_vec(&review).unwrap();
        let (addr, config) = (t.addr, t.h1.clone());
        Newcomer {
            started: Instant::now(),
            answer: tokio::spawn(async move {
                let mut conn = connect(addr, config, Proto::H1).await?;
                conn.post_json("/mutate", body).await
            }),
            expected: with_response_uid(&t.expected, uid),
            review,
        }
    }

    fn answered(&self) -> bool {
        self.answer.is_finished()
    }

    /// Waits for the answer (at most `limit`), checks it, and returns how long it took.
    async fn finish(self, limit: Duration) -> Duration {
        let answer = tokio::time::timeout(limit, self.answer)
            .await
            .unwrap_or_else(|_| panic!("the newcomer got no answer within {limit:?}"))
            .expect("newcomer task")
            .unwrap_or_else(|e| panic!("the newcomer's admission failed: {e}"));
        check_answer("/mutate", &self.review, &answer);
        assert_eq!(answer.json(), self.expected, "the newcomer's answer");
        self.started.elapsed()
    }
}

/// Polls `/metrics` until `cond` holds of the exposition (at most `limit`); returns it.
async fn metrics_until(
    probe: SocketAddr,
    limit: Duration,
    cond: impl Fn(&str) -> bool,
) -> Option<String> {
    let end = Instant::now() + limit;
    loop {
        if let Ok((_, m)) = probe_get(probe, "/metrics").await
            && cond(&m)
        {
            return Some(m);
        }
        if Instant::now() >= end {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// The harness

/// The value of one sample line (`name{labels}`) of the exposition, 0 when absent.
fn sample(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0.0)
}

fn open_connections(metrics: &str) -> f64 {
    sample(metrics, "modelgate_open_connections")
}

fn accept_paused(metrics: &str) -> f64 {
    sample(metrics, "modelgate_accept_paused_total")
}

fn dropped(metrics: &str, reason: &str) -> f64 {
    sample(
        metrics,
        &format!("modelgate_connections_dropped_total{{reason=\"{reason}\"}}"),
    )
}

fn admission_error(metrics: &str, reason: &str) -> f64 {
    sample(
        metrics,
        &format!("modelgate_admission_errors_total{{reason=\"{reason}\"}}"),
    )
}

/// What an attack gets to work with.
#[derive(Clone)]
struct Target {
    addr: SocketAddr,
    /// The probe listener, for `/metrics` during the attack.
    probe: SocketAddr,
    pid: u32,
    /// `serve`'s log lines so far.
    logs: Arc<std::sync::Mutex<Vec<String>>>,
    h1: Arc<rustls::ClientConfig>,
    h2: Arc<rustls::ClientConfig>,
    /// The answer to the LLM pod review before the attack (uid `reference`).
    expected: Arc<Value>,
}

/// What the harness saw: the metrics exposition after the attack, the most connections
/// `modelgate_open_connections` showed while it ran (sampled every 100 ms), and what the attack
/// itself reported.
struct Outcome<R> {
    metrics: String,
    max_open: f64,
    report: R,
}

/// Starts `serve` with `args`, runs `attack` (which must end within [`ATTACK`] plus a margin)
/// while the well-behaved client runs, and checks what every attack must leave intact.
async fn under_attack<F, Fut, R>(name: &str, args: &[&str], attack: F) -> Outcome<R>
where
    F: FnOnce(Target) -> Fut,
    Fut: std::future::Future<Output = R>,
{
    under_attack_with(name, args, None, attack).await
}

/// [`under_attack`], with `serve`'s open-files limit (soft and hard) at `open_files` when set.
async fn under_attack_with<F, Fut, R>(
    name: &str,
    args: &[&str],
    open_files: Option<u64>,
    attack: F,
) -> Outcome<R>
where
    F: FnOnce(Target) -> Fut,
    Fut: std::future::Future<Output = R>,
{
    let _one_at_a_time = SERIAL.lock().await;
    let pki = TestPki::new();
    let mut all_args = pki.tls_args();
    all_args.extend(args.iter().map(|a| a.to_string()));
    let mut cmd = serve_command(&all_args);
    if let Some(n) = open_files {
        with_open_files_limit(&mut cmd, n);
    }
    let server = ServerProcess::spawn(cmd);
    let ca = pki.ca.cert_pem().to_string();

    // The answer before the attack is the reference for every answer during it.
    let mut probe = connect(
        server.webhook,
        client_config(&ca, Proto::H2, None),
        Proto::H2,
    )
    .await
    .unwrap();
    let review = with_uid(&llm_review(), "reference");
    let answer = probe
        .post_json("/mutate", serde_json::to_vec(&review).unwrap())
        .await
        .unwrap();
    check_answer("/mutate", &review, &answer);
    let expected = answer.json();
    assert!(
        expected["response"]["patch"].is_string(),
        "the LLM pod is mutated: {expected}"
    );
    drop(probe);

    let legit = ApiServerClient::start(
        server.webhook,
        ca.clone(),
        expected.clone(),
        LEGIT_IN_FLIGHT,
        LEGIT_TIMEOUT,
    );
    let started = Instant::now();
    let target = Target {
        addr: server.webhook,
        probe: server.probe,
        pid: server.child.id(),
        logs: server.logs.clone(),
        h1: client_config(&ca, Proto::H1, None),
        h2: client_config(&ca, Proto::H2, None),
        expected: Arc::new(expected.clone()),
    };
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = {
        let (probe, sampling) = (server.probe, sampling.clone());
        tokio::spawn(async move {
            let mut max_open = 0f64;
            while sampling.load(Ordering::Relaxed) {
                if let Ok((_, m)) = probe_get(probe, "/metrics").await {
                    max_open = max_open.max(open_connections(&m));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            max_open
        })
    };
    let report = tokio::time::timeout(ATTACK + Duration::from_secs(20), attack(target))
        .await
        .unwrap_or_else(|_| panic!("{name}: the attack itself did not end"));
    let attack_time = started.elapsed();
    sampling.store(false, Ordering::Relaxed);
    let max_open = sampler.await.expect("metrics sampler");
    let legit = legit.finish();
    let peak_rss_kib = status_kib(server.child.id(), "VmHWM:");
    let (_, metrics) = server.probe_get("/metrics").await.unwrap();

    println!(
        "{name}: attack {attack_time:?}; well-behaved client: {} answers, {} failures, p99 {:?}; serve peak RSS {} MiB; at most {max_open} connections open",
        legit.latencies.len(),
        legit.failures.len(),
        legit.p99(),
        peak_rss_kib / 1024
    );
    for line in metrics.lines().filter(|l| {
        (l.starts_with("modelgate_connections_dropped_total")
            || l.starts_with("modelgate_admission_requests_total")
            || l.starts_with("modelgate_open_connections")
            || l.starts_with("modelgate_admission_errors_total")
            || l.starts_with("modelgate_accept_paused_total"))
            && !l.starts_with('#')
    }) {
        println!("  {line}");
    }
    assert!(
        legit.failures.is_empty(),
        "{name}: the well-behaved client lost {} of {} answers, e.g. {:?}",
        legit.failures.len(),
        legit.latencies.len(),
        &legit.failures[..legit.failures.len().min(3)]
    );
    assert!(
        legit.latencies.len() >= 20,
        "{name}: the well-behaved client got only {} answers",
        legit.latencies.len()
    );
    assert!(
        legit.p99() < MAX_P99,
        "{name}: p99 {:?} of the well-behaved client",
        legit.p99()
    );
    assert!(
        peak_rss_kib < MAX_RSS_KIB,
        "{name}: serve's peak RSS was {} MiB",
        peak_rss_kib / 1024
    );

    // Ready afterwards, and a new connection is served (the attack's sockets are closed by now;
    // give the server a moment to notice).
    let (status, text) = server.probe_get("/readyz").await.unwrap();
    assert_eq!(status, StatusCode::OK, "{name}: /readyz: {text}");
    let fresh = wait_for_service(server.webhook, &ca, &expected).await;
    assert!(
        fresh,
        "{name}: no new connection was served after the attack"
    );
    Outcome {
        metrics,
        max_open,
        report,
    }
}

async fn wait_for_service(addr: SocketAddr, ca: &str, expected: &Value) -> bool {
    let review = with_uid(&llm_review(), "after");
    let end = Instant::now() + Duration::from_secs(15);
    while Instant::now() < end {
        if let Ok(mut conn) = connect(addr, client_config(ca, Proto::H1, None), Proto::H1).await
            && let Ok(answer) = conn
                .post_json("/mutate", serde_json::to_vec(&review).unwrap())
                .await
            && answer.status == StatusCode::OK
        {
            assert_eq!(answer.json(), with_response_uid(expected, "after"));
            return true;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    false
}

/// Raises this process's open-files limit (10 000 client sockets); returns it.
fn open_files() -> u64 {
    modelgate::server::limits::raise_open_files_limit().expect("open-files limit")
}

// ---------------------------------------------------------------------------------------------
// The attacks

/// The cap of the attacks that reach `--max-connections`, so that 400 or 600 connections reach it
/// (the default, 1024, is reached by the 10 000 idle connections).
const TEST_CAP: usize = 128;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_streams_are_bounded_by_connections_streams_and_the_body_progress_deadline() {
    // 400 connections, each opening 100 streams whose promised body never comes (40 000
    // streams). --max-connections (128 here) holds 124 of the connections (the well-behaved
    // client has four) while the others wait in the listen backlog, --max-concurrent-streams
    // refuses all but 16 streams on each, and those are answered 408 after 1 s: a body with no
    // byte after its first second is behind --min-body-bytes-per-second (`body_too_slow`),
    // before --body-progress-timeout (2 s) would end it.
    let cap = format!("--max-connections={TEST_CAP}");
    // Every connection may speak HTTP/2 here: the attack is on the connection cap (the HTTP/2
    // cap is tests/server_connections.rs's).
    let http2 = format!("--max-http2-connections={TEST_CAP}");
    let outcome = under_attack("stalled streams", &[&cap, &http2], |t| async move {
        let mut conns = Vec::new();
        for _ in 0..400 {
            let t = t.clone();
            conns.push(tokio::spawn(async move {
                // A connection in the backlog stays there: give up on it after the attack.
                tokio::time::timeout(ATTACK, async {
                    let stream = tls(&t, Proto::H2).await?;
                    let (reader, mut writer) = tokio::io::split(stream);
                    let reading = drain(reader);
                    let mut out = frame::preface(&[]);
                    let block = frame::post_mutate(Some(6000));
                    for i in 0..100u32 {
                        frame::frame(
                            &mut out,
                            frame::HEADERS,
                            frame::END_HEADERS,
                            1 + 2 * i,
                            &block,
                        );
                    }
                    writer.write_all(&out).await?;
                    Ok::<_, std::io::Error>((writer, reading))
                })
                .await
            }));
        }
        let at_cap = metrics_until(t.probe, Duration::from_secs(10), |m| {
            accept_paused(m) >= 1.0
        })
        .await
        .is_some();
        // Beyond the cap, as kube-apiserver's overflow connection would be.
        let newcomer = Newcomer::start(&t, "newcomer");
        let mut arrivals = Arrivals::default();
        let mut held = Vec::new();
        for c in conns {
            held.extend(arrivals.count(c.await.unwrap()));
        }
        tokio::time::sleep(ATTACK).await;
        let waiting = !newcomer.answered();
        for (writer, reading) in held {
            reading.abort();
            drop(writer);
        }
        let waited = newcomer.finish(Duration::from_secs(15)).await;
        println!("stalled streams: {arrivals:?}; newcomer answered after {waited:?}");
        (at_cap, waiting, arrivals)
    })
    .await;
    let (at_cap, newcomer_waited, arrivals) = outcome.report;
    assert!(at_cap, "the accept loop never paused: {}", outcome.metrics);
    arrivals.assert_none_failed("stalled streams");
    assert!(
        arrivals.waited >= 1 && arrivals.established < TEST_CAP,
        "{arrivals:?}"
    );
    assert!(
        newcomer_waited,
        "the newcomer was answered while the cap was full"
    );
    assert!(
        outcome.max_open <= TEST_CAP as f64,
        "{} connections open with --max-connections={TEST_CAP}",
        outcome.max_open
    );
    assert!(
        admission_error(&outcome.metrics, "body_too_slow") >= 1000.0
            && accept_paused(&outcome.metrics) >= 1.0,
        "stalled bodies answered 408, the accept loop paused: {}",
        outcome.metrics
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rapid_reset_connections_get_goaway_enhance_your_calm() {
    let outcome = under_attack("rapid reset", &[], |t| async move {
        let end = Instant::now() + ATTACK;
        let mut tasks = Vec::new();
        for _ in 0..4 {
            let t = t.clone();
            tasks.push(tokio::spawn(async move {
                while Instant::now() < end {
                    let Ok(stream) = tls(&t, Proto::H2).await else {
                        continue;
                    };
                    let (reader, mut writer) = tokio::io::split(stream);
                    drain(reader);
                    let block = frame::post_mutate(None);
                    let mut id = 1u32;
                    let mut out = frame::preface(&[]);
                    while Instant::now() < end {
                        for _ in 0..500 {
                            frame::frame(&mut out, frame::HEADERS, frame::END_HEADERS, id, &block);
                            frame::frame(
                                &mut out,
                                frame::RST_STREAM,
                                0,
                                id,
                                &frame::CANCEL.to_be_bytes(),
                            );
                            id += 2;
                        }
                        if writer.write_all(&out).await.is_err() {
                            break;
                        }
                        out.clear();
                    }
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    })
    .await;
    assert!(
        dropped(&outcome.metrics, "h2_enhance_your_calm") >= 1.0,
        "{}",
        outcome.metrics
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn continuation_floods_and_huge_header_blocks_are_cut_off() {
    let outcome = under_attack("CONTINUATION flood and huge headers", &[], |t| async move {
        let end = Instant::now() + ATTACK;
        let mut tasks = Vec::new();
        for kind in 0..4 {
            let t = t.clone();
            tasks.push(tokio::spawn(async move {
                while Instant::now() < end {
                    let Ok(stream) = tls(&t, Proto::H2).await else {
                        continue;
                    };
                    let (reader, mut writer) = tokio::io::split(stream);
                    drain(reader);
                    let mut out = frame::preface(&[]);
                    frame::frame(
                        &mut out,
                        frame::HEADERS,
                        0,
                        1,
                        &frame::post_mutate(Some(10)),
                    );
                    // An endless header block: CONTINUATION frames that never end it, each
                    // carrying distinct headers (so that the decoded list grows too).
                    let mut n = 0u64;
                    while Instant::now() < end {
                        let mut block = Vec::new();
                        while block.len() < 16_000 {
                            n += 1;
                            let value = if kind % 2 == 0 { 20 } else { 4000 };
                            frame::literal(
                                &mut block,
                                format!("x-h{n}").as_bytes(),
                                &vec![b'a'; value],
                            );
                        }
                        frame::frame(&mut out, frame::CONTINUATION, 0, 1, &block);
                        if writer.write_all(&out).await.is_err() {
                            break;
                        }
                        out.clear();
                    }
                }
            }));
        }
        // HTTP/1.1: an endless request head.
        for _ in 0..2 {
            let t = t.clone();
            tasks.push(tokio::spawn(async move {
                while Instant::now() < end {
                    let Ok(mut stream) = tls(&t, Proto::H1).await else {
                        continue;
                    };
                    let mut out = b"POST /mutate HTTP/1.1\r\nHost: localhost\r\n".to_vec();
                    for i in 0..2000 {
                        out.extend_from_slice(
                            format!("x-h{i}: {}\r\n", "a".repeat(100)).as_bytes(),
                        );
                    }
                    let _ = stream.write_all(&out).await;
                    let mut sink = Vec::new();
                    let _ =
                        tokio::time::timeout(Duration::from_secs(1), stream.read_to_end(&mut sink))
                            .await;
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    })
    .await;
    assert!(
        dropped(&outcome.metrics, "h2_enhance_your_calm")
            + dropped(&outcome.metrics, "h2_compression_error")
            >= 1.0,
        "{}",
        outcome.metrics
    );
    assert!(
        dropped(&outcome.metrics, "header_too_large") >= 1.0,
        "{}",
        outcome.metrics
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_ping_and_window_update_floods_are_closed_by_the_idle_timeout() {
    // h2 answers one SETTINGS and one PING at a time and reads no further frame until the
    // answer is written, so a client that floods and never reads stops itself; what is left is a
    // connection on which no request starts, which the idle timeout closes.
    let outcome = under_attack(
        "SETTINGS/PING/WINDOW_UPDATE floods",
        &["--idle-timeout=1s"],
        |t| async move {
            let end = Instant::now() + ATTACK;
            let mut tasks = Vec::new();
            for kind in 0..3 {
                let t = t.clone();
                tasks.push(tokio::spawn(async move {
                    while Instant::now() < end {
                        let Ok(mut stream) = tls(&t, Proto::H2).await else {
                            continue;
                        };
                        let mut out = frame::preface(&[]);
                        while Instant::now() < end {
                            for i in 0..1000u32 {
                                match kind % 3 {
                                    0 => frame::settings(
                                        &mut out,
                                        &[(frame::SETTINGS_INITIAL_WINDOW_SIZE, 65_535 + i % 2)],
                                    ),
                                    1 => frame::frame(
                                        &mut out,
                                        frame::PING,
                                        0,
                                        0,
                                        &u64::from(i).to_be_bytes(),
                                    ),
                                    _ => frame::frame(
                                        &mut out,
                                        frame::WINDOW_UPDATE,
                                        0,
                                        0,
                                        &1u32.to_be_bytes(),
                                    ),
                                }
                            }
                            // Never reads: the server's answers pile up in the socket buffers.
                            match tokio::time::timeout(
                                Duration::from_millis(500),
                                stream.write_all(&out),
                            )
                            .await
                            {
                                Ok(Ok(())) => out.clear(),
                                Ok(Err(_)) => break,
                                Err(_) => {
                                    // The server stopped reading; hold the connection.
                                    tokio::time::sleep_until(end.into()).await;
                                    break;
                                }
                            }
                        }
                    }
                }));
            }
            for t in tasks {
                t.await.unwrap();
            }
        },
    )
    .await;
    assert!(
        dropped(&outcome.metrics, "idle_timeout") + dropped(&outcome.metrics, "stalled") >= 1.0,
        "{}",
        outcome.metrics
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_window_clients_that_never_read_are_closed() {
    // The client's stream windows are 0: the answers' bodies can never be sent, so the streams
    // stay open, up to --max-concurrent-streams per connection; no new request can start, so
    // the idle timeout sends GOAWAY and, the streams still stuck, closes the connection.
    // 2 s, not less: the same timer closes a kept-alive connection of the well-behaved client
    // that a loaded machine leaves without a request for that long, which is the client's
    // loss, not the attack's.
    let outcome = under_attack(
        "zero-window stall",
        &["--idle-timeout=2s"],
        |t| async move {
            // 100 small reviews fit in the connection's first flow-control window (64 KiB).
            let body = serde_json::to_vec(&pod_review("zero-window")).unwrap();
            let mut conns = Vec::new();
            for _ in 0..100 {
                let (t, body) = (t.clone(), body.clone());
                conns.push(tokio::spawn(async move {
                    let mut stream = tls(&t, Proto::H2).await.ok()?;
                    let mut out = frame::preface(&[(frame::SETTINGS_INITIAL_WINDOW_SIZE, 0)]);
                    let block = frame::post_mutate(Some(body.len()));
                    for i in 0..100u32 {
                        frame::frame(
                            &mut out,
                            frame::HEADERS,
                            frame::END_HEADERS,
                            1 + 2 * i,
                            &block,
                        );
                        frame::frame(&mut out, frame::DATA, frame::END_STREAM, 1 + 2 * i, &body);
                    }
                    stream.write_all(&out).await.ok()?;
                    Some(stream)
                }));
            }
            let mut held = Vec::new();
            for c in conns {
                held.push(c.await.unwrap());
            }
            // Past the idle timeout and the close that follows its GOAWAY.
            tokio::time::sleep(ATTACK + Duration::from_secs(2)).await;
            drop(held);
        },
    )
    .await;
    assert!(
        dropped(&outcome.metrics, "stalled") >= 1.0,
        "{}",
        outcome.metrics
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_idle_connections_wait_in_the_backlog_beyond_max_connections() {
    let limit = open_files();
    // Client and server sockets of 10 000 connections live in two processes; keep a margin.
    let wanted = 10_000usize.min(limit.saturating_sub(200) as usize);
    if wanted < 10_000 {
        println!("open-files hard limit {limit}: {wanted} idle connections instead of 10 000");
    }
    const WITH_TLS: usize = 1000;
    let cap = DEFAULT_MAX_CONNECTIONS as usize;
    // At the default --max-connections (1024). The header read and TLS handshake timeouts
    // (10 s and 3 s by default, which free the slots of connections that never send a request
    // or never start their handshake: `silent_connections_...` below) are raised so that
    // nothing is closed while the connections are held: any close seen then would be the cap's.
    let outcome = under_attack(
        "10 000 idle connections",
        // Every connection may speak HTTP/2: the attack is on the connection cap.
        &[
            "--header-read-timeout=60s",
            "--tls-handshake-timeout=60s",
            "--max-http2-connections=1024",
        ],
        |t| async move {
            // 1 000 complete the TLS handshake and the h2 preface, then say nothing.
            let mut tls_conns = Vec::new();
            let gate = Arc::new(tokio::sync::Semaphore::new(64));
            for _ in 0..WITH_TLS {
                let (t, gate) = (t.clone(), gate.clone());
                tls_conns.push(tokio::spawn(async move {
                    let _turn = gate.acquire().await.unwrap();
                    let mut stream = tls(&t, Proto::H2).await?;
                    stream.write_all(&frame::preface(&[])).await?;
                    Ok::<_, std::io::Error>(stream)
                }));
            }
            let mut tls_held = Vec::new();
            for c in tls_conns {
                tls_held.push(
                    c.await
                        .unwrap()
                        .expect("below the cap, TLS connections are served"),
                );
            }
            // Bare TCP connections (the server waits for their ClientHello) up to the cap.
            let m = metrics_until(t.probe, Duration::from_secs(10), |m| {
                open_connections(m) >= (WITH_TLS + 1) as f64
            })
            .await
            .expect("the TLS connections are open");
            let fill = cap - open_connections(&m) as usize;
            let mut tcp_held = Vec::new();
            for _ in 0..fill {
                tcp_held.push(TcpStream::connect(t.addr).await.expect("below the cap"));
            }
            let full = metrics_until(t.probe, Duration::from_secs(10), |m| {
                accept_paused(m) >= 1.0 && open_connections(m) == cap as f64
            })
            .await
            .is_some();
            let rss_at_cap_kib = status_kib(t.pid, "VmRSS:");
            // The cap is full: a newcomer waits in the listen backlog (1024 long), then the rest
            // arrive at once, each given 1.5 s to connect: a few more fit in the backlog, the
            // kernel drops the others' SYNs (they would retry for two minutes).
            let newcomer = Newcomer::start(&t, "newcomer");
            tokio::time::sleep(Duration::from_millis(200)).await;
            let mut rest = Vec::new();
            for _ in WITH_TLS + fill..wanted {
                let addr = t.addr;
                rest.push(tokio::spawn(async move {
                    tokio::time::timeout(Duration::from_millis(1500), TcpStream::connect(addr))
                        .await
                }));
            }
            let mut arrivals = Arrivals::default();
            for c in rest {
                tcp_held.extend(arrivals.count(c.await.unwrap()));
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
            // Nothing held was closed by the server, and the newcomer still waits.
            let closed = tls_held
                .iter()
                .map(|s| s.get_ref().0)
                .chain(tcp_held.iter())
                .filter(|s| closed_by_server(s))
                .count();
            let waiting = !newcomer.answered();
            let open_at_hold = probe_get(t.probe, "/metrics")
                .await
                .map(|(_, m)| open_connections(&m))
                .unwrap_or(-1.0);
            drop(tls_held);
            drop(tcp_held);
            let waited = newcomer.finish(Duration::from_secs(15)).await;
            println!(
                "10 000 idle connections: {fill} bare TCP to fill the cap; beyond it {arrivals:?}; \
             {closed} held connections closed by the server; {open_at_hold} open while held; \
             RSS at the cap {} MiB; newcomer answered after {waited:?}",
                rss_at_cap_kib / 1024
            );
            (full, waiting, closed, arrivals)
        },
    )
    .await;
    let (full, newcomer_waited, closed, arrivals) = outcome.report;
    assert!(full, "the cap was never full: {}", outcome.metrics);
    arrivals.assert_none_failed("10 000 idle connections");
    assert_eq!(closed, 0, "held connections were closed by the server");
    assert!(
        newcomer_waited,
        "the newcomer was answered while the cap was full"
    );
    assert!(
        outcome.max_open <= cap as f64,
        "{} connections open with --max-connections={cap}",
        outcome.max_open
    );
    assert!(
        accept_paused(&outcome.metrics) >= 1.0,
        "{}",
        outcome.metrics
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http1_pipelining_floods_that_never_read_are_closed() {
    let outcome = under_attack("HTTP/1.1 pipelining flood", &["--idle-timeout=1s"], |t| async move {
        let body = serde_json::to_vec(&with_uid(&llm_review(), "pipelined")).unwrap();
        let mut request = format!(
            "POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        request.extend_from_slice(&body);
        let batch: Vec<u8> = request.repeat(20);
        let end = Instant::now() + ATTACK;
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let (t, batch) = (t.clone(), batch.clone());
            tasks.push(tokio::spawn(async move {
                // A small receive buffer, so that the server's answers back up after kilobytes
                // rather than megabytes.
                let socket = tokio::net::TcpSocket::new_v4().unwrap();
                socket.set_recv_buffer_size(4096).unwrap();
                let Ok(tcp) = socket.connect(t.addr).await else {
                    return;
                };
                let Ok(mut stream) = tls_over(&t, Proto::H1, tcp).await else {
                    return;
                };
                // Writes until the server stops reading, never reads the answers, and holds
                // the connection to the end.
                let _ = tokio::time::timeout_at(end.into(), async {
                    while stream.write_all(&batch).await.is_ok() {}
                })
                .await;
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    })
    .await;
    assert!(
        dropped(&outcome.metrics, "stalled") + dropped(&outcome.metrics, "idle_timeout") >= 1.0,
        "{}",
        outcome.metrics
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_handshake_floods_are_bounded_by_the_handshake_timeout_and_max_connections() {
    // Full handshakes as fast as 4 clients can make them, and 600 half-open ones (a ClientHello,
    // then silence) that hold their connection until the handshake timeout (1 s here); beyond
    // --max-connections (128 here) they wait in the listen backlog for a slot, which the
    // handshake timeout frees.
    let cap = format!("--max-connections={TEST_CAP}");
    // Every connection may speak HTTP/2 (the clients offer only `h2`): the attack is on the
    // connection cap.
    let http2 = format!("--max-http2-connections={TEST_CAP}");
    let outcome = under_attack(
        "TLS handshake flood",
        &["--header-read-timeout=1s", &cap, &http2],
        |t| async move {
            let end = Instant::now() + ATTACK;
            let mut tasks = Vec::new();
            for _ in 0..4 {
                let t = t.clone();
                tasks.push(tokio::spawn(async move {
                    let mut full = Arrivals::default();
                    while Instant::now() < end {
                        full.count(
                            tokio::time::timeout(Duration::from_secs(5), tls(&t, Proto::H2))
                                .await,
                        );
                    }
                    full
                }));
            }
            let hello = {
                let mut client =
                    rustls::ClientConnection::new(t.h2.clone(), "localhost".try_into().unwrap())
                        .unwrap();
                let mut hello = Vec::new();
                client.write_tls(&mut hello).unwrap();
                hello
            };
            let mut opening = Vec::new();
            for _ in 0..600 {
                let (addr, hello) = (t.addr, hello.clone());
                opening.push(tokio::spawn(async move {
                    tokio::time::timeout(ATTACK, async {
                        let mut tcp = TcpStream::connect(addr).await?;
                        tcp.write_all(&hello).await?;
                        Ok::<_, std::io::Error>(tcp)
                    })
                    .await
                }));
            }
            let paused = metrics_until(t.probe, Duration::from_secs(5), |m| {
                accept_paused(m) >= 1.0
            })
            .await
            .is_some();
            // Served within a handshake timeout or so, when the half-open ones lose their slots.
            let newcomer = Newcomer::start(&t, "newcomer");
            let mut half_open = Arrivals::default();
            let mut held = Vec::new();
            for o in opening {
                held.extend(half_open.count(o.await.unwrap()));
            }
            let mut full = Arrivals::default();
            for task in tasks {
                let a = task.await.unwrap();
                full.established += a.established;
                full.waited += a.waited;
                full.failed.extend(a.failed);
            }
            let waited = newcomer.finish(Duration::from_secs(15)).await;
            println!(
                "full handshakes: {full:?}; half-open: {half_open:?}; newcomer answered after {waited:?}"
            );
            drop(held);
            (paused, full, half_open)
        },
    )
    .await;
    let (paused, full, half_open) = outcome.report;
    assert!(paused, "the accept loop never paused: {}", outcome.metrics);
    full.assert_none_failed("full handshakes");
    // Full handshakes queue behind the half-open ones in the listen backlog (FIFO, 1024 long):
    // they are slowed, never refused; some still complete within the attack.
    assert!(full.established >= 1, "{full:?}");
    half_open.assert_none_failed("half-open handshakes");
    assert!(
        outcome.max_open <= TEST_CAP as f64,
        "{} connections open with --max-connections={TEST_CAP}",
        outcome.max_open
    );
    assert!(
        dropped(&outcome.metrics, "tls_handshake_timeout") >= 1.0,
        "{}",
        outcome.metrics
    );
    assert!(
        accept_paused(&outcome.metrics) >= 1.0,
        "{}",
        outcome.metrics
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_without_a_decision_slot_gets_429_with_a_status_body() {
    // One decision at a time and 100 ms to wait for it; eight ~3 MiB reviews sent at once,
    // each decided in far more than 100 ms here (debug build): once their bodies are read, those
    // that find the slot taken for 100 ms get 429, the others are answered.
    const REQUESTS: usize = 8;
    let _one_at_a_time = SERIAL.lock().await;
    let pki = TestPki::new();
    let mut args = pki.tls_args();
    args.extend([
        "--max-requests-in-flight=1".to_string(),
        "--body-progress-timeout=100ms".to_string(),
        // Eight bodies of 3 MiB read at once.
        "--max-buffered-body-bytes=67108864".to_string(),
    ]);
    let server = ServerProcess::start(&args);
    let ca = pki.ca.cert_pem().to_string();
    let mut review = pod_review("large");
    let env: Vec<Value> = (0..40_000)
        .map(|i| serde_json::json!({"name": format!("VARIABLE_{i}"), "value": "a value of some length"}))
        .collect();
    review["request"]["object"]["spec"]["containers"][0]["env"] = env.into();
    let body = serde_json::to_vec(&review).unwrap();
    assert!(body.len() > 2 << 20, "{}", body.len());
    let mut conns = Vec::new();
    for _ in 0..REQUESTS {
        conns.push(
            connect(
                server.webhook,
                client_config(&ca, Proto::H1, None),
                Proto::H1,
            )
            .await
            .unwrap(),
        );
    }
    let mut answers = Vec::new();
    for mut conn in conns {
        let body = body.clone();
        answers.push(tokio::spawn(async move {
            conn.post_json("/mutate?timeout=30s", body).await
        }));
    }
    let (mut decided, mut refused) = (0, 0);
    for a in answers {
        let answer = a.await.unwrap().unwrap();
        if answer.status == StatusCode::OK {
            check_answer("/mutate", &review, &answer);
            decided += 1;
            continue;
        }
        assert_eq!(answer.status, StatusCode::TOO_MANY_REQUESTS, "{answer:?}");
        assert_eq!(answer.content_type, "application/json");
        let status = answer.json();
        assert_eq!(status["kind"], "Status");
        assert_eq!(status["reason"], "TooManyRequests");
        assert_eq!(status["code"], 429);
        // Bodies this large also wait for the one slot of bodies over 1 MiB: either wait may
        // be the one that runs out.
        let message = status["message"].as_str().unwrap();
        assert!(
            message.contains("--max-requests-in-flight")
                || message.contains("(they are made one at a time)"),
            "{status}"
        );
        refused += 1;
    }
    println!("{decided} decided, {refused} refused with 429");
    assert!(
        decided >= 1 && refused >= 1,
        "{decided} decided, {refused} refused"
    );
    let (_, metrics) = server.probe_get("/metrics").await.unwrap();
    assert_eq!(
        admission_error(&metrics, "too_many_requests"),
        refused as f64,
        "{metrics}"
    );
}

// ---------------------------------------------------------------------------------------------
// The probe listener, silent connections, and the log

/// The chart's probe `timeoutSeconds`: a probe not answered within it has failed.
const KUBELET_TIMEOUT: Duration = Duration::from_secs(2);

/// The kubelet's probes while an attack runs: `GET /healthz` and `GET /readyz` in turn every
/// 250 ms, each on a new connection (the kubelet keeps none alive), each given
/// [`KUBELET_TIMEOUT`].
struct KubeletProbes {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Vec<Result<Duration, String>>>,
}

/// What the probes saw: how many were answered, the failures, the most failures in a row (two
/// in a row turn the chart's readiness probe, `failureThreshold: 2`, to not ready), and the
/// slowest answer.
#[derive(Debug)]
#[allow(dead_code)] // `failures` and `slowest` are read through `Debug`, in messages.
struct ProbeReport {
    answered: usize,
    failures: Vec<String>,
    most_failures_in_a_row: usize,
    slowest: Duration,
}

impl KubeletProbes {
    fn start(probe: SocketAddr) -> KubeletProbes {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let mut results = Vec::new();
            for path in ["/healthz", "/readyz"].into_iter().cycle() {
                if flag.load(Ordering::Relaxed) {
                    break;
                }
                let started = Instant::now();
                results.push(
                    match tokio::time::timeout(KUBELET_TIMEOUT, probe_get(probe, path)).await {
                        Ok(Ok((StatusCode::OK, _))) => Ok(started.elapsed()),
                        Ok(Ok((status, body))) => Err(format!("{path}: {status} {body}")),
                        Ok(Err(e)) => Err(format!("{path}: {e}")),
                        Err(_) => Err(format!("{path}: no answer in {KUBELET_TIMEOUT:?}")),
                    },
                );
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            results
        });
        KubeletProbes { stop, task }
    }

    async fn finish(self) -> ProbeReport {
        self.stop.store(true, Ordering::Relaxed);
        let results = self.task.await.expect("kubelet probes");
        let (mut in_a_row, mut most) = (0, 0);
        for r in &results {
            in_a_row = if r.is_err() { in_a_row + 1 } else { 0 };
            most = most.max(in_a_row);
        }
        ProbeReport {
            answered: results.iter().filter(|r| r.is_ok()).count(),
            slowest: results
                .iter()
                .filter_map(|r| r.as_ref().ok())
                .max()
                .copied()
                .unwrap_or_default(),
            failures: results.into_iter().filter_map(Result::err).collect(),
            most_failures_in_a_row: most,
        }
    }

    fn assert_kept_ready(report: &ProbeReport, what: &str) {
        assert!(
            report.answered >= 4 && report.most_failures_in_a_row < 2,
            "{what}: the kubelet's probes failed: {report:?}"
        );
    }
}

fn probe_dropped(metrics: &str, reason: &str) -> f64 {
    sample(
        metrics,
        &format!("modelgate_probe_connections_dropped_total{{reason=\"{reason}\"}}"),
    )
}

/// How many lines of `logs` hold `needle`.
fn log_lines_with(logs: &std::sync::Mutex<Vec<String>>, needle: &str) -> usize {
    logs.lock()
        .unwrap()
        .iter()
        .filter(|l| l.contains(needle))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_port_header_floods_are_cut_at_the_head_limit() {
    // The security review's attack on the probe port: 600 connections, each sending an
    // unterminated 410 000-byte header line (19 MB to 350 MB of RSS, and as much kept after
    // they closed, when the probe port had no limits). --probe-max-header-bytes (8 KiB) answers
    // each 431 and closes it; --probe-max-connections (128) closes the idlest connection when a
    // new one comes at the cap. The kubelet's probes are answered throughout.
    let outcome = under_attack("probe port header flood", &[], |t| async move {
        let rss_before = status_kib(t.pid, "VmRSS:");
        let kubelet = KubeletProbes::start(t.probe);
        let mut head = b"GET /healthz HTTP/1.1\r\nHost: probe\r\nX-Flood: ".to_vec();
        head.resize(head.len() + 410_000, b'a');
        let head = Arc::new(head);
        // A burst of 600 each second of the attack: each connection is held until the server
        // has cut it off (or the attack is over).
        let end = Instant::now() + ATTACK;
        let mut sent = 0;
        for second in 0..ATTACK.as_secs() {
            tokio::time::sleep_until((end - ATTACK + Duration::from_secs(second)).into()).await;
            let mut conns = Vec::new();
            for _ in 0..600 {
                let (probe, head) = (t.probe, head.clone());
                conns.push(tokio::spawn(async move {
                    let mut tcp = TcpStream::connect(probe).await?;
                    // The server stops reading at its limit: the write ends in an error
                    // (reset), or is still blocked when the attack is over.
                    let _ = tokio::time::timeout_at(end.into(), tcp.write_all(&head)).await;
                    Ok::<_, std::io::Error>(tcp)
                }));
            }
            let mut held = Vec::new();
            for c in conns {
                held.extend(c.await.unwrap());
            }
            sent += held.len();
        }
        let rss_peak = status_kib(t.pid, "VmHWM:");
        tokio::time::sleep(Duration::from_millis(500)).await;
        let rss_after = status_kib(t.pid, "VmRSS:");
        let probes = kubelet.finish().await;
        println!(
            "probe header flood: {sent} connections; RSS {} MiB before, {} MiB peak, {} MiB after; kubelet probes {probes:?}",
            rss_before / 1024,
            rss_peak / 1024,
            rss_after / 1024
        );
        (rss_before, rss_peak, probes)
    })
    .await;
    let (rss_before, rss_peak, probes) = outcome.report;
    KubeletProbes::assert_kept_ready(&probes, "probe header flood");
    // 600 heads of 410 KB held would be 240 MiB; at 8 KiB each, and 128 connections at most,
    // the flood costs a few MiB (the well-behaved client's admissions run meanwhile too).
    assert!(
        rss_peak < rss_before + 32 * 1024,
        "RSS grew from {} to {} MiB",
        rss_before / 1024,
        rss_peak / 1024
    );
    assert!(
        probe_dropped(&outcome.metrics, "header_too_large") >= 1.0,
        "{}",
        outcome.metrics
    );
    assert!(
        sample(&outcome.metrics, "modelgate_probe_open_connections")
            <= f64::from(modelgate::server::limits::DEFAULT_PROBE_MAX_CONNECTIONS),
        "{}",
        outcome.metrics
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_port_connection_floods_never_take_the_webhooks_file_descriptors() {
    // The review's second attack: idle connections to the probe port until the process had no
    // file descriptor left (19 990 of them under a limit of 20 000): TLS handshakes on the
    // webhook port then failed, /healthz failed, and "accept failed" was logged every 50 ms.
    // Here `serve` runs under an open-files limit of 2 048, as a container might, and 3 000
    // idle connections come to the probe port: --probe-max-connections (128) holds them to 128,
    // the idlest closed as each new one comes, so the webhook's descriptors stay free.
    const OPEN_FILES: u64 = 2048;
    const FLOOD: usize = 3000;
    open_files();
    let outcome = under_attack_with(
        "probe port connection flood",
        &[],
        Some(OPEN_FILES),
        |t| async move {
            let kubelet = KubeletProbes::start(t.probe);
            let mut held = Vec::new();
            let mut refused = 0;
            for _ in 0..FLOOD {
                match TcpStream::connect(t.probe).await {
                    Ok(tcp) => held.push(tcp),
                    Err(_) => refused += 1,
                }
            }
            // While they are held: a new connection to the webhook (the API server's call
            // beyond its pool) is served.
            let newcomer = Newcomer::start(&t, "newcomer")
                .finish(Duration::from_secs(10))
                .await;
            tokio::time::sleep(Duration::from_secs(1)).await;
            let fds = open_fds(t.pid);
            let closed = held.iter().filter(|s| closed_by_server(s)).count();
            drop(held);
            let probes = kubelet.finish().await;
            let accept_failed = log_lines_with(&t.logs, "accept failed");
            println!(
                "probe connection flood: {FLOOD} idle connections ({refused} refused), {closed} closed by the server; \
                 serve holds {fds} descriptors; newcomer answered after {newcomer:?}; {accept_failed} accept failures logged; \
                 kubelet probes {probes:?}"
            );
            (fds, closed, newcomer, probes, accept_failed)
        },
    )
    .await;
    let (fds, closed, newcomer, probes, accept_failed) = outcome.report;
    KubeletProbes::assert_kept_ready(&probes, "probe connection flood");
    let probe_cap = modelgate::server::limits::DEFAULT_PROBE_MAX_CONNECTIONS as usize;
    // The probe cap, the well-behaved client's and the newcomer's connections, and what the
    // process holds anyway (listeners, stdio, the runtime), far from the limit.
    assert!(fds <= probe_cap + 64, "serve holds {fds} descriptors");
    assert!(
        closed >= FLOOD - probe_cap - 16,
        "only {closed} of {FLOOD} idle connections were closed"
    );
    assert!(
        newcomer < Duration::from_secs(5),
        "newcomer after {newcomer:?}"
    );
    assert_eq!(accept_failed, 0, "accepts failed");
    assert!(
        probe_dropped(&outcome.metrics, "evicted") >= (FLOOD - probe_cap - 16) as f64,
        "{}",
        outcome.metrics
    );
}

/// Opens `n` TCP connections to `addr` that never send a byte (a ClientHello least of all).
async fn silent_connections(addr: SocketAddr, n: usize) -> Vec<TcpStream> {
    let mut held = Vec::with_capacity(n);
    for _ in 0..n {
        held.push(TcpStream::connect(addr).await.expect("connect"));
    }
    held
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_never_delay_a_new_connection_past_the_webhook_timeout() {
    // Connections that never start their TLS handshake. Below --max-connections (1 024) a new
    // connection from the API server is served at once: handshakes run each in its own task and
    // never hold up the accept loop (the contract: within 2 s while a thousand are held).
    // Beyond it (1 100 in a burst, the security review's case: 9.1-9.5 s before, when silent
    // connections kept their slot for the 10 s header read timeout), the newcomer waits in the
    // listen backlog until the silent ones lose their slots: a connection that has sent no byte
    // is closed a third of --tls-handshake-timeout (3 s) after it was accepted.
    let outcome = under_attack("silent TCP connections", &[], |t| async move {
        let opened = Instant::now();
        let silent = silent_connections(t.addr, 1000).await;
        let below_cap = Newcomer::start(&t, "below-cap")
            .finish(Duration::from_secs(15))
            .await;
        // Each is closed by the server about a second after it was accepted.
        let all_closed = loop {
            if silent.iter().all(closed_by_server) || opened.elapsed() > Duration::from_secs(10) {
                break opened.elapsed();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        drop(silent);
        let silent = silent_connections(t.addr, 1100).await;
        let beyond_cap = Newcomer::start(&t, "beyond-cap")
            .finish(Duration::from_secs(15))
            .await;
        drop(silent);
        println!(
            "silent connections: 1 000 held, newcomer answered after {below_cap:?}, all closed by the \
             server {all_closed:?} after they were opened; 1 100 held, newcomer answered after {beyond_cap:?}"
        );
        (below_cap, all_closed, beyond_cap)
    })
    .await;
    let (below_cap, all_closed, beyond_cap) = outcome.report;
    assert!(
        outcome.max_open >= 1000.0,
        "the thousand were never held at once: {}",
        outcome.max_open
    );
    assert!(
        below_cap < Duration::from_secs(2),
        "with 1 000 silent connections held, a new one was answered after {below_cap:?}"
    );
    assert!(
        all_closed < Duration::from_secs(5),
        "silent connections still open after {all_closed:?}"
    );
    // The chart's webhook timeoutSeconds: the API server's call still succeeds.
    assert!(
        beyond_cap < Duration::from_secs(5),
        "with 1 100 silent connections held, a new one was answered after {beyond_cap:?}"
    );
    // The thousand of the first burst, and at least the one whose slot the newcomer took
    // (the rest of the second burst is closed by the test once the newcomer is answered).
    assert!(
        dropped(&outcome.metrics, "tls_handshake_timeout") > 1000.0,
        "{}",
        outcome.metrics
    );
}

/// A TLS 1.3 ClientHello naming `server_name` in its SNI extension, as one handshake message
/// split over records of at most 16 KiB (rustls' client refuses to send a name like this).
fn client_hello_with_sni(server_name: &[u8]) -> Vec<u8> {
    fn ext(out: &mut Vec<u8>, kind: u16, body: &[u8]) {
        out.extend_from_slice(&kind.to_be_bytes());
        out.extend_from_slice(&(body.len() as u16).to_be_bytes());
        out.extend_from_slice(body);
    }
    let mut exts = Vec::new();
    let mut sni = Vec::new();
    sni.extend_from_slice(&((server_name.len() + 3) as u16).to_be_bytes());
    sni.push(0); // host_name
    sni.extend_from_slice(&(server_name.len() as u16).to_be_bytes());
    sni.extend_from_slice(server_name);
    ext(&mut exts, 0, &sni);
    ext(&mut exts, 43, &[2, 3, 4]); // supported_versions: TLS 1.3
    ext(&mut exts, 10, &[0, 2, 0, 0x1d]); // supported_groups: x25519
    ext(&mut exts, 13, &[0, 4, 4, 3, 8, 4]); // signature_algorithms
    let mut share = vec![0, 36, 0, 0x1d, 0, 32];
    share.extend_from_slice(&[7u8; 32]);
    ext(&mut exts, 51, &share); // key_share
    let mut body = vec![3, 3];
    body.extend_from_slice(&[42u8; 32]); // random
    body.push(0); // session id
    body.extend_from_slice(&[0, 2, 0x13, 0x01]); // TLS_AES_128_GCM_SHA256
    body.extend_from_slice(&[1, 0]); // compression: null
    body.extend_from_slice(&(exts.len() as u16).to_be_bytes());
    body.extend_from_slice(&exts);
    let mut message = vec![1]; // client_hello
    message.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
    message.extend_from_slice(&body);
    let mut records = Vec::new();
    for fragment in message.chunks(16 * 1024) {
        records.extend_from_slice(&[22, 3, 1]);
        records.extend_from_slice(&(fragment.len() as u16).to_be_bytes());
        records.extend_from_slice(fragment);
    }
    records
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_server_names_with_a_space_write_a_bounded_log() {
    // 1 000 ClientHellos naming a 65 000-byte server with a space in it: rustls warns with the
    // whole name ("Illegal SNI hostname received …"), and each failed handshake is a warning of
    // its own. Before the log rules that was 57 MiB of log in 0.63 s (release build); now each
    // value from a peer keeps 256 bytes, and each kind of warning about peers is written once
    // per 10 s with the count of those left out.
    let outcome = under_attack(
        "long SNI flood",
        // The well-behaved client's admissions are allowed: logged at debug, not here.
        &["--log-admissions=false"],
        |t| async move {
            let log_bytes = |logs: &std::sync::Mutex<Vec<String>>| {
                logs.lock()
                    .unwrap()
                    .iter()
                    .map(|l| l.len() + 1)
                    .sum::<usize>()
            };
            let before = log_bytes(&t.logs);
            let mut name = vec![b'a'; 32_000];
            name.push(b' ');
            name.resize(65_000, b'b');
            let hello = Arc::new(client_hello_with_sni(&name));
            let started = Instant::now();
            let mut tasks = Vec::new();
            for _ in 0..4 {
                let (addr, hello) = (t.addr, hello.clone());
                tasks.push(tokio::spawn(async move {
                    for _ in 0..250 {
                        let Ok(mut tcp) = TcpStream::connect(addr).await else {
                            continue;
                        };
                        if tcp.write_all(&hello).await.is_err() {
                            continue;
                        }
                        // Until the server's alert and close.
                        let mut sink = Vec::new();
                        let _ = tokio::time::timeout(
                            Duration::from_secs(2),
                            tcp.read_to_end(&mut sink),
                        )
                        .await;
                    }
                }));
            }
            for task in tasks {
                task.await.unwrap();
            }
            let took = started.elapsed();
            // The log is flushed every 50 ms; the test reads it on a thread of its own.
            tokio::time::sleep(Duration::from_millis(500)).await;
            let written = log_bytes(&t.logs) - before;
            let lines: Vec<String> = t.logs.lock().unwrap().clone();
            println!("long SNI flood: 1 000 handshakes in {took:?}, {written} bytes of log");
            (written, lines)
        },
    )
    .await;
    let (written, lines) = outcome.report;
    assert!(
        dropped(&outcome.metrics, "tls_handshake_failed") >= 1000.0,
        "{}",
        outcome.metrics
    );
    assert!(written < 16 * 1024, "{written} bytes of log");
    let sni: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("Illegal SNI hostname"))
        .collect();
    assert!(!sni.is_empty(), "rustls' warning is not logged at all");
    for line in &sni {
        assert!(line.len() < 1024, "a {} byte line", line.len());
        let v: Value = serde_json::from_str(line).unwrap();
        assert!(
            v["message"].as_str().unwrap().ends_with(" more bytes)"),
            "{line}"
        );
        assert_eq!(v["target"], "rustls::msgs::handshake", "{line}");
    }
    assert!(
        log_lines_with_any(&lines, "TLS handshake failed") <= 2,
        "failed handshakes are rate-limited"
    );
}

fn log_lines_with_any(lines: &[String], needle: &str) -> usize {
    lines.iter().filter(|l| l.contains(needle)).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_name_with_line_separators_and_bidi_controls_is_logged_escaped() {
    // U+2028 and U+2029 end a line for JavaScript and many log viewers; U+202E turns the rest of
    // a line around on screen (`evil\u{202e}gpj.exe` reads as "evilexe.jpg"). JSON allows all three raw
    // in a string, and serde_json writes them raw: the log escapes them as it does newlines.
    let _one_at_a_time = SERIAL.lock().await;
    let pki = TestPki::new();
    let mut args = pki.tls_args();
    args.push("--log-admissions=false".into());
    let server = ServerProcess::start(&args);
    let mut conn = connect(
        server.webhook,
        client_config(pki.ca.cert_pem(), Proto::H1, None),
        Proto::H1,
    )
    .await
    .unwrap();
    let name = "evil\u{2028}pod\u{2029}x\u{202e}gpj.exe";
    let mut review = pod_review("uid-bidi");
    review["request"]["name"] = name.into();
    review["request"]["object"]["metadata"]["name"] = name.into();
    // Denied (uid 0), so logged at the default level.
    review["request"]["object"]["spec"]["containers"][0]["securityContext"] =
        serde_json::json!({"runAsUser": 0});
    let answer = conn
        .post_json("/mutate", serde_json::to_vec(&review).unwrap())
        .await
        .unwrap();
    assert_eq!(answer.json()["response"]["allowed"], false);
    let line = wait_until(Duration::from_secs(10), || {
        server
            .logs()
            .lines()
            .find(|l| l.contains("uid-bidi"))
            .map(str::to_string)
    })
    .expect("the denial is logged");
    for raw in ['\u{2028}', '\u{2029}', '\u{202e}'] {
        assert!(!line.contains(raw), "{raw:?} written raw: {line}");
    }
    let v: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(
        v["name"], r"evil\u{2028}pod\u{2029}x\u{202e}gpj.exe",
        "{line}"
    );
    assert_eq!(v["level"], "INFO");
    assert_eq!(v["allowed"], false);
}
