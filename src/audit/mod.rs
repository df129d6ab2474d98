//! `modelgate audit` (docs/policy.md §10): existing workloads evaluated as if each were created now in
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
pub mod exceptions;
pub mod images;
pub mod output;
pub mod rules;
pub mod write;

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use serde::Serialize;
use serde_json::{Map, Value, json};

use crate::admission::{self, Context, Decision, DecodeError, Request, Webhook};
use crate::kinds::{Completeness, KindEntry, Shape, WorkloadKind, WorkloadKinds};
use crate::policy::Rule;
pub use rules::{RuleResult, Status};

/// The kinds `audit` evaluates: Pods, Jobs, and the kinds of the workload-kind table
/// (docs/policy.md §11, §12), whose rows the audit's table holds for the whole run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AuditedKind {
    Pod,
    Job,
    Table(&'static KindEntry),
}

impl Serialize for AuditedKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl AuditedKind {
    /// Every kind of `table`: Pods, Jobs, then the table's rows.
    pub fn all(table: &'static WorkloadKinds) -> Vec<AuditedKind> {
        [AuditedKind::Pod, AuditedKind::Job]
            .into_iter()
            .chain(table.entries().iter().map(AuditedKind::Table))
            .collect()
    }

    pub fn as_str(self) -> &'static str {
        match self {
            AuditedKind::Pod => "Pod",
            AuditedKind::Job => "Job",
            AuditedKind::Table(e) => &e.kind,
        }
    }

    /// API group and version (a table row's first version).
    pub fn group_version(self) -> (&'static str, &'static str) {
        match self {
            AuditedKind::Pod => WorkloadKind::Pod.group_version(),
            AuditedKind::Job => WorkloadKind::Job.group_version(),
            AuditedKind::Table(e) => (&e.group, e.versions.first().map_or("", String::as_str)),
        }
    }

    /// The resource name in API paths (`deployments`).
    pub fn plural(self) -> &'static str {
        match self {
            AuditedKind::Pod => "pods",
            AuditedKind::Job => "jobs",
            AuditedKind::Table(e) => &e.plural,
        }
    }

    /// `group/Kind` for a kind outside the core and batch groups, else the kind: how notes
    /// name it.
    pub fn display(self) -> String {
        match self {
            AuditedKind::Table(e) => e.display(),
            other => other.as_str().to_string(),
        }
    }

    /// Whether its objects live in a namespace.
    pub fn namespaced(self) -> bool {
        !matches!(self, AuditedKind::Table(e) if e.scope == crate::kinds::Scope::Cluster)
    }

    /// The kind of an object, by its `apiVersion` and its `kind`.
    pub fn of(table: &'static WorkloadKinds, api_version: &str, kind: &str) -> Option<AuditedKind> {
        if let Some(entry) = table.find_api_version(api_version, kind) {
            return Some(AuditedKind::Table(entry));
        }
        match WorkloadKind::of_api_version(api_version, kind)? {
            WorkloadKind::Pod => Some(AuditedKind::Pod),
            WorkloadKind::Job => Some(AuditedKind::Job),
            _ => None,
        }
    }
}

/// One pod an object stands for: a Pod or a Job itself, or a complete template of a table
/// kind as the Pod its controller would create.
#[derive(Debug)]
pub struct Part {
    /// Where the Pod's `metadata` and `spec` are inside the object (field path and JSON
    /// pointer), `None` for a Pod or a Job, which are evaluated as themselves:
    /// `spec.template.metadata`/`spec.template.spec` for a Deployment,
    /// `spec.workerGroupSpecs[1].template.…` for a RayCluster, the bare pod spec's own path for
    /// a PodSpec-shaped template.
    pub at: Option<TemplatePlace>,
    /// The Pod (or Job) admission would see.
    pub object: Value,
}

