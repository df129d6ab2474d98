//! The external corpus (`../shared/corpus`, see its README) through the real pipeline.
//!
//! Every YAML and JSON document of the corpus becomes AdmissionReview bytes (Kubernetes objects
//! are wrapped as a CREATE, bare Kubewarden AdmissionRequests get an envelope, AdmissionReviews
//! are sent as they are) and goes to `admission::review` for both webhooks. Each answer is checked
//! twice:
//!
//! - generically, against the wire contract and the invariants of docs/policy.md (uid echoed, answered
//!   in kind, base64 patch only with operations, never a patch from `/validate`, the patch
//!   applies, a second pass yields no patch, the patched object validates, `dryRun` and
//!   `v1beta1` change nothing but the envelope, a denial names the field);
//! - against the expected outcome written down below per file (or per document of the
//!   multi-document files), derived from docs/policy.md. The upstream policies' own verdicts are not
//!   the expectation.
//!
//! When the corpus is absent the tests say so and pass.

#[path = "common/cli.rs"]
mod cli;

use std::collections::BTreeMap;
use std::path::Path;

use cli::corpus_dir;
use modelgate::admission::{Context, Webhook};
use modelgate::cache::CacheIndex;
use modelgate::config::PolicyConfig;
use modelgate::documents::read_documents;
use modelgate::policy::Caches;
use modelgate_core::testing::{self, Answer, create_review};
use serde_json::{Value, json};

// ---------------------------------------------------------------------------------------------
// Harness
// ---------------------------------------------------------------------------------------------

/// The defaults of docs/policy.md §2, with the exempt namespaces the binary computes (kube-system and
/// the webhook's own namespace) written out so the test does not depend on `POD_NAMESPACE`.
fn config() -> PolicyConfig {
    PolicyConfig {
        exempt_namespaces: vec!["kube-system".into(), "modelgate".into()],
        ..PolicyConfig::default()
    }
}

/// KServe's README objects, then the same caches with the status KServe reports and the Nodes
/// and PVCs a hit needs (tests/fixtures/kserve/localmodelcache-status.yaml).
fn kserve_caches(corpus: &Path) -> CacheIndex {
    let (index, skipped) = modelgate::cache::load_files(&[
        corpus.join("kserve/localmodelcache_readme_objects.yaml"),
        fixture_path("kserve/localmodelcache-status.yaml"),
    ])
    .expect("the KServe README cache objects load");
    // Three LocalModelCache names (llama3-8b twice), one node group; the InferenceService at the
    // end of the file is not a cache object and is skipped, not refused.
    let c = index.counts();
    assert_eq!(
        (
            c.namespace_caches,
            c.cluster_caches,
            c.node_groups,
            c.nodes,
            c.pvcs
        ),
        (0, 3, 1, 3, 5)
    );
    assert_eq!(skipped.len(), 1, "{skipped:?}");
    index
}

fn fixture_path(rel: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(rel)
}

/// The pin to the nodes that have the model (gpu-node-1 in the status fixture).
fn pin() -> Value {
    json!({"key": "kubernetes.io/hostname", "operator": "In", "values": ["gpu-node-1"]})
}

/// One endpoint's answer, decoded from the bytes the API server would get.
fn call(webhook: Webhook, review: &Value, ctx: &Context) -> Answer {
    testing::review(webhook, review, ctx)
}

fn apply(object: &Value, ops: &[Value]) -> Value {
    testing::apply(object, ops).unwrap_or_else(|e| {
        panic!(
            "the patch does not apply: {e}\npatch: {}\nobject: {object}",
            Value::Array(ops.to_vec())
        )
    })
}

fn with_object(review: &Value, object: Value) -> Value {
    let mut r = review.clone();
    r["request"]["object"] = object;
    r
}

/// What both endpoints said about one review, after the generic checks.
struct Outcome {
    label: String,
    review: Value,
    mutate: Answer,
    validate: Answer,
    /// The object after the mutating patch (the object itself when there is none), for an
    /// allowed request that carries an object.
    patched: Option<Value>,
}

impl Outcome {
    fn object(&self) -> &Value {
        &self.review["request"]["object"]
    }
}

/// Runs both webhooks on `review` and checks everything docs/policy.md §7 requires of any answer.
fn examine(label: &str, review: Value, ctx: &Context) -> Outcome {
    let mutate = call(Webhook::Mutate, &review, ctx);
    let validate = call(Webhook::Validate, &review, ctx);
    assert_eq!(
        mutate.http, validate.http,
        "{label}: both endpoints read it alike"
    );
    assert!(validate.ops.is_none(), "{label}: /validate never patches");
    let mut out = Outcome {
        label: label.to_string(),
        review,
        mutate,
        validate,
        patched: None,
    };
    if out.mutate.http != 200 {
        return out;
    }
    let review = &out.review;

    // dryRun: same decision, no other difference (§7).
    let mut flipped = review.clone();
    let dry = review["request"]["dryRun"].as_bool().unwrap_or(false);
    flipped["request"]["dryRun"] = json!(!dry);
    for (webhook, answer) in [
        (Webhook::Mutate, &out.mutate),
        (Webhook::Validate, &out.validate),
    ] {
        let again = call(webhook, &flipped, ctx);
        assert_eq!(
            again.body, answer.body,
            "{label}: dryRun changes the answer"
        );
    }

    // v1beta1 is answered in kind with the same response.
    if review["apiVersion"] == "admission.k8s.io/v1" {
        let mut beta = review.clone();
        beta["apiVersion"] = json!("admission.k8s.io/v1beta1");
        for (webhook, answer) in [
            (Webhook::Mutate, &out.mutate),
            (Webhook::Validate, &out.validate),
        ] {
            let again = call(webhook, &beta, ctx);
            assert_eq!(again.body["apiVersion"], "admission.k8s.io/v1beta1");
            assert_eq!(
                again.body["response"], answer.body["response"],
                "{label}: v1beta1 gets another answer"
            );
        }
    }

    let object = review["request"]["object"].clone();
    let creates = review["request"]["operation"] == "CREATE";
    if out.mutate.allowed {
        if !object.is_null() {
            let patched = match &out.mutate.ops {
                Some(ops) => apply(&object, ops),
                None => object.clone(),
            };
            if creates {
                // Idempotency: what makes reinvocationPolicy IfNeeded safe (§1).
                let second = call(Webhook::Mutate, &with_object(review, patched.clone()), ctx);
                assert!(
                    second.allowed,
                    "{label}: second pass denied: {}",
                    second.message
                );
                assert_eq!(
                    second.ops, None,
                    "{label}: a second pass over the patched object must yield no patch"
                );
                // What the API server stores passes the validating webhook.
                let v = call(
                    Webhook::Validate,
                    &with_object(review, patched.clone()),
                    ctx,
                );
                assert!(
                    v.allowed,
                    "{label}: the patched object is refused by /validate: {}\npatched: {patched}",
                    v.message
                );
            }
            out.patched = Some(patched);
        }
    } else {
        // The mutating endpoint denies only what the validating one denies too (§3, §6).
        assert!(
            !out.validate.allowed,
            "{label}: /mutate denies ({}) but /validate allows",
            out.mutate.message
        );
        assert!(
            out.mutate.ops.is_none(),
            "{label}: a denial carries no patch"
        );
        assert!(
            out.mutate.message.contains("spec.") || out.mutate.message.contains("request."),
            "{label}: a denial names a field path: {}",
            out.mutate.message
        );
    }
    out
}

/// The pod spec of a Pod (`spec`) or of a Job's template (`spec.template.spec`).
fn pod_spec_prefix(object: &Value) -> &'static str {
    if object["kind"] == "Job" {
        "spec.template.spec"
    } else {
        "spec"
    }
}

/// docs/policy.md §6's invariant, restated on an object as received: the containers (every list) whose
/// effective `runAsNonRoot` (their own, else the pod's) is not `true`, as `<prefix>.<list>[i]`.
fn lacking_non_root(object: &Value, prefix: &str) -> Vec<String> {
    let spec = &object
        .pointer(&pointer_of(prefix))
        .cloned()
        .unwrap_or_default();
    let pod = spec["securityContext"]["runAsNonRoot"].as_bool();
    let mut out = Vec::new();
    for list in ["initContainers", "containers", "ephemeralContainers"] {
        for (i, c) in spec[list].as_array().into_iter().flatten().enumerate() {
            let own = c["securityContext"]["runAsNonRoot"].as_bool();
            if own.or(pod) != Some(true) {
                out.push(format!("{prefix}.{list}[{i}]"));
            }
        }
    }
    out
}

