//! docs/policy.md §11 through the wire: the pod templates of workload controllers are judged by
//! `/validate` as their pods will be (§3–§5 in memory, then §6), in the namespace's mode, with
//! the template's own paths; never patched; an UPDATE that leaves the template as it was is not
//! judged.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::*;
use crate::cache::{CacheEntry, CacheIndex, CacheScope};
use crate::kinds::WorkloadKinds;
use crate::namespaces::{MODE_LABEL, NamespaceLabels};
use crate::testing;

/// The workload controllers of docs/policy.md §11.
fn controllers() -> impl Iterator<Item = WorkloadKind> {
    WorkloadKind::ALL.into_iter().filter(|k| k.is_controller())
}

/// An object of `kind` whose pods get `pod_spec` (and `pod_annotations`).
fn controller(kind: WorkloadKind, pod_spec: Value, pod_annotations: Value) -> Value {
    let (group, version) = kind.group_version();
    let api_version = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    let template = json!({
        "metadata": {"labels": {"app": "llm"}, "annotations": pod_annotations},
        "spec": pod_spec,
    });
    let spec = match kind {
        WorkloadKind::CronJob => {
            json!({"schedule": "@daily", "jobTemplate": {"spec": {"template": template}}})
        }
        _ => {
            json!({"replicas": 2, "selector": {"matchLabels": {"app": "llm"}}, "template": template})
        }
    };
    json!({"apiVersion": api_version, "kind": kind.as_str(),
           "metadata": {"name": "llm"}, "spec": spec})
}

fn review(
    kind: WorkloadKind,
    operation: &str,
    ns: &str,
    object: &Value,
    old: Option<&Value>,
) -> Value {
    // The API server writes the request's namespace into the object.
    let mut object = object.clone();
    object["metadata"]["namespace"] = json!(ns);
    let object = &object;
    let (group, version) = kind.group_version();
    let mut request = json!({
        "uid": "u-1",
        "kind": {"group": group, "version": version, "kind": kind.as_str()},
        "resource": {"group": group, "version": version, "resource": "x"},
        "namespace": ns, "operation": operation, "userInfo": {"username": "alice"},
        "object": object,
    });
    if let Some(old) = old {
        request["oldObject"] = old.clone();
    }
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request})
}

/// `team-a` without a label (enforce), and `ns-<mode>` for each mode.
fn namespaces() -> Namespaces {
    let mut ns = Namespaces::default();
    for mode in Mode::ALL {
        let labels: BTreeMap<String, String> =
            [(MODE_LABEL.to_string(), mode.as_str().to_string())].into();
        ns.set(&format!("ns-{mode}"), NamespaceLabels::from_labels(&labels));
    }
    ns
}

fn call(webhook: Webhook, review: &Value, index: &CacheIndex) -> testing::Answer {
    let cfg = PolicyConfig::default();
    let namespaces = namespaces();
    let ctx = Context {
        namespaces: &namespaces,
        now: None,
        ..testing::context(&cfg, index)
    };
    testing::review(webhook, review, &ctx)
}

fn root_uid() -> Value {
    json!({"containers": [{"name": "server", "image": "vllm", "securityContext": {"runAsUser": 0}}]})
}

fn plain() -> Value {
    json!({"containers": [{"name": "server", "image": "vllm"}]})
}

/// The path of the first container's runAsUser in the controller's own terms.
fn run_as_user_path(kind: WorkloadKind) -> String {
    let entry = WorkloadKinds::defaults();
    let (group, version) = kind.group_version();
    let template = &entry.find(group, version, kind.as_str()).unwrap().templates[0].path;
    format!("{template}.spec.containers[0].securityContext.runAsUser")
}

