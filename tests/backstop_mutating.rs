//! The backstop's MutatingAdmissionPolicy (docs/policy.md §13, "The MAP") applied as
//! kube-apiserver 1.36 applies it (`map136`, `support/kube_apiserver_cel.rs`), against `/mutate`
//! in process (`admission::review`), over the corpus' Pods and Jobs, the generated pods and the
//! pods below, for the default flags and each flag that changes §3:
//!
//! (a) the MAP, then `/mutate` on its result, gives exactly the object, warnings and summary
//!     `/mutate` alone gives (or the same denial);
//! (b) the MAP on what `/mutate` patched is `UNCHANGED`;
//! (c) the MAP never errors (never an `ignored` error either), a pod of 50 containers and 50 init
//!     containers of 100 env entries each included;
//! (d) the MAP's result alone is admitted by the VAP (`vap136`) wherever the webhooks admit the
//!     pod, the prep aside (the MAP injects none, nor replaces a stale one); and wherever
//!     `/mutate` denies a range, the VAP denies the MAP's result;
//! (e) a container with `runAsUser: 0` is not repaired, and the VAP denies it naming the field;
//! (f) the MAP is bound exactly where the VAP is, over a table of namespace labels.
//!
//! How the objects are compared: `map136` prints the object as kube-apiserver serializes the
//! typed object (`resources: {}`, `status: {}`, empty maps left out). `/mutate`'s result is put
//! through the same serialization by applying the MAP to it, which (b) requires to change
//! nothing: so both sides of (a) are `map136`'s typed serialization of the final object.

#[path = "support/backstop_inputs.rs"]
mod backstop_inputs;
#[path = "common/cli.rs"]
mod cli;
#[path = "support/kube_apiserver_cel.rs"]
mod kube_apiserver_cel;

use std::collections::BTreeMap;

use backstop_inputs::{
    Webhooks, cache_hit_pods, corpus_objects, enforce_labels, generated_pods, large_pod, selects,
};
use kube_apiserver_cel::{
    AdmissionRequest, Case, Decision, MapResult, MapRun, UserInfo, VERSIONS, namespace_object,
};
use modelgate::admission::Webhook;
use modelgate::backstop::{self, Selection, mutating};
use modelgate::config::{AbsentClaims, IdSetting, PodSecurityLevel, PolicyConfig, PrepMode};
use modelgate::namespaces::{Mode, NamespaceLabels};
use modelgate::policy::SET_BY_POLICY;
use modelgate_core::testing::{Answer, create_review};
use serde_json::{Value, json};

const NAMESPACE: &str = "team-a";

/// Namespaces labelled `pod-security.kubernetes.io/enforce`, with their level.
const POD_SECURITY_NAMESPACES: [(&str, &str); 2] =
    [("team-r", "restricted"), ("team-b", "baseline")];

/// The labels of a namespace: the opt-in, and the Pod Security level of
/// [`POD_SECURITY_NAMESPACES`].
fn labels_of(namespace: &str) -> BTreeMap<String, String> {
    let mut labels = enforce_labels();
    if let Some((_, level)) = POD_SECURITY_NAMESPACES
        .iter()
        .find(|(n, _)| *n == namespace)
    {
        labels.insert(
            "pod-security.kubernetes.io/enforce".into(),
            level.to_string(),
        );
    }
    labels
}

/// The webhooks, knowing the labels of [`POD_SECURITY_NAMESPACES`].
fn webhooks(cfg: &PolicyConfig) -> Webhooks {
    let mut hooks = Webhooks::new(cfg.clone());
    for (ns, _) in POD_SECURITY_NAMESPACES {
        let labels = labels_of(ns);
        hooks
            .namespaces
            .set(ns, NamespaceLabels::from_labels(&labels));
    }
    hooks
}

fn selection() -> Selection {
    Selection::new("modelgate", "modelgate")
}

