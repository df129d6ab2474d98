//! The LLM serving pod of benches/reviews as the template of a Deployment, compact: what
//! `/validate` is sent for a controller (SPEC.md §11: it mutates the template in memory, then
//! judges it; `/mutate` never patches a controller).

/// The review of a Deployment whose template is `llm-serving-pod.json`'s pod, from `dir`.
pub fn llm_deployment_review(dir: &std::path::Path) -> Vec<u8> {
    let pretty = std::fs::read(dir.join("llm-serving-pod.json")).expect("reference review");
    let mut review: serde_json::Value = serde_json::from_slice(&pretty).expect("JSON");
    let request = &mut review["request"];
    let pod = request["object"].take();
    let labels = pod["metadata"]["labels"].clone();
    request["kind"] = serde_json::json!({"group": "apps", "version": "v1", "kind": "Deployment"});
    request["resource"] =
        serde_json::json!({"group": "apps", "version": "v1", "resource": "deployments"});
    request["object"] = serde_json::json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "llm", "namespace": pod["metadata"]["namespace"].clone()},
        "spec": {"replicas": 2, "selector": {"matchLabels": labels},
                 "template": {"metadata": pod["metadata"].clone(), "spec": pod["spec"].clone()}},
    });
    serde_json::to_vec(&review).expect("JSON")
}
