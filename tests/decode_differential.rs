//! Speed buys no behaviour change: the request path decodes only the fields the rules read
//! (`policy::view`, docs/policy.md §6), and this test holds it to the decode it replaced.
//!
//! The reference is the previous decode, kept here and only here: the object decoded as a typed
//! k8s-openapi `ObjectMeta` and `PodSpec` (or `JobSpec`), path-named errors through
//! `serde_path_to_error`, the init containers taken from the text as received. Its reading of the
//! object is written back as JSON and run through the same pipeline; the answer (decision, patch,
//! warnings, denial message) must be the one the pipeline gives for the object itself, byte for
//! byte. Where the typed decode refuses the object:
//!
//! - because a field a rule reads has the wrong type, the pipeline refuses it with the same
//!   message;
//! - because of a field no rule reads, the pipeline no longer type-checks it (the intended
//!   difference of docs/policy.md §6): the test asserts exactly that the refused field is not one the
//!   rules read.
//!
//! Over every object and review of the corpus (`.inputs/corpus`, resolved by `scripts/inputs.sh`),
//! `tests/fixtures` and `benches/reviews`, and over generated pods and Jobs (proptest) that mix
//! valid and invalid values, wrong types in read and unread fields, `null`s and unknown fields at
//! every level.

use std::path::{Path, PathBuf};

use modelgate::admission::{Context, Webhook};
use modelgate::cache::CacheIndex;
use modelgate::config::{IdSetting, PolicyConfig, PrepMode};
use modelgate::namespaces::Mode;
use modelgate_core::testing::typed_reference::{
    Typed, is_read_field, policy_on_both_readings, reference,
};
use modelgate_core::testing::{self, context, create_review};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};
use serde_json::{Value, json};

// ---------------------------------------------------------------------------------------------
// The comparison
// ---------------------------------------------------------------------------------------------

/// The whole answer (status and body), through the pipeline's test harness (which checks the
/// wire contract on every call).
fn answer(webhook: Webhook, review: &Value, ctx: &Context) -> Value {
    let a = testing::review(webhook, review, ctx);
    let mut body = a.body;
    body["http"] = a.http.into();
    body
}

/// The policy on both readings of the review's object agrees; returns whether both read it.
fn compare_policy(
    label: &str,
    review: &Value,
    cfg: &PolicyConfig,
    index: &CacheIndex,
) -> Result<bool, TestCaseError> {
    let Some((views, typed)) = policy_on_both_readings(review, cfg, index) else {
        return Ok(false);
    };
    prop_assert!(
        views == typed,
        "{}: the policy differs on the views' reading and the typed reading\nviews: {}\ntyped: {}",
        label,
        views,
        typed
    );
    Ok(true)
}

/// How the typed decode read one review.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Reading {
    NotDecoded,
    Read,
    RefusedReadField,
    RefusedUnreadField,
}

