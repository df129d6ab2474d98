//! docs/policy.md §4: the `model-cache-prep` init container that gives the cache root its owner and mode.

use std::borrow::Cow;

use serde::Serialize;

use super::view::VolumeView;
use super::workload::Workload;
use super::{Denial, Rule};
use crate::config::{AbsentClaims, PREBOUND, PREP_CONTAINER, PolicyConfig, PrepMode};

/// Per-pod override of `--cache-volume`.
pub(crate) const CACHE_VOLUME_ANNOTATION: &str = "modelgate.io/cache-volume";

/// The name of the pod's writable model cache volume.
pub(super) fn cache_volume_name<'s>(w: &'s Workload<'_>, cfg: &'s PolicyConfig) -> &'s str {
    w.annotation(CACHE_VOLUME_ANNOTATION)
        .unwrap_or(cfg.cache_volume.as_str())
}

/// Volume sources that are not persistent, writable storage (docs/policy.md §4): fresh per pod, or
/// read-only. Every other source (persistentVolumeClaim, ephemeral, csi, nfs, hostPath, cephfs,
/// …) is storage whose ownership the prep container can and must fix; a `hostPath` only under
/// the operator's `--prep-host-path` ([`disallowed_host_path`]).
pub(crate) const NOT_CACHE_STORAGE: [&str; 7] = [
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

/// The node directory of a `hostPath` cache volume outside every `--prep-host-path` prefix
/// (`""` when it names none), if the pod has one. The pod chose that directory: a root prep
/// there would `chown` and `chmod` any directory of the node, `/etc` as well (docs/policy.md §4).
pub(super) fn disallowed_host_path<'a>(w: &Workload<'a>, cfg: &PolicyConfig) -> Option<&'a str> {
    let name = cache_volume_name(w, cfg);
    w.spec
        .volumes()
        .iter()
        .filter(|v| v.name() == name && v.has_source("hostPath"))
        .map(|v| {
            let path = v.host_path.as_ref().and_then(|h| h.path.as_deref());
            path.unwrap_or_default()
        })
        .find(|path| !cfg.allows_prep_on_host_path(path))
}

/// Volume sources whose storage the cluster provisioned: a claim, or a claim template. Every
/// other source of a cache volume names its target in the pod (a node directory, a server and
/// export, a pool, a disk), and a root prep would chown whatever the pod points it at.
pub(crate) const PROVISIONED: [&str; 2] = ["persistentVolumeClaim", "ephemeral"];

/// The source of the cache volume that the pod names inline and the operator did not allow
/// with `--prep-volume-type` (`hostPath` aside: [`disallowed_host_path`]), if it has one.
pub(super) fn disallowed_inline_source<'a>(
    w: &Workload<'a>,
    cfg: &PolicyConfig,
) -> Option<&'a str> {
    let name = cache_volume_name(w, cfg);
    w.spec
        .volumes()
        .iter()
        .filter(|v| v.name() == name)
        .flat_map(|v| v.sources.iter())
        .map(|source| &**source)
        .find(|source| {
            !PROVISIONED.contains(source)
                && *source != "hostPath"
                && !NOT_CACHE_STORAGE.contains(source)
                && !cfg.prep_volume_types.iter().any(|t| t == source)
        })
}

