//! The cluster state modelgate routes by, and the one place a model URI is resolved (docs/policy.md §5).
//!
//! The index holds the caches (with their `status` and storage mode), the node groups, the
//! Nodes (name and labels) and the PVCs (namespace, name, phase, deletion mark). It is pure: no
//! client, no runtime, no clock. A [`lookup`](CacheIndex::lookup) answers hit or miss with its
//! reason without any API call:
//!
//! - a model URI longer than [`MAX_MODEL_URI_LEN`] is a miss (`uri-too-long`), never looked up;
//! - matching walks the model URI's prefixes that end at a `/` boundary, longest first, and
//!   hashes only those whose length some cache URI of the scope has (one integer probe each):
//!   O(URI length) plus one hash per candidate length, whatever the number of caches;
//! - the pod's namespace is searched completely before the cluster scope, and precedence picks
//!   the cache first: a failed check is a miss, never a fall-through to another cache;
//! - node-group membership is kept per group (updated when a Node or a group changes), with a
//!   label index, so a `nodeSelector` test costs one hash probe per selector pair plus a walk of
//!   the smallest matching set that stops at the first node that fits;
//! - every map is persistent ([`PMap`]): a clone (the published snapshot) costs O(1), and an
//!   upsert or removal copies O(log n) nodes, so a watch event costs in proportion to what it
//!   changed, not to the size of the cluster;
//! - the PVC test is two hash probes; the downloaded nodes are the cache's `NodeDownloaded`
//!   nodes filtered by O(log n) set probes, which is also the size of the answer.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, NodeSelectorTerm};

use rpds::RedBlackTreeMapSync;

use super::bounds::{
    BoundedText, MAX_DOWNLOADED_NODES, MAX_MISSING_LEN, MAX_NAME_LEN, NODE_STATUS_NOTES, clip,
};
use super::pmap::PMap;
use crate::config::CacheLayout;

/// Which scope a cache comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CacheScope {
    Namespace(String),
    Cluster,
}

/// Where a cache keeps its model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CacheStorage {
    /// `spec.nodeGroups`: a copy on every node of the groups, served through the PVC
    /// `<cache>-<nodegroup>` that KServe creates in the namespaces that use the cache.
    NodeGroups(Vec<String>),
    /// `spec.pvcRef` (namespace caches only): one copy on the user's PVC of that name, in the
    /// cache's namespace.
    PvcRef(String),
}

/// A node's entry in `status.nodeStatus` (KServe's `NodeStatus`), as far as routing and its
/// messages care. `NodeDownloadPending` and `NodeDownloading` are one state: the download's
/// progress from one to the other changes nothing routing decides, so a status update that
/// only moves it converts to an equal value and publishes nothing (docs/policy.md §5, "Scale").
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeState {
    Downloaded,
    /// `NodeDownloadPending` or `NodeDownloading`.
    Downloading,
    DownloadError,
    NotReady,
    /// A value this code does not know, kept for messages.
    Other(Box<str>),
}

impl NodeState {
    pub fn as_str(&self) -> &str {
        match self {
            NodeState::Downloaded => "NodeDownloaded",
            NodeState::Downloading => "downloading",
            NodeState::DownloadError => "NodeDownloadError",
            NodeState::NotReady => "NodeNotReady",
            NodeState::Other(s) => s,
        }
    }
}

impl From<&str> for NodeState {
    fn from(s: &str) -> Self {
        match s {
            "NodeDownloaded" => NodeState::Downloaded,
            "NodeDownloading" | "NodeDownloadPending" => NodeState::Downloading,
            "NodeDownloadError" => NodeState::DownloadError,
            "NodeNotReady" => NodeState::NotReady,
            // Kept for messages only: as much as a message shows.
            other => NodeState::Other(clip(other, MAX_STATE_LEN).into()),
        }
    }
}

/// The longest unknown `status.nodeStatus` value kept (for messages).
const MAX_STATE_LEN: usize = 64;

/// What the cache's `status` says about the model's download.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CacheStatus {
    /// `status.nodeStatus`, sorted by node name. A boxed slice, not a map: a cache has a few
    /// entries and there may be 100 000 caches.
    node_status: Box<[(Box<str>, NodeState)]>,
    /// pvcRef mode: the import finished (a `Ready` condition with status `True`, or
    /// `copies.available` ≥ 1).
    pub import_ready: bool,
    /// Whether the object had a `status` at all (for the miss message).
    pub reported: bool,
}

impl CacheStatus {
    /// A status from `status.nodeStatus` entries (in any order; a repeated node keeps the last).
    pub fn new<'a>(
        node_status: impl IntoIterator<Item = (&'a str, &'a str)>,
        import_ready: bool,
    ) -> Self {
        Self::bounded(node_status, import_ready).0
    }

    /// [`CacheStatus::new`], and how many entries that routing could use were left out: a node
    /// name longer than [`MAX_NAME_LEN`] (no Node has it), `NodeDownloaded` entries past
    /// [`MAX_DOWNLOADED_NODES`]. Of the other states only those among the first entries, which
    /// a `not-downloaded` message names, are kept (not counted: they change no decision).
    pub fn bounded<'a>(
        node_status: impl IntoIterator<Item = (&'a str, &'a str)>,
        import_ready: bool,
    ) -> (Self, usize) {
        let mut dropped = 0;
        let mut entries: Vec<(&str, &str)> = node_status
            .into_iter()
            .filter(|(n, _)| {
                let fits = n.len() <= MAX_NAME_LEN;
                dropped += usize::from(!fits);
                fits
            })
            .collect();
        crate::keyed::sort_keeping_last(&mut entries);
        let mut downloaded = 0;
        let kept: Vec<(Box<str>, NodeState)> = entries
            .into_iter()
            .enumerate()
            .filter(|(i, (_, state))| {
                if *state != NodeState::Downloaded.as_str() {
                    return *i <= NODE_STATUS_NOTES;
                }
                downloaded += 1;
                let fits = downloaded <= MAX_DOWNLOADED_NODES;
                dropped += usize::from(!fits);
                fits
            })
            .map(|(_, (n, s))| (Box::from(n), NodeState::from(s)))
            .collect();
        let status = CacheStatus {
            node_status: kept.into_boxed_slice(),
            import_ready,
            reported: true,
        };
        (status, dropped)
    }

    /// Sets one node's state.
    pub fn set_node(&mut self, node: &str, state: &str) {
        let others = self.node_status.iter().filter(|(n, _)| &**n != node);
        let mut all: Vec<(Box<str>, NodeState)> = others.cloned().collect();
        all.push((node.into(), NodeState::from(state)));
        all.sort_by(|a, b| a.0.cmp(&b.0));
        self.node_status = all.into_boxed_slice();
        self.reported = true;
    }

    /// `status.nodeStatus` by node name.
    pub fn nodes(&self) -> impl Iterator<Item = (&str, &NodeState)> {
        self.node_status.iter().map(|(n, s)| (&**n, s))
    }

    pub fn node(&self, name: &str) -> Option<&NodeState> {
        self.node_status
            .binary_search_by(|(n, _)| (**n).cmp(name))
            .ok()
            .map(|i| &self.node_status[i].1)
    }
}

