//! `modelgate audit --from-cluster --write-reports` end to end: the real binary against the fake
//! API server (tests/support/fake_apiserver.rs), which serves the report resources as the API
//! server serves custom resources (server-side apply checked against the pinned CRDs' schemas,
//! lists with label selectors and pages, deletes) and records every request.
//!
//! What must hold (docs/policy.md §10): one report per evaluated workload, applied with field manager
//! `modelgate` and owned by its workload; the same reports, updated in place, on the next run;
//! modelgate's reports (by label) whose workload is gone deleted, nobody else's, and only in
//! the namespaces audited; a refused write named with its object and the API's reason while the
//! others are still written (exit 2); nothing written or deleted when the workloads could not
//! all be listed. The exit code says whether the reports were written, not what they found: 0
//! with a denied workload among them, 1 for it only with `--fail-on-findings`.

#[path = "support/audit.rs"]
mod audit_support;
#[path = "common/cli.rs"]
mod cli;
mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use audit_support::{
    OPENREPORTS, POLICYREPORT, ReportApi, audit_cluster, check_results, rule_result,
};
use cli::{Run, assert_exit};
use serde_json::{Value, json};
use support::fake_apiserver::{FakeApiServer, NAMESPACES, POLICY_REPORTS, REPORTS, ReportRequest};

const MANAGED_BY: &str = "app.kubernetes.io/managed-by";

/// The workloads the audit evaluates in [`populate`]'s cluster: plural, namespace, name. The
/// fixture's ReplicaSet (counted through its Deployment) and kube-system Pod (exempt) get no
/// report.
const EVALUATED: [(&str, &str, &str); 9] = [
    ("deployments", "team-a", "web"),
    ("statefulsets", "team-a", "db"),
    ("cronjobs", "locked", "nightly"),
    ("daemonsets", "team-b", "agent"),
    ("jobs", "team-b", "convert"),
    ("pods", "team-b", "ok"),
    ("pods", "team-b", "llm"),
    ("pods", "team-c", "plain-0"),
    ("pods", "team-c", "plain-1"),
];

/// The fixture's workloads and Namespaces in the cluster, and two Pods without any security
/// context (patched) in team-c: `plain-0` and `plain-1`.
fn populate(api: &FakeApiServer) {
    audit_support::populate(api, 2);
}

/// The name of the report of a workload of the cluster.
fn report_name(api: &FakeApiServer, plural: &str, namespace: &str, name: &str) -> String {
    format!("modelgate-{}", api.workload_uid(plural, namespace, name))
}

/// (namespace, report name) → the workload, for every evaluated workload (or those in
/// `namespaces`, when given).
fn expected(api: &FakeApiServer, namespaces: &[&str]) -> BTreeMap<(String, String), Value> {
    EVALUATED
        .iter()
        .filter(|(_, ns, _)| namespaces.is_empty() || namespaces.contains(ns))
        .map(|&(plural, ns, name)| {
            (
                (ns.to_string(), report_name(api, plural, ns, name)),
                api.workload(plural, ns, name).unwrap(),
            )
        })
        .collect()
}

fn key(report: &Value) -> (String, String) {
    let get = |k: &str| {
        report["metadata"][k]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    (get("namespace"), get("name"))
}

fn keys(reports: &[Value]) -> BTreeSet<(String, String)> {
    reports.iter().map(key).collect()
}

/// A report of another writer, or one modelgate wrote for a workload since deleted.
fn stale_report(namespace: &str, name: &str, labels: Value) -> Value {
    json!({
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "scope": {"apiVersion": "v1", "kind": "Pod", "name": "gone", "namespace": namespace,
                  "uid": "00000000-0000-4000-8000-0000deadbeef"},
        "results": [{"policy": "modelgate", "rule": "non-root", "result": "pass", "source": "modelgate"}],
        "summary": {"pass": 1},
    })
}

fn ours() -> Value {
    json!({MANAGED_BY: "modelgate"})
}

/// Everything a report of `workload` must say, in the API's own shape.
fn check_report(api: ReportApi, report: &Value, workload: &Value) {
    let what = format!("{} {:?}", api.kind, key(report));
    let meta = &workload["metadata"];
    assert_eq!(report["apiVersion"], api.api_version, "{what}");
    assert_eq!(report["kind"], api.kind, "{what}");
    assert_eq!(
        report["metadata"]["name"],
        format!("modelgate-{}", meta["uid"].as_str().unwrap()),
        "{what}"
    );
    assert_eq!(report["metadata"]["namespace"], meta["namespace"], "{what}");
    assert_eq!(
        report["metadata"]["labels"][MANAGED_BY], "modelgate",
        "{what}"
    );
    // Owned by the workload, so that the garbage collector takes the report with it.
    let owners = report["metadata"]["ownerReferences"]
        .as_array()
        .unwrap_or_else(|| panic!("{what}: no ownerReferences: {report:#}"));
    assert_eq!(owners.len(), 1, "{what}: {owners:?}");
    for field in ["apiVersion", "kind"] {
        assert_eq!(
            owners[0][field], workload[field],
            "{what}: ownerReferences[0].{field}"
        );
    }
    for field in ["name", "uid"] {
        assert_eq!(
            owners[0][field], meta[field],
            "{what}: ownerReferences[0].{field}"
        );
    }
    // Scoped to it.
    let scope = &report["scope"];
    assert_eq!(scope["apiVersion"], workload["apiVersion"], "{what}");
    assert_eq!(scope["kind"], workload["kind"], "{what}");
    for field in ["name", "namespace", "uid"] {
        assert_eq!(scope[field], meta[field], "{what}: scope.{field}");
    }
    if api.plural == REPORTS {
        // Only the OpenReports Report has a report-level source.
        assert_eq!(report["source"], "modelgate", "{what}");
    }
    check_results(&what, report);
}

/// The count of what `--write-reports` did, as stderr says it: `reports: <counts>`.
fn assert_summary(run: &Run, counts: &str) {
    assert!(
        run.stderr.contains(&format!("reports: {counts}")),
        "reports: {counts} in\n{}",
        run.stderr
    );
}

/// The line of stderr that names `report` (`Kind namespace/name`).
fn line_naming<'a>(run: &'a Run, report: &str) -> &'a str {
    run.stderr
        .lines()
        .find(|l| l.contains(report))
        .unwrap_or_else(|| panic!("{report} named in\n{}", run.stderr))
}

