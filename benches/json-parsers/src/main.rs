//! `json-parsers <parser> <n> [compact]` decodes the LLM serving pod review n times with one
//! parser (for callgrind: run with n = 1 and n = 201, the difference ÷ 200 is one decode);
//! `compact` decodes it written without whitespace, as the API server sends it.
//! `json-parsers time` times every parser on both forms (median of 15 batches).
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

// What the views' maps use from the rest of the crate.
#[allow(dead_code)]
#[path = "../../../crates/modelgate-core/src/keyed.rs"]
mod keyed;
// The review as the API server sends it, as the product's examples make it.
#[allow(dead_code)]
#[path = "../../harnesses/support/compact_json.rs"]
mod compact_json;
use compact_json::compact;

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
        // The product's path: the body's UTF-8 checked once, then serde_json over the text.
        "serde_json-utf8" => {
            let text = std::str::from_utf8(body).unwrap();
            summary(&serde_json::from_str::<Review<Pod>>(text).unwrap())
        }
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
        // The whole body as one `RawValue`: serde_json's `ignore_value` and a UTF-8 check of the
        // span (what a view skipping its unread fields as borrowed `RawValue`s would do).
        "serde_json-raw-skip" => serde_json::from_slice::<&serde_json::value::RawValue>(body)
            .unwrap()
            .get()
            .len(),
        // sonic-rs' lazy API, checked: the members of the review located and their values
        // skipped (a decoder over `to_object_iter` would start here).
        "sonic-rs-lazy-skip" => {
            let mut n = 0;
            for member in sonic_rs::to_object_iter(body) {
                let (key, value) = member.unwrap();
                n += key.len() + value.as_raw_str().len();
            }
            n
        }
        // sonic-rs' `get_many`: the envelope's fields and the object's text, located in one
        // pass (nothing decoded).
        "sonic-rs-get-many" => GET_MANY.with(|tree| {
            let found = sonic_rs::get_many(body, tree).unwrap();
            found.iter().flatten().map(|v| v.as_raw_str().len()).sum()
        }),
        // simd-json's tape (validated, strings unescaped in place): its floor before any view.
        "simd-json-tape" => {
            scratch.clear();
            scratch.extend_from_slice(body);
            simd_json::to_tape(scratch).unwrap().0.len()
        }
        other => panic!("unknown parser {other}"),
    }
}

const PARSERS: [&str; 11] = [
    "serde_json-two-pass",
    "serde_json",
    "serde_json-utf8",
    "sonic-rs",
    "simd-json",
    "serde_json-skip",
    "serde_json-raw-skip",
    "sonic-rs-skip",
    "sonic-rs-lazy-skip",
    "sonic-rs-get-many",
    "simd-json-tape",
];

thread_local! {
    static GET_MANY: sonic_rs::PointerTree = {
        let mut tree = sonic_rs::PointerTree::new();
        tree.add_path(["request", "uid"]);
        tree.add_path(["request", "kind", "kind"]);
        tree.add_path(["request", "operation"]);
        tree.add_path(["request", "namespace"]);
        tree.add_path(["request", "object"]);
        tree
    };
}

fn main() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../reviews");
    let pretty = std::fs::read(dir.join("llm-serving-pod.json")).expect("the reference review");
    let compact = compact(&pretty);
    let mut scratch = Vec::new();
    let mut args = std::env::args().skip(1);
    let what = args.next().unwrap_or_else(|| "time".into());
    if what == "acceptance" {
        acceptance();
        return;
    }
    if what != "time" {
        let n: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(1000);
        let body = match args.next().as_deref() {
            Some("compact") => &compact,
            _ => &pretty,
        };
        let total: usize = (0..n).map(|_| decode(&what, body, &mut scratch)).sum();
        println!("{what}: {n} decodes ({total})");
        return;
    }
    for body in [&pretty, &compact] {
        time(body, &mut scratch);
    }
}

fn time(body: &[u8], scratch: &mut Vec<u8>) {
    // Every parser must read the same thing.
    let expected = decode("serde_json", body, scratch);
    for parser in PARSERS
        .iter()
        .filter(|p| !p.ends_with("-skip") && !p.ends_with("-tape") && !p.ends_with("-many"))
    {
        assert_eq!(decode(parser, body, scratch), expected, "{parser}");
    }
    println!(
        "LLM serving pod review ({} bytes), ns per decode, median of 15 batches of 2000:",
        body.len()
    );
    for parser in PARSERS {
        let mut batches: Vec<f64> = (0..15)
            .map(|_| {
                let start = Instant::now();
                for _ in 0..2000 {
                    std::hint::black_box(decode(parser, std::hint::black_box(body), scratch));
                }
                start.elapsed().as_nanos() as f64 / 2000.0
            })
            .collect();
        batches.sort_by(f64::total_cmp);
        println!(
            "{parser:>20}: {:>8.0} ns (min {:.0})",
            batches[7], batches[0]
        );
    }
}

/// Which skipping parsers refuse what serde_json refuses in a value nobody reads (docs/policy.md §6: the
/// body must be well-formed JSON): `json-parsers acceptance`.
fn acceptance() {
    let cases: [(&str, &[u8]); 9] = [
        ("bad escape", br#"{"a":"\x","b":1}"#),
        ("bad \\u escape", br#"{"a":"\u12g4","b":1}"#),
        ("control character in a string", b"{\"a\":\"\x01\",\"b\":1}"),
        ("invalid UTF-8 in a string", b"{\"a\":\"\xff\",\"b\":1}"),
        ("truncated literal", br#"{"a":tru,"b":1}"#),
        ("leading zero", br#"{"a":01,"b":1}"#),
        ("fraction without digits", br#"{"a":1.,"b":1}"#),
        ("trailing comma", br#"{"a":[1,],"b":1}"#),
        ("missing colon", br#"{"a":{"x" 1},"b":1}"#),
    ];
    println!(
        "| malformed unread value | serde_json | sonic-rs lazy | sonic-rs get_many | simd-json tape |"
    );
    println!("|---|---|---|---|---|");
    let verdict = |ok: bool| if ok { "accepted" } else { "refused" };
    for (what, body) in cases {
        let serde = serde_json::from_slice::<serde::de::IgnoredAny>(body).is_ok()
            && std::str::from_utf8(body).is_ok();
        let lazy = sonic_rs::to_object_iter(body).all(|m| m.is_ok());
        let mut tree = sonic_rs::PointerTree::new();
        tree.add_path(["b"]);
        let many = sonic_rs::get_many(body, &tree).is_ok();
        let mut copy = body.to_vec();
        let tape = simd_json::to_tape(&mut copy).is_ok();
        println!(
            "| {what} | {} | {} | {} | {} |",
            verdict(serde),
            verdict(lazy),
            verdict(many),
            verdict(tape)
        );
    }
}
