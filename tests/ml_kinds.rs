//! docs/policy.md §12 end to end: the ML workload custom resources of `tests/fixtures/ml-kinds` (one or
//! more objects of every default kind of the workload-kind table, each saying the answer it must
//! get in its `modelgate.test/expect` annotation) through the webhook pipeline in process and
//! through `modelgate review`; `--workload-kinds` adding a kind and refusing a malformed entry;
//! `audit --from-cluster` listing only the kinds the cluster serves.

#[path = "support/audit.rs"]
mod audit_support;
#[path = "common/cli.rs"]
mod cli;
mod support;

use std::path::PathBuf;

use cli::{assert_exit, fixture, modelgate_env, review};
use modelgate::admission::{Context, Webhook};
use modelgate::cache::CacheIndex;
use modelgate::config::PolicyConfig;
use modelgate::documents::read_documents;
use modelgate_core::testing::{self, Answer, create_review};
use serde_json::{Value, json};
use support::fake_apiserver::FakeApiServer;

const EXPECT: &str = "modelgate.test/expect";

/// What an object must get, as its annotation says.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Expect {
    Allowed,
    /// Denied, naming this field.
    Denied(String),
    /// Allowed with a warning naming this field (a partial template).
    Warned(String),
}

fn expectation(object: &Value) -> Expect {
    let text = object["metadata"]["annotations"][EXPECT]
        .as_str()
        .unwrap_or_else(|| panic!("no {EXPECT}: {object}"));
    match text.split_once(' ') {
        None if text == "allowed" => Expect::Allowed,
        Some(("denied", path)) => Expect::Denied(path.to_string()),
        Some(("warned", path)) => Expect::Warned(path.to_string()),
        _ => panic!("{EXPECT}: {text}"),
    }
}

fn fixture_files() -> Vec<PathBuf> {
    let dir = PathBuf::from(fixture("ml-kinds"));
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
}

/// Every fixture object: (file, object).
fn fixtures() -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for path in fixture_files() {
        let text = std::fs::read_to_string(&path).unwrap();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        for d in read_documents(&name, &text).unwrap() {
            out.push((name.clone(), d.value));
        }
    }
    out
}

fn call(webhook: Webhook, review: &Value, cfg: &PolicyConfig) -> Answer {
    let index = CacheIndex::new();
    let ctx: Context = testing::context(cfg, &index);
    testing::review(webhook, review, &ctx)
}

fn check(label: &str, expect: &Expect, validated: &Answer, mutated: &Answer) {
    // Never patched, and the mutating webhook (not registered for these kinds) says nothing.
    assert!(mutated.allowed && mutated.ops.is_none(), "{label}: /mutate");
    assert!(
        mutated.warnings.is_empty(),
        "{label}: {:?}",
        mutated.warnings
    );
    assert!(validated.ops.is_none(), "{label}: /validate patched");
    match expect {
        Expect::Allowed => {
            assert!(validated.allowed, "{label}: {}", validated.message);
            assert!(
                validated.warnings.is_empty(),
                "{label}: {:?}",
                validated.warnings
            );
        }
        Expect::Denied(path) => {
            assert!(!validated.allowed, "{label}: allowed");
            assert!(
                validated.message.starts_with(&format!("{path}: "))
                    || validated.message.contains(&format!("; {path}: ")),
                "{label}: the denial does not name {path}: {}",
                validated.message
            );
        }
        Expect::Warned(path) => {
            assert!(validated.allowed, "{label}: {}", validated.message);
            assert!(
                validated
                    .warnings
                    .iter()
                    .any(|w| w.starts_with(&format!("{path}: "))
                        && w.contains("(a partial template")),
                "{label}: no warning names {path}: {:?}",
                validated.warnings
            );
        }
    }
}

