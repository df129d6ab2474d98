//! `modelgate audit` end to end: the real binary on files, and against the fake API server
//! (tests/support/fake_apiserver.rs) with paged lists, a forbidden namespace and expired
//! continue tokens. Exit codes as `review`: 0 all allowed, 1 any denied, 2 bad input or a
//! cluster that could not be read completely (and then nothing on stdout).

#[path = "support/audit.rs"]
mod audit_support;
#[path = "common/cli.rs"]
mod cli;
mod support;

use std::process::{Command, Stdio};

use audit_support::{REPORT_APIS, ReportApi, audit_cluster, check_results, rule_result};
use cli::{Run, assert_exit, fixture};
use serde_json::{Value, json};
use support::fake_apiserver::{FakeApiServer, NAMESPACES, WorkloadList};

fn audit(args: &[&str]) -> Run {
    let mut all = vec!["audit"];
    all.extend_from_slice(args);
    cli::modelgate(&all)
}

fn json(run: &Run) -> Value {
    serde_json::from_str(&run.stdout).unwrap_or_else(|e| panic!("{e}: {}", run.stdout))
}

#[test]
fn files_are_counted_per_namespace_and_rule_with_each_denial() {
    let run = audit(&[&fixture("audit-workloads.yaml")]);
    assert_exit(&run, 1);
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(lines[0], "NAMESPACE  OBJECTS  PATCHED  DENIED  UNCHANGED");
    for row in [
        "locked     1        1        0       0",
        "team-a     2        0        1       1",
        "team-b     4        3        0       1",
        "(all)      7        4        1       2",
        "non-root (§3)     7        3        1       3",
        "cache-prep (§4)   7        2        0       5",
        "model-cache (§5)  7        1        0       6",
        "schema (§6)       7        0        0       7",
        "Not evaluated, exempt namespaces: kube-system (1)",
        "note: ReplicaSet controlled by a Deployment: 1, counted through the owner's template",
        "note: not workloads, skipped: Namespace (1), Service (1)",
    ] {
        assert!(lines.contains(&row), "{row:?} in\n{}", run.stdout);
    }
    let denial = lines
        .iter()
        .find(|l| l.starts_with("Deployment team-a/web ("))
        .unwrap_or_else(|| panic!("{}", run.stdout));
    assert!(
        denial.contains(
            "audit-workloads.yaml#2): spec.template.spec.containers[0].securityContext.runAsUser: 0 is outside 1..2147483647"
        ),
        "{denial}"
    );
    // Not a terminal: no progress line.
    assert_eq!(run.stderr, "");
}

