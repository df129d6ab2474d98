//! Policy configuration: the settings of docs/policy.md §2, as plain values.
//!
//! The command line (the `modelgate` package's `PolicyArgs`) parses them with the checks below,
//! so an invalid value stops the program before anything else happens.

use std::sync::Arc;

use crate::kinds::WorkloadKinds;
use crate::namespaces::Mode;

/// Largest uid/gid Kubernetes accepts (`int32` max).
pub const MAX_ID: i64 = 2_147_483_647;

/// The canonical name of the cache-prep init container (docs/policy.md §4).
pub const PREP_CONTAINER: &str = "model-cache-prep";

/// A uid or gid setting that may be switched off (`none`, for OpenShift where the SCC assigns it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdSetting {
    Set(i64),
    None,
}

impl IdSetting {
    pub fn value(self) -> Option<i64> {
        match self {
            IdSetting::Set(v) => Some(v),
            IdSetting::None => None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrepMode {
    Always,
    Never,
}

/// A Pod Security Admission level.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PodSecurityLevel {
    #[default]
    Privileged,
    Baseline,
    Restricted,
}

impl PodSecurityLevel {
    /// The level as Pod Security's labels and configuration write it.
    pub fn as_str(self) -> &'static str {
        match self {
            PodSecurityLevel::Privileged => "privileged",
            PodSecurityLevel::Baseline => "baseline",
            PodSecurityLevel::Restricted => "restricted",
        }
    }
}

/// Directory of a model under the cache PVC's `models/` (docs/policy.md §5).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CacheLayout {
    /// `models/<first 16 hex digits of SHA-256 of sourceModelUri>`: KServe 0.18 and later.
    #[default]
    StorageKey,
    /// `models/<cache name>`: KServe 0.17 and older.
    CacheName,
}

/// The policy's settings (docs/policy.md §2).
#[derive(Clone, Debug)]
pub struct PolicyConfig {
    /// uid set on a pod whose containers have no runAsUser; `none` never sets one.
    pub run_as_user: IdSetting,

    /// gid set alongside runAsUser; `none` never sets one.
    pub run_as_group: IdSetting,

    /// fsGroup given to a pod that mounts the model cache and has none; 0 or less never sets one.
    pub default_fsgroup: i64,

    /// Owner of the cache root when the pod has no pod-level runAsUser (1..2147483647).
    pub init_container_user: i64,

    /// Inject the model-cache-prep init container, or never inject it.
    pub model_cache_prep: PrepMode,

    /// Image of the prep container (needs sh, chown, chmod).
    pub init_image: String,

    /// The pod volume that is the writable model cache (per pod: annotation modelgate.io/cache-volume).
    pub cache_volume: String,

    /// Where the prep container mounts the cache volume's root.
    pub cache_mount_path: String,

    /// Where a resolved node-local model is mounted read-only.
    pub model_mount_path: String,

    /// Directory of a model under the cache PVC's models/: storage-key (KServe 0.18+) or
    /// cache-name (KServe 0.17 and older).
    pub cache_layout: CacheLayout,

    /// Namespace left untouched (repeatable; default: kube-system and the webhook's own namespace).
    pub exempt_namespaces: Vec<String>,

    /// Mode of a namespace without a modelgate.io/mode label (docs/policy.md §9).
    pub default_mode: Mode,

    /// Node directories under which a `hostPath` cache volume still gets the prep, normalised
    /// ([`parse_prep_host_path`]); none by default (docs/policy.md §4).
    pub prep_host_paths: Vec<String>,

    /// The Pod Security level of a namespace without a `pod-security.kubernetes.io/enforce`
    /// label: what the cluster's PSA configuration defaults to (docs/pod-security.md).
    pub pod_security_default: PodSecurityLevel,

    /// Inline volume types (`nfs`, `csi`, …) whose cache volume still gets the prep; none by
    /// default: only claims and claim templates do (docs/policy.md, §4).
    pub prep_volume_types: Vec<String>,

    /// When not empty, only claims of these storage classes get the prep (docs/policy.md,
    /// "Claims whose volume the tenant picked").
    pub prep_storage_classes: Vec<String>,

    /// How a claim the cluster state does not have is taken: set by the command, not a flag.
    pub absent_claims: AbsentClaims,

    /// The kinds whose pod templates are judged at apply time, and where the templates are
    /// (docs/policy.md §11, §12): the rows shipped, plus `--workload-kinds`.
    pub workload_kinds: Arc<WorkloadKinds>,