fn pointer_of(dotted: &str) -> String {
    // "spec.containers[1]" → "/spec/containers/1"
    let mut p = String::new();
    for part in dotted.split('.') {
        match part.split_once('[') {
            Some((key, idx)) => {
                p.push('/');
                p.push_str(key);
                p.push('/');
                p.push_str(idx.trim_end_matches(']'));
            }
            None => {
                p.push('/');
                p.push_str(part);
            }
        }
    }
    p
}

// ---------------------------------------------------------------------------------------------
// Expectations
// ---------------------------------------------------------------------------------------------

/// The expected outcome of one document, derived from docs/policy.md.
#[derive(Debug, Clone)]
enum Expect {
    /// §1 "any other kind": /mutate allows with no patch and exactly one warning; /validate
    /// allows. (The default for every document that is not a Pod, Job or admission request.)
    Other,
    /// Allowed by both endpoints, no patch, no warning: UPDATE/DELETE/status requests, exempt
    /// namespaces, and pods that already satisfy the policy.
    Untouched,
    /// §12 partial templates (InferenceService, LLMInferenceService): /mutate allows with no
    /// patch and no warning (never registered for them); /validate allows, warning of what a
    /// template says against the policy, naming its path.
    Partial,
    /// Denied by both endpoints (§6, and §3 "also by the mutating endpoint"). Each `both`
    /// fragment (`path: value`) is named by both messages, each `validate_also` fragment by the
    /// validating one.
    Denied {
        both: &'static [&'static str],
        validate_also: &'static [&'static str],
    },
    /// Allowed with a patch (§3). The patched object equals the original except that the pod
    /// securityContext becomes `sc` exactly, and the containers in `fixed` (paths relative to
    /// the pod spec) go from `runAsNonRoot: false` to `true`, each with a warning. /validate on
    /// the original denies exactly those containers' `runAsNonRoot: false` (or allows when
    /// `fixed` is empty).
    Mutated {
        sc: Value,
        fixed: &'static [&'static str],
    },
    /// Not an AdmissionReview the API server could have sent (no `request.uid`): HTTP 400 with
    /// a JSON error body that says what is missing (§7).
    Unanswerable,
}

fn mutated(sc: Value) -> Expect {
    Expect::Mutated { sc, fixed: &[] }
}

fn fixes(sc: Value, fixed: &'static [&'static str]) -> Expect {
    Expect::Mutated { sc, fixed }
}

fn denied(both: &'static [&'static str]) -> Expect {
    Expect::Denied {
        both,
        validate_also: &[],
    }
}

/// The default identity of §2/§3 on top of a pod securityContext: `runAsNonRoot: true`,
/// `runAsUser: 1000` and `runAsGroup: 1000` unless the given context already decides them.
fn sc(base: Value) -> Value {
    let mut m = base.as_object().cloned().unwrap_or_default();
    m.insert("runAsNonRoot".into(), json!(true));
    m.entry("runAsUser").or_insert(json!(1000));
    m.entry("runAsGroup").or_insert(json!(1000));
    Value::Object(m)
}

/// The default identity without the uid (every container sets its own runAsUser).
fn sc_no_uid(base: Value) -> Value {
    let mut v = sc(base);
    v.as_object_mut().unwrap().remove("runAsUser");
    v
}

fn seccomp() -> Value {
    json!({"seccompProfile": {"type": "RuntimeDefault"}})
}

