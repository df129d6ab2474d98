//! Speed buys no behaviour change: the request path decodes only the fields the rules read
//! (`policy::view`, SPEC.md §6), and this test holds it to the decode it replaced.
//!
//! The reference is the previous decode, kept here and only here: the object decoded as a typed
//! k8s-openapi `ObjectMeta` and `PodSpec` (or `JobSpec`), path-named errors through
//! `serde_path_to_error`, the init containers taken from the text as received. Its reading of the
//! object is written back as JSON and run through the same pipeline; the answer (decision, patch,
//! warnings, denial message) must be the one the pipeline gives for the object itself, byte for
//! byte. Where the typed decode refuses the object:
//!
//! - because a field a rule reads has the wrong type, the pipeline refuses it with the same
//!   message;
//! - because of a field no rule reads, the pipeline no longer type-checks it (the intended
//!   difference of SPEC.md §6): the test asserts exactly that the refused field is not one the
//!   rules read.
//!
//! Over every object and review of `../shared/corpus`, `tests/fixtures` and `benches/reviews`,
//! and over generated pods and Jobs (proptest) that mix valid and invalid values, wrong types in
//! read and unread fields, `null`s and unknown fields at every level.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::batch::v1::{JobSpec, JobStatus};
use k8s_openapi::api::core::v1::{PodSpec, PodStatus, SecurityContext, VolumeMount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use modelgate::admission::{self, Context, Webhook};
use modelgate::cache::CacheIndex;
use modelgate::config::{IdSetting, PolicyConfig, PrepMode};
use modelgate::namespaces::Mode;
use modelgate::patch::FieldPath;
use modelgate::policy::view::{
    self, AffinityView, ContainerView, IgnoredAnyPresent, InitContainerView, NodeAffinityView,
    NodeSelectorRequirementView, NodeSelectorTermView, NodeSelectorView, ObjectMetaView, PodOsView,
    PodSecurityContextView, PodSpecOf, PodSpecView, PvcSourceView, SecurityContextView, Str,
    StrMap, VolumeMountView, VolumeView,
};
use modelgate::policy::{self, Caches, Workload};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Value, json};

// ---------------------------------------------------------------------------------------------
// The previous decode (the reference)
// ---------------------------------------------------------------------------------------------

#[derive(Deserialize, Serialize)]
struct TypedPod {
    #[serde(skip_serializing_if = "Option::is_none")]
    kind: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    metadata: Option<ObjectMeta>,
    #[serde(skip_serializing_if = "Option::is_none")]
    spec: Option<PodSpec>,
    #[serde(skip_serializing)]
    #[allow(dead_code)] // decoded so that a malformed status was refused like any field
    status: Option<PodStatus>,
}

#[derive(Deserialize, Serialize)]
struct TypedJob {
    #[serde(skip_serializing_if = "Option::is_none")]
    kind: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    metadata: Option<ObjectMeta>,
    #[serde(skip_serializing_if = "Option::is_none")]
    spec: Option<JobSpec>,
    #[serde(skip_serializing)]
    #[allow(dead_code)]
    status: Option<JobStatus>,
}

/// What the typed decode read: the object as JSON (its typed reading, init containers as
/// received), or the field it refused and the message.
enum Typed {
    Read(Value),
    Refused {
        field: String,
        message: String,
    },
    /// Not a workload object the pipeline decodes (another kind, another operation, no object).
    NotDecoded,
}

fn typed_decode<T: serde::de::DeserializeOwned + Serialize>(text: &str, kind: &str) -> Typed {
    let de = &mut serde_json::Deserializer::from_str(text);
    match serde_path_to_error::deserialize::<_, T>(de) {
        Ok(t) => Typed::Read(serde_json::to_value(&t).unwrap()),
        Err(e) => {
            let path = e.path().to_string();
            let inner = e.inner();
            let message = inner.to_string();
            let position = format!(" at line {} column {}", inner.line(), inner.column());
            Typed::Refused {
                field: if path == "." {
                    "request.object".into()
                } else {
                    path
                },
                message: format!(
                    "cannot be decoded as a {kind}: {}",
                    message.strip_suffix(&position).unwrap_or(&message)
                ),
            }
        }
    }
}

/// The previous decode of a review's object.
fn reference(review: &Value) -> Typed {
    let request = &review["request"];
    let kind = (
        request["kind"]["group"].as_str().unwrap_or(""),
        request["kind"]["version"].as_str().unwrap_or(""),
        request["kind"]["kind"].as_str().unwrap_or(""),
    );
    let object = &request["object"];
    if !object.is_object() {
        return Typed::NotDecoded;
    }
    let text = object.to_string();
    let (typed, init_at) = match kind {
        ("", "v1", "Pod") => (typed_decode::<TypedPod>(&text, "Pod"), "/spec"),
        ("batch", "v1", "Job") => (
            typed_decode::<TypedJob>(&text, "Job"),
            "/spec/template/spec",
        ),
        _ => return Typed::NotDecoded,
    };
    match typed {
        Typed::Read(mut read) => {
            // The old decode judged the prep container on the init containers as received.
            let received = object
                .pointer(&format!("{init_at}/initContainers"))
                .filter(|v| !v.is_null());
            if let (Some(received), Some(spec)) = (received, read.pointer_mut(init_at)) {
                spec["initContainers"] = received.clone();
            }
            if let Some(api_version) = object.get("apiVersion") {
                read["apiVersion"] = api_version.clone();
            }
            Typed::Read(read)
        }
        other => other,
    }
}

