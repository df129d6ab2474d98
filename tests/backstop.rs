//! The backstop (docs/policy.md §13) evaluated as the API server evaluates it, against the webhooks.
//!
//! The policy that `modelgate_core::backstop` renders is compiled and evaluated by
//! kube-apiserver's own ValidatingAdmissionPolicy code, offline (`support/kube_apiserver_cel.rs`:
//! the binaries of kube-apiserver 1.30, 1.31, 1.32 with strict cost, and 1.36), which must all
//! decide the same. `request` and `namespaceObject` are bound as the API server binds them:
//! `subResource` only for a subresource, `namespace` only for a namespaced object,
//! `namespaceObject` null for a cluster-scoped one. Which requests reach the policy at all (its
//! `resourceRules`, the binding's namespace selection) is decided here, as the binaries leave
//! that out.
//!
//! A test collects its requests with what it expects of each ([`Checks`]), then every request
//! of a policy is evaluated in one run per version and each expectation is judged on the
//! decision. An evaluation error (a denial under `failurePolicy: Fail`), versions that disagree
//! and a message the API server drops (over 5 KiB) are failures of every check.
//!
//! Then, over the test corpus and generated pods, the backstop is compared with the webhooks
//! (`admission::review`, in process): what `/mutate` then `/validate` admit is admitted as
//! patched (also with the API server's token mount added to every container); what `/validate`
//! denies for a security field is denied, naming that field; what `/mutate` would make
//! non-root is denied unmutated; a compliant pod is admitted unmutated; forged prep containers
//! are denied; only namespaces in `enforce` are bound.

#[path = "support/backstop_inputs.rs"]
mod backstop_inputs;
#[path = "common/cli.rs"]
mod cli;
#[path = "support/kube_apiserver_cel.rs"]
mod kube_apiserver_cel;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use backstop_inputs::{
    Webhooks, cache_hit_pods, corpus_objects, enforce_labels, generated_pods, large_pod, selects,
};
use kube_apiserver_cel::{AdmissionRequest, Case, Decision, UserInfo, namespace_object};
use modelgate::admission::{self, Webhook};
use modelgate::backstop::{self, Selection};
use modelgate::config::{IdSetting, PolicyConfig, PrepMode};
use modelgate::documents::read_documents;
use modelgate::kinds::{self, Scope, WorkloadKind, WorkloadKinds};
use modelgate_core::testing::create_review;
use serde_json::{Value, json};

// ---------------------------------------------------------------------------------------------
// The evaluator
// ---------------------------------------------------------------------------------------------

/// The policy and its binding.
struct Policy {
    objects: [Value; 2],
    /// The workload-kind table of its configuration: the resources of the custom kinds.
    kinds: Arc<WorkloadKinds>,
}

impl Policy {
    fn new(cfg: &PolicyConfig, sel: &Selection) -> Policy {
        Policy {
            objects: backstop::objects(cfg, sel)
                .unwrap_or_else(|e| panic!("the backstop is not rendered: {e}")),
            kinds: cfg.workload_kinds.clone(),
        }
    }

    fn vap(&self) -> &Value {
        &self.objects[0]
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

    /// The request as the API server hands it to the policy, or `None` when the policy's
    /// `resourceRules` do not name its resource and scope (it is never sent to the policy).
    fn case(&self, label: &str, r: &Request) -> Option<Case> {
        let (group, version, kind) = r.kind;
        let plural = match self.kinds.find(group, version, kind) {
            Some(row) => row.plural.clone(),
            None => format!("{}s", kind.to_lowercase()),
        };
        let resource = match r.sub_resource {
            "" => plural.clone(),
            sub => format!("{plural}/{sub}"),
        };
        let names = |rule: &Value, key: &str, want: &str| {
            rule[key]
                .as_array()
                .is_some_and(|l| l.iter().any(|v| v == want || v == "*"))
        };
        let in_scope = |rule: &Value| match rule["scope"].as_str() {
            Some("Namespaced") => r.namespace.is_some(),
            Some("Cluster") => r.namespace.is_none(),
            _ => true,
        };
        let matched = self.objects[0]["spec"]["matchConstraints"]["resourceRules"]
            .as_array()
            .unwrap()
            .iter()
            .any(|rule| {
                names(rule, "apiGroups", group)
                    && names(rule, "apiVersions", version)
                    && names(rule, "operations", r.operation)
                    && names(rule, "resources", &resource)
                    && in_scope(rule)
            });
        if !matched {
            return None;
        }
        // The API server sets the request's namespace in the object (and none in a
        // cluster-scoped one), and names an object created with `generateName` before
        // validation.
        let mut object = r.object.clone();
        let mut name = object["metadata"]["name"].as_str().map(String::from);
        if name.is_none()
            && let Some(prefix) = object["metadata"]["generateName"].as_str()
        {
            let generated = format!("{prefix}x7k2p");
            object["metadata"]["name"] = json!(generated);
            name = Some(generated);
        }
        let place = |o: &mut Value| {
            if let Some(meta) = o.get_mut("metadata").and_then(Value::as_object_mut) {
                match r.namespace {
                    Some(ns) => meta.insert("namespace".into(), json!(ns)),
                    None => meta.remove("namespace"),
                };
            }
        };
        place(&mut object);
        let mut old_object = r.old_object.cloned().unwrap_or(Value::Null);
        place(&mut old_object);
        let request = AdmissionRequest {
            group: group.into(),
            version: version.into(),
            kind: kind.into(),
            resource: plural,
            sub_resource: Some(r.sub_resource.to_string()),
            name,
            namespace: r.namespace.map(String::from),
            operation: r.operation.into(),
            user: UserInfo {
                username: r.username.into(),
                groups: vec!["system:authenticated".into()],
                ..UserInfo::default()
            },
        };
        Some(Case {
            name: label.to_string(),
            object,
            old_object,
            request: request.to_json(),
            namespace_object: match r.namespace {
                Some(ns) => namespace_object(ns, r.namespace_labels),
                None => Value::Null,
            },
        })
    }
}

/// What the policy decided, when it did not fail to evaluate.
#[derive(Debug, PartialEq)]
enum Verdict {
    /// Not sent to the policy (its resource rules), or a match condition left the request out.
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
    /// `ephemeralcontainers`, or empty on the main resource (no `subResource` key).
    sub_resource: &'a str,
    kind: (&'a str, &'a str, &'a str),
    operation: &'a str,
    /// `None` for a cluster-scoped object (no `namespace` key, `namespaceObject` null).
    namespace: Option<&'a str>,
    namespace_labels: &'a BTreeMap<String, String>,
    username: &'a str,
}

impl<'a> Request<'a> {
    /// A CREATE by a deployer: in the object's namespace, else `team-a`, unless the kind is
    /// cluster-scoped in the workload-kind table.
    fn create(object: &'a Value, labels: &'a BTreeMap<String, String>) -> Self {
        let api_version = object["apiVersion"].as_str().unwrap_or("v1");
        let kind = object["kind"].as_str().unwrap_or("");
        let cluster_scoped = WorkloadKinds::defaults()
            .find_api_version(api_version, kind)
            .is_some_and(|row| row.scope == Scope::Cluster);
        let (group, version) = kinds::split_api_version(api_version);
        Request {
            object,
            old_object: None,
            sub_resource: "",
            kind: (group, version, kind),
            operation: "CREATE",
            namespace: if cluster_scoped {
                None
            } else {
                Some(object["metadata"]["namespace"].as_str().unwrap_or("team-a"))
            },
            namespace_labels: labels,
            username: "system:serviceaccount:team-a:deployer",
        }
    }