/// (file relative to the corpus, document name or `*` for every document of the file, outcome)
fn expectations() -> Vec<(&'static str, &'static str, Expect)> {
    use Expect::*;
    let s = || sc(json!({}));
    let mut t: Vec<(&'static str, &'static str, Expect)> = Vec::new();

    // kyverno require-run-as-non-root-user: runAsUser 0 anywhere is denied, naming the field;
    // runAsUser 1 is valid and kept; a pod-level uid is only added when some container has none.
    let f = "kyverno/require-run-as-non-root-user/resource.yaml";
    t.extend([
        (
            f,
            "badpod01",
            denied(&["spec.securityContext.runAsUser: 0"]),
        ),
        (
            f,
            "badpod02",
            denied(&["spec.containers[0].securityContext.runAsUser: 0"]),
        ),
        (
            f,
            "badpod03",
            denied(&["spec.containers[1].securityContext.runAsUser: 0"]),
        ),
        (
            f,
            "badpod04",
            denied(&["spec.securityContext.runAsUser: 0"]),
        ),
        (
            f,
            "badpod05",
            denied(&["spec.initContainers[0].securityContext.runAsUser: 0"]),
        ),
        (
            f,
            "badpod06",
            denied(&["spec.initContainers[1].securityContext.runAsUser: 0"]),
        ),
        (f, "goodpod01", mutated(s())),
        (f, "goodpod02", mutated(sc(json!({"runAsUser": 1})))),
        (f, "goodpod03", mutated(sc_no_uid(json!({})))),
        (f, "goodpod04", mutated(s())),
        (f, "goodpod05", mutated(sc_no_uid(json!({})))),
        (f, "goodpod06", mutated(sc(json!({"runAsUser": 10})))),
        (f, "goodpod07", mutated(s())),
        (f, "goodpod08", mutated(s())),
        (f, "goodpod09", mutated(sc(json!({"runAsUser": 1})))),
        (f, "goodpod10", mutated(s())),
    ]);

    // kyverno require-run-as-nonroot: nobody sets a uid, so every pod gets the default identity;
    // a container's runAsNonRoot: false is switched to true with a warning, and /validate on the
    // original refuses it. A pod-level false is simply set to true (§3 first bullet).
    let f = "kyverno/require-run-as-nonroot/resource.yaml";
    t.extend([
        (f, "badpod01", mutated(s())),
        (f, "badpod02", fixes(s(), &["containers[0]"])),
        (f, "badpod03", mutated(s())),
        (f, "badpod04", fixes(s(), &["containers[0]"])),
        (f, "badpod05", mutated(s())),
        (f, "badpod06", fixes(s(), &["containers[1]"])),
        (f, "badpod07", mutated(s())),
        (f, "badpod08", fixes(s(), &["containers[1]"])),
        (f, "badpod09", fixes(s(), &["containers[1]"])),
        (f, "badpod10", fixes(s(), &["initContainers[0]"])),
        (f, "badpod11", mutated(s())),
        (f, "badpod12", fixes(s(), &["initContainers[0]"])),
        (f, "badpod13", mutated(s())),
        (f, "badpod14", fixes(s(), &["initContainers[1]"])),
        (f, "badpod15", mutated(s())),
        // A field that does not belong in a PodSecurityContext survives untouched.
        (
            f,
            "badpod16",
            mutated(sc(json!({"allowPrivilegeEscalation": false}))),
        ),
    ]);
    for name in [
        "goodpod01",
        "goodpod02",
        "goodpod03",
        "goodpod04",
        "goodpod05",
        "goodpod06",
        "goodpod07",
        "goodpod08",
        "goodpod09",
        "goodpod10",
    ] {
        t.push((f, name, mutated(s())));
    }

    // kyverno mutation policies: their inputs get our defaults; their outputs already satisfy
    // the policy except pod02, which kept a pod-level runAsNonRoot: false.
    let d = "kyverno/mutation/add-default-securitycontext/";
    let p = "kyverno/mutation/apply-pss-restricted-profile/";
    t.extend([
        (leak(d, "chainsaw-test_pod-resources.yaml"), "pod01", mutated(s())),
        (leak(d, "chainsaw-test_pod-resources.yaml"), "pod02", mutated(s())),
        (leak(d, "chainsaw-test_pod-resources-patched.yaml"), "pod01", Untouched),
        (
            leak(d, "chainsaw-test_pod-resources-patched.yaml"),
            "pod02",
            mutated(json!({"runAsNonRoot": true, "runAsUser": 1000, "runAsGroup": 3000, "fsGroup": 2000})),
        ),
        (leak(d, "kyverno-test_resource.yaml"), "*", mutated(s())),
        (leak(d, "kyverno-test_patchedResource.yaml"), "*", Untouched),
        (leak(p, "chainsaw-test_pods.yaml"), "pod01", mutated(s())),
        (leak(p, "chainsaw-test_pods.yaml"), "pod02", mutated(s())),
        (
            leak(p, "chainsaw-test_pods.yaml"),
            "pod03",
            mutated(json!({"runAsNonRoot": true, "runAsUser": 2000, "runAsGroup": 1000, "fsGroup": 3000})),
        ),
        (leak(p, "chainsaw-test_pods-patched.yaml"), "*", Untouched),
        (leak(p, "kyverno-test_resource.yaml"), "*", mutated(s())),
        (leak(p, "kyverno-test_mutatedmypod.yaml"), "*", Untouched),
    ]);

    // kyverno windows: chosen by nodeSelector only, without spec.os.name: docs/policy.md §1 makes them
    // Windows pods all the same, so they get runAsNonRoot only (no uid or gid, which the API
    // forbids there), and their windowsOptions survive; the good pod has it already.
    t.extend([
        (
            "kyverno/windows/pod-bad.yaml",
            "*",
            mutated(json!({
                "runAsNonRoot": true,
                "windowsOptions": {"hostProcess": true, "runAsUserName": "NT AUTHORITY\\Local service"}
            })),
        ),
        ("kyverno/windows/pod-good.yaml", "*", Untouched),
    ]);

    // Pod Security Admission restricted fixtures.
    let with_seccomp = || sc(seccomp());
    t.extend([
        ("psa/fail_runasnonroot0.yaml", "*", mutated(with_seccomp())),
        ("psa/fail_runasnonroot1.yaml", "*", mutated(with_seccomp())),
        (
            "psa/fail_runasnonroot2.yaml",
            "*",
            fixes(with_seccomp(), &["containers[0]"]),
        ),
        (
            "psa/fail_runasnonroot3.yaml",
            "*",
            fixes(with_seccomp(), &["initContainers[0]"]),
        ),
        (
            "psa/fail_runasuser0.yaml",
            "*",
            denied(&["spec.securityContext.runAsUser: 0"]),
        ),
        (
            "psa/fail_runasuser1.yaml",
            "*",
            denied(&["spec.containers[0].securityContext.runAsUser: 0"]),
        ),
        (
            "psa/fail_runasuser2.yaml",
            "*",
            denied(&["spec.initContainers[0].securityContext.runAsUser: 0"]),
        ),
        ("psa/pass_base.yaml", "*", mutated(with_seccomp())),
        ("psa/pass_base_linux.yaml", "*", mutated(with_seccomp())),
        // spec.os.name: windows gets runAsNonRoot only, which it already has.
        ("psa/pass_base_windows.yaml", "*", Untouched),
        ("psa/pass_runasnonroot0.yaml", "*", mutated(with_seccomp())),
        ("psa/pass_runasnonroot1.yaml", "*", mutated(with_seccomp())),
        // The pod's runAsUser 1000 is kept; only the gid is missing.
        ("psa/pass_runasuser0.yaml", "*", mutated(with_seccomp())),
    ]);

    // gatekeeper-library.
    t.extend([
        // fsGroup kept as given; no model cache volume (emptyDir named otherwise), so no prep.
        (
            "gatekeeper/fsgroup/example_allowed.yaml",
            "*",
            mutated(sc(json!({"fsGroup": 500}))),
        ),
        (
            "gatekeeper/fsgroup/example_disallowed.yaml",
            "*",
            mutated(sc(json!({"fsGroup": 2000}))),
        ),
        // gatekeeper's UPDATE fixtures have no request.uid (and no request.kind).
        ("gatekeeper/fsgroup/update.yaml", "*", Unanswerable),
        (
            "gatekeeper/validation/update_admissionreview.yaml",
            "*",
            Unanswerable,
        ),
        (
            "gatekeeper/mutation/example-nomutation.yaml",
            "*",
            Denied {
                both: &["spec.containers[0].securityContext.runAsUser: 0"],
                validate_also: &["spec.containers[0].securityContext.runAsNonRoot: false"],
            },
        ),
        ("gatekeeper/mutation/example.yaml", "*", mutated(s())),
        // Only ephemeral containers, with runAsUser 0: "any container" (§6).
        (
            "gatekeeper/validation/disallowed_ephemeral.yaml",
            "*",
            denied(&["spec.ephemeralContainers[0].securityContext.runAsUser: 0"]),
        ),
        // Pod runAsNonRoot true, the only container has uid and gid: nothing to do.
        ("gatekeeper/validation/example_allowed.yaml", "*", Untouched),
        (
            "gatekeeper/validation/example_disallowed.yaml",
            "*",
            denied(&["spec.containers[0].securityContext.runAsUser: 0"]),
        ),
    ]);

    // Captured AdmissionReviews and AdmissionRequests.
    let k = "admissionreview/kyverno/";
    for f in [
        "Test_BlockLabelRemove_0_update.json",
        "Test_denyFeatureIssue744_BlockDelete_0_delete.json",
        "Test_denyFeatureIssue744_BlockDelete_1_update_status.json",
        "Test_denyFeatureIssue744_BlockFields_0_update.json",
        "Test_denyFeatureIssue744_BlockUpdate_0_update_status.json",
        "Test_denyFeatureIssue744_DenyAll_0_update.json",
    ] {
        t.push((leak(k, f), "*", Untouched));
    }
    t.extend([
        // namespace kube-system: exempt by default (§1).
        (
            leak(k, "Test_denyFeatureIssue744_BlockFields_1_create.json"),
            "*",
            Untouched,
        ),
        (
            leak(k, "Test_denyFeatureIssue744_BlockUpdate_1_create.json"),
            "*",
            mutated(s()),
        ),
        // A Deployment: judged through its pods in corpus_controllers_are_judged_as_their_pods_will_be.
        // An empty pod securityContext `{}` is filled in.
        ("admissionreview/kube-rs/webhook_body_v1_pod_create_gke.json", "*", mutated(s())),
        // generateName only, namespace from the request; pod runAsNonRoot already true.
        (
            "admissionreview/kubewarden-misc/capabilities-psp-policy__panic.json",
            "*",
            mutated(s()),
        ),
        (
            "admissionreview/kubewarden-misc/env-variable-secrets-scanner-policy__pod_creation_with_secrets_init_and_ephemeral_containers.json",
            "*",
            mutated(s()),
        ),
        (
            "admissionreview/kubewarden-misc/pod-privileged-policy__privileged_ephemeral_container.json",
            "*",
            mutated(s()),
        ),
        (
            "admissionreview/kubewarden-misc/pod-runtime-class-policy__PodDeleteRequest.json",
            "*",
            Untouched,
        ),
    ]);

    // Istio: the plain Job gets the policy on spec.template; after injection, istio-init runs
    // as uid 0 with runAsNonRoot false and the Job is denied, naming the field.
    t.extend([
        ("istio/job.yaml", "*", mutated(s())),
        (
            "istio/job.yaml.injected",
            "*",
            Denied {
                both: &["spec.template.spec.initContainers[0].securityContext.runAsUser: 0"],
                validate_also: &[
                    "spec.template.spec.initContainers[0].securityContext.runAsNonRoot: false",
                ],
            },
        ),
    ]);

    // KServe: the storage-initializer Job (no securityContext; its volume is named `pvc`, not
    // the model cache, so no prep) gets the policy on spec.template. Everything else is Other.
    t.push((
        "kserve/samples/storage__pvc-init__job.yaml",
        "*",
        mutated(s()),
    ));
    t
}

fn leak(dir: &str, file: &str) -> &'static str {
    Box::leak(format!("{dir}{file}").into_boxed_str())
}

