//! SPEC.md §4: the `model-cache-prep` init container that gives the cache root its owner and mode.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Capabilities, Container, ResourceRequirements, SeccompProfile, SecurityContext, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::view::VolumeView;
use super::workload::Workload;
use crate::config::{PREP_CONTAINER, PolicyConfig, PrepMode};

/// Per-pod override of `--cache-volume`.
pub(super) const CACHE_VOLUME_ANNOTATION: &str = "modelgate.io/cache-volume";

/// The name of the pod's writable model cache volume.
pub(super) fn cache_volume_name<'a>(w: &Workload<'a>, cfg: &'a PolicyConfig) -> &'a str {
    w.annotation(CACHE_VOLUME_ANNOTATION)
        .unwrap_or(cfg.cache_volume.as_str())
}

/// Volume sources that are not persistent, writable storage (SPEC.md §4): fresh per pod, or
/// read-only. Every other source (persistentVolumeClaim, ephemeral, csi, nfs, hostPath, cephfs,
/// …) is storage whose ownership the prep container can and must fix.
const NOT_CACHE_STORAGE: [&str; 7] = [
    "emptyDir",
    "configMap",
    "secret",
    "downwardAPI",
    "projected",
    "image",
    "gitRepo",
];

/// Whether the volume is persistent, writable storage: it has a source, and none of its sources
/// is one of [`NOT_CACHE_STORAGE`]. A volume without a source is an `emptyDir` (the API server's
/// default); a source this code does not know (a newer Kubernetes) is storage like any other.
fn is_writable_storage(v: &VolumeView) -> bool {
    !v.sources.is_empty()
        && !v
            .sources
            .iter()
            .any(|source| NOT_CACHE_STORAGE.contains(&&**source))
}

/// Whether the pod has the cache volume, backed by writable storage ("mounts the model cache").
pub(super) fn has_writable_cache(w: &Workload, cfg: &PolicyConfig) -> bool {
    let name = cache_volume_name(w, cfg);
    w.spec
        .volumes()
        .iter()
        .any(|v| v.name() == name && is_writable_storage(v))
}

/// `--model-cache-prep` as it applies to this pod: `never` in a namespace that enforces Pod
/// Security `restricted`, where the API server would refuse the root prep container (§9).
pub(super) fn prep_mode(w: &Workload, cfg: &PolicyConfig) -> PrepMode {
    if w.restricted_namespace {
        PrepMode::Never
    } else {
        cfg.model_cache_prep
    }
}

/// Whether the prep is withheld only because the namespace enforces Pod Security `restricted`.
pub(super) fn withheld_by_pod_security(w: &Workload, cfg: &PolicyConfig) -> bool {
    w.restricted_namespace
        && cfg.model_cache_prep == PrepMode::Always
        && !w.is_windows()
        && has_writable_cache(w, cfg)
}

/// The warning a pod gets when its prep is withheld in a `restricted` namespace.
pub(super) fn withheld_warning(w: &Workload) -> String {
    format!(
        "namespace {} enforces Pod Security restricted, which refuses the root {PREP_CONTAINER}: \
         not injected; the pod is treated as under --model-cache-prep=never",
        w.namespace
    )
}

/// Whether modelgate injects (and so owns) the prep container for this pod.
pub(super) fn is_managed(w: &Workload, cfg: &PolicyConfig) -> bool {
    prep_mode(w, cfg) == PrepMode::Always && !w.is_windows() && has_writable_cache(w, cfg)
}

/// The fsGroup to give a pod that mounts the cache and has none (`--default-fsgroup` > 0).
pub(super) fn fs_group_to_set(w: &Workload, cfg: &PolicyConfig) -> Option<i64> {
    let applies = !w.is_windows()
        && w.pod_fs_group().is_none()
        && cfg.default_fsgroup > 0
        && has_writable_cache(w, cfg);
    applies.then_some(cfg.default_fsgroup)
}

/// The shell command of the prep container (the table of SPEC.md §4).
pub(super) fn command(path: &str, uid: i64, fs_group: Option<i64>) -> String {
    match fs_group {
        Some(gid) if gid > 0 => format!("chown 0:{gid} {path} && chmod g+rwX {path}"),
        _ => format!("chown {uid}:0 {path} && chmod 770 {path}"),
    }
}

