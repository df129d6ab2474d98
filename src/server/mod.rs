//! `modelgate serve`: the admission pipeline behind TLS, plus a plain-HTTP probe listener.
//!
//! - Webhook listener (TLS 1.2+, ALPN `h2` and `http/1.1`): `POST /mutate`, `POST /validate`,
//!   `GET /healthz`. Each body goes to [`admission::review`], the one pipeline; this module only
//!   adds HTTP: content type (415), body limit (413), deadline (408), unknown paths (404).
//! - Probe listener (plain HTTP/1.1, limits of its own: [`probe`]): `GET /healthz` (alive),
//!   `GET /readyz` (certificate loaded, caches synced, namespaces listed, not shutting down),
//!   `GET /metrics`.
//! - Shutdown: at the first SIGTERM/SIGINT `/readyz` turns 503 and the webhook keeps serving,
//!   new connections included, for `--shutdown-grace` (endpoint removal takes a moment to reach
//!   the API server); then the listener closes, connections finish their in-flight requests
//!   (at most [`shutdown::DRAIN_TIMEOUT`]) and [`Server::run`] returns.
//! - Hostile clients: every resource a client can hold is capped by [`Limits`] (connections,
//!   streams per connection, decisions in flight, the memory of bodies being read, header bytes,
//!   idle and stalled time, the slowest body), and
//!   every connection the server ends early is counted by reason
//!   (`modelgate_connections_dropped_total`). docs/security.md has the memory formula.
//! - Logs: one line per denial and per error at `info`, one per admission at `debug` (or
//!   `--log-admissions`); every value from a request or a peer escaped and cut, warnings about
//!   peers rate-limited ([`log_format`]).

pub mod body;
pub mod deadline;
pub mod limits;
pub mod log_format;
pub mod log_writer;
pub mod metrics;
pub mod probe;
pub mod process_metrics;
pub mod shutdown;
pub mod tls;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures::FutureExt as _;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulConnection;
use hyper_util::service::TowerToHyperService;
use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, SemaphorePermit, watch};
use tokio_rustls::TlsAcceptor;

use crate::admission::{self, Context, Webhook};
use crate::cache::CacheStore;
use crate::cache::claims::{self, ClaimRead, ClaimReader};
use crate::config::PolicyConfig;
use crate::namespaces::NamespaceStore;
use crate::policy::Caches;
use body::{BodyBudget, Held, MinRate};
use deadline::Budget;
pub use limits::{Limits, ProbeLimits};
use log_format::Throttle;
use metrics::Metrics;
use shutdown::Signals;
use tls::{TlsFiles, TlsReloader};

/// Everything `serve` needs, decided by the command line.
pub struct ServeOptions {
    pub listen: SocketAddr,
    pub probe_listen: SocketAddr,
    pub tls: TlsFiles,
    pub max_body_bytes: usize,
    pub shutdown_grace: Duration,
    /// Time a client has for its first request after the TLS handshake (which has
    /// `--tls-handshake-timeout`, never more than this).
    pub header_read_timeout: Duration,
    pub limits: Limits,
    /// What clients of the probe listener may hold.
    pub probe_limits: ProbeLimits,
    /// One `info` line per admission (`--log-admissions`); otherwise only denials and errors
    /// are logged at `info`, the others at `debug`.
    pub log_admissions: bool,
    pub config: PolicyConfig,
    /// The model caches the admissions read.
    pub store: Arc<CacheStore>,
    /// Namespace modes and Pod Security levels the admissions read.
    pub namespaces: Arc<NamespaceStore>,
    /// Whether the cache source lets `/readyz` say ready (for static caches and the plain
    /// store: `store.is_synced()`).
    pub caches_ready: CachesReady,
    /// Whether the namespace labels are known (the watch's first list arrived; always, without
    /// a cluster): every decision reads its namespace's mode and Pod Security level.
    pub namespaces_ready: CachesReady,
    /// The metrics; other parts of the program may have registered theirs already.
    pub metrics: Metrics,
    /// Reads a claim the watch has not delivered yet (with a cluster only).
    pub claim_reader: Option<ClaimReader>,
}

/// Asked by every `/readyz`: must be cheap.
pub type CachesReady = Box<dyn Fn() -> bool + Send + Sync>;

/// State shared by the handlers.
struct AppState {
    config: PolicyConfig,
    store: Arc<CacheStore>,
    namespaces: Arc<NamespaceStore>,
    caches_ready: CachesReady,
    namespaces_ready: CachesReady,
    metrics: Arc<Metrics>,
    tls: Arc<TlsReloader>,
    draining: AtomicBool,
    max_body_bytes: usize,
    /// One permit per decision being made (`--max-requests-in-flight`); taken once the body is
    /// read.
    decision_slots: Semaphore,
    /// The one slot for a decision on a body over [`LARGE_BODY_BYTES`], taken before a decision
    /// slot.
    large_decision: Semaphore,
    /// What the bodies being read in parts may hold (`--max-buffered-body-bytes`).
    body_budget: BodyBudget,
    limits: Limits,
    log_admissions: bool,
    claim_reader: Option<ClaimReader>,
}

impl AppState {
    /// Why the server is not ready, or nothing.
    fn not_ready(&self) -> Vec<&'static str> {
        let mut reasons = Vec::new();
        if self.draining.load(Ordering::Acquire) {
            reasons.push("shutting down");
        }
        if !self.tls.is_loaded() {
            reasons.push("TLS certificate not loaded");
        }
        if !(self.caches_ready)() {
            reasons.push("model caches not synced");
        }
        if !(self.namespaces_ready)() {
            reasons.push("namespaces not listed");
        }
        reasons
    }
}

/// Bound listeners, ready to run.
pub struct Server {
    state: Arc<AppState>,
    webhook: TcpListener,
    probe: TcpListener,
    probe_limits: ProbeLimits,
    shutdown_grace: Duration,
    header_read_timeout: Duration,
}

/// How the connection stack is configured: fixed by [`Limits`] and the header read timeout.
#[derive(Clone, Debug)]
struct ConnectionSettings {
    header_read_timeout: Duration,
    limits: Limits,
}

impl ConnectionSettings {
    /// When a connection accepted at `accepted` must have finished its TLS handshake:
    /// `--tls-handshake-timeout`, never later than `--header-read-timeout`.
    fn tls_handshake_deadline(&self, accepted: Instant) -> Instant {
        accepted
            + self
                .limits
                .tls_handshake_timeout
                .min(self.header_read_timeout)
    }