/// The documents of the corpus: (relative path, name, review to send).
fn corpus_reviews(corpus: &Path) -> Vec<(String, String, Value)> {
    let mut files = Vec::new();
    let mut stack = vec![corpus.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let name = path.file_name().unwrap().to_string_lossy().to_string();
            let is_doc = name.ends_with(".yaml")
                || name.ends_with(".json")
                || name.ends_with(".yaml.injected");
            if is_doc && name != "_manifest.json" {
                files.push(path);
            }
        }
    }
    files.sort();
    let mut out = Vec::new();
    for path in files {
        let rel = path
            .strip_prefix(corpus)
            .unwrap()
            .to_string_lossy()
            .to_string();
        let text = std::fs::read_to_string(&path).unwrap();
        let docs = read_documents(&rel, &text).unwrap_or_else(|e| panic!("{rel}: {e}"));
        assert!(!docs.is_empty(), "{rel}: no documents read");
        for (i, doc) in docs.into_iter().enumerate() {
            let v = doc.value;
            let uid = format!("corpus-{rel}-{i}");
            let (name, review) = if v["kind"] == "AdmissionReview" {
                let name = v["request"]["object"]["metadata"]["name"]
                    .as_str()
                    .unwrap_or("")
                    .to_string();
                (name, v)
            } else if v["kind"].is_object()
                && v.get("uid").is_some()
                && v.get("operation").is_some()
            {
                // A bare AdmissionRequest (Kubewarden's test format): add the envelope.
                let name = v["object"]["metadata"]["name"]
                    .as_str()
                    .unwrap_or("")
                    .to_string();
                let review = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": v});
                (name, review)
            } else {
                let name = v["metadata"]["name"].as_str().unwrap_or("").to_string();
                (name, create_review(&uid, &v, "default"))
            };
            out.push((rel.clone(), name, review));
        }
    }
    out
}

