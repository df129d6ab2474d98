//! Decoding the AdmissionReview envelope (`admission.k8s.io/v1`, and `v1beta1` in kind).
//!
//! The body is parsed once. The object is kept as raw JSON text and decoded later, directly as
//! its kind; nothing is parsed into an intermediate tree.

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

use kube::core::GroupVersionKind;
use kube::core::admission::Operation;
use serde::Deserialize;
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

use super::{Decision, DecodedObject, Summary};
use crate::kinds::WorkloadKind;
use crate::policy::view::{self, JobView, PodView};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApiVersion {
    V1,
    V1Beta1,
}

impl ApiVersion {
    fn parse(s: &str) -> Option<ApiVersion> {
        match s {
            "admission.k8s.io/v1" => Some(ApiVersion::V1),
            "admission.k8s.io/v1beta1" => Some(ApiVersion::V1Beta1),
            _ => None,
        }
    }

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

/// A decoded admission request. The object stays raw JSON until it is decoded as its kind;
/// patches are computed against it as received.
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
    pub object: Option<Box<RawValue>>,
    /// `oldObject` of an UPDATE of any kind but a Job (a kind of the workload-kind table, whose
    /// unchanged templates are allowed untouched; a Pod, whose prep container is compared; a
    /// Pod's `ephemeralcontainers`, whose stored ephemeral containers are not judged again);
    /// `None` for a Job and for a Pod's other subresources. Kept as text: its views are built
    /// only where a rule reads it, within the bound of one object, as the object's are.
    pub old_object: Option<Box<RawValue>>,
}

#[derive(Debug)]
pub enum DecodeError {
    /// Not an AdmissionReview whose uid can be read: answered with HTTP 400.
    Unanswerable(String),
    /// The uid is known, the rest is malformed: answered as a refused review.
    Invalid { envelope: Envelope, message: String },
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ReviewIn<'a> {
    #[serde(borrow)]
    api_version: Option<Cow<'a, str>>,
    #[serde(borrow)]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow)]
    request: Option<&'a RawValue>,
}

/// The part of `request` that modelgate reads (kube-core's `AdmissionRequest` also requires and
/// decodes `userInfo`, `resource`, the options and a typed object, which no rule here needs),
/// typed as [`FastRequest`] reads it: used to name what that decode refused.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RequestHead<'a> {
    uid: String,
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
    #[serde(borrow, default)]
    object: Option<&'a RawValue>,
    #[serde(borrow, default)]
    old_object: Option<&'a RawValue>,
}

/// The object of a request as the decode leaves it.
pub(super) enum ObjectInput<'a> {
    /// No `object`, or `null`.
    Missing,
    /// Decoded into views while the envelope was read (a Pod or Job whose kind came before the
    /// object, as the API server writes it).
    Decoded(Box<DecodedObject<'a>>),
    /// Kept as text (borrowed from the body), to be decoded once the kind is known.
    Raw(&'a RawValue),
}

/// The request as the one-pass decode reads it: the head, and the object. With `VIEWS`, the
/// object of a Pod or Job whose kind comes first is decoded into views in the same pass; any
/// other object (and every object without `VIEWS`) is kept as text.
struct FastRequest<'a, const VIEWS: bool> {
    uid: Option<String>,
    kind: Option<GroupVersionKind>,
    sub_resource: Option<String>,
    namespace: Option<String>,
    name: Option<String>,
    operation: Option<Operation>,
    dry_run: Option<bool>,
    object: Option<ObjectInput<'a>>,
    old_object: Option<&'a RawValue>,
}

/// The object, decoded as the views of `kind` when one is known to need them, else kept raw.
struct ObjectSeed(Option<WorkloadKind>);

impl<'de> DeserializeSeed<'de> for ObjectSeed {
    type Value = ObjectInput<'de>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<ObjectInput<'de>, D::Error> {
        let object = match self.0 {
            Some(WorkloadKind::Pod) => Option::<PodView>::deserialize(d)?.map(DecodedObject::Pod),
            Some(WorkloadKind::Job) => Option::<JobView>::deserialize(d)?.map(DecodedObject::Job),
            // Controllers are judged only on CREATE or a changed template: decoded then.
            _ => {
                let raw = <&RawValue>::deserialize(d)?;
                return Ok(if raw.get() == "null" {
                    ObjectInput::Missing
                } else {
                    ObjectInput::Raw(raw)
                });
            }
        };
        Ok(object.map_or(ObjectInput::Missing, |o| ObjectInput::Decoded(Box::new(o))))
    }
}

