//! Reading Kubernetes objects from files as kubectl reads them (docs/policy.md §8): YAML whose scalars
//! resolve as sigs.k8s.io/yaml resolves them (go-yaml v2, YAML 1.1: `0440` is the octal 288,
//! `yes`/`on` are `true`), JSON, several documents per file (a YAML stream whose documents are
//! written as JSON is still YAML), `List`s flattened. Used by `review` and `audit` for their
//! inputs and by `--caches` for cache objects.
//!
//! Each document remembers where it came from, so that a problem found later (a field of the
//! wrong type, a denied uid) can be reported at the user's file and line: [`Document::line_of`].

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};
use serde_saphyr::Spanned;

/// One object read from an input, with where it came from for error messages.
#[derive(Debug, Clone)]
pub struct Document {
    /// `file` for a single document, `file#N` (1-based) when the file holds several,
    /// `…items[J]` for an item of a List.
    pub origin: String,
    pub value: Value,
    source: Arc<Source>,
    /// The item of a List document this object is.
    list_item: Option<usize>,
}

/// Where one document is in its file, kept to find lines again when an error needs them.
#[derive(Debug)]
struct Source {
    file: Arc<str>,
    /// The whole file, shared by its documents.
    text: Arc<str>,
    /// The document's bytes in `text`.
    range: Range<usize>,
    /// The file line the document's text starts on (1-based).
    first_line: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum DocumentError {
    #[error("{origin}: not valid JSON: {error}")]
    Json {
        origin: String,
        error: serde_json::Error,
    },
    #[error("{origin}: not valid YAML: {message}")]
    Yaml { origin: String, message: String },
    #[error("{origin}: document {index} is not an object")]
    NotAnObject { origin: String, index: usize },
    #[error("{origin}: document {index} is a List whose `items` is not an array")]
    BadList { origin: String, index: usize },
    #[error(
        "{origin}: document {index} is a List whose items[{item}] is not an object (found {found})"
    )]
    ListItemNotAnObject {
        origin: String,
        index: usize,
        item: usize,
        found: &'static str,
    },
}

/// The text of an input's bytes as kubectl reads a file (cli-runtime's `BOMOverride`): a UTF-8
/// byte order mark is dropped, and bytes that begin with a UTF-16 one (little or big endian, as
/// Windows tools write) are decoded from UTF-16; anything else must be UTF-8. The error says
/// which encoding failed.
pub fn decode_text(bytes: Vec<u8>) -> Result<String, String> {
    let utf16 = |rest: &[u8], unit: fn([u8; 2]) -> u16| {
        if !rest.len().is_multiple_of(2) {
            return Err("UTF-16 (by its byte order mark) but of an odd length".to_string());
        }
        let units: Vec<u16> = rest
            .chunks_exact(2)
            .map(|pair| unit([pair[0], pair[1]]))
            .collect();
        String::from_utf16(&units).map_err(|e| format!("not valid UTF-16: {e}"))
    };
    let mut bytes = bytes;
    match bytes.as_slice() {
        [0xFF, 0xFE, rest @ ..] => return utf16(rest, u16::from_le_bytes),
        [0xFE, 0xFF, rest @ ..] => return utf16(rest, u16::from_be_bytes),
        // Dropped in place: the file is not copied.
        [0xEF, 0xBB, 0xBF, ..] => drop(bytes.drain(..3)),
        _ => {}
    }
    String::from_utf8(bytes).map_err(|e| format!("not valid UTF-8: {e}"))
}

/// Parses `text` (named `origin` in errors) into its objects, in order. Empty documents are
/// skipped; a `List` (kind `List` or any `*List` with an `items` array) yields its items.
pub fn read_documents(origin: &str, text: &str) -> Result<Vec<Document>, DocumentError> {
    let mut out = Vec::new();
    for_each_document(origin, text, None, |d| {
        out.push(d);
        Ok::<_, DocumentError>(())
    })?;
    Ok(out)
}

