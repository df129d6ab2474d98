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
        }
    }
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
    }

    #[test]
    fn defaults_are_the_flags_defaults() {
        let cli = Cli::try_parse_from(["x"]).unwrap();
        assert_eq!(cli.limits, Limits::default());
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
