//! The policy reports of docs/policy.md §10: one report per evaluated workload, in the workload's
//! namespace, scoped to it (and, when its uid is known, owned by it, so that the report goes
//! when the workload does), with one result per rule ([`crate::audit::rules`]).
//!
//! Two APIs with the same shape, as their CRDs define them:
//! - `openreports.io/v1alpha1` `Report` (openreports/reports-api `config/crd`), which also has
//!   a report-level `source`;
//! - `wgpolicyk8s.io/v1alpha2` `PolicyReport` (kubernetes-sigs/wg-policy-prototypes
//!   `policy-report/crd/v1alpha2`), the older API Policy Reporter and Kyverno still read.
//!
//! Each result: `policy: modelgate`, `rule`, `result`, `severity`, `message`, `properties`
//! (strings only), `scored: true`, `source: modelgate`, `timestamp` as `{seconds, nanos}`.

use std::io::{self, Write};

use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

use crate::audit::rules::{self, Status};
use crate::audit::{Scope, WorkloadResults};

/// The report API written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReportApi {
    /// `openreports.io/v1alpha1` `Report`.
    OpenReports,
    /// `wgpolicyk8s.io/v1alpha2` `PolicyReport`.
    PolicyReport,
}

impl ReportApi {
    pub fn group(self) -> &'static str {
        match self {
            ReportApi::OpenReports => "openreports.io",
            ReportApi::PolicyReport => "wgpolicyk8s.io",
        }
    }

    pub fn version(self) -> &'static str {
        match self {
            ReportApi::OpenReports => "v1alpha1",
            ReportApi::PolicyReport => "v1alpha2",
        }
    }

    pub fn api_version(self) -> String {
        format!("{}/{}", self.group(), self.version())
    }

    pub fn kind(self) -> &'static str {
        match self {
            ReportApi::OpenReports => "Report",
            ReportApi::PolicyReport => "PolicyReport",
        }
    }

    /// The resource name in API paths.
    pub fn plural(self) -> &'static str {
        match self {
            ReportApi::OpenReports => "reports",
            ReportApi::PolicyReport => "policyreports",
        }
    }
}

/// The label every report modelgate writes carries, and the selector its prune lists by.
pub const MANAGED_BY_KEY: &str = "app.kubernetes.io/managed-by";
pub const MANAGED_BY_VALUE: &str = "modelgate";
/// The `policy` of every result, and the `source` of results and reports.
pub const POLICY: &str = "modelgate";
pub const SOURCE: &str = "modelgate";

/// The longest object name the API server accepts (a DNS-1123 subdomain).
const MAX_NAME: usize = 253;

/// When the results were produced, as both CRDs want it (`google.protobuf.Timestamp`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timestamp {
    pub seconds: i64,
    pub nanos: i32,
}

