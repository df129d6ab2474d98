//! The object under review as the rules read it: borrowed views of exactly the fields a rule of
//! the rules read, decoded in one pass from the object's JSON text.
//!
//! Contract (docs/policy.md §6):
//! - every field listed here is type-checked against its Kubernetes schema (`runAsUser: "0"` or
//!   `1000.5` is an error, and [`decode_pod`]/[`decode_job`] name the field's path);
//! - every other field is skipped without being allocated or type-checked, but the whole text must
//!   still be well-formed JSON (serde's `IgnoredAny` checks what it skips);
//! - strings borrow from the text unless they hold an escape;
//! - the field semantics are k8s-openapi's: `null` is the same as absent, a missing required field
//!   (a container's `name`) reads as empty, and a key given twice keeps its last value (Go's
//!   `encoding/json` and k8s-openapi do the same);
//! - an init container is also kept as its raw JSON text, because the prep container is judged on
//!   every field it has, including fields no type here knows.
//!
//! serde_json decodes the views (the only JSON reader of the request path). It limits nesting to
//! 128 levels where a value is decoded; what it skips, it skips with a heap stack, so deep nesting
//! in an unread field costs no stack either.
//!
//! What a decode builds is bounded before it is built ([`metered`]): every element of a list the
//! views keep (and every entry of a map they keep) is charged the fewest bytes the API server
//! could store it in, and a decode whose elements pass what etcd stores for one object stops
//! there with a [`DecodeFailure`] that is [`too_large`](DecodeFailure::too_large), naming the
//! list. Lists and maps no view reads are skipped without being allocated.

use std::borrow::Cow;
use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::fmt;
use std::marker::PhantomData;
use std::ops::Deref;

use serde::de::{
    self, Deserialize, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor,
};
use serde_json::value::RawValue;

/// A string of the object: borrowed from the JSON text, owned only when it held an escape.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Str<'a>(pub Cow<'a, str>);

impl Deref for Str<'_> {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Str<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for Str<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl PartialEq<str> for Str<'_> {
    fn eq(&self, other: &str) -> bool {
        *self.0 == *other
    }
}

impl PartialEq<&str> for Str<'_> {
    fn eq(&self, other: &&str) -> bool {
        *self.0 == **other
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Str<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct StrVisitor<'a>(PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for StrVisitor<'a> {
            type Value = Str<'a>;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                // As `String`'s visitor says it, so that messages match k8s-openapi's.
                f.write_str("a string")
            }

            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Str<'a>, E> {
                Ok(Str(Cow::Borrowed(v)))
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<Str<'a>, E> {
                Ok(Str(Cow::Owned(v.to_owned())))
            }

            fn visit_string<E: de::Error>(self, v: String) -> Result<Str<'a>, E> {
                Ok(Str(Cow::Owned(v)))
            }
        }
        d.deserialize_str(StrVisitor(PhantomData))
    }
}

/// The most bytes etcd stores for one object: its default `--max-request-bytes`, 1.5 MiB, which
/// bounds a whole write request (so an object, with its key, takes less).
pub const MAX_STORED_OBJECT_BYTES: usize = 1536 * 1024;

/// The fewest bytes the API server can store an element of a list of named objects in
/// (containers of the three lists, volumes, volume mounts, node selector requirements) or an
/// entry of a `map[string]string` (labels, annotations, nodeSelector): in its protobuf
/// encoding (the smallest it has; etcd keeps built-in kinds as protobuf, custom resources as
/// JSON, which is larger), the element's own field tag and length, then its required name's
/// (or key's) tag, length and at least one byte.
pub const NAMED_ELEMENT_BYTES: usize = 5;

/// The fewest bytes for any other element (a node selector term, a string of `values`, a key
/// of a volume): its field tag and a length or value byte.
pub const ELEMENT_BYTES: usize = 2;

/// The shortest object text whose elements can pass [`MAX_STORED_OBJECT_BYTES`]: the densest
/// charged text is a list of empty named elements, `{}` and a comma, 3 bytes for
/// [`NAMED_ELEMENT_BYTES`]. Below it a decode cannot reach the bound (and is not counted first).
pub(crate) const SHORTEST_TOO_LARGE: usize = MAX_STORED_OBJECT_BYTES / NAMED_ELEMENT_BYTES * 3;

