//! `kubectl debug`: a Pod UPDATE of `pods/ephemeralcontainers` judges and mutates only the
//! ephemeral containers that `oldObject` lacks (docs/policy.md, "Ephemeral containers (`kubectl debug`)"); without
//! an `oldObject`, the whole pod as before. Through the entry point the server uses.

use serde_json::{Value, json};

use super::*;
use crate::cache::{CacheIndex, PvcPhase, PvcState};
use crate::config::PolicyConfig;
use crate::testing;

/// The prep image of the release that admitted the running pod.
const EARLIER_INIT_IMAGE: &str = "registry.example/curl:7.88.1";

fn caches() -> CacheIndex {
    let mut idx = CacheIndex::new();
    idx.upsert_pvc(
        "team-a",
        "llm-cache",
        PvcState::provisioned(PvcPhase::Bound),
    );
    idx
}

fn run(webhook: Webhook, review: &Value, cfg: &PolicyConfig) -> testing::Answer {
    let idx = caches();
    let answer = testing::review(webhook, review, &testing::context(cfg, &idx));
    assert_eq!(answer.http, 200, "{}", answer.body);
    answer
}

fn create(object: &Value) -> Value {
    testing::create_review("create", object, "team-a")
}

/// The review the API server sends for `kubectl debug`: `object` is the pod with the new
/// ephemeral container, `old` the stored pod (left out when `None`).
fn debug(object: &Value, old: Option<&Value>) -> Value {
    let mut request = json!({
        "uid": "debug-1",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "subResource": "ephemeralcontainers",
        "requestSubResource": "ephemeralcontainers",
        "namespace": "team-a",
        "name": "llm-server",
        "operation": "UPDATE",
        "userInfo": {"username": "alice"},
        "object": object,
    });
    if let Some(old) = old {
        request["oldObject"] = old.clone();
    }
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request})
}

/// A pod admitted by an earlier release (another `--init-image`: its prep is not canonical
/// for today's settings), with an ephemeral container added before its namespace was opted in
/// (`runAsNonRoot: false`).
fn running_pod() -> Value {
    let earlier = PolicyConfig {
        init_image: EARLIER_INIT_IMAGE.into(),
        ..PolicyConfig::default()
    };
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
    "metadata": {"name": "llm-server", "namespace": "team-a"},
    "spec": {
        "volumes": [{"name": "model-cache", "persistentVolumeClaim": {"claimName": "llm-cache"}}],
        "containers": [{"name": "main", "image": "vllm/vllm-openai:v0.6.3",
            "volumeMounts": [{"name": "model-cache", "mountPath": "/models"}]}]
    }});
    let admitted = run(Webhook::Mutate, &create(&pod), &earlier);
    assert!(admitted.allowed, "{}", admitted.message);
    let mut running = admitted.patched(&pod);
    assert_eq!(
        running["spec"]["initContainers"][0]["image"], EARLIER_INIT_IMAGE,
        "the earlier release gave it its prep: {running}"
    );
    running["spec"]["ephemeralContainers"] = json!([{"name": "old-debugger",
        "image": "busybox", "securityContext": {"runAsNonRoot": false}}]);
    running
}

/// `running` with `debugger` added to its ephemeral containers, last (as `kubectl debug`'s
/// strategic merge patch leaves it) or first.
fn with_debugger(running: &Value, debugger: Value, first: bool) -> Value {
    let mut pod = running.clone();
    let list = pod["spec"]["ephemeralContainers"].as_array_mut().unwrap();
    match first {
        true => list.insert(0, debugger),
        false => list.push(debugger),
    }
    pod
}

fn kubectl_debugger() -> Value {
    json!({"name": "debugger-7x2k", "image": "busybox:1.36", "targetContainerName": "main",
        "stdin": true, "tty": true})
}

