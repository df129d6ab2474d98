//! End-to-end tests of `modelgate review`: the real binary, spawned as a process, on the fixtures
//! in `tests/fixtures/` and on the KServe and Kyverno samples of `../shared/corpus`.
//!
//! Exit codes (docs/policy.md §8): 0 every object allowed, 1 at least one denied, 2 bad input or flags.

#[path = "common/cli.rs"]
mod cli;

use std::io::Write;
use std::path::PathBuf;
use std::process::Stdio;

use base64::Engine as _;
use cli::{assert_exit, corpus_dir, fixture, modelgate, modelgate_env, review};
use serde_json::{Value, json};

fn decode_patch(b64: &str) -> Vec<Value> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .expect("patch is base64");
    serde_json::from_slice(&bytes).expect("patch is a JSON array")
}

fn apply(object: &Value, ops: &[Value]) -> Value {
    let patch: json_patch::Patch = serde_json::from_value(Value::Array(ops.to_vec())).unwrap();
    let mut out = object.clone();
    json_patch::patch(&mut out, &patch).expect("the patch applies");
    out
}

fn read_yaml_docs(text: &str) -> Vec<Value> {
    let docs = modelgate::documents::read_documents("output", text).expect("the output is YAML");
    docs.into_iter().map(|d| d.value).collect()
}

fn default_identity() -> Value {
    json!({"runAsNonRoot": true, "runAsUser": 1000, "runAsGroup": 1000})
}

// ---------------------------------------------------------------------------------------------
// Output modes
// ---------------------------------------------------------------------------------------------