/// Whether `path` (a field path as serde_path_to_error writes it) is a field a rule reads, or a
/// container of such fields: the fields `policy::view` decodes.
fn is_read_field(path: &str) -> bool {
    let path = path
        .strip_prefix("spec.template.")
        .map(|p| format!("template.{p}"))
        .unwrap_or_else(|| path.to_string());
    // Indices and map keys do not matter: reduce `containers[3]` to `containers[]` and the key
    // of a string map to `*`.
    let mut shape = String::new();
    let mut chars = path.chars().peekable();
    while let Some(c) = chars.next() {
        shape.push(c);
        if c == '[' {
            for d in chars.by_ref() {
                if d == ']' {
                    shape.push(']');
                    break;
                }
            }
        }
    }
    const MAPS: [&str; 3] = ["labels", "annotations", "nodeSelector"];
    let mut segments: Vec<&str> = shape.split('.').collect();
    if segments.len() >= 2 && MAPS.contains(&segments[segments.len() - 2]) {
        let last = segments.len() - 1;
        segments[last] = "*";
    }
    let shape = segments.join(".");
    let meta = |m: &str| {
        [
            "",
            ".name",
            ".generateName",
            ".namespace",
            ".labels",
            ".labels.*",
            ".annotations",
            ".annotations.*",
        ]
        .iter()
        .any(|f| shape == format!("{m}{f}"))
    };
    let container_fields = [
        "",
        "[]",
        "[].name",
        "[].securityContext",
        "[].securityContext.runAsUser",
        "[].securityContext.runAsGroup",
        "[].securityContext.runAsNonRoot",
        "[].volumeMounts",
        "[].volumeMounts[]",
        "[].volumeMounts[].name",
        "[].volumeMounts[].mountPath",
        "[].volumeMounts[].subPath",
        "[].volumeMounts[].readOnly",
    ];
    let term = "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution";
    let spec_fields: Vec<String> = [
        "".to_string(),
        ".securityContext".into(),
        ".securityContext.runAsUser".into(),
        ".securityContext.runAsGroup".into(),
        ".securityContext.runAsNonRoot".into(),
        ".securityContext.fsGroup".into(),
        ".os".into(),
        ".os.name".into(),
        ".nodeSelector".into(),
        ".nodeSelector.*".into(),
        ".affinity".into(),
        ".affinity.nodeAffinity".into(),
        format!(".{term}"),
        format!(".{term}.nodeSelectorTerms"),
        format!(".{term}.nodeSelectorTerms[]"),
        format!(".{term}.nodeSelectorTerms[].matchExpressions"),
        format!(".{term}.nodeSelectorTerms[].matchFields"),
        ".volumes".into(),
        ".volumes[]".into(),
        ".volumes[].name".into(),
        ".volumes[].persistentVolumeClaim".into(),
        ".volumes[].persistentVolumeClaim.claimName".into(),
        ".volumes[].persistentVolumeClaim.readOnly".into(),
    ]
    .into_iter()
    .chain(
        ["initContainers", "containers", "ephemeralContainers"]
            .iter()
            .flat_map(|l| container_fields.iter().map(move |f| format!(".{l}{f}"))),
    )
    .chain(["matchExpressions", "matchFields"].iter().flat_map(|l| {
        ["[]", "[].key", "[].operator", "[].values", "[].values[]"]
            .iter()
            .map(move |f| format!(".{term}.nodeSelectorTerms[].{l}{f}"))
    }))
    .collect();
    let spec = |s: &str| spec_fields.iter().any(|f| shape == format!("{s}{f}"));
    shape == "request.object"
        || shape == "kind"
        || meta("metadata")
        || meta("template.metadata")
        || spec("spec")
        || spec("template.spec")
        || shape == "spec.template"
        || shape == "template"
}

// ---------------------------------------------------------------------------------------------
// The typed reading as views, without the views' decoder
// ---------------------------------------------------------------------------------------------

fn s(v: &str) -> Str<'_> {
    Str(Cow::Borrowed(v))
}

fn str_map(m: &Option<BTreeMap<String, String>>) -> Option<StrMap<'_>> {
    m.as_ref()
        .map(|m| StrMap::from_pairs(m.iter().map(|(k, v)| (k.as_str(), v.as_str()))))
}

fn meta_view(m: &ObjectMeta) -> ObjectMetaView<'_> {
    ObjectMetaView {
        name: m.name.as_deref().map(s),
        generate_name: m.generate_name.as_deref().map(s),
        namespace: m.namespace.as_deref().map(s),
        labels: str_map(&m.labels),
        annotations: str_map(&m.annotations),
    }
}