impl<'de: 'a, 'a, const VIEWS: bool> Deserialize<'de> for FastRequest<'a, VIEWS> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a, const VIEWS: bool>(PhantomData<&'a ()>);
        impl<'de: 'a, 'a, const VIEWS: bool> Visitor<'de> for V<'a, VIEWS> {
            type Value = FastRequest<'a, VIEWS>;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an AdmissionRequest")
            }

            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<FastRequest<'a, VIEWS>, A::Error> {
                let mut r = FastRequest {
                    uid: None,
                    kind: None,
                    sub_resource: None,
                    namespace: None,
                    name: None,
                    operation: None,
                    dry_run: None,
                    object: None,
                    old_object: None,
                };
                fn once<T, E: de::Error>(
                    slot: &mut Option<T>,
                    value: T,
                    key: &'static str,
                ) -> Result<(), E> {
                    // A duplicate is refused, as the derived decode that names it refuses it.
                    if slot.replace(value).is_some() {
                        return Err(E::duplicate_field(key));
                    }
                    Ok(())
                }
                while let Some(key) = map.next_key::<Cow<'de, str>>()? {
                    match &*key {
                        "uid" => once(&mut r.uid, map.next_value()?, "uid")?,
                        "kind" => once(&mut r.kind, map.next_value()?, "kind")?,
                        "subResource" => once(
                            &mut r.sub_resource,
                            map.next_value::<Option<String>>()?.unwrap_or_default(),
                            "subResource",
                        )?,
                        "namespace" => once(
                            &mut r.namespace,
                            map.next_value::<Option<String>>()?.unwrap_or_default(),
                            "namespace",
                        )?,
                        "name" => once(&mut r.name, map.next_value()?, "name")?,
                        "operation" => once(&mut r.operation, map.next_value()?, "operation")?,
                        "dryRun" => once(&mut r.dry_run, map.next_value()?, "dryRun")?,
                        "object" => {
                            // Whatever the operation: an object that does not decode as its
                            // kind sends the body to the decode that keeps it as text.
                            let decode = r
                                .kind
                                .as_ref()
                                .filter(|_| VIEWS)
                                .and_then(|k| workload_kind(&k.group, &k.version, &k.kind));
                            let object = map.next_value_seed(ObjectSeed(decode))?;
                            once(&mut r.object, object, "object")?;
                        }
                        // Borrowed, not allocated: copied only for a controller's UPDATE.
                        "oldObject" => once(&mut r.old_object, map.next_value()?, "oldObject")?,
                        _ => {
                            map.next_value::<de::IgnoredAny>()?;
                        }
                    }
                }
                Ok(r)
            }
        }
        d.deserialize_map(V(PhantomData))
    }
}

#[derive(Deserialize)]
struct FastReview<'a, const VIEWS: bool> {
    #[serde(borrow, rename = "apiVersion")]
    api_version: Cow<'a, str>,
    #[serde(borrow)]
    kind: Cow<'a, str>,
    #[serde(borrow)]
    request: FastRequest<'a, VIEWS>,
}

#[cfg(test)]
thread_local! {
    /// How many bodies [`raw_object`] parsed on this thread: the tests check that only a
    /// controller's UPDATE pays for a second parse of the body.
    pub(super) static RAW_OBJECT_PARSES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// The object's text in an AdmissionReview body, found again (borrowed) after a one-pass decode.
pub(super) fn raw_object(body: &[u8]) -> Option<&RawValue> {
    #[cfg(test)]
    RAW_OBJECT_PARSES.with(|n| n.set(n.get() + 1));
    #[derive(Deserialize)]
    struct ObjectOnly<'a> {
        #[serde(borrow)]
        object: Option<&'a RawValue>,
    }
    let review: ReviewIn = serde_json::from_slice(body).ok()?;
    let request = review.request?;
    serde_json::from_str::<ObjectOnly>(request.get())
        .ok()?
        .object
        .filter(|o| o.get() != "null")
}

#[derive(Deserialize)]
struct UidOnly {
    uid: Option<String>,
}

/// The kinds of docs/policy.md §1; anything else is not handled.
fn workload_kind(group: &str, version: &str, kind: &str) -> Option<WorkloadKind> {
    WorkloadKind::of(group, version, kind)
}

