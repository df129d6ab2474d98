//! The backstop (SPEC.md §13) evaluated as the API server evaluates it, against the webhooks.
//!
//! The policy that `modelgate_core::backstop` renders is evaluated with the Kubernetes CEL
//! libraries (kube-cel's functions on the `cel` interpreter it re-exports), bound as the API
//! server's ValidatingAdmissionPolicy plugin binds them: `object`, `oldObject`, `request` and
//! `namespaceObject` as untyped JSON (the plugin declares `object` as `cel.DynType` and converts
//! the object to unstructured JSON, with no escaping of keys), `matchConditions` first, then
//! the `variables` in order, then each validation and, when it fails, its `messageExpression`.
//! kube-cel's own `VapEvaluator` is used to compile every expression; it is not the evaluator
//! here because it escapes map keys (`modelgate.io/cache-volume` becomes
//! `modelgate__dot__io__slash__cache__dash__volume`), as CRD validation does and the admission
//! plugin does not, and has no `variables`.
//!
//! Then, over the test corpus and generated pods, the backstop is compared with the webhooks
//! (`admission::review`, in process): what `/mutate` then `/validate` admit is admitted as
//! patched (also with the API server's token mount added to every container); what `/validate`
//! denies for a security field is denied, naming that field; what `/mutate` would make
//! non-root is denied unmutated; a compliant pod is admitted unmutated; forged prep containers
//! are denied; only namespaces in `enforce` are bound.

#[path = "support/cel.rs"]
mod cel_support;
#[path = "common/cli.rs"]
mod cli;

use std::collections::BTreeMap;
use std::path::Path;

use cel_support::{on_big_stack, to_cel};
use kube_cel::KubeCelExt as _;
use kube_cel::cel::{self, Context, Program};
use modelgate::admission::{self, Webhook, WorkloadKind};
use modelgate::backstop::{self, Selection};
use modelgate::cache::CacheIndex;
use modelgate::config::{IdSetting, PolicyConfig, PrepMode};
use modelgate::documents::read_documents;
use modelgate::namespaces::Namespaces;
use modelgate::policy::Caches;
use modelgate_core::testing::{self, Answer, create_review};
use serde_json::{Value, json};

// ---------------------------------------------------------------------------------------------
// The evaluator
// ---------------------------------------------------------------------------------------------

struct Compiled {
    source: String,
    program: Program,
}

fn compile(source: &str) -> Compiled {
    let program = Program::compile(source)
        .unwrap_or_else(|e| panic!("the expression does not compile: {e}\n{source}"));
    Compiled {
        source: source.to_string(),
        program,
    }
}

/// The policy and its binding, compiled.
struct Policy {
    objects: [Value; 2],
    conditions: Vec<(String, Compiled)>,
    variables: Vec<(String, Compiled)>,
    validations: Vec<(Compiled, Compiled)>,
}

impl Policy {
    fn new(cfg: &PolicyConfig, sel: &Selection) -> Policy {
        let objects = backstop::objects(cfg, sel);
        let spec = &objects[0]["spec"];
        let named = |list: &Value| -> Vec<(String, Compiled)> {
            list.as_array()
                .into_iter()
                .flatten()
                .map(|v| {
                    (
                        v["name"].as_str().unwrap().to_string(),
                        compile(v["expression"].as_str().unwrap()),
                    )
                })
                .collect()
        };
        let conditions = named(&spec["matchConditions"]);
        let variables = named(&spec["variables"]);
        let validations = spec["validations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| {
                (
                    compile(v["expression"].as_str().unwrap()),
                    compile(v["messageExpression"].as_str().unwrap()),
                )
            })
            .collect();
        Policy {
            objects,
            conditions,
            variables,
            validations,
        }
    }

    /// Whether the binding selects a namespace with these labels.
    fn binds(&self, labels: &BTreeMap<String, String>) -> bool {
        selects(
            &self.objects[1]["spec"]["matchResources"]["namespaceSelector"],
            labels,
        ) && selects(
            &self.objects[0]["spec"]["matchConstraints"]["namespaceSelector"],
            labels,
        )
    }
}

