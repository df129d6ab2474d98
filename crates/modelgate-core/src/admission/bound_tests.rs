//! The bound of one object (docs/security.md, "Memory: bounded by the flags, not the body"): a
//! pod whose lists hold more elements than an object the API server stores can is denied as too
//! large, naming the list, before its views are built past the bound; a patch stops being built
//! once it passes its own bound; an UPDATE's templates are compared without a tree.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::*;
use crate::cache::CacheIndex;
use crate::kinds::WorkloadKinds;
use crate::namespaces::{MODE_LABEL, NamespaceLabels};
use crate::policy::view::{self, ELEMENT_BYTES, MAX_STORED_OBJECT_BYTES, NAMED_ELEMENT_BYTES};

/// The most elements of one kind a pod's lists can hold, alone.
const MOST_NAMED: usize = MAX_STORED_OBJECT_BYTES / NAMED_ELEMENT_BYTES;
const MOST_OTHER: usize = MAX_STORED_OBJECT_BYTES / ELEMENT_BYTES;

const MARKER: &str = "\"bound-tests-marker\"";

fn benches() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../benches/reviews")
}

/// The LLM serving pod's review, a model cache hit with the index of [`index`].
fn llm_review() -> Value {
    serde_json::from_slice(&std::fs::read(benches().join("llm-serving-pod.json")).unwrap()).unwrap()
}

fn index() -> CacheIndex {
    let list: Value =
        serde_json::from_slice(&std::fs::read(benches().join("caches.json")).unwrap()).unwrap();
    let mut index = CacheIndex::new();
    for item in list["items"].as_array().unwrap() {
        index.insert_object(item).unwrap();
    }
    index
}

/// The pod of `review` as the template of a Deployment.
fn as_deployment(review: &mut Value) {
    let request = &mut review["request"];
    let pod = request["object"].take();
    request["kind"] = json!({"group": "apps", "version": "v1", "kind": "Deployment"});
    request["resource"] = json!({"group": "apps", "version": "v1", "resource": "deployments"});
    request["object"] = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "llm", "namespace": pod["metadata"]["namespace"]},
        "spec": {"selector": {"matchLabels": {"app": "llama3"}},
                 "template": {"metadata": pod["metadata"], "spec": pod["spec"]}},
    });
}

/// The body of `review` with the value at `pointer` set to a list of `n` elements made by
/// `element` (written as text: a `Value` of 380 000 elements would be slow to build).
fn with_list(
    mut review: Value,
    pointer: &str,
    n: usize,
    element: impl Fn(usize) -> String,
) -> Vec<u8> {
    *review.pointer_mut(pointer).expect(pointer) = serde_json::from_str(MARKER).unwrap();
    let text = review.to_string();
    let mut list = String::from("[");
    for i in 0..n {
        if i > 0 {
            list.push(',');
        }
        list.push_str(&element(i));
    }
    list.push(']');
    text.replacen(MARKER, &list, 1).into_bytes()
}

struct Answered {
    allowed: bool,
    code: Option<u64>,
    message: String,
    warnings: Vec<String>,
    patch: bool,
}

