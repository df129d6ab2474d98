//! A JSON Patch (RFC 6902) applied to an object's text without decoding the object into a tree.
//!
//! `/validate` judges a controller's template (and, in `warn` and `audit`, a Pod or Job) as the
//! mutation would leave it, so it applies the mutation's patch to the text it came as. A
//! `serde_json::Value` of the whole object costs about 40 times its text (a map of one member is a
//! B-tree node of 600 bytes), and that was most of what a hostile body made a decision hold.
//! Here only the objects and arrays on an operation's path are opened, one level at a time, their
//! members kept as the text they came as (a borrowed slice each); everything else stays text and
//! is written back as it was. Memory is then the text, the patch, and a few dozen bytes per member
//! of what the patch touches.
//!
//! The result is what `json_patch::patch` on a `serde_json::Value` gives (the tests compare them),
//! but for what a `Value` changes without being asked: untouched numbers keep their digits, and
//! untouched objects their member order and repeated keys (whose last value counts, for the views
//! as for `Value`).

use std::borrow::Cow;
use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

use super::Patch;

/// One value of the document being patched.
#[derive(Clone, Debug)]
enum Node<'a> {
    /// Not opened: the text it came as, from the object or the patch.
    Text(&'a RawValue),
    /// An object, its members sorted by key, each key once (its last value).
    Object(Vec<(Cow<'a, str>, Node<'a>)>),
    Array(Vec<Node<'a>>),
}

/// One operation of the patch, its value kept as text.
#[derive(Deserialize)]
struct Operation<'p> {
    #[serde(borrow)]
    op: Cow<'p, str>,
    #[serde(borrow)]
    path: Cow<'p, str>,
    #[serde(borrow, default)]
    from: Option<Cow<'p, str>>,
    #[serde(borrow, default, deserialize_with = "present")]
    value: Option<&'p RawValue>,
}

/// A member that is there, `null` included (which `Option` alone would read as absent).
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

/// `text`, a JSON value found at the pointer `prefix` of the object the patch was made for (`""`
/// for the object itself), with `patch` applied: every operation must name a path under
/// `prefix`. `None` when an operation does not apply (a path that is not there, outside `prefix`,
/// an index out of range, a failed `test`), as `json_patch` refuses it, or when `patch` was
/// truncated.
pub(crate) fn apply(text: &str, patch: &Patch, prefix: &str) -> Option<String> {
    if patch.is_truncated() {
        return None;
    }
    let operations: Vec<Operation> = serde_json::from_slice(patch.as_bytes()).ok()?;
    let mut root = Node::Text(serde_json::from_str(text).ok()?);
    let mut i = 0;
    while i < operations.len() {
        let op = &operations[i];
        let path = tokens(op.path.strip_prefix(prefix)?)?;
        if op.op == "remove"
            && let Some(run) = removals(&operations[i..], prefix, &path)
        {
            remove_run(&mut root, &path[..path.len() - 1], &run)?;
            i += run.len();
            continue;
        }
        match &*op.op {
            "add" => add(&mut root, &path, Node::Text(op.value?))?,
            "remove" => {
                remove(&mut root, &path)?;
            }
            "replace" => {
                *get_mut(&mut root, &path)? = Node::Text(op.value?);
            }
            "move" => {
                let from = tokens(op.from.as_deref()?.strip_prefix(prefix)?)?;
                if from == path {
                    // Nothing moves, but the value must be there, and be one that can be
                    // taken out (not the document itself).
                    if from.is_empty() {
                        return None;
                    }
                    get_mut(&mut root, &from)?;
                } else {
                    // A value cannot move into itself.
                    if path.len() > from.len() && path[..from.len()] == from[..] {
                        return None;
                    }
                    let value = remove(&mut root, &from)?;
                    add(&mut root, &path, value)?;
                }
            }
            "copy" => {
                let from = tokens(op.from.as_deref()?.strip_prefix(prefix)?)?;
                let value = get_mut(&mut root, &from)?.clone();
                add(&mut root, &path, value)?;
            }
            "test" => {
                let found = get_mut(&mut root, &path)?;
                let (mut found_text, mut expected) = (Vec::new(), Vec::new());
                write(found, &mut found_text);
                write(&Node::Text(op.value?), &mut expected);
                let parse = |t: &[u8]| serde_json::from_slice::<serde_json::Value>(t).ok();
                if parse(&found_text)? != parse(&expected)? {
                    return None;
                }
            }
            _ => return None,
        }
        i += 1;
    }
    let mut out = Vec::with_capacity(text.len() + patch.as_bytes().len());
    write(&root, &mut out);
    String::from_utf8(out).ok()
}

/// The reference tokens of a JSON pointer (RFC 6901), unescaped; `None` when it is not one.
fn tokens(pointer: &str) -> Option<Vec<Cow<'_, str>>> {
    if pointer.is_empty() {
        return Some(Vec::new());
    }
    let rest = pointer.strip_prefix('/')?;
    rest.split('/')
        .map(|t| {
            if !t.contains('~') {
                return Some(Cow::Borrowed(t));
            }
            let mut out = String::with_capacity(t.len());
            let mut chars = t.chars();
            while let Some(c) = chars.next() {
                match c {
                    '~' => match chars.next()? {
                        '0' => out.push('~'),
                        '1' => out.push('/'),
                        _ => return None,
                    },
                    c => out.push(c),
                }
            }
            Some(Cow::Owned(out))
        })
        .collect()
}

/// An array index token: digits without a leading zero (`-` is handled by `add`).
fn index(token: &str) -> Option<usize> {
    let digits = token.bytes().all(|b| b.is_ascii_digit());
    if token.is_empty() || !digits || (token.len() > 1 && token.starts_with('0')) {
        return None;
    }
    token.parse().ok()
}

