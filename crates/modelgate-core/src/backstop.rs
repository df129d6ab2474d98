//! docs/policy.md §13: the backstop, the policy inside the API server. [`objects`] renders the
//! `ValidatingAdmissionPolicy` and its `ValidatingAdmissionPolicyBinding` from the same
//! [`PolicyConfig`] the webhooks run on, so that no pod that breaks the policy is created
//! whether modelgate answers or not, while a pod that already complies is created even when it
//! does not.
//!
//! What the objects hold:
//! - the policy matches what the webhooks match (docs/policy.md §1, §11, and the §12 kinds with a
//!   complete template: a kind whose templates are all partial is never denied) with the same
//!   `matchConditions`, `failurePolicy: Fail`, and no `paramKind`: every value is written into
//!   its CEL;
//! - on Pods, Job templates and ephemeral containers it denies the security rules of §6 on the
//!   object as it reaches validation: a `runAsUser` outside `1..2147483647`, a
//!   `runAsGroup`/`fsGroup` outside `0..2147483647`, a container other than the canonical prep
//!   container (§4, matched exactly, rendered by the webhook's own functions) whose effective
//!   `runAsNonRoot` is not `true` (on an ephemeral-container update, only of the ephemeral
//!   containers `oldObject` lacks); on controller templates (§11) and the complete templates of
//!   the workload-kind table's custom resources (§12) only the ranges;
//! - one binding, `validationActions: [Deny]`, selecting the namespaces in `enforce` (§9) by the
//!   webhooks' own namespace selection.
//!
//! The API server evaluates `object` as untyped JSON (`cel.DynType`): its schemas only serve the
//! type check whose findings land in the policy's `status.typeChecking` as warnings. The
//! expressions are written for that: `has()` before every optional field, and exact matches of
//! the prep container by the keys its JSON has.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::config::{MAX_ID, PREP_CONTAINER, PolicyConfig, PrepMode, normalise_absolute};
use crate::kinds::{Completeness, KindEntry, Scope, Shape, Step, WorkloadKind, WorkloadKinds};
use crate::namespaces::{MODE_LABEL, Mode, POD_SECURITY_ENFORCE_LABEL};
use crate::policy::cache_prep;

pub mod mutating;

/// The policy's name when nothing else is asked for.
pub const DEFAULT_NAME: &str = "modelgate-backstop";

/// The label that opts a namespace in, by default (the webhooks' `namespaceSelector`).
pub const OPT_IN_LABEL: (&str, &str) = ("modelgate.io/inject", "enabled");

/// What every message of the backstop ends with: the API server answered, not the webhook.
pub const MESSAGE_SUFFIX: &str = "(modelgate backstop: the webhook did not set this)";

/// The namespace selection and the request filters the webhooks are registered with.
#[derive(Clone, Debug)]
pub struct Selection {
    /// The policy's name; the binding has the same.
    pub name: String,
    /// Labels a namespace must carry to be sent to modelgate (the opt-in).
    pub match_labels: BTreeMap<String, String>,
    /// The username of modelgate's own service account
    /// (`system:serviceaccount:<namespace>:<name>`), whose requests are never judged.
    pub service_account_username: String,
    /// Pods and templates of these priority classes are never judged.
    pub exclude_priority_classes: Vec<String>,
}

impl Selection {
    /// The selection of the manifests: the opt-in label, modelgate's service account `account`
    /// in `namespace`, no priority class left out.
    pub fn new(namespace: &str, account: &str) -> Self {
        Selection {
            name: DEFAULT_NAME.to_string(),
            match_labels: BTreeMap::from([(OPT_IN_LABEL.0.into(), OPT_IN_LABEL.1.into())]),
            service_account_username: format!("system:serviceaccount:{namespace}:{account}"),
            exclude_priority_classes: Vec::new(),
        }
    }
}

/// The policy and its binding, in the order `kubectl apply` should create them; an error when
/// the workload-kind table makes a policy the API server would refuse.
pub fn objects(cfg: &PolicyConfig, sel: &Selection) -> Result<[Value; 2], BackstopError> {
    objects_across_upgrade(cfg, cfg, sel)
}

/// [`objects`] for an upgrade from the settings `previous`: while replicas of the previous
/// release still inject their prep, the policy accepts the prep canonical under either
/// settings, so that the upgrade itself refuses no pod.
pub fn objects_across_upgrade(
    cfg: &PolicyConfig,
    previous: &PolicyConfig,
    sel: &Selection,
) -> Result<[Value; 2], BackstopError> {
    let rows = table_kinds(cfg);
    let shipped = WorkloadKinds::defaults();
    let added = rows
        .iter()
        .filter(|r| {
            !shipped
                .entries()
                .iter()
                .any(|d| d.group == r.group && d.kind == r.kind)
        })
        .count();
    if added > MAX_EXTRA_WORKLOAD_KINDS {
        return Err(BackstopError::TooManyKinds {
            added,
            max: MAX_EXTRA_WORKLOAD_KINDS,
        });
    }
    let policy = policy(cfg, previous, sel);
    check_sizes(&policy, &rows)?;
    Ok([policy, binding(cfg, sel)])
}

/// Every expression of the policy is within cel-go's size limit; the one that is not names
/// the row it comes from.
fn check_sizes(policy: &Value, rows: &[&KindEntry]) -> Result<(), BackstopError> {
    let spec = &policy["spec"];
    let named = ["matchConditions", "variables"]
        .into_iter()
        .flat_map(|list| {
            spec[list].as_array().into_iter().flatten().map(|e| {
                (
                    e["name"].as_str().unwrap_or_default().to_string(),
                    e["expression"].as_str().unwrap_or_default(),
                )
            })
        });
    let validations = spec["validations"].as_array().into_iter().flatten();
    let messages = validations.enumerate().flat_map(|(i, v)| {
        ["expression", "messageExpression"].map(|key| {
            (
                format!("validations[{i}].{key}"),
                v[key].as_str().unwrap_or_default(),
            )
        })
    });
    for (name, expression) in named.chain(messages) {
        let size = expression.chars().count();
        if size > MAX_EXPRESSION_CODE_POINTS {
            let kind = name
                .strip_prefix("tableRow")
                .and_then(|i| i.parse::<usize>().ok())
                .and_then(|i| rows.get(i))
                .map_or_else(|| "all of them".to_string(), |row| row.display());
            return Err(BackstopError::ExpressionTooLarge {
                name,
                kind,
                size,
                max: MAX_EXPRESSION_CODE_POINTS,
            });
        }
    }
    Ok(())
}

fn labels() -> Value {
    json!({
        "app.kubernetes.io/name": "modelgate",
        "app.kubernetes.io/component": "backstop",
        "app.kubernetes.io/part-of": "modelgate",
    })
}

/// The webhooks' `namespaceSelector`: the opt-in labels, never an exempt namespace.
fn namespace_selector(cfg: &PolicyConfig, sel: &Selection, modes: bool) -> Value {
    let mut expressions = vec![json!({
        "key": "kubernetes.io/metadata.name",
        "operator": "NotIn",
        "values": cfg.exempt_namespaces,
    })];
    if modes {
        expressions.extend(enforce_expressions(cfg.default_mode));
        // The policy cannot see exceptions: it is not bound where they are honoured
        // (docs/exceptions.md, "During an outage").
        expressions.push(json!({
            "key": crate::exceptions::NAMESPACE_LABEL,
            "operator": "NotIn",
            "values": [crate::exceptions::ALLOWED],
        }));
    }
    let mut selector = serde_json::Map::new();
    if !sel.match_labels.is_empty() {
        selector.insert("matchLabels".into(), json!(sel.match_labels));
    }
    selector.insert("matchExpressions".into(), Value::Array(expressions));
    Value::Object(selector)
}

