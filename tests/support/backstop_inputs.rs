//! The inputs the backstop's tests share (`tests/backstop.rs`, `tests/backstop_mutating.rs`):
//! the webhooks in process with the cache state of the generated cache hits, the corpus'
//! objects, the generated pods, and the label selection as the API server reads it.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use modelgate::admission::{self, Webhook};
use modelgate::cache::CacheIndex;
use modelgate::config::PolicyConfig;
use modelgate::documents::read_documents;
use modelgate::namespaces::Namespaces;
use modelgate::policy::Caches;
use modelgate_core::testing::{self, Answer};
use serde_json::{Value, json};

/// A label selector, as the API server reads one.
pub fn selects(selector: &Value, labels: &BTreeMap<String, String>) -> bool {
    let by_labels = selector["matchLabels"]
        .as_object()
        .into_iter()
        .flatten()
        .all(|(k, v)| labels.get(k).map(String::as_str) == v.as_str());
    let by_expressions = selector["matchExpressions"]
        .as_array()
        .into_iter()
        .flatten()
        .all(|e| {
            let value = labels.get(e["key"].as_str().unwrap());
            let values: Vec<&str> = e["values"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            match e["operator"].as_str().unwrap() {
                "In" => value.is_some_and(|v| values.contains(&v.as_str())),
                "NotIn" => value.is_none_or(|v| !values.contains(&v.as_str())),
                "Exists" => value.is_some(),
                "DoesNotExist" => value.is_none(),
                op => panic!("operator {op}"),
            }
        });
    by_labels && by_expressions
}

pub fn enforce_labels() -> BTreeMap<String, String> {
    BTreeMap::from([("modelgate.io/inject".to_string(), "enabled".to_string())])
}

pub struct Webhooks {
    pub cfg: PolicyConfig,
    pub index: CacheIndex,
    pub namespaces: Namespaces,
}

impl Webhooks {
    pub fn new(cfg: PolicyConfig) -> Self {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/reviews");
        let hits = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(hits.path(), serde_json::to_vec(&cache_hit_state()).unwrap()).unwrap();
        let (index, _) =
            modelgate::cache::load_files(&[dir.join("caches.json"), hits.path().into()])
                .expect("caches");
        Webhooks {
            cfg,
            index,
            namespaces: Namespaces::default(),
        }
    }

    pub fn call(&self, webhook: Webhook, review: &Value) -> Answer {
        let ctx = admission::Context {
            config: &self.cfg,
            caches: Caches::Ready(&self.index),
            namespaces: &self.namespaces,
            now: None,
        };
        testing::review(webhook, review, &ctx)
    }
}

/// The node counts of the generated cache hits: a model downloaded on 1, 2 and 50 nodes, each
/// pinned by the hit's node affinity (docs/policy.md §5).
pub const HIT_NODES: [usize; 3] = [1, 2, 50];

/// A cluster `LocalModelCache` `hf://org/model-N` per [`HIT_NODES`], downloaded on every node of
/// its group `group-N`, with the PVC KServe makes in team-a: what a hit needs.
pub fn cache_hit_state() -> Value {
    let mut items = Vec::new();
    for n in HIT_NODES {
        let (group, pool) = (format!("group-{n}"), format!("pool-{n}"));
        items.push(json!({"apiVersion": "serving.kserve.io/v1alpha1", "kind": "LocalModelNodeGroup",
            "metadata": {"name": group},
            "spec": {"storageLimit": "100Gi", "persistentVolumeSpec": {"capacity": {"storage": "100Gi"},
                "local": {"path": "/models"},
                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "pool", "operator": "In", "values": [pool]}]}]}}}}}));
        let mut status = serde_json::Map::new();
        for i in 0..n {
            let node = format!("{pool}-node-{i}");
            items.push(json!({"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": node, "labels": {"pool": pool, "kubernetes.io/hostname": node}}}));
            status.insert(node, json!("NodeDownloaded"));
        }
        let cache = format!("model-{n}");
        items.push(json!({"apiVersion": "serving.kserve.io/v1alpha1", "kind": "LocalModelCache",
            "metadata": {"name": cache},
            "spec": {"sourceModelUri": format!("hf://org/model-{n}"), "modelSize": "10Gi", "nodeGroups": [group]},
            "status": {"nodeStatus": status}}));
        items.push(json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": format!("{cache}-{group}"), "namespace": "team-a"},
            "spec": {"accessModes": ["ReadOnlyMany"]}, "status": {"phase": "Bound"}}));
    }
    json!({"apiVersion": "v1", "kind": "List", "items": items})
}