/// Where a template's pod is inside its object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TemplatePlace {
    pub metadata: (String, String),
    pub spec: (String, String),
    /// Whether the template has a `metadata` object of its own (`Some(false)`: it could, but
    /// has none; `None`: a bare pod spec, which cannot), so that a patch of the pod's metadata
    /// is put in the workload's terms as one that applies to it.
    pub own_metadata: Option<bool>,
}

impl Part {
    /// A field of the evaluated Pod (`spec.containers[0]…`) in the workload's own terms.
    pub fn field(&self, field: &str) -> String {
        self.map(field, '.', |p| (&p.metadata.0, &p.spec.0))
    }

    /// A JSON pointer into the evaluated Pod (`/spec/securityContext`) in the workload's terms.
    pub fn pointer(&self, pointer: &str) -> String {
        let Some(inner) = pointer.strip_prefix('/') else {
            return pointer.to_string();
        };
        format!(
            "/{}",
            self.map(inner, '/', |p| (&p.metadata.1, &p.spec.1))
                .trim_start_matches('/')
        )
    }

    fn map(
        &self,
        path: &str,
        sep: char,
        place: impl Fn(&TemplatePlace) -> (&String, &String),
    ) -> String {
        let Some(at) = &self.at else {
            return path.to_string();
        };
        let (metadata, spec) = place(at);
        let (head, rest) = match path.split_once([sep, '[']) {
            Some((head, _)) => (head, &path[head.len()..]),
            None => (path, ""),
        };
        match head {
            "spec" => format!("{spec}{rest}"),
            "metadata" => format!("{metadata}{rest}"),
            _ => path.to_string(),
        }
    }
}

