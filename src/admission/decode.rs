//! Decoding the AdmissionReview envelope (`admission.k8s.io/v1`, and `v1beta1` in kind).

use kube::core::GroupVersionKind;
use kube::core::admission::Operation;
use serde::Deserialize;
use serde_json::Value;

use super::{Decision, Summary, WorkloadKind};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApiVersion {
    V1,
    V1Beta1,
}

impl ApiVersion {
    pub fn as_str(self) -> &'static str {
        match self {
            ApiVersion::V1 => "admission.k8s.io/v1",
            ApiVersion::V1Beta1 => "admission.k8s.io/v1beta1",
        }
    }
}

/// What the response must echo.
#[derive(Clone, Debug)]
pub struct Envelope {
    pub api_version: ApiVersion,
    pub uid: String,
}

/// A decoded admission request. The object stays raw JSON: it is decoded as its kind later,
/// and patches are computed against it as received.
#[derive(Debug)]
pub struct Request {
    pub envelope: Envelope,
    pub group: String,
    pub version: String,
    pub kind: String,
    pub sub_resource: Option<String>,
    pub namespace: String,
    pub name: String,
    pub operation: &'static str,
    pub dry_run: bool,
    pub object: Option<Value>,
}

/// The part of `request` that modelgate reads (kube-core's `AdmissionRequest` also requires and
/// decodes `userInfo`, `resource` and the options, which no rule here needs).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RequestHead {
    kind: GroupVersionKind,
    #[serde(default)]
    sub_resource: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    name: String,
    operation: Operation,
    #[serde(default)]
    dry_run: bool,
}

#[derive(Debug)]
pub enum DecodeError {
    /// Not an AdmissionReview whose uid can be read: answered with HTTP 400.
    Unanswerable(String),
    /// The uid is known, the rest is malformed: answered as a refused review.
    Invalid { envelope: Envelope, message: String },
}

impl Request {
    /// Decodes an AdmissionReview, taking the object out of `value` rather than copying it.
    pub fn from_review(value: &mut Value) -> Result<Request, DecodeError> {
        let unanswerable = |m: &str| DecodeError::Unanswerable(m.to_string());
        let Value::Object(review) = value else {
            return Err(unanswerable("body is not a JSON object"));
        };
        let api_version = match review.get("apiVersion").and_then(Value::as_str) {
            Some("admission.k8s.io/v1") => ApiVersion::V1,
            Some("admission.k8s.io/v1beta1") => ApiVersion::V1Beta1,
            Some(other) => {
                return Err(DecodeError::Unanswerable(format!(
                    "apiVersion `{other}` is not admission.k8s.io/v1 or v1beta1"
                )));
            }
            None => return Err(unanswerable("apiVersion is missing")),
        };
        match review.get("kind").and_then(Value::as_str) {
            Some("AdmissionReview") => {}
            Some(other) => {
                return Err(DecodeError::Unanswerable(format!(
                    "kind `{other}` is not AdmissionReview"
                )));
            }
            None => return Err(unanswerable("kind is missing")),
        }
        let Some(Value::Object(request)) = review.get_mut("request") else {
            return Err(unanswerable("request is missing or not an object"));
        };
        let uid = match request.get("uid").and_then(Value::as_str) {
            Some(uid) if !uid.is_empty() => uid.to_string(),
            _ => return Err(unanswerable("request.uid is missing or not a string")),
        };
        let envelope = Envelope { api_version, uid };
        let object = request.remove("object").filter(|o| !o.is_null());
        request.remove("oldObject");
        // Only the fields modelgate reads; the object was taken out above and is decoded later.
        let head = Value::Object(std::mem::take(request));
        let typed = match RequestHead::deserialize(&head) {
            Ok(r) => r,
            Err(_) => {
                // Decode again with path tracking, only to name the offending field.
                let message = match serde_path_to_error::deserialize::<_, RequestHead>(&head) {
                    Err(e) => format!("request.{}: {}", e.path(), e.inner()),
                    Ok(_) => "request: cannot be decoded".to_string(),
                };
                return Err(DecodeError::Invalid { envelope, message });
            }
        };
        let operation = match typed.operation {
            Operation::Create => "CREATE",
            Operation::Update => "UPDATE",
            Operation::Delete => "DELETE",
            Operation::Connect => "CONNECT",
        };
        Ok(Request {
            envelope,
            group: typed.kind.group,
            version: typed.kind.version,
            kind: typed.kind.kind,
            sub_resource: typed.sub_resource.filter(|s| !s.is_empty()),
            namespace: typed.namespace.unwrap_or_default(),
            name: typed.name,
            operation,
            dry_run: typed.dry_run,
            object,
        })
    }

    /// Pod (core/v1) or Job (batch/v1); anything else is not handled.
    pub fn workload_kind(&self) -> Option<WorkloadKind> {
        match (
            self.group.as_str(),
            self.version.as_str(),
            self.kind.as_str(),
        ) {
            ("", "v1", "Pod") => Some(WorkloadKind::Pod),
            ("batch", "v1", "Job") => Some(WorkloadKind::Job),
            _ => None,
        }
    }

    pub fn kind_display(&self) -> String {
        if self.group.is_empty() {
            format!("{}/{}", self.version, self.kind)
        } else {
            format!("{}/{}/{}", self.group, self.version, self.kind)
        }
    }

    pub fn summary(&self, decision: &Decision) -> Summary {
        let meta = self.object.as_ref().and_then(|o| o.get("metadata"));
        let field = |k: &str| {
            meta.and_then(|m| m.get(k))
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
        };
        let name = if self.name.is_empty() {
            field("name")
                .or(field("generateName"))
                .unwrap_or("")
                .to_string()
        } else {
            self.name.clone()
        };
        Summary {
            uid: self.envelope.uid.clone(),
            kind: self.kind.clone(),
            namespace: field("namespace").unwrap_or(&self.namespace).to_string(),
            name,
            operation: self.operation.to_string(),
            dry_run: self.dry_run,
            allowed: decision.allowed,
            patch_operations: decision.patch_len(),
            error: None,
        }
    }
}
