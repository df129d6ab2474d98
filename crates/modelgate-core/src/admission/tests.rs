//! Unit tests of the pipeline, one per rule of docs/policy.md §1–§7, through the same entry point the
//! server uses: AdmissionReview bytes in, AdmissionReview bytes out.

use serde_json::{Value, json};

use super::*;
use crate::cache::{CacheEntry, CacheIndex, CacheScope};
use crate::config::{IdSetting, PolicyConfig, PrepMode};
use crate::testing;
use base64::Engine;

fn review_of(kind: &str, operation: &str, sub: Option<&str>, ns: &str, object: Value) -> Value {
    let (group, version) = match kind {
        "Job" => ("batch", "v1"),
        "Deployment" => ("apps", "v1"),
        _ => ("", "v1"),
    };
    let mut req = json!({
        "uid": "uid-1",
        "kind": {"group": group, "version": version, "kind": kind},
        "resource": {"group": group, "version": version, "resource": format!("{}s", kind.to_lowercase())},
        "namespace": ns,
        "operation": operation,
        "userInfo": {"username": "alice"},
        "object": object,
    });
    if let Some(s) = sub {
        req["subResource"] = json!(s);
    }
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": req})
}

struct Answer {
    response: Value,
    patch: Vec<Value>,
    patched: Value,
}

impl Answer {
    fn allowed(&self) -> bool {
        self.response["allowed"] == true
    }
    fn message(&self) -> String {
        self.response["status"]["message"]
            .as_str()
            .unwrap_or("")
            .to_string()
    }
    fn warnings(&self) -> Vec<String> {
        self.response["warnings"]
            .as_array()
            .map(|a| a.iter().map(|w| w.as_str().unwrap().to_string()).collect())
            .unwrap_or_default()
    }
}

fn run_with(webhook: Webhook, review: &Value, cfg: &PolicyConfig, index: &CacheIndex) -> Answer {
    let answer = testing::review(webhook, review, &testing::context(cfg, index));
    assert_eq!(answer.http, 200, "{}", answer.body);
    Answer {
        patched: answer.patched(&review["request"]["object"]),
        patch: answer.ops.unwrap_or_default(),
        response: answer.body["response"].clone(),
    }
}

/// Mutates, then checks what the API server's reinvocation and validating webhook would: a
/// second pass yields no patch and the result validates.
fn mutate_with(
    kind: &str,
    ns: &str,
    object: Value,
    cfg: &PolicyConfig,
    index: &CacheIndex,
) -> Answer {
    let a = run_with(
        Webhook::Mutate,
        &review_of(kind, "CREATE", None, ns, object),
        cfg,
        index,
    );
    if a.allowed() {
        let again = run_with(
            Webhook::Mutate,
            &review_of(kind, "CREATE", None, ns, a.patched.clone()),
            cfg,
            index,
        );
        assert!(
            again.patch.is_empty(),
            "second pass must be empty: {:?}",
            again.patch
        );
        let v = run_with(
            Webhook::Validate,
            &review_of(kind, "CREATE", None, ns, a.patched.clone()),
            cfg,
            index,
        );
        assert!(v.allowed(), "patched object must validate: {}", v.message());
        assert!(v.response.get("patch").is_none(), "validate never patches");
    }
    a
}

fn mutate(object: Value) -> Answer {
    mutate_with(
        "Pod",
        "team-a",
        object,
        &PolicyConfig::default(),
        &CacheIndex::new(),
    )
}

fn validate_pod(object: Value, cfg: &PolicyConfig) -> Answer {
    run_with(
        Webhook::Validate,
        &review_of("Pod", "CREATE", None, "team-a", object),
        cfg,
        &CacheIndex::new(),
    )
}

fn pod(spec: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "llm-"}, "spec": spec})
}

fn cache_pod(volume: Value) -> Value {
    pod(json!({
        "volumes": [volume],
        "containers": [{"name": "main", "image": "vllm", "volumeMounts": [{"name": "model-cache", "mountPath": "/cache"}]}]
    }))
}

fn pvc_volume() -> Value {
    json!({"name": "model-cache", "persistentVolumeClaim": {"claimName": "c"}})
}

fn prep_of(patched: &Value) -> &Value {
    patched["spec"]["initContainers"]
        .as_array()
        .and_then(|a| a.iter().find(|c| c["name"] == "model-cache-prep"))
        .unwrap_or(&Value::Null)
}

fn prep_command(patched: &Value) -> String {
    prep_of(patched)["command"][2]
        .as_str()
        .unwrap_or("")
        .to_string()
}

// §3 -----------------------------------------------------------------------------------------

#[test]
fn pod_without_security_context_gets_non_root_numeric_user() {
    let a = mutate(pod(json!({"containers": [{"name": "c", "image": "x"}]})));
    assert!(a.allowed());
    assert_eq!(
        a.patched["spec"]["securityContext"],
        json!({"runAsNonRoot": true, "runAsUser": 1000, "runAsGroup": 1000})
    );
    // No cache volume: no fsGroup, no prep.
    assert!(a.patched["spec"].get("initContainers").is_none());
}

#[test]
fn existing_valid_values_are_kept() {
    let a = mutate(pod(json!({
        "securityContext": {"runAsUser": 5000, "runAsGroup": 6000, "runAsNonRoot": true},
        "containers": [{"name": "c", "image": "x"}]
    })));
    assert!(a.patch.is_empty(), "{:?}", a.patch);
}

#[test]
fn container_level_uid_on_every_container_means_no_pod_uid() {
    let a = mutate(pod(json!({
        "initContainers": [{"name": "i", "image": "x", "securityContext": {"runAsUser": 7, "runAsGroup": 7}}],
        "containers": [{"name": "c", "image": "x", "securityContext": {"runAsUser": 8, "runAsGroup": 8}}]
    })));
    assert_eq!(
        a.patched["spec"]["securityContext"],
        json!({"runAsNonRoot": true})
    );
}

#[test]
fn one_container_without_uid_gives_the_pod_a_uid() {
    let a = mutate(pod(json!({
        "containers": [
            {"name": "a", "image": "x", "securityContext": {"runAsUser": 8}},
            {"name": "b", "image": "x"}
        ]
    })));
    assert_eq!(a.patched["spec"]["securityContext"]["runAsUser"], 1000);
    assert_eq!(
        a.patched["spec"]["containers"][0]["securityContext"]["runAsUser"],
        8
    );
}

#[test]
fn run_as_non_root_false_on_any_container_kind_becomes_true_with_a_warning() {
    let a = mutate(pod(json!({
        "securityContext": {"runAsNonRoot": false},
        "initContainers": [{"name": "i", "image": "x", "securityContext": {"runAsNonRoot": false}}],
        "containers": [{"name": "c", "image": "x", "securityContext": {"runAsNonRoot": false}}],
        "ephemeralContainers": [{"name": "e", "image": "x", "securityContext": {"runAsNonRoot": false}}]
    })));
    let spec = &a.patched["spec"];
    assert_eq!(spec["securityContext"]["runAsNonRoot"], true);
    for list in ["initContainers", "containers", "ephemeralContainers"] {
        assert_eq!(
            spec[list][0]["securityContext"]["runAsNonRoot"], true,
            "{list}"
        );
    }
    let w = a.warnings();
    for name in ["i", "c", "e"] {
        assert!(
            w.contains(&format!(
                "container {name}: runAsNonRoot false changed to true"
            )),
            "{w:?}"
        );
    }
}

#[test]
fn run_as_user_none_never_sets_uid_or_gid() {
    let cfg = PolicyConfig {
        run_as_user: IdSetting::None,
        run_as_group: IdSetting::None,
        ..Default::default()
    };
    let a = mutate_with(
        "Pod",
        "t",
        pod(json!({"containers": [{"name": "c", "image": "x"}]})),
        &cfg,
        &CacheIndex::new(),
    );
    assert_eq!(
        a.patched["spec"]["securityContext"],
        json!({"runAsNonRoot": true})
    );
}

#[test]
fn never_mode_runs_a_cache_pod_as_the_cache_owner() {
    let cfg = PolicyConfig {
        model_cache_prep: PrepMode::Never,
        ..Default::default()
    };
    let a = mutate_with(
        "Pod",
        "t",
        cache_pod(pvc_volume()),
        &cfg,
        &CacheIndex::new(),
    );
    let sc = &a.patched["spec"]["securityContext"];
    assert_eq!(sc["runAsUser"], 101);
    assert_eq!(sc["fsGroup"], 102);
    assert!(
        a.patched["spec"].get("initContainers").is_none(),
        "never: no prep"
    );
    // A pod without the cache volume still gets --run-as-user.
    let b = mutate_with(
        "Pod",
        "t",
        pod(json!({"containers": [{"name": "c", "image": "x"}]})),
        &cfg,
        &CacheIndex::new(),
    );
    assert_eq!(b.patched["spec"]["securityContext"]["runAsUser"], 1000);
}

#[test]
fn windows_pods_get_run_as_non_root_only() {
    let a = mutate(pod(json!({
        "os": {"name": "windows"},
        "volumes": [pvc_volume()],
        "containers": [{"name": "c", "image": "x"}]
    })));
    assert_eq!(
        a.patched["spec"]["securityContext"],
        json!({"runAsNonRoot": true})
    );
    assert!(a.patched["spec"].get("initContainers").is_none());
}