/// A label selector, as the API server reads one.
fn selects(selector: &Value, labels: &BTreeMap<String, String>) -> bool {
    let by_labels = selector["matchLabels"]
        .as_object()
        .into_iter()
        .flatten()
        .all(|(k, v)| labels.get(k).map(String::as_str) == v.as_str());
    let by_expressions = selector["matchExpressions"]
        .as_array()
        .into_iter()
        .flatten()
        .all(|e| {
            let value = labels.get(e["key"].as_str().unwrap());
            let values: Vec<&str> = e["values"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            match e["operator"].as_str().unwrap() {
                "In" => value.is_some_and(|v| values.contains(&v.as_str())),
                "NotIn" => value.is_none_or(|v| !values.contains(&v.as_str())),
                "Exists" => value.is_some(),
                "DoesNotExist" => value.is_none(),
                op => panic!("operator {op}"),
            }
        });
    by_labels && by_expressions
}

/// What the policy decided.
#[derive(Debug, PartialEq)]
enum Verdict {
    /// A match condition left the request out.
    NotMatched,
    Admit,
    /// The messages of the failed validations.
    Deny(Vec<String>),
}

impl Verdict {
    fn message(&self) -> String {
        match self {
            Verdict::Deny(m) => m.join(" | "),
            _ => String::new(),
        }
    }
}

/// A request as the policy sees it.
struct Request<'a> {
    object: &'a Value,
    old_object: Option<&'a Value>,
    /// `ephemeralcontainers`, or empty (the API server's value when there is none).
    sub_resource: &'a str,
    kind: (&'a str, &'a str, &'a str),
    operation: &'a str,
    namespace: &'a str,
    namespace_labels: &'a BTreeMap<String, String>,
    username: &'a str,
}

impl<'a> Request<'a> {
    fn create(object: &'a Value, labels: &'a BTreeMap<String, String>) -> Self {
        let api_version = object["apiVersion"].as_str().unwrap_or("v1");
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        Request {
            object,
            old_object: None,
            sub_resource: "",
            kind: (group, version, object["kind"].as_str().unwrap_or("")),
            operation: "CREATE",
            namespace: object["metadata"]["namespace"].as_str().unwrap_or("team-a"),
            namespace_labels: labels,
            username: "system:serviceaccount:team-a:deployer",
        }
    }
}

/// Evaluates the policy on one request; an expression that errors (which the API server turns
/// into a denial under `failurePolicy: Fail`) is an `Err` naming it.
fn evaluate(policy: &Policy, r: &Request) -> Result<Verdict, String> {
    let mut ctx = Context::default().with_all();
    let (group, version, kind) = r.kind;
    // The policy's resourceRules first: a request for a resource they do not name is never
    // sent to the policy.
    let plural = format!("{}s", kind.to_lowercase());
    let resource = match r.sub_resource {
        "" => plural.clone(),
        sub => format!("{plural}/{sub}"),
    };
    let names = |rule: &Value, key: &str, want: &str| {
        rule[key]
            .as_array()
            .is_some_and(|l| l.iter().any(|v| v == want || v == "*"))
    };
    let matched = policy.objects[0]["spec"]["matchConstraints"]["resourceRules"]
        .as_array()
        .unwrap()
        .iter()
        .any(|rule| {
            names(rule, "apiGroups", group)
                && names(rule, "apiVersions", version)
                && names(rule, "operations", r.operation)
                && names(rule, "resources", &resource)
        });
    if !matched {
        return Ok(Verdict::NotMatched);
    }
    let request = json!({
        "kind": {"group": group, "version": version, "kind": kind},
        "resource": {"group": group, "version": version, "resource": format!("{}s", kind.to_lowercase())},
        "operation": r.operation,
        "subResource": r.sub_resource,
        "namespace": r.namespace,
        "name": r.object["metadata"]["name"].as_str().unwrap_or(""),
        "userInfo": {"username": r.username, "groups": ["system:authenticated"]},
        "dryRun": false,
    });
    let namespace = json!({"metadata": {"name": r.namespace, "labels": r.namespace_labels}});
    ctx.add_variable_from_value("object", to_cel(r.object));
    ctx.add_variable_from_value(
        "oldObject",
        r.old_object.map(to_cel).unwrap_or(cel::Value::Null),
    );
    ctx.add_variable_from_value("request", to_cel(&request));
    ctx.add_variable_from_value("namespaceObject", to_cel(&namespace));
    // Variables in order, each seeing the ones before it. The API server evaluates them lazily
    // (a variable is computed when an expression reads it): one that errors here is left out
    // of `variables`, so that only an expression that reads it fails (with "no such key"), as
    // it would there.
    let mut variables: std::collections::HashMap<String, cel::Value> = Default::default();
    let bind = |ctx: &mut Context, variables: &std::collections::HashMap<String, cel::Value>| {
        let map: std::collections::HashMap<cel::objects::Key, cel::Value> = variables
            .iter()
            .map(|(k, v)| (cel::objects::Key::from(k.as_str()), v.clone()))
            .collect();
        ctx.add_variable_from_value("variables", cel::Value::Map(map.into()));
    };
    for (name, c) in &policy.variables {
        bind(&mut ctx, &variables);
        if let Ok(value) = c.program.execute(&ctx) {
            variables.insert(name.clone(), value);
        }
    }
    bind(&mut ctx, &variables);
    for (name, c) in &policy.conditions {
        match c.program.execute(&ctx) {
            Ok(cel::Value::Bool(true)) => {}
            Ok(cel::Value::Bool(false)) => return Ok(Verdict::NotMatched),
            other => return Err(format!("matchCondition {name}: {other:?}")),
        }
    }
    let mut denials = Vec::new();
    for (expression, message) in &policy.validations {
        match expression.program.execute(&ctx) {
            Ok(cel::Value::Bool(true)) => {}
            Ok(cel::Value::Bool(false)) => match message.program.execute(&ctx) {
                Ok(cel::Value::String(s)) => denials.push(s.to_string()),
                other => return Err(format!("messageExpression: {other:?}\n{}", message.source)),
            },
            other => return Err(format!("validation: {other:?}\n{}", expression.source)),
        }
    }
    Ok(if denials.is_empty() {
        Verdict::Admit
    } else {
        Verdict::Deny(denials)
    })
}

fn verdict(policy: &Policy, object: &Value) -> Verdict {
    let labels = enforce_labels();
    evaluate(policy, &Request::create(object, &labels))
        .unwrap_or_else(|e| panic!("the policy errors: {e}\nobject: {object}"))
}

fn enforce_labels() -> BTreeMap<String, String> {
    BTreeMap::from([("modelgate.io/inject".to_string(), "enabled".to_string())])
}

// ---------------------------------------------------------------------------------------------
// The webhook side
// ---------------------------------------------------------------------------------------------

struct Webhooks {
    cfg: PolicyConfig,
    index: CacheIndex,
    namespaces: Namespaces,
}

impl Webhooks {
    fn new(cfg: PolicyConfig) -> Self {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/reviews");
        let hits = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(hits.path(), serde_json::to_vec(&cache_hit_state()).unwrap()).unwrap();
        let (index, _) =
            modelgate::cache::load_files(&[dir.join("caches.json"), hits.path().into()])
                .expect("caches");
        Webhooks {
            cfg,
            index,
            namespaces: Namespaces::default(),
        }
    }

    fn call(&self, webhook: Webhook, review: &Value) -> Answer {
        let ctx = admission::Context {
            config: &self.cfg,
            caches: Caches::Ready(&self.index),
            namespaces: &self.namespaces,
        };
        testing::review(webhook, review, &ctx)
    }
}

/// The fields a webhook denial names (`<field>: <problem>; …. advice`).
fn denied_fields(message: &str) -> Vec<String> {
    let list = message.split(". ").next().unwrap_or_default();
    list.split("; ")
        .filter_map(|v| v.split_once(": ").map(|(f, _)| f.to_string()))
        .collect()
}

fn is_security_field(field: &str) -> bool {
    ["runAsUser", "runAsGroup", "fsGroup", "runAsNonRoot"]
        .iter()
        .any(|f| field.ends_with(&format!("securityContext.{f}")))
}

/// The object with the ServiceAccount plugin's work done: a projected `kube-api-access-*`
/// volume, mounted read-only at the token path in every container (the injected prep too).
fn with_token_mount(object: &Value) -> Value {
    let mut o = object.clone();
    let spec_pointer = if o["kind"] == "Pod" {
        "/spec"
    } else {
        "/spec/template/spec"
    };
    let Some(spec) = o.pointer_mut(spec_pointer) else {
        return o;
    };
    let volume = json!({"name": "kube-api-access-x7k2p", "projected": {"defaultMode": 420,
        "sources": [{"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}}]}});
    match spec["volumes"].as_array_mut() {
        Some(v) => v.push(volume),
        None => spec["volumes"] = json!([volume]),
    }
    for list in ["initContainers", "containers", "ephemeralContainers"] {
        let containers = spec.get_mut(list).and_then(Value::as_array_mut);
        for c in containers.into_iter().flatten() {
            let mount = json!({"name": "kube-api-access-x7k2p", "readOnly": true,
                "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"});
            match c["volumeMounts"].as_array_mut() {
                Some(m) => m.push(mount),
                None => c["volumeMounts"] = json!([mount]),
            }
        }
    }
    o
}

/// Whether every container of a Pod or Job is non-root by its own runAsNonRoot, else the
/// pod's, the prep container aside (the test's own reading of SPEC.md §6).
fn all_non_root(object: &Value) -> bool {
    let spec = if object["kind"] == "Pod" {
        &object["spec"]
    } else {
        &object["spec"]["template"]["spec"]
    };
    let pod = spec["securityContext"]["runAsNonRoot"] == true;
    ["initContainers", "containers", "ephemeralContainers"]
        .iter()
        .flat_map(|l| spec[*l].as_array().into_iter().flatten())
        .filter(|c| c["name"] != "model-cache-prep")
        .all(|c| match c["securityContext"]["runAsNonRoot"].as_bool() {
            Some(own) => own,
            None => pod,
        })
}

/// How often each comparison ran, so that none of them passes for want of cases.
#[derive(Default, Debug)]
struct Coverage {
    denied_for_a_security_field: usize,
    made_non_root: usize,
    admitted_as_patched: usize,
    templates: usize,
}

/// Compares the backstop with the webhooks on one object, in an `enforce` namespace.
fn differential(
    label: &str,
    object: &Value,
    hooks: &Webhooks,
    policy: &Policy,
    seen: &mut Coverage,
) -> Vec<String> {
    let mut failures = Vec::new();
    let Some(kind) = WorkloadKind::of_api_version(
        object["apiVersion"].as_str().unwrap_or_default(),
        object["kind"].as_str().unwrap_or_default(),
    ) else {
        return failures;
    };
    let review = create_review("uid", object, "team-a");
    let mutate = hooks.call(Webhook::Mutate, &review);
    let validate = hooks.call(Webhook::Validate, &review);
    if mutate.http != 200 {
        return failures;
    }
    let unmutated = verdict(policy, object);
    let mut fail = |what: String| {
        failures.push(format!(
            "{label}: {what}\n  /mutate: {} {}\n  /validate: {} {}\n  backstop: {unmutated:?}\n  object: {object}",
            mutate.allowed,
            Value::Array(mutate.patch().to_vec()),
            validate.allowed,
            validate.message
        ))
    };

    // What /validate denies for a security field, the backstop denies naming that field.
    let fields: Vec<String> = denied_fields(&validate.message)
        .into_iter()
        .filter(|f| is_security_field(f))
        .collect();
    if !validate.allowed && !fields.is_empty() {
        seen.denied_for_a_security_field += 1;
        let message = unmutated.message();
        match &unmutated {
            Verdict::Deny(_) => {
                for f in &fields {
                    if !message.contains(&format!("{f}: ")) {
                        fail(format!("the backstop does not name {f}: {message}"));
                    }
                }
                if !message.contains(backstop::MESSAGE_SUFFIX) {
                    fail("the message does not say the backstop answered".into());
                }
            }
            _ => fail(format!("/validate denies {fields:?}, the backstop admits")),
        }
    }

    if kind.is_controller() {
        seen.templates += 1;
        // Templates: the ranges only, exactly where the webhook denies them.
        if validate.allowed && unmutated != Verdict::Admit {
            fail("/validate admits the template, the backstop does not".into());
        }
        return failures;
    }

    // An unmutated pod that /mutate would make non-root is denied: the patch sets a
    // runAsNonRoot, and some container was not non-root before it.
    let sets_non_root = mutate.patch().iter().any(|op| {
        op["path"]
            .as_str()
            .is_some_and(|p| p.ends_with("runAsNonRoot"))
            || op["value"].get("runAsNonRoot").is_some()
            || op["value"]["securityContext"].get("runAsNonRoot").is_some()
    });
    let makes_non_root = sets_non_root && !all_non_root(object);
    seen.made_non_root += usize::from(makes_non_root);
    if makes_non_root && !matches!(unmutated, Verdict::Deny(_)) {
        fail("/mutate makes it non-root, the backstop admits it unmutated".into());
    }
    // What the backstop denies unmutated, the webhooks would have changed or denied.
    if matches!(unmutated, Verdict::Deny(_)) && !makes_non_root && validate.allowed {
        fail("the backstop denies a pod the webhooks leave as it is".into());
    }

    // What /mutate then /validate admit is admitted as patched, with and without the token
    // mount the API server adds.
    if mutate.allowed {
        let patched = mutate.patched(object);
        let v = hooks.call(Webhook::Validate, &create_review("uid", &patched, "team-a"));
        if v.allowed {
            seen.admitted_as_patched += 1;
            for (what, o) in [
                ("as patched", patched.clone()),
                (
                    "as patched, with the token mount",
                    with_token_mount(&patched),
                ),
            ] {
                let got = verdict(policy, &o);
                if matches!(got, Verdict::Deny(_)) {
                    fail(format!(
                        "the backstop refuses it {what}: {got:?}\n  patched: {o}"
                    ));
                }
            }
        }
    }
    failures
}

// ---------------------------------------------------------------------------------------------
// Configurations and objects
// ---------------------------------------------------------------------------------------------

fn selection() -> Selection {
    Selection::new("modelgate", "modelgate")
}

fn configs() -> Vec<(&'static str, PolicyConfig)> {
    let base = PolicyConfig {
        exempt_namespaces: vec!["kube-system".into(), "modelgate".into()],
        ..PolicyConfig::default()
    };
    vec![
        ("defaults", base.clone()),
        (
            "prep never",
            PolicyConfig {
                model_cache_prep: PrepMode::Never,
                ..base.clone()
            },
        ),
        (
            "OpenShift (uid none, no fsGroup)",
            PolicyConfig {
                run_as_user: IdSetting::None,
                run_as_group: IdSetting::None,
                default_fsgroup: 0,
                ..base.clone()
            },
        ),
        (
            "other image, volume and path",
            PolicyConfig {
                init_image: "registry.example/tools/busybox@sha256:abc".into(),
                cache_volume: "cache".into(),
                cache_mount_path: "/var/cache/models".into(),
                init_container_user: 4242,
                ..base
            },
        ),
    ]
}

/// Pods that exercise every branch of the prep and the security fields.
/// The node counts of the generated cache hits: a model downloaded on 1, 2 and 50 nodes, each
/// pinned by the hit's node affinity (SPEC.md §5).
const HIT_NODES: [usize; 3] = [1, 2, 50];

/// A cluster `LocalModelCache` `hf://org/model-N` per [`HIT_NODES`], downloaded on every node of
/// its group `group-N`, with the PVC KServe makes in team-a: what a hit needs.
fn cache_hit_state() -> Value {
    let mut items = Vec::new();
    for n in HIT_NODES {
        let (group, pool) = (format!("group-{n}"), format!("pool-{n}"));
        items.push(json!({"apiVersion": "serving.kserve.io/v1alpha1", "kind": "LocalModelNodeGroup",
            "metadata": {"name": group},
            "spec": {"storageLimit": "100Gi", "persistentVolumeSpec": {"capacity": {"storage": "100Gi"},
                "local": {"path": "/models"},
                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "pool", "operator": "In", "values": [pool]}]}]}}}}}));
        let mut status = serde_json::Map::new();
        for i in 0..n {
            let node = format!("{pool}-node-{i}");
            items.push(json!({"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": node, "labels": {"pool": pool, "kubernetes.io/hostname": node}}}));
            status.insert(node, json!("NodeDownloaded"));
        }
        let cache = format!("model-{n}");
        items.push(json!({"apiVersion": "serving.kserve.io/v1alpha1", "kind": "LocalModelCache",
            "metadata": {"name": cache},
            "spec": {"sourceModelUri": format!("hf://org/model-{n}"), "modelSize": "10Gi", "nodeGroups": [group]},
            "status": {"nodeStatus": status}}));
        items.push(json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": format!("{cache}-{group}"), "namespace": "team-a"},
            "spec": {"accessModes": ["ReadOnlyMany"]}, "status": {"phase": "Bound"}}));
    }
    json!({"apiVersion": "v1", "kind": "List", "items": items})
}

