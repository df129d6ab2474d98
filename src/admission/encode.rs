//! Encoding the answer: the one place a decision becomes bytes on the wire.

use base64::Engine;
use kube::core::admission::AdmissionResponse;
use serde_json::{Value, json};

use super::decode::Envelope;
use super::{Decision, Outcome, Summary};

/// Kubernetes truncates longer warnings; keep them whole and readable instead.
pub const MAX_WARNING_LEN: usize = 120;

fn clip_warning(w: &str) -> String {
    if w.len() <= MAX_WARNING_LEN {
        return w.to_string();
    }
    let mut end = MAX_WARNING_LEN - '…'.len_utf8();
    while !w.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &w[..end])
}

/// An AdmissionReview response for a decoded envelope.
pub fn response(envelope: &Envelope, decision: &Decision, summary: Summary) -> Outcome {
    let mut r = AdmissionResponse::invalid("");
    r.uid = envelope.uid.clone();
    r.allowed = decision.allowed;
    r.result = Default::default();
    if let Some(message) = &decision.message {
        r.result.message = message.clone();
        r.result.code = decision.code.unwrap_or(403);
        r.result.status = Some(kube::core::response::StatusSummary::Failure);
    }
    if let Some(patch) = decision.patch.as_ref().filter(|p| !p.0.is_empty())
        && let Ok(with_patch) = r.clone().with_patch(patch.clone())
    {
        r = with_patch;
    }
    // kube-core serialises the patch bytes as a number array; the API server expects base64.
    let patch_b64 = r
        .patch
        .take()
        .map(|bytes| base64::engine::general_purpose::STANDARD.encode(bytes));
    if !decision.warnings.is_empty() {
        r.warnings = Some(decision.warnings.iter().map(|w| clip_warning(w)).collect());
    }
    let mut response = serde_json::to_value(&r).unwrap_or_else(|_| json!({}));
    if let (Some(p), Some(obj)) = (patch_b64, response.as_object_mut()) {
        obj.insert("patch".into(), Value::String(p));
    }
    if decision.message.is_none()
        && let Some(obj) = response.as_object_mut()
    {
        obj.remove("status");
    }
    let review = json!({
        "apiVersion": envelope.api_version.as_str(),
        "kind": "AdmissionReview",
        "response": response,
    });
    Outcome {
        http_status: 200,
        body: serde_json::to_vec(&review).unwrap_or_default(),
        summary,
    }
}

/// HTTP 400 with a Kubernetes `Status` body, for a body that is no AdmissionReview at all.
pub fn bad_request(message: String, reason: &'static str) -> Outcome {
    let body = json!({
        "apiVersion": "v1",
        "kind": "Status",
        "status": "Failure",
        "reason": "BadRequest",
        "code": 400,
        "message": message,
    });
    Outcome {
        http_status: 400,
        body: serde_json::to_vec(&body).unwrap_or_default(),
        summary: Summary {
            error: Some(reason),
            ..Default::default()
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warnings_are_clipped_on_a_char_boundary() {
        let long = "é".repeat(100);
        let clipped = clip_warning(&long);
        assert!(clipped.len() <= MAX_WARNING_LEN);
        assert!(clipped.ends_with('…'));
        assert_eq!(clip_warning("short"), "short");
    }
}