/// The state of the decode under way on this thread: how many of [`MAX_STORED_OBJECT_BYTES`]
/// its elements have left, whether it only counts them, whether they ran out, and (once they
/// did) the path of the list where, recorded innermost first as the error unwinds through the
/// views.
struct Meter {
    left: Cell<usize>,
    counting: Cell<bool>,
    tripped: Cell<Option<usize>>,
    trace: RefCell<Vec<Traced>>,
}

enum Traced {
    Key(&'static str),
    Index(usize),
}

thread_local! {
    /// Unlimited outside [`metered`]: a view decoded on its own (a test, a tool) is not charged.
    static METER: Meter = const {
        Meter {
            left: Cell::new(usize::MAX),
            counting: Cell::new(false),
            tripped: Cell::new(None),
            trace: RefCell::new(Vec::new()),
        }
    };
}

/// Runs `decode` with the bound of one object: the elements it decodes into lists and maps may
/// take [`MAX_STORED_OBJECT_BYTES`] at their smallest encoding, and the first that passes it
/// stops the decode with an error. Returns what `decode` returned, and the failure that names
/// the list when the bound stopped it. Decodes nested in `decode` on this thread (an init
/// container's view, decoded from its text) are charged to the same bound.
pub(crate) fn metered<R>(decode: impl FnOnce() -> R) -> (R, Option<DecodeFailure>) {
    within_bound(false, decode)
}

/// [`metered`], keeping no element: every list and map comes out empty, so the decode holds one
/// element at a time. What it says is whether the views of the same text would pass the bound,
/// and where, without building them.
fn counted<R>(decode: impl FnOnce() -> R) -> (R, Option<DecodeFailure>) {
    within_bound(true, decode)
}

fn within_bound<R>(counting: bool, decode: impl FnOnce() -> R) -> (R, Option<DecodeFailure>) {
    let outer = METER.with(|m| {
        m.trace.borrow_mut().clear();
        (
            m.left.replace(MAX_STORED_OBJECT_BYTES),
            m.counting.replace(counting),
            m.tripped.replace(None),
        )
    });
    let out = decode();
    let failure = METER.with(|m| {
        let tripped = m.tripped.replace(outer.2);
        m.left.set(outer.0);
        m.counting.set(outer.1);
        let trace = std::mem::take(&mut *m.trace.borrow_mut());
        tripped.map(|bytes| too_large_failure(&trace, bytes))
    });
    (out, failure)
}

/// Charges one element of `bytes` (its smallest encoding) to the decode under way: an error
/// once the object's elements pass [`MAX_STORED_OBJECT_BYTES`]; else whether to keep the
/// element (not when the decode only counts).
fn charge<E: de::Error>(bytes: usize) -> Result<bool, E> {
    METER.with(|m| match m.left.get() {
        // Outside [`metered`]: nothing to charge.
        usize::MAX => Ok(true),
        left => match left.checked_sub(bytes) {
            Some(left) => {
                m.left.set(left);
                Ok(!m.counting.get())
            }
            None => {
                m.tripped.set(Some(bytes));
                Err(E::custom(TOO_LARGE))
            }
        },
    })
}

const TOO_LARGE: &str = "more list elements than an object the API server stores can hold";

/// Records where an error came from, as it unwinds through a view's field or a list's element:
/// only when the bound stopped the decode (other failures are named by [`failure`]'s pass).
#[cold]
fn traced<E>(e: E, at: Traced) -> E {
    METER.with(|m| {
        if m.tripped.get().is_some() {
            m.trace.borrow_mut().push(at);
        }
    });
    e
}

/// The failure of a decode the bound stopped, naming the list (as `serde_path_to_error` names a
/// field: `spec.containers[3].volumeMounts`) where an element of `bytes` did not fit.
fn too_large_failure(trace: &[Traced], bytes: usize) -> DecodeFailure {
    use std::fmt::Write as _;
    let mut path = String::new();
    for at in trace.iter().rev() {
        match at {
            Traced::Key(k) if path.is_empty() => path.push_str(k),
            Traced::Key(k) => {
                let _ = write!(path, ".{k}");
            }
            Traced::Index(i) => {
                let _ = write!(path, "[{i}]");
            }
        }
    }
    if path.is_empty() {
        path.push('.');
    }
    let kind = if bytes == NAMED_ELEMENT_BYTES {
        "containers, volumes, mounts or map entries"
    } else {
        "other elements"
    };
    DecodeFailure {
        path,
        message: format!(
            "the pod has more list elements than an object the API server stores can hold: \
             counting each container, volume, mount or map entry at {NAMED_ELEMENT_BYTES} bytes \
             and any other element at {ELEMENT_BYTES}, the fewest each is stored in, its lists \
             pass the {MAX_STORED_OBJECT_BYTES} bytes etcd keeps for one object here (a list of \
             {kind} alone holds at most {})",
            MAX_STORED_OBJECT_BYTES / bytes
        ),
        too_large: true,
    }
}

/// An `Option<Vec<T>>` field whose elements are charged `bytes` each as they are decoded
/// ([`metered`]); otherwise read as serde reads it (`null` is `None`, messages the same).
struct Metered<T> {
    bytes: usize,
    element: PhantomData<fn() -> T>,
}

impl<T> Metered<T> {
    fn new(bytes: usize) -> Self {
        Metered {
            bytes,
            element: PhantomData,
        }
    }
}

impl<'de, T: Deserialize<'de>> DeserializeSeed<'de> for Metered<T> {
    type Value = Option<Vec<T>>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Option<Vec<T>>, D::Error> {
        d.deserialize_option(self)
    }
}