/// Every default kind is in the fixtures, with at least one object allowed and one denied (or
/// warned, for a partial kind), so a kind cannot drop out of the table unnoticed.
#[test]
fn the_fixtures_cover_every_default_kind() {
    let table = modelgate::kinds::WorkloadKinds::defaults();
    let objects = fixtures();
    for row in table.entries().iter().skip(6) {
        let of_kind: Vec<Expect> = objects
            .iter()
            .filter(|(_, o)| {
                table.find_api_version(
                    o["apiVersion"].as_str().unwrap(),
                    o["kind"].as_str().unwrap(),
                ) == Some(row)
            })
            .map(|(_, o)| expectation(o))
            .collect();
        assert!(!of_kind.is_empty(), "no fixture of {}", row.display());
    }
    for want in [
        "RayCluster",
        "PyTorchJob",
        "LeaderWorkerSet",
        "InferenceService",
    ] {
        let kinds: Vec<Expect> = objects
            .iter()
            .filter(|(_, o)| o["kind"] == want)
            .map(|(_, o)| expectation(o))
            .collect();
        assert!(kinds.contains(&Expect::Allowed), "{want}: {kinds:?}");
        assert!(
            kinds.iter().any(|e| !matches!(e, Expect::Allowed)),
            "{want}: {kinds:?}"
        );
    }
}

/// Through `modelgate_core::admission::review`, as `serve` answers: CREATE judged as each
/// template's pods will be, every finding named by its own path; an UPDATE that leaves every
/// template as it was is allowed untouched, one that changes a template judged again.
#[test]
fn each_fixture_gets_its_answer_from_the_webhook_pipeline() {
    let cfg = PolicyConfig::default();
    for (file, object) in fixtures() {
        let label = format!("{file} {} {}", object["kind"], object["metadata"]["name"]);
        let expect = expectation(&object);
        let review = create_review("u", &object, "default");
        let validated = call(Webhook::Validate, &review, &cfg);
        let mutated = call(Webhook::Mutate, &review, &cfg);
        check(&label, &expect, &validated, &mutated);

        // A label on the resource itself: no template changed, nothing judged.
        let mut update = review.clone();
        let mut changed = object.clone();
        changed["metadata"]["labels"] = json!({"team": "b"});
        update["request"]["operation"] = json!("UPDATE");
        update["request"]["object"] = changed;
        update["request"]["oldObject"] = object.clone();
        let answer = call(Webhook::Validate, &update, &cfg);
        assert!(answer.allowed, "{label}: an unchanged UPDATE was judged");
        assert!(answer.warnings.is_empty(), "{label}: {:?}", answer.warnings);

        // Against an old object without templates, every template is new: judged as on CREATE.
        let mut old = object.clone();
        old["spec"] = json!({});
        update["request"]["object"] = object.clone();
        update["request"]["oldObject"] = old;
        let answer = call(Webhook::Validate, &update, &cfg);
        check(&format!("{label} (UPDATE)"), &expect, &answer, &mutated);
    }
}

/// The same objects through the real binary: one line each, exit 1 (some are denied).
#[test]
fn review_judges_every_fixture() {
    let files: Vec<String> = fixture_files()
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let args: Vec<&str> = files.iter().map(String::as_str).collect();
    let run = review(&args);
    assert_exit(&run, 1);
    let output = format!("{}{}", run.stdout, run.stderr);
    for (_, object) in fixtures() {
        // A cluster-scoped object is reviewed in the default namespace.
        let who = format!(
            "{} {}/{}",
            object["kind"].as_str().unwrap(),
            object["metadata"]["namespace"]
                .as_str()
                .unwrap_or("default"),
            object["metadata"]["name"].as_str().unwrap()
        );
        let line = output
            .lines()
            .find(|l| l.contains(&format!(": {who}: ")))
            .unwrap_or_else(|| panic!("no line for {who}:\n{output}"));
        match expectation(&object) {
            Expect::Allowed => assert!(
                line.contains(&format!("{who}: allowed, 0 patch operations"))
                    && !line.contains("warnings"),
                "{line}"
            ),
            Expect::Denied(path) => assert!(
                line.contains(&format!("{who}: denied: ")) && line.contains(&format!("{path}: ")),
                "{line}"
            ),
            Expect::Warned(path) => assert!(
                line.contains(&format!("{who}: allowed")) && line.contains(&format!("{path}: ")),
                "{line}"
            ),
        }
    }
}

const CLONESET: &str = "
- group: apps.kruise.io
  versions: [v1alpha1]
  kind: CloneSet
  plural: clonesets
  templates:
    - path: spec.template
";

