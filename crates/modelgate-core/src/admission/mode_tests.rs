//! Every cell of docs/policy.md §9's table, through the wire: for each mode and webhook, the patch (or
//! none), the warnings, the `auditAnnotations`, and the result `modelgate_policy_results_total`
//! counts. Also the Pod Security `restricted` namespace, where the prep is not injected.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::*;
use crate::cache::{CacheEntry, CacheIndex, CacheScope};
use crate::namespaces::{MODE_LABEL, NamespaceLabels, POD_SECURITY_ENFORCE_LABEL};
use crate::testing;

/// Namespaces `ns-<mode>` labelled with each mode, `ns-bogus` with an unknown value,
/// `ns-plain` unlabelled, `ns-restricted` enforcing Pod Security restricted.
fn namespaces() -> Namespaces {
    let mut ns = Namespaces::default();
    let label = |pairs: &[(&str, &str)]| {
        let map: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        NamespaceLabels::from_labels(&map)
    };
    for mode in Mode::ALL {
        ns.set(&format!("ns-{mode}"), label(&[(MODE_LABEL, mode.as_str())]));
    }
    ns.set("ns-bogus", label(&[(MODE_LABEL, "dry-run")]));
    ns.set(
        "ns-restricted",
        label(&[(POD_SECURITY_ENFORCE_LABEL, "restricted")]),
    );
    ns
}

fn review(ns: &str, object: Value) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "u-1",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": ns, "operation": "CREATE", "userInfo": {"username": "alice"},
            "object": object,
        }
    })
}

fn pod(spec: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "p-"}, "spec": spec})
}

/// Needs every §3 field and nothing else: enforce patches it, validation allows it as is.
fn to_patch() -> Value {
    pod(json!({"containers": [{"name": "c", "image": "x"}]}))
}

/// A container says runAsNonRoot: false: enforce's mutation fixes it, so no mode may report
/// the validator's objection to the unpatched object.
fn fixed_by_mutation() -> Value {
    pod(json!({
        "securityContext": {"runAsNonRoot": true, "runAsUser": 1000, "runAsGroup": 1000},
        "containers": [{"name": "c", "image": "x", "securityContext": {"runAsNonRoot": false}}]
    }))
}

/// A uid of 0: denied by both webhooks.
fn to_deny() -> Value {
    pod(json!({"securityContext": {"runAsUser": 0}, "containers": [{"name": "c", "image": "x"}]}))
}

/// Already as the policy wants it.
fn compliant() -> Value {
    pod(json!({
        "securityContext": {"runAsNonRoot": true, "runAsUser": 1000, "runAsGroup": 1000},
        "containers": [{"name": "c", "image": "x"}]
    }))
}

const DENIAL_WARNING: &str =
    "would deny: spec.securityContext.runAsUser: 0 is outside 1..2147483647";
const PATCH_FACTS: [&str; 3] = [
    "set spec.securityContext.runAsNonRoot=true",
    "set spec.securityContext.runAsUser=1000",
    "set spec.securityContext.runAsGroup=1000",
];

struct Answer {
    response: Value,
    patch: Option<Vec<Value>>,
    summary: Summary,
}

impl Answer {
    fn allowed(&self) -> bool {
        self.response["allowed"] == true
    }
    fn warnings(&self) -> Vec<String> {
        self.response["warnings"]
            .as_array()
            .map(|a| a.iter().map(|w| w.as_str().unwrap().to_string()).collect())
            .unwrap_or_default()
    }
    fn audit(&self) -> Value {
        self.response
            .get("auditAnnotations")
            .cloned()
            .unwrap_or(Value::Null)
    }
    fn result(&self) -> (&'static str, &'static str) {
        (
            self.summary.mode.expect("mode").as_str(),
            self.summary.result.expect("result").as_str(),
        )
    }
}