/// Pods whose model URI hits a cache of [`cache_hit_state`]: the patch adds the model volume,
/// its read-only mounts and the node affinity to the hit's nodes.
fn cache_hit_pods() -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for n in HIT_NODES {
        for (what, sc) in [
            ("plain", Value::Null),
            ("pod nonroot", json!({"runAsNonRoot": true})),
        ] {
            let mut pod = json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": format!("hit-{n}"), "namespace": "team-a",
                    "annotations": {"modelgate.io/model-uri": format!("hf://org/model-{n}/weights")}},
                "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.6.0",
                    "volumeMounts": [{"name": "model-cache", "mountPath": "/models"}]}],
                    "volumes": [{"name": "model-cache", "persistentVolumeClaim": {"claimName": "scratch"}}]}});
            if !sc.is_null() {
                pod["spec"]["securityContext"] = sc;
            }
            out.push((format!("cache hit on {n} nodes, {what}"), pod));
        }
    }
    out
}

fn generated_pods() -> Vec<(String, Value)> {
    let pvc = json!({"name": "model-cache", "persistentVolumeClaim": {"claimName": "models"}});
    let mut out = Vec::new();
    let pod = |name: &str, spec: Value, annotations: Value| {
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": "team-a", "annotations": annotations},
               "spec": spec})
    };
    let container = |name: &str, sc: Value| {
        let mut c = json!({"name": name, "image": "vllm/vllm-openai:v0.6.0",
            "volumeMounts": [{"name": "model-cache", "mountPath": "/models"}],
            "resources": {"requests": {"cpu": "2", "memory": "8Gi"}, "limits": {"cpu": "2", "memory": "8Gi"}}});
        if !sc.is_null() {
            c["securityContext"] = sc;
        }
        c
    };
    let pod_scs = [
        ("no pod securityContext", Value::Null),
        ("pod fsGroup 2000", json!({"fsGroup": 2000})),
        ("pod uid 5000", json!({"runAsUser": 5000})),
        ("pod nonroot", json!({"runAsNonRoot": true})),
        (
            "pod nonroot false",
            json!({"runAsNonRoot": false, "runAsUser": 1000}),
        ),
        ("pod uid 0", json!({"runAsUser": 0})),
        (
            "pod gid -1",
            json!({"runAsGroup": -1, "fsGroup": 3_000_000_000i64}),
        ),
    ];
    let container_scs = [
        ("plain", Value::Null),
        ("nonroot false", json!({"runAsNonRoot": false})),
        ("uid 0", json!({"runAsUser": 0})),
        ("nonroot", json!({"runAsNonRoot": true, "runAsUser": 1001})),
    ];
    let volumes = [
        ("pvc", json!([pvc])),
        ("emptyDir", json!([{"name": "model-cache", "emptyDir": {}}])),
        (
            "annotated nfs",
            json!([{"name": "weights", "nfs": {"server": "nfs", "path": "/m"}}]),
        ),
        ("none", Value::Null),
    ];
    for (pn, psc) in &pod_scs {
        for (cn, csc) in &container_scs {
            for (vn, vols) in &volumes {
                let mut spec = json!({"containers": [container("server", csc.clone())]});
                if !psc.is_null() {
                    spec["securityContext"] = psc.clone();
                }
                if !vols.is_null() {
                    spec["volumes"] = vols.clone();
                }
                let annotations = if *vn == "annotated nfs" {
                    json!({"modelgate.io/cache-volume": "weights"})
                } else {
                    json!({})
                };
                out.push((format!("{pn} / {cn} / {vn}"), pod("p", spec, annotations)));
            }
        }
    }
    // Windows pods, by spec.os and by nodeSelector; init and ephemeral containers.
    let windows = json!({"os": {"name": "windows"}, "volumes": [pvc],
        "containers": [{"name": "w", "image": "mcr.microsoft.com/windows/servercore"}]});
    out.push(("windows by os".into(), pod("w", windows, json!({}))));
    let by_selector = json!({"nodeSelector": {"kubernetes.io/os": "windows"}, "volumes": [pvc],
        "containers": [{"name": "w", "image": "mcr.microsoft.com/windows/servercore"}]});
    out.push((
        "windows by nodeSelector".into(),
        pod("w", by_selector, json!({})),
    ));
    let with_init = json!({"volumes": [pvc],
        "initContainers": [{"name": "fetch", "image": "busybox", "securityContext": {"runAsNonRoot": false}}],
        "containers": [{"name": "c", "image": "busybox"}],
        "ephemeralContainers": [{"name": "debug", "image": "busybox", "securityContext": {"runAsUser": 0}}]});
    out.push(("init and ephemeral".into(), pod("i", with_init, json!({}))));
    // A Job and controllers with the same pod.
    let template = json!({"metadata": {"labels": {"app": "x"}},
        "spec": {"restartPolicy": "Never", "volumes": [pvc],
                 "containers": [{"name": "c", "image": "busybox", "securityContext": {"runAsUser": 0}}]}});
    out.push((
        "job".into(),
        json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"},
               "spec": {"template": template}}),
    ));
    out.push((
        "deployment".into(),
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
               "spec": {"selector": {"matchLabels": {"app": "x"}}, "template": template}}),
    ));
    out.push((
        "cronjob".into(),
        json!({"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "cj"},
               "spec": {"schedule": "* * * * *", "jobTemplate": {"spec": {"template": template}}}}),
    ));
    out
}

