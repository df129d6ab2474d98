//! `modelgate serve`: the webhook server (see [`crate::server`]), and `serve --dev`, which
//! makes its own certificates and prints a `curl` command to try it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, ValueEnum};

use super::certs;
use super::{CacheFiles, EXIT_USAGE};
use crate::cache::claims::ClaimReader;
use crate::cache::exception_status::{self, Sources, StatusWriter, StatusWriterConfig};
use crate::cache::{CacheMetrics, ClusterCacheArgs, Kind, WatchMetrics};
use crate::cli::policy::PolicyArgs;
use crate::config::AbsentClaims;
use crate::duration::parse_duration;
use crate::namespaces::watch::{self as namespace_watch, NamespaceWatch, NamespaceWatchConfig};
use crate::namespaces::{NamespaceStore, Namespaces};
use crate::server::limits::{self, ProbeLimits};
use crate::server::log_writer;
use crate::server::metrics::Metrics;
use crate::server::shutdown::Signals;
use crate::server::tls::TlsFiles;
use crate::server::{Limits, ServeOptions, Server};

/// The sample that `--dev`'s curl command sends.
pub const SAMPLE_REVIEW: &str = include_str!("../../examples/admissionreview-pod.json");
const SAMPLE_PATH: &str = "examples/admissionreview-pod.json";

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Address of the webhook listener (TLS) [default: 0.0.0.0:8443; with --dev 127.0.0.1:8443,
    /// so a development server with a throwaway CA is reachable from this machine only].
    #[arg(long, env = "MODELGATE_LISTEN", value_name = "ADDR")]
    pub listen: Option<SocketAddr>,

    /// Address of the plain-HTTP listener for /healthz, /readyz and /metrics [default:
    /// 0.0.0.0:8080; with --dev 127.0.0.1:8080].
    #[arg(long, env = "MODELGATE_PROBE_LISTEN", value_name = "ADDR")]
    pub probe_listen: Option<SocketAddr>,

    /// Serving certificate (PEM, leaf first); reloaded when it changes. Required unless --dev.
    #[arg(
        long,
        env = "MODELGATE_TLS_CERT",
        value_name = "FILE",
        requires = "tls_key"
    )]
    pub tls_cert: Option<PathBuf>,

    /// Private key of the serving certificate (PEM).
    #[arg(
        long,
        env = "MODELGATE_TLS_KEY",
        value_name = "FILE",
        requires = "tls_cert"
    )]
    pub tls_key: Option<PathBuf>,

    /// CA bundle (PEM): when set, only clients with a certificate it signed are served.
    #[arg(long, env = "MODELGATE_CLIENT_CA", value_name = "FILE")]
    pub client_ca: Option<PathBuf>,

    /// Largest request body accepted; larger ones get 413.
    #[arg(long, env = "MODELGATE_MAX_BODY_BYTES", default_value_t = 7 * 1024 * 1024,
          value_parser = clap::value_parser!(u64).range(1..=1 << 30))]
    pub max_body_bytes: u64,

    /// After SIGTERM/SIGINT: how long to keep serving (with /readyz 503) before closing the
    /// listener and draining in-flight requests.
    #[arg(long, env = "MODELGATE_SHUTDOWN_GRACE", default_value = "15s", value_parser = parse_duration)]
    pub shutdown_grace: Duration,

    /// Time a client has for the TLS handshake and for its first request; slower clients are
    /// disconnected. A later request's head on a kept-alive HTTP/1.1 connection has
    /// --idle-timeout (a kept-alive connection waiting for the next request is idle, not slow).
    /// At most 24h.
    #[arg(long, env = "MODELGATE_HEADER_READ_TIMEOUT", default_value = "10s",
          value_parser = crate::server::limits::connection_timeout)]
    pub header_read_timeout: Duration,

    #[arg(long, env = "MODELGATE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// One `info` log line per admission. Without it, only denials and requests that could not
    /// be reviewed are logged at `info`, every other admission at `debug` (RUST_LOG=debug shows
    /// them): at 150 admissions a second a line each is 3.6–4.4 GB of log a day; the counts are
    /// in /metrics.
    #[arg(long, env = "MODELGATE_LOG_ADMISSIONS", action = clap::ArgAction::Set,
          num_args = 0..=1, default_value_t = false, default_missing_value = "true",
          value_parser = clap::builder::BoolishValueParser::new())]
    pub log_admissions: bool,

    #[command(flatten)]
    pub caches: CacheFiles,

    /// Development mode: without --tls-cert/--tls-key, make (or reuse) a CA and a certificate for
    /// localhost in --certs-dir, and print a curl command that sends a sample review. Listens on
    /// 127.0.0.1 only (ports 8443 and 8080) unless --listen/--probe-listen say otherwise.
    #[arg(long, env = "MODELGATE_DEV", action = clap::ArgAction::SetTrue,
          value_parser = clap::builder::BoolishValueParser::new())]
    pub dev: bool,

    /// Where --dev keeps its certificates.
    #[arg(
        long,
        env = "MODELGATE_CERTS_DIR",
        value_name = "DIR",
        default_value = "certs"
    )]
    pub certs_dir: PathBuf,

    #[command(flatten)]
    pub limits: Limits,

    #[command(flatten)]
    pub probe_limits: ProbeLimits,

    #[command(flatten)]
    pub cluster: ClusterCacheArgs,

    #[command(flatten)]
    pub policy: PolicyArgs,
}