    /// An UPDATE of `old` into `object`.
    fn update(object: &'a Value, old: &'a Value, labels: &'a BTreeMap<String, String>) -> Self {
        Request {
            operation: "UPDATE",
            old_object: Some(old),
            ..Request::create(object, labels)
        }
    }
}

/// What a check says of a verdict: its failures, none when it holds.
type Judge<'a> = Box<dyn FnOnce(&Verdict) -> Vec<String> + 'a>;

struct Check<'a> {
    label: String,
    /// `None`: the policy's resource rules leave the request out.
    case: Option<Case>,
    judge: Judge<'a>,
}

/// Requests to evaluate, each with its judge; [`Checks::run`] evaluates every request of a
/// policy in one run of each API server version.
#[derive(Default)]
struct Checks<'a> {
    groups: Vec<(&'a Policy, Vec<Check<'a>>)>,
}

impl<'a> Checks<'a> {
    fn add(
        &mut self,
        policy: &'a Policy,
        label: impl Into<String>,
        r: &Request,
        judge: impl FnOnce(&Verdict) -> Vec<String> + 'a,
    ) {
        let label = label.into();
        let case = policy.case(&label, r);
        let check = Check {
            label,
            case,
            judge: Box::new(judge),
        };
        match self
            .groups
            .iter_mut()
            .find(|(p, _)| std::ptr::eq(*p, policy))
        {
            Some((_, checks)) => checks.push(check),
            None => self.groups.push((policy, vec![check])),
        }
    }

    /// [`add`](Self::add) with what the verdict must be.
    fn expect(
        &mut self,
        policy: &'a Policy,
        label: impl Into<String>,
        r: &Request,
        holds: impl FnOnce(&Verdict) -> bool + 'a,
    ) {
        let label = label.into();
        let what = label.clone();
        self.add(policy, label, r, move |got| {
            if holds(got) {
                Vec::new()
            } else {
                vec![format!("{what}: the backstop {got:?}")]
            }
        });
    }

    fn len(&self) -> usize {
        self.groups.iter().map(|(_, c)| c.len()).sum()
    }