/// The body as JSON text. JSON text is UTF-8, and serde_json checks it only in the strings it
/// decodes: checked here once for the whole body, so that skipped strings are checked too.
fn utf8(body: &[u8]) -> Result<&str, DecodeError> {
    std::str::from_utf8(body).map_err(|e| {
        let at = e.valid_up_to();
        let line_start = body[..at]
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |i| i + 1);
        let line = body[..at].iter().filter(|&&b| b == b'\n').count() + 1;
        DecodeError::Unanswerable(format!(
            "request body is not JSON: invalid unicode code point at line {line} column {}",
            at - line_start + 1
        ))
    })
}

/// serde_json's message without its ` at line L column C`.
fn without_position(e: &serde_json::Error) -> String {
    let message = e.to_string();
    let position = format!(" at line {} column {}", e.line(), e.column());
    match message.strip_suffix(&position) {
        Some(message) => message.to_string(),
        None => message,
    }
}

/// The review in `text` if it is a well-formed AdmissionReview: the request, and its object as
/// [`FastRequest`] read it (views or text, after `VIEWS`).
fn decode<const VIEWS: bool>(text: &str) -> Option<(Request, ObjectInput<'_>)> {
    let review = serde_json::from_str::<FastReview<VIEWS>>(text).ok()?;
    let api_version = ApiVersion::parse(&review.api_version)?;
    let r = review.request;
    let (Some(uid), Some(kind), Some(operation)) = (r.uid, r.kind, r.operation) else {
        return None;
    };
    if review.kind != "AdmissionReview" || uid.is_empty() {
        return None;
    }
    let head = RequestHead {
        uid: uid.clone(),
        kind,
        sub_resource: r.sub_resource,
        namespace: r.namespace,
        name: r.name.unwrap_or_default(),
        operation,
        dry_run: r.dry_run.unwrap_or_default(),
        object: None,
        old_object: r.old_object,
    };
    let envelope = Envelope { api_version, uid };
    let object = r.object.unwrap_or(ObjectInput::Missing);
    Some((Request::from_head(envelope, head), object))
}

/// The AdmissionReview the API server would send for creating `object` (a bare Kubernetes
/// object, as a manifest has it), as a dry run: the request's kind from the object's
/// `apiVersion` and `kind`, its namespace and name from its `metadata` (`default_namespace` when
/// it names none), the uid `<user>-<namespace>-<name>`. `review` and `audit` judge a bare object
/// through this review and [`Request::from_slice`], the decode `serve` uses.
pub fn create_review(
    object: &serde_json::Value,
    default_namespace: &str,
    user: &str,
) -> serde_json::Value {
    let text = |pointer: &str| object.pointer(pointer).and_then(serde_json::Value::as_str);
    let api_version = text("/apiVersion").unwrap_or("");
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let kind = text("/kind").unwrap_or("");
    let namespace = text("/metadata/namespace").unwrap_or(default_namespace);
    let name = text("/metadata/name").unwrap_or("");
    serde_json::json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": format!("{user}-{namespace}-{name}"),
            "kind": {"group": group, "version": version, "kind": kind},
            "resource": {"group": group, "version": version, "resource": format!("{}s", kind.to_lowercase())},
            "namespace": namespace,
            "name": name,
            "operation": "CREATE",
            "userInfo": {"username": user},
            "object": object,
            "dryRun": true,
        }
    })
}

impl Request {
    /// Decodes an AdmissionReview body as `serve` does, in one pass: the object of a Pod or Job
    /// (written after the request's kind, as the API server writes it) is decoded into views in
    /// the same pass, any other object is kept as text. When the object does not decode as its
    /// kind, the body is decoded as [`Request::from_slice`] decodes it (the object kept as text,
    /// for the policy to name the field); a body neither decode takes is refused, saying what is
    /// wrong and echoing the uid when it can be read.
    pub(super) fn from_slice_with_object(
        body: &[u8],
    ) -> Result<(Request, ObjectInput<'_>), DecodeError> {
        let text = utf8(body)?;
        // A body long enough for its object to pass the bound of one object keeps the object
        // as text, to be counted before its views are built (`view::decode_pod`). A shorter one
        // cannot reach the bound.
        let one_pass = text.len() < view::SHORTEST_TOO_LARGE;
        one_pass
            .then(|| decode::<true>(text))
            .flatten()
            .or_else(|| decode::<false>(text))
            .ok_or_else(|| Self::refusal(text))
    }

    /// Decodes an AdmissionReview body with `serve`'s decode, the object kept as its text
    /// (in [`Request::object`]): what `review` and `audit` decode their reviews with, so that a
    /// body `serve` refuses is refused by them with the same message.
    pub fn from_slice(body: &[u8]) -> Result<Request, DecodeError> {
        let text = utf8(body)?;
        let (mut request, object) = decode::<false>(text).ok_or_else(|| Self::refusal(text))?;
        if let ObjectInput::Raw(raw) = object {
            request.object = Some(raw.to_owned());
        }
        Ok(request)
    }

