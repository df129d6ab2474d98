//! Encoding the answer: the one place a decision becomes bytes on the wire.
//!
//! The response is serialised straight from borrowed data. kube-core's `AdmissionResponse` is
//! not used here because it serialises the patch bytes as a number array, where the API server
//! expects base64 (the documented format).

use std::collections::BTreeMap;

use base64::Engine;
use serde::Serialize;

use super::decode::Envelope;
use super::{Decision, Outcome, Summary};
use crate::policy::MAX_WARNING_LEN;

/// The last resort for a warning the policy could not fit (the policy shortens URIs itself so
/// that names survive): cut at the API server's limit, on a character boundary, marked `…`.
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

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ReviewOut<'a> {
    api_version: &'static str,
    kind: &'static str,
    response: ResponseOut<'a>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ResponseOut<'a> {
    uid: &'a str,
    allowed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<StatusOut<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    patch_type: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    patch: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    warnings: Vec<String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    audit_annotations: &'a BTreeMap<&'static str, String>,
}

/// A `metav1.Status`, as the API server shows it to the user on a denial.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct StatusOut<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    api_version: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    kind: Option<&'static str>,
    status: &'static str,
    code: u16,
    reason: &'static str,
    message: &'a str,
}

fn reason(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        _ => "Forbidden",
    }
}

/// An AdmissionReview response for a decoded envelope.
pub fn response(envelope: &Envelope, decision: &Decision, summary: Summary) -> Outcome {
    let status = decision.message.as_deref().map(|message| {
        let code = decision.code.unwrap_or(403);
        StatusOut {
            api_version: None,
            kind: None,
            status: "Failure",
            code,
            reason: reason(code),
            message,
        }
    });
    let patch = decision
        .patch
        .as_ref()
        .filter(|p| !p.0.is_empty())
        .and_then(|p| serde_json::to_vec(p).ok())
        .map(|bytes| base64::engine::general_purpose::STANDARD.encode(bytes));
    let review = ReviewOut {
        api_version: envelope.api_version.as_str(),
        kind: "AdmissionReview",
        response: ResponseOut {
            uid: &envelope.uid,
            allowed: decision.allowed,
            status,
            patch_type: patch.as_ref().map(|_| "JSONPatch"),
            patch,
            warnings: decision.warnings.iter().map(|w| clip_warning(w)).collect(),
            audit_annotations: &decision.audit_annotations,
        },
    };
    Outcome {
        http_status: 200,
        body: serde_json::to_vec(&review).unwrap_or_default(),
        summary,
    }
}

/// HTTP 400 with a Kubernetes `Status` body, for a body that is no AdmissionReview at all.
pub fn bad_request(message: String, error: &'static str) -> Outcome {
    let body = StatusOut {
        api_version: Some("v1"),
        kind: Some("Status"),
        status: "Failure",
        code: 400,
        reason: "BadRequest",
        message: &message,
    };
    Outcome {
        http_status: 400,
        body: serde_json::to_vec(&body).unwrap_or_default(),
        summary: Summary {
            error: Some(error),
            ..Default::default()
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warnings_are_clipped_on_a_char_boundary() {
        let long = "é".repeat(200);
        let clipped = clip_warning(&long);
        assert!(clipped.len() <= MAX_WARNING_LEN);
        assert!(clipped.ends_with('…'));
        assert_eq!(clip_warning("short"), "short");
    }
}