/// [`read_documents`] one document at a time: each object is handed to `f` as soon as its
/// document is parsed, so a large stream is never held whole (`audit` evaluates and drops each
/// one). With `only_containing`, a document whose text lacks that string is skipped without
/// being parsed (`audit` finds the Namespaces of a stream this way before its workloads).
pub fn for_each_document<E: From<DocumentError>>(
    origin: &str,
    text: &str,
    only_containing: Option<&str>,
    mut f: impl FnMut(Document) -> Result<(), E>,
) -> Result<(), E> {
    let text = text.trim_start_matches('\u{feff}');
    // One copy of the file, shared by every document's source.
    let file: Arc<str> = Arc::from(text);
    let name: Arc<str> = Arc::from(origin);
    let wanted =
        |range: &Range<usize>| only_containing.is_none_or(|s| text[range.clone()].contains(s));
    let source = |range: Range<usize>, first_line: usize| Source {
        file: name.clone(),
        text: file.clone(),
        range,
        first_line,
    };
    // Document `i` (0-based) of the stream, handed to `f` unless it is empty.
    let mut hand_over = |several: bool, i: usize, value: Value, range, first_line| {
        if value.is_null() {
            return Ok(());
        }
        emit(
            origin,
            several,
            i + 1,
            value,
            source(range, first_line),
            &mut f,
        )
    };
    let mut json_error = None;
    let trimmed = text.trim_start();
    if trimmed.starts_with('{') || trimmed.starts_with('[') {
        match read_json_stream(origin, text) {
            Ok(docs) => {
                let several = docs.len() > 1;
                for (i, (value, first_line, range)) in docs.into_iter().enumerate() {
                    if wanted(&range) {
                        hand_over(several, i, value, range, first_line)?;
                    }
                }
                return Ok(());
            }
            // Not a JSON stream: a YAML stream whose documents are written as JSON (or in flow
            // style) is read as YAML; when that fails too, the error that fits the file is given.
            Err(e) => json_error = Some(e),
        }
    }
    let docs = split_yaml(text);
    let several = docs.len() > 1;
    // The YAML is parsed on a thread of its own with a stack for [`MAX_DEPTH`] levels of
    // recursion whatever the caller's thread has (a test thread or a runtime worker has 2 MiB;
    // an unoptimised build spends several KiB a level), handing each document over as it is
    // read, so that a large stream is still never held whole.
    std::thread::scope(|scope| {
        let (parsed_tx, parsed) = std::sync::mpsc::sync_channel(4);
        let parser = std::thread::Builder::new()
            .name("yaml-reader".into())
            .stack_size(PARSER_STACK_BYTES)
            .spawn_scoped(scope, move || {
                for (i, (first_line, range)) in docs.into_iter().enumerate() {
                    if !wanted(&range) {
                        continue;
                    }
                    let value = read_yaml(&text[range.clone()]);
                    if parsed_tx.send((i, first_line, range, value)).is_err() {
                        break; // The caller stopped at an error of its own.
                    }
                }
            });
        if let Err(e) = parser {
            return Err(DocumentError::Yaml {
                origin: origin.to_string(),
                message: format!("cannot start the YAML reader: {e}"),
            }
            .into());
        }
        for (i, first_line, range, value) in parsed {
            let value = match value {
                Ok(v) => v,
                Err(e) => {
                    return Err(match json_error {
                        Some(json) if !has_document_marker(text) => json,
                        _ => yaml_error(origin, i + 1, first_line, &e),
                    }
                    .into());
                }
            };
            hand_over(several, i, value, range, first_line)?;
        }
        Ok(())
    })
}

/// The YAML reader's stack: [`MAX_DEPTH`] levels of an unoptimised build with room to spare
/// (address space; only what a document's depth touches is ever mapped).
const PARSER_STACK_BYTES: usize = 64 << 20;

/// Hands one document's objects to `f`: the object, or the items of a List.
fn emit<E: From<DocumentError>>(
    origin: &str,
    several: bool,
    index: usize,
    value: Value,
    source: Source,
    f: &mut impl FnMut(Document) -> Result<(), E>,
) -> Result<(), E> {
    let doc_origin = if several {
        format!("{origin}#{index}")
    } else {
        origin.to_string()
    };
    let Value::Object(mut map) = value else {
        return Err(DocumentError::NotAnObject {
            origin: origin.to_string(),
            index,
        }
        .into());
    };
    let source = Arc::new(source);
    let is_list = map
        .get("kind")
        .and_then(Value::as_str)
        .is_some_and(|k| k == "List" || (k.ends_with("List") && map.contains_key("items")));
    if !is_list {
        return f(Document {
            origin: doc_origin,
            value: Value::Object(map),
            source,
            list_item: None,
        });
    }
    // Items are moved out, not copied: a list of 100 000 caches is large.
    let Some(Value::Array(items)) = map.remove("items") else {
        return Err(DocumentError::BadList {
            origin: origin.to_string(),
            index,
        }
        .into());
    };
    for (j, item) in items.into_iter().enumerate() {
        // kubectl refuses such a List too; passing it on would hand callers a non-object.
        if !item.is_object() {
            return Err(DocumentError::ListItemNotAnObject {
                origin: origin.to_string(),
                index,
                item: j,
                found: json_type(&item),
            }
            .into());
        }
        f(Document {
            origin: format!("{doc_origin}.items[{j}]"),
            value: item,
            source: source.clone(),
            list_item: Some(j),
        })?;
    }
    Ok(())
}