/// Opens a node that is still text into an object or an array (a scalar cannot be opened).
fn open<'a>(node: &mut Node<'a>) -> Option<()> {
    let Node::Text(raw) = *node else {
        return Some(());
    };
    *node = serde_json::from_str::<Opened>(raw.get()).ok()?.0?;
    Some(())
}

/// The node at `path`, opening what lies on the way.
fn get_mut<'n, 'a>(mut node: &'n mut Node<'a>, path: &[Cow<'_, str>]) -> Option<&'n mut Node<'a>> {
    for token in path {
        open(node)?;
        node = match node {
            Node::Object(members) => {
                let at = members
                    .binary_search_by(|(k, _)| k.as_ref().cmp(token))
                    .ok()?;
                &mut members[at].1
            }
            Node::Array(elements) => elements.get_mut(index(token)?)?,
            Node::Text(_) => return None,
        };
    }
    Some(node)
}

/// `add`: sets a member (replacing it) or inserts an element (`-`: at the end).
fn add<'a>(root: &mut Node<'a>, path: &[Cow<'_, str>], value: Node<'a>) -> Option<()> {
    let Some((last, parent)) = path.split_last() else {
        *root = value;
        return Some(());
    };
    let parent = get_mut(root, parent)?;
    open(parent)?;
    match parent {
        Node::Object(members) => match members.binary_search_by(|(k, _)| k.as_ref().cmp(last)) {
            Ok(at) => members[at].1 = value,
            Err(at) => members.insert(at, (Cow::Owned(last.to_string()), value)),
        },
        Node::Array(elements) if last == "-" => elements.push(value),
        Node::Array(elements) => {
            let at = index(last)?;
            if at > elements.len() {
                return None;
            }
            elements.insert(at, value);
        }
        Node::Text(_) => return None,
    }
    Some(())
}

/// `remove`: the member or element at `path`, taken out.
fn remove<'a>(root: &mut Node<'a>, path: &[Cow<'_, str>]) -> Option<Node<'a>> {
    let (last, parent) = path.split_last()?;
    let parent = get_mut(root, parent)?;
    open(parent)?;
    match parent {
        Node::Object(members) => {
            let at = members
                .binary_search_by(|(k, _)| k.as_ref().cmp(last))
                .ok()?;
            Some(members.remove(at).1)
        }
        Node::Array(elements) => {
            let at = index(last)?;
            (at < elements.len()).then(|| elements.remove(at))
        }
        Node::Text(_) => None,
    }
}

/// The indices of the `remove` operations that start `operations` and take elements out of the
/// one array `path` is in, each below the one before (how the policy removes stale mounts and
/// volumes): applied in one pass instead of shifting the array once per operation. `None` when
/// there are fewer than two.
fn removals(operations: &[Operation], prefix: &str, path: &[Cow<'_, str>]) -> Option<Vec<usize>> {
    let (last, parent) = path.split_last()?;
    let mut run = vec![index(last)?];
    for op in &operations[1..] {
        if op.op != "remove" {
            break;
        }
        let Some(next) = op.path.strip_prefix(prefix).and_then(tokens) else {
            break;
        };
        match next.split_last() {
            Some((i, p)) if p == parent => match index(i) {
                Some(i) if i < run[run.len() - 1] => run.push(i),
                _ => break,
            },
            _ => break,
        }
    }
    (run.len() > 1).then_some(run)
}

/// Removes the elements at `run` (descending indices) of the array at `parent`.
fn remove_run(root: &mut Node<'_>, parent: &[Cow<'_, str>], run: &[usize]) -> Option<()> {
    let parent = get_mut(root, parent)?;
    open(parent)?;
    let Node::Array(elements) = parent else {
        return None;
    };
    if run[0] >= elements.len() {
        return None;
    }
    // Ascending, to walk along with the elements.
    let mut doomed = run.iter().rev().copied().peekable();
    let mut at = 0;
    elements.retain(|_| {
        let drop = doomed.peek() == Some(&at);
        if drop {
            doomed.next();
        }
        at += 1;
        !drop
    });
    Some(())
}

/// Writes `node` as JSON text.
fn write(node: &Node, out: &mut Vec<u8>) {
    match node {
        Node::Text(raw) => out.extend_from_slice(raw.get().as_bytes()),
        Node::Object(members) => {
            out.push(b'{');
            for (i, (key, value)) in members.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                // Writing a string into memory cannot fail.
                let _ = serde_json::to_writer(&mut *out, key.as_ref());
                out.push(b':');
                write(value, out);
            }
            out.push(b'}');
        }
        Node::Array(elements) => {
            out.push(b'[');
            for (i, element) in elements.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write(element, out);
            }
            out.push(b']');
        }
    }
}

/// One level of a value's text: an object's members or an array's elements, as text each;
/// `None` for a scalar.
struct Opened<'a>(Option<Node<'a>>);

impl<'de> Deserialize<'de> for Opened<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(OpenVisitor).map(Opened)
    }
}

struct OpenVisitor;

impl<'de> Visitor<'de> for OpenVisitor {
    type Value = Option<Node<'de>>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut members = Vec::new();
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            members.push((key, Node::Text(map.next_value()?)));
        }
        // As `Value` reads it: a key given twice keeps its last value.
        crate::keyed::sort_keeping_last(&mut members);
        Ok(Some(Node::Object(members)))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut elements = Vec::new();
        while let Some(element) = seq.next_element()? {
            elements.push(Node::Text(element));
        }
        Ok(Some(Node::Array(elements)))
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
}

#[cfg(test)]
mod tests;
