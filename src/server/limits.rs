//! What one client, or many, may hold of the webhook server: connections, streams, decisions in
//! flight, the memory of bodies being read, header bytes, and time. Each limit is a flag of `serve` (and an
//! environment variable `MODELGATE_<NAME>`); together they bound the server's memory whatever
//! clients do. docs/security.md gives the formula, the figures, and the attack each one stops.

use std::time::Duration;

use clap::Args;

use crate::duration::parse_duration;

/// Locally reset streams (stream errors caused by the client) allowed per connection before it
/// is closed with GOAWAY ENHANCE_YOUR_CALM (hyper's default, set here so that it cannot be lost).
pub const MAX_LOCAL_ERROR_RESETS: usize = 1024;
/// Response bytes h2 buffers per stream for a client that does not read; answers are a few KiB.
pub const MAX_SEND_BUF_BYTES: usize = 64 * 1024;
/// h2 flow-control windows offered to clients: a stream may have this much of its body in
/// flight, a connection this much over all its streams. Body data not yet read (a request
/// waiting for an in-flight slot) is bounded by the connection window.
pub const STREAM_WINDOW_BYTES: u32 = 128 * 1024;
pub const CONNECTION_WINDOW_BYTES: u32 = 256 * 1024;
/// Kernel send buffer of each connection (the kernel doubles it): what a client that does not
/// read its answers can leave queued in the kernel, instead of up to `tcp_wmem`'s 4 MiB. Answers
/// are a few KiB; socket memory counts against the container's memory limit.
pub const SOCKET_SEND_BUF_BYTES: usize = 64 * 1024;
/// HTTP/2 keep-alive: a PING after this much silence, and the connection closes when its answer
/// does not come within the timeout.
pub const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(30);
pub const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long kube-apiserver keeps an idle webhook connection (client-go's `IdleConnTimeout`): an
/// `--idle-timeout` at or below it closes connections the API server may be about to reuse.
pub const API_SERVER_IDLE: Duration = Duration::from_secs(90);

/// Room for three API servers at their default `--max-mutating-requests-inflight` (200) with
/// 25 kept-alive connections each, and some to spare: every concurrent webhook call of an API
/// server is a connection of its own (HTTP/1.1, one request at a time).
pub const DEFAULT_MAX_CONNECTIONS: u32 = 1024;

/// Request body bytes held at once over all connections: 32 MiB, room for four bodies at the
/// default `--max-body-bytes` (7 MiB) or ten at the API server's largest request (3 MiB), and
/// within the chart's 256Mi next to `--max-connections` (docs/security.md, the memory formula).
pub const DEFAULT_MAX_BUFFERED_BODY_BYTES: u64 = 32 * 1024 * 1024;

/// 64 KiB/s: kube-apiserver writes a body at once, at the speed of the network (megabytes a
/// second and more); only a client that holds a request open on purpose is slower.
pub const DEFAULT_MIN_BODY_BYTES_PER_SECOND: u64 = 64 * 1024;

/// Time a body may take before the minimum rate applies.
pub const BODY_RATE_GRACE: Duration = Duration::from_secs(1);

/// Longest TLS handshake on the webhook port (`--tls-handshake-timeout`). kube-apiserver writes
/// its ClientHello as soon as it has connected and finishes a handshake in two round trips and
/// milliseconds of CPU; a connection slower than this is holding a slot, not handshaking.
pub const DEFAULT_TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(3);

/// The first byte of a connection (its ClientHello) must arrive within this part of the TLS
/// handshake timeout (a third: 1 s by default). A connection that sends nothing at all costs
/// the attacker nothing but a slot; this frees the slot three times as fast as the handshake
/// timeout would, so that a flood of silent connections beyond `--max-connections` delays a new
/// connection by about a second, not by the whole handshake timeout.
pub const CLIENT_HELLO_SHARE: u32 = 3;

/// File descriptors kept for everything but client connections: the two listeners, stdio, the
/// runtime's epoll and wakers, the certificate files while they are read, the API server
/// connections of the watches, and one connection accepted beyond the probe cap while it
/// evicts another. `--max-connections` plus `--probe-max-connections` plus this must fit the
/// open-files limit ([`fit_open_files`]).
pub const RESERVED_FDS: u64 = 64;

/// Probe listener defaults (`ProbeLimits`): the kubelet opens a connection per probe (two
/// probes every 5–10 s per pod) and Prometheus keeps one per target; 128 is far above both.
pub const DEFAULT_PROBE_MAX_CONNECTIONS: u32 = 128;
/// hyper's floor for the HTTP/1.1 read buffer, which holds the request head.
pub const MIN_HEADER_BUF_BYTES: u32 = 8 * 1024;

/// The largest `--idle-timeout` and `--header-read-timeout`: a day. Timers are deadlines
/// (`Instant + Duration`), which larger values could overflow.
pub const MAX_CONNECTION_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// The largest `--body-progress-timeout`: the longest request timeout a client may ask for
/// (the API server's maximum, [`crate::server::deadline::MAX_TIMEOUT`]); a longer wait could
/// never end before the request's own deadline.
pub const MAX_BODY_PROGRESS_TIMEOUT: Duration = crate::server::deadline::MAX_TIMEOUT;

#[derive(Args, Clone, Debug, PartialEq, Eq)]
#[command(next_help_heading = "Client limits (docs/security.md)")]
pub struct Limits {
    /// Open webhook connections in total; at the cap the listener stops accepting, and new
    /// connections wait in the kernel's listen backlog until one closes (never accepted and
    /// closed: kube-apiserver does not retry a failed call).
    #[arg(long, env = "MODELGATE_MAX_CONNECTIONS", default_value_t = DEFAULT_MAX_CONNECTIONS,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_connections: u32,

    /// Open HTTP/2 connections, within --max-connections. Beyond it new connections are offered
    /// only HTTP/1.1 in ALPN: kube-apiserver speaks HTTP/1.1 to webhooks, and an HTTP/2
    /// connection can hold far more memory (streams, windows) than an HTTP/1.1 one.
    #[arg(long, env = "MODELGATE_MAX_HTTP2_CONNECTIONS", default_value_t = 64,
          value_parser = clap::value_parser!(u32).range(0..=1_000_000))]
    pub max_http2_connections: u32,

    /// Streams (requests) one HTTP/2 connection may have open at once (SETTINGS_MAX_CONCURRENT_STREAMS).
    #[arg(long, env = "MODELGATE_MAX_CONCURRENT_STREAMS", default_value_t = 16,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub max_concurrent_streams: u32,

    /// Decisions made at once, over all connections. A request takes a slot once its whole
    /// body has arrived (reading a body never holds one); beyond the limit requests wait in
    /// arrival order, and get 429 after --body-progress-timeout.
    #[arg(long, env = "MODELGATE_MAX_REQUESTS_IN_FLIGHT", default_value_t = 4,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub max_requests_in_flight: u32,

    /// Memory for request bodies that arrive in more than one part, over all connections: each
    /// such body holds the bytes it has buffered until its decision is made. A body that does
    /// not fit gets 503 with Retry-After at once. At least --max-body-bytes.
    #[arg(long, env = "MODELGATE_MAX_BUFFERED_BODY_BYTES",
          default_value_t = DEFAULT_MAX_BUFFERED_BODY_BYTES,
          value_parser = clap::value_parser!(u64).range(1..=1 << 36))]
    pub max_buffered_body_bytes: u64,

    /// Slowest accepted body: once a request's first second is over, its body must have
    /// arrived at this many bytes per second on average over the time since; a slower one gets
    /// 408 and its connection is closed (HTTP/2: the stream is reset).
    #[arg(long, env = "MODELGATE_MIN_BODY_BYTES_PER_SECOND",
          default_value_t = DEFAULT_MIN_BODY_BYTES_PER_SECOND,
          value_parser = clap::value_parser!(u64).range(1..=1 << 36))]
    pub min_body_bytes_per_second: u64,

    /// Largest request header list (HTTP/2 SETTINGS_MAX_HEADER_LIST_SIZE, decoded; HTTP/1.1: the
    /// request head).
    #[arg(long, env = "MODELGATE_MAX_HEADER_LIST_BYTES", default_value_t = 8 * 1024,
          value_parser = clap::value_parser!(u32).range(1024..=1 << 20))]
    pub max_header_list_bytes: u32,

    /// HTTP/2 streams a client may reset before the server accepted them (rapid reset,
    /// CVE-2023-44487); beyond it the connection is closed with GOAWAY ENHANCE_YOUR_CALM.
    #[arg(long, env = "MODELGATE_MAX_PENDING_ACCEPT_RESETS", default_value_t = 20,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub max_pending_accept_resets: u32,

    /// A connection on which no request started for this long is closed (GOAWAY, then closed
    /// for good if it is still open after as long again). Keep it above kube-apiserver's 90 s:
    /// an HTTP/1.1 connection closed under a client that is reusing it fails that admission.
    /// At most 24h.
    #[arg(long, env = "MODELGATE_IDLE_TIMEOUT", default_value = "120s", value_parser = connection_timeout)]
    pub idle_timeout: Duration,

    /// Longest wait for the next part of a request body; a stalled body gets 408 well before
    /// the request's whole time budget is spent. Also the longest wait for a decision slot.
    /// At most 30s.
    #[arg(long, env = "MODELGATE_BODY_PROGRESS_TIMEOUT", default_value = "2s", value_parser = body_progress_timeout)]
    pub body_progress_timeout: Duration,

    /// Longest TLS handshake, from the moment the connection is accepted; its first byte (the
    /// ClientHello) must come within a third of it. Never longer than --header-read-timeout.
    /// At most 24h.
    #[arg(long, env = "MODELGATE_TLS_HANDSHAKE_TIMEOUT", default_value = "3s", value_parser = connection_timeout)]
    pub tls_handshake_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_http2_connections: 64,
            max_concurrent_streams: 16,
            max_requests_in_flight: 4,
            max_buffered_body_bytes: DEFAULT_MAX_BUFFERED_BODY_BYTES,
            min_body_bytes_per_second: DEFAULT_MIN_BODY_BYTES_PER_SECOND,
            max_header_list_bytes: 8 * 1024,
            max_pending_accept_resets: 20,
            idle_timeout: Duration::from_secs(120),
            body_progress_timeout: Duration::from_secs(2),
            tls_handshake_timeout: DEFAULT_TLS_HANDSHAKE_TIMEOUT,
        }
    }
}