#[test]
fn a_template_whose_pods_would_be_denied_is_denied_with_its_own_path_and_never_patched() {
    let index = CacheIndex::new();
    for kind in controllers() {
        let object = controller(kind, root_uid(), json!({}));
        let validated = call(
            Webhook::Validate,
            &review(kind, "CREATE", "team-a", &object, None),
            &index,
        );
        assert!(!validated.allowed, "{kind:?}");
        let expected = format!("{}: 0 is outside 1..2147483647", run_as_user_path(kind));
        assert!(
            validated.message.contains(&expected),
            "{kind:?}: {}",
            validated.message
        );
        assert!(validated.ops.is_none());

        // /mutate (not registered for controllers) never patches one, and has nothing to say.
        let mutated = call(
            Webhook::Mutate,
            &review(kind, "CREATE", "team-a", &object, None),
            &index,
        );
        assert!(mutated.allowed && mutated.ops.is_none(), "{kind:?}");
        assert!(
            mutated.warnings.is_empty(),
            "{kind:?}: {:?}",
            mutated.warnings
        );
    }
}

#[test]
fn a_template_the_mutation_would_fix_is_allowed_as_its_pods_will_be() {
    let index = CacheIndex::new();
    // No user at all, and a container saying runAsNonRoot: false: the pods get a uid and true.
    let spec = json!({"containers": [
        {"name": "server", "image": "vllm", "securityContext": {"runAsNonRoot": false}}
    ]});
    for kind in controllers() {
        let object = controller(kind, spec.clone(), json!({}));
        let a = call(
            Webhook::Validate,
            &review(kind, "CREATE", "team-a", &object, None),
            &index,
        );
        assert!(a.allowed, "{kind:?}: {}", a.message);
        assert!(a.ops.is_none() && a.warnings.is_empty(), "{kind:?}");
    }
}

#[test]
fn an_update_that_leaves_the_template_as_it_was_is_not_judged() {
    let index = CacheIndex::new();
    for kind in controllers() {
        // A template that would be denied today (say, admitted before modelgate was installed).
        let old = controller(kind, root_uid(), json!({}));
        let mut scaled = old.clone();
        scaled["metadata"]["labels"] = json!({"tier": "gold"});
        if kind != WorkloadKind::CronJob {
            scaled["spec"]["replicas"] = json!(5);
        } else {
            scaled["spec"]["schedule"] = json!("@hourly");
        }
        scaled["status"] = json!({"replicas": 5});
        let a = call(
            Webhook::Validate,
            &review(kind, "UPDATE", "team-a", &scaled, Some(&old)),
            &index,
        );
        assert!(a.allowed, "{kind:?}: {}", a.message);
        assert!(a.warnings.is_empty() && a.ops.is_none(), "{kind:?}");

        // The same template with its keys in another order is the same template.
        let text = serde_json::to_string(&scaled).unwrap();
        let reordered: Value = serde_json::from_str(&text).unwrap();
        let a = call(
            Webhook::Validate,
            &review(kind, "UPDATE", "team-a", &reordered, Some(&old)),
            &index,
        );
        assert!(a.allowed, "{kind:?}");

        // A changed template is judged like a new one.
        let changed = controller(kind, root_uid(), json!({"rollout": "2"}));
        let a = call(
            Webhook::Validate,
            &review(kind, "UPDATE", "team-a", &changed, Some(&old)),
            &index,
        );
        assert!(!a.allowed, "{kind:?}");
        assert!(a.message.contains(&run_as_user_path(kind)), "{}", a.message);
    }
    // An UPDATE without the old object to compare with is judged.
    let object = controller(WorkloadKind::Deployment, root_uid(), json!({}));
    let a = call(
        Webhook::Validate,
        &review(WorkloadKind::Deployment, "UPDATE", "team-a", &object, None),
        &index,
    );
    assert!(!a.allowed);
    // Other operations and subresources are not judged.
    for (op, sub) in [
        ("DELETE", None),
        ("UPDATE", Some("scale")),
        ("UPDATE", Some("status")),
    ] {
        let mut r = review(WorkloadKind::Deployment, op, "team-a", &object, None);
        if let Some(sub) = sub {
            r["request"]["subResource"] = json!(sub);
        }
        assert!(call(Webhook::Validate, &r, &index).allowed, "{op} {sub:?}");
    }
}