#[test]
fn pods_that_select_windows_nodes_are_windows_pods() {
    let only_windows = json!({"nodeSelectorTerms": [
        {"matchExpressions": [
            {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]},
            {"key": "kubernetes.io/os", "operator": "In", "values": ["windows"]}
        ]},
        {"matchExpressions": [{"key": "kubernetes.io/os", "operator": "In", "values": ["windows"]}]}
    ]});
    let windows_or_linux = json!({"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "kubernetes.io/os", "operator": "In", "values": ["windows"]}]},
        {"matchExpressions": [{"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}]}
    ]});
    let either_value = json!({"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "kubernetes.io/os", "operator": "In", "values": ["windows", "linux"]}]}
    ]});
    let not_linux = json!({"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "kubernetes.io/os", "operator": "NotIn", "values": ["linux"]}]}
    ]});
    let required = |terms: &Value| json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": terms}});
    let preferred = json!({"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 1, "preference": {"matchExpressions": [
            {"key": "kubernetes.io/os", "operator": "In", "values": ["windows"]}]}}
    ]}});
    for (selection, windows) in [
        (
            json!({"nodeSelector": {"kubernetes.io/os": "windows"}}),
            true,
        ),
        (
            json!({"nodeSelector": {"kubernetes.io/os": "linux"}}),
            false,
        ),
        (json!({"affinity": required(&only_windows)}), true),
        (json!({"affinity": required(&windows_or_linux)}), false),
        (json!({"affinity": required(&either_value)}), false),
        (json!({"affinity": required(&not_linux)}), false),
        (json!({"affinity": preferred}), false),
        // `spec.os` decides when present.
        (
            json!({"os": {"name": "linux"}, "nodeSelector": {"kubernetes.io/os": "windows"}}),
            false,
        ),
    ] {
        let mut spec = selection.clone();
        spec["volumes"] = json!([pvc_volume()]);
        spec["containers"] = json!([{"name": "c", "image": "x"}]);
        let a = mutate(pod(spec));
        let sc = &a.patched["spec"]["securityContext"];
        assert_eq!(sc["runAsNonRoot"], true, "{selection}");
        assert_eq!(sc.get("runAsUser").is_none(), windows, "{selection}");
        assert_eq!(sc.get("fsGroup").is_none(), windows, "{selection}");
        assert_eq!(
            a.patched["spec"].get("initContainers").is_none(),
            windows,
            "{selection}"
        );
    }
}

#[test]
fn unknown_fields_survive() {
    let mut p = cache_pod(pvc_volume());
    p["spec"]["futureField"] = json!({"x": 1});
    p["spec"]["containers"][0]["futureContainerField"] = json!(true);
    p["metadata"]["futureMeta"] = json!("keep");
    let a = mutate(p);
    assert_eq!(a.patched["spec"]["futureField"], json!({"x": 1}));
    assert_eq!(
        a.patched["spec"]["containers"][0]["futureContainerField"],
        true
    );
    assert_eq!(a.patched["metadata"]["futureMeta"], "keep");
}

// §4 -----------------------------------------------------------------------------------------

#[test]
fn prep_is_the_first_init_container_with_the_fsgroup_command() {
    let mut p = cache_pod(pvc_volume());
    p["spec"]["initContainers"] = json!([{"name": "download", "image": "x"}]);
    let a = mutate(p);
    let init = a.patched["spec"]["initContainers"].as_array().unwrap();
    assert_eq!(init[0]["name"], "model-cache-prep");
    assert_eq!(init[1]["name"], "download");
    assert_eq!(a.patched["spec"]["securityContext"]["fsGroup"], 102);
    assert_eq!(
        prep_command(&a.patched),
        "chown 0:102 /models && chmod g+rwX /models"
    );
    let prep = &init[0];
    assert_eq!(prep["image"], "docker.io/curlimages/curl:8.18.0");
    assert_eq!(prep["command"][0], "sh");
    assert_eq!(prep["command"][1], "-c");
    assert_eq!(
        prep["volumeMounts"],
        json!([{"name": "model-cache", "mountPath": "/models"}])
    );
    assert_eq!(
        prep["securityContext"],
        json!({"runAsUser": 0, "runAsNonRoot": false, "allowPrivilegeEscalation": false,
               "readOnlyRootFilesystem": true,
               "capabilities": {"drop": ["ALL"], "add": ["CHOWN", "FOWNER"]},
               "seccompProfile": {"type": "RuntimeDefault"}})
    );
    assert!(prep["resources"]["requests"].is_object() && prep["resources"]["limits"].is_object());
}

#[test]
fn existing_fsgroup_is_used() {
    let mut p = cache_pod(pvc_volume());
    p["spec"]["securityContext"] = json!({"fsGroup": 2000});
    let a = mutate(p);
    assert_eq!(a.patched["spec"]["securityContext"]["fsGroup"], 2000);
    assert_eq!(
        prep_command(&a.patched),
        "chown 0:2000 /models && chmod g+rwX /models"
    );
}

#[test]
fn without_fsgroup_the_owner_is_the_pod_uid_else_the_init_container_user() {
    let cfg = PolicyConfig {
        default_fsgroup: 0,
        ..Default::default()
    };
    let a = mutate_with(
        "Pod",
        "t",
        cache_pod(pvc_volume()),
        &cfg,
        &CacheIndex::new(),
    );
    assert!(
        a.patched["spec"]["securityContext"]
            .get("fsGroup")
            .is_none()
    );
    assert_eq!(
        prep_command(&a.patched),
        "chown 1000:0 /models && chmod 770 /models"
    );

    let cfg = PolicyConfig {
        default_fsgroup: -1,
        run_as_user: IdSetting::None,
        init_container_user: 1000680000,
        ..Default::default()
    };
    let a = mutate_with(
        "Pod",
        "t",
        cache_pod(pvc_volume()),
        &cfg,
        &CacheIndex::new(),
    );
    assert!(
        a.patched["spec"]["securityContext"]
            .get("runAsUser")
            .is_none()
    );
    assert_eq!(
        prep_command(&a.patched),
        "chown 1000680000:0 /models && chmod 770 /models"
    );
}

#[test]
fn only_provisioned_storage_gets_a_prep() {
    // (source, prep, fsGroup): a claim or claim template gets both; an inline volume names its
    // storage in the pod (a server, export or disk of its choosing), so it gets the fsGroup
    // but no root prep; what is not storage gets neither.
    for (source, prep, expected) in [
        (
            json!({"persistentVolumeClaim": {"claimName": "c"}}),
            true,
            true,
        ),
        (
            json!({"ephemeral": {"volumeClaimTemplate": {"spec": {}}}}),
            true,
            true,
        ),
        (json!({"csi": {"driver": "d"}}), false, true),
        (json!({"nfs": {"server": "s", "path": "/p"}}), false, true),
        (json!({"cephfs": {"monitors": ["m"]}}), false, true),
        (
            json!({"rbd": {"monitors": ["m"], "image": "i"}}),
            false,
            true,
        ),
        (
            json!({"iscsi": {"targetPortal": "t", "iqn": "q", "lun": 0}}),
            false,
            true,
        ),
        (
            json!({"azureFile": {"secretName": "s", "shareName": "d"}}),
            false,
            true,
        ),
        (
            json!({"awsElasticBlockStore": {"volumeID": "v"}}),
            false,
            true,
        ),
        (json!({"gcePersistentDisk": {"pdName": "p"}}), false, true),
        (json!({"emptyDir": {}}), false, false),
        (json!({"configMap": {"name": "c"}}), false, false),
        (json!({"secret": {"secretName": "s"}}), false, false),
        (json!({"downwardAPI": {}}), false, false),
        (json!({"projected": {"sources": []}}), false, false),
        (json!({"image": {"reference": "r"}}), false, false),
        (json!({"gitRepo": {"repository": "r"}}), false, false),
        // No source: the API server makes it an emptyDir.
        (json!({}), false, false),
    ] {
        let mut vol = source.clone();
        vol["name"] = json!("model-cache");
        let a = mutate(cache_pod(vol));
        assert_eq!(prep_of(&a.patched).is_object(), prep, "{source}");
        assert_eq!(
            a.patched["spec"]["securityContext"]
                .get("fsGroup")
                .is_some(),
            expected,
            "{source}"
        );
    }
}

/// An inline network volume gets the root prep only when the operator allows its type with
/// `--prep-volume-type`; otherwise the pod is treated as under `--model-cache-prep=never`, with
/// a warning that says why, and `/validate` refuses a prep container there.
#[test]
fn an_inline_network_volume_gets_the_prep_only_by_its_type() {
    let nfs = json!({"name": "model-cache", "nfs": {"server": "10.0.0.1", "path": "/"}});
    let a = mutate(cache_pod(nfs.clone()));
    assert!(prep_of(&a.patched).is_null(), "{}", a.patched);
    assert_eq!(
        a.warnings(),
        [
            "the cache volume is an inline nfs volume, whose storage the pod names: no root \
          model-cache-prep there (--prep-volume-type allows a type); the pod is treated as \
          under --model-cache-prep=never"
        ]
    );
    let cfg = PolicyConfig {
        prep_volume_types: vec!["nfs".into()],
        ..PolicyConfig::default()
    };
    let index = CacheIndex::new();
    let allowed = mutate_with("Pod", "team-a", cache_pod(nfs.clone()), &cfg, &index);
    assert_eq!(
        prep_command(&allowed.patched),
        "chown 0:102 /models && chmod g+rwX /models"
    );
    assert!(allowed.warnings().is_empty(), "{:?}", allowed.warnings());
    // Another type stays refused under that flag.
    let csi = json!({"name": "model-cache", "csi": {"driver": "x"}});
    let a = mutate_with("Pod", "team-a", cache_pod(csi), &cfg, &index);
    assert!(prep_of(&a.patched).is_null(), "{}", a.patched);
    // The prep the flag allowed is refused by a validator without it.
    assert!(validate_pod(allowed.patched.clone(), &cfg).allowed());
    assert!(!validate_pod(allowed.patched, &PolicyConfig::default()).allowed());
}

