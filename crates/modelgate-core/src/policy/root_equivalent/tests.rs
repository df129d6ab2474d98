//! `privileged: true` is warned of by `/validate`, on every container list, by its field path;
//! never denied, never by `/mutate`, and bounded.

use serde_json::{Value, json};

use super::*;
use crate::admission::Webhook;
use crate::cache::CacheIndex;
use crate::config::PolicyConfig;
use crate::namespaces::{MODE_LABEL, Mode, NamespaceLabels, Namespaces};
use crate::policy::{Caches, MAX_WARNING_LEN};
use crate::testing;

fn privileged(name: &str) -> Value {
    json!({"name": name, "image": "x", "securityContext": {"privileged": true}})
}

fn pod(spec: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "p", "namespace": "team-a"},
           "spec": spec})
}

/// A pod `/mutate` already ran on: only the privileged containers are left to say anything of.
fn mutated(mut spec: Value) -> Value {
    spec["securityContext"] = json!({"runAsNonRoot": true, "runAsUser": 1000, "runAsGroup": 1000});
    pod(spec)
}

fn answer(webhook: Webhook, object: &Value, namespaces: &Namespaces) -> testing::Answer {
    let cfg = PolicyConfig::default();
    let index = CacheIndex::new();
    let ctx = crate::admission::Context {
        config: &cfg,
        caches: Caches::Ready(&index),
        namespaces,
        now: None,
    };
    let review = testing::create_review("uid-1", object, "team-a");
    testing::review(webhook, &review, &ctx)
}

fn validate(object: &Value) -> testing::Answer {
    answer(Webhook::Validate, object, Namespaces::none())
}

#[test]
fn validate_warns_of_each_privileged_container_by_its_field_and_allows() {
    let object = mutated(json!({
        "initContainers": [{"name": "i", "image": "x"}, privileged("net-setup")],
        "containers": [{"name": "a", "image": "x",
                        "securityContext": {"privileged": false}}, privileged("b")],
    }));
    let a = validate(&object);
    assert!(a.allowed, "{}", a.message);
    assert_eq!(
        a.warnings,
        [
            format!("spec.initContainers[1].securityContext.privileged: {PROBLEM}"),
            format!("spec.containers[1].securityContext.privileged: {PROBLEM}"),
        ]
    );
    assert!(PROBLEM.starts_with("true: "));
}

#[test]
fn mutate_does_not_warn_of_it() {
    let object = mutated(json!({"containers": [privileged("b")]}));
    let a = answer(Webhook::Mutate, &object, Namespaces::none());
    assert!(a.allowed);
    assert!(
        !a.warnings.iter().any(|w| w.contains("privileged")),
        "{:?}",
        a.warnings
    );
}

#[test]
fn a_job_names_the_templates_field() {
    let job = json!({"apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "j", "namespace": "team-a"},
        "spec": {"template": {"spec": {
            "securityContext": {"runAsNonRoot": true, "runAsUser": 1000, "runAsGroup": 1000},
            "restartPolicy": "Never",
            "containers": [{"name": "a", "image": "x"}, privileged("b")]}}}});
    let a = validate(&job);
    assert!(a.allowed, "{}", a.message);
    assert_eq!(
        a.warnings,
        [format!(
            "spec.template.spec.containers[1].securityContext.privileged: {PROBLEM}"
        )]
    );
}

#[test]
fn a_denied_pod_still_hears_it_and_reports_get_it() {
    let object = pod(json!({"containers": [
        {"name": "a", "image": "x", "securityContext": {"runAsUser": 0, "privileged": true}}]}));
    let a = validate(&object);
    assert!(!a.allowed);
    assert!(
        a.warnings
            .iter()
            .any(|w| w.starts_with("spec.containers[0].securityContext.privileged: true")),
        "{:?}",
        a.warnings
    );
    assert!(
        !a.message.contains("privileged"),
        "never a denial: {}",
        a.message
    );
}

