//! The cache kinds' half of the event rules ([`crate::reflector`]): what a watched object of one
//! [`Kind`] becomes. [`Preparer`] converts each event's object once, as it arrives, into what
//! the index keeps (bounded: docs/model-cache.md, "Bounds"), applies the caps on namespace caches
//! ([`caps`]), and logs what it leaves out at a bounded rate; [`KindRules`] then keeps what it
//! prepared. [`super::watch`] runs one watch per kind with them; the rules are tested here
//! without an API server.

pub(crate) mod caps;

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use kube::api::DynamicObject;
use kube::runtime::watcher::Event;
use tracing::{info, warn};

use super::cluster::{
    Converted, Kind, KindObjects, ObjectKey, Rejected, Trimmed, convert_bounded, describe,
    object_key,
};
use super::{CacheMetrics, MAX_NODE_GROUPS, SkipReason};
use crate::reflector::{Objects, Rules};
use caps::{CacheLimits, Offer, Selection, cap_flags};

impl Objects for KindObjects {
    type Key = ObjectKey;
    type Value = Arc<Converted>;

    fn insert(&mut self, key: ObjectKey, value: Arc<Converted>) {
        std::collections::HashMap::insert(self, key, value);
    }

    fn remove(&mut self, key: &ObjectKey) -> bool {
        std::collections::HashMap::remove(self, key).is_some()
    }

    fn len(&self) -> usize {
        std::collections::HashMap::len(self)
    }

    fn holds(&self, key: &ObjectKey, value: &Arc<Converted>) -> bool {
        self.get(key).is_some_and(|kept| **kept == **value)
    }

    /// An object listed as it was kept stays the one kept, key included: the index shares its
    /// `Arc`s and strings, and a relist must not leave it holding copies of the same values.
    /// Done within the listed map (no second table of 100 000 entries at the first list).
    fn replace(&mut self, mut listed: Self) -> Vec<ObjectKey> {
        // New or different.
        let mut changed: Vec<ObjectKey> = listed
            .iter()
            .filter(|(key, value)| !self.holds(key, value))
            .map(|(key, _)| key.clone())
            .collect();
        for (kept_key, kept) in self.drain() {
            match listed.get(&kept_key) {
                // Gone.
                None => changed.push(kept_key),
                Some(value) if **value == *kept => {
                    listed.remove(&kept_key);
                    listed.insert(kept_key, kept);
                }
                Some(_) => {}
            }
        }
        *self = listed;
        changed
    }
}

/// A watched object as [`Preparer`] hands it on: its key and what the index keeps of it (`None`
/// for a deletion, or an object that is no longer kept).
#[derive(Clone, Debug)]
pub(crate) struct Prepared {
    key: ObjectKey,
    object: Option<Arc<Converted>>,
}

impl Prepared {
    fn gone(key: ObjectKey) -> Self {
        Prepared { key, object: None }
    }
}

/// The rules of one cache kind: an object is kept as [`Preparer`] converted it.
pub(crate) struct KindRules {
    kind: Kind,
}

impl KindRules {
    pub(crate) fn new(kind: Kind) -> Self {
        KindRules { kind }
    }
}

impl Rules for KindRules {
    type Object = Prepared;
    type Objects = KindObjects;

    fn key(&self, object: &Prepared) -> ObjectKey {
        object.key.clone()
    }

    fn convert(
        &self,
        object: Prepared,
    ) -> Result<(ObjectKey, Arc<Converted>), (ObjectKey, String)> {
        // The preparer hands on only what converted: an object it leaves out is a deletion.
        match object.object {
            Some(c) => Ok((object.key, c)),
            None => Err((object.key, "not kept".into())),
        }
    }

    fn describe(&self, key: &ObjectKey) -> String {
        describe(self.kind, key)
    }
}

/// The most lines a kind logs about objects it leaves out or trims, per [`LOG_WINDOW`]; the
/// others are counted (`modelgate_cache_skipped_total`) and summed up in the next line.
pub(crate) const LOG_LINES: u32 = 5;
pub(crate) const LOG_WINDOW: Duration = Duration::from_secs(60);

