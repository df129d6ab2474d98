//! `audit -o junit`: a suite per namespace, a case per object, a failure per denial (a rule that
//! only warns is the case's output, never a failure), in the JUnit XML format that `review`
//! writes too ([`crate::junit`]).

use std::collections::BTreeMap;
use std::io::{self, Write};

use crate::audit::Report;
use crate::junit;

impl Report {
    /// The JUnit report: a suite per namespace, a case per object, a failure per denial.
    pub fn junit_suites(&self) -> Vec<junit::Suite> {
        let mut suites: BTreeMap<&str, junit::Suite> = BTreeMap::new();
        for e in self.entries.iter().flatten() {
            let suite = suites
                .entry(e.namespace.as_str())
                .or_insert_with(|| junit::Suite {
                    name: e.namespace.clone(),
                    cases: Vec::new(),
                });
            suite.cases.push(junit::Case {
                classname: e.origin.clone(),
                name: format!("{} {}/{}", e.kind.as_str(), e.namespace, e.name),
                failure: e.message.clone(),
                output: {
                    // The changes enforcing would make, then what a rule that only warns found.
                    let lines: Vec<&str> = e
                        .changes
                        .iter()
                        .chain(&e.warnings)
                        .map(String::as_str)
                        .collect();
                    (!lines.is_empty()).then(|| lines.join("\n"))
                },
            });
        }
        suites.into_values().collect()
    }

    /// Writes the JUnit XML document (the report must keep its entries: [`Report::new`]).
    pub fn write_junit(&self, out: &mut dyn Write) -> io::Result<()> {
        junit::write(out, "modelgate audit", &self.junit_suites())
    }
}