#[test]
fn json_and_junit_reports() {
    let run = audit(&["-o", "json", &fixture("audit-workloads.yaml")]);
    assert_exit(&run, 1);
    let report = json(&run);
    assert_eq!(report["source"], "files");
    assert_eq!(
        (
            &report["objects"],
            &report["patched"],
            &report["denied"],
            &report["unchanged"]
        ),
        (&json!(7), &json!(4), &json!(1), &json!(2))
    );
    assert_eq!(
        report["namespaces"]["team-b"]["rules"]["cache-prep"],
        json!({"patched": 1, "denied": 0, "unchanged": 3})
    );
    assert_eq!(report["denials"][0]["kind"], "Deployment");
    assert_eq!(report["denials"][0]["rules"], json!(["non-root"]));
    assert_eq!(report["exempt"], json!({"kube-system": 1}));

    let run = audit(&["-o", "junit", &fixture("audit-workloads.yaml")]);
    assert_exit(&run, 1);
    let xml = &run.stdout;
    assert!(
        xml.contains(r#"<testsuites name="modelgate audit" tests="7" failures="1" errors="0">"#),
        "{xml}"
    );
    assert!(
        xml.contains(r#"<testsuite name="team-a" tests="2" failures="1""#),
        "{xml}"
    );
    // Pod Security restricted: no root prep for the CronJob, which is still patched (§9).
    let cron = xml
        .split("<testcase")
        .find(|c| c.contains("CronJob locked/nightly"))
        .unwrap();
    assert!(!cron.contains("model-cache-prep"), "{cron}");
    assert!(
        cron.contains(
            "would set spec.jobTemplate.spec.template.spec.securityContext.runAsUser=101"
        ),
        "{cron}"
    );
    let agent = xml
        .split("<testcase")
        .find(|c| c.contains("DaemonSet team-b/agent"))
        .unwrap();
    assert!(agent.contains("would inject model-cache-prep"), "{agent}");
}

#[test]
fn all_allowed_exits_0_and_bad_input_exits_2_without_a_report() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.yaml");
    std::fs::write(
        &good,
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: a}\nspec:\n  securityContext: {runAsNonRoot: yes, runAsUser: 0o1750, runAsGroup: 1000}\n  containers: [{name: a, image: b}]\n",
    )
    .unwrap();
    let run = audit(&[good.to_str().unwrap()]);
    assert_exit(&run, 0);
    assert!(
        run.stdout
            .contains("(all)      1        0        0       1"),
        "{}",
        run.stdout
    );

    // A directory stands for its YAML and JSON files.
    std::fs::write(dir.path().join("notes.txt"), "not: [yaml").unwrap();
    std::fs::write(
        dir.path().join("more.json"),
        r#"{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "q", "namespace": "a"}, "spec": {"securityContext": {"runAsNonRoot": true, "runAsUser": 7, "runAsGroup": 7}, "containers": []}}"#,
    )
    .unwrap();
    let run = audit(&[dir.path().to_str().unwrap()]);
    assert_exit(&run, 0);
    assert!(
        run.stdout
            .contains("(all)      2        0        0       2"),
        "{}",
        run.stdout
    );

    let broken = dir.path().join("broken.yaml");
    std::fs::write(
        &broken,
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\nspec: {replicas: 1}\n",
    )
    .unwrap();
    let run = audit(&[broken.to_str().unwrap()]);
    assert_exit(&run, 2);
    assert_eq!(run.stdout, "");
    assert!(
        run.stderr
            .contains("broken.yaml#2: spec.template is missing"),
        "{}",
        run.stderr
    );

    let yaml_error = dir.path().join("bad.yaml");
    std::fs::write(&yaml_error, "kind: Pod\nmetadata: [\n").unwrap();
    let run = audit(&[yaml_error.to_str().unwrap()]);
    assert_exit(&run, 2);
    assert!(
        run.stderr.contains("bad.yaml#1: not valid YAML: line 2"),
        "{}",
        run.stderr
    );

    let run = audit(&["--from-cluster", good.to_str().unwrap()]);
    assert_exit(&run, 2);
    assert!(run.stderr.contains("not both"), "{}", run.stderr);

    let run = audit(&["--page-size", "0", good.to_str().unwrap()]);
    assert_exit(&run, 2);

    let run = audit(&["--help"]);
    assert_exit(&run, 0);
    assert!(
        run.stdout
            .contains("Exit codes:\n  0  no object would be denied"),
        "{}",
        run.stdout
    );
}