/// The label requirements that select the namespaces in `enforce` (docs/policy.md §9): a mode label
/// that is none of the other modes (`enforce`, or an unknown value, which counts as
/// `enforce`), or, when `--default-mode` is `enforce`, no mode label at all (`NotIn` matches a
/// namespace without the key).
fn enforce_expressions(default_mode: Mode) -> Vec<Value> {
    let others: Vec<&str> = Mode::ALL
        .into_iter()
        .filter(|m| *m != Mode::Enforce)
        .map(Mode::as_str)
        .collect();
    let mut out = Vec::new();
    if default_mode != Mode::Enforce {
        out.push(json!({"key": MODE_LABEL, "operator": "Exists"}));
    }
    out.push(json!({"key": MODE_LABEL, "operator": "NotIn", "values": others}));
    out
}

/// The resources of both webhooks: Pods (CREATE), their ephemeral containers (UPDATE) and Jobs
/// (CREATE), then the controllers of §11 (CREATE, and UPDATE that the `matchConditions` keep
/// to a changed pod template).
fn resource_rules(cfg: &PolicyConfig) -> Value {
    let rule = |group: &str, resources: Vec<String>, operations: &[&str]| {
        json!({
            "apiGroups": [group],
            "apiVersions": ["v1"],
            "operations": operations,
            "resources": resources,
            "scope": "Namespaced",
        })
    };
    let plural = |k: WorkloadKind| format!("{}s", k.as_str().to_lowercase());
    let mut rules = vec![
        rule("", vec![plural(WorkloadKind::Pod)], &["CREATE"]),
        // A Pod UPDATE: only the prep container's image is judged.
        rule("", vec![plural(WorkloadKind::Pod)], &["UPDATE"]),
        rule(
            "",
            vec![format!("{}/ephemeralcontainers", plural(WorkloadKind::Pod))],
            &["UPDATE"],
        ),
        rule("batch", vec![plural(WorkloadKind::Job)], &["CREATE"]),
    ];
    // One rule per API group, in the order of the kinds' table.
    let mut groups: Vec<(&str, Vec<String>)> = Vec::new();
    for kind in WorkloadKind::ALL.into_iter().filter(|k| k.is_controller()) {
        let (group, version) = kind.group_version();
        debug_assert_eq!(version, "v1");
        match groups.iter_mut().find(|(g, _)| *g == group) {
            Some((_, resources)) => resources.push(plural(kind)),
            None => groups.push((group, vec![plural(kind)])),
        }
    }
    for (group, resources) in groups {
        rules.push(rule(group, resources, &["CREATE", "UPDATE"]));
    }
    // Then each custom resource of the table, as the chart registers it for the webhook.
    for row in table_kinds(cfg) {
        rules.push(json!({
            "apiGroups": [row.group],
            "apiVersions": row.versions,
            "operations": ["CREATE", "UPDATE"],
            "resources": [row.plural],
            "scope": match row.scope {
                Scope::Namespaced => "Namespaced",
                Scope::Cluster => "Cluster",
            },
        }));
    }
    Value::Array(rules)
}

fn policy(cfg: &PolicyConfig, previous: &PolicyConfig, sel: &Selection) -> Value {
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": sel.name, "labels": labels()},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "matchPolicy": "Equivalent",
                "namespaceSelector": namespace_selector(cfg, sel, false),
                "resourceRules": resource_rules(cfg),
            },
            "matchConditions": match_conditions(cfg, sel),
            "variables": variables(cfg, previous, sel)
                .into_iter()
                .map(|(name, expression)| json!({"name": name, "expression": expression}))
                .collect::<Vec<_>>(),
            "validations": validations()
                .into_iter()
                .map(|v| json!({
                    "expression": v.expression,
                    "messageExpression": v.message_expression,
                    "message": v.message,
                    "reason": "Forbidden",
                }))
                .collect::<Vec<_>>(),
        },
    })
}

fn binding(cfg: &PolicyConfig, sel: &Selection) -> Value {
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": sel.name, "labels": labels()},
        "spec": {
            "policyName": sel.name,
            "validationActions": ["Deny"],
            "matchResources": {
                "namespaceSelector": namespace_selector(cfg, sel, true),
            },
        },
    })
}

// ---------------------------------------------------------------------------------------------
// CEL
// ---------------------------------------------------------------------------------------------

/// A CEL string literal: single-quoted, with `\`, `'` and control characters escaped.
pub fn cel_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('\'');
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\'' => out.push_str("\\'"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('\'');
    out
}

fn cel_list<S: AsRef<str>>(items: impl IntoIterator<Item = S>) -> String {
    let items: Vec<String> = items.into_iter().map(|s| cel_string(s.as_ref())).collect();
    format!("[{}]", items.join(", "))
}

/// A JSON value as CEL: JSON's string, number, boolean and list literals are CEL's, and `<`,
/// `>`, `&` are escaped as Go's `encoding/json` (and so Helm's `toJson`) escapes them, so that
/// the chart renders the same text.
pub fn cel_json(value: &Value) -> String {
    serde_json::to_string(value)
        .expect("JSON serializes")
        .replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026")
}

/// The request's `group/Kind`, as the policy compares kinds (a custom resource may share a
/// built-in kind's name in another group).
const KIND_KEY: &str = "request.kind.group + '/' + request.kind.kind";

/// `group/Kind` of a kind, as [`KIND_KEY`] reads it.
fn kind_key(group: &str, kind: &str) -> String {
    format!("{group}/{kind}")
}

/// The built-in kinds the policy judges: Pods, Jobs and the controllers of §11.
fn builtin_kind_keys() -> Vec<String> {
    WorkloadKind::ALL
        .into_iter()
        .map(|k| kind_key(k.group_version().0, k.as_str()))
        .collect()
}

/// The built-in controllers of §11, as `group/Kind`.
fn controller_kind_keys() -> Vec<String> {
    WorkloadKind::ALL
        .into_iter()
        .filter(|k| k.is_controller())
        .map(|k| kind_key(k.group_version().0, k.as_str()))
        .collect()
}

/// The validating webhook's condition for a Pod UPDATE (the chart's and the manifests' too):
/// only one that changes an init container's image is judged.
pub const POD_UPDATE_CONDITION: &str = "request.kind.kind != 'Pod' || request.operation != 'UPDATE' || \
     request.?subResource.orValue('') != '' || \
     (has(object.spec.initContainers) && has(oldObject.spec.initContainers) && \
     object.spec.initContainers.map(c, has(c.image) ? c.image : '') != \
     oldObject.spec.initContainers.map(c, has(c.image) ? c.image : ''))";

/// The policy's `matchConditions`: what the webhooks' conditions leave out, for the built-in
/// kinds. Each is the same text whatever `--workload-kinds` adds: a matchCondition cannot read
/// `variables`, so the table's kinds are judged by their own variables instead (their row
/// variable is empty for an unchanged template or an excluded priority class). Every field of
/// `request` the API server may leave out (it binds the AdmissionRequest with its `omitempty`
/// fields absent) is read with optional access.
fn match_conditions(cfg: &PolicyConfig, sel: &Selection) -> Value {
    let mut out = vec![
        json!({
            "name": "exclude-mirror-pods",
            "expression": "request.kind.kind != 'Pod' || !has(object.metadata.annotations) || \
                           !('kubernetes.io/config.mirror' in object.metadata.annotations)",
        }),
        json!({
            "name": "exclude-unchanged-pod-template",
            "expression": format!(
                "!({KIND_KEY} in {}) || request.operation != 'UPDATE' || \
                 (request.kind.kind == 'CronJob' \
                 ? object.spec.jobTemplate.spec.template != oldObject.spec.jobTemplate.spec.template \
                 : object.spec.template != oldObject.spec.template)",
                cel_list(controller_kind_keys())
            ),
        }),
        json!({
            "name": "only-pod-updates-that-change-init-images",
            "expression": POD_UPDATE_CONDITION,
        }),
        json!({
            "name": "exclude-own-service-account",
            "expression": format!(
                "request.userInfo.?username.orValue('') != {}",
                cel_string(&sel.service_account_username)
            ),
        }),
        json!({
            "name": "exclude-exempt-namespaces",
            // As the chart writes it: the JSON list with single quotes. A cluster-scoped
            // object has no namespace and is never in an exempt one.
            "expression": format!(
                "!(request.?namespace.orValue('') in {})",
                cel_json(&json!(cfg.exempt_namespaces)).replace('"', "'")
            ),
        }),
    ];
    if !sel.exclude_priority_classes.is_empty() {
        let classes = cel_json(&json!(sel.exclude_priority_classes));
        out.push(json!({
            "name": "exclude-priority-classes",
            "expression": format!(
                "!({KIND_KEY} in {}) || (request.kind.kind == 'Pod' \
                 ? !has(object.spec.priorityClassName) || !(object.spec.priorityClassName in {classes}) \
                 : (request.kind.kind == 'CronJob' \
                 ? !has(object.spec.jobTemplate.spec.template.spec.priorityClassName) \
                 || !(object.spec.jobTemplate.spec.template.spec.priorityClassName in {classes}) \
                 : !has(object.spec.template.spec.priorityClassName) \
                 || !(object.spec.template.spec.priorityClassName in {classes})))",
                cel_list(builtin_kind_keys()),
            ),
        }));
    }
    Value::Array(out)
}

