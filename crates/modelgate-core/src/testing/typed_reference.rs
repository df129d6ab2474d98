//! The decode the request path used before the views (`policy::view`), kept only as the
//! reference of the differential test (`tests/decode_differential.rs`): the object decoded as
//! typed k8s-openapi `ObjectMeta`/`PodSpec`/`JobSpec`, errors named through
//! `serde_path_to_error`, the init containers taken from the text as received.
//!
//! - [`reference`] is that decode's reading of a review's object, written back as JSON (or the
//!   field it refused and the message);
//! - [`policy_on_both_readings`] runs the policy on the views the decoder reads and on views made
//!   directly from the typed reading (no shared decoder), for comparison;
//! - [`is_read_field`] says whether a refused field is one the views decode.

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::{JobSpec, JobStatus};
use k8s_openapi::api::core::v1::{PodSpec, PodStatus, SecurityContext, VolumeMount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;

use crate::cache::CacheIndex;
use crate::config::PolicyConfig;
use crate::patch::FieldPath;
use crate::policy::view::{
    self, AffinityView, ClaimSpecView, ClaimTemplateView, ContainerView, EphemeralSourceView,
    HostPathSourceView, IgnoredAnyPresent, InitContainerView, NodeAffinityView,
    NodeSelectorRequirementView, NodeSelectorTermView, NodeSelectorView, ObjectMetaView, PodOsView,
    PodSecurityContextView, PodSpecOf, PodSpecView, PvcSourceView, SecurityContextView, Str,
    StrMap, VolumeMountView, VolumeView,
};
use crate::policy::{self, Caches, Workload};

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
pub enum Typed {
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
pub fn reference(review: &Value) -> Typed {
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
pub fn is_read_field(path: &str) -> bool {
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
        // Read for exceptions' `images` (docs/exceptions.md).
        "[].image",
        "[].securityContext",
        "[].securityContext.runAsUser",
        "[].securityContext.runAsGroup",
        "[].securityContext.runAsNonRoot",
        "[].securityContext.privileged",
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
        ".volumes[].hostPath".into(),
        ".volumes[].hostPath.path".into(),
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
    image: Option<&'a str>,
    sc: &Option<SecurityContext>,
    mounts: &'a Option<Vec<VolumeMount>>,
) -> ContainerView<'a> {
    ContainerView {
        name: Some(s(name)),
        image: image.map(s),
        security_context: sc.as_ref().map(|sc| SecurityContextView {
            run_as_user: sc.run_as_user,
            run_as_group: sc.run_as_group,
            run_as_non_root: sc.run_as_non_root,
            privileged: sc.privileged,
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
            host_path: v.host_path.as_ref().map(|h| HostPathSourceView {
                path: Some(s(&h.path)),
            }),
            ephemeral: v.ephemeral.as_ref().map(|e| EphemeralSourceView {
                volume_claim_template: e.volume_claim_template.as_ref().map(|t| {
                    ClaimTemplateView {
                        spec: Some(ClaimSpecView {
                            volume_name: t.spec.volume_name.as_deref().map(s),
                            selector: t.spec.selector.as_ref().map(|_| IgnoredAnyPresent),
                            storage_class_name: t.spec.storage_class_name.as_deref().map(s),
                        }),
                    }
                }),
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
                    container: container_view(
                        &c.name,
                        c.image.as_deref(),
                        &c.security_context,
                        &c.volume_mounts,
                    ),
                    raw,
                })
                .collect()
        }),
        containers: Some(
            spec.containers
                .iter()
                .map(|c| {
                    container_view(
                        &c.name,
                        c.image.as_deref(),
                        &c.security_context,
                        &c.volume_mounts,
                    )
                })
                .collect(),
        ),
        ephemeral_containers: spec.ephemeral_containers.as_ref().map(|cs| {
            cs.iter()
                .map(|c| {
                    container_view(
                        &c.name,
                        c.image.as_deref(),
                        &c.security_context,
                        &c.volume_mounts,
                    )
                })
                .collect()
        }),
    }
}

/// What the policy made of one workload: the mutation (patch text, changes, notes) or the
/// denial, and the validation.
fn policy_outcome(w: &Workload, cfg: &PolicyConfig, index: &CacheIndex, ephemeral: bool) -> String {
    let mutation = if ephemeral {
        policy::mutate_ephemeral(w, cfg, policy::EphemeralScope::WholePod)
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
    format!(
        "{mutation:?}\n{:?}",
        policy::validate(
            w,
            cfg,
            ephemeral.then_some(policy::EphemeralScope::WholePod)
        )
    )
}

/// The policy on the views the decoder reads from the review's object, and on views made directly
/// from the typed decode of the same object: `(views, typed)`, each the mutation (patch text,
/// changes, notes) or denial and the validation, when both decodes read a Pod or Job.
pub fn policy_on_both_readings(
    review: &Value,
    cfg: &PolicyConfig,
    index: &CacheIndex,
) -> Option<(String, String)> {
    let request = &review["request"];
    let object = &request["object"];
    let job = match (
        request["kind"]["group"].as_str(),
        request["kind"]["kind"].as_str(),
    ) {
        (Some(""), Some("Pod")) => false,
        (Some("batch"), Some("Job")) => true,
        _ => return None,
    };
    if !object.is_object() {
        return None;
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
            namespace: "team-a",
            restricted_namespace: false,
            claims: None,
            prep_withheld: Default::default(),
            exceptions: Default::default(),
            waivers: Default::default(),
            annotations: meta.and_then(|m| m.annotations.as_ref()),
            object_annotations: None,
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
    Some((ours?, theirs?))
}
