//! The wire format: one AdmissionReview in, one AdmissionReview out (SPEC.md §1 and §7).
//!
//! [`review`] is the single entry point that `serve` and `review` share. It decodes the
//! envelope, decides by kind and operation which part of the policy applies, and encodes the
//! answer: uid echoed, `apiVersion` answered in kind, a base64 `patch` only when there are
//! operations.

mod decode;
mod encode;

pub use decode::{ApiVersion, DecodeError, Envelope, Request};
pub use encode::MAX_WARNING_LEN;

use serde_json::Value;

use crate::config::PolicyConfig;
use crate::patch::FieldPath;
use crate::policy::{self, Caches, Denial, Mutation, Workload};

/// Which webhook endpoint is answering.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Webhook {
    Mutate,
    Validate,
}

impl Webhook {
    pub fn as_str(self) -> &'static str {
        match self {
            Webhook::Mutate => "mutate",
            Webhook::Validate => "validate",
        }
    }
}

/// What the policy needs besides the request.
#[derive(Clone, Copy)]
pub struct Context<'a> {
    pub config: &'a PolicyConfig,
    pub caches: Caches<'a>,
}

/// The decision for one request, before encoding.
#[derive(Debug, Default)]
pub struct Decision {
    pub allowed: bool,
    /// The denial message, when not allowed.
    pub message: Option<String>,
    /// HTTP-like status code inside the response (`status.code`) for a denial.
    pub code: Option<u16>,
    pub patch: Option<json_patch::Patch>,
    pub warnings: Vec<String>,
}

impl Decision {
    fn allow() -> Self {
        Decision {
            allowed: true,
            ..Default::default()
        }
    }

    fn deny(denial: &Denial) -> Self {
        Decision {
            allowed: false,
            message: Some(denial.to_string()),
            code: Some(403),
            ..Default::default()
        }
    }

    fn invalid(message: String) -> Self {
        Decision {
            allowed: false,
            message: Some(message),
            code: Some(400),
            ..Default::default()
        }
    }

    pub fn patch_len(&self) -> usize {
        self.patch.as_ref().map_or(0, |p| p.0.len())
    }
}

/// What a log line and the metrics need to know about one admission.
#[derive(Clone, Debug, Default)]
pub struct Summary {
    pub uid: String,
    /// `Pod`, `Job`, another kind, or empty when the body could not be read.
    pub kind: String,
    pub namespace: String,
    /// The name, else the `generateName` prefix.
    pub name: String,
    pub operation: String,
    pub dry_run: bool,
    pub allowed: bool,
    pub patch_operations: usize,
    /// Why the request could not be handled as an admission (for error metrics).
    pub error: Option<&'static str>,
}

/// The encoded answer: the HTTP status and body, plus the summary for logs and metrics.
#[derive(Debug)]
pub struct Outcome {
    pub http_status: u16,
    pub body: Vec<u8>,
    pub summary: Summary,
}

/// Handles one AdmissionReview body end to end. Never panics on input.
pub fn review(webhook: Webhook, body: &[u8], ctx: &Context) -> Outcome {
    let mut value: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => {
            return encode::bad_request(format!("request body is not JSON: {e}"), "invalid_json");
        }
    };
    let request = match Request::from_review(&mut value) {
        Ok(r) => r,
        Err(DecodeError::Unanswerable(message)) => {
            return encode::bad_request(message, "invalid_review");
        }
        Err(DecodeError::Invalid { envelope, message }) => {
            let summary = Summary {
                uid: envelope.uid.clone(),
                error: Some("invalid_review"),
                ..Default::default()
            };
            return encode::response(&envelope, &Decision::invalid(message), summary);
        }
    };
    let decision = decide(webhook, &request, ctx);
    respond(&request, &decision)
}

/// Encodes the decision for a decoded request.
pub fn respond(request: &Request, decision: &Decision) -> Outcome {
    encode::response(&request.envelope, decision, request.summary(decision))
}

