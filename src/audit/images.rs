//! `audit --images` (docs/audit.md#the-image-user-check---images): what `images` reads of each
//! workload's images, joined to the audit as a check of its own, `image-user`, one result per
//! workload next to the policy's rules. It is not a rule of the policy: it patches and denies
//! nothing and never changes the exit code.
//!
//! - `error`: an image of the workload could not be read (with the workload's credentials):
//!   what its containers expect is unknown.
//! - `warn`: a container will run as a uid its image does not expect, could not write the
//!   model cache the prep leaves, or a pull secret of the workload cannot be used.
//! - `pass`: every container runs as the uid its image expects.
//! - `skip`: the workload has no container with an image.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Serialize;

use super::{ExtraResult, Report, Status};
use crate::images::{self, ContainerResult, PullSecretFinding};

/// The name of the check in every output.
pub const RULE: &str = "image-user";
/// Its severity in the policy reports: an image whose files expect another uid fails at run
/// time as a missing prep does (`cache-prep` is `medium` too).
pub const SEVERITY: &str = "medium";

/// One workload's `image-user` result.
#[derive(Clone, Debug, Serialize)]
pub struct ImageUserEntry {
    pub namespace: String,
    pub kind: String,
    pub name: String,
    pub status: Status,
    pub message: String,
}

/// What `--images` adds to the JSON report.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ImagesAudit {
    /// Workloads by result of `image-user`.
    pub counts: BTreeMap<&'static str, usize>,
    /// Each workload's result.
    pub results: Vec<ImageUserEntry>,
    /// Each image read, as `images -o json` gives it.
    pub images: Vec<images::ImageResult>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub pull_secret_findings: Vec<PullSecretFinding>,
    pub notes: Vec<String>,
}

/// `Deployment team-a/web` → the workload's `(kind, namespace, name)`, as [`images`] and the
/// audit both name it.
type Key = (String, String, String);

/// The `image-user` result of one workload from its containers' results.
fn result_of(containers: &[&ContainerResult], findings: &[&PullSecretFinding]) -> (Status, String) {
    if containers.is_empty() {
        return (Status::Skip, "no container with an image".to_string());
    }
    let mut errors = Vec::new();
    let mut warnings = Vec::new();
    for c in containers {
        let u = &c.container;
        let which = format!("container {} ({})", u.container, u.image);
        if let Some(e) = &c.image_error {
            errors.push(format!(
                "{which}: cannot read its config (with {}): {e}",
                c.read_with.as_deref().unwrap_or("anonymous")
            ));
        }
        for w in [&c.warning, &c.cache_warning].into_iter().flatten() {
            warnings.push(format!("{which}: {w}"));
        }
    }
    for f in findings {
        warnings.push(format!("pull secret: {}: {}", f.object, f.problem));
    }
    errors.sort();
    errors.dedup();
    warnings.sort();
    warnings.dedup();
    let status = if !errors.is_empty() {
        Status::Error
    } else if !warnings.is_empty() {
        Status::Warn
    } else {
        Status::Pass
    };
    let message = if status == Status::Pass {
        "every container runs as the uid its image expects".to_string()
    } else {
        errors
            .into_iter()
            .chain(warnings)
            .collect::<Vec<_>>()
            .join("; ")
    };
    (status, message)
}

