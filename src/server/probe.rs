//! The probe listener: `/healthz`, `/readyz` and `/metrics` over plain HTTP/1.1, for the kubelet
//! and Prometheus. Any pod can reach its port unless a NetworkPolicy says otherwise, so it has
//! limits of its own ([`ProbeLimits`]), apart from the webhook's, and its connections can never
//! take the file descriptors or the memory the webhook listener needs:
//!
//! - at most `--probe-max-connections` connections. At the cap a new connection closes the one
//!   that has been idle longest (no request started for the longest time), instead of waiting
//!   behind it, unless that one has bytes waiting to be read and was active within the last
//!   [`PROTECTED_FOR`] (a request the server is about to read: then the next idlest, and when
//!   every connection is such, the new one waits for a slot). The kubelet opens a connection for
//!   each probe and sends its request at once, so idle connections, however many, never keep a
//!   probe out, and a burst of new connections does not close a probe before the server has
//!   read its request;
//! - a request head of at most `--probe-max-header-bytes` and [`MAX_HEADERS`] headers (hyper
//!   answers 431 beyond, and closes);
//! - the first request within `--probe-header-read-timeout`, and none started for
//!   `--probe-idle-timeout` closes the connection (also the longest wait for a later head);
//! - HTTP/1.1 only: neither the kubelet nor Prometheus speak anything else to a plain-HTTP port.
//!
//! Every connection the server closes is counted in `modelgate_probe_connections_dropped_total`
//! by reason; `modelgate_probe_open_connections` is the gauge against the cap.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::Request;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{Notify, Semaphore, watch};

use super::limits::{Limits, ProbeLimits};
use super::log_format::Throttle;
use super::metrics::Metrics;
use super::{ACCEPT_RETRY, Activity, ConnectionSettings, Phase, configure_accepted};

/// Headers a probe request may have: the kubelet sends three, Prometheus five or six.
pub const MAX_HEADERS: usize = 64;

/// How long a new connection at the cap waits for the slot of the connection it closed (which
/// lets go at its next poll).
const EVICTION_WAIT: Duration = Duration::from_secs(1);

/// A connection with bytes waiting to be read (a request the server has not read yet: a probe's,
/// sent with its connection) is not closed to make room while it was active (opened, or its
/// last request started) within this time. Past it, it is: a client that pipelines requests and
/// never reads the answers leaves its input unread too, and must not hold a slot for it.
pub const PROTECTED_FOR: Duration = Duration::from_secs(1);

/// How often a new connection at the cap looks again for one to close, while every connection
/// is protected ([`PROTECTED_FOR`]) and none ends.
const EVICTION_RETRY: Duration = Duration::from_millis(10);

/// Bytes received on socket `fd` and not read yet (0 when it cannot be told).
fn unread_bytes(fd: std::os::fd::RawFd) -> usize {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int through the pointer; on a descriptor that is no longer a
    // socket it fails, and the answer is 0.
    match unsafe { libc::ioctl(fd, libc::FIONREAD, &mut n) } {
        0 => usize::try_from(n).unwrap_or(0),
        _ => 0,
    }
}

static PROBE_ACCEPT_FAILED: Throttle = Throttle::new();

/// One open probe connection: when it last started a request, its socket (to see whether a
/// request is waiting to be read), and the signal that closes it.
struct Entry {
    activity: Activity,
    fd: std::os::fd::RawFd,
    evict: Notify,
}

impl Entry {
    fn last_active(&self) -> Instant {
        self.activity.last_request().unwrap_or(self.activity.opened)
    }
}

#[derive(Default)]
struct Open {
    next_id: u64,
    conns: HashMap<u64, Arc<Entry>>,
}

/// The open probe connections.
#[derive(Clone, Default)]
struct Table(Arc<Mutex<Open>>);

/// Takes a connection out of the table when it ends.
struct Registered {
    table: Table,
    id: u64,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.table.lock().conns.remove(&self.id);
    }
}

