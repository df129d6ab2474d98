//! JSON Patch (RFC 6902) construction against the raw object.
//!
//! The policy reads the object through typed views but never writes it back: it emits patch
//! operations for the fields it owns, so fields it does not know (newer Kubernetes versions) are
//! never touched. A [`FieldPath`] names a place once and renders both as a JSON pointer (for the
//! patch, with `~0`/`~1` escaping) and as the dotted path Kubernetes users read in messages
//! (`spec.containers[1].securityContext.runAsUser`).

use std::borrow::Cow;
use std::fmt;

use serde::Serialize;

pub(crate) mod apply;

#[derive(Clone, Debug, PartialEq, Eq)]
enum Segment {
    Key(Cow<'static, str>),
    Index(usize),
}

/// A location inside the object under review.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct FieldPath(Vec<Segment>);

impl FieldPath {
    pub(crate) fn root() -> Self {
        FieldPath(Vec::new())
    }

    /// A copy with room for `more` segments, so that adding them does not grow it again.
    fn with_room(&self, more: usize) -> Self {
        let mut segments = Vec::with_capacity(self.0.len() + more);
        segments.extend(self.0.iter().cloned());
        FieldPath(segments)
    }

    pub(crate) fn key(&self, key: impl Into<Cow<'static, str>>) -> Self {
        let mut next = self.with_room(1);
        next.0.push(Segment::Key(key.into()));
        next
    }

    pub(crate) fn index(&self, index: usize) -> Self {
        let mut next = self.with_room(1);
        next.0.push(Segment::Index(index));
        next
    }

    /// Chains several keys: `path.keys(["securityContext", "runAsUser"])`.
    pub(crate) fn keys<const N: usize>(&self, keys: [&'static str; N]) -> Self {
        let mut next = self.with_room(N);
        next.0
            .extend(keys.iter().map(|k| Segment::Key(Cow::Borrowed(*k))));
        next
    }

    /// The JSON pointer (RFC 6901: `~` as `~0`, `/` as `~1`).
    pub(crate) fn pointer(&self) -> String {
        let mut out = String::new();
        self.write_pointer(&mut out);
        out
    }

    fn write_pointer(&self, out: &mut String) {
        use std::fmt::Write as _;
        for s in &self.0 {
            match s {
                Segment::Key(k) => push_pointer_key(out, k),
                Segment::Index(i @ 0..=9) => {
                    out.push('/');
                    out.push(char::from(b'0' + *i as u8));
                }
                Segment::Index(i) => {
                    let _ = write!(out, "/{i}");
                }
            }
        }
    }
}

/// Appends `/<key>` to a JSON pointer (RFC 6901: `~` as `~0`, `/` as `~1`).
fn push_pointer_key(out: &mut String, key: &str) {
    out.push('/');
    let mut rest = key;
    while let Some(i) = rest.find(['~', '/']) {
        out.push_str(&rest[..i]);
        out.push_str(if rest.as_bytes()[i] == b'~' {
            "~0"
        } else {
            "~1"
        });
        rest = &rest[i + 1..];
    }
    out.push_str(rest);
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, s) in self.0.iter().enumerate() {
            match s {
                Segment::Key(k) if i == 0 => write!(f, "{k}")?,
                Segment::Key(k) => write!(f, ".{k}")?,
                Segment::Index(n) => write!(f, "[{n}]")?,
            }
        }
        Ok(())
    }
}

/// What a byte of a key needs in a JSON pointer written as a JSON string: 0 nothing, 1 a
/// pointer escape (`~`, `/`), 2 a JSON escape (a control character, `"`, `\\`).
const KEY_BYTE: [u8; 256] = {
    let mut class = [0; 256];
    let mut b = 0;
    while b < 0x20 {
        class[b] = 2;
        b += 1;
    }
    class[b'"' as usize] = 2;
    class[b'\\' as usize] = 2;
    class[b'~' as usize] = 1;
    class[b'/' as usize] = 1;
    class
};

/// Appends `/<key>` with its pointer escapes, unless `key` needs a JSON escape (then appends
/// nothing of the key and returns false).
fn push_plain_key(out: &mut Vec<u8>, key: &str) -> bool {
    let bytes = key.as_bytes();
    match bytes
        .iter()
        .fold(0, |class, &b| class | KEY_BYTE[usize::from(b)])
    {
        0 => {
            out.push(b'/');
            out.extend_from_slice(bytes);
        }
        1 => {
            out.push(b'/');
            for &b in bytes {
                match b {
                    b'~' => out.extend_from_slice(b"~0"),
                    b'/' => out.extend_from_slice(b"~1"),
                    _ => out.push(b),
                }
            }
        }
        _ => return false,
    }
    true
}

