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

use super::{Decision, DecodedObject, Summary, WorkloadKind};
use crate::policy::view::{JobView, PodView, scan};

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
    /// `oldObject` of an UPDATE of a workload controller (whose unchanged template is allowed
    /// untouched); `None` for every other request.
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
/// decodes `userInfo`, `resource`, the options and a typed object, which no rule here needs).
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

/// The whole review as the API server sends it, decoded in one pass on the happy path.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ReviewStrict<'a> {
    #[serde(borrow)]
    api_version: Cow<'a, str>,
    #[serde(borrow)]
    kind: Cow<'a, str>,
    #[serde(borrow)]
    request: RequestHead<'a>,
}

/// The object of a request as the one-pass decode leaves it.
pub(super) enum ObjectInput<'a> {
    /// No `object`, or `null`.
    Missing,
    /// Decoded into views while the envelope was read (a Pod or Job whose kind came before the
    /// object, as the API server writes it).
    Decoded(Box<DecodedObject<'a>>),
    /// Kept as text, to be decoded once the kind is known.
    Raw(&'a RawValue),
}

/// The request as the one-pass decode reads it: the head, the object decoded as the kind the
/// head names when the head comes first.
struct FastRequest<'a> {
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

impl<'de: 'a, 'a> Deserialize<'de> for FastRequest<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = FastRequest<'a>;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an AdmissionRequest")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<FastRequest<'a>, A::Error> {
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
                    // A duplicate is left to the checked decode, which names it.
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
                            // Whatever the operation: an object that does not decode sends the
                            // whole body to the checked path, which answers as before.
                            let decode = r
                                .kind
                                .as_ref()
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
struct FastReview<'a> {
    #[serde(borrow, rename = "apiVersion")]
    api_version: Cow<'a, str>,
    #[serde(borrow)]
    kind: Cow<'a, str>,
    #[serde(borrow)]
    request: FastRequest<'a>,
}

#[cfg(test)]
thread_local! {
    /// How many bodies [`raw_object`] scanned on this thread: the tests check that only a
    /// controller's UPDATE pays for a second scan of the body.
    pub(super) static RAW_OBJECT_SCANS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// The object's text in an AdmissionReview body, found again (borrowed) after a one-pass decode.
pub(super) fn raw_object(body: &[u8]) -> Option<&RawValue> {
    #[cfg(test)]
    RAW_OBJECT_SCANS.with(|n| n.set(n.get() + 1));
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

/// The kinds of SPEC.md §1; anything else is not handled.
fn workload_kind(group: &str, version: &str, kind: &str) -> Option<WorkloadKind> {
    WorkloadKind::of(group, version, kind)
}

impl Request {
    /// Decodes an AdmissionReview body and its object in one pass when the body is well formed
    /// and written in the API server's order (the request's kind before its object); otherwise
    /// as [`Request::from_slice`], the object left raw.
    pub(super) fn from_slice_with_object(
        body: &[u8],
    ) -> Result<(Request, ObjectInput<'_>), DecodeError> {
        // JSON text is UTF-8, and serde_json checks it only in the strings it decodes: checked
        // here once for the whole body, so that skipped strings are checked too.
        // First through the structural scan, which skips unread values faster and hands every
        // body it does not take (see `scan`) to serde_json, which decides.
        if let Ok(text) = std::str::from_utf8(body)
            && let Ok(review) = scan::from_str::<FastReview>(text)
                .or_else(|_| serde_json::from_str::<FastReview>(text).map_err(|_| scan::Bail))
            && review.kind == "AdmissionReview"
            && let Some(api_version) = ApiVersion::parse(&review.api_version)
            && let r = review.request
            && let (Some(uid), Some(kind), Some(operation)) = (r.uid, r.kind, r.operation)
            && !uid.is_empty()
        {
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
            return Ok((Request::from_head(envelope, head), object));
        }
        let request = Self::from_slice(body)?;
        // The slow path owns its object text; the caller decodes it from `request.object`.
        Ok((request, ObjectInput::Missing))
    }

    /// Decodes an AdmissionReview body: in one pass when it is well formed, else again, step by
    /// step, to say what is wrong and echo the uid when it can be read.
    pub fn from_slice(body: &[u8]) -> Result<Request, DecodeError> {
        if let Ok(review) = serde_json::from_slice::<ReviewStrict>(body)
            && review.kind == "AdmissionReview"
            && let Some(api_version) = ApiVersion::parse(&review.api_version)
            && !review.request.uid.is_empty()
        {
            let head = review.request;
            let envelope = Envelope {
                api_version,
                uid: head.uid.clone(),
            };
            return Ok(Request::from_head(envelope, head));
        }
        Self::from_slice_checked(body)
    }

    fn from_head(envelope: Envelope, head: RequestHead) -> Request {
        let operation = match head.operation {
            Operation::Create => "CREATE",
            Operation::Update => "UPDATE",
            Operation::Delete => "DELETE",
            Operation::Connect => "CONNECT",
        };
        let controller = workload_kind(&head.kind.group, &head.kind.version, &head.kind.kind)
            .is_some_and(WorkloadKind::is_controller);
        Request {
            old_object: head
                .old_object
                .filter(|o| controller && o.get() != "null")
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

    fn from_slice_checked(body: &[u8]) -> Result<Request, DecodeError> {
        let review: ReviewIn = serde_json::from_slice(body).map_err(|e| {
            DecodeError::Unanswerable(match e.classify() {
                serde_json::error::Category::Data => {
                    format!("request body is not an AdmissionReview: {e}")
                }
                _ => format!("request body is not JSON: {e}"),
            })
        })?;
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
            return Err(DecodeError::Unanswerable(
                problem.unwrap_or_else(|| "request is missing".into()),
            ));
        };
        // One pass over the request on the happy path; a second, for the uid alone, otherwise.
        let head = serde_json::from_str::<RequestHead>(raw_request.get());
        let uid = match &head {
            Ok(h) => Some(h.uid.clone()),
            Err(_) => serde_json::from_str::<UidOnly>(raw_request.get())
                .ok()
                .and_then(|u| u.uid),
        };
        let Some(uid) = uid.filter(|u| !u.is_empty()) else {
            let problem = [api_version.err(), kind.err()].into_iter().flatten().next();
            return Err(DecodeError::Unanswerable(problem.unwrap_or_else(|| {
                "request.uid is missing or not a string".into()
            })));
        };
        // The uid is readable: from here on, problems are answered in a review that echoes it.
        let envelope = Envelope {
            api_version: *api_version.as_ref().unwrap_or(&ApiVersion::V1),
            uid,
        };
        if let Some(message) = [api_version.err(), kind.err()].into_iter().flatten().next() {
            return Err(DecodeError::Invalid { envelope, message });
        }
        let head = match head {
            Ok(h) => h,
            Err(_) => {
                // Decode again with path tracking, only to name the offending field.
                let de = &mut serde_json::Deserializer::from_str(raw_request.get());
                let message = match serde_path_to_error::deserialize::<_, RequestHead>(de) {
                    Err(e) => format!("request.{}: {}", e.path(), e.inner()),
                    Ok(_) => "request: cannot be decoded".to_string(),
                };
                return Err(DecodeError::Invalid { envelope, message });
            }
        };
        Ok(Request::from_head(envelope, head))
    }

    /// The kind of SPEC.md §1 the request is for; `None` for any other.
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
            error: None,
        }
    }
}

#[cfg(test)]
mod fast_path_tests {
    use super::*;

    /// The reference reviews, and a controller's UPDATE (its object and old object kept as raw
    /// text), are read by the structural scan itself, not by the serde_json pass behind it: a
    /// change that made the scan refuse them would keep every answer and lose the speed.
    #[test]
    fn the_api_server_s_reviews_are_decoded_by_the_scan() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../benches/reviews");
        for name in [
            "llm-serving-pod",
            "one-container-pod",
            "twenty-container-pod",
        ] {
            let pretty = std::fs::read_to_string(format!("{dir}/{name}.json")).unwrap();
            let compact =
                serde_json::to_string(&serde_json::from_str::<serde_json::Value>(&pretty).unwrap())
                    .unwrap();
            for text in [&pretty, &compact] {
                let review = scan::from_str::<FastReview>(text).expect(name);
                assert!(matches!(
                    review.request.object,
                    Some(ObjectInput::Decoded(_))
                ));
                assert_eq!(
                    review.request.uid.as_deref(),
                    Some(&*format!("bench-{name}"))
                );
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
        let review = scan::from_str::<FastReview>(&update).expect("a controller's update");
        let Some(ObjectInput::Raw(object)) = review.request.object else {
            panic!("the object is kept raw");
        };
        assert_eq!(
            object.get(),
            r#"{"kind":"Deployment","spec":{"replicas":2}}"#
        );
        assert_eq!(
            review.request.old_object.map(RawValue::get),
            Some(r#"{"kind":"Deployment","spec":{"replicas":1}}"#)
        );
        assert!(matches!(review.request.operation, Some(Operation::Update)));
    }
}