fn run_in(
    webhook: Webhook,
    ns: &str,
    object: Value,
    cfg: &PolicyConfig,
    namespaces: &Namespaces,
    index: &CacheIndex,
) -> Answer {
    let ctx = Context {
        config: cfg,
        caches: Caches::Ready(index),
        namespaces,
        now: None,
    };
    let answer = testing::review(webhook, &review(ns, object), &ctx);
    assert_eq!(answer.http, 200, "{}", answer.body);
    Answer {
        response: answer.body["response"].clone(),
        patch: answer.ops,
        summary: answer.summary.expect("an in-process answer has a summary"),
    }
}

fn run(webhook: Webhook, ns: &str, object: Value) -> Answer {
    run_in(
        webhook,
        ns,
        object,
        &PolicyConfig::default(),
        &namespaces(),
        &CacheIndex::new(),
    )
}

#[test]
fn enforce_patches_and_denies_as_written() {
    let a = run(Webhook::Mutate, "ns-enforce", to_patch());
    assert!(a.allowed());
    assert_eq!(a.patch.as_ref().map(Vec::len), Some(1));
    assert!(a.warnings().is_empty(), "{:?}", a.warnings());
    assert_eq!(a.audit(), Value::Null);
    assert_eq!(a.result(), ("enforce", "patched"));

    let a = run(Webhook::Mutate, "ns-enforce", to_deny());
    assert!(!a.allowed() && a.patch.is_none());
    assert_eq!(a.response["status"]["code"], 403);
    assert_eq!(a.result(), ("enforce", "denied"));

    let a = run(Webhook::Mutate, "ns-enforce", compliant());
    assert!(a.allowed() && a.patch.is_none());
    assert_eq!(a.result(), ("enforce", "unchanged"));

    let a = run(Webhook::Validate, "ns-enforce", to_deny());
    assert!(!a.allowed());
    assert!(
        a.response["status"]["message"]
            .as_str()
            .unwrap()
            .contains("spec.securityContext.runAsUser: 0 is outside 1..2147483647")
    );
    assert_eq!(a.result(), ("enforce", "denied"));

    // /validate holds the invariant alone: unmutated, the pod is refused (docs/policy.md §6).
    let a = run(Webhook::Validate, "ns-enforce", to_patch());
    assert!(!a.allowed() && a.patch.is_none());
    assert_eq!(
        a.response["status"]["message"].as_str().unwrap(),
        "spec.containers[0].securityContext.runAsNonRoot: not set (neither the container nor \
         the pod sets it to true). Set runAsNonRoot: true on the pod or the container \
         (modelgate's mutating webhook sets it on the pod: check that it is registered for this \
         namespace)."
    );
    assert_eq!(a.result(), ("enforce", "denied"));

    let a = run(Webhook::Validate, "ns-enforce", compliant());
    assert!(a.allowed() && a.patch.is_none());
    assert_eq!(a.result(), ("enforce", "unchanged"));
}

#[test]
fn warn_allows_without_a_patch_and_says_what_would_change() {
    let a = run(Webhook::Mutate, "ns-warn", to_patch());
    assert!(a.allowed() && a.patch.is_none());
    let expected: Vec<String> = PATCH_FACTS.iter().map(|f| format!("would {f}")).collect();
    assert_eq!(a.warnings(), expected);
    assert_eq!(a.audit(), Value::Null);
    assert_eq!(a.result(), ("warn", "would_patch"));

    let a = run(Webhook::Mutate, "ns-warn", to_deny());
    assert!(a.allowed() && a.patch.is_none());
    assert_eq!(a.warnings(), [DENIAL_WARNING]);
    assert_eq!(a.result(), ("warn", "would_deny"));

    let a = run(Webhook::Mutate, "ns-warn", compliant());
    assert!(a.allowed() && a.patch.is_none() && a.warnings().is_empty());
    assert_eq!(a.result(), ("warn", "unchanged"));

    let a = run(Webhook::Validate, "ns-warn", to_deny());
    assert!(a.allowed() && a.patch.is_none());
    assert_eq!(a.warnings(), [DENIAL_WARNING]);
    assert_eq!(a.audit(), Value::Null);
    assert_eq!(a.result(), ("warn", "would_deny"));

    let a = run(Webhook::Validate, "ns-warn", to_patch());
    assert!(a.allowed() && a.warnings().is_empty());
    assert_eq!(a.result(), ("warn", "unchanged"));
}

