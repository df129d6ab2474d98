//! docs/policy.md §12 through the wire, for what the fixtures of `tests/ml_kinds.rs` do not vary: the
//! namespace's mode, a cache miss named by several templates, a partial template in every mode,
//! an object that is not its kind.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::*;
use crate::cache::{CacheEntry, CacheIndex, CacheScope};
use crate::kinds::split_api_version;
use crate::namespaces::{MODE_LABEL, NamespaceLabels};
use crate::testing;

fn review(object: &Value, ns: &str) -> Value {
    let (group, version) = split_api_version(object["apiVersion"].as_str().unwrap());
    let mut object = object.clone();
    object["metadata"]["namespace"] = json!(ns);
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u", "kind": {"group": group, "version": version, "kind": object["kind"]},
        "resource": {"group": group, "version": version, "resource": "x"},
        "namespace": ns, "operation": "CREATE", "userInfo": {"username": "alice"},
        "object": object}})
}

fn call(webhook: Webhook, review: &Value, index: &CacheIndex) -> testing::Answer {
    let cfg = PolicyConfig::default();
    let mut namespaces = Namespaces::default();
    for mode in Mode::ALL {
        let labels: BTreeMap<String, String> =
            [(MODE_LABEL.to_string(), mode.as_str().to_string())].into();
        namespaces.set(&format!("ns-{mode}"), NamespaceLabels::from_labels(&labels));
    }
    let ctx = Context {
        namespaces: &namespaces,
        now: None,
        ..testing::context(&cfg, index)
    };
    testing::review(webhook, review, &ctx)
}

fn template(spec: Value, annotations: Value) -> Value {
    json!({"metadata": {"annotations": annotations}, "spec": spec})
}

fn ray(head: Value, workers: &[Value]) -> Value {
    let groups: Vec<Value> = workers
        .iter()
        .enumerate()
        .map(|(i, t)| json!({"groupName": format!("g{i}"), "replicas": 1, "rayStartParams": {}, "template": t}))
        .collect();
    json!({"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "rc"},
           "spec": {"headGroupSpec": {"rayStartParams": {}, "template": head}, "workerGroupSpecs": groups}})
}

fn plain() -> Value {
    json!({"containers": [{"name": "ray", "image": "rayproject/ray"}]})
}

fn root() -> Value {
    json!({"containers": [{"name": "ray", "image": "rayproject/ray", "securityContext": {"runAsUser": 0}}]})
}

const ROOT_WORKER: &str = "spec.workerGroupSpecs[1].template.spec.containers[0].securityContext.runAsUser: 0 is outside 1..2147483647";

#[test]
fn a_denied_template_is_answered_in_the_namespaces_mode() {
    let index = CacheIndex::new();
    let object = ray(
        template(plain(), json!({})),
        &[template(plain(), json!({})), template(root(), json!({}))],
    );
    let enforce = call(Webhook::Validate, &review(&object, "team-a"), &index);
    assert!(
        !enforce.allowed && enforce.message.starts_with(ROOT_WORKER),
        "{}",
        enforce.message
    );

    let warn = call(Webhook::Validate, &review(&object, "ns-warn"), &index);
    assert!(warn.allowed);
    assert_eq!(warn.warnings, [format!("would deny: {ROOT_WORKER}")]);

    let audit = call(Webhook::Validate, &review(&object, "ns-audit"), &index);
    assert!(audit.allowed && audit.warnings.is_empty());
    let annotations = &audit.response()["auditAnnotations"];
    assert!(
        annotations["would-deny"]
            .as_str()
            .unwrap()
            .starts_with(ROOT_WORKER),
        "{annotations}"
    );

    let off = call(Webhook::Validate, &review(&object, "ns-off"), &index);
    assert!(off.allowed && off.warnings.is_empty());
    for answer in [&enforce, &warn, &audit, &off] {
        assert!(answer.ops.is_none());
    }
}