/// The policy's settings, each a variable of its own holding one literal, so that every other
/// expression is the same text whatever the settings (the chart fills in only these).
pub fn config_variables(cfg: &PolicyConfig) -> Vec<(String, String)> {
    vec![
        (
            "prepAlways".into(),
            (cfg.model_cache_prep == PrepMode::Always).to_string(),
        ),
        ("prepImage".into(), cel_json(&json!(cfg.init_image))),
        (
            "cacheMountPath".into(),
            cel_json(&json!(cfg.cache_mount_path)),
        ),
        (
            "defaultCacheVolume".into(),
            cel_json(&json!(cfg.cache_volume)),
        ),
        (
            "initContainerUser".into(),
            cfg.init_container_user.to_string(),
        ),
        (
            "podSecurityDefault".into(),
            cel_string(cfg.pod_security_default.as_str()),
        ),
        (
            "prepVolumeTypes".into(),
            cel_json(&json!(cfg.prep_volume_types)),
        ),
        (
            "prepHostPaths".into(),
            cel_json(&json!(
                cfg.prep_host_paths
                    .iter()
                    .map(|p| normalise_absolute(p).unwrap_or_else(|| p.clone()))
                    .collect::<Vec<_>>()
            )),
        ),
    ]
}

/// The policy's `variables`, in order (each may use the ones before it): the settings, the
/// previous release's settings (`previous…`), then the rest.
pub fn variables(
    cfg: &PolicyConfig,
    previous: &PolicyConfig,
    sel: &Selection,
) -> Vec<(String, String)> {
    let mut v = config_variables(cfg);
    let settings: Vec<String> = v.iter().map(|(name, _)| name.clone()).collect();
    v.extend(
        config_variables(previous)
            .into_iter()
            .map(|(name, literal)| (previous_name(&name), literal)),
    );
    let mut renamed = settings;
    renamed.extend(PREP_VARIABLES.map(String::from));
    for (name, expression) in derived_variables(cfg, sel) {
        let is_prep = PREP_VARIABLES.contains(&name.as_str());
        let previous_one = is_prep.then(|| {
            (
                previous_name(&name),
                with_previous_settings(&expression, &renamed),
            )
        });
        v.push((name, expression));
        v.extend(previous_one);
    }
    v
}

/// The variables that decide whether a pod's prep is canonical, which the previous release's
/// settings decide again for its preps (`previousPrepCanonical`, …).
const PREP_VARIABLES: [&str; 4] = ["cacheVolume", "prepManaged", "prepCommand", "prepCanonical"];

/// `prepImage` → `previousPrepImage`.
fn previous_name(name: &str) -> String {
    let mut chars = name.chars();
    let first = chars
        .next()
        .map(|c| c.to_ascii_uppercase())
        .unwrap_or_default();
    format!("previous{first}{}", chars.as_str())
}

