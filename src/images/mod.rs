//! `modelgate images`: what each image of the workloads expects to run as, read from its OCI
//! config, next to the uid modelgate's mutation gives the container (docs/images.md).
//!
//! The workloads are those `audit` evaluates, extracted by [`crate::audit::extract`] (Pods,
//! Jobs, the pod templates of the workload-kind table); each pod is run through the core's
//! mutating webhook, its patch applied, and the uid read from the patched pod: the container's
//! `runAsUser`, else the pod's, else none (the image's `User` applies). The registry is read in
//! [`registry`], never on the admission path.

pub mod pull;
pub mod registry;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::io::Write;

use serde::Serialize;
use serde_json::Value;

use crate::admission::{self, Context, Request, Webhook};
use crate::audit::{self, Extracted};
use crate::kinds::WorkloadKinds;

/// The group part of an image's `User` (`1000:1000`, `1000:staff`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum Group {
    Id(u32),
    Name(String),
}

/// What an image's `User` says about who runs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum UserClass {
    /// No `User` (or an empty one, or only a group): the image runs as root.
    Unset,
    /// uid 0 by number (`0`, `0:0`).
    Root,
    /// A user name (`app`, `root`, `nobody:nogroup`): only the image's /etc/passwd knows its
    /// uid, so the kubelet cannot verify that it is not root.
    Name,
    /// A numeric uid other than 0.
    NonRoot,
}

/// An image's `User`, as written and as classified.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ImageUser {
    /// As written in the config's `config.User` (`None`: absent or empty).
    pub written: Option<String>,
    pub class: UserClass,
    /// The numeric uid, for [`UserClass::Root`] and [`UserClass::NonRoot`].
    pub uid: Option<u32>,
    pub group: Option<Group>,
}

/// Classifies an image config's `User`.
pub fn classify(user: Option<&str>) -> ImageUser {
    let written = user.filter(|u| !u.is_empty()).map(str::to_string);
    let Some(text) = written.as_deref() else {
        return ImageUser {
            written,
            class: UserClass::Unset,
            uid: None,
            group: None,
        };
    };
    let (user_part, group_part) = match text.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (text, None),
    };
    let group = group_part
        .filter(|g| !g.is_empty())
        .map(|g| match numeric(g) {
            Some(id) => Group::Id(id),
            None => Group::Name(g.to_string()),
        });
    let (class, uid) = if user_part.is_empty() {
        (UserClass::Unset, None)
    } else {
        match numeric(user_part) {
            Some(0) => (UserClass::Root, Some(0)),
            Some(uid) => (UserClass::NonRoot, Some(uid)),
            None => (UserClass::Name, None),
        }
    };
    ImageUser {
        written,
        class,
        uid,
        group,
    }
}

/// A uid or gid written in decimal digits only (no sign, no spaces).
fn numeric(s: &str) -> Option<u32> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

impl ImageUser {
    /// `uid 1001, gid 1001`, `unset (root)`, `name "app" (not verifiable)`.
    pub fn describe(&self) -> String {
        let group = match &self.group {
            Some(Group::Id(g)) => format!(", gid {g}"),
            Some(Group::Name(g)) => format!(", group name \"{g}\""),
            None => String::new(),
        };
        match self.class {
            UserClass::Unset => format!("unset (root){group}"),
            UserClass::Root => format!("uid 0 (root){group}"),
            UserClass::Name => format!(
                "name \"{}\" (not verifiable by the kubelet){group}",
                self.name()
            ),
            UserClass::NonRoot => format!("uid {}{group}", self.uid.unwrap_or_default()),
        }
    }

    fn name(&self) -> &str {
        let w = self.written.as_deref().unwrap_or("");
        w.split_once(':').map_or(w, |(u, _)| u)
    }

    /// Which user the image's files expect, for a warning.
    fn expects(&self) -> String {
        match self.class {
            UserClass::Unset => "uid 0 (root: the image sets no User)".to_string(),
            UserClass::Root => "uid 0 (root)".to_string(),
            UserClass::Name => format!(
                "the user named \"{}\", whose uid only the image's /etc/passwd knows",
                self.name()
            ),
            UserClass::NonRoot => format!("uid {}", self.uid.unwrap_or_default()),
        }
    }
}

/// `--expect-user UID[:GID]`: the numeric user every image must declare, exactly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExpectUser {
    pub uid: u32,
    pub gid: Option<u32>,
}

