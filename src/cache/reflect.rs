//! The event rules of one watched kind, as a pure transition (after kube-runtime's
//! `Writer::apply_watcher_event`): what each watcher event does to the kind's converted
//! objects. [`super::watch`] feeds it the events of the cluster and decides what to log and when
//! to publish; the rules are tested here without an API server.

use std::sync::{Arc, Mutex, PoisonError};

use kube::api::DynamicObject;
use kube::runtime::watcher::Event;
use tracing::warn;

use super::cluster::{Kind, KindObjects, convert, describe, object_key};

/// What one event did to the kind's objects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Applied {
    /// Nothing visible: a list in progress gathers its objects aside.
    Nothing,
    /// A list completed and replaced the kind's objects; this many were usable.
    Listed(usize),
    /// An object was added, replaced or removed.
    Changed,
}

/// The rules:
/// - a list (`Init`, `InitApply`…, `InitDone`) is gathered aside and replaces the objects only
///   once complete, so a relist never shows a half-listed kind;
/// - `Apply` converts and upserts; an object that no longer converts is removed (its last good
///   version must not keep routing pods) with a warning;
/// - `Delete` removes;
/// - an object of a list that does not convert is skipped with a warning;
/// - after a stream error ([`KindWriter::reset`]) a partial list is dropped and the objects stay.
pub(crate) struct KindWriter {
    kind: Kind,
    listing: Option<KindObjects>,
}

impl KindWriter {
    pub(crate) fn new(kind: Kind) -> Self {
        KindWriter {
            kind,
            listing: None,
        }
    }

    /// Applies one event to `objects`, locking it only to write (conversion happens outside).
    pub(crate) fn apply(
        &mut self,
        event: Event<DynamicObject>,
        objects: &Mutex<KindObjects>,
    ) -> Applied {
        let kind = self.kind;
        let lock = || objects.lock().unwrap_or_else(PoisonError::into_inner);
        match event {
            Event::Init => {
                self.listing = Some(KindObjects::new());
                Applied::Nothing
            }
            Event::InitApply(obj) => {
                let key = object_key(&obj);
                match convert(kind, obj) {
                    Ok(c) => {
                        let key = c.shared_key().unwrap_or(key);
                        self.listing
                            .get_or_insert_default()
                            .insert(key, Arc::new(c));
                    }
                    Err(why) => warn!("{} skipped: {why}", describe(kind, &key)),
                }
                Applied::Nothing
            }
            Event::InitDone => {
                let listed = self.listing.take().unwrap_or_default();
                let n = listed.len();
                *lock() = listed;
                Applied::Listed(n)
            }
            Event::Apply(obj) => {
                let key = object_key(&obj);
                let converted = convert(kind, obj);
                let mut objects = lock();
                match converted {
                    Ok(c) => {
                        objects.insert(c.shared_key().unwrap_or(key), Arc::new(c));
                    }
                    Err(why) => {
                        warn!("{} ignored: {why}", describe(kind, &key));
                        objects.remove(&key);
                    }
                }
                Applied::Changed
            }
            Event::Delete(obj) => {
                lock().remove(&object_key(&obj));
                Applied::Changed
            }
        }
    }