impl Table {
    fn lock(&self) -> MutexGuard<'_, Open> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn register(&self, fd: std::os::fd::RawFd) -> (Arc<Entry>, Registered) {
        let entry = Arc::new(Entry {
            activity: Activity::new(),
            fd,
            evict: Notify::new(),
        });
        let mut open = self.lock();
        let id = open.next_id;
        open.next_id += 1;
        open.conns.insert(id, entry.clone());
        drop(open);
        (
            entry,
            Registered {
                table: self.clone(),
                id,
            },
        )
    }

    /// Closes the connection idle longest, passing over those with a request waiting to be
    /// read that were active within `protected_for` of `now`; false when every connection is
    /// such (or there is none).
    fn evict_idlest(
        &self,
        protected_for: Duration,
        now: Instant,
        unread: impl Fn(&Entry) -> usize,
    ) -> bool {
        let mut open = self.lock();
        let mut by_age: Vec<(Instant, u64)> = open
            .conns
            .iter()
            .map(|(id, e)| (e.last_active(), *id))
            .collect();
        by_age.sort_unstable();
        let victim = by_age.into_iter().find(|(since, id)| {
            now >= *since + protected_for || open.conns.get(id).is_some_and(|e| unread(e) == 0)
        });
        match victim.and_then(|(_, id)| open.conns.remove(&id)) {
            Some(entry) => {
                // Stored if the connection's task is not waiting yet: it ends at its next poll.
                entry.evict.notify_one();
                true
            }
            None => false,
        }
    }
}

/// How long after the idle timeout hyper's own head timer may close a kept-alive connection.
const IDLE_CLOSE_MARGIN: Duration = Duration::from_secs(1);