#[test]
fn audit_allows_silently_and_records_the_facts_in_audit_annotations() {
    let a = run(Webhook::Mutate, "ns-audit", to_patch());
    assert!(a.allowed() && a.patch.is_none() && a.warnings().is_empty());
    assert_eq!(a.audit(), json!({"would-patch": PATCH_FACTS.join("; ")}));
    assert_eq!(a.result(), ("audit", "would_patch"));

    let a = run(Webhook::Mutate, "ns-audit", to_deny());
    assert!(a.allowed() && a.patch.is_none() && a.warnings().is_empty());
    let would_deny = a.audit()["would-deny"].as_str().unwrap().to_string();
    assert!(
        would_deny.starts_with("spec.securityContext.runAsUser: 0 is outside 1..2147483647. "),
        "{would_deny}"
    );
    assert_eq!(a.audit().as_object().unwrap().len(), 1);
    assert_eq!(a.result(), ("audit", "would_deny"));

    let a = run(Webhook::Mutate, "ns-audit", compliant());
    assert!(a.allowed() && a.audit() == Value::Null);
    assert_eq!(a.result(), ("audit", "unchanged"));

    let a = run(Webhook::Validate, "ns-audit", to_deny());
    assert!(a.allowed() && a.warnings().is_empty());
    assert_eq!(a.audit(), json!({"would-deny": would_deny}));
    assert_eq!(a.result(), ("audit", "would_deny"));

    let a = run(Webhook::Validate, "ns-audit", to_patch());
    assert!(a.allowed() && a.audit() == Value::Null);
    assert_eq!(a.result(), ("audit", "unchanged"));
}

#[test]
fn off_allows_everything_untouched() {
    for webhook in [Webhook::Mutate, Webhook::Validate] {
        for object in [to_patch(), to_deny(), fixed_by_mutation(), compliant()] {
            let a = run(webhook, "ns-off", object);
            assert!(a.allowed() && a.patch.is_none());
            assert!(a.warnings().is_empty() && a.audit() == Value::Null);
            assert_eq!(a.result(), ("off", "unchanged"));
        }
    }
    // Even an object that does not decode: the namespace has opted out.
    let a = run(
        Webhook::Validate,
        "ns-off",
        json!({"kind": "Pod", "spec": 7}),
    );
    assert!(a.allowed());
}

#[test]
fn dry_run_validation_reports_only_what_enforce_would_deny() {
    // Enforce: the mutation fixes runAsNonRoot, the validator then sees the fixed pod.
    let a = run(Webhook::Mutate, "ns-enforce", fixed_by_mutation());
    assert_eq!(a.result(), ("enforce", "patched"));
    for ns in ["ns-warn", "ns-audit"] {
        let a = run(Webhook::Validate, ns, fixed_by_mutation());
        assert!(
            a.allowed() && a.warnings().is_empty(),
            "{ns}: {:?}",
            a.warnings()
        );
        assert_eq!(a.audit(), Value::Null, "{ns}");
        assert_eq!(a.result().1, "unchanged", "{ns}");
    }
    let a = run(Webhook::Mutate, "ns-warn", fixed_by_mutation());
    assert_eq!(
        a.warnings(),
        ["would set spec.containers[0].securityContext.runAsNonRoot=true"]
    );
    // A prep container that is not canonical: enforce replaces it, so warn does not deny it.
    let cache_pod = pod(json!({
        "initContainers": [{"name": "model-cache-prep", "image": "old"}],
        "containers": [{"name": "c", "image": "x"}],
        "volumes": [{"name": "model-cache", "persistentVolumeClaim": {"claimName": "c"}}]
    }));
    let a = run(Webhook::Validate, "ns-warn", cache_pod.clone());
    assert!(a.warnings().is_empty(), "{:?}", a.warnings());
    let a = run(Webhook::Validate, "ns-enforce", cache_pod);
    assert!(!a.allowed());
}