/// `expression` reading the previous release's variables: every `variables.<name>` of `names`
/// becomes `variables.previous<Name>` (whole names only).
fn with_previous_settings(expression: &str, names: &[String]) -> String {
    let mut out = String::with_capacity(expression.len() + 64);
    let mut rest = expression;
    while let Some(at) = rest.find("variables.") {
        out.push_str(&rest[..at]);
        let after = &rest[at + "variables.".len()..];
        let end = after
            .find(|c: char| !c.is_ascii_alphanumeric() && c != '_')
            .unwrap_or(after.len());
        let name = &after[..end];
        out.push_str("variables.");
        if names.iter().any(|n| n == name) {
            out.push_str(&previous_name(name));
        } else {
            out.push_str(name);
        }
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

/// The variables that are the same text whatever the settings.
fn derived_variables(cfg: &PolicyConfig, sel: &Selection) -> Vec<(String, String)> {
    let rows = table_kinds(cfg);
    let mut v: Vec<(String, String)> = vec![
        ("kindKey".into(), KIND_KEY.to_string()),
        ("subResource".into(), "request.?subResource.orValue('')".into()),
        // A Pod UPDATE of the main resource: only its prep's image is judged (the rest was
        // judged at creation and cannot change).
        (
            "podUpdate".into(),
            "request.kind.kind == 'Pod' && request.operation == 'UPDATE' \
             && variables.subResource == ''"
                .into(),
        ),
        // A custom resource of the workload-kind table (§12): its templates are found by the
        // table's paths, in its row's variable, and none of the variables of one pod below is
        // read for it.
        (
            "tableKind".into(),
            format!(
                "variables.kindKey in {}",
                cel_list(rows.iter().map(|r| kind_key(&r.group, &r.kind)))
            ),
        ),
        // The pod as its metadata and spec: a Pod is its own, a Job's or a controller's is its
        // template, a CronJob's is its Job template's.
        (
            "template".into(),
            "request.kind.kind == 'Pod' ? object \
             : (request.kind.kind == 'CronJob' ? object.spec.jobTemplate.spec.template \
             : object.spec.template)"
                .into(),
        ),
        ("pod".into(), "variables.template.spec".into()),
        // Where the pod spec is in the object, for the messages.
        (
            "specPath".into(),
            "request.kind.kind == 'Pod' ? 'spec' \
             : (request.kind.kind == 'CronJob' ? 'spec.jobTemplate.spec.template.spec' \
             : 'spec.template.spec')"
                .into(),
        ),
        // Pods and Jobs get every rule; controller templates the ranges only (§11).
        (
            "controller".into(),
            format!("variables.kindKey in {}", cel_list(controller_kind_keys())),
        ),
        (
            "annotations".into(),
            "has(variables.template.metadata) && has(variables.template.metadata.annotations) \
             ? variables.template.metadata.annotations : {}"
                .into(),
        ),
        (
            "cacheVolume".into(),
            format!(
                "{key} in variables.annotations ? variables.annotations[{key}] \
                 : variables.defaultCacheVolume",
                key = cel_string(cache_prep::CACHE_VOLUME_ANNOTATION),
            ),
        ),
        (
            "podNonRoot".into(),
            "has(variables.pod.securityContext) && has(variables.pod.securityContext.runAsNonRoot) \
             && variables.pod.securityContext.runAsNonRoot == true"
                .into(),
        ),
        // A Windows pod (docs/policy.md §1) gets no prep.
        (
            "windows".into(),
            "has(variables.pod.os) ? (has(variables.pod.os.name) && variables.pod.os.name == 'windows') \
             : ((has(variables.pod.nodeSelector) && 'kubernetes.io/os' in variables.pod.nodeSelector \
             && variables.pod.nodeSelector['kubernetes.io/os'] == 'windows') \
             || (has(variables.pod.affinity) && has(variables.pod.affinity.nodeAffinity) \
             && has(variables.pod.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution) \
             && has(variables.pod.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms) \
             && size(variables.pod.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms) > 0 \
             && variables.pod.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms.all(t, \
             has(t.matchExpressions) && t.matchExpressions.exists(e, e.key == 'kubernetes.io/os' \
             && e.operator == 'In' && has(e.values) && size(e.values) > 0 \
             && e.values.all(os, os == 'windows')))))"
                .into(),
        ),
        ("prepManaged".into(), prep_managed()),
        ("prepCommand".into(), prep_command(cfg)),
        // The canonical prep at any index of the init containers (another webhook may have put
        // its own ahead of it), and only one container of that name (the API server's
        // validation keeps names unique; this holds without it).
        (
            "prepCanonical".into(),
            format!(
                "variables.prepManaged && has(variables.pod.initContainers) \
                 && variables.pod.initContainers.exists_one(c, c.name == {prep}) \
                 && variables.pod.initContainers.exists(c, c.name == {prep} && {})",
                canonical_prep(cfg, "c"),
                prep = cel_string(PREP_CONTAINER),
            ),
        ),
        // The one container the rules do not govern: on a Pod or Job the canonical prep; on a
        // controller's template a prep among the init containers that modelgate manages, which
        // its pods get replaced by the canonical one.
        (
            "prepExempt".into(),
            "variables.controller ? variables.prepManaged || variables.previousPrepManaged \
             : variables.prepCanonical || variables.previousPrepCanonical"
                .into(),
        ),
        // Each list's container names, to name a container's index in a message: a lookup per
        // named finding, not per container.
        (
            "containerNames".into(),
            format!(
                "{{{}}}",
                LISTS
                    .iter()
                    .map(|l| format!(
                        "'{l}': has(variables.pod.{l}) ? variables.pod.{l}.map(c, c.name) : []"
                    ))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ),
        // The pod-level ids: fixed when the pod was created, and judged then (an
        // ephemeral-container update judges only its new containers).
        (
            "podRanges".into(),
            format!(
                "{EPHEMERAL_UPDATE} ? [] : ({})",
                pod_ranges("variables.pod", "variables.specPath")
            ),
        ),
    ];
    // Per container list, the containers each rule finds: a filter each, no string built.
    for list in LISTS {
        v.push((list_variable("range", list), range_records(list)));
    }
    for list in LISTS {
        v.push((list_variable("nonRoot", list), non_root_records(list)));
    }
    // On an ephemeral-container update, the stored pod's ephemeral containers are not judged
    // again (the webhook's `EphemeralScope`): what each rule finds among them, by name, then
    // among the others. The API server keeps the stored ones unchanged on this subresource but
    // not in their order, so they are told apart by name, never by index.
    v.push((
        STORED_EPHEMERAL.into(),
        format!("{EPHEMERAL_UPDATE} ? oldObject.?spec.?ephemeralContainers.orValue([]) : []"),
    ));
    for (rule, bad) in [
        ("range", container_out_of_range("c")),
        ("nonRoot", NON_ROOT_BAD.to_string()),
    ] {
        v.push((
            stored_variable(rule),
            format!("variables.{STORED_EPHEMERAL}.filter(c, {bad}).map(c, c.name)"),
        ));
    }
    for rule in ["range", "nonRoot"] {
        v.push((
            new_variable(rule),
            format!(
                "variables.{}.filter(c, !(c.name in variables.{}))",
                list_variable(rule, "ephemeralContainers"),
                stored_variable(rule)
            ),
        ));
    }
    // One variable per row of the table: each is small and compiled on its own, whatever
    // `--workload-kinds` adds.
    let mut names = Vec::new();
    for (i, row) in rows.iter().enumerate() {
        let name = format!("tableRow{i}");
        names.push(format!("variables.{name}"));
        v.push((name, table_row(row, sel)));
    }
    v.push((
        "tableRangeViolations".into(),
        format!("[{}].filter(s, s != '')", names.join(", ")),
    ));
    v
}

/// Whether modelgate manages the prep container of this pod (the webhook's
/// `cache_prep::is_managed`): `--model-cache-prep=always`, not a Windows pod, not in a
/// namespace that enforces Pod Security `restricted` (by its label, else by
/// `--pod-security-default`), and the cache volume backed by
/// persistent, writable storage (it has a source, and none of those that are not): a claim or
/// claim template, a `hostPath` under the `--prep-host-path` prefixes, or an inline type
/// `--prep-volume-type` allows.
fn prep_managed() -> String {
    format!(
        "variables.prepAlways && !variables.windows \
         && (namespaceObject != null && has(namespaceObject.metadata) \
         && has(namespaceObject.metadata.labels) \
         && {label} in namespaceObject.metadata.labels \
         ? namespaceObject.metadata.labels[{label}] : variables.podSecurityDefault) != 'restricted' \
         && has(variables.pod.volumes) && variables.pod.volumes.exists(v, \
         v.name == variables.cacheVolume && size(v) > 1 && {host_path} \
         && v.all(k, k == 'name' || k in {provisioned} || k in variables.prepVolumeTypes))",
        label = cel_string(POD_SECURITY_ENFORCE_LABEL),
        host_path = HOST_PATH_ALLOWED,
        provisioned = cel_list(cache_prep::PROVISIONED.iter().chain(&["hostPath"])),
    )
}

/// `v` is no `hostPath`, or one whose path lies under one of `variables.prepHostPaths`
/// ([`normalise_absolute`], as `--prep-host-path` keeps them): compared by whole path components, `.` and empty components
/// dropped. A `..` component is never allowed (the API server refuses it in a `hostPath`
/// before admission policies run).
const HOST_PATH_ALLOWED: &str = "(!has(v.hostPath) || (has(v.hostPath.path) \
     && v.hostPath.path.startsWith('/') && !v.hostPath.path.split('/').exists(s, s == '..') \
     && variables.prepHostPaths.exists(p, p == '/' \
     || ('/' + v.hostPath.path.split('/').filter(s, s != '' && s != '.').join('/') + '/')\
     .startsWith(p + '/'))))";

/// Stand-ins for what the canonical container holds per pod or per setting, found again in its
/// JSON and replaced by the variable that holds it.
const MARKS: [(&str, &str); 4] = [
    ("\u{1}command\u{1}", "variables.prepCommand"),
    ("\u{1}volume\u{1}", "variables.cacheVolume"),
    ("\u{1}image\u{1}", "variables.prepImage"),
    ("\u{1}path\u{1}", "variables.cacheMountPath"),
];

/// `text` with every mark in it as a CEL concatenation of literals and variables.
fn with_marks(text: &str, marks: &[(&str, &str)]) -> String {
    let mut parts = vec![cel_string(text)];
    for (mark, variable) in marks {
        parts = parts
            .into_iter()
            .flat_map(|p| {
                if !p.starts_with('\'') {
                    return vec![p];
                }
                let literal = &p[1..p.len() - 1];
                let mark_escaped = &cel_string(mark)[1..cel_string(mark).len() - 1];
                let pieces: Vec<&str> = literal.split(mark_escaped).collect();
                let mut out = Vec::new();
                for (i, piece) in pieces.iter().enumerate() {
                    if i > 0 {
                        out.push(variable.to_string());
                    }
                    if !piece.is_empty() {
                        out.push(format!("'{piece}'"));
                    }
                }
                out
            })
            .collect();
    }
    parts.join(" + ")
}

/// The prep command for this pod, as CEL: the webhook's `cache_prep::canonical_command`
/// rendered with stand-ins for the mount path and the ids, which become the setting and the
/// pod's own uid or fsGroup.
fn prep_command(cfg: &PolicyConfig) -> String {
    const ID_MARK: &str = "\u{1}id\u{1}";
    let marked = PolicyConfig {
        cache_mount_path: MARKS[3].0.to_string(),
        ..cfg.clone()
    };
    // The webhook renders ids as decimal numbers: render one that cannot occur otherwise, then
    // mark it.
    const ID: i64 = 1_987_654_321;
    let render = |command: String| command.replace(&ID.to_string(), ID_MARK);
    let fs_group = "string(variables.pod.securityContext.fsGroup)";
    let uid = "string(has(variables.pod.securityContext) \
               && has(variables.pod.securityContext.runAsUser) \
               ? variables.pod.securityContext.runAsUser : variables.initContainerUser)";
    let with_group = with_marks(
        &render(cache_prep::canonical_command(&marked, Some(1), Some(ID))),
        &[(ID_MARK, fs_group), (MARKS[3].0, MARKS[3].1)],
    );
    let with_owner = with_marks(
        &render(cache_prep::canonical_command(&marked, Some(ID), None)),
        &[(ID_MARK, uid), (MARKS[3].0, MARKS[3].1)],
    );
    format!(
        "has(variables.pod.securityContext) && has(variables.pod.securityContext.fsGroup) \
         && variables.pod.securityContext.fsGroup > 0 ? {with_group} : {with_owner}"
    )
}

/// `c` is exactly the canonical prep container of this pod (the webhook's
/// `cache_prep::is_canonical_at`): every key of its JSON but the ones the API server defaults
/// is the canonical one's, with the canonical value; its mounts are the cache volume's root,
/// then, optionally, the ServiceAccount plugin's token mount.
fn canonical_prep(cfg: &PolicyConfig, c: &str) -> String {
    let marked = PolicyConfig {
        init_image: MARKS[2].0.to_string(),
        cache_mount_path: MARKS[3].0.to_string(),
        ..cfg.clone()
    };
    let canonical = serde_json::to_value(cache_prep::canonical(&marked, MARKS[1].0, MARKS[0].0))
        .expect("the canonical container serializes");
    let Value::Object(mut fields) = canonical else {
        unreachable!("a container is an object")
    };
    let mounts = fields.remove("volumeMounts").unwrap_or_default();
    let mut keys: Vec<&str> = fields.keys().map(String::as_str).collect();
    keys.push("volumeMounts");
    keys.extend(cache_prep::DEFAULTED);
    keys.sort_unstable();
    let mut terms = vec![format!("{c}.all(k, k in {})", cel_list(&keys))];
    for (key, value) in &fields {
        terms.push(format!("has({c}.{key})"));
        terms.push(equals(&format!("{c}.{key}"), value));
    }
    let Value::Array(mounts) = mounts else {
        unreachable!("volumeMounts is a list")
    };
    let n = mounts.len();
    terms.push(format!("has({c}.volumeMounts)"));
    terms.push(format!(
        "(size({c}.volumeMounts) == {n} || (size({c}.volumeMounts) == {} && {}))",
        n + 1,
        token_mount(&format!("{c}.volumeMounts[{n}]"))
    ));
    for (i, m) in mounts.iter().enumerate() {
        terms.push(equals(&format!("{c}.volumeMounts[{i}]"), m));
    }
    terms.join(" && ")
}

/// `m` is exactly the mount the ServiceAccount plugin adds: a projected `kube-api-access-*`
/// volume of this pod (its one source), read-only at the token path, nothing else.
fn token_mount(m: &str) -> String {
    format!(
        "{m}.all(k, k in ['mountPath', 'name', 'readOnly']) && has({m}.mountPath) \
         && {m}.mountPath == {path} && has({m}.readOnly) && {m}.readOnly == true \
         && has({m}.name) && {m}.name.startsWith({prefix}) \
         && variables.pod.volumes.exists(v, v.name == {m}.name && size(v) == 2 && has(v.projected))",
        path = cel_string(cache_prep::TOKEN_MOUNT_PATH),
        prefix = cel_string(cache_prep::TOKEN_VOLUME_PREFIX),
    )
}

/// `expr` equals `expected` exactly, as JSON: same keys, same list lengths, same scalars; a
/// string that is one of the [`MARKS`] is compared with the variable that holds it.
fn equals(expr: &str, expected: &Value) -> String {
    match expected {
        Value::Object(fields) => {
            let keys: Vec<&str> = fields.keys().map(String::as_str).collect();
            let mut terms = vec![format!("{expr}.all(k, k in {})", cel_list(&keys))];
            for (key, value) in fields {
                terms.push(format!("has({expr}.{key})"));
                terms.push(equals(&format!("{expr}.{key}"), value));
            }
            format!("({})", terms.join(" && "))
        }
        Value::Array(items) => {
            let mut terms = vec![format!("size({expr}) == {}", items.len())];
            for (i, item) in items.iter().enumerate() {
                terms.push(equals(&format!("{expr}[{i}]"), item));
            }
            format!("({})", terms.join(" && "))
        }
        Value::String(s) => match MARKS.iter().find(|(mark, _)| mark == s) {
            Some((_, variable)) => format!("{expr} == {variable}"),
            None => format!("{expr} == {}", cel_string(s)),
        },
        Value::Bool(b) => format!("{expr} == {b}"),
        Value::Number(n) => format!("{expr} == {n}"),
        Value::Null => format!("{expr} == null"),
    }
}

/// The three container lists, with their field names.
const LISTS: [&str; 3] = ["initContainers", "containers", "ephemeralContainers"];

/// The ids the ranges govern on a pod (`fsGroup`) and on a container, with their lower bound.
const POD_IDS: [(&str, i64); 3] = [("runAsUser", 1), ("runAsGroup", 0), ("fsGroup", 0)];
const CONTAINER_IDS: [(&str, i64); 2] = [("runAsUser", 1), ("runAsGroup", 0)];

/// How many containers of each list a message names (the others are counted): the lookup of a
/// container's index is linear in its list, so naming a bounded number keeps the cost of a
/// message linear in the object.
pub const NAMED_FINDINGS: usize = 5;

/// A message past this many bytes is cut to [`MESSAGE_CUT_CODE_POINTS`] code points: the API
/// server drops a `messageExpression` result over 5 KiB, and the advice follows the list.
const MESSAGE_MAX_BYTES: usize = 4600;
const MESSAGE_CUT_CODE_POINTS: usize = MESSAGE_MAX_BYTES / 4;

/// Where a container's path goes in a finding of a table template, replaced once its index is
/// known; each `[*]` step of a template path has its own (see [`walk`]).
const CONTAINER_MARK: char = '\u{1}';
fn element_mark(depth: usize) -> char {
    char::from_u32(0x10 + depth as u32).expect("a control character")
}

fn out_of_range(value: &str, lo: i64) -> String {
    format!("({value} < {lo} || {value} > {MAX_ID})")
}

fn outside(value: &str, lo: i64) -> String {
    format!("string({value}) + ' is outside {lo}..{MAX_ID}'")
}

/// The pod-level ids of the pod spec `pod` outside their ranges, each a message naming its
/// field under `spec_path` (a CEL string expression).
fn pod_ranges(pod: &str, spec_path: &str) -> String {
    POD_IDS
        .iter()
        .map(|(field, lo)| {
            let value = format!("{pod}.securityContext.{field}");
            format!(
                "(has({pod}.securityContext) && has({value}) && {} \
                 ? [{spec_path} + '.securityContext.{field}: ' + {}] : [])",
                out_of_range(&value, *lo),
                outside(&value, *lo)
            )
        })
        .collect::<Vec<_>>()
        .join(" + ")
}

/// `!(prep exempt) && ` for the init containers, nothing for the other lists.
fn prep_exemption(list: &str, exempt: &str) -> String {
    if list == "initContainers" {
        format!(
            "!({exempt} && c.name == {}) && ",
            cel_string(PREP_CONTAINER)
        )
    } else {
        String::new()
    }
}

/// A container's id outside its range, as findings that start with [`CONTAINER_MARK`] where
/// the container's path goes.
fn container_range_findings(c: &str) -> String {
    CONTAINER_IDS
        .iter()
        .map(|(field, lo)| {
            let v = format!("{c}.securityContext.{field}");
            format!(
                "(has({c}.securityContext) && has({v}) && {} ? [{} + {}] : [])",
                out_of_range(&v, *lo),
                cel_string(&format!("{CONTAINER_MARK}.securityContext.{field}: ")),
                outside(&v, *lo)
            )
        })
        .collect::<Vec<_>>()
        .join(" + ")
}

/// Whether container `c` has an id outside its range.
fn container_out_of_range(c: &str) -> String {
    let any: Vec<String> = CONTAINER_IDS
        .iter()
        .map(|(field, lo)| {
            let v = format!("{c}.securityContext.{field}");
            format!("has({v}) && {}", out_of_range(&v, *lo))
        })
        .collect();
    format!("has({c}.securityContext) && ({})", any.join(" || "))
}

/// A Pod UPDATE of the `ephemeralcontainers` subresource.
const EPHEMERAL_UPDATE: &str = "variables.subResource == 'ephemeralcontainers'";

/// The stored pod's ephemeral containers on an ephemeral-container update (`oldObject`, which
/// leaves the field out when it is empty), else none.
const STORED_EPHEMERAL: &str = "storedEphemeralContainers";

/// The variable that holds the names of the stored ephemeral containers that `rule` finds:
/// `rangeStoredEphemeralContainers`, `nonRootStoredEphemeralContainers`.
fn stored_variable(rule: &str) -> String {
    format!("{rule}StoredEphemeralContainers")
}

/// The variable that holds the ephemeral containers that `rule` finds and the stored pod does
/// not have: `rangeNewEphemeralContainers`, `nonRootNewEphemeralContainers`.
fn new_variable(rule: &str) -> String {
    format!("{rule}NewEphemeralContainers")
}

/// The variable that holds what `rule` finds in `list`: `rangeInitContainers`, ….
fn list_variable(rule: &str, list: &str) -> String {
    let mut chars = list.chars();
    let first = chars
        .next()
        .map(|c| c.to_ascii_uppercase())
        .unwrap_or_default();
    format!("{rule}{first}{}", chars.as_str())
}

/// The containers of `list` (Pods, Jobs, §11 templates) that `bad` (a test of `c`) finds, the
/// prep the rules do not govern left out. Linear, and no string is built: the message builds
/// those of the containers it names.
fn containers_where(list: &str, judged: &str, bad: &str) -> String {
    let exempt = prep_exemption(list, "variables.prepExempt");
    format!("{judged} ? variables.pod.{list}.filter(c, {exempt}{bad}) : []")
}

/// Whether `list` is judged: it is there, and it is not the init or regular containers of an
/// ephemeral-container update (fixed when the pod was created, and judged then).
fn list_judged(list: &str) -> String {
    match list {
        "ephemeralContainers" => format!("has(variables.pod.{list})"),
        _ => format!("variables.subResource != 'ephemeralcontainers' && has(variables.pod.{list})"),
    }
}

/// The containers of `list` with an id outside its range.
fn range_records(list: &str) -> String {
    containers_where(list, &list_judged(list), &container_out_of_range("c"))
}

const NON_ROOT_OWN: &str = "has(c.securityContext) && has(c.securityContext.runAsNonRoot)";

/// Container `c`'s effective runAsNonRoot (its own, else the pod's) is not `true`.
const NON_ROOT_BAD: &str = "!(has(c.securityContext) && has(c.securityContext.runAsNonRoot) \
     ? c.securityContext.runAsNonRoot == true : variables.podNonRoot)";

/// Every container of a Pod or Job, the canonical prep aside, whose effective runAsNonRoot
/// (its own, else the pod's) is not `true`. A controller's pods get it from the mutation when
/// they are created; an ephemeral-container update judges only the ephemeral containers (the
/// others are immutable and already run).
fn non_root_records(list: &str) -> String {
    format!(
        "variables.tableKind || variables.controller ? [] : ({})",
        containers_where(list, &list_judged(list), NON_ROOT_BAD)
    )
}

/// The non-root finding of container `c`, starting with [`CONTAINER_MARK`].
fn non_root_finding(c: &str) -> String {
    let own = NON_ROOT_OWN.replace("c.", &format!("{c}."));
    format!(
        "[{} + ({own} ? 'false is not allowed' \
         : 'not set, and the pod\\'s spec.securityContext.runAsNonRoot is not true')]",
        cel_string(&format!("{CONTAINER_MARK}.securityContext.runAsNonRoot: "))
    )
}

/// Per container list, the first [`NAMED_FINDINGS`] containers `rule` found (its list
/// variables; of the ephemeral containers, those the stored pod does not have) with their
/// `findings` (a function of the container's CEL name), each naming the field by the
/// container's index, then how many more containers of the list there are.
fn named(rule: &str, findings: impl Fn(&str) -> String) -> String {
    let mark = cel_string(&CONTAINER_MARK.to_string());
    let mut lists = Vec::new();
    for list in LISTS {
        let found = match list {
            "ephemeralContainers" => format!("variables.{}", new_variable(rule)),
            _ => format!("variables.{}", list_variable(rule, list)),
        };
        let mut parts = Vec::new();
        for i in 0..NAMED_FINDINGS {
            parts.push(format!(
                "(size({found}) > {i} ? [({}).join('; ').replace({mark}, variables.specPath \
                 + '.{list}[' + string(variables.containerNames['{list}'].indexOf({found}[{i}].name)) \
                 + ']')] : [])",
                findings(&format!("{found}[{i}]"))
            ));
        }
        parts.push(format!(
            "(size({found}) > {n} ? [variables.specPath + '.{list}: ' \
             + string(size({found}) - {n}) + ' more containers'] : [])",
            n = NAMED_FINDINGS
        ));
        let parts = parts.join(" + ");
        if list != "ephemeralContainers" {
            lists.push(parts);
            continue;
        }
        // Telling the new ones by name costs the product of the found and the stored; past
        // [`MAX_NAME_LOOKUPS`] (a pod with hundreds of stored root debug containers) the list
        // is named with how many new ones there are, not which.
        let (all, stored) = (
            format!("variables.{}", list_variable(rule, list)),
            format!("variables.{}", stored_variable(rule)),
        );
        lists.push(format!(
            "(size({all}) * size({stored}) <= {MAX_NAME_LOOKUPS} ? {parts} \
             : (size({all}) > size({stored}) ? [variables.specPath + '.{list}: ' \
             + string(size({all}) - size({stored})) + ' of the containers this update adds'] \
             : []))"
        ));
    }
    lists.join(" + ")
}

/// The most name comparisons a message makes to tell the new ephemeral containers a rule finds
/// from the stored ones: one costs about 1 in kube-apiserver's CEL, and a message expression
/// may cost 1 000 000.
const MAX_NAME_LOOKUPS: usize = 200_000;

/// `size(v1) + size(v2) + …` of what `rule` found in every container list, less what it found
/// among the stored pod's ephemeral containers. The API server validates the update before
/// admission policies run: every stored ephemeral container is in `object`, unchanged, and
/// names are unique, so the difference is exactly how many of the others it found. Linear,
/// where telling each found container's name against the stored ones (the message's list,
/// [`new_variable`]) costs the product of their numbers.
fn found_count(rule: &str) -> String {
    let lists = LISTS
        .iter()
        .map(|list| format!("size(variables.{})", list_variable(rule, list)))
        .collect::<Vec<_>>()
        .join(" + ");
    format!("{lists} - size(variables.{})", stored_variable(rule))
}

/// A message (a CEL string expression) cut to fit the API server's limit.
fn bounded(message: &str) -> String {
    format!(
        "[{message}].map(m, bytes(m).size() <= {MESSAGE_MAX_BYTES} ? m \
         : m.substring(0, {MESSAGE_CUT_CODE_POINTS}) + ' …')[0]"
    )
}

// ---------------------------------------------------------------------------------------------
// The custom resources of the workload-kind table (docs/policy.md §12)
// ---------------------------------------------------------------------------------------------

/// How many rows `--workload-kinds` may add for the backstop: each row is a variable of its
/// own, compiled by every API server at its start and at every change of the policy.
pub const MAX_EXTRA_WORKLOAD_KINDS: usize = 32;

/// The largest expression the policy may hold, in code points: cel-go's limit, which the API
/// server applies to every expression.
pub const MAX_EXPRESSION_CODE_POINTS: usize = 100_000;

/// Why no policy is printed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BackstopError {
    #[error(
        "--workload-kinds adds {added} kinds with complete templates to the backstop, more than \
         the {max} it judges; judge fewer custom resources (mark templates partial) or leave \
         the backstop off"
    )]
    TooManyKinds { added: usize, max: usize },
    #[error(
        "the backstop's expression {name} would be {size} code points, over kube-apiserver's \
         limit of {max}: a row of --workload-kinds ({kind}) has too many templates or too long \
         a path"
    )]
    ExpressionTooLarge {
        name: String,
        kind: String,
        size: usize,
        max: usize,
    },
}

