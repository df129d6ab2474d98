//! `modelgate serve`: the admission pipeline behind TLS, plus a plain-HTTP probe listener.
//!
//! - Webhook listener (TLS 1.2+, ALPN `h2` and `http/1.1`): `POST /mutate`, `POST /validate`,
//!   `GET /healthz`. Each body goes to [`admission::review`], the one pipeline; this module only
//!   adds HTTP: content type (415), body limit (413), deadline (408), unknown paths (404).
//! - Probe listener: `GET /healthz` (alive), `GET /readyz` (certificate loaded, caches synced,
//!   not shutting down), `GET /metrics`.
//! - Shutdown: at the first SIGTERM/SIGINT `/readyz` turns 503 and the webhook keeps serving,
//!   new connections included, for `--shutdown-grace` (endpoint removal takes a moment to reach
//!   the API server); then the listener closes, connections finish their in-flight requests
//!   (at most [`shutdown::DRAIN_TIMEOUT`]) and [`Server::run`] returns.

pub mod deadline;
pub mod metrics;
pub mod process_metrics;
pub mod shutdown;
pub mod tls;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

use crate::admission::{self, Context, Webhook};
use crate::cache::CacheStore;
use crate::config::PolicyConfig;
use deadline::Budget;
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
    /// Time a client has to send a request's headers (HTTP/1.1) or finish the TLS handshake.
    pub header_read_timeout: Duration,
    pub config: PolicyConfig,
    /// The model caches the admissions read.
    pub store: Arc<CacheStore>,
    /// Whether the cache source lets `/readyz` say ready (for static caches and the plain
    /// store: `store.is_synced()`).
    pub caches_ready: CachesReady,
    /// The metrics; other parts of the program may have registered theirs already.
    pub metrics: Metrics,
}

/// Asked by every `/readyz`: must be cheap.
pub type CachesReady = Box<dyn Fn() -> bool + Send + Sync>;

/// State shared by the handlers.
struct AppState {
    config: PolicyConfig,
    store: Arc<CacheStore>,
    caches_ready: CachesReady,
    metrics: Arc<Metrics>,
    tls: Arc<TlsReloader>,
    draining: AtomicBool,
    max_body_bytes: usize,
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
        reasons
    }
}

/// Bound listeners, ready to run.
pub struct Server {
    state: Arc<AppState>,
    webhook: TcpListener,
    probe: TcpListener,
    shutdown_grace: Duration,
    header_read_timeout: Duration,
}