    /// The longest an exception may run, in days from its creation (docs/exceptions.md): one
    /// whose `expires` is later is refused by `/validate` and never honoured.
    pub max_exception_days: u32,
}

/// `--prep-volume-type prebound`: claims bound by name to a volume (or choosing one by
/// selector) may get the prep.
pub const PREBOUND: &str = "prebound";

/// How a claim the cluster state does not have is taken, for the prep (docs/policy.md,
/// "Claims whose volume the tenant picked"). Each command sets it for where its claims come
/// from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AbsentClaims {
    /// The claims are the cluster's (`serve`, `audit --from-cluster`): one that is not there does
    /// not exist, and could still be created bound to a volume of the tenant's choosing.
    Missing,
    /// The claims are what files gave (`review`, `audit` of files), or none are known: one that
    /// is not there is taken as provisioned, and a note says so.
    #[default]
    Provisioned,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
            run_as_user: IdSetting::Set(1000),
            run_as_group: IdSetting::Set(1000),
            default_fsgroup: 102,
            init_container_user: 101,
            model_cache_prep: PrepMode::Always,
            init_image: "docker.io/curlimages/curl:8.18.0".into(),
            cache_volume: "model-cache".into(),
            cache_mount_path: "/models".into(),
            model_mount_path: "/mnt/models".into(),
            cache_layout: CacheLayout::StorageKey,
            exempt_namespaces: Vec::new(),
            default_mode: Mode::Enforce,
            prep_host_paths: Vec::new(),
            prep_volume_types: Vec::new(),
            prep_storage_classes: Vec::new(),
            absent_claims: AbsentClaims::Provisioned,
            pod_security_default: PodSecurityLevel::Privileged,
            workload_kinds: WorkloadKinds::defaults(),
            max_exception_days: crate::exceptions::DEFAULT_MAX_DAYS,
        }
    }
}

impl PolicyConfig {
    /// The exempt namespaces in force: the flag's values, or, when the flag is not given,
    /// `kube-system` plus `own_namespace`, the namespace the webhook runs in. Resolved once, so
    /// the pipeline never asks again.
    pub fn with_default_exemptions(mut self, own_namespace: Option<&str>) -> Self {
        if self.exempt_namespaces.is_empty() {
            self.exempt_namespaces.push("kube-system".to_string());
            if let Some(own) = own_namespace.filter(|n| !n.is_empty() && *n != "kube-system") {
                self.exempt_namespaces.push(own.to_string());
            }
        }
        self
    }

    pub fn is_exempt(&self, namespace: &str) -> bool {
        self.exempt_namespaces.iter().any(|n| n == namespace)
    }

    /// Whether the node directory `path` (a `hostPath` volume's) lies under one of
    /// `--prep-host-path`'s prefixes: compared after normalising, whole path components only
    /// (`/data/models` allows `/data/models/x`, never `/data/models-evil`). A relative path
    /// lies under none.
    pub fn allows_prep_on_host_path(&self, path: &str) -> bool {
        let Some(path) = normalise_absolute(path) else {
            return false;
        };
        self.prep_host_paths.iter().any(|prefix| {
            prefix == "/"
                || path
                    .strip_prefix(prefix.as_str())
                    .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
        })
    }
}

/// An absolute path with `.`, `..` and repeated or trailing `/` resolved as the kernel would
/// without symlinks (`/data/models/../../etc` is `/etc`, `..` at the root stays there); `None`
/// for a relative or empty path.
pub fn normalise_absolute(path: &str) -> Option<String> {
    if !path.starts_with('/') {
        return None;
    }
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            _ => parts.push(part),
        }
    }
    let mut out = String::with_capacity(path.len());
    for part in &parts {
        out.push('/');
        out.push_str(part);
    }
    if out.is_empty() {
        out.push('/');
    }
    Some(out)
}

/// `--prep-volume-type`: a volume source of the Pod API (`nfs`, `csi`, `cephfs`, …) whose
/// inline cache volumes may get the root prep. Refused: `hostPath` (its prefixes are
/// `--prep-host-path`), the claims (they get the prep without it), and the sources that are
/// never cache storage.
pub fn parse_prep_volume_type(s: &str) -> Result<String, String> {
    let t = s.trim();
    let identifier = t.starts_with(|c: char| c.is_ascii_lowercase())
        && t.chars().all(|c| c.is_ascii_alphanumeric());
    if !identifier {
        return Err(format!(
            "{s:?} is not a volume type: expected a volume source of the Pod API, such as nfs or csi"
        ));
    }
    if t == "hostPath" {
        return Err("hostPath: allow node directories with --prep-host-path PREFIX".into());
    }
    if crate::policy::cache_prep::PROVISIONED.contains(&t) {
        return Err(format!(
            "{t}: claims get the prep without --prep-volume-type"
        ));
    }
    if crate::policy::cache_prep::NOT_CACHE_STORAGE.contains(&t) {
        return Err(format!("{t}: never cache storage (nothing to prepare)"));
    }
    Ok(t.to_string())
}

