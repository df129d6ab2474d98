//! Shared by the `server_*` tests: certificates from `modelgate::cli::certs`, the real binary
//! on ephemeral ports of 127.0.0.1, and a TLS client that verifies the server against the CA,
//! as the API server does.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::{Request, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use modelgate::admission::Webhook;
use modelgate::cli::certs::{self, Authority, Issued};
use modelgate_core::testing;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

pub mod admissions;
#[path = "required.rs"]
mod required;
#[allow(unused_imports)] // Not every test crate that includes this module needs it.
pub use required::missing;

pub type Body = BoxBody<Bytes, std::convert::Infallible>;

/// A field of `/proc/PID/status` in KiB (`VmHWM:` the peak RSS, `VmRSS:` the current one).
pub fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("{field} not in /proc/{pid}/status"))
}

pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).boxed()
}

/// Polls `f` every 20 ms until it returns `Some` or `limit` passes.
pub fn wait_until<T>(limit: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let end = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= end {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

// ---------------------------------------------------------------------------------------------
// Certificates

/// A CA and a serving certificate for localhost, written as ca.crt, tls.crt and tls.key.
pub struct TestPki {
    pub dir: tempfile::TempDir,
    pub ca: Authority,
}

impl TestPki {
    pub fn new() -> TestPki {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca = Authority::new("modelgate test CA", 2).expect("CA");
        let pki = TestPki { dir, ca };
        let serving = pki.serving();
        pki.write_pair(pki.dir.path(), &serving);
        std::fs::write(pki.ca_path(), pki.ca.cert_pem()).expect("write ca.crt");
        pki
    }

    pub fn serving(&self) -> Issued {
        self.ca
            .issue_server(&["localhost".into(), "127.0.0.1".into()], 2)
            .expect("serving certificate")
    }

    pub fn write_pair(&self, dir: &Path, pair: &Issued) {
        std::fs::create_dir_all(dir).expect("mkdir");
        std::fs::write(dir.join(certs::CERT_FILE), &pair.cert_pem).expect("write tls.crt");
        std::fs::write(dir.join(certs::KEY_FILE), &pair.key_pem).expect("write tls.key");
    }

    pub fn ca_path(&self) -> PathBuf {
        self.dir.path().join(certs::CA_FILE)
    }

    pub fn cert_path(&self) -> PathBuf {
        self.dir.path().join(certs::CERT_FILE)
    }

    pub fn key_path(&self) -> PathBuf {
        self.dir.path().join(certs::KEY_FILE)
    }

    pub fn tls_args(&self) -> Vec<String> {
        vec![
            format!("--tls-cert={}", self.cert_path().display()),
            format!("--tls-key={}", self.key_path().display()),
        ]
    }
}

pub fn der_of(pem: &str) -> Vec<u8> {
    CertificateDer::from_pem_slice(pem.as_bytes())
        .expect("PEM certificate")
        .to_vec()
}

// ---------------------------------------------------------------------------------------------
// The server process

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_modelgate")
}

/// A `modelgate serve` child process; killed if the test ends before it exits.
pub struct ServerProcess {
    pub child: Child,
    pub webhook: SocketAddr,
    pub probe: SocketAddr,
    /// Every log line (stderr), as read so far.
    pub logs: Arc<Mutex<Vec<String>>>,
    pub stdout: Option<ChildStdout>,
}

/// `modelgate serve` logging JSON at `info`, on ephemeral ports, its output piped. Every
/// admission is logged (`MODELGATE_LOG_ADMISSIONS`: the tests read the lines of allowed
/// admissions too); a test of what is logged by default passes `--log-admissions=false`, which
/// wins over the variable.
fn serve_base() -> Command {
    let mut cmd = Command::new(bin());
    cmd.arg("serve")
        .args([
            "--listen=127.0.0.1:0",
            "--probe-listen=127.0.0.1:0",
            "--log-format=json",
        ])
        .env("RUST_LOG", "info")
        .env("MODELGATE_LOG_ADMISSIONS", "true")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// The binary with `args` after `serve`, logging JSON, on ephemeral ports, with no cluster to
/// watch (tests/cache_watch.rs covers the watch against a fake API server).
pub fn serve_command(args: &[String]) -> Command {
    let mut cmd = serve_base();
    cmd.arg("--no-cluster").args(args);
    cmd
}

/// [`serve_command`] watching the cluster that `kubeconfig` points at (a fake API server's),
/// never the one of the machine's environment.
pub fn serve_command_against(kubeconfig: &std::path::Path, args: &[String]) -> Command {
    let mut cmd = serve_base();
    cmd.args(args)
        .env("KUBECONFIG", kubeconfig)
        .env_remove("KUBERNETES_SERVICE_HOST");
    cmd
}

/// Runs `cmd` with its open-files limit, soft and hard, at `n`, as a container runtime sets it
/// (`serve` can then raise its soft limit no higher).
pub fn with_open_files_limit(cmd: &mut Command, n: u64) -> &mut Command {
    use std::os::unix::process::CommandExt as _;
    // SAFETY: the closure runs in the child between fork and exec and calls only setrlimit,
    // which is async-signal-safe; it allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            let limit = libc::rlimit {
                rlim_cur: n as libc::rlim_t,
                rlim_max: n as libc::rlim_t,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    }
}

/// The file descriptors process `pid` has open.
pub fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

impl ServerProcess {
    pub fn start(args: &[String]) -> ServerProcess {
        Self::spawn(serve_command(args))
    }

    pub fn spawn(mut cmd: Command) -> ServerProcess {
        let mut child = cmd.spawn().expect("spawn modelgate");
        let stderr = child.stderr.take().expect("stderr");
        let logs = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::channel::<(String, SocketAddr)>();
        let sink = logs.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Ok(v) = serde_json::from_str::<Value>(&line)
                    && v["message"] == "listening"
                    && let (Some(name), Some(addr)) = (v["listener"].as_str(), v["addr"].as_str())
                    && let Ok(addr) = addr.parse()
                {
                    let _ = tx.send((name.to_string(), addr));
                }
                sink.lock().unwrap().push(line);
            }
        });
        let (mut webhook, mut probe) = (None, None);
        let end = Instant::now() + Duration::from_secs(30);
        while webhook.is_none() || probe.is_none() {
            let left = end.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok((name, addr)) if name == "webhook" => webhook = Some(addr),
                Ok((_, addr)) => probe = Some(addr),
                Err(_) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!(
                        "modelgate did not report its listeners; logs:\n{}",
                        logs.lock().unwrap().join("\n")
                    );
                }
            }
        }
        let stdout = child.stdout.take();
        ServerProcess {
            child,
            webhook: webhook.unwrap(),
            probe: probe.unwrap(),
            logs,
            stdout,
        }
    }

    pub fn logs(&self) -> String {
        self.logs.lock().unwrap().join("\n")
    }

    pub fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{name} failed");
    }

    /// Waits for the process to exit, at most `limit`.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let child = &mut self.child;
        wait_until(limit, || child.try_wait().ok().flatten())
    }

    /// GET on the probe listener (plain HTTP/1.1): status and body.
    pub async fn probe_get(&self, path: &str) -> Result<(StatusCode, String), String> {
        probe_get(self.probe, path).await
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

pub async fn probe_get(addr: SocketAddr, path: &str) -> Result<(StatusCode, String), String> {
    let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let req = Request::get(path)
        .header("host", "probe")
        .body(full(""))
        .unwrap();
    let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
    let status = resp.status();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

// ---------------------------------------------------------------------------------------------
// The TLS client

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    H1,
    H2,
}

pub fn client_config(
    ca_pem: &str,
    proto: Proto,
    client_cert: Option<&Issued>,
) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca_pem.as_bytes()).expect("CA PEM"))
        .expect("CA");
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_root_certificates(roots);
    let mut config = match client_cert {
        Some(c) => builder
            .with_client_auth_cert(
                vec![CertificateDer::from_pem_slice(c.cert_pem.as_bytes()).unwrap()],
                PrivateKeyDer::from_pem_slice(c.key_pem.as_bytes()).unwrap(),
            )
            .expect("client cert"),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = match proto {
        Proto::H1 => vec![b"http/1.1".to_vec()],
        Proto::H2 => vec![b"h2".to_vec()],
    };
    Arc::new(config)
}

