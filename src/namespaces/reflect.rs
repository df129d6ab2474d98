//! The Namespaces' half of the event rules ([`crate::reflector`]): a namespace is kept as the
//! two labels admission reads, under its name, and forgotten when it carries neither.
//! [`super::watch`] runs the watch with them; the rules are tested here without an API server.

use k8s_openapi::api::core::v1::Namespace;
use kube::core::PartialObjectMeta;

use super::{NamespaceLabels, Namespaces};
use crate::reflector::{Objects, Rules};

impl Objects for Namespaces {
    type Key = String;
    /// `None`: the namespace carries neither label, so it is not kept (`--default-mode`).
    type Value = Option<NamespaceLabels>;

    fn insert(&mut self, name: String, labels: Option<NamespaceLabels>) {
        self.set(&name, labels);
    }

    fn remove(&mut self, name: &String) -> bool {
        let kept = self.get(name).is_some();
        Namespaces::remove(self, name);
        kept
    }

    fn len(&self) -> usize {
        Namespaces::len(self)
    }

    fn holds(&self, name: &String, labels: &Option<NamespaceLabels>) -> bool {
        self.get(name) == labels.as_ref()
    }

    fn replace(&mut self, listed: Self) -> Vec<String> {
        let old = std::mem::replace(self, listed);
        let mut changed: Vec<String> = old
            .names()
            .filter(|n| self.get(n).is_none())
            .map(str::to_string)
            .collect();
        changed.extend(
            self.names()
                .filter(|n| old.get(n) != self.get(n))
                .map(str::to_string),
        );
        changed
    }
}

/// The rules of the Namespace metadata watch. Every namespace converts: its labels are all
/// that is read, and any labels are usable.
pub(crate) struct NamespaceRules;

impl Rules for NamespaceRules {
    type Object = PartialObjectMeta<Namespace>;
    type Objects = Namespaces;

    fn key(&self, ns: &PartialObjectMeta<Namespace>) -> String {
        ns.metadata.name.clone().unwrap_or_default()
    }

    fn convert(
        &self,
        ns: PartialObjectMeta<Namespace>,
    ) -> Result<(String, Option<NamespaceLabels>), (String, String)> {
        let labels = NamespaceLabels::from_labels(ns.metadata.labels.iter().flatten());
        Ok((self.key(&ns), labels))
    }

    fn describe(&self, name: &String) -> String {
        format!("Namespace {name}")
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use kube::runtime::watcher::Event;
    use serde_json::json;

    use super::*;
    use crate::namespaces::{Mode, POD_SECURITY_ENFORCE_LABEL};
    use crate::reflector::{Applied, Writer};

    fn namespace(name: &str, labels: serde_json::Value) -> PartialObjectMeta<Namespace> {
        serde_json::from_value(json!({
            "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
            "metadata": {"name": name, "labels": labels},
        }))
        .unwrap()
    }

    fn mode(objects: &Mutex<Namespaces>, name: &str) -> Mode {
        objects.lock().unwrap().mode(name, Mode::Enforce).mode
    }

    #[test]
    fn a_list_replaces_the_labels_only_once_complete() {
        // The files' labels, until the cluster's first list is complete.
        let mut files = Namespaces::default();
        files.insert(
            "from-files".into(),
            Some(NamespaceLabels {
                mode: Some("off".into()),
                pod_security_enforce: None,
                exceptions: None,
            }),
        );
        let objects = Mutex::new(files);
        let mut w = Writer::new(NamespaceRules);
        assert_eq!(w.apply(Event::Init, &objects), Applied::Nothing);
        let listed = [
            namespace("a", json!({"modelgate.io/mode": "warn"})),
            namespace("b", json!({POD_SECURITY_ENFORCE_LABEL: "restricted"})),
            namespace("plain", json!({"team": "x"})),
        ];
        for ns in listed {
            assert_eq!(w.apply(Event::InitApply(ns), &objects), Applied::Nothing);
            assert_eq!(mode(&objects, "from-files"), Mode::Off, "not visible yet");
        }
        // Only the labelled ones are kept (and counted).
        let Applied::Listed { kept, mut changed } = w.apply(Event::InitDone, &objects) else {
            panic!("a list")
        };
        changed.sort();
        assert_eq!(
            (kept, changed),
            (2, vec!["a".into(), "b".into(), "from-files".into()])
        );
        let ns = objects.lock().unwrap().clone();
        assert_eq!(ns.len(), 2);
        assert_eq!(ns.mode("a", Mode::Enforce).mode, Mode::Warn);
        assert!(ns.enforces_restricted("b", crate::config::PodSecurityLevel::Privileged));
        assert_eq!(ns.mode("from-files", Mode::Enforce).mode, Mode::Enforce);
    }

    #[test]
    fn events_add_change_and_forget_labels() {
        let objects = Mutex::new(Namespaces::default());
        let mut w = Writer::new(NamespaceRules);
        let apply = |w: &mut Writer<NamespaceRules>, ns| w.apply(Event::Apply(ns), &objects);
        assert_eq!(
            apply(
                &mut w,
                namespace("a", json!({"modelgate.io/mode": "audit"}))
            ),
            Applied::Changed("a".into())
        );
        assert_eq!(mode(&objects, "a"), Mode::Audit);
        // Other labels changed, the two read did not: nothing to publish.
        assert_eq!(
            apply(
                &mut w,
                namespace("a", json!({"modelgate.io/mode": "audit", "team": "x"}))
            ),
            Applied::Unchanged
        );
        assert_eq!(
            apply(&mut w, namespace("plain", json!({"team": "x"}))),
            Applied::Unchanged
        );
        apply(&mut w, namespace("a", json!({"modelgate.io/mode": "Off"})));
        let a = objects.lock().unwrap().mode("a", Mode::Off);
        assert_eq!(a.mode, Mode::Enforce, "an unknown value enforces");
        assert!(a.label_warning.is_some());
        // The label taken off: the namespace is forgotten, --default-mode applies.
        apply(&mut w, namespace("a", json!({"team": "x"})));
        assert!(objects.lock().unwrap().is_empty());
        apply(&mut w, namespace("b", json!({"modelgate.io/mode": "off"})));
        let deleted = namespace("b", json!({}));
        assert_eq!(
            w.apply(Event::Delete(deleted), &objects),
            Applied::Changed("b".into())
        );
        assert!(objects.lock().unwrap().is_empty());
    }

    #[test]
    fn a_failed_relist_keeps_the_last_labels() {
        let objects = Mutex::new(Namespaces::default());
        let mut w = Writer::new(NamespaceRules);
        w.apply(Event::Init, &objects);
        w.apply(
            Event::InitApply(namespace("kept", json!({"modelgate.io/mode": "warn"}))),
            &objects,
        );
        w.apply(Event::InitDone, &objects);
        w.apply(Event::Init, &objects);
        w.apply(
            Event::InitApply(namespace("partial", json!({"modelgate.io/mode": "off"}))),
            &objects,
        );
        w.reset();
        assert_eq!(mode(&objects, "kept"), Mode::Warn);
        assert_eq!(mode(&objects, "partial"), Mode::Enforce);
        // The watcher starts over from Init; only that list counts.
        w.apply(Event::Init, &objects);
        assert_eq!(
            w.apply(Event::InitDone, &objects),
            Applied::Listed {
                kept: 0,
                changed: vec!["kept".into()]
            }
        );
        assert!(objects.lock().unwrap().is_empty());
    }
}