/// A kind added by `--workload-kinds` (an OpenKruise CloneSet) is judged like a Deployment;
/// without the file it is a kind modelgate does not handle.
#[test]
fn a_kind_added_by_workload_kinds_is_judged() {
    let dir = tempfile::tempdir().unwrap();
    let kinds = dir.path().join("kinds.yaml");
    std::fs::write(&kinds, CLONESET).unwrap();
    let object = dir.path().join("cloneset.yaml");
    std::fs::write(
        &object,
        "apiVersion: apps.kruise.io/v1alpha1\nkind: CloneSet\nmetadata: {name: web, namespace: a}\n\
         spec:\n  replicas: 2\n  template:\n    spec:\n      containers:\n      - name: web\n        \
         image: nginx\n        securityContext: {runAsUser: 0}\n",
    )
    .unwrap();
    let (kinds, object) = (kinds.to_str().unwrap(), object.to_str().unwrap());
    let run = review(&["--workload-kinds", kinds, object]);
    assert_exit(&run, 1);
    assert!(
        run.stdout
            .contains("spec.template.spec.containers[0].securityContext.runAsUser: 0 is outside"),
        "{}",
        run.stdout
    );
    let run = modelgate_env(
        &["review", object],
        &[("MODELGATE_WORKLOAD_KINDS", kinds)],
        None,
    );
    assert_exit(&run, 1);
    let run = review(&[object]);
    assert_exit(&run, 0);
    assert!(run.stdout.contains("does not handle"), "{}", run.stdout);
}

/// A malformed entry stops `serve`, `review` and `audit` before anything else (exit 2), the
/// message naming the file, the entry and the field.
#[test]
fn a_malformed_workload_kind_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let entry = "- group: g.io\n  versions: [v1]\n  kind: K\n  plural: ks\n";
    let cases = [
        (
            format!("{entry}  templates: [{{path: spec.template, shape: Pod}}]"),
            "entry 1 (g.io/K): templates[0].shape: unknown variant `Pod`",
        ),
        (
            format!("{CLONESET}{entry}  templates: [{{path: \"spec.tasks[0].template\"}}]"),
            "entry 2 (g.io/K): templates[0].path: `spec.tasks[0].template`",
        ),
        (
            entry.to_string(),
            "entry 1 (g.io/K): templates: no template path",
        ),
        (
            format!("{entry}  templates: [{{path: spec.template, completeness: total}}]"),
            "entry 1 (g.io/K): templates[0].completeness: unknown variant `total`",
        ),
    ];
    for (i, (text, want)) in cases.iter().enumerate() {
        let path = dir.path().join(format!("bad-{i}.yaml"));
        std::fs::write(&path, text).unwrap();
        let path = path.to_str().unwrap();
        for args in [
            vec!["review", "--workload-kinds", path, "-"],
            vec!["audit", "--workload-kinds", path, "-"],
            vec!["serve", "--workload-kinds", path],
        ] {
            let run = modelgate_env(&args, &[], Some(""));
            assert_exit(&run, 2);
            assert!(
                run.stderr.contains("--workload-kinds") && run.stderr.contains(path),
                "{args:?}: {}",
                run.stderr
            );
            assert!(run.stderr.contains(want), "{args:?}: {}", run.stderr);
        }
    }
}

/// `audit --from-cluster` lists the kinds the cluster's discovery serves, names the others in
/// one line, and reports scope the custom resource itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_from_cluster_lists_only_the_kinds_the_cluster_serves() {
    let api = FakeApiServer::start(&[]).await;
    api.serve_workload_kind("rayclusters");
    for (_, object) in fixtures() {
        if object["kind"] == "RayCluster" {
            api.add_workload("rayclusters", object);
        }
    }
    let run = audit_support::audit_cluster(&api, &["-o", "json"]).await;
    assert_exit(&run, 1);
    let report: Value = serde_json::from_str(&run.stdout).unwrap();
    let skipped: Vec<&str> = report["notes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .filter(|n| n.starts_with("kinds this cluster does not serve, skipped: "))
        .collect();
    assert_eq!(skipped.len(), 1, "{}", report["notes"]);
    assert!(
        skipped[0].contains("leaderworkerset.x-k8s.io/LeaderWorkerSet")
            && skipped[0].contains("serving.kserve.io/InferenceService")
            && !skipped[0].contains("RayCluster")
            && !skipped[0].contains("apps/Deployment"),
        "{}",
        skipped[0]
    );
    assert_eq!(report["objects"], 2, "{report}");
    let denials = report["denials"].as_array().unwrap();
    assert_eq!(denials.len(), 1, "{report}");
    assert_eq!(denials[0]["kind"], "RayCluster");
    assert!(
        denials[0]["message"].as_str().unwrap().contains(
            "spec.workerGroupSpecs[1].template.spec.containers[0].securityContext.runAsUser: 0"
        ),
        "{}",
        denials[0]
    );
    assert!(
        api.workload_lists()
            .iter()
            .all(|l| l.plural != "leaderworkersets"),
        "an unserved kind was listed"
    );
    assert!(
        api.discovery_requests()
            .iter()
            .any(|p| p == "/apis/ray.io/v1")
    );

    // The report is about the RayCluster itself, not a pod of it.
    let run = audit_support::audit_cluster(&api, &["-o", "openreports"]).await;
    let reports = read_documents("reports", &run.stdout).unwrap();
    let ray: Vec<&Value> = reports
        .iter()
        .map(|d| &d.value)
        .filter(|r| r["scope"]["kind"] == "RayCluster")
        .collect();
    assert_eq!(ray.len(), 2, "{}", run.stdout);
    for r in ray {
        assert_eq!(r["scope"]["apiVersion"], "ray.io/v1");
        assert_eq!(r["metadata"]["namespace"], "team-a");
    }
}