    /// When its first byte (the ClientHello) must have come: a third of the handshake timeout.
    fn client_hello_deadline(&self, accepted: Instant) -> Instant {
        (accepted + self.limits.tls_handshake_timeout / limits::CLIENT_HELLO_SHARE)
            .min(self.tls_handshake_deadline(accepted))
    }
}

/// How long an accept loop waits after a failed accept (out of file descriptors, say) before it
/// tries again.
const ACCEPT_RETRY: Duration = Duration::from_millis(50);

/// Warnings about peers, each at most once per [`log_format::PEER_LOG_INTERVAL`] with the count
/// of those left out: a flood of bad handshakes writes a line every 10 s, not one per handshake.
static WEBHOOK_ACCEPT_FAILED: Throttle = Throttle::new();
static HANDSHAKE_FAILED: Throttle = Throttle::new();
static HANDSHAKE_TIMED_OUT: Throttle = Throttle::new();

/// Where the server is in its life, as every connection sees it (docs/policy.md §7: kube-apiserver
/// does not retry a POST that meets a closed connection, so the server never closes one under a
/// client that may be about to use it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Answering as usual.
    Serving,
    /// From the first signal to the end of the grace period: still answering, new connections
    /// included, but every HTTP/1.1 answer carries `Connection: close` (the client closes that
    /// connection after reading it) and HTTP/2 connections get a GOAWAY, so that clients move
    /// to other replicas. Idle connections are left open.
    Draining,
    /// After the grace period: the listener is closed, connections that stayed idle through the
    /// grace period are closed, the others finish their in-flight requests.
    Stopped,
}

impl Server {
    /// Loads the certificate (a failure is logged; `/readyz` stays 503 until a good pair
    /// appears) and binds both listeners.
    pub async fn bind(options: ServeOptions) -> anyhow::Result<Server> {
        let metrics = Arc::new(options.metrics);
        let body_budget = BodyBudget::new(
            options.limits.max_buffered_body_bytes,
            metrics.buffered_body_bytes(),
        );
        let reloader = Arc::new(TlsReloader::new(options.tls));
        reloader.reload_and_report(&metrics);
        let webhook = bind_with_backlog(options.listen)
            .with_context(|| format!("--listen {}: cannot bind", options.listen))?;
        // The same backlog as the webhook's: a burst of connections at the probe cap waits
        // there while the idlest are closed, instead of having its SYNs dropped (and resent a
        // second later, past the kubelet's probe timeout) beyond tokio's default of 128.
        let probe = bind_with_backlog(options.probe_listen)
            .with_context(|| format!("--probe-listen {}: cannot bind", options.probe_listen))?;
        Ok(Server {
            state: Arc::new(AppState {
                config: options.config,
                store: options.store,
                namespaces: options.namespaces,
                caches_ready: options.caches_ready,
                namespaces_ready: options.namespaces_ready,
                metrics,
                tls: reloader,
                draining: AtomicBool::new(false),
                max_body_bytes: options.max_body_bytes,
                decision_slots: Semaphore::new(options.limits.max_requests_in_flight as usize),
                large_decision: Semaphore::new(1),
                body_budget,
                limits: options.limits,
                log_admissions: options.log_admissions,
                claim_reader: options.claim_reader,
            }),
            webhook,
            probe,
            probe_limits: options.probe_limits,
            shutdown_grace: options.shutdown_grace,
            header_read_timeout: options.header_read_timeout,
        })
    }

    pub fn webhook_addr(&self) -> std::io::Result<SocketAddr> {
        self.webhook.local_addr()
    }

    pub fn probe_addr(&self) -> std::io::Result<SocketAddr> {
        self.probe.local_addr()
    }

    /// Serves until a signal and the drain that follows; then returns.
    pub async fn run(self, mut signals: Signals) -> anyhow::Result<()> {
        let Server {
            state,
            webhook,
            probe,
            probe_limits,
            shutdown_grace,
            header_read_timeout,
        } = self;
        let webhook_addr = webhook.local_addr()?;
        let probe_addr = probe.local_addr()?;

        let reload = tokio::spawn(state.tls.clone().watch(state.metrics.clone()));
        let probe_task = tokio::spawn(probe::serve(
            probe,
            probe_routes(state.clone()),
            probe_limits,
            state.metrics.clone(),
        ));
        let (phase_tx, phase_rx) = watch::channel(Phase::Serving);
        let settings = ConnectionSettings {
            header_read_timeout,
            limits: state.limits.clone(),
        };
        let accept = tokio::spawn(accept_loop(
            webhook,
            state.tls.clone(),
            webhook_routes(state.clone()),
            settings,
            state.metrics.clone(),
            phase_rx,
        ));
        tracing::info!(listener = "webhook", addr = %webhook_addr, "listening");
        tracing::info!(listener = "probe", addr = %probe_addr, "listening");

        let first = signals.recv().await;
        state.draining.store(true, Ordering::Release);
        let _ = phase_tx.send(Phase::Draining);
        tracing::info!(
            signal = first,
            grace = ?shutdown_grace,
            "shutting down: /readyz is 503; serving on for the grace period (a second signal ends it), \
             HTTP/1.1 answers with Connection: close, HTTP/2 connections sent GOAWAY"
        );
        tokio::select! {
            () = tokio::time::sleep(shutdown_grace) => {}
            again = signals.recv() => tracing::info!(signal = again, "grace period cut short"),
        }
        let _ = phase_tx.send(Phase::Stopped);
        let drained = accept.await.unwrap_or(false);
        reload.abort();
        probe_task.abort();
        if drained {
            tracing::info!("stopped: every in-flight request was answered");
        } else {
            tracing::warn!(timeout = ?shutdown::DRAIN_TIMEOUT, "stopped: connections still open after the drain timeout were closed");
        }
        Ok(())
    }
}

/// The HTTP stack of every webhook connection: hyper's own limits, set explicitly so that a
/// dependency upgrade cannot change them silently.
fn http_builder(settings: &ConnectionSettings) -> auto::Builder<TokioExecutor> {
    let limits = &settings.limits;
    let mut http = auto::Builder::new(TokioExecutor::new());
    http.http1()
        .timer(TokioTimer::new())
        // hyper runs this timer whenever a connection waits for a request head, idle kept-alive
        // connections included: at `--header-read-timeout` it would close an idle connection
        // after 10 s, under kube-apiserver, which keeps them 90 s and does not retry a POST
        // that meets the close. So it is the idle timeout here; the first request's head is
        // bounded by `--header-read-timeout` in `watch_connection` (`no_request`).
        .header_read_timeout(settings.limits.idle_timeout)
        // The read buffer holds the request head; hyper refuses less than 8 KiB.
        .max_buf_size((limits.max_header_list_bytes as usize).max(8192))
        .max_headers(100);
    http.http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.max_concurrent_streams)
        .max_pending_accept_reset_streams(limits.max_pending_accept_resets as usize)
        .max_local_error_reset_streams(limits::MAX_LOCAL_ERROR_RESETS)
        .max_header_list_size(limits.max_header_list_bytes)
        .max_send_buf_size(limits::MAX_SEND_BUF_BYTES)
        .initial_stream_window_size(limits::STREAM_WINDOW_BYTES)
        .initial_connection_window_size(limits::CONNECTION_WINDOW_BYTES)
        .keep_alive_interval(limits::KEEP_ALIVE_INTERVAL)
        .keep_alive_timeout(limits::KEEP_ALIVE_TIMEOUT);
    http
}