/// The canonical prep container for a pod whose pod-level runAsUser and fsGroup (after mutation)
/// are `pod_uid` and `fs_group`.
pub(super) fn canonical(
    cfg: &PolicyConfig,
    volume: &str,
    pod_uid: Option<i64>,
    fs_group: Option<i64>,
) -> Container {
    let uid = pod_uid.unwrap_or(cfg.init_container_user);
    let q = |s: &str| Quantity(s.to_string());
    let resources = |cpu: &str, mem: &str| {
        BTreeMap::from([("cpu".to_string(), q(cpu)), ("memory".to_string(), q(mem))])
    };
    Container {
        name: PREP_CONTAINER.to_string(),
        image: Some(cfg.init_image.clone()),
        command: Some(vec![
            "sh".into(),
            "-c".into(),
            command(&cfg.cache_mount_path, uid, fs_group),
        ]),
        volume_mounts: Some(vec![VolumeMount {
            name: volume.to_string(),
            mount_path: cfg.cache_mount_path.clone(),
            ..Default::default()
        }]),
        resources: Some(ResourceRequirements {
            requests: Some(resources("10m", "16Mi")),
            limits: Some(resources("100m", "64Mi")),
            ..Default::default()
        }),
        security_context: Some(SecurityContext {
            run_as_user: Some(0),
            run_as_non_root: Some(false),
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                add: Some(vec!["CHOWN".into(), "FOWNER".into()]),
            }),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Fields the API server defaults on every container: not ours, so they may hold anything.
const DEFAULTED: [&str; 3] = [
    "imagePullPolicy",
    "terminationMessagePath",
    "terminationMessagePolicy",
];

/// Whether the init container at `index` is exactly the canonical one, judged on its JSON as
/// received: every field but the defaulted ones must be canonical, including fields this code's
/// types do not know, so nothing can ride along with a root container.
pub(super) fn is_canonical_at(w: &Workload, index: usize, canonical: &Container) -> bool {
    let Some(raw) = w.spec.init_containers().get(index).map(|c| c.raw) else {
        return false;
    };
    let Ok(serde_json::Value::Object(mut existing)) = serde_json::from_str(raw.get()) else {
        return false;
    };
    for key in DEFAULTED {
        existing.remove(key);
    }
    serde_json::to_value(canonical).is_ok_and(|c| c == serde_json::Value::Object(existing))
}

/// The canonical container for the pod as it stands (for validation), or `None` when modelgate
/// does not manage a prep container for it (then any container of that name is refused).
pub(super) fn canonical_for(w: &Workload, cfg: &PolicyConfig) -> Option<Container> {
    is_managed(w, cfg).then(|| {
        canonical(
            cfg,
            cache_volume_name(w, cfg),
            w.pod_run_as_user(),
            w.pod_fs_group(),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_table() {
        assert_eq!(
            command("/models", 1000, Some(102)),
            "chown 0:102 /models && chmod g+rwX /models"
        );
        assert_eq!(
            command("/models", 101, None),
            "chown 101:0 /models && chmod 770 /models"
        );
        assert_eq!(
            command("/models", 101, Some(0)),
            "chown 101:0 /models && chmod 770 /models"
        );
        assert_eq!(command("/m", 7, Some(-1)), "chown 7:0 /m && chmod 770 /m");
    }

    fn judged(raw: serde_json::Value, canonical: &Container) -> bool {
        let text = serde_json::json!({ "initContainers": [raw] }).to_string();
        let spec: crate::policy::view::PodSpecView = serde_json::from_str(&text).unwrap();
        let w = Workload {
            namespace: "t",
            restricted_namespace: false,
            annotations: None,
            labels: None,
            has_metadata: true,
            spec: &spec,
            meta_path: crate::patch::FieldPath::root().key("metadata"),
            spec_path: crate::patch::FieldPath::root().key("spec"),
        };
        is_canonical_at(&w, 0, canonical)
    }

    #[test]
    fn canonical_ignores_only_api_server_defaults() {
        let cfg = PolicyConfig::default();
        let c = canonical(&cfg, "model-cache", None, Some(102));
        let json = serde_json::to_value(&c).unwrap();
        assert!(judged(json.clone(), &c));
        let mut defaulted = json.clone();
        defaulted["imagePullPolicy"] = "IfNotPresent".into();
        defaulted["terminationMessagePath"] = "/dev/termination-log".into();
        defaulted["terminationMessagePolicy"] = "File".into();
        assert!(judged(defaulted, &c));
        let mut smuggled = json.clone();
        smuggled["args"] = serde_json::json!(["rm -rf /"]);
        assert!(!judged(smuggled, &c));
        // A field newer than this code's Kubernetes types is not ignored either.
        let mut future = json.clone();
        future["securityContext"]["futurePrivilege"] = true.into();
        assert!(!judged(future, &c));
        let mut other_uid = json;
        other_uid["command"][2] = command("/models", 101, None).into();
        assert!(!judged(other_uid, &c));
    }
}