/// Every Kubernetes object of the corpus, and the objects of its CREATE AdmissionReviews.
fn corpus_objects() -> Vec<(String, Value)> {
    let Some(dir) = cli::corpus_dir() else {
        return Vec::new();
    };
    let mut files = Vec::new();
    let mut stack = vec![dir];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap().flatten() {
            let p = entry.path();
            if p.is_dir() {
                stack.push(p);
            } else if matches!(
                p.extension().and_then(|e| e.to_str()),
                Some("yaml" | "yml" | "json")
            ) && !p.ends_with("_manifest.json")
            {
                files.push(p);
            }
        }
    }
    files.sort();
    let mut out = Vec::new();
    for p in files {
        let text = std::fs::read_to_string(&p).unwrap();
        let Ok(docs) = read_documents(&p.display().to_string(), &text) else {
            continue;
        };
        for d in docs {
            let v = d.value;
            let object = if v.get("request").is_some() {
                v["request"]["object"].clone()
            } else if v.get("uid").is_some() && v.get("object").is_some() {
                v["object"].clone()
            } else {
                v
            };
            if object.get("kind").is_some() && object.get("spec").is_some() {
                out.push((d.origin, object));
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------------

/// kube-cel compiles every expression of the policy (matchConditions, variables, validations
/// and their messages), for every configuration.
#[test]
fn every_expression_compiles_with_kube_cel() {
    on_big_stack(every_expression_compiles_with_kube_cel_on_this_thread);
}

fn every_expression_compiles_with_kube_cel_on_this_thread() {
    let mut sel = selection();
    sel.exclude_priority_classes = vec!["system-node-critical".into()];
    for (name, mut cfg) in configs() {
        cfg.prep_host_paths = vec!["/data/models".into(), "/".into()];
        let objects = backstop::objects(&cfg, &sel);
        let spec = &objects[0]["spec"];
        let mut expressions = Vec::new();
        for list in ["matchConditions", "variables"] {
            for e in spec[list].as_array().unwrap() {
                expressions.push(e["expression"].as_str().unwrap().to_string());
            }
        }
        for v in spec["validations"].as_array().unwrap() {
            expressions.push(v["expression"].as_str().unwrap().to_string());
            expressions.push(v["messageExpression"].as_str().unwrap().to_string());
        }
        let evaluator = kube_cel::VapEvaluator::builder().build();
        let exprs: Vec<kube_cel::VapExpression> = expressions
            .iter()
            .map(|e| kube_cel::VapExpression {
                expression: e.clone(),
                message: None,
                message_expression: None,
            })
            .collect();
        for (e, compiled) in expressions
            .iter()
            .zip(evaluator.compile_expressions(&exprs))
        {
            assert!(compiled.is_ok(), "{name}: does not compile: {e}");
        }
        // Every expression reads only the variables a ValidatingAdmissionPolicy has.
        // (kube-cel counts a comprehension's own variable as a reference: those are left out.)
        // The table's templates bind theirs as a letter and their depth (`e0`, `k1`, `p0`).
        let iteration = ["c", "k", "v", "s", "p", "t", "e", "os"];
        let is_iteration = |v: &str| {
            iteration.contains(&v)
                || (v.len() >= 2
                    && "nepk".contains(&v[..1])
                    && v[1..].bytes().all(|b| b.is_ascii_digit()))
        };
        for e in &expressions {
            let warnings = kube_cel::check_rule_scope(e, kube_cel::ScopeContext::AdmissionPolicy);
            for w in warnings {
                let variable = w
                    .message
                    .split("variable '")
                    .nth(1)
                    .and_then(|rest| rest.split('\'').next())
                    .unwrap_or_default();
                assert!(is_iteration(variable), "{name}: {}: {e}", w.message);
            }
        }
        // Settings live in variables of their own; no other expression changes with them.
        assert_eq!(spec["paramKind"], Value::Null);
        assert_eq!(spec["failurePolicy"], "Fail");
    }
}

/// The generated cache hits are hits, pinned to every node that has the model: the
/// differential below judges the patched pods a hit makes, not misses.
#[test]
fn the_generated_cache_hits_are_routed() {
    on_big_stack(the_generated_cache_hits_are_routed_on_this_thread);
}

fn the_generated_cache_hits_are_routed_on_this_thread() {
    let hooks = Webhooks::new(PolicyConfig::default());
    for (label, pod) in cache_hit_pods() {
        let mutate = hooks.call(Webhook::Mutate, &create_review("uid", &pod, "team-a"));
        let patched = mutate.patched(&pod);
        let n = pod["metadata"]["name"]
            .as_str()
            .unwrap()
            .trim_start_matches("hit-");
        assert_eq!(
            patched["metadata"]["annotations"]["modelgate.io/model-cache"],
            format!("cluster/model-{n}"),
            "{label}"
        );
        let pinned = patched
            .to_string()
            .matches(&format!("pool-{n}-node-"))
            .count();
        assert!(
            pinned >= n.parse::<usize>().unwrap(),
            "{label}: {pinned} nodes pinned"
        );
    }
}

#[test]
fn the_corpus_and_generated_pods_agree_with_the_webhooks() {
    on_big_stack(the_corpus_and_generated_pods_agree_with_the_webhooks_on_this_thread);
}

fn the_corpus_and_generated_pods_agree_with_the_webhooks_on_this_thread() {
    let corpus = corpus_objects();
    let mut generated = generated_pods();
    generated.extend(cache_hit_pods());
    let mut failures = Vec::new();
    let mut judged = 0;
    let mut seen = Coverage::default();
    for (name, cfg) in configs() {
        let hooks = Webhooks::new(cfg.clone());
        let policy = Policy::new(&cfg, &selection());
        for (label, object) in corpus.iter().chain(generated.iter()) {
            failures.extend(differential(
                &format!("[{name}] {label}"),
                object,
                &hooks,
                &policy,
                &mut seen,
            ));
            judged += 1;
        }
    }
    assert!(judged > 100, "only {judged} objects judged");
    assert!(
        seen.denied_for_a_security_field > 20
            && seen.made_non_root > 20
            && seen.admitted_as_patched > 100
            && seen.templates > 10,
        "{seen:?}"
    );
    println!("{judged} objects judged: {seen:?}");
    assert!(
        failures.is_empty(),
        "{} disagreements:\n{}",
        failures.len(),
        failures.join("\n\n")
    );
    export_outage_verdicts(&corpus, &generated);
}

/// Where the Go API-server harness reads the backstop's verdicts for its outage scenario
/// (`scripts/check-apiserver.sh`, which the test command runs after `cargo test`).
const OUTAGE_VERDICTS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/target/apiserver/backstop-outage.json"
);

/// For each Pod and Job of the differential, with the default policy: what the backstop says
/// of it as it comes (modelgate down: nothing mutated it), and whether `/validate` admits it as
/// it comes. The harness checks through kube-apiserver's client that the webhook cannot be
/// called, lets the request through as `failurePolicy: Ignore` does, and takes these verdicts.
fn export_outage_verdicts(corpus: &[(String, Value)], generated: &[(String, Value)]) {
    let cfg = configs()[0].1.clone();
    let hooks = Webhooks::new(cfg.clone());
    let policy = Policy::new(&cfg, &selection());
    let mut cases = Vec::new();
    for (label, object) in corpus.iter().chain(generated.iter()) {
        let kind = match object["kind"].as_str() {
            Some("Pod") if object["apiVersion"] == "v1" => {
                json!({"Group": "", "Version": "v1", "Kind": "Pod", "Resource": "pods"})
            }
            Some("Job") if object["apiVersion"] == "batch/v1" => {
                json!({"Group": "batch", "Version": "v1", "Kind": "Job", "Resource": "jobs"})
            }
            _ => continue,
        };
        let validated = hooks.call(Webhook::Validate, &create_review("uid", object, "team-a"));
        if validated.http != 200 {
            continue;
        }
        let (backstop, message) = match verdict(&policy, object) {
            Verdict::Deny(messages) => ("deny", messages.join("\n")),
            Verdict::Admit => ("admit", String::new()),
            Verdict::NotMatched => ("not-matched", String::new()),
        };
        cases.push(json!({
            "label": label, "kind": kind, "object": object, "backstop": backstop,
            "message": message, "validateAllowed": validated.allowed,
        }));
    }
    let path = Path::new(OUTAGE_VERDICTS);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, serde_json::to_vec(&cases).unwrap()).unwrap();
}

/// The canonical prep after the API server's plugins is admitted; any forgery is refused.
#[test]
fn forged_prep_containers_are_denied() {
    on_big_stack(forged_prep_containers_are_denied_on_this_thread);
}

fn forged_prep_containers_are_denied_on_this_thread() {
    let cfg = configs()[0].1.clone();
    let hooks = Webhooks::new(cfg.clone());
    let policy = Policy::new(&cfg, &selection());
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "team-a"},
        "spec": {"volumes": [{"name": "model-cache", "persistentVolumeClaim": {"claimName": "m"}}],
                 "initContainers": [{"name": "fetch", "image": "busybox", "securityContext": {"runAsNonRoot": true}}],
                 "containers": [{"name": "c", "image": "busybox"}]}});
    let mutate = hooks.call(Webhook::Mutate, &create_review("u", &pod, "team-a"));
    let patched = with_token_mount(&mutate.patched(&pod));
    let mut defaulted = patched.clone();
    defaulted["spec"]["initContainers"][0]["imagePullPolicy"] = json!("IfNotPresent");
    defaulted["spec"]["initContainers"][0]["terminationMessagePath"] =
        json!("/dev/termination-log");
    defaulted["spec"]["initContainers"][0]["terminationMessagePolicy"] = json!("File");
    assert_eq!(verdict(&policy, &defaulted), Verdict::Admit);

    let prep = patched["spec"]["initContainers"][0].clone();
    assert_eq!(prep["name"], "model-cache-prep");
    let forge = |f: &dyn Fn(&mut Value)| {
        let mut o = defaulted.clone();
        f(&mut o);
        o
    };
    let forgeries: Vec<(&str, Value)> = vec![
        (
            "other image",
            forge(&|o| o["spec"]["initContainers"][0]["image"] = json!("evil:1")),
        ),
        (
            "other command",
            forge(&|o| {
                o["spec"]["initContainers"][0]["command"][2] =
                    json!("chown 0:102 / && chmod g+rwX /")
            }),
        ),
        (
            "uid not the pod's",
            forge(&|o| {
                o["spec"]["initContainers"][0]["command"][2] =
                    json!("chown 0:103 /models && chmod g+rwX /models")
            }),
        ),
        (
            "args",
            forge(&|o| o["spec"]["initContainers"][0]["args"] = json!(["x"])),
        ),
        (
            "an extra mount",
            forge(&|o| {
                o["spec"]["initContainers"][0]["volumeMounts"]
                    .as_array_mut()
                    .unwrap()
                    .push(json!({"name": "host", "mountPath": "/host"}))
            }),
        ),
        (
            "a writable token mount",
            forge(&|o| {
                o["spec"]["initContainers"][0]["volumeMounts"][1]["readOnly"] = json!(false)
            }),
        ),
        (
            "a capability more",
            forge(&|o| {
                o["spec"]["initContainers"][0]["securityContext"]["capabilities"]["add"]
                    .as_array_mut()
                    .unwrap()
                    .push(json!("SYS_ADMIN"))
            }),
        ),
        (
            "privileged",
            forge(&|o| {
                o["spec"]["initContainers"][0]["securityContext"]["privileged"] = json!(true)
            }),
        ),
        (
            "a sidecar",
            forge(&|o| o["spec"]["initContainers"][0]["restartPolicy"] = json!("Always")),
        ),
        (
            "more resources",
            forge(&|o| o["spec"]["initContainers"][0]["resources"]["limits"]["cpu"] = json!("4")),
        ),
        (
            "not first",
            forge(&|o| {
                let init = o["spec"]["initContainers"].as_array_mut().unwrap();
                init.swap(0, 1);
            }),
        ),
        (
            "a second one",
            forge(&|o| {
                let mut second = prep.clone();
                second["name"] = json!("model-cache-prep-2");
                o["spec"]["initContainers"]
                    .as_array_mut()
                    .unwrap()
                    .push(second);
            }),
        ),
        (
            "on a host path",
            forge(&|o| {
                o["spec"]["volumes"][0] =
                    json!({"name": "model-cache", "hostPath": {"path": "/etc"}})
            }),
        ),
        (
            "on an emptyDir",
            forge(&|o| o["spec"]["volumes"][0] = json!({"name": "model-cache", "emptyDir": {}})),
        ),
        (
            "in a Windows pod",
            forge(&|o| o["spec"]["os"] = json!({"name": "windows"})),
        ),
        ("with prep never", defaulted.clone()),
    ];
    for (what, o) in forgeries {
        let p = if what == "with prep never" {
            Policy::new(
                &PolicyConfig {
                    model_cache_prep: PrepMode::Never,
                    ..cfg.clone()
                },
                &selection(),
            )
        } else {
            Policy::new(&cfg, &selection())
        };
        let got = verdict(&p, &o);
        let message = got.message();
        assert!(
            message.contains("runAsNonRoot: false is not allowed")
                || message.contains("runAsUser: 0 is outside"),
            "{what}: {got:?}"
        );
    }
    // In a namespace that enforces Pod Security restricted modelgate injects none.
    let restricted = BTreeMap::from([
        ("modelgate.io/inject".to_string(), "enabled".to_string()),
        (
            "pod-security.kubernetes.io/enforce".to_string(),
            "restricted".to_string(),
        ),
    ]);
    let got = evaluate(&policy, &Request::create(&defaulted, &restricted)).unwrap();
    assert!(matches!(got, Verdict::Deny(_)), "{got:?}");

    // A host path under --prep-host-path is the prep's to fix, by whole components only.
    for (path, allowed) in [
        ("/data/models", true),
        ("/data//models/./llama", true),
        ("/data/models-evil", false),
        ("/data", false),
        ("/data/models/../../etc", false),
    ] {
        let hosted = PolicyConfig {
            prep_host_paths: vec!["/data/./models/".into()],
            ..cfg.clone()
        };
        let mut o = defaulted.clone();
        o["spec"]["volumes"][0] = json!({"name": "model-cache", "hostPath": {"path": path}});
        let got = verdict(&Policy::new(&hosted, &selection()), &o);
        assert_eq!(got == Verdict::Admit, allowed, "{path}: {got:?}");
    }
}