/// When requests start on one connection, for its idle timeout.
struct Activity {
    opened: Instant,
    /// Milliseconds after `opened` at which the last request started; `u64::MAX`: none yet.
    last_request_ms: AtomicU64,
}

impl Activity {
    fn new() -> Self {
        Activity {
            opened: Instant::now(),
            last_request_ms: AtomicU64::new(u64::MAX),
        }
    }

    fn request_started(&self) {
        let ms = self.opened.elapsed().as_millis() as u64;
        self.last_request_ms.store(ms, Ordering::Relaxed);
    }

    fn last_request(&self) -> Option<Instant> {
        match self.last_request_ms.load(Ordering::Relaxed) {
            u64::MAX => None,
            ms => Some(self.opened + Duration::from_millis(ms)),
        }
    }
}

/// The `reason` label of `modelgate_connections_dropped_total` for a connection that ended with
/// an error, or `None` when the client went away (reset, EOF) or closed it properly.
fn drop_reason(error: &(dyn std::error::Error + 'static)) -> Option<&'static str> {
    let mut cause = Some(error);
    while let Some(e) = cause {
        if let Some(h2) = e.downcast_ref::<h2::Error>() {
            if h2.is_remote() || h2.is_io() {
                return None;
            }
            return Some(match h2.reason() {
                Some(h2::Reason::ENHANCE_YOUR_CALM) => "h2_enhance_your_calm",
                Some(h2::Reason::PROTOCOL_ERROR) => "h2_protocol_error",
                Some(h2::Reason::FRAME_SIZE_ERROR) => "h2_frame_size_error",
                Some(h2::Reason::COMPRESSION_ERROR) => "h2_compression_error",
                Some(h2::Reason::FLOW_CONTROL_ERROR) => "h2_flow_control_error",
                _ => "h2_other_error",
            });
        }
        if let Some(h) = e.downcast_ref::<hyper::Error>() {
            if h.is_timeout() {
                return Some("timeout");
            }
            if h.is_parse_too_large() {
                return Some("header_too_large");
            }
            if h.is_parse() {
                return Some("bad_request");
            }
        }
        cause = e.source();
    }
    None
}

const CONNECTION_CLOSE: axum::http::HeaderValue = axum::http::HeaderValue::from_static("close");

/// After a change of `phase`: records draining in `draining`, and says whether the server
/// stopped (a dropped sender counts as stopped).
fn phase_reached(
    changed: Result<(), watch::error::RecvError>,
    phase: &watch::Receiver<Phase>,
    draining: &AtomicBool,
) -> bool {
    let now = match changed {
        Ok(()) => *phase.borrow(),
        Err(_) => Phase::Stopped,
    };
    if now != Phase::Serving {
        draining.store(true, Ordering::Release);
    }
    now == Phase::Stopped
}

/// Connections the kernel queues for the webhook listener while the accept loop is paused at
/// `--max-connections` (tokio's own `bind` queues 128; the kernel caps the figure at
/// `net.core.somaxconn`, 4096 on current kernels). Beyond it the kernel drops SYNs and the client
/// resends them after 1, 3, 7 s: slower, but never a failed connection.
const LISTEN_BACKLOG: u32 = 1024;

fn bind_with_backlog(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    // As `TcpListener::bind` does: a restarted server can bind while old connections linger.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// Socket options of every webhook connection:
/// - `TCP_NODELAY`: an h2 connection carries many answers, each written as it is ready; with
///   Nagle's algorithm a small write waits for the ACK of the previous one, which the client
///   delays by up to 40 ms (Go's HTTP client, like the API server's, disables Nagle on its side;
///   the server must too);
/// - a bounded kernel send buffer ([`limits::SOCKET_SEND_BUF_BYTES`]).
fn configure_accepted(tcp: &tokio::net::TcpStream) -> std::io::Result<()> {
    tcp.set_nodelay(true)?;
    socket2::SockRef::from(tcp).set_send_buffer_size(limits::SOCKET_SEND_BUF_BYTES)
}

/// The client connection preface of HTTP/2 (RFC 9113 §3.4).
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Reads the first bytes of a connection until they are the HTTP/2 preface or cannot be: says
/// which, and returns what was read (at most the preface's 24 bytes), to be read again.
async fn sniff_h2<S: tokio::io::AsyncRead + Unpin>(
    stream: &mut S,
) -> std::io::Result<(bool, Vec<u8>)> {
    use tokio::io::AsyncReadExt as _;
    let mut read = vec![0u8; H2_PREFACE.len()];
    let mut len = 0;
    while len < H2_PREFACE.len() && read[..len] == H2_PREFACE[..len] {
        match stream.read(&mut read[len..]).await? {
            0 => break,
            n => len += n,
        }
    }
    read.truncate(len);
    Ok((read == H2_PREFACE, read))
}

/// A connection whose first bytes were read already: they are read again first.
struct Rewind<T> {
    read: Vec<u8>,
    at: usize,
    inner: T,
}

impl<T> Rewind<T> {
    fn new(read: Vec<u8>, inner: T) -> Self {
        Rewind { read, at: 0, inner }
    }
}

impl<T: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Rewind<T> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let this = &mut *self;
        if this.at < this.read.len() {
            let n = (this.read.len() - this.at).min(buf.remaining());
            buf.put_slice(&this.read[this.at..this.at + n]);
            this.at += n;
            if this.at == this.read.len() {
                this.read = Vec::new();
                this.at = 0;
            }
            return std::task::Poll::Ready(Ok(()));
        }
        std::pin::Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<T: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Rewind<T> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Accepts TLS connections until [`Phase::Stopped`], then closes the listener and drains the
/// connections. Returns whether every connection finished within [`shutdown::DRAIN_TIMEOUT`].
async fn accept_loop(
    listener: TcpListener,
    tls: Arc<TlsReloader>,
    app: Router,
    settings: ConnectionSettings,
    metrics: Arc<Metrics>,
    mut phase: watch::Receiver<Phase>,
) -> bool {
    let http = http_builder(&settings);
    // The protocol is the one ALPN agreed on; the first bytes tell it only for a client that
    // offered no ALPN (`sniff_h2`).
    let h1 = http.clone().http1_only();
    let h2 = http.clone().http2_only();
    let max_connections = settings.limits.max_connections;
    // One permit per open connection; the drain waits until all are back.
    let connections = Arc::new(Semaphore::new(max_connections as usize));
    // One permit per connection that may speak HTTP/2 (offered `h2` in ALPN).
    let http2_connections = Arc::new(Semaphore::new(
        settings.limits.max_http2_connections as usize,
    ));
    // Read by every HTTP/1.1 answer: whether to add `Connection: close`.
    let draining = Arc::new(AtomicBool::new(false));
    loop {
        // At the cap the listener stops accepting: a new connection waits in the kernel's listen
        // backlog (its TLS handshake with it) until a slot frees, instead of being accepted and
        // closed, which a client that does not retry would see as a failed admission.
        let permit = match connections.clone().try_acquire_owned() {
            Ok(permit) => Some(permit),
            Err(_) => {
                metrics.accept_paused();
                tracing::debug!(
                    max_connections,
                    "--max-connections open: new connections wait in the listen backlog"
                );
                None
            }
        };
        let permit = match permit {
            Some(permit) => permit,
            None => tokio::select! {
                changed = phase.changed() => {
                    if phase_reached(changed, &phase, &draining) {
                        break;
                    }
                    continue;
                }
                permit = connections.clone().acquire_owned() => permit.expect("never closed"),
            },
        };
        let accepted = tokio::select! {
            changed = phase.changed() => {
                if phase_reached(changed, &phase, &draining) {
                    break;
                }
                continue;
            }
            accepted = listener.accept() => accepted,
        };
        let (tcp, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // Out of file descriptors and the like (the caps are fitted to the open-files
                // limit, so not expected): wait a little rather than spin, and say so at most
                // once per interval.
                if let Some(suppressed) = WEBHOOK_ACCEPT_FAILED.allow() {
                    tracing::warn!(listener = "webhook", error = %e, suppressed, "accept failed");
                }
                tokio::time::sleep(ACCEPT_RETRY).await;
                continue;
            }
        };
        // An HTTP/2 slot, if one is free: without one the connection is offered HTTP/1.1 only.
        let http2_permit = http2_connections.clone().try_acquire_owned().ok();
        let config = match http2_permit {
            Some(_) => tls.current(),
            None => tls.current_http1_only(),
        };
        let Some(config) = config else {
            tracing::debug!(%peer, "connection closed: no TLS certificate loaded");
            continue;
        };
        if let Err(e) = configure_accepted(&tcp) {
            tracing::debug!(%peer, error = %e, "cannot set the connection's socket options");
        }
        let acceptor = TlsAcceptor::from(config);
        let (h1, h2) = (h1.clone(), h2.clone());
        let router = TowerToHyperService::new(app.clone());
        let metrics = metrics.clone();
        let settings = settings.clone();
        let phase = phase.clone();
        let draining = draining.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let _open = metrics.open_connection();
            let accepted = Instant::now();
            let header_read_timeout = settings.header_read_timeout;
            let handshake = settings.tls_handshake_deadline(accepted);
            // A connection that has sent nothing yet (not even its ClientHello) holds a slot for
            // a third of the handshake timeout at most.
            // (`peek`, not `readable`: tokio may report a new socket readable before any byte.)
            let mut first = [0u8; 1];
            match tokio::time::timeout_at(
                settings.client_hello_deadline(accepted).into(),
                tcp.peek(&mut first),
            )
            .await
            {
                Ok(Ok(0)) => {
                    tracing::debug!(%peer, "connection closed by the client before the TLS handshake");
                    return;
                }
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "connection failed before the TLS handshake");
                    return;
                }
                Err(_) => {
                    metrics.connection_dropped("tls_handshake_timeout");
                    if let Some(suppressed) = HANDSHAKE_TIMED_OUT.allow() {
                        tracing::warn!(%peer, suppressed, "TLS handshake timed out: no ClientHello");
                    }
                    return;
                }
            }
            let stream = match tokio::time::timeout_at(handshake.into(), acceptor.accept(tcp)).await
            {
                Ok(Ok(stream)) => stream,
                Ok(Err(e))
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::UnexpectedEof
                            | std::io::ErrorKind::ConnectionReset
                            | std::io::ErrorKind::BrokenPipe
                    ) =>
                {
                    tracing::debug!(%peer, error = %e, "connection closed by the client during the TLS handshake");
                    return;
                }
                Ok(Err(e)) => {
                    metrics.connection_dropped("tls_handshake_failed");
                    if let Some(suppressed) = HANDSHAKE_FAILED.allow() {
                        tracing::warn!(%peer, error = %Escaped(&e), suppressed, "TLS handshake failed");
                    }
                    return;
                }
                Err(_) => {
                    metrics.connection_dropped("tls_handshake_timeout");
                    if let Some(suppressed) = HANDSHAKE_TIMED_OUT.allow() {
                        tracing::warn!(%peer, suppressed, "TLS handshake timed out");
                    }
                    return;
                }
            };
            // The first request's time starts once the handshake is done.
            let activity = Arc::new(Activity::new());
            let alpn = stream.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
            let (stream, is_h2) = match alpn.as_deref() {
                Some(b"h2") => (Rewind::new(Vec::new(), stream), true),
                Some(b"http/1.1") => (Rewind::new(Vec::new(), stream), false),
                // No ALPN: HTTP/2 with prior knowledge if the client's first bytes are the h2
                // preface (and HTTP/2 is on offer), so that the connection is told apart from an
                // HTTP/1.1 one where that matters (GOAWAY while draining).
                _ if http2_permit.is_some() => {
                    let mut stream = stream;
                    match tokio::time::timeout(header_read_timeout, sniff_h2(&mut stream)).await {
                        Ok(Ok((is_h2, read))) => (Rewind::new(read, stream), is_h2),
                        Ok(Err(e)) => {
                            tracing::debug!(%peer, error = %e, "connection closed before its first request");
                            return;
                        }
                        Err(_) => {
                            metrics.connection_dropped("no_request");
                            tracing::debug!(%peer, reason = "no_request", "connection dropped");
                            return;
                        }
                    }
                }
                _ => (Rewind::new(Vec::new(), stream), false),
            };
            let http = if is_h2 { h2 } else { h1 };
            // The HTTP/2 slot is kept only by a connection that speaks HTTP/2.
            let _http2_permit = http2_permit.filter(|_| is_h2);
            let service = {
                let activity = activity.clone();
                hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                    activity.request_started();
                    let http1 = req.version() < axum::http::Version::HTTP_2;
                    let answer = hyper::service::Service::call(&router, req);
                    let draining = draining.clone();
                    async move {
                        let mut response = answer.await?;
                        // Decided when the answer is ready, so that a request in flight at the
                        // signal closes its connection too.
                        if http1 && draining.load(Ordering::Acquire) {
                            response
                                .headers_mut()
                                .insert(header::CONNECTION, CONNECTION_CLOSE);
                        }
                        Ok::<_, std::convert::Infallible>(response)
                    }
                })
            };
            let conn = http.serve_connection(TokioIo::new(stream), service);
            if let Some(reason) = watch_connection(conn, is_h2, &activity, &settings, phase).await {
                metrics.connection_dropped(reason);
                tracing::debug!(%peer, reason, "connection dropped");
            }
        });
    }
    drop(listener);
    tracing::info!("webhook listener closed; draining connections");
    tokio::time::timeout(
        shutdown::DRAIN_TIMEOUT,
        connections.acquire_many(max_connections),
    )
    .await
    .is_ok()
}