enum Sender {
    H1(hyper::client::conn::http1::SendRequest<Body>),
    H2(hyper::client::conn::http2::SendRequest<Body>),
}

/// One TLS connection to the webhook listener.
pub struct Conn {
    sender: Sender,
    pub proto: Proto,
    /// DER of the leaf certificate the server presented.
    pub peer_cert: Vec<u8>,
    pub alpn: Option<Vec<u8>>,
    authority: String,
}

/// An answer: status, content type and body.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub version: hyper::Version,
    pub content_type: String,
    /// The answer carried `Connection: close` (HTTP/1.1).
    pub connection_close: bool,
    pub body: Bytes,
}

impl Answer {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }
}

pub async fn connect(
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
    proto: Proto,
) -> Result<Conn, String> {
    connect_named(addr, config, proto, "localhost").await
}

pub async fn connect_named(
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
    proto: Proto,
    server_name: &str,
) -> Result<Conn, String> {
    let tcp = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let name = ServerName::try_from(server_name.to_string()).map_err(|e| e.to_string())?;
    let tls = TlsConnector::from(config)
        .connect(name, tcp)
        .await
        .map_err(|e| format!("TLS handshake: {e}"))?;
    let (_, session) = tls.get_ref();
    let peer_cert = session
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.to_vec())
        .unwrap_or_default();
    let alpn = session.alpn_protocol().map(<[u8]>::to_vec);
    let io = TokioIo::new(tls);
    let sender = match proto {
        Proto::H1 => {
            let (s, conn) = hyper::client::conn::http1::handshake(io)
                .await
                .map_err(|e| format!("HTTP/1.1 handshake: {e}"))?;
            tokio::spawn(conn);
            Sender::H1(s)
        }
        Proto::H2 => {
            let (s, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
                .await
                .map_err(|e| format!("h2 handshake: {e}"))?;
            tokio::spawn(conn);
            Sender::H2(s)
        }
    };
    Ok(Conn {
        sender,
        proto,
        peer_cert,
        alpn,
        authority: format!("{server_name}:{}", addr.port()),
    })
}

