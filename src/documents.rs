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
    #[error("{origin}: not valid JSON: {source}")]
    Json {
        origin: String,
        source: serde_json::Error,
    },
    #[error("{origin}: not valid YAML: {message}")]
    Yaml { origin: String, message: String },
    #[error("{origin}: document {index} is not an object")]
    NotAnObject { origin: String, index: usize },
    #[error("{origin}: document {index} is a List whose `items` is not an array")]
    BadList { origin: String, index: usize },
}

/// Parses `text` (named `origin` in errors) into its objects, in order. Empty documents are
/// skipped; a `List` (kind `List` or any `*List` with an `items` array) yields its items.
pub fn read_documents(origin: &str, text: &str) -> Result<Vec<Document>, DocumentError> {
    let trimmed = text.trim_start_matches('\u{feff}').trim_start();
    let raw: Vec<Value> = if trimmed.starts_with('{') || trimmed.starts_with('[') {
        serde_json::Deserializer::from_str(trimmed)
            .into_iter::<Value>()
            .collect::<Result<_, _>>()
            .map_err(|source| DocumentError::Json {
                origin: origin.to_string(),
                source,
            })?
    } else {
        serde_saphyr::from_multiple::<Value>(text).map_err(|e| DocumentError::Yaml {
            origin: origin.to_string(),
            message: one_line(&e.to_string()),
        })?
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
        let Value::Object(map) = &value else {
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
            let Some(Value::Array(items)) = map.get("items") else {
                return Err(DocumentError::BadList {
                    origin: origin.to_string(),
                    index,
                });
            };
            for (j, item) in items.iter().enumerate() {
                out.push(Document {
                    origin: format!("{doc_origin}.items[{j}]"),
                    value: item.clone(),
                });
            }
        } else {
            out.push(Document {
                origin: doc_origin,
                value,
            });
        }
    }
    Ok(out)
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
        assert!(e.starts_with("bad.yaml: not valid YAML"), "{e}");
        let e = read_documents("s.yaml", "- 1\n- 2\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("document 1 is not an object"), "{e}");
    }
}