    /// Evaluates every request (the policies side by side, within the binaries' limit of
    /// processes) and judges each; the failures.
    fn run(self) -> Vec<String> {
        if kube_apiserver_cel::tools_dir().is_none() {
            return Vec::new();
        }
        let mut groups = self.groups;
        let batches: Vec<(&Policy, Vec<Case>)> = groups
            .iter_mut()
            .map(|(policy, checks)| {
                let cases = checks.iter_mut().filter_map(|c| c.case.clone()).collect();
                (*policy, cases)
            })
            .collect();
        let outcomes: Vec<Vec<kube_apiserver_cel::Outcome>> = std::thread::scope(|scope| {
            let handles: Vec<_> = batches
                .iter()
                .map(|(policy, cases)| {
                    scope.spawn(move || {
                        if cases.is_empty() {
                            Vec::new()
                        } else {
                            kube_apiserver_cel::evaluate(policy.vap(), cases).outcomes
                        }
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .collect()
        });
        let mut failures = Vec::new();
        let (mut judged, mut evaluated) = (0, 0);
        for ((_, checks), outcomes) in groups.into_iter().zip(outcomes) {
            let mut outcomes = outcomes.into_iter();
            for check in checks {
                judged += 1;
                let verdict = match &check.case {
                    None => Verdict::NotMatched,
                    Some(case) => {
                        evaluated += 1;
                        let outcome = outcomes.next().expect("an outcome per case");
                        match outcome.agreed() {
                            Err(problem) => {
                                failures.push(format!("{}: {problem}", check.label));
                                continue;
                            }
                            Ok(Decision::Error(error)) => {
                                failures.push(format!(
                                    "{}: the policy errors (a denial under failurePolicy Fail): \
                                     {error}\n  object: {:.2000}",
                                    check.label,
                                    case.object.to_string()
                                ));
                                continue;
                            }
                            Ok(Decision::NotMatched) => Verdict::NotMatched,
                            Ok(Decision::Admit) => Verdict::Admit,
                            Ok(d @ Decision::Deny(_)) => {
                                Verdict::Deny(d.messages().into_iter().map(String::from).collect())
                            }
                        }
                    }
                };
                failures.extend((check.judge)(&verdict));
            }
            assert!(outcomes.next().is_none(), "more outcomes than cases");
        }
        println!("{judged} checks, {evaluated} requests evaluated by kube-apiserver's CEL");
        failures
    }
}

/// Fails with the count and the first failures.
fn assert_no_failures(failures: &[String]) {
    const SHOWN: usize = 15;
    assert!(
        failures.is_empty(),
        "{} failures{}:\n{}",
        failures.len(),
        if failures.len() > SHOWN {
            format!(" (the first {SHOWN})")
        } else {
            String::new()
        },
        failures
            .iter()
            .take(SHOWN)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n\n")
    );
}

// ---------------------------------------------------------------------------------------------
// The webhook side
// ---------------------------------------------------------------------------------------------

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
/// pod's, the prep container aside (the test's own reading of docs/policy.md §6).
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

/// Compares the backstop with the webhooks on one object, in an `enforce` namespace: the
/// webhooks answer now, the backstop's verdicts are judged when `checks` runs.
fn differential<'a>(
    label: &str,
    object: &Value,
    hooks: &Webhooks,
    policy: &'a Policy,
    seen: &mut Coverage,
    checks: &mut Checks<'a>,
) {
    let Some(kind) = WorkloadKind::of_api_version(
        object["apiVersion"].as_str().unwrap_or_default(),
        object["kind"].as_str().unwrap_or_default(),
    ) else {
        return;
    };
    let review = create_review("uid", object, "team-a");
    let mutate = hooks.call(Webhook::Mutate, &review);
    let validate = hooks.call(Webhook::Validate, &review);
    if mutate.http != 200 {
        return;
    }
    let labels = enforce_labels();
    let context = format!(
        "  /mutate: {} {}\n  /validate: {} {}\n  object: {object}",
        mutate.allowed,
        Value::Array(mutate.patch().to_vec()),
        validate.allowed,
        validate.message
    );
    let fail = {
        let (label, context) = (label.to_string(), context.clone());
        move |what: String, got: &Verdict| {
            format!("{label}: {what}\n{context}\n  backstop: {got:?}")
        }
    };

    // What /validate denies for a security field, the backstop denies naming that field.
    let fields: Vec<String> = denied_fields(&validate.message)
        .into_iter()
        .filter(|f| is_security_field(f))
        .collect();
    let denied_fields = if !validate.allowed && !fields.is_empty() {
        seen.denied_for_a_security_field += 1;
        fields
    } else {
        Vec::new()
    };
    let names_the_fields = move |got: &Verdict| -> Vec<String> {
        if denied_fields.is_empty() {
            return Vec::new();
        }
        let message = got.message();
        match got {
            Verdict::Deny(_) => {
                let mut out: Vec<String> = denied_fields
                    .iter()
                    .filter(|f| !message.contains(&format!("{f}: ")))
                    .map(|f| format!("the backstop does not name {f}: {message}"))
                    .collect();
                if !message.contains(backstop::MESSAGE_SUFFIX) {
                    out.push("the message does not say the backstop answered".into());
                }
                out
            }
            _ => vec![format!(
                "/validate denies {denied_fields:?}, the backstop admits"
            )],
        }
    };

    let validate_allowed = validate.allowed;
    if kind.is_controller() {
        seen.templates += 1;
        // Templates: the ranges only, exactly where the webhook denies them.
        let fail = fail.clone();
        checks.add(
            policy,
            label,
            &Request::create(object, &labels),
            move |got| {
                let mut out = names_the_fields(got);
                if validate_allowed && *got != Verdict::Admit {
                    out.push("/validate admits the template, the backstop does not".into());
                }
                out.into_iter().map(|w| fail(w, got)).collect()
            },
        );
        return;
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
    {
        let fail = fail.clone();
        checks.add(
            policy,
            label,
            &Request::create(object, &labels),
            move |got| {
                let mut out = names_the_fields(got);
                let denied = matches!(got, Verdict::Deny(_));
                if makes_non_root && !denied {
                    out.push("/mutate makes it non-root, the backstop admits it unmutated".into());
                }
                // What the backstop denies unmutated, the webhooks would have changed or
                // denied.
                if denied && !makes_non_root && validate_allowed {
                    out.push("the backstop denies a pod the webhooks leave as it is".into());
                }
                out.into_iter().map(|w| fail(w, got)).collect()
            },
        );
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
                let fail = fail.clone();
                let shown = o.to_string();
                checks.add(
                    policy,
                    format!("{label} ({what})"),
                    &Request::create(&o, &labels),
                    move |got| {
                        if matches!(got, Verdict::Deny(_)) {
                            vec![fail(
                                format!("the backstop refuses it {what}\n  patched: {shown}"),
                                got,
                            )]
                        } else {
                            Vec::new()
                        }
                    },
                );
            }
        }
    }
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

// ---------------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------------

/// kube-apiserver compiles every expression of the policy (matchConditions, variables,
/// validations and their messages) with no error, for every configuration, in every version:
/// as when the policy is created and as when the stored policy is loaded.
#[test]
fn every_expression_compiles_with_kube_cel() {
    if kube_apiserver_cel::tools_dir().is_none() {
        return;
    }
    let mut sel = selection();
    sel.exclude_priority_classes = vec!["system-node-critical".into()];
    let policies: Vec<(&str, Value)> = configs()
        .into_iter()
        .map(|(name, mut cfg)| {
            cfg.prep_host_paths = vec!["/data/models".into(), "/".into()];
            let [vap, _] = backstop::objects(&cfg, &sel)
                .unwrap_or_else(|e| panic!("{name}: the backstop is not rendered: {e}"));
            (name, vap)
        })
        .collect();
    for (_, vap) in &policies {
        // Settings live in variables of their own; no other expression changes with them.
        assert_eq!(vap["spec"]["paramKind"], Value::Null);
        assert_eq!(vap["spec"]["failurePolicy"], "Fail");
    }
    // Compiled side by side (the evaluator runs two processes at a time); a compile error
    // fails the test naming the version and the expression.
    std::thread::scope(|scope| {
        let handles: Vec<_> = policies
            .iter()
            .map(|(name, vap)| {
                scope.spawn(move || (name, kube_apiserver_cel::evaluate(vap, &[]).compiles))
            })
            .collect();
        for h in handles {
            let (name, compiles) = h.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
            for c in compiles {
                println!(
                    "{name}: kube-apiserver {} compiles the policy in {:.2?} as created, {:.2?} as stored",
                    c.version, c.create_time, c.runtime
                );
            }
        }
    });
}

/// The generated cache hits are hits, pinned to every node that has the model: the
/// differential below judges the patched pods a hit makes, not misses.
#[test]
fn the_generated_cache_hits_are_routed() {
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

/// The differential over the corpus and the generated pods, in every configuration, with
/// `request` bound as the API server binds it (a Pod or Job CREATE has no `subResource`).
#[test]
fn the_corpus_and_generated_pods_agree_with_the_webhooks() {
    let corpus = corpus_objects(cli::corpus_dir());
    let mut generated = generated_pods();
    generated.extend(cache_hit_pods());
    let configs = configs();
    let policies: Vec<Policy> = configs
        .iter()
        .map(|(_, cfg)| Policy::new(cfg, &selection()))
        .collect();
    let mut checks = Checks::default();
    let mut judged = 0;
    let mut seen = Coverage::default();
    for ((name, cfg), policy) in configs.iter().zip(&policies) {
        let hooks = Webhooks::new(cfg.clone());
        for (label, object) in corpus.iter().chain(generated.iter()) {
            differential(
                &format!("[{name}] {label}"),
                object,
                &hooks,
                policy,
                &mut seen,
                &mut checks,
            );
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
    assert!(checks.len() > 300, "only {} checks", checks.len());
    println!("{judged} objects judged: {seen:?}");
    assert_no_failures(&checks.run());
}

/// The pod `/mutate` gives a prep container, after the API server's plugins (the token mount)
/// and the defaulting of the prep's fields: the canonical prep at `initContainers[0]`, then the
/// pod's own init container `fetch`.
fn pod_with_canonical_prep(cfg: &PolicyConfig) -> Value {
    let hooks = Webhooks::new(cfg.clone());
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "team-a"},
        "spec": {"volumes": [{"name": "model-cache", "persistentVolumeClaim": {"claimName": "m"}}],
                 "initContainers": [{"name": "fetch", "image": "busybox", "securityContext": {"runAsNonRoot": true}}],
                 "containers": [{"name": "c", "image": "busybox"}]}});
    let mutate = hooks.call(Webhook::Mutate, &create_review("u", &pod, "team-a"));
    let mut defaulted = with_token_mount(&mutate.patched(&pod));
    assert_eq!(
        defaulted["spec"]["initContainers"][0]["name"],
        "model-cache-prep"
    );
    defaulted["spec"]["initContainers"][0]["imagePullPolicy"] = json!("IfNotPresent");
    defaulted["spec"]["initContainers"][0]["terminationMessagePath"] =
        json!("/dev/termination-log");
    defaulted["spec"]["initContainers"][0]["terminationMessagePolicy"] = json!("File");
    defaulted
}

/// What the backstop says of a forged or second prep container: it runs as root.
fn denies_a_root_prep(got: &Verdict) -> bool {
    let message = got.message();
    message.contains("runAsNonRoot: false is not allowed")
        || message.contains("runAsUser: 0 is outside")
}

/// The canonical prep after the API server's plugins is admitted; any forgery is refused.
/// The rule: exactly one init container may be the canonical prep, at any index of
/// `initContainers` (other webhooks may put theirs first); a second one, by another name or
/// the same, is judged as any container and denied.
#[test]
fn forged_prep_containers_are_denied() {
    let cfg = configs()[0].1.clone();
    let policy = Policy::new(&cfg, &selection());
    let never = Policy::new(
        &PolicyConfig {
            model_cache_prep: PrepMode::Never,
            ..cfg.clone()
        },
        &selection(),
    );
    let hosted = Policy::new(
        &PolicyConfig {
            prep_host_paths: vec!["/data/./models/".into()],
            ..cfg.clone()
        },
        &selection(),
    );
    let defaulted = pod_with_canonical_prep(&cfg);
    let prep = defaulted["spec"]["initContainers"][0].clone();
    let labels = enforce_labels();
    let mut checks = Checks::default();
    checks.expect(
        &policy,
        "the canonical prep",
        &Request::create(&defaulted, &labels),
        |got| *got == Verdict::Admit,
    );

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
            "a duplicate",
            forge(&|o| {
                o["spec"]["initContainers"]
                    .as_array_mut()
                    .unwrap()
                    .push(prep.clone());
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
    ];
    for (what, o) in &forgeries {
        checks.expect(
            &policy,
            *what,
            &Request::create(o, &labels),
            denies_a_root_prep,
        );
    }
    checks.expect(
        &never,
        "with prep never",
        &Request::create(&defaulted, &labels),
        denies_a_root_prep,
    );
    // The canonical prep after the pod's own init container: admitted (any index).
    let not_first = forge(&|o| {
        o["spec"]["initContainers"]
            .as_array_mut()
            .unwrap()
            .swap(0, 1)
    });
    checks.expect(
        &policy,
        "not first",
        &Request::create(&not_first, &labels),
        |got| *got == Verdict::Admit,
    );
    // In a namespace that enforces Pod Security restricted modelgate injects none.
    let restricted = BTreeMap::from([
        ("modelgate.io/inject".to_string(), "enabled".to_string()),
        (
            "pod-security.kubernetes.io/enforce".to_string(),
            "restricted".to_string(),
        ),
    ]);
    checks.expect(
        &policy,
        "in a restricted namespace",
        &Request::create(&defaulted, &restricted),
        |got| matches!(got, Verdict::Deny(_)),
    );

    // A host path under --prep-host-path is the prep's to fix, by whole components only.
    let on_host_paths: Vec<(&str, bool, Value)> = [
        ("/data/models", true),
        ("/data//models/./llama", true),
        ("/data/models-evil", false),
        ("/data", false),
        ("/data/models/../../etc", false),
    ]
    .into_iter()
    .map(|(path, allowed)| {
        let mut o = defaulted.clone();
        o["spec"]["volumes"][0] = json!({"name": "model-cache", "hostPath": {"path": path}});
        (path, allowed, o)
    })
    .collect();
    for (path, allowed, o) in &on_host_paths {
        let allowed = *allowed;
        checks.expect(
            &hosted,
            format!("on the host path {path}"),
            &Request::create(o, &labels),
            move |got| (*got == Verdict::Admit) == allowed,
        );
    }
    assert_no_failures(&checks.run());
}

/// Other webhooks' init containers may come before the prep (Istio's `istio-validation`,
/// Vault's `vault-agent-init`, inserted at index 0 after modelgate's patch): the canonical prep
/// is admitted wherever it is, and a second prep container is still denied.
#[test]
fn init_containers_of_other_webhooks_may_come_first() {
    let cfg = configs()[0].1.clone();
    let policy = Policy::new(&cfg, &selection());
    let defaulted = pod_with_canonical_prep(&cfg);
    let prep = defaulted["spec"]["initContainers"][0].clone();
    let istio = json!({"name": "istio-validation", "image": "docker.io/istio/proxyv2:1.24.0",
        "args": ["istio-iptables", "--run-validation", "--skip-rule-apply"],
        "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]},
            "privileged": false, "readOnlyRootFilesystem": true, "runAsGroup": 1337,
            "runAsNonRoot": true, "runAsUser": 1337}});
    let vault = json!({"name": "vault-agent-init", "image": "hashicorp/vault:1.18.0",
        "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]},
            "readOnlyRootFilesystem": true, "runAsGroup": 1000, "runAsNonRoot": true,
            "runAsUser": 100},
        "volumeMounts": [{"name": "home-init", "mountPath": "/home/vault"}]});
    let ahead = |first: &[&Value], more: &[Value]| {
        let mut o = defaulted.clone();
        let init = o["spec"]["initContainers"].as_array_mut().unwrap();
        for (i, c) in first.iter().enumerate() {
            init.insert(i, (*c).clone());
        }
        init.extend(more.iter().cloned());
        o
    };
    let mut second = prep.clone();
    second["name"] = json!("model-cache-prep-2");
    let admitted = [
        ("Istio's first", ahead(&[&istio], &[])),
        ("Vault's first", ahead(&[&vault], &[])),
        ("Istio's and Vault's first", ahead(&[&istio, &vault], &[])),
        ("Vault's and Istio's first", ahead(&[&vault, &istio], &[])),
    ];
    let denied = [
        (
            "Istio's and Vault's first, and a second prep by another name",
            ahead(&[&istio, &vault], &[second]),
        ),
        (
            "Istio's and Vault's first, and the prep twice",
            ahead(&[&istio, &vault], std::slice::from_ref(&prep)),
        ),
        (
            "Istio's first, then a copy of the prep by another name, then the prep",
            {
                let mut copy = prep.clone();
                copy["name"] = json!("prep");
                ahead(&[&istio, &copy], &[])
            },
        ),
    ];
    let labels = enforce_labels();
    let mut checks = Checks::default();
    for (what, o) in &admitted {
        checks.expect(&policy, *what, &Request::create(o, &labels), |got| {
            *got == Verdict::Admit
        });
    }
    for (what, o) in &denied {
        checks.expect(
            &policy,
            *what,
            &Request::create(o, &labels),
            denies_a_root_prep,
        );
    }
    assert_no_failures(&checks.run());
}

/// Only opted-in namespaces in enforce are bound: by label, by an unknown label value, or by
/// --default-mode enforce; warn, audit, off, not opted in and exempt ones are not.
#[test]
fn only_enforce_namespaces_are_bound() {
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
    let cfg = configs()[0].1.clone();
    let mut sel = selection();
    sel.exclude_priority_classes = vec!["system-node-critical".into()];
    let policy = Policy::new(&cfg, &sel);
    let labels = enforce_labels();
    let mut checks = Checks::default();
    let denied = |got: &Verdict| matches!(got, Verdict::Deny(_));
    let not_matched = |got: &Verdict| *got == Verdict::NotMatched;
    let root = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "image": "i", "securityContext": {"runAsUser": 0}}]}});
    checks.expect(&policy, "root", &Request::create(&root, &labels), denied);
    let mut mirror = root.clone();
    mirror["metadata"]["annotations"] = json!({"kubernetes.io/config.mirror": "x"});
    checks.expect(
        &policy,
        "a mirror pod",
        &Request::create(&mirror, &labels),
        not_matched,
    );
    let mut own = Request::create(&root, &labels);
    own.username = "system:serviceaccount:modelgate:modelgate";
    checks.expect(&policy, "modelgate's own account", &own, not_matched);
    let mut exempt = Request::create(&root, &labels);
    exempt.namespace = Some("kube-system");
    checks.expect(&policy, "an exempt namespace", &exempt, not_matched);
    let mut critical = root.clone();
    critical["spec"]["priorityClassName"] = json!("system-node-critical");
    checks.expect(
        &policy,
        "an excluded priority class",
        &Request::create(&critical, &labels),
        not_matched,
    );
    // A scale of a Deployment leaves its template as it was: not judged; a changed one is.
    let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
        "spec": {"replicas": 3, "template": {"spec": root["spec"].clone()}}});
    let mut scaled = deployment.clone();
    scaled["spec"]["replicas"] = json!(1);
    checks.expect(
        &policy,
        "a scaled Deployment",
        &Request::update(&scaled, &deployment, &labels),
        not_matched,
    );
    let fixed = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
        "spec": {"replicas": 3, "template": {"spec": {"containers": [{"name": "c", "image": "i"}]}}}});
    checks.expect(
        &policy,
        "a Deployment template changed to root",
        &Request::update(&deployment, &fixed, &labels),
        denied,
    );
    // An ephemeral container added to a running pod: only the ephemeral containers the stored
    // pod lacks are judged; the other containers are not (they are immutable and already run),
    // as by the webhook's /validate (`kubectl_debug_on_an_old_pod_…` below has more).
    // A pod that predates the policy: its container has no runAsNonRoot, and no bad uid.
    let old_pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "old"},
        "spec": {"containers": [{"name": "c", "image": "i"}]}});
    let mut running = old_pod.clone();
    running["spec"]["ephemeralContainers"] =
        json!([{"name": "debug", "image": "busybox", "securityContext": {"runAsNonRoot": false}}]);
    let mut ephemeral = Request::update(&running, &old_pod, &labels);
    ephemeral.sub_resource = "ephemeralcontainers";
    checks.add(&policy, "a root debug container", &ephemeral, |got| {
        let mut out = Vec::new();
        if !got.message().contains(
            "spec.ephemeralContainers[0].securityContext.runAsNonRoot: false is not allowed",
        ) {
            out.push(format!("a root debug container: {got:?}"));
        }
        if got.message().contains("spec.containers[0]") {
            out.push(format!("the running containers judged again: {got:?}"));
        }
        out
    });
    let mut fixed_debug = running.clone();
    fixed_debug["spec"]["ephemeralContainers"][0]["securityContext"] =
        json!({"runAsNonRoot": true});
    let mut ephemeral = Request::update(&fixed_debug, &old_pod, &labels);
    ephemeral.sub_resource = "ephemeralcontainers";
    checks.expect(
        &policy,
        "kubectl debug on a pod that predates the policy",
        &ephemeral,
        move |got| !denied(got),
    );
    assert_no_failures(&checks.run());
}