/// Holds the pipeline to the reference on one review, for both webhooks; says how the typed
/// decode read it.
fn compare(label: &str, review: &Value, ctx: &Context) -> Result<Reading, TestCaseError> {
    let typed = reference(review);
    let reading = match &typed {
        Typed::NotDecoded => Reading::NotDecoded,
        Typed::Read(_) => Reading::Read,
        Typed::Refused { field, .. } if is_read_field(field) => Reading::RefusedReadField,
        Typed::Refused { .. } => Reading::RefusedUnreadField,
    };
    for webhook in [Webhook::Mutate, Webhook::Validate] {
        let ours = answer(webhook, review, ctx);
        match &typed {
            Typed::NotDecoded => {}
            Typed::Read(read) => {
                let mut as_read = review.clone();
                as_read["request"]["object"] = read.clone();
                let theirs = answer(webhook, &as_read, ctx);
                prop_assert_eq!(&ours, &theirs, "{}: {:?}", label, webhook);
            }
            Typed::Refused { field, message } => {
                let response = &ours["response"];
                let ours_message = response["status"]["message"].as_str().unwrap_or("");
                let enforced = response["allowed"] == false;
                if is_read_field(field) {
                    // The same refusal, word for word (in enforce; warn and audit say it too).
                    let expected = format!(
                        "{field}: {message}. Fix the object so that it matches the Kubernetes API schema."
                    );
                    let said = ours_message == expected
                        || response["warnings"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .any(|w| {
                                w.as_str() == Some(&format!("would deny: {field}: {message}"))
                            })
                        || response["auditAnnotations"]["would-deny"].as_str() == Some(&expected)
                        || !enforced && ours_message.is_empty() && exempt_or_off(review, ctx);
                    prop_assert!(
                        said,
                        "{}: {:?}: the typed decode refused a read field ({}: {}), the pipeline said {}",
                        label,
                        webhook,
                        field,
                        message,
                        response
                    );
                } else {
                    // Not type-checked any more: whatever the pipeline says, it does not refuse
                    // that field.
                    prop_assert!(
                        !ours_message.contains(field.as_str()),
                        "{}: {:?}: refused the unread field {}: {}",
                        label,
                        webhook,
                        field,
                        ours_message
                    );
                }
            }
        }
    }
    Ok(reading)
}

/// The object is let through untouched for a reason that precedes decoding (an exempt namespace,
/// mode `off`, an operation that is not handled).
fn exempt_or_off(review: &Value, ctx: &Context) -> bool {
    let ns = review["request"]["namespace"].as_str().unwrap_or("");
    ctx.config.is_exempt(ns)
        || ctx.config.default_mode == Mode::Off
        || review["request"]["operation"] != "CREATE"
}

// ---------------------------------------------------------------------------------------------
// The corpus
// ---------------------------------------------------------------------------------------------

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The corpus, where `scripts/inputs.sh` resolves it: `$MODELGATE_INPUTS_DIR` (default
/// `.inputs`, relative to the repository)`/corpus`.
fn corpus() -> PathBuf {
    root()
        .join(std::env::var_os("MODELGATE_INPUTS_DIR").unwrap_or_else(|| ".inputs".into()))
        .join("corpus")
}

fn files_under(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<_> = entries.flatten().map(|e| e.path()).collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            files_under(&path, out);
        } else if path
            .extension()
            .is_some_and(|e| e == "json" || e == "yaml" || e == "yml" || e == "injected")
        {
            out.push(path);
        }
    }
}

/// Every review the corpus and the fixtures hold: objects wrapped as CREATEs, bare requests
/// given an envelope, reviews as they are.
fn corpus_reviews() -> Vec<(String, Value)> {
    let mut files = Vec::new();
    for dir in [
        corpus(),
        root().join("tests/fixtures"),
        root().join("benches/reviews"),
    ] {
        files_under(&dir, &mut files);
    }
    let mut out = Vec::new();
    for path in files {
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        let origin = path.display().to_string();
        let Ok(documents) = modelgate::documents::read_documents(&origin, &text) else {
            continue;
        };
        for (i, d) in documents.into_iter().enumerate() {
            let label = format!("{origin}#{i}");
            let v = d.value;
            let review = if v["kind"] == "AdmissionReview" {
                v
            } else if v.get("uid").is_some() && v.get("operation").is_some() {
                json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": v})
            } else if v.is_object() {
                create_review(&label, &v, "default")
            } else {
                continue;
            };
            out.push((label, review));
        }
    }
    out
}

fn configs() -> Vec<PolicyConfig> {
    vec![
        PolicyConfig {
            exempt_namespaces: vec!["kube-system".into()],
            ..PolicyConfig::default()
        },
        PolicyConfig {
            run_as_user: IdSetting::None,
            run_as_group: IdSetting::None,
            default_fsgroup: 0,
            exempt_namespaces: vec![],
            ..PolicyConfig::default()
        },
        PolicyConfig {
            model_cache_prep: PrepMode::Never,
            exempt_namespaces: vec![],
            default_mode: Mode::Warn,
            ..PolicyConfig::default()
        },
        PolicyConfig {
            exempt_namespaces: vec![],
            default_mode: Mode::Audit,
            ..PolicyConfig::default()
        },
    ]
}

