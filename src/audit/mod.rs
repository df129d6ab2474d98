//! `modelgate audit` (SPEC.md §10): existing workloads evaluated as if each were created now in
//! `enforce` mode, and counted per namespace and per rule, with each workload's result for each
//! rule ([`rules`]). The evaluation is pure: objects in, a report out. What is written of the
//! report is in [`output`] (table, JSON, JUnit, the policy reports); the cluster listing is in
//! [`cluster`], the writes of `--write-reports` in [`write`], the command line in `cli::audit`.
//!
//! A Pod or a Job is evaluated as it is. A controller is evaluated through the pods it
//! creates: the Pod of its pod template, where the core's [`WorkloadKind`] says it is
//! (`spec.template`, a CronJob's `spec.jobTemplate.spec.template`); the fields its denials name
//! are given back in the controller's own terms (`spec.template.spec.containers[0]…`). A
//! ReplicaSet controlled by a Deployment and a Job controlled by a CronJob repeat their owner's
//! template exactly, so only the owner is counted.

pub mod cluster;
pub mod output;
pub mod rules;
pub mod write;

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::{Map, Value, json};

use crate::admission::{self, Context, Decision, DecodeError, Request, Webhook, WorkloadKind};
use crate::policy::Rule;
pub use rules::{RuleResult, Status};

/// The kinds `audit` evaluates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum AuditedKind {
    Pod,
    Job,
    CronJob,
    Deployment,
    StatefulSet,
    DaemonSet,
    ReplicaSet,
}

impl AuditedKind {
    pub const ALL: [AuditedKind; 7] = [
        AuditedKind::Pod,
        AuditedKind::Job,
        AuditedKind::CronJob,
        AuditedKind::Deployment,
        AuditedKind::StatefulSet,
        AuditedKind::DaemonSet,
        AuditedKind::ReplicaSet,
    ];

    pub fn as_str(self) -> &'static str {
        self.workload_kind().as_str()
    }

    /// The kind as admission knows it.
    pub fn workload_kind(self) -> WorkloadKind {
        match self {
            AuditedKind::Pod => WorkloadKind::Pod,
            AuditedKind::Job => WorkloadKind::Job,
            AuditedKind::CronJob => WorkloadKind::CronJob,
            AuditedKind::Deployment => WorkloadKind::Deployment,
            AuditedKind::StatefulSet => WorkloadKind::StatefulSet,
            AuditedKind::DaemonSet => WorkloadKind::DaemonSet,
            AuditedKind::ReplicaSet => WorkloadKind::ReplicaSet,
        }
    }

    /// API group and version as served today.
    pub fn group_version(self) -> (&'static str, &'static str) {
        self.workload_kind().group_version()
    }

    /// The resource name in API paths (`deployments`).
    pub fn plural(self) -> &'static str {
        match self {
            AuditedKind::Pod => "pods",
            AuditedKind::Job => "jobs",
            AuditedKind::CronJob => "cronjobs",
            AuditedKind::Deployment => "deployments",
            AuditedKind::StatefulSet => "statefulsets",
            AuditedKind::DaemonSet => "daemonsets",
            AuditedKind::ReplicaSet => "replicasets",
        }
    }

    /// The kind of an object, by its `apiVersion` and its `kind`.
    pub fn of(api_version: &str, kind: &str) -> Option<AuditedKind> {
        let kind = WorkloadKind::of_api_version(api_version, kind)?;
        AuditedKind::ALL
            .into_iter()
            .find(|k| k.workload_kind() == kind)
    }

    /// Where the fields of the evaluated Pod or Job are inside an object of this kind: nothing
    /// for a Pod or a Job (evaluated as themselves), the pod template's path for a controller.
    fn field_prefix(self) -> String {
        let kind = self.workload_kind();
        if !kind.is_controller() {
            return String::new();
        }
        kind.pod_template_path()
            .unwrap_or_default()
            .iter()
            .map(|key| format!("{key}."))
            .collect()
    }
}

/// One object to evaluate: the Pod or Job that stands for it.
#[derive(Debug)]
pub struct Target {
    pub kind: AuditedKind,
    /// The workload's own `apiVersion` (`apps/v1` for a Deployment), as read.
    pub api_version: String,
    pub namespace: String,
    pub name: String,
    /// The workload's `metadata.uid`, when it has one (always from the cluster).
    pub uid: Option<String>,
    /// The Pod (or Job) admission would see.
    pub object: Value,
}

