//! One admission of a hostile shape, built to a given size, through `/mutate` and `/validate`
//! (docs/policy.md §7: every admission costs time and memory linear in its body). The shapes are what
//! a tenant who may create a pod can send: a model URI of separators, a volume of many keys,
//! thousands of root containers, deep nesting in an unread field, and so on.
//!
//! `cost_probe SHAPE BYTES [pod|deployment]` builds the review (compact JSON, as the API server
//! sends it) and prints one JSON line: the body's size, each answer's size and whether it was
//! allowed, and how long each decision took on this thread. `cost_probe SHAPE BYTES KIND body`
//! prints the review itself instead, to send to a server. `tests/cost_bounds.rs` runs it under callgrind at two sizes and checks that the
//! instructions grow linearly; `docs/benchmarks.md` ("Hostile input") runs the release build
//! on 3 MiB bodies. `cost_probe list` prints the shapes.

use std::path::Path;
use std::time::Instant;

use serde_json::{Value, json};

// The allocator the binary uses (src/main.rs), so that the figures are the server's.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use modelgate::admission::{self, Context, Webhook};
use modelgate::config::PolicyConfig;
use modelgate::policy::Caches;

/// The cache URI of `benches/reviews/caches.json`, downloaded on its node group: a URI below
/// it matches, so the lookup and the hit's patch both run.
const CACHE_URI: &str = "hf://meta-llama/Meta-Llama-3-8B";

/// Inflates the reference pod to about the given number of bytes.
type Inflate = fn(&mut Value, usize);

