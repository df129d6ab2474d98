use serde_json::{Value, json};

use super::apply;
use crate::patch::{FieldPath, Patch, PatchBuilder};

fn patch_of(operations: &Value) -> Patch {
    Patch {
        json: serde_json::to_vec(operations).unwrap(),
        len: operations.as_array().unwrap().len(),
        truncated: false,
    }
}

/// What `json_patch` makes of `doc` with `operations` (`None` when it refuses them).
fn reference(doc: &Value, operations: &Value) -> Option<Value> {
    let operations: json_patch::Patch = serde_json::from_value(operations.clone()).ok()?;
    let mut doc = doc.clone();
    // Without its undo, which panics on some failed moves (json-patch 4.2); a failure is
    // `None` either way.
    json_patch::patch_unsafe(&mut doc, &operations).ok()?;
    Some(doc)
}

/// `apply` on the text of `doc` gives what `json_patch` gives on the value, or refuses what
/// it refuses.
fn same_as_json_patch(doc: &Value, operations: &Value) {
    let text = doc.to_string();
    let ours = apply(&text, &patch_of(operations), "")
        .map(|t| serde_json::from_str::<Value>(&t).expect("apply writes JSON"));
    assert_eq!(ours, reference(doc, operations), "{doc}\n{operations}");
}

#[test]
fn every_operation_applies_as_json_patch_applies_it() {
    let doc = json!({
        "metadata": {"annotations": {"a/b": "1", "c~d": "2"}, "labels": {}},
        "spec": {
            "securityContext": {"runAsUser": 5},
            "containers": [
                {"name": "a", "volumeMounts": [{"name": "m", "mountPath": "/m"}]},
                {"name": "b", "securityContext": {"runAsNonRoot": false}}
            ],
            "volumes": [{"name": "x"}, {"name": "y"}, {"name": "z"}, {"name": "w"}],
            "n": 1.5,
            "nothing": null
        }
    });
    let cases = [
        json!([{"op": "add", "path": "/spec/securityContext/runAsNonRoot", "value": true}]),
        json!([{"op": "add", "path": "/spec/securityContext", "value": {"fsGroup": 3}}]),
        json!([{"op": "add", "path": "/spec/initContainers", "value": [{"name": "p"}]}]),
        json!([{"op": "add", "path": "/spec/containers/0", "value": {"name": "first"}}]),
        json!([{"op": "add", "path": "/spec/containers/2", "value": {"name": "last"}}]),
        json!([{"op": "add", "path": "/spec/containers/-", "value": {"name": "end"}}]),
        json!([{"op": "add", "path": "/spec/containers/3", "value": {}}]),
        json!([{"op": "add", "path": "/spec/containers/01", "value": {}}]),
        json!([{"op": "add", "path": "/spec/containers/0/volumeMounts/-", "value": {"name": "n"}}]),
        json!([{"op": "add", "path": "/spec/nothing", "value": null}]),
        json!([{"op": "add", "path": "/spec/missing/x", "value": 1}]),
        json!([{"op": "add", "path": "/metadata/annotations/a~1b", "value": "3"}]),
        json!([{"op": "add", "path": "/metadata/annotations/c~0d", "value": "4"}]),
        json!([{"op": "add", "path": "/metadata/annotations/x~2", "value": "4"}]),
        json!([{"op": "add", "path": "/spec/n/x", "value": 1}]),
        json!([{"op": "add", "path": "", "value": {"whole": true}}]),
        json!([{"op": "replace", "path": "/spec/containers/1/securityContext/runAsNonRoot", "value": true}]),
        json!([{"op": "replace", "path": "/spec/containers/2", "value": {}}]),
        json!([{"op": "replace", "path": "/spec/absent", "value": 1}]),
        json!([{"op": "remove", "path": "/metadata/annotations/a~1b"}]),
        json!([{"op": "remove", "path": "/spec/volumes/1"}]),
        json!([{"op": "remove", "path": "/spec/volumes/4"}]),
        json!([{"op": "remove", "path": "/spec/absent"}]),
        // A run of removals from one array, highest index first, as the policy writes them.
        json!([
            {"op": "remove", "path": "/spec/volumes/3"},
            {"op": "remove", "path": "/spec/volumes/2"},
            {"op": "remove", "path": "/spec/volumes/0"}
        ]),
        json!([
            {"op": "remove", "path": "/spec/volumes/3"},
            {"op": "remove", "path": "/spec/volumes/1"},
            {"op": "remove", "path": "/spec/volumes/2"}
        ]),
        json!([
            {"op": "remove", "path": "/spec/volumes/9"},
            {"op": "remove", "path": "/spec/volumes/1"}
        ]),
        json!([
            {"op": "remove", "path": "/spec/volumes/3"},
            {"op": "remove", "path": "/spec/containers/1"},
            {"op": "remove", "path": "/spec/volumes/0"}
        ]),
        json!([{"op": "copy", "from": "/spec/volumes/0", "path": "/spec/volumes/-"}]),
        json!([{"op": "copy", "from": "/spec/containers/0", "path": "/spec/containers/0/copy"}]),
        json!([{"op": "copy", "from": "/spec/absent", "path": "/spec/volumes/-"}]),
        json!([{"op": "move", "from": "/spec/volumes/0", "path": "/spec/volumes/-"}]),
        json!([{"op": "move", "from": "/spec/containers", "path": "/spec/containers/0/x"}]),
        json!([{"op": "move", "from": "/spec/n", "path": "/spec/n"}]),
        json!([{"op": "test", "path": "/spec/securityContext", "value": {"runAsUser": 5}}]),
        json!([{"op": "test", "path": "/spec/securityContext", "value": {"runAsUser": 6}}]),
        json!([{"op": "test", "path": "/spec/n", "value": 1.5}]),
        // Operations see what the ones before them did.
        json!([
            {"op": "add", "path": "/spec/containers/1/securityContext/runAsUser", "value": 7},
            {"op": "replace", "path": "/spec/containers/1/securityContext/runAsUser", "value": 8},
            {"op": "copy", "from": "/spec/containers/1", "path": "/spec/containers/-"},
            {"op": "add", "path": "/spec/containers/2/name", "value": "c"},
            {"op": "remove", "path": "/spec/containers/0"}
        ]),
    ];
    for operations in &cases {
        same_as_json_patch(&doc, operations);
    }
}

