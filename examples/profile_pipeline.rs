//! Runs the pipeline on one reference review N times, for a profiler:
//! `valgrind --tool=callgrind target/release/examples/profile_pipeline llm-serving-pod 2000`
//! (instruction counts do not depend on the machine's load; see docs/benchmarks.md).
//! A name ending in `-compact` runs that review written without whitespace, as the API server
//! sends it (`llm-serving-pod-compact`).

use std::path::Path;

// The allocator the binary uses (src/main.rs), so the profile is the server's.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use modelgate::admission::{self, Context, Webhook};
use modelgate::config::PolicyConfig;
use modelgate::policy::Caches;

fn main() {
    let mut args = std::env::args().skip(1);
    let name = args.next().unwrap_or_else(|| "llm-serving-pod".into());
    let n: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(1000);
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/reviews");
    let body = match name.strip_suffix("-compact") {
        Some(file) => compact(&std::fs::read(dir.join(format!("{file}.json"))).expect("review")),
        None => std::fs::read(dir.join(format!("{name}.json"))).expect("reference review"),
    };
    let (index, _) = modelgate::cache::load_files(&[dir.join("caches.json")]).expect("caches");
    let config = PolicyConfig::default();
    let ctx = Context {
        config: &config,
        caches: Caches::Ready(&index),
        namespaces: modelgate::namespaces::Namespaces::none(),
    };
    let mut bytes = 0;
    for _ in 0..n {
        bytes += admission::review(Webhook::Mutate, &body, &ctx).body.len();
    }
    println!("{n} reviews, {bytes} response bytes");
}

/// `json` without the whitespace between tokens, keys in their order (a `serde_json::Value` would
/// sort them): the bytes the API server sends for the same object.
fn compact(json: &[u8]) -> Vec<u8> {
    let (mut in_string, mut escaped) = (false, false);
    let mut out = Vec::with_capacity(json.len());
    for &b in json {
        if in_string {
            in_string = escaped || b != b'"';
            escaped = !escaped && b == b'\\';
        } else if b.is_ascii_whitespace() {
            continue;
        } else {
            in_string = b == b'"';
        }
        out.push(b);
    }
    out
}