fn check_expectation(o: &Outcome, expect: &Expect) {
    let label = &o.label;
    let (m, v) = (&o.mutate, &o.validate);
    match expect {
        Expect::Unanswerable => {
            assert_eq!(m.http, 400, "{label}: expected HTTP 400, got {}", m.body);
            assert_eq!(m.body["kind"], "Status", "{label}: a JSON error body");
            assert!(m.message.contains("uid"), "{label}: {}", m.message);
            return;
        }
        _ => assert_eq!(m.http, 200, "{label}: {}", m.body),
    }
    match expect {
        Expect::Unanswerable => unreachable!(),
        Expect::Other => {
            assert!(m.allowed && v.allowed, "{label}: other kinds are allowed");
            assert_eq!(m.ops, None, "{label}: other kinds are not patched");
            assert_eq!(
                m.warnings.len(),
                1,
                "{label}: one warning: {:?}",
                m.warnings
            );
            let kind = o.object()["kind"].as_str().unwrap_or("");
            assert!(
                m.warnings[0].contains(kind),
                "{label}: the warning names the kind {kind}: {}",
                m.warnings[0]
            );
        }
        Expect::Partial => {
            assert!(
                m.allowed && v.allowed,
                "{label}: partial templates are never denied"
            );
            assert_eq!((&m.ops, &v.ops), (&None, &None), "{label}: never patched");
            assert_eq!(m.warnings, Vec::<String>::new(), "{label}");
            for w in &v.warnings {
                assert!(w.contains("(a partial template"), "{label}: {w}");
                assert!(w.starts_with("spec."), "{label}: the path is named: {w}");
            }
        }
        Expect::Untouched => {
            assert!(m.allowed, "{label}: /mutate denied: {}", m.message);
            assert!(v.allowed, "{label}: /validate denied: {}", v.message);
            assert_eq!(m.ops, None, "{label}: expected no patch");
            assert_eq!(m.warnings, Vec::<String>::new(), "{label}");
        }
        Expect::Denied {
            both,
            validate_also,
        } => {
            assert!(!m.allowed, "{label}: /mutate should deny");
            assert!(!v.allowed, "{label}: /validate should deny");
            for frag in *both {
                assert!(
                    m.message.contains(frag),
                    "{label}: /mutate message lacks `{frag}`: {}",
                    m.message
                );
                assert!(
                    v.message.contains(frag),
                    "{label}: /validate message lacks `{frag}`: {}",
                    v.message
                );
            }
            for frag in *validate_also {
                assert!(
                    v.message.contains(frag),
                    "{label}: /validate message lacks `{frag}`: {}",
                    v.message
                );
            }
            // "…and says what to do" (§6).
            assert!(
                m.message.contains("1..2147483647"),
                "{label}: {}",
                m.message
            );
        }
        Expect::Mutated { sc, fixed } => {
            assert!(m.allowed, "{label}: /mutate denied: {}", m.message);
            assert!(m.ops.is_some(), "{label}: expected a patch");
            let original = o.object();
            let prefix = pod_spec_prefix(original);
            let mut expected = original.clone();
            *expected
                .pointer_mut(&pointer_of(prefix))
                .unwrap()
                .as_object_mut()
                .unwrap()
                .entry("securityContext")
                .or_insert(json!(null)) = sc.clone();
            for c in *fixed {
                let p = format!(
                    "{}{}/securityContext/runAsNonRoot",
                    pointer_of(prefix),
                    pointer_of(c)
                );
                assert_eq!(
                    original.pointer(&p),
                    Some(&json!(false)),
                    "{label}: table error at {c}"
                );
                *expected.pointer_mut(&p).unwrap() = json!(true);
            }
            let patched = o.patched.as_ref().unwrap();
            assert_eq!(
                patched, &expected,
                "{label}: the patch changes more or less than the policy owns.\npatch: {:?}",
                m.ops
            );
            assert_eq!(
                m.warnings.len(),
                fixed.len(),
                "{label}: one warning per runAsNonRoot false changed: {:?}",
                m.warnings
            );
            for (w, c) in m.warnings.iter().zip(fixed.iter()) {
                let name = original
                    .pointer(&format!("{}{}/name", pointer_of(prefix), pointer_of(c)))
                    .and_then(Value::as_str)
                    .unwrap();
                assert!(
                    w.contains(name) && w.contains("runAsNonRoot"),
                    "{label}: {w}"
                );
            }
            // /validate on the original holds §6's invariant alone: it refuses exactly the
            // containers without an effective runAsNonRoot: true, those that say false among them.
            let lacking = lacking_non_root(original, prefix);
            if lacking.is_empty() {
                assert!(
                    v.allowed,
                    "{label}: /validate on the original: {}",
                    v.message
                );
            } else {
                assert!(
                    !v.allowed,
                    "{label}: /validate must refuse {lacking:?} without runAsNonRoot: true"
                );
                for c in lacking.iter().take(20) {
                    let frag = format!("{c}.securityContext.runAsNonRoot: ");
                    assert!(
                        v.message.contains(&frag),
                        "{label}: lacks `{frag}`: {}",
                        v.message
                    );
                }
                for c in *fixed {
                    let frag = format!("{prefix}.{c}.securityContext.runAsNonRoot: false");
                    assert!(
                        v.message.contains(&frag),
                        "{label}: lacks `{frag}`: {}",
                        v.message
                    );
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The whole corpus
// ---------------------------------------------------------------------------------------------

#[test]
fn every_corpus_document_gets_the_outcome_spec_md_predicts() {
    let Some(corpus) = corpus_dir() else { return };
    let cfg = config();
    let index = CacheIndex::new();
    let ctx = testing::context(&cfg, &index);
    let table = expectations();
    let mut used = vec![false; table.len()];
    let mut per_file: BTreeMap<String, usize> = BTreeMap::new();
    let mut by_outcome: BTreeMap<&str, usize> = BTreeMap::new();
    let mut failures = Vec::new();

    for (rel, name, review) in corpus_reviews(&corpus) {
        let request_kind = review["request"]["kind"]["kind"].as_str().unwrap_or("");
        if is_partial(&review) {
            let o = examine(&format!("{rel} {name}"), review.clone(), &ctx);
            check_expectation(&o, &Expect::Partial);
            *by_outcome.entry("partial").or_default() += 1;
            *per_file.entry(rel.clone()).or_default() += 1;
            continue;
        }
        if is_controller(&review) {
            // Judged through their pods: corpus_controllers_are_judged_as_their_pods_will_be.
            *by_outcome.entry("controller").or_default() += 1;
            *per_file.entry(rel.clone()).or_default() += 1;
            continue;
        }
        let workload = matches!(request_kind, "Pod" | "Job")
            || review["kind"] == "AdmissionReview" && review["request"]["kind"].is_null();
        *per_file.entry(rel.clone()).or_default() += 1;
        let found = table
            .iter()
            .position(|(f, n, _)| *f == rel && *n == name)
            .or_else(|| table.iter().position(|(f, n, _)| *f == rel && *n == "*"));
        let expect = match found {
            Some(i) => {
                used[i] = true;
                table[i].2.clone()
            }
            None if !workload => Expect::Other,
            None => {
                failures.push(format!(
                    "{rel} {name}: no expectation written for this workload"
                ));
                continue;
            }
        };
        let label = format!("{rel} {name}");
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let o = examine(&label, review.clone(), &ctx);
            check_expectation(&o, &expect);
        }));
        if let Err(e) = outcome {
            let msg = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            failures.push(msg);
        }
        let key = match expect {
            Expect::Other => "other",
            Expect::Untouched => "untouched",
            Expect::Partial => "partial",
            Expect::Denied { .. } => "denied",
            Expect::Mutated { .. } => "mutated",
            Expect::Unanswerable => "unanswerable",
        };
        *by_outcome.entry(key).or_default() += 1;
    }
    for (i, (f, n, _)) in table.iter().enumerate() {
        if !used[i] {
            failures.push(format!("{f} {n}: expectation matches no corpus document"));
        }
    }
    // The reader must not drop documents: the README counts them.
    assert_eq!(per_file["kyverno/require-run-as-nonroot/resource.yaml"], 76);
    assert_eq!(
        per_file["kyverno/require-run-as-non-root-user/resource.yaml"],
        48
    );
    // Comment-only documents (a commented-out Secret) are not documents.
    assert_eq!(
        per_file["kserve/samples/storage__oci-fetch__inference_service.yaml"],
        1
    );
    assert_eq!(per_file["istio/job.yaml.injected"], 1);
    println!("corpus outcomes: {by_outcome:?}");
    assert!(
        failures.is_empty(),
        "{} corpus documents disagree with docs/policy.md:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

/// The row of the workload-kind table a review is for (docs/policy.md §11, §12).
fn table_row(review: &Value) -> Option<modelgate::kinds::KindEntry> {
    let kind = &review["request"]["kind"];
    let field = |k: &str| kind[k].as_str().unwrap_or("");
    modelgate::kinds::WorkloadKinds::defaults()
        .find(field("group"), field("version"), field("kind"))
        .cloned()
}

/// A review of a kind with one complete template (the controllers of docs/policy.md §11).
fn is_controller(review: &Value) -> bool {
    table_row(review).is_some_and(|r| r.templates.len() == 1 && !r.is_partial())
}

/// A review of a kind whose templates are all partial (docs/policy.md §12).
fn is_partial(review: &Value) -> bool {
    table_row(review).is_some_and(|r| r.is_partial())
}

/// What the pods of a controller would get: the Pod of its template (as `audit` makes it)
/// through `/mutate`, the patch applied, then `/validate`.
fn pods_decision(label: &str, controller: &Value, namespace: &str, ctx: &Context) -> Answer {
    static TABLE: std::sync::OnceLock<modelgate::kinds::WorkloadKinds> = std::sync::OnceLock::new();
    let table = TABLE.get_or_init(Default::default);
    let target = match modelgate::audit::extract(controller.clone(), namespace, table) {
        Ok(modelgate::audit::Extracted::Target(t)) if t.parts.len() == 1 => t,
        other => panic!("{label}: not one pod template: {other:?}"),
    };
    let pod = &target.parts[0].object;
    let review = create_review("pod-of-template", pod, namespace);
    let mutated = call(Webhook::Mutate, &review, ctx);
    if !mutated.allowed {
        return mutated;
    }
    let patched = apply(pod, mutated.patch());
    call(Webhook::Validate, &with_object(&review, patched), ctx)
}

/// The controllers of the corpus (Kyverno's and Istio's samples, a kube-review Deployment) and
/// the project's own Deployment: `/validate` gives each the decision its pods will get, naming
/// the fields by the template's path; `/mutate` never patches one.
#[test]
fn corpus_controllers_are_judged_as_their_pods_will_be() {
    let Some(corpus) = corpus_dir() else { return };
    let cfg = config();
    let index = CacheIndex::new();
    let ctx = testing::context(&cfg, &index);
    let own = Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests/base/deployment.yaml");
    let own_text = std::fs::read_to_string(&own).unwrap();
    let own_docs = read_documents("manifests/base/deployment.yaml", &own_text).unwrap();
    let mut reviews: Vec<(String, String, Value)> = corpus_reviews(&corpus);
    for (i, d) in own_docs.into_iter().enumerate() {
        let review = create_review(&format!("own-{i}"), &d.value, "modelgate-system");
        reviews.push((
            "manifests/base/deployment.yaml".into(),
            String::new(),
            review,
        ));
    }
    let (mut allowed, mut denied, mut own_seen) = (0, 0, 0);
    for (rel, name, review) in reviews {
        if !is_controller(&review) || review["request"]["operation"] != "CREATE" {
            continue;
        }
        let label = format!("{rel} {name}");
        let object = &review["request"]["object"];
        let namespace = object["metadata"]["namespace"]
            .as_str()
            .or(review["request"]["namespace"].as_str())
            .unwrap_or("default");
        let m = call(Webhook::Mutate, &review, &ctx);
        assert!(
            m.allowed && m.ops.is_none(),
            "{label}: a controller is never patched"
        );
        assert!(m.warnings.is_empty(), "{label}: {:?}", m.warnings);
        let v = call(Webhook::Validate, &review, &ctx);
        assert!(v.ops.is_none(), "{label}");
        let pods = pods_decision(&label, object, namespace, &ctx);
        assert_eq!(
            v.allowed, pods.allowed,
            "{label}: the controller's decision is its pods' ({} / {})",
            v.message, pods.message
        );
        if v.allowed {
            allowed += 1;
        } else {
            denied += 1;
            let kind = object["kind"].as_str().unwrap_or("");
            let prefix = if kind == "CronJob" {
                "spec.jobTemplate.spec.template.spec"
            } else {
                "spec.template.spec"
            };
            assert!(v.message.contains(prefix), "{label}: {}", v.message);
            // Each field the pods' denial names, named by the template's path.
            for field in pods
                .message
                .split(". ")
                .filter_map(|p| p.split(": ").next())
            {
                if let Some(rest) = field.strip_prefix("spec.") {
                    assert!(
                        v.message.contains(&format!("{prefix}.{rest}")),
                        "{label}: {field} not in {}",
                        v.message
                    );
                }
            }
        }
        if rel.starts_with("manifests/") {
            own_seen += 1;
            assert!(v.allowed, "modelgate's own Deployment: {}", v.message);
        }
    }
    println!("corpus controllers: {allowed} allowed, {denied} denied");
    assert_eq!(own_seen, 1);
    assert!(
        allowed >= 3 && denied >= 3,
        "{allowed} allowed, {denied} denied"
    );
}

// ---------------------------------------------------------------------------------------------
// Corpus objects under other configurations (what the plain run cannot reach)
// ---------------------------------------------------------------------------------------------

fn corpus_object(corpus: &Path, rel: &str) -> Value {
    let text = std::fs::read_to_string(corpus.join(rel)).unwrap();
    let mut docs = read_documents(rel, &text).unwrap();
    assert_eq!(docs.len(), 1, "{rel}");
    docs.remove(0).value
}

fn run_object(
    label: &str,
    object: &Value,
    ns: &str,
    cfg: &PolicyConfig,
    index: &CacheIndex,
) -> Outcome {
    let ctx = Context {
        config: cfg,
        caches: Caches::Ready(index),
        namespaces: modelgate::namespaces::Namespaces::none(),
        now: None,
    };
    examine(
        label,
        create_review(&format!("uid-{label}"), object, ns),
        &ctx,
    )
}

/// The canonical prep container of docs/policy.md §4 for the default flags, written out by hand.
fn canonical_prep(volume: &str, command: &str) -> Value {
    json!({
        "name": "model-cache-prep",
        "image": "docker.io/curlimages/curl:8.18.0",
        "command": ["sh", "-c", command],
        "volumeMounts": [{"name": volume, "mountPath": "/models"}],
        "securityContext": {
            "runAsUser": 0,
            "runAsNonRoot": false,
            "allowPrivilegeEscalation": false,
            "readOnlyRootFilesystem": true,
            "capabilities": {"drop": ["ALL"], "add": ["CHOWN", "FOWNER"]},
            "seccompProfile": {"type": "RuntimeDefault"}
        }
    })
}

/// Checks an injected prep container against §4, resources aside (only "small" is specified).
fn assert_prep(label: &str, prep: &Value, volume: &str, command: &str) {
    let mut without_resources = prep.clone();
    let resources = without_resources
        .as_object_mut()
        .unwrap()
        .remove("resources")
        .unwrap_or_else(|| panic!("{label}: the prep container has resources"));
    assert!(
        resources["requests"].is_object() && resources["limits"].is_object(),
        "{label}: requests and limits: {resources}"
    );
    // A volumeMount may spell out readOnly: false; nothing else may differ.
    if let Some(m) = without_resources.pointer_mut("/volumeMounts/0")
        && m.get("readOnly") == Some(&json!(false))
    {
        m.as_object_mut().unwrap().remove("readOnly");
    }
    assert_eq!(
        without_resources,
        canonical_prep(volume, command),
        "{label}"
    );
}

#[test]
fn windows_pod_with_spec_os_gets_run_as_non_root_only() {
    let Some(corpus) = corpus_dir() else { return };
    let cfg = config();
    let index = CacheIndex::new();
    // psa/pass_base_windows.yaml without its runAsNonRoot, and with a writable model cache.
    let mut pod = corpus_object(&corpus, "psa/pass_base_windows.yaml");
    pod["spec"]["securityContext"] = json!({});
    pod["spec"]["volumes"] =
        json!([{"name": "model-cache", "persistentVolumeClaim": {"claimName": "models"}}]);
    let o = run_object("windows", &pod, "team-a", &cfg, &index);
    assert!(o.mutate.allowed, "{}", o.mutate.message);
    let patched = o.patched.unwrap();
    // No uid, gid, fsGroup or cache prep: the API forbids them on Windows pods.
    assert_eq!(
        patched["spec"]["securityContext"],
        json!({"runAsNonRoot": true})
    );
    assert_eq!(
        patched["spec"]["initContainers"],
        pod["spec"]["initContainers"]
    );
    let mut expected = pod.clone();
    expected["spec"]["securityContext"] = json!({"runAsNonRoot": true});
    assert_eq!(patched, expected);
}

#[test]
fn gatekeeper_update_reviews_with_a_uid_are_allowed_untouched_in_v1beta1() {
    let Some(corpus) = corpus_dir() else { return };
    let cfg = config();
    let index = CacheIndex::new();
    let ctx = testing::context(&cfg, &index);
    for rel in [
        "gatekeeper/fsgroup/update.yaml",
        "gatekeeper/validation/update_admissionreview.yaml",
    ] {
        // Completed the way the API server always sends it: uid, kind, resource, userInfo.
        let mut review = corpus_object(&corpus, rel);
        assert_eq!(review["apiVersion"], "admission.k8s.io/v1beta1");
        let req = &mut review["request"];
        req["uid"] = json!(format!("uid-{rel}"));
        req["kind"] = json!({"group": "", "version": "v1", "kind": "Pod"});
        req["resource"] = json!({"group": "", "version": "v1", "resource": "pods"});
        req["namespace"] = json!("default");
        req["userInfo"] = json!({"username": "gatekeeper"});
        let o = examine(rel, review, &ctx);
        check_expectation(&o, &Expect::Untouched);
        assert_eq!(o.mutate.body["apiVersion"], "admission.k8s.io/v1beta1");
        assert_eq!(o.validate.body["apiVersion"], "admission.k8s.io/v1beta1");
        // As a CREATE the same object would not pass untouched: the validation fixture has
        // runAsUser 0 (denied), the fsGroup one lacks the non-root identity (patched).
        let mut create = o.review.clone();
        create["request"]["operation"] = json!("CREATE");
        let c = examine(rel, create, &ctx);
        if rel.contains("validation") {
            assert!(!c.mutate.allowed && !c.validate.allowed, "{rel} as CREATE");
            assert!(
                c.mutate
                    .message
                    .contains("spec.containers[0].securityContext.runAsUser: 0")
            );
        } else {
            check_expectation(&c, &mutated(sc(json!({"fsGroup": 2000}))));
        }
    }
}

#[test]
fn gatekeeper_fsgroup_pods_with_a_writable_cache_take_the_fsgroup_branch() {
    let Some(corpus) = corpus_dir() else { return };
    let index = CacheIndex::new();
    for (rel, gid) in [
        ("gatekeeper/fsgroup/example_allowed.yaml", 500),
        ("gatekeeper/fsgroup/example_disallowed.yaml", 2000),
    ] {
        let original = corpus_object(&corpus, rel);

        // Their emptyDir volume named as the cache is not writable storage: no prep.
        let mut cfg = config();
        cfg.cache_volume = "fsgroup-demo-vol".into();
        let o = run_object(rel, &original, "team-a", &cfg, &index);
        check_expectation(&o, &mutated(sc(json!({"fsGroup": gid}))));

        // Backed by a PVC, it is: the prep comes first with `chown 0:<fsGroup>` (§4, fsGroup > 0),
        // and the pod's fsGroup is kept.
        let mut pod = original.clone();
        pod["metadata"]["annotations"] = json!({"modelgate.io/cache-volume": "fsgroup-demo-vol"});
        pod["spec"]["volumes"][0] =
            json!({"name": "fsgroup-demo-vol", "persistentVolumeClaim": {"claimName": "data"}});
        let o = run_object(rel, &pod, "team-a", &config(), &index);
        assert!(o.mutate.allowed, "{rel}: {}", o.mutate.message);
        let patched = o.patched.as_ref().unwrap();
        assert_eq!(
            patched["spec"]["securityContext"],
            sc(json!({"fsGroup": gid}))
        );
        let init = patched["spec"]["initContainers"].as_array().unwrap();
        assert_eq!(init.len(), 1, "{rel}");
        let cmd = format!("chown 0:{gid} /models && chmod g+rwX /models");
        assert_prep(rel, &init[0], "fsgroup-demo-vol", &cmd);
        assert_eq!(patched["spec"]["containers"], pod["spec"]["containers"]);
    }
}

#[test]
fn kserve_storage_job_with_the_cache_volume_gets_the_prep_on_its_template() {
    let Some(corpus) = corpus_dir() else { return };
    let job = corpus_object(&corpus, "kserve/samples/storage__pvc-init__job.yaml");
    let index = CacheIndex::new();

    // Default fsGroup 102 applies: the prep takes the fsGroup branch.
    let mut cfg = config();
    cfg.cache_volume = "pvc".into();
    let o = run_object("job-prep", &job, "kserve", &cfg, &index);
    assert!(o.mutate.allowed, "{}", o.mutate.message);
    let patched = o.patched.as_ref().unwrap();
    let spec = &patched["spec"]["template"]["spec"];
    assert_eq!(spec["securityContext"], sc(json!({"fsGroup": 102})));
    assert_eq!(spec["initContainers"].as_array().map(Vec::len), Some(1));
    assert_prep(
        "job-prep",
        &spec["initContainers"][0],
        "pvc",
        "chown 0:102 /models && chmod g+rwX /models",
    );
    assert!(
        patched["spec"]["securityContext"].is_null(),
        "the Job's own spec is not a pod spec"
    );
    for path in o
        .mutate
        .ops
        .as_ref()
        .unwrap()
        .iter()
        .map(|op| op["path"].as_str().unwrap())
    {
        // The template's spec, and its metadata for the identity webhooks' skip annotations.
        assert!(
            path.starts_with("/spec/template/spec/") || path.starts_with("/spec/template/metadata"),
            "{path}"
        );
    }

    // The OpenShift preset: no default fsGroup, the SCC picks the uid → `chown <uid>:0` with the
    // init-container user as owner, mode 770.
    let mut cfg = config();
    cfg.cache_volume = "pvc".into();
    cfg.default_fsgroup = 0;
    cfg.run_as_user = modelgate::config::IdSetting::None;
    cfg.run_as_group = modelgate::config::IdSetting::None;
    let o = run_object("job-prep-openshift", &job, "kserve", &cfg, &index);
    assert!(o.mutate.allowed, "{}", o.mutate.message);
    let spec = &o.patched.as_ref().unwrap()["spec"]["template"]["spec"];
    assert_eq!(spec["securityContext"], json!({"runAsNonRoot": true}));
    assert_prep(
        "job-prep-openshift",
        &spec["initContainers"][0],
        "pvc",
        "chown 101:0 /models && chmod 770 /models",
    );
}

/// sha256 of the URI as written, first 16 hex digits, computed with
/// `printf %s URI | sha256sum` outside this code.
const KEY_LLAMA3_INSTRUCT: &str = "c277d78a31bc6624"; // hf://meta-llama/meta-llama-3-8b-instruct
const KEY_LLAMA3_8B: &str = "c41ae4f29d692d55"; // hf://meta-llama/Meta-Llama-3-8B
const KEY_S3_MODEL: &str = "89da10faf446bbf1"; // s3://mybucket/mymodel

fn gpu_terms() -> Value {
    json!([{"matchExpressions": [{"key": "node-type", "operator": "In", "values": ["gpu"]}, pin()]}])
}

#[test]
fn kserve_shared_pvc_sample_resolves_to_the_pvc_ref_without_pinning_nodes() {
    let (index, _) =
        modelgate::cache::load_files(&[fixture_path("kserve/shared-pvc-status.yaml")]).unwrap();
    let cfg = config();
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"generateName": "vllm-", "namespace": "my-models",
            "annotations": {"modelgate.io/model-uri": "hf://meta-llama/Meta-Llama-3-8B"}},
        "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai"}]}
    });
    let o = run_object("shared", &pod, "my-models", &cfg, &index);
    let p = o.patched.as_ref().unwrap();
    assert_eq!(
        p["metadata"]["annotations"]["modelgate.io/resolved-uri"],
        format!("pvc://shared-models/models/{KEY_LLAMA3_8B}")
    );
    assert!(p["spec"]["affinity"].is_null(), "a shared PVC pins no node");
    // A pod of another namespace never sees that namespace's cache.
    let mut elsewhere = pod.clone();
    elsewhere["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("namespace");
    let o = run_object("other", &elsewhere, "x", &cfg, &index);
    assert_eq!(
        o.patched.as_ref().unwrap()["metadata"]["annotations"]["modelgate.io/model-cache-reason"],
        "no-match"
    );
}