#[test]
fn summary_is_one_line_per_object_with_decision_patch_count_and_warnings() {
    let run = review(&[&fixture("allowed.yaml")]);
    assert_exit(&run, 0);
    let lines = run.lines();
    assert_eq!(lines.len(), 4, "{}", run.stdout);
    // Multi-document input: each line names file#N, the kind, namespace/name, the decision.
    let file = fixture("allowed.yaml");
    assert!(
        lines[0].starts_with(&format!("{file}#1: Pod default/web: allowed, ")),
        "{}",
        lines[0]
    );
    assert!(
        lines[1].starts_with(&format!("{file}#2: Pod tools/debug: allowed, ")),
        "{}",
        lines[1]
    );
    assert!(
        lines[1].contains("warnings:")
            && lines[1].contains("shell")
            && lines[1].contains("runAsNonRoot"),
        "{}",
        lines[1]
    );
    assert!(
        lines[2].starts_with(&format!(
            "{file}#3: Deployment default/api: allowed, 0 patch operations"
        )),
        "{}",
        lines[2]
    );
    // A Deployment is judged by its pod template (docs/policy.md §11), never patched: this one's pods
    // would be allowed, and there is nothing to say.
    assert!(!lines[2].contains("warnings:"), "{}", lines[2]);
    assert!(
        lines[3].starts_with(&format!("{file}#4: Job default/train: allowed, ")),
        "{}",
        lines[3]
    );
    for (line, min_ops) in [(lines[0], 1), (lines[1], 1), (lines[3], 1)] {
        let n: usize = line
            .split("allowed, ")
            .nth(1)
            .and_then(|r| r.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no patch operation count: {line}"));
        assert!(n >= min_ops, "{line}");
    }
    assert!(!lines[0].contains("warnings"), "{}", lines[0]);
}

#[test]
fn summary_of_a_denial_names_the_field_and_exits_1() {
    let run = review(&[&fixture("denied.yaml")]);
    assert_exit(&run, 1);
    let lines = run.lines();
    assert_eq!(lines.len(), 2, "{}", run.stdout);
    assert!(
        lines[0].contains("Pod default/fine: allowed"),
        "{}",
        lines[0]
    );
    assert!(
        lines[1].contains("Pod default/root: denied: "),
        "{}",
        lines[1]
    );
    assert!(
        lines[1]
            .contains("spec.containers[1].securityContext.runAsUser: 0 is outside 1..2147483647"),
        "{}",
        lines[1]
    );
}

#[test]
fn a_denial_is_printed_on_stderr_in_every_output_mode() {
    for mode in ["summary", "review", "patch", "patched", "patched-json"] {
        let run = review(&["-o", mode, &fixture("denied.yaml")]);
        assert_exit(&run, 1);
        let denials: Vec<&str> = run.stderr.lines().collect();
        assert_eq!(denials.len(), 1, "-o {mode}: {}", run.stderr);
        let file = fixture("denied.yaml");
        assert!(
            denials[0].starts_with(&format!("{file}#2: Pod default/root: denied: ")),
            "-o {mode}: {}",
            denials[0]
        );
        assert!(
            denials[0].contains(
                "spec.containers[1].securityContext.runAsUser: 0 is outside 1..2147483647"
            ),
            "-o {mode}: {}",
            denials[0]
        );
    }
    // The allowed object alone: nothing on stderr.
    let run = review(&["-o", "patch", &fixture("allowed.yaml")]);
    assert_exit(&run, 0);
    assert_eq!(run.stderr, "", "{}", run.stderr);
}

#[test]
fn summary_counts_patch_operations_in_the_right_number() {
    let one = "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  securityContext: {runAsUser: 1000, runAsGroup: 1000}\n  containers: [{name: a, image: nginx}]\n";
    let run = modelgate_env(&["review", "-"], &[], Some(one));
    assert_exit(&run, 0);
    assert_eq!(
        run.stdout,
        "stdin: Pod default/p: allowed, 1 patch operation\n"
    );
}

#[test]
fn review_help_lists_the_exit_codes() {
    let run = modelgate(&["review", "--help"]);
    assert_exit(&run, 0);
    for line in [
        "Exit codes:",
        "0  every object was allowed",
        "1  at least one object was denied",
        "2  bad input or flags",
    ] {
        assert!(run.stdout.contains(line), "{line}: {}", run.stdout);
    }
}

#[test]
fn review_output_is_one_admission_review_response_per_line() {
    let run = review(&[
        "-o",
        "review",
        &fixture("allowed.yaml"),
        &fixture("denied.yaml"),
    ]);
    assert_exit(&run, 1);
    let answers = run.json_lines();
    assert_eq!(answers.len(), 6);
    let original = read_yaml_docs(&std::fs::read_to_string(fixture("allowed.yaml")).unwrap());
    for a in &answers {
        assert_eq!(a["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(a["kind"], "AdmissionReview");
        assert!(
            a["response"]["uid"].as_str().is_some_and(|u| !u.is_empty()),
            "{a}"
        );
        assert!(a["response"]["allowed"].is_boolean(), "{a}");
    }
    // The web pod: base64 JSONPatch that gives it the default identity.
    let web = &answers[0]["response"];
    assert_eq!(web["allowed"], true);
    assert_eq!(web["patchType"], "JSONPatch");
    let patched = apply(&original[0], &decode_patch(web["patch"].as_str().unwrap()));
    assert_eq!(patched["spec"]["securityContext"], default_identity());
    // The Deployment: judged by its template, allowed, never patched, nothing to say.
    let deploy = &answers[2]["response"];
    assert_eq!(deploy["allowed"], true);
    assert!(
        deploy.get("patch").is_none() && deploy.get("patchType").is_none(),
        "{deploy}"
    );
    assert!(deploy.get("warnings").is_none(), "{deploy}");
    // The root pod: denied with the field in status.message, no patch.
    let root = &answers[5]["response"];
    assert_eq!(root["allowed"], false);
    assert!(root.get("patch").is_none());
    let msg = root["status"]["message"].as_str().unwrap();
    assert!(
        msg.contains("spec.containers[1].securityContext.runAsUser: 0"),
        "{msg}"
    );
}

#[test]
fn patch_output_is_one_json_patch_array_per_line_and_empty_when_nothing_changes() {
    let run = review(&[
        "-o",
        "patch",
        &fixture("allowed.yaml"),
        &fixture("list.json"),
    ]);
    assert_exit(&run, 0);
    let patches = run.json_lines();
    assert_eq!(patches.len(), 6, "{}", run.stdout);
    // Deployment: nothing changes. The List's second pod already complies.
    assert_eq!(patches[2], json!([]));
    assert_eq!(patches[5], json!([]));
    let original = read_yaml_docs(&std::fs::read_to_string(fixture("allowed.yaml")).unwrap());
    // The debug pod keeps its uid 2000 and gets its container's runAsNonRoot switched.
    let debug = apply(&original[1], patches[1].as_array().unwrap());
    assert_eq!(
        debug["spec"]["securityContext"],
        json!({"runAsUser": 2000, "runAsNonRoot": true, "runAsGroup": 1000})
    );
    assert_eq!(
        debug["spec"]["containers"][0]["securityContext"]["runAsNonRoot"],
        true
    );
    // The Job: the policy lands on spec.template.spec only.
    for op in patches[3].as_array().unwrap() {
        assert!(
            op["path"]
                .as_str()
                .unwrap()
                .starts_with("/spec/template/spec"),
            "{op}"
        );
    }
    let job = apply(&original[3], patches[3].as_array().unwrap());
    assert_eq!(
        job["spec"]["template"]["spec"]["securityContext"],
        default_identity()
    );
}

#[test]
fn patched_output_is_yaml_documents_of_the_resulting_objects() {
    let run = review(&["-o", "patched", &fixture("allowed.yaml")]);
    assert_exit(&run, 0);
    let docs = read_yaml_docs(&run.stdout);
    assert_eq!(docs.len(), 4, "{}", run.stdout);
    let original = read_yaml_docs(&std::fs::read_to_string(fixture("allowed.yaml")).unwrap());
    assert_eq!(docs[0]["metadata"], original[0]["metadata"]);
    assert_eq!(docs[0]["spec"]["securityContext"], default_identity());
    assert_eq!(docs[2], original[2], "a Deployment comes out unchanged");
    assert_eq!(
        docs[3]["spec"]["template"]["spec"]["securityContext"],
        default_identity()
    );

    // Feeding the result back in changes nothing any more (idempotency, through the CLI).
    let again = modelgate_env(&["review", "-o", "patch", "-"], &[], Some(&run.stdout));
    assert_exit(&again, 0);
    assert_eq!(again.json_lines(), vec![json!([]); 4], "{}", again.stdout);
}

#[test]
fn patched_yaml_keeps_strings_that_look_like_other_types() {
    let input = fixture("yaml-strings.yaml");
    let yaml = review(&["-o", "patched", &input]);
    assert_exit(&yaml, 0);
    let direct = review(&["-o", "patched-json", &input]);
    let round_trip = modelgate_env(
        &["review", "-o", "patched-json", "-"],
        &[],
        Some(&yaml.stdout),
    );
    assert_exit(&round_trip, 0);
    assert_eq!(round_trip.json_lines(), direct.json_lines());
    let labels = &direct.json_lines()[0]["metadata"]["labels"];
    assert_eq!(labels["a"], "true");
    assert_eq!(labels["d"], "0755");
    assert_eq!(labels["h"], "");
}

#[test]
fn patched_json_output_is_one_object_per_line() {
    let run = review(&[
        "-o",
        "patched-json",
        &fixture("list.json"),
        &fixture("denied.yaml"),
    ]);
    assert_exit(&run, 1);
    let objects = run.json_lines();
    assert_eq!(objects.len(), 4);
    assert_eq!(objects[0]["metadata"]["name"], "first");
    assert_eq!(objects[0]["spec"]["securityContext"], default_identity());
    assert_eq!(
        objects[1]["spec"]["securityContext"],
        json!({"runAsNonRoot": true, "runAsUser": 1001, "runAsGroup": 1001})
    );
    // A denied object is not patched.
    let root = read_yaml_docs(&std::fs::read_to_string(fixture("denied.yaml")).unwrap())[1].clone();
    assert_eq!(objects[3], root);
}

// ---------------------------------------------------------------------------------------------
// Inputs
// ---------------------------------------------------------------------------------------------

#[test]
fn the_own_namespace_from_pod_namespace_is_exempt_unless_the_flag_names_others() {
    let pod = "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n  - {name: c, image: x, securityContext: {runAsUser: 0}}\n";
    let run = |args: &[&str], env: &[(&str, &str)]| {
        let mut all = vec!["review", "-n", "modelgate-system"];
        all.extend_from_slice(args);
        all.push("-");
        modelgate_env(&all, env, Some(pod))
    };
    let own = [("POD_NAMESPACE", "modelgate-system")];
    let exempt = run(&[], &own);
    assert_exit(&exempt, 0);
    assert!(exempt.stdout.contains("allowed"), "{}", exempt.stdout);
    // Elsewhere the same pod is denied; so it is here when --exempt-namespace replaces the default.
    assert_exit(&run(&[], &[("POD_NAMESPACE", "other")]), 1);
    assert_exit(&run(&["--exempt-namespace", "team-x"], &own), 1);
}

#[test]
fn stdin_dash_and_no_argument_read_standard_input() {
    let pod = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"piped"},"spec":{"containers":[{"name":"c","image":"i"}]}}"#;
    for args in [vec!["review", "-"], vec!["review"]] {
        let run = modelgate_env(&args, &[], Some(pod));
        assert_exit(&run, 0);
        assert_eq!(run.lines().len(), 1);
        assert!(
            run.stdout.starts_with("stdin: Pod default/piped: allowed"),
            "{}",
            run.stdout
        );
    }
    // YAML, several documents, on stdin, mixed with a file.
    let yaml = "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec: {containers: [{name: c, image: i}]}\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: b}\nspec: {containers: [{name: c, image: i, securityContext: {runAsUser: 0}}]}\n";
    let run = modelgate_env(&["review", "-", &fixture("list.json")], &[], Some(yaml));
    assert_exit(&run, 1);
    let lines = run.lines();
    assert_eq!(lines.len(), 4, "{}", run.stdout);
    assert!(
        lines[0].starts_with("stdin#1: Pod default/a: allowed"),
        "{}",
        lines[0]
    );
    assert!(
        lines[1].starts_with("stdin#2: Pod default/b: denied"),
        "{}",
        lines[1]
    );
    assert!(
        lines[2].contains("list.json") && lines[2].contains("Pod default/first: allowed"),
        "{}",
        lines[2]
    );
}

#[test]
fn a_list_yields_its_items() {
    let run = review(&[&fixture("list.json")]);
    assert_exit(&run, 0);
    let lines = run.lines();
    assert_eq!(lines.len(), 2, "{}", run.stdout);
    assert!(
        lines[0].contains("Pod default/first: allowed"),
        "{}",
        lines[0]
    );
    assert!(
        lines[1].contains("Pod default/second: allowed, 0 patch operations"),
        "{}",
        lines[1]
    );
    // Each item is named by its place in the List.
    assert!(
        lines[0].contains("items[0]") && lines[1].contains("items[1]"),
        "{}",
        run.stdout
    );
}

#[test]
fn a_bare_admission_request_is_answered_with_its_uid() {
    let run = review(&["-o", "review", &fixture("bare-request.json")]);
    assert_exit(&run, 0);
    let answers = run.json_lines();
    assert_eq!(answers.len(), 1);
    let r = &answers[0]["response"];
    assert_eq!(r["uid"], "0df28fbd-5f5f-4f2c-8a0e-4d1a2b3c4d5e");
    assert_eq!(r["allowed"], true);
    let request: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("bare-request.json")).unwrap())
            .unwrap();
    let patched = apply(
        &request["object"],
        &decode_patch(r["patch"].as_str().unwrap()),
    );
    assert_eq!(patched["spec"]["securityContext"], default_identity());
    // The summary names the controller-made pod by its generateName and the request's namespace.
    let run = review(&[&fixture("bare-request.json")]);
    assert!(
        run.stdout
            .contains("Pod inference/predictor-7d9f-: allowed"),
        "{}",
        run.stdout
    );
}

