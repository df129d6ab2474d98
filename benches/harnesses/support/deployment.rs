//! The LLM serving pod of benches/reviews as the template of a Deployment, or as both templates
//! of a RayCluster (head and one worker group), compact: what `/validate` is sent for a
//! controller or an ML workload custom resource (docs/policy.md §11, §12: each template is mutated in
//! memory, then judged; `/mutate` never patches them).

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

/// The review of a RayCluster whose head and one worker group both run `llm-serving-pod.json`'s
/// pod, from `dir`: two complete templates (docs/policy.md §12).
#[allow(dead_code)] // benches/pipeline.rs includes this module for the Deployment only.
pub fn llm_raycluster_review(dir: &std::path::Path) -> Vec<u8> {
    let pretty = std::fs::read(dir.join("llm-serving-pod.json")).expect("reference review");
    let mut review: serde_json::Value = serde_json::from_slice(&pretty).expect("JSON");
    let request = &mut review["request"];
    let pod = request["object"].take();
    let template =
        serde_json::json!({"metadata": pod["metadata"].clone(), "spec": pod["spec"].clone()});
    request["kind"] = serde_json::json!({"group": "ray.io", "version": "v1", "kind": "RayCluster"});
    request["resource"] =
        serde_json::json!({"group": "ray.io", "version": "v1", "resource": "rayclusters"});
    request["object"] = serde_json::json!({
        "apiVersion": "ray.io/v1", "kind": "RayCluster",
        "metadata": {"name": "llm", "namespace": pod["metadata"]["namespace"].clone()},
        "spec": {"headGroupSpec": {"rayStartParams": {}, "template": template.clone()},
                 "workerGroupSpecs": [{"groupName": "gpu", "replicas": 2, "rayStartParams": {},
                                       "template": template}]},
    });
    serde_json::to_vec(&review).expect("JSON")
}