#[test]
fn default_mode_applies_to_unlabelled_namespaces_and_an_unknown_label_enforces_with_a_warning() {
    for mode in Mode::ALL {
        let cfg = PolicyConfig {
            default_mode: mode,
            ..PolicyConfig::default()
        };
        let a = run_in(
            Webhook::Mutate,
            "ns-plain",
            to_patch(),
            &cfg,
            &namespaces(),
            &CacheIndex::new(),
        );
        assert_eq!(a.summary.mode, Some(mode));
        assert_eq!(a.patch.is_some(), mode == Mode::Enforce, "{mode}");
        // A label beats the default.
        let a = run_in(
            Webhook::Mutate,
            "ns-warn",
            to_patch(),
            &cfg,
            &namespaces(),
            &CacheIndex::new(),
        );
        assert_eq!(a.summary.mode, Some(Mode::Warn));
    }
    let cfg = PolicyConfig {
        default_mode: Mode::Off,
        ..PolicyConfig::default()
    };
    let a = run_in(
        Webhook::Mutate,
        "ns-bogus",
        to_patch(),
        &cfg,
        &namespaces(),
        &CacheIndex::new(),
    );
    assert_eq!(a.result(), ("enforce", "patched"));
    assert_eq!(
        a.warnings(),
        [
            "namespace ns-bogus: label modelgate.io/mode=\"dry-run\" is not one of enforce, warn, audit, off; enforcing"
        ]
    );
    let a = run_in(
        Webhook::Validate,
        "ns-bogus",
        to_deny(),
        &cfg,
        &namespaces(),
        &CacheIndex::new(),
    );
    assert!(!a.allowed());
    assert_eq!(a.warnings().len(), 1);
}

#[test]
fn exempt_namespaces_stay_outside_the_modes() {
    let cfg = PolicyConfig::default().with_default_exemptions(None);
    let a = run_in(
        Webhook::Mutate,
        "kube-system",
        to_deny(),
        &cfg,
        &namespaces(),
        &CacheIndex::new(),
    );
    assert!(a.allowed() && a.patch.is_none());
    assert_eq!((a.summary.mode, a.summary.result), (None, None));
}

/// The summary carries the mode and result that `modelgate_policy_results_total` counts (the
/// server turns them into labels; tests/serve_cluster.rs reads the exported series).
#[test]
fn each_result_is_summarised_with_its_mode() {
    let cells = [
        (
            Webhook::Mutate,
            "ns-enforce",
            to_patch(),
            "enforce",
            "patched",
        ),
        (
            Webhook::Validate,
            "ns-enforce",
            to_deny(),
            "enforce",
            "denied",
        ),
        (
            Webhook::Mutate,
            "ns-warn",
            to_patch(),
            "warn",
            "would_patch",
        ),
        (
            Webhook::Validate,
            "ns-audit",
            to_deny(),
            "audit",
            "would_deny",
        ),
        (Webhook::Mutate, "ns-off", to_deny(), "off", "unchanged"),
        (
            Webhook::Mutate,
            "ns-audit",
            compliant(),
            "audit",
            "unchanged",
        ),
    ];
    for (webhook, ns, object, mode, result) in cells {
        let a = run(webhook, ns, object);
        let got = (
            a.summary.mode.map(Mode::as_str),
            a.summary.result.map(PolicyResult::as_str),
        );
        assert_eq!(got, (Some(mode), Some(result)), "{webhook:?} in {ns}");
    }
}

