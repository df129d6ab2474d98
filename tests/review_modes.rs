//! `modelgate review` and the rollout modes of docs/policy.md §9: the real binary, with Namespace
//! objects in its `--caches` files and `--default-mode`.

#[path = "common/cli.rs"]
mod cli;
mod support;

use std::path::Path;

use cli::{Run, modelgate_env, review};
use serde_json::{Value, json};
use support::fake_apiserver::{FakeApiServer, NAMESPACES as CLUSTER_NAMESPACES};

const NAMESPACES: &str = "\
apiVersion: v1
kind: Namespace
metadata: {name: team-warn, labels: {modelgate.io/mode: warn}}
---
apiVersion: v1
kind: Namespace
metadata: {name: team-audit, labels: {modelgate.io/mode: audit}}
---
apiVersion: v1
kind: Namespace
metadata: {name: team-off, labels: {modelgate.io/mode: 'off'}}
---
apiVersion: v1
kind: Namespace
metadata:
  name: team-restricted
  labels: {pod-security.kubernetes.io/enforce: restricted}
";

/// A pod with uid 0 in `ns`: denied under enforce.
fn root_pod(ns: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: root, namespace: {ns}}}\n\
         spec: {{securityContext: {{runAsUser: 0}}, containers: [{{name: c, image: x}}]}}\n"
    )
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.to_string_lossy().into_owned()
}

fn responses(run: &Run) -> Vec<Value> {
    run.stdout
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["response"].clone())
        .collect()
}

#[test]
fn namespaces_from_caches_files_set_each_objects_mode() {
    let dir = tempfile::tempdir().unwrap();
    let ns = write(dir.path(), "namespaces.yaml", NAMESPACES);
    let pods: String = ["team-warn", "team-audit", "team-off", "team-plain"]
        .iter()
        .map(|n| root_pod(n))
        .collect::<Vec<_>>()
        .join("---\n");
    let pods = write(dir.path(), "pods.yaml", &pods);
    let run = review(&["--caches", &ns, &pods, "-o", "review"]);
    // team-plain is enforced (the default): denied, exit 1.
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    assert!(
        !run.stderr.contains("skipped"),
        "Namespaces are not skipped documents: {}",
        run.stderr
    );
    let r = responses(&run);
    let warn = &r[0];
    assert_eq!(warn["allowed"], true);
    assert!(warn.get("patch").is_none());
    assert_eq!(
        warn["warnings"][0],
        "would deny: spec.securityContext.runAsUser: 0 is outside 1..2147483647"
    );
    let audit = &r[1];
    assert_eq!(audit["allowed"], true);
    assert!(audit.get("warnings").is_none());
    assert!(
        audit["auditAnnotations"]["would-deny"]
            .as_str()
            .unwrap()
            .starts_with("spec.securityContext.runAsUser: 0 is outside")
    );
    let off = &r[2];
    assert_eq!(off["allowed"], true);
    assert!(off.get("warnings").is_none() && off.get("auditAnnotations").is_none());
    assert_eq!(r[3]["allowed"], false);
}

#[test]
fn default_mode_flag_and_variable() {
    let dir = tempfile::tempdir().unwrap();
    let pod = write(dir.path(), "pod.yaml", &root_pod("team-plain"));
    let run = review(&["--default-mode", "warn", &pod]);
    assert_eq!(run.code, 0, "warn allows: {}\n{}", run.stdout, run.stderr);
    assert!(
        run.stdout
            .contains("would deny: spec.securityContext.runAsUser: 0"),
        "{}",
        run.stdout
    );

    let run = modelgate_env(
        &["review", &pod],
        &[("MODELGATE_DEFAULT_MODE", "off")],
        None,
    );
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);

    let run = review(&["--default-mode", "dry-run", &pod]);
    assert_eq!(run.code, 2);
    let line = run.stderr.trim();
    assert_eq!(line.lines().count(), 1, "{line}");
    assert!(
        line.contains("--default-mode") && line.contains("dry-run"),
        "{line}"
    );
}

#[test]
fn a_restricted_namespace_gets_no_prep_in_review_either() {
    let dir = tempfile::tempdir().unwrap();
    let ns = write(dir.path(), "namespaces.yaml", NAMESPACES);
    let pod = "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: team-restricted}\n\
               spec:\n  containers: [{name: c, image: x}]\n  volumes:\n  \
               - {name: model-cache, persistentVolumeClaim: {claimName: cache}}\n";
    let pod = write(dir.path(), "pod.yaml", pod);
    let run = review(&["--caches", &ns, &pod, "-o", "patched-json"]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let patched: Value = serde_json::from_str(run.stdout.trim()).unwrap();
    assert!(patched["spec"].get("initContainers").is_none(), "{patched}");
    assert_eq!(patched["spec"]["securityContext"]["runAsUser"], 101);
    // The same pod elsewhere gets the prep.
    let elsewhere = std::fs::read_to_string(&pod)
        .unwrap()
        .replace("team-restricted", "team-plain");
    let elsewhere = write(dir.path(), "elsewhere.yaml", &elsewhere);
    let run = review(&["--caches", &ns, &elsewhere, "-o", "patched-json"]);
    let patched: Value = serde_json::from_str(run.stdout.trim()).unwrap();
    assert_eq!(
        patched["spec"]["initContainers"][0]["name"],
        "model-cache-prep"
    );
}

#[test]
fn a_namespace_without_a_name_in_caches_is_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let ns = write(
        dir.path(),
        "namespaces.yaml",
        "apiVersion: v1\nkind: Namespace\nmetadata: {labels: {modelgate.io/mode: warn}}\n",
    );
    let pod = write(dir.path(), "pod.yaml", &root_pod("x"));
    let run = review(&["--caches", &ns, &pod]);
    assert_eq!(run.code, 2);
    assert!(
        run.stderr.contains("namespaces.yaml")
            && run.stderr.contains("Namespace has no metadata.name"),
        "{}",
        run.stderr
    );
}

