//! The cache kinds' half of the event rules ([`crate::reflector`]): what a watched object of one
//! [`Kind`] becomes (its conversion, under its key). [`super::watch`] runs one watch per kind
//! with them; the rules are tested here without an API server.

use std::sync::Arc;

use kube::api::DynamicObject;

use super::cluster::{Converted, Kind, KindObjects, ObjectKey, convert, describe, object_key};
use crate::reflector::{Objects, Rules};

impl Objects for KindObjects {
    type Key = ObjectKey;
    type Value = Arc<Converted>;

    fn insert(&mut self, key: ObjectKey, value: Arc<Converted>) {
        std::collections::HashMap::insert(self, key, value);
    }

    fn remove(&mut self, key: &ObjectKey) {
        std::collections::HashMap::remove(self, key);
    }

    fn len(&self) -> usize {
        std::collections::HashMap::len(self)
    }
}

/// The rules of one cache kind: an object is kept as its conversion, under its shared key when
/// it has one; one that does not convert is not kept.
pub(crate) struct KindRules(pub(crate) Kind);

impl Rules for KindRules {
    type Object = DynamicObject;
    type Objects = KindObjects;

    fn key(&self, object: &DynamicObject) -> ObjectKey {
        object_key(object)
    }

    fn convert(
        &self,
        object: DynamicObject,
    ) -> Result<(ObjectKey, Arc<Converted>), (ObjectKey, String)> {
        let key = object_key(&object);
        match convert(self.0, object) {
            Ok(c) => Ok((c.shared_key().unwrap_or(key), Arc::new(c))),
            Err(why) => Err((key, why)),
        }
    }

    fn describe(&self, key: &ObjectKey) -> String {
        describe(self.0, key)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

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
        let mut w = Writer::new(KindRules(Kind::Pvc));
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
        let mut w = Writer::new(KindRules(Kind::Cache));
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
        let mut w = Writer::new(KindRules(Kind::Pvc));
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
        let mut w = Writer::new(KindRules(Kind::Pvc));
        w.apply(Event::Init, &objects);
        w.apply(Event::InitApply(pvc("a", "ok", "Bound")), &objects);
        w.apply(Event::InitApply(pvc("", "no-namespace", "Bound")), &objects);
        assert_eq!(w.apply(Event::InitDone, &objects), Applied::Listed(1));
        assert_eq!(names(&objects), ["a/ok"]);
    }

    #[test]
    fn a_failed_list_is_dropped_and_the_objects_stay() {
        let objects = Mutex::new(KindObjects::new());
        let mut w = Writer::new(KindRules(Kind::Pvc));
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
