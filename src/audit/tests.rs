use serde_json::json;

use super::*;
use crate::config::PolicyConfig;
use crate::namespaces::{NamespaceLabels, Namespaces};
use crate::policy::Caches;

/// The built-in table, for the whole test run.
fn table() -> &'static WorkloadKinds {
    static TABLE: std::sync::OnceLock<WorkloadKinds> = std::sync::OnceLock::new();
    TABLE.get_or_init(WorkloadKinds::default)
}

fn extract(value: Value, default_ns: &str) -> Result<Extracted, String> {
    super::extract(value, default_ns, table())
}

fn target(value: Value) -> Target {
    match extract(value, "default").unwrap() {
        Extracted::Target(t) => t,
        other => panic!("{other:?}"),
    }
}

fn with_ctx<T>(namespaces: &Namespaces, f: impl FnOnce(&Context) -> T) -> T {
    let config = PolicyConfig::default().with_default_exemptions(None);
    let index = crate::cache::CacheIndex::new();
    let ctx = Context {
        config: &config,
        caches: Caches::Ready(&index),
        namespaces,
        now: None,
    };
    f(&ctx)
}

fn root_container() -> Value {
    json!({"name": "app", "image": "nginx", "securityContext": {"runAsUser": 0}})
}

#[test]
fn controllers_are_evaluated_through_the_object_they_create() {
    let d = target(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "team-a"},
        "spec": {"replicas": 3, "template": {
            "metadata": {"labels": {"app": "web"}},
            "spec": {"containers": [{"name": "a", "image": "b"}]}}}
    }));
    assert_eq!(
        (d.kind.as_str(), d.namespace.as_str(), d.name.as_str()),
        ("Deployment", "team-a", "web")
    );
    assert_eq!(
        d.parts[0].object,
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"labels": {"app": "web"}, "namespace": "team-a", "generateName": "web-"},
               "spec": {"containers": [{"name": "a", "image": "b"}]}})
    );
    let c = target(json!({
        "apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "nightly"},
        "spec": {"schedule": "@daily", "jobTemplate": {"spec": {"template": {"spec": {"containers": []}}}}}
    }));
    // A CronJob's pods come from its job template's pod template.
    assert_eq!(c.namespace, "default");
    assert_eq!(c.parts[0].object["kind"], "Pod");
    assert_eq!(c.parts[0].object["apiVersion"], "v1");
    assert_eq!(c.parts[0].object["spec"], json!({"containers": []}));
    for kind in ["StatefulSet", "DaemonSet", "ReplicaSet"] {
        let t = target(
            json!({"apiVersion": "apps/v1", "kind": kind, "metadata": {"name": "x"},
                              "spec": {"template": {"spec": {"containers": []}}}}),
        );
        assert_eq!(t.kind.as_str(), kind);
        assert_eq!(t.parts[0].object["kind"], "Pod");
    }
}

#[test]
fn owned_copies_and_other_kinds_are_not_evaluated_and_broken_templates_are_errors() {
    let owned = |kind: &str, owner: &str, api: &str| {
        extract(
            json!({"apiVersion": api, "kind": kind, "metadata": {"name": "x", "ownerReferences": [
                {"apiVersion": "v1", "kind": "Other", "name": "o", "uid": "1"},
                {"apiVersion": "v1", "kind": owner, "name": "o", "uid": "2", "controller": true}]},
                   "spec": {"template": {"spec": {"containers": []}}}}),
            "default",
        )
        .unwrap()
    };
    assert!(matches!(
        owned("ReplicaSet", "Deployment", "apps/v1"),
        Extracted::Owned(_)
    ));
    assert!(matches!(
        owned("Job", "CronJob", "batch/v1"),
        Extracted::Owned(_)
    ));
    // A Pod made by a ReplicaSet exists and runs: it is evaluated.
    assert!(matches!(
        owned("Pod", "ReplicaSet", "v1"),
        Extracted::Target(_)
    ));
    // A ReplicaSet of its own is evaluated.
    assert!(matches!(
        owned("ReplicaSet", "Other", "apps/v1"),
        Extracted::Target(_)
    ));
    for v in [
        json!({"apiVersion": "v1", "kind": "Service"}),
        json!({"apiVersion": "example.com/v1", "kind": "Deployment"}),
        json!({"kind": "Pod"}),
    ] {
        assert!(matches!(extract(v, "d").unwrap(), Extracted::NotAWorkload));
    }
    let e = extract(
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "spec": {}}),
        "d",
    )
    .unwrap_err();
    assert_eq!(e, "spec.template is missing");
    let e = extract(
        json!({"apiVersion": "batch/v1", "kind": "CronJob", "spec": {"jobTemplate": 1}}),
        "d",
    )
    .unwrap_err();
    assert_eq!(e, "spec.jobTemplate.spec.template is missing");
    let e = extract(
        json!({"apiVersion": "batch/v1", "kind": "CronJob",
               "spec": {"jobTemplate": {"spec": {"template": 1}}}}),
        "d",
    )
    .unwrap_err();
    assert_eq!(e, "spec.jobTemplate.spec.template is not an object");
}

