//! What every watch of `serve` shares (the cache kinds, the Namespaces), after kube-runtime's
//! reflector: the event rules as a pure transition ([`Writer::apply`], as kube-runtime's
//! `Writer::apply_watcher_event`), and the one loop ([`run`]) that feeds it a kind's events and
//! handles failures, backoff and relists, so that a watch only says what its objects are
//! ([`Rules`]) and what it does when they change ([`Watched`]).
//!
//! The rules:
//! - a list (`Init`, `InitApply`…, `InitDone`) is gathered aside and replaces the objects only
//!   once complete, so a relist never shows a half-listed kind;
//! - `Apply` converts and upserts; an object that no longer converts is removed (its last good
//!   version must not keep being used) with a warning;
//! - an `Apply` whose conversion equals what is kept changes nothing and reports nothing: most
//!   watch events of a real cluster touch nothing a watch keeps (a Node's status or
//!   annotations, a PVC's resize), and each would otherwise cost a publish;
//! - `Delete` removes;
//! - every change is reported with the keys it touched, a complete list with the keys whose
//!   value differs from what it replaced (so a relist that finds what was known reports nothing
//!   changed), so that a watch can apply only those;
//! - an object of a list that does not convert is skipped with a warning;
//! - after a stream error a partial list is dropped and the objects stay.
//!
//! The loop: errors back off and retry (kube-runtime's watcher relists or rewatches as the
//! error requires), keeping the last known objects; only progress (a complete list, an object
//! event) resets the backoff; a watch request answered with HTTP 410 starts over with a fresh
//! list.

use std::sync::atomic::AtomicU64;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use futures::stream::BoxStream;
use kube::runtime::utils::Backoff;
use kube::runtime::watcher::{self, DefaultBackoff, Event};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tracing::{info, warn};

/// A kind's objects as a watch keeps them: what a complete list replaces and events edit.
pub(crate) trait Objects: Default {
    type Key: Clone;
    type Value;
    fn insert(&mut self, key: Self::Key, value: Self::Value);
    /// Whether there was something to remove.
    fn remove(&mut self, key: &Self::Key) -> bool;
    fn len(&self) -> usize;
    /// Whether keeping `value` under `key` is what is kept already (so it would change nothing).
    fn holds(&self, key: &Self::Key, value: &Self::Value) -> bool;
    /// Replaces every object with a complete list; returns the keys whose value appeared,
    /// changed or went.
    fn replace(&mut self, listed: Self) -> Vec<Self::Key>;
}

/// What a watched object becomes: the kind-specific half of the event rules.
pub(crate) trait Rules {
    /// What the watcher yields.
    type Object;
    type Objects: Objects;
    /// The key an object is kept under (what a `Delete` removes).
    fn key(&self, object: &Self::Object) -> Key<Self>;
    /// What is kept of the object and under which key, or its key and why it cannot be used.
    fn convert(&self, object: Self::Object) -> Conversion<Self>;
    /// The object as a log line names it.
    fn describe(&self, key: &Key<Self>) -> String;
}

pub(crate) type Key<R> = <<R as Rules>::Objects as Objects>::Key;
type Value<R> = <<R as Rules>::Objects as Objects>::Value;
/// The key and what is kept, or the key and why nothing is.
type Conversion<R> = Result<(Key<R>, Value<R>), (Key<R>, String)>;

/// What one event did to the objects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Applied<K> {
    /// Nothing visible: a list in progress gathers its objects aside.
    Nothing,
    /// An object event that left the objects as they were (progress all the same).
    Unchanged,
    /// A list completed and replaced the objects: `kept` were kept, the objects of `changed`
    /// differ from before.
    Listed { kept: usize, changed: Vec<K> },
    /// The object of this key was added, replaced or removed.
    Changed(K),
}

/// Applies the events of one watch to its objects (the rules of the module docs).
pub(crate) struct Writer<R: Rules> {
    rules: R,
    listing: Option<R::Objects>,
}

impl<R: Rules> Writer<R> {
    pub(crate) fn new(rules: R) -> Self {
        Writer {
            rules,
            listing: None,
        }
    }

