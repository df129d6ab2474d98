//! Containers that can reach uid 0 whatever uid they run as: the `root-equivalent` rule.
//!
//! A container with `securityContext.privileged: true` has every capability and the node's
//! devices; the uid it runs as no longer bounds what it can do. Refusing it is Pod Security
//! `baseline`'s job (and `restricted`'s), which a namespace enforces with one label, not
//! modelgate's: modelgate's rules are about which uid a container runs as. So modelgate never
//! denies it; it says so where the user will hear it.
//!
//! Contract:
//! - `/validate` warns once per container with `privileged: true` (init, regular and ephemeral
//!   alike; no name is exempt, and the canonical prep is never privileged), naming the field by
//!   its path in the object (`spec.template.spec.containers[1].securityContext.privileged` in a
//!   Job). On a `pods/ephemeralcontainers` update only the ephemeral containers that update
//!   judges are looked at (the ones it adds, when `oldObject` tells them apart): the others
//!   cannot change and were looked at when they were admitted.
//! - `/mutate` does not warn of it: the API server shows the user the warnings of both webhooks
//!   of one `kubectl apply`, and only `/validate` sees the pod as it will be stored (after every
//!   mutating webhook, one that adds a privileged container included).
//! - It is a warning in `enforce` and `warn` mode; `audit` mode stays silent, as it is for
//!   everything; `audit` (the command) reports it as the rule's `warn`.
//! - At most [`MAX_LISTED`] findings are kept, the rest only counted: a pod of a hundred
//!   thousand privileged containers costs one pass and twenty strings.
//! - A container that keeps `allowPrivilegeEscalation` (true, or unset) in an image with setuid
//!   binaries can reach uid 0 too; which binaries an image holds is not in the pod, so that one is
//!   Pod Security `restricted`'s alone, and the docs say so.

use super::EphemeralScope;
use super::view::ContainerView;
use super::workload::Workload;
use super::{MAX_LISTED, Rule, Violation};

/// What a privileged container is told, after its field and `: `.
const PROBLEM: &str = "true: a privileged container can act as root on the node whatever its \
     runAsUser (modelgate does not deny it; Pod Security baseline does)";

/// What to do about it, in reports.
const ADVICE: &str = "Drop privileged: true and add only the capabilities the container needs, \
     or enforce Pod Security baseline in the namespace, which refuses privileged containers.";

/// What a rule that only warns found in one object: the first [`MAX_LISTED`] findings, each
/// naming its field and rule, in the order of the pod's containers, and how many more there were.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Findings {
    pub listed: Vec<Violation>,
    pub more: usize,
}

impl Findings {
    pub fn is_empty(&self) -> bool {
        self.listed.is_empty()
    }

    /// The answer's warnings: one per listed finding (`<field>: <problem>`), then one that
    /// counts the rest.
    pub fn warnings(&self) -> impl Iterator<Item = String> + '_ {
        let more = (self.more > 0).then(|| {
            format!(
                "… and {} more containers with securityContext.privileged: true",
                self.more
            )
        });
        self.listed.iter().map(ToString::to_string).chain(more)
    }

    /// One message for a report: every listed finding with its field put in the report's terms
    /// by `field`, how many more there were, then the advice of each kind of finding once.
    pub fn message(&self, field: impl Fn(&str) -> String) -> String {
        let mut out: Vec<String> = self
            .listed
            .iter()
            .map(|v| format!("{}: {}", field(&v.field), v.problem))
            .collect();
        if self.more > 0 {
            out.push(format!("… and {} more", self.more));
        }
        let mut advice: Vec<&str> = Vec::new();
        for v in &self.listed {
            if !advice.contains(&v.advice) {
                advice.push(v.advice);
            }
        }
        format!("{}. {}", out.join("; "), advice.join(" "))
    }
}

/// The privileged containers of the pod; on an ephemeral-container update (`ephemeral`), only
/// the ephemeral containers its scope judges.
pub(crate) fn check(w: &Workload, ephemeral: Option<EphemeralScope>) -> Findings {
    let mut found = Findings::default();
    let s = w.spec;
    if ephemeral.is_none() {
        let init = s.init_containers().iter().map(|c| &c.container);
        scan(&mut found, w, "initContainers", init.enumerate());
        scan(
            &mut found,
            w,
            "containers",
            s.containers().iter().enumerate(),
        );
    }
    let judged = |(_, c): &(usize, &ContainerView)| {
        ephemeral.is_none_or(|scope| scope.judges_ephemeral(c.name()))
    };
    scan(
        &mut found,
        w,
        "ephemeralContainers",
        s.ephemeral_containers().iter().enumerate().filter(judged),
    );
    found
}

fn scan<'c, 'a: 'c>(
    found: &mut Findings,
    w: &Workload,
    list: &'static str,
    containers: impl Iterator<Item = (usize, &'c ContainerView<'a>)>,
) {
    for (i, c) in containers {
        if c.security_context.as_ref().and_then(|sc| sc.privileged) != Some(true) {
            continue;
        }
        if found.listed.len() == MAX_LISTED {
            found.more += 1;
            continue;
        }
        let field = w
            .spec_path
            .key(list)
            .index(i)
            .keys(["securityContext", "privileged"]);
        found.listed.push(Violation {
            rule: Rule::RootEquivalent,
            field: field.to_string(),
            problem: PROBLEM.into(),
            advice: ADVICE,
        });
    }
}

#[cfg(test)]
mod tests;