fn container_view<'a>(
    name: &'a str,
    sc: &Option<SecurityContext>,
    mounts: &'a Option<Vec<VolumeMount>>,
) -> ContainerView<'a> {
    ContainerView {
        name: Some(s(name)),
        security_context: sc.as_ref().map(|sc| SecurityContextView {
            run_as_user: sc.run_as_user,
            run_as_group: sc.run_as_group,
            run_as_non_root: sc.run_as_non_root,
        }),
        volume_mounts: mounts.as_ref().map(|ms| {
            ms.iter()
                .map(|m| VolumeMountView {
                    name: Some(s(&m.name)),
                    mount_path: Some(s(&m.mount_path)),
                    sub_path: m.sub_path.as_deref().map(s),
                    read_only: m.read_only,
                    sub_path_expr: m.sub_path_expr.as_ref().map(|_| IgnoredAnyPresent),
                    mount_propagation: m.mount_propagation.as_ref().map(|_| IgnoredAnyPresent),
                    recursive_read_only: m.recursive_read_only.as_ref().map(|_| IgnoredAnyPresent),
                })
                .collect()
        }),
    }
}

fn requirements(
    rs: &Option<Vec<k8s_openapi::api::core::v1::NodeSelectorRequirement>>,
) -> Option<Vec<NodeSelectorRequirementView<'_>>> {
    rs.as_ref().map(|rs| {
        rs.iter()
            .map(|r| NodeSelectorRequirementView {
                key: Some(s(&r.key)),
                operator: Some(s(&r.operator)),
                values: r.values.as_ref().map(|v| v.iter().map(|x| s(x)).collect()),
            })
            .collect()
    })
}

/// The pod spec as the typed decode read it, as the views the policy takes; the init
/// containers' raw text is the text as received, as the old decode kept it.
fn spec_view<'a>(spec: &'a PodSpec, raw_init: &'a [Box<RawValue>]) -> PodSpecView<'a> {
    let volume_view = |v: &'a k8s_openapi::api::core::v1::Volume| {
        // The typed volume's sources: its known source fields that are set.
        let json = serde_json::to_value(v).unwrap();
        let sources: Vec<Str<'a>> = json
            .as_object()
            .unwrap()
            .keys()
            .filter(|k| *k != "name")
            .map(|k| Str(Cow::Owned(k.clone())))
            .collect();
        VolumeView {
            name: Some(s(&v.name)),
            sources,
            persistent_volume_claim: v.persistent_volume_claim.as_ref().map(|c| PvcSourceView {
                claim_name: Some(s(&c.claim_name)),
                read_only: c.read_only,
            }),
        }
    };
    PodSpecOf {
        security_context: spec
            .security_context
            .as_ref()
            .map(|p| PodSecurityContextView {
                run_as_user: p.run_as_user,
                run_as_group: p.run_as_group,
                run_as_non_root: p.run_as_non_root,
                fs_group: p.fs_group,
            }),
        os: spec.os.as_ref().map(|os| PodOsView {
            name: Some(s(&os.name)),
        }),
        node_selector: str_map(&spec.node_selector),
        affinity: spec.affinity.as_ref().map(|a| AffinityView {
            node_affinity: a.node_affinity.as_ref().map(|n| NodeAffinityView {
                required: n
                    .required_during_scheduling_ignored_during_execution
                    .as_ref()
                    .map(|r| NodeSelectorView {
                        node_selector_terms: Some(
                            r.node_selector_terms
                                .iter()
                                .map(|t| NodeSelectorTermView {
                                    match_expressions: requirements(&t.match_expressions),
                                    match_fields: requirements(&t.match_fields),
                                })
                                .collect(),
                        ),
                    }),
            }),
        }),
        volumes: spec
            .volumes
            .as_ref()
            .map(|vs| vs.iter().map(volume_view).collect()),
        init_containers: spec.init_containers.as_ref().map(|cs| {
            cs.iter()
                .zip(raw_init)
                .map(|(c, raw)| InitContainerView {
                    container: container_view(&c.name, &c.security_context, &c.volume_mounts),
                    raw,
                })
                .collect()
        }),
        containers: Some(
            spec.containers
                .iter()
                .map(|c| container_view(&c.name, &c.security_context, &c.volume_mounts))
                .collect(),
        ),
        ephemeral_containers: spec.ephemeral_containers.as_ref().map(|cs| {
            cs.iter()
                .map(|c| container_view(&c.name, &c.security_context, &c.volume_mounts))
                .collect()
        }),
    }
}

/// What the policy made of one workload: the mutation (patch text, changes, notes) or the
/// denial, and the validation.
fn policy_outcome(w: &Workload, cfg: &PolicyConfig, index: &CacheIndex, ephemeral: bool) -> String {
    let mutation = if ephemeral {
        policy::mutate_ephemeral(w, cfg)
    } else {
        policy::mutate_create(w, cfg, Caches::Ready(index))
    };
    let mutation = mutation.map(|m| {
        let notes = m.notes.clone();
        let changes = m.changes.clone();
        let patch = m.patch.into_patch();
        (
            String::from_utf8(patch.as_bytes().to_vec()).unwrap(),
            changes,
            notes,
        )
    });
    format!("{mutation:?}\n{:?}", policy::validate(w, cfg))
}

