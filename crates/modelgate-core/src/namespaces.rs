//! Namespaces as admission sees them (docs/policy.md §9): the rollout mode a namespace runs in (label
//! `modelgate.io/mode`, else `--default-mode`) and whether it enforces Pod Security
//! `restricted` (label `pod-security.kubernetes.io/enforce`).
//!
//! `serve` fills a [`NamespaceStore`] from a metadata-only watch of the cluster's Namespaces
//! (the `modelgate` package's `namespaces::watch`); `review` reads Namespace objects from its `--caches` files. Until the first list
//! arrives the store is empty, so `--default-mode` applies everywhere. Only namespaces that
//! carry one of the two labels are kept: memory grows with the labelled ones, not with all.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use crate::config::PodSecurityLevel;
use arc_swap::ArcSwap;
use serde_json::Value;

/// The label that sets a namespace's mode.
pub const MODE_LABEL: &str = "modelgate.io/mode";
/// Pod Security Admission's enforce level.
pub const POD_SECURITY_ENFORCE_LABEL: &str = "pod-security.kubernetes.io/enforce";

/// How modelgate answers for a namespace (the table of docs/policy.md §9).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mode {
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

impl Mode {
    pub const ALL: [Mode; 4] = [Mode::Enforce, Mode::Warn, Mode::Audit, Mode::Off];

    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Enforce => "enforce",
            Mode::Warn => "warn",
            Mode::Audit => "audit",
            Mode::Off => "off",
        }
    }

    /// A label value, exactly as written (labels are case-sensitive, as PSA's are).
    pub(crate) fn from_label(value: &str) -> Option<Mode> {
        Mode::ALL.into_iter().find(|m| m.as_str() == value)
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The two labels of one namespace that admission reads.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NamespaceLabels {
    pub mode: Option<String>,
    pub pod_security_enforce: Option<String>,
    /// `modelgate.io/exceptions` (docs/exceptions.md): `allowed` opens the namespace.
    pub exceptions: Option<String>,
}

impl NamespaceLabels {
    /// The labels that matter, or `None` when the namespace has neither.
    pub fn from_labels<'a>(
        labels: impl IntoIterator<Item = (&'a String, &'a String)>,
    ) -> Option<Self> {
        let mut out = NamespaceLabels::default();
        for (k, v) in labels {
            match k.as_str() {
                MODE_LABEL => out.mode = Some(v.clone()),
                POD_SECURITY_ENFORCE_LABEL => out.pod_security_enforce = Some(v.clone()),
                crate::exceptions::NAMESPACE_LABEL => out.exceptions = Some(v.clone()),
                _ => {}
            }
        }
        (out != NamespaceLabels::default()).then_some(out)
    }
}

/// The mode a namespace runs in, and the warning an unknown label value earns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamespaceMode {
    pub mode: Mode,
    pub label_warning: Option<String>,
}

/// The labelled namespaces, by name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Namespaces {
    by_name: BTreeMap<String, NamespaceLabels>,
}

static NONE: Namespaces = Namespaces {
    by_name: BTreeMap::new(),
};

