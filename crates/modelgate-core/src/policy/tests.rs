//! The per-rule account of a mutation (`Mutation::changes`) and of a denial (`Violation::rule`).

use serde_json::{Value, json};

use super::*;
use crate::cache::{CacheEntry, CacheIndex, CacheScope};
use crate::patch::FieldPath;

fn with_workload<T>(pod: &Value, f: impl FnOnce(&Workload) -> T) -> T {
    let text = pod.to_string();
    let view = view::decode_pod(&text).unwrap();
    let meta = view.metadata.as_ref();
    let w = Workload {
        namespace: "team-a",
        restricted_namespace: false,
        claims: None,
        prep_withheld: Default::default(),
        exceptions: Default::default(),
        waivers: Default::default(),
        annotations: meta.and_then(|m| m.annotations.as_ref()),
        object_annotations: meta.and_then(|m| m.annotations.as_ref()),
        labels: meta.and_then(|m| m.labels.as_ref()),
        has_metadata: true,
        spec: view.spec.as_ref().unwrap(),
        meta_path: FieldPath::root().key("metadata"),
        spec_path: FieldPath::root().key("spec"),
    };
    f(&w)
}

/// A cluster cache with everything a hit needs in namespace `team-a` (the workloads' here).
fn index() -> CacheIndex {
    let mut idx = CacheIndex::new();
    idx.upsert_cache(
        CacheEntry::new(CacheScope::Cluster, "llama", "hf://org/llama", &["workers"])
            .downloaded_on(&["n1"]),
    );
    idx.upsert_node_group("workers", None);
    idx.upsert_node(
        "n1",
        [("kubernetes.io/hostname".to_string(), "n1".to_string())].into(),
    );
    let bound = crate::cache::PvcState::provisioned(crate::cache::PvcPhase::Bound);
    idx.upsert_pvc("team-a", "llama-workers", bound);
    idx
}

fn cache_pod() -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "annotations": {"modelgate.io/model-uri": "hf://org/llama"}},
        "spec": {
            "containers": [{"name": "c", "image": "x", "securityContext": {"runAsNonRoot": false}}],
            "volumes": [{"name": "model-cache", "persistentVolumeClaim": {"claimName": "cache"}}]
        }
    })
}

fn described(changes: &[Change]) -> Vec<(Rule, String)> {
    changes.iter().map(|c| (c.rule, c.description())).collect()
}

#[test]
fn every_change_is_accounted_for_with_its_rule() {
    let idx = index();
    let cfg = PolicyConfig::default();
    let m = with_workload(&cache_pod(), |w| {
        mutate_create(w, &cfg, Caches::Ready(&idx)).unwrap()
    });
    assert_eq!(
        described(&m.changes),
        [
            (
                Rule::NonRoot,
                "set spec.securityContext.runAsNonRoot=true".into()
            ),
            (
                Rule::NonRoot,
                "set spec.securityContext.runAsUser=1000".into()
            ),
            (
                Rule::NonRoot,
                "set spec.securityContext.runAsGroup=1000".into()
            ),
            (
                Rule::CachePrep,
                "set spec.securityContext.fsGroup=102".into()
            ),
            (
                Rule::NonRoot,
                "set spec.containers[0].securityContext.runAsNonRoot=true".into()
            ),
            (
                Rule::ModelCache,
                "mount hf://org/llama from LocalModelCache llama".into()
            ),
            (Rule::CachePrep, "inject model-cache-prep".into()),
            (
                Rule::CachePrep,
                "add model-cache-prep to azure.workload.identity/skip-containers".into()
            ),
            (
                Rule::CachePrep,
                "add model-cache-prep to eks.amazonaws.com/skip-containers".into()
            ),
        ]
    );
    assert_eq!(
        m.changes[4].would(),
        "would set spec.containers[0].securityContext.runAsNonRoot=true"
    );
    // The warnings of the applied mutation are the announced changes, as before.
    assert_eq!(
        m.warnings(),
        [
            "container c: runAsNonRoot false changed to true",
            "model hf://org/llama served from LocalModelCache llama",
        ]
    );
}