/// docs/policy.md §4: a `hostPath` cache volume names a node directory the pod chose, so the root prep
/// never runs there unless the operator allowed the directory with `--prep-host-path`; the pod
/// is then treated as under `--model-cache-prep=never`, with a warning that says why.
#[test]
fn a_host_path_cache_gets_no_root_prep_outside_the_allowed_prefixes() {
    let host = |path: &str| json!({"name": "model-cache", "hostPath": {"path": path}});
    let withheld = |path: &str| {
        format!(
            "the cache volume is hostPath {path} on the node, outside --prep-host-path: no root \
             model-cache-prep there; the pod is treated as under --model-cache-prep=never"
        )
    };
    // No prefix by default: `chown 0:102 /etc && chmod g+rwX /etc` is never written.
    let a = mutate(cache_pod(host("/etc")));
    assert!(prep_of(&a.patched).is_null(), "{}", a.patched);
    assert_eq!(
        a.patched["spec"]["securityContext"],
        json!({"runAsNonRoot": true, "runAsUser": 101, "runAsGroup": 1000, "fsGroup": 102})
    );
    assert_eq!(a.warnings(), [withheld("/etc")]);

    let cfg = PolicyConfig {
        prep_host_paths: vec!["/data/models".into()],
        ..PolicyConfig::default()
    };
    let index = CacheIndex::new();
    let allowed = mutate_with(
        "Pod",
        "team-a",
        cache_pod(host("/data/models/llm")),
        &cfg,
        &index,
    );
    assert_eq!(
        prep_command(&allowed.patched),
        "chown 0:102 /models && chmod g+rwX /models"
    );
    assert!(allowed.warnings().is_empty(), "{:?}", allowed.warnings());
    for outside in [
        "/data/models-evil",
        "/data/models/../../etc",
        "/data",
        "models",
    ] {
        let a = mutate_with("Pod", "team-a", cache_pod(host(outside)), &cfg, &index);
        assert!(prep_of(&a.patched).is_null(), "{outside}: {}", a.patched);
        assert_eq!(a.warnings(), [withheld(outside)], "{outside}");
    }
    // A hostPath named by the per-pod annotation is held to the same rule.
    let mut annotated = cache_pod(json!({"name": "weights", "hostPath": {"path": "/"}}));
    annotated["metadata"]["annotations"] = json!({"modelgate.io/cache-volume": "weights"});
    assert!(prep_of(&mutate(annotated).patched).is_null());

    // The validator never lets a prep through on a disallowed host path, canonical or not.
    assert!(validate_pod(allowed.patched.clone(), &cfg).allowed());
    let a = validate_pod(allowed.patched.clone(), &PolicyConfig::default());
    assert!(
        a.message()
            .contains("spec.initContainers[0]: a container named model-cache-prep that is not"),
        "{}",
        a.message()
    );
    let mut moved = allowed.patched.clone();
    moved["spec"]["volumes"][0]["hostPath"]["path"] = json!("/data/models/../../etc");
    assert!(!validate_pod(moved, &cfg).allowed());
}

#[test]
fn cache_volume_name_from_flag_and_annotation() {
    let vol = json!({"name": "weights", "persistentVolumeClaim": {"claimName": "c"}});
    let mut p = cache_pod(vol.clone());
    assert!(!prep_of(&mutate(p.clone()).patched).is_object());
    p["metadata"]["annotations"] = json!({"modelgate.io/cache-volume": "weights"});
    let a = mutate(p);
    assert_eq!(prep_of(&a.patched)["volumeMounts"][0]["name"], "weights");
    let cfg = PolicyConfig {
        cache_volume: "weights".into(),
        cache_mount_path: "/cache-root".into(),
        ..Default::default()
    };
    let a = mutate_with("Pod", "t", cache_pod(vol), &cfg, &CacheIndex::new());
    assert_eq!(
        prep_command(&a.patched),
        "chown 0:102 /cache-root && chmod g+rwX /cache-root"
    );
}