/// The documents of a JSON stream, each with the file line it starts on and its bytes.
fn read_json_stream(
    origin: &str,
    text: &str,
) -> Result<Vec<(Value, usize, Range<usize>)>, DocumentError> {
    let mut stream = serde_json::Deserializer::from_str(text).into_iter::<Value>();
    let mut docs = Vec::new();
    let mut start = 0;
    while let Some(next) = stream.next() {
        let value = next.map_err(|error| DocumentError::Json {
            origin: origin.to_string(),
            error,
        })?;
        let end = stream.byte_offset();
        let skipped = text[start..end].len() - text[start..end].trim_start().len();
        let doc_start = start + skipped;
        let first_line = 1 + text[..doc_start].matches('\n').count();
        docs.push((value, first_line, doc_start..end));
        start = end;
    }
    Ok(docs)
}

/// A YAML error of document `index`, at the file's line (the parser counts lines from the
/// document's start).
fn yaml_error(
    origin: &str,
    index: usize,
    first_line: usize,
    e: &serde_saphyr::Error,
) -> DocumentError {
    let text = one_line(&e.without_snippet().to_string());
    let message = match e.location() {
        Some(at) if at.line() > 0 => {
            let what = text
                .rfind(" at line ")
                .map_or(text.as_str(), |i| &text[..i]);
            let line = first_line + at.line() as usize - 1;
            format!("line {line}, column {}: {what}", at.column())
        }
        _ => text,
    };
    DocumentError::Yaml {
        origin: format!("{origin}#{index}"),
        message,
    }
}

/// The parser's settings for reading a document of `len` bytes as kubectl does: YAML 1.1 octal
/// integers (`0440`), the last of duplicate keys wins (go-yaml v2 overwrites), and `.inf`/`.nan`
/// refused (JSON cannot hold them; kubectl refuses them too). YAML 1.1 booleans (`yes`, `on`,
/// `y`, …) are the parser's default.
///
/// The budget grows with the document instead of capping it: kubectl reads a `List` of every
/// pod of a cluster (`kubectl get pods -A -o yaml`, millions of nodes), so a fixed node count
/// would refuse real input. What it still stops is amplification, work out of proportion to
/// the bytes: a node takes at least two bytes of text (`[1,1]`), an event (a node's start or
/// end) at least one, so more of either than that can only come from aliases, whose own limits
/// (count, expansion per anchor, retained events) are the parser's defaults. Nesting is
/// allowed to [`MAX_DEPTH`].
fn kubectl_options(len: usize) -> serde_saphyr::Options {
    let defaults = serde_saphyr::Budget::default();
    serde_saphyr::options! {
        legacy_octal_numbers: true,
        duplicate_keys: serde_saphyr::DuplicateKeyPolicy::LastWins,
        non_finite_float_policy: serde_saphyr::NonFiniteFloatPolicy::Reject,
        budget: serde_saphyr::budget! {
            max_nodes: defaults.max_nodes.max(len / 2 + 1),
            max_events: defaults.max_events.max(2 * len + 2),
            max_total_scalar_bytes: defaults.max_total_scalar_bytes.max(len),
            max_depth: MAX_DEPTH,
        },
    }
}

/// The deepest nesting read: serde_json's limit of 128, which every later step shares (the
/// admission decode, `-o patched`), less the levels of the AdmissionReview a document is
/// wrapped in, so that a document read here is never refused after. Far beyond any
/// Kubernetes object (a CRD's OpenAPI schema, the deepest real objects, stays under 40 levels);
/// kubectl itself stops at 10 000 (go-yaml and encoding/json).
const MAX_DEPTH: usize = 120;

/// One YAML document as kubectl reads it.
fn read_yaml(doc: &str) -> Result<Value, serde_saphyr::Error> {
    let value: Option<KubectlValue> =
        serde_saphyr::from_str_with_options(doc, kubectl_options(doc.len()))?;
    Ok(value.map_or(Value::Null, |v| v.0))
}

/// A YAML node converted to the JSON kubectl sends (sigs.k8s.io/yaml's `YAMLToJSON`).
struct KubectlValue(Value);

impl<'de> Deserialize<'de> for KubectlValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(KubectlVisitor).map(KubectlValue)
    }
}

struct KubectlVisitor;

impl<'de> Visitor<'de> for KubectlVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a YAML value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(v.into())
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(v.into())
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        json_number(v).map(Value::Number).ok_or_else(|| {
            E::custom(format!(
                "{v} cannot be written as JSON (kubectl refuses it too)"
            ))
        })
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        while let Some(KubectlValue(v)) = seq.next_element()? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(KubectlKey(k)) = map.next_key()? {
            let KubectlValue(v) = map.next_value()?;
            out.insert(k, v);
        }
        Ok(Value::Object(out))
    }
}