/// Pods whose model URI hits a cache of [`cache_hit_state`]: the patch adds the model volume,
/// its read-only mounts and the node affinity to the hit's nodes.
pub fn cache_hit_pods() -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for n in HIT_NODES {
        for (what, sc) in [
            ("plain", Value::Null),
            ("pod nonroot", json!({"runAsNonRoot": true})),
        ] {
            let mut pod = json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": format!("hit-{n}"), "namespace": "team-a",
                    "annotations": {"modelgate.io/model-uri": format!("hf://org/model-{n}/weights")}},
                "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.6.0",
                    "volumeMounts": [{"name": "model-cache", "mountPath": "/models"}]}],
                    "volumes": [{"name": "model-cache", "persistentVolumeClaim": {"claimName": "scratch"}}]}});
            if !sc.is_null() {
                pod["spec"]["securityContext"] = sc;
            }
            out.push((format!("cache hit on {n} nodes, {what}"), pod));
        }
    }
    out
}

/// Pods that exercise every branch of the prep and the security fields.
pub fn generated_pods() -> Vec<(String, Value)> {
    let pvc = json!({"name": "model-cache", "persistentVolumeClaim": {"claimName": "models"}});
    let mut out = Vec::new();
    let pod = |name: &str, spec: Value, annotations: Value| {
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": "team-a", "annotations": annotations},
               "spec": spec})
    };
    let container = |name: &str, sc: Value| {
        let mut c = json!({"name": name, "image": "vllm/vllm-openai:v0.6.0",
            "volumeMounts": [{"name": "model-cache", "mountPath": "/models"}],
            "resources": {"requests": {"cpu": "2", "memory": "8Gi"}, "limits": {"cpu": "2", "memory": "8Gi"}}});
        if !sc.is_null() {
            c["securityContext"] = sc;
        }
        c
    };
    let pod_scs = [
        ("no pod securityContext", Value::Null),
        ("pod fsGroup 2000", json!({"fsGroup": 2000})),
        ("pod uid 5000", json!({"runAsUser": 5000})),
        ("pod nonroot", json!({"runAsNonRoot": true})),
        (
            "pod nonroot false",
            json!({"runAsNonRoot": false, "runAsUser": 1000}),
        ),
        ("pod uid 0", json!({"runAsUser": 0})),
        (
            "pod gid -1",
            json!({"runAsGroup": -1, "fsGroup": 3_000_000_000i64}),
        ),
    ];
    let container_scs = [
        ("plain", Value::Null),
        ("nonroot false", json!({"runAsNonRoot": false})),
        ("uid 0", json!({"runAsUser": 0})),
        ("nonroot", json!({"runAsNonRoot": true, "runAsUser": 1001})),
    ];
    let volumes = [
        ("pvc", json!([pvc])),
        ("emptyDir", json!([{"name": "model-cache", "emptyDir": {}}])),
        (
            "annotated nfs",
            json!([{"name": "weights", "nfs": {"server": "nfs", "path": "/m"}}]),
        ),
        ("none", Value::Null),
    ];
    for (pn, psc) in &pod_scs {
        for (cn, csc) in &container_scs {
            for (vn, vols) in &volumes {
                let mut spec = json!({"containers": [container("server", csc.clone())]});
                if !psc.is_null() {
                    spec["securityContext"] = psc.clone();
                }
                if !vols.is_null() {
                    spec["volumes"] = vols.clone();
                }
                let annotations = if *vn == "annotated nfs" {
                    json!({"modelgate.io/cache-volume": "weights"})
                } else {
                    json!({})
                };
                out.push((format!("{pn} / {cn} / {vn}"), pod("p", spec, annotations)));
            }
        }
    }
    // Windows pods, by spec.os and by nodeSelector; init and ephemeral containers.
    let windows = json!({"os": {"name": "windows"}, "volumes": [pvc],
        "containers": [{"name": "w", "image": "mcr.microsoft.com/windows/servercore"}]});
    out.push(("windows by os".into(), pod("w", windows, json!({}))));
    let by_selector = json!({"nodeSelector": {"kubernetes.io/os": "windows"}, "volumes": [pvc],
        "containers": [{"name": "w", "image": "mcr.microsoft.com/windows/servercore"}]});
    out.push((
        "windows by nodeSelector".into(),
        pod("w", by_selector, json!({})),
    ));
    let with_init = json!({"volumes": [pvc],
        "initContainers": [{"name": "fetch", "image": "busybox", "securityContext": {"runAsNonRoot": false}}],
        "containers": [{"name": "c", "image": "busybox"}],
        "ephemeralContainers": [{"name": "debug", "image": "busybox", "securityContext": {"runAsUser": 0}}]});
    out.push(("init and ephemeral".into(), pod("i", with_init, json!({}))));
    // A Job and controllers with the same pod.
    let template = json!({"metadata": {"labels": {"app": "x"}},
        "spec": {"restartPolicy": "Never", "volumes": [pvc],
                 "containers": [{"name": "c", "image": "busybox", "securityContext": {"runAsUser": 0}}]}});
    out.push((
        "job".into(),
        json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"},
               "spec": {"template": template}}),
    ));
    out.push((
        "deployment".into(),
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
               "spec": {"selector": {"matchLabels": {"app": "x"}}, "template": template}}),
    ));
    out.push((
        "cronjob".into(),
        json!({"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "cj"},
               "spec": {"schedule": "* * * * *", "jobTemplate": {"spec": {"template": template}}}}),
    ));
    out
}

