//! Reading Kubernetes objects from files: YAML or JSON, several documents per file, `List`s
//! flattened. Used by `review` for its inputs and by `--caches` for cache objects.

use serde_json::Value;

/// One object read from an input, with where it came from for error messages.
#[derive(Debug, Clone)]
pub struct Document {
    /// `file` for a single document, `file#N` (1-based) when the file holds several.
    pub origin: String,
    pub value: Value,
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

/// Parses `text` (named `origin` in errors) into its objects, in order. Empty documents are
/// skipped; a `List` (kind `List` or any `*List` with an `items` array) yields its items.
pub fn read_documents(origin: &str, text: &str) -> Result<Vec<Document>, DocumentError> {
    let trimmed = text.trim_start_matches('\u{feff}').trim_start();
    let raw: Vec<Value> = if trimmed.starts_with('{') || trimmed.starts_with('[') {
        serde_json::Deserializer::from_str(trimmed)
            .into_iter::<Value>()
            .collect::<Result<_, _>>()
            .map_err(|error| DocumentError::Json {
                origin: origin.to_string(),
                error,
            })?
    } else {
        let mut values = Vec::new();
        for (index, (first_line, doc)) in split_yaml(text).into_iter().enumerate() {
            let parsed: Option<Value> =
                serde_saphyr::from_str(&doc).map_err(|e| DocumentError::Yaml {
                    origin: format!("{origin}#{}", index + 1),
                    message: {
                        let text = one_line(&e.without_snippet().to_string());
                        match e.location() {
                            // The parser counts lines from the document's start; name the file's line.
                            Some(at) => {
                                let what = text
                                    .rfind(" at line ")
                                    .map_or(text.as_str(), |i| &text[..i]);
                                let line = first_line + at.line() as usize - 1;
                                format!("line {line}, column {}: {what}", at.column())
                            }
                            None => text,
                        }
                    },
                })?;
            values.extend(parsed);
        }
        values
    };
    let raw: Vec<Value> = raw.into_iter().filter(|v| !v.is_null()).collect();
    let several = raw.len() > 1;
    let mut out = Vec::new();
    for (i, value) in raw.into_iter().enumerate() {
        let index = i + 1;
        let doc_origin = if several {
            format!("{origin}#{index}")
        } else {
            origin.to_string()
        };
        let Value::Object(mut map) = value else {
            return Err(DocumentError::NotAnObject {
                origin: origin.to_string(),
                index,
            });
        };
        let is_list = map
            .get("kind")
            .and_then(Value::as_str)
            .is_some_and(|k| k == "List" || (k.ends_with("List") && map.contains_key("items")));
        if is_list {
            // Items are moved out, not copied: a list of 100 000 caches is large.
            let Some(Value::Array(items)) = map.remove("items") else {
                return Err(DocumentError::BadList {
                    origin: origin.to_string(),
                    index,
                });
            };
            out.reserve(items.len());
            for (j, item) in items.into_iter().enumerate() {
                // kubectl refuses such a List too; passing it on would hand callers a non-object.
                if !item.is_object() {
                    return Err(DocumentError::ListItemNotAnObject {
                        origin: origin.to_string(),
                        index,
                        item: j,
                        found: json_type(&item),
                    });
                }
                out.push(Document {
                    origin: format!("{doc_origin}.items[{j}]"),
                    value: item,
                });
            }
        } else {
            out.push(Document {
                origin: doc_origin,
                value: Value::Object(map),
            });
        }
    }
    Ok(out)
}

/// Splits a YAML stream at its `---` document markers, as kubectl does, keeping for each
/// document the file line it starts on, so errors name the document and the line.
fn split_yaml(text: &str) -> Vec<(usize, String)> {
    let mut docs = Vec::new();
    let mut current = String::new();
    let mut start = 1;
    for (i, line) in text.lines().enumerate() {
        let marker = line == "---" || line.starts_with("--- ") || line.starts_with("---\t");
        if marker {
            if !current.trim().is_empty() {
                docs.push((start, std::mem::take(&mut current)));
            }
            current.clear();
            start = i + 1;
            // Content after the marker on the same line (`--- {a: 1}`) belongs to the document.
            current.push_str(&line[3..]);
            current.push('\n');
        } else {
            current.push_str(line);
            current.push('\n');
        }
    }
    if !current.trim().is_empty() {
        docs.push((start, current));
    }
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
