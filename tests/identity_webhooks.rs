//! modelgate beside the identity webhooks that give every container cloud credentials: EKS's
//! `pod-identity-webhook` and Azure Workload Identity's webhook. Each is played as the JSON
//! Patch it makes, applied with the json-patch crate, before and after modelgate's `/mutate`
//! and again on reinvocation, through the real pipeline (AdmissionReviews in, answers out).
//! Whatever the order, the pod ends with a canonical `model-cache-prep` that holds no
//! credentials, a second `/mutate` changes nothing, and `/validate` admits it.
//!
//! The webhooks, as their sources at these commits do it:
//! - github.com/aws/amazon-eks-pod-identity-webhook@3bf80a348116483b2162190e43232e4d243f76c4,
//!   `pkg/handler/handler.go`: `getContainersToSkip` (the annotation read with Go's
//!   `encoding/csv`, first record), `addEnvToContainer` and `getPodSpecPatch` (the env, the
//!   `aws-iam-token` mount and volume, and a patch that writes back the whole `containers` and
//!   `initContainers` lists); the defaults of `NewModifier` and `main.go` (mount path, volume and
//!   token names); `README.md` shows the result and the annotation;
//! - github.com/Azure/azure-workload-identity@04d01a2fc7f5024290a38f6ccaf69561cf70455d,
//!   `pkg/webhook/webhook.go`: `getSkipContainers` (split on `;`, each name trimmed),
//!   `mutateContainers`, `addEnvironmentVariables`, `addProjectedVolumeMount`,
//!   `addProjectedVolume`, `buildVolumeName`; the names in `pkg/webhook/consts.go`; its
//!   `deploy/azure-wi-webhook.yaml` registers it with `reinvocationPolicy: IfNeeded`.
//!
//! Mutating webhooks run in the order of their configurations' names, and one with
//! `reinvocationPolicy: IfNeeded` runs again when a later one changed the pod: Azure's
//! (`azure-wi-webhook-…`) runs before modelgate and again after it, EKS's
//! (`pod-identity-webhook`) after it. Both orders are played for both.

use modelgate::admission::Webhook;
use modelgate::cache::CacheIndex;
use modelgate::config::PolicyConfig;
use modelgate_core::testing;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

const PREP: &str = "model-cache-prep";

// ---------------------------------------------------------------------------------------------
// The identity webhooks, as JSON patches
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Identity {
    Eks,
    Azure,
}