/// The custom resources of §12 (`tests/fixtures/ml-kinds`, every default kind of the table):
/// the backstop judges only the ranges of complete templates, and names each finding by the
/// template's own path as the webhook does. Each object as it is, then with `runAsUser: 0` in
/// the first container of every template: the backstop denies exactly the range fields that the
/// webhook's `/validate` denies (a partial template: never, the webhook only warns), naming
/// each, except that of a list (of templates, of containers) it names the first element with
/// findings and counts the others; an UPDATE that changes no template is not judged (never
/// denied), one that changes a template is. A cluster-scoped kind's requests have no
/// namespace.
#[test]
fn ml_custom_resources_agree_with_the_webhook() {
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
    // Every object judged, with its variants, before the checks (which borrow them) are made.
    let mut objects = Vec::new();
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap();
        for doc in read_documents(&path.display().to_string(), &text).unwrap() {
            let object = doc.value;
            let api_version = object["apiVersion"].as_str().unwrap();
            let kind = object["kind"].as_str().unwrap();
            let row = cfg
                .workload_kinds
                .find_api_version(api_version, kind)
                .unwrap_or_else(|| panic!("{api_version} {kind}: not in the table"))
                .clone();
            let label = format!("{} {kind} {}", path.display(), object["metadata"]["name"]);
            // As it is, and with root in the first container of every template.
            let mut rooted = object.clone();
            let text = serde_json::to_string(&object).unwrap();
            for t in admission::templates_of(&row, &text).unwrap() {
                let spec = match t.shape {
                    kinds::Shape::PodTemplateSpec => format!("{}/spec", t.pointer),
                    kinds::Shape::PodSpec => t.pointer.clone(),
                };
                if let Some(c) = rooted.pointer_mut(&format!("{spec}/containers/0")) {
                    c["securityContext"]["runAsUser"] = json!(0);
                }
            }
            let relabel = |o: &Value| {
                let mut relabelled = o.clone();
                relabelled["metadata"]["labels"]["touched"] = json!("yes");
                relabelled
            };
            let relabelled = [relabel(&object), relabel(&rooted)];
            objects.push((label, row, object, rooted, relabelled));
        }
    }
    let mut checks = Checks::default();
    let (mut judged, mut denied_by_both) = (0, 0);
    for (label, row, object, rooted, relabelled) in &objects {
        for ((variant, o), relabelled) in [("as is", object), ("rooted", rooted)]
            .into_iter()
            .zip(relabelled)
        {
            judged += 1;
            let validated = hooks.call(Webhook::Validate, &create_review("uid", o, "team-a"));
            let mut want = range_fields(if validated.allowed {
                Vec::new()
            } else {
                denied_fields(&validated.message)
            });
            // A partial template's findings are warnings: the backstop never denies them.
            let partial = row.is_partial();
            if partial {
                want.clear();
            }
            if !want.is_empty() {
                denied_by_both += 1;
            }
            let webhook_message = validated.message.clone();
            let what = format!("{label} ({variant})");
            let expected = want.clone();
            checks.add(
                &policy,
                what.clone(),
                &Request::create(o, &labels),
                move |got| {
                    let mut out = Vec::new();
                    let problems = match got {
                        Verdict::Deny(messages) => {
                            let named: Vec<String> =
                                messages.iter().flat_map(|m| denied_fields(m)).collect();
                            let summaries: Vec<(String, usize)> =
                                messages.iter().flat_map(|m| counted_lists(m)).collect();
                            same_findings(&expected, &range_fields(named), &summaries)
                        }
                        _ if expected.is_empty() => Vec::new(),
                        _ => vec!["the backstop does not deny".to_string()],
                    };
                    if !problems.is_empty() {
                        out.push(format!(
                            "{what}: {}\n  the backstop {got:?}\n  the webhook: {webhook_message}",
                            problems.join("; ")
                        ));
                    }
                    if partial && *got != Verdict::NotMatched {
                        out.push(format!("{what}: a partial kind is not matched: {got:?}"));
                    }
                    out
                },
            );
            if partial {
                continue;
            }
            // An UPDATE that leaves the templates as they were is not judged (never denied,
            // even with root in a template); one that changes a template is.
            checks.expect(
                &policy,
                format!("{label} ({variant}): an UPDATE of the labels only"),
                &Request::update(relabelled, o, &labels),
                |got| !matches!(got, Verdict::Deny(_)),
            );
            if variant == "rooted" && !want.is_empty() && rooted != object {
                checks.expect(
                    &policy,
                    format!("{label}: an UPDATE that puts root in a template"),
                    &Request::update(rooted, object, &labels),
                    |got| matches!(got, Verdict::Deny(_)),
                );
            }
        }
    }
    eprintln!("{judged} judged, {denied_by_both} denied by both");
    assert!(
        judged >= 40 && denied_by_both >= 20,
        "{judged} judged, {denied_by_both} denied"
    );
    assert_no_failures(&checks.run());
}

