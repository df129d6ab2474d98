//! `modelgate certs`: a CA and a serving certificate for the webhook Service, and the same code
//! behind `serve --dev`.
//!
//! Keys are ECDSA P-256 (accepted by the API server and by every TLS client here). The CA's
//! private key is never written: to rotate, run the command again and update the webhook
//! configurations' `caBundle` with what it prints.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use base64::Engine;
use clap::Args;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use time::{Duration, OffsetDateTime};

use super::EXIT_USAGE;

/// File names, as in a `kubernetes.io/tls` Secret (plus `ca.crt`, as cert-manager writes it).
pub const CA_FILE: &str = "ca.crt";
pub const CERT_FILE: &str = "tls.crt";
pub const KEY_FILE: &str = "tls.key";

/// Certificates made by `serve --dev` are reused while they are valid for at least this long.
const DEV_MIN_REMAINING: Duration = Duration::days(1);

#[derive(Args, Debug)]
pub struct CertsArgs {
    /// Directory to write ca.crt, tls.crt and tls.key (mode 0600) into; created when missing.
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,

    /// Name of the webhook's Service.
    #[arg(long, value_name = "NAME", value_parser = dns_label)]
    pub service: String,

    /// Namespace of the webhook's Service.
    #[arg(long, value_name = "NS", value_parser = dns_label)]
    pub namespace: String,

    /// Validity of the CA and of the serving certificate, in days.
    #[arg(long, default_value_t = 365, value_parser = clap::value_parser!(u32).range(1..=3650))]
    pub days: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum CertsError {
    #[error("cannot generate a certificate: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> CertsError + '_ {
    move |source| CertsError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// A certificate and its private key, both PEM.
#[derive(Clone, Debug)]
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
}

/// What a webhook needs: the CA (for `caBundle`) and the serving pair it signed.
#[derive(Clone, Debug)]
pub struct ServingBundle {
    pub ca_pem: String,
    pub serving: Issued,
}

/// A certificate authority held in memory only.
pub struct Authority {
    issuer: Issuer<'static, KeyPair>,
    cert_pem: String,
}

fn validity(params: &mut CertificateParams, days: u32) {
    let now = OffsetDateTime::now_utc();
    // An hour back, so that a client whose clock is slightly behind accepts the certificate.
    params.not_before = now - Duration::hours(1);
    params.not_after = now + Duration::days(i64::from(days));
}

impl Authority {
    pub fn new(common_name: &str, days: u32) -> Result<Self, CertsError> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, common_name);
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        validity(&mut params, days);
        let cert = params.self_signed(&key)?;
        Ok(Authority {
            cert_pem: cert.pem(),
            issuer: Issuer::new(params, key),
        })
    }

    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// A serving certificate for the given DNS names and IP addresses (the first one is also the
    /// common name).
    pub fn issue_server(&self, names: &[String], days: u32) -> Result<Issued, CertsError> {
        let mut params = CertificateParams::new(names.to_vec())?;
        if let Some(first) = names.first() {
            params.distinguished_name = DistinguishedName::new();
            params
                .distinguished_name
                .push(DnType::CommonName, first.as_str());
        }
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.sign(params, days)
    }

    /// A client certificate (for mutual TLS), as the API server presents one.
    pub fn issue_client(&self, common_name: &str, days: u32) -> Result<Issued, CertsError> {
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.sign(params, days)
    }

    fn sign(&self, mut params: CertificateParams, days: u32) -> Result<Issued, CertsError> {
        validity(&mut params, days);
        params.use_authority_key_identifier_extension = true;
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

/// The names a Service is reached by from inside the cluster.
pub fn service_names(service: &str, namespace: &str) -> Vec<String> {
    vec![
        format!("{service}.{namespace}.svc"),
        service.to_string(),
        format!("{service}.{namespace}"),
        format!("{service}.{namespace}.svc.cluster.local"),
    ]
}

/// The names of a `serve --dev` certificate: the local machine and the default Service.
pub fn dev_names() -> Vec<String> {
    let mut names = vec![
        "localhost".to_string(),
        "127.0.0.1".to_string(),
        "::1".to_string(),
    ];
    names.extend(service_names("modelgate", "modelgate-system"));
    names
}

/// A new CA and a serving certificate it signed.
pub fn generate(names: &[String], days: u32) -> Result<ServingBundle, CertsError> {
    let common_name = names.first().map_or("modelgate", String::as_str);
    let ca = Authority::new(&format!("modelgate CA for {common_name}"), days)?;
    let serving = ca.issue_server(names, days)?;
    Ok(ServingBundle {
        ca_pem: ca.cert_pem().to_string(),
        serving,
    })
}

/// Writes `contents` to `path` through a temporary file and a rename, so that a reader (the
/// server's reload) never sees half a file; `mode` applies on Unix.
pub fn write_file_atomic(path: &Path, contents: &[u8], mode: u32) -> Result<(), CertsError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map_or_else(|| "file".into(), |n| n.to_string_lossy().into_owned());
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create(true).truncate(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            options.mode(mode);
        }
        let mut file = options.open(&tmp)?;
        #[cfg(unix)]
        {
            // The mode given to open() is filtered by the umask; this one is not.
            use std::os::unix::fs::PermissionsExt;
            file.set_permissions(std::fs::Permissions::from_mode(mode))?;
        }
        file.write_all(contents)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        io_error(path)(e)
    })
}

