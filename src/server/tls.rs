//! TLS for the webhook listener: the rustls configuration, loading the certificate pair (and
//! the client CA for mutual TLS), and reloading them when the files change.
//!
//! Reload works by polling: every [`RELOAD_INTERVAL`] the files are read again (through any
//! symlinks) and compared with what was last seen. That sees an in-place rewrite as well as the
//! atomic swap of the `..data` symlink by which the kubelet updates a mounted Secret, needs no
//! inotify watch that a symlink swap could invalidate, and costs three small reads a second.
//! A new pair is used by new connections; established ones keep theirs. A pair that does not
//! load (unparsable, key not matching the certificate, unreadable) is logged and the last good
//! configuration stays in use.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use rustls::RootCertStore;
use rustls::ServerConfig;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use time::OffsetDateTime;

use super::metrics::Metrics;

/// How often the certificate files are read again.
pub const RELOAD_INTERVAL: Duration = Duration::from_secs(1);

/// ALPN protocols offered, in order of preference.
pub const ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: cannot read: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: no PEM {what} found ({reason})")]
    Pem {
        path: PathBuf,
        what: &'static str,
        reason: String,
    },
    #[error("{path}: not a valid X.509 certificate: {reason}")]
    X509 { path: PathBuf, reason: String },
    #[error("{cert} and {key} are not a usable pair: {source}")]
    Pair {
        cert: PathBuf,
        key: PathBuf,
        #[source]
        source: rustls::Error,
    },
    #[error("client CA {path}: {reason}")]
    ClientCa { path: PathBuf, reason: String },
}

/// The files the listener's TLS comes from.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// When set, only clients with a certificate signed by one of these CAs are served.
    pub client_ca: Option<PathBuf>,
}

/// A certificate chain with its matching key.
pub struct Pair {
    pub chain: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
    /// The leaf certificate's `notAfter`.
    pub not_after: OffsetDateTime,
}

pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_path_buf(),
        source,
    })
}

fn parse_certs(path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            path: path.to_path_buf(),
            what: "certificate",
            reason: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Pem {
            path: path.to_path_buf(),
            what: "certificate",
            reason: "the file holds none".into(),
        });
    }
    Ok(certs)
}

fn not_after(path: &Path, cert: &CertificateDer<'_>) -> Result<OffsetDateTime, TlsError> {
    x509_parser::parse_x509_certificate(cert)
        .map(|(_, c)| c.validity().not_after.to_datetime())
        .map_err(|e| TlsError::X509 {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })
}

/// Parses a PEM chain and key and checks that the key belongs to the leaf certificate.
pub fn parse_pair(
    cert_path: &Path,
    cert_pem: &[u8],
    key_path: &Path,
    key_pem: &[u8],
) -> Result<Pair, TlsError> {
    let chain = parse_certs(cert_path, cert_pem)?;
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| TlsError::Pem {
        path: key_path.to_path_buf(),
        what: "private key",
        reason: e.to_string(),
    })?;
    let leaf = chain.first().ok_or_else(|| TlsError::Pem {
        path: cert_path.to_path_buf(),
        what: "certificate",
        reason: "the file holds none".into(),
    })?;
    let not_after = not_after(cert_path, leaf)?;
    rustls::sign::CertifiedKey::from_der(chain.clone(), key.clone_key(), &provider()).map_err(
        |source| TlsError::Pair {
            cert: cert_path.to_path_buf(),
            key: key_path.to_path_buf(),
            source,
        },
    )?;
    Ok(Pair {
        chain,
        key,
        not_after,
    })
}

/// Reads and checks a certificate pair from files.
pub fn load_pair(cert: &Path, key: &Path) -> Result<Pair, TlsError> {
    parse_pair(cert, &read(cert)?, key, &read(key)?)
}

/// The raw bytes of the files, as last read.
#[derive(Clone, PartialEq, Eq)]
struct Contents {
    cert: Vec<u8>,
    key: Vec<u8>,
    client_ca: Option<Vec<u8>>,
}