#[test]
fn evaluation_is_enforce_and_names_fields_in_the_controllers_terms() {
    let none = Namespaces::default();
    let deploy = target(json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": "a"},
        "spec": {"template": {"spec": {"containers": [root_container()]}}}
    }));
    let e = with_ctx(&none, |ctx| evaluate(&deploy, ctx));
    assert_eq!(e.outcome, Outcome::Denied);
    assert_eq!(e.rules, vec![Rule::NonRoot]);
    let message = e.message.unwrap();
    assert!(
        message.starts_with(
            "spec.template.spec.containers[0].securityContext.runAsUser: 0 is outside"
        ),
        "{message}"
    );

    let pod = target(
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "a"},
                            "spec": {"containers": [{"name": "a", "image": "b"}]}}),
    );
    let e = with_ctx(&none, |ctx| evaluate(&pod, ctx));
    assert_eq!(e.outcome, Outcome::Patched);
    assert_eq!(e.rules, vec![Rule::NonRoot]);
    assert!(
        e.changes
            .contains(&"would set spec.securityContext.runAsNonRoot=true".to_string()),
        "{:?}",
        e.changes
    );

    // A namespace that says `off` is still evaluated as enforce once its mode is forgotten.
    let mut labelled = Namespaces::default();
    labelled.set(
        "a",
        Some(NamespaceLabels {
            mode: Some("off".into()),
            pod_security_enforce: None,
            exceptions: None,
        }),
    );
    let e = with_ctx(&labelled.without_modes(), |ctx| evaluate(&pod, ctx));
    assert_eq!(e.outcome, Outcome::Patched);

    let job = target(
        json!({"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "n", "namespace": "a"},
        "spec": {"jobTemplate": {"spec": {"template": {"spec": {
            "securityContext": {"runAsNonRoot": true, "runAsUser": 5, "runAsGroup": 5},
            "containers": [{"name": "a", "image": "b"}]}}}}}}),
    );
    let e = with_ctx(&none, |ctx| evaluate(&job, ctx));
    assert_eq!(e.outcome, Outcome::Unchanged);
    assert!(e.rules.is_empty() && e.changes.is_empty() && e.message.is_none());
}

#[test]
fn a_schema_error_is_a_denial_of_the_schema_rule() {
    let pod = target(
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "a", "image": "b", "securityContext": {"runAsUser": "0"}}]}}),
    );
    let e = with_ctx(&Namespaces::default(), |ctx| evaluate(&pod, ctx));
    assert_eq!(e.outcome, Outcome::Denied);
    assert_eq!(e.rules, vec![Rule::Schema]);
    let schema = e.results.iter().find(|r| r.rule == Rule::Schema).unwrap();
    assert_eq!(schema.status, Status::Fail);
    assert!(schema.message.contains("runAsUser"), "{}", schema.message);
}

/// An object is judged in the AdmissionReview of its creation, decoded as `serve` decodes a body:
/// a Job's denial is `serve`'s answer to that review, word for word.
#[test]
fn an_object_is_judged_as_serve_judges_the_review_of_its_creation() {
    let job = json!({"apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "j", "namespace": "team-a"},
        "spec": {"template": {"spec": {"containers": [
            {"name": "a", "image": "b", "securityContext": {"runAsUser": "0"}}]}}}});
    let t = target(job.clone());
    with_ctx(&Namespaces::default(), |ctx| {
        let e = evaluate(&t, ctx);
        assert_eq!(e.outcome, Outcome::Denied);
        let review = admission::create_review(&job, "default", "serve");
        assert_eq!(
            review["request"]["kind"],
            json!({"group": "batch", "version": "v1", "kind": "Job"})
        );
        let body = serde_json::to_vec(&review).unwrap();
        let served: Value =
            serde_json::from_slice(&admission::review(Webhook::Mutate, &body, ctx).body).unwrap();
        let message = served["response"]["status"]["message"].as_str().unwrap();
        assert!(message.contains("runAsUser"), "{message}");
        assert_eq!(e.message.as_deref(), Some(message));
    });
}