    /// Applies one event to `objects`, locking it only to write (conversion happens outside).
    pub(crate) fn apply(
        &mut self,
        event: Event<R::Object>,
        objects: &Mutex<R::Objects>,
    ) -> Applied<Key<R>> {
        let lock = || objects.lock().unwrap_or_else(PoisonError::into_inner);
        match event {
            Event::Init => {
                self.listing = Some(R::Objects::default());
                Applied::Nothing
            }
            Event::InitApply(obj) => {
                match self.rules.convert(obj) {
                    Ok((key, value)) => self.listing.get_or_insert_default().insert(key, value),
                    Err((key, why)) => warn!("{} skipped: {why}", self.rules.describe(&key)),
                }
                Applied::Nothing
            }
            Event::InitDone => {
                let listed = self.listing.take().unwrap_or_default();
                let kept = listed.len();
                let changed = lock().replace(listed);
                Applied::Listed { kept, changed }
            }
            Event::Apply(obj) => {
                let converted = self.rules.convert(obj);
                let mut objects = lock();
                match converted {
                    Ok((key, value)) if objects.holds(&key, &value) => Applied::Unchanged,
                    Ok((key, value)) => {
                        objects.insert(key.clone(), value);
                        Applied::Changed(key)
                    }
                    Err((key, why)) => {
                        warn!("{} ignored: {why}", self.rules.describe(&key));
                        match objects.remove(&key) {
                            true => Applied::Changed(key),
                            false => Applied::Unchanged,
                        }
                    }
                }
            }
            Event::Delete(obj) => {
                let key = self.rules.key(&obj);
                match lock().remove(&key) {
                    true => Applied::Changed(key),
                    false => Applied::Unchanged,
                }
            }
        }
    }

    /// The stream failed: a list in progress will be started again from `Init`.
    pub(crate) fn reset(&mut self) {
        self.listing = None;
    }
}

/// One watch as [`run`] drives it: where its events come from, where its objects live, and
/// what it does when they change or its stream fails.
pub(crate) trait Watched {
    type Rules: Rules;
    /// What log lines call the watched kind.
    fn name(&self) -> String;
    /// A fresh list-then-watch stream (each one starts with a list).
    fn stream(
        &self,
    ) -> BoxStream<'static, Result<Event<<Self::Rules as Rules>::Object>, watcher::Error>>;
    fn objects(&self) -> &Mutex<<Self::Rules as Rules>::Objects>;
    /// A complete list replaced the objects; `n` were kept. [`Watched::changed`] follows when
    /// it changed any.
    fn listed(&mut self, n: usize);
    /// The objects of these keys changed (were added, replaced or removed): publish them.
    fn changed(&mut self, keys: Vec<Key<Self::Rules>>);
    /// The stream failed and will be retried after a backoff, the last known objects staying
    /// in use: count and log it, and say whether the watch is broken by it or the error is a
    /// state the watch expects. An expired resourceVersion ([`relists`]) is logged by [`run`].
    fn failed(&mut self, error: &watcher::Error) -> Failure;
}

/// What an error of the stream says about the watch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Failure {
    /// The watch cannot list or watch (RBAC, an unreachable API server, a server error): what
    /// it keeps may be going stale.
    Broken,
    /// A state the watch works with: an expired resourceVersion (relisted), a CRD that is not
    /// installed (counted as empty).
    Expected,
}

/// How current each watch is, for the alert on a watch that keeps failing while what it keeps
/// goes stale (a gone PVC still routed to):
///
/// | metric | labels | meaning |
/// |---|---|---|
/// | `modelgate_watch_last_progress_timestamp_seconds` | `watch` | Unix time of the watch's last complete list or object event; 0 before the first |
/// | `modelgate_watch_last_failure_timestamp_seconds` | `watch` | Unix time of the watch's last failed list or watch request (not a relist after 410, not a missing CRD); 0 before the first |
///
/// A healthy watch of a quiet cluster may see no event for hours, so the age of the last
/// progress alone says nothing; a broken one fails again after every backoff (at most 30 s)
/// or request timeout (at most kube's 295 s read timeout), so "a failure within the last few
/// minutes, continuously, and no progress for ten" is a watch that is not working.
/// Cloning shares the series.
#[derive(Clone, Debug, Default)]
pub struct WatchMetrics {
    progress: Family<WatchLabel, Gauge<f64, AtomicU64>>,
    failure: Family<WatchLabel, Gauge<f64, AtomicU64>>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WatchLabel {
    watch: &'static str,
}

impl WatchMetrics {
    /// The series of every watch in `watches` exist from the start, at 0.
    pub fn new(watches: &[&'static str]) -> Self {
        let m = WatchMetrics::default();
        for &watch in watches {
            drop(m.progress.get_or_create(&WatchLabel { watch }));
            drop(m.failure.get_or_create(&WatchLabel { watch }));
        }
        m
    }

    /// Adds the two families to the server's registry.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "modelgate_watch_last_progress_timestamp_seconds",
            "Unix time of the watch's last complete list or object event (0: none yet)",
            self.progress.clone(),
        );
        registry.register(
            "modelgate_watch_last_failure_timestamp_seconds",
            "Unix time of the watch's last failed list or watch request (0: none yet)",
            self.failure.clone(),
        );
    }

