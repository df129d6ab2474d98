//! A review as the API server sends it: the JSON of the reference reviews (benches/reviews),
//! written as people read it, without the whitespace between tokens and with its keys in their
//! order (a `serde_json::Value` would sort them). Go's `encoding/json` writes the same bytes.

/// The review `name` from `dir`: `<name>.json` as written, or, for a name ending in `-compact`,
/// that file without its whitespace.
pub fn read_review(dir: &std::path::Path, name: &str) -> std::io::Result<Vec<u8>> {
    match name.strip_suffix("-compact") {
        Some(file) => Ok(compact(&std::fs::read(dir.join(format!("{file}.json")))?)),
        None => std::fs::read(dir.join(format!("{name}.json"))),
    }
}

/// `json` without the whitespace between tokens.
pub fn compact(json: &[u8]) -> Vec<u8> {
    let (mut in_string, mut escaped) = (false, false);
    let mut out = Vec::with_capacity(json.len());
    for &b in json {
        if in_string {
            in_string = escaped || b != b'"';
            escaped = !escaped && b == b'\\';
        } else if b.is_ascii_whitespace() {
            continue;
        } else {
            in_string = b == b'"';
        }
        out.push(b);
    }
    out
}