/// A float as kubectl writes it into JSON: Go's encoder writes an integral value below 1e21
/// without a fraction (`1.0` → `1`), which the API server then reads as an integer.
fn json_number(v: f64) -> Option<Number> {
    // 2^63 and 2^64, exactly representable as f64.
    const I64_END: f64 = 9_223_372_036_854_775_808.0;
    const U64_END: f64 = 18_446_744_073_709_551_616.0;
    if v.fract() == 0.0 && v.abs() < 1e21 {
        if (-I64_END..I64_END).contains(&v) {
            return Some((v as i64).into());
        }
        if (0.0..U64_END).contains(&v) {
            return Some((v as u64).into());
        }
    }
    Number::from_f64(v)
}

/// A mapping key as sigs.k8s.io/yaml turns it into a JSON key: strings as written, integers in
/// decimal (`0x10:` is `"16"`), booleans as `true`/`false` (`on:` is `"true"`), floats as Go's
/// `FormatFloat(f, 'g', -1, 32)`; any other key is refused.
struct KubectlKey(String);

impl<'de> Deserialize<'de> for KubectlKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(KeyVisitor).map(KubectlKey)
    }
}

struct KeyVisitor;

impl<'de> Visitor<'de> for KeyVisitor {
    type Value = String;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string, number or boolean mapping key")
    }
    fn visit_bool<E>(self, v: bool) -> Result<String, E> {
        Ok(v.to_string())
    }
    fn visit_i64<E>(self, v: i64) -> Result<String, E> {
        Ok(v.to_string())
    }
    fn visit_u64<E>(self, v: u64) -> Result<String, E> {
        Ok(v.to_string())
    }
    fn visit_f64<E>(self, v: f64) -> Result<String, E> {
        Ok(go_format_float32(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<String, E> {
        Ok(v.to_string())
    }
    fn visit_string<E>(self, v: String) -> Result<String, E> {
        Ok(v)
    }
    fn visit_unit<E: de::Error>(self) -> Result<String, E> {
        Err(E::custom("a null mapping key cannot be a JSON key"))
    }
    fn visit_none<E: de::Error>(self) -> Result<String, E> {
        self.visit_unit()
    }
}

/// Go's `strconv.FormatFloat(v, 'g', -1, 32)`: the shortest digits that identify the float32,
/// in `%e` form when the exponent is below -4 or at least 6 (`1e+06`), else in `%f` form.
fn go_format_float32(v: f64) -> String {
    let f = v as f32;
    if f.is_nan() {
        return ".nan".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { ".inf" } else { "-.inf" }.into();
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0" } else { "0" }.into();
    }
    let sci = format!("{:e}", f.abs()); // shortest digits: "1.5e6", "2e-5"
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let sign = if f < 0.0 { "-" } else { "" };
    if !(-4..6).contains(&exp) {
        let rest = if digits.len() > 1 {
            format!(".{}", &digits[1..])
        } else {
            String::new()
        };
        let exp_sign = if exp < 0 { '-' } else { '+' };
        return format!("{sign}{}{rest}e{exp_sign}{:02}", &digits[..1], exp.abs());
    }
    if exp < 0 {
        let zeros = "0".repeat((-exp - 1) as usize);
        return format!("{sign}0.{zeros}{digits}");
    }
    let whole = exp as usize + 1;
    if digits.len() <= whole {
        format!("{sign}{digits}{}", "0".repeat(whole - digits.len()))
    } else {
        format!("{sign}{}.{}", &digits[..whole], &digits[whole..])
    }
}

impl Document {
    /// The file line of the field at `path` (as the policy names fields:
    /// `spec.containers[1].securityContext.runAsUser`), when it can be found. The document is
    /// parsed again for this, so only errors pay for it.
    pub fn line_of(&self, path: &str) -> Option<usize> {
        let text = &self.source.text[self.source.range.clone()];
        let root: Spanned<Located> =
            serde_saphyr::from_str_with_options(text, kubectl_options(text.len())).ok()?;
        let mut node = &root.value;
        let mut line = root.referenced.line();
        if let Some(j) = self.list_item {
            let Located::Map(entries) = node else {
                return None;
            };
            let (_, items) = entries.iter().find(|(k, _)| k.value == "items")?;
            let Located::Seq(items) = &items.value else {
                return None;
            };
            let item = items.get(j)?;
            (node, line) = (&item.value, item.referenced.line());
        }
        let mut rest = path;
        while !rest.is_empty() {
            (node, line, rest) = node.step(rest)?;
        }
        (line > 0).then(|| self.source.first_line + line as usize - 1)
    }

    /// `file:line` of the field at `path`, when it can be found.
    pub fn locate(&self, path: &str) -> Option<String> {
        self.line_of(path)
            .map(|line| format!("{}:{line}", self.source.file))
    }
}

/// A YAML node with the lines of its entries, for [`Document::line_of`].
enum Located {
    Scalar,
    Seq(Vec<Spanned<Located>>),
    Map(Vec<(Spanned<String>, Spanned<Located>)>),
}

impl Located {
    /// Follows the first segment of `path` (`key`, `.key`, `[n]`): the node, the line of its
    /// key (or element), and the rest of the path. A key may itself contain dots
    /// (`modelgate.io/mode`), so the longest key that fits wins.
    fn step<'p>(&self, path: &'p str) -> Option<(&Located, u64, &'p str)> {
        let path = path.strip_prefix('.').unwrap_or(path);
        match self {
            Located::Seq(items) => {
                let inner = path.strip_prefix('[')?;
                let (n, rest) = inner.split_once(']')?;
                let item = items.get(n.parse::<usize>().ok()?)?;
                Some((&item.value, item.referenced.line(), rest))
            }
            Located::Map(entries) => entries
                .iter()
                .filter(|(k, _)| {
                    path.strip_prefix(k.value.as_str())
                        .is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '[']))
                })
                .max_by_key(|(k, _)| k.value.len())
                .map(|(k, v)| (&v.value, k.referenced.line(), &path[k.value.len()..])),
            Located::Scalar => None,
        }
    }
}

