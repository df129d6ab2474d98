//! The cache kinds' half of the event rules ([`crate::reflector`]): what a watched object of one
//! [`Kind`] becomes (its conversion, under its key). [`super::watch`] runs one watch per kind
//! with them; the rules are tested here without an API server.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};

use kube::api::DynamicObject;

use super::cluster::{Converted, Kind, KindObjects, ObjectKey, convert, describe, object_key};
use crate::reflector::{Objects, Rules};

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

/// The rules of one cache kind: an object is kept as its conversion, under its shared key when
/// it has one; one that does not convert is not kept.
pub(crate) struct KindRules {
    kind: Kind,
    /// The namespace names seen, so that 100 000 PVCs over 100 namespaces hold 100 strings,
    /// not 100 000 copies. Never shrinks: it is as large as the namespaces ever seen.
    namespaces: Mutex<HashSet<Arc<str>>>,
}

impl KindRules {
    pub(crate) fn new(kind: Kind) -> Self {
        KindRules {
            kind,
            namespaces: Mutex::default(),
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
}

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
        match convert(self.kind, object) {
            Ok(mut c) => {
                if let Converted::Pvc { namespace, .. } = &mut c {
                    *namespace = self.shared_namespace(namespace);
                }
                Ok((c.shared_key().unwrap_or(key), Arc::new(c)))
            }
            Err(why) => Err((key, why)),
        }
    }

    fn describe(&self, key: &ObjectKey) -> String {
        describe(self.kind, key)
    }
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
        let mut w = Writer::new(KindRules::new(Kind::Pvc));
        assert_eq!(
            w.apply(Event::Apply(pvc("a", "old", "Bound")), &objects),
            Applied::Changed(key("a", "old"))
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
        let Applied::Listed { kept, mut changed } = w.apply(Event::InitDone, &objects) else {
            panic!("a list")
        };
        changed.sort();
        assert_eq!(kept, 2);
        assert_eq!(changed, [key("a", "old"), key("a", "x"), key("a", "y")]);
        assert_eq!(names(&objects), ["a/x", "a/y"]);
    }

    #[test]
    fn apply_upserts_delete_removes_and_an_unusable_update_removes() {
        let objects = Mutex::new(KindObjects::new());
        let mut w = Writer::new(KindRules::new(Kind::Cache));
        let good = json!({"sourceModelUri": "hf://org/m", "nodeGroups": ["g"]});
        assert_eq!(
            w.apply(Event::Apply(cache("m", good.clone())), &objects),
            Applied::Changed(key("", "m"))
        );
        assert_eq!(
            w.apply(Event::Apply(cache("n", good.clone())), &objects),
            Applied::Changed(key("", "n"))
        );
        assert_eq!(names(&objects), ["/m", "/n"]);
        // An update that no longer converts takes the object out rather than keep the old one.
        let bad = json!({"sourceModelUri": ""});
        assert_eq!(
            w.apply(Event::Apply(cache("m", bad.clone())), &objects),
            Applied::Changed(key("", "m"))
        );
        // Still unusable, and no longer kept: nothing to report.
        assert_eq!(
            w.apply(Event::Apply(cache("m", bad)), &objects),
            Applied::Unchanged
        );
        assert_eq!(names(&objects), ["/n"]);
        assert_eq!(
            w.apply(Event::Delete(cache("n", good.clone())), &objects),
            Applied::Changed(key("", "n"))
        );
        assert_eq!(
            w.apply(Event::Delete(cache("n", good)), &objects),
            Applied::Unchanged
        );
        assert!(names(&objects).is_empty());
    }