/// One cache object as the index keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheEntry {
    pub scope: CacheScope,
    pub name: String,
    /// `spec.sourceModelUri` exactly as written (the storage key hashes this). Shared with the
    /// index's key for the caches of this URI: stored once.
    pub source_model_uri: Arc<str>,
    /// [`storage_key`] of `source_model_uri`, computed once when the entry is made.
    pub storage_key: String,
    pub storage: CacheStorage,
    pub status: CacheStatus,
    /// [`CacheEntry::reference`] then [`CacheEntry::describe`], rendered once when the entry is
    /// made (a hit writes the one and names the other), in one allocation: there may be
    /// 100 000 entries.
    names: Box<str>,
    reference_len: usize,
}

impl CacheEntry {
    /// A cache as the index keeps it; what depends only on the cache is computed here, once.
    pub fn from_parts(
        scope: CacheScope,
        name: String,
        source_model_uri: String,
        storage: CacheStorage,
        status: CacheStatus,
    ) -> Self {
        let (reference, description) = match &scope {
            CacheScope::Namespace(ns) => (
                format!("namespace/{ns}/{name}"),
                format!("LocalModelNamespaceCache {ns}/{name}"),
            ),
            CacheScope::Cluster => (format!("cluster/{name}"), format!("LocalModelCache {name}")),
        };
        // Bounded here too, so that no path builds an entry a decision pays more for.
        let storage = match storage {
            CacheStorage::NodeGroups(groups) => {
                CacheStorage::NodeGroups(super::bounds::bound_node_groups(groups).0)
            }
            pvc => pvc,
        };
        CacheEntry {
            storage_key: storage_key(&source_model_uri),
            scope,
            name,
            source_model_uri: source_model_uri.into(),
            storage,
            status,
            reference_len: reference.len(),
            names: (reference + &description).into(),
        }
    }

    /// A nodeGroups-mode cache without status.
    pub fn new(
        scope: CacheScope,
        name: &str,
        source_model_uri: &str,
        node_groups: &[&str],
    ) -> Self {
        CacheEntry::from_parts(
            scope,
            name.into(),
            source_model_uri.into(),
            CacheStorage::NodeGroups(node_groups.iter().map(|g| g.to_string()).collect()),
            CacheStatus::default(),
        )
    }

    /// The same cache with `nodes` reported as `NodeDownloaded`.
    pub fn downloaded_on(mut self, nodes: &[&str]) -> Self {
        for n in nodes {
            self.status.set_node(n, "NodeDownloaded");
        }
        self
    }

    pub fn kind(&self) -> &'static str {
        match self.scope {
            CacheScope::Namespace(_) => "LocalModelNamespaceCache",
            CacheScope::Cluster => "LocalModelCache",
        }
    }

    /// `LocalModelNamespaceCache team-a/m` or `LocalModelCache m`, for messages.
    pub fn describe(&self) -> &str {
        &self.names[self.reference_len..]
    }

    /// `namespace/<ns>/<name>` or `cluster/<name>`: the `modelgate.io/model-cache` annotation.
    pub fn reference(&self) -> &str {
        &self.names[..self.reference_len]
    }

    pub fn node_groups(&self) -> &[String] {
        match &self.storage {
            CacheStorage::NodeGroups(g) => g,
            CacheStorage::PvcRef(_) => &[],
        }
    }
}

/// `status.phase` of a PVC, as far as routing cares.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PvcPhase {
    Pending,
    Bound,
    Lost,
    /// No phase reported yet, or one this code does not know.
    #[default]
    Unknown,
}

impl PvcPhase {
    pub fn parse(phase: Option<&str>) -> Self {
        match phase {
            Some("Pending") => PvcPhase::Pending,
            Some("Bound") => PvcPhase::Bound,
            Some("Lost") => PvcPhase::Lost,
            _ => PvcPhase::Unknown,
        }
    }
}

/// What the index keeps of a PersistentVolumeClaim: what routing checks before it mounts one,
/// and what decides whether a cache volume on it may get the root prep (docs/policy.md,
/// "Claims whose volume the tenant picked").
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PvcState {
    pub phase: PvcPhase,
    /// `metadata.deletionTimestamp` is set.
    pub deleting: bool,
    /// Whoever wrote the claim chose its volume: `spec.volumeName` set by the claim's author (not
    /// by the PV controller, which marks its own bindings `pv.kubernetes.io/bound-by-controller`),
    /// or a `spec.selector` that picks among existing volumes.
    pub picked: bool,
    /// `spec.storageClassName` (shared: a cluster has a handful of classes).
    pub storage_class: Option<Arc<str>>,
}

impl PvcState {
    /// A claim in `phase`, not being deleted, whose volume the cluster chose.
    pub const fn provisioned(phase: PvcPhase) -> Self {
        PvcState {
            phase,
            deleting: false,
            picked: false,
            storage_class: None,
        }
    }
}

/// Why a model is not mounted from a cache (the `modelgate.io/model-cache-reason` annotation and
/// the `reason` label of `modelgate_cache_lookups_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MissReason {
    NoMatch,
    OptedOut,
    KserveManaged,
    NodeGroupMismatch,
    PvcMissing,
    NotDownloaded,
    NotSynced,
    UriTooLong,
    UriNotNormal,
}

impl MissReason {
    pub const ALL: [MissReason; 9] = [
        MissReason::NoMatch,
        MissReason::OptedOut,
        MissReason::KserveManaged,
        MissReason::NodeGroupMismatch,
        MissReason::PvcMissing,
        MissReason::NotDownloaded,
        MissReason::NotSynced,
        MissReason::UriTooLong,
        MissReason::UriNotNormal,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            MissReason::NoMatch => "no-match",
            MissReason::OptedOut => "opted-out",
            MissReason::KserveManaged => "kserve-managed",
            MissReason::NodeGroupMismatch => "node-group-mismatch",
            MissReason::PvcMissing => "pvc-missing",
            MissReason::NotDownloaded => "not-downloaded",
            MissReason::NotSynced => "not-synced",
            MissReason::UriTooLong => "uri-too-long",
            MissReason::UriNotNormal => "uri-not-normal",
        }
    }
}