impl std::str::FromStr for ExpectUser {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("{s:?}: expected a numeric UID or UID:GID (e.g. 1000 or 1000:1000)");
        let (u, g) = match s.split_once(':') {
            Some((u, g)) => (u, Some(g)),
            None => (s, None),
        };
        let uid = numeric(u).ok_or_else(bad)?;
        let gid = match g {
            Some(g) => Some(numeric(g).ok_or_else(bad)?),
            None => None,
        };
        Ok(ExpectUser { uid, gid })
    }
}

impl std::fmt::Display for ExpectUser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.gid {
            Some(g) => write!(f, "{}:{g}", self.uid),
            None => write!(f, "{}", self.uid),
        }
    }
}

impl ExpectUser {
    /// Whether the image declares exactly this numeric user: the same uid, and the same gid
    /// or, when none is expected, no group.
    pub fn matches(&self, user: &ImageUser) -> bool {
        let uid_ok = matches!(user.class, UserClass::Root | UserClass::NonRoot)
            && user.uid == Some(self.uid);
        let gid_ok = match (&user.group, self.gid) {
            (None, None) => true,
            (Some(Group::Id(g)), Some(want)) => *g == want,
            _ => false,
        };
        uid_ok && gid_ok
    }
}

/// One container of a workload, with the uid it will run as after modelgate's mutation.
#[derive(Clone, Debug, Serialize)]
pub struct ContainerUse {
    pub kind: String,
    pub namespace: String,
    pub name: String,
    pub container: String,
    /// The container in the workload's own terms (`spec.template.spec.containers[0]`).
    pub field: String,
    pub image: String,
    /// The uid the pod sets for this container once mutated: the container's `runAsUser`, else
    /// the pod's; `None`: the image's `User` applies.
    pub run_as_user: Option<i64>,
    /// `container` or `pod`: where [`ContainerUse::run_as_user`] comes from.
    pub run_as_user_from: Option<&'static str>,
    /// The mutating webhook would deny the pod (it would not run at all): its message.
    pub denied: Option<String>,
    /// What the container will find at the model cache root, when it mounts the cache
    /// writable and the pod gets the cache-prep init container.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache: Option<CacheMount>,
    /// Where the kubelet finds the pod's pull credentials (read only with `--from-cluster`).
    #[serde(skip)]
    pub pull: PullSource,
}

/// The pull secrets a pod names, and whether its ServiceAccount's stand in for them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PullSource {
    /// The pod spec's (or template's) `imagePullSecrets`, in order.
    pub secrets: Vec<String>,
    /// For a template, the ServiceAccount (`spec.serviceAccountName`, else `default`) whose
    /// `imagePullSecrets` the ServiceAccount admission plugin gives the pod when it names
    /// none; `None` for a Pod, which went through that plugin already.
    pub service_account: Option<String>,
}