/// The resolution of the pod's model travels out in the summary of the admission that used it
/// (`/mutate`, in every mode but `off`), to be counted once by the server.
#[test]
fn the_model_resolution_is_summarised_by_the_mutation_that_used_it() {
    let model_pod = || {
        let mut p = to_patch();
        p["metadata"]["annotations"] = json!({"modelgate.io/model-uri": "hf://org/absent"});
        p
    };
    let miss = Some(crate::cache::Resolved::Miss(
        crate::cache::MissReason::NoMatch,
    ));
    for ns in ["ns-enforce", "ns-warn", "ns-audit"] {
        assert_eq!(
            run(Webhook::Mutate, ns, model_pod()).summary.model_cache,
            miss,
            "{ns}"
        );
        assert_eq!(
            run(Webhook::Validate, ns, model_pod()).summary.model_cache,
            None,
            "{ns}"
        );
    }
    assert_eq!(
        run(Webhook::Mutate, "ns-off", model_pod())
            .summary
            .model_cache,
        None
    );
    assert_eq!(
        run(Webhook::Mutate, "ns-enforce", to_patch())
            .summary
            .model_cache,
        None
    );
}

// Pod Security -------------------------------------------------------------------------------

fn cache_pod() -> Value {
    pod(json!({
        "containers": [{"name": "c", "image": "x", "volumeMounts": [{"name": "model-cache", "mountPath": "/cache"}]}],
        "volumes": [{"name": "model-cache", "persistentVolumeClaim": {"claimName": "cache"}}]
    }))
}

fn patched(object: &Value, patch: &Option<Vec<Value>>) -> Value {
    let mut out = object.clone();
    if let Some(ops) = patch {
        let p: json_patch::Patch = serde_json::from_value(Value::Array(ops.clone())).unwrap();
        json_patch::patch(&mut out, &p).unwrap();
    }
    out
}

#[test]
fn restricted_namespaces_get_no_root_prep_and_run_as_the_cache_owner() {
    let a = run(Webhook::Mutate, "ns-restricted", cache_pod());
    assert!(a.allowed());
    let pod = patched(&cache_pod(), &a.patch);
    assert!(pod["spec"].get("initContainers").is_none(), "{pod}");
    // As under --model-cache-prep=never: the pod runs as the cache owner.
    assert_eq!(
        pod["spec"]["securityContext"],
        json!({"runAsNonRoot": true, "runAsUser": 101, "runAsGroup": 1000, "fsGroup": 102})
    );
    assert_eq!(
        a.warnings(),
        [
            "namespace ns-restricted enforces Pod Security restricted, which refuses the root model-cache-prep: not injected; the pod is treated as under --model-cache-prep=never"
        ]
    );
    // The result validates, and a second pass changes nothing.
    let v = run(Webhook::Validate, "ns-restricted", pod.clone());
    assert!(v.allowed(), "{}", v.response);
    let again = run(Webhook::Mutate, "ns-restricted", pod);
    assert!(again.patch.is_none());

    // Elsewhere the same pod gets the prep.
    let a = run(Webhook::Mutate, "ns-plain", cache_pod());
    let pod = patched(&cache_pod(), &a.patch);
    assert_eq!(pod["spec"]["initContainers"][0]["name"], "model-cache-prep");
    // The only word: its claim is not among the objects given, and is taken as provisioned.
    let [note] = &a.warnings()[..] else {
        panic!("{:?}", a.warnings())
    };
    assert!(note.starts_with("claim "), "{note}");

    // A pod that brings its own root prep into a restricted namespace is refused.
    let mut own = cache_pod();
    own["spec"]["initContainers"] = json!([{"name": "model-cache-prep", "image": "x",
        "securityContext": {"runAsUser": 0, "runAsNonRoot": false}}]);
    let v = run(Webhook::Validate, "ns-restricted", own);
    assert!(!v.allowed());
}

