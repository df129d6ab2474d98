//! JSON Patch (RFC 6902) construction against the raw object.
//!
//! The policy reads the object through typed views but never writes it back: it emits patch
//! operations for the fields it owns, so fields it does not know (newer Kubernetes versions) are
//! never touched. A [`FieldPath`] names a place once and renders both as a JSON pointer (for the
//! patch, with `~0`/`~1` escaping) and as the dotted path Kubernetes users read in messages
//! (`spec.containers[1].securityContext.runAsUser`).

use std::borrow::Cow;
use std::fmt;

use json_patch::jsonptr::{PointerBuf, Token};
use json_patch::{AddOperation, CopyOperation, PatchOperation, RemoveOperation, ReplaceOperation};
use serde_json::Value;

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

    pub(crate) fn key(&self, key: impl Into<Cow<'static, str>>) -> Self {
        let mut next = self.clone();
        next.0.push(Segment::Key(key.into()));
        next
    }

    pub(crate) fn index(&self, index: usize) -> Self {
        let mut next = self.clone();
        next.0.push(Segment::Index(index));
        next
    }

    /// Chains several keys: `path.keys(["securityContext", "runAsUser"])`.
    pub(crate) fn keys<const N: usize>(&self, keys: [&'static str; N]) -> Self {
        let mut next = self.clone();
        next.0
            .extend(keys.iter().map(|k| Segment::Key(Cow::Borrowed(*k))));
        next
    }

    pub(crate) fn pointer(&self) -> PointerBuf {
        PointerBuf::from_tokens(self.0.iter().map(|s| match s {
            Segment::Key(k) => Token::new(k.as_ref()),
            Segment::Index(i) => Token::from(*i),
        }))
    }

    /// The pointer of the array element appended at the end (`.../-`).
    fn append_pointer(&self) -> PointerBuf {
        let mut p = self.pointer();
        p.push_back("-");
        p
    }
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

/// An ordered list of patch operations. Operations apply in order, so callers emit in-place
/// edits before anything that shifts array indices (inserts at the front, removals).
#[derive(Debug, Default)]
pub(crate) struct PatchBuilder {
    ops: Vec<PatchOperation>,
}

impl PatchBuilder {
    /// Sets a member or inserts an array element (`add` replaces an existing member).
    pub(crate) fn add(&mut self, path: &FieldPath, value: Value) {
        self.ops.push(PatchOperation::Add(AddOperation {
            path: path.pointer(),
            value,
        }));
    }

    pub(crate) fn append(&mut self, array: &FieldPath, value: Value) {
        self.ops.push(PatchOperation::Add(AddOperation {
            path: array.append_pointer(),
            value,
        }));
    }

    pub(crate) fn replace(&mut self, path: &FieldPath, value: Value) {
        self.ops.push(PatchOperation::Replace(ReplaceOperation {
            path: path.pointer(),
            value,
        }));
    }

    /// Copies the value at `from` to the end of the array at `array` (keeps fields this code
    /// does not know, which a typed copy would drop).
    pub(crate) fn copy_to_end(&mut self, from: &FieldPath, array: &FieldPath) {
        self.ops.push(PatchOperation::Copy(CopyOperation {
            from: from.pointer(),
            path: array.append_pointer(),
        }));
    }

    pub(crate) fn remove(&mut self, path: &FieldPath) {
        self.ops.push(PatchOperation::Remove(RemoveOperation {
            path: path.pointer(),
        }));
    }

    /// Appends to an array that may not exist yet: creates it with one element when absent.
    pub(crate) fn push_to(&mut self, array: &FieldPath, exists: bool, value: Value) {
        if exists {
            self.append(array, value);
        } else {
            self.add(array, Value::Array(vec![value]));
        }
    }

    /// Sets `key` in the map at `map`, creating the map when absent.
    pub(crate) fn set_in_map(&mut self, map: &FieldPath, exists: bool, key: &str, value: Value) {
        let mut fields = serde_json::Map::new();
        fields.insert(key.to_string(), value);
        self.set_fields(map, exists, fields);
    }

    /// Sets each of `fields` in the object at `object`: one `add` per field when it exists, else
    /// one `add` of the whole object (so no operation needs a parent that is not there yet).
    pub(crate) fn set_fields(
        &mut self,
        object: &FieldPath,
        exists: bool,
        fields: serde_json::Map<String, Value>,
    ) {
        if fields.is_empty() {
            return;
        }
        if exists {
            for (k, v) in fields {
                self.add(&object.key(k), v);
            }
        } else {
            self.add(object, Value::Object(fields));
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.ops.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    pub(crate) fn into_patch(self) -> json_patch::Patch {
        json_patch::Patch(self.ops)
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
            p.pointer().as_str(),
            "/metadata/annotations/modelgate.io~1model-cache"
        );
        let tilde = FieldPath::root().key("a~b/c");
        assert_eq!(tilde.pointer().as_str(), "/a~0b~1c");
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
        json_patch::patch(&mut doc, &b.into_patch()).unwrap();
        assert_eq!(
            doc,
            json!({"metadata": {"annotations": {"x/y": "1"}},
                   "spec": {"volumes": [{"name": "a"}, {"name": "b"}], "initContainers": [{"name": "c"}]}})
        );
    }
}