/// The rows of the table the backstop judges: not the built-in kinds (Pods, Jobs and the
/// controllers of §11, which have their own expressions), and with a complete template (a
/// partial one is never denied, so a kind with only those needs no policy).
fn table_kinds(cfg: &PolicyConfig) -> Vec<&KindEntry> {
    cfg.workload_kinds
        .entries()
        .iter()
        .filter(|row| {
            row.versions
                .iter()
                .all(|v| WorkloadKind::of(&row.group, v, &row.kind).is_none())
        })
        .filter(|row| {
            row.templates
                .iter()
                .any(|t| t.completeness == Completeness::Complete)
        })
        .collect()
}

/// `has(r.a) && has(r.a.b)` for the keys under `root` (`true` without keys).
fn has_chain(root: &str, keys: &[&str]) -> String {
    let mut at = root.to_string();
    let mut has = Vec::new();
    for key in keys {
        at = format!("{at}.{key}");
        has.push(format!("has({at})"));
    }
    if has.is_empty() {
        "true".to_string()
    } else {
        has.join(" && ")
    }
}

fn get(root: &str, keys: &[&str]) -> String {
    keys.iter()
        .fold(root.to_string(), |at, k| format!("{at}.{k}"))
}

/// A key step's key; a wildcard has none.
fn key_of(step: &Step) -> &str {
    match step {
        Step::Key(k) => k,
        _ => "",
    }
}