/// Runs one connection to its end and says why the server ended it, if it did:
///
/// - no complete first request within the header read timeout (hyper's own timeout covers
///   HTTP/1.1 requests once they start; this covers nothing at all, part of the h2 preface, or
///   part of the first headers): closed (`no_request`);
/// - no request started for `--idle-timeout`: GOAWAY and a graceful close (`idle_timeout`);
///   a client that keeps its streams open past as long again (it stopped reading, or its
///   flow-control window stays shut) is closed for good (`stalled`);
/// - [`Phase::Draining`]: an HTTP/2 connection gets a GOAWAY (its in-flight streams finish);
///   an HTTP/1.1 one is left to its client, whose next answer carries `Connection: close`;
/// - [`Phase::Stopped`]: a graceful close (an idle HTTP/1.1 connection closes at once); the
///   accept loop's drain bounds how long it may take.
async fn watch_connection<C>(
    conn: C,
    is_h2: bool,
    activity: &Activity,
    settings: &ConnectionSettings,
    mut phase: watch::Receiver<Phase>,
) -> Option<&'static str>
where
    C: GracefulConnection,
    C::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let idle = settings.limits.idle_timeout;
    let first_request = settings.header_read_timeout;
    tokio::pin!(conn);
    // Set when the server starts closing the connection for a reason of its own.
    let mut closing: Option<(&'static str, Instant)> = None;
    // A graceful close was asked for because of the phase.
    let mut shutting = false;
    let mut stopped = false;
    // A connection opened while draining acts on the phase at once.
    let mut now_phase = Some(*phase.borrow_and_update());
    loop {
        match now_phase.take() {
            Some(Phase::Draining) if is_h2 && closing.is_none() && !shutting => {
                conn.as_mut().graceful_shutdown();
                shutting = true;
            }
            Some(Phase::Stopped) => {
                stopped = true;
                if closing.is_none() && !shutting {
                    conn.as_mut().graceful_shutdown();
                    shutting = true;
                }
            }
            _ => {}
        }
        let wake = match (closing, activity.last_request()) {
            (Some((_, since)), _) => since + idle,
            (None, None) => activity.opened + first_request.min(idle),
            (None, Some(last)) => last + idle,
        };
        tokio::select! {
            result = conn.as_mut() => {
                let reason = closing.map(|(reason, _)| reason);
                return match result {
                    Ok(()) => reason,
                    Err(e) => {
                        let e: Box<dyn std::error::Error + Send + Sync> = e.into();
                        tracing::debug!(error = %Escaped(&e), "connection ended with an error");
                        drop_reason(&*e).or(reason)
                    }
                };
            }
            () = tokio::time::sleep_until(wake.into()), if !stopped => {
                let now = Instant::now();
                match (closing, activity.last_request()) {
                    (Some(_), _) => return Some("stalled"),
                    (None, None) if now >= activity.opened + first_request => {
                        return Some("no_request");
                    }
                    (None, None) => {}
                    (None, Some(last)) if now < last + idle => continue,
                    (None, Some(_)) => {}
                }
                if !shutting {
                    conn.as_mut().graceful_shutdown();
                }
                closing = Some(("idle_timeout", now));
            }
            changed = phase.changed(), if !stopped => {
                now_phase = Some(match changed {
                    Ok(()) => *phase.borrow_and_update(),
                    Err(_) => Phase::Stopped,
                });
            }
        }
    }
}
/// Serves `app` on `listener` through the webhook listener's own TLS and HTTP stack (the same
/// rustls configuration from `tls`, the same hyper-util auto builder, timeouts, ALPN dispatch and
/// graceful drain) until `stop` turns true; returns whether the drain finished in time.
///
/// For benchmarks: `benches/harnesses/loadgen.rs` runs its "floor" server (a router that answers without
/// the pipeline) through this, so that the only difference from `serve` is the handler.
pub async fn serve_router(
    listener: TcpListener,
    tls: TlsFiles,
    app: Router,
    header_read_timeout: Duration,
    mut stop: watch::Receiver<bool>,
) -> anyhow::Result<bool> {
    let reloader = Arc::new(TlsReloader::new(tls));
    if let tls::Reload::Failed(e) = reloader.reload() {
        return Err(e.into());
    }
    anyhow::ensure!(reloader.is_loaded(), "no TLS certificate loaded");
    let settings = ConnectionSettings {
        header_read_timeout,
        limits: Limits::default(),
    };
    let metrics = Arc::new(Metrics::new());
    let (phase_tx, phase) = watch::channel(Phase::Serving);
    tokio::spawn(async move {
        let _ = stop.wait_for(|stop| *stop).await;
        let _ = phase_tx.send(Phase::Stopped);
    });
    Ok(accept_loop(listener, reloader, app, settings, metrics, phase).await)
}

