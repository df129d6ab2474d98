//! The policy flags of docs/policy.md §2 on the command line, shared by `serve`, `review` and `audit`.
//!
//! Every flag is also an environment variable `MODELGATE_<NAME>`. Values are checked while the
//! command line is parsed (with the core's checks), so an invalid one stops the program with exit
//! code 2 and a one-line error that names the flag and the accepted range, before anything else
//! happens. [`PolicyArgs::into_config`] gives the core's plain [`PolicyConfig`].

use std::sync::Arc;

use clap::{Args, ValueEnum};

use crate::config::{
    AbsentClaims, CacheLayout, IdSetting, PodSecurityLevel, PolicyConfig, PrepMode, absolute_path,
    non_empty, parse_fsgroup, parse_gid_or_none, parse_init_container_user, parse_prep_host_path,
    parse_prep_volume_type, parse_uid_or_none, shell_safe_path,
};
use crate::kinds::WorkloadKinds;
use crate::namespaces::Mode;

/// `--model-cache-prep` ([`PrepMode`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PrepModeArg {
    Always,
    Never,
}

/// `--pod-security-default` ([`PodSecurityLevel`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum PodSecurityLevelArg {
    #[default]
    Privileged,
    Baseline,
    Restricted,
}

impl From<PodSecurityLevelArg> for PodSecurityLevel {
    fn from(level: PodSecurityLevelArg) -> Self {
        match level {
            PodSecurityLevelArg::Privileged => PodSecurityLevel::Privileged,
            PodSecurityLevelArg::Baseline => PodSecurityLevel::Baseline,
            PodSecurityLevelArg::Restricted => PodSecurityLevel::Restricted,
        }
    }
}

/// `--cache-layout` ([`CacheLayout`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum CacheLayoutArg {
    /// `models/<first 16 hex digits of SHA-256 of sourceModelUri>`: KServe 0.18 and later.
    #[default]
    StorageKey,
    /// `models/<cache name>`: KServe 0.17 and older.
    CacheName,
}

/// `--default-mode` ([`Mode`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum ModeArg {
    /// Patch and deny as the policy says.
    #[default]
    Enforce,
    /// Allow without a patch; say in warnings what would change or be denied.
    Warn,
    /// Allow without a patch or warning; say it in audit annotations.
    Audit,
    /// Allow untouched.
    Off,
}

impl From<ModeArg> for Mode {
    fn from(m: ModeArg) -> Mode {
        match m {
            ModeArg::Enforce => Mode::Enforce,
            ModeArg::Warn => Mode::Warn,
            ModeArg::Audit => Mode::Audit,
            ModeArg::Off => Mode::Off,
        }
    }
}

