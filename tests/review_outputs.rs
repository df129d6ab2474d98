//! `modelgate review`'s reports for people and CI (the real binary): `-o diff`, `-o junit`, and
//! denials that point at the user's file and line.

#[path = "common/cli.rs"]
mod cli;

use cli::review;

/// Three documents: a pod denied on line 15, a JSON-written pod that gets patched, a pod whose
/// uid is a string (line 29).
const STREAM: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: web
spec:
  volumes:
  - name: cfg
    secret:
      secretName: s
      defaultMode: 0440
  containers:
  - name: app
    image: nginx
    securityContext:
      runAsUser: 0
---
{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "j"},
 "spec": {"containers": [{"name": "a", "image": "x", "securityContext": {"readOnlyRootFilesystem": true}}]}}
---
apiVersion: v1
kind: Pod
metadata:
  name: typed
spec:
  containers:
  - name: a
    image: x
    securityContext:
      runAsUser: "0"
"#;

fn write_stream() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pods.yaml");
    std::fs::write(&path, STREAM).unwrap();
    let path = path.to_str().unwrap().to_string();
    (dir, path)
}

#[test]
fn denials_name_the_file_and_line_of_each_field() {
    let (_dir, path) = write_stream();
    let run = review(&[&path]);
    assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert!(
        lines[0].contains(&format!(
            "denied: {path}:15: spec.containers[0].securityContext.runAsUser: 0 is outside"
        )),
        "{}",
        lines[0]
    );
    // A wrong type: the user's line, not a position in the re-encoded object.
    assert!(
        lines[2].contains(&format!(
            "denied: {path}:29: spec.containers[0].securityContext.runAsUser: cannot be decoded as a Pod: invalid type: string \"0\", expected i64."
        )),
        "{}",
        lines[2]
    );
    assert!(!run.stdout.contains("column"), "{}", run.stdout);
    // The AdmissionReview answer stays the webhook's.
    let run = review(&["-o", "review", &path]);
    assert!(!run.stdout.contains("pods.yaml:15"), "{}", run.stdout);
    assert!(
        run.stdout
            .contains("spec.containers[0].securityContext.runAsUser: 0 is outside"),
        "{}",
        run.stdout
    );
}

#[test]
fn diff_shows_each_patch_as_a_unified_diff() {
    let (_dir, path) = write_stream();
    let run = review(&["-o", "diff", &path]);
    assert_eq!(run.code, 1);
    let expected = format!(
        "--- {path}#2\n+++ {path}#2 (patched)\n@@ -8,3 +8,7 @@\n     name: a\n     securityContext:\n       readOnlyRootFilesystem: true\n+  securityContext:\n+    runAsGroup: 1000\n+    runAsNonRoot: true\n+    runAsUser: 1000\n"
    );
    assert_eq!(run.stdout, expected);
    // The two denied objects are said on stderr.
    assert!(run.stderr.contains(&format!("{path}#1")), "{}", run.stderr);
    assert!(run.stderr.contains(&format!("{path}#3")), "{}", run.stderr);

    // Nothing to change: no diff, exit 0.
    let dir = tempfile::tempdir().unwrap();
    let fine = dir.path().join("fine.yaml");
    std::fs::write(
        &fine,
        "apiVersion: v1\nkind: Pod\nmetadata: {name: f}\nspec:\n  securityContext: {runAsNonRoot: on, runAsUser: 0o1750, runAsGroup: 1000}\n  containers: [{name: a, image: b}]\n",
    )
    .unwrap();
    let run = review(&["-o", "diff", fine.to_str().unwrap()]);
    assert_eq!((run.code, run.stdout.as_str()), (0, ""), "{}", run.stderr);
}

#[test]
fn junit_has_a_case_per_object_and_a_failure_per_denial() {
    let (_dir, path) = write_stream();
    let run = review(&["-o", "junit", &path]);
    assert_eq!(run.code, 1);
    let xml = &run.stdout;
    assert!(
        xml.starts_with("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"),
        "{xml}"
    );
    assert!(
        xml.contains(r#"<testsuites name="modelgate review" tests="3" failures="2" errors="0">"#),
        "{xml}"
    );
    assert_eq!(xml.matches("<testcase ").count(), 3, "{xml}");
    assert_eq!(xml.matches("<failure type=\"denied\"").count(), 2, "{xml}");
    assert!(
        xml.contains(&format!(
            r#"<testcase classname="{path}#2" name="Pod default/j">"#
        )),
        "{xml}"
    );
    assert!(xml.contains("string &quot;0&quot;, expected i64"), "{xml}");
    assert!(xml.trim_end().ends_with("</testsuites>"), "{xml}");
}
