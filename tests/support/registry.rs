//! A real OCI registry on loopback for the `images` tests (`images`, `audit --images`):
//! Debian's `docker-registry` package (the CNCF distribution registry), which
//! scripts/install-tools.sh puts in `.tools/bin`. Each test starts its own registries (a free
//! port, a temporary storage directory, a config file) and pushes images it builds itself with
//! oci-client; a registry may sit behind basic auth (an htpasswd file of bcrypt hashes) or
//! serve HTTPS with a CA of its own.
//! Included with `#[path = "support/registry.rs"] mod registry_support;`, next to `mod cli;`
//! (common/cli.rs), which it uses.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use oci_client::client::{
    Certificate, CertificateEncoding, ClientConfig, ClientProtocol, Config, ImageLayer,
};
use oci_client::manifest::{OciImageIndex, OciImageManifest};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use serde_json::json;

use crate::cli;

/// The registry binary, or `None` after [`cli::missing`] said so.
pub fn registry_binary() -> Option<PathBuf> {
    let candidates = [
        std::env::var_os("MODELGATE_TOOLS_DIR")
            .map(|d| PathBuf::from(d).join("bin/docker-registry")),
        Some(Path::new(env!("CARGO_MANIFEST_DIR")).join(".tools/bin/docker-registry")),
    ];
    let found = candidates.into_iter().flatten().find(|p| p.is_file());
    if found.is_none() {
        cli::missing("docker-registry (the distribution registry; scripts/install-tools.sh)");
    }
    found
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A distribution registry on 127.0.0.1, killed when dropped.
pub struct Registry {
    child: Child,
    pub host: String,
    _dir: tempfile::TempDir,
    pub auth: RegistryAuth,
    /// The CA of its certificate, when it serves HTTPS.
    pub ca_pem: Option<String>,
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Registry {
    /// Starts a registry over plain HTTP; with `user`, behind basic auth for that user and
    /// password.
    pub fn start(binary: &Path, user: Option<(&str, &str)>) -> Registry {
        Registry::start_with(binary, user, false)
    }

    /// Starts a registry; `tls`: over HTTPS, with a certificate for 127.0.0.1 from a CA of
    /// its own.
    pub fn start_with(binary: &Path, user: Option<(&str, &str)>, tls: bool) -> Registry {
        let dir = tempfile::tempdir().unwrap();
        let mut tls_section = String::new();
        let mut ca_pem = None;
        if tls {
            let ca = modelgate::cli::certs::Authority::new("images test CA", 1).unwrap();
            let issued = ca.issue_server(&["127.0.0.1".to_string()], 1).unwrap();
            let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
            std::fs::write(&cert, &issued.cert_pem).unwrap();
            std::fs::write(&key, &issued.key_pem).unwrap();
            tls_section = format!(
                "  tls:\n    certificate: {}\n    key: {}\n",
                cert.display(),
                key.display()
            );
            ca_pem = Some(ca.cert_pem().to_string());
        }
        let port = free_port();
        let mut auth_section = String::new();
        let mut auth = RegistryAuth::Anonymous;
        if let Some((name, password)) = user {
            let hash = bcrypt::hash(password, 4).unwrap();
            let htpasswd = dir.path().join("htpasswd");
            std::fs::write(&htpasswd, format!("{name}:{hash}\n")).unwrap();
            auth_section = format!(
                "auth:\n  htpasswd:\n    realm: modelgate-test\n    path: {}\n",
                htpasswd.display()
            );
            auth = RegistryAuth::Basic(name.to_string(), password.to_string());
        }
        let config = format!(
            "version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\n\
             storage:\n  filesystem:\n    rootdirectory: {}\n\
             http:\n  addr: 127.0.0.1:{port}\n  secret: modelgate-test\n{tls_section}{auth_section}",
            dir.path().join("data").display()
        );
        let config_path = dir.path().join("config.yml");
        std::fs::write(&config_path, config).unwrap();
        let child = Command::new(binary)
            .arg("serve")
            .arg(&config_path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("docker-registry starts");
        let host = format!("127.0.0.1:{port}");
        let mut registry = Registry {
            child,
            host,
            _dir: dir,
            auth,
            ca_pem,
        };
        registry.wait_ready();
        registry
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(mut s) = TcpStream::connect(&self.host) {
                let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
                // Over TLS, any bytes back (an alert) say it listens.
                let _ = s.write_all(b"GET /v2/ HTTP/1.0\r\n\r\n");
                let mut head = [0u8; 7];
                if s.read_exact(&mut head).is_ok()
                    && (self.ca_pem.is_some() || head.starts_with(b"HTTP/1."))
                {
                    return;
                }
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("docker-registry exited: {status}");
            }
            assert!(Instant::now() < deadline, "docker-registry did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn client(&self) -> Client {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let config = match &self.ca_pem {
            Some(pem) => ClientConfig {
                extra_root_certificates: vec![Certificate {
                    encoding: CertificateEncoding::Pem,
                    data: pem.as_bytes().to_vec(),
                }],
                ..ClientConfig::default()
            },
            None => ClientConfig {
                protocol: ClientProtocol::Http,
                ..ClientConfig::default()
            },
        };
        Client::try_from(config).unwrap()
    }

    pub fn reference(&self, name: &str) -> Reference {
        format!("{}/{name}", self.host).parse().unwrap()
    }

    /// Pushes an image whose config has `user` (none: no `User`) for `arch`; its manifest's
    /// digest and size.
    pub fn push(&self, name: &str, user: Option<&str>, arch: &str) -> (String, usize) {
        let mut config = json!({
            "architecture": arch,
            "os": "linux",
            "config": {"Env": ["PATH=/usr/bin"]},
            "rootfs": {"type": "layers", "diff_ids": ["sha256:5f70bf18a086007016e948b04aed3b82103a36bea41755b6cddfaf10ace3c6ef"]},
        });
        if let Some(u) = user {
            config["config"]["User"] = json!(u);
        }
        let config = Config::oci_v1(serde_json::to_vec(&config).unwrap(), None);
        let layers = vec![ImageLayer::oci_v1_gzip(
            format!("layer of {name} for {arch}").into_bytes(),
            None,
        )];
        let manifest = OciImageManifest::build(&layers, &config, None);
        let reference = self.reference(name);
        let runtime = runtime();
        runtime.block_on(async {
            let client = self.client();
            client
                .push(&reference, &layers, config, &self.auth, Some(manifest))
                .await
                .expect("push");
            let (body, digest) = client
                .pull_manifest_raw(
                    &reference,
                    &self.auth,
                    &[oci_client::manifest::OCI_IMAGE_MEDIA_TYPE],
                )
                .await
                .expect("pull back");
            (digest, body.len())
        })
    }

    /// Pushes an index of `entries` (arch, manifest digest, size) as `name`.
    pub fn push_index(&self, name: &str, entries: &[(&str, String, usize)]) {
        let index: OciImageIndex = serde_json::from_value(json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": entries.iter().map(|(arch, digest, size)| json!({
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": digest,
                "size": size,
                "platform": {"architecture": arch, "os": "linux"},
            })).collect::<Vec<_>>(),
        }))
        .unwrap();
        let reference = self.reference(name);
        runtime().block_on(async {
            self.client()
                .push_manifest_list(&reference, &self.auth, index)
                .await
                .expect("push the index");
        });
    }
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}