fn caches() -> CacheIndex {
    let mut files = vec![root().join("benches/reviews/caches.json")];
    let kserve = corpus().join("kserve/localmodelcache_readme_objects.yaml");
    if kserve.is_file() {
        files.push(kserve);
        files.push(root().join("tests/fixtures/kserve/localmodelcache-status.yaml"));
    }
    files.push(root().join("tests/fixtures/caches.yaml"));
    modelgate::cache::load_files(&files)
        .expect("the test caches load")
        .0
}

#[test]
fn the_corpus_gets_the_answers_of_the_typed_decode() {
    let reviews = corpus_reviews();
    assert!(
        reviews.len() >= 20,
        "only {} reviews found: the fixtures and benches must be there",
        reviews.len()
    );
    let index = caches();
    let mut readings = std::collections::BTreeMap::new();
    let mut policy_compared = 0;
    for cfg in configs() {
        let ctx = context(&cfg, &index);
        for (label, review) in &reviews {
            let reading = compare(label, review, &ctx).unwrap_or_else(|e| panic!("{e}"));
            if compare_policy(label, review, &cfg, &index).unwrap_or_else(|e| panic!("{e}")) {
                policy_compared += 1;
            }
            *readings.entry(reading).or_insert(0) += 1;
        }
    }
    println!("corpus reviews under 4 configurations, by the typed decode's reading: {readings:?}");
    println!("{policy_compared} of them through the policy on both readings");
    assert!(readings.get(&Reading::Read).copied().unwrap_or(0) >= 100);
    assert!(policy_compared >= 100, "{policy_compared}");
}

// ---------------------------------------------------------------------------------------------
// Generated pods and Jobs
// ---------------------------------------------------------------------------------------------

/// A value where a rule reads an id: mostly valid, sometimes out of range, sometimes of the
/// wrong type (`"0"`, `1000.5`, `true`, `null`).
fn id_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        40 => prop_oneof![Just(json!(1000)), Just(json!(1)), Just(json!(2_147_483_647)), (2i64..70_000).prop_map(Value::from)],
        6 => prop_oneof![Just(json!(0)), Just(json!(-1)), Just(json!(2_147_483_648i64)), Just(Value::Null)],
        1 => prop_oneof![Just(json!("0")), Just(json!(1000.5)), Just(json!(true))],
    ]
}

fn bool_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        40 => any::<bool>().prop_map(Value::from),
        3 => Just(Value::Null),
        1 => prop_oneof![Just(json!("true")), Just(json!(1))],
    ]
}

/// A value in a field no rule reads: usually `valid` (of its schema's type), sometimes not.
fn unread(valid: Value) -> BoxedStrategy<Value> {
    prop_oneof![
        60 => Just(valid),
        1 => Just(json!("not the schema's type")),
        1 => Just(json!(42)),
        1 => Just(json!([[[[[[{"deep": []}]]]]]])),
    ]
    .boxed()
}

/// A field unknown to every schema here (newer Kubernetes): any JSON at all.
fn unknown_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(json!({"future": [1, "two", {"three": null}]})),
        Just(json!([[[[[[{"deep": []}]]]]]])),
        Just(json!("text")),
    ]
}