/// Serves `app` on `listener` for as long as the task runs (the process: `/readyz` answers 503
/// through the shutdown).
pub(super) async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ProbeLimits,
    metrics: Arc<Metrics>,
) {
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        // hyper runs this timer whenever the connection waits for a head, kept-alive ones
        // included; the first request's head is bounded by the header read timeout in
        // `watch_connection` (`no_request`). A second past the idle timeout, so that an idle
        // connection is closed, and counted as `idle_timeout`, by `watch_connection`: at the
        // same instant the two raced, and hyper's close went uncounted.
        .header_read_timeout(limits.probe_idle_timeout + IDLE_CLOSE_MARGIN)
        .max_buf_size(limits.probe_max_header_bytes as usize)
        .max_headers(MAX_HEADERS);
    let settings = ConnectionSettings {
        header_read_timeout: limits.probe_header_read_timeout,
        limits: Limits {
            idle_timeout: limits.probe_idle_timeout,
            ..Limits::default()
        },
    };
    // Probe connections live as long as the listener: the phase never changes (when the task
    // ends, the sender goes and they close gracefully).
    let (_phase_tx, phase) = watch::channel(Phase::Serving);
    let slots = Arc::new(Semaphore::new(limits.probe_max_connections as usize));
    let table = Table::default();
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                if let Some(suppressed) = PROBE_ACCEPT_FAILED.allow() {
                    tracing::warn!(listener = "probe", error = %e, suppressed, "accept failed");
                }
                tokio::time::sleep(ACCEPT_RETRY).await;
                continue;
            }
        };
        let permit = loop {
            if let Ok(permit) = slots.clone().try_acquire_owned() {
                break Some(permit);
            }
            if table.evict_idlest(PROTECTED_FOR, Instant::now(), |e| unread_bytes(e.fd)) {
                metrics.probe_connection_dropped("evicted");
                break tokio::time::timeout(EVICTION_WAIT, slots.clone().acquire_owned())
                    .await
                    .ok()
                    .and_then(Result::ok);
            }
            // Every connection has a request about to be read: a slot that frees first, or
            // another look shortly.
            tokio::select! {
                permit = slots.clone().acquire_owned() => break permit.ok(),
                () = tokio::time::sleep(EVICTION_RETRY) => {}
            }
        };
        let Some(permit) = permit else {
            tracing::debug!(%peer, "probe connection closed: no slot came free");
            continue;
        };
        if let Err(e) = configure_accepted(&tcp) {
            tracing::debug!(%peer, error = %e, "cannot set the connection's socket options");
        }
        let (entry, registered) = table.register(std::os::fd::AsRawFd::as_raw_fd(&tcp));
        let http = http.clone();
        let router = TowerToHyperService::new(app.clone());
        let (settings, phase, metrics) = (settings.clone(), phase.clone(), metrics.clone());
        tokio::spawn(async move {
            let _permit = permit;
            let _registered = registered;
            let _open = metrics.probe_open_connection();
            let service = {
                let entry = entry.clone();
                hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                    entry.activity.request_started();
                    hyper::service::Service::call(&router, req)
                })
            };
            let conn = http.serve_connection(TokioIo::new(tcp), service);
            tokio::select! {
                reason = super::watch_connection(conn, false, &entry.activity, &settings, phase) => {
                    if let Some(reason) = reason {
                        metrics.probe_connection_dropped(reason);
                        tracing::debug!(%peer, reason, "probe connection dropped");
                    }
                }
                () = entry.evict.notified() => {
                    tracing::debug!(%peer, reason = "evicted", "probe connection dropped");
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn told(e: &Entry) -> bool {
        futures::FutureExt::now_or_never(e.evict.notified()).is_some()
    }

    #[test]
    fn the_connection_idle_longest_is_evicted_first() {
        let table = Table::default();
        let evict = |t: &Table| t.evict_idlest(Duration::ZERO, Instant::now(), |_| 0);
        let (a, _ra) = table.register(-1);
        std::thread::sleep(Duration::from_millis(5));
        let (b, _rb) = table.register(-1);
        std::thread::sleep(Duration::from_millis(5));
        let (c, _rc) = table.register(-1);
        // `a` is the oldest, but started a request last.
        std::thread::sleep(Duration::from_millis(5));
        a.activity.request_started();
        assert!(evict(&table));
        assert_eq!(table.lock().conns.len(), 2);
        // `b` was told to go; `a` and `c` were not.
        assert!(told(&b));
        assert!(!told(&a) && !told(&c));
        assert!(evict(&table));
        assert!(told(&c));
        assert!(evict(&table));
        assert!(told(&a));
        assert!(!evict(&table));
    }

    #[test]
    fn a_request_waiting_to_be_read_is_not_evicted_while_it_is_fresh() {
        let table = Table::default();
        let (a, _ra) = table.register(1);
        std::thread::sleep(Duration::from_millis(5));
        let (b, _rb) = table.register(2);
        let protected = Duration::from_secs(1);
        let opened = a.activity.opened;
        // `a` is the idlest, but has a request waiting: `b`, which has none, goes.
        let unread = |e: &Entry| if e.fd == 1 { 100 } else { 0 };
        assert!(table.evict_idlest(protected, opened, unread));
        assert!(told(&b) && !told(&a));
        // Only `a` is left, still protected; past the protection it goes too.
        assert!(!table.evict_idlest(protected, opened + Duration::from_millis(900), unread));
        assert!(table.evict_idlest(protected, opened + protected, unread));
        assert!(told(&a));
    }

    #[test]
    fn a_connection_leaves_the_table_when_it_ends() {
        let table = Table::default();
        let (_a, ra) = table.register(-1);
        assert_eq!(table.lock().conns.len(), 1);
        drop(ra);
        assert!(table.lock().conns.is_empty());
        assert!(!table.evict_idlest(Duration::ZERO, Instant::now(), |_| 0));
    }

    #[tokio::test]
    async fn unread_bytes_are_the_sockets_receive_queue() {
        use std::os::fd::AsRawFd as _;
        use tokio::io::AsyncWriteExt as _;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        assert_eq!(unread_bytes(server.as_raw_fd()), 0);
        let request = b"GET /healthz HTTP/1.1\r\n\r\n";
        client.write_all(request).await.unwrap();
        let end = Instant::now() + Duration::from_secs(5);
        while unread_bytes(server.as_raw_fd()) == 0 && Instant::now() < end {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(unread_bytes(server.as_raw_fd()), request.len());
        assert_eq!(unread_bytes(-1), 0);
    }
}
