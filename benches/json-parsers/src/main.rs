//! `json-parsers <parser> <n>` decodes the LLM serving pod review n times with one parser (for
//! callgrind: run with n = 1 and n = 201, the difference ÷ 200 is one decode); `json-parsers time`
//! times every parser (median of 15 batches).
//!
//! What is decoded is what modelgate's request path decodes: the AdmissionReview envelope (uid,
//! kind, operation, ...) and the object into the views of `src/policy/view.rs` (included below, so
//! the code measured is the product's), every other field skipped.

use std::borrow::Cow;
use std::time::Instant;

use serde::Deserialize;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[allow(dead_code)]
#[path = "../../../crates/modelgate-core/src/policy/view.rs"]
mod view;

use view::{ContainerView, PodOf};

/// The views without init containers' raw text (serde_json's `RawValue` is serde_json's own).
type Pod<'a> = PodOf<'a, ContainerView<'a>>;

#[derive(Deserialize)]
#[allow(dead_code)]
struct Gvk<'a> {
    #[serde(borrow)]
    group: Cow<'a, str>,
    #[serde(borrow)]
    version: Cow<'a, str>,
    #[serde(borrow)]
    kind: Cow<'a, str>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)]
struct Request<'a, O> {
    #[serde(borrow)]
    uid: Cow<'a, str>,
    #[serde(borrow)]
    kind: Gvk<'a>,
    #[serde(borrow, default)]
    namespace: Option<Cow<'a, str>>,
    #[serde(borrow)]
    operation: Cow<'a, str>,
    #[serde(default)]
    dry_run: bool,
    object: Option<O>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)]
struct Review<'a, O> {
    #[serde(borrow)]
    api_version: Cow<'a, str>,
    #[serde(borrow)]
    kind: Cow<'a, str>,
    request: Request<'a, O>,
}

/// One decode of `body` with `parser`; returns a number that depends on the result, so that the
/// work cannot be optimised away.
fn decode(parser: &str, body: &[u8], scratch: &mut Vec<u8>) -> usize {
    fn summary(review: &Review<Pod>) -> usize {
        let spec = review.request.object.as_ref().and_then(|o| o.spec.as_ref());
        review.request.uid.len() + spec.map_or(0, |s| s.containers.as_ref().map_or(0, Vec::len))
    }
    match parser {
        // The request path as modelgate ran it before the views: the envelope with the object as
        // raw text, then the object decoded from that text.
        "serde_json-two-pass" => {
            let review: Review<&serde_json::value::RawValue> =
                serde_json::from_slice(body).unwrap();
            let raw = review.request.object.unwrap();
            let pod: view::PodView = serde_json::from_str(raw.get()).unwrap();
            review.request.uid.len() + pod.spec.map_or(0, |s| s.containers().len())
        }
        "serde_json" => summary(&serde_json::from_slice::<Review<Pod>>(body).unwrap()),
        "sonic-rs" => summary(&sonic_rs::from_slice::<Review<Pod>>(body).unwrap()),
        "simd-json" => {
            // simd-json parses in place: the body is copied into a buffer it may change.
            scratch.clear();
            scratch.extend_from_slice(body);
            summary(&simd_json::serde::from_slice::<Review<Pod>>(scratch).unwrap())
        }
        // Only checking that the body is well-formed JSON, nothing decoded.
        "serde_json-skip" => {
            serde_json::from_slice::<serde::de::IgnoredAny>(body).unwrap();
            1
        }
        "sonic-rs-skip" => {
            sonic_rs::from_slice::<serde::de::IgnoredAny>(body).unwrap();
            1
        }
        other => panic!("unknown parser {other}"),
    }
}

const PARSERS: [&str; 6] = [
    "serde_json-two-pass",
    "serde_json",
    "sonic-rs",
    "simd-json",
    "serde_json-skip",
    "sonic-rs-skip",
];

fn main() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../reviews");
    let body = std::fs::read(dir.join("llm-serving-pod.json")).expect("the reference review");
    let mut scratch = Vec::new();
    let mut args = std::env::args().skip(1);
    let what = args.next().unwrap_or_else(|| "time".into());
    if what != "time" {
        let n: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(1000);
        let total: usize = (0..n).map(|_| decode(&what, &body, &mut scratch)).sum();
        println!("{what}: {n} decodes ({total})");
        return;
    }
    // Every parser must read the same thing.
    let expected = decode("serde_json", &body, &mut scratch);
    for parser in PARSERS.iter().filter(|p| !p.ends_with("-skip")) {
        assert_eq!(decode(parser, &body, &mut scratch), expected, "{parser}");
    }
    println!("LLM serving pod review ({} bytes), ns per decode, median of 15 batches of 2000:", body.len());
    for parser in PARSERS {
        let mut batches: Vec<f64> = (0..15)
            .map(|_| {
                let start = Instant::now();
                for _ in 0..2000 {
                    std::hint::black_box(decode(parser, std::hint::black_box(&body), &mut scratch));
                }
                start.elapsed().as_nanos() as f64 / 2000.0
            })
            .collect();
        batches.sort_by(f64::total_cmp);
        println!("{parser:>20}: {:>8.0} ns (min {:.0})", batches[7], batches[0]);
    }
}