/// Whether a model URI's path has no empty, `.` or `..` segment, also percent-encoded (`%2e`,
/// `%2E`), and no encoded `/` (`%2f`, `%2F`): the mount's `subPath` is built from the URI, and
/// the API server refuses a `subPath` with `..`. One trailing `/` is allowed (matching strips
/// it); the scheme's `//` and the authority are not part of the path.
pub(crate) fn is_normal_uri(uri: &str) -> bool {
    let uri = uri.strip_suffix('/').unwrap_or(uri);
    let path = match uri.split_once("://") {
        Some((_, rest)) => rest.split_once('/').map_or("", |(_, path)| path),
        None => uri,
    };
    if path.is_empty() {
        return true;
    }
    path.split('/').all(|segment| {
        let bytes = segment.as_bytes();
        let encoded_slash = bytes
            .windows(3)
            .any(|w| w[0] == b'%' && w[1] == b'2' && w[2].eq_ignore_ascii_case(&b'f'));
        !segment.is_empty() && !is_dots(segment) && !encoded_slash
    })
}

/// `.` or `..`, each dot written as `.` or percent-encoded (`%2e`, `%2E`).
fn is_dots(segment: &str) -> bool {
    let dot = |s: &str| -> Option<usize> {
        if s.starts_with('.') {
            Some(1)
        } else if s.len() >= 3 && s[..3].eq_ignore_ascii_case("%2e") {
            Some(3)
        } else {
            None
        }
    };
    match dot(segment) {
        Some(n) if n == segment.len() => true,
        Some(n) => dot(&segment[n..]).is_some_and(|m| n + m == segment.len()),
        None => false,
    }
}

impl std::fmt::Display for MissReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a lookup is asked.
#[derive(Clone, Copy, Debug)]
pub struct LookupRequest<'a> {
    /// The namespace the pod runs in.
    pub namespace: &'a str,
    pub model_uri: &'a str,
    /// `modelgate.io/node-group`, else `serving.kserve.io/nodegroup`.
    pub node_group: Option<&'a str>,
    /// The pod's `spec.nodeSelector`, borrowed: one pair per key, sorted by key.
    pub node_selector: Option<&'a [(&'a str, &'a str)]>,
    pub layout: CacheLayout,
}

impl<'a> LookupRequest<'a> {
    /// A request without node group or nodeSelector, in the default layout.
    pub fn new(namespace: &'a str, model_uri: &'a str) -> Self {
        LookupRequest {
            namespace,
            model_uri,
            node_group: None,
            node_selector: None,
            layout: CacheLayout::StorageKey,
        }
    }
}

/// A hit: everything the patch needs.
#[derive(Clone, Debug, PartialEq)]
pub struct Hit {
    pub cache: Arc<CacheEntry>,
    /// The claim to mount, in the pod's namespace.
    pub pvc: String,
    /// The model's directory under `models/` (storage key or cache name).
    pub dir: String,
    /// The model URI after the (trimmed) cache URI: empty or starting with `/`.
    pub sub_path: String,
    /// nodeGroups mode: the chosen group, its PV's required node terms (`None`: the PV has no
    /// node affinity) and the hostnames of the group's nodes with `NodeDownloaded` that fit the
    /// pod's nodeSelector. pvcRef mode: `None`.
    pub placement: Option<Placement>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Placement {
    pub node_group: String,
    pub required_terms: Option<Arc<[NodeSelectorTerm]>>,
    /// The [`HOSTNAME_LABEL`] values of those nodes, sorted: what the pod is pinned to (a
    /// node without the label cannot be pinned and is left out).
    pub hostnames: Vec<String>,
    /// The group's terms as JSON text, written once when the group is set.
    pub pinned_terms: PinnedTerms,
}

/// A node group's required terms (or one empty term when it has none) as the JSON text a hit
/// writes, each with a gap for the pin at the end of its `matchExpressions`: per term, the text
/// before the pin and the text after it. Set once per group, so that a hit copies bytes instead
/// of cloning and serialising the terms. `None` only if a term did not serialise in the expected
/// shape (then the hit serialises the terms itself).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PinnedTerms(Option<Arc<[TermText]>>);

/// A term's JSON text before the pin and after it.
type TermText = (Box<str>, Box<str>);

impl PinnedTerms {
    pub(crate) fn of(terms: Option<&[NodeSelectorTerm]>) -> Self {
        // What the pin's place holds while the terms are serialised, found again in the text.
        let gap = NodeSelectorRequirement {
            key: HOSTNAME_LABEL.into(),
            ..Default::default()
        };
        let gap_text = serde_json::to_string(&gap).ok();
        let default = [NodeSelectorTerm::default()];
        let terms = match terms {
            Some(terms) if !terms.is_empty() => terms,
            _ => &default,
        };
        let pieces = terms.iter().map(|term| {
            let mut term = term.clone();
            term.match_expressions
                .get_or_insert_default()
                .push(gap.clone());
            let text = serde_json::to_string(&term).ok()?;
            // `matchFields` is serialised after `matchExpressions`, the pin last in the latter.
            let fields = match &term.match_fields {
                Some(f) => format!(",\"matchFields\":{}", serde_json::to_string(f).ok()?),
                None => String::new(),
            };
            let after = format!("]{fields}}}");
            let before = text
                .strip_suffix(after.as_str())?
                .strip_suffix(gap_text.as_deref()?)?;
            Some((before.into(), after.into()))
        });
        PinnedTerms(pieces.collect::<Option<Vec<_>>>().map(Arc::from))
    }

    /// Writes the terms as a JSON array, each with `pin` at its gap; false when the group's text
    /// is not there or the pin does not serialise (the caller drops what was written).
    pub fn write(&self, out: &mut Vec<u8>, pin: &impl serde::Serialize) -> bool {
        let Some(pieces) = &self.0 else {
            return false;
        };
        out.push(b'[');
        for (i, (before, after)) in pieces.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(before.as_bytes());
            if serde_json::to_writer(&mut *out, pin).is_err() {
                return false;
            }
            out.extend_from_slice(after.as_bytes());
        }
        out.push(b']');
        true
    }
}

/// The node label a hit pins the pod by: `matchExpressions` on it take many values, while the
/// API server accepts exactly one value for `matchFields metadata.name In`.
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";

impl Hit {
    /// `models/<dir><sub-path>`: the mount's subPath.
    pub fn volume_sub_path(&self) -> String {
        self.volume_sub_path_in(&self.resolved_uri()).to_owned()
    }

    /// `pvc://<pvc>/models/<dir><sub-path>`.
    pub fn resolved_uri(&self) -> String {
        let parts = ["pvc://", &self.pvc, "/models/", &self.dir, &self.sub_path];
        let mut uri = String::with_capacity(parts.iter().map(|p| p.len()).sum());
        for p in parts {
            uri.push_str(p);
        }
        uri
    }

