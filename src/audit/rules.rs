//! One result per rule for each evaluated workload, as the policy reports carry them
//! (`-o openreports`, `-o policyreport`, `--write-reports`; docs/policy.md §10).
//!
//! The rules are the core's [`Rule::ALL`]: `non-root` (§3, and the uid/gid ranges and
//! `runAsNonRoot: false` of §6), `cache-prep` (§4, and §6's canonical prep), `model-cache` (§5)
//! and `schema` (§6: the object decodes as its kind). Each §6 check belongs to the rule whose
//! fields it reads, so a denial is a `fail` of that rule. `root-equivalent` only warns
//! ([`Rule::warns_only`]): its result is `warn` when `/validate` would warn of the object
//! (a privileged container), `pass` otherwise, never `fail`.
//!
//! - `fail`: the rule's violations would deny the object; the message names them, in the
//!   workload's own terms (`spec.template.spec.containers[0]…` for a Deployment).
//! - `warn`: enforcing would patch the object for this rule; the message says what (`would …`)
//!   and the `patch` property holds the JSON Patch enforcing would apply.
//! - `pass`: the rule applies and neither changes nor denies anything.
//! - `skip`: the rule does not apply to this object (no model URI, no cache-prep for it), or
//!   was not evaluated because the object is denied before anything is patched.
//! - `error`: the evaluation itself failed (the policy's own patch did not apply).

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::{Value, json};

use super::Part;
use crate::admission::Decision;
use crate::cache::{MissReason, Resolved};
use crate::config::PREP_CONTAINER;
use crate::policy::{Change, Denial, Rule, Violation};

/// A result as the report APIs spell it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Pass,
    Fail,
    Warn,
    Error,
    Skip,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pass => "pass",
            Status::Fail => "fail",
            Status::Warn => "warn",
            Status::Error => "error",
            Status::Skip => "skip",
        }
    }
}

/// Property keys of a result (values are strings, as both report APIs require).
pub const PATCH: &str = "patch";
pub const MODEL_CACHE_OUTCOME: &str = "modelCacheOutcome";
pub const MODEL_CACHE_REASON: &str = "modelCacheReason";
/// The exceptions that waived the rule for the workload (docs/exceptions.md), comma-separated.
pub const EXCEPTION: &str = "exception";

/// One rule's result for one workload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleResult {
    pub rule: Rule,
    pub status: Status,
    pub message: String,
    pub properties: BTreeMap<&'static str, String>,
}

/// The severity a rule's results are reported with: running as root is the risk the policy
/// exists for (and what Pod Security's `restricted` refuses), an object that does not decode
/// is refused outright, a missing or wrong prep leaves a cache unwritable, and a model cache
/// miss only costs a download.
pub fn severity(rule: Rule) -> &'static str {
    match rule {
        Rule::NonRoot | Rule::Schema | Rule::RootEquivalent => "high",
        Rule::CachePrep => "medium",
        Rule::ModelCache => "low",
    }
}

/// The object is denied by the mutating pass (the ranges are checked before any patch is
/// built): the violated rules fail; the others were not evaluated.
pub(super) fn denied_before_mutation(part: &Part, decision: &Decision) -> Vec<RuleResult> {
    Rule::ALL
        .into_iter()
        .map(|rule| match failure(part, decision, rule) {
            Some(r) => r,
            None => RuleResult {
                rule,
                status: Status::Skip,
                message: "not evaluated: the object would be denied before anything is patched"
                    .into(),
                properties: BTreeMap::new(),
            },
        })
        .collect()
}

/// Every rule in error, when the evaluation itself failed.
pub(super) fn all_errors(message: &str) -> Vec<RuleResult> {
    Rule::ALL
        .into_iter()
        .map(|rule| RuleResult {
            rule,
            status: Status::Error,
            message: message.to_string(),
            properties: BTreeMap::new(),
        })
        .collect()
}