impl<'de, T: Deserialize<'de>> Visitor<'de> for Metered<T> {
    type Value = Option<Vec<T>>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("option")
    }

    fn visit_none<E: de::Error>(self) -> Result<Option<Vec<T>>, E> {
        Ok(None)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Option<Vec<T>>, E> {
        Ok(None)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Option<Vec<T>>, D::Error> {
        d.deserialize_seq(MeteredSeq(self)).map(Some)
    }
}

struct MeteredSeq<T>(Metered<T>);

impl<'de, T: Deserialize<'de>> Visitor<'de> for MeteredSeq<T> {
    type Value = Vec<T>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        // As `Vec`'s visitor says it, so that messages match k8s-openapi's.
        f.write_str("a sequence")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
        let mut out = Vec::new();
        for i in 0.. {
            let element = match seq.next_element() {
                Ok(Some(element)) => element,
                Ok(None) => break,
                Err(e) => return Err(traced(e, Traced::Index(i))),
            };
            if charge(self.0.bytes)? {
                out.push(element);
            }
        }
        Ok(out)
    }
}

/// A `map[string]string` (labels, annotations, nodeSelector), sorted by key, each key once with
/// its last value: the semantics of the `BTreeMap` k8s-openapi decodes into, without a tree.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StrMap<'a>(Vec<(Cow<'a, str>, Cow<'a, str>)>);

impl<'a> StrMap<'a> {
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .binary_search_by(|(k, _)| k.as_ref().cmp(key))
            .ok()
            .map(|i| self.0[i].1.as_ref())
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    /// The pairs in key order.
    pub fn pairs(&self) -> &[(Cow<'a, str>, Cow<'a, str>)] {
        &self.0
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// A map of the given pairs, with the decoder's semantics (sorted, last value wins).
    pub fn from_pairs(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        let entries = pairs
            .into_iter()
            .map(|(k, v)| (Cow::Borrowed(k), Cow::Borrowed(v)))
            .collect();
        Self::normalised(entries)
    }

    fn normalised(mut entries: Vec<(Cow<'a, str>, Cow<'a, str>)>) -> Self {
        crate::keyed::sort_keeping_last(&mut entries);
        StrMap(entries)
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for StrMap<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct MapVisitor<'a>(PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for MapVisitor<'a> {
            type Value = StrMap<'a>;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a map")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<StrMap<'a>, A::Error> {
                let mut entries = Vec::with_capacity(map.size_hint().unwrap_or(4).min(64));
                while let Some(key) = map.next_key::<Str<'a>>()? {
                    let value = map.next_value::<Str<'a>>()?;
                    if charge(NAMED_ELEMENT_BYTES)? {
                        entries.push((key.0, value.0));
                    }
                }
                Ok(StrMap::normalised(entries))
            }
        }
        d.deserialize_map(MapVisitor(PhantomData))
    }
}