#[test]
fn report_counts_per_namespace_and_rule() {
    let none = Namespaces::default();
    let mut report = Report::new("files", true);
    let objects = [
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p1", "namespace": "a"},
               "spec": {"containers": [{"name": "a", "image": "b"}]}}),
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p2", "namespace": "a"},
               "spec": {"containers": [root_container()]}}),
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p3", "namespace": "b"},
               "spec": {"securityContext": {"runAsNonRoot": true, "runAsUser": 5, "runAsGroup": 5},
                        "containers": [{"name": "a", "image": "b"}]}}),
    ];
    with_ctx(&none, |ctx| {
        for o in objects {
            let t = target(o);
            let e = evaluate(&t, ctx);
            report.add(&t, "f.yaml", e);
        }
    });
    assert_eq!(
        report.counts,
        Counts {
            patched: 1,
            denied: 1,
            unchanged: 1
        }
    );
    assert_eq!(
        report.namespaces["a"].counts,
        Counts {
            patched: 1,
            denied: 1,
            unchanged: 0
        }
    );
    assert_eq!(
        report.namespaces["a"].rules["non-root"],
        Counts {
            patched: 1,
            denied: 1,
            unchanged: 0
        }
    );
    assert_eq!(
        report.namespaces["a"].rules["cache-prep"],
        Counts {
            patched: 0,
            denied: 0,
            unchanged: 2
        }
    );
    assert_eq!(
        report.rules["non-root"],
        Counts {
            patched: 1,
            denied: 1,
            unchanged: 1
        }
    );
    assert_eq!(report.denials.len(), 1);
    assert_eq!(report.denials[0].name, "p2");
    assert_eq!(report.denials[0].rules, vec!["non-root"]);
    assert!(!report.all_allowed());

    let table = report.table();
    assert!(
        table.contains("a          2        1        1       0"),
        "{table}"
    );
    assert!(
        table.contains("(all)      3        1        1       1"),
        "{table}"
    );
    assert!(
        table.contains("non-root (§3)     3        1        1       1"),
        "{table}"
    );
    assert!(
        table.contains("Pod a/p2 (f.yaml): spec.containers[0].securityContext.runAsUser: 0"),
        "{table}"
    );

    let suites = report.junit_suites();
    assert_eq!(suites.len(), 2);
    assert_eq!(suites[0].cases.len(), 2);
    assert!(suites[0].cases.iter().any(|c| c.failure.is_some()));

    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["namespaces"]["a"]["rules"]["non-root"]["denied"], 1);
    assert_eq!(json["patched"], 1);
    assert_eq!(json["denials"][0]["kind"], "Pod");
}

fn result(e: &Evaluation, rule: Rule) -> &RuleResult {
    e.results.iter().find(|r| r.rule == rule).unwrap()
}