impl Namespaces {
    /// No namespace labelled: `--default-mode` everywhere, no Pod Security level known.
    pub fn none() -> &'static Namespaces {
        &NONE
    }

    /// Records a namespace's labels (forgets it when it has none that matter).
    pub fn set(&mut self, name: &str, labels: Option<NamespaceLabels>) {
        match labels {
            Some(l) => {
                self.by_name.insert(name.to_string(), l);
            }
            None => {
                self.by_name.remove(name);
            }
        }
    }

    pub fn remove(&mut self, name: &str) {
        self.by_name.remove(name);
    }

    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    /// The labels kept for a namespace (none when it carries neither label).
    pub fn get(&self, name: &str) -> Option<&NamespaceLabels> {
        self.by_name.get(name)
    }

    /// The labelled namespaces' names, in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.by_name.keys().map(String::as_str)
    }

    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    /// The namespace's mode: its label, else `default`. An unknown label value counts as
    /// `enforce`, with a warning that names the namespace and the value.
    pub fn mode(&self, namespace: &str, default: Mode) -> NamespaceMode {
        let label = self.by_name.get(namespace).and_then(|l| l.mode.as_deref());
        match label {
            None => NamespaceMode {
                mode: default,
                label_warning: None,
            },
            Some(value) => match Mode::from_label(value) {
                Some(mode) => NamespaceMode {
                    mode,
                    label_warning: None,
                },
                None => NamespaceMode {
                    mode: Mode::Enforce,
                    label_warning: Some(format!(
                        "namespace {namespace}: label {MODE_LABEL}={value:?} is not one of \
                         enforce, warn, audit, off; enforcing"
                    )),
                },
            },
        }
    }

    /// The same namespaces with their mode labels forgotten: what `--default-mode` everywhere
    /// sees (`audit` evaluates as `enforce`, whatever the namespaces say).
    pub fn without_modes(&self) -> Namespaces {
        let mut out = self.clone();
        for labels in out.by_name.values_mut() {
            labels.mode = None;
        }
        out
    }

    /// Whether the namespace is open for exceptions: labelled `modelgate.io/exceptions:
    /// allowed` (docs/exceptions.md).
    pub fn exceptions_open(&self, namespace: &str) -> bool {
        crate::exceptions::is_open(
            self.by_name
                .get(namespace)
                .and_then(|l| l.exceptions.as_deref()),
        )
    }

    /// Whether the namespace enforces Pod Security `restricted`, which refuses root containers:
    /// by its `pod-security.kubernetes.io/enforce` label, else by `default` (the level the
    /// cluster's PSA configuration gives a namespace without that label).
    pub fn enforces_restricted(&self, namespace: &str, default: PodSecurityLevel) -> bool {
        match self
            .by_name
            .get(namespace)
            .and_then(|l| l.pod_security_enforce.as_deref())
        {
            Some(level) => level == "restricted",
            None => default == PodSecurityLevel::Restricted,
        }
    }
}

/// Whether a document is a core `v1` Namespace.
pub fn is_namespace(value: &Value) -> bool {
    value.get("apiVersion").and_then(Value::as_str) == Some("v1")
        && value.get("kind").and_then(Value::as_str) == Some("Namespace")
}

/// The namespaces as the server shares them: one snapshot, replaced whole by the watch, read
/// by admissions without locking.
#[derive(Debug, Default)]
pub struct NamespaceStore {
    current: ArcSwap<Namespaces>,
}

impl NamespaceStore {
    pub fn new(initial: Namespaces) -> Self {
        NamespaceStore {
            current: ArcSwap::from_pointee(initial),
        }
    }

    pub fn view(&self) -> Arc<Namespaces> {
        self.current.load_full()
    }

    pub fn publish(&self, namespaces: Namespaces) {
        self.current.store(Arc::new(namespaces));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_exact_label_value_opens_a_namespace_for_exceptions() {
        let mut ns = Namespaces::default();
        for (name, value) in [("a", "allowed"), ("b", "Allowed"), ("c", "true")] {
            let labels = BTreeMap::from([(
                crate::exceptions::NAMESPACE_LABEL.to_string(),
                value.to_string(),
            )]);
            ns.set(name, NamespaceLabels::from_labels(&labels));
        }
        assert!(ns.exceptions_open("a"));
        assert!(!ns.exceptions_open("b") && !ns.exceptions_open("c"));
        assert!(!ns.exceptions_open("d"));
        // The label alone keeps a namespace, with the default mode.
        assert_eq!(ns.mode("a", Mode::Warn).mode, Mode::Warn);
    }

    #[test]
    fn a_label_removed_forgets_the_namespace() {
        let mut ns = Namespaces::default();
        let labels = BTreeMap::from([(MODE_LABEL.to_string(), "off".to_string())]);
        ns.set("a", NamespaceLabels::from_labels(&labels));
        assert_eq!(ns.mode("a", Mode::Enforce).mode, Mode::Off);
        ns.set("a", NamespaceLabels::from_labels(&BTreeMap::new()));
        assert!(ns.is_empty());
        assert_eq!(ns.mode("a", Mode::Enforce).mode, Mode::Enforce);
    }
}
