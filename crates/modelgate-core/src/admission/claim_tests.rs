//! The prep on claims (docs/policy.md, "Claims whose volume the tenant picked"): a claim bound
//! by name or selector, a model cache's claim, a claim that does not exist, and the storage
//! classes, through real AdmissionReviews.

use serde_json::{Value, json};

use super::*;
use crate::cache::{CacheEntry, CacheIndex, CacheScope, PvcPhase, PvcState};
use crate::config::{AbsentClaims, PolicyConfig};
use crate::testing;

fn pod_with(volume: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "llm"},
        "spec": {
            "volumes": [volume],
            "containers": [{"name": "main", "image": "vllm",
                            "volumeMounts": [{"name": "model-cache", "mountPath": "/cache"}]}]
        }
    })
}

fn claim_volume(claim: &str) -> Value {
    json!({"name": "model-cache", "persistentVolumeClaim": {"claimName": claim}})
}

fn review(operation: &str, object: Value) -> Value {
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u", "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": "team-a", "operation": operation, "userInfo": {"username": "alice"},
        "object": object,
    }})
}

struct Answer {
    allowed: bool,
    warnings: Vec<String>,
    patched: Value,
    message: String,
    claim_to_read: Option<String>,
}

fn run(webhook: Webhook, object: &Value, cfg: &PolicyConfig, index: &CacheIndex) -> Answer {
    let review = review("CREATE", object.clone());
    let ctx = testing::context(cfg, index);
    let answer = testing::review(webhook, &review, &ctx);
    let request = Request::from_slice(review.to_string().as_bytes()).unwrap();
    let decision = decide(webhook, &request, &ctx);
    let response = &answer.body["response"];
    Answer {
        allowed: response["allowed"] == true,
        warnings: response["warnings"]
            .as_array()
            .map(|a| a.iter().map(|w| w.as_str().unwrap().to_string()).collect())
            .unwrap_or_default(),
        patched: answer.patched(object),
        message: response["status"]["message"]
            .as_str()
            .unwrap_or_default()
            .into(),
        claim_to_read: decision.claim_to_read,
    }
}

fn has_prep(pod: &Value) -> bool {
    pod["spec"]["initContainers"]
        .as_array()
        .is_some_and(|a| a.iter().any(|c| c["name"] == "model-cache-prep"))
}

fn serve_config() -> PolicyConfig {
    PolicyConfig {
        absent_claims: AbsentClaims::Missing,
        ..PolicyConfig::default()
    }
}

fn claims(entries: &[(&str, PvcState)]) -> CacheIndex {
    let mut index = CacheIndex::new();
    for (name, state) in entries {
        index.upsert_pvc("team-a", *name, state.clone());
    }
    index
}

fn picked() -> PvcState {
    PvcState {
        picked: true,
        ..PvcState::provisioned(PvcPhase::Bound)
    }
}

fn of_class(class: &str) -> PvcState {
    PvcState {
        storage_class: Some(class.into()),
        ..PvcState::provisioned(PvcPhase::Bound)
    }
}