#[test]
fn an_admission_review_is_used_as_it_is_and_answered_in_kind() {
    let run = review(&["-o", "review", &fixture("review-v1beta1.json")]);
    assert_exit(&run, 0);
    let a = &run.json_lines()[0];
    assert_eq!(a["apiVersion"], "admission.k8s.io/v1beta1");
    assert_eq!(a["response"]["uid"], "b3e1c0de-0000-4000-8000-000000000001");
    assert_eq!(a["response"]["patchType"], "JSONPatch");
    let run = review(&[&fixture("review-v1beta1.json")]);
    assert!(
        run.stdout.contains("Pod serving/beta: allowed"),
        "{}",
        run.stdout
    );
}

#[test]
fn namespace_flag_applies_to_objects_that_name_none() {
    let run = review(&[
        "-o",
        "review",
        "--namespace",
        "ml-team",
        &fixture("allowed.yaml"),
    ]);
    assert_exit(&run, 0);
    let run = review(&["--namespace", "ml-team", &fixture("allowed.yaml")]);
    let lines = run.lines();
    assert!(lines[0].contains("Pod ml-team/web:"), "{}", lines[0]);
    // An object's own namespace wins.
    assert!(lines[1].contains("Pod tools/debug:"), "{}", lines[1]);
    // kube-system is exempt by default: allowed untouched.
    let run = review(&[
        "-o",
        "patch",
        "--namespace",
        "kube-system",
        &fixture("denied.yaml"),
    ]);
    assert_exit(&run, 0);
    assert_eq!(
        run.json_lines(),
        vec![json!([]), json!([])],
        "{}",
        run.stdout
    );
    // ... unless the exempt namespaces are given explicitly.
    let run = review(&[
        "--namespace",
        "kube-system",
        "--exempt-namespace",
        "other",
        &fixture("denied.yaml"),
    ]);
    assert_exit(&run, 1);
}

// ---------------------------------------------------------------------------------------------
// --webhook
// ---------------------------------------------------------------------------------------------

#[test]
fn webhook_choice_selects_mutate_validate_or_both() {
    // runAsNonRoot: false: the original is refused by /validate, repaired by /mutate, and the
    // repaired pod passes /validate.
    let debug = fixture("allowed.yaml");
    let run = review(&["--webhook", "validate", &debug]);
    assert_exit(&run, 1);
    let line = run.lines()[1];
    assert!(
        line.contains("denied")
            && line.contains("spec.containers[0].securityContext.runAsNonRoot: false"),
        "{line}"
    );
    // validate never patches.
    let run = review(&["--webhook", "validate", "-o", "patch", &debug]);
    assert!(
        run.json_lines().iter().all(|p| p == &json!([])),
        "{}",
        run.stdout
    );
    for mode in ["mutate", "both"] {
        let run = review(&["--webhook", mode, &debug]);
        assert_exit(&run, 0);
    }
    let default = review(&[&debug]);
    assert_eq!(
        default.stdout,
        review(&["--webhook", "both", &debug]).stdout
    );

    // An init container named model-cache-prep in a pod modelgate does not manage: /mutate has
    // nothing to refuse, /validate refuses it, and `both` validates the mutated result.
    let clash = fixture("prep-name-clash.yaml");
    let run = review(&["--webhook", "mutate", &clash]);
    assert_exit(&run, 0);
    for mode in ["validate", "both"] {
        let run = review(&["--webhook", mode, &clash]);
        assert_exit(&run, 1);
        assert!(
            run.stdout.contains("spec.initContainers[0]")
                && run.stdout.contains("model-cache-prep"),
            "{}",
            run.stdout
        );
    }
}

// ---------------------------------------------------------------------------------------------
// --caches and policy flags
// ---------------------------------------------------------------------------------------------