/// `--prep-host-path`: an absolute node directory, kept normalised.
pub fn parse_prep_host_path(s: &str) -> Result<String, String> {
    normalise_absolute(s).ok_or_else(|| format!("`{s}` is not an absolute path"))
}

fn parse_int(s: &str) -> Result<i64, String> {
    s.trim()
        .parse::<i64>()
        .map_err(|_| format!("`{s}` is not an integer"))
}

fn in_range(s: &str, lo: i64) -> Result<i64, String> {
    let v = parse_int(s).map_err(|e| format!("{e}; expected an integer in {lo}..{MAX_ID}"))?;
    if (lo..=MAX_ID).contains(&v) {
        Ok(v)
    } else {
        Err(format!("{v} is outside {lo}..{MAX_ID}"))
    }
}

pub fn parse_uid_or_none(s: &str) -> Result<IdSetting, String> {
    if s == "none" {
        return Ok(IdSetting::None);
    }
    in_range(s, 1)
        .map(IdSetting::Set)
        .map_err(|e| format!("{e} (or `none`)"))
}

pub fn parse_gid_or_none(s: &str) -> Result<IdSetting, String> {
    if s == "none" {
        return Ok(IdSetting::None);
    }
    in_range(s, 0)
        .map(IdSetting::Set)
        .map_err(|e| format!("{e} (or `none`)"))
}

pub fn parse_fsgroup(s: &str) -> Result<i64, String> {
    let v = parse_int(s)?;
    if v > MAX_ID {
        return Err(format!(
            "{v} is above {MAX_ID}; use 0 to never set an fsGroup"
        ));
    }
    Ok(v)
}

/// `--init-container-user` must be a real non-root uid: 1..2147483647.
pub fn parse_init_container_user(s: &str) -> Result<i64, String> {
    in_range(s, 1)
}

pub fn non_empty(s: &str) -> Result<String, String> {
    if s.trim().is_empty() {
        Err("must not be empty".into())
    } else {
        Ok(s.to_string())
    }
}

/// `--model-mount-path`: an absolute path, kept normalised (it is compared with the mounts
/// pods already have).
pub fn absolute_path(s: &str) -> Result<String, String> {
    normalise_absolute(s).ok_or_else(|| format!("`{s}` must be an absolute path"))
}