/// The real server (`serve --dev`, with a `--workload-kinds` file) answers the API server's
/// reviews of these kinds as the pipeline does: a RayCluster whose second worker group runs as
/// root denied naming that path, a partial InferenceService warned, a kind of the file judged.
#[test]
fn the_server_judges_these_kinds_over_https() {
    use std::io::{BufRead, BufReader};

    let dir = tempfile::tempdir().unwrap();
    let kinds = dir.path().join("kinds.yaml");
    std::fs::write(&kinds, CLONESET).unwrap();
    let mut cmd = cli::command(&[
        "serve",
        "--dev",
        "--workload-kinds",
        kinds.to_str().unwrap(),
    ]);
    cmd.current_dir(dir.path())
        .env("MODELGATE_LISTEN", "127.0.0.1:0")
        .env("MODELGATE_PROBE_LISTEN", "127.0.0.1:0")
        .env("MODELGATE_SHUTDOWN_GRACE", "1s")
        .stderr(std::process::Stdio::null());
    let mut child = cmd.spawn().unwrap();
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let stdout = child.stdout.take().unwrap();
    let child = Kill(child);
    // Read on to the end, so that the server never writes into a closed pipe.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(rest) = line.split("serving ").nth(1) {
                let _ = tx.send(rest.split_whitespace().next().map(str::to_string));
            }
        }
    });
    let url = rx
        .recv_timeout(std::time::Duration::from_secs(60))
        .ok()
        .flatten();
    let url = url.expect("serve --dev prints where it serves");
    let send = |name: &str, review: &Value| -> Value {
        let body = dir.path().join(format!("{name}.json"));
        std::fs::write(&body, review.to_string()).unwrap();
        let out = std::process::Command::new("curl")
            .current_dir(dir.path())
            .args(["-sS", "--fail-with-body", "--cacert", "certs/ca.crt"])
            .args(["-H", "Content-Type: application/json", "--data-binary"])
            .arg(format!("@{}", body.display()))
            .arg(format!("{url}/validate"))
            .output()
            .expect("curl runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<Value>(&out.stdout).unwrap()["response"].clone()
    };
    let object = |name: &str| {
        fixtures()
            .into_iter()
            .map(|(_, o)| o)
            .find(|o| o["metadata"]["name"] == name)
            .unwrap()
    };
    let ray = send(
        "ray",
        &create_review("u-ray", &object("raycluster-root-worker"), "default"),
    );
    assert_eq!(ray["allowed"], false, "{ray}");
    assert!(
        ray["status"]["message"].as_str().unwrap().starts_with(
            "spec.workerGroupSpecs[1].template.spec.containers[0].securityContext.runAsUser: 0"
        ),
        "{ray}"
    );
    assert!(ray.get("patch").is_none(), "{ray}");
    let isvc = send(
        "isvc",
        &create_review("u-isvc", &object("sklearn-iris-root"), "default"),
    );
    assert_eq!(isvc["allowed"], true, "{isvc}");
    assert!(
        isvc["warnings"][0]
            .as_str()
            .unwrap()
            .starts_with("spec.predictor.containers[0].securityContext.runAsUser: 0"),
        "{isvc}"
    );
    let clone = json!({"apiVersion": "apps.kruise.io/v1alpha1", "kind": "CloneSet",
        "metadata": {"name": "web", "namespace": "a"},
        "spec": {"template": {"spec": {"securityContext": {"runAsUser": 0}, "containers": [{"name": "c", "image": "x"}]}}}});
    let clone = send("clone", &create_review("u-clone", &clone, "default"));
    assert_eq!(clone["allowed"], false, "{clone}");
    drop(child);
}