/// Why this pod gets no prep although `--model-cache-prep=always` and it mounts the cache.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Withheld<'a> {
    /// An exception of the namespace waives the `cache-prep` rule for the pod
    /// (docs/exceptions.md).
    Exception(&'a str),
    /// The namespace enforces Pod Security `restricted`, which refuses a root container (§9).
    PodSecurity,
    /// The cache volume is a node directory the operator did not allow (§4).
    HostPath(&'a str),
    /// The cache volume is an inline volume of this type, which names its storage in the pod,
    /// and the operator did not allow the type (§4).
    Inline(&'a str),
    /// The cache volume is the claim a model cache keeps its models on (a `pvcRef`, or
    /// KServe's `<cache>-<nodegroup>` claim): a store other pods and namespaces read.
    CacheClaim { claim: &'a str, cache: &'a str },
    /// The claim does not exist: it could still be created bound to a volume of the tenant's
    /// choosing, after the pod.
    NoClaim(&'a str),
    /// The claim (`None`: the ephemeral volume's claim template) names its volume, or selects
    /// among existing ones, and `--prep-volume-type prebound` is not given.
    PickedVolume(Option<&'a str>),
    /// `--prep-storage-class` is given and the claim's class (`""`: none written) is not one
    /// of them.
    StorageClass {
        claim: Option<&'a str>,
        class: &'a str,
    },
}

/// The cache volume's claim, as the pod names it: a claim by name, or an ephemeral volume's
/// claim template.
enum CacheClaim<'a> {
    Named(&'a str),
    Template(Option<&'a super::view::ClaimSpecView<'a>>),
}

fn cache_claim<'a>(w: &Workload<'a>, cfg: &PolicyConfig) -> Option<CacheClaim<'a>> {
    let name = cache_volume_name(w, cfg);
    let volume = w.spec.volumes().iter().find(|v| v.name() == name)?;
    if let Some(pvc) = &volume.persistent_volume_claim {
        return Some(CacheClaim::Named(
            pvc.claim_name.as_deref().unwrap_or_default(),
        ));
    }
    let template = volume.ephemeral.as_ref()?.volume_claim_template.as_ref();
    Some(CacheClaim::Template(template.and_then(|t| t.spec.as_ref())))
}

/// The decision on the claim under the cache volume (docs/policy.md, "Claims whose volume the
/// tenant picked"): a model cache's claim never gets the prep; a claim that does not exist
/// gets none; one whose volume its author chose only under `--prep-volume-type prebound`; with
/// `--prep-storage-class`, only claims of those classes.
fn withheld_claim<'a>(w: &Workload<'a>, cfg: &PolicyConfig) -> Option<Withheld<'a>> {
    let prebound = cfg.prep_volume_types.iter().any(|t| t == PREBOUND);
    fn class_refused<'c>(cfg: &PolicyConfig, class: Option<&'c str>) -> Option<&'c str> {
        let class = class.unwrap_or_default();
        let listed = cfg.prep_storage_classes.iter().any(|c| c == class);
        (!cfg.prep_storage_classes.is_empty() && !listed).then_some(class)
    }
    match cache_claim(w, cfg)? {
        CacheClaim::Template(spec) => {
            let picked = spec.is_some_and(|s| {
                s.volume_name.as_deref().is_some_and(|v| !v.is_empty()) || s.selector.is_some()
            });
            if picked && !prebound {
                return Some(Withheld::PickedVolume(None));
            }
            let class = spec.and_then(|s| s.storage_class_name.as_deref());
            class_refused(cfg, class).map(|class| Withheld::StorageClass { claim: None, class })
        }
        CacheClaim::Named(claim) => {
            let index = w.claims?;
            if let Some(cache) = index.cache_owning_claim(w.namespace, claim) {
                return Some(Withheld::CacheClaim {
                    claim,
                    cache: cache.describe(),
                });
            }
            let Some(state) = index.pvc(w.namespace, claim) else {
                return (cfg.absent_claims == AbsentClaims::Missing)
                    .then_some(Withheld::NoClaim(claim));
            };
            if state.picked && !prebound {
                return Some(Withheld::PickedVolume(Some(claim)));
            }
            class_refused(cfg, state.storage_class.as_deref()).map(|class| Withheld::StorageClass {
                claim: Some(claim),
                class,
            })
        }
    }
}

fn withheld<'a>(w: &Workload<'a>, cfg: &PolicyConfig) -> Option<Withheld<'a>> {
    *w.prep_withheld.get_or_init(|| find_withheld(w, cfg))
}

fn find_withheld<'a>(w: &Workload<'a>, cfg: &PolicyConfig) -> Option<Withheld<'a>> {
    if let Some(name) = w.waivers().cache_prep {
        return Some(Withheld::Exception(name));
    }
    if w.restricted_namespace {
        return Some(Withheld::PodSecurity);
    }
    if let Some(path) = disallowed_host_path(w, cfg) {
        return Some(Withheld::HostPath(path));
    }
    if let Some(source) = disallowed_inline_source(w, cfg) {
        return Some(Withheld::Inline(source));
    }
    withheld_claim(w, cfg)
}