/// What [`extract`] makes of one object.
#[derive(Debug)]
pub enum Extracted {
    Target(Target),
    /// A workload counted through its owner, which repeats its template (says which kind).
    Owned(&'static str),
    /// Not one of the audited kinds (a Service, a ConfigMap, …).
    NotAWorkload,
}

/// The object (with `apiVersion` and `kind`) as the thing admission would see. `default_ns`
/// names the namespace of an object that names none. An audited kind without what admission
/// needs (its template) is an error saying what is missing.
pub fn extract(mut value: Value, default_ns: &str) -> Result<Extracted, String> {
    let api_version = value
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("");
    let kind_name = value.get("kind").and_then(Value::as_str).unwrap_or("");
    let Some(kind) = AuditedKind::of(api_version, kind_name) else {
        return Ok(Extracted::NotAWorkload);
    };
    let controller = value
        .pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .and_then(|refs| {
            refs.iter()
                .find(|r| r.get("controller") == Some(&Value::Bool(true)))
        })
        .and_then(|r| r.get("kind"))
        .and_then(Value::as_str);
    match (kind, controller) {
        (AuditedKind::ReplicaSet, Some("Deployment")) => {
            return Ok(Extracted::Owned("ReplicaSet controlled by a Deployment"));
        }
        (AuditedKind::Job, Some("CronJob")) => {
            return Ok(Extracted::Owned("Job controlled by a CronJob"));
        }
        _ => {}
    }
    let meta = |v: &Value, key: &str| {
        v.pointer(&format!("/metadata/{key}"))
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
    };
    let namespace = meta(&value, "namespace").unwrap_or_else(|| default_ns.to_string());
    let name = meta(&value, "name")
        .or_else(|| meta(&value, "generateName"))
        .unwrap_or_default();
    let uid = meta(&value, "uid");
    let api_version = api_version.to_string();
    let object = if kind.workload_kind().is_controller() {
        let template = take_template(&mut value, kind.workload_kind())?;
        from_template(template, "v1", "Pod", &namespace, &name)
    } else {
        value
    };
    Ok(Extracted::Target(Target {
        kind,
        api_version,
        namespace,
        name,
        uid,
        object,
    }))
}

fn take_template(value: &mut Value, kind: WorkloadKind) -> Result<Map<String, Value>, String> {
    let pointer = kind.pod_template_pointer();
    let field = pointer.trim_start_matches('/').replace('/', ".");
    match value.pointer_mut(&pointer).map(Value::take) {
        Some(Value::Object(t)) => Ok(t),
        Some(_) => Err(format!("{field} is not an object")),
        None => Err(format!("{field} is missing")),
    }
}

/// The object a controller creates from its template, in the controller's namespace.
fn from_template(
    mut template: Map<String, Value>,
    api_version: &str,
    kind: &str,
    namespace: &str,
    owner: &str,
) -> Value {
    let mut metadata = match template.remove("metadata") {
        Some(Value::Object(m)) => m,
        _ => Map::new(),
    };
    metadata.insert("namespace".into(), json!(namespace));
    // Controllers name what they create after themselves; nothing may depend on the name.
    metadata
        .entry("generateName")
        .or_insert_with(|| json!(format!("{owner}-")));
    json!({
        "apiVersion": api_version,
        "kind": kind,
        "metadata": metadata,
        "spec": template.remove("spec").unwrap_or(Value::Null),
    })
}

/// What `enforce` would do with one object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    Patched,
    Denied,
    Unchanged,
}

/// The evaluation of one object.
#[derive(Debug)]
pub struct Evaluation {
    pub outcome: Outcome,
    /// The rules whose changes the patch makes (allowed objects) or whose violations the denial
    /// names (denied objects), each once.
    pub rules: Vec<Rule>,
    /// `would …` phrases of the changes (allowed objects).
    pub changes: Vec<String>,
    /// The denial's message, in the original object's terms.
    pub message: Option<String>,
    /// One result per rule of [`Rule::ALL`], in that order (see [`rules`]).
    pub results: Vec<RuleResult>,
}