/// The requests of a run: those after the `before` first.
fn since(api: &FakeApiServer, before: usize) -> Vec<ReportRequest> {
    api.report_requests().split_off(before)
}

fn writes(requests: &[ReportRequest]) -> Vec<&ReportRequest> {
    requests.iter().filter(|r| r.is_write()).collect()
}

/// The (namespace, name) of each request of a kind.
fn targets(
    requests: &[ReportRequest],
    pick: fn(&ReportRequest) -> bool,
) -> BTreeSet<(String, String)> {
    requests
        .iter()
        .filter(|r| pick(r))
        .map(|r| {
            (
                r.namespace.clone().unwrap_or_default(),
                r.name.clone().unwrap_or_default(),
            )
        })
        .collect()
}

/// Every apply is a server-side apply by `modelgate` that takes the fields over.
fn assert_server_side_applies(requests: &[ReportRequest]) {
    for r in requests.iter().filter(|r| r.is_apply()) {
        assert!(
            r.content_type
                .as_deref()
                .is_some_and(|c| c.starts_with("application/apply-patch+yaml")),
            "{r:?}"
        );
        assert_eq!(
            r.query.get("fieldManager").map(String::as_str),
            Some("modelgate"),
            "{r:?}"
        );
        assert_eq!(
            r.query.get("force").map(String::as_str),
            Some("true"),
            "{r:?}"
        );
    }
    for r in requests.iter().filter(|r| r.is_write()) {
        assert!(
            r.is_apply() || r.is_delete(),
            "only applies and deletes: {r:?}"
        );
    }
}

/// Modelgate's own reports are found by their label, not by their name.
fn assert_lists_by_label(requests: &[ReportRequest]) {
    let lists: Vec<&ReportRequest> = requests.iter().filter(|r| r.is_list()).collect();
    assert!(!lists.is_empty(), "the reports are listed to prune them");
    for l in lists {
        assert_eq!(
            l.query.get("labelSelector").map(String::as_str),
            Some("app.kubernetes.io/managed-by=modelgate"),
            "{l:?}"
        );
    }
}