/// Declares a view struct whose fields are all `Option`s, and its decoder: a map visitor that
/// reads the listed keys, skips every other one with [`IgnoredAny`], and keeps the last value of
/// a key given twice. `expecting` is the Kubernetes type's name, as k8s-openapi says it in errors.
macro_rules! view {
    (
        $(#[$meta:meta])*
        pub struct $name:ident $(<$lt:lifetime $(, $g:ident)?>)? expecting $expecting:literal {
            $( $(#[$field_meta:meta])* $json:literal $([$bytes:expr])? => $field:ident : $ty:ty ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Debug, PartialEq)]
        pub struct $name $(<$lt $(, $g)?>)? {
            $( $(#[$field_meta])* pub $field: $ty, )*
        }

        impl $(<$lt $(, $g)?>)? Default for $name $(<$lt $(, $g)?>)? {
            fn default() -> Self {
                $name { $( $field: None, )* }
            }
        }

        view!(@impl $name [$($lt $(, $g)?)?] $expecting { $( $json $([$bytes])? => $field ),* });
    };
    // A field's value: a list with `[bytes]` is charged that much per element ([`metered`]).
    // An error records the field's key on its way out, for the bound's message.
    (@value $map:ident $json:literal) => {
        match $map.next_value() {
            Ok(value) => value,
            Err(e) => return Err(traced(e, Traced::Key($json))),
        }
    };
    (@value $map:ident $json:literal [$bytes:expr]) => {
        match $map.next_value_seed(Metered::new($bytes)) {
            Ok(value) => value,
            Err(e) => return Err(traced(e, Traced::Key($json))),
        }
    };
    (@impl $name:ident [] $expecting:literal { $( $json:literal $([$bytes:expr])? => $field:ident ),* }) => {
        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct V;
                impl<'de> Visitor<'de> for V {
                    type Value = $name;

                    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                        f.write_str($expecting)
                    }

                    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<$name, A::Error> {
                        let mut out = $name::default();
                        while let Some(key) = map.next_key::<Str<'de>>()? {
                            match &*key {
                                $( $json => out.$field = view!(@value map $json $([$bytes])?), )*
                                _ => {
                                    map.next_value::<IgnoredAny>()?;
                                }
                            }
                        }
                        Ok(out)
                    }
                }
                d.deserialize_map(V)
            }
        }
    };
    (@impl $name:ident [$lt:lifetime $(, $g:ident)?] $expecting:literal { $( $json:literal $([$bytes:expr])? => $field:ident ),* }) => {
        impl<'de: $lt, $lt $(, $g: Deserialize<'de>)?> Deserialize<'de> for $name<$lt $(, $g)?> {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct V<$lt $(, $g)?>(PhantomData<fn() -> $name<$lt $(, $g)?>>);
                impl<'de: $lt, $lt $(, $g: Deserialize<'de>)?> Visitor<'de> for V<$lt $(, $g)?> {
                    type Value = $name<$lt $(, $g)?>;

                    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                        f.write_str($expecting)
                    }

                    fn visit_map<A: MapAccess<'de>>(
                        self,
                        mut map: A,
                    ) -> Result<$name<$lt $(, $g)?>, A::Error> {
                        let mut out = $name::default();
                        while let Some(key) = map.next_key::<Str<'de>>()? {
                            match &*key {
                                $( $json => out.$field = view!(@value map $json $([$bytes])?), )*
                                _ => {
                                    map.next_value::<IgnoredAny>()?;
                                }
                            }
                        }
                        Ok(out)
                    }
                }
                d.deserialize_map(V(PhantomData))
            }
        }
    };
}

view! {
    /// `metadata` of a Pod, a Job or a Job's pod template.
    pub struct ObjectMetaView<'a> expecting "ObjectMeta" {
        "name" => name: Option<Str<'a>>,
        "generateName" => generate_name: Option<Str<'a>>,
        "namespace" => namespace: Option<Str<'a>>,
        "labels" => labels: Option<StrMap<'a>>,
        "annotations" => annotations: Option<StrMap<'a>>,
    }
}

view! {
    /// The pod-level `securityContext`.
    pub struct PodSecurityContextView expecting "PodSecurityContext" {
        "runAsUser" => run_as_user: Option<i64>,
        "runAsGroup" => run_as_group: Option<i64>,
        "runAsNonRoot" => run_as_non_root: Option<bool>,
        "fsGroup" => fs_group: Option<i64>,
    }
}

view! {
    /// A container's `securityContext`.
    pub struct SecurityContextView expecting "SecurityContext" {
        "runAsUser" => run_as_user: Option<i64>,
        "runAsGroup" => run_as_group: Option<i64>,
        "runAsNonRoot" => run_as_non_root: Option<bool>,
        /// Read for the `root-equivalent` warning (`policy::root_equivalent`).
        "privileged" => privileged: Option<bool>,
    }
}