#[test]
fn caches_resolve_the_model_and_the_prep_container_is_injected() {
    let caches = fixture("caches.yaml");
    let pod = fixture("model-pod.yaml");
    let run = review(&["-o", "patched-json", "--caches", &caches, &pod]);
    assert_exit(&run, 0);
    let p = &run.json_lines()[0];
    let key = "97b21acca68d6cb6"; // printf %s hf://org/llm | sha256sum | cut -c1-16
    assert_eq!(
        p["metadata"]["annotations"]["modelgate.io/model-cache"],
        "cluster/llm"
    );
    assert_eq!(
        p["metadata"]["annotations"]["modelgate.io/resolved-uri"],
        format!("pvc://llm-gpu-nodes/models/{key}/snapshots/main")
    );
    assert_eq!(
        p["spec"]["containers"][0]["volumeMounts"][1],
        json!({"name": "modelgate-model", "mountPath": "/mnt/models", "subPath": format!("models/{key}/snapshots/main"), "readOnly": true})
    );
    assert_eq!(
        p["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"],
        json!([{"matchExpressions": [{"key": "accelerator", "operator": "In", "values": ["a100"]},
                {"key": "kubernetes.io/hostname", "operator": "In", "values": ["a100-1"]}]}])
    );
    // The writable cache: fsGroup 102 and the prep container first, fsGroup branch.
    assert_eq!(
        p["spec"]["securityContext"],
        json!({"runAsNonRoot": true, "runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 102})
    );
    let prep = &p["spec"]["initContainers"][0];
    assert_eq!(prep["name"], "model-cache-prep");
    assert_eq!(
        prep["command"],
        json!(["sh", "-c", "chown 0:102 /models && chmod g+rwX /models"])
    );
    // The summary reports the hit as a hit, not among the warnings.
    let run = review(&["--caches", &caches, &pod]);
    assert!(
        run.stdout.contains(&format!(
            "; model cache hit: cluster/llm (pvc://llm-gpu-nodes/models/{key}/snapshots/main)"
        )),
        "{}",
        run.stdout
    );
    assert!(!run.stdout.contains("served from"), "{}", run.stdout);

    // The namespace's own cache wins; its key hashes the URI as written (with its slash).
    let run = review(&[
        "-o",
        "patched-json",
        "--caches",
        &caches,
        "--namespace",
        "team-a",
        &pod,
    ]);
    let p = &run.json_lines()[0];
    assert_eq!(
        p["metadata"]["annotations"]["modelgate.io/model-cache"],
        "namespace/team-a/team-llm"
    );
    assert_eq!(
        p["metadata"]["annotations"]["modelgate.io/resolved-uri"],
        "pvc://team-llm-team-nodes/models/bffca0e481f29c78/snapshots/main"
    );
    assert_eq!(
        p["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"],
        json!([{"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["a100-1"]}]}]),
        "team-nodes' PV has no node affinity: pinned by hostname only"
    );

    // Files are the whole truth: without the PVC, the miss names the PVC a user must create.
    let dir = tempfile::tempdir().unwrap();
    let without_pvc = dir.path().join("caches.yaml");
    let text = std::fs::read_to_string(&caches).unwrap();
    let cut = text.find("kind: PersistentVolumeClaim").unwrap();
    let cut = text[..cut].rfind("---").unwrap();
    std::fs::write(&without_pvc, &text[..cut]).unwrap();
    let run = review(&["--caches", without_pvc.to_str().unwrap(), &pod]);
    assert_exit(&run, 0);
    assert!(
        run.stdout.contains(
            "pvc-missing: LocalModelCache llm matches hf://org/llm/snapshots/main but PVC default/llm-gpu-nodes does not exist"
        ),
        "{}",
        run.stdout
    );

    // Without caches: a miss.
    let run = review(&["-o", "patched-json", &pod]);
    assert_eq!(
        run.json_lines()[0]["metadata"]["annotations"]["modelgate.io/model-cache"],
        "miss"
    );
    let run = review(&[&pod]);
    assert!(run.stdout.contains("; model cache miss"), "{}", run.stdout);
    assert!(!run.stdout.contains("model cache hit"), "{}", run.stdout);

    // Policy flags: --model-cache-prep never runs the pod as the cache owner instead (§3).
    let run = review(&[
        "-o",
        "patched-json",
        "--model-cache-prep",
        "never",
        "--init-container-user",
        "4242",
        &pod,
    ]);
    assert_exit(&run, 0);
    let p = &run.json_lines()[0];
    assert!(p["spec"].get("initContainers").is_none());
    assert_eq!(p["spec"]["securityContext"]["runAsUser"], 4242);
    // ... and the env var form of a flag works too.
    let run = modelgate_env(
        &["review", "-o", "patched-json", &pod],
        &[
            ("MODELGATE_MODEL_CACHE_PREP", "never"),
            ("MODELGATE_INIT_CONTAINER_USER", "4343"),
        ],
        None,
    );
    assert_exit(&run, 0);
    assert_eq!(
        run.json_lines()[0]["spec"]["securityContext"]["runAsUser"],
        4343
    );
}

#[test]
fn a_broken_cache_file_is_bad_input() {
    let run = review(&[
        "--caches",
        &fixture("bad-cache.yaml"),
        &fixture("list.json"),
    ]);
    assert_exit(&run, 2);
    assert!(run.stderr.contains("bad-cache.yaml"), "{}", run.stderr);
    assert!(run.stderr.contains("sourceModelUri"), "{}", run.stderr);
    assert_eq!(run.stdout, "");
    let run = review(&[
        "--caches",
        "/nonexistent/caches.yaml",
        &fixture("list.json"),
    ]);
    assert_exit(&run, 2);
    assert!(
        run.stderr.contains("/nonexistent/caches.yaml"),
        "{}",
        run.stderr
    );
}

// ---------------------------------------------------------------------------------------------
// Exit code 2
// ---------------------------------------------------------------------------------------------

fn one_line(stderr: &str) -> &str {
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "a one-line error, got:\n{stderr}");
    lines[0]
}

#[test]
fn unreadable_input_exits_2_naming_the_file_and_document_without_partial_output() {
    // The first document is fine; the second is no Kubernetes object.
    let run = review(&[&fixture("bad-second-document.yaml")]);
    assert_exit(&run, 2);
    assert_eq!(run.stdout, "", "no partial results");
    let line = one_line(&run.stderr);
    assert!(line.contains("bad-second-document.yaml#2"), "{line}");

    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("review_cli");
    std::fs::create_dir_all(&dir).unwrap();
    let cases = [
        (
            "broken.yaml",
            "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec: {containers: [{name: c}]}\n---\nfoo: [1, 2\n",
            "line 6",
        ),
        (
            "broken.json",
            "{\"apiVersion\": \"v1\", \"kind\": ",
            "line 1",
        ),
        ("scalar.yaml", "kind: Pod\n---\n- 1\n- 2\n", "document 2"),
    ];
    for (name, text, place) in cases {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        let path = path.to_string_lossy().into_owned();
        let run = review(&[&path]);
        assert_exit(&run, 2);
        assert_eq!(run.stdout, "");
        let line = one_line(&run.stderr);
        assert!(line.contains(&path), "{line}");
        assert!(line.contains(place), "{name}: `{place}` not in: {line}");
    }
    let run = review(&["/nonexistent/pods.yaml"]);
    assert_exit(&run, 2);
    assert!(one_line(&run.stderr).contains("/nonexistent/pods.yaml"));
    let run = modelgate_env(
        &["review", "-"],
        &[],
        Some("apiVersion: v1\nkind: Pod\nspec: [unclosed\n"),
    );
    assert_exit(&run, 2);
    assert!(one_line(&run.stderr).contains("stdin"), "{}", run.stderr);
}

#[test]
fn init_container_user_outside_the_range_is_refused_at_start() {
    let input = fixture("list.json");
    for bad in ["0", "-1", "2147483648", "abc"] {
        for args in [
            vec![
                "review".to_string(),
                "--init-container-user".into(),
                bad.into(),
                input.clone(),
            ],
            vec![
                "review".to_string(),
                format!("--init-container-user={bad}"),
                input.clone(),
            ],
        ] {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let run = modelgate(&args);
            assert_exit(&run, 2);
            assert_eq!(run.stdout, "", "refused before reviewing anything");
            let line = one_line(&run.stderr);
            assert!(line.contains("--init-container-user"), "{bad}: {line}");
            assert!(line.contains("1..2147483647"), "{bad}: {line}");
        }
    }
    for good in ["1", "2147483647"] {
        let run = review(&["--init-container-user", good, &input]);
        assert_exit(&run, 0);
    }
    // The environment variable form.
    for bad in ["0", "-1", "2147483648", "abc"] {
        let run = modelgate_env(
            &["review", &input],
            &[("MODELGATE_INIT_CONTAINER_USER", bad)],
            None,
        );
        assert_exit(&run, 2);
        let line = one_line(&run.stderr);
        assert!(
            line.contains("--init-container-user")
                || line.contains("MODELGATE_INIT_CONTAINER_USER"),
            "{bad}: {line}"
        );
        assert!(line.contains("1..2147483647"), "{bad}: {line}");
    }
}

#[test]
fn other_invalid_flags_exit_2_with_one_line() {
    let input = fixture("list.json");
    for (args, names) in [
        (vec!["--run-as-user", "0"], "--run-as-user"),
        (vec!["--run-as-user", "2147483648"], "--run-as-user"),
        (vec!["--run-as-group=-1"], "--run-as-group"),
        (vec!["--run-as-user=-1"], "--run-as-user"),
        (vec!["--default-fsgroup", "abc"], "--default-fsgroup"),
        (vec!["--webhook", "all"], "--webhook"),
        (vec!["-o", "yaml"], "--output"),
        (
            vec!["--model-cache-prep", "sometimes"],
            "--model-cache-prep",
        ),
        (vec!["--no-such-flag"], "--no-such-flag"),
    ] {
        let mut all = vec!["review"];
        all.extend(args.iter().copied());
        all.push(&input);
        let run = modelgate(&all);
        assert_exit(&run, 2);
        assert_eq!(run.stdout, "");
        let line = one_line(&run.stderr);
        assert!(line.contains(names), "{args:?}: {line}");
    }
    // A negative value given as a separate word is refused too (clap reads it as an unknown
    // flag, so the message names the value rather than the flag).
    for flag in ["--run-as-user", "--run-as-group"] {
        let run = review(&[flag, "-1", &input]);
        assert_exit(&run, 2);
        assert!(one_line(&run.stderr).contains("-1"), "{}", run.stderr);
    }
    // `none` and the OpenShift preset are valid.
    let run = review(&[
        "--run-as-user",
        "none",
        "--run-as-group",
        "none",
        "--default-fsgroup",
        "0",
        "-o",
        "patched-json",
        &input,
    ]);
    assert_exit(&run, 0);
    assert_eq!(
        run.json_lines()[0]["spec"]["securityContext"],
        json!({"runAsNonRoot": true})
    );
}

// ---------------------------------------------------------------------------------------------
// The corpus samples, as a new user would run them
// ---------------------------------------------------------------------------------------------

#[test]
fn kserve_samples_are_allowed_and_the_job_gets_the_policy() {
    let Some(corpus) = corpus_dir() else { return };
    let samples = corpus.join("kserve/samples");
    let mut files: Vec<String> = std::fs::read_dir(&samples)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    files.sort();
    let caches = corpus.join("kserve/localmodelcache_readme_objects.yaml");
    let caches = caches.to_string_lossy();
    let mut args = vec!["--caches", &*caches];
    args.extend(files.iter().map(String::as_str));
    let run = review(&args);
    assert_exit(&run, 0);
    // The README's InferenceService in --caches is not a cache object: noted, not refused.
    assert!(run.stderr.contains("InferenceService"), "{}", run.stderr);
    let lines = run.lines();
    assert_eq!(lines.len(), files.len(), "{}", run.stdout);
    for line in &lines {
        if line.contains(": Job ") {
            assert!(
                line.contains("Job default/deepseek-r1-0528-storage-init-job: allowed"),
                "{line}"
            );
            assert!(!line.contains("warnings"), "{line}");
        } else if line.contains("LLMInferenceService") {
            // Partial templates (docs/policy.md §12): the vLLM CPU sample's explicit
            // `runAsNonRoot: false` is a warning naming its path, never a denial.
            assert!(line.contains("allowed, 0 patch operations"), "{line}");
            assert!(
                line.contains(
                    "spec.template.containers[0].securityContext.runAsNonRoot: false is not \
                     allowed (a partial template"
                ),
                "{line}"
            );
        } else {
            assert!(line.contains("InferenceService"), "{line}");
            assert!(line.contains("allowed, 0 patch operations"), "{line}");
            // serving.kserve.io/v1alpha2 InferenceService (an old sample) is no version KServe
            // serves, so not a row of the table.
            assert!(
                !line.contains("warnings")
                    || line.ends_with(
                        "warnings: modelgate does not handle \
                         serving.kserve.io/v1alpha2/InferenceService; allowed without changes"
                    ),
                "{line}"
            );
        }
    }
    let job = samples.join("storage__pvc-init__job.yaml");
    let run = review(&["-o", "patched-json", &job.to_string_lossy()]);
    let job = &run.json_lines()[0];
    assert_eq!(
        job["spec"]["template"]["spec"]["securityContext"],
        default_identity()
    );
    assert!(
        job["spec"]["template"]["spec"]
            .get("initContainers")
            .is_none(),
        "its volume is not the cache"
    );
    // Named as the cache, the PVC gets the prep container.
    let run = review(&[
        "-o",
        "patched-json",
        "--cache-volume",
        "pvc",
        &samples
            .join("storage__pvc-init__job.yaml")
            .to_string_lossy(),
    ]);
    assert_exit(&run, 0);
    let spec = &run.json_lines()[0]["spec"]["template"]["spec"];
    assert_eq!(spec["initContainers"][0]["name"], "model-cache-prep");
    assert_eq!(spec["securityContext"]["fsGroup"], 102);
}

#[test]
fn kyverno_samples_give_the_answers_spec_md_predicts() {
    let Some(corpus) = corpus_dir() else { return };
    let k = corpus.join("kyverno");
    let path = |p: &str| k.join(p).to_string_lossy().into_owned();

    // runAsUser 0 at pod or container level: denied, naming the field; exit 1.
    let run = review(&[&path("require-run-as-non-root-user/resource.yaml")]);
    assert_exit(&run, 1);
    let lines = run.lines();
    assert_eq!(lines.len(), 48);
    let denied: Vec<&&str> = lines.iter().filter(|l| l.contains(": denied: ")).collect();
    assert_eq!(
        denied.len(),
        18,
        "the six bad pods, and the six bad Deployments and CronJobs by their templates:\n{}",
        run.stdout
    );
    let fields = [
        "spec.securityContext.runAsUser: 0",
        "spec.containers[0].securityContext.runAsUser: 0",
        "spec.containers[1].securityContext.runAsUser: 0",
        "spec.securityContext.runAsUser: 0",
        "spec.initContainers[0].securityContext.runAsUser: 0",
        "spec.initContainers[1].securityContext.runAsUser: 0",
    ];
    let expected = [
        ("Pod default/badpod", ""),
        ("Deployment default/baddeployment", "spec.template."),
        (
            "CronJob default/badcronjob",
            "spec.jobTemplate.spec.template.",
        ),
    ];
    for (i, line) in denied.iter().enumerate() {
        let (object, prefix) = expected[i / 6];
        let field = format!("{prefix}{}", fields[i % 6]);
        // The field, after the file and line it is on.
        assert!(
            line.contains(object) && line.contains(&format!(": {field}")),
            "{line}: {field}"
        );
        assert!(line.contains("resource.yaml:"), "{line}");
    }
    for line in lines
        .iter()
        .filter(|l| l.contains("/good") && (l.contains("Deployment ") || l.contains("CronJob ")))
    {
        assert!(line.ends_with("allowed, 0 patch operations"), "{line}");
    }

    // runAsNonRoot: every pod is repaired, so `both` allows all 76 documents ...
    let nonroot = path("require-run-as-nonroot/resource.yaml");
    let run = review(&[&nonroot]);
    assert_exit(&run, 0);
    assert_eq!(run.lines().len(), 76);
    let badpod02 = run
        .lines()
        .into_iter()
        .find(|l| l.contains("Pod default/badpod02:"))
        .unwrap();
    assert!(
        badpod02.contains("container01") && badpod02.contains("runAsNonRoot"),
        "{badpod02}"
    );
    // ... while the validating webhook alone refuses every pod with a container whose
    // effective runAsNonRoot is not true: the 16 bad pods, whether a container says false or
    // nobody says anything (docs/policy.md §6), and no good one.
    let run = review(&["--webhook", "validate", &nonroot]);
    assert_exit(&run, 1);
    let refused: Vec<String> = run
        .lines()
        .into_iter()
        .filter(|l| l.contains(": denied: "))
        .map(|l| l.split(": ").nth(1).unwrap().to_string())
        .collect();
    let expected: Vec<String> = (1..=16)
        .map(|n| format!("Pod default/badpod{n:02}"))
        .collect();
    assert_eq!(refused, expected);
    let badpod01 = run
        .lines()
        .into_iter()
        .find(|l| l.contains("Pod default/badpod01:"))
        .unwrap();
    assert!(
        badpod01.contains("spec.containers[0].securityContext.runAsNonRoot: not set"),
        "{badpod01}"
    );
    // The patched pods all validate and a second pass changes nothing.
    let patched = review(&["-o", "patched", &nonroot]);
    let again = modelgate_env(
        &["review", "-o", "patch", "--webhook", "both", "-"],
        &[],
        Some(&patched.stdout),
    );
    assert_exit(&again, 0);
    assert!(
        again.json_lines().iter().all(|p| p == &json!([])),
        "{}",
        again.stdout
    );

    // Windows pods chosen by nodeSelector only are Windows pods (docs/policy.md §1): runAsNonRoot, no uid.
    let run = review(&[
        "-o",
        "patched-json",
        &path("windows/pod-bad.yaml"),
        &path("windows/pod-good.yaml"),
    ]);
    assert_exit(&run, 0);
    for p in run.json_lines() {
        let sc = &p["spec"]["securityContext"];
        assert_eq!(sc["runAsNonRoot"], json!(true), "{p}");
        assert!(sc.get("runAsUser").is_none(), "{p}");
        assert!(sc.get("runAsGroup").is_none(), "{p}");
        assert!(sc["windowsOptions"].is_object());
    }

    // The mutation samples: inputs patched, Kyverno's own outputs left alone except pod02's
    // pod-level runAsNonRoot: false.
    let run = review(&[
        "-o",
        "patch",
        &path("mutation/add-default-securitycontext/chainsaw-test_pod-resources-patched.yaml"),
    ]);
    assert_exit(&run, 0);
    let patches = run.json_lines();
    assert_eq!(patches[0], json!([]));
    assert_eq!(
        patches[1].as_array().map(Vec::len),
        Some(1),
        "{}",
        run.stdout
    );
    assert_eq!(patches[1][0]["path"], "/spec/securityContext/runAsNonRoot");
    assert_eq!(patches[1][0]["value"], true);
}

#[test]
fn hand_written_reviews_missing_api_server_fields_still_run() {
    // gatekeeper's UPDATE samples carry only the operation and the object.
    let text = "kind: AdmissionReview\napiVersion: admission.k8s.io/v1beta1\nrequest:\n  operation: UPDATE\n  object:\n    apiVersion: v1\n    kind: Pod\n    metadata: {name: p}\n    spec:\n      containers:\n      - {name: c, image: x, securityContext: {runAsUser: 0}}\n";
    let run = modelgate_env(&["review", "-", "-o", "review"], &[], Some(text));
    assert_exit(&run, 0);
    let out = &run.json_lines()[0];
    assert_eq!(out["apiVersion"], "admission.k8s.io/v1beta1");
    assert_eq!(out["response"]["allowed"], true);
    assert!(
        out["response"].get("patch").is_none(),
        "UPDATE is never patched"
    );
}

#[test]
fn negative_ids_as_separate_words_name_the_flag() {
    for flag in ["--run-as-user", "--run-as-group"] {
        let run = modelgate(&["review", flag, "-1", "-"]);
        assert_exit(&run, 2);
        assert!(
            run.stderr.contains(flag) && run.stderr.contains("2147483647"),
            "{}",
            run.stderr
        );
        assert_eq!(run.stderr.trim().lines().count(), 1, "{}", run.stderr);
    }
}

#[test]
fn yaml_errors_name_the_document_and_the_file_line() {
    let run = modelgate_env(
        &["review", "-"],
        &[],
        Some("apiVersion: v1\nkind: Pod\n---\nkind: [\n"),
    );
    assert_exit(&run, 2);
    assert!(
        run.stderr
            .contains("stdin#2: not valid YAML: line 4, column"),
        "{}",
        run.stderr
    );
    assert!(run.stdout.is_empty());
}

#[test]
fn a_reader_that_leaves_early_does_not_turn_into_an_error() {
    // Two objects, the second denied; stdout is closed before anything is written.
    let text = "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec: {containers: [{name: c, image: x}]}\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: b}\nspec: {containers: [{name: c, image: x, securityContext: {runAsUser: 0}}]}\n";
    let mut child = cli::command(&["review", "-"])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Only the denial (stderr in every output mode), no error about the closed pipe.
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(
        lines[0].starts_with("stdin#2: Pod default/b: denied: "),
        "{stderr}"
    );
}

/// docs/policy.md §11 offline: `review` judges a controller's pod template as its pods will be, with
/// the template's own path, exit 1 on a denial; a Deployment is never patched.
#[test]
fn review_judges_controllers_by_their_pod_templates() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("controllers.yaml");
    std::fs::write(
        &file,
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: vllm, namespace: team-a}\n\
         spec:\n  selector: {matchLabels: {app: vllm}}\n  template:\n    metadata: {labels: {app: vllm}}\n    \
         spec:\n      containers:\n      - {name: server, image: vllm, securityContext: {runAsUser: 0}}\n\
         ---\napiVersion: batch/v1\nkind: CronJob\nmetadata: {name: nightly, namespace: team-a}\n\
         spec:\n  schedule: '@daily'\n  jobTemplate:\n    spec:\n      template:\n        spec:\n          \
         restartPolicy: Never\n          securityContext: {runAsUser: 0}\n          containers: [{name: c, image: x}]\n\
         ---\napiVersion: apps/v1\nkind: StatefulSet\nmetadata: {name: db, namespace: team-a}\n\
         spec:\n  serviceName: db\n  selector: {matchLabels: {app: db}}\n  template:\n    \
         metadata: {labels: {app: db}}\n    spec:\n      containers: [{name: c, image: x}]\n",
    )
    .unwrap();
    let path = file.to_string_lossy().into_owned();
    let run = review(&[&path]);
    assert_exit(&run, 1);
    assert!(
        run.stderr.contains(
            "controllers.yaml:10: spec.template.spec.containers[0].securityContext.runAsUser: 0 is outside 1..2147483647"
        ),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains(
            "controllers.yaml:22: spec.jobTemplate.spec.template.spec.securityContext.runAsUser: 0 is outside 1..2147483647"
        ),
        "{}",
        run.stderr
    );
    assert!(
        run.stdout
            .contains("StatefulSet team-a/db: allowed, 0 patch operations"),
        "{}",
        run.stdout
    );
    assert!(!run.stdout.contains("does not handle"), "{}", run.stdout);
    // Never a patch: -o patch prints none for the allowed one.
    let run = review(&["-o", "patch", &path]);
    assert_exit(&run, 1);
    assert!(!run.stdout.contains("\"op\""), "{}", run.stdout);
}

// ---------------------------------------------------------------------------------------------
// Hostile input: host paths, sizes, flags that reach a shell
// ---------------------------------------------------------------------------------------------

/// A pod whose model cache is the node directory `path`.
fn host_path_pod(path: &str) -> String {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "host", "namespace": "team-a"},
        "spec": {
            "volumes": [{"name": "model-cache", "hostPath": {"path": path}}],
            "containers": [{"name": "main", "image": "vllm",
                            "volumeMounts": [{"name": "model-cache", "mountPath": "/cache"}]}]
        }
    })
    .to_string()
}