/// The results once the mutating pass allowed the object: `mutated` is its decision, `patched`
/// the object with its patch applied, `validated` the validating pass's decision on it, and
/// `would` puts a change in the workload's terms.
pub(super) fn after_mutation(
    part: &Part,
    mutated: &Decision,
    patched: &Value,
    validated: &Decision,
    would: &dyn Fn(&Change) -> String,
) -> Vec<RuleResult> {
    let patch = mutated
        .patch
        .as_ref()
        .and_then(|p| p.try_operations().ok())
        .map(|ops| workload_patch(part, ops));
    Rule::ALL
        .into_iter()
        .map(|rule| {
            if rule.warns_only() {
                return warned(part, validated, rule);
            }
            let mut result = failure(part, validated, rule).unwrap_or_else(|| {
                let changes: Vec<&Change> =
                    mutated.changes.iter().filter(|c| c.rule == rule).collect();
                if changes.is_empty() {
                    unchanged(rule, part, mutated, patched)
                } else {
                    let mut phrases: Vec<String> = changes.iter().map(|c| would(c)).collect();
                    // What a change announces when applied (a cache that matched but missed,
                    // and what is missing) is part of why it would be made.
                    phrases.extend(changes.iter().filter_map(|c| c.applied_warning.clone()));
                    let mut properties = BTreeMap::new();
                    if let Some(patch) = &patch {
                        properties.insert(PATCH, patch.clone());
                    }
                    RuleResult {
                        rule,
                        status: Status::Warn,
                        message: phrases.join("; "),
                        properties,
                    }
                }
            });
            waived(&mut result, mutated, validated);
            if rule == Rule::ModelCache
                && let Some(resolved) = mutated.model_cache
            {
                let (outcome, reason) = model_cache_properties(resolved);
                result
                    .properties
                    .insert(MODEL_CACHE_OUTCOME, outcome.into());
                result.properties.insert(MODEL_CACHE_REASON, reason.into());
            }
            result
        })
        .collect()
}

/// A rule an exception waived for the workload (docs/exceptions.md): `skip`, naming the
/// exception, where the rule would change nothing else; a `warn` or `fail` for what the
/// exception does not cover stays, and names the exception too.
fn waived(result: &mut RuleResult, mutated: &Decision, validated: &Decision) {
    use crate::exceptions::Waivable;
    let waivable = match result.rule {
        Rule::NonRoot => Waivable::NonRoot,
        Rule::CachePrep => Waivable::CachePrep,
        _ => return,
    };
    let mut uses: Vec<&crate::exceptions::ExceptionUse> = Vec::new();
    for u in mutated.exceptions.iter().chain(&validated.exceptions) {
        if u.waives(waivable) && !uses.iter().any(|k| k.name == u.name) {
            uses.push(u);
        }
    }
    if uses.is_empty() {
        return;
    }
    let names: Vec<&str> = uses.iter().map(|u| u.name.as_str()).collect();
    let named = uses
        .iter()
        .map(|u| format!("exception {} (until {})", u.name, u.expires))
        .collect::<Vec<_>>()
        .join(", ");
    result.properties.insert(EXCEPTION, names.join(","));
    match result.status {
        Status::Pass | Status::Skip => {
            result.status = Status::Skip;
            result.message = format!("waived by {named}");
        }
        _ => result.message = format!("{}; {waivable} waived in part by {named}", result.message),
    }
}

/// The result of a rule that only warns: `warn` with what the validating pass found (in the
/// workload's own terms), whether or not the object is denied for other rules; else `pass`.
fn warned(part: &Part, validated: &Decision, rule: Rule) -> RuleResult {
    let findings = &validated.findings;
    let (status, message) = if findings.listed.iter().any(|v| v.rule == rule) {
        (Status::Warn, findings.message(|field| part.field(field)))
    } else {
        (
            Status::Pass,
            "no container has securityContext.privileged: true".to_string(),
        )
    };
    RuleResult {
        rule,
        status,
        message,
        properties: BTreeMap::new(),
    }
}

/// `fail` of `rule`, when `decision` denies with violations of it. A denial without any
/// violation (the request itself could not be judged) is the schema rule's.
fn failure(part: &Part, decision: &Decision, rule: Rule) -> Option<RuleResult> {
    if decision.allowed {
        return None;
    }
    if decision.violations.is_empty() {
        return (rule == Rule::Schema).then(|| RuleResult {
            rule,
            status: Status::Fail,
            message: decision.message.clone().unwrap_or_default(),
            properties: BTreeMap::new(),
        });
    }
    let violations: Vec<Violation> = decision
        .violations
        .iter()
        .filter(|v| v.rule == rule)
        .map(|v| Violation {
            field: part.field(&v.field),
            ..v.clone()
        })
        .collect();
    if violations.is_empty() {
        return None;
    }
    Some(RuleResult {
        rule,
        status: Status::Fail,
        message: Denial { violations }.to_string(),
        properties: BTreeMap::new(),
    })
}