    /// The mount's subPath inside this hit's [`resolved_uri`](Hit::resolved_uri): its tail
    /// after `pvc://<pvc>/`, so one string serves both.
    pub fn volume_sub_path_in<'u>(&self, resolved_uri: &'u str) -> &'u str {
        &resolved_uri["pvc://".len() + self.pvc.len() + 1..]
    }
}

/// A miss: the reason, and when a cache matched, which one and what it lacked.
#[derive(Clone, Debug, PartialEq)]
pub struct Miss {
    pub reason: MissReason,
    pub cache: Option<Arc<CacheEntry>>,
    /// The object or state that is missing, e.g. `PVC team-b/llama-gpu does not exist`.
    pub missing: Option<String>,
}

impl Miss {
    pub fn because(reason: MissReason) -> Self {
        Miss {
            reason,
            cache: None,
            missing: None,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Lookup {
    Hit(Hit),
    Miss(Miss),
}

impl Lookup {
    pub fn hit(&self) -> Option<&Hit> {
        match self {
            Lookup::Hit(h) => Some(h),
            Lookup::Miss(_) => None,
        }
    }

    /// The miss reason, `None` for a hit.
    pub fn reason(&self) -> Option<MissReason> {
        match self {
            Lookup::Hit(_) => None,
            Lookup::Miss(m) => Some(m.reason),
        }
    }

    /// The answer in brief, as `modelgate_cache_lookups_total` counts it.
    pub fn resolved(&self) -> Resolved {
        match self {
            Lookup::Hit(h) => match h.cache.scope {
                CacheScope::Namespace(_) => Resolved::Namespace,
                CacheScope::Cluster => Resolved::Cluster,
            },
            Lookup::Miss(m) => Resolved::Miss(m.reason),
        }
    }
}

/// How a pod's model URI was resolved: a hit by the scope of its cache, or a miss by reason.
/// The admission that used the answer carries it out (in its summary) to be counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resolved {
    Namespace,
    Cluster,
    Miss(MissReason),
}

/// The longest model URI that is looked up, in bytes (docs/policy.md §7): a longer one is a miss,
/// `uri-too-long`, so that no request pays for a lookup in proportion to what it chose to send.
pub const MAX_MODEL_URI_LEN: usize = 2048;

/// Strips one trailing `/`, as matching requires for both URIs.
pub(crate) fn trim_uri(uri: &str) -> &str {
    uri.strip_suffix('/').unwrap_or(uri)
}

/// The first 16 hex digits of SHA-256 of the cache's `sourceModelUri` as written (KServe's
/// `GetStorageKey`).
pub fn storage_key(source_model_uri: &str) -> String {
    use sha2::{Digest, Sha256};
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let digest = Sha256::digest(source_model_uri.as_bytes());
    digest[..8]
        .iter()
        .flat_map(|b| [HEX[usize::from(b >> 4)], HEX[usize::from(b & 15)]])
        .map(char::from)
        .collect()
}

/// A cache URI as a key of [`Scope::by_uri`]: the entry's own `sourceModelUri` (shared, not
/// copied), compared and hashed without its one trailing `/`, as matching requires.
#[derive(Clone, Debug)]
struct UriKey(Arc<str>);

impl UriKey {
    fn trimmed(&self) -> &str {
        trim_uri(&self.0)
    }
}

impl PartialEq for UriKey {
    fn eq(&self, other: &Self) -> bool {
        self.trimmed() == other.trimmed()
    }
}

impl Eq for UriKey {}

impl std::hash::Hash for UriKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        // As the `str` it borrows as, so that a probe by `&str` finds it.
        self.trimmed().hash(state);
    }
}

impl std::borrow::Borrow<str> for UriKey {
    fn borrow(&self) -> &str {
        self.trimmed()
    }
}

/// The caches of one scope that have one URI. Nearly always one, kept as it is; several are a
/// persistent map by name (the smallest name wins), so that adding or removing one of
/// thousands copies a path of that map, not the list.
#[derive(Clone, Debug, PartialEq)]
enum SameUri {
    One(Arc<CacheEntry>),
    Many(RedBlackTreeMapSync<Arc<str>, Arc<CacheEntry>>),
}

impl SameUri {
    fn first(&self) -> Option<&Arc<CacheEntry>> {
        match self {
            SameUri::One(e) => Some(e),
            SameUri::Many(m) => m.first().map(|(_, e)| e),
        }
    }

    fn insert(&mut self, entry: Arc<CacheEntry>) {
        match self {
            SameUri::One(e) if e.name == entry.name => *e = entry,
            SameUri::One(e) => {
                let mut m = RedBlackTreeMapSync::new_sync();
                m.insert_mut(Arc::from(e.name.as_str()), e.clone());
                m.insert_mut(Arc::from(entry.name.as_str()), entry);
                *self = SameUri::Many(m);
            }
            SameUri::Many(m) => m.insert_mut(Arc::from(entry.name.as_str()), entry),
        }
    }

    /// Takes the cache of that name out; whether none is left.
    fn remove(&mut self, name: &str) -> bool {
        match self {
            SameUri::One(e) => e.name == name,
            SameUri::Many(m) => {
                m.remove_mut(name);
                match m.size() {
                    0 => true,
                    1 => {
                        let last = m.first().map(|(_, e)| e.clone()).expect("one left");
                        *self = SameUri::One(last);
                        false
                    }
                    _ => false,
                }
            }
        }
    }
}

/// Caches of one scope (one namespace, or the cluster).
#[derive(Clone, Debug, Default, PartialEq)]
struct Scope {
    /// trimmed source URI → the caches with that URI. Each change is an upsert or removal in
    /// this map and in the URI's own map: its cost does not grow with the number of caches that
    /// share the URI.
    by_uri: PMap<UriKey, SameUri>,
    /// name → entry, to find the old entry on update and delete.
    by_name: PMap<Arc<str>, Arc<CacheEntry>>,
    /// length of a key of `by_uri` → how many keys have it: the only prefix lengths of a model
    /// URI that can match, so a lookup hashes no other prefix.
    uri_lengths: PMap<usize, usize>,
    /// `spec.pvcRef` → how many caches of the scope name that claim: a claim a cache owns is
    /// found without a walk of the scope's caches.
    pvc_refs: PMap<Arc<str>, usize>,
}

impl Scope {
    fn upsert(&mut self, entry: Arc<CacheEntry>) {
        self.remove(&entry.name);
        self.by_name
            .insert(entry.name.as_str().into(), entry.clone());
        if let CacheStorage::PvcRef(claim) = &entry.storage {
            *self
                .pvc_refs
                .get_or_insert_with(claim.as_str().into(), || 0) += 1;
        }
        let uri = trim_uri(&entry.source_model_uri);
        match self.by_uri.get_mut(uri) {
            Some(same) => same.insert(entry),
            None => {
                *self.uri_lengths.get_or_insert_with(uri.len(), || 0) += 1;
                let key = UriKey(entry.source_model_uri.clone());
                self.by_uri.insert(key, SameUri::One(entry));
            }
        }
    }