/// Only opted-in namespaces in enforce are bound: by label, by an unknown label value, or by
/// --default-mode enforce; warn, audit, off, not opted in and exempt ones are not.
#[test]
fn only_enforce_namespaces_are_bound() {
    on_big_stack(only_enforce_namespaces_are_bound_on_this_thread);
}

fn only_enforce_namespaces_are_bound_on_this_thread() {
    let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let opt_in = ("modelgate.io/inject", "enabled");
    let cases = [
        (labels(&[opt_in]), true, false),
        (
            labels(&[opt_in, ("modelgate.io/mode", "enforce")]),
            true,
            true,
        ),
        (
            labels(&[opt_in, ("modelgate.io/mode", "Enforce")]),
            true,
            true,
        ),
        (
            labels(&[opt_in, ("modelgate.io/mode", "warn")]),
            false,
            false,
        ),
        (
            labels(&[opt_in, ("modelgate.io/mode", "audit")]),
            false,
            false,
        ),
        (
            labels(&[opt_in, ("modelgate.io/mode", "off")]),
            false,
            false,
        ),
        (labels(&[("modelgate.io/mode", "enforce")]), false, false),
        (
            labels(&[opt_in, ("kubernetes.io/metadata.name", "kube-system")]),
            false,
            false,
        ),
        (
            labels(&[opt_in, ("kubernetes.io/metadata.name", "modelgate")]),
            false,
            false,
        ),
    ];
    for default_mode in modelgate::namespaces::Mode::ALL {
        let cfg = PolicyConfig {
            default_mode,
            ..configs()[0].1.clone()
        };
        let policy = Policy::new(&cfg, &selection());
        for (l, bound_by_default, bound_otherwise) in &cases {
            let expected = if default_mode == modelgate::namespaces::Mode::Enforce {
                *bound_by_default
            } else {
                *bound_otherwise
            };
            assert_eq!(policy.binds(l), expected, "{default_mode}: {l:?}");
        }
    }
}