/// Every Kubernetes object of the corpus in `dir` (`cli::corpus_dir()`; none without it), and
/// the objects of its CREATE AdmissionReviews.
pub fn corpus_objects(dir: Option<PathBuf>) -> Vec<(String, Value)> {
    let Some(dir) = dir else {
        return Vec::new();
    };
    let mut files = Vec::new();
    let mut stack = vec![dir];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap().flatten() {
            let p = entry.path();
            if p.is_dir() {
                stack.push(p);
            } else if matches!(
                p.extension().and_then(|e| e.to_str()),
                Some("yaml" | "yml" | "json")
            ) && !p.ends_with("_manifest.json")
            {
                files.push(p);
            }
        }
    }
    files.sort();
    let mut out = Vec::new();
    for p in files {
        let text = std::fs::read_to_string(&p).unwrap();
        let Ok(docs) = read_documents(&p.display().to_string(), &text) else {
            continue;
        };
        for d in docs {
            let v = d.value;
            let object = if v.get("request").is_some() {
                v["request"]["object"].clone()
            } else if v.get("uid").is_some() && v.get("object").is_some() {
                v["object"].clone()
            } else {
                v
            };
            if object.get("kind").is_some() && object.get("spec").is_some() {
                out.push((d.origin, object));
            }
        }
    }
    out
}

/// A pod of `n` containers and `n` init containers, each with `env` variables and this
/// securityContext (none when null).
pub fn large_pod(n: usize, init: usize, env: usize, security_context: &Value) -> Value {
    let container = |prefix: &str, i: usize| {
        let mut c = json!({"name": format!("{prefix}-{i}"), "image": "registry.example/app:1",
            "env": (0..env).map(|e| json!({"name": format!("VARIABLE_{e}"), "value": format!("value-{e}")}))
                .collect::<Vec<_>>()});
        if env == 0 {
            c.as_object_mut().unwrap().remove("env");
        }
        if !security_context.is_null() {
            c["securityContext"] = security_context.clone();
        }
        c
    };
    let mut spec = json!({"containers": (0..n).map(|i| container("app", i)).collect::<Vec<_>>()});
    if init > 0 {
        spec["initContainers"] = json!((0..init).map(|i| container("init", i)).collect::<Vec<_>>());
    }
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "large", "namespace": "team-a"},
        "spec": spec})
}