/// An object with some of `fields` (each present or not) and, sometimes, an unknown field.
fn object_of(fields: Vec<(&'static str, BoxedStrategy<Value>)>) -> BoxedStrategy<Value> {
    let n = fields.len();
    let (names, values): (Vec<_>, Vec<_>) = fields.into_iter().unzip();
    (
        proptest::collection::vec(any::<bool>(), n),
        values,
        proptest::option::of(unknown_value()),
    )
        .prop_map(move |(present, values, unknown)| {
            let mut m = serde_json::Map::new();
            for ((name, value), present) in names.iter().zip(values).zip(present) {
                if present {
                    m.insert(name.to_string(), value);
                }
            }
            if let Some(u) = unknown {
                m.insert("xFutureField".into(), u);
            }
            Value::Object(m)
        })
        .boxed()
}

fn security_context(pod: bool) -> BoxedStrategy<Value> {
    let mut fields = vec![
        ("runAsUser", id_value().boxed()),
        ("runAsGroup", id_value().boxed()),
        ("runAsNonRoot", bool_value().boxed()),
        ("capabilities", unread(json!({"drop": ["ALL"]}))),
    ];
    if pod {
        fields.push(("fsGroup", id_value().boxed()));
        fields.push(("seLinuxOptions", unread(json!({"level": "s0"}))));
    } else {
        fields.push(("privileged", bool_value().boxed()));
    }
    prop_oneof![1 => Just(Value::Null), 6 => object_of(fields)].boxed()
}

fn mount() -> BoxedStrategy<Value> {
    prop_oneof![
        8 => Just(json!({"name": "model-cache", "mountPath": "/models"})),
        8 => Just(json!({"name": "modelgate-model", "mountPath": "/mnt/models", "subPath": "models/c41ae4f29d692d55", "readOnly": true})),
        4 => Just(json!({"name": "modelgate-model", "mountPath": "/mnt/models", "subPath": "models/x", "readOnly": true})),
        4 => Just(json!({"name": "other", "mountPath": "/mnt/models", "readOnly": true})),
        4 => Just(json!({"name": "modelgate-model", "mountPath": "/mnt/models", "subPath": "models/c41ae4f29d692d55", "readOnly": true, "mountPropagation": "None"})),
        1 => Just(json!({"name": "data", "mountPath": 7})),
        1 => Just(json!({"name": "data", "mountPath": "/data", "subPathExpr": ["x"]})),
    ]
    .boxed()
}

fn container(prep: bool) -> BoxedStrategy<Value> {
    let name = if prep {
        Just(json!("model-cache-prep")).boxed()
    } else {
        prop_oneof![
            40 => prop_oneof![Just(json!("app")), Just(json!("sidecar")), Just(json!("model-cache-prep"))],
            2 => Just(Value::Null),
            1 => Just(json!(5)),
        ]
        .boxed()
    };
    object_of(vec![
        ("name", name),
        (
            "image",
            prop_oneof![40 => Just(json!("busybox")), 1 => Just(json!(5))].boxed(),
        ),
        ("securityContext", security_context(false)),
        (
            "volumeMounts",
            prop_oneof![
                40 => proptest::collection::vec(mount(), 0..3).prop_map(Value::Array),
                3 => Just(Value::Null),
                1 => Just(json!({"name": "x"})),
            ]
            .boxed(),
        ),
        ("ports", unread(json!([{"containerPort": 8080}]))),
        ("resources", unread(json!({"limits": {"cpu": "1"}}))),
    ])
}

/// The canonical prep container for the default configuration and a pod with runAsUser 1000 and
/// fsGroup 102, sometimes with a field smuggled in.
fn canonical_prep() -> BoxedStrategy<Value> {
    let canonical = json!({
        "name": "model-cache-prep",
        "image": "docker.io/curlimages/curl:8.18.0",
        "command": ["sh", "-c", "chown 0:102 /models && chmod g+rwX /models"],
        "volumeMounts": [{"name": "model-cache", "mountPath": "/models"}],
        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"cpu": "100m", "memory": "64Mi"}},
        "securityContext": {"runAsUser": 0, "runAsNonRoot": false, "allowPrivilegeEscalation": false,
            "readOnlyRootFilesystem": true, "capabilities": {"drop": ["ALL"], "add": ["CHOWN", "FOWNER"]},
            "seccompProfile": {"type": "RuntimeDefault"}},
        "imagePullPolicy": "IfNotPresent"
    });
    let mut smuggled = canonical.clone();
    smuggled["securityContext"]["futurePrivilege"] = json!(true);
    prop_oneof![Just(canonical), Just(smuggled)].boxed()
}

