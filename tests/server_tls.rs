//! TLS: mutual TLS, certificate rotation by a Secret-style symlink swap under load, and the
//! `certs` subcommand's output served for real.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use base64::Engine;
use common::*;
use hyper::StatusCode;
use modelgate::cli::certs::{self, Authority};
use tokio::sync::Mutex;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_serves_only_clients_signed_by_the_client_ca() {
    let pki = TestPki::new();
    let client_ca = Authority::new("API server client CA", 1).unwrap();
    let ca_file = pki.dir.path().join("client-ca.crt");
    std::fs::write(&ca_file, client_ca.cert_pem()).unwrap();
    let mut args = pki.tls_args();
    args.push(format!("--client-ca={}", ca_file.display()));
    let server = ServerProcess::start(&args);

    let apiserver = client_ca.issue_client("kube-apiserver", 1).unwrap();
    let stranger = Authority::new("someone else", 1)
        .unwrap()
        .issue_client("kube-apiserver", 1)
        .unwrap();
    let review = pod_review("mtls");
    let body = serde_json::to_vec(&review).unwrap();
    for proto in [Proto::H1, Proto::H2] {
        let config = client_config(pki.ca.cert_pem(), proto, Some(&apiserver));
        let mut conn = connect(server.webhook, config, proto).await.unwrap();
        let a = conn.post_json("/mutate", body.clone()).await.unwrap();
        check_answer("/mutate", &review, &a);

        for (who, cert) in [("no certificate", None), ("another CA", Some(&stranger))] {
            let config = client_config(pki.ca.cert_pem(), proto, cert);
            // With TLS 1.3 the refusal may only show on the first read.
            let result = match connect(server.webhook, config, proto).await {
                Ok(mut conn) => conn
                    .post_json("/mutate", body.clone())
                    .await
                    .map(|a| a.status),
                Err(e) => Err(e),
            };
            assert!(result.is_err(), "{proto:?}, {who}: served: {result:?}");
        }
    }
    // Log lines are written by a flusher, a moment after the event.
    wait_until(Duration::from_secs(5), || {
        server.logs().contains("TLS handshake failed").then_some(())
    })
    .unwrap_or_else(|| panic!("not logged: TLS handshake failed: {}", server.logs()));
}

/// The layout of a mounted Secret: `..<timestamp>/` folders, a `..data` symlink to the current
/// one, and the file names as symlinks through `..data`.
fn secret_version(dir: &Path, version: &str, cert_pem: &str, key_pem: &str) {
    let data = dir.join(version);
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("tls.crt"), cert_pem).unwrap();
    std::fs::write(data.join("tls.key"), key_pem).unwrap();
}

fn secret_swap(dir: &Path, version: &str) {
    let tmp = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(version, &tmp).unwrap();
    std::fs::rename(&tmp, dir.join("..data")).unwrap();
}

fn not_after(cert_pem: &str) -> i64 {
    let der = der_of(cert_pem);
    let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
    cert.validity().not_after.timestamp()
}