    fn from_head(envelope: Envelope, head: RequestHead) -> Request {
        let operation = match head.operation {
            Operation::Create => "CREATE",
            Operation::Update => "UPDATE",
            Operation::Delete => "DELETE",
            Operation::Connect => "CONNECT",
        };
        // Pods and Jobs are judged on CREATE (and ephemeral containers): only the kinds whose
        // templates are judged on UPDATE keep the old object, to compare the templates.
        let kind = workload_kind(&head.kind.group, &head.kind.version, &head.kind.kind);
        let mutated = kind.is_some_and(WorkloadKind::is_mutated);
        // A Pod UPDATE of the main resource keeps it too: its prep container is compared; and
        // one of `ephemeralcontainers`: only the ephemeral containers it lacks are judged.
        let pod_update = kind == Some(WorkloadKind::Pod)
            && operation == "UPDATE"
            && matches!(
                head.sub_resource.as_deref(),
                None | Some("" | "ephemeralcontainers")
            );
        Request {
            old_object: head
                .old_object
                .filter(|o| (!mutated || pod_update) && o.get() != "null")
                .map(|o| o.to_owned()),
            envelope,
            group: head.kind.group,
            version: head.kind.version,
            kind: head.kind.kind,
            sub_resource: head.sub_resource.filter(|s| !s.is_empty()),
            namespace: head.namespace.unwrap_or_default(),
            name: head.name,
            operation,
            dry_run: head.dry_run,
            object: head
                .object
                .filter(|o| o.get() != "null")
                .map(|o| o.to_owned()),
        }
    }

    /// Why [`decode`] refused `text`, decoded again step by step to say what is wrong and to
    /// echo the uid when it can be read.
    fn refusal(text: &str) -> DecodeError {
        let review: ReviewIn = match serde_json::from_str(text) {
            Ok(review) => review,
            Err(e) => {
                return DecodeError::Unanswerable(match e.classify() {
                    serde_json::error::Category::Data => {
                        format!("request body is not an AdmissionReview: {e}")
                    }
                    _ => format!("request body is not JSON: {e}"),
                });
            }
        };
        let raw_request = review.request.filter(|r| r.get() != "null");
        let api_version = match review.api_version.as_deref() {
            Some(v) => ApiVersion::parse(v)
                .ok_or_else(|| format!("apiVersion `{v}` is not admission.k8s.io/v1 or v1beta1")),
            None => Err("apiVersion is missing".to_string()),
        };
        let kind = match review.kind.as_deref() {
            Some("AdmissionReview") => Ok(()),
            Some(other) => Err(format!("kind `{other}` is not AdmissionReview")),
            None => Err("kind is missing".to_string()),
        };
        let Some(raw_request) = raw_request else {
            let problem = [api_version.err(), kind.err()].into_iter().flatten().next();
            return DecodeError::Unanswerable(
                problem.unwrap_or_else(|| "request is missing".into()),
            );
        };
        // One pass over the request when only the envelope is wrong; a second, for the uid
        // alone, otherwise.
        let head = serde_json::from_str::<RequestHead>(raw_request.get());
        let uid = match &head {
            Ok(h) => Some(h.uid.clone()),
            Err(_) => match serde_json::from_str::<UidOnly>(raw_request.get()) {
                Ok(u) => u.uid,
                // Two `uid` keys: which one to echo is anybody's guess, so none is, and the
                // message says why rather than that the uid is missing.
                Err(e) if e.to_string().starts_with("duplicate field `uid`") => {
                    return DecodeError::Unanswerable(
                        "request.uid: duplicate field `uid` (the key is given more than once)"
                            .into(),
                    );
                }
                Err(_) => None,
            },
        };
        let Some(uid) = uid.filter(|u| !u.is_empty()) else {
            let problem = [api_version.err(), kind.err()].into_iter().flatten().next();
            return DecodeError::Unanswerable(
                problem.unwrap_or_else(|| "request.uid is missing or not a string".into()),
            );
        };
        // The uid is readable: from here on, problems are answered in a review that echoes it.
        let envelope = Envelope {
            api_version: *api_version.as_ref().unwrap_or(&ApiVersion::V1),
            uid,
        };
        if let Some(message) = [api_version.err(), kind.err()].into_iter().flatten().next() {
            return DecodeError::Invalid { envelope, message };
        }
        // Decode again with path tracking, only to name the offending field.
        let de = &mut serde_json::Deserializer::from_str(raw_request.get());
        let message = match serde_path_to_error::deserialize::<_, RequestHead>(de) {
            // Without serde_json's position: the path names the field, and the position would
            // point into a body nobody sees (or, for `review`, into the review it re-encoded).
            Err(e) => format!("request.{}: {}", e.path(), without_position(e.inner())),
            // Both decodes read the request alike, so this is not reached.
            Ok(_) => "request: cannot be decoded".to_string(),
        };
        DecodeError::Invalid { envelope, message }
    }

