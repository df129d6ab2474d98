//! Shared by the `audit_*` tests: `modelgate audit --from-cluster` against the fake API server,
//! a cluster holding the workloads of tests/fixtures/audit-workloads.yaml, the two report APIs
//! audit writes, and what every report's results must be.
//! Included by those tests with `#[path = "support/audit.rs"] mod audit_support;`, next to
//! `mod cli;` (common/cli.rs) and `mod support;`, which it uses.
#![allow(dead_code)]

use serde_json::{Value, json};

use crate::cli::{self, Run};
use crate::support::fake_apiserver::{
    self, FakeApiServer, NAMESPACES, POLICY_REPORTS, PVCS, REPORTS,
};

/// audit's rules, one result each in every report.
pub const RULES: [&str; 5] = [
    "non-root",
    "cache-prep",
    "model-cache",
    "schema",
    "root-equivalent",
];

/// The rules that only warn: a `warn` of theirs is a finding, never a patch.
pub const WARN_ONLY: [&str; 1] = ["root-equivalent"];

/// The statuses a result can have, each counted in the report's summary.
pub const STATUSES: [&str; 5] = ["pass", "fail", "warn", "error", "skip"];

/// A report API audit writes: its name for `-o` and `--report-api`, its resource in the fake
/// API server, and the apiVersion and kind of its reports.
#[derive(Clone, Copy, Debug)]
pub struct ReportApi {
    pub output: &'static str,
    pub plural: &'static str,
    pub api_version: &'static str,
    pub kind: &'static str,
}

pub const OPENREPORTS: ReportApi = ReportApi {
    output: "openreports",
    plural: REPORTS,
    api_version: "openreports.io/v1alpha1",
    kind: "Report",
};

pub const POLICYREPORT: ReportApi = ReportApi {
    output: "policyreport",
    plural: POLICY_REPORTS,
    api_version: "wgpolicyk8s.io/v1alpha2",
    kind: "PolicyReport",
};

pub const REPORT_APIS: [ReportApi; 2] = [OPENREPORTS, POLICYREPORT];

impl ReportApi {
    /// The schema of the pinned CRD (tests/assets/crds), the one the fake checks applies with.
    pub fn schema(&self) -> &'static Value {
        fake_apiserver::report_schema(self.plural)
    }
}

/// Runs `audit --from-cluster <args>` against the fake API server without blocking its runtime.
pub async fn audit_cluster(api: &FakeApiServer, args: &[&str]) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig);
    let mut all = vec!["audit", "--from-cluster"];
    all.extend_from_slice(args);
    let mut cmd = cli::command(&all);
    cmd.env("KUBECONFIG", &kubeconfig);
    let out = tokio::task::spawn_blocking(move || cmd.output().unwrap())
        .await
        .unwrap();
    cli::finish(out)
}

/// The fixture's workloads and Namespaces (not its Service) in the cluster, and `plain_pods`
/// Pods without any security context (patched), `plain-0`, `plain-1`…, in team-c.
pub fn populate(api: &FakeApiServer, plain_pods: usize) {
    let text = std::fs::read_to_string(cli::fixture("audit-workloads.yaml")).unwrap();
    for d in modelgate::documents::read_documents("fixture", &text).unwrap() {
        let kind = d.value["kind"].as_str().unwrap().to_string();
        match kind.as_str() {
            "Namespace" => {
                api.apply(NAMESPACES, d.value);
            }
            "Service" => {}
            _ => {
                // The claims the workloads name exist, provisioned, as in a cluster where
                // they run (a claim that does not exist gets no prep: docs/policy.md).
                let namespace = d.value["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or("default");
                for claim in claim_names(&d.value) {
                    api.apply(
                        PVCS,
                        json!({"metadata": {"name": claim, "namespace": namespace},
                               "spec": {"accessModes": ["ReadWriteOnce"]},
                               "status": {"phase": "Bound"}}),
                    );
                }
                api.add_workload(&format!("{}s", kind.to_lowercase()), d.value)
            }
        }
    }
    for i in 0..plain_pods {
        api.add_workload(
            "pods",
            json!({"metadata": {"name": format!("plain-{i}"), "namespace": "team-c"},
                   "spec": {"containers": [{"name": "a", "image": "b"}]}}),
        );
    }
}

/// Every `persistentVolumeClaim.claimName` in `value`.
fn claim_names(value: &Value) -> Vec<String> {
    match value {
        Value::Object(map) => {
            let own = map
                .get("persistentVolumeClaim")
                .and_then(|c| c["claimName"].as_str())
                .map(str::to_string);
            own.into_iter()
                .chain(map.values().flat_map(claim_names))
                .collect()
        }
        Value::Array(items) => items.iter().flat_map(claim_names).collect(),
        _ => Vec::new(),
    }
}

/// The one result of `rule` in `report`.
pub fn rule_result<'a>(report: &'a Value, rule: &str) -> &'a Value {
    let results = report["results"].as_array().expect("results");
    let found: Vec<&Value> = results.iter().filter(|r| r["rule"] == rule).collect();
    assert_eq!(found.len(), 1, "one result for {rule}: {report:#}");
    found[0]
}

/// One result per rule, each complete (policy and source `modelgate`, a status, a severity, a
/// message, a timestamp, string properties), with a patch exactly where enforcing would patch
/// for its rule (a `warn`), and a summary that counts them, each status (zeros too).
pub fn check_results(what: &str, report: &Value) {
    let results = report["results"]
        .as_array()
        .unwrap_or_else(|| panic!("{what}: no results: {report:#}"));
    let mut rules: Vec<&str> = results
        .iter()
        .map(|r| r["rule"].as_str().unwrap_or_default())
        .collect();
    rules.sort();
    let mut all = RULES.to_vec();
    all.sort();
    assert_eq!(rules, all, "{what}: one result per rule");
    for r in results {
        assert_eq!(
            (&r["policy"], &r["source"]),
            (&json!("modelgate"), &json!("modelgate")),
            "{what}: {r}"
        );
        assert!(
            STATUSES.contains(&r["result"].as_str().unwrap_or_default()),
            "{what}: {r}"
        );
        assert_eq!(r["scored"], true, "{what}: {r}");
        assert!(r["severity"].is_string(), "{what}: {r}");
        assert!(
            r["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{what}: {r}"
        );
        assert!(
            r["timestamp"]["seconds"].as_i64().is_some_and(|s| s > 0),
            "{what}: {r}"
        );
        if let Some(properties) = r.get("properties") {
            assert!(
                properties
                    .as_object()
                    .is_some_and(|p| p.values().all(Value::is_string)),
                "{what}: properties are strings: {r}"
            );
        }
        // A partial template's finding (docs/policy.md §12) is a warn that patches nothing, as is a
        // rule that only warns.
        let partial = r["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("a partial template"));
        let warn_only = WARN_ONLY.contains(&r["rule"].as_str().unwrap_or_default());
        assert_ne!(
            (warn_only, &r["result"]),
            (true, &json!("fail")),
            "{what}: never a failure: {r}"
        );
        assert_eq!(
            r["result"] == "warn" && !partial && !warn_only,
            r["properties"]["patch"].is_string(),
            "{what}: a patch exactly on a warn: {r}"
        );
    }
    for status in STATUSES {
        let n = results.iter().filter(|r| r["result"] == status).count();
        assert_eq!(
            report["summary"][status],
            json!(n),
            "{what}: summary.{status} in {report:#}"
        );
    }
}