/// The case of the rule: the stored pod's stale prep and its root debug container are not
/// judged again. `kubectl debug` as it comes (no security context of its own) needs nothing:
/// the pod's `runAsNonRoot` covers it; one that says `runAsNonRoot: false` is turned around, and
/// only it.
#[test]
fn kubectl_debug_on_a_pod_with_an_earlier_prep_and_a_root_debugger_judges_only_the_new_one() {
    let cfg = PolicyConfig::default();
    let running = running_pod();
    let object = with_debugger(&running, kubectl_debugger(), false);
    for webhook in [Webhook::Mutate, Webhook::Validate] {
        let a = run(webhook, &debug(&object, Some(&running)), &cfg);
        assert!(a.allowed, "{webhook:?}: {}", a.message);
        assert!(a.patch().is_empty(), "{webhook:?}: {:?}", a.ops);
        assert!(a.warnings.is_empty(), "{webhook:?}: {:?}", a.warnings);
    }

    let mut not_non_root = kubectl_debugger();
    not_non_root["securityContext"] = json!({"runAsNonRoot": false});
    let object = with_debugger(&running, not_non_root, false);
    let mutated = run(Webhook::Mutate, &debug(&object, Some(&running)), &cfg);
    assert!(mutated.allowed, "{}", mutated.message);
    assert_eq!(
        mutated.patch(),
        [json!({"op": "add",
            "path": "/spec/ephemeralContainers/1/securityContext/runAsNonRoot", "value": true})]
    );
    assert_eq!(
        mutated.warnings,
        ["container debugger-7x2k: runAsNonRoot false changed to true"]
    );
    let patched = mutated.patched(&object);
    let validated = run(Webhook::Validate, &debug(&patched, Some(&running)), &cfg);
    assert!(validated.allowed, "{}", validated.message);
    // A second pass (reinvocation) changes nothing.
    let again = run(Webhook::Mutate, &debug(&patched, Some(&running)), &cfg);
    assert!(again.allowed && again.patch().is_empty(), "{:?}", again.ops);
    // Unmutated, `/validate` alone names the new container only.
    let alone = run(Webhook::Validate, &debug(&object, Some(&running)), &cfg);
    assert!(!alone.allowed);
    assert_eq!(
        alone.message,
        "spec.ephemeralContainers[1].securityContext.runAsNonRoot: false is not allowed. Remove \
         runAsNonRoot: false; only modelgate's own model-cache-prep may run as root."
    );
}

/// A new container that would run as root is still denied by both webhooks, named by its
/// index.
#[test]
fn a_new_root_ephemeral_container_is_still_denied_on_an_old_pod() {
    let cfg = PolicyConfig::default();
    let running = running_pod();
    let mut root = kubectl_debugger();
    root["securityContext"] = json!({"runAsUser": 0});
    let object = with_debugger(&running, root, false);
    for webhook in [Webhook::Mutate, Webhook::Validate] {
        let a = run(webhook, &debug(&object, Some(&running)), &cfg);
        assert!(!a.allowed, "{webhook:?}");
        assert_eq!(
            a.message,
            "spec.ephemeralContainers[1].securityContext.runAsUser: 0 is outside \
             1..2147483647. Use a uid in 1..2147483647, or leave runAsUser unset and modelgate \
             sets one.",
            "{webhook:?}"
        );
    }
}

/// The API server keeps the stored ephemeral containers but not their order (an update may put
/// a new one first): a container is new by its name, never by its index. A root container put
/// ahead of the stored one is judged at its own index, and the stored one, now second, is not.
#[test]
fn a_new_container_put_before_the_stored_ones_is_judged_by_its_name() {
    let cfg = PolicyConfig::default();
    let running = running_pod();
    let mut root = kubectl_debugger();
    root["securityContext"] = json!({"runAsUser": 0});
    let object = with_debugger(&running, root, true);
    for webhook in [Webhook::Mutate, Webhook::Validate] {
        let a = run(webhook, &debug(&object, Some(&running)), &cfg);
        assert!(!a.allowed, "{webhook:?}");
        assert!(
            a.message.starts_with(
                "spec.ephemeralContainers[0].securityContext.runAsUser: 0 is outside \
                 1..2147483647. "
            ),
            "{webhook:?}: {}",
            a.message
        );
        assert!(!a.message.contains("[1]"), "{webhook:?}: {}", a.message);
    }
    let mut not_non_root = kubectl_debugger();
    not_non_root["securityContext"] = json!({"runAsNonRoot": false});
    let object = with_debugger(&running, not_non_root, true);
    let mutated = run(Webhook::Mutate, &debug(&object, Some(&running)), &cfg);
    assert!(mutated.allowed, "{}", mutated.message);
    assert_eq!(
        mutated.patch(),
        [json!({"op": "add",
            "path": "/spec/ephemeralContainers/0/securityContext/runAsNonRoot", "value": true})]
    );
    let validated = run(
        Webhook::Validate,
        &debug(&mutated.patched(&object), Some(&running)),
        &cfg,
    );
    assert!(validated.allowed, "{}", validated.message);
}