/// The default flags, and each flag that changes what §3 sets.
fn configs() -> Vec<(&'static str, PolicyConfig)> {
    let base = PolicyConfig {
        exempt_namespaces: vec!["kube-system".into(), "modelgate".into()],
        ..PolicyConfig::default()
    };
    vec![
        ("defaults", base.clone()),
        (
            "defaults, claims as serve reads them from a cluster (one it has not is missing)",
            PolicyConfig {
                absent_claims: AbsentClaims::Missing,
                ..base.clone()
            },
        ),
        (
            "--run-as-user none --run-as-group none",
            PolicyConfig {
                run_as_user: IdSetting::None,
                run_as_group: IdSetting::None,
                default_fsgroup: 0,
                ..base.clone()
            },
        ),
        (
            "--run-as-user 4242 --run-as-group 0",
            PolicyConfig {
                run_as_user: IdSetting::Set(4242),
                run_as_group: IdSetting::Set(0),
                ..base.clone()
            },
        ),
        (
            "--model-cache-prep never --init-container-user 4343",
            PolicyConfig {
                model_cache_prep: PrepMode::Never,
                init_container_user: 4343,
                ..base.clone()
            },
        ),
        (
            "--init-container-user 1000 (the uid of a named claim's pod is known)",
            PolicyConfig {
                init_container_user: 1000,
                ..base.clone()
            },
        ),
        (
            "--prep-volume-type nfs --prep-host-path /data --cache-volume cache",
            PolicyConfig {
                prep_volume_types: vec!["nfs".into()],
                prep_host_paths: vec!["/data".into()],
                cache_volume: "cache".into(),
                ..base.clone()
            },
        ),
        (
            "--prep-storage-class fast --prep-volume-type prebound",
            PolicyConfig {
                prep_storage_classes: vec!["fast".into()],
                prep_volume_types: vec!["prebound".into()],
                ..base.clone()
            },
        ),
        (
            "--pod-security-default restricted",
            PolicyConfig {
                pod_security_default: PodSecurityLevel::Restricted,
                ..base
            },
        ),
    ]
}

/// Pods for what §3 decides from the cache volume, the prep and Windows, beside the generated
/// ones.
fn more_pods() -> Vec<(String, Value)> {
    let pod = |spec: Value| json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "p-"}, "spec": spec});
    let server = json!({"name": "server", "image": "vllm"});
    let template = |claim_spec: Value| json!([{"name": "model-cache", "ephemeral": {"volumeClaimTemplate": {"spec": claim_spec}}}]);
    let mut out = Vec::new();
    for (what, volumes) in [
        (
            "claim template",
            template(json!({"accessModes": ["ReadWriteOnce"]})),
        ),
        (
            "claim template of class fast",
            template(json!({"storageClassName": "fast"})),
        ),
        (
            "claim template that names its volume",
            template(json!({"volumeName": "pv-1", "storageClassName": "fast"})),
        ),
        (
            "claim template with a selector",
            template(json!({"selector": {"matchLabels": {"a": "b"}}})),
        ),
        (
            "hostPath under /data",
            json!([{"name": "model-cache", "hostPath": {"path": "/data/./models/"}}]),
        ),
        (
            "hostPath /etc",
            json!([{"name": "model-cache", "hostPath": {"path": "/etc"}}]),
        ),
        (
            "inline nfs",
            json!([{"name": "model-cache", "nfs": {"server": "s", "path": "/m"}}]),
        ),
        (
            "inline nfs named cache",
            json!([{"name": "cache", "nfs": {"server": "s", "path": "/m"}}]),
        ),
        (
            "claim named cache",
            json!([{"name": "cache", "persistentVolumeClaim": {"claimName": "c"}}]),
        ),
        (
            "csi",
            json!([{"name": "model-cache", "csi": {"driver": "d"}}]),
        ),
    ] {
        out.push((
            what.to_string(),
            pod(json!({"volumes": volumes.clone(), "containers": [server.clone()]})),
        ));
        // In a namespace whose Pod Security label says restricted, or baseline (which wins
        // over `--pod-security-default restricted`).
        for (ns, _) in POD_SECURITY_NAMESPACES {
            let mut p = pod(json!({"volumes": volumes.clone(), "containers": [server.clone()]}));
            p["metadata"]["namespace"] = json!(ns);
            out.push((format!("{what}, in {ns}"), p));
        }
    }
    // Every container with its own uid but an init container named like the prep: whether it
    // counts depends on whether modelgate manages the prep.
    let prep_without_ids = json!({"name": "model-cache-prep", "image": "busybox"});
    let own_ids = json!({"name": "server", "image": "vllm",
        "securityContext": {"runAsUser": 7, "runAsGroup": 7, "runAsNonRoot": false}});
    for (what, volumes) in [
        (
            "a claim",
            json!([{"name": "model-cache", "persistentVolumeClaim": {"claimName": "c"}}]),
        ),
        ("no cache", json!([])),
        (
            "an emptyDir",
            json!([{"name": "model-cache", "emptyDir": {}}]),
        ),
    ] {
        out.push((
            format!("own ids, a stale prep, {what}"),
            pod(
                json!({"volumes": volumes, "initContainers": [prep_without_ids.clone()],
                "containers": [own_ids.clone()]}),
            ),
        ));
    }
    // A stale prep that says runAsNonRoot: false, next to init and regular containers that do.
    out.push((
        "a stale prep and containers that say runAsNonRoot false".into(),
        pod(json!({
            "volumes": [{"name": "model-cache", "persistentVolumeClaim": {"claimName": "c"}}],
            "initContainers": [
                {"name": "setup", "image": "busybox", "securityContext": {"runAsNonRoot": false}},
                {"name": "model-cache-prep", "image": "busybox", "securityContext": {"runAsNonRoot": false}}],
            "containers": [
                {"name": "a", "image": "x", "securityContext": {"runAsNonRoot": false}},
                {"name": "b", "image": "x", "securityContext": {"runAsNonRoot": true}},
                {"name": "c", "image": "x", "securityContext": {"runAsNonRoot": false, "runAsUser": 9}}]})),
    ));
    // Windows by a required node affinity, and one that may land on Linux.
    let affinity = |values: Value| {
        json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/os", "operator": "In", "values": values}]}]}}})
    };
    for (what, values) in [
        ("windows by affinity", json!(["windows"])),
        ("windows or linux by affinity", json!(["windows", "linux"])),
    ] {
        out.push((
            what.to_string(),
            pod(
                json!({"affinity": affinity(values), "containers": [server.clone()],
                "securityContext": {"runAsNonRoot": false}}),
            ),
        ));
    }
    // A Job with init containers and a claim template.
    out.push((
        "job with init containers".into(),
        json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train"},
            "spec": {"template": {"spec": {"restartPolicy": "Never",
                "volumes": template(json!({"storageClassName": "fast"})),
                "initContainers": [{"name": "fetch", "image": "x", "securityContext": {"runAsNonRoot": false}}],
                "containers": [{"name": "c", "image": "x"}]}}}}),
    ));
    out
}