impl Timestamp {
    /// The time of this run, or `SOURCE_DATE_EPOCH` (whole seconds) when it is set, so that two
    /// runs over the same objects can write byte-identical reports.
    pub fn of_run() -> Self {
        if let Some(seconds) = std::env::var("SOURCE_DATE_EPOCH")
            .ok()
            .and_then(|s| s.trim().parse::<i64>().ok())
        {
            return Timestamp { seconds, nanos: 0 };
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Timestamp {
            seconds: i64::try_from(now.as_secs()).unwrap_or(i64::MAX),
            nanos: i32::try_from(now.subsec_nanos()).unwrap_or(0),
        }
    }
}

/// How every report name of modelgate begins.
pub const NAME_PREFIX: &str = "modelgate-";

/// Whether a report listed by modelgate's label (`data`: the object without its metadata) is
/// modelgate's to delete: its name is one [`report_name`] gives and its source is modelgate's
/// (the report's own `source`, else every result's). A label is copied with a manifest and a
/// name can be chosen by anyone; all three together are what modelgate writes.
pub fn is_modelgates(name: &str, data: &Value) -> bool {
    let source = match data.get("source") {
        Some(source) => source == SOURCE,
        None => data["results"]
            .as_array()
            .is_some_and(|r| !r.is_empty() && r.iter().all(|r| r["source"] == SOURCE)),
    };
    name.starts_with(NAME_PREFIX) && source
}

/// The report's name, stable across runs: `modelgate-<uid>` when the workload's uid is known,
/// else `modelgate-<kind>-<name>`. A name that is not already a DNS-1123 subdomain of at most
/// 253 characters is made one (lowercased, other characters as `-`, cut to length) and gets
/// `-` and 8 hex digits of SHA-256 of what it stands for, so that two workloads never share a
/// report through the cleaning.
pub fn report_name(scope: &Scope) -> String {
    let raw = match &scope.uid {
        Some(uid) => format!("{NAME_PREFIX}{uid}"),
        None => format!(
            "{NAME_PREFIX}{}-{}",
            scope.kind.as_str().to_ascii_lowercase(),
            scope.name
        ),
    };
    dns_subdomain(&raw)
}

/// `raw` when it is a valid DNS-1123 subdomain, else a cleaned copy with a short stable hash.
pub(crate) fn dns_subdomain(raw: &str) -> String {
    if is_dns_subdomain(raw) {
        return raw.to_string();
    }
    let digest = Sha256::digest(raw.as_bytes());
    let hash: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
    let mapped: Vec<char> = raw
        .chars()
        .map(|c| c.to_ascii_lowercase())
        .map(|c| {
            if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' {
                c
            } else {
                '-'
            }
        })
        .collect();
    // A `.` must sit between two alphanumerics (each label starts and ends with one).
    let alnum = |c: Option<&char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    let mut clean: String = (0..mapped.len())
        .map(|i| match mapped[i] {
            '.' if !(i > 0 && alnum(mapped.get(i - 1)) && alnum(mapped.get(i + 1))) => '-',
            c => c,
        })
        .collect();
    let room = MAX_NAME - hash.len() - 1;
    clean.truncate(room);
    let clean = clean.trim_end_matches(['-', '.']);
    let clean = clean.trim_start_matches(['-', '.']);
    if clean.is_empty() {
        format!("{NAME_PREFIX}{hash}")
    } else {
        format!("{clean}-{hash}")
    }
}

fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= MAX_NAME
        && !s.is_empty()
        && s.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// Counts of each result, as `summary` has them.
pub fn summary(w: &WorkloadResults) -> Value {
    let count = |status: Status| {
        w.results.iter().filter(|r| r.status == status).count()
            + w.extra.iter().filter(|r| r.status == status).count()
    };
    json!({
        "pass": count(Status::Pass),
        "fail": count(Status::Fail),
        "warn": count(Status::Warn),
        "error": count(Status::Error),
        "skip": count(Status::Skip),
    })
}

/// The report object for one workload.
pub fn report(api: ReportApi, w: &WorkloadResults, at: Timestamp) -> Value {
    let scope = &w.scope;
    let mut metadata = Map::new();
    metadata.insert("name".into(), json!(report_name(scope)));
    metadata.insert("namespace".into(), json!(scope.namespace));
    metadata.insert("labels".into(), json!({ MANAGED_BY_KEY: MANAGED_BY_VALUE }));
    let mut scope_ref = Map::new();
    scope_ref.insert("apiVersion".into(), json!(scope.api_version));
    scope_ref.insert("kind".into(), json!(scope.kind.as_str()));
    scope_ref.insert("name".into(), json!(scope.name));
    scope_ref.insert("namespace".into(), json!(scope.namespace));
    if let Some(uid) = &scope.uid {
        scope_ref.insert("uid".into(), json!(uid));
        // Owned, so that the garbage collector removes the report with its workload. Neither
        // `controller` nor `blockOwnerDeletion`: the report controls nothing, and blocking
        // would need the finalizers permission on the workload kinds.
        metadata.insert(
            "ownerReferences".into(),
            json!([{
                "apiVersion": scope.api_version,
                "kind": scope.kind.as_str(),
                "name": scope.name,
                "uid": uid,
            }]),
        );
    }
    let results: Vec<Value> = w
        .results
        .iter()
        .map(|r| {
            let mut result = Map::new();
            result.insert("policy".into(), json!(POLICY));
            result.insert("rule".into(), json!(r.rule.as_str()));
            result.insert("result".into(), json!(r.status.as_str()));
            result.insert("severity".into(), json!(rules::severity(r.rule)));
            result.insert("message".into(), json!(&*r.message));
            if !r.properties.is_empty() {
                let properties: Map<String, Value> = r
                    .properties
                    .iter()
                    .map(|(k, v)| (k.to_string(), json!(&**v)))
                    .collect();
                result.insert("properties".into(), Value::Object(properties));
            }
            result.insert("scored".into(), json!(true));
            result.insert("source".into(), json!(SOURCE));
            result.insert(
                "timestamp".into(),
                json!({"seconds": at.seconds, "nanos": at.nanos}),
            );
            Value::Object(result)
        })
        .chain(w.extra.iter().map(|r| {
            json!({
                "policy": POLICY,
                "rule": r.rule,
                "result": r.status.as_str(),
                "severity": r.severity,
                "message": &*r.message,
                "scored": true,
                "source": SOURCE,
                "timestamp": {"seconds": at.seconds, "nanos": at.nanos},
            })
        }))
        .collect();
    let mut report = Map::new();
    report.insert("apiVersion".into(), json!(api.api_version()));
    report.insert("kind".into(), json!(api.kind()));
    report.insert("metadata".into(), Value::Object(metadata));
    report.insert("scope".into(), Value::Object(scope_ref));
    if api == ReportApi::OpenReports {
        // Only the OpenReports CRD has a report-level source.
        report.insert("source".into(), json!(SOURCE));
    }
    report.insert("results".into(), Value::Array(results));
    report.insert("summary".into(), summary(w));
    Value::Object(report)
}