/// The match conditions leave out what the webhooks' leave out.
#[test]
fn match_conditions_mirror_the_webhooks() {
    on_big_stack(match_conditions_mirror_the_webhooks_on_this_thread);
}

fn match_conditions_mirror_the_webhooks_on_this_thread() {
    let cfg = configs()[0].1.clone();
    let mut sel = selection();
    sel.exclude_priority_classes = vec!["system-node-critical".into()];
    let policy = Policy::new(&cfg, &sel);
    let labels = enforce_labels();
    let root = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "image": "i", "securityContext": {"runAsUser": 0}}]}});
    let deny = |r: &Request| matches!(evaluate(&policy, r).unwrap(), Verdict::Deny(_));
    assert!(deny(&Request::create(&root, &labels)));
    let mut mirror = root.clone();
    mirror["metadata"]["annotations"] = json!({"kubernetes.io/config.mirror": "x"});
    assert_eq!(
        evaluate(&policy, &Request::create(&mirror, &labels)).unwrap(),
        Verdict::NotMatched
    );
    let mut own = Request::create(&root, &labels);
    own.username = "system:serviceaccount:modelgate:modelgate";
    assert_eq!(evaluate(&policy, &own).unwrap(), Verdict::NotMatched);
    let mut exempt = Request::create(&root, &labels);
    exempt.namespace = "kube-system";
    assert_eq!(evaluate(&policy, &exempt).unwrap(), Verdict::NotMatched);
    let mut critical = root.clone();
    critical["spec"]["priorityClassName"] = json!("system-node-critical");
    assert_eq!(
        evaluate(&policy, &Request::create(&critical, &labels)).unwrap(),
        Verdict::NotMatched
    );
    // A scale of a Deployment leaves its template as it was: not judged; a changed one is.
    let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
        "spec": {"replicas": 3, "template": {"spec": root["spec"].clone()}}});
    let mut scaled = deployment.clone();
    scaled["spec"]["replicas"] = json!(1);
    let mut update = Request::create(&scaled, &labels);
    update.operation = "UPDATE";
    update.old_object = Some(&deployment);
    assert_eq!(evaluate(&policy, &update).unwrap(), Verdict::NotMatched);
    let fixed = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
        "spec": {"replicas": 3, "template": {"spec": {"containers": [{"name": "c", "image": "i"}]}}}});
    let mut update = Request::create(&deployment, &labels);
    update.operation = "UPDATE";
    update.old_object = Some(&fixed);
    assert!(deny(&update));
    // An ephemeral container added to a running pod: the ranges of the whole pod and the
    // ephemeral containers' runAsNonRoot are judged; the other containers' runAsNonRoot is
    // not (they are immutable and already run), as by the webhook's /validate.
    // A pod that predates the policy: its container has no runAsNonRoot, and no bad uid.
    let old_pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "old"},
        "spec": {"containers": [{"name": "c", "image": "i"}]}});
    let mut running = old_pod.clone();
    running["spec"]["ephemeralContainers"] =
        json!([{"name": "debug", "image": "busybox", "securityContext": {"runAsNonRoot": false}}]);
    let mut ephemeral = Request::create(&running, &labels);
    ephemeral.operation = "UPDATE";
    ephemeral.sub_resource = "ephemeralcontainers";
    ephemeral.old_object = Some(&old_pod);
    let got = evaluate(&policy, &ephemeral).unwrap();
    assert!(
        got.message().contains(
            "spec.ephemeralContainers[0].securityContext.runAsNonRoot: false is not allowed"
        ),
        "{got:?}"
    );
    assert!(
        !got.message().contains("spec.containers[0]"),
        "the running containers judged again: {got:?}"
    );
    let mut fixed_debug = running.clone();
    fixed_debug["spec"]["ephemeralContainers"][0]["securityContext"] =
        json!({"runAsNonRoot": true});
    let mut ephemeral = Request::create(&fixed_debug, &labels);
    ephemeral.operation = "UPDATE";
    ephemeral.sub_resource = "ephemeralcontainers";
    ephemeral.old_object = Some(&old_pod);
    assert!(
        !deny(&ephemeral),
        "kubectl debug refused on a pod that predates the policy"
    );
}