#[test]
fn canonical_prep_is_left_alone_and_a_stale_one_is_replaced() {
    let first = mutate(cache_pod(pvc_volume())).patched;
    // Canonical: nothing changes (checked by mutate's idempotency pass), plus API defaults.
    let mut defaulted = first.clone();
    defaulted["spec"]["initContainers"][0]["imagePullPolicy"] = json!("IfNotPresent");
    defaulted["spec"]["initContainers"][0]["terminationMessagePath"] =
        json!("/dev/termination-log");
    assert!(mutate(defaulted).patch.is_empty());

    // A Job template rendered for uid 101 without fsGroup, whose pod then got another uid.
    let mut stale = first.clone();
    stale["spec"]["securityContext"] =
        json!({"runAsNonRoot": true, "runAsUser": 1000680000, "runAsGroup": 0});
    stale["spec"]["initContainers"][0]["command"][2] =
        json!("chown 101:0 /models && chmod 770 /models");
    let cfg = PolicyConfig {
        default_fsgroup: 0,
        ..Default::default()
    };
    let a = mutate_with("Pod", "t", stale, &cfg, &CacheIndex::new());
    assert_eq!(
        prep_command(&a.patched),
        "chown 1000680000:0 /models && chmod 770 /models"
    );
    assert_eq!(
        a.patched["spec"]["initContainers"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    assert!(a.warnings().iter().any(|w| w.contains("replaced")));
}

/// After modelgate's patch the API server re-runs its own admission plugins, and the
/// ServiceAccount plugin mounts the token into the injected prep too (docs/policy.md §4). That prep is
/// still canonical: the reinvoked /mutate leaves it, /validate allows it.
#[test]
fn the_prep_with_the_api_servers_token_mount_needs_no_second_round() {
    let token_volume = json!({"name": "kube-api-access-7xq2n", "projected": {"defaultMode": 420,
        "sources": [{"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}}]}});
    let token_mount = json!({"name": "kube-api-access-7xq2n", "readOnly": true,
        "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"});
    let mut object = cache_pod(pvc_volume());
    object["spec"]["volumes"]
        .as_array_mut()
        .unwrap()
        .push(token_volume);
    object["spec"]["containers"][0]["volumeMounts"]
        .as_array_mut()
        .unwrap()
        .push(token_mount.clone());
    let first = mutate(object).patched;
    // What the plugin does on its re-run: the prep lacks a mount at the token path, so it gets one.
    let mut replugged = first.clone();
    let prep = &mut replugged["spec"]["initContainers"][0];
    assert_eq!(prep["name"], "model-cache-prep");
    prep["volumeMounts"]
        .as_array_mut()
        .unwrap()
        .push(token_mount);
    prep["imagePullPolicy"] = json!("IfNotPresent");
    let again = mutate(replugged);
    assert!(again.patch.is_empty(), "{:?}", again.patch);
}

/// The prep's requests equal its limits, so a pod whose containers all have requests equal to
/// limits stays `Guaranteed` (static CPU pinning).
#[test]
fn the_prep_keeps_a_guaranteed_pod_guaranteed() {
    let mut object = cache_pod(pvc_volume());
    let equal = json!({"requests": {"cpu": "4", "memory": "16Gi"}, "limits": {"cpu": "4", "memory": "16Gi"}});
    object["spec"]["containers"][0]["resources"] = equal;
    let patched = mutate(object).patched;
    let resources = &prep_of(&patched)["resources"];
    assert!(resources["limits"]["cpu"].is_string() && resources["limits"]["memory"].is_string());
    assert_eq!(resources["requests"], resources["limits"]);
}

#[test]
fn validator_lets_through_only_the_canonical_prep() {
    let cfg = PolicyConfig::default();
    let good = mutate(cache_pod(pvc_volume())).patched;
    assert!(validate_pod(good.clone(), &cfg).allowed());

    let mut smuggled = good.clone();
    smuggled["spec"]["initContainers"][0]["command"][2] = json!("chown 0:102 /models; id");
    let a = validate_pod(smuggled, &cfg);
    assert!(!a.allowed());
    assert!(
        a.message()
            .contains("spec.initContainers[0]: a container named model-cache-prep"),
        "{}",
        a.message()
    );

    // A root "prep" as a regular container, or in a pod without a cache volume.
    let mut regular = good.clone();
    let prep = regular["spec"]["initContainers"][0].clone();
    regular["spec"]["containers"]
        .as_array_mut()
        .unwrap()
        .push(prep.clone());
    let a = validate_pod(regular, &cfg);
    assert!(
        a.message()
            .contains("spec.containers[1]: a container named model-cache-prep"),
        "{}",
        a.message()
    );
    let no_cache = pod(
        json!({"securityContext": {"runAsNonRoot": true, "runAsUser": 5},
                             "initContainers": [prep], "containers": [{"name": "c", "image": "x"}]}),
    );
    let a = validate_pod(no_cache, &cfg);
    assert!(!a.allowed());
    assert!(
        a.message().contains(
            "spec.initContainers[0].securityContext.runAsUser: 0 is outside 1..2147483647"
        ),
        "{}",
        a.message()
    );
}

/// docs/policy.md §6: `/validate` alone refuses every container but the canonical prep whose effective
/// `runAsNonRoot` (its own, else the pod's) is not `true`, naming the container's own field.
#[test]
fn validator_alone_refuses_a_container_without_effective_run_as_non_root() {
    let cfg = PolicyConfig::default();
    let message = |spec: Value| {
        let a = validate_pod(pod(spec), &cfg);
        assert_eq!(a.allowed(), a.message().is_empty(), "{}", a.message());
        a.message()
    };
    let c = |sc: Value| json!({"name": "c", "image": "x", "securityContext": sc});
    // The pod's true covers every container; a container's own true overrides the pod's false.
    assert_eq!(
        message(json!({"securityContext": {"runAsNonRoot": true}, "containers": [c(json!({}))]})),
        ""
    );
    assert_eq!(
        message(json!({"securityContext": {"runAsNonRoot": false},
                       "containers": [c(json!({"runAsNonRoot": true}))]})),
        ""
    );
    // Unset on both, in every list: each container named.
    let m = message(json!({
        "initContainers": [{"name": "i", "image": "x"}],
        "containers": [c(json!({"runAsUser": 5}))],
        "ephemeralContainers": [{"name": "e", "image": "x"}]
    }));
    for list in ["initContainers", "containers", "ephemeralContainers"] {
        assert!(
            m.contains(&format!(
                "spec.{list}[0].securityContext.runAsNonRoot: not set (neither the container nor the pod sets it to true)"
            )),
            "{m}"
        );
    }
    assert!(
        m.ends_with("check that it is registered for this namespace)."),
        "{m}"
    );
    // The pod says false and the container nothing.
    let m =
        message(json!({"securityContext": {"runAsNonRoot": false}, "containers": [c(json!({}))]}));
    assert!(
        m.starts_with(
            "spec.containers[0].securityContext.runAsNonRoot: not set, and the pod's spec.securityContext.runAsNonRoot is false. "
        ),
        "{m}"
    );
    // The container says false: the message of old, whatever the pod says.
    let m = message(
        json!({"securityContext": {"runAsNonRoot": true}, "containers": [c(json!({"runAsNonRoot": false}))]}),
    );
    assert!(
        m.starts_with("spec.containers[0].securityContext.runAsNonRoot: false is not allowed. "),
        "{m}"
    );
    // A Windows pod is held to it too (mutation sets it there as well).
    let windows = json!({"os": {"name": "windows"}, "containers": [c(json!({}))]});
    assert!(message(windows.clone()).contains("runAsNonRoot: not set"));
    let mutated = mutate(pod(windows)).patched;
    assert!(validate_pod(mutated, &cfg).allowed());
    // The canonical prep (runAsNonRoot: false, by necessity) is the one exception.
    let prepped = mutate(cache_pod(pvc_volume())).patched;
    assert_eq!(prep_of(&prepped)["securityContext"]["runAsNonRoot"], false);
    assert!(validate_pod(prepped, &cfg).allowed());
}

// §5 -----------------------------------------------------------------------------------------

/// Caches with everything a hit needs: node groups `workers` (node-type=gpu) and `gpu` (a PV
/// without node affinity), Node n1 (gpu) with the models downloaded, and the PVCs KServe makes.
fn caches() -> CacheIndex {
    use crate::cache::{PvcPhase, PvcState};
    let mut idx = CacheIndex::new();
    let add = |idx: &mut CacheIndex, scope: CacheScope, name: &str, uri: &str, groups: &[&str]| {
        idx.upsert_cache(CacheEntry::new(scope, name, uri, groups).downloaded_on(&["n1"]))
    };
    add(
        &mut idx,
        CacheScope::Cluster,
        "llama",
        "hf://org/m",
        &["workers", "gpu"],
    );
    add(
        &mut idx,
        CacheScope::Namespace("team-a".into()),
        "mine",
        "hf://org/m/",
        &["workers"],
    );
    add(
        &mut idx,
        CacheScope::Namespace("team-b".into()),
        "theirs",
        "gs://b/model",
        &["workers"],
    );
    let term: k8s_openapi::api::core::v1::NodeSelectorTerm = serde_json::from_value(
        json!({"matchExpressions": [{"key": "node-type", "operator": "In", "values": ["gpu"]}]}),
    )
    .unwrap();
    idx.upsert_node_group("workers", Some(vec![term]));
    idx.upsert_node_group("gpu", None);
    idx.upsert_node(
        "n1",
        [
            ("kubernetes.io/hostname".to_string(), "n1".to_string()),
            ("node-type".to_string(), "gpu".to_string()),
        ]
        .into(),
    );
    let bound = PvcState::provisioned(PvcPhase::Bound);
    for (ns, pvc) in [
        ("team-a", "mine-workers"),
        ("team-b", "theirs-workers"),
        ("team-c", "llama-workers"),
        ("team-c", "llama-gpu"),
    ] {
        idx.upsert_pvc(ns, pvc, bound.clone());
    }
    idx
}

fn pin() -> Value {
    json!({"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1"]})
}

fn model_pod(annotations: Value) -> Value {
    let mut p = pod(json!({
        "containers": [
            {"name": "server", "image": "vllm"},
            {"name": "sidecar", "image": "x", "volumeMounts": [{"name": "other", "mountPath": "/mnt/models"}]}
        ],
        "volumes": [{"name": "other", "emptyDir": {}}]
    }));
    p["metadata"]["annotations"] = annotations;
    p
}

#[test]
fn namespace_cache_beats_cluster_cache_and_is_mounted() {
    let a = mutate_with(
        "Pod",
        "team-a",
        model_pod(json!({"modelgate.io/model-uri": "hf://org/m/weights"})),
        &PolicyConfig::default(),
        &caches(),
    );
    let key = crate::policy::model_cache::storage_key("hf://org/m/");
    let ann = &a.patched["metadata"]["annotations"];
    assert_eq!(ann["modelgate.io/model-cache"], "namespace/team-a/mine");
    assert_eq!(
        ann["modelgate.io/resolved-uri"],
        format!("pvc://mine-workers/models/{key}/weights")
    );
    let vols = a.patched["spec"]["volumes"].as_array().unwrap();
    assert!(vols.contains(&json!({"name": "modelgate-model", "persistentVolumeClaim": {"claimName": "mine-workers", "readOnly": true}})));
    assert_eq!(
        a.patched["spec"]["containers"][0]["volumeMounts"],
        json!([{"name": "modelgate-model", "mountPath": "/mnt/models", "subPath": format!("models/{key}/weights"), "readOnly": true}])
    );
    // The sidecar already mounts something at /mnt/models: skipped with a warning.
    assert_eq!(
        a.patched["spec"]["containers"][1]["volumeMounts"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    let w = a.warnings();
    assert!(
        w.iter().any(|w| w
            == "container sidecar already mounts other at /mnt/models: model not mounted there"),
        "{w:?}"
    );
    assert!(
        w.contains(
            &"model hf://org/m/weights served from LocalModelNamespaceCache team-a/mine"
                .to_string()
        ),
        "{w:?}"
    );
    assert_eq!(
        a.patched["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"],
        json!([{"matchExpressions": [{"key": "node-type", "operator": "In", "values": ["gpu"]}, pin()]}])
    );
    assert!(ann.get("modelgate.io/model-cache-reason").is_none());
}

#[test]
fn other_namespaces_use_the_cluster_cache_and_never_anothers() {
    let a = mutate_with(
        "Pod",
        "team-c",
        model_pod(
            json!({"internal.serving.kserve.io/storage-initializer-sourceuri": "hf://org/m", "serving.kserve.io/nodegroup": "gpu"}),
        ),
        &PolicyConfig::default(),
        &caches(),
    );
    let ann = &a.patched["metadata"]["annotations"];
    assert_eq!(ann["modelgate.io/model-cache"], "cluster/llama");
    let key = crate::policy::model_cache::storage_key("hf://org/m");
    assert_eq!(
        ann["modelgate.io/resolved-uri"],
        format!("pvc://llama-gpu/models/{key}")
    );
    // gpu's PV has no node affinity: the pod is pinned by hostname only.
    assert_eq!(
        a.patched["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"],
        json!([{"matchExpressions": [pin()]}])
    );

    let a = mutate_with(
        "Pod",
        "team-a",
        model_pod(json!({"modelgate.io/model-uri": "gs://b/model"})),
        &PolicyConfig::default(),
        &caches(),
    );
    assert_eq!(
        a.patched["metadata"]["annotations"]["modelgate.io/model-cache"],
        "miss"
    );
}

#[test]
fn lookalike_prefix_is_a_miss() {
    let a = mutate_with(
        "Pod",
        "team-b",
        model_pod(json!({"modelgate.io/model-uri": "gs://b/model-evil"})),
        &PolicyConfig::default(),
        &caches(),
    );
    assert_eq!(
        a.patched["metadata"]["annotations"]["modelgate.io/model-cache"],
        "miss"
    );
    assert!(
        a.patched["metadata"]["annotations"]
            .get("modelgate.io/resolved-uri")
            .is_none()
    );
}

#[test]
fn miss_removes_stale_resolution() {
    let hit = mutate_with(
        "Pod",
        "team-c",
        model_pod(json!({"modelgate.io/model-uri": "hf://org/m"})),
        &PolicyConfig::default(),
        &caches(),
    )
    .patched;
    assert!(hit["metadata"]["annotations"]["modelgate.io/resolved-uri"].is_string());
    // The cache is gone by the time the Job's pod arrives.
    let a = mutate_with(
        "Pod",
        "team-c",
        hit,
        &PolicyConfig::default(),
        &CacheIndex::new(),
    );
    let ann = &a.patched["metadata"]["annotations"];
    assert_eq!(ann["modelgate.io/model-cache"], "miss");
    assert!(ann.get("modelgate.io/resolved-uri").is_none());
    assert!(
        !a.patched["spec"]["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["name"] == "modelgate-model")
    );
    assert!(
        a.patched["spec"]["containers"][0]
            .get("volumeMounts")
            .is_none_or(|m| m.as_array().unwrap().is_empty())
    );
}

#[test]
fn opt_out_is_a_miss_with_its_reason_and_no_uri_does_nothing() {
    for ann in [
        json!({"modelgate.io/model-uri": "hf://org/m", "modelgate.io/disable-model-cache": "true"}),
        json!({"modelgate.io/model-uri": "hf://org/m", "serving.kserve.io/disable-localmodel": "true"}),
    ] {
        let a = mutate_with(
            "Pod",
            "team-c",
            model_pod(ann.clone()),
            &PolicyConfig::default(),
            &caches(),
        );
        let got = &a.patched["metadata"]["annotations"];
        assert_eq!(got["modelgate.io/model-cache"], "miss", "{ann}");
        assert_eq!(got["modelgate.io/model-cache-reason"], "opted-out", "{ann}");
        assert!(a.patched["spec"].get("affinity").is_none());
    }
    let a = mutate_with(
        "Pod",
        "team-c",
        model_pod(json!({})),
        &PolicyConfig::default(),
        &caches(),
    );
    assert_eq!(a.patched["metadata"]["annotations"], json!({}));
}

/// The `modelgate.io/model-cache-reason` annotation, warnings, and whether the model volume is
/// there, for a pod in `ns`.
fn miss_of(ns: &str, pod: Value, index: &CacheIndex) -> (String, Vec<String>, bool) {
    let a = mutate_with("Pod", ns, pod, &PolicyConfig::default(), index);
    let ann = &a.patched["metadata"]["annotations"];
    assert_eq!(ann["modelgate.io/model-cache"], "miss", "{ann}");
    let mounted = a.patched["spec"]["volumes"]
        .as_array()
        .is_some_and(|v| v.iter().any(|v| v["name"] == "modelgate-model"));
    (
        ann["modelgate.io/model-cache-reason"]
            .as_str()
            .unwrap()
            .to_string(),
        a.warnings(),
        mounted,
    )
}

#[test]
fn each_miss_reason_is_annotated_and_a_matched_cache_is_named_with_what_it_lacks() {
    let uri = |u: &str| model_pod(json!({"modelgate.io/model-uri": u}));
    // no-match: no warning.
    let (reason, w, mounted) = miss_of("team-c", uri("hf://other/m"), &caches());
    assert_eq!((reason.as_str(), mounted), ("no-match", false));
    assert!(!w.iter().any(|w| w.contains("matches")), "{w:?}");
    // pvc-missing: team-d has no PVC llama-workers.
    let (reason, w, _) = miss_of("team-d", uri("hf://org/m"), &caches());
    assert_eq!(reason, "pvc-missing");
    assert!(
        w.contains(&"pvc-missing: LocalModelCache llama matches hf://org/m but PVC team-d/llama-workers does not exist".to_string()),
        "{w:?}"
    );
    // node-group-mismatch: the requested group is not listed.
    let pod = model_pod(
        json!({"modelgate.io/model-uri": "hf://org/m", "modelgate.io/node-group": "tpu"}),
    );
    let (reason, w, _) = miss_of("team-c", pod, &caches());
    assert_eq!(reason, "node-group-mismatch");
    assert!(
        w.iter().any(|w| w.contains("requested node group tpu")),
        "{w:?}"
    );
    // not-downloaded: the model is still downloading on n1.
    let mut index = caches();
    let mut downloading = CacheEntry::new(CacheScope::Cluster, "llama", "hf://org/m", &["workers"]);
    downloading.status.set_node("n1", "NodeDownloading");
    index.upsert_cache(downloading);
    let (reason, w, _) = miss_of("team-c", uri("hf://org/m"), &index);
    assert_eq!(reason, "not-downloaded");
    assert!(
        w.iter().any(|w| w.starts_with(
            "not-downloaded: LocalModelCache llama matches hf://org/m but no node of group workers"
        )),
        "{w:?}"
    );
}

#[test]
fn kserve_managed_pods_are_never_resolved_but_keep_the_rest_of_the_policy() {
    for label in [
        "serving.kserve.io/inferenceservice",
        "internal.serving.kserve.io/localmodel",
    ] {
        let mut pod = model_pod(json!({
            "internal.serving.kserve.io/storage-initializer-sourceuri": "hf://org/m"
        }));
        pod["metadata"]["labels"] = json!({ label: "llama" });
        let a = mutate_with("Pod", "team-c", pod, &PolicyConfig::default(), &caches());
        let ann = &a.patched["metadata"]["annotations"];
        assert_eq!(ann["modelgate.io/model-cache-reason"], "kserve-managed");
        assert!(
            !a.patched["spec"]["volumes"]
                .as_array()
                .unwrap()
                .iter()
                .any(|v| v["name"] == "modelgate-model")
        );
        // §3 still applies.
        assert_eq!(a.patched["spec"]["securityContext"]["runAsNonRoot"], true);
    }
}

#[test]
fn node_group_terms_are_anded_into_each_existing_term() {
    let mut p = model_pod(
        json!({"modelgate.io/model-uri": "hf://org/m", "modelgate.io/node-group": "workers"}),
    );
    p["spec"]["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
    ]}}});
    let a = mutate_with("Pod", "team-c", p, &PolicyConfig::default(), &caches());
    let gpu = json!({"key": "node-type", "operator": "In", "values": ["gpu"]});
    assert_eq!(
        a.patched["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"],
        json!([
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}, gpu, pin()]},
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}], "matchExpressions": [gpu, pin()]}
        ])
    );
}