/// The pull credentials of a pod spec at `pointer` of `object` (a Pod when `is_pod`).
fn pull_source(object: &Value, pointer: &str, is_pod: bool) -> PullSource {
    let spec = object.pointer(pointer);
    let secrets: Vec<String> = spec
        .and_then(|s| s.get("imagePullSecrets"))
        .and_then(Value::as_array)
        .map(|list| {
            list.iter()
                .filter_map(|r| r.get("name").and_then(Value::as_str))
                .filter(|n| !n.is_empty())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    let named = |key: &str| {
        spec.and_then(|s| s.get(key))
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
    };
    let service_account = (!is_pod).then(|| {
        named("serviceAccountName")
            .or_else(|| named("serviceAccount"))
            .unwrap_or("default")
            .to_string()
    });
    PullSource {
        secrets,
        service_account,
    }
}

/// The model cache root as the prep leaves it, and the ids the container brings to it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CacheMount {
    /// The cache root (`--cache-mount-path`).
    pub path: String,
    pub owner_uid: i64,
    pub owner_gid: i64,
    /// As the prep's `chmod` writes it (`g+rwX`, `770`).
    pub mode: String,
    /// The container's `runAsGroup` after mutation, else the pod's.
    pub run_as_group: Option<i64>,
    /// The pod's `fsGroup` and `supplementalGroups` after mutation (every container gets them).
    pub pod_groups: Vec<i64>,
}

impl CacheMount {
    fn group_writable(&self) -> bool {
        match self.mode.as_bytes() {
            [.., g, _] if self.mode.bytes().all(|b| b.is_ascii_digit()) => (g - b'0') & 2 != 0,
            _ => self.mode.starts_with("g+") && self.mode.contains('w'),
        }
    }

    fn other_writable(&self) -> bool {
        self.mode.bytes().all(|b| b.is_ascii_digit())
            && self
                .mode
                .bytes()
                .last()
                .is_some_and(|o| (o - b'0') & 2 != 0)
    }
}

/// The prep's owner, group, mode and volume, read back from its `sh -c` command
/// (`chown U:G PATH && chmod MODE PATH`).
fn prep_of(pod_spec: &Value) -> Option<(String, String, i64, i64, String)> {
    let prep = pod_spec
        .get("initContainers")?
        .as_array()?
        .iter()
        .find(|c| c.get("name").and_then(Value::as_str) == Some("model-cache-prep"))?;
    let script = prep.pointer("/command/2").and_then(Value::as_str)?;
    let (chown, chmod) = script.split_once(" && ")?;
    let mut chown = chown.strip_prefix("chown ")?.split(' ');
    let (uid, gid) = chown.next()?.split_once(':')?;
    let path = chown.next()?.to_string();
    let mode = chmod.strip_prefix("chmod ")?.split(' ').next()?.to_string();
    let volume = prep
        .pointer("/volumeMounts/0/name")
        .and_then(Value::as_str)?
        .to_string();
    Some((volume, path, uid.parse().ok()?, gid.parse().ok()?, mode))
}

impl ContainerUse {
    pub fn workload(&self) -> String {
        if self.namespace.is_empty() {
            format!("{} {}", self.kind, self.name)
        } else {
            format!("{} {}/{}", self.kind, self.namespace, self.name)
        }
    }
}

/// The containers of one object (none for an object that is not a workload), each with the uid
/// the core's mutation gives it in `ctx` (enforce).
pub fn containers_of(
    value: Value,
    table: &'static WorkloadKinds,
    ctx: &Context,
) -> Result<Vec<ContainerUse>, String> {
    let Extracted::Target(target) = audit::extract(value, "default", table)? else {
        return Ok(Vec::new());
    };
    let exempt = ctx.config.is_exempt(&target.namespace);
    let mut out = Vec::new();
    for part in &target.parts {
        let (mutated, denied) = if exempt {
            (part.object.clone(), None)
        } else {
            after_mutation(&part.object, &target.namespace, ctx)
        };
        let (pointer, dotted) = match part.object.get("kind").and_then(Value::as_str) {
            Some("Job") => ("/spec/template/spec", "spec.template.spec"),
            _ => ("/spec", "spec"),
        };
        let pod_uid = mutated
            .pointer(&format!("{pointer}/securityContext/runAsUser"))
            .and_then(Value::as_i64);
        let pod_gid = mutated
            .pointer(&format!("{pointer}/securityContext/runAsGroup"))
            .and_then(Value::as_i64);
        let prep = mutated.pointer(pointer).and_then(prep_of);
        let is_pod = part.at.is_none() && target.kind == audit::AuditedKind::Pod;
        let pull = pull_source(&part.object, pointer, is_pod);
        let mut pod_groups: Vec<i64> = mutated
            .pointer(&format!("{pointer}/securityContext/fsGroup"))
            .and_then(Value::as_i64)
            .into_iter()
            .collect();
        if let Some(extra) = mutated
            .pointer(&format!("{pointer}/securityContext/supplementalGroups"))
            .and_then(Value::as_array)
        {
            pod_groups.extend(extra.iter().filter_map(Value::as_i64));
        }
        for list in ["initContainers", "containers"] {
            let Some(originals) = part
                .object
                .pointer(&format!("{pointer}/{list}"))
                .and_then(Value::as_array)
            else {
                continue;
            };
            let patched = mutated
                .pointer(&format!("{pointer}/{list}"))
                .and_then(Value::as_array);
            for (i, c) in originals.iter().enumerate() {
                let name = c.get("name").and_then(Value::as_str).unwrap_or("");
                let Some(image) = c.get("image").and_then(Value::as_str) else {
                    continue;
                };
                let after = patched
                    .and_then(|p| p.iter().find(|m| m.get("name") == c.get("name")))
                    .unwrap_or(c);
                let own = after
                    .pointer("/securityContext/runAsUser")
                    .and_then(Value::as_i64);
                let (run_as_user, from) = match (own, pod_uid) {
                    (Some(u), _) => (Some(u), Some("container")),
                    (None, Some(u)) => (Some(u), Some("pod")),
                    (None, None) => (None, None),
                };
                let mounts_cache = |(volume, ..): &&(String, String, i64, i64, String)| {
                    after
                        .get("volumeMounts")
                        .and_then(Value::as_array)
                        .is_some_and(|m| {
                            m.iter().any(|m| {
                                m.get("name").and_then(Value::as_str) == Some(volume.as_str())
                                    && m.get("readOnly") != Some(&Value::Bool(true))
                            })
                        })
                };
                let cache = prep.as_ref().filter(mounts_cache).map(
                    |(_, path, owner_uid, owner_gid, mode)| CacheMount {
                        path: path.clone(),
                        owner_uid: *owner_uid,
                        owner_gid: *owner_gid,
                        mode: mode.clone(),
                        run_as_group: after
                            .pointer("/securityContext/runAsGroup")
                            .and_then(Value::as_i64)
                            .or(pod_gid),
                        pod_groups: pod_groups.clone(),
                    },
                );
                out.push(ContainerUse {
                    kind: target.kind.as_str().to_string(),
                    namespace: target.namespace.clone(),
                    name: target.name.clone(),
                    container: name.to_string(),
                    field: part.field(&format!("{dotted}.{list}[{i}]")),
                    image: image.to_string(),
                    run_as_user,
                    run_as_user_from: from,
                    denied: denied.clone(),
                    cache,
                    pull: pull.clone(),
                });
            }
        }
    }
    Ok(out)
}

/// The object as the mutating webhook leaves it (its patch applied), and the denial's message
/// when it would refuse it (then the object as it is).
fn after_mutation(object: &Value, namespace: &str, ctx: &Context) -> (Value, Option<String>) {
    let review = admission::create_review(object, namespace, "modelgate-images");
    let body = serde_json::to_vec(&review).unwrap_or_default();
    let request = match Request::from_slice(&body) {
        Ok(r) => r,
        Err(_) => return (object.clone(), Some("cannot be decoded".to_string())),
    };
    let decision = admission::decide(Webhook::Mutate, &request, ctx);
    if !decision.allowed {
        return (object.clone(), Some(decision.message.unwrap_or_default()));
    }
    let mut out = object.clone();
    if let Some(patch) = &decision.patch {
        let applied = patch
            .try_operations()
            .map_err(|e| e.to_string())
            .and_then(|ops| json_patch::patch(&mut out, &ops).map_err(|e| e.to_string()));
        if let Err(e) = applied {
            return (
                object.clone(),
                Some(format!("the policy's patch does not apply: {e}")),
            );
        }
    }
    (out, None)
}

/// What was read of one image.
#[derive(Clone, Debug, Serialize)]
pub struct ImageResult {
    pub image: String,
    /// The credentials it was read with (`anonymous`, `pull secret NS/NAME`,
    /// `--registry-config`), or, when it could not be read, those tried.
    pub read_with: String,
    /// The digest of the image manifest read (the platform's, for an index).
    pub digest: Option<String>,
    /// The digest of the index the manifest was chosen from, when the image is multi-platform.
    pub index_digest: Option<String>,
    /// The platform chosen from the index.
    pub platform: Option<String>,
    pub config_digest: Option<String>,
    pub user: Option<ImageUser>,
    /// Why the image's config could not be read (a finding).
    pub error: Option<String>,
    /// With `--expect-user`: whether the image declares exactly that user.
    pub expected: Option<bool>,
    /// How many containers use it.
    pub containers: usize,
}

/// One container's finding.
#[derive(Clone, Debug, Serialize)]
pub struct ContainerResult {
    #[serde(flatten)]
    pub container: ContainerUse,
    pub image_user: Option<ImageUser>,
    /// The credentials its image was read with (or tried), as in `images[].read_with`.
    pub read_with: Option<String>,
    /// Why its image could not be read with the workload's credentials.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_error: Option<String>,
    /// The pull secrets the kubelet uses for it, `NAMESPACE/NAME` (with `--from-cluster`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub pull_secrets: Vec<String>,
    /// A mismatch between the uid it runs as and what the image expects.
    pub warning: Option<String>,
    /// The container could not write the model cache root the prep leaves.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_warning: Option<String>,
}

/// The whole answer of `images`.
#[derive(Debug, Default, Serialize)]
pub struct Report {
    pub images: Vec<ImageResult>,
    pub containers: Vec<ContainerResult>,
    /// With `--expect-user`, the user expected.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expect_user: Option<String>,
    /// Pull secrets and ServiceAccounts that could not be used (with `--from-cluster`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub pull_secret_findings: Vec<PullSecretFinding>,
    pub notes: Vec<String>,
}

/// A pull secret (or the ServiceAccount that names them) a workload's pods could not use.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct PullSecretFinding {
    /// `Deployment team-a/web`.
    pub workload: String,
    /// `secret team-a/regcred` or `serviceaccount team-a/builder`.
    pub object: String,
    pub problem: String,
}