/// The custom resources of §12 (`tests/fixtures/ml-kinds`, every default kind of the table):
/// the backstop judges only the ranges of complete templates, and names each finding by the
/// template's own path as the webhook does. Each object as it is, then with `runAsUser: 0` in
/// the first container of every template: the backstop denies exactly the range fields that the
/// webhook's `/validate` denies (a partial template: never, the webhook only warns); an UPDATE
/// that changes no template is not matched, one that changes a template is judged.
#[test]
fn ml_custom_resources_agree_with_the_webhook() {
    on_big_stack(ml_custom_resources_agree_with_the_webhook_on_this_thread);
}

fn ml_custom_resources_agree_with_the_webhook_on_this_thread() {
    let cfg = PolicyConfig::default();
    let policy = Policy::new(&cfg, &selection());
    let hooks = Webhooks::new(cfg.clone());
    let labels = enforce_labels();
    let range_fields = |fields: Vec<String>| -> Vec<String> {
        let mut f: Vec<String> = fields
            .into_iter()
            .filter(|f| !f.ends_with("runAsNonRoot"))
            .filter(|f| is_security_field(f))
            .collect();
        f.sort();
        f
    };
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/ml-kinds");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    let (mut judged, mut denied_by_both) = (0, 0);
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap();
        for doc in read_documents(&path.display().to_string(), &text).unwrap() {
            let object = doc.value;
            let api_version = object["apiVersion"].as_str().unwrap();
            let kind = object["kind"].as_str().unwrap();
            let row = cfg
                .workload_kinds
                .find_api_version(api_version, kind)
                .unwrap_or_else(|| panic!("{api_version} {kind}: not in the table"));
            let label = format!("{} {kind} {}", path.display(), object["metadata"]["name"]);
            // As it is, and with root in the first container of every template.
            let mut rooted = object.clone();
            let text = serde_json::to_string(&object).unwrap();
            for t in admission::templates_of(row, &text).unwrap() {
                let spec = match t.shape {
                    admission::Shape::PodTemplateSpec => format!("{}/spec", t.pointer),
                    admission::Shape::PodSpec => t.pointer.clone(),
                };
                if let Some(c) = rooted.pointer_mut(&format!("{spec}/containers/0")) {
                    c["securityContext"]["runAsUser"] = json!(0);
                }
            }
            for (variant, o) in [("as is", &object), ("rooted", &rooted)] {
                judged += 1;
                let validated = hooks.call(Webhook::Validate, &create_review("uid", o, "team-a"));
                let mut want = range_fields(if validated.allowed {
                    Vec::new()
                } else {
                    denied_fields(&validated.message)
                });
                // A partial template's findings are warnings: the backstop never denies them.
                if row.is_partial() {
                    want.clear();
                }
                let got = evaluate(&policy, &Request::create(o, &labels))
                    .unwrap_or_else(|e| panic!("{label} ({variant}): the policy errors: {e}"));
                let got_fields = match &got {
                    Verdict::Deny(messages) => {
                        range_fields(messages.iter().flat_map(|m| denied_fields(m)).collect())
                    }
                    _ => Vec::new(),
                };
                assert_eq!(
                    got_fields, want,
                    "{label} ({variant}): the backstop {got:?}, the webhook: {}",
                    validated.message
                );
                if !want.is_empty() {
                    denied_by_both += 1;
                }
                if row.is_partial() {
                    assert_eq!(
                        got,
                        Verdict::NotMatched,
                        "{label}: a partial kind is not matched"
                    );
                    continue;
                }
                // An UPDATE that leaves the templates as they were is not judged; one that
                // changes a template is.
                let mut relabelled = o.clone();
                relabelled["metadata"]["labels"]["touched"] = json!("yes");
                let mut update = Request::create(&relabelled, &labels);
                update.operation = "UPDATE";
                update.old_object = Some(o);
                assert_eq!(
                    evaluate(&policy, &update).unwrap(),
                    Verdict::NotMatched,
                    "{label} ({variant}): an UPDATE of the labels only"
                );
                if variant == "rooted" && !want.is_empty() && rooted != object {
                    let mut update = Request::create(&rooted, &labels);
                    update.operation = "UPDATE";
                    update.old_object = Some(&object);
                    assert!(
                        matches!(evaluate(&policy, &update).unwrap(), Verdict::Deny(_)),
                        "{label}: an UPDATE that puts root in a template"
                    );
                }
            }
        }
    }
    eprintln!("{judged} judged, {denied_by_both} denied by both");
    assert!(
        judged >= 40 && denied_by_both >= 20,
        "{judged} judged, {denied_by_both} denied"
    );
}
