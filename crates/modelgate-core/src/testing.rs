//! The one test harness of the pipeline (cargo feature `testing`, which the `modelgate`
//! package's tests enable): an AdmissionReview in, the answer read back the way the API server
//! reads it, with the wire contract of docs/policy.md §7 checked on every call.
//!
//! [`review`] calls [`admission::review`] in process; [`read_answer`] reads a response that
//! came over HTTP the same way. Each test file keeps only what it adds (its own fixtures and
//! expectations).

use base64::Engine;
use serde_json::{Value, json};

use crate::admission::{self, Context, Summary, Webhook};
use crate::cache::CacheIndex;
use crate::config::PolicyConfig;
use crate::namespaces::Namespaces;
use crate::policy::{Caches, MAX_WARNING_LEN};

/// A CREATE AdmissionReview for `object`, as the API server sends it: the request's kind and
/// resource from the object's `apiVersion`/`kind`, its namespace from the object, else
/// `default_namespace`.
pub fn create_review(uid: &str, object: &Value, default_namespace: &str) -> Value {
    let api_version = object["apiVersion"].as_str().unwrap_or("v1");
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let kind = object["kind"].as_str().unwrap_or("");
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": group, "version": version, "kind": kind},
            "resource": {"group": group, "version": version, "resource": format!("{}s", kind.to_lowercase())},
            "namespace": object["metadata"]["namespace"].as_str().unwrap_or(default_namespace),
            "name": object["metadata"]["name"].as_str().unwrap_or(""),
            "operation": "CREATE",
            "userInfo": {"username": "corpus"},
            "object": object,
            "dryRun": false,
        }
    })
}

/// One answer, decoded.
#[derive(Clone, Debug)]
pub struct Answer {
    /// The HTTP status (200, or 400 for a body that is not an AdmissionReview).
    pub http: u16,
    /// The whole response body.
    pub body: Value,
    /// `response.allowed` (false when the HTTP status is not 200).
    pub allowed: bool,
    /// The decoded JSON patch, when the response carries one (never empty).
    pub ops: Option<Vec<Value>>,
    pub warnings: Vec<String>,
    /// `response.status.message`, or the error body's `message` when the status is not 200.
    pub message: String,
    /// The pipeline's summary (for logs and metrics); `None` for an answer read off the wire.
    pub summary: Option<Summary>,
}

impl Answer {
    /// `body.response` (`null` when the status is not 200).
    pub fn response(&self) -> &Value {
        &self.body["response"]
    }

    /// The patch operations, empty when there is no patch.
    pub fn patch(&self) -> &[Value] {
        self.ops.as_deref().unwrap_or_default()
    }

    /// `object` with the answer's patch applied (the object itself without a patch). Panics,
    /// naming the patch and the object, when the patch does not apply.
    pub fn patched(&self, object: &Value) -> Value {
        apply(object, self.patch()).unwrap_or_else(|e| {
            panic!(
                "the patch does not apply: {e}\npatch: {}\nobject: {object}",
                Value::Array(self.patch().to_vec())
            )
        })
    }
}

/// Applies JSON patch operations to a copy of `object`.
pub fn apply(object: &Value, ops: &[Value]) -> Result<Value, String> {
    let patch: json_patch::Patch =
        serde_json::from_value(Value::Array(ops.to_vec())).map_err(|e| e.to_string())?;
    let mut out = object.clone();
    json_patch::patch(&mut out, &patch).map_err(|e| e.to_string())?;
    Ok(out)
}

/// The context of most tests: every cache in `index` synced, no namespace labelled.
pub fn context<'a>(config: &'a PolicyConfig, index: &'a CacheIndex) -> Context<'a> {
    Context {
        config,
        caches: Caches::Ready(index),
        namespaces: Namespaces::none(),
        now: None,
    }
}

/// Sends `review` (serialised as the API server would) to one webhook and reads the answer.
pub fn review(webhook: Webhook, review: &Value, ctx: &Context) -> Answer {
    let bytes = serde_json::to_vec(review).expect("a JSON value serialises");
    let out = admission::review(webhook, &bytes, ctx);
    let mut answer = read_answer(webhook, review, out.http_status, &out.body);
    answer.summary = Some(out.summary);
    answer
}