/// A rule that changes nothing: `pass` where it applies, `skip` where it does not.
fn unchanged(rule: Rule, part: &Part, mutated: &Decision, patched: &Value) -> RuleResult {
    let (status, message) = match rule {
        Rule::NonRoot => (
            Status::Pass,
            "runs as a non-root, numeric user: nothing to change".to_string(),
        ),
        Rule::Schema => (
            Status::Pass,
            "the fields the policy reads decode as their Kubernetes schema says".to_string(),
        ),
        // Judged by `warned`; nothing to change is a pass.
        Rule::RootEquivalent => (Status::Pass, "nothing to change".to_string()),
        Rule::CachePrep if has_prep(part, patched) => (
            Status::Pass,
            format!("the {PREP_CONTAINER} init container is in place and canonical"),
        ),
        // After enforce's patch, the canonical prep is there exactly when the policy manages
        // one for this pod; without it, nothing of §4 applies.
        Rule::CachePrep => (
            Status::Skip,
            format!(
                "no {PREP_CONTAINER} for this pod: no writable model cache volume, \
                 --model-cache-prep=never, a Windows pod, or a Pod Security restricted namespace"
            ),
        ),
        Rule::ModelCache => match mutated.model_cache {
            None => (
                Status::Skip,
                "no model URI (modelgate.io/model-uri or KServe's storage-initializer-sourceuri)"
                    .to_string(),
            ),
            Some(Resolved::Miss(MissReason::OptedOut)) => {
                (Status::Skip, "opted out of the model cache".to_string())
            }
            Some(Resolved::Miss(MissReason::KserveManaged)) => (
                Status::Skip,
                "routed by KServe's own pod mutator, not by modelgate".to_string(),
            ),
            Some(Resolved::Miss(reason)) => (
                Status::Pass,
                format!("model cache miss ({reason}), already recorded: nothing to change"),
            ),
            Some(hit) => (
                Status::Pass,
                format!(
                    "model served from a {}, already mounted: nothing to change",
                    model_cache_properties(hit).1
                ),
            ),
        },
    };
    RuleResult {
        rule,
        status,
        message,
        properties: BTreeMap::new(),
    }
}

/// `modelCacheOutcome` (`hit` or `miss`) and `modelCacheReason`: the miss's reason, or the
/// kind of cache that serves a hit.
fn model_cache_properties(resolved: Resolved) -> (&'static str, &'static str) {
    match resolved {
        Resolved::Namespace => ("hit", "LocalModelNamespaceCache"),
        Resolved::Cluster => ("hit", "LocalModelCache"),
        Resolved::Miss(reason) => ("miss", reason.as_str()),
    }
}

/// Whether the evaluated object (after enforce's patch) has the prep init container.
fn has_prep(part: &Part, patched: &Value) -> bool {
    let pointer = match part.object.get("kind").and_then(Value::as_str) {
        Some("Job") => "/spec/template/spec/initContainers",
        _ => "/spec/initContainers",
    };
    patched
        .pointer(pointer)
        .and_then(Value::as_array)
        .is_some_and(|init| {
            init.iter()
                .any(|c| c.get("name").and_then(Value::as_str) == Some(PREP_CONTAINER))
        })
}