/// The fixture's workloads, in the cluster (Namespaces included), with more pods so that lists
/// take several pages.
fn populate(api: &FakeApiServer) {
    audit_support::populate(api, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_is_read_in_pages_and_counted_as_the_same_objects_in_files() {
    let api = FakeApiServer::start(&[]).await;
    populate(&api);
    let run = audit_cluster(&api, &["--page-size", "2", "-o", "json"]).await;
    assert_exit(&run, 1);
    let report = json(&run);
    assert_eq!(report["source"], "cluster");
    // The fixture's 7 (the controlled ReplicaSet through its Deployment) and 5 more pods.
    assert_eq!(report["objects"], 12, "{report:#}");
    assert_eq!(report["namespaces"]["team-c"]["patched"], 5);
    assert_eq!(report["denied"], 1);
    assert_eq!(report["exempt"], json!({"kube-system": 1}));
    // Same objects, same answers as from files (the extra pods aside).
    let files = json(&audit(&["-o", "json", &fixture("audit-workloads.yaml")]));
    for ns in ["locked", "team-a", "team-b"] {
        assert_eq!(report["namespaces"][ns], files["namespaces"][ns], "{ns}");
    }
    // Pod Security labels came from the cluster's Namespaces: no root prep in `locked`.
    let junit = audit_cluster(&api, &["--page-size", "2", "-o", "junit"]).await;
    let cron = junit
        .stdout
        .split("<testcase")
        .find(|c| c.contains("CronJob locked/nightly"))
        .unwrap();
    assert!(!cron.contains("model-cache-prep"), "{cron}");

    // 8 pods in pages of 2: four calls, the last three continuing; every call says its limit.
    let pods: Vec<WorkloadList> = api
        .workload_lists()
        .into_iter()
        .filter(|l| l.plural == "pods")
        .take(4)
        .collect();
    assert_eq!(pods.len(), 4, "{pods:?}");
    assert!(
        pods.iter()
            .all(|l| l.limit == Some(2) && l.namespace.is_none()),
        "{pods:?}"
    );
    assert_eq!(
        pods.iter().map(|l| l.continued).collect::<Vec<_>>(),
        [false, true, true, true]
    );
    let kinds: std::collections::BTreeSet<String> =
        api.workload_lists().into_iter().map(|l| l.plural).collect();
    // Pods, Jobs and the built-in rows of the workload-kind table (the fake serves no custom
    // workload resource here).
    assert_eq!(kinds.len(), 8, "{kinds:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forbidden_namespace_is_named_and_no_partial_report_is_written() {
    let api = FakeApiServer::start(&[]).await;
    populate(&api);
    api.forbid_namespace("team-b");

    // The namespaces the user can read are audited completely.
    let run = audit_cluster(
        &api,
        &[
            "-n",
            "team-a",
            "-n",
            "team-c",
            "--page-size",
            "2",
            "-o",
            "json",
        ],
    )
    .await;
    assert_exit(&run, 1);
    let report = json(&run);
    assert_eq!(report["objects"], 7);
    assert_eq!(
        report["namespaces"]
            .as_object()
            .unwrap()
            .keys()
            .collect::<Vec<_>>(),
        ["team-a", "team-c"]
    );
    assert!(
        api.workload_lists().iter().all(|l| l.namespace.is_some()),
        "each namespace is listed on its own"
    );

    // One of them forbidden: the error names it, and stdout stays empty.
    let run = audit_cluster(&api, &["-n", "team-a", "-n", "team-b", "--page-size", "2"]).await;
    assert_exit(&run, 2);
    assert_eq!(run.stdout, "");
    assert!(
        run.stderr
            .contains("cannot list pods in namespace team-b: Forbidden (403): pods is forbidden"),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("no report is written"),
        "{}",
        run.stderr
    );

    // All namespaces without cluster-wide permission: the error says to name namespaces.
    let run = audit_cluster(&api, &[]).await;
    assert_exit(&run, 2);
    assert_eq!(run.stdout, "");
    assert!(
        run.stderr
            .contains("cannot list pods in all namespaces: Forbidden (403)")
            && run.stderr.contains("--namespace NS"),
        "{}",
        run.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_continue_token_ends_the_audit_with_a_clear_error() {
    let api = FakeApiServer::start(&[]).await;
    populate(&api);
    api.expire_continue_tokens(true);
    let run = audit_cluster(&api, &["--page-size", "3"]).await;
    assert_exit(&run, 2);
    assert_eq!(run.stdout, "");
    assert!(
        run.stderr
            .contains("cannot list pods in all namespaces: Expired (410)")
            && run.stderr.contains("run the audit again"),
        "{}",
        run.stderr
    );
}

/// Kyverno's `require-run-as-non-root-user` resources (the corpus): the same six bad
/// security contexts as Pods, Deployments and CronJobs. The controllers are denied exactly where
/// their pods are, with the field named in their own terms; the good ones are patched.
#[test]
fn controllers_in_the_kyverno_corpus_are_denied_where_their_pods_are() {
    let file = cli::inputs_dir().join("corpus/kyverno/require-run-as-non-root-user/resource.yaml");
    if !file.is_file() {
        cli::missing(&format!("the corpus ({})", file.display()));
        return;
    }
    let run = audit(&["-o", "json", file.to_str().unwrap()]);
    assert_exit(&run, 1);
    let report = json(&run);
    assert_eq!(
        (&report["objects"], &report["denied"], &report["patched"]),
        (&json!(48), &json!(18), &json!(30))
    );
    let denials = report["denials"].as_array().unwrap();
    let message = |kind: &str, name: &str| {
        denials
            .iter()
            .find(|d| d["kind"] == kind && d["name"] == name)
            .unwrap_or_else(|| panic!("{kind} {name} denied: {denials:#?}"))["message"]
            .as_str()
            .unwrap()
            .to_string()
    };
    for i in 1..=6 {
        let pod = message("Pod", &format!("badpod0{i}"));
        assert!(pod.starts_with("spec."), "{pod}");
        assert_eq!(
            message("Deployment", &format!("baddeployment0{i}")),
            format!("spec.template.{pod}")
        );
        assert_eq!(
            message("CronJob", &format!("badcronjob0{i}")),
            format!("spec.jobTemplate.spec.template.{pod}")
        );
    }
}

/// On a terminal (a pseudo-terminal from Python's `pty`, which the test command needs anyway),
/// stderr gets a progress line, erased at the end; the pipe of the other tests gets none.
#[test]
fn a_terminal_gets_a_progress_line_that_is_erased_at_the_end() {
    let spawned = Command::new("python3")
        .args([
            "-c",
            "import pty, sys; sys.exit(pty.spawn(sys.argv[1:]) >> 8)",
        ])
        .arg(env!("CARGO_BIN_EXE_modelgate"))
        .args(["audit", "-o", "json", &fixture("audit-workloads.yaml")])
        .env("KUBECONFIG", "/nonexistent")
        .stdin(Stdio::null())
        .output();
    let Ok(out) = spawned else {
        cli::missing("python3");
        return;
    };
    // The terminal merges stdout and stderr, and turns \n into \r\n.
    let screen = String::from_utf8_lossy(&out.stdout);
    assert!(
        screen.contains("\r\x1b[Kaudit: evaluated 1 objects"),
        "{screen:?}"
    );
    let erased = screen.rfind("\r\x1b[K").unwrap();
    let report_starts = screen.find('{').unwrap();
    assert!(
        erased < report_starts,
        "erased before the report: {screen:?}"
    );
    assert_eq!(out.status.code(), Some(1), "{screen:?}");
}

/// The cluster's Namespaces are read by metadata only, as `serve` reads them; a `--caches`
/// Namespace replaces the cluster's of the same name; Namespaces that cannot be listed leave a
/// note rather than end the audit (only their Pod Security labels are read).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_namespaces_by_metadata_with_caches_files_in_their_place() {
    let api = FakeApiServer::start(&[]).await;
    populate(&api);
    let prep_in_locked = |run: &Run| {
        run.stdout
            .split("<testcase")
            .find(|c| c.contains("CronJob locked/nightly"))
            .unwrap_or_else(|| panic!("{}", run.stdout))
            .contains("model-cache-prep")
    };
    let run = audit_cluster(&api, &["-o", "junit"]).await;
    assert!(!prep_in_locked(&run), "locked is restricted in the cluster");
    let counts = api.counts(NAMESPACES);
    assert_eq!(counts.lists, 1);
    assert_eq!(counts.metadata_only, 1, "metadata only");

    // A --caches file's `locked` without the Pod Security label replaces the cluster's.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("namespaces.yaml");
    std::fs::write(
        &file,
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: locked}\n",
    )
    .unwrap();
    let caches = file.to_str().unwrap();
    let run = audit_cluster(&api, &["--caches", caches, "-o", "junit"]).await;
    assert!(prep_in_locked(&run), "the file's locked is not restricted");

    // Namespaces refused: a note that says what is unknown, and the audit goes on.
    api.fail_lists(NAMESPACES, Some(403));
    let run = audit_cluster(&api, &["-o", "json"]).await;
    assert_exit(&run, 1);
    let notes = json(&run)["notes"].to_string();
    assert!(
        notes.contains("cannot list namespaces (") && notes.contains("(403)"),
        "{notes}"
    );
}

// --- Policy reports (-o openreports, -o policyreport) ------------------------------------------

/// The documents of a YAML stream on stdout.
fn documents(run: &Run) -> Vec<Value> {
    modelgate::documents::read_documents("stdout", &run.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", run.stdout))
        .into_iter()
        .map(|d| d.value)
        .collect()
}

/// The report of `kind` `namespace/name` among `reports`.
fn report_of<'a>(reports: &'a [Value], kind: &str, namespace: &str, name: &str) -> &'a Value {
    reports
        .iter()
        .find(|r| {
            r["scope"]["kind"] == kind
                && r["scope"]["namespace"] == namespace
                && r["scope"]["name"] == name
        })
        .unwrap_or_else(|| panic!("no report for {kind} {namespace}/{name}: {reports:#?}"))
}

/// `value` against a structural schema, strictly: `type`, `enum`, `required`, `format: int32`,
/// and no field the schema does not know (the API server would silently drop it).
fn schema_errors(schema: &Value, value: &Value, path: &str, errors: &mut Vec<String>) {
    let ty = schema["type"].as_str().unwrap_or("");
    let ok = match ty {
        "object" => value.is_object(),
        "array" => value.is_array(),
        "string" => value.is_string(),
        "integer" => value.is_i64() || value.is_u64(),
        "boolean" => value.is_boolean(),
        _ => true,
    };
    if !ok {
        errors.push(format!("{path}: {value} is not {ty}"));
        return;
    }
    if let Some(allowed) = schema["enum"].as_array()
        && !allowed.contains(value)
    {
        errors.push(format!("{path}: {value} not in {allowed:?}"));
    }
    if schema["format"] == "int32" && value.as_i64().and_then(|n| i32::try_from(n).ok()).is_none() {
        errors.push(format!("{path}: {value} is not an int32"));
    }
    match value {
        Value::Object(map) => {
            for required in schema["required"].as_array().into_iter().flatten() {
                if !map.contains_key(required.as_str().unwrap()) {
                    errors.push(format!("{path}: {required} is required"));
                }
            }
            // `metadata` is checked by the API server itself, not by the CRD's schema.
            if path == "metadata" {
                return;
            }
            for (key, v) in map {
                let sub = if schema["properties"][key].is_object() {
                    &schema["properties"][key]
                } else if schema["additionalProperties"].is_object() {
                    &schema["additionalProperties"]
                } else {
                    errors.push(format!("{path}.{key}: unknown to the schema"));
                    continue;
                };
                let at = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                schema_errors(sub, v, &at, errors);
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                schema_errors(&schema["items"], v, &format!("{path}[{i}]"), errors);
            }
        }
        _ => {}
    }
}

/// What every report must be, whatever its workload: valid for its CRD, the prune label, a
/// valid stable name, one complete result per rule and a summary that counts them.
fn check_well_formed(report: &Value, api: ReportApi) {
    let what = format!(
        "{} {}",
        report["metadata"]["namespace"], report["metadata"]["name"]
    );
    let mut errors = Vec::new();
    schema_errors(api.schema(), report, "", &mut errors);
    assert_eq!(errors, Vec::<String>::new(), "{what}: {report:#}");
    assert_eq!(report["apiVersion"], api.api_version, "{what}");
    assert_eq!(report["kind"], api.kind, "{what}");
    assert_eq!(
        report["metadata"]["labels"],
        json!({"app.kubernetes.io/managed-by": "modelgate"}),
        "{what}"
    );
    assert_eq!(
        report["metadata"]["namespace"], report["scope"]["namespace"],
        "{what}"
    );
    let name = report["metadata"]["name"].as_str().unwrap();
    assert!(
        name.len() <= 253
            && name.starts_with("modelgate-")
            && name.split('.').all(|l| !l.is_empty()
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')),
        "{name}"
    );
    check_results(&what, report);
}

/// `--from-cluster`-less reports of the fixture: a denied Deployment fails its rule with the
/// denial's message in the Deployment's terms; every patched workload carries the JSON Patch
/// enforcing would apply, in the workload's own terms, and the workload with that patch applied
/// is audited as passing (nothing left to change or deny).
#[test]
fn reports_fail_a_denied_workload_and_carry_the_patch_of_a_patched_one() {
    let run = audit(&["-o", "openreports", &fixture("audit-workloads.yaml")]);
    assert_exit(&run, 1);
    let reports = documents(&run);
    // Seven workloads evaluated (the owned ReplicaSet and kube-system's Pod are not).
    assert_eq!(reports.len(), 7, "{}", run.stdout);

    let web = report_of(&reports, "Deployment", "team-a", "web");
    let non_root = rule_result(web, "non-root");
    assert_eq!(non_root["result"], "fail", "{web:#}");
    assert_eq!(non_root["severity"], "high");
    assert_eq!(
        non_root["message"],
        "spec.template.spec.containers[0].securityContext.runAsUser: 0 is outside \
         1..2147483647. Use a uid in 1..2147483647, or leave runAsUser unset and modelgate sets one."
    );
    assert_eq!(web["summary"]["fail"], 1);
    assert_eq!(web["metadata"]["name"], "modelgate-deployment-web");
    assert!(
        web["metadata"].get("ownerReferences").is_none(),
        "no uid, no owner"
    );
    assert_eq!(
        web["scope"],
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "namespace": "team-a"})
    );

    let untouched = report_of(&reports, "StatefulSet", "team-a", "db");
    assert_eq!(rule_result(untouched, "non-root")["result"], "pass");
    assert_eq!(rule_result(untouched, "cache-prep")["result"], "skip");
    assert_eq!(rule_result(untouched, "model-cache")["result"], "skip");

    let llm = report_of(&reports, "Pod", "team-b", "llm");
    let cache = rule_result(llm, "model-cache");
    assert_eq!(cache["result"], "warn", "{llm:#}");
    assert_eq!(cache["properties"]["modelCacheOutcome"], "miss");
    assert_eq!(cache["properties"]["modelCacheReason"], "no-match");

    let agent = report_of(&reports, "DaemonSet", "team-b", "agent");
    let prep = rule_result(agent, "cache-prep");
    assert_eq!(prep["result"], "warn", "{agent:#}");
    assert!(
        prep["message"]
            .as_str()
            .unwrap()
            .contains("would inject model-cache-prep"),
        "{prep}"
    );

    // Apply each patch to its workload as written in the file.
    let text = std::fs::read_to_string(fixture("audit-workloads.yaml")).unwrap();
    let mut objects: Vec<Value> = modelgate::documents::read_documents("fixture", &text)
        .unwrap()
        .into_iter()
        .map(|d| d.value)
        .collect();
    let mut patched = 0;
    for report in &reports {
        let patches: Vec<&str> = report["results"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|r| r["properties"]["patch"].as_str())
            .collect();
        let Some(patch) = patches.first() else {
            continue;
        };
        // Without attribution of each operation to its rule, every patched rule carries the
        // whole patch.
        assert!(patches.iter().all(|p| p == patch), "{report:#}");
        let patch: json_patch::Patch = serde_json::from_str(patch).unwrap();
        let scope = &report["scope"];
        let object = objects
            .iter_mut()
            .find(|o| {
                o["kind"] == scope["kind"]
                    && o["metadata"]["name"] == scope["name"]
                    && o["metadata"]["namespace"] == scope["namespace"]
            })
            .unwrap_or_else(|| panic!("{scope}"));
        json_patch::patch(object, &patch).unwrap_or_else(|e| panic!("{scope}: {e}"));
        patched += 1;
    }
    assert_eq!(patched, 4, "the four workloads the table counts as patched");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("patched.yaml");
    let stream: Vec<String> = objects
        .iter()
        .filter(|o| o["metadata"]["name"] != "web")
        .map(|o| serde_json::to_string(o).unwrap())
        .collect();
    std::fs::write(&file, stream.join("\n---\n")).unwrap();
    let again = audit(&["-o", "openreports", file.to_str().unwrap()]);
    assert_exit(&again, 0);
    let again = documents(&again);
    assert_eq!(again.len(), 6, "every workload but web: {again:#?}");
    for report in again {
        for r in report["results"].as_array().unwrap() {
            assert!(
                r["result"] == "pass" || r["result"] == "skip",
                "{} after its patch: {r}",
                report["scope"]
            );
        }
    }
}

/// Both APIs, each valid for its pinned CRD; the same names on every run (and the same bytes
/// with SOURCE_DATE_EPOCH); a workload whose uid is known is named by it and owns its report.
#[test]
fn both_report_apis_are_valid_for_their_crds_with_names_stable_across_runs() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("w.yaml");
    std::fs::write(
        &file,
        format!(
            "{}\n---\n{}",
            std::fs::read_to_string(fixture("audit-workloads.yaml")).unwrap(),
            r#"{"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "Odd_Name", "namespace": "team-c",
                             "uid": "6c2f7e0a-93b1-4d55-a0f2-0d2a3c4b5e6f"},
                "spec": {"template": {"spec": {"containers": [{"name": "a", "image": "b"}]}}}}"#
        ),
    )
    .unwrap();
    let file = file.to_str().unwrap();
    for api in REPORT_APIS {
        let output = api.output;
        let epoch = [("SOURCE_DATE_EPOCH", "1700000000")];
        let first = cli::modelgate_env(&["audit", "-o", output, file], &epoch, None);
        let second = cli::modelgate_env(&["audit", "-o", output, file], &epoch, None);
        assert_exit(&first, 1);
        assert_eq!(first.stdout, second.stdout, "{output}: the same bytes");
        let third = audit(&["-o", output, file]);
        let names = |run: &Run| -> Vec<Value> {
            documents(run)
                .iter()
                .map(|r| r["metadata"]["name"].clone())
                .collect()
        };
        assert_eq!(names(&first), names(&third), "{output}: the same names");
        let reports = documents(&first);
        assert_eq!(reports.len(), 8);
        for report in &reports {
            check_well_formed(report, api);
            for r in report["results"].as_array().unwrap() {
                assert_eq!(r["timestamp"], json!({"seconds": 1700000000, "nanos": 0}));
            }
        }
        // Only the OpenReports CRD has a report-level source.
        assert_eq!(
            reports[0].get("source").is_some(),
            output == "openreports",
            "{output}"
        );
        let owned = report_of(&reports, "Deployment", "team-c", "Odd_Name");
        assert_eq!(
            owned["metadata"]["name"],
            "modelgate-6c2f7e0a-93b1-4d55-a0f2-0d2a3c4b5e6f"
        );
        assert_eq!(
            owned["metadata"]["ownerReferences"],
            json!([{"apiVersion": "apps/v1", "kind": "Deployment", "name": "Odd_Name",
                    "uid": "6c2f7e0a-93b1-4d55-a0f2-0d2a3c4b5e6f"}])
        );
        assert_eq!(
            owned["scope"]["uid"],
            "6c2f7e0a-93b1-4d55-a0f2-0d2a3c4b5e6f"
        );
    }
}

