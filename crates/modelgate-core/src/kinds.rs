//! The kinds modelgate handles (docs/policy.md §1): Pods and Jobs, which it mutates, and the
//! workload-kind table (docs/policy.md §11, §12), the one place that says where the pod templates of
//! every other kind are and how each is judged, for admission, `review`, `audit` and the
//! reports alike. The table is data: `workload-kinds.yaml` next to this file holds the rows
//! shipped (each with the upstream type its paths were checked against), and `--workload-kinds`
//! files add rows or replace them.

use std::fmt;
use std::sync::{Arc, OnceLock};

use serde::Deserialize;

/// The built-in kinds: what metrics label a request with, and the two kinds that are mutated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum WorkloadKind {
    Pod,
    Job,
    Deployment,
    StatefulSet,
    DaemonSet,
    ReplicaSet,
    ReplicationController,
    CronJob,
}

impl WorkloadKind {
    pub const ALL: [WorkloadKind; 8] = [
        WorkloadKind::Pod,
        WorkloadKind::Job,
        WorkloadKind::Deployment,
        WorkloadKind::StatefulSet,
        WorkloadKind::DaemonSet,
        WorkloadKind::ReplicaSet,
        WorkloadKind::ReplicationController,
        WorkloadKind::CronJob,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            WorkloadKind::Pod => "Pod",
            WorkloadKind::Job => "Job",
            WorkloadKind::Deployment => "Deployment",
            WorkloadKind::StatefulSet => "StatefulSet",
            WorkloadKind::DaemonSet => "DaemonSet",
            WorkloadKind::ReplicaSet => "ReplicaSet",
            WorkloadKind::ReplicationController => "ReplicationController",
            WorkloadKind::CronJob => "CronJob",
        }
    }

    /// API group and version, as served today.
    pub fn group_version(self) -> (&'static str, &'static str) {
        match self {
            WorkloadKind::Pod | WorkloadKind::ReplicationController => ("", "v1"),
            WorkloadKind::Job | WorkloadKind::CronJob => ("batch", "v1"),
            WorkloadKind::Deployment
            | WorkloadKind::StatefulSet
            | WorkloadKind::DaemonSet
            | WorkloadKind::ReplicaSet => ("apps", "v1"),
        }
    }

    /// The kind of a request or an object by group, version and kind; `None` for any other.
    pub fn of(group: &str, version: &str, kind: &str) -> Option<WorkloadKind> {
        WorkloadKind::ALL
            .into_iter()
            .find(|k| k.as_str() == kind && k.group_version() == (group, version))
    }

    /// [`of`](Self::of) for an object's `apiVersion` (`apps/v1`, `v1`) and `kind`.
    pub fn of_api_version(api_version: &str, kind: &str) -> Option<WorkloadKind> {
        let (group, version) = split_api_version(api_version);
        WorkloadKind::of(group, version, kind)
    }

    /// A built-in workload controller (docs/policy.md §11), a row of the table: its pod template is
    /// judged, never patched; its pods are mutated when they are created.
    pub fn is_controller(self) -> bool {
        !self.is_mutated()
    }

    /// A Pod or a Job: mutated and validated (docs/policy.md §1).
    pub fn is_mutated(self) -> bool {
        matches!(self, WorkloadKind::Pod | WorkloadKind::Job)
    }
}

/// `apps/v1` → (`apps`, `v1`); `v1` → (``, `v1`).
pub fn split_api_version(api_version: &str) -> (&str, &str) {
    api_version.rsplit_once('/').unwrap_or(("", api_version))
}

/// What is found at a template path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
pub enum Shape {
    /// `metadata` and `spec`, as a Deployment's `spec.template`.
    PodTemplateSpec,
    /// A pod spec without metadata, as an InferenceService's `spec.predictor`.
    PodSpec,
}