/// The shapes, by name.
const SHAPES: &[(&str, Inflate)] = &[
    ("uri-slashes", |pod, n| {
        set_uri(pod, format!("{CACHE_URI}{}", "/".repeat(n)))
    }),
    ("uri-segments", |pod, n| {
        set_uri(pod, format!("{CACHE_URI}{}", "/a".repeat(n / 2)))
    }),
    ("uri-under-the-cap", |pod, n| {
        // A model URI just under the 2 048-byte cap in every container's env, many times: the
        // lookup itself is bounded, the body is not.
        set_uri(pod, format!("{CACHE_URI}{}", "/a".repeat(1000)));
        let env: Vec<Value> = (0..n / 2100)
            .map(|i| json!({"name": format!("U{i}"), "value": "/a".repeat(1000)}))
            .collect();
        pod["spec"]["containers"][0]["env"] = Value::Array(env);
    }),
    ("volume-keys", |pod, n| {
        let volumes = pod["spec"]["volumes"].as_array_mut().unwrap();
        let cache = volumes
            .iter_mut()
            .find(|v| v["name"] == "model-cache")
            .unwrap();
        for i in 0..n / 14 {
            cache[format!("k{i}")] = json!({});
        }
    }),
    ("root-containers", |pod, n| {
        let containers: Vec<Value> = (0..n / 70)
            .map(|i| json!({"name": format!("c{i}"), "image": "busybox", "securityContext": {"runAsUser": 0}}))
            .collect();
        pod["spec"]["containers"] = Value::Array(containers);
    }),
    ("nonroot-false-containers", |pod, n| {
        let containers: Vec<Value> = (0..n / 80)
            .map(|i| json!({"name": format!("c{i}"), "image": "busybox", "securityContext": {"runAsNonRoot": false}}))
            .collect();
        pod["spec"]["containers"] = Value::Array(containers);
    }),
    ("init-containers", |pod, n| {
        let init: Vec<Value> = (0..n / 60)
            .map(|i| json!({"name": format!("i{i}"), "image": "busybox", "command": ["true"]}))
            .collect();
        pod["spec"]["initContainers"] = Value::Array(init);
    }),
    ("container-mounts", |pod, n| {
        let mounts: Vec<Value> = (0..n / 60)
            .map(|i| json!({"name": "model-cache", "mountPath": format!("/m/{i}")}))
            .collect();
        pod["spec"]["containers"][0]["volumeMounts"] = Value::Array(mounts);
    }),
    ("volumes", |pod, n| {
        // In front of the cache volume, built in one pass: inserting at the front one by one
        // would make the probe itself quadratic.
        let volumes = pod["spec"]["volumes"].as_array_mut().unwrap();
        let mut inflated: Vec<Value> = (0..n / 40)
            .map(|i| json!({"name": format!("v{i}"), "emptyDir": {}}))
            .collect();
        inflated.append(volumes);
        *volumes = inflated;
    }),
    ("annotations", |pod, n| {
        let annotations = pod["metadata"]["annotations"].as_object_mut().unwrap();
        for i in 0..n / 20 {
            annotations.insert(format!("a/k{i}"), json!("v"));
        }
    }),
    ("affinity-terms", |pod, n| {
        let terms: Vec<Value> = (0..n / 90)
            .map(|i| json!({"matchExpressions": [{"key": format!("k{i}"), "operator": "Exists"}]}))
            .collect();
        pod["spec"]["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}});
    }),
    ("node-selector", |pod, n| {
        let selector: serde_json::Map<String, Value> =
            (0..n / 20).map(|i| (format!("k{i}"), json!("v"))).collect();
        pod["spec"]["nodeSelector"] = Value::Object(selector);
    }),
    ("deep-unread-field", |pod, _| {
        // Nesting in a field no rule reads: `main` puts `BYTES / 2` levels of arrays in place
        // of the marker (a `Value` this deep could not be written by serde_json).
        pod["spec"]["x-unread"] = json!(DEEP_MARKER);
    }),
    ("eks-skip-names", |pod, n| {
        // An identity webhook's skip annotation of many names: read once, the prep appended.
        let names: Vec<String> = (0..n / 7).map(|i| format!("c{i}")).collect();
        pod["metadata"]["annotations"]["eks.amazonaws.com/skip-containers"] =
            json!(names.join(","));
    }),
    ("eks-skip-rewritten", |pod, n| {
        // Names, then a line the webhook does not read: the value is rewritten as the names.
        let names: Vec<String> = (0..n / 7).map(|i| format!("c{i}")).collect();
        pod["metadata"]["annotations"]["eks.amazonaws.com/skip-containers"] =
            json!(format!("{}\n\"", names.join(",")));
    }),
    ("azure-skip-names", |pod, n| {
        let names: Vec<String> = (0..n / 7).map(|i| format!("c{i}")).collect();
        pod["metadata"]["annotations"]["azure.workload.identity/skip-containers"] =
            json!(names.join(";"));
    }),
    ("privileged-containers", |pod, n| {
        // Each warned of by `/validate`; at most twenty warnings are built.
        let containers: Vec<Value> = (0..n / 80)
            .map(|i| json!({"name": format!("c{i}"), "image": "busybox", "securityContext": {"privileged": true}}))
            .collect();
        pod["spec"]["containers"] = Value::Array(containers);
    }),
    ("exception-covered-containers", |pod, n| {
        // Root containers of a pod that the namespace's exceptions cover (`main` gives this
        // shape a namespace open for exceptions holding as many as `serve` keeps): each
        // container is looked up in every exception's names and images, and the waived ones
        // again by every rule that reads the waivers.
        pod["metadata"]["labels"]["app"] = json!("vendor");
        let containers: Vec<Value> = (0..n / 80)
            .map(|i| json!({"name": format!("c{i}"), "image": "busybox", "securityContext": {"runAsUser": 0}}))
            .collect();
        pod["spec"]["containers"] = Value::Array(containers);
    }),
    ("long-strings", |pod, n| {
        pod["metadata"]["generateName"] = json!("g".repeat(n / 3));
        pod["spec"]["containers"][0]["name"] = json!("c".repeat(n / 3));
        pod["spec"]["containers"][0]["image"] = json!("i".repeat(n / 3));
    }),
];

const DEEP_MARKER: &str = "cost-probe-deep-nesting";

/// The clock of the `exception-` shapes: within every exception's life.
const EXCEPTIONS_NOW: i64 = 1_790_000_000;

/// `team-a` opened for exceptions, holding as many as `serve` keeps in a namespace by default,
/// each covering the shape's pods: 64 container names (the most a spec may list) and an image
/// pattern.
fn open_with_exceptions(
    index: &mut modelgate::cache::CacheIndex,
    namespaces: &mut modelgate::namespaces::Namespaces,
) {
    let labels = std::collections::BTreeMap::from([(
        modelgate::exceptions::NAMESPACE_LABEL.to_string(),
        modelgate::exceptions::ALLOWED.to_string(),
    )]);
    namespaces.set(
        "team-a",
        modelgate::namespaces::NamespaceLabels::from_labels(&labels),
    );
    let names: Vec<String> = (0..64).map(|i| format!("c{}", i * 7)).collect();
    for i in 0..100 {
        let object = json!({
            "metadata": {"name": format!("vendor-{i}"), "namespace": "team-a",
                         "creationTimestamp": "2026-09-01T00:00:00Z"},
            "spec": {"reason": "vendor image", "expires": "2026-11-01T00:00:00Z",
                     "rules": ["non-root"], "selector": {"matchLabels": {"app": "vendor"}},
                     "containers": names, "images": ["busy*"]},
        });
        let exception = modelgate::exceptions::Exception::from_object(&object).expect("exception");
        index.upsert_exception(std::sync::Arc::new(exception));
    }
}

fn set_uri(pod: &mut Value, uri: String) {
    pod["metadata"]["annotations"]["modelgate.io/model-uri"] = Value::String(uri);
}

/// The reference LLM serving pod of the benchmarks, with a writable model cache volume.
fn reference_review(dir: &Path) -> Value {
    let text = std::fs::read(dir.join("llm-serving-pod.json")).expect("reference review");
    let mut review: Value = serde_json::from_slice(&text).expect("JSON");
    let pod = &mut review["request"]["object"];
    let volumes = pod["spec"]["volumes"].as_array_mut().expect("volumes");
    if !volumes.iter().any(|v| v["name"] == "model-cache") {
        volumes
            .push(json!({"name": "model-cache", "persistentVolumeClaim": {"claimName": "cache"}}));
    }
    review
}

/// The pod as the template of a Deployment (docs/policy.md §11).
fn as_deployment(review: &mut Value) {
    let request = &mut review["request"];
    let pod = request["object"].take();
    request["kind"] = json!({"group": "apps", "version": "v1", "kind": "Deployment"});
    request["resource"] = json!({"group": "apps", "version": "v1", "resource": "deployments"});
    request["object"] = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "llm", "namespace": "team-a"},
        "spec": {"selector": {"matchLabels": {"app": "llama3"}},
                 "template": {"metadata": pod["metadata"].clone(), "spec": pod["spec"].clone()}},
    });
}