/// The policy on the views the decoder reads from `text` and on the views made from the typed
/// decode of the same text must agree, when both read it; returns whether both did.
fn compare_policy(
    label: &str,
    review: &Value,
    cfg: &PolicyConfig,
    index: &CacheIndex,
) -> Result<bool, TestCaseError> {
    let request = &review["request"];
    let object = &request["object"];
    let job = match (
        request["kind"]["group"].as_str(),
        request["kind"]["kind"].as_str(),
    ) {
        (Some(""), Some("Pod")) => false,
        (Some("batch"), Some("Job")) => true,
        _ => return Ok(false),
    };
    if !object.is_object() {
        return Ok(false);
    }
    let ephemeral = request["subResource"] == "ephemeralcontainers";
    let text = object.to_string();
    let init_at = if job {
        "/spec/template/spec/initContainers"
    } else {
        "/spec/initContainers"
    };
    let raw_init: Vec<Box<RawValue>> = object
        .pointer(init_at)
        .and_then(Value::as_array)
        .map(|cs| {
            cs.iter()
                .map(|c| serde_json::value::to_raw_value(c).unwrap())
                .collect()
        })
        .unwrap_or_default();
    let paths = |job: bool| {
        if job {
            (
                FieldPath::root().keys(["spec", "template", "metadata"]),
                FieldPath::root().keys(["spec", "template", "spec"]),
            )
        } else {
            (
                FieldPath::root().key("metadata"),
                FieldPath::root().key("spec"),
            )
        }
    };
    let (meta_path, spec_path) = paths(job);
    let outcome = |meta: Option<&ObjectMetaView<'_>>, spec: &PodSpecView<'_>| {
        let w = Workload {
            kind: if job { "Job" } else { "Pod" },
            namespace: "team-a",
            restricted_namespace: false,
            annotations: meta.and_then(|m| m.annotations.as_ref()),
            labels: meta.and_then(|m| m.labels.as_ref()),
            has_metadata: meta.is_some(),
            spec,
            meta_path: meta_path.clone(),
            spec_path: spec_path.clone(),
        };
        policy_outcome(&w, cfg, index, ephemeral)
    };
    // The views' decoder.
    let ours = if job {
        view::decode_job(&text).ok().and_then(|j| {
            let template = j.spec?.template?;
            let spec = template.spec?;
            Some(outcome(template.metadata.as_ref(), &spec))
        })
    } else {
        view::decode_pod(&text).ok().and_then(|p| {
            let spec = p.spec?;
            Some(outcome(p.metadata.as_ref(), &spec))
        })
    };
    // The typed decode.
    let theirs = if job {
        serde_json::from_str::<TypedJob>(&text).ok().and_then(|j| {
            let template = j.spec?.template;
            let spec = template.spec.as_ref()?;
            let meta = template.metadata.as_ref().map(meta_view);
            Some(outcome(meta.as_ref(), &spec_view(spec, &raw_init)))
        })
    } else {
        serde_json::from_str::<TypedPod>(&text).ok().and_then(|p| {
            let spec = p.spec.as_ref()?;
            let meta = p.metadata.as_ref().map(meta_view);
            Some(outcome(meta.as_ref(), &spec_view(spec, &raw_init)))
        })
    };
    let (Some(ours), Some(theirs)) = (&ours, &theirs) else {
        return Ok(false);
    };
    {
        prop_assert!(
            ours == theirs,
            "{}: the policy differs on the views' reading and the typed reading\nviews: {}\ntyped: {}",
            label,
            ours,
            theirs
        );
    }
    Ok(true)
}

// ---------------------------------------------------------------------------------------------
// The comparison
// ---------------------------------------------------------------------------------------------

fn answer(webhook: Webhook, review: &Value, ctx: &Context) -> Value {
    let out = admission::review(webhook, &serde_json::to_vec(review).unwrap(), ctx);
    let mut body: Value = serde_json::from_slice(&out.body).unwrap();
    body["http"] = out.http_status.into();
    body
}

/// How the typed decode read one review.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Reading {
    NotDecoded,
    Read,
    RefusedReadField,
    RefusedUnreadField,
}

