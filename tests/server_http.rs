//! The webhook over real TLS sockets: corpus round trips on HTTP/1.1 and h2, the 4xx answers,
//! the request deadline, slow clients, probes and metrics.

mod common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use hyper::StatusCode;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corpus_round_trips_over_http1_and_h2() {
    let pki = TestPki::new();
    let server = ServerProcess::start(&pki.tls_args());
    let mut reviews = vec![("pod".to_string(), pod_review("uid-pod"))];
    reviews.extend(corpus_reviews().unwrap_or_default());
    for proto in [Proto::H1, Proto::H2] {
        let config = client_config(pki.ca.cert_pem(), proto, None);
        let mut conn = connect(server.webhook, config, proto).await.unwrap();
        let want_alpn: &[u8] = if proto == Proto::H1 {
            b"http/1.1"
        } else {
            b"h2"
        };
        assert_eq!(conn.alpn.as_deref(), Some(want_alpn));
        let mut patched = 0;
        for (name, review) in &reviews {
            let body = serde_json::to_vec(review).unwrap();
            let mutated = conn.post_json("/mutate", body.clone()).await.unwrap();
            let want_version = match proto {
                Proto::H1 => hyper::Version::HTTP_11,
                Proto::H2 => hyper::Version::HTTP_2,
            };
            assert_eq!(mutated.version, want_version);
            let object = check_answer("/mutate", review, &mutated);
            if mutated.json()["response"].get("patch").is_some() {
                patched += 1;
                // The mutated object passes validation, and a second mutation changes nothing.
                let mut again = review.clone();
                again["request"]["object"] = object;
                let body = serde_json::to_vec(&again).unwrap();
                let v = conn.post_json("/validate", body.clone()).await.unwrap();
                check_answer("/validate", &again, &v);
                assert_eq!(
                    v.json()["response"]["allowed"],
                    true,
                    "{name}: {}",
                    v.json()
                );
                let m = conn.post_json("/mutate", body).await.unwrap();
                assert!(
                    m.json()["response"].get("patch").is_none(),
                    "{name}: not idempotent"
                );
            }
            let validated = conn.post_json("/validate", body).await.unwrap();
            check_answer("/validate", review, &validated);
        }
        assert!(patched >= 1, "no review was mutated");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_4xx_and_the_server_stays_up() {
    let pki = TestPki::new();
    let mut args = pki.tls_args();
    args.push("--max-body-bytes=65536".into());
    let server = ServerProcess::start(&args);
    for proto in [Proto::H1, Proto::H2] {
        let config = client_config(pki.ca.cert_pem(), proto, None);
        let fresh = || async {
            connect(server.webhook, config.clone(), proto)
                .await
                .unwrap()
        };
        let still_up = || async {
            let mut conn = fresh().await;
            let review = pod_review("after");
            let a = conn
                .post_json("/mutate", serde_json::to_vec(&review).unwrap())
                .await
                .unwrap();
            check_answer("/mutate", &review, &a);
        };

        // Not JSON: 400 with a Kubernetes Status body.
        let mut conn = fresh().await;
        let a = conn.post_json("/mutate", "{not json").await.unwrap();
        assert_eq!(a.status, StatusCode::BAD_REQUEST);
        assert_eq!(a.json()["kind"], "Status");
        assert_eq!(a.json()["code"], 400);
        // JSON but no AdmissionReview: 400 too.
        let a = conn.post_json("/validate", "[1,2]").await.unwrap();
        assert_eq!(a.status, StatusCode::BAD_REQUEST);
        still_up().await;

        // The uid can be read, the rest is malformed: the answer is a refused review echoing it.
        let mut broken = pod_review("uid-broken");
        broken["request"]["operation"] = json!("EXPLODE");
        let a = conn
            .post_json("/mutate", serde_json::to_vec(&broken).unwrap())
            .await
            .unwrap();
        assert_eq!(a.status, StatusCode::OK);
        assert_eq!(a.json()["response"]["uid"], "uid-broken");
        assert_eq!(a.json()["response"]["allowed"], false);
        assert_eq!(a.json()["response"]["status"]["code"], 400);

        // Over the body limit: 413, whether the length is declared or streamed.
        let mut big = pod_review("big");
        big["request"]["object"]["metadata"]["annotations"] = json!({"filler": "x".repeat(70_000)});
        let big = serde_json::to_vec(&big).unwrap();
        // Declared: the answer comes from the header alone, before any byte of the body is sent
        // (a body written while the server answers and closes would race the answer).
        let mut conn = fresh().await;
        let (held, body) = http_body_util::channel::Channel::<Bytes>::new(1);
        let req = conn
            .request("POST", "/mutate")
            .header("content-type", "application/json")
            .header("content-length", big.len().to_string())
            .body(http_body_util::BodyExt::boxed(body))
            .unwrap();
        let a = conn.send(req).await.unwrap();
        drop(held);
        assert_eq!(a.status, StatusCode::PAYLOAD_TOO_LARGE, "{a:?}");
        assert_eq!(a.json()["code"], 413);
        let message = a.json()["message"].as_str().unwrap().to_string();
        assert!(message.contains("limit of 65536 bytes"), "{message}");
        assert!(
            message.contains(&format!("({} bytes)", big.len())),
            "{message}"
        );
        let mut conn = fresh().await;
        let (mut tx, body) = http_body_util::channel::Channel::<Bytes>::new(4);
        let req = conn
            .request("POST", "/validate")
            .header("content-type", "application/json")
            .body(http_body_util::BodyExt::boxed(body))
            .unwrap();
        let feeder = tokio::spawn(async move {
            for chunk in big.chunks(4096) {
                if tx.send_data(Bytes::copy_from_slice(chunk)).await.is_err() {
                    break;
                }
            }
        });
        let a = conn.send(req).await.unwrap();
        assert_eq!(a.status, StatusCode::PAYLOAD_TOO_LARGE, "{a:?}");
        feeder.abort();
        still_up().await;

        // Wrong or missing content type: 415.
        let mut conn = fresh().await;
        let req = conn
            .request("POST", "/mutate")
            .header("content-type", "text/plain")
            .body(full("{}"))
            .unwrap();
        let a = conn.send(req).await.unwrap();
        assert_eq!(a.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
        assert!(a.json()["message"].as_str().unwrap().contains("text/plain"));
        let req = conn.request("POST", "/validate").body(full("{}")).unwrap();
        assert_eq!(
            conn.send(req).await.unwrap().status,
            StatusCode::UNSUPPORTED_MEDIA_TYPE
        );
        // A charset parameter is fine.
        let review = pod_review("charset");
        let req = conn
            .request("POST", "/mutate")
            .header("content-type", "application/json; charset=utf-8")
            .body(full(serde_json::to_vec(&review).unwrap()))
            .unwrap();
        check_answer("/mutate", &review, &conn.send(req).await.unwrap());

        // Unknown path: 404; wrong method: 405.
        let a = conn.post_json("/mutate/extra", "{}").await.unwrap();
        assert_eq!(a.status, StatusCode::NOT_FOUND);
        assert_eq!(a.json()["code"], 404);
        let req = conn.request("GET", "/mutate").body(full("")).unwrap();
        assert_eq!(
            conn.send(req).await.unwrap().status,
            StatusCode::METHOD_NOT_ALLOWED
        );
        let req = conn.request("GET", "/healthz").body(full("")).unwrap();
        assert_eq!(conn.send(req).await.unwrap().status, StatusCode::OK);
        still_up().await;
    }
    let (status, metrics) = server.probe_get("/metrics").await.unwrap();
    assert_eq!(status, StatusCode::OK);
    for want in [
        r#"modelgate_admission_errors_total{reason="invalid_json"} 2"#,
        r#"modelgate_admission_errors_total{reason="payload_too_large"} 4"#,
        r#"modelgate_admission_errors_total{reason="unsupported_media_type"} 4"#,
        r#"modelgate_admission_errors_total{reason="invalid_review"} 4"#,
    ] {
        assert!(metrics.contains(want), "missing {want} in\n{metrics}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_does_not_arrive_in_time_gets_a_clear_408_before_the_timeout() {
    let pki = TestPki::new();
    let mut args = pki.tls_args();
    // A rate the body below keeps up with until its deadline (14 bytes: 14 s at 1 byte/s), so
    // that the deadline, not the minimum rate (tests/slow_senders.rs), ends it.
    args.push("--min-body-bytes-per-second=1".into());
    // Nor the wait for the body's next part (2 s by default).
    args.push("--body-progress-timeout=10s".into());
    let server = ServerProcess::start(&args);
    let mut tasks = Vec::new();
    for proto in [Proto::H1, Proto::H2] {
        let config = client_config(pki.ca.cert_pem(), proto, None);
        let addr = server.webhook;
        tasks.push(tokio::spawn(async move {
            let mut conn = connect(addr, config, proto).await.unwrap();
            let (mut tx, body) = http_body_util::channel::Channel::<Bytes>::new(1);
            let req = conn
                .request("POST", "/mutate?timeout=5s")
                .header("content-type", "application/json")
                .header("content-length", "1000")
                .body(http_body_util::BodyExt::boxed(body))
                .unwrap();
            tx.send_data(Bytes::from_static(b"{\"apiVersion\":"))
                .await
                .unwrap();
            let started = Instant::now();
            let a = conn.send(req).await.unwrap();
            let took = started.elapsed();
            drop(tx);
            assert_eq!(a.status, StatusCode::REQUEST_TIMEOUT, "{proto:?}: {a:?}");
            // The 5 s timeout leaves a 1 s margin (a fifth, at most 1 s): the answer comes at
            // 4 s, a whole second before the caller gives up, which a loaded machine does not
            // eat; and never before the budget is spent.
            assert!(
                took < Duration::from_secs(5),
                "{proto:?}: answered after the caller's timeout: {took:?}"
            );
            assert!(
                took >= Duration::from_millis(3900),
                "{proto:?}: too early: {took:?}"
            );
            let message = a.json()["message"].as_str().unwrap().to_string();
            assert!(message.contains("did not arrive within 4s"), "{message}");
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let (_, metrics) = server.probe_get("/metrics").await.unwrap();
    assert!(metrics.contains(r#"modelgate_admission_errors_total{reason="deadline_exceeded"} 2"#));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_are_disconnected() {
    let pki = TestPki::new();
    let mut args = pki.tls_args();
    args.push("--header-read-timeout=300ms".into());
    let server = ServerProcess::start(&args);

    // After the TLS handshake: half a request's headers, part of the h2 preface, or nothing at
    // all (slowloris), with and without ALPN. The server hangs up on each.
    let no_alpn = {
        let mut c = (*client_config(pki.ca.cert_pem(), Proto::H1, None)).clone();
        c.alpn_protocols.clear();
        std::sync::Arc::new(c)
    };
    let cases: [(&str, _, &[u8]); 5] = [
        (
            "h1 headers",
            client_config(pki.ca.cert_pem(), Proto::H1, None),
            b"POST /mutate HTTP/1.1\r\nHost: localhost\r\n",
        ),
        (
            "h1 nothing",
            client_config(pki.ca.cert_pem(), Proto::H1, None),
            b"",
        ),
        (
            "h2 preface",
            client_config(pki.ca.cert_pem(), Proto::H2, None),
            b"PRI * HTTP/2.0\r\n",
        ),
        (
            "h2 nothing",
            client_config(pki.ca.cert_pem(), Proto::H2, None),
            b"",
        ),
        ("no ALPN, nothing", no_alpn, b""),
    ];
    // All at once: each must be closed about one timeout after it went quiet.
    let mut tasks = Vec::new();
    for (what, config, sent) in cases {
        let addr = server.webhook;
        tasks.push(tokio::spawn(async move {
            let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
            let mut tls = tokio_rustls::TlsConnector::from(config)
                .connect("localhost".try_into().unwrap(), tcp)
                .await
                .unwrap();
            tls.write_all(sent).await.unwrap();
            tls.flush().await.unwrap();
            let started = Instant::now();
            let mut buf = Vec::new();
            let read =
                tokio::time::timeout(Duration::from_secs(5), tls.read_to_end(&mut buf)).await;
            assert!(read.is_ok(), "{what}: the connection was not closed");
            assert!(started.elapsed() < Duration::from_secs(2), "{what}");
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }

    // A TCP connection that never starts TLS is closed too.
    let mut tcp = tokio::net::TcpStream::connect(server.webhook)
        .await
        .unwrap();
    let mut buf = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), tcp.read_to_end(&mut buf)).await;
    assert!(read.is_ok(), "the silent connection was not closed");

    // Meanwhile, prompt clients are served, and an h2 connection that has made a request
    // stays open while idle (the API server keeps its connections).
    let review = pod_review("prompt");
    let body = serde_json::to_vec(&review).unwrap();
    let config = client_config(pki.ca.cert_pem(), Proto::H1, None);
    let mut conn = connect(server.webhook, config, Proto::H1).await.unwrap();
    check_answer(
        "/mutate",
        &review,
        &conn.post_json("/mutate", body.clone()).await.unwrap(),
    );
    let config = client_config(pki.ca.cert_pem(), Proto::H2, None);
    let mut conn = connect(server.webhook, config, Proto::H2).await.unwrap();
    check_answer(
        "/mutate",
        &review,
        &conn.post_json("/mutate", body.clone()).await.unwrap(),
    );
    tokio::time::sleep(Duration::from_millis(700)).await;
    check_answer(
        "/mutate",
        &review,
        &conn.post_json("/mutate", body).await.unwrap(),
    );
}

/// A fresh server exports every metric family with its series before the first event: each
/// counter at 0 (an alert's `rate()` then sees the first increment, and an absent series means
/// a failed scrape), and every policy result a webhook gives in a mode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_server_exports_every_family_with_its_zero_series() {
    let pki = TestPki::new();
    let server = ServerProcess::start(&pki.tls_args());
    let (status, metrics) = server.probe_get("/metrics").await.unwrap();
    assert_eq!(status, StatusCode::OK);
    /// A family's name, type and samples (series, value).
    type Family<'a> = (&'a str, &'a str, Vec<(&'a str, f64)>);
    // `# TYPE <family> <type>`, then the family's samples up to the next `#` line.
    let mut families: Vec<Family> = Vec::new();
    for line in metrics.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("# TYPE name type");
            families.push((name, kind, Vec::new()));
        } else if !line.starts_with('#')
            && let Some((series, value)) = line.rsplit_once(' ')
            && let Some((_, _, samples)) = families.last_mut()
        {
            samples.push((series, value.parse().expect("a sample's value")));
        }
    }
    let ours: Vec<_> = families
        .iter()
        .filter(|(name, _, _)| name.starts_with("modelgate_"))
        .collect();
    for family in [
        "modelgate_admission_requests",
        "modelgate_admission_duration_seconds",
        "modelgate_policy_results",
        "modelgate_cache_lookups",
        "modelgate_watch_last_failure_timestamp_seconds",
        "modelgate_probe_connections_dropped",
        "modelgate_probe_open_connections",
    ] {
        assert!(
            ours.iter().any(|(name, _, _)| *name == family),
            "{family} is not registered\n{metrics}"
        );
    }
    for (name, kind, samples) in &ours {
        assert!(!samples.is_empty(), "{name} has no series\n{metrics}");
        if *kind == "counter" {
            assert!(
                samples.iter().any(|(_, v)| *v == 0.0),
                "{name} has no series at 0\n{metrics}"
            );
        }
    }
    let policy_results: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("modelgate_policy_results_total{"))
        .collect();
    let mut want = Vec::new();
    for (webhook, modes) in [
        (
            "mutate",
            [
                ("enforce", &["patched", "denied", "unchanged"][..]),
                ("warn", &["would_patch", "would_deny", "unchanged"][..]),
                ("audit", &["would_patch", "would_deny", "unchanged"][..]),
                ("off", &["unchanged"][..]),
            ],
        ),
        (
            "validate",
            [
                ("enforce", &["denied", "unchanged"][..]),
                ("warn", &["would_deny", "unchanged"][..]),
                ("audit", &["would_deny", "unchanged"][..]),
                ("off", &["unchanged"][..]),
            ],
        ),
    ] {
        for (mode, results) in modes {
            for result in results {
                want.push(format!(
                    r#"modelgate_policy_results_total{{webhook="{webhook}",mode="{mode}",result="{result}"}} 0"#
                ));
            }
        }
    }
    let mut got = policy_results.clone();
    got.sort_unstable();
    want.sort_unstable();
    assert_eq!(got, want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_metrics_and_one_log_line_per_admission() {
    let pki = TestPki::new();
    let server = ServerProcess::start(&pki.tls_args());
    assert_eq!(
        server.probe_get("/healthz").await.unwrap().0,
        StatusCode::OK
    );
    let (status, body) = server.probe_get("/readyz").await.unwrap();
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        server.probe_get("/nope").await.unwrap().0,
        StatusCode::NOT_FOUND
    );

    let config = client_config(pki.ca.cert_pem(), Proto::H2, None);
    let mut conn = connect(server.webhook, config, Proto::H2).await.unwrap();
    let mut review = pod_review("uid-metrics");
    review["request"]["dryRun"] = json!(true);
    review["request"]["object"]["metadata"]["annotations"] =
        json!({"secret-looking": "do-not-log-me"});
    let a = conn
        .post_json("/mutate", serde_json::to_vec(&review).unwrap())
        .await
        .unwrap();
    check_answer("/mutate", &review, &a);
    let a = conn
        .post_json("/validate", serde_json::to_vec(&review).unwrap())
        .await
        .unwrap();
    check_answer("/validate", &review, &a);

    let (status, metrics) = server.probe_get("/metrics").await.unwrap();
    assert_eq!(status, StatusCode::OK);
    for want in [
        r#"modelgate_admission_requests_total{webhook="mutate",kind="Pod",operation="CREATE",allowed="true",mutated="true",dry_run="true"} 1"#,
        // The unmutated pod sets no runAsNonRoot: /validate alone refuses it (docs/policy.md §6).
        r#"modelgate_admission_requests_total{webhook="validate",kind="Pod",operation="CREATE",allowed="false",mutated="false",dry_run="true"} 1"#,
        r#"modelgate_admission_duration_seconds_count{webhook="mutate",kind="Pod",operation="CREATE",dry_run="true"} 1"#,
        r#"modelgate_tls_reloads_total{result="success"} 1"#,
        "modelgate_inflight_requests 0",
        "modelgate_tls_certificate_expiry_timestamp_seconds ",
        // The process metrics every Prometheus client exports.
        "process_cpu_seconds_total ",
        "process_resident_memory_bytes ",
        "process_open_fds ",
        "process_start_time_seconds ",
    ] {
        assert!(metrics.contains(want), "missing {want} in\n{metrics}");
    }

    // Exactly one line per admission, with the summary fields and never the object.
    let lines: Vec<Value> = wait_until(Duration::from_secs(5), || {
        let lines: Vec<Value> = server
            .logs()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|v| v["message"] == "admission")
            .collect();
        (lines.len() >= 2).then_some(lines)
    })
    .expect("admission log lines");
    assert_eq!(lines.len(), 2, "{lines:?}");
    let mutate = &lines[0];
    assert_eq!(mutate["uid"], "uid-metrics");
    assert_eq!(mutate["webhook"], "mutate");
    assert_eq!(mutate["kind"], "Pod");
    assert_eq!(mutate["namespace"], "team-a");
    assert_eq!(mutate["name"], "worker-");
    assert_eq!(mutate["operation"], "CREATE");
    assert_eq!(mutate["dry_run"], true);
    assert_eq!(mutate["allowed"], true);
    assert!(mutate["patch_operations"].as_u64().unwrap() > 0);
    assert!(mutate["latency_ms"].is_number());
    assert!(!server.logs().contains("do-not-log-me"));
}

/// What `serve` logs by default: one `info` line for each denial and for each request that
/// could not be reviewed; an allowed admission only at `debug` (RUST_LOG=debug), or at `info`
/// with --log-admissions. A line per admission at 150 a second is ~2 GB of log a day.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_denials_and_errors_are_logged_at_info_by_default() {
    let pki = TestPki::new();
    for (rust_log, flag, allowed_level) in [
        ("info", "--log-admissions=false", None),
        ("debug", "--log-admissions=false", Some("DEBUG")),
        ("info", "--log-admissions", Some("INFO")),
    ] {
        let mut args = pki.tls_args();
        args.push(flag.into());
        let mut cmd = serve_command(&args);
        cmd.env("RUST_LOG", rust_log);
        let server = ServerProcess::spawn(cmd);
        let config = client_config(pki.ca.cert_pem(), Proto::H1, None);
        let mut conn = connect(server.webhook, config, Proto::H1).await.unwrap();
        let allowed = pod_review("uid-allowed");
        let a = conn
            .post_json("/mutate", serde_json::to_vec(&allowed).unwrap())
            .await
            .unwrap();
        assert_eq!(a.json()["response"]["allowed"], true);
        let mut denied = pod_review("uid-denied");
        denied["request"]["object"]["spec"]["containers"][0]["securityContext"] =
            json!({"runAsUser": 0});
        let a = conn
            .post_json("/mutate", serde_json::to_vec(&denied).unwrap())
            .await
            .unwrap();
        assert_eq!(a.json()["response"]["allowed"], false);
        let a = conn.post_json("/mutate", &b"{"[..]).await.unwrap();
        assert_eq!(a.status, StatusCode::BAD_REQUEST);
        let lines: Vec<Value> = wait_until(Duration::from_secs(10), || {
            let lines: Vec<Value> = server
                .logs()
                .lines()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                .filter(|v| v["message"] == "admission")
                .collect();
            (lines.iter().any(|v| v["uid"] == "uid-denied")
                && lines.iter().any(|v| v["error"] == "invalid_json"))
            .then_some(lines)
        })
        .unwrap_or_else(|| {
            panic!(
                "{rust_log} {flag}: no denial or error line: {}",
                server.logs()
            )
        });
        let level_of = |uid: &str| {
            lines
                .iter()
                .find(|v| v["uid"] == uid)
                .map(|v| v["level"].as_str().unwrap().to_string())
        };
        assert_eq!(
            level_of("uid-denied").as_deref(),
            Some("INFO"),
            "{rust_log} {flag}"
        );
        let error = lines.iter().find(|v| v["error"] == "invalid_json").unwrap();
        assert_eq!(error["level"], "INFO");
        assert_eq!(error["status"], 400);
        assert_eq!(
            level_of("uid-allowed").as_deref(),
            allowed_level,
            "{rust_log} {flag}: {lines:?}"
        );
    }
}

/// The probe listener's own limits (docs/security.md): a request head past
/// --probe-max-header-bytes gets 431 and the connection closes; a connection that sends no
/// request is closed after --probe-header-read-timeout, one that stays idle after a request
/// after --probe-idle-timeout; and at --probe-max-connections a new connection closes the one
/// idle longest instead of waiting behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_probe_listener_has_limits_of_its_own() {
    use tokio::net::TcpStream;
    let pki = TestPki::new();
    let mut args = pki.tls_args();
    args.extend(
        [
            "--probe-header-read-timeout=1s",
            "--probe-idle-timeout=2s",
            "--probe-max-connections=4",
        ]
        .map(String::from),
    );
    let server = ServerProcess::start(&args);
    let closed_within = |mut tcp: TcpStream, limit: Duration| async move {
        let mut sink = Vec::new();
        matches!(
            tokio::time::timeout(limit, tcp.read_to_end(&mut sink)).await,
            Ok(Ok(_)) | Ok(Err(_))
        )
    };

    // A 9 KB request head: 431, and the connection closes.
    let mut tcp = TcpStream::connect(server.probe).await.unwrap();
    let mut head = b"GET /healthz HTTP/1.1\r\nHost: probe\r\nX-Big: ".to_vec();
    head.resize(head.len() + 9000, b'a');
    head.extend_from_slice(b"\r\n\r\n");
    let _ = tcp.write_all(&head).await;
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), tcp.read_to_end(&mut answer)).await;
    assert!(
        answer.starts_with(b"HTTP/1.1 431"),
        "{}",
        String::from_utf8_lossy(&answer)
    );

    // Silent: closed after the header read timeout, not before.
    let started = Instant::now();
    let tcp = TcpStream::connect(server.probe).await.unwrap();
    assert!(closed_within(tcp, Duration::from_secs(10)).await);
    let silent_for = started.elapsed();
    assert!(silent_for >= Duration::from_millis(900), "{silent_for:?}");

    // Idle after a request: closed after the idle timeout, not before.
    let mut tcp = TcpStream::connect(server.probe).await.unwrap();
    tcp.write_all(b"GET /healthz HTTP/1.1\r\nHost: probe\r\n\r\n")
        .await
        .unwrap();
    let mut buf = vec![0u8; 1024];
    let n = tcp.read(&mut buf).await.unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"), "{:?}", &buf[..n]);
    let started = Instant::now();
    assert!(closed_within(tcp, Duration::from_secs(10)).await);
    let idle_for = started.elapsed();
    assert!(idle_for >= Duration::from_millis(1900), "{idle_for:?}");

    // At the cap (4 connections that say nothing), a probe is answered at once: the connection
    // idle longest makes room.
    let mut silent = Vec::new();
    for _ in 0..4 {
        silent.push(TcpStream::connect(server.probe).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    let (status, _) = server.probe_get("/healthz").await.unwrap();
    assert_eq!(status, StatusCode::OK);
    assert!(
        started.elapsed() < Duration::from_millis(900),
        "the probe waited {:?}",
        started.elapsed()
    );
    let oldest = silent.remove(0);
    assert!(closed_within(oldest, Duration::from_millis(500)).await);

    let (_, metrics) = server.probe_get("/metrics").await.unwrap();
    for reason in ["header_too_large", "no_request", "idle_timeout", "evicted"] {
        let series = format!("modelgate_probe_connections_dropped_total{{reason=\"{reason}\"}} ");
        let count: f64 = metrics
            .lines()
            .find_map(|l| l.strip_prefix(&series))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0);
        assert!(count >= 1.0, "{reason}: {metrics}");
    }
}