fn webhook_routes(state: Arc<AppState>) -> Router {
    Router::new()
        .route(
            "/mutate",
            post(|State(s): State<Arc<AppState>>, req: Request| admit(s, Webhook::Mutate, req)),
        )
        .route(
            "/validate",
            post(|State(s): State<Arc<AppState>>, req: Request| admit(s, Webhook::Validate, req)),
        )
        .route("/healthz", get(|| async { "ok\n" }))
        .fallback(not_found)
        .with_state(state)
}

fn probe_routes(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_handler))
        .fallback(not_found)
        .with_state(state)
}

async fn readyz(State(state): State<Arc<AppState>>) -> Response {
    let reasons = state.not_ready();
    if reasons.is_empty() {
        (StatusCode::OK, "ok\n").into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {}\n", reasons.join("; ")),
        )
            .into_response()
    }
}

async fn metrics_handler(State(state): State<Arc<AppState>>) -> Response {
    match state.metrics.encode() {
        Ok(text) => ([(header::CONTENT_TYPE, metrics::CONTENT_TYPE)], text).into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

async fn not_found(req: Request) -> Response {
    status_response(
        StatusCode::NOT_FOUND,
        "NotFound",
        format!(
            "{} is not served here; the webhook paths are /mutate and /validate",
            req.uri().path()
        ),
    )
}

/// A Kubernetes `Status` body, as the API server shows it in its error for the webhook call.
fn status_response(code: StatusCode, reason: &str, message: String) -> Response {
    let body = json!({
        "apiVersion": "v1",
        "kind": "Status",
        "status": "Failure",
        "reason": reason,
        "code": code.as_u16(),
        "message": message,
    });
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|media| media.trim().eq_ignore_ascii_case("application/json"))
}

/// Why a request was refused before the pipeline saw it.
struct Refusal {
    status: StatusCode,
    reason: &'static str,
    status_reason: &'static str,
    message: String,
    /// The rest of the body will not be read: an HTTP/1.1 connection is closed after the
    /// answer (`Connection: close`); an HTTP/2 stream is reset after it.
    close: bool,
    /// The rest of a body refused for what it would cost to hold, to be read and dropped
    /// before an HTTP/1.1 connection is closed ([`drain_refused_body`]).
    unread: Option<Limited<axum::body::Body>>,
}

impl Refusal {
    fn new(
        status: StatusCode,
        reason: &'static str,
        status_reason: &'static str,
        message: String,
    ) -> Self {
        Refusal {
            status,
            reason,
            status_reason,
            message,
            close: false,
            unread: None,
        }
    }
}

/// A request's body, read in full, and the decision slot it holds: both are given back when
/// the decision is made.
struct ReadBody<'s> {
    bytes: axum::body::Bytes,
    _held: Held<'s>,
    _large: Option<SemaphorePermit<'s>>,
    _slot: SemaphorePermit<'s>,
}

