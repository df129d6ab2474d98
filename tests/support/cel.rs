//! CEL as the API server evaluates it for admission (matchConditions, ValidatingAdmissionPolicy):
//! the Kubernetes CEL libraries (kube-cel's functions on the `cel` interpreter it re-exports),
//! with objects bound as untyped JSON.
#![allow(dead_code)]

use kube_cel::cel;
use serde_json::Value;

/// Runs `test` on a thread with a 256 MiB stack: the `cel` interpreter recurses once per level
/// of an expression, and in this debug build its frames are large, so the longest expressions
/// rendered from the workload-kind table (a sum or a chain of conditionals over its rows)
/// overflow a test thread's 2 MiB. The API server's cel-go parses the same text within its
/// recursion limit (250 levels).
pub fn on_big_stack<T: Send + 'static>(test: impl FnOnce() -> T + Send + 'static) -> T {
    let outcome = std::thread::Builder::new()
        .stack_size(256 << 20)
        .spawn(test)
        .unwrap()
        .join();
    outcome.unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

/// JSON as the API server hands it to CEL (unstructured JSON through cel-go's type adapter):
/// integers are `int` (int64), maps keep their keys as written.
pub fn to_cel(value: &Value) -> cel::Value {
    match value {
        Value::Null => cel::Value::Null,
        Value::Bool(b) => cel::Value::Bool(*b),
        Value::Number(n) => match n.as_i64() {
            Some(i) => cel::Value::Int(i),
            None => cel::Value::Float(n.as_f64().unwrap_or(f64::NAN)),
        },
        Value::String(s) => cel::Value::String(s.clone().into()),
        Value::Array(items) => {
            cel::Value::List(items.iter().map(to_cel).collect::<Vec<_>>().into())
        }
        Value::Object(fields) => {
            let map: std::collections::HashMap<cel::objects::Key, cel::Value> = fields
                .iter()
                .map(|(k, v)| (cel::objects::Key::from(k.as_str()), to_cel(v)))
                .collect();
            cel::Value::Map(map.into())
        }
    }
}