/// Appends `n` in decimal.
fn push_decimal(out: &mut Vec<u8>, n: usize) {
    if n < 10 {
        out.push(b'0' + n as u8);
        return;
    }
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut rest = n;
    while rest > 0 {
        at -= 1;
        digits[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
    }
    out.extend_from_slice(&digits[at..]);
}

/// The largest patch an answer carries (before base64). What the patch adds is stored with the
/// object, and etcd takes at most 1.5 MiB in one request: a patch past 1 MiB makes an object
/// the API server cannot store, while the answer that carries it (the patch is linear in the
/// pod, but several times its size for many affinity terms or containers) would cost the
/// webhook's memory and bandwidth for nothing. A [`PatchBuilder`] stops writing once its patch
/// passes it, and such a pod is denied instead, saying why.
pub(crate) const MAX_PATCH_BYTES: usize = 1 << 20;

/// A JSON Patch document as text, and its number of operations.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Patch {
    json: Vec<u8>,
    len: usize,
    /// The builder passed [`MAX_PATCH_BYTES`] and stopped writing: `json` is then `[]`, and
    /// the patch is never sent nor applied.
    truncated: bool,
}

impl Patch {
    /// The document: a JSON array of operations (`[]` when [`Patch::is_truncated`]).
    pub fn as_bytes(&self) -> &[u8] {
        &self.json
    }

    /// The patch passed [`MAX_PATCH_BYTES`] and was not built further: the pod it was for is
    /// denied (or, where nothing is patched, judged as it came).
    pub fn is_truncated(&self) -> bool {
        self.truncated
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The operations, parsed; an error only if the builder wrote something that is not a JSON
    /// Patch (a bug), which the request path answers with its fallback instead of a panic.
    pub fn try_operations(&self) -> serde_json::Result<json_patch::Patch> {
        serde_json::from_slice(&self.json)
    }

    /// [`Patch::try_operations`] for tools and tests off the request path, where a bug may panic.
    pub fn operations(&self) -> json_patch::Patch {
        self.try_operations()
            .expect("PatchBuilder writes a valid JSON Patch")
    }
}

/// An ordered list of patch operations, written as JSON text as they are added (no
/// intermediate tree). Operations apply in order, so callers emit in-place edits before anything
/// that shifts array indices (inserts at the front, removals).
///
/// Bounded: once the text passes [`MAX_PATCH_BYTES`] the builder is truncated, and from then on
/// each operation is written and dropped at once (its count kept, so that callers that compare
/// counts see the same), so it never holds more than the bound and one operation.
#[derive(Debug, Default)]
pub(crate) struct PatchBuilder {
    /// `[` and the operations so far, comma-separated; `]` is added by [`PatchBuilder::into_patch`].
    json: Vec<u8>,
    len: usize,
    truncated: bool,
    /// A reusable buffer for rendering pointers.
    pointer: String,
}

/// Writes `value` as JSON into `out`: serialising into memory fails only for values that are
/// not JSON (a map with non-string keys), which no caller passes.
fn write_json(out: &mut Vec<u8>, value: &impl Serialize) {
    serde_json::to_writer(out, value).expect("patch values serialise to JSON");
}

impl PatchBuilder {
    /// Starts an operation: `{"op":<op>,"path":<pointer of path, with /- when appending>`.
    fn start(&mut self, op: &str, path: &FieldPath, append: bool) {
        self.start_at(op, path, if append { Some("-") } else { None });
    }

    /// Starts an operation on `member` of `path` (`-`: the end of an array), or on `path`.
    fn start_at(&mut self, op: &str, path: &FieldPath, member: Option<&str>) {
        if self.len == 0 {
            // Room for a typical patch (a model cache hit writes about 2 KB), grown in one step.
            self.json.reserve(2048);
        }
        self.json
            .extend_from_slice(if self.len == 0 { b"[" } else { b"," });
        self.len += 1;
        self.json.extend_from_slice(b"{\"op\":\"");
        self.json.extend_from_slice(op.as_bytes());
        self.json.extend_from_slice(b"\",\"path\":");
        self.write_pointer_to(path, member);
    }

    fn write_pointer(&mut self, path: &FieldPath, append: bool) {
        self.write_pointer_to(path, if append { Some("-") } else { None });
    }

    /// The pointer of `path`, then of `member` inside it (`-`: the end of an array), as a JSON
    /// string.
    fn write_pointer_to(&mut self, path: &FieldPath, member: Option<&str>) {
        // Keys that need no JSON escaping (all of them but odd annotation keys) are written
        // straight into the patch, with their pointer escapes.
        let start = self.json.len();
        let json = &mut self.json;
        json.push(b'"');
        let written = path.0.iter().all(|s| match s {
            Segment::Key(k) => push_plain_key(json, k),
            Segment::Index(i) => {
                json.push(b'/');
                push_decimal(json, *i);
                true
            }
        }) && member.is_none_or(|k| push_plain_key(json, k));
        if written {
            json.push(b'"');
            return;
        }
        json.truncate(start);
        self.pointer.clear();
        path.write_pointer(&mut self.pointer);
        if let Some(key) = member {
            push_pointer_key(&mut self.pointer, key);
        }
        write_json(&mut self.json, &self.pointer.as_str());
    }