#[derive(Args, Clone, Debug)]
#[command(next_help_heading = "Policy (docs/policy.md §2)")]
pub struct PolicyArgs {
    /// uid set on a pod whose containers have no runAsUser; `none` never sets one.
    #[arg(long, env = "MODELGATE_RUN_AS_USER", default_value = "1000", allow_negative_numbers = true,
          value_parser = parse_uid_or_none)]
    pub run_as_user: IdSetting,

    /// gid set alongside runAsUser; `none` never sets one.
    #[arg(long, env = "MODELGATE_RUN_AS_GROUP", default_value = "1000", allow_negative_numbers = true,
          value_parser = parse_gid_or_none)]
    pub run_as_group: IdSetting,

    /// fsGroup given to a pod that mounts the model cache and has none; 0 or less never sets one.
    #[arg(long = "default-fsgroup", env = "MODELGATE_DEFAULT_FSGROUP", default_value_t = 102,
          allow_negative_numbers = true, value_parser = parse_fsgroup)]
    pub default_fsgroup: i64,

    /// Owner of the cache root when the pod has no pod-level runAsUser (1..2147483647).
    #[arg(long, env = "MODELGATE_INIT_CONTAINER_USER", default_value_t = 101,
          allow_negative_numbers = true, value_parser = parse_init_container_user)]
    pub init_container_user: i64,

    /// Inject the model-cache-prep init container, or never inject it.
    #[arg(long, env = "MODELGATE_MODEL_CACHE_PREP", value_enum, default_value_t = PrepModeArg::Always)]
    pub model_cache_prep: PrepModeArg,

    /// Image of the prep container (needs sh, chown, chmod).
    #[arg(long, env = "MODELGATE_INIT_IMAGE", default_value = "docker.io/curlimages/curl:8.18.0",
          value_parser = non_empty)]
    pub init_image: String,

    /// The pod volume that is the writable model cache (per pod: annotation modelgate.io/cache-volume).
    #[arg(long, env = "MODELGATE_CACHE_VOLUME", default_value = "model-cache", value_parser = non_empty)]
    pub cache_volume: String,

    /// Where the prep container mounts the cache volume's root (absolute; it goes into the
    /// prep's shell command, so only letters, digits and / . _ - + : @ % , =).
    #[arg(long, env = "MODELGATE_CACHE_MOUNT_PATH", default_value = "/models", value_parser = shell_safe_path)]
    pub cache_mount_path: String,

    /// Where a resolved node-local model is mounted read-only.
    #[arg(long, env = "MODELGATE_MODEL_MOUNT_PATH", default_value = "/mnt/models", value_parser = absolute_path)]
    pub model_mount_path: String,

    /// Directory of a model under the cache PVC's models/: storage-key (KServe 0.18+) or
    /// cache-name (KServe 0.17 and older).
    #[arg(long, env = "MODELGATE_CACHE_LAYOUT", value_enum, default_value_t = CacheLayoutArg::StorageKey)]
    pub cache_layout: CacheLayoutArg,

    /// Namespace left untouched (repeatable; default: kube-system and the webhook's own namespace).
    #[arg(
        long = "exempt-namespace",
        env = "MODELGATE_EXEMPT_NAMESPACE",
        value_delimiter = ','
    )]
    pub exempt_namespaces: Vec<String>,

    /// Mode of a namespace without a modelgate.io/mode label (docs/policy.md §9).
    #[arg(long, env = "MODELGATE_DEFAULT_MODE", value_enum, default_value_t = ModeArg::Enforce)]
    pub default_mode: ModeArg,

    /// Node directory under which a hostPath cache volume still gets the root prep (repeatable,
    /// absolute; none by default: a hostPath cache gets no prep, as under --model-cache-prep=never).
    #[arg(
        long = "prep-host-path",
        env = "MODELGATE_PREP_HOST_PATH",
        value_name = "PREFIX",
        value_delimiter = ',',
        value_parser = parse_prep_host_path
    )]
    pub prep_host_paths: Vec<String>,

    /// An inline volume type (nfs, csi, cephfs, …) whose cache volume may still get the root
    /// prep (repeatable; none by default: only claims and claim templates get it, since an
    /// inline volume names its storage, a server or disk of the pod's choosing).
    #[arg(
        long = "prep-volume-type",
        env = "MODELGATE_PREP_VOLUME_TYPE",
        value_name = "TYPE",
        value_delimiter = ',',
        value_parser = parse_prep_volume_type
    )]
    pub prep_volume_types: Vec<String>,

    /// A storage class whose claims may get the root prep (repeatable; none by default: every
    /// class). Given, a claim of another class, or of none written, gets no prep.
    #[arg(
        long = "prep-storage-class",
        env = "MODELGATE_PREP_STORAGE_CLASS",
        value_name = "CLASS",
        value_delimiter = ',',
        value_parser = parse_storage_class
    )]
    pub prep_storage_classes: Vec<String>,

    /// The Pod Security level of a namespace without a pod-security.kubernetes.io/enforce
    /// label, as the cluster's PSA configuration sets it: under restricted no root prep is
    /// injected there (the API server would refuse it).
    #[arg(long, env = "MODELGATE_POD_SECURITY_DEFAULT", value_enum,
          default_value_t = PodSecurityLevelArg::Privileged)]
    pub pod_security_default: PodSecurityLevelArg,

    /// A YAML file of workload kinds whose pod templates are judged at apply time (docs/policy.md
    /// §12): each entry (group, versions, kind, plural, templates: [{path, shape,
    /// completeness}]) is added to the built-in table, or replaces its row of the same group
    /// and kind. A malformed entry stops the program (exit 2), naming the entry and the field.
    #[arg(
        long,
        env = "MODELGATE_WORKLOAD_KINDS",
        value_name = "FILE",
        value_parser = parse_workload_kinds
    )]
    pub workload_kinds: Option<Arc<WorkloadKinds>>,

    /// The longest a ModelgateException may run, in days from its creation (1..3650):
    /// /validate refuses an expires further ahead, and one that outlives its creation by more
    /// is never honoured.
    #[arg(long, env = "MODELGATE_MAX_EXCEPTION_DAYS", value_name = "DAYS",
          default_value_t = crate::exceptions::DEFAULT_MAX_DAYS, value_parser = parse_days)]
    pub max_exception_days: u32,
}