/// One object to evaluate: the pods that stand for it.
#[derive(Debug)]
pub struct Target {
    pub kind: AuditedKind,
    /// The workload's own `apiVersion` (`apps/v1` for a Deployment), as read.
    pub api_version: String,
    pub namespace: String,
    pub name: String,
    /// The workload's `metadata.uid`, when it has one (always from the cluster).
    pub uid: Option<String>,
    /// The pods of its complete templates (one for a Pod or a Job; none for a kind whose
    /// templates are all partial or absent).
    pub parts: Vec<Part>,
    /// What its partial templates say that their pods would be denied for (warnings).
    pub partial: Vec<crate::policy::Violation>,
    /// The object itself, as read, for the findings of its partial templates.
    source: Option<Value>,
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

/// The object (with `apiVersion` and `kind`) as the things admission would see. `default_ns`
/// names the namespace of an object that names none. An audited kind without what admission
/// needs is an error saying what is missing.
pub fn extract(
    value: Value,
    default_ns: &str,
    table: &'static WorkloadKinds,
) -> Result<Extracted, String> {
    let api_version = value
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("");
    let kind_name = value.get("kind").and_then(Value::as_str).unwrap_or("");
    let Some(kind) = AuditedKind::of(table, api_version, kind_name) else {
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
        (AuditedKind::Table(e), Some("Deployment"))
            if e.group == "apps" && e.kind == "ReplicaSet" =>
        {
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
    let namespace = meta(&value, "namespace").unwrap_or_else(|| {
        if kind.namespaced() {
            default_ns.to_string()
        } else {
            String::new()
        }
    });
    let name = meta(&value, "name")
        .or_else(|| meta(&value, "generateName"))
        .unwrap_or_default();
    let uid = meta(&value, "uid");
    let api_version = api_version.to_string();
    let (parts, source) = match kind {
        AuditedKind::Table(entry) => (
            template_parts(entry, &value, &namespace, &name)?,
            Some(value),
        ),
        _ => (
            vec![Part {
                at: None,
                object: value,
            }],
            None,
        ),
    };
    Ok(Extracted::Target(Target {
        kind,
        api_version,
        namespace,
        name,
        uid,
        parts,
        partial: Vec::new(),
        source,
    }))
}

/// The Pods of the complete templates of an object of a table kind.
fn template_parts(
    entry: &KindEntry,
    value: &Value,
    namespace: &str,
    owner: &str,
) -> Result<Vec<Part>, String> {
    let text = value.to_string();
    let found = admission::templates_of(entry, &text)?;
    let mut parts = Vec::new();
    for t in found {
        if t.completeness == Completeness::Partial {
            continue;
        }
        let template = match serde_json::from_str::<Value>(t.text) {
            Ok(Value::Object(template)) => template,
            _ => return Err(format!("{} is not an object", t.path)),
        };
        let template = match t.shape {
            Shape::PodTemplateSpec => template,
            Shape::PodSpec => {
                let mut wrapped = Map::new();
                wrapped.insert("spec".into(), Value::Object(template));
                wrapped
            }
        };
        let dotted = |inner: &str| format!("{}.{inner}", t.path);
        let slashed = |inner: &str| format!("{}/{inner}", t.pointer);
        let at = match t.shape {
            Shape::PodTemplateSpec => TemplatePlace {
                metadata: (dotted("metadata"), slashed("metadata")),
                spec: (dotted("spec"), slashed("spec")),
                own_metadata: Some(template.get("metadata").is_some_and(Value::is_object)),
            },
            // A bare pod spec: the Pod's `spec` is the template itself.
            Shape::PodSpec => TemplatePlace {
                metadata: (dotted("metadata"), slashed("metadata")),
                spec: (t.path.clone(), t.pointer.clone()),
                own_metadata: None,
            },
        };
        parts.push(Part {
            at: Some(at),
            object: from_template(template, "v1", "Pod", namespace, owner),
        });
    }
    // A kind with complete templates makes no pod without one: an object that has none is not
    // an object of its kind (the API server would have refused it).
    let complete: Vec<&str> = entry
        .templates
        .iter()
        .filter(|t| t.completeness == Completeness::Complete)
        .map(|t| t.path.as_str())
        .collect();
    if parts.is_empty() && !complete.is_empty() {
        return Err(format!("{} is missing", complete.join(" or ")));
    }
    Ok(parts)
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

/// Evaluates `target` as the API server would on its creation now, in `enforce` mode: for each
/// pod that stands for it, the mutating webhook, its patch applied, then the validating
/// webhook; the findings of its partial templates are warnings. `ctx` must say `enforce` for
/// every namespace.
pub fn evaluate(target: &Target, ctx: &Context) -> Evaluation {
    let mut parts = target
        .parts
        .iter()
        .map(|part| evaluate_part(target, part, ctx));
    let first = parts.next();
    let mut e = match first {
        Some(e) => parts.fold(e, combine),
        None => Evaluation {
            outcome: Outcome::Unchanged,
            rules: Vec::new(),
            changes: Vec::new(),
            message: None,
            results: rules::no_complete_template(),
        },
    };
    let partial = match (&target.kind, &target.source) {
        (AuditedKind::Table(entry), Some(source)) => {
            admission::partial_findings(entry, &source.to_string(), &target.namespace, ctx)
        }
        _ => target.partial.clone(),
    };
    rules::add_partial_findings(&mut e.results, &partial);
    e
}

/// One evaluation of two pods of the same object: the worse outcome, every rule and change,
/// both messages, and each rule's worse result.
fn combine(mut a: Evaluation, b: Evaluation) -> Evaluation {
    a.outcome = match (a.outcome, b.outcome) {
        (Outcome::Denied, _) | (_, Outcome::Denied) => Outcome::Denied,
        (Outcome::Patched, _) | (_, Outcome::Patched) => Outcome::Patched,
        _ => Outcome::Unchanged,
    };
    a.rules.extend(b.rules);
    a.rules.sort();
    a.rules.dedup();
    a.changes.extend(b.changes);
    a.message = match (a.message, b.message) {
        (Some(x), Some(y)) => Some(format!("{x} {y}")),
        (x, y) => x.or(y),
    };
    a.results = rules::worse(a.results, b.results);
    a
}

/// One pod of `target`: the Pod or Job itself, or the Pod of one of its complete templates.
fn evaluate_part(target: &Target, part: &Part, ctx: &Context) -> Evaluation {
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
    let mutated = decide(Webhook::Mutate, &part.object);
    if !mutated.allowed {
        // Ranges are checked before anything is patched: what the rest would do is unknown.
        let results = rules::denied_before_mutation(part, &mutated);
        return denied(part, mutated, results);
    }
    let (validated, patched) = match &mutated.patch {
        Some(patch) => {
            let mut object = part.object.clone();
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
        None => (decide(Webhook::Validate, &part.object), part.object.clone()),
    };
    let would = |c: &crate::policy::Change| {
        // `would set spec.…` in the workload's own terms.
        let would = c.would();
        match would.split_once(" spec.") {
            Some((verb, rest)) if part.at.is_some() => {
                format!("{verb} {}", part.field(&format!("spec.{rest}")))
            }
            _ => would,
        }
    };
    let results = rules::after_mutation(part, &mutated, &patched, &validated, &would);
    if !validated.allowed {
        return denied(part, validated, results);
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

fn denied(part: &Part, decision: Decision, results: Vec<RuleResult>) -> Evaluation {
    let mut rules: Vec<Rule> = decision.violations.iter().map(|v| v.rule).collect();
    rules.sort();
    rules.dedup();
    let mut message = decision.message.unwrap_or_default();
    if part.at.is_some() {
        for v in &decision.violations {
            message = rename_field(&message, &v.field, &part.field(&v.field));
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
/// renamed to `renamed`.
fn rename_field(message: &str, field: &str, renamed: &str) -> String {
    let needle = format!("{field}: ");
    let at = message
        .match_indices(&needle)
        .map(|(at, _)| at)
        .find(|&at| at == 0 || message[..at].ends_with(' '));
    match at {
        Some(at) => format!(
            "{}{renamed}{}",
            &message[..at],
            &message[at + field.len()..]
        ),
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

/// One object a rule that only warns has a finding on (`root-equivalent`): never a denial.
#[derive(Clone, Debug, Serialize)]
pub struct WarningEntry {
    pub namespace: String,
    pub kind: AuditedKind,
    pub name: String,
    /// Where it was read: `file#N` or `cluster`.
    pub origin: String,
    pub rule: &'static str,
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
    /// `<rule>: <message>` of each rule that only warns and has a finding on it.
    pub warnings: Vec<String>,
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
    /// Every namespace together, by rule (the rules that patch or deny: a rule that only warns
    /// would count every object unchanged; its findings are in `warnings`).
    pub rules: BTreeMap<&'static str, Counts>,
    pub denials: Vec<DenialEntry>,
    /// The findings of the rules that only warn (`root-equivalent`), one per object and rule.
    pub warnings: Vec<WarningEntry>,
    /// Objects in namespaces exempt from the policy (`--exempt-namespace`), not evaluated.
    pub exempt: BTreeMap<String, usize>,
    /// Workloads counted through their owner, and other notes.
    pub notes: Vec<String>,
    /// With `--images`: each workload's `image-user` result, and what was read of the images.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub images: Option<images::ImagesAudit>,
    /// Every exception of the cluster state, and the workloads each waived a rule for.
    #[serde(skip_serializing_if = "exceptions::ExceptionUses::is_empty")]
    pub exceptions: exceptions::ExceptionUses,
    /// Every object's result, only when a report needs them all (JUnit).
    #[serde(skip)]
    pub entries: Option<Vec<ObjectEntry>>,
    /// Every object's results by rule, only when the policy reports need them.
    #[serde(skip)]
    pub workloads: Option<Vec<WorkloadResults>>,
    /// The texts of the kept results, each held once.
    #[serde(skip)]
    texts: Texts,
}

/// Each distinct text of the kept results, held once: a cluster's workloads mostly repeat
/// the same messages and patches (the same uid, fsGroup and prep for a namespace's
/// Deployments), and `--write-reports` keeps every workload's results until the reports are
/// written, so memory grows with the distinct texts, not with the workloads times their texts.
#[derive(Clone, Debug, Default)]
struct Texts(HashSet<Arc<str>>);

impl Texts {
    fn share(&mut self, text: &str) -> Arc<str> {
        if let Some(held) = self.0.get(text) {
            return held.clone();
        }
        let held: Arc<str> = Arc::from(text);
        self.0.insert(held.clone());
        held
    }
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

/// One evaluated workload and its result for each rule, as the policy reports need it.
#[derive(Clone, Debug)]
pub struct WorkloadResults {
    pub scope: Scope,
    pub results: Vec<KeptResult>,
    /// Results of checks that are not policy rules, after the rules' (`image-user`, with
    /// `audit --images`).
    pub extra: Vec<ExtraResult>,
}

/// The result of a check that is not one of the policy's rules (`image-user`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExtraResult {
    pub rule: &'static str,
    pub status: Status,
    pub severity: &'static str,
    pub message: Arc<str>,
}

/// A [`RuleResult`] kept for a report, its texts shared with every equal one of the run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeptResult {
    pub rule: Rule,
    pub status: Status,
    pub message: Arc<str>,
    pub properties: Vec<(&'static str, Arc<str>)>,
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
        // Reports are namespaced: a cluster-scoped workload (a ClusterTrainingRuntime) is
        // counted and listed, but gets none.
        if let Some(workloads) = self
            .workloads
            .as_mut()
            .filter(|_| !target.namespace.is_empty())
        {
            workloads.push(WorkloadResults {
                scope: Scope {
                    api_version: target.api_version.clone(),
                    kind: target.kind,
                    namespace: target.namespace.clone(),
                    name: target.name.clone(),
                    uid: target.uid.clone(),
                },
                results: e
                    .results
                    .iter()
                    .map(|r| KeptResult {
                        rule: r.rule,
                        status: r.status,
                        message: self.texts.share(&r.message),
                        properties: r
                            .properties
                            .iter()
                            .map(|(&k, v)| (k, self.texts.share(v)))
                            .collect(),
                    })
                    .collect(),
                extra: Vec::new(),
            });
        }
        let mut waivers: Vec<&str> = e
            .results
            .iter()
            .filter_map(|r| r.properties.get(rules::EXCEPTION))
            .flat_map(|names| names.split(','))
            .collect();
        if !waivers.is_empty() {
            waivers.sort_unstable();
            waivers.dedup();
            self.exceptions.add(&target.namespace, &waivers, || {
                format!(
                    "{} {}/{}",
                    target.kind.as_str(),
                    target.namespace,
                    target.name
                )
            });
        }
        self.objects += 1;
        self.counts.add(e.outcome);
        let ns = self.namespaces.entry(target.namespace.clone()).or_default();
        ns.objects += 1;
        ns.counts.add(e.outcome);
        for rule in Rule::ALL.into_iter().filter(|r| !r.warns_only()) {
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
        let warned: Vec<&RuleResult> = e
            .results
            .iter()
            .filter(|r| r.rule.warns_only() && r.status == Status::Warn)
            .collect();
        for r in &warned {
            self.warnings.push(WarningEntry {
                namespace: target.namespace.clone(),
                kind: target.kind,
                name: target.name.clone(),
                origin: origin.to_string(),
                rule: r.rule.as_str(),
                message: r.message.clone(),
            });
        }
        if let Some(entries) = self.entries.as_mut() {
            entries.push(ObjectEntry {
                namespace: target.namespace.clone(),
                kind: target.kind,
                name: target.name.clone(),
                origin: origin.to_string(),
                outcome: e.outcome,
                warnings: warned
                    .iter()
                    .map(|r| format!("{}: {}", r.rule, r.message))
                    .collect(),
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