/// What the patch does not touch is written back as it came: numbers keep their digits, and
/// objects their member order and repeated keys (the views, like a `Value`, keep the last).
#[test]
fn what_the_patch_does_not_touch_stays_the_text_it_was() {
    let text = r#"{"spec":{"x":{"b":1.50,"a":1e2,"a":3},"list":[ 1 , {"k":"\u0041"} ],"c":{}}}"#;
    let operations = json!([{"op": "add", "path": "/spec/c/d", "value": 1}]);
    assert_eq!(
        apply(text, &patch_of(&operations), "").unwrap(),
        r#"{"spec":{"c":{"d":1},"list":[ 1 , {"k":"\u0041"} ],"x":{"b":1.50,"a":1e2,"a":3}}}"#
    );
    // An object the patch opens keeps the last of a repeated key, as a `Value` does.
    let operations = json!([{"op": "add", "path": "/spec/x/c", "value": 1}]);
    let patched: Value =
        serde_json::from_str(&apply(text, &patch_of(&operations), "").unwrap()).unwrap();
    assert_eq!(patched["spec"]["x"], json!({"a": 3, "b": 1.5, "c": 1}));
}

/// A template's patch names fields from the object's root: applied to the template's text
/// under its pointer; an operation outside it does not apply.
#[test]
fn a_patch_applies_under_a_prefix_and_nowhere_else() {
    let template = r#"{"spec":{"containers":[{"name":"a"}]}}"#;
    let operations = json!([
        {"op": "add", "path": "/spec/template/spec/securityContext", "value": {"runAsNonRoot": true}},
        {"op": "add", "path": "/spec/template", "value": {"x": 1}}
    ]);
    assert_eq!(
        apply(template, &patch_of(&operations), "/spec/template").unwrap(),
        r#"{"x":1}"#
    );
    for outside in ["/spec/templateX/a", "/spec/other", "/spec"] {
        let operations = json!([{"op": "add", "path": outside, "value": 1}]);
        assert_eq!(
            apply(template, &patch_of(&operations), "/spec/template"),
            None,
            "{outside}"
        );
    }
}