/// The lists whose other elements a backstop message counts instead of naming them
/// (`<list>: <n> more …`), with the count.
fn counted_lists(message: &str) -> Vec<(String, usize)> {
    let list = message.split(". ").next().unwrap_or_default();
    list.split("; ")
        .filter_map(|entry| entry.split_once(": "))
        .filter_map(|(path, problem)| {
            let (n, rest) = problem.split_once(' ')?;
            rest.starts_with("more ")
                .then(|| n.parse().ok().map(|n| (path.to_string(), n)))?
        })
        .collect()
}

/// How the backstop's range findings differ from the webhook's (`want`, all named): the
/// backstop names no field the webhook does not, and every field of the webhook, except that
/// under a list of templates or containers it names the first element with findings and
/// counts the others (`summaries`).
fn same_findings(want: &[String], named: &[String], summaries: &[(String, usize)]) -> Vec<String> {
    let mut out = Vec::new();
    for f in named {
        if !want.contains(f) {
            out.push(format!("names {f}, which the webhook does not deny"));
        }
    }
    for f in want {
        let counted = summaries
            .iter()
            .any(|(list, _)| f.starts_with(&format!("{list}[")));
        if !named.contains(f) && !counted {
            out.push(format!("neither names nor counts {f}"));
        }
    }
    for (list, n) in summaries {
        let mut elements: Vec<&str> = want
            .iter()
            .filter_map(|f| f.strip_prefix(&format!("{list}[")))
            .filter_map(|rest| rest.split_once(']').map(|(index, _)| index))
            .collect();
        elements.sort();
        elements.dedup();
        if elements.len() != n + 1 {
            out.push(format!(
                "counts {n} more under {list}, the webhook denies {} elements of it",
                elements.len()
            ));
        }
    }
    out
}