#[test]
fn a_provisioned_claim_gets_the_prep_and_one_bound_by_name_does_not() {
    let cfg = serve_config();
    let index = claims(&[
        ("provisioned", PvcState::provisioned(PvcPhase::Pending)),
        ("static-nfs", picked()),
    ]);
    let a = run(
        Webhook::Mutate,
        &pod_with(claim_volume("provisioned")),
        &cfg,
        &index,
    );
    assert!(has_prep(&a.patched), "{}", a.patched);
    assert!(a.warnings.is_empty(), "{:?}", a.warnings);

    let a = run(
        Webhook::Mutate,
        &pod_with(claim_volume("static-nfs")),
        &cfg,
        &index,
    );
    assert!(a.allowed);
    assert!(!has_prep(&a.patched), "{}", a.patched);
    assert_eq!(
        a.warnings,
        [
            "claim static-nfs names its volume (spec.volumeName or spec.selector): no root \
          model-cache-prep there (--prep-volume-type prebound allows it); the pod is treated \
          as under --model-cache-prep=never"
        ]
    );
    // As under `never`: the pod runs as the cache owner, and that validates.
    assert_eq!(a.patched["spec"]["securityContext"]["runAsUser"], 101);
    assert!(run(Webhook::Validate, &a.patched, &cfg, &index).allowed);

    // The hostile case: the tenant writes the canonical prep itself, as it would be injected
    // on a provisioned claim, onto the claim it bound to a volume of its choosing.
    let mut own = run(
        Webhook::Mutate,
        &pod_with(claim_volume("provisioned")),
        &cfg,
        &index,
    )
    .patched;
    own["spec"]["volumes"] = json!([claim_volume("static-nfs")]);
    let v = run(Webhook::Validate, &own, &cfg, &index);
    assert!(
        !v.allowed,
        "a hand-written prep on a picked claim must be refused"
    );
    assert!(v.message.contains("model-cache-prep"), "{}", v.message);

    // `--prep-volume-type prebound` lets it have the prep.
    let cfg = PolicyConfig {
        prep_volume_types: vec!["prebound".into()],
        ..serve_config()
    };
    let a = run(
        Webhook::Mutate,
        &pod_with(claim_volume("static-nfs")),
        &cfg,
        &index,
    );
    assert!(has_prep(&a.patched), "{}", a.patched);
    assert!(run(Webhook::Validate, &a.patched, &cfg, &index).allowed);
}

#[test]
fn a_model_caches_claim_never_gets_the_prep() {
    let cfg = PolicyConfig {
        prep_volume_types: vec!["prebound".into()],
        ..serve_config()
    };
    let mut index = claims(&[
        ("llama-gpu", PvcState::provisioned(PvcPhase::Bound)),
        ("team-store", PvcState::provisioned(PvcPhase::Bound)),
        ("llama-gpu-extra", PvcState::provisioned(PvcPhase::Bound)),
    ]);
    index.upsert_cache(CacheEntry::new(
        CacheScope::Cluster,
        "llama",
        "hf://org/llama",
        &["gpu"],
    ));
    index.upsert_cache(CacheEntry::from_parts(
        CacheScope::Namespace("team-a".into()),
        "mine".into(),
        "hf://org/mine".into(),
        crate::cache::CacheStorage::PvcRef("team-store".into()),
        Default::default(),
    ));
    for (claim, owner) in [
        ("llama-gpu", "LocalModelCache llama"),
        ("team-store", "LocalModelNamespaceCache team-a/mine"),
    ] {
        let a = run(
            Webhook::Mutate,
            &pod_with(claim_volume(claim)),
            &cfg,
            &index,
        );
        assert!(!has_prep(&a.patched), "{claim}: {}", a.patched);
        assert_eq!(
            a.warnings,
            [format!(
                "the cache volume is claim {claim}, the model store of {owner}: never a root \
                 model-cache-prep there; the pod is treated as under --model-cache-prep=never"
            )]
        );
    }
    // A claim whose name only starts like one is the tenant's own.
    let a = run(
        Webhook::Mutate,
        &pod_with(claim_volume("llama-gpu-extra")),
        &cfg,
        &index,
    );
    assert!(has_prep(&a.patched), "{}", a.patched);
}