impl<'de> Deserialize<'de> for Located {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Located;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a YAML node")
            }
            fn visit_bool<E>(self, _: bool) -> Result<Located, E> {
                Ok(Located::Scalar)
            }
            fn visit_i64<E>(self, _: i64) -> Result<Located, E> {
                Ok(Located::Scalar)
            }
            fn visit_u64<E>(self, _: u64) -> Result<Located, E> {
                Ok(Located::Scalar)
            }
            fn visit_f64<E>(self, _: f64) -> Result<Located, E> {
                Ok(Located::Scalar)
            }
            fn visit_str<E>(self, _: &str) -> Result<Located, E> {
                Ok(Located::Scalar)
            }
            fn visit_unit<E>(self) -> Result<Located, E> {
                Ok(Located::Scalar)
            }
            fn visit_none<E>(self) -> Result<Located, E> {
                Ok(Located::Scalar)
            }
            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Located, D::Error> {
                d.deserialize_any(self)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Located, A::Error> {
                let mut out = Vec::new();
                while let Some(v) = seq.next_element()? {
                    out.push(v);
                }
                Ok(Located::Seq(out))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Located, A::Error> {
                let mut out = Vec::new();
                while let Some(k) = map.next_key::<Spanned<KubectlKey>>()? {
                    let key = Spanned::new(k.value.0, k.referenced, k.defined);
                    out.push((key, map.next_value()?));
                }
                Ok(Located::Map(out))
            }
        }
        d.deserialize_any(V)
    }
}

/// Whether the text has a YAML document marker line (`---`).
fn has_document_marker(text: &str) -> bool {
    text.lines().any(is_document_marker)
}

fn is_document_marker(line: &str) -> bool {
    line == "---" || line.starts_with("--- ") || line.starts_with("---\t")
}

/// Splits a YAML stream at its `---` document markers, as kubectl does, keeping for each
/// document the file line it starts on (so errors name the document and the line) and its bytes.
/// Documents of nothing but blank lines and comments are left out.
fn split_yaml(text: &str) -> Vec<(usize, Range<usize>)> {
    fn push(docs: &mut Vec<(usize, Range<usize>)>, text: &str, line: usize, range: Range<usize>) {
        let blank = text[range.clone()].lines().all(|l| {
            let l = l.trim();
            l.is_empty() || l.starts_with('#')
        });
        if !blank {
            docs.push((line, range));
        }
    }
    let mut docs = Vec::new();
    let mut start = 0;
    let mut start_line = 1;
    let mut offset = 0;
    for (i, line) in text.split_inclusive('\n').enumerate() {
        if is_document_marker(line.trim_end_matches(['\n', '\r'])) {
            push(&mut docs, text, start_line, start..offset);
            // Content after the marker on the same line (`--- {a: 1}`) belongs to the document.
            start = offset + 3;
            start_line = i + 1;
        }
        offset += line.len();
    }
    push(&mut docs, text, start_line, start..text.len());
    docs
}

fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `List` of pods as `kubectl get pods -A -o yaml` prints it, `n` items of 16 nodes.
    fn pod_list_yaml(n: usize) -> String {
        let mut text = String::from("apiVersion: v1\nkind: List\nitems:\n");
        for i in 0..n {
            text.push_str(&format!(
                "- apiVersion: v1\n  kind: Pod\n  metadata:\n    name: p{i}\n    namespace: team-a\n    labels:\n      app: x\n  spec:\n    containers:\n    - name: c\n      image: busybox\n  status:\n    phase: Running\n"
            ));
        }
        text
    }

    #[test]
    fn a_list_of_more_nodes_than_the_parsers_default_budget_is_read_whole() {
        // 16 000 pods: 256 000 nodes, past serde-saphyr's default of 250 000.
        let text = pod_list_yaml(16_000);
        let docs = read_documents("pods.yaml", &text).unwrap();
        assert_eq!(docs.len(), 16_000);
        assert_eq!(docs[15_999].value["metadata"]["name"], "p15999");
        // The same as JSON.
        let json = serde_json::to_string(&serde_json::json!({
            "apiVersion": "v1", "kind": "List",
            "items": docs.iter().map(|d| d.value.clone()).collect::<Vec<_>>(),
        }))
        .unwrap();
        assert_eq!(read_documents("pods.json", &json).unwrap().len(), 16_000);
    }

    #[test]
    fn amplification_by_aliases_stays_bounded_by_the_bytes() {
        // A billion-laughs document: each level doubles the nodes of the one before.
        let mut text = String::from("a0: &a0 [x, x]\n");
        for i in 1..40 {
            text.push_str(&format!("a{i}: &a{i} [*a{p}, *a{p}]\n", p = i - 1));
        }
        let err = read_documents("bomb.yaml", &text).unwrap_err().to_string();
        assert!(err.starts_with("bomb.yaml#1: not valid YAML"), "{err}");
    }

    /// A ConfigMap with `depth` levels of nesting under `data`.
    fn nested(depth: usize) -> String {
        let mut text =
            String::from("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: deep}\nx:\n");
        for i in 0..depth {
            text.push_str(&format!("{}a:\n", "  ".repeat(i + 1)));
        }
        text.push_str(&format!("{}b: 1\n", "  ".repeat(depth + 1)));
        text
    }

    #[test]
    fn nesting_is_read_to_the_depth_every_later_step_reads_and_refused_beyond_with_its_line() {
        // On the test's own 2 MiB thread: the reader has a stack of its own.
        // The root mapping, `x` and the nested levels: `MAX_DEPTH` in all.
        assert!(read_documents("deep.yaml", &nested(MAX_DEPTH - 2)).is_ok());
        let err = read_documents("deep.yaml", &nested(MAX_DEPTH - 1))
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("deep.yaml#1: not valid YAML: line "),
            "{err}"
        );
        assert!(err.contains("Depth"), "{err}");
    }

    #[test]
    fn yaml_multi_document_and_lists() {
        let text = "kind: Pod\nmetadata: {name: a}\n---\n---\nkind: List\nitems:\n- {kind: Pod}\n- {kind: Job}\n";
        let docs = read_documents("f.yaml", text).unwrap();
        assert_eq!(docs.len(), 3);
        assert_eq!(docs[0].origin, "f.yaml#1");
        assert_eq!(docs[2].origin, "f.yaml#2.items[1]");
        assert_eq!(docs[2].value["kind"], "Job");
    }

    #[test]
    fn json_stream() {
        let docs = read_documents("f.json", "{\"kind\":\"Pod\"}\n{\"kind\":\"Job\"}").unwrap();
        assert_eq!(docs.len(), 2);
        assert_eq!(docs[1].value["kind"], "Job");
    }

    #[test]
    fn numbers_stay_integers() {
        let docs = read_documents(
            "f",
            "spec:\n  securityContext:\n    runAsUser: 1000680000\n",
        )
        .unwrap();
        assert_eq!(
            docs[0].value["spec"]["securityContext"]["runAsUser"].as_i64(),
            Some(1000680000)
        );
    }

    #[test]
    fn errors_name_the_input() {
        let e = read_documents("bad.json", "{\"kind\":")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("bad.json: not valid JSON"), "{e}");
        let e = read_documents("bad.yaml", "a: [1, 2\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("bad.yaml#1: not valid YAML: line 1, column 4: "),
            "{e}"
        );
        let e = read_documents("bad.yaml", "a: 1\n---\nb: 2\n---\nc: [\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("bad.yaml#3: not valid YAML: line 5, column 4: "),
            "{e}"
        );
        assert!(!e.contains('\n'), "{e}");
        let e = read_documents("s.yaml", "- 1\n- 2\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("document 1 is not an object"), "{e}");
    }
}

#[cfg(test)]
mod list_items {
    use super::*;