/// Failures before serving: bad input (exit 2) or the environment (exit 1).
enum StartError {
    Usage(anyhow::Error),
    Runtime(anyhow::Error),
}

pub fn run(args: ServeArgs) -> ExitCode {
    let log = init_logging(args.log_format);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(serve(args));
    // Every buffered line reaches stderr before a final message; later lines go straight out.
    drop(log);
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(StartError::Usage(e)) => {
            eprintln!("error: {e:#}");
            ExitCode::from(EXIT_USAGE)
        }
        Err(StartError::Runtime(e)) => {
            tracing::error!("{e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(args: ServeArgs) -> Result<(), StartError> {
    if !args.dev && (args.tls_cert.is_none() || args.tls_key.is_none()) {
        return Err(StartError::Usage(anyhow::anyhow!(
            "--tls-cert and --tls-key are required (or --dev, to make a development certificate)"
        )));
    }
    if args.limits.max_buffered_body_bytes < args.max_body_bytes {
        return Err(StartError::Usage(anyhow::anyhow!(
            "--max-buffered-body-bytes ({}) must be at least --max-body-bytes ({}): a body of the \
             largest size would never fit",
            args.limits.max_buffered_body_bytes,
            args.max_body_bytes
        )));
    }
    // Before anything listens, so an early SIGTERM is handled, not fatal.
    let signals = Signals::install()
        .context("cannot install signal handlers")
        .map_err(StartError::Runtime)?;
    let (limits, probe_limits) = open_files_for(args.limits.clone(), args.probe_limits.clone())
        .map_err(StartError::Runtime)?;
    if args.limits.idle_timeout <= crate::server::limits::API_SERVER_IDLE {
        tracing::warn!(
            idle_timeout = ?args.limits.idle_timeout,
            "--idle-timeout is not above kube-apiserver's 90 s idle connection timeout: a connection \
             modelgate closes while the API server reuses it fails that admission (it does not retry)"
        );
    }
    let super::LoadedFiles {
        index,
        namespaces,
        skipped,
    } = args.caches.load().map_err(StartError::Usage)?;
    if !skipped.is_empty() {
        tracing::info!(
            skipped = skipped.len(),
            "--caches: skipped documents that are not cache objects or Namespaces: {}",
            skipped.join(", ")
        );
    }
    let counts = index.counts();
    tracing::info!(
        caches = counts.cluster_caches,
        namespace_caches = counts.namespace_caches,
        node_groups = counts.node_groups,
        pvcs = counts.pvcs,
        nodes = counts.nodes,
        files = args.caches.files.len(),
        "model caches loaded from files"
    );
    release_freed_memory();
    let (tls, dev) = match (args.tls_cert.clone(), args.tls_key.clone()) {
        (Some(cert), Some(key)) => (
            TlsFiles {
                cert,
                key,
                client_ca: args.client_ca.clone(),
            },
            None,
        ),
        _ => {
            let made = certs::ensure_dev_certs(&args.certs_dir)
                .with_context(|| format!("--dev: certificates in {}", args.certs_dir.display()))
                .map_err(StartError::Runtime)?;
            tracing::info!(
                dir = %args.certs_dir.display(),
                reused = made.reused,
                "development certificates {}",
                if made.reused { "reused" } else { "created" }
            );
            (
                TlsFiles {
                    cert: made.cert.clone(),
                    key: made.key.clone(),
                    client_ca: args.client_ca.clone(),
                },
                Some(made),
            )
        }
    };
    // The cluster's caches (watched, merged with --caches), or the static ones alone under
    // --no-cluster; --dev needs no cluster. `caches` must live as long as the server.
    let mut metrics = Metrics::new();
    let cache_metrics = CacheMetrics::new();
    cache_metrics.register(metrics.registry_mut());
    let watch_names: Vec<&'static str> = Kind::ALL
        .iter()
        .map(|k| k.name())
        .chain([namespace_watch::WATCH_NAME])
        .collect();
    let watch_metrics = WatchMetrics::new(&watch_names);
    watch_metrics.register(metrics.registry_mut());
    metrics.count_cache_lookups(cache_metrics.lookup_counters());
    let no_cluster = args.cluster.no_cluster || args.dev;
    if args.dev && !args.cluster.no_cluster {
        tracing::info!("--dev: not watching the cluster's caches (as with --no-cluster)");
    }
    let cluster = ClusterCacheArgs {
        no_cluster,
        ..args.cluster.clone()
    };
    let caches = cluster
        .start(index, cache_metrics, watch_metrics.clone())
        .await
        .context("cannot watch the cluster's model caches (use --no-cluster to run without)")
        .map_err(StartError::Runtime)?;
    let readiness = caches.readiness.clone();
    // Namespace modes: the files' Namespaces, replaced by the cluster's once listed. Until then
    // --default-mode applies to every namespace the files do not label.
    let namespace_store = Arc::new(NamespaceStore::new(namespaces.over(Namespaces::default())));
    let namespace_watch = if no_cluster {
        None
    } else {
        let client = kube::Client::try_default()
            .await
            .context("cannot watch the cluster's namespaces (use --no-cluster to run without)")
            .map_err(StartError::Runtime)?;
        Some(NamespaceWatch::spawn(
            client,
            namespace_store.clone(),
            NamespaceWatchConfig {
                watch_metrics: watch_metrics.clone(),
                ..NamespaceWatchConfig::default()
            },
        ))
    };
    // Each exception's status, written where the cluster's objects are (docs/exceptions.md).
    let status_writer = match (&namespace_watch, args.cluster.exception_status_interval) {
        (Some(watch), interval) if !interval.is_zero() => {
            let client = kube::Client::try_default()
                .await
                .context("cannot write the exceptions' status (use --no-cluster to run without)")
                .map_err(StartError::Runtime)?;
            let listed = watch.listed();
            let store = caches.store.clone();
            Some(StatusWriter::spawn(
                client,
                Sources {
                    caches: caches.store.clone(),
                    namespaces: namespace_store.clone(),
                    ready: Box::new(move || store.is_synced() && listed()),
                },
                StatusWriterConfig {
                    interval,
                    max_days: args.policy.max_exception_days,
                },
                exception_status::register(metrics.registry_mut()),
            ))
        }
        _ => None,
    };
    // Without a cluster the files' Namespaces are the whole truth, known from the start.
    let namespaces_ready: crate::server::CachesReady = match &namespace_watch {
        Some(watch) => Box::new(watch.listed()),
        None => Box::new(|| true),
    };
    // With a cluster, the claims are the cluster's: one the watch has not delivered is read
    // once, and one that does not exist gets no prep. Without, the files' are all there is.
    let mut config = args.policy.clone().into_config();
    config.absent_claims = match no_cluster {
        true => AbsentClaims::Provisioned,
        false => AbsentClaims::Missing,
    };
    let claim_reader = match no_cluster {
        true => None,
        false => {
            let client = kube::Client::try_default()
                .await
                .context("cannot read the cluster's claims (use --no-cluster to run without)")
                .map_err(StartError::Runtime)?;
            Some(ClaimReader::new(client, metrics.registry_mut()))
        }
    };
    let (listen, probe_listen) = listen_addresses(&args);
    let options = ServeOptions {
        listen,
        probe_listen,
        tls,
        max_body_bytes: usize::try_from(args.max_body_bytes).unwrap_or(usize::MAX),
        shutdown_grace: args.shutdown_grace,
        header_read_timeout: args.header_read_timeout,
        limits,
        probe_limits,
        log_admissions: args.log_admissions,
        config,
        store: caches.store.clone(),
        namespaces: namespace_store,
        caches_ready: Box::new(move || readiness.is_ready()),
        namespaces_ready,
        metrics,
        claim_reader,
    };
    let server = Server::bind(options).await.map_err(StartError::Runtime)?;
    if let Some(made) = dev {
        let addr = server
            .webhook_addr()
            .context("webhook listener")
            .map_err(StartError::Runtime)?;
        let probe = server
            .probe_addr()
            .context("probe listener")
            .map_err(StartError::Runtime)?;
        let sample = sample_path(&args.certs_dir).map_err(StartError::Runtime)?;
        println!(
            "modelgate serve --dev: serving https://{host}:{port} (probes and metrics on \
             http://{probe_host}:{probe_port}) with the certificate in {dir}\n\
             Send it a sample AdmissionReview:\n\n  {curl}\n",
            host = url_host(addr),
            port = addr.port(),
            probe_host = url_host(probe),
            probe_port = probe.port(),
            dir = args.certs_dir.display(),
            curl = curl_command(&made.ca, &sample, addr),
        );
    }
    let result = server.run(signals).await.map_err(StartError::Runtime);
    drop(status_writer);
    drop(caches);
    drop(namespace_watch);
    result
}

/// The webhook and probe addresses: the flags when given, else every interface in production
/// (the Service routes to the pod) and loopback under `--dev`.
fn listen_addresses(args: &ServeArgs) -> (SocketAddr, SocketAddr) {
    let ip = if args.dev {
        std::net::Ipv4Addr::LOCALHOST
    } else {
        std::net::Ipv4Addr::UNSPECIFIED
    };
    (
        args.listen.unwrap_or(SocketAddr::from((ip, 8443))),
        args.probe_listen.unwrap_or(SocketAddr::from((ip, 8080))),
    )
}

/// Each connection is a file descriptor: raise the soft limit as far as the hard one allows,
/// and fit `--max-connections` and `--probe-max-connections` (plus a reserve for everything
/// else) within it, lowering them with a warning when they do not fit, so that no listener can
/// fail to accept for want of a descriptor and the probe listener's connections can never take
/// the webhook's. Fails only when the limit leaves no room for a connection.
fn open_files_for(
    mut webhook: Limits,
    mut probe: ProbeLimits,
) -> anyhow::Result<(Limits, ProbeLimits)> {
    let limit = match limits::raise_open_files_limit() {
        Ok(limit) => limit,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read or raise the open-files limit");
            return Ok((webhook, probe));
        }
    };
    let (max_connections, probe_max_connections) =
        limits::fit_open_files(limit, webhook.max_connections, probe.probe_max_connections)
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "the open-files limit ({limit}) leaves no room for connections once {} are \
                     kept for the listeners and the cluster watches; raise it (ulimit -n)",
                    limits::RESERVED_FDS
                )
            })?;
    if (max_connections, probe_max_connections)
        != (webhook.max_connections, probe.probe_max_connections)
    {
        tracing::warn!(
            open_files = limit,
            max_connections = webhook.max_connections,
            probe_max_connections = probe.probe_max_connections,
            reserved = limits::RESERVED_FDS,
            "the open-files limit cannot hold --max-connections plus --probe-max-connections plus \
             the reserve; serving with --max-connections={max_connections} and \
             --probe-max-connections={probe_max_connections} (raise the limit, ulimit -n, to keep them)"
        );
        webhook.max_connections = max_connections;
        webhook.max_http2_connections = webhook.max_http2_connections.min(max_connections);
        probe.probe_max_connections = probe_max_connections;
    } else {
        tracing::debug!(open_files = limit, "open-files limit");
    }
    Ok((webhook, probe))
}