fn volume() -> BoxedStrategy<Value> {
    let source = prop_oneof![
        8 => Just(("persistentVolumeClaim", json!({"claimName": "cache"}))),
        1 => Just(("persistentVolumeClaim", json!({"claimName": 3}))),
        4 => Just(("emptyDir", json!({}))),
        4 => Just(("nfs", json!({"server": "s", "path": "/x"}))),
        4 => Just(("configMap", json!({"name": "c"}))),
        1 => Just(("projected", json!({"sources": "wrong type, unread"}))),
        1 => Just(("hostPath", json!({"path": 3}))),
        4 => Just(("cephfs", json!({"monitors": ["m"]}))),
    ];
    let name = prop_oneof![
        Just("model-cache"),
        Just("modelgate-model"),
        Just("data"),
        Just("other")
    ];
    (name, source)
        .prop_map(|(name, (kind, value))| {
            if name == "modelgate-model" {
                json!({"name": name, "persistentVolumeClaim": {"claimName": "llama3-8b-workers", "readOnly": true}})
            } else {
                json!({"name": name, kind: value})
            }
        })
        .boxed()
}

fn affinity() -> BoxedStrategy<Value> {
    let expr = prop_oneof![
        8 => Just(json!({"key": "kubernetes.io/os", "operator": "In", "values": ["windows"]})),
        8 => Just(json!({"key": "node-type", "operator": "In", "values": ["gpu"]})),
        8 => Just(json!({"key": "zone", "operator": "Exists"})),
        1 => Just(json!({"key": "zone", "operator": "In", "values": "a"})),
    ];
    prop_oneof![
        1 => Just(Value::Null),
        1 => Just(json!({"podAntiAffinity": {"x": 1}})),
        4 => proptest::collection::vec(proptest::collection::vec(expr, 0..3), 0..3).prop_map(|terms| {
            let terms: Vec<Value> = terms.into_iter().map(|t| json!({"matchExpressions": t})).collect();
            json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}})
        }),
    ]
    .boxed()
}

fn metadata() -> BoxedStrategy<Value> {
    let annotations = proptest::collection::vec(
        prop_oneof![
            Just((
                "modelgate.io/model-uri",
                json!("hf://meta-llama/Meta-Llama-3-8B")
            )),
            Just(("modelgate.io/model-uri", json!("hf://nobody/nothing"))),
            Just(("serving.kserve.io/nodegroup", json!("workers"))),
            Just(("modelgate.io/disable-model-cache", json!("true"))),
            Just(("modelgate.io/cache-volume", json!("data"))),
            Just(("modelgate.io/model-cache", json!("miss"))),
            Just(("kubernetes.io/config.mirror", json!("x"))),
            Just(("note", json!("five"))),
        ],
        0..4,
    )
    .prop_map(|pairs| {
        let m: serde_json::Map<String, Value> =
            pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        Value::Object(m)
    });
    object_of(vec![
        ("generateName", Just(json!("llama-")).boxed()),
        (
            "namespace",
            prop_oneof![Just(json!("team-a")), Just(json!("kube-system"))].boxed(),
        ),
        ("annotations", annotations.boxed()),
        (
            "labels",
            prop_oneof![
                20 => Just(json!({"app": "x"})),
                5 => Just(json!({"serving.kserve.io/inferenceservice": "x"})),
                1 => Just(json!(["not a map"])),
            ]
            .boxed(),
        ),
        ("creationTimestamp", unread(json!("2026-12-01T00:00:00Z"))),
        (
            "ownerReferences",
            unread(
                json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "r", "uid": "u"}]),
            ),
        ),
    ])
}