    fn remove(&mut self, name: &str) -> bool {
        let Some(old) = self.by_name.remove(name) else {
            return false;
        };
        if let CacheStorage::PvcRef(claim) = &old.storage {
            match self.pvc_refs.get(claim.as_str()).copied() {
                Some(1) | None => {
                    self.pvc_refs.remove(claim.as_str());
                }
                Some(n) => {
                    self.pvc_refs.insert(claim.as_str().into(), n - 1);
                }
            }
        }
        let key = trim_uri(&old.source_model_uri);
        let emptied = self
            .by_uri
            .get_mut(key)
            .is_some_and(|same| same.remove(name));
        if emptied {
            self.by_uri.remove(key);
            let left = self.uri_lengths.get(&key.len()).map_or(0, |n| n - 1);
            if left == 0 {
                self.uri_lengths.remove(&key.len());
            } else {
                self.uri_lengths.insert(key.len(), left);
            }
        }
        true
    }

    fn len(&self) -> usize {
        self.by_name.len()
    }

    /// The cache of this scope whose storage is `claim`: a `pvcRef`, or the
    /// `<cache>-<nodegroup>` claim KServe makes for a node group of the cache. Every split of the
    /// name at a `-` is one lookup: at most one per byte of the name, whatever the scope holds.
    fn owner_of_claim(&self, claim: &str) -> Option<&Arc<CacheEntry>> {
        if self.pvc_refs.get(claim).is_some() {
            return self
                .entries()
                .find(|e| e.storage == CacheStorage::PvcRef(claim.into()));
        }
        claim.match_indices('-').find_map(|(at, _)| {
            let (cache, group) = (&claim[..at], &claim[at + 1..]);
            let entry = self.by_name.get(cache)?;
            entry
                .node_groups()
                .iter()
                .any(|g| g == group)
                .then_some(entry)
        })
    }

    fn entries(&self) -> impl Iterator<Item = &Arc<CacheEntry>> {
        self.by_name.values()
    }

    /// The longest matching cache URI, then the smallest name. Only the prefixes whose length
    /// some cache URI has are hashed: a URI of slashes costs one integer probe per slash.
    fn find(&self, model_uri: &str) -> Option<&Arc<CacheEntry>> {
        let model = trim_uri(model_uri);
        prefixes_longest_first(model)
            .filter(|prefix| self.uri_lengths.contains_key(&prefix.len()))
            .find_map(|prefix| {
                #[cfg(test)]
                tests::URI_PROBES.with(|n| n.set(n.get() + 1));
                self.by_uri.get(prefix)
            })
            .and_then(SameUri::first)
    }
}

/// The prefixes `p` of `uri` for which `uri == p` or `uri` starts with `p + "/"`.
fn prefixes_longest_first(uri: &str) -> impl Iterator<Item = &str> {
    std::iter::once(uri).chain(uri.rmatch_indices('/').map(move |(i, _)| &uri[..i]))
}

type Labels = BTreeMap<String, String>;

/// A set of node names.
type NodeSet = PMap<Arc<str>, ()>;

/// A node group: its PV's required node terms and the known Nodes they admit.
#[derive(Clone, Debug, Default, PartialEq)]
struct NodeGroup {
    /// `None`: the PV has no required node affinity, so every node is admitted.
    terms: Option<Arc<[NodeSelectorTerm]>>,
    /// The terms as a hit writes them.
    pinned_terms: PinnedTerms,
    members: NodeSet,
    /// label key → value → members with that label.
    by_label: PMap<Arc<str>, PMap<Arc<str>, NodeSet>>,
}

impl NodeGroup {
    fn admits(&self, name: &str, labels: &Labels) -> bool {
        match &self.terms {
            None => true,
            Some(terms) => terms.iter().any(|t| term_matches(t, name, labels)),
        }
    }

    fn add(&mut self, name: &Arc<str>, labels: &Labels) {
        self.members.insert(name.clone(), ());
        for (k, v) in labels {
            self.by_label
                .get_or_insert_with(k.as_str().into(), PMap::new)
                .get_or_insert_with(v.as_str().into(), PMap::new)
                .insert(name.clone(), ());
        }
    }

    fn remove(&mut self, name: &str, labels: &Labels) {
        if self.members.remove(name).is_none() {
            return;
        }
        for (k, v) in labels {
            let Some(values) = self.by_label.get_mut(k.as_str()) else {
                continue;
            };
            if let Some(set) = values.get_mut(v.as_str()) {
                set.remove(name);
                if set.is_empty() {
                    values.remove(v.as_str());
                }
            }
            if values.is_empty() {
                self.by_label.remove(k.as_str());
            }
        }
    }

    /// Some member satisfies `selector` (every pair present with that value).
    fn fits_selector(&self, selector: Selector, nodes: &PMap<Arc<str>, Arc<Labels>>) -> bool {
        if selector.is_empty() {
            return !self.members.is_empty();
        }
        let mut smallest: Option<&NodeSet> = None;
        for (k, v) in selector {
            match self.by_label.get(*k).and_then(|values| values.get(*v)) {
                None => return false,
                Some(set) if smallest.is_none_or(|s| set.len() < s.len()) => smallest = Some(set),
                Some(_) => {}
            }
        }
        let Some(candidates) = smallest else {
            return false;
        };
        if selector.len() == 1 {
            return true;
        }
        candidates.keys().any(|n| {
            nodes
                .get(n)
                .is_some_and(|labels| selector_matches(selector, labels))
        })
    }
}

/// A pod's `nodeSelector` pairs.
type Selector<'a> = &'a [(&'a str, &'a str)];

fn selector_matches(selector: Selector, labels: &Labels) -> bool {
    selector
        .iter()
        .all(|(k, v)| labels.get(*k).map(String::as_str) == Some(*v))
}

/// Kubernetes' node selector term semantics: every requirement holds; an empty term matches no
/// node.
pub(crate) fn term_matches(term: &NodeSelectorTerm, name: &str, labels: &Labels) -> bool {
    let expressions = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    if expressions.is_empty() && fields.is_empty() {
        return false;
    }
    expressions
        .iter()
        .all(|r| requirement_holds(r, labels.get(&r.key).map(String::as_str)))
        && fields.iter().all(|r| {
            let value = (r.key == "metadata.name").then_some(name);
            matches!(r.operator.as_str(), "In" | "NotIn") && requirement_holds(r, value)
        })
}