/// The claim `serve` reads from the API server before it decides, when the cluster state it
/// watches does not have it yet (a StatefulSet creates the claim milliseconds before the pod):
/// the cache volume's claim, if the pod would get the prep but for the claim being unknown.
pub(crate) fn claim_to_read<'a>(w: &Workload<'a>, cfg: &PolicyConfig) -> Option<&'a str> {
    match withheld(w, cfg) {
        Some(Withheld::NoClaim(claim))
            if cfg.model_cache_prep == PrepMode::Always
                && !w.is_windows()
                && has_writable_cache(w, cfg)
                && !claim.is_empty() =>
        {
            Some(claim)
        }
        _ => None,
    }
}

/// The note of a pod that gets the prep on a claim the cluster state does not have, where such
/// a claim is taken as provisioned (`review` and `audit` of files).
pub(super) fn assumed_claim_note(w: &Workload, cfg: &PolicyConfig) -> Option<String> {
    let index = w.claims?;
    let Some(CacheClaim::Named(claim)) = cache_claim(w, cfg) else {
        return None;
    };
    let assumed = cfg.absent_claims == AbsentClaims::Provisioned
        && index.pvc(w.namespace, claim).is_none()
        && is_managed(w, cfg);
    assumed.then(|| {
        format!(
            "claim {} is not among the given objects: taken as provisioned by the cluster \
             (in a cluster, a claim that does not exist or names its volume gets no \
             {PREP_CONTAINER})",
            super::shorten_uri(claim, 80)
        )
    })
}

/// `--model-cache-prep` as it applies to this pod: `never` where the prep is withheld (a Pod
/// Security `restricted` namespace, storage the pod names or picked, a model cache's claim).
pub(super) fn prep_mode(w: &Workload, cfg: &PolicyConfig) -> PrepMode {
    if withheld(w, cfg).is_some() {
        PrepMode::Never
    } else {
        cfg.model_cache_prep
    }
}