#[test]
fn a_claim_that_does_not_exist_gets_no_prep_and_is_read_by_serve() {
    let cfg = serve_config();
    let index = CacheIndex::new();
    let a = run(
        Webhook::Mutate,
        &pod_with(claim_volume("later")),
        &cfg,
        &index,
    );
    assert!(!has_prep(&a.patched), "{}", a.patched);
    assert_eq!(
        a.warnings,
        [
            "claim later does not exist: no root model-cache-prep (it could be created bound to \
          a volume of anyone's choosing); the pod is treated as under --model-cache-prep=never"
        ]
    );
    // The server reads it once and decides again with what it found.
    assert_eq!(a.claim_to_read.as_deref(), Some("later"));
    let index = claims(&[("later", PvcState::provisioned(PvcPhase::Pending))]);
    let a = run(
        Webhook::Mutate,
        &pod_with(claim_volume("later")),
        &cfg,
        &index,
    );
    assert!(has_prep(&a.patched), "{}", a.patched);
    assert_eq!(a.claim_to_read, None);

    // Where the claims are a file's (`review`), an absent one is taken as provisioned, and a
    // note says so; nothing is read.
    let files = PolicyConfig::default();
    let a = run(
        Webhook::Mutate,
        &pod_with(claim_volume("later")),
        &files,
        &CacheIndex::new(),
    );
    assert!(has_prep(&a.patched), "{}", a.patched);
    assert_eq!(a.claim_to_read, None);
    assert_eq!(a.warnings.len(), 1, "{:?}", a.warnings);
    assert!(
        a.warnings[0].contains("taken as provisioned"),
        "{:?}",
        a.warnings
    );
}

#[test]
fn storage_classes_restrict_the_prep_when_given() {
    let cfg = PolicyConfig {
        prep_storage_classes: vec!["fast-nfs".into()],
        ..serve_config()
    };
    let index = claims(&[
        ("ok", of_class("fast-nfs")),
        ("other", of_class("manual")),
        ("none", PvcState::provisioned(PvcPhase::Bound)),
    ]);
    let a = run(Webhook::Mutate, &pod_with(claim_volume("ok")), &cfg, &index);
    assert!(has_prep(&a.patched), "{}", a.patched);
    for (claim, class) in [("other", "manual"), ("none", "(none written)")] {
        let a = run(
            Webhook::Mutate,
            &pod_with(claim_volume(claim)),
            &cfg,
            &index,
        );
        assert!(!has_prep(&a.patched), "{}", a.patched);
        assert_eq!(
            a.warnings,
            [format!(
                "claim {claim} is of storage class {class}, not one of --prep-storage-class: no \
                 root model-cache-prep there; the pod is treated as under \
                 --model-cache-prep=never"
            )]
        );
    }
}

#[test]
fn an_ephemeral_claim_template_that_names_its_volume_gets_no_prep() {
    let cfg = serve_config();
    let index = CacheIndex::new();
    let template = |spec: Value| json!({"name": "model-cache", "ephemeral": {"volumeClaimTemplate": {"spec": spec}}});
    let plain = template(json!({"accessModes": ["ReadWriteOnce"], "storageClassName": "fast-nfs"}));
    let a = run(Webhook::Mutate, &pod_with(plain.clone()), &cfg, &index);
    assert!(has_prep(&a.patched), "{}", a.patched);

    for spec in [
        json!({"volumeName": "pv-of-my-choice"}),
        json!({"selector": {"matchLabels": {"export": "shared"}}}),
    ] {
        let a = run(
            Webhook::Mutate,
            &pod_with(template(spec.clone())),
            &cfg,
            &index,
        );
        assert!(!has_prep(&a.patched), "{spec}: {}", a.patched);
        assert!(a.warnings[0].starts_with("the cache volume's claim template names its volume"));
    }
    // The class of a template is its own.
    let cfg = PolicyConfig {
        prep_storage_classes: vec!["other".into()],
        ..serve_config()
    };
    let a = run(Webhook::Mutate, &pod_with(plain), &cfg, &index);
    assert!(!has_prep(&a.patched), "{}", a.patched);
}

/// The owner of a claim is found by splitting its name at each dash (one lookup per dash,
/// whatever the caches hold), with only whole node-group names matching.
#[test]
fn a_claims_owner_is_found_at_any_dash_of_its_name() {
    let mut index = CacheIndex::new();
    for i in 0..200 {
        let name = "-".repeat(i + 1);
        let entry = CacheEntry::new(
            CacheScope::Namespace("team-a".into()),
            &format!("a{name}"),
            "hf://org/m",
            &["g"],
        );
        index.upsert_cache(entry);
    }
    let claim = format!("a{}", "-".repeat(252));
    assert!(index.cache_owning_claim("team-a", &claim).is_none());
    assert!(index.cache_owning_claim("team-a", "a--g").is_some());
}