    /// Ends an operation: past [`MAX_PATCH_BYTES`], the text is dropped and the builder
    /// truncated for good.
    fn end(&mut self) {
        self.json.push(b'}');
        if self.json.len() > MAX_PATCH_BYTES {
            self.truncated = true;
        }
        if self.truncated {
            // Kept at its capacity (about the bound): later operations are written into it
            // and dropped, without allocating again.
            self.json.clear();
        }
    }

    fn with_value(&mut self, op: &str, path: &FieldPath, append: bool, value: &impl Serialize) {
        self.start(op, path, append);
        self.json.extend_from_slice(b",\"value\":");
        write_json(&mut self.json, value);
        self.end();
    }

    /// Sets a member or inserts an array element (`add` replaces an existing member).
    pub(crate) fn add(&mut self, path: &FieldPath, value: impl Serialize) {
        self.with_value("add", path, false, &value);
    }

    /// Sets a member or inserts an array element to a value `write` writes as JSON text; when
    /// it writes none (returns false), the patch is left as it was and false returned.
    pub(crate) fn add_json(
        &mut self,
        path: &FieldPath,
        write: impl FnOnce(&mut Vec<u8>) -> bool,
    ) -> bool {
        let (json_len, len) = (self.json.len(), self.len);
        self.start("add", path, false);
        self.json.extend_from_slice(b",\"value\":");
        if !write(&mut self.json) {
            self.json.truncate(json_len);
            self.len = len;
            return false;
        }
        self.end();
        true
    }

    pub(crate) fn append(&mut self, array: &FieldPath, value: impl Serialize) {
        self.with_value("add", array, true, &value);
    }

    pub(crate) fn replace(&mut self, path: &FieldPath, value: impl Serialize) {
        self.with_value("replace", path, false, &value);
    }

    /// Copies the value at `from` to the end of the array at `array` (keeps fields this code
    /// does not know, which a typed copy would drop).
    pub(crate) fn copy_to_end(&mut self, from: &FieldPath, array: &FieldPath) {
        self.start("copy", array, true);
        self.json.extend_from_slice(b",\"from\":");
        self.write_pointer(from, false);
        self.end();
    }

    pub(crate) fn remove(&mut self, path: &FieldPath) {
        self.start("remove", path, false);
        self.end();
    }

    /// Appends to an array that may not exist yet: creates it with one element when absent.
    pub(crate) fn push_to(&mut self, array: &FieldPath, exists: bool, value: impl Serialize) {
        if exists {
            self.append(array, value);
        } else {
            self.add(array, [value]);
        }
    }

    /// Sets `key` in the map at `map`, creating the map when absent.
    pub(crate) fn set_in_map(
        &mut self,
        map: &FieldPath,
        exists: bool,
        key: &str,
        value: impl Serialize,
    ) {
        self.set_fields(map, exists, &[(key, value)]);
    }

