//! What kube-apiserver's connection pool needs from the server (docs/policy.md §7): it does not retry a
//! POST that meets a closed connection, so the server never closes one under it. At the
//! connection cap a new connection waits instead of being accepted and closed; from SIGTERM on,
//! HTTP/1.1 answers carry `Connection: close` and HTTP/2 connections get a GOAWAY, while idle
//! connections stay usable through the grace period. The Go harness (`tests/apiserver`,
//! `cmd/transport`) runs the same cases with the API server's own client under load; these are
//! the direct, fast checks on the real binary.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use hyper::StatusCode;

/// At `--max-connections` a new connection is not accepted-then-closed (an EOF the API server
/// would not retry): it waits in the listen backlog and is served once a slot frees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_connection_cap_a_new_connection_waits_and_is_served() {
    let pki = TestPki::new();
    let mut args = pki.tls_args();
    args.push("--max-connections=2".into());
    let server = ServerProcess::start(&args);
    let review = pod_review("at-the-cap");
    let body = serde_json::to_vec(&review).unwrap();
    let config = client_config(pki.ca.cert_pem(), Proto::H1, None);

    let mut held = Vec::new();
    for _ in 0..2 {
        let mut conn = connect(server.webhook, config.clone(), Proto::H1)
            .await
            .unwrap();
        let answer = conn.post_json("/mutate", body.clone()).await.unwrap();
        check_answer("/mutate", &review, &answer);
        held.push(conn);
    }

    // The third connection's TLS handshake cannot finish while both slots are held.
    let third = tokio::spawn({
        let (addr, config, body) = (server.webhook, config.clone(), body.clone());
        async move {
            let mut conn = connect(addr, config, Proto::H1).await?;
            conn.post_json("/mutate", body).await
        }
    });
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(!third.is_finished(), "served or closed beyond the cap");
    let (_, metrics) = server.probe_get("/metrics").await.unwrap();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("modelgate_accept_paused_total ") && !l.ends_with(" 0")),
        "{metrics}"
    );

    // A slot frees: the waiting connection is accepted and answered.
    drop(held.pop());
    let answer = tokio::time::timeout(Duration::from_secs(10), third)
        .await
        .expect("served once a slot freed")
        .unwrap()
        .expect("no EOF, no reset");
    check_answer("/mutate", &review, &answer);
}

/// The default idle timeout outlives kube-apiserver's 90 s idle pool: checked on the flags the
/// binary actually parses, by its help text.
#[test]
fn the_default_idle_timeout_is_longer_than_the_api_servers_90_seconds() {
    let out = std::process::Command::new(bin())
        .args(["serve", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    let idle = help
        .split("--idle-timeout <")
        .nth(1)
        .and_then(|rest| rest.split("[default: ").nth(1))
        .and_then(|rest| rest.split(']').next())
        .expect("--idle-timeout has a default in --help");
    let seconds: u64 = idle
        .strip_suffix('s')
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("default {idle:?} is not in seconds"));
    assert!(seconds > 90, "--idle-timeout default {idle}");
}

/// A kept-alive HTTP/1.1 connection waiting for its next request is idle, not a slow client:
/// it outlives `--header-read-timeout` (hyper's header timer also runs while a connection
/// waits for its next request) and is served when the client comes back to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_http1_connection_outlives_the_header_read_timeout() {
    let pki = TestPki::new();
    let mut args = pki.tls_args();
    args.push("--header-read-timeout=1s".into());
    let server = ServerProcess::start(&args);
    let review = pod_review("kept-alive");
    let body = serde_json::to_vec(&review).unwrap();
    let config = client_config(pki.ca.cert_pem(), Proto::H1, None);
    let mut conn = connect(server.webhook, config, Proto::H1).await.unwrap();
    for _ in 0..2 {
        let answer = conn.post_json("/mutate", body.clone()).await.unwrap();
        check_answer("/mutate", &review, &answer);
        tokio::time::sleep(Duration::from_millis(2500)).await;
    }
    let answer = conn.post_json("/mutate", body).await.unwrap();
    check_answer("/mutate", &review, &answer);
}