#[test]
fn the_namespaces_mode_decides_as_for_pods() {
    let index = CacheIndex::new();
    let kind = WorkloadKind::Deployment;
    let object = controller(kind, root_uid(), json!({}));
    let answer = |ns: &str| {
        call(
            Webhook::Validate,
            &review(kind, "CREATE", ns, &object, None),
            &index,
        )
    };
    let path = run_as_user_path(kind);

    assert!(!answer("ns-enforce").allowed);

    let warn = answer("ns-warn");
    assert!(warn.allowed && warn.ops.is_none());
    assert_eq!(
        warn.warnings,
        [format!("would deny: {path}: 0 is outside 1..2147483647")]
    );

    let audit = answer("ns-audit");
    assert!(audit.allowed && audit.warnings.is_empty());
    let would_deny = audit.body["response"]["auditAnnotations"]["would-deny"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(would_deny.contains(&path), "{would_deny}");

    let off = answer("ns-off");
    assert!(off.allowed && off.warnings.is_empty());
    assert!(off.body["response"].get("auditAnnotations").is_none());
}

/// The model cache index of the tests: `hf://org/m` cached cluster-wide on node group `gpu`,
/// downloaded on n1; the PVC exists in `team-b` only.
fn caches() -> CacheIndex {
    use crate::cache::{PvcPhase, PvcState};
    let mut index = CacheIndex::new();
    index.upsert_cache(
        CacheEntry::new(CacheScope::Cluster, "llama", "hf://org/m", &["gpu"])
            .downloaded_on(&["n1"]),
    );
    index.upsert_node_group("gpu", None);
    index.upsert_node(
        "n1",
        [("kubernetes.io/hostname".to_string(), "n1".to_string())].into(),
    );
    let bound = PvcState::provisioned(PvcPhase::Bound);
    index.upsert_pvc("team-b", "llama-gpu", bound);
    index
}

#[test]
fn a_template_whose_pods_would_miss_a_matching_cache_gets_one_warning() {
    let index = caches();
    let model = json!({"modelgate.io/model-uri": "hf://org/m"});
    for kind in controllers() {
        // team-a has no PVC for the cache: the pods would download the model.
        let object = controller(kind, plain(), model.clone());
        let a = call(
            Webhook::Validate,
            &review(kind, "CREATE", "team-a", &object, None),
            &index,
        );
        assert!(a.allowed, "{kind:?}: {}", a.message);
        assert_eq!(
            a.warnings,
            [
                "pvc-missing: LocalModelCache llama matches hf://org/m but PVC team-a/llama-gpu does not exist"
            ],
            "{kind:?}"
        );
        assert!(a.ops.is_none());

        // In team-b the pods would hit: nothing to say. A URI no cache matches: nothing either.
        for (ns, annotations) in [
            ("team-b", model.clone()),
            (
                "team-a",
                json!({"modelgate.io/model-uri": "hf://other/model"}),
            ),
            (
                "team-a",
                json!({"modelgate.io/model-uri": "hf://org/m", "modelgate.io/disable-model-cache": ""}),
            ),
        ] {
            let object = controller(kind, plain(), annotations.clone());
            let a = call(
                Webhook::Validate,
                &review(kind, "CREATE", ns, &object, None),
                &index,
            );
            assert!(
                a.allowed && a.warnings.is_empty(),
                "{kind:?} {ns} {annotations}: {:?}",
                a.warnings
            );
        }
    }
}

#[test]
fn an_object_that_is_not_its_kind_is_denied_with_the_field_named() {
    let index = CacheIndex::new();
    let mut object = controller(WorkloadKind::CronJob, plain(), json!({}));
    object["spec"]["jobTemplate"]["spec"]["template"]["spec"]["securityContext"] =
        json!({"runAsUser": "0"});
    let a = call(
        Webhook::Validate,
        &review(WorkloadKind::CronJob, "CREATE", "team-a", &object, None),
        &index,
    );
    assert!(!a.allowed);
    assert!(
        a.message
            .contains("spec.jobTemplate.spec.template.spec.securityContext.runAsUser"),
        "{}",
        a.message
    );
    let missing = json!({"apiVersion": "apps/v1", "kind": "Deployment", "spec": {"replicas": 1}});
    let a = call(
        Webhook::Validate,
        &review(WorkloadKind::Deployment, "CREATE", "team-a", &missing, None),
        &index,
    );
    // An absent template is skipped, as for every kind of the table (docs/policy.md §12): the API
    // server refuses a Deployment without one anyway.
    assert!(a.allowed, "{}", a.message);
    let not_a_template = json!({"apiVersion": "apps/v1", "kind": "Deployment",
                                "spec": {"template": {"spec": {"containers": "x"}}}});
    let a = call(
        Webhook::Validate,
        &review(
            WorkloadKind::Deployment,
            "CREATE",
            "team-a",
            &not_a_template,
            None,
        ),
        &index,
    );
    assert!(!a.allowed);
    assert!(
        a.message
            .contains("spec.template.spec.containers: cannot be decoded as a Deployment"),
        "{}",
        a.message
    );
}

#[test]
fn a_template_reviewed_before_the_caches_are_synced_is_warned_once() {
    let index = caches();
    let cfg = PolicyConfig::default();
    let namespaces = namespaces();
    let ctx = Context {
        caches: Caches::NotSynced(&index),
        namespaces: &namespaces,
        now: None,
        ..testing::context(&cfg, &index)
    };
    let kind = WorkloadKind::Deployment;
    let object = controller(
        kind,
        plain(),
        json!({"modelgate.io/model-uri": "hf://org/m"}),
    );
    let a = testing::review(
        Webhook::Validate,
        &review(kind, "CREATE", "team-b", &object, None),
        &ctx,
    );
    assert!(a.allowed, "{}", a.message);
    assert_eq!(
        a.warnings,
        ["model caches are not synced yet: model cache lookup treated as a miss (not-synced)"]
    );
}

#[test]
fn a_pods_admission_never_parses_the_body_again_for_the_objects_text() {
    // Only a controller's UPDATE compares templates; finding the object's text again costs a
    // second parse of the whole body, which a Pod's admission must never pay.
    let parses = || super::decode::RAW_OBJECT_PARSES.with(std::cell::Cell::get);
    let index = CacheIndex::new();
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                     "spec": {"securityContext": {"runAsNonRoot": true},
                              "containers": [{"name": "a", "image": "b"}]}});
    let body = review(WorkloadKind::Pod, "CREATE", "team-a", &pod, None);
    let before = parses();
    for webhook in [Webhook::Mutate, Webhook::Validate] {
        assert!(call(webhook, &body, &index).allowed);
    }
    assert_eq!(parses(), before, "a Pod's admission parsed the body again");
    // The count is live: a parse is counted.
    let text = serde_json::to_vec(&body).unwrap();
    assert!(super::decode::raw_object(&text).is_some());
    assert_eq!(parses(), before + 1);
}

