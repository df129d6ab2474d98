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