/// The most namespaces warned about one by one for reaching their cap.
const WARNED_NAMESPACES: usize = 10_000;

/// A kind's state that outlives one list-then-watch stream.
pub(crate) struct KindShared {
    kind: Kind,
    metrics: CacheMetrics,
    limits: CacheLimits,
    /// The namespace names seen, so that 100 000 PVCs over 100 namespaces hold 100 strings,
    /// not 100 000 copies. Never shrinks: it is as large as the namespaces ever seen.
    namespaces: Mutex<HashSet<Arc<str>>>,
    log: Mutex<LogLimit>,
    warned: Mutex<Warned>,
    /// When the kind last relisted to find the objects owed a freed place.
    last_relist: Mutex<Option<Instant>>,
    relist_interval: Duration,
}

#[derive(Default)]
struct LogLimit {
    window: Option<Instant>,
    logged: u32,
    suppressed: u64,
}

#[derive(Default)]
struct Warned {
    namespaces: HashSet<Arc<str>>,
    total: bool,
    more: bool,
}

impl KindShared {
    pub(crate) fn new(
        kind: Kind,
        metrics: CacheMetrics,
        limits: CacheLimits,
        relist_interval: Duration,
    ) -> Self {
        KindShared {
            kind,
            metrics,
            limits,
            namespaces: Mutex::default(),
            log: Mutex::default(),
            warned: Mutex::default(),
            last_relist: Mutex::default(),
            relist_interval,
        }
    }

    fn shared_namespace(&self, namespace: &Arc<str>) -> Arc<str> {
        let mut seen = self
            .namespaces
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match seen.get(namespace) {
            Some(shared) => shared.clone(),
            None => {
                seen.insert(namespace.clone());
                namespace.clone()
            }
        }
    }

    /// Logs `line()` unless this kind has logged [`LOG_LINES`] lines in the current window.
    fn log(&self, line: impl FnOnce() -> String) {
        let now = Instant::now();
        let mut limit = self.log.lock().unwrap_or_else(PoisonError::into_inner);
        if limit
            .window
            .is_none_or(|w| now.duration_since(w) >= LOG_WINDOW)
        {
            let suppressed = std::mem::take(&mut limit.suppressed);
            limit.window = Some(now);
            limit.logged = 0;
            if suppressed > 0 {
                warn!(
                    "{}: {suppressed} more objects left out or trimmed were not logged \
                     (modelgate_cache_skipped_total counts them)",
                    self.kind
                );
            }
        }
        if limit.logged < LOG_LINES {
            limit.logged += 1;
            drop(limit);
            warn!("{}", line());
        } else {
            limit.suppressed += 1;
        }
    }

    /// Counts an object ignored past a cap; warns once per namespace (and once for the total).
    fn over_cap(&self, key: &ObjectKey, reason: SkipReason) {
        self.metrics.skipped(self.kind, reason, 1);
        let Some((per_namespace_flag, total_flag)) = cap_flags(self.kind) else {
            return;
        };
        let mut warned = self.warned.lock().unwrap_or_else(PoisonError::into_inner);
        let limits = self.limits;
        let kind = self.kind;
        let ns = &key.0;
        match reason {
            SkipReason::OverTotalCap if !warned.total => {
                warned.total = true;
                warn!(
                    "more than {total_flag}={} {kind} objects in all namespaces: the newest are \
                     ignored (this is logged once; \
                     modelgate_cache_skipped_total{{reason=\"over-total-cap\"}} counts them)",
                    limits.total
                );
            }
            SkipReason::OverNamespaceCap if !warned.namespaces.contains(ns) => {
                if warned.namespaces.len() < WARNED_NAMESPACES {
                    warned.namespaces.insert(ns.clone());
                    warn!(
                        namespace = %ns,
                        "more than {per_namespace_flag}={} {kind} objects in namespace {ns}: \
                         the newest are ignored (logged once per namespace; \
                         modelgate_cache_skipped_total{{reason=\"over-namespace-cap\"}} counts \
                         them)",
                        limits.per_namespace
                    );
                } else if !warned.more {
                    warned.more = true;
                    warn!("more namespaces reached {per_namespace_flag}; not logged one by one");
                }
            }
            _ => {}
        }
    }