/// Reading `--caches` builds a large transient JSON tree (100 000 caches: ~250 MiB). The
/// allocator keeps freed pages until this thread allocates again, which a serving main thread
/// rarely does; give them back now (RSS with 100 000 caches: 362 MiB -> 107 MiB).
fn release_freed_memory() {
    crate::cache::store::release_freed_memory()
}

/// `examples/admissionreview-pod.json` when run from the repository, else a copy written next
/// to the certificates.
fn sample_path(certs_dir: &Path) -> anyhow::Result<PathBuf> {
    let in_repo = PathBuf::from(SAMPLE_PATH);
    if in_repo.is_file() {
        return Ok(in_repo);
    }
    let copy = certs_dir.join("admissionreview-pod.json");
    if !copy.is_file() {
        std::fs::write(&copy, SAMPLE_REVIEW)
            .with_context(|| format!("{}: cannot write the sample", copy.display()))?;
    }
    Ok(copy)
}

fn url_host(addr: SocketAddr) -> String {
    match addr.ip() {
        ip if ip.is_unspecified() => "localhost".into(),
        std::net::IpAddr::V6(ip) => format!("[{ip}]"),
        ip => ip.to_string(),
    }
}

/// Quotes a word for a POSIX shell when it needs it.
fn shell_word(s: &str) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"@%+=:,./-_".contains(&b))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// The curl command that sends `sample` to the `/mutate` endpoint at `addr`.
pub fn curl_command(ca: &Path, sample: &Path, addr: SocketAddr) -> String {
    format!(
        "curl -sS --fail-with-body --cacert {ca} -H 'Content-Type: application/json' --data-binary {data} https://{host}:{port}/mutate",
        ca = shell_word(&ca.display().to_string()),
        data = shell_word(&format!("@{}", sample.display())),
        host = url_host(addr),
        port = addr.port(),
    )
}