/// Writes `ca.crt`, `tls.crt` (0644) and `tls.key` (0600) into `dir`, creating it when missing.
pub fn write_bundle(dir: &Path, bundle: &ServingBundle) -> Result<(), CertsError> {
    std::fs::create_dir_all(dir).map_err(io_error(dir))?;
    write_file_atomic(
        &dir.join(KEY_FILE),
        bundle.serving.key_pem.as_bytes(),
        0o600,
    )?;
    write_file_atomic(
        &dir.join(CERT_FILE),
        bundle.serving.cert_pem.as_bytes(),
        0o644,
    )?;
    write_file_atomic(&dir.join(CA_FILE), bundle.ca_pem.as_bytes(), 0o644)
}

/// The `caBundle` field of a webhook configuration: the CA certificate's PEM, base64-encoded.
pub fn ca_bundle(ca_pem: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(ca_pem)
}

/// What `serve --dev` found or made.
#[derive(Debug)]
pub struct DevCerts {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    /// True when valid certificates were already there.
    pub reused: bool,
}

/// Reuses the certificates in `dir` when they load as a pair and stay valid for at least a day,
/// else writes new ones there.
pub fn ensure_dev_certs(dir: &Path) -> Result<DevCerts, CertsError> {
    let certs = DevCerts {
        ca: dir.join(CA_FILE),
        cert: dir.join(CERT_FILE),
        key: dir.join(KEY_FILE),
        reused: true,
    };
    let reusable = certs.ca.is_file()
        && crate::server::tls::load_pair(&certs.cert, &certs.key)
            .is_ok_and(|pair| pair.not_after > OffsetDateTime::now_utc() + DEV_MIN_REMAINING);
    if reusable {
        return Ok(certs);
    }
    write_bundle(dir, &generate(&dev_names(), 365)?)?;
    Ok(DevCerts {
        reused: false,
        ..certs
    })
}

pub fn run(args: CertsArgs) -> ExitCode {
    let names = service_names(&args.service, &args.namespace);
    let result = generate(&names, args.days).and_then(|bundle| {
        write_bundle(&args.out, &bundle)?;
        Ok(bundle)
    });
    match result {
        Ok(bundle) => {
            eprintln!(
                "wrote {ca}, {cert} and {key} (mode 0600) for {names}, valid {days} days",
                ca = args.out.join(CA_FILE).display(),
                cert = args.out.join(CERT_FILE).display(),
                key = args.out.join(KEY_FILE).display(),
                names = names.join(", "),
                days = args.days,
            );
            eprintln!("caBundle for the webhook configurations (stdout):");
            println!("{}", ca_bundle(&bundle.ca_pem));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(EXIT_USAGE)
        }
    }
}

/// A DNS-1123 label, as Service and namespace names are.
fn dns_label(s: &str) -> Result<String, String> {
    let ok = !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-');
    if ok {
        Ok(s.to_string())
    } else {
        Err(format!(
            "`{s}` is not a DNS label (lowercase letters, digits and `-`, at most 63)"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_names_cover_the_cluster_forms() {
        assert_eq!(
            service_names("modelgate", "ops"),
            [
                "modelgate.ops.svc",
                "modelgate",
                "modelgate.ops",
                "modelgate.ops.svc.cluster.local"
            ]
        );
    }

    #[test]
    fn dns_labels() {
        assert!(dns_label("modelgate-system").is_ok());
        for bad in ["", "Modelgate", "-a", "a-", "a.b", &"a".repeat(64)] {
            assert!(dns_label(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn bundle_files_and_modes() {
        let dir = tempfile::tempdir().unwrap();
        let bundle = generate(&service_names("svc", "ns"), 2).unwrap();
        write_bundle(dir.path(), &bundle).unwrap();
        let pair =
            crate::server::tls::load_pair(&dir.path().join(CERT_FILE), &dir.path().join(KEY_FILE))
                .unwrap();
        assert!(pair.not_after < OffsetDateTime::now_utc() + Duration::days(3));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = |f: &str| {
                std::fs::metadata(dir.path().join(f))
                    .unwrap()
                    .permissions()
                    .mode()
                    & 0o777
            };
            assert_eq!(mode(KEY_FILE), 0o600);
            assert_eq!(mode(CERT_FILE), 0o644);
        }
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(ca_bundle(&bundle.ca_pem))
            .unwrap();
        assert_eq!(decoded, bundle.ca_pem.as_bytes());
    }

    #[test]
    fn dev_certs_are_reused() {
        let dir = tempfile::tempdir().unwrap();
        let first = ensure_dev_certs(dir.path()).unwrap();
        assert!(!first.reused);
        let before = std::fs::read(&first.cert).unwrap();
        let second = ensure_dev_certs(dir.path()).unwrap();
        assert!(second.reused);
        assert_eq!(std::fs::read(&second.cert).unwrap(), before);
        // A broken key is replaced, not served.
        std::fs::write(&first.key, "garbage").unwrap();
        let third = ensure_dev_certs(dir.path()).unwrap();
        assert!(!third.reused);
        assert_ne!(std::fs::read(&third.cert).unwrap(), before);
    }
}