#[test]
fn an_ephemeral_update_looks_at_the_ephemeral_containers_only() {
    // A privileged debugger added earlier is stored; this update adds another.
    let debugger = |name: &str| {
        json!({"name": name, "image": "busybox",
               "securityContext": {"privileged": true, "runAsNonRoot": true}})
    };
    let mut object = mutated(json!({"containers": [privileged("old")]}));
    object["spec"]["ephemeralContainers"] = json!([debugger("earlier"), debugger("debugger")]);
    let mut old = object.clone();
    old["spec"]["ephemeralContainers"] = json!([debugger("earlier")]);
    let mut review = testing::create_review("uid-1", &object, "team-a");
    review["request"]["operation"] = json!("UPDATE");
    review["request"]["subResource"] = json!("ephemeralcontainers");
    review["request"]["oldObject"] = old;
    let cfg = PolicyConfig::default();
    let index = CacheIndex::new();
    let a = testing::review(Webhook::Validate, &review, &testing::context(&cfg, &index));
    assert!(a.allowed, "{}", a.message);
    assert_eq!(
        a.warnings,
        [format!(
            "spec.ephemeralContainers[1].securityContext.privileged: {PROBLEM}"
        )]
    );
}

#[test]
fn the_modes_show_it_as_they_show_warnings() {
    let object = mutated(json!({"containers": [privileged("b")]}));
    for (mode, shown) in [
        (Mode::Enforce, true),
        (Mode::Warn, true),
        (Mode::Audit, false),
        (Mode::Off, false),
    ] {
        let mut namespaces = Namespaces::default();
        let labels = [(MODE_LABEL.to_string(), mode.as_str().to_string())];
        namespaces.set(
            "team-a",
            NamespaceLabels::from_labels(labels.iter().map(|(k, v)| (k, v))),
        );
        let a = answer(Webhook::Validate, &object, &namespaces);
        assert!(a.allowed);
        assert_eq!(
            a.warnings.iter().any(|w| w.contains("privileged")),
            shown,
            "{mode:?}: {:?}",
            a.warnings
        );
    }
}

#[test]
fn many_privileged_containers_give_twenty_warnings_at_most() {
    let containers: Vec<Value> = (0..5000).map(|i| privileged(&format!("c{i}"))).collect();
    let object = mutated(json!({"containers": containers}));
    let a = validate(&object);
    assert!(a.allowed, "{}", a.message);
    assert_eq!(a.warnings.len(), MAX_LISTED);
    assert!(
        a.warnings.last().unwrap().starts_with("… and "),
        "{:?}",
        a.warnings.last()
    );
    for w in &a.warnings {
        assert!(w.len() <= MAX_WARNING_LEN, "{w}");
    }
}

#[test]
fn the_findings_keep_twenty_and_count_the_rest() {
    let containers: Vec<Value> = (0..25).map(|i| privileged(&format!("c{i}"))).collect();
    let object = mutated(json!({"containers": containers}));
    let cfg = PolicyConfig::default();
    let index = CacheIndex::new();
    let bytes = serde_json::to_vec(&testing::create_review("uid-1", &object, "team-a")).unwrap();
    let request = crate::admission::Request::from_slice(&bytes).unwrap();
    let decision =
        crate::admission::decide(Webhook::Validate, &request, &testing::context(&cfg, &index));
    let found = decision.findings;
    assert_eq!((found.listed.len(), found.more), (MAX_LISTED, 5));
    assert!(found.listed.iter().all(|v| v.rule == Rule::RootEquivalent));
    let warnings: Vec<String> = found.warnings().collect();
    assert_eq!(warnings.len(), MAX_LISTED + 1);
    assert_eq!(
        warnings[MAX_LISTED],
        "… and 5 more containers with securityContext.privileged: true"
    );
    let message = found.message(|f| format!("x.{f}"));
    assert!(
        message.starts_with("x.spec.containers[0].securityContext.privileged: true: "),
        "{message}"
    );
    assert!(
        message.contains("; … and 5 more. Drop privileged"),
        "{message}"
    );
}

#[test]
fn the_longest_field_still_fits_a_warning() {
    let field = "spec.template.spec.ephemeralContainers[1000000].securityContext.privileged";
    assert!(field.len() + 2 + PROBLEM.len() <= MAX_WARNING_LEN);
}