/// The warning of a pod whose prep is withheld although it would otherwise get one, saying
/// why; `None` when nothing is withheld.
pub(super) fn withheld_warning(w: &Workload, cfg: &PolicyConfig) -> Option<String> {
    if cfg.model_cache_prep != PrepMode::Always || w.is_windows() || !has_writable_cache(w, cfg) {
        return None;
    }
    const NEVER: &str = "the pod is treated as under --model-cache-prep=never";
    // A claim's name has up to 253 bytes: it gives way, so that the reason stays whole.
    let claim = |name: &str| super::shorten_uri(name, 64).into_owned();
    Some(match withheld(w, cfg)? {
        Withheld::Exception(name) => format!(
            "exception {} waives the cache-prep rule for this pod: no {PREP_CONTAINER}; {NEVER}",
            super::shorten_uri(name, 64)
        ),
        Withheld::PodSecurity => format!(
            "namespace {} enforces Pod Security restricted, which refuses the root \
             {PREP_CONTAINER}: not injected; {NEVER}",
            w.namespace
        ),
        Withheld::Inline(source) => format!(
            "the cache volume is an inline {} volume, whose storage the pod names: no root \
             {PREP_CONTAINER} there (--prep-volume-type allows a type); {NEVER}",
            super::shorten_uri(source, 64)
        ),
        Withheld::HostPath(path) => {
            let fixed = "the cache volume is hostPath  on the node, outside --prep-host-path: \
                 no root model-cache-prep there; the pod is treated as under \
                 --model-cache-prep=never";
            let path = match path.is_empty() {
                true => "(no path)".into(),
                false => {
                    super::shorten_uri(path, super::MAX_WARNING_LEN.saturating_sub(fixed.len()))
                }
            };
            format!(
                "the cache volume is hostPath {path} on the node, outside --prep-host-path: no \
                 root {PREP_CONTAINER} there; {NEVER}"
            )
        }
        Withheld::CacheClaim { claim: name, cache } => format!(
            "the cache volume is claim {}, the model store of {}: never a root \
             {PREP_CONTAINER} there; {NEVER}",
            claim(name),
            super::shorten_uri(cache, 80)
        ),
        Withheld::NoClaim(name) => format!(
            "claim {} does not exist: no root {PREP_CONTAINER} (it could be created bound to \
             a volume of anyone's choosing); {NEVER}",
            claim(name)
        ),
        Withheld::PickedVolume(Some(name)) => format!(
            "claim {} names its volume (spec.volumeName or spec.selector): no root \
             {PREP_CONTAINER} there (--prep-volume-type prebound allows it); {NEVER}",
            claim(name)
        ),
        Withheld::PickedVolume(None) => format!(
            "the cache volume's claim template names its volume (spec.volumeName or \
             spec.selector): no root {PREP_CONTAINER} there (--prep-volume-type prebound \
             allows it); {NEVER}"
        ),
        Withheld::StorageClass { claim: name, class } => format!(
            "{} is of storage class {}, not one of --prep-storage-class: no root \
             {PREP_CONTAINER} there; {NEVER}",
            match name {
                Some(name) => format!("claim {}", claim(name)),
                None => "the cache volume's claim template".into(),
            },
            match class.is_empty() {
                true => "(none written)".into(),
                false => super::shorten_uri(class, 40),
            }
        ),
    })
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

/// The shell command of the prep container (the table of docs/policy.md §4).
pub(super) fn command(path: &str, uid: i64, fs_group: Option<i64>) -> String {
    match fs_group {
        Some(gid) if gid > 0 => format!("chown 0:{gid} {path} && chmod g+rwX {path}"),
        _ => format!("chown {uid}:0 {path} && chmod 770 {path}"),
    }
}

/// The canonical prep container (docs/policy.md §4) as it is written into a patch: the fields in the
/// order the API server writes them, borrowed, so that writing it builds nothing in between.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PrepContainer<'a> {
    command: [&'a str; 3],
    image: &'a str,
    name: &'static str,
    resources: PrepResources,
    security_context: PrepSecurityContext,
    volume_mounts: [PrepMount<'a>; 1],
}

#[derive(Debug, Serialize)]
struct PrepResources {
    limits: CpuMemory,
    requests: CpuMemory,
}

#[derive(Debug, Serialize)]
struct CpuMemory {
    cpu: &'static str,
    memory: &'static str,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct PrepSecurityContext {
    allow_privilege_escalation: bool,
    capabilities: PrepCapabilities,
    read_only_root_filesystem: bool,
    run_as_non_root: bool,
    run_as_user: i64,
    seccomp_profile: PrepSeccomp,
}

#[derive(Debug, Serialize)]
struct PrepCapabilities {
    add: [&'static str; 2],
    drop: [&'static str; 1],
}

#[derive(Debug, Serialize)]
struct PrepSeccomp {
    #[serde(rename = "type")]
    type_: &'static str,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct PrepMount<'a> {
    mount_path: &'a str,
    name: &'a str,
}

/// The canonical prep container for a pod whose pod-level runAsUser and fsGroup (after mutation)
/// are `pod_uid` and `fs_group`; `command` holds its shell command ([`command`]).
pub(crate) fn canonical<'a>(
    cfg: &'a PolicyConfig,
    volume: &'a str,
    command: &'a str,
) -> PrepContainer<'a> {
    PrepContainer {
        command: ["sh", "-c", command],
        image: &cfg.init_image,
        name: PREP_CONTAINER,
        resources: PrepResources {
            limits: CpuMemory {
                cpu: "100m",
                memory: "64Mi",
            },
            // Equal to the limits: an init container with requests below its limits makes the
            // pod `Burstable`, which would cost a `Guaranteed` serving pod its static CPU pinning.
            requests: CpuMemory {
                cpu: "100m",
                memory: "64Mi",
            },
        },
        security_context: PrepSecurityContext {
            allow_privilege_escalation: false,
            capabilities: PrepCapabilities {
                add: ["CHOWN", "FOWNER"],
                drop: ["ALL"],
            },
            read_only_root_filesystem: true,
            run_as_non_root: false,
            run_as_user: 0,
            seccomp_profile: PrepSeccomp {
                type_: "RuntimeDefault",
            },
        },
        volume_mounts: [PrepMount {
            mount_path: &cfg.cache_mount_path,
            name: volume,
        }],
    }
}

/// The command of the canonical prep container for a pod whose pod-level runAsUser and fsGroup
/// (after mutation) are `pod_uid` and `fs_group`.
pub(crate) fn canonical_command(
    cfg: &PolicyConfig,
    pod_uid: Option<i64>,
    fs_group: Option<i64>,
) -> String {
    command(
        &cfg.cache_mount_path,
        pod_uid.unwrap_or(cfg.init_container_user),
        fs_group,
    )
}

/// Fields the API server defaults on every container: not ours, so they may hold anything.
pub(crate) const DEFAULTED: [&str; 3] = [
    "imagePullPolicy",
    "terminationMessagePath",
    "terminationMessagePolicy",
];

/// Where the API server's ServiceAccount admission plugin mounts the service account token.
pub(crate) const TOKEN_MOUNT_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// The name prefix of the projected token volume that plugin adds (`kube-api-access-<random>`).
pub(crate) const TOKEN_VOLUME_PREFIX: &str = "kube-api-access-";

/// The image of a container, from its JSON.
#[derive(serde::Deserialize)]
struct ImageOf<'a> {
    #[serde(borrow)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow)]
    image: Option<Cow<'a, str>>,
}

/// The init containers of a stored pod (`oldObject`), as JSON.
#[derive(serde::Deserialize)]
struct OldPod<'a> {
    #[serde(borrow)]
    spec: Option<OldSpec<'a>>,
}

#[derive(serde::Deserialize)]
struct OldSpec<'a> {
    #[serde(rename = "initContainers", borrow)]
    init_containers: Option<Vec<ImageOf<'a>>>,
}