    /// The stream failed: a list in progress will be started again from `Init`.
    pub(crate) fn reset(&mut self) {
        self.listing = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::cluster::Converted;
    use serde_json::json;

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

    /// `ns/name` of every object, sorted.
    fn names(objects: &Mutex<KindObjects>) -> Vec<String> {
        let mut out: Vec<String> = objects
            .lock()
            .unwrap()
            .keys()
            .map(|(ns, name)| format!("{ns}/{name}"))
            .collect();
        out.sort();
        out
    }

    #[test]
    fn a_list_replaces_the_objects_only_once_complete() {
        let objects = Mutex::new(KindObjects::new());
        let mut w = KindWriter::new(Kind::Pvc);
        assert_eq!(
            w.apply(Event::Apply(pvc("a", "old", "Bound")), &objects),
            Applied::Changed
        );
        assert_eq!(w.apply(Event::Init, &objects), Applied::Nothing);
        for name in ["x", "y"] {
            let e = Event::InitApply(pvc("a", name, "Bound"));
            assert_eq!(w.apply(e, &objects), Applied::Nothing);
            assert_eq!(
                names(&objects),
                ["a/old"],
                "a list in progress is not visible"
            );
        }
        assert_eq!(w.apply(Event::InitDone, &objects), Applied::Listed(2));
        assert_eq!(names(&objects), ["a/x", "a/y"]);
    }

    #[test]
    fn apply_upserts_delete_removes_and_an_unusable_update_removes() {
        let objects = Mutex::new(KindObjects::new());
        let mut w = KindWriter::new(Kind::Cache);
        let good = json!({"sourceModelUri": "hf://org/m", "nodeGroups": ["g"]});
        assert_eq!(
            w.apply(Event::Apply(cache("m", good.clone())), &objects),
            Applied::Changed
        );
        assert_eq!(
            w.apply(Event::Apply(cache("n", good.clone())), &objects),
            Applied::Changed
        );
        assert_eq!(names(&objects), ["/m", "/n"]);
        // An update that no longer converts takes the object out rather than keep the old one.
        let bad = json!({"sourceModelUri": ""});
        assert_eq!(
            w.apply(Event::Apply(cache("m", bad)), &objects),
            Applied::Changed
        );
        assert_eq!(names(&objects), ["/n"]);
        assert_eq!(
            w.apply(Event::Delete(cache("n", good)), &objects),
            Applied::Changed
        );
        assert!(names(&objects).is_empty());
    }

    #[test]
    fn an_update_replaces_the_object_of_the_same_key() {
        let objects = Mutex::new(KindObjects::new());
        let mut w = KindWriter::new(Kind::Pvc);
        w.apply(Event::Apply(pvc("a", "c", "Pending")), &objects);
        w.apply(Event::Apply(pvc("a", "c", "Lost")), &objects);
        let objects = objects.into_inner().unwrap();
        assert_eq!(objects.len(), 1);
        let Some(Converted::Pvc { state, .. }) = objects.values().next().map(|c| &**c) else {
            panic!("a PVC: {objects:?}");
        };
        assert_eq!(state.phase, crate::cache::PvcPhase::Lost);
    }

    #[test]
    fn unusable_objects_of_a_list_are_skipped() {
        let objects = Mutex::new(KindObjects::new());
        let mut w = KindWriter::new(Kind::Pvc);
        w.apply(Event::Init, &objects);
        w.apply(Event::InitApply(pvc("a", "ok", "Bound")), &objects);
        w.apply(Event::InitApply(pvc("", "no-namespace", "Bound")), &objects);
        assert_eq!(w.apply(Event::InitDone, &objects), Applied::Listed(1));
        assert_eq!(names(&objects), ["a/ok"]);
    }

    #[test]
    fn a_failed_list_is_dropped_and_the_objects_stay() {
        let objects = Mutex::new(KindObjects::new());
        let mut w = KindWriter::new(Kind::Pvc);
        w.apply(Event::Init, &objects);
        w.apply(Event::InitApply(pvc("a", "kept", "Bound")), &objects);
        w.apply(Event::InitDone, &objects);
        w.apply(Event::Init, &objects);
        w.apply(Event::InitApply(pvc("a", "partial", "Bound")), &objects);
        w.reset();
        assert_eq!(names(&objects), ["a/kept"]);
        // The watcher starts over from Init; only that list counts.
        w.apply(Event::Init, &objects);
        w.apply(Event::InitApply(pvc("a", "fresh", "Bound")), &objects);
        assert_eq!(w.apply(Event::InitDone, &objects), Applied::Listed(1));
        assert_eq!(names(&objects), ["a/fresh"]);
    }
}