#[test]
fn the_summary_shows_audit_annotations() {
    let dir = tempfile::tempdir().unwrap();
    let ns = write(dir.path(), "namespaces.yaml", NAMESPACES);
    let pod = write(
        dir.path(),
        "pod.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: team-audit}\n\
         spec: {containers: [{name: c, image: x}]}\n",
    );
    let run = review(&["--caches", &ns, &pod]);
    assert_eq!(run.code, 0);
    assert!(
        run.stdout.trim_end().ends_with(
            "allowed, 0 patch operations; audit annotations: would-patch: set \
             spec.securityContext.runAsNonRoot=true; set spec.securityContext.runAsUser=1000; \
             set spec.securityContext.runAsGroup=1000"
        ),
        "{}",
        run.stdout
    );
}

/// `review --from-cluster <args>` against the fake API server, without blocking its runtime.
async fn review_cluster(api: &FakeApiServer, args: &[&str]) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig);
    let mut all = vec!["review", "--from-cluster"];
    all.extend_from_slice(args);
    let mut cmd = cli::command(&all);
    cmd.env("KUBECONFIG", &kubeconfig);
    tokio::task::spawn_blocking(move || cli::run(cmd, None))
        .await
        .unwrap()
}

/// With `--from-cluster`, each namespace's mode and Pod Security level are the cluster's, as
/// `serve` reads them (metadata only); a `--caches` Namespace replaces the cluster's of the
/// same name, labels and all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn from_cluster_namespaces_set_each_objects_mode_and_files_replace_them() {
    let api = FakeApiServer::start(&[]).await;
    let namespace =
        |name: &str, labels: Value| json!({"metadata": {"name": name, "labels": labels}});
    api.apply(
        CLUSTER_NAMESPACES,
        namespace("team-warn", json!({"modelgate.io/mode": "warn"})),
    );
    api.apply(
        CLUSTER_NAMESPACES,
        namespace("team-off", json!({"modelgate.io/mode": "off"})),
    );
    api.apply(
        CLUSTER_NAMESPACES,
        namespace("team-file", json!({"modelgate.io/mode": "off"})),
    );
    api.apply(
        CLUSTER_NAMESPACES,
        namespace(
            "team-restricted",
            json!({"pod-security.kubernetes.io/enforce": "restricted"}),
        ),
    );
    let dir = tempfile::tempdir().unwrap();
    // The file's team-file has no mode label: it replaces the cluster's `off` with nothing.
    let files = write(
        dir.path(),
        "namespaces.yaml",
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: team-file}\n",
    );
    let pods: String = ["team-warn", "team-off", "team-file", "team-plain"]
        .iter()
        .map(|n| root_pod(n))
        .collect::<Vec<_>>()
        .join("---\n");
    let pods = write(dir.path(), "pods.yaml", &pods);
    let run = review_cluster(&api, &["--caches", &files, &pods, "-o", "review"]).await;
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    let r = responses(&run);
    assert_eq!(r[0]["allowed"], true, "warn: {}", r[0]);
    assert!(
        r[0]["warnings"][0]
            .as_str()
            .unwrap()
            .starts_with("would deny: ")
    );
    assert_eq!(r[1]["allowed"], true, "off: {}", r[1]);
    assert!(r[1].get("warnings").is_none());
    assert_eq!(
        r[2]["allowed"], false,
        "the file's team-file enforces: {}",
        r[2]
    );
    assert_eq!(r[3]["allowed"], false, "no label: --default-mode: {}", r[3]);
    let counts = api.counts(CLUSTER_NAMESPACES);
    assert_eq!(
        (counts.lists, counts.watches),
        (1, 0),
        "listed once, never watched"
    );
    assert_eq!(counts.metadata_only, 1, "metadata only");

    // The cluster's Pod Security level: no root prep in team-restricted.
    let pod = "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: team-restricted}\n\
               spec:\n  containers: [{name: c, image: x}]\n  volumes:\n  \
               - {name: model-cache, persistentVolumeClaim: {claimName: cache}}\n";
    let pod = write(dir.path(), "pod.yaml", pod);
    let run = review_cluster(&api, &[&pod, "-o", "patched-json"]).await;
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let patched: Value = serde_json::from_str(run.stdout.trim()).unwrap();
    assert!(patched["spec"].get("initContainers").is_none(), "{patched}");
}

/// Namespaces that cannot be listed are an error, not a silent `--default-mode`: the mode
/// decides the verdict.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn from_cluster_without_permission_to_list_namespaces_is_an_error() {
    let api = FakeApiServer::start(&[]).await;
    api.fail_lists(CLUSTER_NAMESPACES, Some(403));
    let dir = tempfile::tempdir().unwrap();
    let pod = write(dir.path(), "pod.yaml", &root_pod("team-a"));
    let run = review_cluster(&api, &[&pod]).await;
    assert_eq!(run.code, 2, "{}\n{}", run.stdout, run.stderr);
    assert!(run.stdout.is_empty(), "{}", run.stdout);
    let line = run.stderr.trim();
    assert!(
        line.starts_with("error: cannot list namespaces: ")
            && line.contains("(403)")
            && line.contains("RBAC: list on namespaces"),
        "{line}"
    );
}
