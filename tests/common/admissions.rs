//! The API server as a client under attack: its admissions, one at a time on each of a few
//! kept-alive HTTP/1.1 connections (kube-apiserver speaks HTTP/1.1 to webhooks and pipelines
//! nothing), on a thread and runtime of their own so that an attack's tasks in the test process
//! cannot delay them, each answer compared with the one given before the attack.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hyper::StatusCode;
use serde_json::Value;

use super::{Proto, client_config, connect};

/// The review the client sends: an LLM serving pod.
pub fn llm_review() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/benches/reviews/llm-serving-pod.json"
    );
    serde_json::from_slice(&std::fs::read(path).expect("read the LLM pod review")).unwrap()
}

pub fn with_uid(review: &Value, uid: &str) -> Value {
    let mut r = review.clone();
    r["request"]["uid"] = uid.into();
    r
}

pub fn with_response_uid(answer: &Value, uid: &str) -> Value {
    let mut a = answer.clone();
    a["response"]["uid"] = uid.into();
    a
}

/// What the client saw: the latency of every admission, and each one that failed (an HTTP
/// status other than 200, a wrong answer, a broken connection, no answer in time).
#[derive(Debug, Default)]
pub struct ClientReport {
    pub latencies: Vec<Duration>,
    pub failures: Vec<String>,
}

impl ClientReport {
    pub fn p99(&self) -> Duration {
        let mut l = self.latencies.clone();
        l.sort();
        l.get((l.len() * 99).div_ceil(100).saturating_sub(1))
            .copied()
            .unwrap_or_default()
    }
}

/// The client, running until [`ApiServerClient::finish`].
pub struct ApiServerClient {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<ClientReport>,
}

impl ApiServerClient {
    /// Connects `conns` connections to `addr` (returning once all are up) and sends the LLM pod
    /// review to `/mutate` on each, again and again, with `?timeout=` the webhook's `timeout`:
    /// an answer not there by then is a failure, and that connection stops, as the API
    /// server's call would.
    pub fn start(
        addr: SocketAddr,
        ca: String,
        expected: Value,
        conns: usize,
        timeout: Duration,
    ) -> ApiServerClient {
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let stop_flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let review = llm_review();
                let path = format!("/mutate?timeout={}s", timeout.as_secs());
                let mut pool = Vec::new();
                for _ in 0..conns {
                    pool.push(
                        connect(addr, client_config(&ca, Proto::H1, None), Proto::H1)
                            .await
                            .expect("the API server's client connects"),
                    );
                }
                let counter = Arc::new(AtomicU64::new(0));
                let _ = ready_tx.send(());
                let mut workers = Vec::new();
                for mut conn in pool {
                    let (stop, counter) = (stop_flag.clone(), counter.clone());
                    let (review, expected, path) = (review.clone(), expected.clone(), path.clone());
                    workers.push(tokio::spawn(async move {
                        let mut report = ClientReport::default();
                        while !stop.load(Ordering::Relaxed) {
                            let uid = format!("api-{}", counter.fetch_add(1, Ordering::Relaxed));
                            let body = serde_json::to_vec(&with_uid(&review, &uid)).unwrap();
                            let started = Instant::now();
                            let result =
                                tokio::time::timeout(timeout, conn.post_json(&path, body)).await;
                            report.latencies.push(started.elapsed());
                            match result {
                                Ok(Ok(a)) if a.status == StatusCode::OK => {
                                    let got: Value =
                                        serde_json::from_slice(&a.body).unwrap_or_default();
                                    if got != with_response_uid(&expected, &uid) {
                                        report.failures.push(format!("{uid}: wrong answer {got}"));
                                    }
                                }
                                Ok(Ok(a)) => report.failures.push(format!(
                                    "{uid}: HTTP {}: {}",
                                    a.status,
                                    String::from_utf8_lossy(&a.body)
                                )),
                                Ok(Err(e)) => report.failures.push(format!("{uid}: {e}")),
                                Err(_) => {
                                    report
                                        .failures
                                        .push(format!("{uid}: no answer in {timeout:?}"));
                                    break;
                                }
                            }
                        }
                        report
                    }));
                }
                let mut all = ClientReport::default();
                for w in workers {
                    let r = w.await.expect("worker");
                    all.latencies.extend(r.latencies);
                    all.failures.extend(r.failures);
                }
                all
            })
        });
        ready_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the API server's client is connected");
        ApiServerClient { stop, thread }
    }

    /// Stops sending and returns what the client saw.
    pub fn finish(self) -> ClientReport {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("the API server's client thread")
    }

    /// Sends for `time`, then [`Self::finish`].
    pub fn run_for(self, time: Duration) -> ClientReport {
        std::thread::sleep(time);
        self.finish()
    }
}