/// How much of the pods a template says (docs/policy.md §12).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Completeness {
    /// Copied into the pods (the controller adds labels, env, volumes): judged as the pods will
    /// be, mutated in memory, then validated.
    Complete,
    /// Merged with other objects (a runtime, a base config) before it becomes a pod: judged
    /// only on the fields it carries, and the findings are warnings.
    Partial,
}

/// Whether the kind's objects live in a namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
pub enum Scope {
    Namespaced,
    Cluster,
}

/// One step of a template path.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Step {
    /// The value of this key of an object.
    Key(String),
    /// Every element of a list (`[*]`).
    EveryElement,
    /// Every value of a map (`*`).
    EveryValue,
}

/// Where one pod template of a kind is, and how it is judged.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TemplatePath {
    /// As written: `spec.workerGroupSpecs[*].template`.
    pub path: String,
    pub steps: Vec<Step>,
    pub shape: Shape,
    pub completeness: Completeness,
}

/// One row of the table.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KindEntry {
    /// The API group (`""` for the core group).
    pub group: String,
    pub versions: Vec<String>,
    pub kind: String,
    /// The resource name in API paths and webhook rules.
    pub plural: String,
    pub scope: Scope,
    pub templates: Vec<TemplatePath>,
    /// Where the paths were checked (upstream repository and type).
    pub source: Option<String>,
}

impl KindEntry {
    /// `group/Kind`, or `Kind` for the core group: how messages name the kind.
    pub fn display(&self) -> String {
        if self.group.is_empty() {
            self.kind.clone()
        } else {
            format!("{}/{}", self.group, self.kind)
        }
    }

    /// Whether every template of the kind is partial (nothing it says is ever denied).
    pub fn is_partial(&self) -> bool {
        self.templates
            .iter()
            .all(|t| t.completeness == Completeness::Partial)
    }

    fn serves(&self, group: &str, version: &str, kind: &str) -> bool {
        self.group == group && self.kind == kind && self.versions.iter().any(|v| v == version)
    }
}

/// The table: the rows shipped, then those of `--workload-kinds` (which replace a shipped row
/// of the same group and kind).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkloadKinds {
    entries: Vec<KindEntry>,
}

/// The rows shipped, as data.
pub const DEFAULT_TABLE: &str = include_str!("workload-kinds.yaml");

/// A table file that cannot be used: which entry, which field, what is wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableError(pub String);

impl fmt::Display for TableError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TableError {}

/// An entry as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EntryIn {
    group: String,
    versions: Vec<String>,
    kind: String,
    plural: String,
    #[serde(default)]
    scope: Option<Scope>,
    #[serde(default)]
    templates: Vec<TemplateIn>,
    #[serde(default)]
    source: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TemplateIn {
    path: String,
    #[serde(default)]
    shape: Option<Shape>,
    #[serde(default)]
    completeness: Option<Completeness>,
}

impl WorkloadKinds {
    /// The rows shipped (parsed once).
    pub fn defaults() -> Arc<WorkloadKinds> {
        static DEFAULTS: OnceLock<Arc<WorkloadKinds>> = OnceLock::new();
        DEFAULTS
            .get_or_init(|| {
                let entries = parse(DEFAULT_TABLE, "the built-in table")
                    .unwrap_or_else(|e| panic!("the built-in workload-kind table: {e}"));
                Arc::new(WorkloadKinds { entries })
            })
            .clone()
    }

    /// The table with the entries of `text` (a `--workload-kinds` file, named `origin` in
    /// errors): each replaces the row of the same group and kind, or is added after the rows.
    pub fn with_file(&self, text: &str, origin: &str) -> Result<WorkloadKinds, TableError> {
        let mut entries = self.entries.clone();
        for extra in parse(text, origin)? {
            match entries
                .iter_mut()
                .find(|e| e.group == extra.group && e.kind == extra.kind)
            {
                Some(row) => *row = extra,
                None => entries.push(extra),
            }
        }
        Ok(WorkloadKinds { entries })
    }

    pub fn entries(&self) -> &[KindEntry] {
        &self.entries
    }