#[test]
fn kserve_job_resolves_its_model_against_the_readme_caches() {
    let Some(corpus) = corpus_dir() else { return };
    let index = kserve_caches(&corpus);
    let cfg = config();
    let mut job = corpus_object(&corpus, "kserve/samples/storage__pvc-init__job.yaml");
    job["spec"]["template"]["metadata"] = json!({"annotations": {"modelgate.io/model-uri": "hf://meta-llama/meta-llama-3-8b-instruct"}});
    let o = run_object("job-model", &job, "kserve", &cfg, &index);
    assert!(o.mutate.allowed, "{}", o.mutate.message);
    // The Job's template is not routed (its pods are, each when it is created); the Job hears
    // which model its pods would mount now.
    let template = &o.patched.as_ref().unwrap()["spec"]["template"];
    assert_eq!(
        template["metadata"], job["spec"]["template"]["metadata"],
        "{template}"
    );
    assert!(template["spec"]["affinity"].is_null(), "{template}");
    assert!(
        o.mutate.warnings.iter().any(|w| w
            == "pods created now would mount model hf://meta-llama/meta-llama-3-8b-instruct \
                from LocalModelCache meta-llama3-8b-instruct"),
        "{:?}",
        o.mutate.warnings
    );
    // Its pod, created from the template, is routed.
    let pod = pod_from_template(o.patched.as_ref().unwrap());
    let o = run_object("job-model-pod", &pod, "kserve", &cfg, &index);
    assert!(o.mutate.allowed, "{}", o.mutate.message);
    let t = o.patched.as_ref().unwrap();
    let pvc = "meta-llama3-8b-instruct-workers";
    assert_eq!(
        t["metadata"]["annotations"],
        json!({
            "modelgate.io/model-uri": "hf://meta-llama/meta-llama-3-8b-instruct",
            "modelgate.io/model-cache": "cluster/meta-llama3-8b-instruct",
            "modelgate.io/resolved-uri": format!("pvc://{pvc}/models/{KEY_LLAMA3_INSTRUCT}"),
        })
    );
    let volumes = t["spec"]["volumes"].as_array().unwrap();
    assert_eq!(volumes.len(), 2);
    assert_eq!(volumes[0], job["spec"]["template"]["spec"]["volumes"][0]);
    assert_eq!(
        volumes[1],
        json!({"name": "modelgate-model", "persistentVolumeClaim": {"claimName": pvc, "readOnly": true}})
    );
    // The storage initializer already mounts its `pvc` volume at /mnt/models: skipped, warned.
    assert_eq!(
        t["spec"]["containers"][0]["volumeMounts"],
        job["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
    );
    assert!(
        o.mutate
            .warnings
            .iter()
            .any(|w| w.contains("storage-initializer")),
        "{:?}",
        o.mutate.warnings
    );
    assert!(
        o.mutate
            .warnings
            .iter()
            .any(|w| w.contains("hf://meta-llama/meta-llama-3-8b-instruct")
                && w.contains("meta-llama3-8b-instruct")),
        "{:?}",
        o.mutate.warnings
    );
    // The node group's PV affinity: the pod lands only where the model is.
    assert_eq!(
        t["spec"]["affinity"],
        json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": gpu_terms()}}})
    );
}

#[test]
fn kserve_pods_resolve_with_precedence_subpaths_and_misses() {
    let Some(corpus) = corpus_dir() else { return };
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/namespace-caches.yaml");
    let (index, _) = modelgate::cache::load_files(&[
        corpus.join("kserve/localmodelcache_readme_objects.yaml"),
        fixture_path("kserve/localmodelcache-status.yaml"),
        fixture,
    ])
    .unwrap();
    let cfg = config();
    // A predictor pod as KServe renders it: the source URI and node group in KServe's
    // annotations, an existing node affinity, and one container.
    let pod = |uri: &str, ns: &str| {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"generateName": "huggingface-llama3-predictor-", "namespace": ns,
                "annotations": {
                    "internal.serving.kserve.io/storage-initializer-sourceuri": uri,
                    "serving.kserve.io/nodegroup": "workers"}},
            "spec": {
                "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]}}},
                "containers": [{"name": "kserve-container", "image": "kserve/huggingfaceserver"}]
            }
        })
    };
    let annotations = |o: &Outcome| o.patched.as_ref().unwrap()["metadata"]["annotations"].clone();

    // Cluster cache, model below the cache URI: sub-path kept after the key.
    let o = run_object(
        "sub",
        &pod("hf://meta-llama/Meta-Llama-3-8B/original/", "team-b"),
        "x",
        &cfg,
        &index,
    );
    let p = o.patched.as_ref().unwrap();
    assert_eq!(
        annotations(&o)["modelgate.io/model-cache"],
        "cluster/llama3-8b"
    );
    let sub = format!("models/{KEY_LLAMA3_8B}/original");
    assert_eq!(
        annotations(&o)["modelgate.io/resolved-uri"],
        format!("pvc://llama3-8b-workers/{sub}")
    );
    assert_eq!(
        p["spec"]["containers"][0]["volumeMounts"],
        json!([{"name": "modelgate-model", "mountPath": "/mnt/models", "subPath": sub, "readOnly": true}])
    );
    // ANDed into the existing term.
    assert_eq!(
        p["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"],
        json!([{"matchExpressions": [
            {"key": "zone", "operator": "In", "values": ["a"]},
            {"key": "node-type", "operator": "In", "values": ["gpu"]},
            pin()]}])
    );

    // The namespace's own cache (tests/fixtures/namespace-caches.yaml) beats the cluster's, even
    // with a shorter URI; another namespace's cache is never used.
    let o = run_object(
        "ns",
        &pod("hf://meta-llama/Meta-Llama-3-8B", "team-a"),
        "x",
        &cfg,
        &index,
    );
    assert_eq!(
        annotations(&o)["modelgate.io/model-cache"],
        "namespace/team-a/team-llama"
    );
    let o = run_object(
        "other-ns",
        &pod("hf://meta-llama/Meta-Llama-3-8B", "team-c"),
        "x",
        &cfg,
        &index,
    );
    assert_eq!(
        annotations(&o)["modelgate.io/model-cache"],
        "cluster/llama3-8b"
    );

    // One trailing slash on either side is ignored; a look-alike prefix is a miss.
    let o = run_object(
        "slash",
        &pod("s3://mybucket/mymodel/", "team-b"),
        "x",
        &cfg,
        &index,
    );
    assert_eq!(
        annotations(&o)["modelgate.io/resolved-uri"],
        format!("pvc://s3-model-workers/models/{KEY_S3_MODEL}")
    );
    let o = run_object(
        "evil",
        &pod("s3://mybucket/mymodel-evil", "team-b"),
        "x",
        &cfg,
        &index,
    );
    assert_eq!(annotations(&o)["modelgate.io/model-cache"], "miss");
    let p = o.patched.as_ref().unwrap();
    assert!(p["spec"]["volumes"].is_null(), "a miss adds no volume");
    assert!(p["spec"]["containers"][0].get("volumeMounts").is_none());
    assert_eq!(
        p["spec"]["affinity"],
        pod("x", "y")["spec"]["affinity"],
        "a miss changes no affinity"
    );

    // A node group the cache does not list: miss.
    let mut other_group = pod("hf://meta-llama/Meta-Llama-3-8B", "team-b");
    other_group["metadata"]["annotations"]["serving.kserve.io/nodegroup"] = json!("cpu");
    let o = run_object("group", &other_group, "x", &cfg, &index);
    assert_eq!(annotations(&o)["modelgate.io/model-cache"], "miss");
    assert_eq!(
        annotations(&o)["modelgate.io/model-cache-reason"],
        "node-group-mismatch"
    );

    // A namespace where KServe made no PVC: a miss that names the PVC.
    let o = run_object(
        "no-pvc",
        &pod("hf://meta-llama/Meta-Llama-3-8B", "team-x"),
        "x",
        &cfg,
        &index,
    );
    assert_eq!(
        annotations(&o)["modelgate.io/model-cache-reason"],
        "pvc-missing"
    );
    assert!(
        o.mutate.warnings.iter().any(
            |w| w.starts_with("pvc-missing: LocalModelNamespaceCache team-x/elsewhere matches")
        ),
        "{:?}",
        o.mutate.warnings
    );

    // Opting out: a miss with its reason; nothing else about the model changes.
    let mut opt_out = pod("hf://meta-llama/Meta-Llama-3-8B", "team-b");
    opt_out["metadata"]["annotations"]["serving.kserve.io/disable-localmodel"] = json!("true");
    let o = run_object("opt-out", &opt_out, "x", &cfg, &index);
    let mut expected = opt_out["metadata"]["annotations"].clone();
    expected["modelgate.io/model-cache"] = json!("miss");
    expected["modelgate.io/model-cache-reason"] = json!("opted-out");
    assert_eq!(annotations(&o), expected);
    assert!(o.patched.as_ref().unwrap()["spec"]["volumes"].is_null());
}