/// A cluster whose PSA configuration defaults to `restricted` refuses the root prep in a
/// namespace with no label: `--pod-security-default restricted` says so, and a namespace
/// labelled with another level keeps the prep.
#[test]
fn the_pod_security_default_counts_for_namespaces_without_the_label() {
    let cfg = PolicyConfig {
        pod_security_default: crate::config::PodSecurityLevel::Restricted,
        ..PolicyConfig::default()
    };
    let mut ns = namespaces();
    let labels: BTreeMap<String, String> = [(
        POD_SECURITY_ENFORCE_LABEL.to_string(),
        "baseline".to_string(),
    )]
    .into();
    ns.set("ns-baseline", NamespaceLabels::from_labels(&labels));
    let index = CacheIndex::new();
    let a = run_in(Webhook::Mutate, "ns-plain", cache_pod(), &cfg, &ns, &index);
    let pod = patched(&cache_pod(), &a.patch);
    assert!(pod["spec"].get("initContainers").is_none(), "{pod}");
    assert_eq!(
        a.warnings(),
        [
            "namespace ns-plain enforces Pod Security restricted, which refuses the root model-cache-prep: not injected; the pod is treated as under --model-cache-prep=never"
        ]
    );
    let a = run_in(
        Webhook::Mutate,
        "ns-baseline",
        cache_pod(),
        &cfg,
        &ns,
        &index,
    );
    let pod = patched(&cache_pod(), &a.patch);
    assert_eq!(pod["spec"]["initContainers"][0]["name"], "model-cache-prep");
}