/// docs/policy.md §4: no root prep on a node directory the pod chose, unless `--prep-host-path` (or
/// its environment variable) allows it; `review` says why in a warning.
#[test]
fn a_host_path_cache_gets_the_prep_only_under_an_allowed_prefix() {
    let patched = |args: &[&str], env: &[(&str, &str)], path: &str| {
        let mut all = vec!["review", "-o", "patched-json"];
        all.extend_from_slice(args);
        all.push("-");
        let run = modelgate_env(&all, env, Some(&host_path_pod(path)));
        assert_exit(&run, 0);
        run.json_lines().remove(0)
    };
    let etc = patched(&[], &[], "/etc");
    assert!(etc["spec"].get("initContainers").is_none(), "{etc}");
    assert_eq!(etc["spec"]["securityContext"]["runAsUser"], 101);
    let run = modelgate_env(&["review", "-"], &[], Some(&host_path_pod("/etc")));
    assert!(
        run.stdout.contains(
            "the cache volume is hostPath /etc on the node, outside --prep-host-path: no root model-cache-prep there"
        ),
        "{}",
        run.stdout
    );

    let allowed = patched(
        &["--prep-host-path", "/data/models/"],
        &[],
        "/data/models/llm",
    );
    assert_eq!(
        allowed["spec"]["initContainers"][0]["command"][2],
        "chown 0:102 /models && chmod g+rwX /models"
    );
    let from_env = patched(
        &[],
        &[("MODELGATE_PREP_HOST_PATH", "/srv,/data/models")],
        "/data/models/llm",
    );
    assert_eq!(
        from_env["spec"]["initContainers"],
        allowed["spec"]["initContainers"]
    );
    for outside in ["/data/models-evil", "/data/models/../../etc"] {
        let p = patched(&["--prep-host-path=/data/models"], &[], outside);
        assert!(p["spec"].get("initContainers").is_none(), "{outside}: {p}");
    }
    // The prep that one allowed pod got does not pass on another node directory.
    let mut elsewhere = allowed.clone();
    elsewhere["spec"]["volumes"][0]["hostPath"]["path"] = json!("/etc");
    let run = modelgate_env(
        &[
            "review",
            "--webhook",
            "validate",
            "--prep-host-path",
            "/data/models",
            "-",
        ],
        &[],
        Some(&elsewhere.to_string()),
    );
    assert_exit(&run, 1);
    assert!(
        run.stdout.contains("spec.initContainers[0]"),
        "{}",
        run.stdout
    );
}

