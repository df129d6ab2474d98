//! Runs the pipeline on one reference review N times, for a profiler and for the instruction
//! budget of the test command (scripts/instruction-budget.sh):
//! `valgrind --tool=callgrind target/release/examples/profile_pipeline llm-serving-pod 2000`
//! (instruction counts do not depend on the machine's load; see docs/benchmarks.md).
//!
//! `profile_pipeline [REVIEW] [N] [mutate|validate]`: REVIEW is a review of benches/reviews
//! (default `llm-serving-pod`); a name ending in `-compact` runs it written without whitespace,
//! as the API server sends it (`llm-serving-pod-compact`); `llm-serving-deployment-compact` is
//! that pod as the template of a Deployment, `llm-serving-raycluster-compact` as both templates
//! of a RayCluster. N defaults to 1000, the webhook to `mutate`.

use std::path::Path;

#[path = "support/compact_json.rs"]
mod compact_json;
#[path = "support/deployment.rs"]
mod deployment;

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
    let webhook = match args.next().as_deref() {
        None | Some("mutate") => Webhook::Mutate,
        Some("validate") => Webhook::Validate,
        Some(other) => {
            eprintln!("profile_pipeline: webhook `{other}` is neither mutate nor validate");
            std::process::exit(2);
        }
    };
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/reviews");
    let body = match name.as_str() {
        "llm-serving-deployment-compact" => deployment::llm_deployment_review(&dir),
        "llm-serving-raycluster-compact" => deployment::llm_raycluster_review(&dir),
        _ => compact_json::read_review(&dir, &name).expect("reference review"),
    };
    let (index, _) = modelgate::cache::load_files(&[dir.join("caches.json")]).expect("caches");
    let config = PolicyConfig::default();
    let ctx = Context {
        config: &config,
        caches: Caches::Ready(&index),
        namespaces: modelgate::namespaces::Namespaces::none(),
        now: None,
    };
    let mut bytes = 0;
    let mut allowed = 0;
    for _ in 0..n {
        let out = admission::review(webhook, &body, &ctx);
        bytes += out.body.len();
        allowed += usize::from(out.http_status == 200 && out.summary.allowed);
    }
    println!(
        "{n} {} reviews, {allowed} allowed, {bytes} response bytes",
        webhook.as_str()
    );
}