/// Pods and Jobs to compare, by label: the corpus', the generated ones, the cache hits and
/// [`more_pods`], each in [`NAMESPACE`] unless it names a namespace the MAP is bound to.
fn objects(cfg: &PolicyConfig) -> Vec<(String, Value)> {
    let mut all = corpus_objects(cli::corpus_dir());
    all.extend(generated_pods());
    all.extend(cache_hit_pods());
    all.extend(more_pods());
    all.into_iter()
        .filter(|(_, o)| {
            let kind = (o["apiVersion"].as_str(), o["kind"].as_str());
            matches!(
                kind,
                (Some("v1"), Some("Pod")) | (Some("batch/v1"), Some("Job"))
            )
        })
        .map(|(label, mut o)| {
            let ns = o["metadata"]["namespace"].as_str().unwrap_or(NAMESPACE);
            if cfg.exempt_namespaces.iter().any(|e| e == ns) {
                o["metadata"]["namespace"] = json!(NAMESPACE);
            }
            (label, o)
        })
        .collect()
}

/// The CREATE of `object` as the API server hands it to the MAP (the name generated, the
/// namespace set), in a namespace with these labels.
fn case(label: &str, object: &Value, labels: &BTreeMap<String, String>) -> Case {
    let mut object = object.clone();
    if object.get("metadata").is_none() {
        object["metadata"] = json!({});
    }
    let namespace = object["metadata"]["namespace"]
        .as_str()
        .unwrap_or(NAMESPACE)
        .to_string();
    object["metadata"]["namespace"] = json!(namespace);
    if object["metadata"]["name"].is_null()
        && let Some(prefix) = object["metadata"]["generateName"].as_str()
    {
        object["metadata"]["name"] = json!(format!("{prefix}x7k2p"));
    }
    let (group, version, kind, resource) = match object["kind"].as_str() {
        Some("Job") => ("batch", "v1", "Job", "jobs"),
        _ => ("", "v1", "Pod", "pods"),
    };
    let request = AdmissionRequest {
        group: group.into(),
        version: version.into(),
        kind: kind.into(),
        resource: resource.into(),
        sub_resource: None,
        name: object["metadata"]["name"].as_str().map(String::from),
        namespace: Some(namespace.clone()),
        operation: "CREATE".into(),
        user: UserInfo {
            username: "system:serviceaccount:team-a:deployer".into(),
            groups: vec!["system:authenticated".into()],
            ..UserInfo::default()
        },
    };
    Case {
        name: label.replace(['\n', '\r'], " "),
        object,
        old_object: Value::Null,
        request: request.to_json(),
        namespace_object: namespace_object(&namespace, labels),
    }
}