#[test]
fn in_warn_mode_a_restricted_namespace_hears_why_no_prep_would_be_injected() {
    let mut ns = namespaces();
    let labels: BTreeMap<String, String> = [
        (MODE_LABEL, "warn"),
        (POD_SECURITY_ENFORCE_LABEL, "restricted"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    ns.set("both", NamespaceLabels::from_labels(&labels));
    let a = run_in(
        Webhook::Mutate,
        "both",
        cache_pod(),
        &PolicyConfig::default(),
        &ns,
        &CacheIndex::new(),
    );
    let w = a.warnings();
    assert!(
        w.contains(&"would set spec.securityContext.runAsUser=101".to_string()),
        "{w:?}"
    );
    assert!(!w.iter().any(|w| w.starts_with("would inject")), "{w:?}");
    assert!(
        w.iter().any(|w| w.contains("Pod Security restricted")),
        "{w:?}"
    );
}

// Warnings keep the cache's name ---------------------------------------------------------------

#[test]
fn a_long_model_uri_is_shortened_so_the_cache_name_survives() {
    let long_name = format!("cache-{}", "n".repeat(90));
    let uri = format!("hf://org/{}/weights", "m".repeat(300));
    let mut index = CacheIndex::new();
    for ns in ["ns-warn", "ns-enforce"] {
        index.upsert_cache(
            CacheEntry::new(
                CacheScope::Namespace(ns.into()),
                &long_name,
                &uri,
                &["workers"],
            )
            .downloaded_on(&["n1"]),
        );
        let bound = crate::cache::PvcState::provisioned(crate::cache::PvcPhase::Bound);
        index.upsert_pvc(ns, format!("{long_name}-workers"), bound);
    }
    index.upsert_node_group("workers", None);
    index.upsert_node(
        "n1",
        [("kubernetes.io/hostname".to_string(), "n1".to_string())].into(),
    );
    let mut object = pod(json!({"containers": [{"name": "c", "image": "x"}]}));
    object["metadata"]["annotations"] = json!({"modelgate.io/model-uri": uri});
    let source = format!("LocalModelNamespaceCache ns-enforce/{long_name}");
    let a = run_in(
        Webhook::Mutate,
        "ns-enforce",
        object.clone(),
        &PolicyConfig::default(),
        &namespaces(),
        &index,
    );
    let served = a
        .warnings()
        .into_iter()
        .find(|w| w.starts_with("model "))
        .unwrap();
    assert!(served.len() <= MAX_WARNING_LEN, "{} bytes", served.len());
    assert!(
        served.ends_with(&format!(" served from {source}")),
        "{served}"
    );
    assert!(
        served.starts_with("model hf://org/mmm") && served.contains('…'),
        "{served}"
    );
    // The mount itself uses the whole URI.
    let pod = patched(&object, &a.patch);
    assert_eq!(
        pod["metadata"]["annotations"]["modelgate.io/model-cache"],
        format!("namespace/ns-enforce/{long_name}")
    );

    let a = run_in(
        Webhook::Mutate,
        "ns-warn",
        object,
        &PolicyConfig::default(),
        &namespaces(),
        &index,
    );
    let would = a
        .warnings()
        .into_iter()
        .find(|w| w.starts_with("would mount "))
        .unwrap();
    assert!(would.len() <= MAX_WARNING_LEN, "{} bytes", would.len());
    assert!(
        would.ends_with(&format!(
            " from LocalModelNamespaceCache ns-warn/{long_name}"
        )),
        "{would}"
    );
}

/// A model URI beyond the lookup limit is a miss with its own reason in every mode, and no
/// answer copies it whole: the warning and the `would …` text name it shortened, so that each
/// fits a warning whole, and the audit annotation stays as small.
#[test]
fn a_model_uri_beyond_the_lookup_limit_is_a_miss_that_no_answer_copies_whole() {
    let uri = format!("hf://org/m{}x", "/".repeat(300_000));
    let mut object = to_patch();
    object["metadata"]["annotations"] = json!({"modelgate.io/model-uri": uri});
    let mut index = CacheIndex::new();
    index.upsert_cache(CacheEntry::new(
        CacheScope::Cluster,
        "m",
        "hf://org/m",
        &["g"],
    ));
    let in_ns = |ns: &str| {
        run_in(
            Webhook::Mutate,
            ns,
            object.clone(),
            &PolicyConfig::default(),
            &namespaces(),
            &index,
        )
    };

    let a = in_ns("ns-enforce");
    assert!(a.allowed());
    let patched = testing::apply(&object, a.patch.as_deref().unwrap()).unwrap();
    assert_eq!(
        patched["metadata"]["annotations"]["modelgate.io/model-cache-reason"],
        "uri-too-long"
    );
    assert_eq!(
        a.warnings(),
        ["uri-too-long: the model URI has 300011 bytes, more than 2048: not looked up"]
    );
    assert_eq!(
        a.summary.model_cache,
        Some(crate::cache::Resolved::Miss(
            crate::cache::MissReason::UriTooLong
        ))
    );

    let a = in_ns("ns-warn");
    let would = a
        .warnings()
        .into_iter()
        .find(|w| w.starts_with("would record a model cache miss for hf://org/m/"))
        .expect("the would-be miss is a warning");
    assert!(
        would.len() <= MAX_WARNING_LEN && would.ends_with("model-cache-reason: uri-too-long)"),
        "{would}"
    );

    let a = in_ns("ns-audit");
    let facts = a.audit()["would-patch"].as_str().unwrap().to_string();
    assert!(
        facts.len() < 1024 && facts.contains("uri-too-long"),
        "{facts}"
    );
}

/// docs/policy.md §7: 45 000 containers with `runAsUser: 0` (2.8 MB) get a denial that names the first
/// 20 violations and counts the rest, in every mode and from both webhooks; warnings are at most
/// 20, the last saying how many were left out; and no answer reaches 64 KiB.
#[test]
fn what_grows_with_the_request_is_capped_in_every_answer() {
    const N: usize = 45_000;
    let containers: Vec<Value> = (0..N)
        .map(
            |i| json!({"name": format!("c{i}"), "image": "x", "securityContext": {"runAsUser": 0}}),
        )
        .collect();
    let object = pod(json!({"containers": containers}));
    let index = CacheIndex::new();
    let ctx = Context {
        config: &PolicyConfig::default(),
        caches: Caches::Ready(&index),
        namespaces: &namespaces(),
        now: None,
    };
    let more = format!("; … and {} more. ", N - 20);
    for (webhook, ns) in [
        (Webhook::Mutate, "ns-enforce"),
        (Webhook::Validate, "ns-enforce"),
        (Webhook::Mutate, "ns-warn"),
        (Webhook::Validate, "ns-warn"),
        (Webhook::Mutate, "ns-audit"),
        (Webhook::Validate, "ns-audit"),
    ] {
        let body = serde_json::to_vec(&review(ns, object.clone())).unwrap();
        assert!(body.len() > 5 << 19, "{} bytes", body.len());
        let out = super::review(webhook, &body, &ctx);
        assert!(out.body.len() < 64 << 10, "{ns}: {} bytes", out.body.len());
        let answer: Value = serde_json::from_slice(&out.body).unwrap();
        let response = &answer["response"];
        let denial = match ns {
            "ns-enforce" => response["status"]["message"].as_str(),
            "ns-audit" => response["auditAnnotations"]["would-deny"].as_str(),
            _ => None,
        };
        if let Some(denial) = denial {
            assert!(
                denial.starts_with("spec.containers[0].securityContext.runAsUser: 0 is outside"),
                "{denial}"
            );
            assert_eq!(denial.matches("spec.containers[").count(), 20, "{denial}");
            // /validate also names what mutation would have fixed: more violations, counted.
            assert!(
                denial.contains(&more)
                    || webhook == Webhook::Validate && denial.contains(" more. "),
                "{ns} {webhook:?}: {denial}"
            );
        }
        if ns == "ns-warn" {
            let warnings: Vec<&str> = response["warnings"]
                .as_array()
                .unwrap()
                .iter()
                .map(|w| w.as_str().unwrap())
                .collect();
            assert_eq!(warnings.len(), 20, "{warnings:?}");
            assert_eq!(
                warnings[0],
                "would deny: spec.containers[0].securityContext.runAsUser: 0 is outside 1..2147483647"
            );
            assert_eq!(warnings[19], format!("… and {} more warnings", N - 19));
        }
    }
}

/// Request-derived text in a schema denial is shortened: a string of 100 000 bytes where a uid
/// belongs does not come back whole.
#[test]
fn a_schema_denial_does_not_quote_the_request_whole() {
    let uid = "0".repeat(100_000);
    let object = pod(json!({"securityContext": {"runAsUser": uid}, "containers": [{"name": "c"}]}));
    let a = run(Webhook::Mutate, "ns-enforce", object);
    let message = a.response["status"]["message"].as_str().unwrap();
    assert!(
        message.starts_with(
            "spec.securityContext.runAsUser: cannot be decoded as a Pod: invalid type: string"
        ),
        "{message}"
    );
    assert!(message.len() < 1024, "{} bytes", message.len());
}

/// A model URI with a `..` segment matches a cache by its prefix, but the mount's `subPath`
/// would carry the `..` and the API server would refuse the pod: it is a miss, not a hit, and
/// the warning says why.
#[test]
fn a_model_uri_with_a_dot_dot_segment_is_a_miss_not_a_mount() {
    let mut object = to_patch();
    object["metadata"]["annotations"] =
        json!({"modelgate.io/model-uri": "hf://org/m/../../secrets"});
    let mut index = CacheIndex::new();
    index.upsert_cache(CacheEntry::new(
        CacheScope::Cluster,
        "m",
        "hf://org/m",
        &["g"],
    ));
    let a = run_in(
        Webhook::Mutate,
        "ns-enforce",
        object.clone(),
        &PolicyConfig::default(),
        &namespaces(),
        &index,
    );
    assert!(a.allowed());
    let patched = testing::apply(&object, a.patch.as_deref().unwrap()).unwrap();
    assert_eq!(
        patched["metadata"]["annotations"]["modelgate.io/model-cache-reason"],
        "uri-not-normal"
    );
    assert!(!patched.to_string().contains("subPath"), "{patched}");
    assert_eq!(
        a.warnings(),
        [
            "uri-not-normal: the model URI hf://org/m/../../secrets has an empty, '.' or '..' path \
          segment (or an encoded '/'): not looked up"
        ]
    );
}
