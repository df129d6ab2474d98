//! Exceptions granted through RBAC (docs/exceptions.md), through the wire: what a
//! `ModelgateException` waives, for whom, where and until when, and the hostile cases.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Value, json};

use super::*;
use crate::cache::CacheIndex;
use crate::exceptions::{Exception, NAMESPACE_LABEL, parse_time};
use crate::namespaces::NamespaceLabels;
use crate::testing;

const VENDOR: &str = "registry.example/vendor@sha256:abc";
const NOW: &str = "2026-12-01T00:00:00Z";

fn exception(namespace: &str, name: &str, spec: Value) -> Arc<Exception> {
    Arc::new(
        Exception::from_object(&json!({
            "apiVersion": "modelgate.io/v1alpha1", "kind": "ModelgateException",
            "metadata": {"name": name, "namespace": namespace,
                         "creationTimestamp": "2026-11-20T00:00:00Z"},
            "spec": spec,
        }))
        .unwrap(),
    )
}

fn vendor_root(namespace: &str) -> Arc<Exception> {
    exception(
        namespace,
        "vendor-root",
        json!({"reason": "vendor image runs as root until 2.0",
               "expires": "2027-01-01T00:00:00Z", "rules": ["non-root"],
               "selector": {"matchLabels": {"app": "vendor"}},
               "containers": ["vendor"], "images": [VENDOR]}),
    )
}

/// `team-a` and `team-b` open for exceptions, `closed` not; one exception in each.
fn setup() -> (CacheIndex, Namespaces) {
    let mut index = CacheIndex::new();
    for ns in ["team-a", "team-b", "closed"] {
        if ns != "team-b" {
            index.upsert_exception(vendor_root(ns));
        }
    }
    index.upsert_exception(exception(
        "team-a",
        "no-prep",
        json!({"reason": "r", "expires": "2027-01-01T00:00:00Z", "rules": ["cache-prep"],
               "selector": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["loader"]}]}}),
    ));
    let mut namespaces = Namespaces::default();
    for ns in ["team-a", "team-b"] {
        let labels = BTreeMap::from([(NAMESPACE_LABEL.to_string(), "allowed".to_string())]);
        namespaces.set(ns, NamespaceLabels::from_labels(&labels));
    }
    (index, namespaces)
}

fn root_pod(namespace: &str, labels: Value, image: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "p", "namespace": namespace, "labels": labels},
           "spec": {"containers": [
               {"name": "vendor", "image": image,
                "securityContext": {"runAsUser": 0, "runAsNonRoot": false}},
               {"name": "sidecar", "image": "registry.example/sidecar:1"}]}})
}

struct Run {
    index: CacheIndex,
    namespaces: Namespaces,
    config: PolicyConfig,
    now: Option<i64>,
}

impl Run {
    fn new() -> Self {
        let (index, namespaces) = setup();
        Run {
            index,
            namespaces,
            config: PolicyConfig::default(),
            now: parse_time(NOW),
        }
    }

    fn at(mut self, now: &str) -> Self {
        self.now = parse_time(now);
        self
    }

    fn ctx(&self) -> Context<'_> {
        Context {
            config: &self.config,
            caches: Caches::Ready(&self.index),
            namespaces: &self.namespaces,
            now: self.now,
        }
    }

    /// `/mutate`, then `/validate` of what it patched, as the API server runs them.
    fn admit(&self, object: &Value) -> (testing::Answer, testing::Answer) {
        let ns = object["metadata"]["namespace"].as_str().unwrap();
        let ctx = self.ctx();
        let m = testing::review(
            Webhook::Mutate,
            &testing::create_review("u", object, ns),
            &ctx,
        );
        let patched = m.patched(object);
        let v = testing::review(
            Webhook::Validate,
            &testing::create_review("u", &patched, ns),
            &ctx,
        );
        (m, v)
    }
}

fn annotation(a: &testing::Answer) -> Option<String> {
    a.response()["auditAnnotations"]["exception"]
        .as_str()
        .map(str::to_string)
}