const UNCHANGED_PREP_ADVICE: &str = "Recreate the pod instead: modelgate injects the prep \
     container of its current settings into a new pod.";

/// A Pod UPDATE keeps the prep's image: the API server lets an update change a container's
/// image, and the kubelet runs the new one as root with CHOWN and FOWNER the next time the
/// init containers run (a sandbox restart after a node reboot). `old_object` is the stored
/// pod; an update that changes the image of the init container named `model-cache-prep` is
/// denied, naming the field.
pub(crate) fn prep_unchanged(w: &Workload, old_object: Option<&str>) -> Result<(), Denial> {
    let Some(new_index) = w
        .spec
        .init_containers()
        .iter()
        .position(|c| c.container.name() == PREP_CONTAINER)
    else {
        return Ok(());
    };
    let Ok(new) = serde_json::from_str::<ImageOf>(w.spec.init_containers()[new_index].raw.get())
    else {
        return Ok(());
    };
    let old = old_object
        .and_then(|text| serde_json::from_str::<OldPod>(text).ok())
        .and_then(|pod| {
            pod.spec?
                .init_containers?
                .into_iter()
                .find(|c| c.name.as_deref() == Some(PREP_CONTAINER))
        });
    let Some(old) = old else {
        // No prep in the stored pod: the API server refuses an update that adds an init
        // container, so there is nothing to compare.
        return Ok(());
    };
    if old.image == new.image {
        return Ok(());
    }
    let shown = |i: &Option<Cow<str>>| {
        super::shorten_uri(i.as_deref().unwrap_or_default(), 128).into_owned()
    };
    Err(Denial::single(
        Rule::CachePrep,
        w.spec_path
            .key("initContainers")
            .index(new_index)
            .key("image")
            .to_string(),
        format!(
            "the {PREP_CONTAINER} image cannot change after admission ({} to {})",
            shown(&old.image),
            shown(&new.image)
        ),
        UNCHANGED_PREP_ADVICE,
    ))
}