// ---------------------------------------------------------------------------------------------
// Property: a complete template is judged as the pod its controller makes from it.
// ---------------------------------------------------------------------------------------------

use proptest::prelude::*;

fn id() -> impl Strategy<Value = Option<i64>> {
    prop_oneof![3 => Just(None), 1 => Just(Some(-1)), 2 => Just(Some(0)), 2 => Just(Some(1000)), 1 => Just(Some(2147483648))]
}

fn non_root() -> impl Strategy<Value = Option<bool>> {
    prop_oneof![3 => Just(None), 1 => Just(Some(true)), 1 => Just(Some(false))]
}

fn security_context() -> impl Strategy<Value = Option<Value>> {
    (any::<bool>(), id(), id(), non_root()).prop_map(|(present, uid, gid, non_root)| {
        present.then(|| {
            let mut sc = serde_json::Map::new();
            for (key, value) in [
                ("runAsUser", uid.map(Value::from)),
                ("runAsGroup", gid.map(Value::from)),
                ("runAsNonRoot", non_root.map(Value::from)),
            ] {
                if let Some(v) = value {
                    sc.insert(key.into(), v);
                }
            }
            Value::Object(sc)
        })
    })
}

/// A pod spec: a pod security context and one to three containers, each perhaps with its own.
fn pod_spec() -> impl Strategy<Value = Value> {
    (
        security_context(),
        prop::collection::vec(security_context(), 1..4),
    )
        .prop_map(|(pod, cs)| {
            let containers: Vec<Value> = cs
                .into_iter()
                .enumerate()
                .map(|(i, sc)| {
                    let mut c = json!({"name": format!("c{i}"), "image": "registry.example/app:1"});
                    if let Some(sc) = sc {
                        c["securityContext"] = sc;
                    }
                    c
                })
                .collect();
            let mut spec = json!({"containers": containers});
            if let Some(sc) = pod {
                spec["securityContext"] = sc;
            }
            spec
        })
}

/// The allowed fixtures of kinds whose templates are all complete: the skeletons a generated
/// pod spec is put into.
fn skeletons() -> Vec<Value> {
    let table = modelgate::kinds::WorkloadKinds::defaults();
    fixtures()
        .into_iter()
        .map(|(_, o)| o)
        .filter(|o| expectation(o) == Expect::Allowed)
        .filter(|o| {
            table
                .find_api_version(
                    o["apiVersion"].as_str().unwrap(),
                    o["kind"].as_str().unwrap(),
                )
                .is_some_and(|row| !row.is_partial())
        })
        .collect()
}

/// `message` with each field of the pod's spec (`spec.…` at the start of a violation) renamed
/// to the template's (`<template>.spec.…`).
fn in_template_terms(message: &str, template: &str) -> String {
    let mut out = String::new();
    for (i, part) in message.split("; ").enumerate() {
        if i > 0 {
            out.push_str("; ");
        }
        match part.strip_prefix("spec.") {
            Some(rest) => out.push_str(&format!("{template}.spec.{rest}")),
            None => out.push_str(part),
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, failure_persistence: None, ..ProptestConfig::default() })]

    /// For every complete kind and any template of it, `/validate` of the object gives what
    /// `/mutate` then `/validate` give the Pod made from that template, in the same namespace:
    /// allowed alike, and denied with the same violations, named by the template's path.
    #[test]
    fn a_complete_template_is_judged_as_its_pod(
        which in 0usize..64,
        position in 0usize..64,
        spec in pod_spec(),
    ) {
        let cfg = PolicyConfig::default();
        let table = modelgate::kinds::WorkloadKinds::defaults();
        let skeletons = skeletons();
        let mut object = skeletons[which % skeletons.len()].clone();
        let row = table
            .find_api_version(object["apiVersion"].as_str().unwrap(), object["kind"].as_str().unwrap())
            .unwrap()
            .clone();
        let text = object.to_string();
        let templates = modelgate::admission::templates_of(&row, &text).unwrap();
        let at = &templates[position % templates.len()];
        let (path, pointer) = (at.path.clone(), at.pointer.clone());
        object.pointer_mut(&pointer).unwrap()["spec"] = spec.clone();
        let template = object.pointer(&pointer).unwrap().clone();

        let validated = call(Webhook::Validate, &create_review("u", &object, "default"), &cfg);

        let mut metadata = template.get("metadata").cloned().unwrap_or(json!({}));
        metadata["namespace"] = object["metadata"]["namespace"].clone();
        metadata["generateName"] = json!("pod-");
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec});
        let review = create_review("p", &pod, "default");
        let mutated = call(Webhook::Mutate, &review, &cfg);
        let pods = if mutated.allowed {
            let mut patched_review = review.clone();
            patched_review["request"]["object"] = mutated.patched(&pod);
            call(Webhook::Validate, &patched_review, &cfg)
        } else {
            mutated
        };
        prop_assert_eq!(validated.allowed, pods.allowed, "{} at {}: {} / {}", object["kind"], path, validated.message, pods.message);
        if !pods.allowed {
            prop_assert_eq!(&validated.message, &in_template_terms(&pods.message, &path));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The requests the API server would send for these kinds, for the Go API-server harness.
// ---------------------------------------------------------------------------------------------

#[path = "support/kube_apiserver_cel.rs"]
mod kube_apiserver_cel;

use kube_apiserver_cel::{AdmissionRequest, Case, Decision, UserInfo};

/// Where the Go harness (`scripts/check-apiserver.sh`, run after `cargo test`) reads them.
const ML_REQUESTS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/target/apiserver/ml-kinds-requests.json"
);