fn requirement_holds(r: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = r.values.as_deref().unwrap_or_default();
    let number = |s: &str| s.parse::<i64>().ok();
    let compare = |ord: std::cmp::Ordering| match (value.and_then(number), values) {
        (Some(have), [limit]) => number(limit).is_some_and(|l| have.cmp(&l) == ord),
        _ => false,
    };
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| values.iter().all(|x| x != v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" => compare(std::cmp::Ordering::Greater),
        "Lt" => compare(std::cmp::Ordering::Less),
        _ => false,
    }
}

/// Counts of the objects in the index.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub namespace_caches: usize,
    pub cluster_caches: usize,
    pub node_groups: usize,
    pub pvcs: usize,
    pub nodes: usize,
}

/// The cluster state, by scope and kind. Cloning it is O(1) (every map is persistent); the clone
/// and the original then change independently.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CacheIndex {
    namespaces: PMap<Arc<str>, Scope>,
    cluster: Scope,
    node_groups: PMap<Arc<str>, NodeGroup>,
    nodes: PMap<Arc<str>, Arc<Labels>>,
    /// namespace → claim name → state. Shared strings: the watch keeps the same ones.
    pvcs: PMap<Arc<str>, PMap<Arc<str>, PvcState>>,
    /// Kept as the maps change, so that counting is O(1) however many namespaces there are.
    namespace_caches: usize,
    pvc_count: usize,
    /// namespace → its `ModelgateException`s, by name (docs/exceptions.md). A handful per
    /// namespace: a change copies the namespace's list.
    exceptions: PMap<Arc<str>, Arc<[Arc<crate::exceptions::Exception>]>>,
}

impl CacheIndex {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds or replaces a cache (by scope and name). An `Arc` is shared, not copied: the watch
    /// keeps its converted objects and the index points at the same entries.
    pub fn upsert_cache(&mut self, entry: impl Into<Arc<CacheEntry>>) {
        let entry = entry.into();
        match &entry.scope {
            CacheScope::Cluster => self.cluster.upsert(entry),
            CacheScope::Namespace(ns) => {
                let scope = self
                    .namespaces
                    .get_or_insert_with(ns.as_str().into(), Scope::default);
                let before = scope.len();
                scope.upsert(entry);
                self.namespace_caches += scope.len() - before;
            }
        }
    }

    /// Takes a cache out; whether it was there.
    pub fn remove_cache(&mut self, scope: &CacheScope, name: &str) -> bool {
        match scope {
            CacheScope::Cluster => self.cluster.remove(name),
            CacheScope::Namespace(ns) => {
                if !self.has_cache(scope, name) {
                    return false;
                }
                let Some(s) = self.namespaces.get_mut(ns.as_str()) else {
                    return false;
                };
                let removed = s.remove(name);
                if s.len() == 0 {
                    self.namespaces.remove(ns.as_str());
                }
                self.namespace_caches -= usize::from(removed);
                removed
            }
        }
    }

    /// Whether a cache of that scope and name is in the index.
    pub fn has_cache(&self, scope: &CacheScope, name: &str) -> bool {
        match scope {
            CacheScope::Cluster => self.cluster.by_name.contains_key(name),
            CacheScope::Namespace(ns) => self
                .namespaces
                .get(ns.as_str())
                .is_some_and(|s| s.by_name.contains_key(name)),
        }
    }

    /// Adds or replaces a node group; its members are found among the known Nodes (a walk of
    /// the Nodes: a group's change can change all of its membership).
    pub fn upsert_node_group(&mut self, name: &str, required_terms: Option<Vec<NodeSelectorTerm>>) {
        let mut group = NodeGroup {
            pinned_terms: PinnedTerms::of(required_terms.as_deref()),
            terms: required_terms.map(Arc::from),
            ..NodeGroup::default()
        };
        for (node, labels) in self.nodes.iter() {
            if group.admits(node, labels) {
                group.add(node, labels);
            }
        }
        self.node_groups.insert(name.into(), group);
    }

    pub fn remove_node_group(&mut self, name: &str) -> bool {
        self.node_groups.remove(name).is_some()
    }

    pub fn has_node_group(&self, name: &str) -> bool {
        self.node_groups.contains_key(name)
    }

    /// Adds or replaces a Node (name and labels).
    pub fn upsert_node(&mut self, name: impl Into<Arc<str>>, labels: Labels) {
        let name: Arc<str> = name.into();
        self.remove_node(&name);
        let names: Vec<Arc<str>> = self.node_groups.keys().cloned().collect();
        for group_name in names {
            // Only the groups that admit the Node are written (and so copied).
            let admits = self
                .node_groups
                .get(&group_name)
                .is_some_and(|g| g.admits(&name, &labels));
            if admits && let Some(group) = self.node_groups.get_mut(&group_name) {
                group.add(&name, &labels);
            }
        }
        self.nodes.insert(name, Arc::new(labels));
    }

    pub fn remove_node(&mut self, name: &str) -> bool {
        let Some(labels) = self.nodes.remove(name) else {
            return false;
        };
        let names: Vec<Arc<str>> = self.node_groups.keys().cloned().collect();
        for group_name in names {
            // Only the groups the Node was in are written (and so copied).
            let member = self
                .node_groups
                .get(&group_name)
                .is_some_and(|g| g.members.contains_key(name));
            if member && let Some(group) = self.node_groups.get_mut(&group_name) {
                group.remove(name, &labels);
            }
        }
        true
    }

    pub fn has_node(&self, name: &str) -> bool {
        self.nodes.contains_key(name)
    }

    pub fn upsert_pvc(
        &mut self,
        namespace: impl Into<Arc<str>>,
        name: impl Into<Arc<str>>,
        state: PvcState,
    ) {
        let claims = self.pvcs.get_or_insert_with(namespace.into(), PMap::new);
        if claims.insert(name.into(), state).is_none() {
            self.pvc_count += 1;
        }
    }

    pub fn remove_pvc(&mut self, namespace: &str, name: &str) -> bool {
        if !self.has_pvc(namespace, name) {
            return false;
        }
        let Some(claims) = self.pvcs.get_mut(namespace) else {
            return false;
        };
        let removed = claims.remove(name).is_some();
        if claims.is_empty() {
            self.pvcs.remove(namespace);
        }
        self.pvc_count -= usize::from(removed);
        removed
    }