/// The MAP of a configuration.
fn map_of(cfg: &PolicyConfig) -> Value {
    let [map, _] = mutating::objects(cfg, &selection());
    map
}

/// What a review answered that (a) compares: the decision, the warnings, the denial's message,
/// the audit annotations and the summary as metrics count it.
fn answer_facts(a: &Answer) -> Value {
    let summary = a.summary.as_ref();
    json!({
        "allowed": a.allowed,
        "warnings": a.warnings,
        "message": a.message,
        "auditAnnotations": a.response()["auditAnnotations"],
        "mode": summary.map(|s| format!("{:?}", s.mode)),
        "result": summary.map(|s| format!("{:?}", s.result)),
        "model_cache": summary.map(|s| format!("{:?}", s.model_cache)),
    })
}

/// The MAP's object of a run, failing (c) on an error or an ignored error.
fn map_object<'r>(run: &'r MapRun, failures: &mut Vec<String>) -> Option<&'r Value> {
    if !run.ignored.is_empty() {
        failures.push(format!(
            "{}: the MAP errs (ignored): {:?}",
            run.name, run.ignored
        ));
    }
    match &run.result {
        MapResult::Error(e) => {
            failures.push(format!("{}: the MAP errs: {e}\n{}", run.name, run.raw));
            None
        }
        _ => Some(&run.object),
    }
}

fn assert_no_failures(failures: &[String]) {
    const SHOWN: usize = 12;
    assert!(
        failures.is_empty(),
        "{} failures (the first {SHOWN}):\n{}",
        failures.len(),
        failures
            .iter()
            .take(SHOWN)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n\n")
    );
}