/// Whether an UPDATE changed what a template path finds, as the webhooks' condition says
/// (the chart's `modelgate.templateChanged`): the value at the path; under one `[*]`, the
/// elements' templates in order (a change of an element's other fields is not a change);
/// under one `*`, each key's template; with a second wildcard, the whole list or map at the
/// first. Each step guarded by `has()`.
fn template_changed(steps: &[Step]) -> String {
    let wild = steps
        .iter()
        .position(|s| !matches!(s, Step::Key(_)))
        .unwrap_or(steps.len());
    let prefix: Vec<&str> = steps[..wild].iter().map(key_of).collect();
    let rest = steps.get(wild + 1..).unwrap_or_default();
    let more = rest.iter().any(|s| !matches!(s, Step::Key(_)));
    let suffix: Vec<&str> = rest.iter().map(key_of).collect();
    let (g_new, g_old) = (
        has_chain("object", &prefix),
        has_chain("oldObject", &prefix),
    );
    let (v_new, v_old) = (get("object", &prefix), get("oldObject", &prefix));
    let mut differ = format!("{v_new} != {v_old}");
    match steps.get(wild) {
        Some(Step::EveryElement) if !more && !suffix.is_empty() => {
            let (h, g) = (has_chain("e", &suffix), get("e", &suffix));
            differ =
                format!("{v_new}.filter(e, {h}).map(e, {g}) != {v_old}.filter(e, {h}).map(e, {g})");
        }
        Some(Step::EveryValue) if !more => {
            let (nk, ok) = (format!("{v_new}[k]"), format!("{v_old}[k]"));
            let (h_n, h_o) = (has_chain(&nk, &suffix), has_chain(&ok, &suffix));
            let (s_n, s_o) = (get(&nk, &suffix), get(&ok, &suffix));
            differ = format!(
                "{v_new}.exists(k, {h_n} && !(k in {v_old} && {h_o} && {s_n} == {s_o})) \
                 || {v_old}.exists(k, {h_o} && !(k in {v_new} && {h_n}))"
            );
        }
        _ => {}
    }
    format!("({g_new}) != ({g_old}) || ({g_new}) && ({differ})")
}