/// Writes the reports as a YAML stream, one document per workload, each begun by `---`.
pub fn write_stream<'a>(
    out: &mut dyn Write,
    api: ReportApi,
    workloads: impl IntoIterator<Item = &'a WorkloadResults>,
    at: Timestamp,
) -> io::Result<()> {
    for w in workloads {
        let yaml = serde_saphyr::to_string(&report(api, w, at)).map_err(io::Error::other)?;
        writeln!(out, "---\n{}", yaml.trim_end())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::AuditedKind;
    use crate::kinds::WorkloadKinds;

    fn kind(name: &str) -> AuditedKind {
        static TABLE: std::sync::OnceLock<WorkloadKinds> = std::sync::OnceLock::new();
        let table = TABLE.get_or_init(WorkloadKinds::default);
        AuditedKind::of(table, "apps/v1", name).unwrap()
    }

    fn scope(kind: AuditedKind, name: &str, uid: Option<&str>) -> Scope {
        Scope {
            api_version: "apps/v1".into(),
            kind,
            namespace: "team-a".into(),
            name: name.into(),
            uid: uid.map(str::to_string),
        }
    }

    #[test]
    fn names_come_from_the_uid_or_the_kind_and_name() {
        assert_eq!(
            report_name(&scope(
                kind("Deployment"),
                "web",
                Some("0b7c3f2e-1111-4a2b-8c3d-000000000001")
            )),
            "modelgate-0b7c3f2e-1111-4a2b-8c3d-000000000001"
        );
        assert_eq!(
            report_name(&scope(kind("StatefulSet"), "db.v2", None)),
            "modelgate-statefulset-db.v2"
        );
    }

    #[test]
    fn invalid_or_long_names_are_cleaned_with_a_stable_hash() {
        let a = report_name(&scope(AuditedKind::Pod, "Web_App-", None));
        assert!(is_dns_subdomain(&a), "{a}");
        assert!(a.starts_with("modelgate-pod-web-app-"), "{a}");
        assert_eq!(a, report_name(&scope(AuditedKind::Pod, "Web_App-", None)));
        // Two names that clean to the same text keep apart through the hash.
        let b = report_name(&scope(AuditedKind::Pod, "web-app_", None));
        assert_ne!(a, b);
        for raw in [
            "x".repeat(300),
            "a..b".into(),
            ".-.-.".into(),
            "-".into(),
            "é".repeat(200),
        ] {
            let name = dns_subdomain(&raw);
            assert!(is_dns_subdomain(&name), "{raw:?} -> {name:?}");
            assert!(name.len() <= MAX_NAME);
            assert_eq!(name, dns_subdomain(&raw));
        }
        let long = dns_subdomain(&"x".repeat(300));
        assert_eq!(long.len(), MAX_NAME);
        assert_ne!(long, dns_subdomain(&"x".repeat(301)));
    }

    #[test]
    fn subdomain_rules() {
        for ok in ["a", "a.b", "a-b.c-d", "0"] {
            assert!(is_dns_subdomain(ok), "{ok}");
        }
        for bad in ["", "A", "a..b", "-a", "a-", "a.-b", "a_b", ".a"] {
            assert!(!is_dns_subdomain(bad), "{bad}");
        }
    }
}