    /// The kind of docs/policy.md §1 the request is for; `None` for any other.
    pub fn workload_kind(&self) -> Option<WorkloadKind> {
        workload_kind(&self.group, &self.version, &self.kind)
    }

    pub fn kind_display(&self) -> String {
        if self.group.is_empty() {
            format!("{}/{}", self.version, self.kind)
        } else {
            format!("{}/{}/{}", self.group, self.version, self.kind)
        }
    }

    pub fn summary(&self, decision: &Decision) -> Summary {
        let name = if self.name.is_empty() {
            decision.object_name.clone().unwrap_or_default()
        } else {
            self.name.clone()
        };
        Summary {
            uid: self.envelope.uid.clone(),
            kind: self.kind.clone(),
            namespace: decision
                .object_namespace
                .clone()
                .unwrap_or_else(|| self.namespace.clone()),
            name,
            operation: self.operation.to_string(),
            dry_run: self.dry_run,
            allowed: decision.allowed,
            patch_operations: decision.patch_len(),
            mode: decision.mode,
            result: decision.result,
            model_cache: decision.model_cache,
            claim_to_read: decision.claim_to_read.clone(),
            exceptions: decision.exceptions.iter().map(|u| u.name.clone()).collect(),
            error: None,
        }
    }
}

#[cfg(test)]
mod one_pass_tests {
    use super::*;

    fn compact(pretty: &str) -> String {
        serde_json::to_string(&serde_json::from_str::<serde_json::Value>(pretty).unwrap()).unwrap()
    }