/// What clients of the probe listener (`/healthz`, `/readyz`, `/metrics`: the kubelet and
/// Prometheus) may hold. Any pod can reach that port, so it has limits of its own, apart from
/// the webhook's: its connections can never take the file descriptors or the memory the
/// webhook listener needs.
#[derive(Args, Clone, Debug, PartialEq, Eq)]
#[command(next_help_heading = "Probe listener limits (docs/security.md)")]
pub struct ProbeLimits {
    /// Open connections to the probe listener. At the cap a new connection closes the one that
    /// has been idle longest (the kubelet opens a connection per probe, Prometheus keeps one per
    /// target), so that idle connections can never lock the probes out.
    #[arg(long, env = "MODELGATE_PROBE_MAX_CONNECTIONS",
          default_value_t = DEFAULT_PROBE_MAX_CONNECTIONS,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub probe_max_connections: u32,

    /// Largest request head on the probe listener, in bytes (hyper reads at least 8192); a
    /// larger one gets 431 and the connection is closed.
    #[arg(long, env = "MODELGATE_PROBE_MAX_HEADER_BYTES",
          default_value_t = MIN_HEADER_BUF_BYTES,
          value_parser = clap::value_parser!(u32).range(8192..=1 << 20))]
    pub probe_max_header_bytes: u32,

    /// Time a probe connection has for its first complete request head. At most 24h.
    #[arg(long, env = "MODELGATE_PROBE_HEADER_READ_TIMEOUT",
          default_value = "5s", value_parser = connection_timeout)]
    pub probe_header_read_timeout: Duration,

    /// A probe connection on which no request starts for this long is closed (also the
    /// longest wait for a later request's head). At most 24h.
    #[arg(long, env = "MODELGATE_PROBE_IDLE_TIMEOUT",
          default_value = "90s", value_parser = connection_timeout)]
    pub probe_idle_timeout: Duration,
}

