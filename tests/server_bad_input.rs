//! The bad-input table of docs/reliability.md, against the real `serve` binary over TLS: every case gets its
//! exact expected answer, and after every case a fresh connection proves the server still serves.
//! Also: a thousand concurrent h2 streams on one connection, slowloris clients that must not hold
//! a worker, and plaintext HTTP on the TLS port.

mod common;

use std::time::{Duration, Instant};

use base64::Engine;
use common::*;
use hyper::StatusCode;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The default `--max-body-bytes` (7 MiB), which this file does not override.
const LIMIT: usize = 7 * 1024 * 1024;

/// What a case must get back.
enum Expect {
    /// HTTP 400 with a Kubernetes `Status` body whose message starts with this.
    BadRequest(&'static str),
    /// HTTP 413 with a `Status` body whose message contains this.
    TooLarge(&'static str),
    /// HTTP 200, a review echoing the uid, not allowed, `status.code`, and the message contains
    /// every one of these strings.
    Denied(&'static str, u16, Vec<&'static str>),
    /// HTTP 200, allowed; when the review can be parsed here, the patch applies to the object
    /// and the result passes `/validate`.
    Allowed(&'static str),
}

struct Case {
    name: &'static str,
    body: Vec<u8>,
    expect: Expect,
}

fn review_of(uid: &str, object: Value) -> Value {
    let mut r = pod_review(uid);
    r["request"]["object"] = object;
    r
}

fn pod_object(spec: Value) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "worker-", "namespace": "team-a"},
        "spec": spec
    })
}

fn bytes(v: &Value) -> Vec<u8> {
    serde_json::to_vec(v).unwrap()
}

fn run_as_user(uid: &str, value: Value) -> Vec<u8> {
    bytes(&review_of(
        uid,
        pod_object(json!({"containers": [
            {"name": "main", "image": "busybox", "securityContext": {"runAsUser": value}}
        ]})),
    ))
}