impl Server {
    /// Loads the certificate (a failure is logged; `/readyz` stays 503 until a good pair
    /// appears) and binds both listeners.
    pub async fn bind(options: ServeOptions) -> anyhow::Result<Server> {
        let metrics = Arc::new(options.metrics);
        let reloader = Arc::new(TlsReloader::new(options.tls));
        reloader.reload_and_report(&metrics);
        let webhook = TcpListener::bind(options.listen)
            .await
            .with_context(|| format!("--listen {}: cannot bind", options.listen))?;
        let probe = TcpListener::bind(options.probe_listen)
            .await
            .with_context(|| format!("--probe-listen {}: cannot bind", options.probe_listen))?;
        Ok(Server {
            state: Arc::new(AppState {
                config: options.config,
                store: options.store,
                caches_ready: options.caches_ready,
                metrics,
                tls: reloader,
                draining: AtomicBool::new(false),
                max_body_bytes: options.max_body_bytes,
            }),
            webhook,
            probe,
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
            shutdown_grace,
            header_read_timeout,
        } = self;
        let webhook_addr = webhook.local_addr()?;
        let probe_addr = probe.local_addr()?;

        let reload = tokio::spawn(state.tls.clone().watch(state.metrics.clone()));
        let probe_router = probe_routes(state.clone());
        let probe_task = tokio::spawn(async move {
            if let Err(e) = axum::serve(probe, probe_router).await {
                tracing::error!(error = %e, "probe listener failed");
            }
        });
        let (stop_tx, stop_rx) = watch::channel(false);
        let accept = tokio::spawn(accept_loop(
            webhook,
            state.tls.clone(),
            webhook_routes(state.clone()),
            header_read_timeout,
            stop_rx,
        ));
        tracing::info!(listener = "webhook", addr = %webhook_addr, "listening");
        tracing::info!(listener = "probe", addr = %probe_addr, "listening");

        let first = signals.recv().await;
        state.draining.store(true, Ordering::Release);
        tracing::info!(
            signal = first,
            grace = ?shutdown_grace,
            "shutting down: /readyz is 503; serving on for the grace period (a second signal ends it)"
        );
        tokio::select! {
            () = tokio::time::sleep(shutdown_grace) => {}
            again = signals.recv() => tracing::info!(signal = again, "grace period cut short"),
        }
        let _ = stop_tx.send(true);
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

/// Accepts TLS connections until `stop`, then closes the listener and drains the connections.
/// Returns whether every connection finished within [`shutdown::DRAIN_TIMEOUT`].
async fn accept_loop(
    listener: TcpListener,
    tls: Arc<TlsReloader>,
    app: Router,
    header_read_timeout: Duration,
    mut stop: watch::Receiver<bool>,
) -> bool {
    let mut http = auto::Builder::new(TokioExecutor::new());
    http.http1()
        .timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout);
    http.http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(10));
    // The protocol is the one ALPN agreed on; sniffing the first bytes is only the fallback for
    // a client that offered no ALPN.
    let h1 = http.clone().http1_only();
    let h2 = http.clone().http2_only();
    let graceful = GracefulShutdown::new();
    loop {
        let stopped = async {
            let _ = stop.wait_for(|stop| *stop).await;
        };
        let accepted = tokio::select! {
            () = stopped => break,
            accepted = listener.accept() => accepted,
        };
        let (tcp, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // Out of file descriptors and the like: wait a little rather than spin.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Some(config) = tls.current() else {
            tracing::debug!(%peer, "connection closed: no TLS certificate loaded");
            continue;
        };
        let acceptor = TlsAcceptor::from(config);
        let (http, h1, h2) = (http.clone(), h1.clone(), h2.clone());
        // Set by the first request, so that a connection that never sends one is dropped.
        let requested = Arc::new(AtomicBool::new(false));
        let service = {
            let requested = requested.clone();
            let router = TowerToHyperService::new(app.clone());
            hyper::service::service_fn(move |req| {
                requested.store(true, Ordering::Relaxed);
                hyper::service::Service::call(&router, req)
            })
        };
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let stream = match tokio::time::timeout(header_read_timeout, acceptor.accept(tcp)).await
            {
                Ok(Ok(stream)) => stream,
                Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                    tracing::debug!(%peer, "connection closed during the TLS handshake");
                    return;
                }
                Ok(Err(e)) => {
                    tracing::warn!(%peer, error = %e, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::warn!(%peer, "TLS handshake timed out");
                    return;
                }
            };
            let http = match stream.get_ref().1.alpn_protocol() {
                Some(b"h2") => h2,
                Some(b"http/1.1") => h1,
                _ => http,
            };
            let conn = watcher.watch(http.serve_connection(TokioIo::new(stream), service));
            // hyper's header timeout covers HTTP/1.1 requests once they start; this covers a
            // client that completes the handshake and then sends no complete first request
            // (nothing, part of the h2 preface, part of the first headers).
            let no_request = async {
                tokio::time::sleep(header_read_timeout).await;
                if requested.load(Ordering::Relaxed) {
                    std::future::pending::<()>().await;
                }
            };
            tokio::select! {
                result = conn => if let Err(e) = result {
                    tracing::debug!(%peer, error = %e, "connection ended with an error");
                },
                () = no_request => {
                    tracing::debug!(%peer, "connection closed: no request within the header read timeout");
                }
            }
        });
    }
    drop(listener);
    tracing::info!("webhook listener closed; draining connections");
    tokio::time::timeout(shutdown::DRAIN_TIMEOUT, graceful.shutdown())
        .await
        .is_ok()
}

/// Serves `app` on `listener` through the webhook listener's own TLS and HTTP stack (the same
/// rustls configuration from `tls`, the same hyper-util auto builder, timeouts, ALPN dispatch and
/// graceful drain) until `stop` turns true; returns whether the drain finished in time.
///
/// For benchmarks: `examples/loadgen.rs` runs its "floor" server (a router that answers without
/// the pipeline) through this, so that the only difference from `serve` is the handler.
pub async fn serve_router(
    listener: TcpListener,
    tls: TlsFiles,
    app: Router,
    header_read_timeout: Duration,
    stop: watch::Receiver<bool>,
) -> anyhow::Result<bool> {
    let reloader = Arc::new(TlsReloader::new(tls));
    if let tls::Reload::Failed(e) = reloader.reload() {
        return Err(e.into());
    }
    anyhow::ensure!(reloader.is_loaded(), "no TLS certificate loaded");
    Ok(accept_loop(listener, reloader, app, header_read_timeout, stop).await)
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
}