const CONTROLLERS_HOOK: &str = "validate-controllers.modelgate.io";

/// The `matchConditions` of the controllers' webhook as installed (the kustomize base, which
/// the asset tests check is the chart's rendering).
fn installed_match_conditions() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/manifests/base/webhooks.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    let hook = read_documents(path, &text)
        .unwrap()
        .into_iter()
        .filter(|d| d.value["kind"] == "ValidatingWebhookConfiguration")
        .flat_map(|d| d.value["webhooks"].as_array().cloned().unwrap_or_default())
        .find(|h| h["name"] == CONTROLLERS_HOOK)
        .unwrap_or_else(|| panic!("{path}: no {CONTROLLERS_HOOK}"));
    hook["matchConditions"].clone()
}

/// The API server's rule, evaluated by kube-apiserver's own CEL (every version of
/// `support/kube_apiserver_cel.rs`): the webhook is called only if every condition is true.
/// The conditions are compiled as a ValidatingAdmissionPolicy's (the same environment) with
/// one validation `true`: admitted is called, not matched is not. An evaluation error (the API
/// server would apply `failurePolicy`) or versions that disagree fail the test.
fn are_called(conditions: &Value, cases: &[Case]) -> Vec<bool> {
    let policy = kube_apiserver_cel::match_conditions_policy(conditions);
    kube_apiserver_cel::evaluate(&policy, cases)
        .outcomes
        .iter()
        .map(|outcome| match outcome.agreed() {
            Ok(Decision::Admit) => true,
            Ok(Decision::NotMatched) => false,
            Ok(other) => panic!("{}: the matchConditions give {other:?}", outcome.name),
            Err(problem) => panic!("{}: {problem}", outcome.name),
        })
        .collect()
}

/// A change of the object's last template: its service account, which a PodTemplateSpec's
/// spec and a bare pod spec both have.
fn change_last_template(object: &mut Value, row: &modelgate::kinds::KindEntry) {
    let text = object.to_string();
    let templates = modelgate::admission::templates_of(row, &text).unwrap();
    let last = templates.last().unwrap();
    let mut pointer = last.pointer.clone();
    if last.shape == modelgate::kinds::Shape::PodTemplateSpec {
        pointer.push_str("/spec");
    }
    object.pointer_mut(&pointer).unwrap()["serviceAccountName"] = json!("other");
}

/// Each fixture as the API server would send it to the controllers' webhook: CREATE, an
/// UPDATE that changes a template and one that only relabels the resource, each with the
/// verdict of the installed `matchConditions` (evaluated as CEL) on whether modelgate is called,
/// and the templates of the object (where complete), from which the Go harness makes the pods
/// the kind's controller would create.
#[test]
fn exports_the_requests_the_api_server_sends_for_these_kinds() {
    if kube_apiserver_cel::tools_dir().is_none() {
        return;
    }
    let requests = ml_requests();
    let sent = requests.iter().filter(|r| r["called"] == true).count();
    assert!(
        sent > 0 && sent < requests.len(),
        "{sent} of {}",
        requests.len()
    );
    let path = std::path::Path::new(ML_REQUESTS);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, serde_json::to_vec(&requests).unwrap()).unwrap();
}