/// docs/policy.md §10: under --write-reports the findings are the reports' content; the exit code says
/// whether they were written (0), and --fail-on-findings brings back the 1 for a denial. A
/// refused write is 2 either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_reports_exits_0_with_findings_and_1_only_with_fail_on_findings() {
    let api = FakeApiServer::start(&[]).await;
    populate(&api);
    assert_exit(&audit_cluster(&api, &["--write-reports"]).await, 0);
    let failing = audit_cluster(&api, &["--write-reports", "--fail-on-findings"]).await;
    assert_exit(&failing, 1);
    assert_summary(&failing, "9 applied, 0 deleted, 0 refused");
    // Without --write-reports, a denial is 1 as in `review`, with or without the flag.
    assert_exit(&audit_cluster(&api, &[]).await, 1);
    api.forbid_report_writes("team-b");
    let refused = audit_cluster(&api, &["--write-reports", "--fail-on-findings"]).await;
    assert_exit(&refused, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_workload_gets_one_report_applied_by_modelgate_and_owned_by_the_workload() {
    let api = FakeApiServer::start(&[]).await;
    populate(&api);
    let run = audit_cluster(&api, &["--write-reports"]).await;
    // Deployment team-a/web is denied: a finding the reports carry, not a failure of the run.
    assert_exit(&run, 0);
    assert_summary(&run, "9 applied, 0 deleted, 0 refused");

    let want = expected(&api, &[]);
    let stored = api.reports(REPORTS);
    assert_eq!(keys(&stored), want.keys().cloned().collect(), "{stored:#?}");
    for report in &stored {
        check_report(OPENREPORTS, report, &want[&key(report)]);
        assert_eq!(
            report["metadata"]["managedFields"][0]["manager"], "modelgate",
            "{report:#}"
        );
    }
    assert!(
        api.reports(POLICY_REPORTS).is_empty(),
        "only the API asked for"
    );
    assert_eq!(
        api.pruned_report_fields(),
        Vec::<String>::new(),
        "fields outside the CRD's schema"
    );

    let requests = api.report_requests();
    assert_server_side_applies(&requests);
    assert_lists_by_label(&requests);
    assert_eq!(
        targets(&requests, ReportRequest::is_apply),
        want.keys().cloned().collect(),
        "one apply per report"
    );
    assert_eq!(requests.iter().filter(|r| r.is_apply()).count(), 9);
    assert!(requests.iter().all(|r| r.code < 300), "{requests:#?}");
    assert!(requests.iter().all(|r| !r.is_delete()), "nothing to prune");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_run_applies_the_same_reports_in_place_reading_the_reports_in_pages() {
    let api = FakeApiServer::start(&[]).await;
    populate(&api);
    let first = audit_cluster(&api, &["--write-reports"]).await;
    assert_exit(&first, 0);
    let before = api.reports(REPORTS);
    let seen = api.report_requests().len();

    let second = audit_cluster(&api, &["--write-reports", "--page-size", "2"]).await;
    assert_exit(&second, 0);
    assert_summary(&second, "9 applied, 0 deleted, 0 refused");
    let after = api.reports(REPORTS);
    assert_eq!(keys(&after), keys(&before), "same names, same set");
    // Updated in place: same objects (uids), same content but for when it was evaluated.
    let comparable = |r: &Value| {
        let mut r = r.clone();
        for field in ["resourceVersion", "generation", "managedFields"] {
            r["metadata"].as_object_mut().unwrap().remove(field);
        }
        for result in r["results"].as_array_mut().unwrap() {
            result.as_object_mut().unwrap().remove("timestamp");
        }
        r
    };
    for (b, a) in before.iter().zip(&after) {
        assert_eq!(comparable(a), comparable(b), "{:?}", key(a));
    }

    let requests = since(&api, seen);
    assert_server_side_applies(&requests);
    assert_eq!(requests.iter().filter(|r| r.is_apply()).count(), 9);
    assert!(requests.iter().all(|r| !r.is_delete()), "{requests:#?}");
    // 9 reports in pages of 2: the list is continued, and every call says its limit.
    let lists: Vec<&ReportRequest> = requests.iter().filter(|r| r.is_list()).collect();
    assert!(
        lists
            .iter()
            .all(|l| l.query.get("limit").map(String::as_str) == Some("2")),
        "{lists:#?}"
    );
    assert!(
        lists.iter().any(|l| l.query.contains_key("continue")),
        "{lists:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_of_workloads_that_are_gone_are_deleted_and_nobody_elses() {
    let api = FakeApiServer::start(&[]).await;
    populate(&api);
    let gone_a = "modelgate-00000000-0000-4000-8000-0000deadbeef";
    let gone_b = "modelgate-00000000-0000-4000-8000-0000deadbee2";
    let seeded_a = api.seed_report(REPORTS, "modelgate", stale_report("team-a", gone_a, ours()));
    let seeded_b = api.seed_report(REPORTS, "modelgate", stale_report("team-b", gone_b, ours()));
    // Labelled as modelgate's, but not named as modelgate names its reports, or not of
    // modelgate's source: a label alone is copied with a manifest.
    api.seed_report(
        REPORTS,
        "kubectl",
        stale_report("team-a", "copied-report", ours()),
    );
    let mut other_source = stale_report("team-a", "modelgate-from-another-tool", ours());
    other_source["results"][0]["source"] = json!("kyverno");
    api.seed_report(REPORTS, "kubectl", other_source);
    // Another tool's report, and one whose name looks like modelgate's but is not labelled so.
    api.seed_report(
        REPORTS,
        "kyverno",
        stale_report("team-a", "kyverno-pod-gone", json!({MANAGED_BY: "kyverno"})),
    );
    api.seed_report(
        REPORTS,
        "kubectl",
        stale_report("team-a", "modelgate-handwritten", json!({})),
    );
    // Modelgate's, in the API not written this time.
    api.seed_report(
        POLICY_REPORTS,
        "modelgate",
        stale_report("team-a", gone_a, ours()),
    );

    let run = audit_cluster(&api, &["--write-reports", "--page-size", "2"]).await;
    assert_exit(&run, 0);
    assert_summary(&run, "9 applied, 2 deleted, 0 refused");
    let requests = api.report_requests();
    assert_server_side_applies(&requests);
    assert_lists_by_label(&requests);
    let deleted: BTreeSet<(String, String)> = [("team-a", gone_a), ("team-b", gone_b)]
        .iter()
        .map(|(ns, n)| (ns.to_string(), n.to_string()))
        .collect();
    assert_eq!(targets(&requests, ReportRequest::is_delete), deleted);
    // Each delete holds to the object as listed: a report written again since is kept.
    for seeded in [&seeded_a, &seeded_b] {
        let delete = requests
            .iter()
            .find(|r| r.is_delete() && r.name.as_deref() == seeded["metadata"]["name"].as_str())
            .unwrap();
        assert_eq!(
            delete.preconditions,
            Some(json!({
                "uid": seeded["metadata"]["uid"],
                "resourceVersion": seeded["metadata"]["resourceVersion"],
            })),
            "{delete:?}"
        );
    }
    let mut remaining = expected(&api, &[]).into_keys().collect::<BTreeSet<_>>();
    remaining.insert(("team-a".into(), "kyverno-pod-gone".into()));
    remaining.insert(("team-a".into(), "modelgate-handwritten".into()));
    remaining.insert(("team-a".into(), "copied-report".into()));
    remaining.insert(("team-a".into(), "modelgate-from-another-tool".into()));
    assert_eq!(keys(&api.reports(REPORTS)), remaining);
    assert!(
        api.report(POLICY_REPORTS, "team-a", gone_a).is_some(),
        "the other API is left alone"
    );

    // A workload deleted since: its report goes on the next run.
    let ok = report_name(&api, "pods", "team-b", "ok");
    api.remove_workload("pods", "team-b", "ok");
    let seen = api.report_requests().len();
    let run = audit_cluster(&api, &["--write-reports"]).await;
    assert_exit(&run, 0);
    assert_summary(&run, "8 applied, 1 deleted, 0 refused");
    assert_eq!(
        targets(&since(&api, seen), ReportRequest::is_delete),
        [("team-b".to_string(), ok.clone())].into()
    );
    assert!(api.report(REPORTS, "team-b", &ok).is_none());
}

/// A report written again between the prune's listing and its delete (by a run beside this
/// one) is kept: the delete's preconditions no longer hold, and that is not a refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_changed_since_the_listing_is_not_deleted() {
    let api = FakeApiServer::start(&[]).await;
    populate(&api);
    let gone = "modelgate-00000000-0000-4000-8000-0000deadbeef";
    api.seed_report(REPORTS, "modelgate", stale_report("team-a", gone, ours()));
    api.rewrite_report_after_list("team-a", gone);
    let run = audit_cluster(&api, &["--write-reports"]).await;
    assert_exit(&run, 0);
    assert_summary(&run, "9 applied, 0 deleted, 0 refused");
    let delete = api
        .report_requests()
        .into_iter()
        .find(ReportRequest::is_delete)
        .expect("the delete was sent");
    assert_eq!(delete.code, 409, "{delete:?}");
    assert!(api.report(REPORTS, "team-a", gone).is_some());
}

/// The prune's own listing refused (403 in a namespace, 403 at the cluster scope, an expired
/// continue token): nothing is pruned there, the refusal is named, and the run exits 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_prune_listing_deletes_nothing_there_and_is_exit_2() {
    let gone = "modelgate-00000000-0000-4000-8000-0000deadbeef";
    // Forbidden in one audited namespace.
    let api = FakeApiServer::start(&[]).await;
    populate(&api);
    api.seed_report(REPORTS, "modelgate", stale_report("team-a", gone, ours()));
    api.forbid_report_lists("team-a");
    let run = audit_cluster(&api, &["--write-reports", "-n", "team-a", "-n", "team-b"]).await;
    assert_exit(&run, 2);
    let line = line_naming(&run, "in namespace team-a (nothing pruned there)");
    assert!(line.contains("403") && line.contains("forbidden"), "{line}");
    assert!(api.report(REPORTS, "team-a", gone).is_some());

    // Forbidden at the cluster scope (no -n).
    let api = FakeApiServer::start(&[]).await;
    populate(&api);
    api.seed_report(REPORTS, "modelgate", stale_report("team-a", gone, ours()));
    api.forbid_report_lists("");
    let run = audit_cluster(&api, &["--write-reports"]).await;
    assert_exit(&run, 2);
    let line = line_naming(&run, "in all namespaces (nothing pruned there)");
    assert!(line.contains("403"), "{line}");
    assert!(api.report(REPORTS, "team-a", gone).is_some());
    assert!(!api.report_requests().iter().any(ReportRequest::is_delete));

    // The listing's continue token expired between pages: what the first pages found is not
    // deleted either (the listing is incomplete).
    let api = FakeApiServer::start(&[]).await;
    populate(&api);
    api.seed_report(REPORTS, "modelgate", stale_report("team-a", gone, ours()));
    api.expire_report_continue_tokens();
    let run = audit_cluster(&api, &["--write-reports", "--page-size", "2"]).await;
    assert_exit(&run, 2);
    let line = line_naming(&run, "(nothing pruned there)");
    assert!(line.contains("410") || line.contains("too old"), "{line}");
    assert!(api.report(REPORTS, "team-a", gone).is_some());
    assert!(!api.report_requests().iter().any(ReportRequest::is_delete));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_namespace_only_those_namespaces_are_written_and_pruned() {
    let api = FakeApiServer::start(&[]).await;
    populate(&api);
    let gone = "modelgate-00000000-0000-4000-8000-0000deadbeef";
    api.seed_report(REPORTS, "modelgate", stale_report("team-a", gone, ours()));
    api.seed_report(REPORTS, "modelgate", stale_report("team-b", gone, ours()));

    // Named twice, audited once.
    let run = audit_cluster(&api, &["-n", "team-a", "-n", "team-a", "--write-reports"]).await;
    assert_exit(&run, 0);
    assert_summary(&run, "2 applied, 1 deleted, 0 refused");
    let requests = api.report_requests();
    assert_eq!(
        requests.iter().filter(|r| r.is_list()).count(),
        1,
        "one prune listing: {requests:#?}"
    );
    assert!(
        requests
            .iter()
            .all(|r| r.namespace.as_deref() == Some("team-a")),
        "only team-a's reports are read or written: {requests:#?}"
    );
    assert_lists_by_label(&requests);
    let mut want: BTreeSet<_> = expected(&api, &["team-a"]).into_keys().collect();
    want.insert(("team-b".into(), gone.into()));
    assert_eq!(keys(&api.reports(REPORTS)), want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_write_is_named_with_its_reason_and_the_others_are_written() {
    let api = FakeApiServer::start(&[]).await;
    populate(&api);
    let gone = "modelgate-00000000-0000-4000-8000-0000deadbee2";
    api.seed_report(REPORTS, "modelgate", stale_report("team-b", gone, ours()));
    api.forbid_report_writes("team-b");
    // plain-0's report exists from an earlier run; this time its apply is refused. It must not
    // be taken for the report of a workload that is gone.
    let plain0 = report_name(&api, "pods", "team-c", "plain-0");
    let mut earlier = stale_report("team-c", &plain0, ours());
    earlier["scope"]["name"] = json!("plain-0");
    api.seed_report(REPORTS, "modelgate", earlier);
    api.refuse_report(
        &plain0,
        "results: Forbidden: refused by the test's admission policy",
    );

    let run = audit_cluster(&api, &["--write-reports"]).await;
    assert_exit(&run, 2);
    // team-b: 4 applies and the prune of its stale report refused; plain-0's apply refused.
    assert_summary(&run, "4 applied, 0 deleted, 6 refused");
    for (plural, name) in [("pods", "ok"), ("daemonsets", "agent")] {
        let report = report_name(&api, plural, "team-b", name);
        let line = line_naming(&run, &format!("Report team-b/{report}"));
        assert!(line.contains("403") && line.contains("forbidden"), "{line}");
    }
    // The refused delete is named too.
    line_naming(&run, &format!("Report team-b/{gone}"));
    let line = line_naming(&run, &format!("Report team-c/{plain0}"));
    assert!(
        line.contains("refused by the test's admission policy") && line.contains("422"),
        "{line}"
    );

    let mut want: BTreeSet<_> = expected(&api, &["team-a", "locked", "team-c"])
        .into_keys()
        .collect();
    want.insert(("team-b".into(), gone.into()));
    assert_eq!(keys(&api.reports(REPORTS)), want, "the others are written");
    assert_eq!(
        api.report(REPORTS, "team-c", &plain0).unwrap()["scope"]["name"],
        "plain-0",
        "the refused report is left as it was, not deleted"
    );
    assert!(
        !api.report_requests()
            .iter()
            .any(|r| r.is_delete() && r.name.as_deref() == Some(plain0.as_str())),
        "a workload that exists keeps its report"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_incomplete_listing_of_the_workloads_writes_and_deletes_nothing() {
    let api = FakeApiServer::start(&[]).await;
    populate(&api);
    let gone = "modelgate-00000000-0000-4000-8000-0000deadbeef";
    api.seed_report(REPORTS, "modelgate", stale_report("team-a", gone, ours()));
    api.forbid_namespace("team-b");

    for args in [
        &["--write-reports"][..],
        &["--write-reports", "-n", "team-a", "-n", "team-b"][..],
    ] {
        let run = audit_cluster(&api, args).await;
        assert_exit(&run, 2);
        assert!(
            run.stderr.contains("no report is written"),
            "{}",
            run.stderr
        );
        let requests = api.report_requests();
        assert_eq!(writes(&requests), Vec::<&ReportRequest>::new(), "{args:?}");
        assert_eq!(
            keys(&api.reports(REPORTS)),
            [("team-a".to_string(), gone.to_string())].into(),
            "{args:?}"
        );
    }
}

/// The Namespaces' Pod Security labels decide what a report says of the prep: a Namespace list
/// that fails is exit 2 before any report is written or deleted, never reports written as if no
/// namespace were restricted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_namespace_list_writes_and_deletes_nothing() {
    let api = FakeApiServer::start(&[]).await;
    populate(&api);
    let gone = "modelgate-00000000-0000-4000-8000-0000deadbeef";
    api.seed_report(REPORTS, "modelgate", stale_report("team-a", gone, ours()));
    api.fail_lists(NAMESPACES, Some(403));
    let run = audit_cluster(&api, &["--write-reports"]).await;
    assert_exit(&run, 2);
    assert!(
        run.stderr.contains("cannot list namespaces")
            && run.stderr.contains("no report is written or deleted"),
        "{}",
        run.stderr
    );
    assert_eq!(writes(&api.report_requests()), Vec::<&ReportRequest>::new());
    assert_eq!(
        keys(&api.reports(REPORTS)),
        [("team-a".to_string(), gone.to_string())].into()
    );
    // Without --write-reports the audit goes on, the failure a note of its report.
    let run = audit_cluster(&api, &["-o", "json"]).await;
    assert!(
        run.stdout.contains("cannot list namespaces"),
        "{}",
        run.stdout
    );
    assert_ne!(run.code, 2, "{}", run.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_crd_that_is_not_installed_is_a_refused_write() {
    let api = FakeApiServer::start(&[]).await;
    populate(&api);
    api.set_report_crd(REPORTS, false);
    let run = audit_cluster(&api, &["--write-reports"]).await;
    assert_exit(&run, 2);
    // One line says it, naming the CRD, and one apply tried it.
    let lines: Vec<&str> = run
        .stderr
        .lines()
        .filter(|l| l.starts_with("error: cannot write"))
        .collect();
    assert_eq!(lines.len(), 1, "{}", run.stderr);
    assert!(
        lines[0].contains("and the 8 other reports")
            && lines[0].contains("404")
            && lines[0].contains("install the reports CRD"),
        "{}",
        lines[0]
    );
    assert_summary(&run, "0 applied, 0 deleted, 1 refused");
    assert_eq!(writes(&api.report_requests()).len(), 1);
    assert!(api.reports(REPORTS).is_empty());
}

/// Reports are applied several at a time (the first alone), never more than eight at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_are_applied_a_few_at_a_time() {
    let api = FakeApiServer::start(&[]).await;
    populate(&api);
    api.hold_report_applies(Duration::from_millis(200));
    let run = audit_cluster(&api, &["--write-reports"]).await;
    assert_exit(&run, 0);
    assert_summary(&run, "9 applied, 0 deleted, 0 refused");
    let most = api.most_report_applies_at_once();
    assert!((2..=8).contains(&most), "{most} applies at once");
    assert_eq!(
        keys(&api.reports(REPORTS)),
        expected(&api, &[]).into_keys().collect()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn report_api_policyreport_writes_and_prunes_wgpolicyk8s_policyreports() {
    let api = FakeApiServer::start(&[]).await;
    populate(&api);
    let gone = "modelgate-00000000-0000-4000-8000-0000deadbeef";
    api.seed_report(
        POLICY_REPORTS,
        "modelgate",
        stale_report("team-a", gone, ours()),
    );
    api.seed_report(REPORTS, "modelgate", stale_report("team-a", gone, ours()));

    let run = audit_cluster(&api, &["--write-reports", "--report-api", "policyreport"]).await;
    assert_exit(&run, 0);
    assert_summary(&run, "9 applied, 1 deleted, 0 refused");
    let want = expected(&api, &[]);
    let stored = api.reports(POLICY_REPORTS);
    assert_eq!(keys(&stored), want.keys().cloned().collect());
    for report in &stored {
        check_report(POLICYREPORT, report, &want[&key(report)]);
        assert!(
            report.get("source").is_none(),
            "v1alpha2 has no report-level source"
        );
    }
    assert_eq!(api.pruned_report_fields(), Vec::<String>::new());
    let requests = api.report_requests();
    assert!(
        requests.iter().all(|r| r.plural == POLICY_REPORTS),
        "{requests:#?}"
    );
    assert_server_side_applies(&requests);
    assert_lists_by_label(&requests);
    assert!(
        api.report(REPORTS, "team-a", gone).is_some(),
        "OpenReports left alone"
    );

    // A refused PolicyReport is named as one.
    api.forbid_report_writes("locked");
    let run = audit_cluster(&api, &["--write-reports", "--report-api", "policyreport"]).await;
    assert_exit(&run, 2);
    let nightly = report_name(&api, "cronjobs", "locked", "nightly");
    let line = line_naming(&run, &format!("PolicyReport locked/{nightly}"));
    assert!(line.contains("403"), "{line}");
}

/// What enforcing would do is in the report: a denial as a `fail` of its rule with the
/// denial's message, a patch as the JSON Patch that applies to the workload as it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_workload_fails_with_the_rule_message_and_a_patched_one_carries_its_patch() {
    let api = FakeApiServer::start(&[]).await;
    populate(&api);
    let run = audit_cluster(&api, &["--write-reports"]).await;
    assert_exit(&run, 0);
    let report = |plural: &str, ns: &str, name: &str| {
        api.report(REPORTS, ns, &report_name(&api, plural, ns, name))
            .unwrap_or_else(|| panic!("no report of {plural} {ns}/{name}"))
    };
    let patched = |plural: &str, ns: &str, name: &str, rule: &str| {
        let r = report(plural, ns, name);
        let result = rule_result(&r, rule).clone();
        let patch = result["properties"]["patch"]
            .as_str()
            .unwrap_or_else(|| panic!("{rule} of {name} has no patch: {result:#}"));
        let patch: json_patch::Patch = serde_json::from_str(patch).unwrap();
        let mut workload = api.workload(plural, ns, name).unwrap();
        json_patch::patch(&mut workload, &patch)
            .unwrap_or_else(|e| panic!("{name}'s patch does not apply to it: {e}"));
        (result, workload)
    };

    let web = report("deployments", "team-a", "web");
    let non_root = rule_result(&web, "non-root");
    assert_eq!(non_root["result"], "fail", "{web:#}");
    assert!(
        non_root["message"].as_str().unwrap().contains(
            "spec.template.spec.containers[0].securityContext.runAsUser: 0 is outside 1..2147483647"
        ),
        "{non_root}"
    );
    assert_eq!(web["summary"]["fail"], 1, "{web:#}");

    // A Pod without a security context: made non-root.
    let (non_root, pod) = patched("pods", "team-c", "plain-0", "non-root");
    assert_eq!(non_root["result"], "warn", "{non_root}");
    let sc = &pod["spec"]["securityContext"];
    assert_eq!(sc["runAsNonRoot"], true, "{pod:#}");
    assert!(sc["runAsUser"].as_u64().is_some_and(|u| u > 0), "{pod:#}");

    // A CronJob in a Pod Security restricted namespace: its pod template made non-root, and no
    // root prep container.
    let (_, cron) = patched("cronjobs", "locked", "nightly", "non-root");
    let template = &cron["spec"]["jobTemplate"]["spec"]["template"]["spec"];
    assert_eq!(
        template["securityContext"]["runAsNonRoot"], true,
        "{cron:#}"
    );
    assert!(
        !template.to_string().contains("model-cache-prep"),
        "{template:#}"
    );

    // A DaemonSet that mounts a model cache: the prep container goes into its template.
    let (prep, agent) = patched("daemonsets", "team-b", "agent", "cache-prep");
    assert_eq!(prep["result"], "warn", "{prep}");
    let init = agent["spec"]["template"]["spec"]["initContainers"]
        .as_array()
        .unwrap_or_else(|| panic!("{agent:#}"));
    assert!(
        init.iter().any(|c| c["name"] == "model-cache-prep"),
        "{init:?}"
    );

    // A Pod that names a model: the cache's outcome and reason.
    let llm = report("pods", "team-b", "llm");
    let cache = rule_result(&llm, "model-cache");
    for property in ["modelCacheOutcome", "modelCacheReason"] {
        assert!(
            cache["properties"][property]
                .as_str()
                .is_some_and(|s| !s.is_empty()),
            "{property} in {cache:#}"
        );
    }

    // A compliant Pod passes every rule that applies to it.
    let ok = report("pods", "team-b", "ok");
    assert_eq!(ok["summary"]["fail"].as_u64().unwrap_or(0), 0, "{ok:#}");
    assert_eq!(ok["summary"]["warn"].as_u64().unwrap_or(0), 0, "{ok:#}");
    assert_eq!(rule_result(&ok, "non-root")["result"], "pass", "{ok:#}");
}

/// One HTTP/1.1 request to the fake, as a client that is not kube-rs would send it: (status,
/// body as JSON or `null`).
async fn http(
    api: &FakeApiServer,
    method: &str,
    path: &str,
    content_type: &str,
    body: &str,
) -> (u16, Value) {
    use std::io::{Read, Write};
    let addr = api.addr();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let answer = tokio::task::spawn_blocking(move || {
        let mut stream = std::net::TcpStream::connect(addr).unwrap();
        stream.write_all(request.as_bytes()).unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        answer
    })
    .await
    .unwrap();
    let code = answer[9..12].parse().unwrap();
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (code, serde_json::from_str(body).unwrap_or(Value::Null))
}

/// The tests above trust the fake to refuse what the API server refuses; these are the
/// refusals a report writer could run into.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fake_refuses_reports_as_the_api_server_does() {
    let api = FakeApiServer::start(&[]).await;
    let path = "/apis/openreports.io/v1alpha1/namespaces/a/reports/r";
    let apply = "application/apply-patch+yaml";
    let ssa = format!("{path}?fieldManager=modelgate&force=true");
    let good = json!({
        "apiVersion": "openreports.io/v1alpha1", "kind": "Report",
        "metadata": {"name": "r", "namespace": "a", "labels": {MANAGED_BY: "modelgate"},
                     "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u"}]},
        "scope": {"apiVersion": "v1", "kind": "Pod", "name": "p", "namespace": "a", "uid": "u"},
        "source": "modelgate",
        "results": [{"policy": "modelgate", "rule": "non-root", "result": "pass", "severity": "high",
                     "properties": {"patch": "[]"}, "timestamp": {"seconds": 1, "nanos": 0}}],
        "summary": {"pass": 1},
    });
    let with = |pointer: &str, value: Value| {
        let mut v = good.clone();
        let (parent, last) = pointer.rsplit_once('/').unwrap();
        match v.pointer_mut(parent).unwrap() {
            Value::Array(items) => items[last.parse::<usize>().unwrap()] = value,
            object => object[last] = value,
        }
        v.to_string()
    };
    let good_text = good.to_string();

    let (code, status) = http(
        &api,
        "PATCH",
        &ssa,
        "application/merge-patch+json",
        &good_text,
    )
    .await;
    assert_eq!(
        (code, &status["reason"]),
        (415, &json!("UnsupportedMediaType"))
    );
    let (code, status) = http(&api, "PATCH", path, apply, &good_text).await;
    assert_eq!(code, 422, "an apply without a field manager: {status}");
    let refused = [
        ("/kind", json!("PolicyReport"), 400, "apiVersion and kind"),
        (
            "/metadata/name",
            json!("other"),
            400,
            "does not match the name on the URL",
        ),
        (
            "/results/0/result",
            json!("maybe"),
            422,
            "results[0].result: Unsupported value",
        ),
        (
            "/results/0/severity",
            json!("urgent"),
            422,
            "results[0].severity: Unsupported value",
        ),
        (
            "/results/0/timestamp",
            json!("2026-01-01T00:00:00Z"),
            422,
            "must be of type object",
        ),
        (
            "/results/0/properties/patch",
            json!([]),
            422,
            "must be of type string",
        ),
        (
            "/results/0/policy",
            Value::Null,
            422,
            "results[0].policy: Required value",
        ),
        ("/summary/pass", json!("1"), 422, "must be of type integer"),
        (
            "/metadata/ownerReferences/0/uid",
            json!(""),
            422,
            "uid must not be empty",
        ),
        (
            "/metadata/labels",
            json!({MANAGED_BY: "model gate"}),
            422,
            "not a valid label value",
        ),
    ];
    for (pointer, value, want, message) in refused {
        let (code, status) = http(&api, "PATCH", &ssa, apply, &with(pointer, value.clone())).await;
        assert_eq!(code, want, "{pointer} = {value}: {status}");
        assert!(
            status["message"].as_str().unwrap().contains(message),
            "{pointer} = {value}: {status}"
        );
    }
    assert!(api.reports(REPORTS).is_empty());

    // A field the CRD does not know is dropped, as the API server prunes it.
    let (code, _) = http(
        &api,
        "PATCH",
        &ssa,
        apply,
        &with("/scope/extra", json!("x")),
    )
    .await;
    assert_eq!(code, 201);
    assert_eq!(api.pruned_report_fields(), ["Report a/r: scope.extra"]);
    assert!(
        api.report(REPORTS, "a", "r").unwrap()["scope"]
            .get("extra")
            .is_none()
    );
    // PolicyReport v1alpha2 has no report-level source.
    let polr = with("/kind", json!("PolicyReport"))
        .replace("openreports.io/v1alpha1", "wgpolicyk8s.io/v1alpha2");
    let polr_path =
        "/apis/wgpolicyk8s.io/v1alpha2/namespaces/a/policyreports/r?fieldManager=modelgate";
    let (code, _) = http(&api, "PATCH", polr_path, apply, &polr).await;
    assert_eq!(code, 201);
    assert_eq!(api.pruned_report_fields()[1], "PolicyReport a/r: source");

    // Another manager's report is taken over only by force.
    api.seed_report(REPORTS, "kyverno", stale_report("a", "theirs", ours()));
    let theirs = good_text.replace("\"name\":\"r\"", "\"name\":\"theirs\"");
    let (code, _) = http(
        &api,
        "PATCH",
        "/apis/openreports.io/v1alpha1/namespaces/a/reports/theirs?fieldManager=modelgate",
        apply,
        &theirs,
    )
    .await;
    assert_eq!(code, 409);

    let (code, status) = http(
        &api,
        "DELETE",
        "/apis/openreports.io/v1alpha1/namespaces/a/reports/absent",
        "application/json",
        "",
    )
    .await;
    assert_eq!((code, &status["reason"]), (404, &json!("NotFound")));
    let (code, _) = http(
        &api,
        "GET",
        "/apis/openreports.io/v1alpha1/reports?labelSelector=a%20in%20(b)",
        "",
        "",
    )
    .await;
    assert_eq!(
        code, 400,
        "a selector the fake cannot read is refused, not ignored"
    );
    api.forbid_report_writes("a");
    let (code, status) = http(
        &api,
        "DELETE",
        "/apis/openreports.io/v1alpha1/namespaces/a/reports/r",
        "application/json",
        "",
    )
    .await;
    assert_eq!((code, &status["reason"]), (403, &json!("Forbidden")));
    api.set_report_crd(REPORTS, false);
    let (code, status) = http(&api, "GET", "/apis/openreports.io/v1alpha1/reports", "", "").await;
    assert_eq!(
        (code, status),
        (404, Value::Null),
        "the plain 404 of an unknown group"
    );
}

/// Benchmark, not run by the test command (docs/benchmarks.md, "Audit at scale"):
/// `audit --from-cluster --write-reports` of the binary this test was built with, against the
/// fake API server holding `MODELGATE_BENCH_WORKLOADS` workloads (default 100 000: Pods,
/// Deployments and Jobs in 50 namespaces, one in ten running as root, the others as one of ten
/// uids; or, with `MODELGATE_BENCH_DISTINCT=1`, each with its own uid and fsGroup, so that no
/// two patches and few messages are the same). It prints the run's wall time, CPU and peak RSS (`/usr/bin/time`),
/// which the chart's CronJob limits are set from.
///
/// ```text
/// CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 CARGO_TARGET_DIR=target/bench \
///   cargo test --release --test audit_write_reports -- --ignored --nocapture write_reports_at_scale
/// ```
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run with --ignored on an optimised build"]
async fn write_reports_at_scale() {
    let n: usize = std::env::var("MODELGATE_BENCH_WORKLOADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let distinct = std::env::var("MODELGATE_BENCH_DISTINCT").is_ok_and(|v| v == "1");
    let api = FakeApiServer::start(&[REPORTS]).await;
    for i in 0..50 {
        api.apply(
            NAMESPACES,
            json!({"metadata": {"name": format!("team-{i}")}}),
        );
    }
    for i in 0..n {
        let (plural, restart) = [
            ("pods", "Always"),
            ("deployments", "Always"),
            ("jobs", "Never"),
        ][i % 3];
        let spec = json!({
            "containers": [{"name": "server", "image": format!("registry.example/app:{}", i % 7),
                "args": ["--port", "8080"], "ports": [{"containerPort": 8080, "protocol": "TCP"}],
                "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
                "securityContext": {"runAsUser": match i {
                    _ if i % 10 == 0 => 0,
                    _ if distinct => 1000 + i,
                    _ => 1000 + i % 10,
                }}}],
            "restartPolicy": restart,
            "volumes": [{"name": "model-cache", "persistentVolumeClaim": {"claimName": "cache"}}],
        });
        let mut spec = spec;
        if distinct {
            // Its own fsGroup: the prep's command, and so the patch, differ from every other.
            spec["securityContext"] = json!({"fsGroup": 2000 + i});
        }
        let metadata = json!({"name": format!("w-{i}"), "namespace": format!("team-{}", i % 50),
            "labels": {"app": format!("w-{i}")}});
        let object = if plural == "pods" {
            json!({"metadata": metadata, "spec": spec})
        } else {
            json!({"metadata": metadata, "spec": {"template": {"metadata": {"labels": {"app": format!("w-{i}")}}, "spec": spec}}})
        };
        api.add_workload(plural, object);
    }
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig);
    let mut cmd = std::process::Command::new("/usr/bin/time");
    cmd.args([
        "-f",
        "%e s wall, %U s user, %S s system, %M KiB peak RSS",
        env!("CARGO_BIN_EXE_modelgate"),
        "audit",
        "--from-cluster",
        "--write-reports",
        "-o",
        "json",
    ])
    .env("KUBECONFIG", &kubeconfig)
    .stdout(std::process::Stdio::null());
    let out = tokio::task::spawn_blocking(move || cmd.output().unwrap())
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let written = api.reports(REPORTS).len();
    println!(
        "{n} workloads: exit {:?}, {written} reports\n{}",
        out.status.code(),
        stderr.lines().rev().take(3).collect::<Vec<_>>().join("\n")
    );
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(written, n);
}