#[test]
fn each_rule_gets_one_result_fail_warn_pass_or_skip() {
    let none = Namespaces::default();
    // Denied by the ranges before anything is patched: the rest is not evaluated.
    let deploy = target(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "a", "uid": "u-1"},
        "spec": {"template": {"spec": {"containers": [root_container()]}}}
    }));
    assert_eq!(deploy.uid.as_deref(), Some("u-1"));
    assert_eq!(deploy.api_version, "apps/v1");
    let e = with_ctx(&none, |ctx| evaluate(&deploy, ctx));
    let statuses: Vec<(Rule, Status)> = e.results.iter().map(|r| (r.rule, r.status)).collect();
    assert_eq!(
        statuses,
        vec![
            (Rule::NonRoot, Status::Fail),
            (Rule::CachePrep, Status::Skip),
            (Rule::ModelCache, Status::Skip),
            (Rule::Schema, Status::Skip),
            (Rule::RootEquivalent, Status::Skip),
        ]
    );
    assert_eq!(
        result(&e, Rule::NonRoot).message,
        "spec.template.spec.containers[0].securityContext.runAsUser: 0 is outside \
         1..2147483647. Use a uid in 1..2147483647, or leave runAsUser unset and modelgate sets one."
    );

    // Patched for two rules, one patch (in the CronJob's terms) on both; denied for a third
    // after the patch: a `model-cache-prep` that modelgate does not manage here (no cache
    // volume) is not its canonical one.
    let cron = target(json!({
        "apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "n", "namespace": "a"},
        "spec": {"jobTemplate": {"spec": {"template": {"spec": {
            "initContainers": [{"name": "model-cache-prep", "image": "x"}],
            "containers": [{"name": "a", "image": "b"}]}}}}}
    }));
    let e = with_ctx(&none, |ctx| evaluate(&cron, ctx));
    assert_eq!(e.outcome, Outcome::Denied);
    let prep = result(&e, Rule::CachePrep);
    assert_eq!(prep.status, Status::Fail);
    assert!(
        prep.message.starts_with(
            "spec.jobTemplate.spec.template.spec.initContainers[0]: a container named"
        ),
        "{}",
        prep.message
    );
    let non_root = result(&e, Rule::NonRoot);
    assert_eq!(non_root.status, Status::Warn);
    assert!(
        non_root.message.contains(
            "would set spec.jobTemplate.spec.template.spec.securityContext.runAsNonRoot=true"
        ),
        "{}",
        non_root.message
    );
    let patch: Value = serde_json::from_str(&non_root.properties[rules::PATCH]).unwrap();
    assert_eq!(
        patch[0]["path"],
        "/spec/jobTemplate/spec/template/spec/securityContext"
    );
    assert_eq!(result(&e, Rule::Schema).status, Status::Pass);
    assert_eq!(result(&e, Rule::ModelCache).status, Status::Skip);

    // A Pod with a writable cache volume and a model URI: the prep is injected, the miss is
    // recorded, both with their outcome.
    let pod = target(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": "a",
                     "annotations": {"modelgate.io/model-uri": "hf://org/m"}},
        "spec": {"volumes": [{"name": "model-cache", "persistentVolumeClaim": {"claimName": "c"}}],
                 "containers": [{"name": "a", "image": "b"}]}
    }));
    let e = with_ctx(&none, |ctx| evaluate(&pod, ctx));
    assert_eq!(e.outcome, Outcome::Patched);
    let prep = result(&e, Rule::CachePrep);
    assert_eq!(prep.status, Status::Warn);
    assert!(
        prep.message.contains("would inject model-cache-prep"),
        "{}",
        prep.message
    );
    let cache = result(&e, Rule::ModelCache);
    assert_eq!(cache.status, Status::Warn);
    assert_eq!(cache.properties[rules::MODEL_CACHE_OUTCOME], "miss");
    assert_eq!(cache.properties[rules::MODEL_CACHE_REASON], "no-match");
    assert_eq!(
        cache.properties[rules::PATCH],
        prep.properties[rules::PATCH]
    );

    // The same Pod once patched: nothing left to change, every rule passes, and the cache
    // outcome is still reported.
    let mut patched = pod.parts[0].object.clone();
    let ops: json_patch::Patch = serde_json::from_str(&prep.properties[rules::PATCH]).unwrap();
    json_patch::patch(&mut patched, &ops).unwrap();
    let again = target(patched);
    let e = with_ctx(&none, |ctx| evaluate(&again, ctx));
    assert_eq!(e.outcome, Outcome::Unchanged);
    assert!(
        e.results.iter().all(|r| r.status == Status::Pass),
        "{:?}",
        e.results
    );
    assert!(
        e.results
            .iter()
            .all(|r| !r.properties.contains_key(rules::PATCH)),
        "{:?}",
        e.results
    );
    assert_eq!(
        result(&e, Rule::ModelCache).properties[rules::MODEL_CACHE_OUTCOME],
        "miss"
    );
}