/// Logs to stderr through [`log_writer`]: one line per admission costs a copy on the request
/// path, not a `write(2)`. Keep the guard until the end: it writes what is still buffered.
///
/// Both formats escape every value and cut those from requests and peers, and rate-limit the
/// warnings of the libraries that talk to peers ([`crate::server::log_format`]); the `log`
/// crate's records (rustls logs through it) come through the same formats.
fn init_logging(format: LogFormat) -> log_writer::FlushGuard<std::io::Stderr> {
    use crate::server::log_format::{JsonFormat, SafeFields, TextFormat};
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let (writer, guard) = log_writer::stderr();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .fmt_fields(SafeFields);
    let result = match format {
        LogFormat::Text => builder.event_format(TextFormat::default()).try_init(),
        LogFormat::Json => builder.event_format(JsonFormat::default()).try_init(),
    };
    if let Err(e) = result {
        eprintln!("warning: logging not initialised: {e}");
    }
    guard
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn curl_command_quotes_paths() {
        let addr: SocketAddr = "0.0.0.0:8443".parse().unwrap();
        assert_eq!(
            curl_command(
                Path::new("certs/ca.crt"),
                Path::new("examples/r.json"),
                addr
            ),
            "curl -sS --fail-with-body --cacert certs/ca.crt -H 'Content-Type: application/json' --data-binary @examples/r.json https://localhost:8443/mutate"
        );
        let addr: SocketAddr = "127.0.0.1:1234".parse().unwrap();
        let cmd = curl_command(
            Path::new("/tmp/my certs/ca.crt"),
            Path::new("it's.json"),
            addr,
        );
        assert!(cmd.contains("--cacert '/tmp/my certs/ca.crt'"), "{cmd}");
        assert!(cmd.contains(r"'@it'\''s.json'"), "{cmd}");
        assert!(cmd.ends_with("https://127.0.0.1:1234/mutate"), "{cmd}");
    }

    #[test]
    fn dev_listens_on_loopback_unless_told_otherwise() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            serve: ServeArgs,
        }
        let addrs = |args: &[&str]| {
            let cli =
                Cli::try_parse_from(std::iter::once("serve").chain(args.iter().copied())).unwrap();
            let (l, p) = listen_addresses(&cli.serve);
            (l.to_string(), p.to_string())
        };
        let s = |a: &str, b: &str| (a.to_string(), b.to_string());
        assert_eq!(addrs(&["--dev"]), s("127.0.0.1:8443", "127.0.0.1:8080"));
        assert_eq!(
            addrs(&["--tls-cert", "c", "--tls-key", "k"]),
            s("0.0.0.0:8443", "0.0.0.0:8080")
        );
        assert_eq!(
            addrs(&["--dev", "--listen", "0.0.0.0:9443"]),
            s("0.0.0.0:9443", "127.0.0.1:8080")
        );
        assert_eq!(
            addrs(&["--dev", "--probe-listen", "[::]:9090"]),
            s("127.0.0.1:8443", "[::]:9090")
        );
    }

    #[test]
    fn sample_is_an_admission_review() {
        let v: serde_json::Value = serde_json::from_str(SAMPLE_REVIEW).unwrap();
        assert_eq!(v["kind"], "AdmissionReview");
        assert_eq!(v["request"]["operation"], "CREATE");
    }
}