impl Identity {
    fn skip_annotation(self) -> &'static str {
        match self {
            Identity::Eks => "eks.amazonaws.com/skip-containers",
            Identity::Azure => "azure.workload.identity/skip-containers",
        }
    }

    /// The names the webhook skips, as its code reads its annotation.
    fn skipped(self, pod: &Value) -> Vec<String> {
        let Some(value) = pod["metadata"]["annotations"][self.skip_annotation()].as_str() else {
            return Vec::new();
        };
        match self {
            // `csv.NewReader(strings.NewReader(value)).Read()`: the first record; fields are
            // not trimmed. This reader knows unquoted fields only, all these tests write (the
            // quoting rules are the core's unit tests', checked against Go's reader).
            Identity::Eks => {
                assert!(!value.contains('"'), "unquoted names only here: {value:?}");
                let first = value
                    .split('\n')
                    .map(|l| l.strip_suffix('\r').unwrap_or(l))
                    .find(|l| !l.is_empty());
                first
                    .map(|l| l.split(',').map(str::to_string).collect())
                    .unwrap_or_default()
            }
            // `strings.Split(value, ";")`, each `strings.TrimSpace`d; empty: none.
            Identity::Azure if value.is_empty() => Vec::new(),
            Identity::Azure => value.split(';').map(|n| n.trim().to_string()).collect(),
        }
    }

    /// The environment variables it adds to a container that has none of them.
    fn env(self) -> Vec<Value> {
        match self {
            // addEnvToContainer, with a region configured and no regional STS.
            Identity::Eks => vec![
                json!({"name": "AWS_DEFAULT_REGION", "value": "us-west-2"}),
                json!({"name": "AWS_REGION", "value": "us-west-2"}),
                json!({"name": "AWS_ROLE_ARN", "value": "arn:aws:iam::111122223333:role/s3-reader"}),
                json!({"name": "AWS_WEB_IDENTITY_TOKEN_FILE",
                       "value": "/var/run/secrets/eks.amazonaws.com/serviceaccount/token"}),
            ],
            // addEnvironmentVariables: the four it always adds, if absent.
            Identity::Azure => vec![
                json!({"name": "AZURE_CLIENT_ID", "value": "00000000-0000-0000-0000-000000000001"}),
                json!({"name": "AZURE_TENANT_ID", "value": "00000000-0000-0000-0000-000000000002"}),
                json!({"name": "AZURE_FEDERATED_TOKEN_FILE",
                       "value": "/var/run/secrets/azure/wi/token/azure-identity-token"}),
                json!({"name": "AZURE_AUTHORITY_HOST",
                       "value": "https://login.microsoftonline.com/"}),
            ],
        }
    }

    /// The volume (and so the mount) it adds: EKS's fixed name; Azure's from the pod's name.
    fn volume_name(self, pod: &Value) -> String {
        match self {
            Identity::Eks => "aws-iam-token".into(),
            Identity::Azure => {
                let name = match pod["metadata"]["name"].as_str().filter(|n| !n.is_empty()) {
                    Some(name) => name.to_string(),
                    None => format!(
                        "{} (prefix)",
                        pod["metadata"]["generateName"].as_str().unwrap_or("")
                    ),
                };
                let prefix = "azure-workload-identity-reserved-";
                let hash = format!("{:x}", Sha256::digest(name.as_bytes()));
                format!("{prefix}{}", &hash[..63 - prefix.len()])
            }
        }
    }

    fn mount(self, pod: &Value) -> Value {
        let path = match self {
            Identity::Eks => "/var/run/secrets/eks.amazonaws.com/serviceaccount",
            Identity::Azure => "/var/run/secrets/azure/wi",
        };
        json!({"name": self.volume_name(pod), "readOnly": true, "mountPath": path})
    }

    fn volume(self, pod: &Value) -> Value {
        let (audience, expiration, path) = match self {
            Identity::Eks => ("sts.amazonaws.com", 86400, "token"),
            Identity::Azure => (
                "api://AzureADTokenExchange",
                3600,
                "token/azure-identity-token",
            ),
        };
        json!({"name": self.volume_name(pod), "projected": {"sources": [{"serviceAccountToken": {
            "audience": audience, "expirationSeconds": expiration, "path": path}}]}})
    }

    /// The container as the webhook leaves it when it does not skip it.
    fn mutated_container(self, pod: &Value, c: &Value) -> Value {
        let mut c = c.clone();
        let has = |c: &Value, name: &str| {
            c["env"]
                .as_array()
                .is_some_and(|env| env.iter().any(|e| e["name"] == name))
        };
        let mut added = Vec::new();
        for e in self.env() {
            let name = e["name"].as_str().unwrap();
            let wanted = match self {
                // Region keys: neither is set; web identity keys: neither is set.
                Identity::Eks if name.ends_with("REGION") => {
                    !has(&c, "AWS_REGION") && !has(&c, "AWS_DEFAULT_REGION")
                }
                Identity::Eks => {
                    !has(&c, "AWS_ROLE_ARN") && !has(&c, "AWS_WEB_IDENTITY_TOKEN_FILE")
                }
                Identity::Azure => !has(&c, name),
            };
            if wanted {
                added.push(e);
            }
        }
        if !added.is_empty() {
            let env = c["env"].as_array().cloned().unwrap_or_default();
            c["env"] = Value::Array(env.into_iter().chain(added).collect());
        }
        let mount = self.mount(pod);
        let mut mounts = c["volumeMounts"].as_array().cloned().unwrap_or_default();
        match mounts.iter().position(|m| m["name"] == mount["name"]) {
            // EKS leaves a mount of that name; Azure writes its own over it.
            Some(i) if self == Identity::Azure => mounts[i] = mount,
            Some(_) => {}
            None => mounts.push(mount),
        }
        c["volumeMounts"] = Value::Array(mounts);
        c
    }

    /// The JSON Patch the webhook answers `pod` with.
    fn patch(self, pod: &Value) -> Vec<Value> {
        let skipped = self.skipped(pod);
        let spec = &pod["spec"];
        let list = |field: &str| -> Vec<Value> {
            spec[field]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .map(|c| {
                    let name = c["name"].as_str().unwrap_or_default();
                    if skipped.iter().any(|s| s == name) {
                        c
                    } else {
                        self.mutated_container(pod, &c)
                    }
                })
                .collect()
        };
        let (init, containers) = (list("initContainers"), list("containers"));
        let volume = self.volume(pod);
        let volumes = spec["volumes"].as_array();
        let existing = volumes.and_then(|v| v.iter().position(|v| v["name"] == volume["name"]));
        let mut ops = Vec::new();
        match self {
            Identity::Eks => {
                // getPodSpecPatch: the volume first (at the front, unless there), then both
                // lists written back whole. The typed round trip gives every container a
                // `resources` object.
                let typed = |list: Vec<Value>| -> Vec<Value> {
                    list.into_iter()
                        .map(|mut c| {
                            if c.get("resources").is_none() {
                                c["resources"] = json!({});
                            }
                            c
                        })
                        .collect()
                };
                match (volumes, existing) {
                    (_, Some(_)) => {}
                    (Some(_), None) => {
                        ops.push(json!({"op": "add", "path": "/spec/volumes/0", "value": volume}))
                    }
                    (None, None) => {
                        ops.push(json!({"op": "add", "path": "/spec/volumes", "value": [volume]}))
                    }
                }
                ops.push(
                    json!({"op": "add", "path": "/spec/containers", "value": typed(containers)}),
                );
                if !init.is_empty() {
                    ops.push(
                        json!({"op": "add", "path": "/spec/initContainers", "value": typed(init)}),
                    );
                }
            }
            Identity::Azure => {
                // Handle: the pod mutated in place, answered as the patch from the old pod to
                // the new (controller-runtime's PatchResponseFromRaw); each list and the volume
                // replaced here, which applies to the same pod.
                for (field, list) in [("initContainers", init), ("containers", containers)] {
                    if spec[field].is_array() {
                        ops.push(json!({"op": "replace", "path": format!("/spec/{field}"), "value": list}));
                    }
                }
                match (volumes, existing) {
                    (_, Some(i)) => ops.push(
                        json!({"op": "replace", "path": format!("/spec/volumes/{i}"), "value": volume}),
                    ),
                    (Some(_), None) => {
                        ops.push(json!({"op": "add", "path": "/spec/volumes/-", "value": volume}))
                    }
                    (None, None) => {
                        ops.push(json!({"op": "add", "path": "/spec/volumes", "value": [volume]}))
                    }
                }
            }
        }
        ops
    }

    /// `pod` after the webhook's patch.
    fn apply(self, pod: &Value) -> Value {
        testing::apply(pod, &self.patch(pod)).expect("the webhook's patch applies")
    }
}