/// Every workload of the corpus (.inputs/corpus: Kyverno's, Pod Security's, Istio's and
/// Gatekeeper's objects) gets a report valid for both CRDs, and two different workloads never
/// share a report name.
#[test]
fn corpus_workloads_get_well_formed_reports() {
    let Some(corpus) = cli::corpus_dir() else {
        return;
    };
    let inputs: Vec<String> = [
        "kyverno/require-run-as-nonroot",
        "kyverno/require-run-as-non-root-user",
        "kyverno/windows",
        "kyverno/mutation/add-default-securitycontext",
        "kyverno/mutation/apply-pss-restricted-profile",
        "psa",
        "istio",
        "gatekeeper/fsgroup",
        "gatekeeper/mutation",
        "gatekeeper/validation",
        "kserve/samples",
    ]
    .iter()
    .map(|p| corpus.join(p).display().to_string())
    .collect();
    for api in REPORT_APIS {
        let output = api.output;
        let mut seen = std::collections::BTreeMap::new();
        let mut total = 0;
        // One directory per run: files in different directories reuse object names.
        for input in &inputs {
            let run = audit(&["-o", output, input]);
            assert!(run.code == 0 || run.code == 1, "{input}: {}", run.stderr);
            let reports = documents(&run);
            assert!(!reports.is_empty(), "{input}");
            total += reports.len();
            seen.clear();
            for report in &reports {
                check_well_formed(report, api);
                let scope = &report["scope"];
                let workload = (scope["kind"].to_string(), scope["name"].to_string());
                let name = (
                    report["metadata"]["namespace"].to_string(),
                    report["metadata"]["name"].to_string(),
                );
                if let Some(other) = seen.insert(name.clone(), workload.clone()) {
                    assert_eq!(other, workload, "{input}: {name:?} names two workloads");
                }
            }
        }
        assert!(total >= 150, "{output}: {total} reports");
    }
}