/// A row's templates are not of an excluded priority class, as the webhooks' condition says
/// (the chart's `modelgate.celPriorityExcluded`): a kind with one `PodTemplateSpec` at a fixed
/// path is left out when its template is of such a class; any other is judged (one template
/// of the class does not say what the others are).
fn row_not_priority_excluded(row: &KindEntry, classes: &str) -> String {
    match row.templates.as_slice() {
        [t] if t.shape == Shape::PodTemplateSpec
            && t.steps.iter().all(|s| matches!(s, Step::Key(_))) =>
        {
            let mut keys: Vec<&str> = t.steps.iter().map(key_of).collect();
            keys.extend(["spec", "priorityClassName"]);
            format!(
                "!({}) || !({} in {classes})",
                has_chain("object", &keys),
                get("object", &keys)
            )
        }
        _ => "true".to_string(),
    }
}

/// One row's variable: for a request of its kind that creates it or changes one of its
/// templates (and whose template is not of an excluded priority class), the ranges of every
/// complete template, one string (`; `-joined), each finding named by the template's own path
/// (`spec.workerGroupSpecs[1].template.spec.containers[0]…`, as the webhook names them);
/// otherwise `''`. A prep container in a template is not judged: its pods get the canonical
/// one from the mutation, and the backstop judges that one on the pods.
fn table_row(row: &KindEntry, sel: &Selection) -> String {
    let changed: Vec<String> = row
        .templates
        .iter()
        .map(|t| format!("({})", template_changed(&t.steps)))
        .collect();
    let priority = if sel.exclude_priority_classes.is_empty() {
        "true".to_string()
    } else {
        row_not_priority_excluded(row, &cel_json(&json!(sel.exclude_priority_classes)))
    };
    let templates: Vec<String> = row
        .templates
        .iter()
        .filter(|t| t.completeness == Completeness::Complete)
        .map(|t| walk(&t.steps, "object", &CelPath::root(), t.shape, 0))
        .collect();
    format!(
        "variables.kindKey == {} && (request.operation != 'UPDATE' || {}) && ({priority}) \
         ? [{}].filter(s, s != '').join('; ') : ''",
        cel_string(&kind_key(&row.group, &row.kind)),
        changed.join(" || "),
        templates.join(", ")
    )
}

/// A field path as a CEL string expression: what is known only at evaluation (a map key),
/// then literal text (which may hold marks, replaced once an index is known).
#[derive(Clone)]
struct CelPath {
    dynamic: Option<String>,
    tail: String,
}

impl CelPath {
    fn root() -> Self {
        CelPath {
            dynamic: None,
            tail: String::new(),
        }
    }

    fn key(&self, key: &str) -> Self {
        let dot = if self.dynamic.is_none() && self.tail.is_empty() {
            ""
        } else {
            "."
        };
        CelPath {
            dynamic: self.dynamic.clone(),
            tail: format!("{}{dot}{key}", self.tail),
        }
    }

    /// `self` followed by the mark of an index not known yet.
    fn marked(&self, mark: char) -> Self {
        CelPath {
            dynamic: self.dynamic.clone(),
            tail: format!("{}{mark}", self.tail),
        }
    }

    /// `self` followed by `open`, the CEL string `expr`, and `close`.
    fn dynamic(&self, open: &str, expr: &str, close: &str) -> Self {
        CelPath {
            dynamic: Some(format!("{} + {expr}", self.with(open))),
            tail: close.to_string(),
        }
    }

    /// The path and the literal `more` after it, as one CEL string expression.
    fn with(&self, more: &str) -> String {
        let literal = cel_string(&format!("{}{more}", self.tail));
        match &self.dynamic {
            Some(d) => format!("{d} + {literal}"),
            None => literal,
        }
    }
}

/// Of a list of findings strings `f` (one per element, `''` for none; each holding `mark`
/// where `prefix` (a CEL string expression) and the element's index go), the first element's
/// findings, then how many other elements have findings, named under `list_path`. Linear:
/// `indexOf` on a list of booleans, once.
fn first_with_findings(f: &str, mark: char, prefix: &str, list_path: &str, what: &str) -> String {
    let first = format!("{f}.map(s, s != '').indexOf(true)");
    let others = format!("size({f}.filter(s, s != '')) - 1");
    format!(
        "({f}.exists(s, s != '') ? {f}[{first}].replace({}, {prefix} + '[' + string({first}) + ']') \
         + ({others} > 0 ? '; ' + {list_path} + ': ' + string({others}) + ' more {what}' : '') \
         : '')",
        cel_string(&mark.to_string())
    )
}