/// The API server calls /mutate again when a later webhook changed the pod (reinvocationPolicy
/// IfNeeded). When the cache's NodeDownloaded nodes changed in between, the second pass replaces
/// the node pin modelgate wrote and leaves the user's own alone: ANDing a second pin would keep
/// only the nodes in both lists, possibly none, and strand the pod (docs/policy.md §5).
#[test]
fn a_second_pass_replaces_modelgates_own_node_pin_when_the_downloaded_nodes_changed() {
    let cfg = PolicyConfig::default();
    let mut p = model_pod(
        json!({"modelgate.io/model-uri": "hf://org/m", "modelgate.io/node-group": "workers"}),
    );
    let zone_a = json!({"key": "zone", "operator": "In", "values": ["a"]});
    let users_pin =
        json!({"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1", "n2"]});
    p["spec"]["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [zone_a]},
        {"matchExpressions": [users_pin]}
    ]}}});
    let first = mutate_with("Pod", "team-c", p, &cfg, &caches());
    let gpu = json!({"key": "node-type", "operator": "In", "values": ["gpu"]});
    let terms = |a: &Answer| {
        a.patched["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"]
            .clone()
    };
    assert_eq!(
        terms(&first),
        json!([
            {"matchExpressions": [zone_a, gpu, pin()]},
            {"matchExpressions": [users_pin, gpu, pin()]}
        ])
    );

    // Between the passes n1 loses the model and n2 (a gpu node of the group) has it.
    let mut moved = caches();
    moved.upsert_node(
        "n2",
        [
            ("kubernetes.io/hostname".to_string(), "n2".to_string()),
            ("node-type".to_string(), "gpu".to_string()),
        ]
        .into(),
    );
    moved.upsert_cache(
        CacheEntry::new(
            CacheScope::Cluster,
            "llama",
            "hf://org/m",
            &["workers", "gpu"],
        )
        .downloaded_on(&["n2"]),
    );
    // `mutate_with` also checks that a further pass changes nothing.
    let second = mutate_with("Pod", "team-c", first.patched.clone(), &cfg, &moved);
    let n2 = json!({"key": "kubernetes.io/hostname", "operator": "In", "values": ["n2"]});
    assert_eq!(
        terms(&second),
        json!([
            {"matchExpressions": [zone_a, gpu, n2]},
            {"matchExpressions": [users_pin, gpu, n2]}
        ])
    );
    // Only the pin's values changed: one operation per term.
    assert_eq!(
        second.patch,
        [
            json!({"op": "replace", "path": "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms/0/matchExpressions/2", "value": n2}),
            json!({"op": "replace", "path": "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms/1/matchExpressions/2", "value": n2}),
        ]
    );
    // Nothing changed: nothing to do.
    let again = mutate_with("Pod", "team-c", first.patched.clone(), &cfg, &caches());
    assert!(again.patch.is_empty(), "{:?}", again.patch);
}

/// When the node group's own terms changed too, they are ANDed in as on a first pass, and the
/// pin is still replaced, never doubled, in every term and every copy.
#[test]
fn a_second_pass_after_the_group_changed_still_keeps_one_pin_per_term() {
    let cfg = PolicyConfig::default();
    let p = model_pod(
        json!({"modelgate.io/model-uri": "hf://org/m", "modelgate.io/node-group": "workers"}),
    );
    let first = mutate_with("Pod", "team-c", p, &cfg, &caches());
    // The group now spans gpu nodes of zones b and c; n2 and n3 have the model, n1 left it.
    let mut moved = caches();
    let gpu = json!({"key": "node-type", "operator": "In", "values": ["gpu"]});
    let zone_b = json!({"key": "zone", "operator": "In", "values": ["b"]});
    let zone_c = json!({"key": "zone", "operator": "In", "values": ["c"]});
    let terms: Vec<k8s_openapi::api::core::v1::NodeSelectorTerm> = serde_json::from_value(json!([
        {"matchExpressions": [gpu, zone_b]},
        {"matchExpressions": [gpu, zone_c]}
    ]))
    .unwrap();
    moved.upsert_node_group("workers", Some(terms));
    for (node, zone) in [("n2", "b"), ("n3", "c")] {
        let labels = [
            ("kubernetes.io/hostname", node),
            ("node-type", "gpu"),
            ("zone", zone),
        ];
        moved.upsert_node(
            node,
            labels.map(|(k, v)| (k.to_string(), v.to_string())).into(),
        );
    }
    moved.upsert_cache(
        CacheEntry::new(
            CacheScope::Cluster,
            "llama",
            "hf://org/m",
            &["workers", "gpu"],
        )
        .downloaded_on(&["n2", "n3"]),
    );
    let second = mutate_with("Pod", "team-c", first.patched.clone(), &cfg, &moved);
    let n2_n3 = json!({"key": "kubernetes.io/hostname", "operator": "In", "values": ["n2", "n3"]});
    assert_eq!(
        second.patched["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"],
        json!([
            // The group's terms are ANDed in as on any pass (the term's own requirements are
            // kept as they are); the pin is replaced, in the term and in its copy, and stays
            // the last requirement.
            {"matchExpressions": [gpu, gpu, zone_b, n2_n3]},
            {"matchExpressions": [gpu, gpu, zone_c, n2_n3]}
        ])
    );
}

