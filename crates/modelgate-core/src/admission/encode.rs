//! Encoding the answer: the one place a decision becomes bytes on the wire.
//!
//! The response is written straight from borrowed data. kube-core's `AdmissionResponse` is
//! not used here because it serialises the patch bytes as a number array, where the API server
//! expects base64 (the documented format).

use serde::Serialize;

use super::decode::Envelope;
use super::{Decision, Outcome, Summary};

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

/// Room for a typical answer (an LLM serving pod's patch is about 3 KiB of base64), so that the
/// body is allocated once.
const RESPONSE_CAPACITY: usize = 4096;

/// An AdmissionReview response for a decoded envelope.
pub(super) fn response(envelope: &Envelope, decision: &Decision, summary: Summary) -> Outcome {
    Outcome {
        http_status: 200,
        body: write_review(envelope, decision).unwrap_or_default(),
        summary,
    }
}

/// The AdmissionReview written once into the body: fixed keys as literals, strings escaped by
/// serde_json, the patch serialised into one buffer and base64-encoded straight into the body
/// (base64 needs no escaping, so it is not passed through a JSON string writer). Keys in the
/// order of `admission.k8s.io/v1`'s `AdmissionResponse`; empty `patch`, `warnings` and
/// `auditAnnotations` are left out.
fn write_review(envelope: &Envelope, decision: &Decision) -> serde_json::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(RESPONSE_CAPACITY);
    out.extend_from_slice(b"{\"apiVersion\":");
    serde_json::to_writer(&mut out, envelope.api_version.as_str())?;
    out.extend_from_slice(b",\"kind\":\"AdmissionReview\",\"response\":{\"uid\":");
    serde_json::to_writer(&mut out, &envelope.uid)?;
    out.extend_from_slice(if decision.allowed {
        b",\"allowed\":true"
    } else {
        b",\"allowed\":false"
    });
    if let Some(message) = decision.message.as_deref() {
        let code = decision.code.unwrap_or(403);
        out.extend_from_slice(b",\"status\":");
        serde_json::to_writer(
            &mut out,
            &StatusOut {
                api_version: None,
                kind: None,
                status: "Failure",
                code,
                reason: reason(code),
                message,
            },
        )?;
    }
    if let Some(patch) = decision.patch.as_ref().filter(|p| !p.is_empty()) {
        let json = patch.as_bytes();
        out.extend_from_slice(b",\"patchType\":\"JSONPatch\",\"patch\":\"");
        push_base64(&mut out, json).map_err(serde_json::Error::io)?;
        out.push(b'"');
    }
    if !decision.warnings.is_empty() {
        out.extend_from_slice(b",\"warnings\":[");
        for (i, warning) in decision.warnings.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            serde_json::to_writer(&mut out, warning)?;
        }
        out.push(b']');
    }
    if !decision.audit_annotations.is_empty() {
        out.extend_from_slice(b",\"auditAnnotations\":");
        serde_json::to_writer(&mut out, &decision.audit_annotations)?;
    }
    out.extend_from_slice(b"}}");
    Ok(out)
}

/// Appends `input` in standard base64 with padding. The encoder writes through its own block
/// into the body's spare room, so the body is not zeroed first as `encode_slice` needs it.
fn push_base64(out: &mut Vec<u8>, input: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    out.reserve(input.len().div_ceil(3) * 4);
    let mut encoder =
        base64::write::EncoderWriter::new(out, &base64::engine::general_purpose::STANDARD);
    encoder.write_all(input)?;
    encoder.finish()?;
    Ok(())
}

/// HTTP 400 with a Kubernetes `Status` body, for a body that is no AdmissionReview at all.
pub(super) fn bad_request(message: String, error: &'static str) -> Outcome {
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
    use base64::Engine;

    use super::*;

    #[test]
    fn base64_is_the_standard_alphabet_with_padding() {
        // Every length up to a few blocks, every byte value, and an arbitrary byte mix.
        let mut bytes: Vec<u8> = (0..=255u8).chain((0..=255u8).rev()).collect();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..600 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            bytes.push(x as u8);
        }
        for len in 0..bytes.len() {
            let mut out = b"prefix".to_vec();
            push_base64(&mut out, &bytes[..len]).unwrap();
            let expected = base64::engine::general_purpose::STANDARD.encode(&bytes[..len]);
            assert_eq!(&out[6..], expected.as_bytes(), "{len} bytes");
            assert_eq!(&out[..6], b"prefix");
        }
    }

    fn written(decision: &Decision) -> serde_json::Value {
        let envelope = Envelope {
            api_version: super::super::decode::ApiVersion::V1,
            uid: "a\"b\n".into(),
        };
        let body = write_review(&envelope, decision).unwrap();
        serde_json::from_slice(&body).expect("the body is one JSON document")
    }

    #[test]
    fn every_field_is_written_and_the_patch_is_base64_json() {
        let expected: json_patch::Patch = serde_json::from_value(serde_json::json!([
            {"op": "add", "path": "/metadata/labels/a~1b", "value": "é\"x"}
        ]))
        .unwrap();
        let mut builder = crate::patch::PatchBuilder::default();
        builder.add(
            &crate::patch::FieldPath::root()
                .keys(["metadata", "labels"])
                .key("a/b"),
            "é\"x",
        );
        let patch = builder.into_patch();
        let decision = Decision {
            allowed: true,
            patch: Some(patch.clone()),
            warnings: vec!["one".into(), "é\"\n".into()],
            audit_annotations: [("mode", "enforce".to_string())].into(),
            ..Default::default()
        };
        let value = written(&decision);
        let response = &value["response"];
        assert_eq!(value["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(value["kind"], "AdmissionReview");
        assert_eq!(response["uid"], "a\"b\n");
        assert_eq!(response["allowed"], true);
        assert_eq!(response["patchType"], "JSONPatch");
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(response["patch"].as_str().unwrap())
            .unwrap();
        let decoded: json_patch::Patch = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(decoded, expected);
        assert_eq!(response["warnings"][0], "one");
        assert_eq!(response["warnings"][1], "é\"\n");
        assert_eq!(response["auditAnnotations"]["mode"], "enforce");
        assert!(response.get("status").is_none());
    }

    #[test]
    fn a_denial_has_a_status_and_no_empty_fields() {
        let decision = Decision {
            allowed: false,
            message: Some("no".into()),
            patch: Some(crate::patch::PatchBuilder::default().into_patch()),
            ..Default::default()
        };
        let value = written(&decision);
        assert_eq!(
            value["response"],
            serde_json::json!({
                "uid": "a\"b\n",
                "allowed": false,
                "status": {"status": "Failure", "code": 403, "reason": "Forbidden", "message": "no"}
            })
        );
    }
}