/// A template whose pods' patch would pass what the API server can store is denied as those
/// pods are, naming the template's spec; in `warn` mode its pods are not patched, so nothing is
/// said of the size.
#[test]
fn a_template_whose_pods_patch_would_be_too_large_is_denied_as_its_pods_are() {
    let index = CacheIndex::new();
    let containers: Vec<Value> = (0..20_000)
        .map(|i| json!({"name": format!("c{i}"), "image": "x", "securityContext": {"runAsNonRoot": false}}))
        .collect();
    let object = controller(
        WorkloadKind::Deployment,
        json!({"containers": containers}),
        json!({}),
    );
    let enforced = call(
        Webhook::Validate,
        &review(WorkloadKind::Deployment, "CREATE", "team-a", &object, None),
        &index,
    );
    assert!(!enforced.allowed);
    assert!(
        enforced.message.starts_with(
            "spec.template.spec: the pod is too large for the changes modelgate must make: their \
             patch is "
        ),
        "{}",
        enforced.message
    );
    let warned = call(
        Webhook::Validate,
        &review(WorkloadKind::Deployment, "CREATE", "ns-warn", &object, None),
        &index,
    );
    assert!(warned.allowed);
    assert!(
        !warned.warnings.iter().any(|w| w.contains("too large")),
        "{:?}",
        warned.warnings
    );
}
