//! Which workloads depend on which `ModelgateException` (docs/exceptions.md, "Who uses which"):
//! every exception the audit's cluster state holds, with what its status would say now, and the
//! workloads it waived a rule for — the list to read before an exception expires.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::cache::CacheIndex;
use crate::namespaces::Namespaces;

/// The workloads listed by name per exception; past it they are only counted.
pub const MAX_LISTED: usize = 50;

/// One exception: whether it is in force, and the workloads it waived a rule for.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ExceptionEntry {
    pub namespace: String,
    pub name: String,
    /// As its `status` would say now: `None` for an exception a workload names that the
    /// cluster state does not hold (never, when the results come from the same state).
    #[serde(rename = "inForce")]
    pub in_force: Option<bool>,
    pub reason: String,
    /// How many workloads it waived a rule for.
    pub workloads: usize,
    /// The first [`MAX_LISTED`] of them, as `Kind namespace/name`.
    pub listed: Vec<String>,
}

/// The exceptions of a run, by namespace and name (a list in JSON, in that order).
#[derive(Clone, Debug, Default)]
pub struct ExceptionUses(BTreeMap<(String, String), ExceptionEntry>);

impl Serialize for ExceptionUses {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.values())
    }
}

impl ExceptionUses {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn entries(&self) -> impl Iterator<Item = &ExceptionEntry> {
        self.0.values()
    }

    /// A workload of `namespace` that the exceptions `names` (comma-separated, as the results'
    /// `exception` property says) waived a rule for; each exception counts it once.
    pub fn add(&mut self, namespace: &str, names: &[&str], workload: impl Fn() -> String) {
        for name in names {
            let entry = self
                .0
                .entry((namespace.to_string(), name.to_string()))
                .or_insert_with(|| ExceptionEntry {
                    namespace: namespace.to_string(),
                    name: name.to_string(),
                    ..ExceptionEntry::default()
                });
            entry.workloads += 1;
            if entry.listed.len() < MAX_LISTED {
                entry.listed.push(workload());
            }
        }
    }

    /// Every exception `index` holds, with its status at `now`: those no workload used too
    /// (expired, in a closed namespace, or simply unused).
    pub fn describe(
        &mut self,
        index: &CacheIndex,
        namespaces: &Namespaces,
        now: i64,
        max_days: u32,
    ) {
        for e in index.exceptions() {
            let status = e.status_at(namespaces.exceptions_open(&e.namespace), now, max_days);
            let entry = self
                .0
                .entry((e.namespace.to_string(), e.name.to_string()))
                .or_insert_with(|| ExceptionEntry {
                    namespace: e.namespace.to_string(),
                    name: e.name.to_string(),
                    ..ExceptionEntry::default()
                });
            entry.in_force = Some(status.in_force);
            entry.reason = status.reason.into();
        }
    }

    /// The table's section: one line per exception, then its workloads.
    pub fn table(&self) -> String {
        let mut out = format!("\nEXCEPTIONS ({}):\n", self.0.len());
        for e in self.0.values() {
            let status = match e.in_force {
                Some(_) => e.reason.as_str(),
                None => "not in the cluster state read",
            };
            out.push_str(&format!(
                "{}/{}: {status}; waives a rule for {} workload{}\n",
                e.namespace,
                e.name,
                e.workloads,
                if e.workloads == 1 { "" } else { "s" }
            ));
            for w in &e.listed {
                out.push_str(&format!("  {w}\n"));
            }
            if e.workloads > e.listed.len() {
                out.push_str(&format!("  … and {} more\n", e.workloads - e.listed.len()));
            }
        }
        out
    }
}