/// The findings (one string) of the templates that `steps` find below `value` (a CEL
/// expression), at `path`. The template's spec is bound to a short name (`[v].map(p, …)[0]`),
/// so that the text does not repeat the path to it in every rule. Under a list (`[*]`) the
/// findings of the first element that has any are named, and the others counted: an element's
/// index is found once, linear in the list.
fn walk(steps: &[Step], value: &str, path: &CelPath, shape: Shape, depth: usize) -> String {
    match steps.split_first() {
        None => {
            let pod = format!("p{depth}");
            let (spec, spec_path) = match shape {
                Shape::PodTemplateSpec => (format!("{value}.spec"), path.key("spec")),
                Shape::PodSpec => (value.to_string(), path.clone()),
            };
            let guard = match shape {
                Shape::PodTemplateSpec => format!("has({value}.spec)"),
                Shape::PodSpec => "true".to_string(),
            };
            // The three container lists as pairs `[name, list]`, judged by one expression.
            let lists: Vec<String> = LISTS
                .iter()
                .map(|l| format!("[dyn('{l}'), has({pod}.{l}) ? {pod}.{l} : []]"))
                .collect();
            let f = format!("f{depth}");
            let list_path = format!("{} + '.' + l{depth}[0]", spec_path.with(""));
            let per_list = format!(
                "[{}].map(l{depth}, [l{depth}[1].map(c, !(l{depth}[0] == 'initContainers' \
                 && has(c.name) && c.name == {}) ? ({}).join('; ') : '')].map({f}, {})[0])",
                lists.join(", "),
                cel_string(PREP_CONTAINER),
                container_range_findings("c"),
                first_with_findings(
                    &f,
                    CONTAINER_MARK,
                    &list_path,
                    &list_path,
                    "containers with an id outside its range"
                )
            );
            let findings = [
                format!("({})", pod_ranges(&pod, &spec_path.with(""))),
                per_list,
            ];
            format!(
                "({guard} ? [{spec}].map({pod}, ({}).filter(s, s != '').join('; '))[0] : '')",
                findings.join(" + ")
            )
        }
        Some((Step::Key(key), rest)) => format!(
            "(has({value}.{key}) ? {} : '')",
            walk(
                rest,
                &format!("{value}.{key}"),
                &path.key(key),
                shape,
                depth
            )
        ),
        Some((Step::EveryElement, rest)) => {
            let (e, l) = (format!("e{depth}"), format!("l{depth}"));
            let mark = element_mark(depth);
            format!(
                "[{value}.map({e}, {})].map({l}, {})[0]",
                walk(rest, &e, &path.marked(mark), shape, depth + 1),
                first_with_findings(
                    &l,
                    mark,
                    "''",
                    &path.with(""),
                    "elements with an id outside its range"
                )
            )
        }
        Some((Step::EveryValue, rest)) => {
            let k = format!("k{depth}");
            let at = path.dynamic(".", &k, "");
            format!(
                "{value}.map({k}, {}).filter(s, s != '').join('; ')",
                walk(rest, &format!("{value}[{k}]"), &at, shape, depth + 1)
            )
        }
    }
}

/// One entry of the policy's `validations`.
pub struct Validation {
    pub expression: String,
    pub message_expression: String,
    /// The fallback when the message expression fails or its result is too long.
    pub message: String,
}

const RANGE_ADVICE: &str = "Use a uid in 1..2147483647 and a gid in 0..2147483647, or leave \
     them unset and let modelgate set them.";
const PREP_UPDATE_ADVICE: &str = "Recreate the pod instead: modelgate injects the prep \
     container of its current settings into a new pod.";
const NONROOT_ADVICE: &str = "Set runAsNonRoot: true on the pod or the container; only \
     modelgate's own model-cache-prep may run as root.";

/// The policy's `validations`: the ranges, then non-root. Each expression is a test on
/// variables that are linear in the object; its message names the fields.
pub fn validations() -> Vec<Validation> {
    let entry = |expression: String, list: String, advice: &str, fallback: &str| Validation {
        expression,
        message_expression: format!(
            "{} + {}",
            bounded(&format!("({list}).join('; ')")),
            cel_string(&format!(". {advice} {MESSAGE_SUFFIX}"))
        ),
        message: format!("{fallback} {advice} {MESSAGE_SUFFIX}"),
    };
    vec![
        entry(
            format!(
                "variables.podUpdate || (variables.tableKind ? size(variables.tableRangeViolations) == 0 \
                 : size(variables.podRanges) + {} == 0)",
                found_count("range")
            ),
            format!(
                "variables.tableKind ? variables.tableRangeViolations \
                 : variables.podRanges + {}",
                named("range", container_range_findings)
            ),
            RANGE_ADVICE,
            "A runAsUser, runAsGroup or fsGroup of the pod is outside its range.",
        ),
        entry(
            format!("variables.podUpdate || {} == 0", found_count("nonRoot")),
            named("nonRoot", non_root_finding),
            NONROOT_ADVICE,
            "A container may run as root: its runAsNonRoot (its own, else the pod's) is not true.",
        ),
        entry(
            format!(
                "!variables.podUpdate || !has(oldObject.spec.initContainers) \
                 || !has(object.spec.initContainers) \
                 || oldObject.spec.initContainers.filter(o, has(o.name) && o.name == {prep}).all(o, \
                 object.spec.initContainers.filter(c, has(c.name) && c.name == {prep}).all(c, \
                 (has(c.image) ? c.image : '') == (has(o.image) ? o.image : '')))",
                prep = cel_string(PREP_CONTAINER)
            ),
            format!(
                "['spec.initContainers[' + string(object.spec.initContainers.map(c, \
                 has(c.name) ? c.name : '').indexOf({prep})) + '].image: the {PREP_CONTAINER} image \
                 cannot change after admission']",
                prep = cel_string(PREP_CONTAINER)
            ),
            PREP_UPDATE_ADVICE,
            "The model-cache-prep image cannot change after admission.",
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cel_strings_are_escaped() {
        assert_eq!(cel_string("a'b\\c"), r"'a\'b\\c'");
        assert_eq!(cel_string("x\ny"), r"'x\ny'");
        assert_eq!(cel_string("\u{1}"), r"'\u0001'");
    }

    #[test]
    fn enforce_namespaces_by_label_or_by_default() {
        let on = enforce_expressions(Mode::Enforce);
        assert_eq!(
            on,
            [json!({"key": MODE_LABEL, "operator": "NotIn", "values": ["warn", "audit", "off"]})]
        );
        let off = enforce_expressions(Mode::Audit);
        assert_eq!(off.len(), 2);
        assert_eq!(off[0], json!({"key": MODE_LABEL, "operator": "Exists"}));
    }

    #[test]
    fn the_binding_leaves_out_the_namespaces_open_for_exceptions() {
        let sel = Selection {
            name: "modelgate-backstop".into(),
            match_labels: BTreeMap::from([("modelgate.io/inject".into(), "enabled".into())]),
            service_account_username: "system:serviceaccount:m:m".into(),
            exclude_priority_classes: Vec::new(),
        };
        let b = binding(&PolicyConfig::default(), &sel);
        let expressions = b["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"]
            .as_array()
            .unwrap()
            .clone();
        assert!(expressions.contains(&json!({
            "key": "modelgate.io/exceptions", "operator": "NotIn", "values": ["allowed"]
        })));
        // The policy's own match is the webhooks': it is the binding that leaves them out.
        let p = policy_namespace_selector_for_test(&sel);
        assert!(!p.to_string().contains("modelgate.io/exceptions"));
    }

    fn policy_namespace_selector_for_test(sel: &Selection) -> Value {
        namespace_selector(&PolicyConfig::default(), sel, false)
    }

    #[test]
    fn host_path_prefixes_are_normalized() {
        assert_eq!(
            normalise_absolute("/data//./cache/").as_deref(),
            Some("/data/cache")
        );
        assert_eq!(normalise_absolute("/").as_deref(), Some("/"));
    }

    #[test]
    fn the_command_is_the_webhooks_with_the_pods_ids() {
        let cfg = PolicyConfig::default();
        let cel = prep_command(&cfg);
        assert!(
            cel.contains(
                "'chown 0:' + string(variables.pod.securityContext.fsGroup) + ' ' \
                 + variables.cacheMountPath + ' && chmod g+rwX ' + variables.cacheMountPath"
            ),
            "{cel}"
        );
        assert!(cel.contains(": variables.initContainerUser)"), "{cel}");
    }
}