/// Holds the pipeline to the reference on one review, for both webhooks; says how the typed
/// decode read it.
fn compare(label: &str, review: &Value, ctx: &Context) -> Result<Reading, TestCaseError> {
    let typed = reference(review);
    let reading = match &typed {
        Typed::NotDecoded => Reading::NotDecoded,
        Typed::Read(_) => Reading::Read,
        Typed::Refused { field, .. } if is_read_field(field) => Reading::RefusedReadField,
        Typed::Refused { .. } => Reading::RefusedUnreadField,
    };
    for webhook in [Webhook::Mutate, Webhook::Validate] {
        let ours = answer(webhook, review, ctx);
        match &typed {
            Typed::NotDecoded => {}
            Typed::Read(read) => {
                let mut as_read = review.clone();
                as_read["request"]["object"] = read.clone();
                let theirs = answer(webhook, &as_read, ctx);
                prop_assert_eq!(&ours, &theirs, "{}: {:?}", label, webhook);
            }
            Typed::Refused { field, message } => {
                let response = &ours["response"];
                let ours_message = response["status"]["message"].as_str().unwrap_or("");
                let enforced = response["allowed"] == false;
                if is_read_field(field) {
                    // The same refusal, word for word (in enforce; warn and audit say it too).
                    let expected = format!(
                        "{field}: {message}. Fix the object so that it matches the Kubernetes API schema."
                    );
                    let said = ours_message == expected
                        || response["warnings"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .any(|w| {
                                w.as_str() == Some(&format!("would deny: {field}: {message}"))
                            })
                        || response["auditAnnotations"]["would-deny"].as_str() == Some(&expected)
                        || !enforced && ours_message.is_empty() && exempt_or_off(review, ctx);
                    prop_assert!(
                        said,
                        "{}: {:?}: the typed decode refused a read field ({}: {}), the pipeline said {}",
                        label,
                        webhook,
                        field,
                        message,
                        response
                    );
                } else {
                    // Not type-checked any more: whatever the pipeline says, it does not refuse
                    // that field.
                    prop_assert!(
                        !ours_message.contains(field.as_str()),
                        "{}: {:?}: refused the unread field {}: {}",
                        label,
                        webhook,
                        field,
                        ours_message
                    );
                }
            }
        }
    }
    Ok(reading)
}

/// The object is let through untouched for a reason that precedes decoding (an exempt namespace,
/// mode `off`, an operation that is not handled).
fn exempt_or_off(review: &Value, ctx: &Context) -> bool {
    let ns = review["request"]["namespace"].as_str().unwrap_or("");
    ctx.config.is_exempt(ns)
        || ctx.config.default_mode == Mode::Off
        || review["request"]["operation"] != "CREATE"
}

// ---------------------------------------------------------------------------------------------
// The corpus
// ---------------------------------------------------------------------------------------------

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn files_under(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<_> = entries.flatten().map(|e| e.path()).collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            files_under(&path, out);
        } else if path
            .extension()
            .is_some_and(|e| e == "json" || e == "yaml" || e == "yml" || e == "injected")
        {
            out.push(path);
        }
    }
}

/// A CREATE AdmissionReview for an object, as the API server sends it.
fn create_review(uid: &str, object: &Value) -> Value {
    let api_version = object["apiVersion"].as_str().unwrap_or("v1");
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let kind = object["kind"].as_str().unwrap_or("");
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": group, "version": version, "kind": kind},
            "namespace": object["metadata"]["namespace"].as_str().unwrap_or("default"),
            "operation": "CREATE",
            "object": object,
        }
    })
}

/// Every review the corpus and the fixtures hold: objects wrapped as CREATEs, bare requests
/// given an envelope, reviews as they are.
fn corpus_reviews() -> Vec<(String, Value)> {
    let mut files = Vec::new();
    for dir in ["../shared/corpus", "tests/fixtures", "benches/reviews"] {
        files_under(&root().join(dir), &mut files);
    }
    let mut out = Vec::new();
    for path in files {
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        let origin = path.display().to_string();
        let Ok(documents) = modelgate::documents::read_documents(&origin, &text) else {
            continue;
        };
        for (i, d) in documents.into_iter().enumerate() {
            let label = format!("{origin}#{i}");
            let v = d.value;
            let review = if v["kind"] == "AdmissionReview" {
                v
            } else if v.get("uid").is_some() && v.get("operation").is_some() {
                json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": v})
            } else if v.is_object() {
                create_review(&label, &v)
            } else {
                continue;
            };
            out.push((label, review));
        }
    }
    out
}

fn configs() -> Vec<PolicyConfig> {
    vec![
        PolicyConfig {
            exempt_namespaces: vec!["kube-system".into()],
            ..PolicyConfig::default()
        },
        PolicyConfig {
            run_as_user: IdSetting::None,
            run_as_group: IdSetting::None,
            default_fsgroup: 0,
            exempt_namespaces: vec![],
            ..PolicyConfig::default()
        },
        PolicyConfig {
            model_cache_prep: PrepMode::Never,
            exempt_namespaces: vec![],
            default_mode: Mode::Warn,
            ..PolicyConfig::default()
        },
        PolicyConfig {
            exempt_namespaces: vec![],
            default_mode: Mode::Audit,
            ..PolicyConfig::default()
        },
    ]
}

fn caches() -> CacheIndex {
    let mut files = vec![root().join("benches/reviews/caches.json")];
    let kserve = root().join("../shared/corpus/kserve/localmodelcache_readme_objects.yaml");
    if kserve.is_file() {
        files.push(kserve);
        files.push(root().join("tests/fixtures/kserve/localmodelcache-status.yaml"));
    }
    files.push(root().join("tests/fixtures/caches.yaml"));
    CacheIndex::load_files(&files)
        .expect("the test caches load")
        .0
}