#[test]
fn an_exception_lets_its_container_run_as_root_and_says_so() {
    let run = Run::new();
    let (m, v) = run.admit(&root_pod("team-a", json!({"app": "vendor"}), VENDOR));
    assert!(m.allowed && v.allowed, "{} / {}", m.message, v.message);
    // The vendor container keeps its own security context; the pod and the sidecar are forced.
    assert!(
        !m.patch().iter().any(|op| op["path"]
            .as_str()
            .unwrap()
            .starts_with("/spec/containers/0")),
        "{:?}",
        m.patch()
    );
    assert!(
        m.patch()
            .iter()
            .any(|op| op["path"] == "/spec/securityContext")
    );
    for a in [&m, &v] {
        assert_eq!(annotation(a).as_deref(), Some("vendor-root"));
        assert!(
            a.warnings.contains(
                &"exception vendor-root waives non-root until 2027-01-01T00:00:00Z".to_string()
            ),
            "{:?}",
            a.warnings
        );
    }
    // The sidecar is not covered: uid 0 there is still refused.
    let mut pod = root_pod("team-a", json!({"app": "vendor"}), VENDOR);
    pod["spec"]["containers"][1]["securityContext"] = json!({"runAsUser": 0});
    let (m, _) = run.admit(&pod);
    assert!(!m.allowed);
    assert!(
        m.message
            .starts_with("spec.containers[1].securityContext.runAsUser: 0 is outside"),
        "{}",
        m.message
    );
}

fn refused(run: &Run, pod: &Value) -> String {
    let (m, v) = run.admit(pod);
    assert!(!(m.allowed && v.allowed), "admitted: {pod}");
    assert_eq!(annotation(&m), None);
    if m.allowed { v.message } else { m.message }
}

#[test]
fn hostile_pods_and_exceptions_get_nothing() {
    let run = Run::new();
    // Copies the labels but runs another image.
    let m = refused(
        &run,
        &root_pod(
            "team-a",
            json!({"app": "vendor"}),
            "registry.example/vendor:latest",
        ),
    );
    assert!(
        m.contains("spec.containers[0].securityContext.runAsUser: 0"),
        "{m}"
    );
    // Same image, other labels.
    refused(&run, &root_pod("team-a", json!({"app": "other"}), VENDOR));
    // No labels at all.
    refused(&run, &root_pod("team-a", json!({}), VENDOR));
    // team-b is open, but its only exception would be team-a's: exceptions never cross.
    refused(&run, &root_pod("team-b", json!({"app": "vendor"}), VENDOR));
    // A namespace not open for exceptions: the exception there is inert.
    refused(&run, &root_pod("closed", json!({"app": "vendor"}), VENDOR));
}

#[test]
fn an_exception_is_honoured_until_expires_exactly_and_needs_a_clock() {
    let pod = root_pod("team-a", json!({"app": "vendor"}), VENDOR);
    let (m, v) = Run::new().at("2027-01-01T00:00:00Z").admit(&pod);
    assert!(m.allowed && v.allowed);
    refused(&Run::new().at("2027-01-01T00:00:01Z"), &pod);
    let mut run = Run::new();
    run.now = None;
    refused(&run, &pod);
}

#[test]
fn an_exception_that_outlives_its_limit_is_never_honoured() {
    let mut run = Run::new();
    run.config.max_exception_days = 30;
    // Created 2026-11-20, expiring 2027-01-01: 42 days, more than 30.
    refused(&run, &root_pod("team-a", json!({"app": "vendor"}), VENDOR));
}

#[test]
fn a_broad_selector_never_matches_even_when_stored() {
    let mut run = Run::new();
    let mut index = CacheIndex::new();
    // What the CRD and /validate refuse, had it been stored while neither ran: the index
    // refuses it too.
    let broad = Exception::from_object(&json!({
        "metadata": {"name": "all", "namespace": "team-a"},
        "spec": {"reason": "r", "expires": "2027-01-01T00:00:00Z", "rules": ["non-root"],
                 "selector": {"matchExpressions": [{"key": "app", "operator": "Exists"}]}}}));
    assert!(
        broad
            .unwrap_err()
            .starts_with("spec.selector: pins no label")
    );
    index.upsert_exception(vendor_root("team-b"));
    run.index = index;
    refused(&run, &root_pod("team-a", json!({"app": "vendor"}), VENDOR));
}

fn cache_pod(labels: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "p", "namespace": "team-a", "labels": labels},
           "spec": {"containers": [{"name": "c", "image": "x",
                                    "volumeMounts": [{"name": "model-cache", "mountPath": "/models"}]}],
                    "volumes": [{"name": "model-cache", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}}]}})
}