/// The longest text a canonical prep container can have as it reaches a webhook: the
/// container (its image and mount path are flags, at most a few hundred bytes each), the
/// defaulted fields and the token mount, with room to spare.
const MAX_CANONICAL_BYTES: usize = 16 * 1024;

/// Whether the init container at `index` is exactly the canonical one, judged on its JSON as
/// received: every field but the defaulted ones must be canonical, including fields this code's
/// types do not know, so nothing can ride along with a root container. The one addition
/// allowed is what the API server's ServiceAccount plugin appends to every container when it
/// re-runs after a webhook's patch: a read-only mount of the pod's projected
/// `kube-api-access-*` volume at the token path, after the cache mount.
pub(super) fn is_canonical_at(w: &Workload, index: usize, canonical: &PrepContainer) -> bool {
    let Some(raw) = w.spec.init_containers().get(index).map(|c| c.raw) else {
        return false;
    };
    // The canonical container, the API server's defaults and its token mount fit in a few
    // hundred bytes: a longer one is not canonical, and is never parsed into a tree (a prep
    // with 370 000 env entries would cost hundreds of MiB to compare).
    if raw.get().len() > MAX_CANONICAL_BYTES {
        return false;
    }
    let Ok(serde_json::Value::Object(mut existing)) = serde_json::from_str(raw.get()) else {
        return false;
    };
    for key in DEFAULTED {
        existing.remove(key);
    }
    if let Some(serde_json::Value::Array(mounts)) = existing.get_mut("volumeMounts")
        && mounts.len() == 2
        && is_token_mount(w, &mounts[1])
    {
        mounts.pop();
    }
    serde_json::to_value(canonical).is_ok_and(|c| c == serde_json::Value::Object(existing))
}