/// (a), (b), (c) and (d) over every configuration and object.
#[test]
fn the_map_then_mutate_answers_as_mutate_alone() {
    if kube_apiserver_cel::map_tools_dir().is_none() {
        return;
    }
    let mut failures = Vec::new();
    let mut seen = BTreeMap::<&str, usize>::new();
    for (name, cfg) in configs() {
        let hooks = webhooks(&cfg);
        let map = map_of(&cfg);
        let objects = objects(&cfg);
        let cases: Vec<Case> = objects
            .iter()
            .map(|(l, o)| {
                let ns = o["metadata"]["namespace"].as_str().unwrap_or(NAMESPACE);
                case(l, o, &labels_of(ns))
            })
            .collect();
        let first = kube_apiserver_cel::apply_map(&map, &cases);

        // /mutate alone, and /mutate after the MAP.
        let mut normalise = Vec::new();
        let mut admitted_alone = Vec::new();
        for ((label, _), (case, run)) in objects.iter().zip(cases.iter().zip(&first.runs)) {
            let label = format!("[{name}] {label}");
            let Some(after_map) = map_object(run, &mut failures) else {
                continue;
            };
            let object = &case.object;
            if object.to_string().contains(SET_BY_POLICY) {
                failures.push(format!("{label}: carries the annotation before the MAP"));
                continue;
            }
            let alone = hooks.call(Webhook::Mutate, &create_review("uid", object, NAMESPACE));
            let after = hooks.call(Webhook::Mutate, &create_review("uid", after_map, NAMESPACE));
            if run.result == MapResult::Patched {
                *seen.entry("patched by the MAP").or_default() += 1;
                // On the object's own metadata: never on a Job's template, which its pods copy.
                let own = &after_map["metadata"]["annotations"][SET_BY_POLICY];
                let template = &after_map["spec"]["template"]["metadata"]["annotations"];
                if !own.is_string() || template.get(SET_BY_POLICY).is_some() {
                    failures.push(format!("{label}: the annotation is misplaced: {after_map}"));
                }
                if after_map["kind"] == "Job" {
                    *seen.entry("a Job patched by the MAP").or_default() += 1;
                }
            }
            if answer_facts(&alone) != answer_facts(&after) {
                failures.push(format!(
                    "{label}: /mutate answers otherwise after the MAP\n  alone: {}\n  after the MAP: {}\n  the MAP's object: {after_map}",
                    answer_facts(&alone),
                    answer_facts(&after)
                ));
                continue;
            }
            if !alone.allowed {
                *seen.entry("denied both ways").or_default() += 1;
                // (d): a range /mutate denies, the VAP denies on the MAP's result.
                admitted_alone.push((label.clone(), after_map.clone(), false, case.clone()));
                continue;
            }
            let patched_alone = alone.patched(object);
            let patched_after = after.patched(after_map);
            if patched_after.to_string().contains(SET_BY_POLICY) {
                failures.push(format!("{label}: the annotation survives /mutate"));
            }
            let mut c = case.clone();
            c.name = format!("{label} (/mutate alone)");
            c.object = patched_alone.clone();
            normalise.push(c.clone());
            c.name = format!("{label} (the MAP, then /mutate)");
            c.object = patched_after;
            normalise.push(c);
            // (d) where the webhooks admit the pod, but where /mutate replaces a stale prep.
            let validated = hooks.call(
                Webhook::Validate,
                &create_review("uid", &patched_alone, NAMESPACE),
            );
            let replaces_prep = alone
                .warnings
                .iter()
                .any(|w| w.contains("replaced by the canonical one"));
            if validated.allowed && !replaces_prep {
                admitted_alone.push((label.clone(), after_map.clone(), true, case.clone()));
            } else if validated.allowed {
                *seen
                    .entry("left out of (d): /mutate replaces a stale prep")
                    .or_default() += 1;
            }
        }

        // (a) and (b): the MAP changes nothing of either result, and both are the same object.
        let second = kube_apiserver_cel::apply_map(&map, &normalise);
        for pair in second.runs.chunks(2) {
            let [alone, after] = pair else { unreachable!() };
            for run in pair {
                if map_object(run, &mut failures).is_some() && run.result != MapResult::Unchanged {
                    failures.push(format!(
                        "{}: the MAP changes what /mutate patched (b)\n{}",
                        run.name, run.raw
                    ));
                }
            }
            if alone.object != after.object {
                failures.push(format!(
                    "{}: the objects differ (a)\n  alone:         {}\n  after the MAP: {}",
                    after.name, alone.object, after.object
                ));
            } else {
                *seen.entry("same object").or_default() += 1;
            }
        }

        // (d): the VAP on the MAP's result alone.
        let vap = backstop::objects(&cfg, &selection()).unwrap()[0].clone();
        let vap_cases: Vec<Case> = admitted_alone
            .iter()
            .map(|(label, object, _, case)| Case {
                name: label.clone(),
                object: object.clone(),
                ..case.clone()
            })
            .collect();
        let evaluation = kube_apiserver_cel::evaluate_in(&[VERSIONS[3]], &vap, &vap_cases);
        for ((label, object, admitted, _), outcome) in
            admitted_alone.iter().zip(&evaluation.outcomes)
        {
            let decision = outcome.agreed().cloned();
            match (admitted, decision) {
                (true, Ok(Decision::Admit)) => {
                    *seen.entry("admitted by the VAP as the MAP left it").or_default() += 1
                }
                (false, Ok(Decision::Deny(_))) => {
                    *seen.entry("denied by the VAP as the MAP left it").or_default() += 1
                }
                // A pod without containers (`containers: null` once typed), which the API
                // server's validation refuses anyway: the VAP fails on it, a denial under its
                // failurePolicy Fail.
                (false, Ok(Decision::Error(_)))
                    if object["spec"].get("containers") == Some(&Value::Null) =>
                {
                    *seen.entry("denied by the VAP as the MAP left it").or_default() += 1
                }
                (_, got) => failures.push(format!(
                    "{label}: the webhooks {} it, the VAP on the MAP's result: {got:?}\n  object: {object}",
                    if *admitted { "admit" } else { "deny" }
                )),
            }
        }
    }
    println!("{seen:#?}");
    for what in [
        "patched by the MAP",
        "a Job patched by the MAP",
        "same object",
        "denied both ways",
        "admitted by the VAP as the MAP left it",
        "denied by the VAP as the MAP left it",
    ] {
        assert!(seen.get(what).copied().unwrap_or(0) > 0, "no case: {what}");
    }
    assert_no_failures(&failures);
}