async fn metric(server: &ServerProcess, line_prefix: &str) -> Option<String> {
    let (_, text) = server.probe_get("/metrics").await.ok()?;
    text.lines()
        .find(|l| l.starts_with(line_prefix))
        .map(str::to_string)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotation_by_symlink_swap_under_load_loses_no_request() {
    let pki = TestPki::new();
    let secret = pki.dir.path().join("secret");
    let first = pki.serving();
    let second = pki
        .ca
        .issue_server(&["localhost".into(), "127.0.0.1".into()], 1)
        .unwrap();
    assert_ne!(not_after(&first.cert_pem), not_after(&second.cert_pem));
    secret_version(
        &secret,
        "..2025_01_01_00_00_00.1",
        &first.cert_pem,
        &first.key_pem,
    );
    secret_swap(&secret, "..2025_01_01_00_00_00.1");
    for f in ["tls.crt", "tls.key"] {
        std::os::unix::fs::symlink(format!("..data/{f}"), secret.join(f)).unwrap();
    }
    let server = ServerProcess::start(&[
        format!("--tls-cert={}", secret.join("tls.crt").display()),
        format!("--tls-key={}", secret.join("tls.key").display()),
    ]);
    let (first_der, second_der) = (der_of(&first.cert_pem), der_of(&second.cert_pem));

    let stop = Arc::new(AtomicBool::new(false));
    let failures = Arc::new(Mutex::new(Vec::<String>::new()));
    let answered = Arc::new(AtomicUsize::new(0));
    // Which certificate each new connection saw, in order.
    let seen = Arc::new(Mutex::new(Vec::<Vec<u8>>::new()));
    let body = serde_json::to_vec(&pod_review("rotation")).unwrap();

    // One long-lived h2 connection (established before the swap, it keeps its certificate) ...
    let steady = {
        let (stop, failures, answered, body) = (
            stop.clone(),
            failures.clone(),
            answered.clone(),
            body.clone(),
        );
        let config = client_config(pki.ca.cert_pem(), Proto::H2, None);
        let addr = server.webhook;
        tokio::spawn(async move {
            let mut conn = connect(addr, config, Proto::H2).await.unwrap();
            while !stop.load(Ordering::Relaxed) {
                match conn.post_json("/mutate", body.clone()).await {
                    Ok(a) if a.status == StatusCode::OK => {
                        answered.fetch_add(1, Ordering::Relaxed);
                    }
                    other => failures.lock().await.push(format!("h2: {other:?}")),
                }
            }
        })
    };
    // ... and a new HTTP/1.1 connection for every request.
    let churn = {
        let (stop, failures, answered, seen, body) = (
            stop.clone(),
            failures.clone(),
            answered.clone(),
            seen.clone(),
            body.clone(),
        );
        let config = client_config(pki.ca.cert_pem(), Proto::H1, None);
        let addr = server.webhook;
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let result = match connect(addr, config.clone(), Proto::H1).await {
                    Ok(mut conn) => {
                        seen.lock().await.push(conn.peer_cert.clone());
                        conn.post_json("/validate", body.clone()).await
                    }
                    Err(e) => Err(e),
                };
                match result {
                    Ok(a) if a.status == StatusCode::OK => {
                        answered.fetch_add(1, Ordering::Relaxed);
                    }
                    other => failures.lock().await.push(format!("h1: {other:?}")),
                }
            }
        })
    };

    let wait_for_cert = |want: Vec<u8>| {
        let seen = seen.clone();
        async move {
            for _ in 0..500 {
                if seen.lock().await.last() == Some(&want) {
                    return true;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            false
        }
    };
    assert!(wait_for_cert(first_der.clone()).await);
    tokio::time::sleep(Duration::from_millis(200)).await;

    secret_version(
        &secret,
        "..2025_02_01_00_00_00.2",
        &second.cert_pem,
        &second.key_pem,
    );
    secret_swap(&secret, "..2025_02_01_00_00_00.2");
    assert!(
        wait_for_cert(second_der.clone()).await,
        "new connections never presented the new certificate"
    );
    let swapped_at = seen.lock().await.len();

    // A broken pair (the key of another certificate): logged, and the last good pair stays.
    let stray = pki.serving();
    secret_version(
        &secret,
        "..2025_03_01_00_00_00.3",
        &second.cert_pem,
        &stray.key_pem,
    );
    secret_swap(&secret, "..2025_03_01_00_00_00.3");
    let mut refused = None;
    for _ in 0..500 {
        refused = metric(&server, r#"modelgate_tls_reloads_total{result="failure"}"#).await;
        // The series is there at 0 from the start; wait for the count.
        if refused.as_deref().is_some_and(|l| !l.ends_with(" 0")) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        refused.as_deref(),
        Some(r#"modelgate_tls_reloads_total{result="failure"} 1"#)
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, Ordering::Relaxed);
    steady.await.unwrap();
    churn.await.unwrap();

    let failures = failures.lock().await;
    assert!(failures.is_empty(), "failed requests: {failures:?}");
    let seen = seen.lock().await;
    assert!(
        seen[swapped_at..].iter().all(|c| *c == second_der),
        "a connection after the swap presented something other than the new certificate"
    );
    assert!(answered.load(Ordering::Relaxed) > 20);
    assert_eq!(
        metric(&server, r#"modelgate_tls_reloads_total{result="success"}"#)
            .await
            .as_deref(),
        Some(r#"modelgate_tls_reloads_total{result="success"} 2"#)
    );
    assert_eq!(
        metric(
            &server,
            "modelgate_tls_certificate_expiry_timestamp_seconds "
        )
        .await,
        Some(format!(
            "modelgate_tls_certificate_expiry_timestamp_seconds {}",
            not_after(&second.cert_pem)
        ))
    );
    let (status, _) = server.probe_get("/readyz").await.unwrap();
    assert_eq!(status, StatusCode::OK);
    // Log lines are written by a flusher, a moment after the event.
    wait_until(Duration::from_secs(5), || {
        server
            .logs()
            .contains("the last good one stays in use")
            .then_some(())
    })
    .unwrap_or_else(|| {
        panic!(
            "not logged: the last good one stays in use: {}",
            server.logs()
        )
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certs_subcommand_writes_a_pair_the_server_serves_for_the_service_names() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("tls");
    let run = std::process::Command::new(bin())
        .args(["certs", "--service", "webhook", "--namespace", "ops"])
        .args(["--days", "30", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(run.status.success(), "{run:?}");
    let ca_pem = std::fs::read_to_string(out.join(certs::CA_FILE)).unwrap();
    let bundle = String::from_utf8(run.stdout).unwrap();
    assert_eq!(
        base64::engine::general_purpose::STANDARD
            .decode(bundle.trim())
            .unwrap(),
        ca_pem.as_bytes(),
        "stdout is the caBundle"
    );
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(out.join(certs::KEY_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    let cert_pem = std::fs::read_to_string(out.join(certs::CERT_FILE)).unwrap();
    let der = der_of(&cert_pem);
    let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
    let mut sans: Vec<String> = cert
        .subject_alternative_name()
        .unwrap()
        .unwrap()
        .value
        .general_names
        .iter()
        .map(|n| n.to_string())
        .collect();
    sans.sort();
    assert_eq!(
        sans,
        [
            "DNSName(webhook)",
            "DNSName(webhook.ops)",
            "DNSName(webhook.ops.svc)",
            "DNSName(webhook.ops.svc.cluster.local)"
        ]
    );
    let days =
        (cert.validity().not_after.timestamp() - cert.validity().not_before.timestamp()) / 86_400;
    assert_eq!(
        days, 30,
        "30 days and the hour of clock-skew slack, rounded down"
    );

    let server = ServerProcess::start(&[
        format!("--tls-cert={}", out.join(certs::CERT_FILE).display()),
        format!("--tls-key={}", out.join(certs::KEY_FILE).display()),
    ]);
    let config = client_config(&ca_pem, Proto::H2, None);
    let mut conn = connect_named(server.webhook, config.clone(), Proto::H2, "webhook.ops.svc")
        .await
        .expect("verified as webhook.ops.svc against ca.crt");
    let review = pod_review("certs");
    let a = conn
        .post_json("/mutate", serde_json::to_vec(&review).unwrap())
        .await
        .unwrap();
    check_answer("/mutate", &review, &a);
    assert!(
        connect_named(server.webhook, config, Proto::H2, "elsewhere.ops.svc")
            .await
            .is_err(),
        "a name outside the SANs must not verify"
    );

    let bad = std::process::Command::new(bin())
        .args([
            "certs",
            "--service",
            "Bad_Name",
            "--namespace",
            "ops",
            "--out",
        ])
        .arg(&out)
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("Bad_Name"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_ready_until_a_certificate_loads() {
    let pki = TestPki::new();
    let later = pki.dir.path().join("later");
    let server = ServerProcess::start(&[
        format!("--tls-cert={}", later.join("tls.crt").display()),
        format!("--tls-key={}", later.join("tls.key").display()),
    ]);
    let (status, text) = server.probe_get("/readyz").await.unwrap();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(text.contains("TLS certificate not loaded"), "{text}");
    assert_eq!(
        server.probe_get("/healthz").await.unwrap().0,
        StatusCode::OK
    );
    let config = client_config(pki.ca.cert_pem(), Proto::H1, None);
    assert!(
        connect(server.webhook, config.clone(), Proto::H1)
            .await
            .is_err()
    );

    // Written the way `certs` writes (atomically, one file after the other).
    let pair = pki.serving();
    std::fs::create_dir_all(&later).unwrap();
    certs::write_file_atomic(&later.join("tls.key"), pair.key_pem.as_bytes(), 0o600).unwrap();
    certs::write_file_atomic(&later.join("tls.crt"), pair.cert_pem.as_bytes(), 0o644).unwrap();
    let mut ready = false;
    for _ in 0..250 {
        if server.probe_get("/readyz").await.unwrap().0 == StatusCode::OK {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(ready, "{}", server.logs());
    let mut conn = connect(server.webhook, config, Proto::H1).await.unwrap();
    assert_eq!(conn.peer_cert, der_of(&pair.cert_pem));
    let review = pod_review("late");
    let a = conn
        .post_json("/validate", serde_json::to_vec(&review).unwrap())
        .await
        .unwrap();
    check_answer("/validate", &review, &a);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_1_2_and_1_3_clients_are_served() {
    let pki = TestPki::new();
    let server = ServerProcess::start(&pki.tls_args());
    for version in [&rustls::version::TLS12, &rustls::version::TLS13] {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(der_of(pki.ca.cert_pem()).into()).unwrap();
        let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_protocol_versions(&[version])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        config.alpn_protocols = vec![b"h2".to_vec()];
        let mut conn = connect(server.webhook, Arc::new(config), Proto::H2)
            .await
            .unwrap_or_else(|e| panic!("{version:?}: {e}"));
        let review = pod_review("versions");
        let a = conn
            .post_json("/mutate", serde_json::to_vec(&review).unwrap())
            .await
            .unwrap();
        check_answer("/mutate", &review, &a);
    }
}