/// Bodies past this size are decided one at a time. No object past 1.5 MiB can be stored (etcd's
/// limit), so such a request is hostile or doomed; its decision is linear but costs about 20
/// times the body in memory when a controller's templates are mutated in memory (a 3 MiB
/// Deployment of many volumes: ~50 MB and a tenth of a second, docs/benchmarks.md), and four at
/// once would come near the chart's 256 Mi.
const LARGE_BODY_BYTES: usize = 1 << 20;

/// Takes a permit of `slots` at once, or waits for one until `wait`; `None` when none came.
async fn take_slot(slots: &Semaphore, wait: Instant) -> Option<SemaphorePermit<'_>> {
    // A free slot is taken at once; `try_acquire` finds none while others wait for one, so the
    // order of arrival holds.
    match slots.try_acquire() {
        Ok(permit) => Some(permit),
        Err(_) => tokio::time::timeout_at(wait.into(), slots.acquire())
            .await
            .ok()?
            .ok(),
    }
}

/// Reads the body, then takes one of the `--max-requests-in-flight` decision slots. Reading
/// holds no slot: the body must come at most `--max-body-bytes` long, each part within
/// `--body-progress-timeout` of the one before, at `--min-body-bytes-per-second` or faster once
/// its first second is over (slower: 408 and the rest is not read), and all of it within the
/// request's budget (counted from `arrived`); the buffer of a body that comes in parts is taken
/// from `--max-buffered-body-bytes` as it grows (none left: 503 at once). Requests with their
/// whole body wait for a slot in arrival order (a body over [`LARGE_BODY_BYTES`] first for the
/// one slot of such bodies); one that has none within the progress timeout gets 429.
///
/// A part that is already there and a free slot are taken without arming a timer (the usual
/// case: the whole body came with the headers); a body that comes in one part is passed on as
/// it came, without a copy and without taking from the budget.
async fn read_body<'s>(
    state: &'s AppState,
    req: Request,
    budget: Budget,
    arrived: Instant,
) -> Result<ReadBody<'s>, Refusal> {
    let limit = state.max_body_bytes;
    let too_large = |declared: Option<u64>| {
        Refusal::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            "RequestEntityTooLarge",
            match declared {
                Some(n) => format!(
                    "the request body ({n} bytes) is larger than the limit of {limit} bytes (--max-body-bytes)"
                ),
                None => format!(
                    "the request body is larger than the limit of {limit} bytes (--max-body-bytes)"
                ),
            },
        )
    };
    if !is_json(req.headers()) {
        let got = req
            .headers()
            .get(header::CONTENT_TYPE)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .unwrap_or_else(|| "none".into());
        return Err(Refusal::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "UnsupportedMediaType",
            format!("Content-Type must be application/json, not `{got}`"),
        ));
    }
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if let Some(n) = declared
        && n > limit as u64
    {
        return Err(too_large(Some(n)));
    }
    let progress = state.limits.body_progress_timeout;
    let deadline = arrived + budget.budget;
    let rate = MinRate {
        arrived,
        bytes_per_second: state.limits.min_body_bytes_per_second,
    };
    let mut body = Limited::new(req.into_body(), limit);
    let mut held = Held::none(&state.body_budget);
    // The first part as it came; a second part starts a copy of both into `joined`.
    let mut first: Option<axum::body::Bytes> = None;
    let mut joined = Vec::new();
    let mut received = 0u64;
    loop {
        let frame = match body.frame().now_or_never() {
            Some(frame) => frame,
            None => {
                let behind = rate.behind_at(received, deadline);
                let next = (Instant::now() + progress).min(deadline).min(behind);
                match tokio::time::timeout_at(next.into(), body.frame()).await {
                    Ok(frame) => frame,
                    Err(_) if next >= deadline => {
                        return Err(Refusal::new(
                            StatusCode::REQUEST_TIMEOUT,
                            "deadline_exceeded",
                            "Timeout",
                            format!(
                                "the request body did not arrive within {:?} (the {:?} timeout less a margin for the answer); nothing was decided",
                                budget.budget, budget.timeout
                            ),
                        ));
                    }
                    Err(_) if next >= behind => {
                        let elapsed = arrived.elapsed();
                        return Err(Refusal {
                            close: true,
                            ..Refusal::new(
                                StatusCode::REQUEST_TIMEOUT,
                                "body_too_slow",
                                "Timeout",
                                format!(
                                    "the request body came slower than {} bytes/s after its first second \
                                     ({received} bytes{} in {:.1}s; --min-body-bytes-per-second); nothing was decided",
                                    rate.bytes_per_second,
                                    declared.map(|n| format!(" of {n}")).unwrap_or_default(),
                                    elapsed.as_secs_f64()
                                ),
                            )
                        });
                    }
                    Err(_) => {
                        return Err(Refusal::new(
                            StatusCode::REQUEST_TIMEOUT,
                            "body_stalled",
                            "Timeout",
                            format!(
                                "no part of the request body arrived for {progress:?} (--body-progress-timeout); nothing was decided"
                            ),
                        ));
                    }
                }
            }
        };
        match frame {
            None => break,
            Some(Ok(frame)) => {
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                received += data.len() as u64;
                match first.take() {
                    None if joined.is_empty() => first = Some(data),
                    held_part => {
                        let needed =
                            joined.len() + held_part.as_ref().map_or(0, |b| b.len()) + data.len();
                        if needed > joined.capacity() {
                            let expected = declared.map_or(limit, |n| n as usize);
                            let capacity =
                                body::grown_capacity(joined.capacity(), needed, expected);
                            if !held.grow((capacity - joined.capacity()) as u64) {
                                return Err(budget_exhausted(state, received, declared, body));
                            }
                            joined.reserve_exact(capacity - joined.len());
                        }
                        if let Some(part) = held_part {
                            joined.extend_from_slice(&part);
                        }
                        joined.extend_from_slice(&data);
                    }
                }
            }
            Some(Err(e)) if e.is::<LengthLimitError>() => return Err(too_large(None)),
            Some(Err(e)) => {
                return Err(Refusal::new(
                    StatusCode::BAD_REQUEST,
                    "body_read_error",
                    "BadRequest",
                    format!("cannot read the request body: {e}"),
                ));
            }
        }
    }
    let wait = (Instant::now() + progress).min(deadline);
    let len = first.as_ref().map_or(joined.len(), |b| b.len());
    let large = match len > LARGE_BODY_BYTES {
        false => None,
        true => Some(take_slot(&state.large_decision, wait).await.ok_or_else(|| {
            too_many(format!(
                "a decision on another body over {LARGE_BODY_BYTES} bytes was being made for \
                 {progress:?} (they are made one at a time); retry"
            ))
        })?),
    };
    let slot = take_slot(&state.decision_slots, wait)
        .await
        .ok_or_else(|| {
            too_many(format!(
                "{} decisions were being made for {progress:?} (--max-requests-in-flight); retry",
                state.limits.max_requests_in_flight
            ))
        })?;
    let bytes = first.unwrap_or_else(|| joined.into());
    Ok(ReadBody {
        bytes,
        _held: held,
        _large: large,
        _slot: slot,
    })
}