fn ml_requests() -> Vec<Value> {
    let conditions = installed_match_conditions();
    let table = modelgate::kinds::WorkloadKinds::defaults();
    let mut out = Vec::new();
    let mut cases = Vec::new();
    let mut expected = Vec::new();
    for (file, object) in fixtures() {
        let (api_version, kind) = (
            object["apiVersion"].as_str().unwrap(),
            object["kind"].as_str().unwrap(),
        );
        let row = table.find_api_version(api_version, kind).unwrap().clone();
        let (group, version) = modelgate::kinds::split_api_version(api_version);
        let namespace = object["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default");
        let label = format!("{file}: {kind} {}", object["metadata"]["name"]);
        let mut stored = object.clone();
        stored["metadata"]["namespace"] = json!(namespace);
        stored["metadata"]["uid"] = json!("3f8e7c1a-0000-4000-8000-000000000001");
        stored["metadata"]["resourceVersion"] = json!("1000");
        stored["metadata"]["generation"] = json!(1);
        let bookkeeping = |o: &mut Value| {
            o["metadata"]["resourceVersion"] = json!("1001");
            o["metadata"]["generation"] = json!(2);
        };
        let mut changed = stored.clone();
        bookkeeping(&mut changed);
        change_last_template(&mut changed, &row);
        let mut relabelled = stored.clone();
        bookkeeping(&mut relabelled);
        relabelled["metadata"]["labels"]["team"] = json!("b");
        for (operation, what, new, old, must_be_called) in [
            ("CREATE", "created", &object, Value::Null, true),
            (
                "UPDATE",
                "a template changed",
                &changed,
                stored.clone(),
                true,
            ),
            ("UPDATE", "relabelled", &relabelled, stored.clone(), false),
        ] {
            let mut new = new.clone();
            new["metadata"]["namespace"] = json!(namespace);
            // As the API server binds the request: a cluster-scoped object has no namespace.
            let cluster_scoped = row.scope == modelgate::kinds::Scope::Cluster;
            let in_scope = |o: &Value| {
                let mut o = o.clone();
                if cluster_scoped && let Some(meta) = o["metadata"].as_object_mut() {
                    meta.remove("namespace");
                }
                o
            };
            let request = AdmissionRequest {
                group: group.into(),
                version: version.into(),
                kind: kind.into(),
                resource: row.plural.clone(),
                sub_resource: None,
                name: new["metadata"]["name"].as_str().map(String::from),
                namespace: (!cluster_scoped).then(|| namespace.to_string()),
                operation: operation.into(),
                user: UserInfo {
                    username: "kubernetes-admin".into(),
                    groups: vec!["system:authenticated".into()],
                    ..UserInfo::default()
                },
            };
            cases.push(Case {
                name: format!("{label}, {what}"),
                object: in_scope(&new),
                old_object: if old.is_null() {
                    old.clone()
                } else {
                    in_scope(&old)
                },
                request: request.to_json(),
                // A webhook's conditions have no namespaceObject; a cluster-scoped object has none.
                namespace_object: Value::Null,
            });
            expected.push(must_be_called);
            let text = new.to_string();
            let templates: Vec<Value> = modelgate::admission::templates_of(&row, &text)
                .unwrap()
                .into_iter()
                .map(|t| {
                    let found = new.pointer(&t.pointer).unwrap().clone();
                    let template = match t.shape {
                        modelgate::kinds::Shape::PodTemplateSpec => found,
                        _ => json!({"spec": found}),
                    };
                    json!({"path": t.path, "template": template,
                        "partial": t.completeness == modelgate::kinds::Completeness::Partial})
                })
                .collect();
            out.push(json!({
                "label": format!("{label}, {what}"),
                "kind": {"Group": group, "Version": version, "Kind": kind, "Resource": row.plural},
                "operation": operation,
                "object": new,
                "oldObject": old,
                "namespace": namespace,
                "templates": templates,
            }));
        }
    }
    let called = are_called(&conditions, &cases);
    for (((request, case), called), must_be_called) in
        out.iter_mut().zip(&cases).zip(called).zip(expected)
    {
        assert_eq!(called, must_be_called, "{}", case.name);
        request["called"] = json!(called);
    }
    out
}