#[test]
fn the_corpus_gets_the_answers_of_the_typed_decode() {
    let reviews = corpus_reviews();
    assert!(
        reviews.len() >= 20,
        "only {} reviews found: the fixtures and benches must be there",
        reviews.len()
    );
    let index = caches();
    let mut readings = std::collections::BTreeMap::new();
    let mut policy_compared = 0;
    for cfg in configs() {
        let ctx = Context {
            config: &cfg,
            caches: Caches::Ready(&index),
            namespaces: modelgate::namespaces::Namespaces::none(),
        };
        for (label, review) in &reviews {
            let reading = compare(label, review, &ctx).unwrap_or_else(|e| panic!("{e}"));
            if compare_policy(label, review, &cfg, &index).unwrap_or_else(|e| panic!("{e}")) {
                policy_compared += 1;
            }
            *readings.entry(reading).or_insert(0) += 1;
        }
    }
    println!("corpus reviews under 4 configurations, by the typed decode's reading: {readings:?}");
    println!("{policy_compared} of them through the policy on both readings");
    assert!(readings.get(&Reading::Read).copied().unwrap_or(0) >= 100);
    assert!(policy_compared >= 100, "{policy_compared}");
}

// ---------------------------------------------------------------------------------------------
// Generated pods and Jobs
// ---------------------------------------------------------------------------------------------

/// A value where a rule reads an id: mostly valid, sometimes out of range, sometimes of the
/// wrong type (`"0"`, `1000.5`, `true`, `null`).
fn id_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        40 => prop_oneof![Just(json!(1000)), Just(json!(1)), Just(json!(2_147_483_647)), (2i64..70_000).prop_map(Value::from)],
        6 => prop_oneof![Just(json!(0)), Just(json!(-1)), Just(json!(2_147_483_648i64)), Just(Value::Null)],
        1 => prop_oneof![Just(json!("0")), Just(json!(1000.5)), Just(json!(true))],
    ]
}

fn bool_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        40 => any::<bool>().prop_map(Value::from),
        3 => Just(Value::Null),
        1 => prop_oneof![Just(json!("true")), Just(json!(1))],
    ]
}

/// A value in a field no rule reads: usually `valid` (of its schema's type), sometimes not.
fn unread(valid: Value) -> BoxedStrategy<Value> {
    prop_oneof![
        60 => Just(valid),
        1 => Just(json!("not the schema's type")),
        1 => Just(json!(42)),
        1 => Just(json!([[[[[[{"deep": []}]]]]]])),
    ]
    .boxed()
}

/// A field unknown to every schema here (newer Kubernetes): any JSON at all.
fn unknown_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(json!({"future": [1, "two", {"three": null}]})),
        Just(json!([[[[[[{"deep": []}]]]]]])),
        Just(json!("text")),
    ]
}