    /// The reference reviews' objects are decoded into views while the envelope is read, and a
    /// controller's UPDATE keeps its object and old object as the text received: a change that
    /// sent them to the decode that keeps the object as text would keep every answer and cost
    /// every Pod's admission a second pass over its object.
    #[test]
    fn the_api_server_s_reviews_are_decoded_in_one_pass() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../benches/reviews");
        for name in [
            "llm-serving-pod",
            "one-container-pod",
            "twenty-container-pod",
        ] {
            let pretty = std::fs::read_to_string(format!("{dir}/{name}.json")).unwrap();
            for text in [pretty.clone(), compact(&pretty)] {
                let (request, object) = Request::from_slice_with_object(text.as_bytes())
                    .unwrap_or_else(|_| panic!("{name}"));
                assert!(matches!(object, ObjectInput::Decoded(_)), "{name}");
                assert_eq!(request.envelope.uid, format!("bench-{name}"));
                assert!(request.object.is_none(), "{name}: the object was copied");
            }
        }
        let update = serde_json::json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "u",
                "kind": {"group": "apps", "version": "v1", "kind": "Deployment"},
                "operation": "UPDATE",
                "object": {"kind": "Deployment", "spec": {"replicas": 2}},
                "oldObject": {"kind": "Deployment", "spec": {"replicas": 1}},
                "dryRun": false
            }
        })
        .to_string();
        let (request, object) = Request::from_slice_with_object(update.as_bytes()).unwrap();
        let ObjectInput::Raw(object) = object else {
            panic!("the object is kept raw");
        };
        assert_eq!(
            object.get(),
            r#"{"kind":"Deployment","spec":{"replicas":2}}"#
        );
        assert_eq!(
            request.old_object.as_deref().map(RawValue::get),
            Some(r#"{"kind":"Deployment","spec":{"replicas":1}}"#)
        );
        assert_eq!(request.operation, "UPDATE");
    }

    /// `from_slice` (what `review` and `audit` decode with) reads a review as `serve`'s decode
    /// does, the object kept as its exact text, and refuses what it refuses with the same error.
    #[test]
    fn from_slice_is_serve_s_decode_with_the_object_as_text() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../benches/reviews");
        let pretty = std::fs::read_to_string(format!("{dir}/llm-serving-pod.json")).unwrap();
        let text = compact(&pretty);
        let request = Request::from_slice(text.as_bytes()).unwrap();
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            request.object.as_deref().map(RawValue::get),
            Some(
                serde_json::to_string(&value["request"]["object"])
                    .unwrap()
                    .as_str()
            )
        );
        let (served, _) = Request::from_slice_with_object(text.as_bytes()).unwrap();
        assert_eq!(
            format!(
                "{:?}",
                Request {
                    object: None,
                    ..request
                }
            ),
            format!("{served:?}")
        );
        let review = |request: &str| {
            format!(
                r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{request}}}"#
            )
        };
        let refused = [
            review(
                r#"{"uid":"u","kind":{"group":"","version":"v1","kind":"Pod"},"operation":"EXPLODE"}"#,
            ),
            review(
                r#"{"uid":"u","uid":"v","kind":{"group":"","version":"v1","kind":"Pod"},"operation":"CREATE"}"#,
            ),
            review(
                r#"{"uid":7,"kind":{"group":"","version":"v1","kind":"Pod"},"operation":"CREATE"}"#,
            ),
            review(
                r#"{"uid":"u","kind":{"group":"","version":"v1","kind":"Pod"},"operation":"CREATE","dryRun":"yes"}"#,
            ),
            review(
                r#"{"uid":"u","kind":{"group":"","version":"v1","kind":"Pod"},"operation":"CREATE","object":{"spec":}}"#,
            ),
            review("null"),
            r#"{"apiVersion":"v1","kind":"AdmissionReview","request":{"uid":"u"}}"#.to_string(),
            "[]".to_string(),
            "{".to_string(),
        ];
        for body in &refused {
            let (Err(a), Err(b)) = (
                Request::from_slice(body.as_bytes()),
                Request::from_slice_with_object(body.as_bytes()),
            ) else {
                panic!("accepted: {body}");
            };
            assert_eq!(format!("{a:?}"), format!("{b:?}"), "{body}");
        }
        // A Pod whose object does not decode as a Pod is still a readable review: the policy,
        // not the decode, refuses it and names the field.
        let bad_object = review(
            r#"{"uid":"u","kind":{"group":"","version":"v1","kind":"Pod"},"operation":"CREATE",
                "object":{"spec":{"securityContext":{"runAsUser":"0"}}}}"#,
        );
        let (served, object) = Request::from_slice_with_object(bad_object.as_bytes()).unwrap();
        assert!(matches!(object, ObjectInput::Raw(_)));
        let request = Request::from_slice(bad_object.as_bytes()).unwrap();
        assert_eq!(
            format!(
                "{:?}",
                Request {
                    object: None,
                    ..request
                }
            ),
            format!("{served:?}")
        );
    }

    /// Two `uid` keys: refused, with a message that says the key is duplicated, not missing.
    #[test]
    fn a_duplicate_uid_is_named_as_such() {
        let body = r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","kind":{"group":"","version":"v1","kind":"Pod"},"uid":"v","operation":"CREATE"}}"#;
        for result in [
            Request::from_slice(body.as_bytes()).map(|_| ()),
            Request::from_slice_with_object(body.as_bytes()).map(|_| ()),
        ] {
            let Err(DecodeError::Unanswerable(message)) = result else {
                panic!("accepted or answered: {result:?}");
            };
            assert_eq!(
                message,
                "request.uid: duplicate field `uid` (the key is given more than once)"
            );
        }
    }

    /// JSON text is UTF-8: bytes that are not are refused wherever they are, also in a field no
    /// rule reads (which serde_json alone would skip without checking).
    #[test]
    fn a_body_that_is_not_utf8_is_refused_even_in_an_unread_field() {
        let prefix = br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","kind":{"group":"","version":"v1","kind":"Pod"},"operation":"DELETE","userInfo":{"username":"a"#;
        let mut body = prefix.to_vec();
        body.extend_from_slice(b"\xff\"}}}");
        for result in [
            Request::from_slice(&body).map(|_| ()),
            Request::from_slice_with_object(&body).map(|_| ()),
        ] {
            let Err(DecodeError::Unanswerable(message)) = result else {
                panic!("accepted or answered: {result:?}");
            };
            assert_eq!(
                message,
                format!(
                    "request body is not JSON: invalid unicode code point at line 1 column {}",
                    prefix.len() + 1
                )
            );
        }
        // Without the check, serde_json would have taken it.
        assert!(serde_json::from_slice::<serde::de::IgnoredAny>(&body).is_ok());
    }
}