/// A new ephemeral container named `model-cache-prep` is never the canonical prep.
#[test]
fn a_new_ephemeral_container_named_model_cache_prep_is_denied() {
    let cfg = PolicyConfig::default();
    let running = running_pod();
    let mut prep = running["spec"]["initContainers"][0].clone();
    prep["securityContext"] = json!({"runAsNonRoot": true, "runAsUser": 1000});
    let object = with_debugger(&running, prep, false);
    let a = run(Webhook::Validate, &debug(&object, Some(&running)), &cfg);
    assert!(!a.allowed);
    assert!(
        a.message.starts_with(
            "spec.ephemeralContainers[1]: a container named model-cache-prep that is not \
             modelgate's canonical one for this pod. "
        ),
        "{}",
        a.message
    );
}

/// Without `oldObject` (a review written by hand) nothing tells the new containers from the
/// stored ones: the whole pod is judged and every ephemeral container mutated, as before. So
/// is it when the old object does not read as a Pod.
#[test]
fn without_an_old_object_the_whole_pod_is_judged() {
    let cfg = PolicyConfig::default();
    let running = running_pod();
    let mut not_non_root = kubectl_debugger();
    not_non_root["securityContext"] = json!({"runAsNonRoot": false});
    let object = with_debugger(&running, not_non_root, false);
    let unreadable = json!({"spec": {"ephemeralContainers": "not a list"}});
    for old in [None, Some(&unreadable)] {
        let validated = run(Webhook::Validate, &debug(&object, old), &cfg);
        assert_eq!(
            validated.message,
            "spec.initContainers[0]: a container named model-cache-prep that is not \
             modelgate's canonical one for this pod; \
             spec.initContainers[0].securityContext.runAsUser: 0 is outside 1..2147483647; \
             spec.ephemeralContainers[0].securityContext.runAsNonRoot: false is not allowed; \
             spec.ephemeralContainers[1].securityContext.runAsNonRoot: false is not allowed. \
             Remove the model-cache-prep container and let modelgate inject it, or rename your \
             container. Use a uid in 1..2147483647, or leave runAsUser unset and modelgate sets \
             one. Remove runAsNonRoot: false; only modelgate's own model-cache-prep may run as \
             root.",
            "{old:?}"
        );
        // `/mutate` repairs the ephemeral containers (the prep it would replace is not range
        // checked there) and `/validate` then refuses the stale prep.
        let mutated = run(Webhook::Mutate, &debug(&object, old), &cfg);
        assert!(mutated.allowed, "{old:?}: {}", mutated.message);
        let paths: Vec<&str> = mutated
            .patch()
            .iter()
            .map(|op| op["path"].as_str().unwrap())
            .collect();
        assert_eq!(
            paths,
            [
                "/spec/ephemeralContainers/0/securityContext/runAsNonRoot",
                "/spec/ephemeralContainers/1/securityContext/runAsNonRoot",
            ],
            "{old:?}"
        );
    }
}