/// Evaluates `target` as the API server would on its creation now, in `enforce` mode: the
/// mutating webhook, its patch applied, then the validating webhook. `ctx` must say `enforce`
/// for every namespace.
pub fn evaluate(target: &Target, ctx: &Context) -> Evaluation {
    // The decision for `object` in the AdmissionReview of its creation, decoded as `serve`
    // decodes a body.
    let decide = |webhook: Webhook, object: &Value| {
        let review = admission::create_review(object, &target.namespace, "modelgate-audit");
        let body = serde_json::to_vec(&review).unwrap_or_default();
        match Request::from_slice(&body) {
            Ok(request) => admission::decide(webhook, &request, ctx),
            Err(e) => Decision {
                allowed: false,
                message: Some(match e {
                    DecodeError::Unanswerable(message) | DecodeError::Invalid { message, .. } => {
                        message
                    }
                }),
                code: Some(400),
                ..Default::default()
            },
        }
    };
    let mutated = decide(Webhook::Mutate, &target.object);
    if !mutated.allowed {
        // Ranges are checked before anything is patched: what the rest would do is unknown.
        let results = rules::denied_before_mutation(target, &mutated);
        return denied(target.kind, mutated, results);
    }
    let (validated, patched) = match &mutated.patch {
        Some(patch) => {
            let mut object = target.object.clone();
            let applied = patch
                .try_operations()
                .map_err(|e| e.to_string())
                .and_then(|ops| json_patch::patch(&mut object, &ops).map_err(|e| e.to_string()));
            if let Err(e) = applied {
                // The patch is built against this very object; say so rather than guess.
                let message = format!("the policy's patch does not apply: {e}");
                return Evaluation {
                    outcome: Outcome::Denied,
                    rules: Vec::new(),
                    changes: Vec::new(),
                    results: rules::all_errors(&message),
                    message: Some(message),
                };
            }
            let validated = decide(Webhook::Validate, &object);
            (validated, object)
        }
        None => (
            decide(Webhook::Validate, &target.object),
            target.object.clone(),
        ),
    };
    let prefix = target.kind.field_prefix();
    let prefix = prefix.as_str();
    let would = |c: &crate::policy::Change| {
        // `would set spec.…` in the controller's own terms.
        let would = c.would();
        match would.split_once(" spec.") {
            Some((verb, rest)) if !prefix.is_empty() => format!("{verb} {prefix}spec.{rest}"),
            _ => would,
        }
    };
    let results = rules::after_mutation(target, &mutated, &patched, &validated, &would);
    if !validated.allowed {
        return denied(target.kind, validated, results);
    }
    let mut rules: Vec<Rule> = mutated.changes.iter().map(|c| c.rule).collect();
    rules.sort();
    rules.dedup();
    let changes = mutated.changes.iter().map(would).collect();
    Evaluation {
        outcome: if mutated.patch.is_some() {
            Outcome::Patched
        } else {
            Outcome::Unchanged
        },
        rules,
        changes,
        message: None,
        results,
    }
}

fn denied(kind: AuditedKind, decision: Decision, results: Vec<RuleResult>) -> Evaluation {
    let mut rules: Vec<Rule> = decision.violations.iter().map(|v| v.rule).collect();
    rules.sort();
    rules.dedup();
    let mut message = decision.message.unwrap_or_default();
    let prefix = kind.field_prefix();
    let prefix = prefix.as_str();
    if !prefix.is_empty() {
        for v in &decision.violations {
            message = prefix_field(&message, &v.field, prefix);
        }
    }
    Evaluation {
        outcome: Outcome::Denied,
        rules,
        changes: Vec::new(),
        message: Some(message),
        results,
    }
}

/// `message` with the whole field `field` (at the start or after a space, followed by `: `)
/// renamed to `prefix` + `field`.
fn prefix_field(message: &str, field: &str, prefix: &str) -> String {
    let needle = format!("{field}: ");
    let at = message
        .match_indices(&needle)
        .map(|(at, _)| at)
        .find(|&at| at == 0 || message[..at].ends_with(' '));
    match at {
        Some(at) => format!("{}{prefix}{}", &message[..at], &message[at..]),
        None => message.to_string(),
    }
}

/// Counts of one rule, or of all rules together.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    pub patched: usize,
    pub denied: usize,
    pub unchanged: usize,
}

impl Counts {
    fn add(&mut self, outcome: Outcome) {
        match outcome {
            Outcome::Patched => self.patched += 1,
            Outcome::Denied => self.denied += 1,
            Outcome::Unchanged => self.unchanged += 1,
        }
    }

    pub fn objects(&self) -> usize {
        self.patched + self.denied + self.unchanged
    }
}

/// One namespace: its objects' outcomes, and by rule.
#[derive(Clone, Debug, Default, Serialize)]
pub struct NamespaceReport {
    pub objects: usize,
    #[serde(flatten)]
    pub counts: Counts,
    /// For each rule: objects it would patch, objects it would deny, objects it leaves as they
    /// are.
    pub rules: BTreeMap<&'static str, Counts>,
}

