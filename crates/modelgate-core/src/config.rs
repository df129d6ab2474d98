//! Policy configuration: the settings of SPEC.md §2, as plain values.
//!
//! The command line (the `modelgate` package's `PolicyArgs`) parses them with the checks below,
//! so an invalid value stops the program before anything else happens.

use crate::namespaces::Mode;

/// Largest uid/gid Kubernetes accepts (`int32` max).
pub const MAX_ID: i64 = 2_147_483_647;

/// The canonical name of the cache-prep init container (SPEC.md §4).
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

/// Directory of a model under the cache PVC's `models/` (SPEC.md §5).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CacheLayout {
    /// `models/<first 16 hex digits of SHA-256 of sourceModelUri>`: KServe 0.18 and later.
    #[default]
    StorageKey,
    /// `models/<cache name>`: KServe 0.17 and older.
    CacheName,
}

/// The policy's settings (SPEC.md §2).
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

    /// Mode of a namespace without a modelgate.io/mode label (SPEC.md §9).
    pub default_mode: Mode,

    /// Absolute host path prefixes under which a `hostPath` cache volume may get the prep
    /// container (SPEC.md §4, `--prep-host-path`); empty: never on a host path.
    pub prep_host_paths: Vec<String>,
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

pub fn absolute_path(s: &str) -> Result<String, String> {
    if !s.starts_with('/') || s.contains(['\n', '\'', '"', ';', '&', '|', '$', '`']) {
        Err(format!(
            "`{s}` must be an absolute path without shell metacharacters"
        ))
    } else {
        Ok(s.to_string())
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
    fn paths_must_be_absolute_and_shell_safe() {
        assert!(absolute_path("/models").is_ok());
        assert!(absolute_path("models").is_err());
        assert!(absolute_path("/m; rm -rf /").is_err());
    }
}