// ---------------------------------------------------------------------------------------------
// modelgate, through its pipeline
// ---------------------------------------------------------------------------------------------

fn call(webhook: Webhook, object: &Value) -> testing::Answer {
    let cfg = PolicyConfig::default();
    let index = CacheIndex::new();
    let review = testing::create_review("uid-identity", object, "team-a");
    testing::review(webhook, &review, &testing::context(&cfg, &index))
}

/// modelgate's `/mutate`, applied.
fn modelgate(object: &Value) -> Value {
    let answer = call(Webhook::Mutate, object);
    assert!(answer.allowed, "/mutate denied: {}", answer.message);
    answer.patched(object)
}

/// A model server with a sidecar its author already keeps out of the credentials, and a
/// writable model cache (an ephemeral claim, storage the cluster provisions): it gets the prep.
fn serving_pod(annotations: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"generateName": "llm-", "namespace": "team-a", "annotations": annotations},
        "spec": {
            "serviceAccountName": "model-reader",
            "initContainers": [{"name": "fetch-config", "image": "busybox"}],
            "containers": [
                {"name": "server", "image": "vllm/vllm-openai:v0.8.5"},
                {"name": "sidecar", "image": "envoyproxy/envoy:v1.31"}
            ],
            "volumes": [{"name": "model-cache", "ephemeral": {"volumeClaimTemplate": {"spec": {
                "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "50Gi"}}}}}}]
        }
    })
}

fn containers<'a>(pod: &'a Value, field: &str) -> impl Iterator<Item = &'a Value> {
    pod["spec"][field].as_array().into_iter().flatten()
}

fn named<'a>(pod: &'a Value, name: &str) -> &'a Value {
    containers(pod, "initContainers")
        .chain(containers(pod, "containers"))
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no container {name} in {pod:#}"))
}

fn has_credentials(identity: Identity, pod: &Value, c: &Value) -> bool {
    let mount = identity.volume_name(pod);
    let envs: Vec<Value> = identity.env();
    c["env"].as_array().is_some_and(|env| {
        env.iter()
            .any(|e| envs.iter().any(|w| w["name"] == e["name"]))
    }) || c["volumeMounts"]
        .as_array()
        .is_some_and(|m| m.iter().any(|m| m["name"] == mount.as_str()))
}