/// A truncated patch (past its bound, not built to the end) is never applied.
#[test]
fn a_truncated_patch_is_not_applied() {
    let mut b = PatchBuilder::default();
    let path = FieldPath::root().keys(["metadata", "annotations"]);
    let big = "v".repeat(crate::patch::MAX_PATCH_BYTES);
    b.add(&path.key("a"), &big);
    b.add(&path.key("b"), "small");
    let patch = b.into_patch();
    assert!(patch.is_truncated());
    assert_eq!(patch.len(), 2);
    assert_eq!(patch.as_bytes(), b"[]");
    assert_eq!(
        apply(r#"{"metadata":{"annotations":{}}}"#, &patch, ""),
        None
    );
}

/// Random patches of every operation on random documents: `apply` agrees with `json_patch`,
/// whether they apply or not.
#[test]
fn random_patches_apply_as_json_patch_applies_them() {
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = move |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    fn doc(next: &mut impl FnMut(u64) -> u64, depth: u32) -> Value {
        match (depth, next(5)) {
            (0, _) | (_, 0) => json!(next(3)),
            (_, 1) => json!(format!("s{}", next(3))),
            (_, 2) | (_, 3) => Value::Object(
                (0..next(4))
                    .map(|_| {
                        (
                            ["a", "b", "c~", "d/"][next(4) as usize].to_string(),
                            doc(next, depth - 1),
                        )
                    })
                    .collect(),
            ),
            _ => Value::Array((0..next(4)).map(|_| doc(next, depth - 1)).collect()),
        }
    }
    fn pointer(next: &mut impl FnMut(u64) -> u64) -> String {
        (0..next(4))
            .map(|_| ["/a", "/b", "/c~0", "/d~1", "/0", "/1", "/2", "/-"][next(8) as usize])
            .collect()
    }
    let mut applied = 0;
    for _ in 0..15_000 {
        let d = doc(&mut next, 3);
        let operations: Vec<Value> = (0..1 + next(3))
            .map(|_| {
                let op = ["add", "remove", "replace", "copy", "move", "test"][next(6) as usize];
                let mut o = json!({"op": op, "path": pointer(&mut next)});
                if matches!(op, "add" | "replace" | "test") {
                    o["value"] = doc(&mut next, 2);
                }
                if matches!(op, "copy" | "move") {
                    o["from"] = json!(pointer(&mut next));
                }
                o
            })
            .collect();
        let operations = Value::Array(operations);
        same_as_json_patch(&d, &operations);
        applied += usize::from(reference(&d, &operations).is_some());
    }
    // Enough of them applied for the comparison to mean something.
    assert!(applied > 500, "{applied}");
}

/// The finding's patch: a mount for each of 370 000 containers, 64 MB of text before it was
/// refused. The builder stops holding operations once it passes its bound: its text never
/// takes more than the bound (and the doubling that reached it), whatever it is asked to
/// write, and it still counts every operation.
#[test]
fn a_builder_past_its_bound_holds_no_more_than_the_bound() {
    let mut b = PatchBuilder::default();
    let containers = FieldPath::root().keys(["spec", "containers"]);
    let n = 370_000;
    for i in 0..n {
        b.append(
            &containers.index(i).key("volumeMounts"),
            json!({"name": "modelgate-model", "mountPath": "/mnt/models", "readOnly": true}),
        );
    }
    assert!(b.truncated);
    assert_eq!(b.len(), n);
    assert!(
        b.json.capacity() <= 2 * crate::patch::MAX_PATCH_BYTES + 4096,
        "{}",
        b.json.capacity()
    );
    let patch = b.into_patch();
    assert!(patch.is_truncated() && patch.len() == n && patch.as_bytes() == b"[]");
    // Just under the bound, nothing is lost.
    let mut b = PatchBuilder::default();
    b.add(&containers, "v".repeat(crate::patch::MAX_PATCH_BYTES - 100));
    let patch = b.into_patch();
    assert!(!patch.is_truncated());
    assert_eq!(patch.operations().0.len(), 1);
}