impl Default for ProbeLimits {
    fn default() -> Self {
        ProbeLimits {
            probe_max_connections: DEFAULT_PROBE_MAX_CONNECTIONS,
            probe_max_header_bytes: MIN_HEADER_BUF_BYTES,
            probe_header_read_timeout: Duration::from_secs(5),
            probe_idle_timeout: Duration::from_secs(90),
        }
    }
}

/// The connection caps that fit an open-files limit of `limit`: `webhook` and `probe`
/// unchanged when `webhook + probe + RESERVED_FDS` fits, else lowered until they do (the probe
/// cap to at most a quarter of what is left, the webhook's to the rest), so that no listener
/// can ever fail to accept for want of a descriptor. `None` when the limit leaves no room for
/// a connection of each listener.
pub fn fit_open_files(limit: u64, webhook: u32, probe: u32) -> Option<(u32, u32)> {
    if u64::from(webhook) + u64::from(probe) + RESERVED_FDS <= limit {
        return Some((webhook, probe));
    }
    let room = limit.checked_sub(RESERVED_FDS).filter(|&r| r >= 2)?;
    let probe = u64::from(probe).min((room / 4).max(1));
    let webhook = u64::from(webhook).min(room - probe);
    Some((webhook as u32, probe as u32))
}

/// A duration above 0 and at most `max`.
pub fn bounded_duration(s: &str, max: Duration) -> Result<Duration, String> {
    match parse_duration(s)? {
        d if d.is_zero() => Err("must be more than 0".into()),
        d if d > max => Err(format!("must be at most {max:?}")),
        d => Ok(d),
    }
}