    /// When the kind may relist next to find an object owed a freed place: a second after the
    /// freeing (deletions of a burst are one relist), and `relist_interval` after the last one.
    fn relist_at(&self, now: Instant) -> Instant {
        let soon = now + self.relist_interval.min(Duration::from_secs(1));
        let last = *self
            .last_relist
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match last {
            Some(at) => soon.max(at + self.relist_interval),
            None => soon,
        }
    }

    /// The stream ended to relist.
    pub(crate) fn relisting(&self) {
        *self
            .last_relist
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
        info!(
            "{}: relisting, to keep the objects ignored past a cap that a deletion made room for",
            self.kind
        );
    }
}

/// Converts the events of one list-then-watch stream of a kind (see the module docs). A new
/// stream (which starts with a list) gets a new one.
pub(crate) struct Preparer {
    shared: Arc<KindShared>,
    /// The capped kinds (namespace caches, exceptions): the caps.
    selection: Option<Selection>,
    /// The capped kinds: the objects of a list in progress that the caps keep so far (those
    /// they displace are dropped before the list is handed on, complete, at its end).
    listing: Option<std::collections::HashMap<ObjectKey, Arc<Converted>>>,
    /// When to end the stream so that the kind relists (a place was freed that an ignored
    /// object may be owed).
    relist_at: Option<Instant>,
}

impl Preparer {
    pub(crate) fn new(shared: Arc<KindShared>) -> Self {
        let selection = cap_flags(shared.kind).map(|_| Selection::new(shared.limits));
        Preparer {
            shared,
            selection,
            listing: None,
            relist_at: None,
        }
    }

    pub(crate) fn relist_at(&self) -> Option<Instant> {
        self.relist_at
    }

    /// The object's key and what the index keeps of it, or its key and `None` (logged, at a
    /// bounded rate, and counted). The key of a PVC or Node shares the converted object's
    /// strings (there may be 100 000 PVCs: one copy of each name, not three).
    fn convert(&self, obj: DynamicObject, listing: bool) -> (ObjectKey, Option<Arc<Converted>>) {
        let kind = self.shared.kind;
        let key = object_key(&obj);
        match convert_bounded(kind, obj) {
            Ok((mut c, trimmed)) => {
                if let Converted::Pvc { namespace, .. } = &mut c {
                    *namespace = self.shared.shared_namespace(namespace);
                }
                self.trimmed(&key, trimmed);
                (c.shared_key().unwrap_or(key), Some(Arc::new(c)))
            }
            Err(Rejected { reason, why }) => {
                self.shared.metrics.skipped(kind, reason, 1);
                let what = if listing { "skipped" } else { "ignored" };
                self.shared
                    .log(|| format!("{} {what}: {why}", describe(kind, &key)));
                (key, None)
            }
        }
    }

    fn trimmed(&self, key: &ObjectKey, trimmed: Trimmed) {
        let kind = self.shared.kind;
        let metrics = &self.shared.metrics;
        if trimmed.node_groups > 0 {
            metrics.skipped(kind, SkipReason::NodeGroupsTrimmed, 1);
            self.shared.log(|| {
                format!(
                    "{} kept without {} of its spec.nodeGroups (duplicates, names longer than \
                     an object name, or past the first {MAX_NODE_GROUPS})",
                    describe(kind, key),
                    trimmed.node_groups
                )
            });
        }
        if trimmed.node_status > 0 {
            metrics.skipped(kind, SkipReason::NodeStatusTrimmed, 1);
            self.shared.log(|| {
                format!(
                    "{} kept without {} of its status.nodeStatus entries (node names longer \
                     than an object name, or NodeDownloaded entries past the first {})",
                    describe(kind, key),
                    trimmed.node_status,
                    super::MAX_DOWNLOADED_NODES
                )
            });
        }
    }