/// 429: no slot to decide in; the API server retries within its timeout.
fn too_many(message: String) -> Refusal {
    Refusal::new(
        StatusCode::TOO_MANY_REQUESTS,
        "too_many_requests",
        "TooManyRequests",
        message,
    )
}

/// 503 for a body that does not fit in what is left of `--max-buffered-body-bytes`.
fn budget_exhausted(
    state: &AppState,
    received: u64,
    declared: Option<u64>,
    rest: Limited<axum::body::Body>,
) -> Refusal {
    Refusal {
        close: true,
        unread: Some(rest),
        ..Refusal::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "body_budget_exhausted",
            "ServiceUnavailable",
            format!(
                "the request bodies being read hold {} of {} bytes (--max-buffered-body-bytes); this one ({received} bytes{} so far) does not fit; retry",
                state.body_budget.used(),
                state.limits.max_buffered_body_bytes,
                declared.map(|n| format!(" of {n}")).unwrap_or_default(),
            ),
        )
    }
}

/// How long the rest of a body refused for lack of buffer memory is read after the answer.
const DRAIN_REFUSED_BODY: Duration = Duration::from_secs(1);

/// Reads and drops the rest of a refused body, for at most [`DRAIN_REFUSED_BODY`] and
/// `--max-body-bytes`, before the HTTP/1.1 connection is closed: a client that writes its whole
/// body before it reads (kube-apiserver's) then reads the 503 and its `Retry-After`, which it
/// retries, where closing with the body unread would reset the connection under its write (a
/// transport error, never retried). Each part is dropped as it comes: no memory is held.
async fn drain_refused_body(mut rest: Limited<axum::body::Body>) {
    let _ = tokio::time::timeout(DRAIN_REFUSED_BODY, async {
        while let Some(Ok(_)) = rest.frame().await {}
    })
    .await;
}

/// The most bytes of a request-derived string a log line copies: a 100 KB uid or name must not
/// make a 200 KB line.
pub const LOG_FIELD_MAX_BYTES: usize = 256;

/// A value from a request or a peer, for a log line: at most [`LOG_FIELD_MAX_BYTES`] of its text
/// (cut at a character boundary, then `…(N more bytes)`), with control characters (newlines
/// above all), the Unicode line and paragraph separators and the bidirectional controls written
/// escaped ([`log_format::needs_escape`]), so that a name or uid can neither forge a line nor
/// change how one reads.
pub struct Escaped<T>(pub T);

impl<T: std::fmt::Display> std::fmt::Display for Escaped<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use std::fmt::Write as _;
        let mut out = log_format::Sanitizer::new(f, LOG_FIELD_MAX_BYTES);
        write!(out, "{}", self.0)?;
        out.finish()
    }
}