/// A user's own hostname pin on a pod modelgate has not routed is the user's: a hit ANDs
/// modelgate's pin next to it, never in its place.
#[test]
fn a_users_own_node_pin_is_kept_on_the_first_pass() {
    let mut p = model_pod(
        json!({"modelgate.io/model-uri": "hf://org/m", "modelgate.io/node-group": "workers"}),
    );
    let users_pin =
        json!({"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1", "n9"]});
    p["spec"]["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [users_pin]}
    ]}}});
    let a = mutate_with("Pod", "team-c", p, &PolicyConfig::default(), &caches());
    let gpu = json!({"key": "node-type", "operator": "In", "values": ["gpu"]});
    assert_eq!(
        a.patched["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"],
        json!([{"matchExpressions": [users_pin, gpu, pin()]}])
    );
}

#[test]
fn caches_not_synced_is_a_miss_with_a_warning() {
    let cfg = PolicyConfig::default();
    let index = caches();
    let ctx = Context {
        config: &cfg,
        caches: Caches::NotSynced(&index),
        namespaces: crate::namespaces::Namespaces::none(),
        now: None,
    };
    let r = review_of(
        "Pod",
        "CREATE",
        None,
        "t",
        model_pod(json!({"modelgate.io/model-uri": "hf://org/m"})),
    );
    let out = super::review(Webhook::Mutate, &serde_json::to_vec(&r).unwrap(), &ctx);
    let body: Value = serde_json::from_slice(&out.body).unwrap();
    assert!(
        body["response"]["warnings"]
            .to_string()
            .contains("not synced")
    );
    let patch: Vec<Value> = serde_json::from_slice(
        &base64::engine::general_purpose::STANDARD
            .decode(body["response"]["patch"].as_str().unwrap())
            .unwrap(),
    )
    .unwrap();
    assert!(
        patch.iter().any(
            |op| op["path"].as_str().unwrap().ends_with("model-cache-reason")
                && op["value"] == "not-synced"
        ),
        "{patch:?}"
    );
}

// §6 -----------------------------------------------------------------------------------------

#[test]
fn run_as_user_boundaries() {
    let cfg = PolicyConfig::default();
    for (uid, ok) in [
        (1i64, true),
        (2147483647, true),
        (0, false),
        (-1, false),
        (2147483648, false),
    ] {
        let p = pod(
            json!({"securityContext": {"runAsNonRoot": true, "runAsUser": uid, "runAsGroup": 0},
                           "containers": [{"name": "c", "image": "x"}]}),
        );
        let v = validate_pod(p.clone(), &cfg);
        assert_eq!(v.allowed(), ok, "validate {uid}");
        let m = mutate(p);
        assert_eq!(m.allowed(), ok, "mutate {uid}");
        if !ok {
            let expected =
                format!("spec.securityContext.runAsUser: {uid} is outside 1..2147483647");
            assert!(v.message().contains(&expected), "{}", v.message());
            assert!(m.message().contains(&expected), "{}", m.message());
            assert!(m.patch.is_empty(), "no patch from a bad uid");
            assert_eq!(m.response["status"]["code"], 403);
        }
    }
}

#[test]
fn every_offending_field_is_listed_with_advice() {
    let p = json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"}, "spec": {"template": {"spec": {
        "securityContext": {"runAsGroup": -1, "fsGroup": 2147483648i64},
        "initContainers": [{"name": "i", "image": "x", "securityContext": {"runAsUser": 0}}],
        "containers": [
            {"name": "a", "image": "x"},
            {"name": "b", "image": "x", "securityContext": {"runAsUser": 0, "runAsGroup": 3000000000i64, "runAsNonRoot": false}}
        ],
        "ephemeralContainers": [{"name": "e", "image": "x", "securityContext": {"runAsUser": -5}}]
    }}}});
    let a = run_with(
        Webhook::Validate,
        &review_of("Job", "CREATE", None, "t", p),
        &PolicyConfig::default(),
        &CacheIndex::new(),
    );
    assert!(!a.allowed());
    let msg = a.message();
    for part in [
        "spec.template.spec.securityContext.runAsGroup: -1 is outside 0..2147483647",
        "spec.template.spec.securityContext.fsGroup: 2147483648 is outside 0..2147483647",
        "spec.template.spec.initContainers[0].securityContext.runAsUser: 0 is outside 1..2147483647",
        "spec.template.spec.containers[1].securityContext.runAsUser: 0 is outside 1..2147483647",
        "spec.template.spec.containers[1].securityContext.runAsGroup: 3000000000 is outside 0..2147483647",
        "spec.template.spec.containers[1].securityContext.runAsNonRoot: false is not allowed",
        "spec.template.spec.ephemeralContainers[0].securityContext.runAsUser: -5 is outside 1..2147483647",
        "Use a uid in 1..2147483647",
    ] {
        assert!(msg.contains(part), "missing `{part}` in {msg}");
    }
}

#[test]
fn undecodable_objects_are_denied_naming_the_field() {
    let cfg = PolicyConfig::default();
    for (bad, field) in [
        (
            json!("1000"),
            "spec.containers[0].securityContext.runAsUser",
        ),
        (json!(1.5), "spec.containers[0].securityContext.runAsUser"),
        (
            json!(9223372036854775808u64),
            "spec.containers[0].securityContext.runAsUser",
        ),
    ] {
        let p = pod(
            json!({"containers": [{"name": "c", "image": "x", "securityContext": {"runAsUser": bad}}]}),
        );
        for webhook in [Webhook::Mutate, Webhook::Validate] {
            let a = run_with(
                webhook,
                &review_of("Pod", "CREATE", None, "t", p.clone()),
                &cfg,
                &CacheIndex::new(),
            );
            assert!(!a.allowed());
            assert!(a.message().starts_with(field), "{}", a.message());
            assert!(
                a.message().contains("cannot be decoded as a Pod"),
                "{}",
                a.message()
            );
        }
    }
    let p = pod(json!({"containers": {"name": "c"}}));
    let a = run_with(
        Webhook::Mutate,
        &review_of("Pod", "CREATE", None, "t", p),
        &cfg,
        &CacheIndex::new(),
    );
    assert!(
        a.message()
            .starts_with("spec.containers: cannot be decoded"),
        "{}",
        a.message()
    );
    let job_as_pod = json!({"apiVersion": "batch/v1", "kind": "Job", "spec": {}});
    let a = run_with(
        Webhook::Mutate,
        &review_of("Pod", "CREATE", None, "t", job_as_pod),
        &cfg,
        &CacheIndex::new(),
    );
    assert!(
        a.message()
            .contains("the object is a Job, but the request is for a Pod"),
        "{}",
        a.message()
    );
}

// §1 -----------------------------------------------------------------------------------------

#[test]
fn job_template_gets_the_policy() {
    let job = json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "dl"},
        "spec": {"template": {"spec": {"restartPolicy": "Never", "volumes": [pvc_volume()],
            "containers": [{"name": "c", "image": "x"}]}}}});
    let a = mutate_with(
        "Job",
        "team-a",
        job,
        &PolicyConfig::default(),
        &CacheIndex::new(),
    );
    let spec = &a.patched["spec"]["template"]["spec"];
    assert_eq!(spec["securityContext"]["runAsUser"], 1000);
    assert_eq!(spec["initContainers"][0]["name"], "model-cache-prep");
    assert!(a.patched["spec"].get("securityContext").is_none());
}

/// A Job's template is not routed: its pods are, each when it is created (they can come hours
/// later, when the nodes a pin named are gone); the Job hears which model they would mount.
#[test]
fn a_job_template_is_not_routed_and_hears_what_its_pods_would_mount() {
    let job = json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "dl", "annotations": {}},
        "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "x"}]}}}});
    let mut with_uri = job.clone();
    with_uri["spec"]["template"]["metadata"] = Value::Null;
    // Annotations on the Job itself are not the pod's: nothing to resolve without template ones.
    let a = mutate_with(
        "Job",
        "team-c",
        with_uri,
        &PolicyConfig::default(),
        &caches(),
    );
    assert!(a.patched["spec"]["template"]["metadata"].is_null());
    let mut templ = job;
    templ["spec"]["template"]["metadata"] =
        json!({"annotations": {"modelgate.io/model-uri": "hf://org/m"}});
    let a = mutate_with("Job", "team-c", templ, &PolicyConfig::default(), &caches());
    let template = &a.patched["spec"]["template"];
    assert_eq!(
        template["metadata"]["annotations"],
        json!({"modelgate.io/model-uri": "hf://org/m"}),
        "{template}"
    );
    assert!(!template.to_string().contains("nodeAffinity"), "{template}");
    assert!(
        a.warnings().contains(
            &"pods created now would mount model hf://org/m from LocalModelCache llama".into()
        ),
        "{:?}",
        a.warnings()
    );
    // The Job's pod is routed when it is created.
    let mut pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "dl-x", "annotations": {"modelgate.io/model-uri": "hf://org/m"}},
        "spec": {"containers": [{"name": "c", "image": "x"}]}});
    pod["metadata"]["namespace"] = json!("team-c");
    let a = mutate_with("Pod", "team-c", pod, &PolicyConfig::default(), &caches());
    assert_eq!(
        a.patched["metadata"]["annotations"]["modelgate.io/model-cache"],
        "cluster/llama"
    );
}

#[test]
fn annotations_created_when_pod_has_no_metadata_annotations() {
    let mut p = model_pod(Value::Null);
    p["metadata"].as_object_mut().unwrap().remove("annotations");
    p["metadata"]["annotations"] = json!({"modelgate.io/model-uri": "hf://org/m"});
    let a = mutate_with(
        "Pod",
        "team-c",
        p.clone(),
        &PolicyConfig::default(),
        &caches(),
    );
    assert_eq!(
        a.patched["metadata"]["annotations"]["modelgate.io/model-cache"],
        "cluster/llama"
    );
    // Escaped keys in the patch.
    assert!(
        a.patch
            .iter()
            .any(|op| op["path"] == "/metadata/annotations/modelgate.io~1model-cache"),
        "{:?}",
        a.patch
    );
}

