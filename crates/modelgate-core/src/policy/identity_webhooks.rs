//! Identity webhooks that give every container cloud credentials, and the annotations by which
//! they leave a container alone.
//!
//! EKS's `pod-identity-webhook` and Azure Workload Identity's webhook add environment variables
//! and a projected service account token mount to every container of a pod, init containers
//! included. On the prep that is harmful either way: `/validate` denies a prep that is no longer
//! canonical, and a root container that holds cloud credentials is exactly what the prep must
//! never be. Both webhooks skip the containers a pod annotation names, so on a pod that gets the
//! prep `/mutate` makes sure both annotations name `model-cache-prep`, keeping every name already
//! there.
//!
//! Contract:
//! - each annotation is read exactly as its webhook reads it ([`Syntax`]): a value that already
//!   names the prep *for that webhook* is left as it is, so a second pass is an empty patch;
//! - otherwise `model-cache-prep` is appended with the webhook's separator, the value's text kept
//!   as written; only an EKS value where appending would not reach what the webhook reads (it
//!   reads the first line only, and nothing of a value it cannot parse) is rewritten, with a
//!   warning, as one line of the container names that webhook did read, then the prep;
//! - a missing annotation, map or `metadata` is created;
//! - the cost is linear in the value and nothing is kept per name: a value of a megabyte or of a
//!   hundred thousand names is read once or twice, and only the new value is built.
//!
//! The annotations are written whether or not those webhooks are installed: where nobody reads
//! them they cost nothing, and a webhook installed later finds them in place.

use super::workload::Workload;
use super::{Change, Mutation};
use crate::config::PREP_CONTAINER;
use crate::patch::Fields;

/// How an identity webhook reads its skip annotation into container names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Syntax {
    /// EKS `pod-identity-webhook` (`pkg/handler/handler.go`, `getContainersToSkip`): the first
    /// record of Go's `encoding/csv` reader with its defaults. Names are comma-separated and not
    /// trimmed (`a, b` names `a` and ` b`); `"…"` quotes a name; only the first line (record) is
    /// read; a value the reader refuses (a bare `"`, an unclosed quote) or one with no record
    /// at all (empty) skips no container.
    GoCsvFirstRecord,
    /// Azure Workload Identity (`pkg/webhook/webhook.go`, `getSkipContainers`): an empty value
    /// names none; otherwise `strings.Split(value, ";")`, each name `strings.TrimSpace`d (Go's and
    /// Rust's `trim` both strip Unicode `White_Space`).
    SemicolonTrimmed,
}

/// One identity webhook's skip annotation.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SkipAnnotation {
    pub(crate) key: &'static str,
    /// The webhook, as a warning names it.
    webhook: &'static str,
    syntax: Syntax,
}

/// Azure Workload Identity's skip annotation (semicolon-separated names).
pub(crate) const AZURE_SKIP_CONTAINERS: &str = "azure.workload.identity/skip-containers";
/// EKS `pod-identity-webhook`'s skip annotation (comma-separated names), under its default
/// annotation domain `eks.amazonaws.com` (its `--annotation-prefix` can move it).
pub(crate) const EKS_SKIP_CONTAINERS: &str = "eks.amazonaws.com/skip-containers";

/// Both annotations, in key order (as the API server writes a map, and as a new map is written).
pub(crate) const SKIP_ANNOTATIONS: [SkipAnnotation; 2] = [
    SkipAnnotation {
        key: AZURE_SKIP_CONTAINERS,
        webhook: "Azure Workload Identity's webhook",
        syntax: Syntax::SemicolonTrimmed,
    },
    SkipAnnotation {
        key: EKS_SKIP_CONTAINERS,
        webhook: "pod-identity-webhook",
        syntax: Syntax::GoCsvFirstRecord,
    },
];

/// The value an annotation must get so that its webhook skips the prep.
#[derive(Debug, PartialEq, Eq)]
struct NewValue {
    value: String,
    /// The old value was not kept as written (see [`with_prep`]): said in a warning.
    rewritten: bool,
}