/// A tenant who writes the annotation by hand gains nothing: `/mutate` removes it and patches the
/// pod as it would without it; what it lists that is not what the MAP sets is named in a
/// warning; an entry whose value is the MAP's is only reported as a change.
#[test]
fn a_hand_written_annotation_gains_nothing() {
    let cfg = configs()[0].1.clone();
    let hooks = Webhooks::new(cfg);
    let pod = |annotation: Option<&str>, uid: i64| {
        let mut p = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "forged", "namespace": NAMESPACE},
            "spec": {"securityContext": {"runAsUser": uid},
                "containers": [{"name": "server", "image": "x", "securityContext": {"runAsNonRoot": true}},
                    {"name": "side", "image": "x", "securityContext": {"runAsNonRoot": false}}]}});
        if let Some(a) = annotation {
            p["metadata"]["annotations"] = json!({SET_BY_POLICY: a});
        }
        p
    };
    for (listed, uid, untrusted) in [
        (
            "securityContext.runAsUser,containers[server].securityContext.runAsNonRoot",
            1000,
            None,
        ),
        (
            "securityContext.runAsUser,securityContext.runAsNonRoot,containers[side].securityContext.runAsNonRoot,spec.hostPID",
            5,
            Some(
                "securityContext.runAsUser, securityContext.runAsNonRoot, containers[side].securityContext.runAsNonRoot, spec.hostPID",
            ),
        ),
    ] {
        let forged = pod(Some(listed), uid);
        let honest = pod(None, uid);
        let a = hooks.call(Webhook::Mutate, &create_review("uid", &forged, NAMESPACE));
        let b = hooks.call(Webhook::Mutate, &create_review("uid", &honest, NAMESPACE));
        assert!(a.allowed && b.allowed);
        let mut patched = a.patched(&forged);
        assert!(!patched.to_string().contains(SET_BY_POLICY), "{patched}");
        // Removing the one annotation leaves `annotations: {}`, which the API server drops.
        assert_eq!(patched["metadata"]["annotations"], json!({}));
        patched["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("annotations");
        assert_eq!(patched, b.patched(&honest), "{listed}");
        match untrusted {
            Some(entries) => assert!(
                a.warnings
                    .iter()
                    .any(|w| w.starts_with(SET_BY_POLICY) && w.ends_with(entries)),
                "{:?}",
                a.warnings
            ),
            None => assert!(
                !a.warnings.iter().any(|w| w.starts_with(SET_BY_POLICY)),
                "{:?}",
                a.warnings
            ),
        }
    }
}

/// (c): the largest pod the VAP's tests use, and one of 4 000 containers, are patched within
/// the cost limits, never an error; the cost of each mutation is printed.
#[test]
fn the_map_never_errs_on_a_large_pod() {
    if kube_apiserver_cel::map_tools_dir().is_none() {
        return;
    }
    let cfg = &configs()[0].1;
    let labels = enforce_labels();
    let pods = [
        ("plain", large_pod(50, 50, 100, &Value::Null)),
        (
            "runAsNonRoot false",
            large_pod(50, 50, 100, &json!({"runAsNonRoot": false})),
        ),
        (
            "runAsNonRoot false, uid 0",
            large_pod(50, 50, 100, &json!({"runAsNonRoot": false, "runAsUser": 0})),
        ),
        (
            "2000 and 2000 init containers, runAsNonRoot false",
            large_pod(2000, 2000, 0, &json!({"runAsNonRoot": false})),
        ),
    ];
    let cases: Vec<Case> = pods.iter().map(|(l, p)| case(l, p, &labels)).collect();
    let evaluation = kube_apiserver_cel::apply_map(&map_of(cfg), &cases);
    let mut failures = Vec::new();
    for run in &evaluation.runs {
        println!("{}: {:?} costs {:?}", run.name, run.result, run.costs);
        for line in run.raw.lines().filter(|l| l.contains("elapsed=")) {
            println!("  {}", line.trim());
        }
        if map_object(run, &mut failures).is_some() && run.result != MapResult::Patched {
            failures.push(format!("{}: not patched: {:?}", run.name, run.result));
        }
        // Linear in the containers, far within the budget of 10 000 000 per mutation (and
        // within 1 000 000, one expression's limit elsewhere in kube-apiserver).
        for (what, cost) in &run.costs {
            if *cost > 1_000_000 {
                failures.push(format!("{}: {what} costs {cost}", run.name));
            }
        }
    }
    println!(
        "compile: {:?} at creation, {:?} as stored",
        evaluation.create_time, evaluation.runtime
    );
    // With every matchCondition (excluded priority classes too), and another opt-in label,
    // the MAP compiles and applies the same.
    let sel = Selection {
        exclude_priority_classes: vec!["system-node-critical".into()],
        ..selection()
    };
    let [with_classes, _] = mutating::objects(cfg, &sel);
    let again = kube_apiserver_cel::apply_map(&with_classes, &cases[1..2]);
    assert_eq!(again.runs[0].object, evaluation.runs[1].object);
    // Every container that said false now says true.
    let fixed = &evaluation.runs[1].object;
    let all_true = ["initContainers", "containers"].iter().all(|l| {
        fixed["spec"][*l].as_array().is_some_and(|cs| {
            cs.iter()
                .all(|c| c["securityContext"]["runAsNonRoot"] == true)
        })
    });
    assert!(all_true, "{fixed:.3000}");
    assert_no_failures(&failures);
}

