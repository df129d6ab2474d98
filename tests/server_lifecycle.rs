//! The process: graceful shutdown with requests in flight, `serve --dev` from a fresh
//! directory with curl, flags and their environment variables.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use hyper::StatusCode;
use serde_json::{Value, json};

/// Starts a request whose body is only half sent; returns the sender of the rest and the task
/// that awaits the answer.
async fn half_sent(
    conn: Conn,
    body: Vec<u8>,
) -> (
    http_body_util::channel::Sender<Bytes>,
    tokio::task::JoinHandle<Result<Answer, String>>,
    Bytes,
) {
    let mut conn = conn;
    let (mut tx, channel) = http_body_util::channel::Channel::<Bytes>::new(2);
    let req = conn
        .request("POST", "/mutate?timeout=10s")
        .header("content-type", "application/json")
        .header("content-length", body.len().to_string())
        .body(http_body_util::BodyExt::boxed(channel))
        .unwrap();
    let half = body.len() / 2;
    let task = tokio::spawn(async move { conn.send(req).await });
    tx.send_data(Bytes::copy_from_slice(&body[..half]))
        .await
        .unwrap();
    (tx, task, Bytes::copy_from_slice(&body[half..]))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_in_flight_requests_and_exits_0() {
    let pki = TestPki::new();
    let mut args = pki.tls_args();
    // A grace period long enough that the late connection below is made within it however
    // loaded the machine is; what is checked after it is order, not time.
    args.push("--shutdown-grace=5s".into());
    // The rest of each body comes after the grace period: longer than the default progress wait,
    // and slower than the default minimum rate.
    args.push("--body-progress-timeout=30s".into());
    args.push("--min-body-bytes-per-second=1".into());
    let mut server = ServerProcess::start(&args);
    let review = pod_review("in-flight");
    let body = serde_json::to_vec(&review).unwrap();

    let mut in_flight = Vec::new();
    for proto in [Proto::H1, Proto::H2] {
        let config = client_config(pki.ca.cert_pem(), proto, None);
        let conn = connect(server.webhook, config, proto).await.unwrap();
        in_flight.push(half_sent(conn, body.clone()).await);
    }
    let mut inflight_seen = false;
    for _ in 0..250 {
        let (_, metrics) = server.probe_get("/metrics").await.unwrap();
        if metrics.contains("modelgate_inflight_requests 2") {
            inflight_seen = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(inflight_seen, "the two requests never reached the server");

    server.signal("TERM");
    let started = Instant::now();
    let mut drained_readyz = None;
    for _ in 0..250 {
        let (status, text) = server.probe_get("/readyz").await.unwrap();
        if status == StatusCode::SERVICE_UNAVAILABLE {
            drained_readyz = Some(text);
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let text = drained_readyz.expect("/readyz never turned 503");
    assert!(text.contains("shutting down"), "{text}");

    // Within the grace period the server still takes new connections (the API server may
    // not have seen the endpoint go yet).
    let config = client_config(pki.ca.cert_pem(), Proto::H1, None);
    let mut late = connect(server.webhook, config, Proto::H1).await.unwrap();
    check_answer(
        "/mutate",
        &review,
        &late.post_json("/mutate", body.clone()).await.unwrap(),
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "slower than the grace period"
    );

    // After it, new connections are refused while the in-flight requests are still pending.
    let mut refused = false;
    for _ in 0..500 {
        if tokio::net::TcpStream::connect(server.webhook)
            .await
            .is_err()
        {
            refused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(refused, "the listener never closed");
    assert!(
        server.child.try_wait().unwrap().is_none(),
        "exited before draining"
    );
    let (status, _) = server.probe_get("/readyz").await.unwrap();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);

    for (mut tx, task, rest) in in_flight {
        tx.send_data(rest).await.unwrap();
        drop(tx);
        let answer = tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("answered")
            .unwrap()
            .expect("in-flight request answered");
        check_answer("/mutate", &review, &answer);
    }
    let status = server
        .wait_exit(Duration::from_secs(10))
        .expect("exited after draining");
    assert_eq!(status.code(), Some(0), "{}", server.logs());
    assert!(
        server
            .logs()
            .contains("stopped: every in-flight request was answered")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_cuts_the_grace_period_short() {
    let pki = TestPki::new();
    let mut args = pki.tls_args();
    args.push("--shutdown-grace=10m".into());
    let mut server = ServerProcess::start(&args);
    server.signal("INT");
    let saw_503 = wait_until(Duration::from_secs(5), || {
        server.logs().contains("shutting down").then_some(())
    });
    assert!(saw_503.is_some(), "{}", server.logs());
    server.signal("INT");
    let status = server
        .wait_exit(Duration::from_secs(10))
        .expect("exits on the second signal");
    assert_eq!(status.code(), Some(0));
}

fn curl_available() -> bool {
    if Path::new("/usr/bin/curl").exists() {
        return true;
    }
    common::missing("/usr/bin/curl");
    false
}

/// Starts `serve --dev` in `dir`; returns the process and the curl command it printed.
fn start_dev(dir: &Path) -> (ServerProcess, String) {
    let mut cmd = serve_command(&["--dev".into(), "--shutdown-grace=0s".into()]);
    cmd.current_dir(dir);
    let mut server = ServerProcess::spawn(cmd);
    let stdout = server.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.trim_start().starts_with("curl ") {
                let _ = tx.send(line.trim().to_string());
            }
        }
    });
    let curl = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("--dev printed a curl command");
    (server, curl)
}

fn run_curl(dir: &Path, command: &str) -> Value {
    let out = Command::new("sh")
        .arg("-c")
        .arg(command)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{command}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("curl printed the JSON answer")
}

#[test]
fn dev_mode_from_a_fresh_directory_answers_the_printed_curl_command() {
    if !curl_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (mut server, curl) = start_dev(dir.path());
    assert!(curl.contains("--cacert certs/ca.crt"), "{curl}");
    let answer = run_curl(dir.path(), &curl);
    let sample: Value = serde_json::from_str(modelgate::cli::serve::SAMPLE_REVIEW).unwrap();
    assert_eq!(answer["response"]["uid"], sample["request"]["uid"]);
    assert_eq!(answer["response"]["allowed"], true);
    assert_eq!(answer["response"]["patchType"], "JSONPatch");
    {
        use std::os::unix::fs::PermissionsExt;
        let key = std::fs::metadata(dir.path().join("certs/tls.key")).unwrap();
        assert_eq!(key.permissions().mode() & 0o777, 0o600);
    }
    let cert = std::fs::read(dir.path().join("certs/tls.crt")).unwrap();
    server.signal("TERM");
    let status = server.wait_exit(Duration::from_secs(10)).expect("exit");
    assert_eq!(status.code(), Some(0));

    // The second start reuses the certificates: the same CA, so the same command works.
    let (server, curl_again) = start_dev(dir.path());
    assert_eq!(
        std::fs::read(dir.path().join("certs/tls.crt")).unwrap(),
        cert
    );
    // The curl command is printed on stdout at once; log lines reach stderr a moment later.
    wait_until(Duration::from_secs(5), || {
        server.logs().contains(r#""reused":true"#).then_some(())
    })
    .unwrap_or_else(|| panic!("reuse not logged: {}", server.logs()));
    let answer = run_curl(dir.path(), &curl_again);
    assert_eq!(answer["response"]["uid"], sample["request"]["uid"]);
}

#[test]
fn bad_flags_exit_2_with_one_line() {
    for args in [
        vec!["serve", "--dev", "--init-container-user=0"],
        vec!["serve"],
        vec!["serve", "--dev", "--shutdown-grace=soon"],
        vec!["serve", "--dev", "--max-body-bytes=0"],
        vec!["serve", "--tls-cert=/x"],
    ] {
        let out = Command::new(bin())
            .args(&args)
            .env("MODELGATE_DEV", "false")
            .current_dir(std::env::temp_dir())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(stderr.trim().lines().count(), 1, "{args:?}: {stderr}");
    }
    let out = Command::new(bin())
        .args(["serve", "--dev", "--caches=/nonexistent/caches.yaml"])
        .args(["--listen=127.0.0.1:0", "--probe-listen=127.0.0.1:0"])
        .current_dir(tempfile::tempdir().unwrap().path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/caches.yaml"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn environment_variables_and_cache_files_reach_the_server() {
    let pki = TestPki::new();
    let caches = pki.dir.path().join("caches.yaml");
    std::fs::write(
        &caches,
        "apiVersion: serving.kserve.io/v1alpha1\nkind: LocalModelCache\nmetadata:\n  name: llama\n\
         spec:\n  sourceModelUri: hf://meta-llama/Llama-3.1-8B-Instruct\n  modelSize: 10Gi\n  \
         nodeGroups: [workers]\nstatus:\n  nodeStatus: {gpu-1: NodeDownloaded}\n---\n\
         apiVersion: serving.kserve.io/v1alpha1\nkind: LocalModelNodeGroup\nmetadata: {name: workers}\n\
         spec: {persistentVolumeSpec: {local: {path: /models}}}\n---\n\
         apiVersion: v1\nkind: Node\nmetadata: {name: gpu-1, labels: {kubernetes.io/hostname: gpu-1}}\n---\n\
         apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: llama-workers, namespace: ml-team}\n",
    )
    .unwrap();
    let mut cmd = serve_command(&[]);
    cmd.env("MODELGATE_TLS_CERT", pki.cert_path())
        .env("MODELGATE_TLS_KEY", pki.key_path())
        .env("MODELGATE_CACHES", &caches)
        .env("MODELGATE_RUN_AS_USER", "4242")
        .env("MODELGATE_MAX_BODY_BYTES", "4000");
    let server = ServerProcess::spawn(cmd);
    let config = client_config(pki.ca.cert_pem(), Proto::H2, None);
    let mut conn = connect(server.webhook, config, Proto::H2).await.unwrap();

    let sample: Value = serde_json::from_str(modelgate::cli::serve::SAMPLE_REVIEW).unwrap();
    let answer = conn
        .post_json("/mutate", serde_json::to_vec(&sample).unwrap())
        .await
        .unwrap();
    let object = check_answer("/mutate", &sample, &answer);
    assert_eq!(
        object["metadata"]["annotations"]["modelgate.io/model-cache"],
        "cluster/llama"
    );
    assert_eq!(object["spec"]["securityContext"]["runAsUser"], 4242);

    let mut big = pod_review("big");
    big["request"]["object"]["metadata"]["annotations"] = json!({"filler": "x".repeat(5000)});
    let answer = conn
        .post_json("/mutate", serde_json::to_vec(&big).unwrap())
        .await
        .unwrap();
    assert_eq!(answer.status, StatusCode::PAYLOAD_TOO_LARGE);
}