/// The value `annotation` must get so that its webhook skips the prep, `None` when `old` (the
/// value it has, if any) already makes it do so.
fn with_prep(annotation: &SkipAnnotation, old: Option<&str>) -> Option<NewValue> {
    let kept = |value: String| NewValue {
        value,
        rewritten: false,
    };
    let Some(old) = old else {
        return Some(kept(PREP_CONTAINER.to_string()));
    };
    match annotation.syntax {
        Syntax::SemicolonTrimmed => {
            if old.is_empty() {
                return Some(kept(PREP_CONTAINER.to_string()));
            }
            if old.split(';').any(|name| name.trim() == PREP_CONTAINER) {
                return None;
            }
            // No empty name in between when the value already ends with a separator.
            let sep = if old.trim_end().ends_with(';') {
                ""
            } else {
                ";"
            };
            Some(kept(format!("{old}{sep}{PREP_CONTAINER}")))
        }
        Syntax::GoCsvFirstRecord => {
            let mut names_prep = false;
            let read = go_csv_first_record(old, |name| names_prep |= name == PREP_CONTAINER);
            match read {
                Ok(_) if names_prep => None,
                // The record runs to the end of the value: `,model-cache-prep` appends exactly
                // one name to it. (A trailing `\r` at the end is dropped by the reader, but
                // would be part of the last name once something follows it.)
                Ok(RecordEnd::EndOfText) if !old.ends_with('\r') => {
                    Some(kept(format!("{old},{PREP_CONTAINER}")))
                }
                // A record followed by more lines, a value the reader refuses, or one with no
                // record: appending would not reach the record the webhook reads. Rewritten as
                // the names it did read that can be a container's, then the prep: the webhook
                // then skips the same containers as before, and the prep.
                _ => {
                    let mut value = String::with_capacity(old.len() + PREP_CONTAINER.len() + 1);
                    if read.is_ok() {
                        let _ = go_csv_first_record(old, |name| {
                            if is_container_name(name) {
                                value.push_str(name);
                                value.push(',');
                            }
                        });
                    }
                    value.push_str(PREP_CONTAINER);
                    Some(NewValue {
                        value,
                        rewritten: !old.trim().is_empty(),
                    })
                }
            }
        }
    }
}

/// Whether `name` can be a container's name (a DNS-1123 label, as the API server validates
/// it): only such a name in a skip list can match a container.
fn is_container_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// Where the first record of a CSV text ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RecordEnd {
    /// At the end of the text, on a line without a line break.
    EndOfText,
    /// At a line break (more text may follow).
    LineBreak,
}

/// The text holds no record Go's `encoding/csv` reader accepts as its first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct NoRecord;

/// One line of the text as Go's `csv.Reader.readLine` returns it: its text without the line
/// break, and whether it had one (`\r\n` counts as `\n`; the last line of the text, without a
/// line break, loses a trailing `\r`).
struct Line<'a> {
    text: &'a str,
    line_break: bool,
}

/// The next line of `rest`, `None` at the end of the text.
fn read_line<'a>(rest: &mut &'a str) -> Option<Line<'a>> {
    if rest.is_empty() {
        return None;
    }
    let line = match rest.find('\n') {
        Some(i) => {
            let text = &rest[..i];
            *rest = &rest[i + 1..];
            Line {
                text: text.strip_suffix('\r').unwrap_or(text),
                line_break: true,
            }
        }
        None => {
            let text = std::mem::take(rest);
            Line {
                text: text.strip_suffix('\r').unwrap_or(text),
                line_break: false,
            }
        }
    };
    Some(line)
}