/// In `warn` and `audit` the validator judges the object as `enforce`'s mutation would leave
/// it, with the same scope: nothing would be denied for the stored pod's containers.
#[test]
fn warn_and_audit_judge_the_same_containers() {
    let running = running_pod();
    let object = with_debugger(&running, kubectl_debugger(), false);
    for mode in [
        crate::namespaces::Mode::Warn,
        crate::namespaces::Mode::Audit,
    ] {
        let cfg = PolicyConfig {
            default_mode: mode,
            ..PolicyConfig::default()
        };
        let a = run(Webhook::Validate, &debug(&object, Some(&running)), &cfg);
        assert!(a.allowed, "{mode:?}");
        assert!(
            !a.warnings.iter().any(|w| w.contains("would deny")),
            "{mode:?}: {:?}",
            a.warnings
        );
        assert!(
            !a.response()["auditAnnotations"]
                .to_string()
                .contains("would-deny"),
            "{mode:?}: {}",
            a.body
        );
        let mut root = kubectl_debugger();
        root["securityContext"] = json!({"runAsUser": 0});
        let object = with_debugger(&running, root, false);
        let a = run(Webhook::Validate, &debug(&object, Some(&running)), &cfg);
        assert!(a.allowed, "{mode:?}");
        let said = format!("{:?} {}", a.warnings, a.response()["auditAnnotations"]);
        assert!(
            said.contains("spec.ephemeralContainers[1].securityContext.runAsUser: 0"),
            "{mode:?}: {said}"
        );
        assert!(!said.contains("initContainers"), "{mode:?}: {said}");
    }
}

/// The decode keeps `oldObject` for `ephemeralcontainers` (as for the main resource) and for
/// no other subresource of a Pod.
#[test]
fn the_old_object_is_kept_for_ephemeral_containers_only_among_subresources() {
    let running = running_pod();
    let object = with_debugger(&running, kubectl_debugger(), false);
    let mut review = debug(&object, Some(&running));
    for (sub, kept) in [
        (Some("ephemeralcontainers"), true),
        (None, true),
        (Some("status"), false),
        (Some("resize"), false),
    ] {
        match sub {
            Some(sub) => review["request"]["subResource"] = json!(sub),
            None => {
                review["request"]
                    .as_object_mut()
                    .unwrap()
                    .remove("subResource");
            }
        }
        let body = serde_json::to_vec(&review).unwrap();
        for request in [
            Request::from_slice(&body).unwrap(),
            Request::from_slice_with_object(&body).unwrap().0,
        ] {
            let old = request.old_object.as_deref().map(RawValue::get);
            match kept {
                true => assert_eq!(
                    old.map(|o| serde_json::from_str::<Value>(o).unwrap()),
                    Some(running.clone()),
                    "{sub:?}"
                ),
                false => assert_eq!(old, None, "{sub:?}"),
            }
        }
    }
}

/// The old object is read within the bound of one object, as the object is: one whose lists
/// pass what etcd stores for one object (no API server sends it) is counted, never decoded
/// into views, and the update is judged as without it.
#[test]
fn an_old_object_past_the_bound_of_one_object_is_judged_as_none() {
    let cfg = PolicyConfig::default();
    let running = running_pod();
    let mut not_non_root = kubectl_debugger();
    not_non_root["securityContext"] = json!({"runAsNonRoot": false});
    let object = with_debugger(&running, not_non_root, false);
    let n = view::MAX_STORED_OBJECT_BYTES / view::NAMED_ELEMENT_BYTES + 1;
    let mut huge = running.clone();
    huge["spec"]["ephemeralContainers"] =
        (0..n).map(|i| json!({"name": format!("e{i}")})).collect();
    assert!(policy::StoredEphemeral::decode(&huge.to_string()).is_none());
    let just_under = {
        let mut old = running.clone();
        old["spec"]["ephemeralContainers"] = json!([{"name": "old-debugger"}]);
        old
    };
    assert!(policy::StoredEphemeral::decode(&just_under.to_string()).is_some());
    let without = run(Webhook::Validate, &debug(&object, None), &cfg);
    let past = run(Webhook::Validate, &debug(&object, Some(&huge)), &cfg);
    assert!(!past.allowed);
    assert_eq!(past.message, without.message);
}