view! {
    /// A container's volume mount: what the model mount compares with its own.
    pub struct VolumeMountView<'a> expecting "VolumeMount" {
        "name" => name: Option<Str<'a>>,
        "mountPath" => mount_path: Option<Str<'a>>,
        "subPath" => sub_path: Option<Str<'a>>,
        "readOnly" => read_only: Option<bool>,
        /// The other fields of a mount are only told apart from absent: a mount that has one is
        /// not the one modelgate writes.
        "subPathExpr" => sub_path_expr: Option<IgnoredAnyPresent>,
        "mountPropagation" => mount_propagation: Option<IgnoredAnyPresent>,
        "recursiveReadOnly" => recursive_read_only: Option<IgnoredAnyPresent>,
    }
}

impl VolumeMountView<'_> {
    pub fn name(&self) -> &str {
        self.name.as_deref().unwrap_or_default()
    }

    pub fn mount_path(&self) -> &str {
        self.mount_path.as_deref().unwrap_or_default()
    }
}

/// A field whose value no rule reads, only whether it is there (not `null`): skipped, not checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IgnoredAnyPresent;

impl<'de> Deserialize<'de> for IgnoredAnyPresent {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        IgnoredAny::deserialize(d).map(|_| IgnoredAnyPresent)
    }
}

view! {
    /// A container of any of the three lists.
    pub struct ContainerView<'a> expecting "Container" {
        "name" => name: Option<Str<'a>>,
        "image" => image: Option<Str<'a>>,
        "securityContext" => security_context: Option<SecurityContextView>,
        "volumeMounts" [NAMED_ELEMENT_BYTES] => volume_mounts: Option<Vec<VolumeMountView<'a>>>,
    }
}

impl ContainerView<'_> {
    pub fn name(&self) -> &str {
        self.name.as_deref().unwrap_or_default()
    }
}

/// An init container: its view, and its JSON exactly as received (the prep container is judged
/// on every field it has).
#[derive(Clone, Debug)]
pub struct InitContainerView<'a> {
    pub container: ContainerView<'a>,
    pub raw: &'a RawValue,
}

impl PartialEq for InitContainerView<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.container == other.container && self.raw.get() == other.raw.get()
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for InitContainerView<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // The raw text first, then the view from it: the text is short, and this way the view's
        // strings still borrow from the review. (A failure is named by the path-tracking pass,
        // which decodes init containers as plain `ContainerView`s.)
        let raw = <&'a RawValue>::deserialize(d)?;
        let container = serde_json::from_str(raw.get()).map_err(de::Error::custom)?;
        Ok(InitContainerView { container, raw })
    }
}

/// How an init container list entry reads as a container, for the pod's code that does not care
/// which decoding pass produced it.
pub trait AsContainer<'a> {
    fn container(&self) -> &ContainerView<'a>;
}

impl<'a> AsContainer<'a> for ContainerView<'a> {
    fn container(&self) -> &ContainerView<'a> {
        self
    }
}

impl<'a> AsContainer<'a> for InitContainerView<'a> {
    fn container(&self) -> &ContainerView<'a> {
        &self.container
    }
}

/// A volume: its name and which sources it has (the keys besides `name` whose value is not
/// `null`; the API server admits exactly one). A source's content is not read, except the
/// `persistentVolumeClaim` of modelgate's own model volume.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct VolumeView<'a> {
    pub name: Option<Str<'a>>,
    pub sources: Vec<Str<'a>>,
    pub persistent_volume_claim: Option<PvcSourceView<'a>>,
    pub host_path: Option<HostPathSourceView<'a>>,
    pub ephemeral: Option<EphemeralSourceView<'a>>,
}

impl VolumeView<'_> {
    pub fn name(&self) -> &str {
        self.name.as_deref().unwrap_or_default()
    }

    /// The volume has this source (`emptyDir`, `persistentVolumeClaim`, ...).
    pub fn has_source(&self, kind: &str) -> bool {
        self.sources.iter().any(|s| *s == kind)
    }
}

view! {
    /// `persistentVolumeClaim` of a volume.
    pub struct PvcSourceView<'a> expecting "PersistentVolumeClaimVolumeSource" {
        "claimName" => claim_name: Option<Str<'a>>,
        "readOnly" => read_only: Option<bool>,
    }
}