    /// The gauges of one watch.
    pub(crate) fn health(&self, watch: &'static str) -> WatchHealth {
        let label = WatchLabel { watch };
        WatchHealth {
            progress: self.progress.get_or_create(&label).clone(),
            failure: self.failure.get_or_create(&label).clone(),
        }
    }
}

/// One watch's two timestamps.
#[derive(Clone, Debug)]
pub(crate) struct WatchHealth {
    progress: Gauge<f64, AtomicU64>,
    failure: Gauge<f64, AtomicU64>,
}

impl WatchHealth {
    fn progressed(&self) {
        self.progress.set(unix_now());
    }

    fn failed(&self) {
        self.failure.set(unix_now());
    }
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Whether [`run`] starts the stream over with a fresh list after this error: a watch request
/// answered with HTTP 410. (kube-runtime relists after a 410 `ERROR` event, but retries the
/// watch with the same resourceVersion when the request itself answers 410, forever.)
pub(crate) fn relists(error: &watcher::Error) -> bool {
    matches!(error, watcher::Error::WatchStartFailed(kube::Error::Api(s)) if s.code == 410)
}

/// Watches for as long as the task lives, applying every event with `rules`.
pub(crate) async fn run<W: Watched>(
    mut watched: W,
    rules: W::Rules,
    backoff: &WatchBackoff,
    health: WatchHealth,
) {
    // The backoff is applied here rather than with `WatchStreamExt::backoff`: that one resets on
    // every `Ok` item, and the watcher emits `Init` before each list attempt, so a list that keeps
    // failing (a missing CRD, RBAC not granted) would be retried at the minimum delay forever.
    // Here only progress resets it.
    let mut backoff = backoff.build();
    let mut writer = Writer::new(rules);
    loop {
        let mut stream = watched.stream();
        writer.reset();
        while let Some(item) = stream.next().await {
            let changed = match item {
                Ok(event) => match writer.apply(event, watched.objects()) {
                    Applied::Nothing => None,
                    Applied::Unchanged => Some(Vec::new()),
                    Applied::Changed(key) => Some(vec![key]),
                    Applied::Listed { kept, changed } => {
                        watched.listed(kept);
                        Some(changed)
                    }
                },
                Err(e) => {
                    writer.reset();
                    if watched.failed(&e) == Failure::Broken {
                        health.failed();
                    }
                    tokio::time::sleep(backoff.next().unwrap_or_default()).await;
                    if relists(&e) {
                        info!(
                            "{}: resourceVersion expired (HTTP 410); relisting",
                            watched.name()
                        );
                        break;
                    }
                    continue;
                }
            };
            // Any complete list or object event is progress, even one that changed nothing.
            if let Some(keys) = changed {
                backoff.reset();
                health.progressed();
                if !keys.is_empty() {
                    watched.changed(keys);
                }
            }
        }
    }
}

/// How a failing list or watch is retried.
#[derive(Clone, Debug, PartialEq)]
pub enum WatchBackoff {
    /// kube-runtime's default, after client-go: 0.8 s doubling to 30 s, with jitter.
    Default,
    /// Doubling from `min` to `max`, without jitter (tests).
    Exponential { min: Duration, max: Duration },
}

impl WatchBackoff {
    pub(crate) fn build(&self) -> Box<dyn Backoff> {
        match *self {
            WatchBackoff::Default => Box::new(DefaultBackoff::default()),
            WatchBackoff::Exponential { min, max } => Box::new(Doubling {
                min,
                max,
                next: min,
            }),
        }
    }
}

struct Doubling {
    min: Duration,
    max: Duration,
    next: Duration,
}

impl Iterator for Doubling {
    type Item = Duration;
    fn next(&mut self) -> Option<Duration> {
        let current = self.next;
        self.next = current.saturating_mul(2).min(self.max);
        Some(current)
    }
}

impl Backoff for Doubling {
    fn reset(&mut self) {
        self.next = self.min;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// Objects as `(name, value)` pairs, a negative value not converting.
    struct Pairs;

    impl Objects for BTreeMap<String, i64> {
        type Key = String;
        type Value = i64;
        fn insert(&mut self, key: String, value: i64) {
            BTreeMap::insert(self, key, value);
        }
        fn remove(&mut self, key: &String) -> bool {
            BTreeMap::remove(self, key).is_some()
        }
        fn len(&self) -> usize {
            BTreeMap::len(self)
        }
        fn holds(&self, key: &String, value: &i64) -> bool {
            self.get(key) == Some(value)
        }
        fn replace(&mut self, listed: Self) -> Vec<String> {
            let old = std::mem::replace(self, listed);
            let gone = old.keys().filter(|k| !self.contains_key(*k));
            let changed = self.iter().filter(|(k, v)| old.get(*k) != Some(v));
            gone.chain(changed.map(|(k, _)| k)).cloned().collect()
        }
    }

    impl Rules for Pairs {
        type Object = (String, i64);
        type Objects = BTreeMap<String, i64>;
        fn key(&self, object: &(String, i64)) -> String {
            object.0.clone()
        }
        fn convert(&self, (key, value): (String, i64)) -> Conversion<Self> {
            if value < 0 {
                return Err((key, "negative".into()));
            }
            Ok((key, value))
        }
        fn describe(&self, key: &String) -> String {
            key.clone()
        }
    }

    fn pair(name: &str, value: i64) -> (String, i64) {
        (name.to_string(), value)
    }

    #[test]
    fn an_event_that_changes_nothing_reports_nothing() {
        let objects = Mutex::new(BTreeMap::new());
        let mut w = Writer::new(Pairs);
        let changed = |k: &str| Applied::Changed(k.to_string());
        assert_eq!(w.apply(Event::Apply(pair("a", 1)), &objects), changed("a"));
        // The same value again: a Node status update or a PVC resize, as the watch converts it.
        assert_eq!(
            w.apply(Event::Apply(pair("a", 1)), &objects),
            Applied::Unchanged
        );
        assert_eq!(w.apply(Event::Apply(pair("a", 2)), &objects), changed("a"));
        // Deleting, or failing to convert, what is not kept changes nothing either.
        assert_eq!(
            w.apply(Event::Delete(pair("b", 0)), &objects),
            Applied::Unchanged
        );
        assert_eq!(
            w.apply(Event::Apply(pair("b", -1)), &objects),
            Applied::Unchanged
        );
        assert_eq!(w.apply(Event::Apply(pair("a", -1)), &objects), changed("a"));
        assert!(objects.lock().unwrap().is_empty());
    }

    #[test]
    fn a_relist_reports_only_what_differs() {
        let objects = Mutex::new(BTreeMap::new());
        let mut w = Writer::new(Pairs);
        let list = |w: &mut Writer<Pairs>, items: &[(&str, i64)]| {
            w.apply(Event::Init, &objects);
            for (k, v) in items {
                w.apply(Event::InitApply(pair(k, *v)), &objects);
            }
            w.apply(Event::InitDone, &objects)
        };
        let listed = |kept, changed: &[&str]| Applied::Listed {
            kept,
            changed: changed.iter().map(|c| c.to_string()).collect(),
        };
        assert_eq!(list(&mut w, &[("a", 1), ("b", 2)]), listed(2, &["a", "b"]));
        assert_eq!(list(&mut w, &[("a", 1), ("b", 2)]), listed(2, &[]));
        let mut after = list(&mut w, &[("b", 3), ("c", 4)]);
        if let Applied::Listed { changed, .. } = &mut after {
            changed.sort();
        }
        assert_eq!(after, listed(2, &["a", "b", "c"]));
    }

    #[test]
    fn doubling_backoff_caps_and_resets() {
        let mut b = WatchBackoff::Exponential {
            min: Duration::from_millis(10),
            max: Duration::from_millis(35),
        }
        .build();
        let first: Vec<_> = (&mut b).take(4).map(|d| d.as_millis()).collect();
        assert_eq!(first, [10, 20, 35, 35]);
        b.reset();
        assert_eq!(b.next(), Some(Duration::from_millis(10)));
    }

    #[test]
    fn only_a_watch_request_answered_410_relists() {
        let status = |code| {
            kube::Error::Api(
                kube::core::Status::failure("gone", "Expired")
                    .with_code(code)
                    .boxed(),
            )
        };
        assert!(relists(&watcher::Error::WatchStartFailed(status(410))));
        assert!(!relists(&watcher::Error::WatchStartFailed(status(500))));
        assert!(!relists(&watcher::Error::InitialListFailed(status(410))));
    }
}