impl Conn {
    /// A clone of the h2 sender, to run many requests at once on this one connection.
    pub fn h2_sender(&self) -> Option<hyper::client::conn::http2::SendRequest<Body>> {
        match &self.sender {
            Sender::H2(s) => Some(s.clone()),
            Sender::H1(_) => None,
        }
    }

    pub fn request(&self, method: &str, path: &str) -> hyper::http::request::Builder {
        let builder = Request::builder().method(method);
        match self.proto {
            Proto::H1 => builder.uri(path).header("host", &self.authority),
            Proto::H2 => builder.uri(format!("https://{}{path}", self.authority)),
        }
    }

    pub async fn send(&mut self, req: Request<Body>) -> Result<Answer, String> {
        let resp = match &mut self.sender {
            Sender::H1(s) => {
                s.ready().await.map_err(|e| e.to_string())?;
                s.send_request(req).await
            }
            Sender::H2(s) => {
                s.ready().await.map_err(|e| e.to_string())?;
                s.send_request(req).await
            }
        }
        .map_err(|e| format!("request: {e}"))?;
        let status = resp.status();
        let version = resp.version();
        let content_type = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let connection_close = resp
            .headers()
            .get("connection")
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"close"));
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("response body: {e}"))?
            .to_bytes();
        Ok(Answer {
            status,
            version,
            content_type,
            connection_close,
            body,
        })
    }

    /// POST a JSON body.
    pub async fn post_json(
        &mut self,
        path: &str,
        body: impl Into<Bytes>,
    ) -> Result<Answer, String> {
        let req = self
            .request("POST", path)
            .header("content-type", "application/json")
            .body(full(body))
            .unwrap();
        self.send(req).await
    }
}

// ---------------------------------------------------------------------------------------------
// AdmissionReviews

/// The corpus's AdmissionReviews, where `scripts/inputs.sh` resolves them:
/// `$MODELGATE_INPUTS_DIR` (default `.inputs`, relative to the repository)`/corpus/admissionreview`.
pub fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(std::env::var_os("MODELGATE_INPUTS_DIR").unwrap_or_else(|| ".inputs".into()))
        .join("corpus/admissionreview")
}

/// The corpus AdmissionReviews (bare AdmissionRequests wrapped in a v1 envelope), or `None`
/// (after saying so) when the corpus is not there.
pub fn corpus_reviews() -> Option<Vec<(String, Value)>> {
    let dir = corpus_dir();
    if !dir.is_dir() {
        println!(
            "corpus not found at {}: corpus round trips skipped",
            dir.display()
        );
        return None;
    }
    let mut out = Vec::new();
    let mut stack = vec![dir];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).expect("read corpus dir") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if !name.ends_with(".json") || name.starts_with('_') {
                continue;
            }
            let v: Value = serde_json::from_slice(&std::fs::read(&path).unwrap())
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let review = if v["kind"] == "AdmissionReview" {
                v
            } else {
                json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": v})
            };
            out.push((name, review));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Some(out)
}

/// A Pod CREATE review that modelgate mutates (and allows).
pub fn pod_review(uid: &str) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "team-a",
            "operation": "CREATE",
            "userInfo": {"username": "tester"},
            "object": {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"generateName": "worker-", "namespace": "team-a"},
                "spec": {"containers": [{"name": "main", "image": "busybox"}]}
            }
        }
    })
}

/// Checks an answer to `review` from `path` as the API server would, and returns the patched
/// object (the object itself when there is no patch).
pub fn check_answer(path: &str, review: &Value, answer: &Answer) -> Value {
    assert_eq!(answer.status, StatusCode::OK, "{path}: {answer:?}");
    assert_eq!(answer.content_type, "application/json");
    let webhook = if path.starts_with("/validate") {
        Webhook::Validate
    } else {
        Webhook::Mutate
    };
    testing::read_answer(webhook, review, 200, &answer.body).patched(&review["request"]["object"])
}