/// `--max-exception-days`: a whole number of days from 1 to 3650.
fn parse_days(s: &str) -> Result<u32, String> {
    match s.trim().parse::<u32>() {
        Ok(n) if (1..=3650).contains(&n) => Ok(n),
        _ => Err(format!(
            "`{s}` is not a whole number of days from 1 to 3650"
        )),
    }
}

/// `--prep-storage-class`: a StorageClass name, as the API server validates one (a DNS
/// subdomain).
fn parse_storage_class(s: &str) -> Result<String, String> {
    let t = s.trim();
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if t.len() <= 253 && t.split('.').all(label_ok) {
        Ok(t.to_string())
    } else {
        Err(format!(
            "{s:?} is not a storage class name (lowercase letters, digits, '-' and '.', at most \
             253 characters)"
        ))
    }
}

/// The built-in table with the entries of the file at `path`.
fn parse_workload_kinds(path: &str) -> Result<Arc<WorkloadKinds>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {path}: {e}"))?;
    WorkloadKinds::defaults()
        .with_file(&text, path)
        .map(Arc::new)
        .map_err(|e| e.to_string())
}

impl PolicyArgs {
    /// The core's configuration, with the exempt namespace default resolved
    /// ([`PolicyConfig::finalize`]).
    pub fn into_config(self) -> PolicyConfig {
        PolicyConfig {
            run_as_user: self.run_as_user,
            run_as_group: self.run_as_group,
            default_fsgroup: self.default_fsgroup,
            init_container_user: self.init_container_user,
            model_cache_prep: match self.model_cache_prep {
                PrepModeArg::Always => PrepMode::Always,
                PrepModeArg::Never => PrepMode::Never,
            },
            init_image: self.init_image,
            cache_volume: self.cache_volume,
            cache_mount_path: self.cache_mount_path,
            model_mount_path: self.model_mount_path,
            cache_layout: match self.cache_layout {
                CacheLayoutArg::StorageKey => CacheLayout::StorageKey,
                CacheLayoutArg::CacheName => CacheLayout::CacheName,
            },
            exempt_namespaces: self.exempt_namespaces,
            default_mode: self.default_mode.into(),
            prep_host_paths: self.prep_host_paths,
            prep_volume_types: self.prep_volume_types,
            prep_storage_classes: self.prep_storage_classes,
            absent_claims: AbsentClaims::default(),
            pod_security_default: self.pod_security_default.into(),
            workload_kinds: self.workload_kinds.unwrap_or_else(WorkloadKinds::defaults),
            max_exception_days: self.max_exception_days,
        }
        // The manifests give the pod its namespace in POD_NAMESPACE (the downward API).
        .with_default_exemptions(std::env::var("POD_NAMESPACE").ok().as_deref())
    }
}