    /// Adds or replaces an exception (by namespace and name).
    pub fn upsert_exception(&mut self, exception: Arc<crate::exceptions::Exception>) {
        let namespace = exception.namespace.clone();
        let mut list: Vec<_> = self
            .exceptions
            .get(&*namespace)
            .map(|l| {
                l.iter()
                    .filter(|e| e.name != exception.name)
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        list.push(exception);
        list.sort_by(|a, b| a.name.cmp(&b.name));
        self.exceptions.insert(namespace, list.into());
    }

    pub fn remove_exception(&mut self, namespace: &str, name: &str) -> bool {
        if !self.has_exception(namespace, name) {
            return false;
        }
        let list: Vec<_> = self
            .exceptions_in(namespace)
            .iter()
            .filter(|e| &*e.name != name)
            .cloned()
            .collect();
        if list.is_empty() {
            self.exceptions.remove(namespace);
        } else {
            self.exceptions.insert(Arc::from(namespace), list.into());
        }
        true
    }

    pub fn has_exception(&self, namespace: &str, name: &str) -> bool {
        self.exceptions_in(namespace)
            .iter()
            .any(|e| &*e.name == name)
    }

    /// The exceptions of `namespace`, by name (whether in force or not).
    pub fn exceptions_in(&self, namespace: &str) -> &[Arc<crate::exceptions::Exception>] {
        if self.exceptions.is_empty() {
            return &[];
        }
        self.exceptions.get(namespace).map_or(&[], |l| &**l)
    }

    /// Every exception the index holds (whether in force or not), by name within a namespace.
    pub fn exceptions(&self) -> impl Iterator<Item = &Arc<crate::exceptions::Exception>> {
        self.exceptions.values().flat_map(|l| l.iter())
    }

    /// How many exceptions the index holds.
    pub fn exception_count(&self) -> usize {
        self.exceptions.values().map(|l| l.len()).sum()
    }

    /// The claim `namespace/name`, if the index has it.
    pub fn pvc(&self, namespace: &str, name: &str) -> Option<&PvcState> {
        self.pvcs.get(namespace)?.get(name)
    }

    /// The cache, of `namespace` or the cluster, whose storage is the claim `namespace/name`
    /// (its `pvcRef`, or KServe's `<cache>-<nodegroup>` claim): the node's or a team's shared
    /// model store, whose owner must not be changed for one pod.
    pub fn cache_owning_claim(&self, namespace: &str, name: &str) -> Option<&CacheEntry> {
        let own = self
            .namespaces
            .get(namespace)
            .and_then(|s| s.owner_of_claim(name));
        own.or_else(|| self.cluster.owner_of_claim(name))
            .map(|e| &**e)
    }

    pub fn has_pvc(&self, namespace: &str, name: &str) -> bool {
        self.pvcs
            .get(namespace)
            .is_some_and(|c| c.contains_key(name))
    }

    /// Adds every object of `other`, replacing those of the same kind, scope and name.
    pub(crate) fn merge(&mut self, other: &CacheIndex) {
        let scopes = other.namespaces.values().chain([&other.cluster]);
        for entry in scopes.flat_map(Scope::entries) {
            self.upsert_cache(entry.clone());
        }
        for (name, labels) in other.nodes.iter() {
            self.upsert_node(name.clone(), (**labels).clone());
        }
        for (name, group) in other.node_groups.iter() {
            self.upsert_node_group(name, group.terms.as_deref().map(<[_]>::to_vec));
        }
        for (ns, claims) in other.pvcs.iter() {
            for (name, state) in claims.iter() {
                self.upsert_pvc(ns.clone(), name.clone(), state.clone());
            }
        }
        for list in other.exceptions.values() {
            for e in list.iter() {
                self.upsert_exception(e.clone());
            }
        }
    }

    pub fn counts(&self) -> Counts {
        Counts {
            namespace_caches: self.namespace_caches,
            cluster_caches: self.cluster.len(),
            node_groups: self.node_groups.len(),
            pvcs: self.pvc_count,
            nodes: self.nodes.len(),
        }
    }

    /// Resolves a model URI for a pod: the cache by precedence, then the node group, then the
    /// checks of docs/policy.md §5 in order.
    pub fn lookup(&self, req: &LookupRequest) -> Lookup {
        if req.model_uri.len() > MAX_MODEL_URI_LEN {
            return Lookup::Miss(Miss::because(MissReason::UriTooLong));
        }
        if !is_normal_uri(req.model_uri) {
            return Lookup::Miss(Miss::because(MissReason::UriNotNormal));
        }
        let found = self
            .namespaces
            .get(req.namespace)
            .and_then(|s| s.find(req.model_uri))
            .or_else(|| self.cluster.find(req.model_uri));
        let Some(cache) = found else {
            return Lookup::Miss(Miss::because(MissReason::NoMatch));
        };
        let miss = |reason, missing: String| {
            Lookup::Miss(Miss {
                reason,
                cache: Some(cache.clone()),
                missing: Some(missing),
            })
        };
        let sub_path = trim_uri(req.model_uri)[trim_uri(&cache.source_model_uri).len()..].into();
        match &cache.storage {
            CacheStorage::PvcRef(pvc) => {
                // KServe's shared-PVC mode exists only in releases that use the storage key.
                if let Err(missing) = self.check_pvc(req.namespace, pvc) {
                    return miss(MissReason::PvcMissing, missing);
                }
                if !cache.status.import_ready {
                    return miss(
                        MissReason::NotDownloaded,
                        format!(
                            "its import onto PVC {}/{pvc} has not finished (no Ready condition \
                             with status True, no copies.available)",
                            req.namespace
                        ),
                    );
                }
                Lookup::Hit(Hit {
                    pvc: pvc.clone(),
                    dir: cache.storage_key.clone(),
                    sub_path,
                    placement: None,
                    cache: cache.clone(),
                })
            }
            CacheStorage::NodeGroups(groups) => {
                let selector = req.node_selector.unwrap_or_default();
                let (group_name, group) = match self.choose_group(groups, req.node_group, selector)
                {
                    Ok(chosen) => chosen,
                    Err(missing) => return miss(MissReason::NodeGroupMismatch, missing),
                };
                let pvc = format!("{}-{group_name}", cache.name);
                if let Err(missing) = self.check_pvc(req.namespace, &pvc) {
                    return miss(MissReason::PvcMissing, missing);
                }
                let mut hostnames: Vec<String> = cache
                    .status
                    .nodes()
                    .filter(|(_, state)| **state == NodeState::Downloaded)
                    .filter(|(node, _)| group.members.contains_key(*node))
                    .filter_map(|(node, _)| self.nodes.get(node))
                    .filter(|labels| selector_matches(selector, labels))
                    .filter_map(|labels| labels.get(HOSTNAME_LABEL))
                    .map(String::clone)
                    .collect();
                hostnames.sort_unstable();
                hostnames.dedup();
                if hostnames.is_empty() {
                    return miss(
                        MissReason::NotDownloaded,
                        self.why_not_downloaded(cache, group_name, selector),
                    );
                }
                let dir = match req.layout {
                    CacheLayout::StorageKey => cache.storage_key.clone(),
                    CacheLayout::CacheName => cache.name.clone(),
                };
                Lookup::Hit(Hit {
                    pvc,
                    dir,
                    sub_path,
                    placement: Some(Placement {
                        node_group: group_name.to_string(),
                        required_terms: group.terms.clone(),
                        hostnames,
                        pinned_terms: group.pinned_terms.clone(),
                    }),
                    cache: cache.clone(),
                })
            }
        }
    }

    /// The requested group (it must be listed and fit), else the first listed group that has a
    /// node fitting the pod's nodeSelector. Costs a probe per listed group (at most
    /// [`MAX_NODE_GROUPS`](super::bounds::MAX_NODE_GROUPS) of them are kept) and one per
    /// selector pair for each group that exists; the explanation of a mismatch is written as
    /// the groups are tried and stops growing at [`MAX_MISSING_LEN`], the pod's nodeSelector
    /// in it once.
    fn choose_group<'a>(
        &'a self,
        listed: &'a [String],
        requested: Option<&'a str>,
        selector: Selector,
    ) -> Result<(&'a str, &'a NodeGroup), String> {
        if let Some(name) = requested {
            if !listed.iter().any(|g| g == name) {
                let mut why = BoundedText::new(MAX_MISSING_LEN);
                why.push_fmt(format_args!(
                    "it does not list the requested node group {name} (nodeGroups: "
                ));
                push_list(&mut why, listed.iter().map(String::as_str));
                why.push(")");
                return Err(why.into_string());
            }
            return match self.node_groups.get(name) {
                None => Err(clip(
                    &format!("LocalModelNodeGroup {name} does not exist"),
                    MAX_MISSING_LEN,
                )),
                Some(g) if selector.is_empty() || g.fits_selector(selector, &self.nodes) => {
                    Ok((name, g))
                }
                Some(_) => {
                    let mut why = BoundedText::new(MAX_MISSING_LEN);
                    why.push_fmt(format_args!(
                        "no Node of LocalModelNodeGroup {name} matches the pod's nodeSelector "
                    ));
                    push_selector(&mut why, selector);
                    Err(why.into_string())
                }
            };
        }
        if listed.is_empty() {
            return Err("it lists no node group".into());
        }
        // Without a nodeSelector the group's own check (a downloaded node) decides.
        let mut missing = BoundedText::new(MAX_MISSING_LEN);
        let mut unfit = BoundedText::new(MAX_MISSING_LEN);
        let mut unfit_count = 0;
        for name in listed {
            match self.node_groups.get(name.as_str()) {
                None => {
                    if !missing.is_empty() {
                        missing.push("; ");
                    }
                    missing.push_fmt(format_args!("LocalModelNodeGroup {name} does not exist"));
                }
                Some(g) if selector.is_empty() || g.fits_selector(selector, &self.nodes) => {
                    return Ok((name, g));
                }
                Some(_) => {
                    unfit.push(if unfit_count == 0 { "" } else { ", " });
                    unfit.push(name);
                    unfit_count += 1;
                }
            }
        }
        // One sentence for the groups that exist (the selector written once), after those that
        // do not.
        let mut why = BoundedText::new(MAX_MISSING_LEN);
        why.push(&missing.into_string());
        let unfit = unfit.into_string();
        if !unfit.is_empty() {
            if !why.is_empty() {
                why.push("; ");
            }
            let groups = if unfit_count == 1 {
                "LocalModelNodeGroup"
            } else {
                "LocalModelNodeGroups"
            };
            why.push_fmt(format_args!(
                "no Node of {groups} {unfit} matches the pod's nodeSelector "
            ));
            push_selector(&mut why, selector);
        }
        Err(why.into_string())
    }

    /// The PVC exists in `namespace`, is not being deleted and is not `Lost`.
    fn check_pvc(&self, namespace: &str, name: &str) -> Result<(), String> {
        match self.pvcs.get(namespace).and_then(|c| c.get(name)) {
            None => Err(format!("PVC {namespace}/{name} does not exist")),
            Some(s) if s.deleting => Err(format!("PVC {namespace}/{name} is being deleted")),
            Some(s) if s.phase == PvcPhase::Lost => Err(format!("PVC {namespace}/{name} is Lost")),
            Some(_) => Ok(()),
        }
    }

    fn why_not_downloaded(&self, cache: &CacheEntry, group: &str, selector: Selector) -> String {
        let mut why = BoundedText::new(MAX_MISSING_LEN);
        why.push_fmt(format_args!(
            "no node of group {group} has NodeDownloaded ("
        ));
        if !cache.status.reported {
            why.push_fmt(format_args!(
                "{} has no status.nodeStatus)",
                cache.describe()
            ));
            return why.into_string();
        }
        let mut notes = 0;
        for (node, state) in cache.status.nodes() {
            if notes == NODE_STATUS_NOTES {
                why.push(", …");
                break;
            }
            if notes > 0 {
                why.push(", ");
            }
            notes += 1;
            if *state != NodeState::Downloaded {
                why.push_fmt(format_args!("{node} {}", state.as_str()));
            } else if !self.nodes.contains_key(node) {
                why.push_fmt(format_args!(
                    "{node} NodeDownloaded but Node {node} does not exist"
                ));
            } else if !self
                .node_groups
                .get(group)
                .is_some_and(|g| g.members.contains_key(node))
            {
                why.push_fmt(format_args!(
                    "{node} NodeDownloaded but not in node group {group}"
                ));
            } else if !self
                .nodes
                .get(node)
                .is_some_and(|l| selector_matches(selector, l))
            {
                why.push_fmt(format_args!(
                    "{node} NodeDownloaded but outside the pod's nodeSelector"
                ));
            } else {
                why.push_fmt(format_args!(
                    "{node} NodeDownloaded but has no {HOSTNAME_LABEL} label to pin the pod to"
                ));
            }
        }
        if notes == 0 {
            why.push("status.nodeStatus is empty");
        }
        why.push(")");
        why.into_string()
    }
}

/// `a, b, c` into `out`, within its bound.
fn push_list<'a>(out: &mut BoundedText, items: impl Iterator<Item = &'a str>) {
    for (i, item) in items.enumerate() {
        if out.is_full() {
            return;
        }
        if i > 0 {
            out.push(", ");
        }
        out.push(item);
    }
}

/// `{k=v, …}` into `out`, within its bound: a selector of thousands of pairs costs the bound.
fn push_selector(out: &mut BoundedText, selector: Selector) {
    out.push("{");
    for (i, (k, v)) in selector.iter().enumerate() {
        if out.is_full() {
            return;
        }
        if i > 0 {
            out.push(", ");
        }
        out.push_fmt(format_args!("{k}={v}"));
    }
    out.push("}");
}

#[cfg(test)]
mod tests;