/// `--idle-timeout`, `--header-read-timeout`.
pub fn connection_timeout(s: &str) -> Result<Duration, String> {
    bounded_duration(s, MAX_CONNECTION_TIMEOUT)
}

fn body_progress_timeout(s: &str) -> Result<Duration, String> {
    bounded_duration(s, MAX_BODY_PROGRESS_TIMEOUT)
}

/// Raises this process's soft limit on open files to its hard limit (as Go programs do at
/// start), so that `--max-connections` is not cut short by a low default of 1024. Returns the
/// soft limit in force afterwards.
pub fn raise_open_files_limit() -> std::io::Result<libc::rlim_t> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct passed by pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: as above.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        lim = raised;
    }
    Ok(lim.rlim_cur)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        limits: Limits,
        #[command(flatten)]
        probe: ProbeLimits,
    }

    #[test]
    fn defaults_are_the_flags_defaults() {
        let cli = Cli::try_parse_from(["x"]).unwrap();
        assert_eq!(cli.limits, Limits::default());
        assert_eq!(cli.probe, ProbeLimits::default());
    }

    #[test]
    fn both_caps_fit_the_open_files_limit() {
        // The usual container limit holds the defaults with room to spare.
        assert_eq!(fit_open_files(1 << 20, 1024, 128), Some((1024, 128)));
        assert_eq!(
            fit_open_files(1024 + 128 + 64, 1024, 128),
            Some((1024, 128))
        );
        // A hard limit of 1024: the webhook cap gives way, the probe keeps its own.
        assert_eq!(fit_open_files(1024, 1024, 128), Some((832, 128)));
        // Very low limits: a quarter of the room for the probes, the rest for the webhook.
        assert_eq!(fit_open_files(264, 1024, 128), Some((150, 50)));
        assert_eq!(fit_open_files(66, 1024, 128), Some((1, 1)));
        assert_eq!(fit_open_files(65, 1024, 128), None);
        for limit in [66u64, 100, 500, 1000, 1216, 5000] {
            let (w, p) = fit_open_files(limit, 1024, 128).unwrap();
            assert!(
                u64::from(w) + u64::from(p) + RESERVED_FDS <= limit,
                "{limit}"
            );
            assert!(w >= 1 && p >= 1, "{limit}");
        }
    }

    #[test]
    fn zero_or_out_of_range_values_are_refused_with_the_flag_named() {
        for args in [
            ["x", "--max-connections=0"],
            ["x", "--max-concurrent-streams=0"],
            ["x", "--max-requests-in-flight=0"],
            ["x", "--max-header-list-bytes=10"],
            ["x", "--idle-timeout=0"],
            ["x", "--body-progress-timeout=soon"],
            ["x", "--max-buffered-body-bytes=0"],
            ["x", "--min-body-bytes-per-second=0"],
            // Values whose deadlines (`Instant + Duration`) could overflow.
            ["x", "--idle-timeout=4000000000000000h"],
            ["x", "--idle-timeout=25h"],
            ["x", "--body-progress-timeout=31s"],
            ["x", "--body-progress-timeout=4000000000000000h"],
            ["x", "--tls-handshake-timeout=0"],
            ["x", "--tls-handshake-timeout=25h"],
            ["x", "--probe-max-connections=0"],
            ["x", "--probe-max-header-bytes=8191"],
            ["x", "--probe-header-read-timeout=0"],
            ["x", "--probe-idle-timeout=25h"],
        ] {
            let err = Cli::try_parse_from(args)
                .err()
                .expect("refused")
                .to_string();
            let flag = args[1].split('=').next().unwrap();
            assert!(err.contains(flag), "{args:?}: {err}");
        }
    }

    #[test]
    fn the_largest_accepted_timeouts_leave_every_deadline_computable() {
        let cli = Cli::try_parse_from(["x", "--idle-timeout=24h", "--body-progress-timeout=30s"])
            .unwrap();
        assert_eq!(cli.limits.idle_timeout, MAX_CONNECTION_TIMEOUT);
        assert_eq!(cli.limits.body_progress_timeout, MAX_BODY_PROGRESS_TIMEOUT);
        // The deadlines the server computes from them: a connection's idle end (twice the idle
        // timeout after its last request) and a body's next part.
        let now = std::time::Instant::now();
        assert!(now.checked_add(cli.limits.idle_timeout * 2).is_some());
        assert!(
            tokio::time::Instant::now()
                .checked_add(cli.limits.body_progress_timeout)
                .is_some()
        );
    }

    #[test]
    fn the_open_files_limit_is_raised_to_the_hard_limit() {
        let soft = raise_open_files_limit().unwrap();
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
        assert_eq!(soft, lim.rlim_cur);
        assert_eq!(lim.rlim_cur, lim.rlim_max);
    }
}