/// An object with some of `fields` (each present or not) and, sometimes, an unknown field.
fn object_of(fields: Vec<(&'static str, BoxedStrategy<Value>)>) -> BoxedStrategy<Value> {
    let n = fields.len();
    let (names, values): (Vec<_>, Vec<_>) = fields.into_iter().unzip();
    (
        proptest::collection::vec(any::<bool>(), n),
        values,
        proptest::option::of(unknown_value()),
    )
        .prop_map(move |(present, values, unknown)| {
            let mut m = serde_json::Map::new();
            for ((name, value), present) in names.iter().zip(values).zip(present) {
                if present {
                    m.insert(name.to_string(), value);
                }
            }
            if let Some(u) = unknown {
                m.insert("xFutureField".into(), u);
            }
            Value::Object(m)
        })
        .boxed()
}

fn security_context(pod: bool) -> BoxedStrategy<Value> {
    let mut fields = vec![
        ("runAsUser", id_value().boxed()),
        ("runAsGroup", id_value().boxed()),
        ("runAsNonRoot", bool_value().boxed()),
        ("capabilities", unread(json!({"drop": ["ALL"]}))),
    ];
    if pod {
        fields.push(("fsGroup", id_value().boxed()));
        fields.push(("seLinuxOptions", unread(json!({"level": "s0"}))));
    }
    prop_oneof![1 => Just(Value::Null), 6 => object_of(fields)].boxed()
}

fn mount() -> BoxedStrategy<Value> {
    prop_oneof![
        8 => Just(json!({"name": "model-cache", "mountPath": "/models"})),
        8 => Just(json!({"name": "modelgate-model", "mountPath": "/mnt/models", "subPath": "models/c41ae4f29d692d55", "readOnly": true})),
        4 => Just(json!({"name": "modelgate-model", "mountPath": "/mnt/models", "subPath": "models/x", "readOnly": true})),
        4 => Just(json!({"name": "other", "mountPath": "/mnt/models", "readOnly": true})),
        4 => Just(json!({"name": "modelgate-model", "mountPath": "/mnt/models", "subPath": "models/c41ae4f29d692d55", "readOnly": true, "mountPropagation": "None"})),
        1 => Just(json!({"name": "data", "mountPath": 7})),
        1 => Just(json!({"name": "data", "mountPath": "/data", "subPathExpr": ["x"]})),
    ]
    .boxed()
}

fn container(prep: bool) -> BoxedStrategy<Value> {
    let name = if prep {
        Just(json!("model-cache-prep")).boxed()
    } else {
        prop_oneof![
            40 => prop_oneof![Just(json!("app")), Just(json!("sidecar")), Just(json!("model-cache-prep"))],
            2 => Just(Value::Null),
            1 => Just(json!(5)),
        ]
        .boxed()
    };
    object_of(vec![
        ("name", name),
        (
            "image",
            prop_oneof![40 => Just(json!("busybox")), 1 => Just(json!(5))].boxed(),
        ),
        ("securityContext", security_context(false)),
        (
            "volumeMounts",
            prop_oneof![
                40 => proptest::collection::vec(mount(), 0..3).prop_map(Value::Array),
                3 => Just(Value::Null),
                1 => Just(json!({"name": "x"})),
            ]
            .boxed(),
        ),
        ("ports", unread(json!([{"containerPort": 8080}]))),
        ("resources", unread(json!({"limits": {"cpu": "1"}}))),
    ])
}

/// The canonical prep container for the default configuration and a pod with runAsUser 1000 and
/// fsGroup 102, sometimes with a field smuggled in.
fn canonical_prep() -> BoxedStrategy<Value> {
    let canonical = json!({
        "name": "model-cache-prep",
        "image": "docker.io/curlimages/curl:8.18.0",
        "command": ["sh", "-c", "chown 0:102 /models && chmod g+rwX /models"],
        "volumeMounts": [{"name": "model-cache", "mountPath": "/models"}],
        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"cpu": "100m", "memory": "64Mi"}},
        "securityContext": {"runAsUser": 0, "runAsNonRoot": false, "allowPrivilegeEscalation": false,
            "readOnlyRootFilesystem": true, "capabilities": {"drop": ["ALL"], "add": ["CHOWN", "FOWNER"]},
            "seccompProfile": {"type": "RuntimeDefault"}},
        "imagePullPolicy": "IfNotPresent"
    });
    let mut smuggled = canonical.clone();
    smuggled["securityContext"]["futurePrivilege"] = json!(true);
    prop_oneof![Just(canonical), Just(smuggled)].boxed()
}

fn volume() -> BoxedStrategy<Value> {
    let source = prop_oneof![
        8 => Just(("persistentVolumeClaim", json!({"claimName": "cache"}))),
        1 => Just(("persistentVolumeClaim", json!({"claimName": 3}))),
        4 => Just(("emptyDir", json!({}))),
        4 => Just(("nfs", json!({"server": "s", "path": "/x"}))),
        4 => Just(("configMap", json!({"name": "c"}))),
        1 => Just(("projected", json!({"sources": "wrong type, unread"}))),
        1 => Just(("hostPath", json!({"path": 3}))),
        4 => Just(("cephfs", json!({"monitors": ["m"]}))),
    ];
    let name = prop_oneof![
        Just("model-cache"),
        Just("modelgate-model"),
        Just("data"),
        Just("other")
    ];
    (name, source)
        .prop_map(|(name, (kind, value))| {
            if name == "modelgate-model" {
                json!({"name": name, "persistentVolumeClaim": {"claimName": "llama3-8b-workers", "readOnly": true}})
            } else {
                json!({"name": name, kind: value})
            }
        })
        .boxed()
}

fn affinity() -> BoxedStrategy<Value> {
    let expr = prop_oneof![
        8 => Just(json!({"key": "kubernetes.io/os", "operator": "In", "values": ["windows"]})),
        8 => Just(json!({"key": "node-type", "operator": "In", "values": ["gpu"]})),
        8 => Just(json!({"key": "zone", "operator": "Exists"})),
        1 => Just(json!({"key": "zone", "operator": "In", "values": "a"})),
    ];
    prop_oneof![
        1 => Just(Value::Null),
        1 => Just(json!({"podAntiAffinity": {"x": 1}})),
        4 => proptest::collection::vec(proptest::collection::vec(expr, 0..3), 0..3).prop_map(|terms| {
            let terms: Vec<Value> = terms.into_iter().map(|t| json!({"matchExpressions": t})).collect();
            json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}})
        }),
    ]
    .boxed()
}

