//! Runs the pipeline on one reference review N times, for a profiler:
//! `valgrind --tool=callgrind target/release/examples/profile_pipeline llm-serving-pod 2000`
//! (instruction counts do not depend on the machine's load; see docs/benchmarks.md).
//! A name ending in `-compact` runs that review written without whitespace, as the API server
//! sends it (`llm-serving-pod-compact`).

use std::path::Path;

#[path = "support/compact_json.rs"]
mod compact_json;

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
    let body = compact_json::read_review(&dir, &name).expect("reference review");
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