    /// Sets each of `fields` in the object at `object`: one `add` per field when it exists, else
    /// one `add` of the whole object (so no operation needs a parent that is not there yet).
    pub(crate) fn set_fields<V: Serialize>(
        &mut self,
        object: &FieldPath,
        exists: bool,
        fields: &[(&str, V)],
    ) {
        if fields.is_empty() {
            return;
        }
        if exists {
            for (k, v) in fields {
                // `<object>/<k>`, without building that path.
                self.start_at("add", object, Some(k));
                self.json.extend_from_slice(b",\"value\":");
                write_json(&mut self.json, v);
                self.end();
            }
        } else {
            self.add(object, Fields(fields));
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub(crate) fn into_patch(mut self) -> Patch {
        if self.truncated {
            return Patch {
                json: b"[]".to_vec(),
                len: self.len,
                truncated: true,
            };
        }
        if self.len == 0 {
            self.json.push(b'[');
        }
        self.json.push(b']');
        Patch {
            json: self.json,
            len: self.len,
            truncated: false,
        }
    }
}

/// A JSON object of the given members, in their order.
pub(crate) struct Fields<'a, V>(pub &'a [(&'a str, V)]);

impl<V: Serialize> Serialize for Fields<'_, V> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in self.0 {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn pointer_escapes_annotation_keys() {
        let p = FieldPath::root()
            .keys(["metadata", "annotations"])
            .key("modelgate.io/model-cache");
        assert_eq!(
            p.pointer(),
            "/metadata/annotations/modelgate.io~1model-cache"
        );
        let tilde = FieldPath::root().key("a~b/c");
        assert_eq!(tilde.pointer(), "/a~0b~1c");
    }

    #[test]
    fn display_reads_like_kubectl_field_paths() {
        let p = FieldPath::root()
            .keys(["spec", "template", "spec", "containers"])
            .index(1)
            .keys(["securityContext", "runAsUser"]);
        assert_eq!(
            p.to_string(),
            "spec.template.spec.containers[1].securityContext.runAsUser"
        );
    }

    #[test]
    fn builder_ops_apply_in_order() {
        let mut doc = json!({"metadata": {}, "spec": {"volumes": [{"name": "a"}]}});
        let mut b = PatchBuilder::default();
        let meta = FieldPath::root().key("metadata");
        b.set_in_map(&meta.key("annotations"), false, "x/y", json!("1"));
        b.push_to(
            &FieldPath::root().keys(["spec", "volumes"]),
            true,
            json!({"name": "b"}),
        );
        b.push_to(
            &FieldPath::root().keys(["spec", "initContainers"]),
            false,
            json!({"name": "c"}),
        );
        let patch = b.into_patch();
        assert_eq!(patch.len(), 3);
        json_patch::patch(&mut doc, &patch.operations()).unwrap();
        assert_eq!(
            doc,
            json!({"metadata": {"annotations": {"x/y": "1"}},
                   "spec": {"volumes": [{"name": "a"}, {"name": "b"}], "initContainers": [{"name": "c"}]}})
        );
    }

    #[test]
    fn pointers_copied_straight_match_the_escaped_ones() {
        let paths = [
            FieldPath::root().keys(["spec", "containers"]).index(12),
            FieldPath::root()
                .key("a")
                .index(0)
                .index(9)
                .index(10)
                .index(12345),
            FieldPath::root()
                .keys(["metadata", "annotations"])
                .key("é x\u{7f}"),
            FieldPath::root(),
        ];
        for path in paths {
            let mut b = PatchBuilder::default();
            b.remove(&path);
            b.copy_to_end(&path, &path);
            let patch = b.into_patch();
            let pointer = path.pointer();
            let expected = json!([
                {"op": "remove", "path": pointer},
                {"op": "copy", "path": format!("{pointer}/-"), "from": pointer}
            ]);
            let text: serde_json::Value = serde_json::from_slice(patch.as_bytes()).unwrap();
            assert_eq!(text, expected);
            let mut slow = String::new();
            path.write_pointer(&mut slow);
            let written = format!(
                "[{{\"op\":\"remove\",\"path\":{}}}",
                serde_json::to_string(&slow).unwrap()
            );
            assert!(String::from_utf8_lossy(patch.as_bytes()).starts_with(&written));
        }
    }

    #[test]
    fn the_patch_is_written_as_json_text_with_escaped_pointers() {
        let mut b = PatchBuilder::default();
        assert!(b.is_empty());
        let odd = FieldPath::root()
            .keys(["metadata", "annotations"])
            .key("a/\"b~\n");
        b.add(&odd, "v\u{1}");
        b.remove(&FieldPath::root().keys(["spec", "volumes"]).index(3));
        b.copy_to_end(
            &FieldPath::root().keys(["spec", "terms"]).index(0),
            &FieldPath::root().keys(["spec", "terms"]),
        );
        b.replace(&FieldPath::root().key("x"), json!({"k": [1, null]}));
        b.set_fields(&FieldPath::root().key("sc"), false, &[("a", 1), ("b", 2)]);
        let patch = b.into_patch();
        assert_eq!(patch.len(), 5);
        let text: serde_json::Value = serde_json::from_slice(patch.as_bytes()).unwrap();
        assert_eq!(
            text,
            json!([
                {"op": "add", "path": "/metadata/annotations/a~1\"b~0\n", "value": "v\u{1}"},
                {"op": "remove", "path": "/spec/volumes/3"},
                {"op": "copy", "from": "/spec/terms/0", "path": "/spec/terms/-"},
                {"op": "replace", "path": "/x", "value": {"k": [1, null]}},
                {"op": "add", "path": "/sc", "value": {"a": 1, "b": 2}}
            ])
        );
        assert_eq!(patch.operations().0.len(), 5);
        assert_eq!(PatchBuilder::default().into_patch().as_bytes(), b"[]");
    }

    #[test]
    fn a_patch_that_does_not_parse_is_an_error_not_a_panic() {
        let broken = Patch {
            json: b"[{\"op\":\"add\"".to_vec(),
            len: 1,
            truncated: false,
        };
        assert!(broken.try_operations().is_err());
    }
}