#[test]
fn templates_that_would_miss_the_same_cache_give_one_warning() {
    let mut index = CacheIndex::new();
    index.upsert_cache(
        CacheEntry::new(CacheScope::Cluster, "llama", "hf://org/m", &["gpu"])
            .downloaded_on(&["n1"]),
    );
    index.upsert_node_group("gpu", None);
    let model = json!({"modelgate.io/model-uri": "hf://org/m"});
    let object = ray(
        template(plain(), model.clone()),
        &[template(plain(), model.clone()), template(plain(), model)],
    );
    let a = call(Webhook::Validate, &review(&object, "team-a"), &index);
    assert!(a.allowed, "{}", a.message);
    assert_eq!(
        a.warnings,
        [
            "pvc-missing: LocalModelCache llama matches hf://org/m but PVC team-a/llama-gpu does not exist"
        ]
    );
}

#[test]
fn a_partial_template_warns_in_enforce_and_warn_and_never_denies() {
    let index = CacheIndex::new();
    let isvc = json!({"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService",
        "metadata": {"name": "m"},
        "spec": {"predictor": {"securityContext": {"runAsNonRoot": false},
                               "containers": [{"name": "kserve-container", "image": "x",
                                               "securityContext": {"runAsUser": 0}}]},
                 "explainer": {"containers": [{"name": "e", "image": "y"}]}}});
    let findings = [
        "spec.predictor.securityContext.runAsNonRoot: false is not allowed",
        "spec.predictor.containers[0].securityContext.runAsUser: 0 is outside 1..2147483647",
    ];
    for ns in ["team-a", "ns-warn"] {
        let a = call(Webhook::Validate, &review(&isvc, ns), &index);
        assert!(a.allowed, "{ns}: {}", a.message);
        assert_eq!(a.warnings.len(), 2, "{ns}: {:?}", a.warnings);
        for (w, f) in a.warnings.iter().zip(findings) {
            assert!(
                w.starts_with(f) && w.contains("(a partial template"),
                "{ns}: {w}"
            );
        }
    }
    for ns in ["ns-audit", "ns-off"] {
        let a = call(Webhook::Validate, &review(&isvc, ns), &index);
        assert!(a.allowed && a.warnings.is_empty(), "{ns}: {:?}", a.warnings);
    }
    // What a partial template leaves out (here: every runAsNonRoot) is never a finding.
    let quiet = json!({"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService",
        "metadata": {"name": "m"}, "spec": {"predictor": {"containers": [{"name": "c", "image": "x"}]}}});
    let a = call(Webhook::Validate, &review(&quiet, "team-a"), &index);
    assert!(a.allowed && a.warnings.is_empty(), "{:?}", a.warnings);
}

#[test]
fn an_object_that_is_not_its_kind_or_not_an_object_is_denied_naming_the_field() {
    let index = CacheIndex::new();
    let mut object = ray(template(plain(), json!({})), &[]);
    object["kind"] = json!("RayJob");
    let mut r = review(&object, "team-a");
    r["request"]["kind"]["kind"] = json!("RayCluster");
    let a = call(Webhook::Validate, &r, &index);
    assert!(!a.allowed);
    assert!(
        a.message.starts_with(
            "request.object.kind: the object is a RayJob, but the request is for a RayCluster"
        ),
        "{}",
        a.message
    );
    let bad = ray(
        template(json!({"containers": [{"name": 7}]}), json!({})),
        &[],
    );
    let a = call(Webhook::Validate, &review(&bad, "team-a"), &index);
    assert!(!a.allowed);
    assert!(
        a.message.starts_with(
            "spec.headGroupSpec.template.spec.containers[0].name: cannot be decoded as a RayCluster"
        ),
        "{}",
        a.message
    );
    // Scalars or nulls where a path goes find nothing: nothing to judge.
    for spec in [
        json!({"headGroupSpec": null, "workerGroupSpecs": 3}),
        json!({"workerGroupSpecs": [null, 1, {"template": null}]}),
    ] {
        let object = json!({"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "rc"}, "spec": spec});
        let a = call(Webhook::Validate, &review(&object, "team-a"), &index);
        assert!(a.allowed && a.warnings.is_empty(), "{}", a.message);
    }
}