/// `request` as the API server binds it: the keys of an empty `omitempty` field are absent.
#[test]
fn requests_are_bound_as_the_api_server_binds_them() {
    let policy = Policy::new(&PolicyConfig::default(), &selection());
    let labels = enforce_labels();
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "llama-server"},
        "spec": {"containers": [{"name": "c", "image": "i"}]}});
    let case = policy.case("pod", &Request::create(&pod, &labels)).unwrap();
    assert_eq!(
        case.request,
        json!({"uid": "", "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "name": "llama-server", "namespace": "team-a", "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:team-a:deployer",
                "groups": ["system:authenticated"]},
            "object": null, "oldObject": null, "dryRun": false, "options": null})
    );
    assert_eq!(case.object["metadata"]["namespace"], "team-a");
    assert_eq!(
        case.namespace_object,
        json!({"metadata": {"name": "team-a", "labels": {
            "kubernetes.io/metadata.name": "team-a", "modelgate.io/inject": "enabled"}}})
    );
    let mut debug = Request::update(&pod, &pod, &labels);
    debug.sub_resource = "ephemeralcontainers";
    let case = policy.case("debug", &debug).unwrap();
    assert_eq!(case.request["subResource"], "ephemeralcontainers");
    assert_eq!(case.request["requestSubResource"], "ephemeralcontainers");
    assert_eq!(case.request["resource"]["resource"], "pods");
    let runtime = cluster_training_runtime(json!({"runAsNonRoot": true}));
    let case = policy
        .case("runtime", &Request::create(&runtime, &labels))
        .unwrap();
    let request = case.request.as_object().unwrap();
    assert!(!request.contains_key("namespace"), "{request:?}");
    assert!(!request.contains_key("subResource"), "{request:?}");
    assert_eq!(request["resource"]["resource"], "clustertrainingruntimes");
    assert_eq!(case.namespace_object, Value::Null);
}

/// Kubeflow Trainer's ClusterTrainingRuntime (scope Cluster in the workload-kind table), its
/// one template's first container with this securityContext.
fn cluster_training_runtime(security_context: Value) -> Value {
    json!({"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime",
        "metadata": {"name": "torch-distributed"},
        "spec": {"mlPolicy": {"numNodes": 1, "torch": {"numProcPerNode": "auto"}},
            "template": {"spec": {"replicatedJobs": [{"name": "node", "template": {"spec": {"template": {"spec": {
                "containers": [{"name": "node", "image": "pytorch/pytorch:2.7.1-cuda12.8-cudnn9-runtime",
                    "securityContext": security_context}]}}}}}]}}}})
}

/// A cluster-scoped kind of the workload-kind table is decided on CREATE and UPDATE, with no
/// `namespace` in the request and `namespaceObject` null: a compliant template admitted, an
/// out-of-range `runAsUser` denied naming the field.
#[test]
fn cluster_scoped_kinds_are_decided() {
    let policy = Policy::new(&configs()[0].1, &selection());
    let labels = enforce_labels();
    let field = "spec.template.spec.replicatedJobs[0].template.spec.template.spec.containers[0].securityContext.runAsUser";
    let compliant = cluster_training_runtime(json!({"runAsNonRoot": true, "runAsUser": 1000}));
    let other = cluster_training_runtime(json!({"runAsNonRoot": true, "runAsUser": 2000}));
    let rooted = cluster_training_runtime(json!({"runAsUser": 0}));
    let mut relabelled = rooted.clone();
    relabelled["metadata"]["labels"] = json!({"team": "b"});
    let admitted = |got: &Verdict| *got == Verdict::Admit;
    let names_the_field = |got: &Verdict| {
        matches!(got, Verdict::Deny(_))
            && got
                .message()
                .contains(&format!("{field}: 0 is outside 1..2147483647"))
    };
    let mut checks = Checks::default();
    checks.expect(
        &policy,
        "CREATE compliant",
        &Request::create(&compliant, &labels),
        admitted,
    );
    checks.expect(
        &policy,
        "CREATE with runAsUser 0",
        &Request::create(&rooted, &labels),
        names_the_field,
    );
    checks.expect(
        &policy,
        "UPDATE to another compliant template",
        &Request::update(&compliant, &other, &labels),
        admitted,
    );
    checks.expect(
        &policy,
        "UPDATE to runAsUser 0",
        &Request::update(&rooted, &compliant, &labels),
        names_the_field,
    );
    checks.expect(
        &policy,
        "UPDATE of the labels only (not judged)",
        &Request::update(&relabelled, &rooted, &labels),
        |got| !matches!(got, Verdict::Deny(_)),
    );
    let n = checks.len();
    assert_no_failures(&checks.run());
    assert_eq!(n, 5);
}

/// Large pods under strict cost: denied by a validation that names the first violation of each
/// list, never an evaluation error (a cost limit) nor a message the API server drops (over
/// 5 KiB); a compliant one of the same size admitted.
#[test]
fn large_pods_are_decided_within_the_cost_limits() {
    let policy = Policy::new(&configs()[0].1, &selection());
    let labels = enforce_labels();
    let names = |fields: &'static [&'static str]| {
        move |got: &Verdict| {
            matches!(got, Verdict::Deny(_)) && fields.iter().all(|f| got.message().contains(f))
        }
    };
    type Holds = Box<dyn Fn(&Verdict) -> bool>;
    let cases: Vec<(&str, Value, Holds)> = vec![
        (
            "50 and 50 init containers of 100 env entries, none non-root",
            large_pod(50, 50, 100, &Value::Null),
            Box::new(names(&[
                "spec.initContainers[0].securityContext.runAsNonRoot",
                "spec.containers[0].securityContext.runAsNonRoot",
            ])),
        ),
        (
            "50 and 50 init containers of 100 env entries, none non-root, runAsUser 0",
            large_pod(50, 50, 100, &json!({"runAsUser": 0})),
            Box::new(names(&[
                "spec.initContainers[0].securityContext.runAsNonRoot",
                "spec.containers[0].securityContext.runAsNonRoot",
                "spec.initContainers[0].securityContext.runAsUser",
                "spec.containers[0].securityContext.runAsUser",
            ])),
        ),
        (
            "50 and 50 init containers of 100 env entries, compliant",
            large_pod(
                50,
                50,
                100,
                &json!({"runAsNonRoot": true, "runAsUser": 1000}),
            ),
            Box::new(|got: &Verdict| *got == Verdict::Admit),
        ),
        (
            "2000 containers, each runAsUser 0",
            large_pod(2000, 0, 0, &json!({"runAsUser": 0})),
            Box::new(names(&["spec.containers[0].securityContext.runAs"])),
        ),
    ];
    let mut checks = Checks::default();
    for (what, pod, holds) in &cases {
        checks.expect(&policy, *what, &Request::create(pod, &labels), holds);
    }
    assert_no_failures(&checks.run());
}