fn answer(webhook: Webhook, body: &[u8], index: &CacheIndex, namespaces: &Namespaces) -> Answered {
    let config = PolicyConfig::default();
    let ctx = Context {
        config: &config,
        caches: Caches::Ready(index),
        namespaces,
        now: None,
    };
    let out = review(webhook, body, &ctx);
    assert_eq!(
        out.http_status,
        200,
        "{}",
        String::from_utf8_lossy(&out.body)
    );
    let body: Value = serde_json::from_slice(&out.body).unwrap();
    let response = &body["response"];
    Answered {
        allowed: response["allowed"] == true,
        code: response["status"]["code"].as_u64(),
        message: response["status"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        warnings: response["warnings"]
            .as_array()
            .map(|w| w.iter().map(|w| w.as_str().unwrap().to_string()).collect())
            .unwrap_or_default(),
        patch: response.get("patch").is_some(),
    }
}

/// Denied as too large (HTTP 200, `allowed: false`, code 403, as the patch's bound is), naming
/// `list` and the bound of its kind of element.
fn assert_too_large(a: &Answered, list: &str, most: usize) {
    assert!(!a.allowed && !a.patch, "{}", a.message);
    assert_eq!(a.code, Some(403));
    let expected = format!(
        "{list}: the pod has more list elements than an object the API server stores can hold"
    );
    assert!(a.message.starts_with(&expected), "{}", a.message);
    assert!(
        a.message.contains(&format!("alone holds at most {most})")),
        "{}",
        a.message
    );
    assert!(a.message.contains("Split the workload"), "{}", a.message);
}

/// The finding's Deployment: a template of 380 000 volumes (7 MB) took a decision from 17 MB
/// to 359 MB of memory, its template decoded, patched and decoded again as a tree. Its lists
/// cannot be stored (5 bytes a volume at the least: 314 572 fit in 1.5 MiB), so it is denied
/// naming the template's volumes.
#[test]
fn a_deployment_of_380000_volumes_is_denied_as_too_large_naming_its_volumes() {
    let mut review = llm_review();
    as_deployment(&mut review);
    let body = with_list(
        review,
        "/request/object/spec/template/spec/volumes",
        380_000,
        |i| format!(r#"{{"name":"v{i}","emptyDir":{{}}}}"#),
    );
    assert!(body.len() > 10_000_000, "{}", body.len());
    let a = answer(Webhook::Validate, &body, &index(), Namespaces::none());
    assert_too_large(&a, "spec.template.spec.volumes", MOST_NAMED);
}

/// The finding's Pod: 370 000 containers and a model cache hit, whose patch (a mount per
/// container) reached 64 MB before it was refused. Denied as too large by both webhooks, its
/// patch never started; the same whether the object came after the request's kind (decoded in
/// one pass) or before it.
#[test]
fn a_pod_of_370000_containers_with_a_cache_hit_is_denied_before_any_patch_is_built() {
    let index = index();
    let body = with_list(
        llm_review(),
        "/request/object/spec/containers",
        370_000,
        |i| format!(r#"{{"name":"c{i}"}}"#),
    );
    for webhook in [Webhook::Mutate, Webhook::Validate] {
        let a = answer(webhook, &body, &index, Namespaces::none());
        assert_too_large(&a, "spec.containers", MOST_NAMED);
    }
    // The object before the request's kind: kept as text, then decoded on its own.
    let object = with_list(
        llm_review()["request"]["object"].clone(),
        "/spec/containers",
        370_000,
        |i| format!(r#"{{"name":"c{i}"}}"#),
    );
    let object_first = format!(
        r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{{"object":{},"uid":"u","kind":{{"group":"","version":"v1","kind":"Pod"}},"namespace":"team-a","operation":"CREATE"}}}}"#,
        String::from_utf8(object).unwrap()
    );
    let a = answer(
        Webhook::Mutate,
        object_first.as_bytes(),
        &index,
        Namespaces::none(),
    );
    assert_too_large(&a, "spec.containers", MOST_NAMED);
    // Below the bound, the same pod with 2 000 containers is answered with its patch.
    let body = with_list(
        llm_review(),
        "/request/object/spec/containers",
        2_000,
        |i| format!(r#"{{"name":"c{i}"}}"#),
    );
    let a = answer(Webhook::Mutate, &body, &index, Namespaces::none());
    assert!(a.allowed && a.patch, "{}", a.message);
}

/// The bound is exact: as many elements as fit in 1.5 MiB at their smallest decode, one more
/// does not, whichever lists they are in.
#[test]
fn the_bound_is_what_fits_in_what_etcd_stores_at_the_smallest_encoding() {
    let pod = |volumes: usize, values: usize| {
        let volumes = vec!["{}"; volumes].join(",");
        let values = vec!["\"\""; values].join(",");
        format!(
            r#"{{"spec":{{"volumes":[{volumes}],"affinity":{{"nodeAffinity":{{"requiredDuringSchedulingIgnoredDuringExecution":{{"nodeSelectorTerms":[{{"matchExpressions":[{{"values":[{values}]}}]}}]}}}}}}}}}}"#
        )
    };
    // One term (2 bytes) and one requirement (5) besides the volumes and values.
    let room = MAX_STORED_OBJECT_BYTES - ELEMENT_BYTES - NAMED_ELEMENT_BYTES;
    let volumes = room / NAMED_ELEMENT_BYTES;
    let values = (room - volumes * NAMED_ELEMENT_BYTES) / ELEMENT_BYTES;
    let fits = pod(volumes, values);
    assert!(view::decode_pod(&fits).is_ok());
    // An element is charged once it is read, after what it holds: the value that does not fit
    // leaves no room for the term around it.
    let failure = view::decode_pod(&pod(volumes, values + 1)).unwrap_err();
    assert!(failure.too_large, "{failure:?}");
    assert_eq!(
        failure.path,
        "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms"
    );
    assert!(
        failure.message.ends_with(&format!(
            "(a list of other elements alone holds at most {MOST_OTHER})"
        )),
        "{}",
        failure.message
    );
    // One list alone: exactly as many as fit.
    let volumes = |n: usize| format!(r#"{{"spec":{{"volumes":[{}]}}}}"#, vec!["{}"; n].join(","));
    assert!(view::decode_pod(&volumes(MOST_NAMED)).is_ok());
    let over = volumes(MOST_NAMED + 1);
    let failure = view::decode_pod(&over).unwrap_err();
    assert!(failure.too_large);
    assert_eq!(failure.path, "spec.volumes");
    // The same views outside a decode of the pipeline are not bounded (a tool, a test).
    assert!(serde_json::from_str::<view::PodView>(&over).is_ok());
}

/// The denial names the list where the elements ran out, however deep: a container's mounts,
/// a map of the metadata, a volume of many keys; and a Job's template as the Job's own path.
#[test]
fn the_denial_names_the_list_where_the_elements_ran_out() {
    let index = CacheIndex::new();
    let n = MOST_NAMED + 1;
    let cases = [
        (
            "/request/object/spec/containers/0/volumeMounts",
            "spec.containers[0].volumeMounts",
            MOST_NAMED,
        ),
        (
            "/request/object/spec/initContainers",
            "spec.initContainers",
            MOST_NAMED,
        ),
    ];
    for (pointer, list, most) in cases {
        let body = with_list(llm_review(), pointer, n, |i| {
            format!(r#"{{"name":"m","mountPath":"/m/{i}"}}"#)
        });
        let a = answer(Webhook::Mutate, &body, &index, Namespaces::none());
        assert_too_large(&a, list, most);
    }
    // A map: its entries are charged as named elements.
    let mut review = llm_review();
    let annotations: serde_json::Map<String, Value> =
        (0..n).map(|i| (format!("a{i}"), json!(""))).collect();
    review["request"]["object"]["metadata"]["annotations"] = Value::Object(annotations);
    let body = serde_json::to_vec(&review).unwrap();
    let a = answer(Webhook::Validate, &body, &index, Namespaces::none());
    assert_too_large(&a, "metadata.annotations", MOST_NAMED);
    // A volume of many keys (each a source to tell apart): the volume is named.
    let mut review = llm_review();
    let volume: serde_json::Map<String, Value> = (0..MOST_OTHER + 1)
        .map(|i| (format!("k{i}"), json!(null)))
        .collect();
    review["request"]["object"]["spec"]["volumes"] = json!([{"name": "a"}, volume]);
    let body = serde_json::to_vec(&review).unwrap();
    let a = answer(Webhook::Validate, &body, &index, Namespaces::none());
    assert_too_large(&a, "spec.volumes[1]", MOST_OTHER);
    // A Deployment's own metadata, read with its templates.
    let mut review = llm_review();
    as_deployment(&mut review);
    let annotations: serde_json::Map<String, Value> =
        (0..n).map(|i| (format!("a{i}"), json!(""))).collect();
    review["request"]["object"]["metadata"]["annotations"] = Value::Object(annotations);
    let body = serde_json::to_vec(&review).unwrap();
    let a = answer(Webhook::Validate, &body, &index, Namespaces::none());
    assert_too_large(&a, "metadata.annotations", MOST_NAMED);
    // A Job: the template's list, by the Job's path.
    let mut review = llm_review();
    let pod = review["request"]["object"].take();
    review["request"]["kind"] = json!({"group": "batch", "version": "v1", "kind": "Job"});
    review["request"]["object"] = json!({"kind": "Job", "spec": {"template": pod}});
    let body = with_list(
        review,
        "/request/object/spec/template/spec/volumes",
        n,
        |_| "{}".into(),
    );
    let a = answer(Webhook::Mutate, &body, &index, Namespaces::none());
    assert_too_large(&a, "spec.template.spec.volumes", MOST_NAMED);
}

/// Where nothing is denied (`warn`), the bound is a warning of what `enforce` would deny; the
/// decode is bounded all the same.
#[test]
fn in_warn_mode_a_pod_too_large_is_allowed_with_what_enforce_would_deny() {
    let mut namespaces = Namespaces::default();
    let labels: BTreeMap<String, String> = [(MODE_LABEL.to_string(), "warn".to_string())].into();
    namespaces.set("ns-warn", NamespaceLabels::from_labels(&labels));
    let mut review = llm_review();
    review["request"]["namespace"] = json!("ns-warn");
    review["request"]["object"]["metadata"]["namespace"] = json!("ns-warn");
    let body = with_list(
        review,
        "/request/object/spec/volumes",
        MOST_NAMED + 1,
        |_| "{}".into(),
    );
    for webhook in [Webhook::Mutate, Webhook::Validate] {
        let a = answer(webhook, &body, &CacheIndex::new(), &namespaces);
        assert!(a.allowed && !a.patch, "{}", a.message);
        assert!(
            a.warnings.iter().any(|w| w.starts_with(
                "would deny: spec.volumes: the pod has more list elements than an object"
            )),
            "{:?}",
            a.warnings
        );
    }
}

/// A pod whose patch passes its bound is denied as before, and the patch was never held past
/// the bound; in `warn` (nothing patched) the pod is judged as it came.
#[test]
fn a_patch_stops_being_built_past_its_bound() {
    let containers = |n: usize| {
        with_list(llm_review(), "/request/object/spec/containers", n, |i| {
            format!(r#"{{"name":"c{i}","securityContext":{{"runAsNonRoot":false}}}}"#)
        })
    };
    let index = index();
    let a = answer(
        Webhook::Mutate,
        &containers(40_000),
        &index,
        Namespaces::none(),
    );
    assert!(!a.allowed && !a.patch);
    assert_eq!(a.code, Some(403));
    assert!(
        a.message.starts_with(
            "spec: the pod is too large for the changes modelgate must make: their patch is over \
             1048576 bytes"
        ),
        "{}",
        a.message
    );
    let a = answer(
        Webhook::Mutate,
        &containers(200),
        &index,
        Namespaces::none(),
    );
    assert!(a.allowed && a.patch, "{}", a.message);
}

/// An UPDATE whose templates are the same values in other texts (members in another order,
/// repeated keys, whitespace) is not judged, as before; one whose template changed is. Compared
/// without a tree of either.
#[test]
fn an_update_compares_templates_as_values_without_a_tree() {
    let deployment = |template: &str| {
        format!(
            r#"{{"apiVersion":"apps/v1","kind":"Deployment","metadata":{{"name":"d","namespace":"team-a"}},"spec":{{"template":{template}}}}}"#
        )
    };
    let body = |object: &str, old: &str| {
        format!(
            r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{{"uid":"u","kind":{{"group":"apps","version":"v1","kind":"Deployment"}},"namespace":"team-a","operation":"UPDATE","object":{object},"oldObject":{old}}}}}"#
        )
    };
    // A root container: judged, it would be denied.
    let root = r#"{"spec":{"containers":[{"name":"a","image":"x","securityContext":{"runAsUser":0,"runAsGroup":1}}]}}"#;
    let same = r#"{ "spec" : {"containers":[{"securityContext":{"runAsGroup":1,"runAsUser":7,"runAsUser":0},"image":"x","name":"a"}]}}"#;
    let changed = [
        r#"{"spec":{"containers":[{"name":"a","image":"y","securityContext":{"runAsUser":0,"runAsGroup":1}}]}}"#,
        r#"{"spec":{"containers":[{"name":"a","image":"x","securityContext":{"runAsUser":0,"runAsGroup":1.0}}]}}"#,
        r#"{"spec":{"containers":[{"name":"a","image":"x","securityContext":{"runAsUser":0}}]}}"#,
    ];
    let index = CacheIndex::new();
    let a = answer(
        Webhook::Validate,
        body(&deployment(root), &deployment(same)).as_bytes(),
        &index,
        Namespaces::none(),
    );
    assert!(a.allowed, "an unchanged template was judged: {}", a.message);
    for old in changed {
        let a = answer(
            Webhook::Validate,
            body(&deployment(root), &deployment(old)).as_bytes(),
            &index,
            Namespaces::none(),
        );
        assert!(!a.allowed, "a changed template was not judged: {old}");
    }
    // Canonical texts: as `serde_json::Value` compares.
    for (a, b, equal) in [
        (
            r#"{"a":1,"b":[1,{"c":"\u0041"}]}"#,
            r#"{"b":[1,{"c":"A"}],"a":1}"#,
            true,
        ),
        (r#"{"a":1,"a":2}"#, r#"{"a":2}"#, true),
        (r#"{"a":1}"#, r#"{"a":1.0}"#, false),
        (r#"[1,2]"#, r#"[2,1]"#, false),
        (r#"{"a":null}"#, r#"{}"#, false),
    ] {
        let values_equal =
            serde_json::from_str::<Value>(a).unwrap() == serde_json::from_str::<Value>(b).unwrap();
        assert_eq!(values_equal, equal, "{a} {b}");
        assert_eq!(
            templates::canonical(a) == templates::canonical(b),
            equal,
            "{a} {b}"
        );
    }
}

/// A text shorter than `SHORTEST_TOO_LARGE` cannot pass the bound (it is decoded without being
/// counted first, in one pass with its review): the densest charged text, empty named elements,
/// just fits. A longer text is counted first, keeping nothing, and decoded whole when it fits.
#[test]
fn only_a_text_long_enough_to_pass_the_bound_is_counted_first() {
    let shortest = view::SHORTEST_TOO_LARGE;
    let densest = |len: usize| {
        let (open, close) = (r#"{"spec":{"volumes":["#, "]}}");
        let n = (len - open.len() - close.len() + 1) / 3;
        let text = format!("{open}{}{close}", vec!["{}"; n].join(","));
        assert!(text.len() <= len && text.len() + 3 > len);
        text
    };
    let text = densest(shortest - 1);
    let serde_view: view::PodView = serde_json::from_str(&text).unwrap();
    let count = serde_view.spec.unwrap().volumes().len();
    assert!(
        count * NAMED_ELEMENT_BYTES <= MAX_STORED_OBJECT_BYTES,
        "{count}"
    );
    assert!(view::decode_pod(&text).is_ok());
    // Long, within the bound: one annotation of a megabyte, and volumes.
    let long = format!(
        r#"{{"metadata":{{"annotations":{{"a":"{}"}}}},"spec":{{"volumes":[{}]}}}}"#,
        "x".repeat(shortest),
        vec![r#"{"name":"v","emptyDir":{}}"#; 1000].join(",")
    );
    let pod = view::decode_pod(&long).unwrap();
    assert_eq!(pod.spec.unwrap().volumes().len(), 1000);
    assert_eq!(
        pod.metadata
            .unwrap()
            .annotations
            .unwrap()
            .get("a")
            .map(str::len),
        Some(shortest)
    );
}

/// A partial template (an InferenceService's predictor, merged with more by its controller) is
/// judged on its fields and only warned of; but one whose lists pass what an object the API
/// server stores can hold makes the object itself unstorable, and is denied as too large.
#[test]
fn a_partial_template_too_large_to_be_stored_is_denied() {
    let object = |predictor: &str| {
        format!(
            r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{{"uid":"u","kind":{{"group":"serving.kserve.io","version":"v1beta1","kind":"InferenceService"}},"namespace":"team-a","operation":"CREATE","object":{{"apiVersion":"serving.kserve.io/v1beta1","kind":"InferenceService","metadata":{{"name":"i","namespace":"team-a"}},"spec":{{"predictor":{predictor}}}}}}}}}"#
        )
    };
    let index = CacheIndex::new();
    let root = r#"{"containers":[{"name":"a","securityContext":{"runAsUser":0}}]}"#;
    let a = answer(
        Webhook::Validate,
        object(root).as_bytes(),
        &index,
        Namespaces::none(),
    );
    assert!(a.allowed, "{}", a.message);
    assert!(!a.warnings.is_empty());
    let containers = vec![r#"{"name":"c"}"#; MOST_NAMED + 1].join(",");
    let body = object(&format!(r#"{{"containers":[{containers}]}}"#));
    let a = answer(
        Webhook::Validate,
        body.as_bytes(),
        &index,
        Namespaces::none(),
    );
    assert_too_large(&a, "spec.predictor.containers", MOST_NAMED);
}

/// A found template keeps only the keys and indices its row's wildcards took (a few dozen
/// bytes, borrowed from the object's text); its path and pointer are the same as before.
#[test]
fn a_found_template_keeps_its_path_and_pointer() {
    let table = WorkloadKinds::default();
    let ray = table.find("ray.io", "v1", "RayCluster").unwrap();
    let object = r#"{"spec":{"headGroupSpec":{"template":{"spec":{}}},"workerGroupSpecs":[{"template":{}},{"x":1},{"template":{"metadata":{}}}]}}"#;
    let found: Vec<(String, String)> = templates_of(ray, object)
        .unwrap()
        .into_iter()
        .map(|t| (t.path, t.pointer))
        .collect();
    assert_eq!(
        found,
        [
            (
                "spec.headGroupSpec.template".into(),
                "/spec/headGroupSpec/template".into()
            ),
            (
                "spec.workerGroupSpecs[0].template".into(),
                "/spec/workerGroupSpecs/0/template".into()
            ),
            (
                "spec.workerGroupSpecs[2].template".into(),
                "/spec/workerGroupSpecs/2/template".into()
            ),
        ]
    );
    let pytorch = table.find("kubeflow.org", "v1", "PyTorchJob").unwrap();
    let object =
        r#"{"spec":{"pytorchReplicaSpecs":{"Master":{"template":{}},"W/o~rker":{"template":{}}}}}"#;
    let found: Vec<(String, String)> = templates_of(pytorch, object)
        .unwrap()
        .into_iter()
        .map(|t| (t.path, t.pointer))
        .collect();
    assert_eq!(
        found,
        [
            (
                "spec.pytorchReplicaSpecs.Master.template".into(),
                "/spec/pytorchReplicaSpecs/Master/template".into()
            ),
            (
                "spec.pytorchReplicaSpecs.W/o~rker.template".into(),
                "/spec/pytorchReplicaSpecs/W~1o~0rker/template".into()
            ),
        ]
    );
}