/// The fields of the first record of `text`, each passed to `field`, as Go's `encoding/csv`
/// `Reader.Read` with its defaults reads them (`Comma` `,`, no comment character,
/// `LazyQuotes` and `TrimLeadingSpace` false): empty lines before the record are skipped; an
/// unquoted field runs to the next `,` or the end of its line and may not hold a `"`; a quoted
/// field may hold `,`, `""` (one `"`) and line breaks (`\r\n` read as `\n`), and its closing
/// quote must be followed by `,` or the end of a line. A field passed before an error is not
/// taken back: the caller looks at the result first. Linear in the text; one buffer, for quoted
/// fields.
fn go_csv_first_record(text: &str, mut field: impl FnMut(&str)) -> Result<RecordEnd, NoRecord> {
    let mut rest = text;
    let first = loop {
        match read_line(&mut rest) {
            None => return Err(NoRecord),
            Some(l) if l.text.is_empty() => continue,
            Some(l) => break l,
        }
    };
    let (mut line, mut line_break) = (first.text, first.line_break);
    let end = |line_break: bool| match line_break {
        true => RecordEnd::LineBreak,
        false => RecordEnd::EndOfText,
    };
    let mut quoted = String::new();
    loop {
        let Some(inner) = line.strip_prefix('"') else {
            let (text, next) = match line.find(',') {
                Some(i) => (&line[..i], Some(&line[i + 1..])),
                None => (line, None),
            };
            if text.contains('"') {
                return Err(NoRecord);
            }
            field(text);
            match next {
                Some(next) => {
                    line = next;
                    continue;
                }
                None => return Ok(end(line_break)),
            }
        };
        line = inner;
        quoted.clear();
        loop {
            if let Some(i) = line.find('"') {
                quoted.push_str(&line[..i]);
                line = &line[i + 1..];
                match line.as_bytes().first() {
                    Some(b'"') => {
                        quoted.push('"');
                        line = &line[1..];
                    }
                    Some(b',') => {
                        line = &line[1..];
                        field(&quoted);
                        break;
                    }
                    None => {
                        field(&quoted);
                        return Ok(end(line_break));
                    }
                    Some(_) => return Err(NoRecord),
                }
            } else if !line.is_empty() || line_break {
                // The field goes on on the next line, with the line break.
                quoted.push_str(line);
                if line_break {
                    quoted.push('\n');
                }
                match read_line(&mut rest) {
                    Some(next) => (line, line_break) = (next.text, next.line_break),
                    None => return Err(NoRecord),
                }
            } else {
                // The text ends inside the quotes.
                return Err(NoRecord);
            }
        }
    }
}

/// The warning of an EKS annotation that was rewritten rather than appended to.
fn rewritten_warning(annotation: &SkipAnnotation) -> String {
    format!(
        "{} rewritten as one line of the container names {} read in it, then {PREP_CONTAINER} \
         (it reads only the first comma-separated line, and skips no container when it cannot \
         parse it)",
        annotation.key, annotation.webhook
    )
}

/// On a pod that gets the prep: makes both skip annotations name it, one change each.
pub(super) fn skip_prep(w: &Workload, m: &mut Mutation) {
    let mut pairs: Vec<(&str, String)> = Vec::with_capacity(SKIP_ANNOTATIONS.len());
    for annotation in &SKIP_ANNOTATIONS {
        let Some(new) = with_prep(annotation, w.annotation(annotation.key)) else {
            continue;
        };
        let change = Change::skip_prep_in(annotation.key);
        m.changes.push(match new.rewritten {
            true => change.warned(rewritten_warning(annotation)),
            false => change,
        });
        pairs.push((annotation.key, new.value));
    }
    if pairs.is_empty() {
        return;
    }
    // In one object where the map (or the metadata) is missing, so that the second has a parent.
    // The model-cache step before this one never creates the map: it writes only on a pod that
    // names a model, in an annotation.
    if w.has_metadata {
        m.patch
            .set_fields(&w.annotations_path(), w.annotations.is_some(), &pairs);
    } else {
        m.patch
            .add(&w.meta_path, Fields(&[("annotations", Fields(&pairs))]));
    }
}

#[cfg(test)]
mod tests;