/// One container with the read of its image (an index into the reads given to
/// [`Report::new`]), and the pull secrets it was read with.
pub struct Joined {
    pub container: ContainerUse,
    pub read: usize,
    pub pull_secrets: Vec<String>,
}

/// One read of an image and what it gave.
pub struct ReadResult {
    pub image: String,
    /// What was tried, for a read that failed (`anonymous`, or the credentials' labels).
    pub tried: String,
    pub result: Result<registry::Fetched, String>,
}

/// Reads the image of every container with the credentials of its workload (`pull`, from
/// [`pull::resolve`] under `--from-cluster`; else `--registry-config`'s alone), each distinct
/// read once, and joins the results to the containers.
pub async fn read_images(
    fetcher: &registry::Fetcher,
    containers: Vec<ContainerUse>,
    pull: Option<pull::Resolved>,
    expect: Option<ExpectUser>,
) -> Report {
    let (mut keyrings, mut names, findings) = match pull {
        Some(p) => (p.keyrings, p.secret_names, p.findings),
        None => (Vec::new(), Vec::new(), Vec::new()),
    };
    keyrings.resize_with(containers.len(), Vec::new);
    names.resize_with(containers.len(), Vec::new);
    let mut index: BTreeMap<registry::Read, usize> = BTreeMap::new();
    let mut joined = Vec::with_capacity(containers.len());
    for ((container, keyring), pull_secrets) in containers.into_iter().zip(keyrings).zip(names) {
        let read = fetcher.read_for(&container.image, &keyring);
        let next = index.len();
        let read = *index.entry(read).or_insert(next);
        joined.push(Joined {
            container,
            read,
            pull_secrets,
        });
    }
    let mut reads: Vec<Option<registry::Read>> = vec![None; index.len()];
    for (read, i) in &index {
        reads[*i] = Some(read.clone());
    }
    let mut fetched = fetcher.fetch_all(index.into_keys().collect()).await;
    let results = reads
        .into_iter()
        .flatten()
        .map(|read| {
            let result = fetched
                .remove(&read)
                .unwrap_or_else(|| Err("not read".to_string()));
            ReadResult {
                tried: read.tried(),
                image: read.image,
                result,
            }
        })
        .collect();
    let mut report = Report::new(joined, results, expect);
    report.pull_secret_findings = findings;
    report
}