#[test]
fn a_second_pass_has_no_changes_and_still_says_where_the_model_is_from() {
    let idx = index();
    let cfg = PolicyConfig::default();
    let mut pod = cache_pod();
    let m = with_workload(&pod, |w| {
        mutate_create(w, &cfg, Caches::Ready(&idx)).unwrap()
    });
    json_patch::patch(&mut pod, &m.patch.into_patch().operations()).unwrap();
    let again = with_workload(&pod, |w| {
        mutate_create(w, &cfg, Caches::Ready(&idx)).unwrap()
    });
    assert!(again.patch.is_empty());
    assert!(again.changes.is_empty(), "{:?}", again.changes);
    assert_eq!(
        again.warnings(),
        ["model hf://org/llama served from LocalModelCache llama"]
    );
}

#[test]
fn a_miss_and_a_replaced_prep_are_changes_too() {
    let cfg = PolicyConfig::default();
    let mut pod = cache_pod();
    pod["spec"]["containers"][0]["securityContext"] = json!({});
    pod["spec"]["securityContext"] =
        json!({"runAsNonRoot": true, "runAsUser": 5, "runAsGroup": 5, "fsGroup": 5});
    pod["spec"]["initContainers"] = json!([{"name": "model-cache-prep", "image": "old"}]);
    let idx = index();
    let m = with_workload(&pod, |w| {
        mutate_create(w, &cfg, Caches::NotSynced(&idx)).unwrap()
    });
    assert_eq!(
        described(&m.changes),
        [
            (
                Rule::ModelCache,
                "record a model cache miss for hf://org/llama (modelgate.io/model-cache: miss, \
                 modelgate.io/model-cache-reason: not-synced)"
                    .into()
            ),
            (
                Rule::CachePrep,
                "replace model-cache-prep by the canonical one for this pod".into()
            ),
            (
                Rule::CachePrep,
                "add model-cache-prep to azure.workload.identity/skip-containers".into()
            ),
            (
                Rule::CachePrep,
                "add model-cache-prep to eks.amazonaws.com/skip-containers".into()
            ),
        ]
    );
    // The miss is no news to announce; "not synced" is a note, not a change.
    assert_eq!(
        m.warnings(),
        [
            "model-cache-prep init container replaced by the canonical one for this pod",
            "model caches are not synced yet: model cache lookup treated as a miss (not-synced)",
        ]
    );
}

#[test]
fn a_miss_of_a_matched_cache_announces_what_is_missing() {
    let mut idx = index();
    assert!(idx.remove_pvc("team-a", "llama-workers"));
    let cfg = PolicyConfig::default();
    let m = with_workload(&cache_pod(), |w| {
        mutate_create(w, &cfg, Caches::Ready(&idx)).unwrap()
    });
    let miss = m
        .changes
        .iter()
        .find(|c| c.rule == Rule::ModelCache)
        .unwrap();
    assert_eq!(
        miss.applied_warning.as_deref(),
        Some(
            "pvc-missing: LocalModelCache llama matches hf://org/llama but PVC \
             team-a/llama-workers does not exist"
        )
    );
    assert!(
        m.warnings()
            .contains(&miss.applied_warning.clone().unwrap())
    );
}

#[test]
fn a_miss_warning_shortens_the_uri_and_keeps_the_cache_and_the_missing_object() {
    let long = format!("hf://org/{}", "x".repeat(400));
    let w = miss_warning_for(&long);
    assert!(w.len() <= MAX_WARNING_LEN, "{} bytes", w.len());
    assert!(
        w.starts_with("pvc-missing: LocalModelCache llama matches hf://org/x"),
        "{w}"
    );
    assert!(
        w.ends_with(" but PVC default/llama-workers does not exist"),
        "{w}"
    );
}

fn miss_warning_for(uri: &str) -> String {
    model_cache::miss_warning(
        crate::cache::MissReason::PvcMissing,
        "LocalModelCache llama",
        uri,
        "PVC default/llama-workers does not exist",
    )
}

#[test]
fn ephemeral_changes_name_the_ephemeral_container() {
    let cfg = PolicyConfig::default();
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
        "spec": {
            "containers": [{"name": "c", "image": "x"}],
            "ephemeralContainers": [{"name": "dbg", "image": "busybox", "securityContext": {"runAsNonRoot": false}}]
        }
    });
    let m = with_workload(&pod, |w| {
        mutate_ephemeral(w, &cfg, EphemeralScope::WholePod).unwrap()
    });
    assert_eq!(
        described(&m.changes),
        [
            (
                Rule::NonRoot,
                "set spec.ephemeralContainers[0].securityContext.runAsNonRoot=true".into()
            ),
            (
                Rule::NonRoot,
                "set spec.ephemeralContainers[0].securityContext.runAsUser=1000".into()
            ),
            (
                Rule::NonRoot,
                "set spec.ephemeralContainers[0].securityContext.runAsGroup=1000".into()
            ),
        ]
    );
    assert_eq!(
        m.warnings(),
        ["container dbg: runAsNonRoot false changed to true"]
    );
}