/// What every order must end with: the prep exactly as modelgate wrote it (`expected`),
/// without the webhook's credentials; the webhook's work done on the others but the skipped
/// sidecar; a reinvoked `/mutate` that changes nothing; `/validate` admitting the pod.
fn check_admitted(identity: Identity, pod: &Value, expected_prep: &Value, order: &str) {
    let prep = named(pod, PREP);
    assert_eq!(
        prep, expected_prep,
        "{identity:?} {order}: the prep was changed"
    );
    assert!(
        !has_credentials(identity, pod, prep),
        "{identity:?} {order}: {prep:#}"
    );
    for name in ["fetch-config", "server"] {
        assert!(
            has_credentials(identity, pod, named(pod, name)),
            "{identity:?} {order}: {name} should have the webhook's credentials"
        );
    }
    assert!(
        !has_credentials(identity, pod, named(pod, "sidecar")),
        "{identity:?} {order}: the sidecar is skipped by its own annotation"
    );
    let again = call(Webhook::Mutate, pod);
    assert!(again.allowed, "{identity:?} {order}: {}", again.message);
    assert_eq!(
        again.patch(),
        &[] as &[Value],
        "{identity:?} {order}: reinvoked /mutate must change nothing"
    );
    let validated = call(Webhook::Validate, pod);
    assert!(
        validated.allowed,
        "{identity:?} {order}: /validate denied: {}",
        validated.message
    );
}

fn annotations(identity: Identity) -> Value {
    match identity {
        Identity::Eks => json!({"eks.amazonaws.com/skip-containers": "sidecar"}),
        Identity::Azure => json!({"azure.workload.identity/skip-containers": "sidecar;"}),
    }
}

#[test]
fn the_webhook_first_then_modelgate_then_the_webhook_reinvoked() {
    for identity in [Identity::Azure, Identity::Eks] {
        let pod = serving_pod(annotations(identity));
        let pod = identity.apply(&pod);
        let pod = modelgate(&pod);
        let prep = named(&pod, PREP).clone();
        assert_eq!(prep["name"], PREP);
        let skip = &pod["metadata"]["annotations"][identity.skip_annotation()];
        assert!(
            identity.skipped(&pod).iter().any(|n| n == PREP),
            "{identity:?}: {skip}"
        );
        assert!(
            identity.skipped(&pod).iter().any(|n| n == "sidecar"),
            "{identity:?}: the user's names are kept: {skip}"
        );
        let pod = identity.apply(&pod);
        check_admitted(identity, &pod, &prep, "webhook, modelgate, webhook");
    }
}

#[test]
fn modelgate_first_then_the_webhook() {
    for identity in [Identity::Azure, Identity::Eks] {
        let pod = modelgate(&serving_pod(annotations(identity)));
        let prep = named(&pod, PREP).clone();
        let pod = identity.apply(&pod);
        check_admitted(identity, &pod, &prep, "modelgate, webhook");
    }
}

#[test]
fn without_the_annotation_the_webhook_would_have_given_the_prep_credentials() {
    // The premise, played without modelgate's annotations: the prep loses its canonical form
    // and `/validate` refuses the pod.
    for identity in [Identity::Azure, Identity::Eks] {
        let pod = modelgate(&serving_pod(json!({})));
        let mut stripped = pod.clone();
        stripped["metadata"]["annotations"] = json!({});
        let stripped = identity.apply(&stripped);
        assert!(has_credentials(identity, &stripped, named(&stripped, PREP)));
        let validated = call(Webhook::Validate, &stripped);
        assert!(!validated.allowed, "{identity:?}");
        assert!(
            validated.message.contains("model-cache-prep"),
            "{identity:?}: {}",
            validated.message
        );
    }
}

#[test]
fn a_pod_of_a_job_carries_the_annotations_from_its_template() {
    // The Job's template gets the prep and both annotations at the Job's creation; its pods
    // come through the webhooks again, each with them from the start.
    let pod = serving_pod(json!({}));
    let job = json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "warmup", "namespace": "team-a"},
        "spec": {"template": {"spec": {
            "restartPolicy": "Never",
            "initContainers": pod["spec"]["initContainers"].clone(),
            "containers": pod["spec"]["containers"].clone(),
            "volumes": pod["spec"]["volumes"].clone()}}}
    });
    let job = modelgate(&job);
    let template = &job["spec"]["template"];
    for identity in [Identity::Azure, Identity::Eks] {
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"generateName": "warmup-", "namespace": "team-a",
                         "annotations": template["metadata"]["annotations"].clone()},
            "spec": template["spec"].clone(),
        });
        let prep = named(&pod, PREP).clone();
        // Azure before modelgate, EKS after it: either way the prep is left alone, and
        // modelgate has nothing to change on the pod.
        let pod = identity.apply(&pod);
        assert_eq!(named(&pod, PREP), &prep, "{identity:?}");
        let answer = call(Webhook::Mutate, &pod);
        assert!(answer.allowed, "{}", answer.message);
        assert_eq!(answer.patch(), &[] as &[Value], "{identity:?}");
        assert!(call(Webhook::Validate, &pod).allowed, "{identity:?}");
    }
}