    /// The row of a request's group, version and kind.
    pub fn find(&self, group: &str, version: &str, kind: &str) -> Option<&KindEntry> {
        self.entries.iter().find(|e| e.serves(group, version, kind))
    }

    /// [`find`](Self::find) for an object's `apiVersion` and `kind`.
    pub fn find_api_version(&self, api_version: &str, kind: &str) -> Option<&KindEntry> {
        let (group, version) = split_api_version(api_version);
        self.find(group, version, kind)
    }
}

impl Default for WorkloadKinds {
    fn default() -> Self {
        WorkloadKinds::defaults().as_ref().clone()
    }
}

/// Reads a table file: a YAML list of entries (an empty file is an empty list).
pub(super) fn parse(text: &str, origin: &str) -> Result<Vec<KindEntry>, TableError> {
    let value: serde_json::Value =
        serde_saphyr::from_str(text).map_err(|e| TableError(format!("{origin}: not YAML: {e}")))?;
    let items = match value {
        serde_json::Value::Null => return Ok(Vec::new()),
        serde_json::Value::Array(items) => items,
        _ => {
            return Err(TableError(format!(
                "{origin}: expected a list of workload kinds (- group: …, kind: …, templates: …)"
            )));
        }
    };
    items
        .into_iter()
        .enumerate()
        .map(|(i, item)| entry(item, origin, i + 1))
        .collect()
}

fn entry(item: serde_json::Value, origin: &str, n: usize) -> Result<KindEntry, TableError> {
    let name = {
        let field = |key: &str| item.get(key).and_then(|v| v.as_str()).unwrap_or("");
        match (field("group"), field("kind")) {
            (_, "") => String::new(),
            ("", kind) => format!(" ({kind})"),
            (group, kind) => format!(" ({group}/{kind})"),
        }
    };
    let fail = |field: &str, problem: String| {
        TableError(format!("{origin}: entry {n}{name}: {field}: {problem}"))
    };
    let raw: EntryIn = serde_path_to_error::deserialize(item).map_err(|e| {
        let field = e.path().to_string();
        fail(&field, e.into_inner().to_string())
    })?;
    let non_empty = |field: &str, value: &str| {
        if value.is_empty() {
            Err(fail(field, "must not be empty".into()))
        } else {
            Ok(())
        }
    };
    non_empty("kind", &raw.kind)?;
    non_empty("plural", &raw.plural)?;
    if raw.versions.is_empty() {
        return Err(fail("versions", "must name at least one version".into()));
    }
    for (i, v) in raw.versions.iter().enumerate() {
        non_empty(&format!("versions[{i}]"), v)?;
    }
    if let Some(own) = WorkloadKind::ALL
        .into_iter()
        .filter(|k| k.is_mutated())
        .find(|k| k.group_version().0 == raw.group && k.as_str() == raw.kind)
    {
        return Err(fail(
            "kind",
            format!(
                "{} is mutated by modelgate itself and cannot be a row",
                own.as_str()
            ),
        ));
    }
    if raw.templates.is_empty() {
        return Err(fail(
            "templates",
            "no template path: name at least one (- path: spec.template)".into(),
        ));
    }
    let templates = raw
        .templates
        .into_iter()
        .enumerate()
        .map(|(i, t)| {
            let steps =
                parse_path(&t.path).map_err(|why| fail(&format!("templates[{i}].path"), why))?;
            Ok(TemplatePath {
                path: t.path,
                steps,
                shape: t.shape.unwrap_or(Shape::PodTemplateSpec),
                completeness: t.completeness.unwrap_or(Completeness::Complete),
            })
        })
        .collect::<Result<_, TableError>>()?;
    Ok(KindEntry {
        group: raw.group,
        versions: raw.versions,
        kind: raw.kind,
        plural: raw.plural,
        scope: raw.scope.unwrap_or(Scope::Namespaced),
        templates,
        source: raw.source,
    })
}

