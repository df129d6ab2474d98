//! What the fuzz targets check, in one place: the cargo-fuzz targets (`fuzz_targets/`) call these
//! on random inputs, and `tests/fuzz_regressions.rs` calls them on every kept corpus input and
//! every regression input in `cargo test`. A broken invariant panics with a message that says
//! which one.

use std::sync::LazyLock;

use base64::Engine as _;
use modelgate::admission::{self, Context, Webhook};
use modelgate::cache::{CacheEntry, CacheIndex, CacheScope, PvcPhase, PvcState};
use modelgate::config::PolicyConfig;
use modelgate::policy::Caches;
use serde_json::Value;

/// The YAML/JSON reader of `review` and `--caches`: no panic, and every document it returns is
/// an object (Lists are flattened into their items, which must be objects too).
pub fn check_read_documents(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data)
        && let Ok(documents) = modelgate::documents::read_documents("fuzz", text)
    {
        for d in documents {
            assert!(d.value.is_object(), "{}: not an object", d.origin);
        }
    }
}

/// The request-bytes-to-response entry point (`admission::review`, what `serve` runs for every
/// body), for both webhooks. Beyond "no panic": the answer is JSON; a `/validate` answer never
/// patches; a patch from `/mutate` applies to the object it was built from, and the patched
/// object passes `/validate`.
pub fn check_review(data: &[u8]) {
    let (status, mutated) = answer(Webhook::Mutate, data);
    let (_, validated) = answer(Webhook::Validate, data);
    assert!(
        validated["response"].get("patch").is_none(),
        "/validate patched"
    );
    if status != 200 || mutated["response"]["allowed"] != true {
        return;
    }
    let Some(patch) = mutated["response"]["patch"].as_str() else {
        return;
    };
    // Within serde_json's recursion limit only (the pipeline itself never builds a tree).
    let Ok(mut review) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(patch)
        .expect("base64 patch");
    let ops: json_patch::Patch = serde_json::from_slice(&bytes).expect("a JSON patch");
    let object = &mut review["request"]["object"];
    json_patch::patch(object, &ops.0).expect("the patch applies to the object it came from");
    let body = serde_json::to_vec(&review).unwrap();
    let (_, again) = answer(Webhook::Validate, &body);
    // The one documented exception (tests/properties.rs, "impostor-refused"): a user's own
    // `model-cache-prep` in a pod modelgate does not manage is left in place by /mutate and
    // refused by /validate.
    let message = again["response"]["status"]["message"]
        .as_str()
        .unwrap_or("");
    let impostor = message.contains("a container named model-cache-prep")
        && message
            .split("; ")
            .all(|v| v.contains("a container named model-cache-prep"));
    assert!(
        again["response"]["allowed"] == true || impostor,
        "the patched object does not validate: {again}"
    );
}

static INDEX: LazyLock<CacheIndex> = LazyLock::new(|| {
    let mut idx = CacheIndex::new();
    for (scope, name, uri) in [
        (CacheScope::Cluster, "llama", "hf://org/m"),
        (
            CacheScope::Namespace("team-a".into()),
            "mine",
            "hf://org/m/",
        ),
        (
            CacheScope::Namespace("team-b".into()),
            "theirs",
            "gs://b/model",
        ),
    ] {
        // Everything a hit needs: downloaded on n1, the PVCs in the usual namespaces.
        idx.upsert_cache(
            CacheEntry::new(scope, name, uri, &["workers", "gpu"]).downloaded_on(&["n1"]),
        );
        for ns in ["default", "team-a", "team-b", "t", "x"] {
            for group in ["workers", "gpu"] {
                let bound = PvcState::provisioned(PvcPhase::Bound);
                idx.upsert_pvc(ns, format!("{name}-{group}"), bound.clone());
            }
        }
    }
    let term = serde_json::from_str(
        r#"{"matchExpressions":[{"key":"node-type","operator":"In","values":["gpu"]}]}"#,
    )
    .unwrap();
    idx.upsert_node_group("workers", Some(vec![term]));
    idx.upsert_node_group("gpu", None);
    idx.upsert_node(
        "n1",
        [
            ("kubernetes.io/hostname".to_string(), "n1".to_string()),
            ("node-type".to_string(), "gpu".to_string()),
        ]
        .into(),
    );
    idx
});

static CONFIG: LazyLock<PolicyConfig> = LazyLock::new(|| PolicyConfig {
    exempt_namespaces: vec!["kube-system".into()],
    ..PolicyConfig::default()
});

fn answer(webhook: Webhook, body: &[u8]) -> (u16, Value) {
    let ctx = Context {
        config: &CONFIG,
        caches: Caches::Ready(&INDEX),
        namespaces: modelgate::namespaces::Namespaces::none(),
        now: None,
    };
    let out = admission::review(webhook, body, &ctx);
    let v: Value = serde_json::from_slice(&out.body).expect("the answer is JSON");
    (out.http_status, v)
}