/// The decision for a decoded request: dispatch by kind and operation (SPEC.md §1).
pub fn decide(webhook: Webhook, req: &Request, ctx: &Context) -> Decision {
    let Some(kind) = req.workload_kind() else {
        let mut d = Decision::allow();
        if webhook == Webhook::Mutate {
            d.warnings.push(format!(
                "modelgate does not handle {}; allowed without changes",
                req.kind_display()
            ));
        }
        return d;
    };
    let ephemeral_update = kind == WorkloadKind::Pod
        && req.operation == "UPDATE"
        && req.sub_resource.as_deref() == Some("ephemeralcontainers");
    let create = req.operation == "CREATE" && req.sub_resource.is_none();
    if !(create || ephemeral_update) {
        return Decision::allow();
    }
    let Some(object) = req.object.as_ref() else {
        return Decision::invalid(format!(
            "request.object is missing on {} of a {}",
            req.operation,
            kind.as_str()
        ));
    };
    let decoded = match DecodedObject::decode(kind, object) {
        Ok(d) => d,
        Err(denial) => return Decision::deny(&denial),
    };
    let namespace = decoded
        .namespace()
        .unwrap_or(req.namespace.as_str())
        .to_string();
    if ctx.config.is_exempt(&namespace) {
        return Decision::allow();
    }
    let workload = match decoded.workload(&namespace, object) {
        Ok(w) => w,
        Err(denial) => return Decision::deny(&denial),
    };
    let result = match webhook {
        Webhook::Validate => policy::validate(&workload, ctx.config).map(|()| Mutation::default()),
        Webhook::Mutate if ephemeral_update => policy::mutate_ephemeral(&workload, ctx.config),
        Webhook::Mutate => policy::mutate_create(&workload, ctx.config, ctx.caches),
    };
    match result {
        Ok(m) => Decision {
            allowed: true,
            patch: (!m.patch.is_empty()).then(|| m.patch.into_patch()),
            warnings: m.warnings,
            ..Default::default()
        },
        Err(denial) => Decision::deny(&denial),
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkloadKind {
    Pod,
    Job,
}

impl WorkloadKind {
    pub fn as_str(self) -> &'static str {
        match self {
            WorkloadKind::Pod => "Pod",
            WorkloadKind::Job => "Job",
        }
    }
}

/// The object decoded as the kind the request names.
enum DecodedObject {
    Pod(Box<k8s_openapi::api::core::v1::Pod>),
    Job(Box<k8s_openapi::api::batch::v1::Job>),
}

const DECODE_ADVICE: &str = "Fix the object so that it matches the Kubernetes API schema.";

impl DecodedObject {
    fn decode(kind: WorkloadKind, object: &Value) -> Result<Self, Denial> {
        let fail = |field: String, problem: String| Denial::single(field, problem, DECODE_ADVICE);
        if !object.is_object() {
            return Err(fail(
                "request.object".into(),
                format!("cannot be decoded as a {}: not an object", kind.as_str()),
            ));
        }
        if let Some(found) = object.get("kind").and_then(Value::as_str)
            && found != kind.as_str()
        {
            return Err(fail(
                "request.object.kind".into(),
                format!(
                    "the object is a {found}, but the request is for a {}",
                    kind.as_str()
                ),
            ));
        }
        fn typed<T: serde::de::DeserializeOwned>(object: &Value, kind: &str) -> Result<T, Denial> {
            if let Ok(t) = T::deserialize(object) {
                return Ok(t);
            }
            // Decode again with path tracking (slower), only to name the offending field.
            serde_path_to_error::deserialize(object).map_err(|e| {
                let path = e.path().to_string();
                let field = if path == "." {
                    "request.object".to_string()
                } else {
                    path
                };
                Denial::single(
                    field,
                    format!("cannot be decoded as a {kind}: {}", e.inner()),
                    DECODE_ADVICE,
                )
            })
        }
        Ok(match kind {
            WorkloadKind::Pod => DecodedObject::Pod(typed(object, "Pod")?),
            WorkloadKind::Job => DecodedObject::Job(typed(object, "Job")?),
        })
    }

    fn namespace(&self) -> Option<&str> {
        let meta = match self {
            DecodedObject::Pod(p) => &p.metadata,
            DecodedObject::Job(j) => &j.metadata,
        };
        meta.namespace.as_deref().filter(|n| !n.is_empty())
    }

    fn workload<'a>(&'a self, namespace: &'a str, raw: &'a Value) -> Result<Workload<'a>, Denial> {
        let missing = |field: &str| Denial::single(field, "is missing", DECODE_ADVICE);
        match self {
            DecodedObject::Pod(p) => {
                let spec = p.spec.as_ref().ok_or_else(|| missing("spec"))?;
                Ok(Workload {
                    kind: "Pod",
                    namespace,
                    annotations: p.metadata.annotations.as_ref(),
                    has_metadata: raw.get("metadata").is_some_and(Value::is_object),
                    spec,
                    raw_spec: &raw["spec"],
                    meta_path: FieldPath::root().key("metadata"),
                    spec_path: FieldPath::root().key("spec"),
                })
            }
            DecodedObject::Job(j) => {
                let spec = j.spec.as_ref().ok_or_else(|| missing("spec"))?;
                let template = &spec.template;
                let pod_spec = template
                    .spec
                    .as_ref()
                    .ok_or_else(|| missing("spec.template.spec"))?;
                let raw_template = &raw["spec"]["template"];
                Ok(Workload {
                    kind: "Job",
                    namespace,
                    annotations: template
                        .metadata
                        .as_ref()
                        .and_then(|m| m.annotations.as_ref()),
                    has_metadata: raw_template.get("metadata").is_some_and(Value::is_object),
                    spec: pod_spec,
                    raw_spec: &raw_template["spec"],
                    meta_path: FieldPath::root().keys(["spec", "template", "metadata"]),
                    spec_path: FieldPath::root().keys(["spec", "template", "spec"]),
                })
            }
        }
    }
}

#[cfg(test)]
mod tests;
