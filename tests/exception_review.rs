//! `modelgate review --caches` applies the `ModelgateException`s of its files as `serve` does
//! (docs/exceptions.md): the real binary, on files written here.

#[path = "common/cli.rs"]
mod cli;

use cli::{assert_exit, review};

const POD: &str = r#"apiVersion: v1
kind: Pod
metadata: {name: engine, namespace: team-a, labels: {app: vendor}}
spec:
  containers:
  - name: engine
    image: registry.example/vendor@sha256:abc
    securityContext: {runAsUser: 0, runAsNonRoot: false}
"#;

fn state(namespace_label: &str, expires: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Namespace
metadata: {{name: team-a, labels: {{{namespace_label}}}}}
---
apiVersion: modelgate.io/v1alpha1
kind: ModelgateException
metadata: {{name: vendor-root, namespace: team-a}}
spec:
  reason: the vendor image runs as root until its 2.0
  expires: "{expires}"
  rules: [non-root]
  selector: {{matchLabels: {{app: vendor}}}}
  images: [registry.example/vendor@sha256:abc]
"#
    )
}

/// `review` of the root pod with `state` as `--caches`, a limit long enough for the dates here.
fn run(state: &str) -> cli::Run {
    let dir = tempfile::tempdir().unwrap();
    let caches = dir.path().join("state.yaml");
    let pod = dir.path().join("pod.yaml");
    std::fs::write(&caches, state).unwrap();
    std::fs::write(&pod, POD).unwrap();
    review(&[
        "--max-exception-days",
        "3650",
        "--caches",
        caches.to_str().unwrap(),
        pod.to_str().unwrap(),
    ])
}

#[test]
fn review_honours_an_exception_of_its_files_and_names_it() {
    let r = run(&state(
        "modelgate.io/exceptions: allowed",
        "2035-01-01T00:00:00Z",
    ));
    assert_exit(&r, 0);
    assert!(
        r.stdout
            .contains("exception vendor-root waives non-root until 2035-01-01T00:00:00Z"),
        "{}",
        r.stdout
    );
}

#[test]
fn review_denies_without_the_namespace_label_or_after_expiry() {
    let closed = run(&state("team: a", "2035-01-01T00:00:00Z"));
    assert_exit(&closed, 1);
    assert!(
        closed
            .stdout
            .contains("spec.containers[0].securityContext.runAsUser: 0 is outside"),
        "{}",
        closed.stdout
    );
    let expired = run(&state(
        "modelgate.io/exceptions: allowed",
        "2020-01-01T00:00:00Z",
    ));
    assert_exit(&expired, 1);
    // The limit counts from now for an object written in a file: the default 90 days refuses a
    // date years ahead.
    let dir = tempfile::tempdir().unwrap();
    let caches = dir.path().join("state.yaml");
    let pod = dir.path().join("pod.yaml");
    std::fs::write(
        &caches,
        state("modelgate.io/exceptions: allowed", "2035-01-01T00:00:00Z"),
    )
    .unwrap();
    std::fs::write(&pod, POD).unwrap();
    let too_long = review(&["--caches", caches.to_str().unwrap(), pod.to_str().unwrap()]);
    assert_exit(&too_long, 1);
}

#[test]
fn a_malformed_exception_in_a_file_is_bad_input_naming_the_field() {
    let bad = state("modelgate.io/exceptions: allowed", "2035-01-01T00:00:00Z")
        .replace("rules: [non-root]", "rules: [root]");
    let r = run(&bad);
    assert_exit(&r, 2);
    assert!(r.stderr.contains("spec.rules[0]"), "{}", r.stderr);
}

/// A Deployment whose pods the exception covers, beside the Pod.
const DEPLOYMENT: &str = r#"apiVersion: apps/v1
kind: Deployment
metadata: {name: engine, namespace: team-a}
spec:
  selector: {matchLabels: {app: vendor}}
  template:
    metadata: {labels: {app: vendor}}
    spec:
      containers:
      - name: engine
        image: registry.example/vendor@sha256:abc
        securityContext: {runAsUser: 0, runAsNonRoot: false}
"#;

#[test]
fn audit_lists_each_exception_with_the_workloads_that_depend_on_it() {
    let dir = tempfile::tempdir().unwrap();
    let caches = dir.path().join("state.yaml");
    let workloads = dir.path().join("workloads.yaml");
    let expired = r#"
---
apiVersion: modelgate.io/v1alpha1
kind: ModelgateException
metadata: {name: old-root, namespace: team-a}
spec:
  reason: the previous vendor image
  expires: "2020-01-01T00:00:00Z"
  rules: [non-root]
  selector: {matchLabels: {app: old}}
"#;
    std::fs::write(
        &caches,
        state("modelgate.io/exceptions: allowed", "2035-01-01T00:00:00Z") + expired,
    )
    .unwrap();
    std::fs::write(&workloads, format!("{POD}---\n{DEPLOYMENT}")).unwrap();
    let args = |output: &'static str| {
        vec![
            "audit".to_string(),
            "--max-exception-days".into(),
            "3650".into(),
            "--caches".into(),
            caches.to_str().unwrap().into(),
            "-o".into(),
            output.into(),
            workloads.to_str().unwrap().into(),
        ]
    };
    let table = cli::modelgate(&args("table").iter().map(String::as_str).collect::<Vec<_>>());
    assert_exit(&table, 0);
    let section = table
        .stdout
        .split_once("\nEXCEPTIONS (2):\n")
        .unwrap_or_else(|| panic!("no exceptions section:\n{}", table.stdout))
        .1;
    assert!(
        section.starts_with(
            "team-a/old-root: expired at 2020-01-01T00:00:00Z; waives a rule for 0 workloads\n\
             team-a/vendor-root: in force until 2035-01-01T00:00:00Z; waives a rule for 2 \
             workloads\n  Pod team-a/engine\n  Deployment team-a/engine\n"
        ),
        "{section}"
    );
    let json = cli::modelgate(&args("json").iter().map(String::as_str).collect::<Vec<_>>());
    assert_exit(&json, 0);
    let report: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(
        report["exceptions"][1],
        serde_json::json!({"namespace": "team-a", "name": "vendor-root", "inForce": true,
                           "reason": "in force until 2035-01-01T00:00:00Z", "workloads": 2,
                           "listed": ["Pod team-a/engine", "Deployment team-a/engine"]}),
        "{}",
        json.stdout
    );
    assert_eq!(report["exceptions"][0]["inForce"], serde_json::json!(false));
}