#[test]
fn a_cache_prep_exception_skips_the_prep_but_never_admits_a_fake_one() {
    let run = Run::new();
    let (m, _) = run.admit(&cache_pod(json!({"app": "other"})));
    assert!(
        m.patch()
            .iter()
            .any(|op| op["path"] == "/spec/initContainers"),
        "{:?}",
        m.patch()
    );
    let (m, v) = run.admit(&cache_pod(json!({"app": "loader"})));
    assert!(m.allowed && v.allowed, "{}", v.message);
    assert!(
        !m.patch().iter().any(|op| op["path"]
            .as_str()
            .unwrap()
            .starts_with("/spec/initContainers")),
        "{:?}",
        m.patch()
    );
    assert_eq!(annotation(&m).as_deref(), Some("no-prep"));
    assert!(
        m.warnings
            .iter()
            .any(|w| w.starts_with("exception no-prep waives the cache-prep rule")),
        "{:?}",
        m.warnings
    );
    let mut fake = cache_pod(json!({"app": "loader"}));
    fake["spec"]["initContainers"] = json!([{"name": "model-cache-prep", "image": "x",
        "securityContext": {"runAsUser": 0, "runAsNonRoot": false}}]);
    let (_, v) = run.admit(&fake);
    assert!(!v.allowed);
    assert!(
        v.message.contains("not modelgate's canonical one"),
        "{}",
        v.message
    );
}

#[test]
fn a_controller_template_gets_the_exception_its_pods_will_get() {
    let run = Run::new();
    let template = root_pod("team-a", json!({"app": "vendor"}), VENDOR);
    let deployment = |labels: Value| {
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
               "metadata": {"name": "d", "namespace": "team-a"},
               "spec": {"template": {"metadata": {"labels": labels}, "spec": template["spec"]}}})
    };
    let ctx = run.ctx();
    let ok = testing::review(
        Webhook::Validate,
        &testing::create_review("u", &deployment(json!({"app": "vendor"})), "team-a"),
        &ctx,
    );
    assert!(ok.allowed, "{}", ok.message);
    assert_eq!(annotation(&ok).as_deref(), Some("vendor-root"));
    let no = testing::review(
        Webhook::Validate,
        &testing::create_review("u", &deployment(json!({"app": "copy"})), "team-a"),
        &ctx,
    );
    assert!(!no.allowed);
    assert!(
        no.message
            .starts_with("spec.template.spec.containers[0].securityContext.runAsUser: 0"),
        "{}",
        no.message
    );
}

fn exception_review(spec: Value) -> Value {
    testing::create_review(
        "u",
        &json!({"apiVersion": "modelgate.io/v1alpha1", "kind": "ModelgateException",
                "metadata": {"name": "x", "namespace": "team-a"}, "spec": spec}),
        "team-a",
    )
}

#[test]
fn validate_refuses_an_exception_object_naming_its_fields() {
    let run = Run::new();
    let ctx = run.ctx();
    let a = testing::review(
        Webhook::Validate,
        &exception_review(json!({"expires": "2027-12-01T00:00:00Z", "rules": ["root"],
                                 "selector": {}})),
        &ctx,
    );
    assert!(!a.allowed);
    for field in [
        "spec.reason",
        "spec.rules[0]",
        "spec.selector",
        "spec.expires",
    ] {
        assert!(
            a.message.contains(&format!("{field}: ")),
            "{field}: {}",
            a.message
        );
    }
    let a = testing::review(
        Webhook::Validate,
        &exception_review(json!({"reason": "r", "expires": "2027-01-01T00:00:00Z",
                                 "rules": ["non-root"],
                                 "selector": {"matchLabels": {"app": "vendor"}}})),
        &ctx,
    );
    assert!(a.allowed, "{}", a.message);
    assert_eq!(a.warnings.len(), 1, "{:?}", a.warnings);
    assert!(a.warnings[0].starts_with("spec.images is not set"));
    // /mutate leaves the object alone.
    let m = testing::review(Webhook::Mutate, &exception_review(json!({})), &ctx);
    assert!(m.allowed && m.patch().is_empty() && m.warnings.is_empty());
}