/// (e): a container with `runAsUser: 0` is left as it is, and the VAP denies the MAP's result
/// naming that field.
#[test]
fn a_root_uid_is_not_repaired_and_the_vap_names_it() {
    if kube_apiserver_cel::map_tools_dir().is_none() {
        return;
    }
    let cfg = &configs()[0].1;
    let labels = enforce_labels();
    let pods = [
        (
            "spec.containers[1].securityContext.runAsUser",
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                "spec": {"containers": [{"name": "a", "image": "x"},
                    {"name": "b", "image": "x", "securityContext": {"runAsUser": 0, "runAsNonRoot": false}}]}}),
        ),
        (
            "spec.initContainers[0].securityContext.runAsUser",
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                "spec": {"initContainers": [{"name": "i", "image": "x", "securityContext": {"runAsUser": 0}}],
                    "containers": [{"name": "a", "image": "x"}]}}),
        ),
        (
            "spec.template.spec.containers[0].securityContext.runAsUser",
            json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"},
                "spec": {"template": {"spec": {"restartPolicy": "Never",
                    "containers": [{"name": "a", "image": "x", "securityContext": {"runAsUser": 0}}]}}}}),
        ),
    ];
    let cases: Vec<Case> = pods.iter().map(|(l, p)| case(l, p, &labels)).collect();
    let evaluation = kube_apiserver_cel::apply_map(&map_of(cfg), &cases);
    let mut failures = Vec::new();
    let mut vap_cases = Vec::new();
    for ((field, _), (run, case)) in pods.iter().zip(evaluation.runs.iter().zip(&cases)) {
        let Some(object) = map_object(run, &mut failures) else {
            continue;
        };
        let pointer = format!(
            "/{}",
            field
                .replace("[", ".")
                .replace("]", "")
                .split('.')
                .collect::<Vec<_>>()
                .join("/")
        );
        if object.pointer(&pointer) != Some(&json!(0)) {
            failures.push(format!("{field}: the MAP changed it: {object}"));
        }
        vap_cases.push(Case {
            object: object.clone(),
            ..case.clone()
        });
    }
    let vap = backstop::objects(cfg, &selection()).unwrap()[0].clone();
    let outcomes = kube_apiserver_cel::evaluate_in(&[VERSIONS[3]], &vap, &vap_cases).outcomes;
    for ((field, _), outcome) in pods.iter().zip(&outcomes) {
        match outcome.agreed() {
            Ok(d @ Decision::Deny(_))
                if d.messages()
                    .iter()
                    .any(|m| m.contains(&format!("{field}: 0 "))) => {}
            got => failures.push(format!(
                "{field}: the VAP does not deny it naming it: {got:?}"
            )),
        }
    }
    assert_no_failures(&failures);
}