/// Joins `read` (what `images` read of the audited workloads) to `report`: an `image-user`
/// result for every evaluated workload, in the JSON and table outputs, in the policy reports
/// kept (after the rules' results) and in the JUnit entries' output.
pub fn join(report: &mut Report, read: images::Report) {
    let mut by_workload: BTreeMap<Key, Vec<&ContainerResult>> = BTreeMap::new();
    for c in &read.containers {
        let u = &c.container;
        by_workload
            .entry((u.kind.clone(), u.namespace.clone(), u.name.clone()))
            .or_default()
            .push(c);
    }
    let mut findings: BTreeMap<&str, Vec<&PullSecretFinding>> = BTreeMap::new();
    for f in &read.pull_secret_findings {
        findings.entry(f.workload.as_str()).or_default().push(f);
    }
    let mut audit = ImagesAudit::default();
    let mut results: BTreeMap<Key, (Status, Arc<str>)> = BTreeMap::new();
    // The workloads the audit evaluated: the kept results (policy reports), the JUnit
    // entries, or, for the table and JSON, those `images` saw (the same objects).
    let mut keys: Vec<Key> = by_workload.keys().cloned().collect();
    for w in report.workloads.iter().flatten() {
        keys.push((
            w.scope.kind.as_str().to_string(),
            w.scope.namespace.clone(),
            w.scope.name.clone(),
        ));
    }
    keys.sort();
    keys.dedup();
    for key in keys {
        let workload = format!("{} {}/{}", key.0, key.1, key.2);
        let containers = by_workload.get(&key).map(Vec::as_slice).unwrap_or_default();
        let found = findings
            .get(workload.as_str())
            .map(Vec::as_slice)
            .unwrap_or_default();
        let (status, message) = result_of(containers, found);
        *audit.counts.entry(status.as_str()).or_default() += 1;
        audit.results.push(ImageUserEntry {
            kind: key.0.clone(),
            namespace: key.1.clone(),
            name: key.2.clone(),
            status,
            message: message.clone(),
        });
        results.insert(key, (status, Arc::from(message)));
    }
    for w in report.workloads.iter_mut().flatten() {
        let key = (
            w.scope.kind.as_str().to_string(),
            w.scope.namespace.clone(),
            w.scope.name.clone(),
        );
        if let Some((status, message)) = results.get(&key) {
            w.extra.push(ExtraResult {
                rule: RULE,
                status: *status,
                severity: SEVERITY,
                message: message.clone(),
            });
        }
    }
    for e in report.entries.iter_mut().flatten() {
        let key = (
            e.kind.as_str().to_string(),
            e.namespace.clone(),
            e.name.clone(),
        );
        if let Some((status, message)) = results.get(&key)
            && matches!(status, Status::Warn | Status::Error)
        {
            e.warnings
                .push(format!("{RULE}: {}: {message}", status.as_str()));
        }
    }
    audit.images = read.images;
    audit.pull_secret_findings = read.pull_secret_findings;
    audit.notes = read.notes;
    report.images = Some(audit);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::images::ContainerUse;

    fn container(warning: Option<&str>, error: Option<&str>) -> ContainerResult {
        ContainerResult {
            container: ContainerUse {
                kind: "Deployment".into(),
                namespace: "team-a".into(),
                name: "web".into(),
                container: "c0".into(),
                field: "spec.template.spec.containers[0]".into(),
                image: "r.example/app:1".into(),
                run_as_user: Some(1000),
                run_as_user_from: Some("pod"),
                denied: None,
                cache: None,
                pull: Default::default(),
            },
            image_user: None,
            read_with: Some("anonymous".into()),
            image_error: error.map(str::to_string),
            pull_secrets: Vec::new(),
            warning: warning.map(str::to_string),
            cache_warning: None,
        }
    }

    #[test]
    fn an_unreadable_image_is_an_error_a_mismatch_a_warning() {
        let ok = container(None, None);
        let mismatch = container(Some("runs as uid 1000 … expect uid 1001"), None);
        let unreadable = container(None, Some("Not authorized"));
        assert_eq!(result_of(&[&ok], &[]).0, Status::Pass);
        let (status, message) = result_of(&[&ok, &mismatch], &[]);
        assert_eq!(status, Status::Warn);
        assert!(message.contains("container c0 (r.example/app:1): runs as uid 1000"));
        let (status, message) = result_of(&[&mismatch, &unreadable], &[]);
        assert_eq!(status, Status::Error);
        assert!(message.contains("cannot read its config (with anonymous): Not authorized"));
        assert!(message.contains("expect uid 1001"));
        assert_eq!(result_of(&[], &[]).0, Status::Skip);
        let finding = PullSecretFinding {
            workload: "Deployment team-a/web".into(),
            object: "secret team-a/broken".into(),
            problem: "malformed".into(),
        };
        assert_eq!(result_of(&[&ok], &[&finding]).0, Status::Warn);
    }
}