fn cases() -> Vec<Case> {
    let mut cases = Vec::new();
    let mut add = |name, body, expect| cases.push(Case { name, body, expect });

    add(
        "empty body",
        Vec::new(),
        Expect::BadRequest(
            "request body is not JSON: EOF while parsing a value at line 1 column 0",
        ),
    );
    add(
        "not JSON",
        b"{not json".to_vec(),
        Expect::BadRequest("request body is not JSON: key must be a string at line 1 column 2"),
    );
    let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
    add(
        "JSON nested 10 000 levels deep (the whole body)",
        deep.clone().into_bytes(),
        Expect::BadRequest("request body is not an AdmissionReview: invalid type: sequence"),
    );
    // Inside a field no type here knows: skipped without recursion, and the pod is admitted.
    let mut unknown_deep = bytes(&pod_review("uid-deep-unknown"));
    let at = find(&unknown_deep, br#""containers":"#);
    unknown_deep.splice(at..at, format!(r#""x-future-field":{deep},"#).into_bytes());
    add(
        "JSON nested 10 000 levels deep (an unknown field of the spec)",
        unknown_deep,
        Expect::Allowed("uid-deep-unknown"),
    );
    // Inside a field no rule reads (managedFields[].fieldsV1, a free-form JSON value): docs/policy.md §6
    // no longer type-checks it, so it is skipped like an unknown field, without recursion, and
    // the pod is admitted.
    let mut free_deep = bytes(&pod_review("uid-deep-free"));
    let at = find(&free_deep, br#""namespace":"team-a"}"#);
    free_deep.splice(
        at..at,
        format!(r#""managedFields":[{{"fieldsV1":{deep}}}],"#).into_bytes(),
    );
    add(
        "JSON nested 10 000 levels deep (a free-form field)",
        free_deep,
        Expect::Allowed("uid-deep-free"),
    );
    add(
        "non-UTF-8 bytes in a string",
        {
            let mut b = bytes(&pod_review("uid-utf8"));
            let at = find(&b, b"busybox");
            b.splice(at..at, [0xff, 0xfe, 0xc3]);
            b
        },
        Expect::BadRequest("request body is not JSON: invalid unicode code point"),
    );
    add(
        "kind not AdmissionReview",
        {
            let mut r = pod_review("uid-kind");
            r["kind"] = json!("Pod");
            bytes(&r)
        },
        Expect::Denied("uid-kind", 400, vec!["kind `Pod` is not AdmissionReview"]),
    );
    add(
        "missing request",
        br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#.to_vec(),
        Expect::BadRequest("request is missing"),
    );
    add(
        "missing uid",
        {
            let mut r = pod_review("x");
            r["request"].as_object_mut().unwrap().remove("uid");
            bytes(&r)
        },
        Expect::BadRequest("request.uid is missing or not a string"),
    );
    add(
        "request.object of the wrong kind (a ConfigMap for a Pod)",
        bytes(&review_of(
            "uid-wrong-kind",
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"},
                   "data": {"k": "v"}}),
        )),
        Expect::Denied(
            "uid-wrong-kind",
            403,
            vec!["request.object.kind: the object is a ConfigMap, but the request is for a Pod"],
        ),
    );
    add(
        "request.object of the wrong kind (a Job for a Pod)",
        bytes(&review_of(
            "uid-job-as-pod",
            json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"},
                   "spec": {"template": {"spec": {"containers": [{"name": "m", "image": "i"}]}}}}),
        )),
        Expect::Denied(
            "uid-job-as-pod",
            403,
            vec!["request.object.kind: the object is a Job, but the request is for a Pod"],
        ),
    );
    add(
        "object null on CREATE",
        {
            let mut r = pod_review("uid-null");
            r["request"]["object"] = Value::Null;
            bytes(&r)
        },
        Expect::Denied(
            "uid-null",
            400,
            vec!["request.object is missing on CREATE of a Pod"],
        ),
    );
    add(
        "containers not a list",
        bytes(&review_of(
            "uid-containers-map",
            pod_object(json!({"containers": {"name": "main", "image": "busybox"}})),
        )),
        Expect::Denied(
            "uid-containers-map",
            403,
            vec![
                "spec.containers: cannot be decoded as a Pod: invalid type: map, expected a sequence",
            ],
        ),
    );
    add(
        "runAsUser as a string",
        run_as_user("uid-ras-string", json!("1000")),
        Expect::Denied(
            "uid-ras-string",
            403,
            vec![
                r#"spec.containers[0].securityContext.runAsUser: cannot be decoded as a Pod: invalid type: string "1000", expected i64"#,
            ],
        ),
    );
    add(
        "runAsUser as a float",
        run_as_user("uid-ras-float", json!(1000.5)),
        Expect::Denied(
            "uid-ras-float",
            403,
            vec![
                "spec.containers[0].securityContext.runAsUser: cannot be decoded as a Pod: invalid type: floating point `1000.5`, expected i64",
            ],
        ),
    );
    add(
        "runAsUser 2^63",
        run_as_user("uid-ras-2-63", json!(9_223_372_036_854_775_808u64)),
        Expect::Denied(
            "uid-ras-2-63",
            403,
            vec![
                "spec.containers[0].securityContext.runAsUser: cannot be decoded as a Pod: invalid value: integer `9223372036854775808`, expected i64",
            ],
        ),
    );
    add(
        "runAsUser 2^63-1 (an i64, out of range)",
        run_as_user("uid-ras-i64-max", json!(i64::MAX)),
        Expect::Denied(
            "uid-ras-i64-max",
            403,
            vec![
                "spec.containers[0].securityContext.runAsUser: 9223372036854775807 is outside 1..2147483647",
            ],
        ),
    );
    // Duplicate names are the API server's to refuse (after admission); modelgate must neither
    // choke nor build a patch that does not apply.
    add(
        "duplicate container names",
        bytes(&review_of(
            "uid-dup",
            pod_object(json!({"containers": [
                {"name": "main", "image": "busybox"},
                {"name": "main", "image": "busybox", "securityContext": {"runAsUser": 1234}}
            ]})),
        )),
        Expect::Allowed("uid-dup"),
    );
    let many: Vec<Value> = (0..10_000)
        .map(|i| json!({"name": format!("c{i}"), "image": "busybox"}))
        .collect();
    add(
        "10 000 containers",
        bytes(&review_of(
            "uid-many",
            pod_object(json!({"containers": many})),
        )),
        Expect::Allowed("uid-many"),
    );
    let mut big_annotation = pod_review("uid-big-annotation");
    big_annotation["request"]["object"]["metadata"]["annotations"] =
        json!({"example.com/blob": "a".repeat(1024 * 1024)});
    add(
        "an annotation value of 1 MiB",
        bytes(&big_annotation),
        Expect::Allowed("uid-big-annotation"),
    );
    // Exactly the limit is read; one byte more is refused before the pipeline sees it.
    let mut at_limit = bytes(&pod_review("uid-at-limit"));
    at_limit.resize(LIMIT, b' ');
    add(
        "a body of exactly the limit",
        at_limit,
        Expect::Allowed("uid-at-limit"),
    );
    let mut over = bytes(&pod_review("uid-over-limit"));
    over.resize(LIMIT + 1, b' ');
    add(
        "a body one byte over the limit",
        over,
        Expect::TooLarge("is larger than the limit of 7340032 bytes (--max-body-bytes)"),
    );
    // Last, so that the cases above keep the protocol they alternate on.
    add(
        "duplicate uid (the message says so, not that it is missing)",
        {
            let b = bytes(&pod_review("uid-first"));
            let at = find(&b, br#""uid":"uid-first""#);
            let mut b = b;
            b.splice(at..at, br#""uid":"uid-second","#.iter().copied());
            b
        },
        Expect::BadRequest("request.uid: duplicate field `uid`"),
    );
    cases
}

fn find(haystack: &[u8], needle: &[u8]) -> usize {
    haystack
        .windows(needle.len())
        .position(|w| w == needle)
        .unwrap_or_else(|| panic!("{} not found", String::from_utf8_lossy(needle)))
}

fn check(case: &Case, path: &str, a: &Answer) {
    let name = case.name;
    assert_eq!(a.content_type, "application/json", "{name}: {a:?}");
    match &case.expect {
        Expect::BadRequest(prefix) | Expect::TooLarge(prefix) => {
            let (status, code) = match case.expect {
                Expect::BadRequest(_) => (StatusCode::BAD_REQUEST, 400),
                _ => (StatusCode::PAYLOAD_TOO_LARGE, 413),
            };
            assert_eq!(a.status, status, "{name}: {a:?}");
            let v = a.json();
            assert_eq!(v["kind"], "Status", "{name}: {v}");
            assert_eq!(v["status"], "Failure", "{name}: {v}");
            assert_eq!(v["code"], code, "{name}: {v}");
            let message = v["message"].as_str().unwrap();
            if code == 400 {
                assert!(message.starts_with(prefix), "{name}: {message}");
            } else {
                assert!(message.contains(prefix), "{name}: {message}");
            }
        }
        Expect::Denied(uid, code, wants) => {
            assert_eq!(a.status, StatusCode::OK, "{name}: {a:?}");
            let v = a.json();
            assert_eq!(v["kind"], "AdmissionReview", "{name}: {v}");
            let r = &v["response"];
            assert_eq!(r["uid"], *uid, "{name}: {v}");
            assert_eq!(r["allowed"], false, "{name}: {v}");
            assert!(
                r.get("patch").is_none(),
                "{name}: a denial carries no patch: {v}"
            );
            assert_eq!(r["status"]["code"], *code, "{name}: {v}");
            let message = r["status"]["message"].as_str().unwrap();
            for want in wants {
                assert!(message.contains(want), "{name}: {message}");
            }
        }
        // These pods are as a user writes them, without runAsNonRoot: `/validate` alone holds
        // the invariant (docs/policy.md §6) and refuses them, naming the field, which shows the odd
        // input was read through; `/mutate` admits them with its patch.
        Expect::Allowed(uid) if path == "/validate" => {
            assert_eq!(a.status, StatusCode::OK, "{name}: {a:?}");
            let v = a.json();
            let r = &v["response"];
            assert_eq!(r["uid"], *uid, "{name}: {v}");
            assert_eq!(r["allowed"], false, "{name}: {v}");
            let message = r["status"]["message"].as_str().unwrap_or_default();
            assert!(
                message.starts_with("spec.containers[0].securityContext.runAsNonRoot: not set"),
                "{name}: {message}"
            );
        }
        Expect::Allowed(uid) => {
            assert_eq!(a.status, StatusCode::OK, "{name}: {a:?}");
            let v = a.json();
            let r = &v["response"];
            assert_eq!(r["uid"], *uid, "{name}: {v}");
            assert_eq!(r["allowed"], true, "{name}: {v}");
            if let Ok(review) = serde_json::from_slice::<Value>(&case.body) {
                check_answer(path, &review, a);
            } else if let Some(patch) = r["patch"].as_str() {
                // Too deep for serde_json::Value here: the patch must at least be well formed.
                let ops = base64::engine::general_purpose::STANDARD
                    .decode(patch)
                    .unwrap();
                let _: json_patch::Patch = serde_json::from_slice(&ops).unwrap();
            }
        }
    }
}

async fn still_serves(server: &ServerProcess, pki: &TestPki, proto: Proto, after: &str) {
    let config = client_config(pki.ca.cert_pem(), proto, None);
    let mut conn = connect(server.webhook, config, proto)
        .await
        .unwrap_or_else(|e| panic!("after {after}: {e}"));
    let review = pod_review("still-serving");
    let a = conn
        .post_json("/mutate", bytes(&review))
        .await
        .unwrap_or_else(|e| panic!("after {after}: {e}"));
    check_answer("/mutate", &review, &a);
    assert_eq!(a.json()["response"]["allowed"], true, "after {after}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_bad_input_gets_its_exact_answer_and_the_server_serves_on() {
    let pki = TestPki::new();
    let server = ServerProcess::start(&pki.tls_args());
    let cases = cases();
    for (i, case) in cases.iter().enumerate() {
        // Both protocols, both endpoints (alternating, to keep the file quick).
        let proto = if i % 2 == 0 { Proto::H1 } else { Proto::H2 };
        let paths: &[&str] = if case.body.len() > 1024 * 1024 {
            &["/mutate"]
        } else {
            &["/mutate", "/validate"]
        };
        for path in paths {
            let config = client_config(pki.ca.cert_pem(), proto, None);
            let mut conn = connect(server.webhook, config, proto).await.unwrap();
            let a = conn
                .post_json(path, case.body.clone())
                .await
                .unwrap_or_else(|e| panic!("{}: {e}", case.name));
            check(case, path, &a);
            if *path == "/validate" {
                let v = a.json();
                assert!(v["response"].get("patch").is_none(), "{}: {v}", case.name);
            }
            still_serves(&server, &pki, proto, case.name).await;
        }
    }
    // The process is still the one that started, and it logged no panic.
    assert!(server.logs().lines().all(|l| !l.contains("panicked")));
    let (status, _) = server.probe_get("/healthz").await.unwrap();
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_concurrent_h2_streams_on_one_connection_are_all_answered() {
    let pki = TestPki::new();
    let server = ServerProcess::start(&pki.tls_args());
    let config = client_config(pki.ca.cert_pem(), Proto::H2, None);
    let conn = connect(server.webhook, config, Proto::H2).await.unwrap();
    let sender = conn.h2_sender().unwrap();
    // One answer first: by then the client has the server's SETTINGS (--max-concurrent-streams)
    // and queues the rest; streams opened before it has them may be refused (REFUSED_STREAM,
    // which Go's client, the API server's, retries).
    let first = conn
        .request("POST", "/mutate")
        .header("content-type", "application/json")
        .body(full(bytes(&pod_review("first"))))
        .unwrap();
    let mut first_sender = sender.clone();
    first_sender.ready().await.unwrap();
    let answer = first_sender.send_request(first).await.unwrap();
    assert_eq!(answer.status(), StatusCode::OK);
    let mut tasks = Vec::new();
    for i in 0..1000 {
        let mut sender = sender.clone();
        let req = conn
            .request("POST", "/mutate")
            .header("content-type", "application/json")
            .body(full(bytes(&pod_review(&format!("stream-{i}")))))
            .unwrap();
        tasks.push(tokio::spawn(async move {
            sender.ready().await.map_err(|e| e.to_string())?;
            let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
            let status = resp.status();
            let body = http_body_util::BodyExt::collect(resp.into_body())
                .await
                .map_err(|e| e.to_string())?
                .to_bytes();
            Ok::<_, String>((i, status, body))
        }));
    }
    for task in tasks {
        let (i, status, body) = task.await.unwrap().unwrap();
        assert_eq!(status, StatusCode::OK, "stream {i}");
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["response"]["uid"], format!("stream-{i}"));
        assert_eq!(v["response"]["allowed"], true);
    }
    still_serves(&server, &pki, Proto::H2, "1000 streams").await;
    still_serves(&server, &pki, Proto::H1, "1000 streams").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowloris_clients_are_dropped_after_the_timeout_without_holding_a_worker() {
    let pki = TestPki::new();
    let mut args = pki.tls_args();
    args.push("--header-read-timeout=500ms".into());
    let server = ServerProcess::start(&args);
    let h1 = client_config(pki.ca.cert_pem(), Proto::H1, None);

    // Many stalled clients at once (more than the machine has cores, hence workers): each
    // completes the handshake, sends the start of its headers and stalls; a few trickle a byte
    // every 100 ms, which must not reset the timeout.
    let mut stalled = Vec::new();
    for i in 0..64 {
        let config = h1.clone();
        let addr = server.webhook;
        stalled.push(tokio::spawn(async move {
            let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
            let mut tls = tokio_rustls::TlsConnector::from(config)
                .connect("localhost".try_into().unwrap(), tcp)
                .await
                .unwrap();
            tls.write_all(b"POST /mutate HTTP/1.1\r\nHost: localhost\r\n")
                .await
                .unwrap();
            tls.flush().await.unwrap();
            let started = Instant::now();
            let mut buf = [0u8; 1024];
            loop {
                let read = if i % 8 == 0 {
                    // Trickle: one header byte every 100 ms until the server hangs up.
                    match tokio::time::timeout(Duration::from_millis(100), tls.read(&mut buf)).await
                    {
                        Ok(r) => Some(r),
                        Err(_) => {
                            if tls.write_all(b"X").await.is_err() || tls.flush().await.is_err() {
                                return started.elapsed();
                            }
                            None
                        }
                    }
                } else {
                    Some(tls.read(&mut buf).await)
                };
                match read {
                    Some(Ok(0)) | Some(Err(_)) => return started.elapsed(),
                    Some(Ok(_)) => {} // an error response or alert before the close
                    None => {}
                }
                assert!(
                    started.elapsed() < Duration::from_secs(20),
                    "client {i}: the connection was never dropped"
                );
            }
        }));
    }
    // While they stall, prompt clients are answered (the stalled ones hold no worker).
    tokio::time::sleep(Duration::from_millis(100)).await;
    for proto in [Proto::H1, Proto::H2] {
        still_serves(&server, &pki, proto, "64 stalled clients").await;
    }
    for task in stalled {
        let took = tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .expect("a stalled client was never dropped")
            .unwrap();
        // Dropped because of the timeout, not at once.
        assert!(
            took >= Duration::from_millis(300),
            "dropped early: {took:?}"
        );
    }
    still_serves(&server, &pki, Proto::H1, "slowloris").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plaintext_http_on_the_tls_port_is_refused() {
    let pki = TestPki::new();
    let server = ServerProcess::start(&pki.tls_args());
    let review = bytes(&pod_review("plaintext"));
    let mut tcp = tokio::net::TcpStream::connect(server.webhook)
        .await
        .unwrap();
    let head = format!(
        "POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        review.len()
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    tcp.write_all(&review).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), tcp.read_to_end(&mut answer))
        .await
        .expect("the plaintext connection was not closed")
        .ok();
    // No HTTP answer and no admission: at most a TLS alert record (content type 21), then EOF.
    assert!(
        !answer.starts_with(b"HTTP/"),
        "answered in plaintext: {}",
        String::from_utf8_lossy(&answer)
    );
    assert!(
        answer.is_empty() || answer[0] == 0x15,
        "not a TLS alert: {answer:?}"
    );
    let logs = wait_until(Duration::from_secs(5), || {
        let logs = server.logs();
        logs.contains("TLS handshake failed").then_some(logs)
    })
    .expect("the refused handshake is logged");
    assert!(!logs.contains(r#""uid":"plaintext""#), "{logs}");
    still_serves(&server, &pki, Proto::H1, "plaintext").await;
}