/// A cluster-scoped kind of the table has no namespace, whatever the default: it is counted
/// (under the empty namespace) and gets no policy report, which is namespaced.
#[test]
fn a_cluster_scoped_workload_is_counted_without_a_report() {
    let runtime = json!({
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime",
        "metadata": {"name": "torch"},
        "spec": {"template": {"spec": {"replicatedJobs": [{"name": "node", "template": {"spec": {
            "template": {"spec": {"containers": [root_container()]}}}}}]}}}
    });
    let t = target(runtime);
    assert_eq!(t.namespace, "");
    let none = Namespaces::default();
    let e = with_ctx(&none, |ctx| evaluate(&t, ctx));
    assert_eq!(e.outcome, Outcome::Denied);
    assert!(
        e.message.as_deref().unwrap().starts_with(
            "spec.template.spec.replicatedJobs[0].template.spec.template.spec.containers[0]\
             .securityContext.runAsUser: 0"
        ),
        "{:?}",
        e.message
    );
    let mut report = Report::new("files", false).keeping_results();
    report.add(&t, "f", e);
    assert_eq!(report.objects, 1);
    assert!(report.workloads.unwrap().is_empty());
}

/// The kept results of two workloads whose messages and patches are the same point at one copy
/// of each text; a different text is its own.
#[test]
fn kept_results_hold_each_distinct_text_once() {
    let deployment = |name: &str, fs_group: i64| {
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": "team-a", "uid": format!("uid-{name}")},
            "spec": {"template": {"spec": {
                "securityContext": {"runAsUser": 1000, "fsGroup": fs_group},
                "containers": [{"name": "app", "image": "nginx"}],
                "volumes": [{"name": "model-cache", "persistentVolumeClaim": {"claimName": "c"}}],
            }}}
        })
    };
    let none = Namespaces::default();
    let mut report = Report::new("files", false).keeping_results();
    for (name, fs_group) in [("a", 2000), ("b", 2000), ("c", 3000)] {
        let t = target(deployment(name, fs_group));
        let e = with_ctx(&none, |ctx| evaluate(&t, ctx));
        report.add(&t, "f", e);
    }
    let kept = report.workloads.unwrap();
    let non_root = |w: &WorkloadResults| {
        w.results
            .iter()
            .find(|r| r.rule == Rule::NonRoot)
            .unwrap()
            .clone()
    };
    let (a, b, c) = (non_root(&kept[0]), non_root(&kept[1]), non_root(&kept[2]));
    assert_eq!(a.status, Status::Warn);
    let patch = |r: &KeptResult| {
        r.properties
            .iter()
            .find(|(k, _)| *k == rules::PATCH)
            .unwrap()
            .1
            .clone()
    };
    assert!(Arc::ptr_eq(&a.message, &b.message), "{}", a.message);
    assert!(Arc::ptr_eq(&patch(&a), &patch(&b)));
    assert!(!Arc::ptr_eq(&patch(&a), &patch(&c)), "{}", patch(&c));
    assert_ne!(patch(&a), patch(&c));
    // The rules a patch concerns share it within a workload too.
    let prep = kept[0]
        .results
        .iter()
        .find(|r| r.rule == Rule::CachePrep)
        .unwrap();
    assert!(Arc::ptr_eq(&patch(&a), &patch(prep)));
}