#[test]
fn write_reports_needs_the_cluster() {
    let run = audit(&["--write-reports", &fixture("audit-workloads.yaml")]);
    assert_exit(&run, 2);
    assert!(run.stdout.is_empty(), "{}", run.stdout);
    assert!(
        run.stderr.contains("--write-reports") && run.stderr.contains("--from-cluster"),
        "{}",
        run.stderr
    );
}

/// A privileged container is the `root-equivalent` rule's `warn`, never a denial: in the JSON
/// report's `warnings` (not its denials, nor its counts by rule, and the exit code says nothing
/// would be denied), in the table and the JUnit output, and in both policy reports, valid for
/// their CRDs, in the workload's own terms.
#[test]
fn a_privileged_container_is_a_root_equivalent_warning_in_every_output() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("privileged.yaml");
    std::fs::write(
        &file,
        "apiVersion: apps/v1
kind: Deployment
metadata: {name: vpn, namespace: team-a, uid: 0b7c3f2e-1111-4a2b-8c3d-000000000009}
spec:
  selector:
    matchLabels: {app: vpn}
  template:
    metadata:
      labels: {app: vpn}
    spec:
      securityContext: {runAsNonRoot: true, runAsUser: 1000, runAsGroup: 1000}
      containers:
      - {name: app, image: app:1}
      - name: tunnel
        image: wireguard:1
        securityContext: {privileged: true}
",
    )
    .unwrap();
    let file = file.to_str().unwrap();
    let field = "spec.template.spec.containers[1].securityContext.privileged";

    let run = audit(&["-o", "json", file]);
    assert_exit(&run, 0);
    let report = json(&run);
    assert_eq!(report["denials"], json!([]));
    assert_eq!(report["unchanged"], 1);
    assert!(
        report["rules"].get("root-equivalent").is_none(),
        "{report:#}"
    );
    let warnings = report["warnings"].as_array().unwrap();
    assert_eq!(warnings.len(), 1, "{report:#}");
    let w = &warnings[0];
    assert_eq!(
        (&w["namespace"], &w["kind"], &w["name"], &w["rule"]),
        (
            &json!("team-a"),
            &json!("Deployment"),
            &json!("vpn"),
            &json!("root-equivalent")
        )
    );
    assert_eq!(w["origin"], file, "{w}");
    let message = w["message"].as_str().unwrap();
    assert!(
        message.starts_with(&format!("{field}: true: ")),
        "{message}"
    );
    assert!(message.contains("Pod Security baseline"), "{message}");

    let run = audit(&[file]);
    assert_exit(&run, 0);
    assert!(
        run.stdout.contains(&format!(
            "WARNINGS (1):\nDeployment team-a/vpn ({file}): root-equivalent: {field}: true: "
        )),
        "{}",
        run.stdout
    );

    let run = audit(&["-o", "junit", file]);
    assert_exit(&run, 0);
    assert!(run.stdout.contains(r#"failures="0""#), "{}", run.stdout);
    assert!(
        run.stdout
            .contains(&format!("root-equivalent: {field}: true: ")),
        "{}",
        run.stdout
    );

    for api in REPORT_APIS {
        let run = audit(&["-o", api.output, file]);
        assert_exit(&run, 0);
        let reports = documents(&run);
        assert_eq!(reports.len(), 1, "{}", run.stdout);
        let report = &reports[0];
        check_well_formed(report, api);
        let result = rule_result(report, "root-equivalent");
        assert_eq!(result["result"], "warn", "{}: {report:#}", api.output);
        assert_eq!(result["severity"], "high");
        assert!(
            result["message"]
                .as_str()
                .unwrap()
                .starts_with(&format!("{field}: true: ")),
            "{result}"
        );
        assert!(result.get("properties").is_none(), "no patch: {result}");
        assert_eq!(rule_result(report, "non-root")["result"], "pass");
        assert_eq!(report["summary"]["warn"], 1, "{report:#}");
        assert_eq!(report["summary"]["fail"], 0, "{report:#}");
    }
}