fn pod_spec() -> BoxedStrategy<Value> {
    let init = prop_oneof![
        2 => Just(Value::Null),
        3 => proptest::collection::vec(prop_oneof![container(false), canonical_prep()], 0..3).prop_map(Value::Array),
    ];
    object_of(vec![
        ("securityContext", security_context(true)),
        (
            "os",
            prop_oneof![10 => Just(json!({"name": "linux"})), 5 => Just(json!({"name": "windows"})), 1 => Just(json!({"name": 1}))].boxed(),
        ),
        (
            "nodeSelector",
            prop_oneof![
                10 => Just(json!({"kubernetes.io/os": "windows"})),
                10 => Just(json!({"node-type": "gpu"})),
                1 => Just(json!({"node-type": null})),
            ]
            .boxed(),
        ),
        ("affinity", affinity()),
        ("volumes", proptest::collection::vec(volume(), 0..3).prop_map(Value::Array).boxed()),
        ("initContainers", init.boxed()),
        ("containers", proptest::collection::vec(container(false), 0..3).prop_map(Value::Array).boxed()),
        ("ephemeralContainers", proptest::collection::vec(container(false), 0..2).prop_map(Value::Array).boxed()),
        ("dnsPolicy", unread(json!("ClusterFirst"))),
        ("tolerations", unread(json!([{"key": "gpu", "operator": "Exists"}]))),
    ])
}

fn review_case() -> impl Strategy<Value = (Value, usize)> {
    (
        any::<bool>(),
        metadata(),
        metadata(),
        pod_spec(),
        unread(json!({"phase": "Pending"})),
        0usize..4,
        prop_oneof![8 => Just(None), 1 => Just(Some("ephemeralcontainers"))],
    )
        .prop_map(|(job, meta, template_meta, spec, status, cfg, sub)| {
            let object = if job {
                json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": meta,
                       "spec": {"backoffLimit": 2, "template": {"metadata": template_meta, "spec": spec}},
                       "status": status})
            } else {
                json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": status})
            };
            let mut review = create_review("generated", &object, "default");
            if let Some(sub) = sub.filter(|_| !job) {
                review["request"]["operation"] = json!("UPDATE");
                review["request"]["subResource"] = json!(sub);
            }
            (review, cfg)
        })
}

#[test]
fn generated_pods_and_jobs_get_the_answers_of_the_typed_decode() {
    let index = caches();
    let configs = configs();
    let mut runner = proptest::test_runner::TestRunner::new(Config {
        cases: 2000,
        failure_persistence: None,
        rng_seed: RngSeed::Fixed(12),
        ..Config::default()
    });
    let readings = std::cell::RefCell::new(std::collections::BTreeMap::new());
    let policy_compared = std::cell::Cell::new(0);
    runner
        .run(&review_case(), |(review, cfg)| {
            let ctx = context(&configs[cfg], &index);
            let reading = compare("generated", &review, &ctx)?;
            if compare_policy("generated", &review, &configs[cfg], &index)? {
                policy_compared.set(policy_compared.get() + 1);
            }
            *readings.borrow_mut().entry(reading).or_insert(0) += 1;
            Ok(())
        })
        .unwrap();
    // Both sides of the difference were exercised.
    let readings = readings.into_inner();
    let policy_compared = policy_compared.get();
    println!(
        "generated reviews, by the typed decode's reading: {readings:?}; \
         {policy_compared} through the policy on both readings"
    );
    assert!(policy_compared >= 1000, "{policy_compared}");
    for reading in [
        Reading::Read,
        Reading::RefusedReadField,
        Reading::RefusedUnreadField,
    ] {
        let n = readings.get(&reading).copied().unwrap_or(0);
        assert!(
            n >= 100,
            "only {n} generated reviews {reading:?}: {readings:?}"
        );
    }
}