/// The most extra workload kinds the backstop supports
/// ([`backstop::MAX_EXTRA_WORKLOAD_KINDS`]), each a single complete template at
/// `spec.template`: the policy compiles with no error in every version, and the last kind is
/// judged.
#[test]
fn the_most_extra_workload_kinds_compile_and_are_judged() {
    let n = backstop::MAX_EXTRA_WORKLOAD_KINDS;
    assert!(n > 0);
    let rows: String = (0..n)
        .map(|i| {
            format!(
                "- group: example.com\n  versions: [v1]\n  kind: Custom{i}\n  plural: custom{i}s\n  \
                 templates: [{{path: spec.template}}]\n"
            )
        })
        .collect();
    let table = WorkloadKinds::defaults()
        .with_file(&rows, "extra kinds")
        .expect("the extra kinds");
    assert_eq!(
        table.entries().len(),
        WorkloadKinds::defaults().entries().len() + n
    );
    let cfg = PolicyConfig {
        workload_kinds: Arc::new(table),
        ..configs()[0].1.clone()
    };
    let policy = Policy::new(&cfg, &selection());
    let labels = enforce_labels();
    let custom = |i: usize, security_context: Value| {
        json!({"apiVersion": "example.com/v1", "kind": format!("Custom{i}"),
            "metadata": {"name": "x", "namespace": "team-a"},
            "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "i",
                "securityContext": security_context}]}}}})
    };
    let last_rooted = custom(n - 1, json!({"runAsUser": 0}));
    let last_compliant = custom(n - 1, json!({"runAsNonRoot": true, "runAsUser": 1000}));
    let first_rooted = custom(0, json!({"runAsUser": 0}));
    let field = "spec.template.spec.containers[0].securityContext.runAsUser: 0 is outside";
    let mut checks = Checks::default();
    checks.expect(
        &policy,
        format!("Custom{} with runAsUser 0", n - 1),
        &Request::create(&last_rooted, &labels),
        |got| matches!(got, Verdict::Deny(_)) && got.message().contains(field),
    );
    checks.expect(
        &policy,
        "Custom0 with runAsUser 0",
        &Request::create(&first_rooted, &labels),
        |got| matches!(got, Verdict::Deny(_)) && got.message().contains(field),
    );
    checks.expect(
        &policy,
        format!("Custom{} compliant", n - 1),
        &Request::create(&last_compliant, &labels),
        |got| *got == Verdict::Admit,
    );
    assert_no_failures(&checks.run());
}

/// Upgrades refuse nothing: while replicas of the previous release still answer, a pod they
/// patched under the previous settings (another prep image, mount path, init-container user)
/// is admitted by the new policy, as is one patched under the new settings; a prep canonical
/// under neither is refused. `modelgate backstop --previous-values FILE` reads the previous
/// flags from a file.
#[test]
fn an_upgrade_admits_the_previous_releases_prep() {
    let current = configs()[0].1.clone();
    let previous = PolicyConfig {
        init_image: "docker.io/curlimages/curl:8.17.0".into(),
        cache_mount_path: "/cache".into(),
        init_container_user: 4242,
        default_fsgroup: 0,
        ..current.clone()
    };
    let third = PolicyConfig {
        init_image: "docker.io/curlimages/curl:8.16.0".into(),
        ..current.clone()
    };
    let sel = selection();
    let across = Policy {
        objects: backstop::objects_across_upgrade(&current, &previous, &sel)
            .unwrap_or_else(|e| panic!("the backstop is not rendered: {e}")),
        kinds: current.workload_kinds.clone(),
    };
    let only_current = Policy::new(&current, &sel);
    let labels = enforce_labels();
    let pods = [
        (
            "patched by the new release",
            pod_with_canonical_prep(&current),
        ),
        (
            "patched by the previous release",
            pod_with_canonical_prep(&previous),
        ),
        (
            "patched with a third prep image",
            pod_with_canonical_prep(&third),
        ),
    ];
    let mut checks = Checks::default();
    for (i, (what, pod)) in pods.iter().enumerate() {
        let r = Request::create(pod, &labels);
        checks.expect(
            &across,
            format!("across the upgrade, {what}"),
            &r,
            move |got| (*got == Verdict::Admit) == (i < 2) && (i < 2 || denies_a_root_prep(got)),
        );
        checks.expect(
            &only_current,
            format!("without one, {what}"),
            &r,
            move |got| (*got == Verdict::Admit) == (i == 0),
        );
    }
    assert_no_failures(&checks.run());

    // The binary: the previous flags from a file, as the webhook takes them.
    let dir = tempfile::tempdir().unwrap();
    let flags = dir.path().join("previous.flags");
    std::fs::write(
        &flags,
        "# the previous release\n--init-image=docker.io/curlimages/curl:8.17.0\n\
         --cache-mount-path=/cache --init-container-user=4242\n",
    )
    .unwrap();
    let path = flags.to_str().unwrap();
    let printed = cli::modelgate(&["backstop", "--previous-values", path]);
    cli::assert_exit(&printed, 0);
    let vap = serde_json::to_value(
        modelgate::documents::read_documents("backstop", &printed.stdout)
            .unwrap()
            .into_iter()
            .map(|d| d.value)
            .find(|v| v["kind"] == "ValidatingAdmissionPolicy")
            .unwrap(),
    )
    .unwrap();
    let variable = |name: &str| {
        vap["spec"]["variables"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == name)
            .map(|v| v["expression"].clone())
    };
    assert_eq!(
        variable("previousPrepImage"),
        Some(json!("\"docker.io/curlimages/curl:8.17.0\""))
    );
    assert_eq!(variable("previousInitContainerUser"), Some(json!("4242")));
    assert_eq!(
        variable("previousCacheMountPath"),
        Some(json!("\"/cache\""))
    );
    assert_eq!(
        variable("prepImage"),
        Some(json!("\"docker.io/curlimages/curl:8.18.0\""))
    );
    std::fs::write(&flags, "--init-image=x:1 --no-such-flag\n").unwrap();
    let refused = cli::modelgate(&["backstop", "--previous-values", path]);
    cli::assert_exit(&refused, 1);
    assert!(
        refused.stderr.contains("--previous-values") && refused.stderr.contains("--no-such-flag"),
        "{}",
        refused.stderr
    );
}

/// `kubectl set image` on the prep, as the API server sends it (a Pod UPDATE with its
/// `oldObject`): the backstop denies it naming the field, as `/validate` does; an update of
/// another container's image is admitted; one that changes no init image is not matched (the
/// same condition keeps it from the webhook). Pods admitted earlier are not judged again.
#[test]
fn a_pod_update_may_not_change_the_prep_image() {
    let cfg = configs()[0].1.clone();
    let policy = Policy::new(&cfg, &selection());
    let hooks = Webhooks::new(cfg.clone());
    let admitted = pod_with_canonical_prep(&cfg);
    let mut swapped = admitted.clone();
    swapped["spec"]["initContainers"][0]["image"] = json!("evil.example/root:1");
    let mut other_init = admitted.clone();
    other_init["spec"]["initContainers"][1]["image"] = json!("busybox:2");
    let mut other = admitted.clone();
    other["spec"]["containers"][0]["image"] = json!("busybox:2");
    // A pod from before the policy, with a root container: an image update is not the moment
    // to judge it again.
    let mut old_root = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "old", "namespace": "team-a"},
        "spec": {"initContainers": [{"name": "setup", "image": "busybox:1"}],
                 "containers": [{"name": "c", "image": "busybox:1"}]}});
    let mut old_root_updated = old_root.clone();
    old_root_updated["spec"]["initContainers"][0]["image"] = json!("busybox:2");
    old_root["spec"]["containers"][0]["securityContext"] = json!({"runAsUser": 0});
    old_root_updated["spec"]["containers"][0]["securityContext"] = json!({"runAsUser": 0});
    let labels = enforce_labels();
    let mut checks = Checks::default();
    checks.expect(
        &policy,
        "the prep's image changed",
        &Request::update(&swapped, &admitted, &labels),
        |got| {
            got.message().starts_with(
                "spec.initContainers[0].image: the model-cache-prep image cannot change after admission",
            ) && got.message().contains(backstop::MESSAGE_SUFFIX)
        },
    );
    checks.expect(
        &policy,
        "another init container's image changed",
        &Request::update(&other_init, &admitted, &labels),
        |got| *got == Verdict::Admit,
    );
    checks.expect(
        &policy,
        "a container's image changed",
        &Request::update(&other, &admitted, &labels),
        |got| *got == Verdict::NotMatched,
    );
    checks.expect(
        &policy,
        "an older root pod's init image changed",
        &Request::update(&old_root_updated, &old_root, &labels),
        |got| *got == Verdict::Admit,
    );
    assert_no_failures(&checks.run());
    // /validate says the same of the same update.
    let mut review = create_review("u", &swapped, "team-a");
    review["request"]["operation"] = json!("UPDATE");
    review["request"]["oldObject"] = admitted.clone();
    let answer = hooks.call(Webhook::Validate, &review);
    assert!(!answer.allowed, "{}", answer.message);
    assert!(
        answer
            .message
            .starts_with("spec.initContainers[0].image: the model-cache-prep image cannot change"),
        "{}",
        answer.message
    );
}