/// `POST /mutate` and `POST /validate`.
async fn admit(state: Arc<AppState>, webhook: Webhook, req: Request) -> Response {
    let started = Instant::now();
    let _inflight = state.metrics.inflight();
    let budget = Budget::from_query(req.uri().query());
    let http1 = req.version() < axum::http::Version::HTTP_2;
    let read = match read_body(&state, req, budget, started).await {
        Ok(read) => read,
        Err(r) => {
            let seconds = started.elapsed().as_secs_f64();
            state.metrics.error(r.reason);
            state
                .metrics
                .observe(webhook, "none", "none", false, seconds);
            tracing::warn!(
                webhook = webhook.as_str(),
                status = r.status.as_u16(),
                reason = r.reason,
                latency_ms = seconds * 1e3,
                "admission request refused: {}",
                Escaped(&r.message)
            );
            let mut response = status_response(r.status, r.status_reason, r.message);
            if matches!(
                r.status,
                StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE
            ) {
                response
                    .headers_mut()
                    .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
            }
            if r.close && http1 {
                response
                    .headers_mut()
                    .insert(header::CONNECTION, CONNECTION_CLOSE);
                if let Some(rest) = r.unread {
                    tokio::spawn(drain_refused_body(rest));
                }
            }
            return response;
        }
    };
    // The pipeline is CPU-bound and takes microseconds: it runs inline.
    let view = state.store.view();
    let namespaces = state.namespaces.view();
    let ctx = Context {
        config: &state.config,
        caches: view.caches(),
        namespaces: &namespaces,
        now: Some(crate::unix_now()),
    };
    let mut outcome = admission::review(webhook, &read.bytes, &ctx);
    if let (Some(reader), Some(claim)) = (&state.claim_reader, &outcome.summary.claim_to_read) {
        // The decision took the claim as missing; the watch may just not have delivered it.
        let namespace = &outcome.summary.namespace;
        if let ClaimRead::Found(claim_state) = reader.read(namespace, claim).await {
            let index = claims::with_claim(&view.index, namespace, claim, claim_state);
            let caches = match view.synced {
                true => Caches::Ready(&index),
                false => Caches::NotSynced(&index),
            };
            outcome = admission::review(webhook, &read.bytes, &Context { caches, ..ctx });
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    state.metrics.admission(webhook, &outcome.summary, seconds);
    if state.log_admissions || is_notable(&outcome.summary, outcome.http_status) {
        log_admission(webhook, &outcome.summary, outcome.http_status, seconds);
    } else {
        log_admission_debug(webhook, &outcome.summary, outcome.http_status, seconds);
    }
    tracing::trace!(response = %Escaped(String::from_utf8_lossy(&outcome.body)), "admission response");
    let status = StatusCode::from_u16(outcome.http_status).unwrap_or(StatusCode::OK);
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        Body::from(outcome.body),
    )
        .into_response()
}

/// The admission event at `level` (the fields `log_format::ADMISSION_FIELDS` lists, in order).
macro_rules! admission_event {
    ($level:expr, $webhook:expr, $s:expr, $http_status:expr, $seconds:expr) => {
        tracing::event!(
            $level,
            webhook = $webhook.as_str(),
            uid = %Escaped(&$s.uid),
            kind = %Escaped(&$s.kind),
            namespace = %Escaped(&$s.namespace),
            name = %Escaped(&$s.name),
            operation = %Escaped(&$s.operation),
            dry_run = $s.dry_run,
            allowed = $s.allowed,
            patch_operations = $s.patch_operations,
            status = $http_status,
            error = $s.error,
            latency_ms = $seconds * 1e3,
            "admission"
        )
    };
}

/// Whether an admission is logged at `info` whatever `--log-admissions` says: a denial (a patch
/// the server refuses to build, past the size an object can have, is one), or a request that
/// could not be reviewed. At 150 admissions a second a line for each would be 3.6 GB (text) to
/// 4.4 GB (JSON) of log a day per replica; the counts are in the metrics
/// (`modelgate_admission_requests_total`, `modelgate_policy_results_total`).
pub fn is_notable(s: &admission::Summary, http_status: u16) -> bool {
    !s.allowed || s.error.is_some() || http_status != 200
}

/// The `info` line of an admission.
pub fn log_admission(webhook: Webhook, s: &admission::Summary, http_status: u16, seconds: f64) {
    admission_event!(tracing::Level::INFO, webhook, s, http_status, seconds);
}

/// The same line at `debug`: every other admission, unless `--log-admissions`.
pub fn log_admission_debug(
    webhook: Webhook,
    s: &admission::Summary,
    http_status: u16,
    seconds: f64,
) {
    admission_event!(tracing::Level::DEBUG, webhook, s, http_status, seconds);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_field_keeps_at_most_256_bytes_and_escapes_control_characters() {
        assert_eq!(Escaped("pod-1").to_string(), "pod-1");
        assert_eq!(Escaped("a\nb").to_string(), "a\\nb");
        let long = "x".repeat(100_000);
        let line = Escaped(&long).to_string();
        assert_eq!(line, format!("{}…(99744 more bytes)", "x".repeat(256)));
        // Cut at a character boundary: 255 bytes of `x` then a two-byte `é`.
        let multi = format!("{}é{}", "x".repeat(255), "y".repeat(10));
        assert_eq!(
            Escaped(&multi).to_string(),
            format!("{}…(12 more bytes)", "x".repeat(255))
        );
        let controls = "\n".repeat(1000);
        assert_eq!(
            Escaped(&controls).to_string(),
            format!("{}…(744 more bytes)", "\\n".repeat(256))
        );
    }

    #[tokio::test]
    async fn accepted_connections_send_without_nagle_and_with_a_bounded_buffer() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let _client = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (tcp, _) = listener.accept().await.unwrap();
        assert!(!tcp.nodelay().unwrap(), "the kernel's default has Nagle on");
        configure_accepted(&tcp).unwrap();
        assert!(tcp.nodelay().unwrap());
        // Linux doubles the value it is given.
        let sndbuf = socket2::SockRef::from(&tcp).send_buffer_size().unwrap();
        assert!(sndbuf <= 2 * limits::SOCKET_SEND_BUF_BYTES, "{sndbuf}");
    }

    #[tokio::test]
    async fn the_h2_preface_is_told_apart_and_read_again() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        for (sent, is_h2, sniffed) in [
            (&b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04"[..], true, 24),
            // What one read brings, once it cannot be the preface.
            (&b"POST /mutate HTTP/1.1\r\n"[..], false, 23),
            (&b"GET / HTTP/1.1\r\n"[..], false, 16),
            (&b"PRI"[..], false, 3),
        ] {
            let (mut client, server) = tokio::io::duplex(1024);
            client.write_all(sent).await.unwrap();
            // The client stays open: the sniffer must not wait for more than it needs, except
            // for a prefix of the preface cut short (then the end of the stream ends it).
            if sent.len() < H2_PREFACE.len() && H2_PREFACE.starts_with(sent) {
                drop(client);
                let mut server = server;
                let (h2, read) = sniff_h2(&mut server).await.unwrap();
                assert_eq!((h2, read.len()), (is_h2, sniffed));
                continue;
            }
            let mut server = server;
            let (h2, read) = sniff_h2(&mut server).await.unwrap();
            assert_eq!((h2, read.len()), (is_h2, sniffed), "{sent:?}");
            drop(client);
            let mut again = Vec::new();
            Rewind::new(read, server)
                .read_to_end(&mut again)
                .await
                .unwrap();
            assert_eq!(again, sent, "every byte read again, in order");
        }
    }
}