#[test]
fn other_operations_and_subresources_are_allowed_untouched() {
    let cfg = PolicyConfig::default();
    let p = pod(
        json!({"containers": [{"name": "c", "image": "x", "securityContext": {"runAsUser": 0}}]}),
    );
    for (op, sub) in [
        ("UPDATE", None),
        ("DELETE", None),
        ("CONNECT", None),
        ("UPDATE", Some("status")),
    ] {
        for webhook in [Webhook::Mutate, Webhook::Validate] {
            let a = run_with(
                webhook,
                &review_of("Pod", op, sub, "t", p.clone()),
                &cfg,
                &CacheIndex::new(),
            );
            assert!(a.allowed(), "{op} {sub:?}");
            assert!(a.patch.is_empty());
            assert!(a.warnings().is_empty());
        }
    }
}

#[test]
fn other_kinds_are_allowed_with_one_warning() {
    let d = json!({"apiVersion": "v1", "kind": "Service", "spec": {}});
    let a = run_with(
        Webhook::Mutate,
        &review_of("Service", "CREATE", None, "t", d),
        &PolicyConfig::default(),
        &CacheIndex::new(),
    );
    assert!(a.allowed() && a.patch.is_empty());
    assert_eq!(
        a.warnings(),
        ["modelgate does not handle v1/Service; allowed without changes"]
    );
}

#[test]
fn exempt_namespaces_are_untouched() {
    let cfg = PolicyConfig::default().with_default_exemptions(None);
    let p = pod(
        json!({"containers": [{"name": "c", "image": "x", "securityContext": {"runAsUser": 0}}]}),
    );
    for webhook in [Webhook::Mutate, Webhook::Validate] {
        let a = run_with(
            webhook,
            &review_of("Pod", "CREATE", None, "kube-system", p.clone()),
            &cfg,
            &CacheIndex::new(),
        );
        assert!(a.allowed() && a.patch.is_empty());
    }
    // The object's namespace wins over the request's.
    let mut q = p.clone();
    q["metadata"]["namespace"] = json!("kube-system");
    let a = run_with(
        Webhook::Validate,
        &review_of("Pod", "CREATE", None, "", q),
        &cfg,
        &CacheIndex::new(),
    );
    assert!(a.allowed());
}

#[test]
fn mirror_pods_are_untouched() {
    let cfg = PolicyConfig::default().with_default_exemptions(None);
    let mut p = pod(
        json!({"containers": [{"name": "c", "image": "x", "securityContext": {"runAsUser": 0}}]}),
    );
    p["metadata"]["annotations"] = json!({"kubernetes.io/config.mirror": "3f2a"});
    for webhook in [Webhook::Mutate, Webhook::Validate] {
        let a = run_with(
            webhook,
            &review_of("Pod", "CREATE", None, "team-a", p.clone()),
            &cfg,
            &CacheIndex::new(),
        );
        assert!(a.allowed() && a.patch.is_empty() && a.warnings().is_empty());
    }
    // The annotation is the kubelet's mark on Pods only: a Job template carrying it is judged.
    let job = json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"},
        "spec": {"template": {"metadata": {"annotations": {"kubernetes.io/config.mirror": "x"}},
            "spec": {"containers": [{"name": "c", "image": "x", "securityContext": {"runAsUser": 0}}]}}}});
    let a = run_with(
        Webhook::Validate,
        &review_of("Job", "CREATE", None, "team-a", job),
        &cfg,
        &CacheIndex::new(),
    );
    assert!(!a.allowed());
    // Without the annotation the same pod is denied.
    p["metadata"]["annotations"] = json!({});
    let a = run_with(
        Webhook::Validate,
        &review_of("Pod", "CREATE", None, "team-a", p),
        &cfg,
        &CacheIndex::new(),
    );
    assert!(!a.allowed());
}

/// A pod whose patch would pass what the API server can store is denied with the reason, not
/// answered with a patch of many megabytes; the same pod in `warn` mode is allowed as it is.
#[test]
fn a_patch_past_what_the_api_server_can_store_is_a_denial() {
    let containers: Vec<Value> = (0..20_000)
        .map(|i| json!({"name": format!("c{i}"), "image": "x", "securityContext": {"runAsNonRoot": false}}))
        .collect();
    let p = pod(json!({"containers": containers}));
    let cfg = PolicyConfig::default();
    let a = run_with(
        Webhook::Mutate,
        &review_of("Pod", "CREATE", None, "t", p),
        &cfg,
        &CacheIndex::new(),
    );
    assert!(!a.allowed());
    assert!(a.patch.is_empty());
    assert!(
        a.message().starts_with(
            "spec: the pod is too large for the changes modelgate must make: their patch is "
        ),
        "{}",
        a.message()
    );
    // Below the bound, the same shape is patched.
    let containers: Vec<Value> = (0..200)
        .map(|i| json!({"name": format!("c{i}"), "image": "x", "securityContext": {"runAsNonRoot": false}}))
        .collect();
    let a = run_with(
        Webhook::Mutate,
        &review_of(
            "Pod",
            "CREATE",
            None,
            "t",
            pod(json!({"containers": containers})),
        ),
        &cfg,
        &CacheIndex::new(),
    );
    assert!(a.allowed() && a.patch.len() > 200);
}

/// `kubectl debug` on a pod that predates the policy (its container has no runAsNonRoot): the
/// update judges the ephemeral containers' runAsNonRoot, not the running containers', which
/// are immutable; `/mutate` then `/validate` admit it.
#[test]
fn an_ephemeral_update_judges_the_ephemeral_containers_non_root_only() {
    let old = pod(json!({
        "containers": [{"name": "c", "image": "x"}],
        "ephemeralContainers": [{"name": "debug", "image": "busybox"}]
    }));
    let cfg = PolicyConfig::default();
    let review =
        |object: Value| review_of("Pod", "UPDATE", Some("ephemeralcontainers"), "t", object);
    let unmutated = run_with(
        Webhook::Validate,
        &review(old.clone()),
        &cfg,
        &CacheIndex::new(),
    );
    assert!(!unmutated.allowed());
    assert_eq!(
        unmutated.message(),
        "spec.ephemeralContainers[0].securityContext.runAsNonRoot: not set (neither the \
         container nor the pod sets it to true). Set runAsNonRoot: true on the pod or the \
         container (modelgate's mutating webhook sets it on the pod: check that it is registered \
         for this namespace)."
    );
    let mutated = run_with(
        Webhook::Mutate,
        &review(old.clone()),
        &cfg,
        &CacheIndex::new(),
    );
    assert!(mutated.allowed());
    let validated = run_with(
        Webhook::Validate,
        &review(mutated.patched),
        &cfg,
        &CacheIndex::new(),
    );
    assert!(validated.allowed(), "{}", validated.message());
    // The same pod on CREATE: every container is judged.
    let create = run_with(
        Webhook::Validate,
        &review_of("Pod", "CREATE", None, "t", old),
        &cfg,
        &CacheIndex::new(),
    );
    assert!(
        create
            .message()
            .contains("spec.containers[0].securityContext.runAsNonRoot")
    );
}

#[test]
fn ephemeral_container_update_touches_only_ephemeral_security_contexts() {
    let p = pod(json!({
        "containers": [{"name": "c", "image": "x"}],
        "ephemeralContainers": [
            {"name": "debug", "image": "busybox"},
            {"name": "dbg2", "image": "busybox", "securityContext": {"runAsNonRoot": false, "runAsUser": 5}}
        ]
    }));
    let cfg = PolicyConfig::default();
    let a = run_with(
        Webhook::Mutate,
        &review_of("Pod", "UPDATE", Some("ephemeralcontainers"), "t", p.clone()),
        &cfg,
        &CacheIndex::new(),
    );
    assert!(a.allowed());
    for op in &a.patch {
        assert!(
            op["path"]
                .as_str()
                .unwrap()
                .starts_with("/spec/ephemeralContainers/"),
            "{op}"
        );
    }
    let e = &a.patched["spec"]["ephemeralContainers"];
    assert_eq!(
        e[0]["securityContext"],
        json!({"runAsNonRoot": true, "runAsUser": 1000, "runAsGroup": 1000})
    );
    assert_eq!(
        e[1]["securityContext"],
        json!({"runAsNonRoot": true, "runAsUser": 5, "runAsGroup": 1000})
    );
    let again = run_with(
        Webhook::Mutate,
        &review_of(
            "Pod",
            "UPDATE",
            Some("ephemeralcontainers"),
            "t",
            a.patched.clone(),
        ),
        &cfg,
        &CacheIndex::new(),
    );
    assert!(again.patch.is_empty());
    // A root debug container is denied by both webhooks.
    let mut root = p;
    root["spec"]["ephemeralContainers"][0]["securityContext"] = json!({"runAsUser": 0});
    for webhook in [Webhook::Mutate, Webhook::Validate] {
        let a = run_with(
            webhook,
            &review_of(
                "Pod",
                "UPDATE",
                Some("ephemeralcontainers"),
                "t",
                root.clone(),
            ),
            &cfg,
            &CacheIndex::new(),
        );
        assert!(
            a.message()
                .contains("spec.ephemeralContainers[0].securityContext.runAsUser: 0"),
            "{}",
            a.message()
        );
    }
}

// §7 -----------------------------------------------------------------------------------------

fn raw(webhook: Webhook, body: &[u8]) -> (u16, Value) {
    let cfg = PolicyConfig::default();
    let idx = CacheIndex::new();
    let out = super::review(
        webhook,
        body,
        &Context {
            config: &cfg,
            caches: Caches::Ready(&idx),
            namespaces: crate::namespaces::Namespaces::none(),
            now: None,
        },
    );
    (out.http_status, serde_json::from_slice(&out.body).unwrap())
}