view! {
    /// `ephemeral` of a volume: the claim the pod's volume will be.
    pub struct EphemeralSourceView<'a> expecting "EphemeralVolumeSource" {
        "volumeClaimTemplate" => volume_claim_template: Option<ClaimTemplateView<'a>>,
    }
}

view! {
    /// `ephemeral.volumeClaimTemplate`.
    pub struct ClaimTemplateView<'a> expecting "PersistentVolumeClaimTemplate" {
        "spec" => spec: Option<ClaimSpecView<'a>>,
    }
}

view! {
    /// The fields of a claim's spec that say who chose its volume.
    pub struct ClaimSpecView<'a> expecting "PersistentVolumeClaimSpec" {
        "volumeName" => volume_name: Option<Str<'a>>,
        "selector" => selector: Option<IgnoredAnyPresent>,
        "storageClassName" => storage_class_name: Option<Str<'a>>,
    }
}

view! {
    /// `hostPath` of a volume: the node directory a cache volume may name.
    pub struct HostPathSourceView<'a> expecting "HostPathVolumeSource" {
        "path" => path: Option<Str<'a>>,
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for VolumeView<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = VolumeView<'a>;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("Volume")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<VolumeView<'a>, A::Error> {
                let mut out = VolumeView::default();
                // Every source key as given, with whether its value is there (not `null`).
                let mut given = Vec::new();
                while let Some(key) = map.next_key::<Str<'a>>()? {
                    let present = match &*key {
                        "name" => {
                            out.name = map.next_value()?;
                            continue;
                        }
                        "persistentVolumeClaim" => {
                            out.persistent_volume_claim = map.next_value()?;
                            out.persistent_volume_claim.is_some()
                        }
                        "hostPath" => {
                            out.host_path = map.next_value()?;
                            out.host_path.is_some()
                        }
                        "ephemeral" => {
                            out.ephemeral = map.next_value()?;
                            out.ephemeral.is_some()
                        }
                        _ => map.next_value::<Option<IgnoredAnyPresent>>()?.is_some(),
                    };
                    // Kept until the last is known: charged, so that a volume of many keys is
                    // bounded as a list is.
                    if charge(ELEMENT_BYTES)? {
                        given.push((key, present));
                    }
                }
                out.sources = last_given(given);
                Ok(out)
            }
        }
        d.deserialize_map(V(PhantomData))
    }
}

/// The keys whose last value is there, once each, in the order of their last occurrence: a key
/// given twice keeps its last value (`null` the second time removes it). One pass backwards,
/// each key hashed once: linear in the keys, however many there are.
fn last_given(given: Vec<(Str<'_>, bool)>) -> Vec<Str<'_>> {
    // The API server admits one source: without a repeated key, nothing to look up.
    if given.len() <= 1 {
        return given
            .into_iter()
            .filter_map(|(k, present)| present.then_some(k))
            .collect();
    }
    let mut seen = HashSet::with_capacity(given.len());
    let keep: Vec<bool> = given
        .iter()
        .rev()
        .map(|(key, present)| seen.insert(&**key) && *present)
        .collect();
    let mut kept: Vec<Str<'_>> = given
        .into_iter()
        .rev()
        .zip(keep)
        .filter_map(|((key, _), keep)| keep.then_some(key))
        .collect();
    kept.reverse();
    kept
}

view! {
    /// `spec.os`.
    pub struct PodOsView<'a> expecting "PodOS" {
        "name" => name: Option<Str<'a>>,
    }
}

impl PodOsView<'_> {
    pub fn name(&self) -> &str {
        self.name.as_deref().unwrap_or_default()
    }
}

view! {
    /// One requirement of a node selector term (`matchExpressions` or `matchFields`).
    pub struct NodeSelectorRequirementView<'a> expecting "NodeSelectorRequirement" {
        "key" => key: Option<Str<'a>>,
        "operator" => operator: Option<Str<'a>>,
        "values" [ELEMENT_BYTES] => values: Option<Vec<Str<'a>>>,
    }
}

impl NodeSelectorRequirementView<'_> {
    pub fn key(&self) -> &str {
        self.key.as_deref().unwrap_or_default()
    }

    pub fn operator(&self) -> &str {
        self.operator.as_deref().unwrap_or_default()
    }
}