    #[test]
    fn an_update_replaces_the_object_of_the_same_key() {
        let objects = Mutex::new(KindObjects::new());
        let mut w = Writer::new(KindRules::new(Kind::Pvc));
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
    fn a_node_heartbeat_or_a_pvc_resize_changes_nothing_and_reports_nothing() {
        let objects = Mutex::new(KindObjects::new());
        let mut w = Writer::new(KindRules::new(Kind::Node));
        let gpu = json!({"node-type": "gpu"});
        assert_eq!(
            w.apply(Event::Apply(node("n1", "1", gpu.clone())), &objects),
            Applied::Changed(key("", "n1"))
        );
        let kept = objects.lock().unwrap()[&key("", "n1")].clone();
        for rv in 2..20 {
            let e = Event::Apply(node("n1", &rv.to_string(), gpu.clone()));
            assert_eq!(w.apply(e, &objects), Applied::Unchanged);
        }
        // What is kept is still the first conversion, shared with the index.
        assert!(Arc::ptr_eq(&kept, &objects.lock().unwrap()[&key("", "n1")]));
        let e = Event::Apply(node("n1", "21", json!({"node-type": "cpu"})));
        assert_eq!(w.apply(e, &objects), Applied::Changed(key("", "n1")));

        let objects = Mutex::new(KindObjects::new());
        let mut w = Writer::new(KindRules::new(Kind::Pvc));
        w.apply(Event::Apply(pvc("a", "c", "Bound")), &objects);
        let mut resized = pvc("a", "c", "Bound");
        resized.data["spec"] = json!({"resources": {"requests": {"storage": "2Gi"}}});
        assert_eq!(w.apply(Event::Apply(resized), &objects), Applied::Unchanged);
    }

    #[test]
    fn pvcs_of_one_namespace_share_its_name() {
        let objects = Mutex::new(KindObjects::new());
        let mut w = Writer::new(KindRules::new(Kind::Pvc));
        w.apply(Event::Apply(pvc("team-a", "x", "Bound")), &objects);
        w.apply(Event::Apply(pvc("team-a", "y", "Bound")), &objects);
        let objects = objects.lock().unwrap();
        let (x, _) = objects.get_key_value(&key("team-a", "x")).unwrap();
        let (y, _) = objects.get_key_value(&key("team-a", "y")).unwrap();
        assert!(Arc::ptr_eq(&x.0, &y.0));
    }

    #[test]
    fn a_relist_keeps_the_objects_it_finds_unchanged() {
        let objects = Mutex::new(KindObjects::new());
        let mut w = Writer::new(KindRules::new(Kind::Pvc));
        w.apply(Event::Apply(pvc("a", "same", "Bound")), &objects);
        w.apply(Event::Apply(pvc("a", "moved", "Pending")), &objects);
        let kept = objects.lock().unwrap().clone();
        w.apply(Event::Init, &objects);
        w.apply(Event::InitApply(pvc("a", "same", "Bound")), &objects);
        w.apply(Event::InitApply(pvc("a", "moved", "Bound")), &objects);
        let listed = w.apply(Event::InitDone, &objects);
        assert_eq!(
            listed,
            Applied::Listed {
                kept: 2,
                changed: vec![key("a", "moved")]
            }
        );
        // The unchanged object is the one kept before, key and value, not a copy.
        let objects = objects.lock().unwrap();
        let (k, v) = objects.get_key_value(&key("a", "same")).unwrap();
        let (old_k, old_v) = kept.get_key_value(&key("a", "same")).unwrap();
        assert!(Arc::ptr_eq(v, old_v) && Arc::ptr_eq(&k.1, &old_k.1));
    }

    #[test]
    fn unusable_objects_of_a_list_are_skipped() {
        let objects = Mutex::new(KindObjects::new());
        let mut w = Writer::new(KindRules::new(Kind::Pvc));
        w.apply(Event::Init, &objects);
        w.apply(Event::InitApply(pvc("a", "ok", "Bound")), &objects);
        w.apply(Event::InitApply(pvc("", "no-namespace", "Bound")), &objects);
        assert!(matches!(
            w.apply(Event::InitDone, &objects),
            Applied::Listed { kept: 1, .. }
        ));
        assert_eq!(names(&objects), ["a/ok"]);
    }

    #[test]
    fn a_failed_list_is_dropped_and_the_objects_stay() {
        let objects = Mutex::new(KindObjects::new());
        let mut w = Writer::new(KindRules::new(Kind::Pvc));
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
        assert!(matches!(
            w.apply(Event::InitDone, &objects),
            Applied::Listed { kept: 1, .. }
        ));
        assert_eq!(names(&objects), ["a/fresh"]);
    }
}
