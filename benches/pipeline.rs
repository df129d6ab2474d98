//! The pipeline from request bytes to response bytes, on the three reference reviews in
//! `benches/reviews/`, the LLM serving review written compact as the API server sends it, and
//! that pod as a Deployment's template. Targets: the LLM serving Pod's `/mutate` within 8 µs,
//! the 20-container Pod's within 25 µs. Run with `cargo bench --bench pipeline`; figures go to
//! docs/benchmarks.md ("Hot path").

#[path = "harnesses/support/deployment.rs"]
mod deployment;

use std::hint::black_box;
use std::path::Path;

use criterion::{Criterion, criterion_group, criterion_main};
use modelgate::admission::{self, Context, Webhook};
use modelgate::config::PolicyConfig;
use modelgate::policy::Caches;

use deployment::llm_deployment_review;

// The allocator the binary uses (src/main.rs).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn reviews() -> Vec<(&'static str, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/reviews");
    [
        "one-container-pod",
        "llm-serving-pod",
        "twenty-container-pod",
    ]
    .into_iter()
    .map(|n| {
        (
            n,
            std::fs::read(dir.join(format!("{n}.json"))).expect("reference review"),
        )
    })
    .chain(std::iter::once((
        "llm-serving-pod-compact",
        compact_llm_review(&dir),
    )))
    .collect()
}

/// The LLM serving review without the pretty-printing: how the API server sends it.
fn compact_llm_review(dir: &Path) -> Vec<u8> {
    let pretty = std::fs::read(dir.join("llm-serving-pod.json")).expect("reference review");
    let value: serde_json::Value = serde_json::from_slice(&pretty).expect("JSON");
    serde_json::to_vec(&value).expect("JSON")
}

fn pipeline(c: &mut Criterion) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/reviews");
    let (index, _) = modelgate::cache::load_files(&[dir.join("caches.json")]).expect("caches");
    let config = PolicyConfig::default();
    let ctx = Context {
        config: &config,
        caches: Caches::Ready(&index),
        namespaces: modelgate::namespaces::Namespaces::none(),
        now: None,
    };
    let mut group = c.benchmark_group("pipeline");
    for (name, body) in reviews() {
        let out = admission::review(Webhook::Mutate, &body, &ctx);
        assert_eq!(out.http_status, 200);
        assert!(
            out.summary.allowed && out.summary.patch_operations > 0,
            "{name}"
        );
        for webhook in [Webhook::Mutate, Webhook::Validate] {
            group.bench_function(format!("{}/{name}", webhook.as_str()), |b| {
                b.iter(|| admission::review(webhook, black_box(&body), &ctx).body)
            });
        }
    }
    // A Deployment of the same pod, next to the Pod's two calls: what `/validate` costs for it.
    let deployment = llm_deployment_review(&dir);
    let out = admission::review(Webhook::Validate, &deployment, &ctx);
    assert!(out.http_status == 200 && out.summary.allowed);
    group.bench_function("validate/llm-serving-deployment-compact", |b| {
        b.iter(|| admission::review(Webhook::Validate, black_box(&deployment), &ctx).body)
    });
    group.finish();
}

criterion_group!(benches, pipeline);
criterion_main!(benches);