/// `kubectl debug` on a pod admitted by an earlier release (another `--init-image`: its prep is
/// not canonical for today's settings, and runs as root) that already has a root debug
/// container: only the ephemeral containers `oldObject` lacks are judged, by name (the API
/// server keeps the stored ones, not their order), as by the webhook's `/validate`. A new root
/// container is denied wherever it is put; the stored pod is never named. Also beside many
/// stored root debug containers, within the cost limits: the decision is linear, and past the
/// name lookups a message affords, the message names the list and counts the new containers.
#[test]
fn kubectl_debug_on_an_old_pod_judges_only_the_new_ephemeral_containers() {
    let cfg = configs()[0].1.clone();
    let earlier = PolicyConfig {
        init_image: "registry.example/curl:7.88.1".into(),
        ..cfg.clone()
    };
    let policy = Policy::new(&cfg, &selection());
    let hooks = Webhooks::new(cfg.clone());
    let labels = enforce_labels();
    let mut running = pod_with_canonical_prep(&earlier);
    assert_eq!(
        running["spec"]["initContainers"][0]["image"],
        "registry.example/curl:7.88.1"
    );
    running["spec"]["ephemeralContainers"] = json!([{"name": "old-debugger", "image": "busybox",
        "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
        "imagePullPolicy": "Always", "securityContext": {"runAsNonRoot": false}}]);
    let debugger = |security_context: Value| {
        let mut c = json!({"name": "debugger-7x2k", "image": "busybox:1.36",
            "targetContainerName": "c", "stdin": true, "tty": true,
            "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
            "imagePullPolicy": "IfNotPresent"});
        if !security_context.is_null() {
            c["securityContext"] = security_context;
        }
        c
    };
    let with = |stored: &Value, new: Value, first: bool| {
        let mut pod = stored.clone();
        let list = pod["spec"]["ephemeralContainers"].as_array_mut().unwrap();
        match first {
            true => list.insert(0, new),
            false => list.push(new),
        }
        pod
    };
    // Many stored root debug containers (a pod debugged before its namespace was opted in).
    let stored_roots = |n: usize| {
        let mut pod = running.clone();
        pod["spec"]["ephemeralContainers"] = (0..n)
            .map(|i| json!({"name": format!("old-{i}"), "image": "busybox", "securityContext": {"runAsUser": 0}}))
            .collect();
        pod
    };
    let (some, many) = (stored_roots(300), stored_roots(2000));
    let root = json!({"runAsUser": 0});
    let cases: Vec<(&str, &Value, Value, Option<&str>)> = vec![
        (
            "kubectl debug as it comes",
            &running,
            with(&running, debugger(Value::Null), false),
            None,
        ),
        (
            "a debugger that sets its own non-root uid",
            &running,
            with(
                &running,
                debugger(json!({"runAsNonRoot": true, "runAsUser": 1000})),
                false,
            ),
            None,
        ),
        (
            "a new root debugger",
            &running,
            with(&running, debugger(root.clone()), false),
            Some(
                "spec.ephemeralContainers[1].securityContext.runAsUser: 0 is outside 1..2147483647",
            ),
        ),
        (
            "a new debugger with runAsNonRoot false",
            &running,
            with(&running, debugger(json!({"runAsNonRoot": false})), false),
            Some("spec.ephemeralContainers[1].securityContext.runAsNonRoot: false is not allowed"),
        ),
        (
            "a new root debugger put before the stored one",
            &running,
            with(&running, debugger(root.clone()), true),
            Some(
                "spec.ephemeralContainers[0].securityContext.runAsUser: 0 is outside 1..2147483647",
            ),
        ),
        (
            "kubectl debug beside 2000 stored root debuggers",
            &many,
            with(&many, debugger(Value::Null), false),
            None,
        ),
        (
            "a new root debugger beside 300 stored ones",
            &some,
            with(&some, debugger(root.clone()), false),
            Some(
                "spec.ephemeralContainers[300].securityContext.runAsUser: 0 is outside 1..2147483647",
            ),
        ),
        (
            "a new root debugger beside 2000 stored ones",
            &many,
            with(&many, debugger(root.clone()), false),
            Some(
                "spec.ephemeralContainers[2000].securityContext.runAsUser: 0 is outside 1..2147483647",
            ),
        ),
    ];
    // Past the name lookups a message may afford, the backstop names the list and how many
    // containers the update adds there, not which.
    let backstop_says = |what: &str, field: &str| match what {
        "a new root debugger beside 2000 stored ones" => {
            "spec.ephemeralContainers: 1 of the containers this update adds. ".to_string()
        }
        _ => field.to_string(),
    };
    let mut checks = Checks::default();
    for (what, stored, object, denied) in &cases {
        let mut request = Request::update(object, stored, &labels);
        request.sub_resource = "ephemeralcontainers";
        let stored_names: Vec<String> = stored["spec"]["ephemeralContainers"]
            .as_array()
            .unwrap()
            .iter()
            .enumerate()
            .map(|(i, _)| format!("spec.ephemeralContainers[{i}]"))
            .collect();
        let label = what.to_string();
        let denied = *denied;
        let says = denied.map(|field| backstop_says(what, field));
        checks.add(&policy, *what, &request, move |got| {
            let what = label;
            let message = got.message();
            let mut out = Vec::new();
            match &says {
                None if *got != Verdict::Admit => out.push(format!("{what}: {got:?}")),
                Some(field) if !message.starts_with(field.as_str()) => {
                    out.push(format!("{what}: {message:.600}"));
                }
                _ => {}
            }
            if message.contains("initContainers") || message.contains("spec.securityContext") {
                out.push(format!(
                    "{what}: the stored pod judged again: {message:.600}"
                ));
            }
            // The new container's index is the only one named.
            let new_index = denied.map(|f| f.split(']').next().unwrap().to_string() + "]");
            for name in &stored_names {
                if Some(name) != new_index.as_ref() && message.contains(&format!("{name}.")) {
                    out.push(format!("{what}: a stored container named: {message:.600}"));
                }
            }
            out
        });
        // The webhook's /validate says the same of the same review.
        let mut review = create_review("debug", object, "team-a");
        review["request"]["operation"] = json!("UPDATE");
        review["request"]["subResource"] = json!("ephemeralcontainers");
        review["request"]["oldObject"] = (*stored).clone();
        let answer = hooks.call(Webhook::Validate, &review);
        match denied {
            None => assert!(answer.allowed, "{what}: /validate: {}", answer.message),
            Some(field) => assert!(
                answer.message.starts_with(field),
                "{what}: /validate: {}",
                answer.message
            ),
        }
    }
    assert_no_failures(&checks.run());
}