/// The distinct images of `containers`, in name order.
pub fn distinct_images(containers: &[ContainerUse]) -> Vec<String> {
    let set: BTreeSet<&str> = containers.iter().map(|c| c.image.as_str()).collect();
    set.into_iter().map(str::to_string).collect()
}

/// The warning for one container: the uid it runs as against what its image expects.
pub fn warning(c: &ContainerUse, user: Option<&ImageUser>) -> Option<String> {
    let user = user?;
    let declared = match &user.written {
        Some(w) => format!("User \"{w}\""),
        None => "no User".to_string(),
    };
    match (c.run_as_user, user.class) {
        (Some(u), UserClass::NonRoot) if user.uid.map(i64::from) == Some(u) => None,
        (Some(0), UserClass::Root | UserClass::Unset) => None,
        (Some(u), UserClass::Name) => Some(format!(
            "runs as uid {u} (the {} runAsUser after modelgate's mutation), the image declares \
             {declared}: its files expect {}; check that uid {u} can write what it writes",
            c.run_as_user_from.unwrap_or("pod"),
            user.expects()
        )),
        (Some(u), _) => Some(format!(
            "runs as uid {u} (the {} runAsUser after modelgate's mutation), the image declares \
             {declared}: its files expect {}",
            c.run_as_user_from.unwrap_or("pod"),
            user.expects()
        )),
        (None, UserClass::NonRoot) => None,
        (None, UserClass::Unset | UserClass::Root) => Some(format!(
            "no runAsUser after modelgate's mutation and the image declares {declared}: it runs \
             as root"
        )),
        (None, UserClass::Name) => Some(format!(
            "no runAsUser after modelgate's mutation: it runs as the image's user name \"{}\", \
             which the kubelet cannot verify (runAsNonRoot refuses the pod)",
            user.name()
        )),
    }
}