/// `--cache-mount-path`: an absolute path, normalised, that goes into the prep's `sh -c`
/// command as it is, so it may hold only characters no shell gives a meaning to: letters,
/// digits and `/ . _ - + : @ % , =`. Whitespace, quotes, `$`, `;`, `*`, `~`, … are refused.
pub fn shell_safe_path(s: &str) -> Result<String, String> {
    let path = normalise_absolute(s).ok_or_else(|| format!("`{s}` must be an absolute path"))?;
    let safe = |c: char| c.is_ascii_alphanumeric() || "/._-+:@%,=".contains(c);
    match path.chars().find(|c| !safe(*c)) {
        None => Ok(path),
        Some(c) => Err(format!(
            "`{s}` holds {c:?}; only letters, digits and / . _ - + : @ % , = may appear, \
             since the path goes into the prep container's shell command"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_exemptions_are_kube_system_and_the_own_namespace_unless_the_flag_is_given() {
        let exempt = |flag: &[&str], own: Option<&str>| {
            PolicyConfig {
                exempt_namespaces: flag.iter().map(|n| n.to_string()).collect(),
                ..Default::default()
            }
            .with_default_exemptions(own)
            .exempt_namespaces
        };
        assert_eq!(exempt(&[], None), ["kube-system"]);
        assert_eq!(exempt(&[], Some("")), ["kube-system"]);
        assert_eq!(exempt(&[], Some("kube-system")), ["kube-system"]);
        assert_eq!(exempt(&[], Some("modelgate")), ["kube-system", "modelgate"]);
        assert_eq!(exempt(&["team-x"], Some("modelgate")), ["team-x"]);
    }

    #[test]
    fn init_container_user_range() {
        assert_eq!(parse_init_container_user("1"), Ok(1));
        assert_eq!(parse_init_container_user("2147483647"), Ok(MAX_ID));
        for bad in ["0", "-1", "2147483648", "abc", "1.5", ""] {
            let err = parse_init_container_user(bad).unwrap_err();
            assert!(err.contains("1..2147483647"), "{bad}: {err}");
        }
    }

    #[test]
    fn uid_or_none() {
        assert_eq!(parse_uid_or_none("none"), Ok(IdSetting::None));
        assert_eq!(parse_uid_or_none("1000"), Ok(IdSetting::Set(1000)));
        assert!(parse_uid_or_none("0").is_err());
        assert_eq!(parse_gid_or_none("0"), Ok(IdSetting::Set(0)));
        assert!(parse_gid_or_none("-1").is_err());
    }

    #[test]
    fn fsgroup_zero_or_negative_means_never() {
        assert_eq!(parse_fsgroup("0"), Ok(0));
        assert_eq!(parse_fsgroup("-5"), Ok(-5));
        assert!(parse_fsgroup("2147483648").is_err());
    }

    #[test]
    fn mount_paths_must_be_absolute_and_the_cache_one_shell_safe() {
        assert_eq!(absolute_path("/mnt//models/"), Ok("/mnt/models".into()));
        assert!(absolute_path("models").is_err());
        assert!(absolute_path("").is_err());
        assert_eq!(shell_safe_path("/models"), Ok("/models".into()));
        assert_eq!(shell_safe_path("/a/./b/../c"), Ok("/a/c".into()));
        assert_eq!(shell_safe_path("/data/m-1_2.x"), Ok("/data/m-1_2.x".into()));
        for bad in [
            "models",
            "",
            "/m; rm -rf /",
            "/m && id",
            "/m x",
            "/m\tx",
            "/m\nx",
            "/$(id)",
            "/`id`",
            "/m'x",
            "/m\"x",
            "/m*",
            "/m?",
            "/~root",
            "/m|x",
            "/m>x",
            "/m\\x",
            "/mé",
        ] {
            assert!(shell_safe_path(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn prep_volume_types_are_inline_sources_only() {
        assert_eq!(parse_prep_volume_type(" nfs ").as_deref(), Ok("nfs"));
        assert_eq!(parse_prep_volume_type("csi").as_deref(), Ok("csi"));
        for (bad, says) in [
            ("hostPath", "--prep-host-path"),
            ("persistentVolumeClaim", "without --prep-volume-type"),
            ("emptyDir", "never cache storage"),
            ("", "not a volume type"),
            ("NFS", "not a volume type"),
            ("nfs,csi", "not a volume type"),
        ] {
            let e = parse_prep_volume_type(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn host_paths_normalise_and_match_whole_components() {
        assert_eq!(normalise_absolute("/"), Some("/".into()));
        assert_eq!(
            normalise_absolute("//data//models/"),
            Some("/data/models".into())
        );
        assert_eq!(
            normalise_absolute("/data/./models/."),
            Some("/data/models".into())
        );
        assert_eq!(
            normalise_absolute("/data/models/../../etc"),
            Some("/etc".into())
        );
        assert_eq!(normalise_absolute("/../../etc"), Some("/etc".into()));
        assert_eq!(normalise_absolute("data/models"), None);
        assert_eq!(normalise_absolute(""), None);
        assert_eq!(
            parse_prep_host_path("/data//models/"),
            Ok("/data/models".into())
        );
        for bad in ["", "data", "./data"] {
            assert!(parse_prep_host_path(bad).is_err(), "{bad:?}");
        }

        let cfg = PolicyConfig {
            prep_host_paths: vec!["/data/models".into(), "/srv/cache".into()],
            ..Default::default()
        };
        for allowed in [
            "/data/models",
            "/data/models/",
            "/data/models/x",
            "/data/models/x/../y",
            "//data/models//x",
            "/srv/cache/llm",
        ] {
            assert!(cfg.allows_prep_on_host_path(allowed), "{allowed}");
        }
        for refused in [
            "/data/models-evil",
            "/data/model",
            "/data",
            "/data/models/../../etc",
            "/data/models/..",
            "/etc",
            "/",
            "data/models/x",
            "",
        ] {
            assert!(!cfg.allows_prep_on_host_path(refused), "{refused}");
        }
        assert!(!PolicyConfig::default().allows_prep_on_host_path("/data/models"));
        let root = PolicyConfig {
            prep_host_paths: vec!["/".into()],
            ..Default::default()
        };
        assert!(root.allows_prep_on_host_path("/etc"));
    }
}