#[test]
fn kserve_cache_objects_and_samples_reviewed_as_objects_are_other_kinds() {
    let Some(corpus) = corpus_dir() else { return };
    let cfg = config();
    let index = kserve_caches(&corpus);
    let ctx = Context {
        config: &cfg,
        caches: Caches::Ready(&index),
        namespaces: modelgate::namespaces::Namespaces::none(),
        now: None,
    };
    // LocalModelCache, LocalModelNodeGroup: with the caches loaded they are still not
    // intercepted; InferenceService and LLMInferenceService are judged on their partial
    // templates only (docs/policy.md §12).
    let mut n = 0;
    for (rel, name, review) in corpus_reviews(&corpus) {
        if !rel.starts_with("kserve/") || review["request"]["kind"]["kind"] == "Job" {
            continue;
        }
        let expect = if is_partial(&review) {
            Expect::Partial
        } else {
            Expect::Other
        };
        let o = examine(&format!("{rel} {name}"), review, &ctx);
        check_expectation(&o, &expect);
        n += 1;
    }
    assert!(n >= 14, "only {n} KServe objects");
}

/// The pod the Job controller makes from a template, as the API server hands it to the Pod
/// webhook: name from generateName, labels, and the defaults the API server fills in.
fn pod_from_template(job: &Value) -> Value {
    let template = &job["spec"]["template"];
    let mut pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": template["metadata"].clone(),
        "spec": template["spec"].clone(),
    });
    let meta = pod["metadata"]
        .as_object_mut()
        .map(std::mem::take)
        .unwrap_or_default();
    let mut meta = Value::Object(meta);
    meta["generateName"] = json!(format!("{}-", job["metadata"]["name"].as_str().unwrap()));
    meta["labels"]["batch.kubernetes.io/job-name"] = job["metadata"]["name"].clone();
    meta["ownerReferences"] = json!([{"apiVersion": "batch/v1", "kind": "Job", "name": job["metadata"]["name"], "uid": "1", "controller": true}]);
    pod["metadata"] = meta;
    let spec = &mut pod["spec"];
    for key in [
        "dnsPolicy",
        "schedulerName",
        "terminationGracePeriodSeconds",
    ] {
        spec[key] = match key {
            "dnsPolicy" => json!("ClusterFirst"),
            "schedulerName" => json!("default-scheduler"),
            _ => json!(30),
        };
    }
    for list in ["initContainers", "containers"] {
        for c in spec[list].as_array_mut().into_iter().flatten() {
            c["imagePullPolicy"] = json!("IfNotPresent");
            c["terminationMessagePath"] = json!("/dev/termination-log");
            c["terminationMessagePolicy"] = json!("File");
        }
    }
    pod
}