#[test]
fn prep_host_path_and_mount_paths_are_checked_at_start() {
    let input = fixture("list.json");
    for (args, flag) in [
        (vec!["--prep-host-path", "data/models"], "--prep-host-path"),
        (vec!["--prep-host-path="], "--prep-host-path"),
        (
            vec!["--cache-mount-path", "/models; reboot"],
            "--cache-mount-path",
        ),
        (
            vec!["--cache-mount-path", "/my models"],
            "--cache-mount-path",
        ),
        (vec!["--cache-mount-path", "/$(id)"], "--cache-mount-path"),
        (vec!["--cache-mount-path", "models"], "--cache-mount-path"),
        (
            vec!["--model-mount-path", "mnt/models"],
            "--model-mount-path",
        ),
    ] {
        let mut all = vec!["review"];
        all.extend(args.iter().copied());
        all.push(&input);
        let run = modelgate(&all);
        assert_exit(&run, 2);
        assert_eq!(run.stdout, "");
        let line = one_line(&run.stderr);
        assert!(line.contains(flag), "{args:?}: {line}");
    }
    let run = modelgate_env(
        &["review", &input],
        &[("MODELGATE_PREP_HOST_PATH", "relative")],
        None,
    );
    assert_exit(&run, 2);
    // The cache mount path is normalised before it goes into the command.
    let run = modelgate_env(
        &["review", "-o", "patched-json", "--cache-mount-path", "/cache//root/", "-"],
        &[],
        Some(
            &json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                    "spec": {"volumes": [{"name": "model-cache", "persistentVolumeClaim": {"claimName": "c"}}],
                             "containers": [{"name": "c", "image": "x"}]}})
            .to_string(),
        ),
    );
    assert_exit(&run, 0);
    assert_eq!(
        run.json_lines()[0]["spec"]["initContainers"][0]["command"][2],
        "chown 0:102 /cache/root && chmod g+rwX /cache/root"
    );
}