#[test]
fn violations_carry_their_rule() {
    let cfg = PolicyConfig::default();
    let mut pod = cache_pod();
    pod["spec"]["securityContext"] = json!({"runAsUser": 0});
    pod["spec"]["initContainers"] = json!([{"name": "model-cache-prep", "image": "evil"}]);
    let denial = with_workload(&pod, |w| validate(w, &cfg, None)).unwrap_err();
    let rules: Vec<(Rule, &str)> = denial
        .violations
        .iter()
        .map(|v| (v.rule, v.field.as_str()))
        .collect();
    assert_eq!(
        rules,
        [
            (Rule::NonRoot, "spec.securityContext.runAsUser"),
            (Rule::CachePrep, "spec.initContainers[0]"),
            (
                Rule::NonRoot,
                "spec.initContainers[0].securityContext.runAsNonRoot"
            ),
            (
                Rule::NonRoot,
                "spec.containers[0].securityContext.runAsNonRoot"
            ),
        ]
    );
}

#[test]
fn uris_are_shortened_in_the_middle_on_character_boundaries() {
    assert_eq!(shorten_uri("hf://org/m", 10), "hf://org/m");
    let short = shorten_uri("hf://org/model/weights", 12);
    assert_eq!(short, "hf://…ghts");
    assert!(short.len() <= 12);
    let uri = "gs://bücket/ünïcödé/ﬁle";
    for room in 0..40 {
        let s = shorten_uri(uri, room);
        assert!(s.len() <= room.max(3), "{room}: {s}");
        assert_eq!(s.contains('…'), uri.len() > room, "{room}: {s}");
        assert!(s.starts_with("gs") || room < 6, "{room}: {s}");
    }
}

/// A pod that modelgate's MutatingAdmissionPolicy mutated first (docs/policy.md §13, "The MAP")
/// gets the changes and warnings of the pod as it came, and a patch that removes the annotation
/// and sets the rest; a listed field whose value is not the MAP's is not reported, but warned of.
#[test]
fn what_the_map_set_is_reported_as_set_here() {
    let cfg = PolicyConfig::default();
    let idx = CacheIndex::new();
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
        "spec": {"containers": [
            {"name": "a", "image": "x", "securityContext": {"runAsNonRoot": false}},
            {"name": "b", "image": "x"}],
            "volumes": [{"name": "model-cache", "emptyDir": {}}]}});
    let alone = with_workload(&pod, |w| {
        mutate_create(w, &cfg, Caches::Ready(&idx)).unwrap()
    });
    let mut after_map = pod.clone();
    after_map["metadata"]["annotations"] = json!({SET_BY_POLICY: "securityContext.runAsNonRoot,\
        securityContext.runAsUser,securityContext.runAsGroup,containers[a].securityContext.runAsNonRoot"});
    after_map["spec"]["securityContext"] =
        json!({"runAsNonRoot": true, "runAsUser": 1000, "runAsGroup": 1000});
    after_map["spec"]["containers"][0]["securityContext"]["runAsNonRoot"] = json!(true);
    let after = with_workload(&after_map, |w| {
        mutate_create(w, &cfg, Caches::Ready(&idx)).unwrap()
    });
    assert_eq!(described(&alone.changes), described(&after.changes));
    assert_eq!(alone.warnings(), after.warnings());
    assert_eq!(
        serde_json::to_value(after.patch.into_patch().operations()).unwrap(),
        json!([{"op": "remove", "path": "/metadata/annotations/modelgate.io~1set-by-policy"}])
    );

    // By hand, with another uid than the MAP's: the uid is the pod's own, and the entry is
    // named in a warning.
    after_map["spec"]["securityContext"]["runAsUser"] = json!(5);
    let forged = with_workload(&after_map, |w| {
        mutate_create(w, &cfg, Caches::Ready(&idx)).unwrap()
    });
    let mut expected = described(&alone.changes);
    expected.retain(|(_, d)| !d.contains("runAsUser"));
    assert_eq!(described(&forged.changes), expected);
    let warnings = forged.warnings();
    assert!(
        warnings.last().unwrap().starts_with(SET_BY_POLICY)
            && warnings
                .last()
                .unwrap()
                .ends_with(": securityContext.runAsUser"),
        "{warnings:?}"
    );
}