/// `privileged: true` is the `root-equivalent` rule's `warn`, in the workload's own terms and
/// never a denial (the Deployment is otherwise left as it is); it is listed among the report's
/// warnings, not counted among what enforcing would patch or deny; a denied workload still
/// gets it; and without a privileged container the rule passes.
#[test]
fn a_privileged_container_is_a_root_equivalent_warning_never_a_denial() {
    let none = Namespaces::default();
    let deploy = target(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "net", "namespace": "a"},
        "spec": {"template": {"spec": {
            "securityContext": {"runAsNonRoot": true, "runAsUser": 1000, "runAsGroup": 1000},
            "containers": [{"name": "app", "image": "x"},
                           {"name": "vpn", "image": "y", "securityContext": {"privileged": true}}]}}}
    }));
    let e = with_ctx(&none, |ctx| evaluate(&deploy, ctx));
    assert_eq!(e.outcome, Outcome::Unchanged);
    let found = result(&e, Rule::RootEquivalent);
    assert_eq!(found.status, Status::Warn);
    assert!(
        found
            .message
            .starts_with("spec.template.spec.containers[1].securityContext.privileged: true: "),
        "{}",
        found.message
    );
    assert!(
        found.properties.is_empty(),
        "no patch: {:?}",
        found.properties
    );
    assert_eq!(result(&e, Rule::NonRoot).status, Status::Pass);

    let mut report = Report::new("files", true);
    report.add(&deploy, "f.yaml#1", e);
    assert!(report.all_allowed());
    assert_eq!(report.warnings.len(), 1);
    assert_eq!(report.warnings[0].rule, "root-equivalent");
    assert!(!report.rules.contains_key("root-equivalent"));
    let table = report.table();
    assert!(
        table.contains(
            "WARNINGS (1):\nDeployment a/net (f.yaml#1): root-equivalent: spec.template.spec.containers[1].securityContext.privileged: true: "
        ),
        "{table}"
    );
    assert!(!table.contains("root-equivalent (§6)"), "{table}");
    let suites = report.junit_suites();
    let case = &suites[0].cases[0];
    assert!(case.failure.is_none());
    assert!(
        case.output
            .as_deref()
            .is_some_and(|o| o.starts_with("root-equivalent: spec.template.spec.containers[1]")),
        "{:?}",
        case.output
    );

    // Denied by the validating pass (a prep modelgate does not manage here), and still told of
    // the privileged container.
    let denied = target(json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "a"},
        "spec": {"initContainers": [{"name": "model-cache-prep", "image": "x"}],
                 "containers": [{"name": "a", "image": "x",
                                 "securityContext": {"privileged": true}}]}
    }));
    let e = with_ctx(&none, |ctx| evaluate(&denied, ctx));
    assert_eq!(e.outcome, Outcome::Denied);
    assert_eq!(result(&e, Rule::RootEquivalent).status, Status::Warn);
    assert!(!e.message.unwrap().contains("privileged"));

    let plain = target(json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "q", "namespace": "a"},
        "spec": {"containers": [{"name": "a", "image": "x",
                                 "securityContext": {"privileged": false}}]}
    }));
    let e = with_ctx(&none, |ctx| evaluate(&plain, ctx));
    assert_eq!(result(&e, Rule::RootEquivalent).status, Status::Pass);
}

#[test]
fn a_rule_an_exception_waives_is_a_skip_that_names_it() {
    use crate::exceptions::{Exception, NAMESPACE_LABEL};
    let mut open = Namespaces::default();
    let labels = BTreeMap::from([(NAMESPACE_LABEL.to_string(), "allowed".to_string())]);
    open.set("team-a", NamespaceLabels::from_labels(&labels));
    let mut index = crate::cache::CacheIndex::new();
    index.upsert_exception(Arc::new(
        Exception::from_object(&json!({
            "metadata": {"name": "vendor-root", "namespace": "team-a"},
            "spec": {"reason": "r", "expires": "2027-01-01T00:00:00Z", "rules": ["non-root"],
                     "selector": {"matchLabels": {"app": "vendor"}}}}))
        .unwrap(),
    ));
    let config = PolicyConfig::default().with_default_exemptions(None);
    let ctx = Context {
        config: &config,
        caches: Caches::Ready(&index),
        namespaces: &open,
        now: crate::exceptions::parse_time("2026-12-01T00:00:00Z"),
    };
    // The pod already complies at pod level; its one container runs as root.
    let deploy = |app: &str| {
        target(json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "vendor", "namespace": "team-a"},
            "spec": {"template": {"metadata": {"labels": {"app": app}}, "spec": {
                "securityContext": {"runAsNonRoot": true, "runAsUser": 1000, "runAsGroup": 1000},
                "containers": [{"name": "engine", "image": "vendor",
                                "securityContext": {"runAsUser": 0, "runAsNonRoot": false}}]}}}
        }))
    };
    let e = evaluate(&deploy("vendor"), &ctx);
    let r = result(&e, Rule::NonRoot);
    assert_eq!(r.status, Status::Skip, "{r:?}");
    assert_eq!(
        r.message,
        "waived by exception vendor-root (until 2027-01-01T00:00:00Z)"
    );
    assert_eq!(
        r.properties.get(rules::EXCEPTION).map(String::as_str),
        Some("vendor-root")
    );
    // The same workload without the labels: denied, as ever.
    let e = evaluate(&deploy("other"), &ctx);
    assert_eq!(result(&e, Rule::NonRoot).status, Status::Fail);
    assert!(
        !result(&e, Rule::NonRoot)
            .properties
            .contains_key(rules::EXCEPTION)
    );
}