impl Contents {
    fn read(files: &TlsFiles) -> Result<Self, TlsError> {
        Ok(Contents {
            cert: read(&files.cert)?,
            key: read(&files.key)?,
            client_ca: files.client_ca.as_deref().map(read).transpose()?,
        })
    }
}

/// A loaded server configuration and what the metrics and logs say about it.
pub struct Loaded {
    pub config: Arc<ServerConfig>,
    /// The same configuration offering only `http/1.1` in ALPN: for new connections while
    /// `--max-http2-connections` HTTP/2 connections are open.
    pub http1_only: Arc<ServerConfig>,
    pub not_after: OffsetDateTime,
}

fn build(files: &TlsFiles, contents: &Contents) -> Result<Loaded, TlsError> {
    let pair = parse_pair(&files.cert, &contents.cert, &files.key, &contents.key)?;
    let provider = provider();
    let pair_error = |source| TlsError::Pair {
        cert: files.cert.clone(),
        key: files.key.clone(),
        source,
    };
    // rustls' safe defaults: TLS 1.3 and 1.2, nothing older.
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(rustls::DEFAULT_VERSIONS)
        .map_err(pair_error)?;
    let builder = match (&files.client_ca, &contents.client_ca) {
        (Some(path), Some(pem)) => {
            let ca_error = |reason: String| TlsError::ClientCa {
                path: path.clone(),
                reason,
            };
            let mut roots = RootCertStore::empty();
            for cert in parse_certs(path, pem)? {
                roots.add(cert).map_err(|e| ca_error(e.to_string()))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| ca_error(e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
        _ => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(pair.chain, pair.key)
        .map_err(pair_error)?;
    config.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
    let mut http1_only = config.clone();
    http1_only.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Loaded {
        config: Arc::new(config),
        http1_only: Arc::new(http1_only),
        not_after: pair.not_after,
    })
}

/// What one look at the files found.
pub enum Reload {
    /// Same bytes as last time (or the same failure).
    Unchanged,
    /// The files changed while being read; look again on the next tick.
    InFlux,
    Loaded {
        not_after: OffsetDateTime,
    },
    Failed(TlsError),
}

/// What was last seen on disk: the bytes, or the read error's text (to log it once).
#[derive(PartialEq, Eq)]
enum Seen {
    Nothing,
    Contents(Contents),
    Unreadable(String),
}

/// The current server configuration, replaced whole when the files change.
pub struct TlsReloader {
    files: TlsFiles,
    current: ArcSwapOption<ServerConfig>,
    http1_only: ArcSwapOption<ServerConfig>,
    seen: Mutex<Seen>,
}

impl TlsReloader {
    pub fn new(files: TlsFiles) -> Self {
        TlsReloader {
            files,
            current: ArcSwapOption::empty(),
            http1_only: ArcSwapOption::empty(),
            seen: Mutex::new(Seen::Nothing),
        }
    }

    /// The configuration for a new connection; `None` until a pair has loaded.
    pub fn current(&self) -> Option<Arc<ServerConfig>> {
        self.current.load_full()
    }

    /// [`current`](Self::current), offering only `http/1.1` in ALPN.
    pub fn current_http1_only(&self) -> Option<Arc<ServerConfig>> {
        self.http1_only.load_full()
    }

    pub fn is_loaded(&self) -> bool {
        self.current.load().is_some()
    }

    /// Reads the files and, when they changed, builds and installs a new configuration.
    /// Blocking (file reads): call it from a blocking context.
    pub fn reload(&self) -> Reload {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let contents = match Contents::read(&self.files) {
            Ok(c) => c,
            Err(e) => {
                let text = e.to_string();
                if *seen == Seen::Unreadable(text.clone()) {
                    return Reload::Unchanged;
                }
                *seen = Seen::Unreadable(text);
                return Reload::Failed(e);
            }
        };
        if matches!(&*seen, Seen::Contents(c) if *c == contents) {
            return Reload::Unchanged;
        }
        // A writer that replaces the files one by one may be half done: only act on bytes that
        // read the same twice.
        match Contents::read(&self.files) {
            Ok(again) if again == contents => {}
            _ => return Reload::InFlux,
        }
        let result = build(&self.files, &contents);
        *seen = Seen::Contents(contents);
        match result {
            Ok(loaded) => {
                // The HTTP/1.1-only one first: a connection that sees the new full
                // configuration never gets an older HTTP/1.1-only one after it.
                self.http1_only.store(Some(loaded.http1_only));
                self.current.store(Some(loaded.config));
                Reload::Loaded {
                    not_after: loaded.not_after,
                }
            }
            Err(e) => Reload::Failed(e),
        }
    }

    /// Reloads once and records the result in the log and the metrics.
    pub fn reload_and_report(&self, metrics: &Metrics) {
        match self.reload() {
            Reload::Unchanged | Reload::InFlux => {}
            Reload::Loaded { not_after } => {
                metrics.tls_reloaded(true, Some(not_after.unix_timestamp()));
                tracing::info!(
                    cert = %self.files.cert.display(),
                    key = %self.files.key.display(),
                    client_ca = self.files.client_ca.as_ref().map(|p| p.display().to_string()),
                    not_after = %not_after,
                    "TLS certificate loaded"
                );
            }
            Reload::Failed(e) => {
                metrics.tls_reloaded(false, None);
                if self.is_loaded() {
                    tracing::error!(error = %e, "TLS certificate not reloaded; the last good one stays in use");
                } else {
                    tracing::error!(error = %e, "TLS certificate not loaded; not serving TLS until it is");
                }
            }
        }
    }

    /// Polls the files for as long as the task runs.
    pub async fn watch(self: Arc<Self>, metrics: Arc<Metrics>) {
        let mut ticker = tokio::time::interval(RELOAD_INTERVAL);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        ticker.tick().await;
        loop {
            ticker.tick().await;
            let (me, m) = (self.clone(), metrics.clone());
            if tokio::task::spawn_blocking(move || me.reload_and_report(&m))
                .await
                .is_err()
            {
                tracing::error!("TLS reload task failed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::certs;

    fn write_pair(dir: &Path, bundle: &certs::ServingBundle) {
        certs::write_bundle(dir, bundle).unwrap();
    }

    #[test]
    fn reload_keeps_the_last_good_pair() {
        let dir = tempfile::tempdir().unwrap();
        let files = TlsFiles {
            cert: dir.path().join("tls.crt"),
            key: dir.path().join("tls.key"),
            client_ca: None,
        };
        let reloader = TlsReloader::new(files.clone());
        assert!(matches!(
            reloader.reload(),
            Reload::Failed(TlsError::Read { .. })
        ));
        assert!(matches!(reloader.reload(), Reload::Unchanged));
        assert!(!reloader.is_loaded());

        write_pair(dir.path(), &certs::generate(&["a.test".into()], 1).unwrap());
        assert!(matches!(reloader.reload(), Reload::Loaded { .. }));
        let first = reloader.current().unwrap();
        assert!(matches!(reloader.reload(), Reload::Unchanged));

        // A key that belongs to another certificate is refused; the old config stays.
        let other = certs::generate(&["b.test".into()], 1).unwrap();
        std::fs::write(&files.key, &other.serving.key_pem).unwrap();
        assert!(matches!(
            reloader.reload(),
            Reload::Failed(TlsError::Pair { .. })
        ));
        assert!(Arc::ptr_eq(&first, &reloader.current().unwrap()));

        std::fs::write(&files.cert, &other.serving.cert_pem).unwrap();
        assert!(matches!(reloader.reload(), Reload::Loaded { .. }));
        assert!(!Arc::ptr_eq(&first, &reloader.current().unwrap()));
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        let p = Path::new("x");
        for (cert, key) in [
            (&b""[..], &b""[..]),
            (
                b"-----BEGIN CERTIFICATE-----\n!!\n-----END CERTIFICATE-----\n",
                b"",
            ),
            (
                b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
                b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
            ),
        ] {
            assert!(parse_pair(p, cert, p, key).is_err());
        }
    }
}