/// Whether `mount` is exactly the ServiceAccount plugin's token mount (`name`, `readOnly: true`,
/// `mountPath`, nothing else) of a projected `kube-api-access-*` volume of this pod.
fn is_token_mount(w: &Workload, mount: &serde_json::Value) -> bool {
    let Some(fields) = mount.as_object() else {
        return false;
    };
    let Some(name) = fields.get("name").and_then(|n| n.as_str()) else {
        return false;
    };
    fields.len() == 3
        && fields.get("mountPath").and_then(|p| p.as_str()) == Some(TOKEN_MOUNT_PATH)
        && fields.get("readOnly").and_then(|r| r.as_bool()) == Some(true)
        && name.starts_with(TOKEN_VOLUME_PREFIX)
        && w.spec
            .volumes()
            .iter()
            .any(|v| v.name() == name && v.sources.len() == 1 && v.has_source("projected"))
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

    fn judged(raw: serde_json::Value, canonical: &PrepContainer) -> bool {
        judged_with_volumes(raw, serde_json::json!([]), canonical)
    }

    fn judged_with_volumes(
        raw: serde_json::Value,
        volumes: serde_json::Value,
        canonical: &PrepContainer,
    ) -> bool {
        let text = serde_json::json!({ "initContainers": [raw], "volumes": volumes }).to_string();
        let spec: crate::policy::view::PodSpecView = serde_json::from_str(&text).unwrap();
        let w = Workload {
            namespace: "t",
            restricted_namespace: false,
            claims: None,
            prep_withheld: Default::default(),
            exceptions: Default::default(),
            waivers: Default::default(),
            annotations: None,
            object_annotations: None,
            labels: None,
            has_metadata: true,
            spec: &spec,
            meta_path: crate::patch::FieldPath::root().key("metadata"),
            spec_path: crate::patch::FieldPath::root().key("spec"),
        };
        is_canonical_at(&w, 0, canonical)
    }

    /// A prep container past the size a canonical one can have is not canonical, and is never
    /// parsed into a tree (what a huge one would cost).
    #[test]
    fn a_prep_container_too_long_to_be_canonical_is_not() {
        let cfg = PolicyConfig::default();
        let cmd = canonical_command(&cfg, None, Some(102));
        let c = canonical(&cfg, "model-cache", &cmd);
        let mut json = serde_json::to_value(&c).unwrap();
        assert!(judged(json.clone(), &c));
        json["terminationMessagePath"] = serde_json::json!("x".repeat(MAX_CANONICAL_BYTES));
        assert!(!judged(json, &c));
    }

    #[test]
    fn canonical_ignores_only_api_server_defaults() {
        let cfg = PolicyConfig::default();
        let cmd = canonical_command(&cfg, None, Some(102));
        let c = canonical(&cfg, "model-cache", &cmd);
        let json = serde_json::to_value(&c).unwrap();
        // docs/policy.md §4's container, field by field.
        assert_eq!(
            json,
            serde_json::json!({
                "name": "model-cache-prep",
                "image": "docker.io/curlimages/curl:8.18.0",
                "command": ["sh", "-c", "chown 0:102 /models && chmod g+rwX /models"],
                "volumeMounts": [{"name": "model-cache", "mountPath": "/models"}],
                "resources": {
                    "requests": {"cpu": "100m", "memory": "64Mi"},
                    "limits": {"cpu": "100m", "memory": "64Mi"}
                },
                "securityContext": {
                    "runAsUser": 0,
                    "runAsNonRoot": false,
                    "allowPrivilegeEscalation": false,
                    "readOnlyRootFilesystem": true,
                    "capabilities": {"drop": ["ALL"], "add": ["CHOWN", "FOWNER"]},
                    "seccompProfile": {"type": "RuntimeDefault"}
                }
            })
        );
        assert_eq!(
            canonical_command(&cfg, Some(5000), None),
            "chown 5000:0 /models && chmod 770 /models"
        );
        assert_eq!(
            canonical_command(&cfg, None, None),
            "chown 101:0 /models && chmod 770 /models"
        );
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

    /// The ServiceAccount plugin's token mount, as the API server appends it to the prep when it
    /// re-runs its plugins after modelgate's patch, keeps the prep canonical; anything else
    /// mounted alongside does not.
    #[test]
    fn the_api_servers_token_mount_is_part_of_the_canonical_form() {
        let cfg = PolicyConfig::default();
        let cmd = canonical_command(&cfg, None, Some(102));
        let c = canonical(&cfg, "model-cache", &cmd);
        let token_volume = serde_json::json!({"name": "kube-api-access-x7k2p", "projected": {
            "defaultMode": 420,
            "sources": [{"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}}]
        }});
        let cache_volume =
            serde_json::json!({"name": "model-cache", "persistentVolumeClaim": {"claimName": "c"}});
        let volumes = serde_json::json!([cache_volume, token_volume]);
        let token_mount = serde_json::json!({
            "name": "kube-api-access-x7k2p",
            "readOnly": true,
            "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"
        });
        let with_mount = |mount: serde_json::Value| {
            let mut prep = serde_json::to_value(&c).unwrap();
            prep["volumeMounts"].as_array_mut().unwrap().push(mount);
            prep["imagePullPolicy"] = "IfNotPresent".into();
            prep
        };
        assert!(judged_with_volumes(
            with_mount(token_mount.clone()),
            volumes.clone(),
            &c
        ));

        // Writable, elsewhere, with more fields, or of a volume that is not the projected token.
        let mut writable = token_mount.clone();
        writable["readOnly"] = false.into();
        let mut elsewhere = token_mount.clone();
        elsewhere["mountPath"] = "/host".into();
        let mut sub_path = token_mount.clone();
        sub_path["subPath"] = "x".into();
        let mut cache_as_token = token_mount.clone();
        cache_as_token["name"] = "model-cache".into();
        for mount in [writable, elsewhere, sub_path, cache_as_token] {
            assert!(
                !judged_with_volumes(with_mount(mount.clone()), volumes.clone(), &c),
                "{mount}"
            );
        }
        let host =
            serde_json::json!([{"name": "kube-api-access-x7k2p", "hostPath": {"path": "/"}}]);
        assert!(!judged_with_volumes(
            with_mount(token_mount.clone()),
            host,
            &c
        ));
        // The mount without its volume in the pod.
        assert!(!judged_with_volumes(
            with_mount(token_mount),
            serde_json::json!([]),
            &c
        ));
    }
}