/// The warning for a container that mounts the model cache: whether the uid and groups it will
/// run with can write the root as the prep leaves it (the owner's uid, or a group of the owner
/// with the group bits writable, or the other bits writable). The uid is the one the pod sets,
/// else the image's numeric `User`; the groups are its `runAsGroup` (else the image's numeric
/// group), the pod's `fsGroup` and `supplementalGroups`.
pub fn cache_warning(c: &ContainerUse, user: Option<&ImageUser>) -> Option<String> {
    let cache = c.cache.as_ref()?;
    let uid = match (c.run_as_user, user) {
        (Some(u), _) => u,
        (None, Some(u)) if matches!(u.class, UserClass::NonRoot | UserClass::Root) => {
            i64::from(u.uid?)
        }
        (None, Some(u)) if u.class == UserClass::Unset => 0,
        (None, Some(u)) => {
            return Some(format!(
                "mounts the model cache {}, owned by {}:{} mode {} after the prep, and runs as \
                 the image's user name \"{}\", whose uid is unknown: it may not write it",
                cache.path,
                cache.owner_uid,
                cache.owner_gid,
                cache.mode,
                u.name()
            ));
        }
        (None, None) => return None,
    };
    if uid == 0 || uid == cache.owner_uid || cache.other_writable() {
        return None;
    }
    let primary = cache
        .run_as_group
        .or_else(|| match user.and_then(|u| u.group.as_ref()) {
            Some(Group::Id(g)) => Some(i64::from(*g)),
            _ => None,
        });
    let mut groups: Vec<i64> = primary
        .into_iter()
        .chain(cache.pod_groups.iter().copied())
        .collect();
    groups.sort_unstable();
    groups.dedup();
    if cache.group_writable() && groups.contains(&cache.owner_gid) {
        return None;
    }
    let groups_text = if groups.is_empty() {
        "no group known".to_string()
    } else {
        format!(
            "groups {}",
            groups
                .iter()
                .map(i64::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    Some(format!(
        "cannot write the model cache {}: the prep leaves it owned by uid {}, gid {}, mode {}; \
         the container runs as uid {uid} with {groups_text}{}",
        cache.path,
        cache.owner_uid,
        cache.owner_gid,
        cache.mode,
        if primary.is_none() {
            " (its primary group, from the image, is unknown)"
        } else {
            ""
        }
    ))
}

impl Report {
    /// Joins the containers with what was read of their images.
    pub fn new(joined: Vec<Joined>, reads: Vec<ReadResult>, expect: Option<ExpectUser>) -> Report {
        // One row per image and credentials: reads that end the same (the same credentials
        // succeeded, or the same were tried) are one row.
        let mut rows: BTreeMap<(String, String), ImageResult> = BTreeMap::new();
        let mut row_of: Vec<(String, String)> = Vec::with_capacity(reads.len());
        for r in reads {
            let key = match &r.result {
                Ok(f) => (r.image.clone(), f.read_with.clone()),
                Err(_) => (r.image.clone(), r.tried.clone()),
            };
            row_of.push(key.clone());
            rows.entry(key.clone()).or_insert_with(|| match r.result {
                Ok(f) => {
                    let user = classify(f.user.as_deref());
                    ImageResult {
                        expected: expect.map(|e| e.matches(&user)),
                        image: r.image,
                        read_with: key.1,
                        digest: Some(f.digest),
                        index_digest: f.index_digest,
                        platform: f.platform,
                        config_digest: Some(f.config_digest),
                        user: Some(user),
                        error: None,
                        containers: 0,
                    }
                }
                Err(e) => ImageResult {
                    image: r.image,
                    read_with: key.1,
                    digest: None,
                    index_digest: None,
                    platform: None,
                    config_digest: None,
                    user: None,
                    error: Some(e),
                    expected: None,
                    containers: 0,
                },
            });
        }
        for j in &joined {
            if let Some(row) = row_of.get(j.read).and_then(|k| rows.get_mut(k)) {
                row.containers += 1;
            }
        }
        let containers = joined
            .into_iter()
            .map(|j| {
                let row = row_of.get(j.read).and_then(|k| rows.get(k));
                let user = row.and_then(|i| i.user.clone());
                let c = j.container;
                ContainerResult {
                    warning: warning(&c, user.as_ref()),
                    cache_warning: cache_warning(&c, user.as_ref()),
                    image_user: user,
                    read_with: row.map(|i| i.read_with.clone()),
                    image_error: row.and_then(|i| i.error.clone()),
                    pull_secrets: j.pull_secrets,
                    container: c,
                }
            })
            .collect();
        Report {
            images: rows.into_values().collect(),
            containers,
            expect_user: expect.map(|e| e.to_string()),
            pull_secret_findings: Vec::new(),
            notes: Vec::new(),
        }
    }

    /// At least one image could not be read.
    pub fn unreadable(&self) -> bool {
        self.images.iter().any(|i| i.error.is_some())
    }

    /// With `--expect-user`: at least one readable image does not declare that user.
    pub fn contract_broken(&self) -> bool {
        self.images.iter().any(|i| i.expected == Some(false))
    }

    pub fn table(&self) -> String {
        let mut out = String::new();
        let mut rows = vec![vec![
            "IMAGE".to_string(),
            "USER".to_string(),
            "CLASSIFIED".to_string(),
            "DIGEST".to_string(),
        ]];
        if self.expect_user.is_some() {
            rows[0].push("EXPECTED".to_string());
        }
        // Under --from-cluster an image may be read with several workloads' credentials.
        let by_credentials = self
            .images
            .iter()
            .any(|i| i.read_with.contains("pull secret"));
        if by_credentials {
            rows[0].push("READ WITH".to_string());
        }
        for i in &self.images {
            let mut row = vec![
                i.image.clone(),
                i.user
                    .as_ref()
                    .map(|u| u.written.clone().unwrap_or_else(|| "-".to_string()))
                    .unwrap_or_else(|| "?".to_string()),
                match (&i.user, &i.error) {
                    (Some(u), _) => u.describe(),
                    (None, _) => "unreadable".to_string(),
                },
                i.digest
                    .as_deref()
                    .map(short_digest)
                    .unwrap_or("-")
                    .to_string(),
            ];
            if self.expect_user.is_some() {
                row.push(
                    match i.expected {
                        Some(true) => "yes",
                        Some(false) => "NO",
                        None => "?",
                    }
                    .to_string(),
                );
            }
            if by_credentials {
                row.push(i.read_with.clone());
            }
            rows.push(row);
        }
        out.push_str(&align(&rows));
        if !self.containers.is_empty() {
            out.push('\n');
            let mut rows = vec![vec![
                "WORKLOAD".to_string(),
                "CONTAINER".to_string(),
                "IMAGE".to_string(),
                "RUNS AS".to_string(),
                "IMAGE USER".to_string(),
            ]];
            for c in &self.containers {
                let u = &c.container;
                rows.push(vec![
                    u.workload(),
                    u.container.clone(),
                    u.image.clone(),
                    match (u.run_as_user, u.run_as_user_from) {
                        (Some(uid), Some(from)) => format!("{uid} ({from})"),
                        (Some(uid), None) => uid.to_string(),
                        (None, _) => "image's User".to_string(),
                    },
                    c.image_user
                        .as_ref()
                        .map(ImageUser::describe)
                        .unwrap_or_else(|| "unreadable".to_string()),
                ]);
            }
            out.push_str(&align(&rows));
        }
        let mut findings = Vec::new();
        for f in &self.pull_secret_findings {
            findings.push(format!(
                "pull secret: {} ({}): {}",
                f.object, f.workload, f.problem
            ));
        }
        for i in &self.images {
            if let Some(e) = &i.error {
                findings.push(format!("image {}: cannot read its config: {e}", i.image));
            }
            if i.expected == Some(false) {
                findings.push(format!(
                    "image {}: declares {}, not the expected user {}",
                    i.image,
                    i.user.as_ref().map(ImageUser::describe).unwrap_or_default(),
                    self.expect_user.as_deref().unwrap_or_default()
                ));
            }
        }
        for c in &self.containers {
            let u = &c.container;
            if let Some(w) = &c.warning {
                findings.push(format!(
                    "warning: {} container {} ({}): {w}",
                    u.workload(),
                    u.container,
                    u.image
                ));
            }
            if let Some(w) = &c.cache_warning {
                findings.push(format!(
                    "warning: {} container {} ({}): {w}",
                    u.workload(),
                    u.container,
                    u.image
                ));
            }
            if let Some(d) = &u.denied {
                findings.push(format!(
                    "note: {} would be denied by modelgate: {d}",
                    u.workload()
                ));
            }
        }
        findings.dedup();
        if !findings.is_empty() {
            out.push('\n');
            for f in findings {
                let _ = writeln!(out, "{f}");
            }
        }
        for n in &self.notes {
            let _ = writeln!(out, "note: {n}");
        }
        out
    }

    pub fn write_json(&self, out: &mut dyn Write) -> std::io::Result<()> {
        serde_json::to_writer_pretty(&mut *out, self)?;
        writeln!(out)
    }

    /// A suite of images (a failure per unreadable image, and per image that breaks
    /// `--expect-user`) and a suite of containers (a failure per warning).
    pub fn write_junit(&self, out: &mut dyn Write) -> std::io::Result<()> {
        use crate::junit::{Case, Suite};
        let images = Suite {
            name: "images".to_string(),
            cases: self
                .images
                .iter()
                .map(|i| Case {
                    classname: "images".to_string(),
                    name: i.image.clone(),
                    failure: match (&i.error, i.expected) {
                        (Some(e), _) => Some(format!("cannot read its config: {e}")),
                        (None, Some(false)) => Some(format!(
                            "declares {}, not the expected user {}",
                            i.user.as_ref().map(ImageUser::describe).unwrap_or_default(),
                            self.expect_user.as_deref().unwrap_or_default()
                        )),
                        _ => None,
                    },
                    output: i.user.as_ref().map(ImageUser::describe),
                })
                .collect(),
        };
        let containers = Suite {
            name: "containers".to_string(),
            cases: self
                .containers
                .iter()
                .map(|c| Case {
                    classname: c.container.workload(),
                    name: format!("{} ({})", c.container.container, c.container.image),
                    failure: match (&c.warning, &c.cache_warning) {
                        (Some(a), Some(b)) => Some(format!("{a}; {b}")),
                        (a, b) => a.clone().or_else(|| b.clone()),
                    },
                    output: None,
                })
                .collect(),
        };
        let mut suites = vec![images, containers];
        if !self.pull_secret_findings.is_empty() {
            suites.push(Suite {
                name: "pull-secrets".to_string(),
                cases: self
                    .pull_secret_findings
                    .iter()
                    .map(|f| Case {
                        classname: f.workload.clone(),
                        name: f.object.clone(),
                        failure: Some(f.problem.clone()),
                        output: None,
                    })
                    .collect(),
            });
        }
        crate::junit::write(out, "modelgate images", &suites)
    }
}

fn short_digest(d: &str) -> &str {
    // `sha256:` and 12 hex digits, as `docker images` shows them.
    d.get(..19).unwrap_or(d)
}

/// Columns separated by two spaces, each as wide as its widest cell.
fn align(rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = Vec::new();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            let w = cell.chars().count();
            if widths.len() <= i {
                widths.push(w);
            } else {
                widths[i] = widths[i].max(w);
            }
        }
    }
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                let _ = write!(line, "{cell:<w$}  ", w = widths[i]);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn users_are_classified() {
        let c = |u: Option<&str>| classify(u);
        assert_eq!(c(None).class, UserClass::Unset);
        assert_eq!(c(Some("")).class, UserClass::Unset);
        assert_eq!(c(Some("0")).class, UserClass::Root);
        assert_eq!(c(Some("0:0")).group, Some(Group::Id(0)));
        assert_eq!(c(Some("root")).class, UserClass::Name);
        assert_eq!(c(Some("app:app")).group, Some(Group::Name("app".into())));
        let u = c(Some("1001"));
        assert_eq!(
            (u.class, u.uid, u.group),
            (UserClass::NonRoot, Some(1001), None)
        );
        let u = c(Some("1000:1000"));
        assert_eq!(u.group, Some(Group::Id(1000)));
        assert_eq!(
            c(Some("1000:staff")).group,
            Some(Group::Name("staff".into()))
        );
        assert_eq!(c(Some("+1000")).class, UserClass::Name);
        assert_eq!(c(Some(":1000")).class, UserClass::Unset);
    }

    #[test]
    fn cache_modes_are_read() {
        let mount = |mode: &str| CacheMount {
            path: "/models".into(),
            owner_uid: 0,
            owner_gid: 102,
            mode: mode.into(),
            run_as_group: None,
            pod_groups: vec![],
        };
        assert!(mount("g+rwX").group_writable() && !mount("g+rwX").other_writable());
        assert!(mount("770").group_writable() && !mount("770").other_writable());
        assert!(!mount("750").group_writable());
        assert!(mount("777").other_writable());
        let pod = serde_json::json!({"initContainers": [{
            "name": "model-cache-prep",
            "command": ["sh", "-c", "chown 1000:0 /models && chmod 770 /models"],
            "volumeMounts": [{"name": "model-cache", "mountPath": "/models"}],
        }]});
        assert_eq!(
            prep_of(&pod),
            Some((
                "model-cache".into(),
                "/models".into(),
                1000,
                0,
                "770".into()
            ))
        );
    }

    #[test]
    fn the_contract_is_exact() {
        let e: ExpectUser = "1000:1000".parse().unwrap();
        assert!(e.matches(&classify(Some("1000:1000"))));
        assert!(!e.matches(&classify(Some("1000"))));
        assert!(!e.matches(&classify(Some("1000:1001"))));
        assert!(!e.matches(&classify(Some("app:1000"))));
        assert!(!e.matches(&classify(None)));
        let e: ExpectUser = "1000".parse().unwrap();
        assert!(e.matches(&classify(Some("1000"))));
        assert!(!e.matches(&classify(Some("1000:1000"))));
        assert!("x".parse::<ExpectUser>().is_err());
        assert!("1000:".parse::<ExpectUser>().is_err());
        assert!("-1".parse::<ExpectUser>().is_err());
    }
}
