//! `modelgate review` and the rollout modes of SPEC.md §9: the real binary, with Namespace
//! objects in its `--caches` files and `--default-mode`.

#[path = "common/cli.rs"]
mod cli;

use std::path::Path;

use cli::{Run, modelgate_env, review};
use serde_json::Value;

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