    /// A kept object is gone: the caps may owe its place to an ignored object.
    fn freed(&mut self, key: &ObjectKey) {
        let owed = self.selection.as_mut().is_some_and(|s| s.remove(key));
        if owed && self.relist_at.is_none() {
            self.relist_at = Some(self.shared.relist_at(Instant::now()));
        }
    }

    /// The events to hand on for one event of the watcher.
    pub(crate) fn event(&mut self, event: Event<DynamicObject>) -> Vec<Event<Prepared>> {
        match event {
            Event::Init => {
                if let Some(s) = &mut self.selection {
                    s.reset();
                    self.listing = Some(Default::default());
                }
                self.relist_at = None;
                vec![Event::Init]
            }
            Event::InitApply(obj) => {
                let created = created(&obj);
                let (key, Some(c)) = self.convert(obj, true) else {
                    return Vec::new();
                };
                let Some(selection) = &mut self.selection else {
                    return vec![Event::InitApply(Prepared {
                        key,
                        object: Some(c),
                    })];
                };
                let listing = self.listing.get_or_insert_default();
                match selection.offer(&key, created) {
                    Offer::Kept => {
                        listing.insert(key, c);
                    }
                    Offer::Admitted { displaced } => {
                        for (d, reason) in displaced {
                            listing.remove(&d);
                            self.shared.over_cap(&d, reason);
                        }
                        listing.insert(key, c);
                    }
                    Offer::Refused(reason) => self.shared.over_cap(&key, reason),
                }
                Vec::new()
            }
            Event::InitDone => {
                let mut out: Vec<Event<Prepared>> = self
                    .listing
                    .take()
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(key, c)| {
                        Event::InitApply(Prepared {
                            key,
                            object: Some(c),
                        })
                    })
                    .collect();
                out.push(Event::InitDone);
                out
            }
            Event::Apply(obj) => {
                let created = created(&obj);
                let (key, c) = self.convert(obj, false);
                let Some(c) = c else {
                    // A kept version must not stay in use.
                    self.freed(&key);
                    return vec![Event::Delete(Prepared::gone(key))];
                };
                let Some(selection) = &mut self.selection else {
                    return vec![Event::Apply(Prepared {
                        key,
                        object: Some(c),
                    })];
                };
                match selection.offer(&key, created) {
                    Offer::Kept => vec![Event::Apply(Prepared {
                        key,
                        object: Some(c),
                    })],
                    Offer::Admitted { displaced } => {
                        let mut out = Vec::with_capacity(displaced.len() + 1);
                        for (d, reason) in displaced {
                            self.shared.over_cap(&d, reason);
                            out.push(Event::Delete(Prepared::gone(d)));
                        }
                        out.push(Event::Apply(Prepared {
                            key,
                            object: Some(c),
                        }));
                        out
                    }
                    Offer::Refused(reason) => {
                        self.shared.over_cap(&key, reason);
                        Vec::new()
                    }
                }
            }
            Event::Delete(obj) => {
                let key = object_key(&obj);
                self.freed(&key);
                vec![Event::Delete(Prepared::gone(key))]
            }
        }
    }
}

/// `metadata.creationTimestamp` in Unix seconds; an object without one counts as the newest.
fn created(obj: &DynamicObject) -> i64 {
    obj.metadata
        .creation_timestamp
        .as_ref()
        .map_or(i64::MAX, |t| t.0.as_second())
}

#[cfg(test)]
mod tests {
    use kube::runtime::watcher::Event;
    use serde_json::json;

    use super::*;
    use crate::reflector::{Applied, Writer};