fn metadata() -> BoxedStrategy<Value> {
    let annotations = proptest::collection::vec(
        prop_oneof![
            Just((
                "modelgate.io/model-uri",
                json!("hf://meta-llama/Meta-Llama-3-8B")
            )),
            Just(("modelgate.io/model-uri", json!("hf://nobody/nothing"))),
            Just(("serving.kserve.io/nodegroup", json!("workers"))),
            Just(("modelgate.io/disable-model-cache", json!("true"))),
            Just(("modelgate.io/cache-volume", json!("data"))),
            Just(("modelgate.io/model-cache", json!("miss"))),
            Just(("kubernetes.io/config.mirror", json!("x"))),
            Just(("note", json!("five"))),
        ],
        0..4,
    )
    .prop_map(|pairs| {
        let m: serde_json::Map<String, Value> =
            pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        Value::Object(m)
    });
    object_of(vec![
        ("generateName", Just(json!("llama-")).boxed()),
        (
            "namespace",
            prop_oneof![Just(json!("team-a")), Just(json!("kube-system"))].boxed(),
        ),
        ("annotations", annotations.boxed()),
        (
            "labels",
            prop_oneof![
                20 => Just(json!({"app": "x"})),
                5 => Just(json!({"serving.kserve.io/inferenceservice": "x"})),
                1 => Just(json!(["not a map"])),
            ]
            .boxed(),
        ),
        ("creationTimestamp", unread(json!("2026-12-01T00:00:00Z"))),
        (
            "ownerReferences",
            unread(
                json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "r", "uid": "u"}]),
            ),
        ),
    ])
}

fn pod_spec() -> BoxedStrategy<Value> {
    let init = prop_oneof![
        2 => Just(Value::Null),
        3 => proptest::collection::vec(prop_oneof![container(false), canonical_prep()], 0..3).prop_map(Value::Array),
    ];
    object_of(vec![
        ("securityContext", security_context(true)),
        (
            "os",
            prop_oneof![10 => Just(json!({"name": "linux"})), 5 => Just(json!({"name": "windows"})), 1 => Just(json!({"name": 1}))].boxed(),
        ),
        (
            "nodeSelector",
            prop_oneof![
                10 => Just(json!({"kubernetes.io/os": "windows"})),
                10 => Just(json!({"node-type": "gpu"})),
                1 => Just(json!({"node-type": null})),
            ]
            .boxed(),
        ),
        ("affinity", affinity()),
        ("volumes", proptest::collection::vec(volume(), 0..3).prop_map(Value::Array).boxed()),
        ("initContainers", init.boxed()),
        ("containers", proptest::collection::vec(container(false), 0..3).prop_map(Value::Array).boxed()),
        ("ephemeralContainers", proptest::collection::vec(container(false), 0..2).prop_map(Value::Array).boxed()),
        ("dnsPolicy", unread(json!("ClusterFirst"))),
        ("tolerations", unread(json!([{"key": "gpu", "operator": "Exists"}]))),
    ])
}

fn review_case() -> impl Strategy<Value = (Value, usize)> {
    (
        any::<bool>(),
        metadata(),
        metadata(),
        pod_spec(),
        unread(json!({"phase": "Pending"})),
        0usize..4,
        prop_oneof![8 => Just(None), 1 => Just(Some("ephemeralcontainers"))],
    )
        .prop_map(|(job, meta, template_meta, spec, status, cfg, sub)| {
            let object = if job {
                json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": meta,
                       "spec": {"backoffLimit": 2, "template": {"metadata": template_meta, "spec": spec}},
                       "status": status})
            } else {
                json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": status})
            };
            let mut review = create_review("generated", &object);
            if let Some(sub) = sub.filter(|_| !job) {
                review["request"]["operation"] = json!("UPDATE");
                review["request"]["subResource"] = json!(sub);
            }
            (review, cfg)
        })
}

#[test]
fn generated_pods_and_jobs_get_the_answers_of_the_typed_decode() {
    let index = caches();
    let configs = configs();
    let mut runner = proptest::test_runner::TestRunner::new(Config {
        cases: 2000,
        failure_persistence: None,
        rng_seed: RngSeed::Fixed(12),
        ..Config::default()
    });
    let readings = std::cell::RefCell::new(std::collections::BTreeMap::new());
    let policy_compared = std::cell::Cell::new(0);
    runner
        .run(&review_case(), |(review, cfg)| {
            let ctx = Context {
                config: &configs[cfg],
                caches: Caches::Ready(&index),
                namespaces: modelgate::namespaces::Namespaces::none(),
            };
            let reading = compare("generated", &review, &ctx)?;
            if compare_policy("generated", &review, &configs[cfg], &index)? {
                policy_compared.set(policy_compared.get() + 1);
            }
            *readings.borrow_mut().entry(reading).or_insert(0) += 1;
            Ok(())
        })
        .unwrap();
    // Both sides of the difference were exercised.
    let readings = readings.into_inner();
    let policy_compared = policy_compared.get();
    println!(
        "generated reviews, by the typed decode's reading: {readings:?}; \
         {policy_compared} through the policy on both readings"
    );
    assert!(policy_compared >= 1000, "{policy_compared}");
    for reading in [
        Reading::Read,
        Reading::RefusedReadField,
        Reading::RefusedUnreadField,
    ] {
        let n = readings.get(&reading).copied().unwrap_or(0);
        assert!(
            n >= 100,
            "only {n} generated reviews {reading:?}: {readings:?}"
        );
    }
}