/// docs/policy.md §7 through `review`: 2 000 containers with `runAsUser: 0` are denied with a message
/// that names 20 of them (the core's tests take 45 000 through the pipeline; reading that much
/// YAML in a debug build takes a minute here).
#[test]
fn a_huge_denial_is_printed_capped() {
    let containers: Vec<Value> = (0..2_000)
        .map(
            |i| json!({"name": format!("c{i}"), "image": "x", "securityContext": {"runAsUser": 0}}),
        )
        .collect();
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "many"},
                     "spec": {"containers": containers}});
    let run = modelgate_env(&["review", "-"], &[], Some(&pod.to_string()));
    assert_exit(&run, 1);
    assert!(run.stdout.len() < 64 << 10, "{} bytes", run.stdout.len());
    assert!(run.stdout.contains("; … and 1980 more. "), "{}", run.stdout);
    assert_eq!(run.stdout.matches("is outside 1..2147483647").count(), 20);
}

/// `review` decodes an AdmissionReview with `serve`'s decode: a review the server refuses as
/// malformed is refused by `review` with the server's own message, naming the file (exit 2).
#[test]
fn a_review_the_server_refuses_is_refused_with_the_server_s_message() {
    use modelgate::admission::{self, Context, Webhook};

    let config = modelgate::config::PolicyConfig::default();
    let index = modelgate::cache::CacheIndex::new();
    let ctx = Context {
        config: &config,
        caches: modelgate::policy::Caches::Ready(&index),
        namespaces: modelgate::namespaces::Namespaces::none(),
        now: None,
    };
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("review_cli_refused");
    std::fs::create_dir_all(&dir).unwrap();
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                     "spec": {"containers": [{"name": "c", "image": "x"}]}});
    let request = |field: &str, value: Value| {
        let mut request = json!({
            "uid": "u-1",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "default",
            "operation": "CREATE",
            "userInfo": {"username": "u"},
            "object": pod,
        });
        request[field] = value;
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request})
    };
    for (name, doc) in [
        ("dry-run-not-a-bool", request("dryRun", json!("yes"))),
        ("unknown-operation", request("operation", json!("EXPLODE"))),
        ("null-name", request("name", Value::Null)),
        ("kind-not-an-object", request("kind", json!("Pod"))),
    ] {
        let body = serde_json::to_vec(&doc).unwrap();
        let served = admission::review(Webhook::Validate, &body, &ctx);
        let answer: Value = serde_json::from_slice(&served.body).unwrap();
        assert_eq!(answer["response"]["allowed"], false, "{name}");
        assert_eq!(answer["response"]["status"]["code"], 400, "{name}");
        let message = answer["response"]["status"]["message"].as_str().unwrap();
        assert!(message.starts_with("request."), "{name}: {message}");

        let path = dir.join(format!("{name}.json"));
        std::fs::write(&path, &body).unwrap();
        let path = path.to_string_lossy().into_owned();
        let run = review(&[&path]);
        assert_exit(&run, 2);
        assert_eq!(run.stdout, "", "{name}");
        assert_eq!(
            one_line(&run.stderr),
            format!("error: {path}: {message}"),
            "{name}"
        );
    }
}