/// From SIGTERM on, every HTTP/1.1 answer says `Connection: close` (the client moves to another
/// replica), an idle HTTP/1.1 connection is still served during the grace period (closing it
/// could meet a request the client is writing), and an HTTP/2 connection gets a GOAWAY.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_sigterm_answers_close_their_connection_and_idle_ones_stay_usable() {
    let pki = TestPki::new();
    let mut args = pki.tls_args();
    args.push("--shutdown-grace=4s".into());
    let mut server = ServerProcess::start(&args);
    let review = pod_review("draining");
    let body = serde_json::to_vec(&review).unwrap();
    let h1 = client_config(pki.ca.cert_pem(), Proto::H1, None);
    let h2 = client_config(pki.ca.cert_pem(), Proto::H2, None);

    let mut busy = connect(server.webhook, h1.clone(), Proto::H1)
        .await
        .unwrap();
    let mut idle = connect(server.webhook, h1.clone(), Proto::H1)
        .await
        .unwrap();
    for conn in [&mut busy, &mut idle] {
        let answer = conn.post_json("/mutate", body.clone()).await.unwrap();
        check_answer("/mutate", &review, &answer);
        assert!(!answer.connection_close, "kept alive while serving");
    }
    let multiplexed = connect(server.webhook, h2, Proto::H2).await.unwrap();
    let h2_sender = multiplexed.h2_sender().unwrap();

    server.signal("TERM");
    let mut draining = false;
    for _ in 0..250 {
        let (status, _) = server.probe_get("/readyz").await.unwrap();
        if status == StatusCode::SERVICE_UNAVAILABLE {
            draining = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(draining, "/readyz never turned 503");

    let answer = busy.post_json("/mutate", body.clone()).await.unwrap();
    check_answer("/mutate", &review, &answer);
    assert!(answer.connection_close, "answer during the grace period");

    // Idle through the signal, then used: still open, served, and closed by that answer.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let answer = idle.post_json("/mutate", body.clone()).await.unwrap();
    check_answer("/mutate", &review, &answer);
    assert!(answer.connection_close);

    // A new connection during the grace period is served too, and told to close.
    let mut late = connect(server.webhook, h1, Proto::H1).await.unwrap();
    let answer = late.post_json("/mutate", body).await.unwrap();
    check_answer("/mutate", &review, &answer);
    assert!(answer.connection_close);

    let mut goaway = false;
    for _ in 0..150 {
        if h2_sender.is_closed() {
            goaway = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(goaway, "the HTTP/2 connection got no GOAWAY");

    let status = server
        .wait_exit(Duration::from_secs(15))
        .expect("exited after the grace period");
    assert_eq!(status.code(), Some(0), "{}", server.logs());
}

/// HTTP/2 connections are capped apart (`--max-http2-connections`): beyond the cap a new
/// connection is offered HTTP/1.1 only, and served; a freed slot offers HTTP/2 again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beyond_the_http2_cap_new_connections_speak_http1() {
    let pki = TestPki::new();
    let mut args = pki.tls_args();
    args.push("--max-http2-connections=1".into());
    let server = ServerProcess::start(&args);
    let review = pod_review("h2-cap");
    let body = serde_json::to_vec(&review).unwrap();
    let either = {
        let mut c = (*client_config(pki.ca.cert_pem(), Proto::H2, None)).clone();
        c.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        std::sync::Arc::new(c)
    };

    let mut first = connect(server.webhook, either.clone(), Proto::H2)
        .await
        .unwrap();
    assert_eq!(first.alpn.as_deref(), Some(&b"h2"[..]));
    check_answer(
        "/mutate",
        &review,
        &first.post_json("/mutate", body.clone()).await.unwrap(),
    );

    let mut second = connect(server.webhook, either.clone(), Proto::H1)
        .await
        .unwrap();
    assert_eq!(second.alpn.as_deref(), Some(&b"http/1.1"[..]));
    check_answer(
        "/mutate",
        &review,
        &second.post_json("/mutate", body.clone()).await.unwrap(),
    );

    drop(first);
    let mut h2_again = None;
    for _ in 0..100 {
        let conn = connect(server.webhook, either.clone(), Proto::H1)
            .await
            .unwrap();
        if conn.alpn.as_deref() == Some(&b"h2"[..]) {
            h2_again = Some(());
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        h2_again.is_some(),
        "the freed HTTP/2 slot was never offered again"
    );
}

/// A client that offers no ALPN and speaks HTTP/2 with prior knowledge is told apart from an
/// HTTP/1.1 one by its first bytes: from SIGTERM on it gets a GOAWAY as an HTTP/2 connection
/// negotiated by ALPN does, while an HTTP/1.1 connection without ALPN is left open and told to
/// close by its next answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_alpn_an_http2_connection_gets_a_goaway_when_draining() {
    let pki = TestPki::new();
    let mut args = pki.tls_args();
    args.push("--shutdown-grace=4s".into());
    let mut server = ServerProcess::start(&args);
    let review = pod_review("no-alpn");
    let body = serde_json::to_vec(&review).unwrap();
    let without_alpn = |proto| {
        let mut config = (*client_config(pki.ca.cert_pem(), proto, None)).clone();
        config.alpn_protocols.clear();
        Arc::new(config)
    };

    let mut h2 = connect(server.webhook, without_alpn(Proto::H2), Proto::H2)
        .await
        .unwrap();
    let mut h1 = connect(server.webhook, without_alpn(Proto::H1), Proto::H1)
        .await
        .unwrap();
    assert_eq!((h2.alpn.clone(), h1.alpn.clone()), (None, None));
    let answer = h2.post_json("/mutate", body.clone()).await.unwrap();
    check_answer("/mutate", &review, &answer);
    assert_eq!(answer.version, hyper::Version::HTTP_2);
    let answer = h1.post_json("/mutate", body.clone()).await.unwrap();
    check_answer("/mutate", &review, &answer);
    assert_eq!(answer.version, hyper::Version::HTTP_11);
    let h2_sender = h2.h2_sender().unwrap();

    server.signal("TERM");
    let goaway = wait_until(Duration::from_secs(3), || {
        h2_sender.is_closed().then_some(())
    });
    assert!(
        goaway.is_some(),
        "the HTTP/2 connection without ALPN got no GOAWAY"
    );
    let answer = h1.post_json("/mutate", body).await.unwrap();
    check_answer("/mutate", &review, &answer);
    assert!(answer.connection_close, "answer during the grace period");

    let status = server
        .wait_exit(Duration::from_secs(15))
        .expect("exited after the grace period");
    assert_eq!(status.code(), Some(0), "{}", server.logs());
}