fn main() {
    let mut args = std::env::args().skip(1);
    let shape = args.next().unwrap_or_else(|| "list".into());
    if shape == "list" {
        for (name, _) in SHAPES {
            println!("{name}");
        }
        return;
    }
    let bytes: usize = args
        .next()
        .and_then(|s| s.parse().ok())
        .expect("cost_probe SHAPE BYTES [pod|deployment]");
    let deployment = args.next().as_deref() == Some("deployment");
    let print_body = args.next().as_deref() == Some("body");
    let (_, inflate) = SHAPES
        .iter()
        .find(|(name, _)| *name == shape)
        .unwrap_or_else(|| panic!("no shape {shape} (cost_probe list)"));
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/reviews");
    let mut review = reference_review(&dir);
    inflate(&mut review["request"]["object"], bytes);
    if deployment {
        as_deployment(&mut review);
    }
    let mut body = serde_json::to_string(&review).expect("JSON");
    let marker = format!("\"{DEEP_MARKER}\"");
    if body.contains(&marker) {
        let depth = bytes / 2;
        body = body.replacen(
            &marker,
            &format!("{}{}", "[".repeat(depth), "]".repeat(depth)),
            1,
        );
    }
    if print_body {
        println!("{body}");
        return;
    }
    let (mut index, _) = modelgate::cache::load_files(&[dir.join("caches.json")]).expect("caches");
    let mut namespaces = modelgate::namespaces::Namespaces::default();
    let now = shape.starts_with("exception-").then(|| {
        open_with_exceptions(&mut index, &mut namespaces);
        EXCEPTIONS_NOW
    });
    let config = PolicyConfig::default();
    let ctx = Context {
        config: &config,
        caches: Caches::Ready(&index),
        namespaces: &namespaces,
        now,
    };
    // Each decision timed alone, on this one thread: the review's construction above is not
    // the server's cost.
    let started = Instant::now();
    let mutate = admission::review(Webhook::Mutate, body.as_bytes(), &ctx);
    let mutate_ms = started.elapsed().as_secs_f64() * 1e3;
    let started = Instant::now();
    let validate = admission::review(Webhook::Validate, body.as_bytes(), &ctx);
    let validate_ms = started.elapsed().as_secs_f64() * 1e3;
    println!(
        "{}",
        json!({
            "shape": shape,
            "body_bytes": body.len(),
            "mutate": {"status": mutate.http_status, "allowed": mutate.summary.allowed,
                       "answer_bytes": mutate.body.len(), "ms": mutate_ms},
            "validate": {"status": validate.http_status, "allowed": validate.summary.allowed,
                         "answer_bytes": validate.body.len(), "ms": validate_ms},
        })
    );
}
