//! Each namespace's rollout mode and Pod Security level (docs/policy.md §9). The map and its rules are
//! the core's ([`modelgate_core::namespaces`], re-exported here); this module adds where the
//! labels come from: `--caches` files ([`NamespaceDocuments`]), a one-time list of the cluster
//! ([`list`], `review` and `audit --from-cluster`) and `serve`'s metadata watch ([`watch`]).

pub use modelgate_core::namespaces::*;

pub mod list;
mod reflect;
pub mod watch;

use std::collections::BTreeMap;

use serde_json::Value;

use crate::documents::Document;

/// Adds the `v1` Namespace objects among `docs` (the others are left to other readers) and
/// returns how many there were.
pub fn insert_documents(namespaces: &mut Namespaces, docs: &[Document]) -> anyhow::Result<usize> {
    let mut read = NamespaceDocuments::default();
    let n = read.read(docs)?;
    *namespaces = read.over(std::mem::take(namespaces));
    Ok(n)
}

/// The Namespaces of files (`--caches`), in order. Each replaces a namespace of the same name
/// from elsewhere (the cluster's, in `review` and `audit --from-cluster`) whole: a file
/// Namespace without the labels leaves that namespace unlabelled.
#[derive(Clone, Debug, Default)]
pub struct NamespaceDocuments(Vec<(String, Option<NamespaceLabels>)>);

impl NamespaceDocuments {
    /// Reads the `v1` Namespace objects among `docs` and returns how many there were. One
    /// without a name, or whose labels are not strings, is an error naming its document.
    pub fn read(&mut self, docs: &[Document]) -> anyhow::Result<usize> {
        let mut n = 0;
        for d in docs.iter().filter(|d| is_namespace(&d.value)) {
            let name = d
                .value
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty())
                .ok_or_else(|| anyhow::anyhow!("{}: Namespace has no metadata.name", d.origin))?;
            let labels: BTreeMap<String, String> = match d.value.pointer("/metadata/labels") {
                None | Some(Value::Null) => BTreeMap::new(),
                Some(v) => serde_json::from_value(v.clone()).map_err(|e| {
                    anyhow::anyhow!(
                        "{}: Namespace {name}: metadata.labels must map strings to strings: {e}",
                        d.origin
                    )
                })?,
            };
            self.0
                .push((name.to_string(), NamespaceLabels::from_labels(&labels)));
            n += 1;
        }
        Ok(n)
    }

    /// `base` with these namespaces in place of its own of the same name.
    pub fn over(&self, mut base: Namespaces) -> Namespaces {
        for (name, labels) in &self.0 {
            base.set(name, labels.clone());
        }
        base
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PodSecurityLevel;
    use crate::documents::read_documents;
    use crate::namespaces::{Mode, Namespaces};

    #[test]
    fn mode_from_label_else_default_and_unknown_is_enforce_with_a_warning() {
        let docs = read_documents(
            "ns.yaml",
            "apiVersion: v1\nkind: Namespace\nmetadata: {name: a, labels: {modelgate.io/mode: warn}}\n---\n\
             apiVersion: v1\nkind: Namespace\nmetadata: {name: b, labels: {modelgate.io/mode: Audit}}\n---\n\
             apiVersion: v1\nkind: Namespace\nmetadata: {name: c, labels: {pod-security.kubernetes.io/enforce: restricted}}\n---\n\
             apiVersion: v1\nkind: Namespace\nmetadata: {name: d}\n---\n\
             apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n",
        )
        .unwrap();
        let mut ns = Namespaces::default();
        assert_eq!(insert_documents(&mut ns, &docs).unwrap(), 4);
        assert_eq!(ns.len(), 3, "only labelled namespaces are kept");
        assert_eq!(ns.mode("a", Mode::Audit).mode, Mode::Warn);
        let b = ns.mode("b", Mode::Off);
        assert_eq!(b.mode, Mode::Enforce);
        assert_eq!(
            b.label_warning.as_deref(),
            Some(
                "namespace b: label modelgate.io/mode=\"Audit\" is not one of enforce, warn, \
                 audit, off; enforcing"
            )
        );
        assert_eq!(ns.mode("c", Mode::Audit).mode, Mode::Audit);
        assert_eq!(ns.mode("unknown", Mode::Off).mode, Mode::Off);
        assert!(ns.enforces_restricted("c", PodSecurityLevel::Privileged));
        assert!(
            !ns.enforces_restricted("a", PodSecurityLevel::Privileged)
                && !ns.enforces_restricted("d", PodSecurityLevel::Privileged)
                && ns.enforces_restricted("d", PodSecurityLevel::Restricted)
                && ns.enforces_restricted("a", PodSecurityLevel::Restricted)
        );
    }

    #[test]
    fn bad_namespace_objects_are_named() {
        let docs =
            read_documents("ns.yaml", "apiVersion: v1\nkind: Namespace\nmetadata: {}\n").unwrap();
        let e = insert_documents(&mut Namespaces::default(), &docs).unwrap_err();
        assert!(e.to_string().contains("ns.yaml"), "{e}");
        let docs = read_documents(
            "ns.yaml",
            "apiVersion: v1\nkind: Namespace\nmetadata: {name: a, labels: {x: [1]}}\n",
        )
        .unwrap();
        let e = insert_documents(&mut Namespaces::default(), &docs).unwrap_err();
        assert!(
            e.to_string().contains("Namespace a: metadata.labels"),
            "{e}"
        );
    }

    #[test]
    fn file_namespaces_replace_those_of_the_same_name_whole() {
        let mut cluster = Namespaces::default();
        let labels = |mode: &str| {
            NamespaceLabels::from_labels(&BTreeMap::from([(
                MODE_LABEL.to_string(),
                mode.to_string(),
            )]))
        };
        cluster.set("a", labels("warn"));
        cluster.set("b", labels("audit"));
        cluster.set("c", labels("off"));
        let docs = read_documents(
            "ns.yaml",
            "apiVersion: v1\nkind: Namespace\nmetadata: {name: a, labels: {modelgate.io/mode: 'off'}}\n---\n\
             apiVersion: v1\nkind: Namespace\nmetadata: {name: b}\n",
        )
        .unwrap();
        let mut files = NamespaceDocuments::default();
        assert_eq!(files.read(&docs).unwrap(), 2);
        let ns = files.over(cluster);
        assert_eq!(ns.mode("a", Mode::Enforce).mode, Mode::Off);
        assert_eq!(
            ns.mode("b", Mode::Enforce).mode,
            Mode::Enforce,
            "a file Namespace without the label unlabels it"
        );
        assert_eq!(ns.mode("c", Mode::Enforce).mode, Mode::Off, "untouched");
    }
}