async fn read_body(
    state: &AppState,
    req: Request,
    budget: Budget,
) -> Result<axum::body::Bytes, Refusal> {
    let limit = state.max_body_bytes;
    let too_large = |declared: Option<u64>| Refusal {
        status: StatusCode::PAYLOAD_TOO_LARGE,
        reason: "payload_too_large",
        status_reason: "RequestEntityTooLarge",
        message: match declared {
            Some(n) => format!(
                "the request body ({n} bytes) is larger than the limit of {limit} bytes (--max-body-bytes)"
            ),
            None => format!(
                "the request body is larger than the limit of {limit} bytes (--max-body-bytes)"
            ),
        },
    };
    if !is_json(req.headers()) {
        let got = req
            .headers()
            .get(header::CONTENT_TYPE)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .unwrap_or_else(|| "none".into());
        return Err(Refusal {
            status: StatusCode::UNSUPPORTED_MEDIA_TYPE,
            reason: "unsupported_media_type",
            status_reason: "UnsupportedMediaType",
            message: format!("Content-Type must be application/json, not `{got}`"),
        });
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
    let body = Limited::new(req.into_body(), limit);
    match tokio::time::timeout(budget.budget, body.collect()).await {
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(e)) if e.is::<LengthLimitError>() => Err(too_large(None)),
        Ok(Err(e)) => Err(Refusal {
            status: StatusCode::BAD_REQUEST,
            reason: "body_read_error",
            status_reason: "BadRequest",
            message: format!("cannot read the request body: {e}"),
        }),
        Err(_) => Err(Refusal {
            status: StatusCode::REQUEST_TIMEOUT,
            reason: "deadline_exceeded",
            status_reason: "Timeout",
            message: format!(
                "the request body did not arrive within {:?} (the {:?} timeout less a margin for the answer); nothing was decided",
                budget.budget, budget.timeout
            ),
        }),
    }
}

/// A string from the request, for a log line: control characters (newlines above all) are
/// written escaped, so that a name or uid cannot forge a line of the text log format.
struct Escaped<'a>(&'a str);

impl std::fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use std::fmt::Write as _;
        for c in self.0.chars() {
            if c.is_control() {
                write!(f, "{}", c.escape_default())?;
            } else {
                f.write_char(c)?;
            }
        }
        Ok(())
    }
}

/// `POST /mutate` and `POST /validate`.
async fn admit(state: Arc<AppState>, webhook: Webhook, req: Request) -> Response {
    let started = Instant::now();
    let _inflight = state.metrics.inflight();
    let budget = Budget::from_query(req.uri().query());
    let body = match read_body(&state, req, budget).await {
        Ok(b) => b,
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
                r.message
            );
            return status_response(r.status, r.status_reason, r.message);
        }
    };
    // The pipeline is CPU-bound and takes microseconds: it runs inline.
    let view = state.store.view();
    let ctx = Context {
        config: &state.config,
        caches: view.caches(),
    };
    let outcome = admission::review(webhook, &body, &ctx);
    let seconds = started.elapsed().as_secs_f64();
    state.metrics.admission(webhook, &outcome.summary, seconds);
    let s = &outcome.summary;
    tracing::info!(
        webhook = webhook.as_str(),
        uid = %Escaped(&s.uid),
        kind = %Escaped(&s.kind),
        namespace = %Escaped(&s.namespace),
        name = %Escaped(&s.name),
        operation = %Escaped(&s.operation),
        dry_run = s.dry_run,
        allowed = s.allowed,
        patch_operations = s.patch_operations,
        status = outcome.http_status,
        error = s.error,
        latency_ms = seconds * 1e3,
        "admission"
    );
    tracing::trace!(response = %String::from_utf8_lossy(&outcome.body), "admission response");
    let status = StatusCode::from_u16(outcome.http_status).unwrap_or(StatusCode::OK);
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        Body::from(outcome.body),
    )
        .into_response()
}