#[test]
fn v1beta1_is_answered_in_kind() {
    let mut r = review_of(
        "Pod",
        "CREATE",
        None,
        "t",
        pod(json!({"containers": [{"name": "c", "image": "x"}]})),
    );
    r["apiVersion"] = json!("admission.k8s.io/v1beta1");
    let (status, body) = raw(Webhook::Mutate, &serde_json::to_vec(&r).unwrap());
    assert_eq!(status, 200);
    assert_eq!(body["apiVersion"], "admission.k8s.io/v1beta1");
    assert_eq!(body["kind"], "AdmissionReview");
    assert!(body["response"]["patch"].is_string());
}

#[test]
fn dry_run_gets_the_same_decision() {
    let p = pod(json!({"containers": [{"name": "c", "image": "x"}]}));
    let wet = review_of("Pod", "CREATE", None, "t", p.clone());
    let mut dry = wet.clone();
    dry["request"]["dryRun"] = json!(true);
    let (_, a) = raw(Webhook::Mutate, &serde_json::to_vec(&wet).unwrap());
    let (_, b) = raw(Webhook::Mutate, &serde_json::to_vec(&dry).unwrap());
    assert_eq!(a, b);
}

#[test]
fn malformed_bodies() {
    let (s, b) = raw(Webhook::Mutate, b"not json");
    assert_eq!(s, 400);
    assert_eq!(b["kind"], "Status");
    assert!(b["message"].as_str().unwrap().contains("not JSON"));
    let (s, _) = raw(
        Webhook::Mutate,
        br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#,
    );
    assert_eq!(s, 400);
    let (s, _) = raw(Webhook::Mutate, br#"{"apiVersion":"v1","kind":"Pod"}"#);
    assert_eq!(s, 400);
    // The uid is readable: it is echoed in a refused review.
    let (s, b) = raw(
        Webhook::Validate,
        br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"abc","operation":"EXPLODE"}}"#,
    );
    assert_eq!(s, 200);
    assert_eq!(b["response"]["uid"], "abc");
    assert_eq!(b["response"]["allowed"], false);
    assert_eq!(b["response"]["status"]["code"], 400);
    // object null on CREATE.
    let mut r = review_of("Pod", "CREATE", None, "t", Value::Null);
    r["request"]["object"] = Value::Null;
    let (s, b) = raw(Webhook::Mutate, &serde_json::to_vec(&r).unwrap());
    assert_eq!(s, 200);
    assert_eq!(b["response"]["allowed"], false);
    assert!(
        b["response"]["status"]["message"]
            .as_str()
            .unwrap()
            .contains("request.object is missing")
    );
}

#[test]
fn allowed_without_changes_has_no_patch_fields_and_no_status() {
    let r = review_of("Pod", "DELETE", None, "t", Value::Null);
    let (_, b) = raw(Webhook::Mutate, &serde_json::to_vec(&r).unwrap());
    let resp = b["response"].as_object().unwrap();
    assert_eq!(resp["allowed"], true);
    assert!(!resp.contains_key("patch") && !resp.contains_key("patchType"));
}

/// The one-pass decode (request kind before the object, as the API server writes it) and the
/// two-step one (object first, kept raw, decoded once the kind is known) answer alike, byte for
/// byte, on the reference reviews and on objects that fail to decode.
#[test]
fn the_one_pass_decode_and_the_raw_object_path_answer_alike() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../benches/reviews");
    let list: Value =
        serde_json::from_slice(&std::fs::read(dir.join("caches.json")).unwrap()).unwrap();
    let mut index = CacheIndex::new();
    for item in list["items"].as_array().unwrap() {
        index.insert_object(item).unwrap();
    }
    let cfg = PolicyConfig::default();
    let ctx = Context {
        config: &cfg,
        caches: Caches::Ready(&index),
        namespaces: crate::namespaces::Namespaces::none(),
        now: None,
    };
    let mut reviews: Vec<Value> = [
        "one-container-pod",
        "llm-serving-pod",
        "twenty-container-pod",
    ]
    .iter()
    .map(|n| {
        serde_json::from_slice(&std::fs::read(dir.join(format!("{n}.json"))).unwrap()).unwrap()
    })
    .collect();
    let bad_uid =
        json!({"spec": {"containers": [{"name": "c", "securityContext": {"runAsUser": "0"}}]}});
    reviews.push(review_of("Pod", "CREATE", None, "team-a", bad_uid));
    reviews.push(review_of("Pod", "CREATE", None, "team-a", json!([1])));
    reviews.push(review_of(
        "Job",
        "CREATE",
        None,
        "team-a",
        json!({"kind": "Pod", "spec": {}}),
    ));
    reviews.push(review_of("Pod", "DELETE", None, "team-a", Value::Null));
    for review in reviews {
        // Object last (API server order; serde_json writes keys sorted, and `kind` < `object`).
        let kind_first = serde_json::to_vec(&review).unwrap();
        // Object first: the same review with `object` moved to the front of `request`.
        let mut request = review["request"].as_object().unwrap().clone();
        let object = request.remove("object").unwrap_or(Value::Null);
        let rest = serde_json::to_string(&request).unwrap();
        let object_first = format!(
            r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{{"object":{object},{}}}"#,
            &rest[1..]
        );
        for webhook in [Webhook::Mutate, Webhook::Validate] {
            let a = super::review(webhook, &kind_first, &ctx);
            let b = super::review(webhook, object_first.as_bytes(), &ctx);
            assert_eq!(
                String::from_utf8_lossy(&a.body),
                String::from_utf8_lossy(&b.body),
                "{webhook:?} {}",
                review["request"]["uid"]
            );
            assert_eq!(a.http_status, b.http_status);
        }
    }
}

#[test]
fn warnings_are_at_most_twenty_the_last_counting_the_rest_each_clipped_on_a_char_boundary() {
    let numbered = |n: usize| -> Vec<String> { (0..n).map(|i| format!("w{i}")).collect() };
    let mut twenty = numbered(20);
    bound_warnings(&mut twenty);
    assert_eq!(twenty, numbered(20));
    let mut many = numbered(21);
    bound_warnings(&mut many);
    assert_eq!(many.len(), 20);
    assert_eq!(many[18], "w18");
    assert_eq!(many[19], "… and 2 more warnings");

    let mut long = vec!["é".repeat(200), "short".to_string()];
    bound_warnings(&mut long);
    assert!(
        long[0].len() <= MAX_WARNING_LEN && long[0].ends_with('…'),
        "{}",
        long[0]
    );
    assert!(long[0].starts_with("éé"));
    assert_eq!(long[1], "short");
}

/// The namespace a decision rests on is the request's: an object that names another (an
/// exempt one) is denied, naming the field, by both webhooks; the same object without the
/// field is decided in the request's namespace.
#[test]
fn an_object_naming_another_namespace_than_the_request_is_denied() {
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": "kube-system"},
        "spec": {"containers": [{"name": "c", "image": "x", "securityContext": {"runAsUser": 0}}]}});
    for webhook in [Webhook::Mutate, Webhook::Validate] {
        let a = run_with(
            webhook,
            &review_of("Pod", "CREATE", None, "team-a", pod.clone()),
            &PolicyConfig::default(),
            &CacheIndex::new(),
        );
        assert!(
            !a.allowed(),
            "{webhook:?}: kube-system's exemption was taken from the object"
        );
        assert!(
            a.message().starts_with(
                "metadata.namespace: is kube-system, but the request is for namespace team-a"
            ),
            "{}",
            a.message()
        );
    }
    let mut same = pod.clone();
    same["metadata"]["namespace"] = json!("team-a");
    let a = run_with(
        Webhook::Validate,
        &review_of("Pod", "CREATE", None, "team-a", same),
        &PolicyConfig::default(),
        &CacheIndex::new(),
    );
    assert!(a.message().contains("runAsUser"), "{}", a.message());
    // In the exempt namespace itself, the request's, the pod is left alone.
    let a = run_with(
        Webhook::Validate,
        &review_of("Pod", "CREATE", None, "kube-system", pod),
        &PolicyConfig::default().with_default_exemptions(None),
        &CacheIndex::new(),
    );
    assert!(a.allowed());
}

/// `kubectl set image` on the prep, as the API server sends it (a Pod UPDATE with its
/// `oldObject`): denied, naming the field; an update that changes another container's image,
/// or nothing of the prep, is allowed. The mutating webhook does not take part.
#[test]
fn a_pod_update_may_not_change_the_prep_image() {
    let admitted = mutate(cache_pod(pvc_volume())).patched;
    let mut swapped = admitted.clone();
    swapped["spec"]["initContainers"][0]["image"] = json!("evil.example/root:1");
    let mut other = admitted.clone();
    other["spec"]["containers"][0]["image"] = json!("busybox:2");
    let update = |object: &Value| {
        let mut review = review_of("Pod", "UPDATE", None, "team-a", object.clone());
        review["request"]["oldObject"] = admitted.clone();
        review
    };
    let cfg = PolicyConfig::default();
    let index = CacheIndex::new();
    let a = run_with(Webhook::Validate, &update(&swapped), &cfg, &index);
    assert!(!a.allowed());
    assert!(
        a.message().starts_with(
            "spec.initContainers[0].image: the model-cache-prep image cannot change after \
             admission (docker.io/curlimages/curl:8.18.0 to evil.example/root:1)"
        ),
        "{}",
        a.message()
    );
    for allowed in [&other, &admitted] {
        assert!(run_with(Webhook::Validate, &update(allowed), &cfg, &index).allowed());
    }
    let m = run_with(Webhook::Mutate, &update(&swapped), &cfg, &index);
    assert!(m.allowed() && m.patch.is_empty());
}