/// (f): the MAP is bound where the VAP is, and only to Pod and Job CREATE, with the VAP's
/// matchConditions.
#[test]
fn the_map_is_bound_where_the_vap_is() {
    let sel = Selection {
        exclude_priority_classes: vec!["system-node-critical".into()],
        ..selection()
    };
    let mut compared = 0;
    for default_mode in [Mode::Enforce, Mode::Warn, Mode::Audit, Mode::Off] {
        let cfg = PolicyConfig {
            default_mode,
            ..configs()[0].1.clone()
        };
        let [vap, vap_binding] = backstop::objects(&cfg, &sel).unwrap();
        let [map, map_binding] = mutating::objects(&cfg, &sel);
        assert_eq!(
            map["spec"]["matchConditions"], vap["spec"]["matchConditions"],
            "the matchConditions"
        );
        assert_eq!(map_binding["spec"]["policyName"], map["metadata"]["name"]);
        assert!(map_binding["spec"].get("paramRef").is_none());
        assert!(map["spec"].get("paramKind").is_none());
        let rules = map["spec"]["matchConstraints"]["resourceRules"].clone();
        assert_eq!(
            rules,
            json!([
                {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"], "scope": "Namespaced"},
                {"apiGroups": ["batch"], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["jobs"], "scope": "Namespaced"}
            ])
        );
        let binds = |policy: &Value, binding: &Value, labels: &BTreeMap<String, String>| {
            selects(
                &policy["spec"]["matchConstraints"]["namespaceSelector"],
                labels,
            ) && selects(
                &binding["spec"]["matchResources"]["namespaceSelector"],
                labels,
            )
        };
        for name in ["team-a", "kube-system", "modelgate"] {
            for inject in [None, Some("enabled"), Some("disabled")] {
                for mode in [
                    None,
                    Some("enforce"),
                    Some("warn"),
                    Some("audit"),
                    Some("off"),
                    Some("bogus"),
                ] {
                    for exceptions in [None, Some("allowed"), Some("denied")] {
                        let mut labels = BTreeMap::from([(
                            "kubernetes.io/metadata.name".to_string(),
                            name.to_string(),
                        )]);
                        let mut put = |k: &str, v: Option<&str>| {
                            if let Some(v) = v {
                                labels.insert(k.into(), v.into());
                            }
                        };
                        put("modelgate.io/inject", inject);
                        put("modelgate.io/mode", mode);
                        put("modelgate.io/exceptions", exceptions);
                        let vap_binds = binds(&vap, &vap_binding, &labels);
                        assert_eq!(
                            binds(&map, &map_binding, &labels),
                            vap_binds,
                            "{default_mode:?} {labels:?}"
                        );
                        // The VAP's own selection, as docs/policy.md §13 and §14 say it.
                        let expected = name == "team-a"
                            && inject == Some("enabled")
                            && exceptions != Some("allowed")
                            && match mode {
                                None => default_mode == Mode::Enforce,
                                Some(m) => !["warn", "audit", "off"].contains(&m),
                            };
                        assert_eq!(vap_binds, expected, "{default_mode:?} {labels:?}");
                        compared += 1;
                    }
                }
            }
        }
    }
    assert_eq!(compared, 4 * 3 * 3 * 6 * 3);
}

/// `backstop --mutating` prints the VAP, its binding, the MAP and its binding; a previous
/// release with other settings of §3 is refused with exit 2, naming the flag.
#[test]
fn backstop_mutating_prints_the_map_after_the_vap() {
    let run = cli::modelgate(&["backstop", "--mutating"]);
    cli::assert_exit(&run, 0);
    let kinds: Vec<&str> = run
        .stdout
        .lines()
        .filter_map(|l| l.strip_prefix("kind: "))
        .collect();
    assert_eq!(
        kinds,
        [
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
            "MutatingAdmissionPolicy",
            "MutatingAdmissionPolicyBinding"
        ]
    );
    let dir = tempfile::tempdir().unwrap();
    let previous = dir.path().join("previous");
    std::fs::write(&previous, "--run-as-user 2000\n").unwrap();
    let previous = previous.to_str().unwrap();
    let run = cli::modelgate(&["backstop", "--mutating", "--previous-values", previous]);
    cli::assert_exit(&run, 2);
    assert!(run.stderr.contains("--run-as-user"), "{}", run.stderr);
    assert!(run.stdout.is_empty());
    // Without --mutating, the upgrade prints the VAP as before.
    cli::assert_exit(
        &cli::modelgate(&["backstop", "--previous-values", previous]),
        0,
    );
}