/// Files written by Windows tools: UTF-16 with a byte order mark (either order) and UTF-8 with
/// one are read as kubectl reads them; the same pod gives the same
/// line whatever the encoding.
#[test]
fn files_with_a_byte_order_mark_are_read_as_kubectl_reads_them() {
    let text = std::fs::read_to_string(fixture("../../examples/pod.yaml")).unwrap();
    let plain = review(&[&fixture("../../examples/pod.yaml")]);
    assert_exit(&plain, 0);
    let dir = tempfile::tempdir().unwrap();
    let mut encodings: Vec<(&str, Vec<u8>)> = vec![("utf-8-bom", vec![0xEF, 0xBB, 0xBF])];
    encodings[0].1.extend_from_slice(text.as_bytes());
    let (mut le, mut be) = (vec![0xFF, 0xFE], vec![0xFE, 0xFF]);
    for unit in text.encode_utf16() {
        le.extend_from_slice(&unit.to_le_bytes());
        be.extend_from_slice(&unit.to_be_bytes());
    }
    encodings.push(("utf-16le", le));
    encodings.push(("utf-16be", be));
    let line = |out: &str, origin: &str| out.replacen(origin, "<input>", 1);
    let want = line(&plain.stdout, &fixture("../../examples/pod.yaml"));
    for (name, bytes) in encodings {
        let path = dir.path().join(format!("{name}.yaml"));
        std::fs::write(&path, &bytes).unwrap();
        let path = path.display().to_string();
        let run = review(&[&path]);
        assert_exit(&run, 0);
        assert_eq!(line(&run.stdout, &path), want, "{name}");
    }
    // A UTF-16 file cut in the middle of a character is an error naming the file.
    let cut = dir.path().join("cut.yaml");
    std::fs::write(&cut, [0xFF, 0xFE, b'k', 0, b'i']).unwrap();
    let run = review(&[&cut.display().to_string()]);
    assert_exit(&run, 2);
    assert!(
        run.stderr.contains("cut.yaml: cannot read: UTF-16"),
        "{}",
        run.stderr
    );
}

/// `review` takes claims from its `--caches` files (docs/policy.md, "Claims whose volume the
/// tenant picked"): a claim bound by name there gets no prep, with the warning; one absent from
/// them is taken as provisioned, with a note; `--prep-volume-type prebound` and
/// `--prep-storage-class` (and their environment variables) apply as in `serve`.
#[test]
fn review_judges_claims_from_the_caches_files() {
    let dir = tempfile::tempdir().unwrap();
    let claims = dir.path().join("claims.yaml");
    std::fs::write(
        &claims,
        "apiVersion: v1\nkind: PersistentVolumeClaim\n\
         metadata: {name: static, namespace: team-a}\n\
         spec: {volumeName: nfs-root, storageClassName: manual}\nstatus: {phase: Bound}\n",
    )
    .unwrap();
    let pod = |claim: &str| {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "team-a"},
            "spec": {
                "volumes": [{"name": "model-cache", "persistentVolumeClaim": {"claimName": claim}}],
                "containers": [{"name": "main", "image": "vllm",
                                "volumeMounts": [{"name": "model-cache", "mountPath": "/cache"}]}]
            }
        })
        .to_string()
    };
    let claims = claims.to_str().unwrap();
    // The review's text, and whether the patched pod has the prep.
    let run = |args: &[&str], env: &[(&str, &str)], claim: &str| {
        let mut all = vec!["review", "--caches", claims];
        all.extend_from_slice(args);
        all.push("-");
        let text = modelgate_env(&all, env, Some(&pod(claim)));
        assert_exit(&text, 0);
        all.splice(1..1, ["-o", "patched-json"]);
        let patched = modelgate_env(&all, env, Some(&pod(claim)));
        assert_exit(&patched, 0);
        let prep =
            patched.json_lines()[0]["spec"]["initContainers"][0]["name"] == "model-cache-prep";
        (prep, text.stdout)
    };
    let (prep, picked) = run(&[], &[], "static");
    assert!(!prep, "{picked}");
    assert!(
        picked.contains("claim static names its volume (spec.volumeName or spec.selector)"),
        "{picked}"
    );
    let (prep, absent) = run(&[], &[], "elsewhere");
    assert!(prep, "{absent}");
    assert!(absent.contains("taken as provisioned"), "{absent}");

    let (prep, prebound) = run(&["--prep-volume-type", "prebound"], &[], "static");
    assert!(prep, "{prebound}");
    let env = [
        ("MODELGATE_PREP_VOLUME_TYPE", "prebound"),
        ("MODELGATE_PREP_STORAGE_CLASS", "fast"),
    ];
    let (prep, other_class) = run(&[], &env, "static");
    assert!(!prep, "{other_class}");
    assert!(
        other_class
            .contains("claim static is of storage class manual, not one of --prep-storage-class"),
        "{other_class}"
    );
    // A storage class name is checked at start.
    let bad = modelgate_env(
        &["review", "--prep-storage-class", "Fast_NFS", "-"],
        &[],
        Some("{}"),
    );
    assert_exit(&bad, 2);
    assert!(
        bad.stderr.contains("--prep-storage-class"),
        "{}",
        bad.stderr
    );
}