    #[test]
    fn list_items_must_be_objects() {
        let e = read_documents("fuzz", r#"{"apiVersion":"v1","kind":"List","items":[0]}"#)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "fuzz: document 1 is a List whose items[0] is not an object (found a number)"
        );
        let e = read_documents(
            "l.yaml",
            "kind: Pod\n---\nkind: PodList\nitems:\n- {kind: Pod}\n- null\n",
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            e,
            "l.yaml: document 2 is a List whose items[1] is not an object (found null)"
        );
    }
}

#[cfg(test)]
mod kubectl_reading {
    use super::*;
    use serde_json::json;

    fn value(yaml_scalar: &str) -> Value {
        let docs = read_documents("t.yaml", &format!("v: {yaml_scalar}\n"))
            .unwrap_or_else(|e| panic!("{yaml_scalar}: {e}"));
        docs[0].value["v"].clone()
    }

    /// Each spelling and the value sigs.k8s.io/yaml (go-yaml v2) gives it.
    #[test]
    fn scalars_resolve_as_go_yaml_v2() {
        let cases = [
            ("0440", json!(288)),
            ("0o440", json!(288)),
            ("0777", json!(511)),
            ("00", json!(0)),
            ("0", json!(0)),
            ("-0440", json!(-288)),
            ("0x1F", json!(31)),
            ("-0x10", json!(-16)),
            ("0b101", json!(5)),
            ("1_000", json!(1000)),
            ("+12", json!(12)),
            ("08", json!(8)),
            ("09.5", json!(9.5)),
            ("1.0", json!(1)),
            ("1.", json!(1)),
            ("1.5", json!(1.5)),
            ("1e3", json!(1000)),
            (".5", json!(0.5)),
            ("-.5", json!(-0.5)),
            ("9223372036854775807", json!(9223372036854775807i64)),
            ("18446744073709551615", json!(18446744073709551615u64)),
            ("yes", json!(true)),
            ("Yes", json!(true)),
            ("YES", json!(true)),
            ("y", json!(true)),
            ("Y", json!(true)),
            ("on", json!(true)),
            ("On", json!(true)),
            ("ON", json!(true)),
            ("True", json!(true)),
            ("no", json!(false)),
            ("n", json!(false)),
            ("N", json!(false)),
            ("off", json!(false)),
            ("OFF", json!(false)),
            ("FALSE", json!(false)),
            ("~", json!(null)),
            ("null", json!(null)),
            ("Null", json!(null)),
            ("", json!(null)),
            ("\"0440\"", json!("0440")),
            ("'yes'", json!("yes")),
            ("!!str 0440", json!("0440")),
            ("2001-12-14", json!("2001-12-14")),
            ("2001-12-14T21:59:43.10Z", json!("2001-12-14T21:59:43.10Z")),
            ("1.2.3", json!("1.2.3")),
            ("0x", json!("0x")),
            ("+", json!("+")),
            ("yess", json!("yes".to_string() + "s")),
            ("0440abc", json!("0440abc")),
        ];
        for (spelling, want) in cases {
            assert_eq!(value(spelling), want, "{spelling}");
        }
    }

    #[test]
    fn mapping_keys_become_json_keys_as_kubectl_makes_them() {
        let docs = read_documents(
            "k.yaml",
            "on: a\n1: b\n0x10: c\n1.5: d\n1000000.0: f\n\"y\": g\n",
        )
        .unwrap();
        assert_eq!(
            docs[0].value,
            json!({"true": "a", "1": "b", "16": "c", "1.5": "d", "1e+06": "f", "y": "g"})
        );
        assert_eq!(go_format_float32(0.0001), "0.0001");
        assert_eq!(go_format_float32(0.00001), "1e-05");
        assert_eq!(go_format_float32(123456.0), "123456");
        assert_eq!(go_format_float32(-2.5), "-2.5");
        assert_eq!(go_format_float32(1234567.0), "1.234567e+06");
        let e = read_documents("k.yaml", "~: a\n").unwrap_err().to_string();
        assert!(e.contains("null mapping key"), "{e}");
    }

    #[test]
    fn what_kubectl_refuses_is_refused_with_its_line() {
        for (text, why) in [("a: 1\nb: .inf\n", "line 2"), ("a: 1\nb: .nan\n", "line 2")] {
            let e = read_documents("r.yaml", text).unwrap_err().to_string();
            assert!(e.starts_with("r.yaml#1: not valid YAML: "), "{e}");
            assert!(e.contains(why), "{text:?}: {e}");
        }
    }

    #[test]
    fn the_last_of_duplicate_keys_wins_as_in_kubectl() {
        let docs = read_documents("d.yaml", "a: 1\nb: {c: 1}\na: 2\nb: {d: 2}\n").unwrap();
        assert_eq!(docs[0].value, json!({"a": 2, "b": {"d": 2}}));
    }