/// The patch enforcing would apply, as a JSON array in a string, in the workload's own terms:
/// a template's pods get it, so its paths are moved under the template
/// (`/spec/template/spec/securityContext`). The policy patches a pod's metadata for a model URI
/// (itself in the template's metadata) and for the skip annotations of the identity webhooks
/// (which create `metadata.annotations` where the template has none).
pub(super) fn workload_patch(part: &Part, ops: json_patch::Patch) -> String {
    let mut ops = serde_json::to_value(ops).unwrap_or(Value::Array(Vec::new()));
    if let Some(at) = &part.at
        && let Value::Array(list) = &mut ops
    {
        // The evaluated Pod always has metadata (its namespace); the template may have none.
        // Without a place for it (a bare pod spec) the pods get theirs when they are created:
        // such operations are left out. Without one of its own, the annotations the policy
        // creates create the template's metadata.
        if at.own_metadata.is_none() {
            list.retain(|op| {
                op["path"]
                    .as_str()
                    .is_none_or(|p| p != "/metadata" && !p.starts_with("/metadata/"))
            });
        }
        for op in list.iter_mut() {
            if at.own_metadata == Some(false)
                && op["op"] == "add"
                && op["path"] == "/metadata/annotations"
            {
                op["path"] = Value::String("/metadata".into());
                op["value"] = json!({"annotations": op["value"].take()});
            }
            for key in ["path", "from"] {
                if let Some(Value::String(path)) = op.get_mut(key) {
                    *path = part.pointer(path);
                }
            }
        }
    }
    ops.to_string()
}

/// The results of an object without a complete template (every template partial or absent):
/// nothing is patched or denied; what its partial templates say is added after.
pub(super) fn no_complete_template() -> Vec<RuleResult> {
    Rule::ALL
        .into_iter()
        .map(|rule| RuleResult {
            rule,
            status: match rule {
                Rule::NonRoot | Rule::Schema => Status::Pass,
                Rule::CachePrep | Rule::ModelCache | Rule::RootEquivalent => Status::Skip,
            },
            message: match rule {
                Rule::NonRoot | Rule::Schema => {
                    "no complete pod template; the partial templates say nothing against it"
                }
                Rule::CachePrep | Rule::ModelCache | Rule::RootEquivalent => {
                    "no complete pod template: judged when its pods are created"
                }
            }
            .to_string(),
            properties: BTreeMap::new(),
        })
        .collect()
}

/// The findings of partial templates (docs/policy.md §12): a `warn` of their rule, never a `fail`
/// (a rule that already fails keeps its result).
pub(super) fn add_partial_findings(results: &mut [RuleResult], findings: &[Violation]) {
    for result in results.iter_mut() {
        let mine: Vec<Violation> = findings
            .iter()
            .filter(|v| v.rule == result.rule)
            .cloned()
            .collect();
        if mine.is_empty() || matches!(result.status, Status::Fail | Status::Error) {
            continue;
        }
        let message = format!(
            "a partial template would give its pods a denial: {}",
            Denial { violations: mine }
        );
        if result.status == Status::Warn {
            result.message = format!("{}; {message}", result.message);
        } else {
            result.status = Status::Warn;
            result.message = message;
        }
    }
}

/// Each rule's worse result of two pods of one object (`fail` over `error` over `warn` over
/// `pass` over `skip`); two results of the same status keep both messages and patches.
pub(super) fn worse(a: Vec<RuleResult>, b: Vec<RuleResult>) -> Vec<RuleResult> {
    let rank = |s: Status| match s {
        Status::Fail => 4,
        Status::Error => 3,
        Status::Warn => 2,
        Status::Pass => 1,
        Status::Skip => 0,
    };
    a.into_iter()
        .zip(b)
        .map(|(mut a, b)| {
            match rank(a.status).cmp(&rank(b.status)) {
                std::cmp::Ordering::Less => return b,
                std::cmp::Ordering::Greater => return a,
                std::cmp::Ordering::Equal => {}
            }
            if a.message != b.message {
                a.message = format!("{}; {}", a.message, b.message);
            }
            for (key, value) in b.properties {
                match a.properties.get_mut(key) {
                    Some(mine) if key == PATCH => *mine = concat_patches(mine, &value),
                    Some(_) => {}
                    None => {
                        a.properties.insert(key, value);
                    }
                }
            }
            a
        })
        .collect()
}

/// Two JSON Patch arrays (as strings) as one.
fn concat_patches(a: &str, b: &str) -> String {
    let parse = |s: &str| serde_json::from_str::<Vec<Value>>(s).unwrap_or_default();
    let mut ops = parse(a);
    ops.extend(parse(b));
    Value::Array(ops).to_string()
}