#[test]
fn a_mutated_job_template_yields_pods_the_pod_webhook_leaves_alone() {
    // A Job's pods come through the Pod webhook again: with the same policy they need nothing
    // more than their model's routing (a template is not routed), and they validate.
    let Some(corpus) = corpus_dir() else { return };
    let index = kserve_caches(&corpus);
    let mut cfg = config();
    cfg.cache_volume = "pvc".into();
    let mut job = corpus_object(&corpus, "kserve/samples/storage__pvc-init__job.yaml");
    job["spec"]["template"]["metadata"] = json!({"annotations": {
        "serving.kserve.io/nodegroup": "workers",
        "internal.serving.kserve.io/storage-initializer-sourceuri": "hf://meta-llama/meta-llama-3-8b-instruct"}});
    let o = run_object("job", &job, "kserve", &cfg, &index);
    assert!(o.mutate.allowed, "{}", o.mutate.message);
    let mutated_job = o.patched.unwrap();
    assert_eq!(
        mutated_job["spec"]["template"]["spec"]["initContainers"][0]["name"],
        "model-cache-prep"
    );
    let pod = pod_from_template(&mutated_job);
    let p = run_object("job-pod", &pod, "kserve", &cfg, &index);
    assert!(p.mutate.allowed, "{}", p.mutate.message);
    let ops = p.mutate.ops.clone().unwrap_or_default();
    assert!(
        !ops.is_empty(),
        "the Job's pod is routed when it is created"
    );
    for op in &ops {
        let path = op["path"].as_str().unwrap_or_default();
        assert!(
            !path.contains("securityContext") && !path.starts_with("/spec/initContainers"),
            "the Job's pod needs nothing but its routing: {op}"
        );
    }
    assert!(p.validate.allowed, "{}", p.validate.message);

    // On OpenShift (no default uid or fsGroup) the template's prep owns the cache as the init
    // user 101; the SCC then gives the pod a uid, and the Pod webhook re-renders the prep for it
    // (§4: "replaced by the canonical one for this pod").
    let mut cfg = config();
    cfg.cache_volume = "pvc".into();
    cfg.default_fsgroup = 0;
    cfg.run_as_user = modelgate::config::IdSetting::None;
    cfg.run_as_group = modelgate::config::IdSetting::None;
    let o = run_object("job-openshift", &job, "kserve", &cfg, &index);
    let mutated_job = o.patched.unwrap();
    let mut pod = pod_from_template(&mutated_job);
    assert_eq!(
        pod["spec"]["initContainers"][0]["command"][2],
        "chown 101:0 /models && chmod 770 /models"
    );
    pod["spec"]["securityContext"]["runAsUser"] = json!(1000680000);
    let ns = "kserve";
    let original = call(
        Webhook::Validate,
        &create_review("scc", &pod, ns),
        &Context {
            config: &cfg,
            caches: Caches::Ready(&index),
            namespaces: modelgate::namespaces::Namespaces::none(),
            now: None,
        },
    );
    assert!(
        !original.allowed,
        "the stale prep is not canonical for this pod"
    );
    assert!(
        original.message.contains("spec.initContainers[0]"),
        "{}",
        original.message
    );
    let p = run_object("scc-pod", &pod, ns, &cfg, &index);
    assert!(p.mutate.allowed, "{}", p.mutate.message);
    let patched = p.patched.as_ref().unwrap();
    assert_eq!(
        patched["spec"]["initContainers"][0]["command"][2],
        "chown 1000680000:0 /models && chmod 770 /models"
    );
    assert_eq!(
        patched["spec"]["initContainers"].as_array().unwrap().len(),
        1
    );
    assert!(
        p.mutate
            .warnings
            .iter()
            .any(|w| w.contains("model-cache-prep")),
        "{:?}",
        p.mutate.warnings
    );
}