    #[test]
    fn json_documents_inside_a_yaml_stream() {
        let text = "{\"kind\": \"Pod\", \"metadata\": {\"name\": \"a\"}}\n---\n{\n  \"kind\": \"Job\",\n  \"spec\": {\"x\": 1.0}\n}\n---\nkind: Pod\n";
        let docs = read_documents("s.yaml", text).unwrap();
        assert_eq!(docs.len(), 3);
        assert_eq!(docs[1].value, json!({"kind": "Job", "spec": {"x": 1}}));
        assert_eq!(docs[1].line_of("spec.x"), Some(5));
        // A JSON file with a mistake is still reported as JSON.
        let e = read_documents("j.json", "{\"kind\": [}")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("j.json: not valid JSON"), "{e}");
    }

    #[test]
    fn lines_of_fields_in_the_file() {
        let text = "# comment\nkind: Pod\n---\nkind: Pod\nmetadata:\n  annotations:\n    modelgate.io/mode: warn\nspec:\n  containers:\n  - name: a\n  - name: b\n    securityContext:\n      runAsUser: \"0\"\n";
        let docs = read_documents("p.yaml", text).unwrap();
        let d = &docs[1];
        assert_eq!(
            d.line_of("spec.containers[1].securityContext.runAsUser"),
            Some(13)
        );
        assert_eq!(d.line_of("spec.containers[0]"), Some(10));
        assert_eq!(d.line_of("metadata.annotations.modelgate.io/mode"), Some(7));
        assert_eq!(d.line_of("spec.volumes"), None);
        assert_eq!(d.locate("spec"), Some("p.yaml:8".into()));
        let list = "kind: List\nitems:\n- kind: Pod\n  spec: {}\n- kind: Pod\n  spec:\n    hostNetwork: true\n";
        let docs = read_documents("l.yaml", list).unwrap();
        assert_eq!(docs[1].line_of("spec.hostNetwork"), Some(7));
        let json = "{\"kind\": \"Pod\"}\n{\n \"kind\": \"Pod\",\n \"spec\": {\"a\": 1}\n}\n";
        let docs = read_documents("j.json", json).unwrap();
        assert_eq!(docs[1].line_of("spec.a"), Some(4));
    }
}

#[cfg(test)]
mod never_panics {
    use super::*;
    use proptest::prelude::*;

    /// Streams stitched from pieces that stress the splitting and the line arithmetic:
    /// markers with and without content, CRLF and CR line ends, comments, JSON, flow, blank
    /// documents, multi-byte text, a byte-order mark.
    fn piece() -> impl Strategy<Value = &'static str> {
        prop::sample::select(vec![
            "---",
            "---\n",
            "--- {a: 1}\n",
            "---\r\n",
            "\r",
            "\n",
            "# c\n",
            "a: 1\n",
            "a: [\n",
            "{\"k\": 0440}",
            "{\"kind\": \"List\", \"items\": [1]}\n",
            "kind: List\nitems: [{a: 1}]\n",
            "é: ü\n",
            "\u{feff}",
            "  - x\n",
            "...\n",
            "b: !!str 0x1F\n",
            "c: .inf\n",
            "~\n",
        ])
    }

    proptest! {
        #[test]
        fn any_stream_is_read_or_refused_without_panicking(pieces in prop::collection::vec(piece(), 0..12)) {
            let text: String = pieces.concat();
            if let Ok(docs) = read_documents("p.yaml", &text) {
                for d in docs {
                    // Finding lines must not panic either.
                    let _ = d.line_of("a");
                    let _ = d.locate("items[0].a");
                }
            }
        }
    }

    #[test]
    fn byte_order_marks_are_read_as_kubectl_reads_them() {
        let text = "kind: Pod\nmetadata: {name: é}\n";
        let mut utf8 = vec![0xEF, 0xBB, 0xBF];
        utf8.extend_from_slice(text.as_bytes());
        let mut le = vec![0xFF, 0xFE];
        let mut be = vec![0xFE, 0xFF];
        for unit in text.encode_utf16() {
            le.extend_from_slice(&unit.to_le_bytes());
            be.extend_from_slice(&unit.to_be_bytes());
        }
        for bytes in [text.as_bytes().to_vec(), utf8, le, be] {
            assert_eq!(decode_text(bytes).unwrap(), text);
        }
        assert!(
            decode_text(vec![0xFF, 0xFE, 0x41])
                .unwrap_err()
                .contains("odd length")
        );
        assert!(
            decode_text(vec![0xFF, 0xFE, 0x00, 0xD8])
                .unwrap_err()
                .contains("not valid UTF-16")
        );
        assert!(
            decode_text(vec![b'a', 0xFF])
                .unwrap_err()
                .starts_with("not valid UTF-8")
        );
    }
}