/// Words CEL reserves: a field of one of these names cannot be selected by the chart's
/// `matchConditions` as written.
const CEL_RESERVED: [&str; 21] = [
    "true",
    "false",
    "null",
    "in",
    "as",
    "break",
    "const",
    "continue",
    "else",
    "for",
    "function",
    "if",
    "import",
    "let",
    "loop",
    "package",
    "namespace",
    "return",
    "var",
    "void",
    "while",
];

/// `spec.workerGroupSpecs[*].template` → its steps. Keys are field names (letters, digits,
/// `_`, not starting with a digit), as Kubernetes API fields are and as CEL selects them.
pub(super) fn parse_path(path: &str) -> Result<Vec<Step>, String> {
    let mut steps = Vec::new();
    for (i, segment) in path.split('.').enumerate() {
        if segment == "*" {
            if i == 0 {
                return Err(format!(
                    "`{path}`: a path starts with a field name, not `*`"
                ));
            }
            steps.push(Step::EveryValue);
            continue;
        }
        let (key, every) = match segment.strip_suffix("[*]") {
            Some(key) => (key, true),
            None => (segment, false),
        };
        let is_name = key
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !is_name {
            return Err(format!(
                "`{path}`: `{segment}` is not a field name (letters, digits and `_`), \
                 a field name followed by `[*]` (every element of a list) or `*` (every \
                 value of a map)"
            ));
        }
        if CEL_RESERVED.contains(&key) {
            return Err(format!(
                "`{path}`: `{key}` is a CEL reserved word, which the webhook's conditions \
                 cannot select"
            ));
        }
        steps.push(Step::Key(key.to_string()));
        if every {
            steps.push(Step::EveryElement);
        }
    }
    Ok(steps)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_is_found_by_its_group_version_and_name_only() {
        for kind in WorkloadKind::ALL {
            let (group, version) = kind.group_version();
            assert_eq!(WorkloadKind::of(group, version, kind.as_str()), Some(kind));
            let api_version = if group.is_empty() {
                version.to_string()
            } else {
                format!("{group}/{version}")
            };
            assert_eq!(
                WorkloadKind::of_api_version(&api_version, kind.as_str()),
                Some(kind)
            );
        }
        assert_eq!(WorkloadKind::of("apps", "v1beta2", "Deployment"), None);
        assert_eq!(WorkloadKind::of("", "v1", "Deployment"), None);
        assert_eq!(WorkloadKind::of("", "v1", "Service"), None);
    }

    /// The chart renders the webhook's rules and conditions from its copy of the table: the
    /// two must be the same file.
    #[test]
    fn the_chart_s_copy_of_the_table_is_the_table() {
        let chart = include_str!("../../../charts/modelgate/files/workload-kinds.yaml");
        assert!(
            chart == DEFAULT_TABLE,
            "charts/modelgate/files/workload-kinds.yaml differs from \
             crates/modelgate-core/src/workload-kinds.yaml: copy it"
        );
    }

    #[test]
    fn the_built_in_controllers_are_the_first_rows_and_every_row_names_its_source() {
        let table = WorkloadKinds::defaults();
        let controllers: Vec<_> = WorkloadKind::ALL
            .into_iter()
            .filter(|k| k.is_controller())
            .collect();
        for (row, kind) in table.entries().iter().zip(&controllers) {
            let (group, version) = kind.group_version();
            assert!(row.serves(group, version, kind.as_str()), "{row:?}");
        }
        for row in table.entries() {
            assert!(row.source.is_some(), "{} has no source", row.display());
            let again = table.find(&row.group, &row.versions[0], &row.kind);
            assert_eq!(again, Some(row), "{} is shadowed", row.display());
        }
        let paths = |group: &str, version: &str, kind: &str| -> Vec<String> {
            table
                .find(group, version, kind)
                .unwrap()
                .templates
                .iter()
                .map(|t| t.path.clone())
                .collect()
        };
        assert_eq!(
            paths("batch", "v1", "CronJob"),
            ["spec.jobTemplate.spec.template"]
        );
        assert_eq!(
            paths("ray.io", "v1", "RayCluster"),
            [
                "spec.headGroupSpec.template",
                "spec.workerGroupSpecs[*].template"
            ]
        );
        assert!(table.find("batch", "v1", "Job").is_none());
        assert!(table.find("batch.volcano.sh", "v1alpha1", "Job").is_some());
        assert!(
            table
                .find("serving.kserve.io", "v1beta1", "InferenceService")
                .unwrap()
                .is_partial()
        );
    }

    #[test]
    fn paths_parse_into_keys_elements_and_values() {
        assert_eq!(
            parse_path("spec.pytorchReplicaSpecs.*.template").unwrap(),
            [
                Step::Key("spec".into()),
                Step::Key("pytorchReplicaSpecs".into()),
                Step::EveryValue,
                Step::Key("template".into()),
            ]
        );
        assert_eq!(
            parse_path("spec.tasks[*].template").unwrap(),
            [
                Step::Key("spec".into()),
                Step::Key("tasks".into()),
                Step::EveryElement,
                Step::Key("template".into()),
            ]
        );
        for bad in [
            "",
            "spec..template",
            "*.template",
            "spec.tasks[0]",
            "spec.a-b",
            "spec.[*]",
        ] {
            assert!(parse_path(bad).is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn a_file_adds_a_kind_or_replaces_a_row_and_a_malformed_entry_names_entry_and_field() {
        let table = WorkloadKinds::defaults();
        let extra = "
- group: apps.kruise.io
  versions: [v1alpha1]
  kind: CloneSet
  plural: clonesets
  templates: [{path: spec.template}]
- group: ray.io
  versions: [v1]
  kind: RayCluster
  plural: rayclusters
  templates: [{path: spec.headGroupSpec.template, completeness: partial}]
";
        let more = table.with_file(extra, "kinds.yaml").unwrap();
        assert_eq!(more.entries().len(), table.entries().len() + 1);
        let ray = more.find("ray.io", "v1", "RayCluster").unwrap();
        assert_eq!(ray.templates.len(), 1);
        assert!(ray.is_partial());
        assert!(
            more.find("apps.kruise.io", "v1alpha1", "CloneSet")
                .is_some()
        );
        assert_eq!(
            table.with_file("", "empty.yaml").unwrap().entries(),
            table.entries()
        );

        let refused = |text: &str| table.with_file(text, "kinds.yaml").unwrap_err().0;
        let entry = "- group: g.io\n  versions: [v1]\n  kind: K\n  plural: ks\n";
        assert_eq!(
            refused(&format!(
                "{entry}  templates: [{{path: spec.template, shape: Pod}}]"
            )),
            "kinds.yaml: entry 1 (g.io/K): templates[0].shape: unknown variant `Pod`, \
             expected `PodTemplateSpec` or `PodSpec`"
        );
        assert!(
            refused(&format!("{entry}  templates: [{{path: spec.a-b}}]"))
                .starts_with("kinds.yaml: entry 1 (g.io/K): templates[0].path: `spec.a-b`:"),
        );
        assert_eq!(
            refused(entry),
            "kinds.yaml: entry 1 (g.io/K): templates: no template path: name at least one \
             (- path: spec.template)"
        );
        assert!(
            refused(&format!(
                "{entry}  templates: [{{path: spec.template}}]\n- {{group: h.io, kind: H}}"
            ))
            .starts_with("kinds.yaml: entry 2 (h.io/H): "),
        );
        assert!(
            refused(&format!(
                "{entry}  templates: [{{path: spec.template, completeness: all}}]"
            ))
            .contains("templates[0].completeness: unknown variant `all`"),
        );
        assert!(refused("group: g").contains("expected a list"));
        assert!(
            refused("- {group: batch, versions: [v1], kind: Job, plural: jobs, templates: [{path: spec.template}]}")
                .contains("kind: Job is mutated by modelgate itself"),
        );
    }
}