view! {
    /// One term of a node selector (terms are ORed, requirements within a term ANDed).
    pub struct NodeSelectorTermView<'a> expecting "NodeSelectorTerm" {
        "matchExpressions" [NAMED_ELEMENT_BYTES] => match_expressions: Option<Vec<NodeSelectorRequirementView<'a>>>,
        "matchFields" [NAMED_ELEMENT_BYTES] => match_fields: Option<Vec<NodeSelectorRequirementView<'a>>>,
    }
}

view! {
    /// `requiredDuringSchedulingIgnoredDuringExecution` of a node affinity.
    pub struct NodeSelectorView<'a> expecting "NodeSelector" {
        "nodeSelectorTerms" [ELEMENT_BYTES] => node_selector_terms: Option<Vec<NodeSelectorTermView<'a>>>,
    }
}

impl<'a> NodeSelectorView<'a> {
    pub fn terms(&self) -> &[NodeSelectorTermView<'a>] {
        self.node_selector_terms.as_deref().unwrap_or_default()
    }
}

view! {
    /// `affinity.nodeAffinity`: only its required part is read.
    pub struct NodeAffinityView<'a> expecting "NodeAffinity" {
        "requiredDuringSchedulingIgnoredDuringExecution" => required: Option<NodeSelectorView<'a>>,
    }
}

view! {
    /// `spec.affinity`: only the node affinity is read.
    pub struct AffinityView<'a> expecting "Affinity" {
        "nodeAffinity" => node_affinity: Option<NodeAffinityView<'a>>,
    }
}

view! {
    /// A pod spec. `I` is how an init container is decoded: [`InitContainerView`] (with its raw
    /// text) on the request path, [`ContainerView`] in the pass that names a failing field.
    pub struct PodSpecOf<'a, I> expecting "PodSpec" {
        "securityContext" => security_context: Option<PodSecurityContextView>,
        "os" => os: Option<PodOsView<'a>>,
        "nodeSelector" => node_selector: Option<StrMap<'a>>,
        "affinity" => affinity: Option<AffinityView<'a>>,
        "volumes" [NAMED_ELEMENT_BYTES] => volumes: Option<Vec<VolumeView<'a>>>,
        "initContainers" [NAMED_ELEMENT_BYTES] => init_containers: Option<Vec<I>>,
        "containers" [NAMED_ELEMENT_BYTES] => containers: Option<Vec<ContainerView<'a>>>,
        "ephemeralContainers" [NAMED_ELEMENT_BYTES] => ephemeral_containers: Option<Vec<ContainerView<'a>>>,
    }
}

/// The pod spec as the rules read it.
pub type PodSpecView<'a> = PodSpecOf<'a, InitContainerView<'a>>;

view! {
    /// A Pod.
    pub struct PodOf<'a, I> expecting "Pod" {
        "kind" => kind: Option<Str<'a>>,
        "metadata" => metadata: Option<ObjectMetaView<'a>>,
        "spec" => spec: Option<PodSpecOf<'a, I>>,
    }
}

/// A Pod as the rules read it.
pub type PodView<'a> = PodOf<'a, InitContainerView<'a>>;

view! {
    /// A pod template: `spec.template` of a Job, or a template of a workload kind's object.
    pub struct PodTemplateOf<'a, I> expecting "PodTemplateSpec" {
        "metadata" => metadata: Option<ObjectMetaView<'a>>,
        "spec" => spec: Option<PodSpecOf<'a, I>>,
    }
}

view! {
    /// `spec` of a Job: only its pod template is read.
    pub struct JobSpecOf<'a, I> expecting "JobSpec" {
        "template" => template: Option<PodTemplateOf<'a, I>>,
    }
}

view! {
    /// A batch/v1 Job.
    pub struct JobOf<'a, I> expecting "Job" {
        "kind" => kind: Option<Str<'a>>,
        "metadata" => metadata: Option<ObjectMetaView<'a>>,
        "spec" => spec: Option<JobSpecOf<'a, I>>,
    }
}

/// A Job as the rules read it.
pub type JobView<'a> = JobOf<'a, InitContainerView<'a>>;

impl<'a> PodSpecView<'a> {
    pub fn init_containers(&self) -> &[InitContainerView<'a>] {
        self.init_containers.as_deref().unwrap_or_default()
    }

    pub fn containers(&self) -> &[ContainerView<'a>] {
        self.containers.as_deref().unwrap_or_default()
    }