/// Reads a webhook's answer to `review` and checks the wire contract (docs/policy.md §7): a JSON body;
/// with status 200 an AdmissionReview answered in kind that echoes the uid, a boolean
/// `allowed`, a base64 JSON patch only with operations and only from `/mutate`, `patchType`
/// only with a patch, warnings the API server passes on whole, and a reason for every denial.
pub fn read_answer(webhook: Webhook, review: &Value, http_status: u16, body: &[u8]) -> Answer {
    let body: Value = serde_json::from_slice(body).unwrap_or_else(|e| {
        panic!(
            "the response body is not JSON ({e}): {}",
            String::from_utf8_lossy(body)
        )
    });
    if http_status != 200 {
        return Answer {
            http: http_status,
            allowed: false,
            ops: None,
            warnings: Vec::new(),
            message: body["message"].as_str().unwrap_or("").to_string(),
            body,
            summary: None,
        };
    }
    assert_eq!(body["apiVersion"], review["apiVersion"], "answered in kind");
    assert_eq!(body["kind"], "AdmissionReview");
    let response = &body["response"];
    assert_eq!(response["uid"], review["request"]["uid"], "uid echoed");
    let allowed = response["allowed"]
        .as_bool()
        .unwrap_or_else(|| panic!("response.allowed is a bool: {body}"));
    let ops = response.get("patch").map(|p| {
        assert_eq!(webhook, Webhook::Mutate, "/validate never patches: {body}");
        assert_eq!(response["patchType"], "JSONPatch");
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(p.as_str().expect("the patch is a base64 string"))
            .expect("the patch is valid base64");
        let ops: Vec<Value> = serde_json::from_slice(&bytes).expect("the patch is a JSON array");
        assert!(!ops.is_empty(), "a patch is only sent with operations");
        ops
    });
    if ops.is_none() {
        assert!(
            response.get("patchType").is_none(),
            "patchType only with a patch: {body}"
        );
    }
    let warnings: Vec<String> = response["warnings"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|w| w.as_str().expect("a warning is a string").to_string())
                .collect()
        })
        .unwrap_or_default();
    for w in &warnings {
        assert!(
            w.len() <= MAX_WARNING_LEN,
            "warning longer than the API server passes whole: {w}"
        );
    }
    let message = response["status"]["message"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(allowed || !message.is_empty(), "a denial says why: {body}");
    Answer {
        http: 200,
        allowed,
        ops,
        warnings,
        message,
        body,
        summary: None,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn request() -> Value {
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
               "request": {"uid": "u-1"}})
    }

    fn answer(response: Value) -> Vec<u8> {
        serde_json::to_vec(&json!({"apiVersion": "admission.k8s.io/v1",
                                   "kind": "AdmissionReview", "response": response}))
        .unwrap()
    }

    #[test]
    fn reads_a_patch_and_applies_it() {
        let patch = base64::engine::general_purpose::STANDARD
            .encode(br#"[{"op":"add","path":"/a","value":1}]"#);
        let body = answer(json!({"uid": "u-1", "allowed": true,
                                 "patchType": "JSONPatch", "patch": patch}));
        let a = read_answer(Webhook::Mutate, &request(), 200, &body);
        assert!(a.allowed);
        assert_eq!(a.patched(&json!({})), json!({"a": 1}));
    }

    #[test]
    #[should_panic(expected = "/validate never patches")]
    fn a_patch_from_validate_fails_the_test() {
        let patch = base64::engine::general_purpose::STANDARD.encode(b"[]");
        let body = answer(json!({"uid": "u-1", "allowed": true,
                                 "patchType": "JSONPatch", "patch": patch}));
        read_answer(Webhook::Validate, &request(), 200, &body);
    }

    #[test]
    #[should_panic(expected = "uid echoed")]
    fn another_uid_fails_the_test() {
        read_answer(
            Webhook::Mutate,
            &request(),
            200,
            &answer(json!({"uid": "u-2", "allowed": true})),
        );
    }

    #[test]
    #[should_panic(expected = "a denial says why")]
    fn a_denial_without_a_reason_fails_the_test() {
        read_answer(
            Webhook::Validate,
            &request(),
            200,
            &answer(json!({"uid": "u-1", "allowed": false})),
        );
    }
}

pub mod typed_reference;