    fn pvc(ns: &str, name: &str, phase: &str) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": ns},
            "status": {"phase": phase},
        }))
        .unwrap()
    }

    fn cache(name: &str, spec: serde_json::Value) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "serving.kserve.io/v1alpha1", "kind": "LocalModelCache",
            "metadata": {"name": name}, "spec": spec,
        }))
        .unwrap()
    }

    /// A namespace cache created at `created` (seconds after a fixed day).
    fn ns_cache(ns: &str, name: &str, created: i64) -> DynamicObject {
        let at = k8s_openapi::jiff::Timestamp::from_second(1_790_000_000 + created).unwrap();
        serde_json::from_value(json!({
            "apiVersion": "serving.kserve.io/v1alpha1", "kind": "LocalModelNamespaceCache",
            "metadata": {"name": name, "namespace": ns, "creationTimestamp": at.to_string()},
            "spec": {"sourceModelUri": format!("hf://org/{name}"), "nodeGroups": ["g"]},
        }))
        .unwrap()
    }

    fn key(ns: &str, name: &str) -> ObjectKey {
        (ns.into(), name.into())
    }

    fn node(name: &str, rv: &str, labels: serde_json::Value) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "resourceVersion": rv, "labels": labels,
                         "annotations": {"heartbeat": rv}},
        }))
        .unwrap()
    }

    /// A kind's events through a [`Preparer`] and a [`Writer`], as one stream of the watch.
    struct Watch {
        preparer: Preparer,
        writer: Writer<KindRules>,
        objects: Mutex<KindObjects>,
        metrics: CacheMetrics,
    }

    impl Watch {
        fn new(kind: Kind) -> Self {
            Self::with_limits(kind, CacheLimits::default())
        }

        fn with_limits(kind: Kind, limits: CacheLimits) -> Self {
            let metrics = CacheMetrics::new();
            let shared = KindShared::new(kind, metrics.clone(), limits, Duration::from_secs(30));
            Watch {
                preparer: Preparer::new(Arc::new(shared)),
                writer: Writer::new(KindRules::new(kind)),
                objects: Mutex::new(KindObjects::new()),
                metrics,
            }
        }

        /// What the writer made of the events the preparer handed on for `event`: the last
        /// one's outcome, or `Nothing` when it handed on none.
        fn apply(&mut self, event: Event<DynamicObject>) -> Applied<ObjectKey> {
            let mut last = Applied::Nothing;
            for e in self.preparer.event(event) {
                last = self.writer.apply(e, &self.objects);
            }
            last
        }

        fn list(&mut self, objects: impl IntoIterator<Item = DynamicObject>) -> Applied<ObjectKey> {
            self.apply(Event::Init);
            for o in objects {
                self.apply(Event::InitApply(o));
            }
            self.apply(Event::InitDone)
        }

        /// `ns/name` of every object kept, sorted.
        fn names(&self) -> Vec<String> {
            let mut out: Vec<String> = self
                .objects
                .lock()
                .unwrap()
                .keys()
                .map(|(ns, name)| format!("{ns}/{name}"))
                .collect();
            out.sort();
            out
        }

        fn skipped(&self, reason: &str) -> u64 {
            let mut registry = prometheus_client::registry::Registry::default();
            self.metrics.register(&mut registry);
            let mut text = String::new();
            prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
            let kind = self.preparer.shared.kind;
            let series =
                format!("modelgate_cache_skipped_total{{kind=\"{kind}\",reason=\"{reason}\"}} ");
            text.lines()
                .find_map(|l| l.strip_prefix(&series))
                .unwrap_or_else(|| panic!("{series} not in {text}"))
                .parse()
                .unwrap()
        }
    }

    #[test]
    fn a_list_replaces_the_objects_only_once_complete() {
        let mut w = Watch::new(Kind::Pvc);
        assert_eq!(
            w.apply(Event::Apply(pvc("a", "old", "Bound"))),
            Applied::Changed(key("a", "old"))
        );
        assert_eq!(w.apply(Event::Init), Applied::Nothing);
        for name in ["x", "y"] {
            let e = Event::InitApply(pvc("a", name, "Bound"));
            assert_eq!(w.apply(e), Applied::Nothing);
            assert_eq!(w.names(), ["a/old"], "a list in progress is not visible");
        }
        let Applied::Listed { kept, mut changed } = w.apply(Event::InitDone) else {
            panic!("a list")
        };
        changed.sort();
        assert_eq!(kept, 2);
        assert_eq!(changed, [key("a", "old"), key("a", "x"), key("a", "y")]);
        assert_eq!(w.names(), ["a/x", "a/y"]);
    }

    #[test]
    fn apply_upserts_delete_removes_and_an_unusable_update_removes() {
        let mut w = Watch::new(Kind::Cache);
        let good = json!({"sourceModelUri": "hf://org/m", "nodeGroups": ["g"]});
        assert_eq!(
            w.apply(Event::Apply(cache("m", good.clone()))),
            Applied::Changed(key("", "m"))
        );
        assert_eq!(
            w.apply(Event::Apply(cache("n", good.clone()))),
            Applied::Changed(key("", "n"))
        );
        assert_eq!(w.names(), ["/m", "/n"]);
        // An update that no longer converts takes the object out rather than keep the old one.
        let bad = json!({"sourceModelUri": ""});
        assert_eq!(
            w.apply(Event::Apply(cache("m", bad.clone()))),
            Applied::Changed(key("", "m"))
        );
        // Still unusable, and no longer kept: nothing to report.
        assert_eq!(w.apply(Event::Apply(cache("m", bad))), Applied::Unchanged);
        assert_eq!(w.names(), ["/n"]);
        assert_eq!(
            w.apply(Event::Delete(cache("n", good.clone()))),
            Applied::Changed(key("", "n"))
        );
        assert_eq!(w.apply(Event::Delete(cache("n", good))), Applied::Unchanged);
        assert!(w.names().is_empty());
        assert_eq!(w.skipped("unusable"), 2);
    }

    #[test]
    fn what_is_left_out_is_counted_and_logged_at_a_bounded_rate() {
        let mut w = Watch::new(Kind::Cache);
        let long = format!("hf://{}", "x".repeat(1 << 20));
        let mut groups = vec!["g".to_string(); 1_000];
        groups.push("h".into());
        for i in 0..1_000 {
            let huge = cache("m", json!({"sourceModelUri": long, "nodeGroups": ["g"]}));
            assert_eq!(w.apply(Event::Apply(huge)), Applied::Unchanged, "{i}");
        }
        assert_eq!(w.skipped("uri-too-long"), 1_000);
        assert_eq!(
            w.apply(Event::Apply(cache(
                "g",
                json!({"sourceModelUri": "hf://m", "nodeGroups": groups})
            ))),
            Applied::Changed(key("", "g"))
        );
        assert_eq!(w.skipped("node-groups-trimmed"), 1);
        let limit = w.preparer.shared.log.lock().unwrap();
        assert_eq!(limit.logged, LOG_LINES);
        assert_eq!(limit.suppressed, 1_001 - u64::from(LOG_LINES));
    }

    #[test]
    fn an_update_replaces_the_object_of_the_same_key() {
        let mut w = Watch::new(Kind::Pvc);
        w.apply(Event::Apply(pvc("a", "c", "Pending")));
        w.apply(Event::Apply(pvc("a", "c", "Lost")));
        let objects = w.objects.into_inner().unwrap();
        assert_eq!(objects.len(), 1);
        let Some(Converted::Pvc { state, .. }) = objects.values().next().map(|c| &**c) else {
            panic!("a PVC: {objects:?}");
        };
        assert_eq!(state.phase, crate::cache::PvcPhase::Lost);
    }

    #[test]
    fn a_node_heartbeat_or_a_pvc_resize_changes_nothing_and_reports_nothing() {
        let mut w = Watch::new(Kind::Node);
        let gpu = json!({"node-type": "gpu"});
        assert_eq!(
            w.apply(Event::Apply(node("n1", "1", gpu.clone()))),
            Applied::Changed(key("", "n1"))
        );
        let kept = w.objects.lock().unwrap()[&key("", "n1")].clone();
        for rv in 2..20 {
            let e = Event::Apply(node("n1", &rv.to_string(), gpu.clone()));
            assert_eq!(w.apply(e), Applied::Unchanged);
        }
        // What is kept is still the first conversion, shared with the index.
        assert!(Arc::ptr_eq(
            &kept,
            &w.objects.lock().unwrap()[&key("", "n1")]
        ));
        let e = Event::Apply(node("n1", "21", json!({"node-type": "cpu"})));
        assert_eq!(w.apply(e), Applied::Changed(key("", "n1")));

        let mut w = Watch::new(Kind::Pvc);
        w.apply(Event::Apply(pvc("a", "c", "Bound")));
        let mut resized = pvc("a", "c", "Bound");
        resized.data["spec"] = json!({"resources": {"requests": {"storage": "2Gi"}}});
        assert_eq!(w.apply(Event::Apply(resized)), Applied::Unchanged);
    }

    #[test]
    fn pvcs_of_one_namespace_share_its_name() {
        let mut w = Watch::new(Kind::Pvc);
        w.apply(Event::Apply(pvc("team-a", "x", "Bound")));
        w.apply(Event::Apply(pvc("team-a", "y", "Bound")));
        let objects = w.objects.lock().unwrap();
        let (x, _) = objects.get_key_value(&key("team-a", "x")).unwrap();
        let (y, _) = objects.get_key_value(&key("team-a", "y")).unwrap();
        assert!(Arc::ptr_eq(&x.0, &y.0));
    }

    #[test]
    fn a_relist_keeps_the_objects_it_finds_unchanged() {
        let mut w = Watch::new(Kind::Pvc);
        w.apply(Event::Apply(pvc("a", "same", "Bound")));
        w.apply(Event::Apply(pvc("a", "moved", "Pending")));
        let kept = w.objects.lock().unwrap().clone();
        let listed = w.list([pvc("a", "same", "Bound"), pvc("a", "moved", "Bound")]);
        assert_eq!(
            listed,
            Applied::Listed {
                kept: 2,
                changed: vec![key("a", "moved")]
            }
        );
        // The unchanged object is the one kept before, key and value, not a copy.
        let objects = w.objects.lock().unwrap();
        let (k, v) = objects.get_key_value(&key("a", "same")).unwrap();
        let (old_k, old_v) = kept.get_key_value(&key("a", "same")).unwrap();
        assert!(Arc::ptr_eq(v, old_v) && Arc::ptr_eq(&k.1, &old_k.1));
    }

    #[test]
    fn unusable_objects_of_a_list_are_skipped() {
        let mut w = Watch::new(Kind::Pvc);
        let listed = w.list([pvc("a", "ok", "Bound"), pvc("", "no-namespace", "Bound")]);
        assert!(matches!(listed, Applied::Listed { kept: 1, .. }));
        assert_eq!(w.names(), ["a/ok"]);
        assert_eq!(w.skipped("unusable"), 1);
    }

    #[test]
    fn a_failed_list_is_dropped_and_the_objects_stay() {
        let mut w = Watch::new(Kind::Pvc);
        w.list([pvc("a", "kept", "Bound")]);
        w.apply(Event::Init);
        w.apply(Event::InitApply(pvc("a", "partial", "Bound")));
        w.writer.reset();
        assert_eq!(w.names(), ["a/kept"]);
        // The watcher starts over from Init; only that list counts.
        let listed = w.list([pvc("a", "fresh", "Bound")]);
        assert!(matches!(listed, Applied::Listed { kept: 1, .. }));
        assert_eq!(w.names(), ["a/fresh"]);
    }

    #[test]
    fn the_newest_namespace_caches_past_a_cap_are_ignored_and_a_deletion_asks_for_a_list() {
        let limits = CacheLimits {
            per_namespace: 2,
            total: 3,
        };
        let mut w = Watch::with_limits(Kind::NamespaceCache, limits);
        // Listed in name order, kept by age: team-a's newest (a-3) is ignored.
        let listed = w.list([
            ns_cache("team-a", "a-1", 30),
            ns_cache("team-a", "a-2", 10),
            ns_cache("team-a", "a-3", 40),
            ns_cache("team-a", "a-4", 20),
            ns_cache("team-b", "b-1", 50),
        ]);
        assert!(
            matches!(listed, Applied::Listed { kept: 3, .. }),
            "{listed:?}"
        );
        assert_eq!(w.names(), ["team-a/a-2", "team-a/a-4", "team-b/b-1"]);
        assert_eq!(w.skipped("over-namespace-cap"), 2);
        assert_eq!(w.preparer.relist_at(), None);
        // A new cache past the total: ignored; one older than a kept one would displace it.
        assert_eq!(
            w.apply(Event::Apply(ns_cache("team-c", "c-1", 60))),
            Applied::Nothing
        );
        assert_eq!(w.skipped("over-total-cap"), 1);
        assert_eq!(
            w.apply(Event::Apply(ns_cache("team-c", "c-0", 5))),
            Applied::Changed(key("team-c", "c-0"))
        );
        assert_eq!(w.names(), ["team-a/a-2", "team-a/a-4", "team-c/c-0"]);
        assert_eq!(w.skipped("over-total-cap"), 2);
        // An update of a kept one passes.
        assert_eq!(
            w.apply(Event::Apply(ns_cache("team-a", "a-2", 10))),
            Applied::Unchanged
        );
        // A deletion frees a place owed to an ignored object: the stream is to end, to relist.
        assert_eq!(
            w.apply(Event::Delete(ns_cache("team-a", "a-4", 20))),
            Applied::Changed(key("team-a", "a-4"))
        );
        assert!(w.preparer.relist_at().is_some());
        // The relist keeps the oldest again, and asks for nothing more.
        let listed = w.list([
            ns_cache("team-a", "a-1", 30),
            ns_cache("team-a", "a-2", 10),
            ns_cache("team-a", "a-3", 40),
            ns_cache("team-b", "b-1", 50),
            ns_cache("team-c", "c-0", 5),
            ns_cache("team-c", "c-1", 60),
        ]);
        assert!(
            matches!(listed, Applied::Listed { kept: 3, .. }),
            "{listed:?}"
        );
        assert_eq!(w.names(), ["team-a/a-1", "team-a/a-2", "team-c/c-0"]);
        assert_eq!(w.preparer.relist_at(), None);
    }

    /// An exception created at `created` (seconds after a fixed day).
    fn exception(ns: &str, name: &str, created: i64) -> DynamicObject {
        let at = k8s_openapi::jiff::Timestamp::from_second(1_790_000_000 + created).unwrap();
        serde_json::from_value(json!({
            "apiVersion": "modelgate.io/v1alpha1", "kind": "ModelgateException",
            "metadata": {"name": name, "namespace": ns, "creationTimestamp": at.to_string()},
            "spec": {"reason": "vendor image", "expires": "2030-01-01T00:00:00Z",
                     "rules": ["non-root"], "selector": {"matchLabels": {"app": name}}},
        }))
        .unwrap()
    }

    #[test]
    fn the_newest_exceptions_past_a_cap_are_ignored() {
        let limits = CacheLimits {
            per_namespace: 2,
            total: 3,
        };
        let mut w = Watch::with_limits(Kind::Exception, limits);
        let listed = w.list([
            exception("team-a", "e-1", 30),
            exception("team-a", "e-2", 10),
            exception("team-a", "e-3", 40),
            exception("team-b", "e-1", 50),
        ]);
        assert!(
            matches!(listed, Applied::Listed { kept: 3, .. }),
            "{listed:?}"
        );
        assert_eq!(w.names(), ["team-a/e-1", "team-a/e-2", "team-b/e-1"]);
        assert_eq!(w.skipped("over-namespace-cap"), 1);
        assert_eq!(
            w.apply(Event::Apply(exception("team-c", "e-1", 60))),
            Applied::Nothing
        );
        assert_eq!(w.skipped("over-total-cap"), 1);
    }
}