    pub fn ephemeral_containers(&self) -> &[ContainerView<'a>] {
        self.ephemeral_containers.as_deref().unwrap_or_default()
    }

    pub fn volumes(&self) -> &[VolumeView<'a>] {
        self.volumes.as_deref().unwrap_or_default()
    }

    /// `affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution`.
    pub fn required_node_selector(&self) -> Option<&NodeSelectorView<'a>> {
        self.affinity
            .as_ref()?
            .node_affinity
            .as_ref()?
            .required
            .as_ref()
    }
}

/// Why the object could not be read: the path of the offending field (`.` for the object itself)
/// and serde_json's message without its position (which would point into the re-encoded object
/// the API server sent, which nobody sees).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodeFailure {
    pub path: String,
    pub message: String,
    /// The object was not decoded because its lists hold more elements than an object the API
    /// server stores can ([`metered`]); `path` names the list where they ran out.
    pub too_large: bool,
}

impl fmt::Display for DecodeFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// Decodes a Pod, within the bound of one object ([`metered`]). On the happy path one pass; on
/// failure a second pass, with path tracking, only to name the field (none when the bound
/// stopped it: its failure names the list).
pub fn decode_pod(text: &str) -> Result<PodView<'_>, DecodeFailure> {
    decode_as::<_, PodOf<'_, ContainerView<'_>>>(text)
}

/// Decodes a batch/v1 Job, as [`decode_pod`].
pub fn decode_job(text: &str) -> Result<JobView<'_>, DecodeFailure> {
    decode_as::<_, JobOf<'_, ContainerView<'_>>>(text)
}

/// Decodes a pod template (`metadata` and `spec`) of a workload kind's object, as
/// [`decode_pod`].
pub fn decode_pod_template(
    text: &str,
) -> Result<PodTemplateOf<'_, InitContainerView<'_>>, DecodeFailure> {
    decode_as::<_, PodTemplateOf<'_, ContainerView<'_>>>(text)
}

/// Decodes a bare pod spec of a workload kind's object, as [`decode_pod`].
pub fn decode_pod_spec(text: &str) -> Result<PodSpecView<'_>, DecodeFailure> {
    decode_as::<_, PodSpecOf<'_, ContainerView<'_>>>(text)
}

/// `text` decoded as `T` within the bound of one object; on failure, the failure named by
/// decoding it again as `P` (`T` with init containers as plain views) with path tracking.
fn decode_as<'a, T: Deserialize<'a>, P: Deserialize<'a>>(
    text: &'a str,
) -> Result<T, DecodeFailure> {
    // A text long enough to pass the bound (a pod is a few KiB; only hostile or doomed objects
    // are this long) is counted first, keeping nothing: past the bound it is refused without
    // its views ever being built.
    if text.len() >= SHORTEST_TOO_LARGE
        && let (_, Some(too_large)) = counted(|| serde_json::from_str::<T>(text))
    {
        return Err(too_large);
    }
    match metered(|| serde_json::from_str(text)) {
        (Ok(decoded), _) => Ok(decoded),
        (Err(_), Some(too_large)) => Err(too_large),
        (Err(_), None) => Err(failure::<P>(text)),
    }
}

/// Decodes `text` again as `T` (the same views, init containers without their raw text), tracking
/// the path, to say which field failed. Within the bound too: the first pass failed before it
/// was reached, and so does this one.
fn failure<'a, T: Deserialize<'a>>(text: &'a str) -> DecodeFailure {
    let mut de = serde_json::Deserializer::from_str(text);
    let (tracked, too_large) = metered(|| serde_path_to_error::deserialize::<_, T>(&mut de));
    if let Some(too_large) = too_large {
        return too_large;
    }
    let (path, inner) = match tracked {
        Err(e) => (e.path().to_string(), e.into_inner()),
        // The views decoded, so what failed was the end of the text.
        Ok(_) => match de.end() {
            Err(e) => (".".to_string(), e),
            Ok(()) => {
                return DecodeFailure {
                    path: ".".into(),
                    message: "cannot be decoded".into(),
                    too_large: false,
                };
            }
        },
    };
    let message = inner.to_string();
    let position = format!(" at line {} column {}", inner.line(), inner.column());
    DecodeFailure {
        path,
        message: message
            .strip_suffix(&position)
            .unwrap_or(&message)
            .to_string(),
        too_large: false,
    }
}

#[cfg(test)]
mod tests;