/// One denied object.
#[derive(Clone, Debug, Serialize)]
pub struct DenialEntry {
    pub namespace: String,
    pub kind: AuditedKind,
    pub name: String,
    /// Where it was read: `file#N` or `cluster`.
    pub origin: String,
    pub rules: Vec<&'static str>,
    pub message: String,
}

/// One evaluated object, kept for the JUnit report.
#[derive(Clone, Debug)]
pub struct ObjectEntry {
    pub namespace: String,
    pub kind: AuditedKind,
    pub name: String,
    pub origin: String,
    pub outcome: Outcome,
    pub changes: Vec<String>,
    pub message: Option<String>,
}

/// The whole audit.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Report {
    /// `files` or `cluster`.
    pub source: String,
    pub objects: usize,
    #[serde(flatten)]
    pub counts: Counts,
    pub namespaces: BTreeMap<String, NamespaceReport>,
    /// Every namespace together, by rule.
    pub rules: BTreeMap<&'static str, Counts>,
    pub denials: Vec<DenialEntry>,
    /// Objects in namespaces exempt from the policy (`--exempt-namespace`), not evaluated.
    pub exempt: BTreeMap<String, usize>,
    /// Workloads counted through their owner, and other notes.
    pub notes: Vec<String>,
    /// Every object's result, only when a report needs them all (JUnit).
    #[serde(skip)]
    pub entries: Option<Vec<ObjectEntry>>,
    /// Every object's results by rule, only when the policy reports need them.
    #[serde(skip)]
    pub workloads: Option<Vec<WorkloadResults>>,
}

/// The workload a policy report is about: its own apiVersion, kind, name and uid (a
/// Deployment, not its pod template).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scope {
    pub api_version: String,
    pub kind: AuditedKind,
    pub namespace: String,
    pub name: String,
    pub uid: Option<String>,
}

/// One evaluated workload and its result for each rule.
#[derive(Clone, Debug)]
pub struct WorkloadResults {
    pub scope: Scope,
    pub results: Vec<RuleResult>,
}

impl Report {
    pub fn new(source: &str, keep_entries: bool) -> Self {
        Report {
            source: source.into(),
            entries: keep_entries.then(Vec::new),
            ..Default::default()
        }
    }

    /// Counts an exempt object.
    pub fn add_exempt(&mut self, namespace: &str) {
        *self.exempt.entry(namespace.to_string()).or_default() += 1;
    }

    /// Keeps every object's results by rule, for the policy reports.
    pub fn keeping_results(mut self) -> Self {
        self.workloads = Some(Vec::new());
        self
    }

    /// Counts one evaluated object.
    pub fn add(&mut self, target: &Target, origin: &str, e: Evaluation) {
        if let Some(workloads) = self.workloads.as_mut() {
            workloads.push(WorkloadResults {
                scope: Scope {
                    api_version: target.api_version.clone(),
                    kind: target.kind,
                    namespace: target.namespace.clone(),
                    name: target.name.clone(),
                    uid: target.uid.clone(),
                },
                results: e.results.clone(),
            });
        }
        self.objects += 1;
        self.counts.add(e.outcome);
        let ns = self.namespaces.entry(target.namespace.clone()).or_default();
        ns.objects += 1;
        ns.counts.add(e.outcome);
        for rule in Rule::ALL {
            let outcome = if e.rules.contains(&rule) {
                e.outcome
            } else {
                Outcome::Unchanged
            };
            ns.rules.entry(rule.as_str()).or_default().add(outcome);
            self.rules.entry(rule.as_str()).or_default().add(outcome);
        }
        if let Some(message) = &e.message {
            self.denials.push(DenialEntry {
                namespace: target.namespace.clone(),
                kind: target.kind,
                name: target.name.clone(),
                origin: origin.to_string(),
                rules: e.rules.iter().map(|r| r.as_str()).collect(),
                message: message.clone(),
            });
        }
        if let Some(entries) = self.entries.as_mut() {
            entries.push(ObjectEntry {
                namespace: target.namespace.clone(),
                kind: target.kind,
                name: target.name.clone(),
                origin: origin.to_string(),
                outcome: e.outcome,
                changes: e.changes,
                message: e.message,
            });
        }
    }

    /// Whether every evaluated object would be allowed.
    pub fn all_allowed(&self) -> bool {
        self.counts.denied == 0
    }
}

#[cfg(test)]
mod tests;
