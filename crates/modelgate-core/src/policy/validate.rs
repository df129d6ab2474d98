//! docs/policy.md §6: what is denied, and a message that names every offending field.

use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt;

use super::view::{self, SecurityContextView};
use super::workload::{ContainerList, ContainerRef, Workload};
use super::{Rule, cache_prep};
use crate::config::{MAX_ID, PREP_CONTAINER, PolicyConfig};
use crate::patch::FieldPath;

/// One offending field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub rule: Rule,
    pub field: String,
    pub problem: String,
    pub advice: &'static str,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.problem)
    }
}

/// A denial: every violation, then what to do about them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Denial {
    pub violations: Vec<Violation>,
}

impl Denial {
    pub fn single(
        rule: Rule,
        field: impl Into<String>,
        problem: impl Into<String>,
        advice: &'static str,
    ) -> Self {
        Denial {
            violations: vec![Violation {
                rule,
                field: field.into(),
                problem: problem.into(),
                advice,
            }],
        }
    }
}

/// The message: the first [`MAX_LISTED`](super::MAX_LISTED) violations, how many more there
/// are, then the advice of every violation, each piece once (there are a handful).
impl fmt::Display for Denial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        super::write_listed(f, self.violations.iter(), "; ")?;
        let mut advice: Vec<&str> = Vec::new();
        for v in &self.violations {
            if !advice.contains(&v.advice) {
                advice.push(v.advice);
            }
        }
        write!(f, ". {}", advice.join(" "))
    }
}

const UID_ADVICE: &str =
    "Use a uid in 1..2147483647, or leave runAsUser unset and modelgate sets one.";
const GID_ADVICE: &str = "Use a gid in 0..2147483647, or leave it unset.";
const NONROOT_ADVICE: &str =
    "Remove runAsNonRoot: false; only modelgate's own model-cache-prep may run as root.";
const NONROOT_UNSET_ADVICE: &str = "Set runAsNonRoot: true on the pod or the container \
     (modelgate's mutating webhook sets it on the pod: check that it is registered for this namespace).";
const PREP_ADVICE: &str =
    "Remove the model-cache-prep container and let modelgate inject it, or rename your container.";

/// Which checks to run: the mutating endpoint checks only the ranges (it repairs the rest before
/// the validating endpoint sees the pod); the validating endpoint checks everything.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Checks {
    RangesOnly,
    All,
    /// A partial template (docs/policy.md §12): only what its fields say — the ranges, and a
    /// `runAsNonRoot: false` it writes. What it leaves out is filled in elsewhere.
    Present,
    /// An `ephemeralcontainers` update: everything, but the effective `runAsNonRoot` only of
    /// the ephemeral containers. The others are immutable and already run (a pod created before
    /// modelgate may have none): refusing the update would protect nothing and only stop
    /// `kubectl debug`, and `/mutate` cannot change them on this subresource either. Which
    /// containers are judged at all is the [`EphemeralScope`].
    EphemeralUpdate,
}

/// The ephemeral containers the stored pod already has: the names in `oldObject` of a
/// `pods/ephemeralcontainers` update.
///
/// The API server keeps them as stored on that subresource (it refuses an update that removes
/// or changes one, and takes the rest of the spec from the stored pod), but not necessarily in
/// their order: a new container may come before them. So a container is told new by its name,
/// never by its index.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct StoredEphemeral<'a> {
    names: HashSet<Cow<'a, str>>,
}

impl<'a> StoredEphemeral<'a> {
    /// The ephemeral containers of `old_object` (a Pod's JSON text), decoded as the object is,
    /// within the bound of one object (`view::decode_pod`): `None` when it does not decode as a
    /// Pod within it. The API server never sends such an old object; the caller then judges
    /// the whole pod, as without one.
    pub(crate) fn decode(old_object: &'a str) -> Option<Self> {
        let pod = view::decode_pod(old_object).ok()?;
        let names = pod
            .spec
            .and_then(|s| s.ephemeral_containers)
            .unwrap_or_default()
            .into_iter()
            .map(|c| c.name.unwrap_or_default().0)
            .collect();
        Some(StoredEphemeral { names })
    }

    fn has(&self, name: &str) -> bool {
        self.names.contains(name)
    }
}

/// Which containers of a `pods/ephemeralcontainers` update are judged (and mutated).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EphemeralScope<'s> {
    /// No `oldObject` to tell the new ephemeral containers from the others: the whole pod, as
    /// a create (every ephemeral container, every range, the prep).
    WholePod,
    /// Only the ephemeral containers the stored pod does not have. The rest of the pod was
    /// judged (or not) when it was admitted and cannot change on this subresource: judging it
    /// again would only stop `kubectl debug` on a pod admitted under an earlier policy, prep or
    /// exception, and would protect nothing. The pod's `runAsNonRoot` is still read, as the
    /// fallback of a new container's own.
    NewOnly(&'s StoredEphemeral<'s>),
}

impl EphemeralScope<'_> {
    /// Whether container `c` is judged.
    pub(crate) fn judges(&self, c: &ContainerRef) -> bool {
        match self {
            EphemeralScope::WholePod => true,
            EphemeralScope::NewOnly(stored) => {
                c.list == ContainerList::Ephemeral && !stored.has(c.name)
            }
        }
    }

    /// Whether the ephemeral container named `name` is judged.
    pub(crate) fn judges_ephemeral(&self, name: &str) -> bool {
        match self {
            EphemeralScope::WholePod => true,
            EphemeralScope::NewOnly(stored) => !stored.has(name),
        }
    }

    /// Whether the whole pod is judged: the pod-level ranges and the prep too.
    fn is_whole_pod(&self) -> bool {
        *self == EphemeralScope::WholePod
    }
}

/// Checks one id; the object's `sc` (a security context's path, built only for a violation) and
/// the field's name make the violation's path.
fn check_range(
    out: &mut Vec<Violation>,
    (sc, field): (&dyn Fn() -> FieldPath, &'static str),
    value: Option<i64>,
    min: i64,
    advice: &'static str,
) {
    if let Some(v) = value
        && !(min..=MAX_ID).contains(&v)
    {
        out.push(Violation {
            rule: Rule::NonRoot,
            field: sc().key(field).to_string(),
            problem: format!("{v} is outside {min}..{MAX_ID}"),
            advice,
        });
    }
}

/// The invariant `/validate` holds by itself (docs/policy.md §6): a container's effective
/// `runAsNonRoot` (its own, else the pod's) is `true`. `sc` is the container's security
/// context's path; the violation names the container's own field, where the fix goes.
fn check_non_root(
    out: &mut Vec<Violation>,
    sc: &dyn Fn() -> FieldPath,
    container: Option<&SecurityContextView>,
    pod: Option<bool>,
) {
    let problem = match (container.and_then(|s| s.run_as_non_root), pod) {
        (Some(true), _) | (None, Some(true)) => return,
        (Some(false), _) => {
            out.push(Violation {
                rule: Rule::NonRoot,
                field: sc().key("runAsNonRoot").to_string(),
                problem: "false is not allowed".into(),
                advice: NONROOT_ADVICE,
            });
            return;
        }
        (None, Some(false)) => "not set, and the pod's spec.securityContext.runAsNonRoot is false",
        (None, None) => "not set (neither the container nor the pod sets it to true)",
    };
    out.push(Violation {
        rule: Rule::NonRoot,
        field: sc().key("runAsNonRoot").to_string(),
        problem: problem.into(),
        advice: NONROOT_UNSET_ADVICE,
    });
}

pub(super) fn validate(w: &Workload, cfg: &PolicyConfig, checks: Checks) -> Result<(), Denial> {
    validate_in(w, cfg, checks, EphemeralScope::WholePod)
}

/// [`validate`] of the containers `scope` judges.
pub(super) fn validate_in(
    w: &Workload,
    cfg: &PolicyConfig,
    checks: Checks,
    scope: EphemeralScope,
) -> Result<(), Denial> {
    let mut out = Vec::new();
    let pod_sc = || w.spec_path.key("securityContext");
    if let Some(sc) = w.pod_security().filter(|_| scope.is_whole_pod()) {
        check_range(
            &mut out,
            (&pod_sc, "runAsUser"),
            sc.run_as_user,
            1,
            UID_ADVICE,
        );
        check_range(
            &mut out,
            (&pod_sc, "runAsGroup"),
            sc.run_as_group,
            0,
            GID_ADVICE,
        );
        check_range(&mut out, (&pod_sc, "fsGroup"), sc.fs_group, 0, GID_ADVICE);
        if checks == Checks::Present && sc.run_as_non_root == Some(false) {
            out.push(Violation {
                rule: Rule::NonRoot,
                field: pod_sc().key("runAsNonRoot").to_string(),
                problem: "false is not allowed".into(),
                advice: NONROOT_ADVICE,
            });
        }
    }

    let managed = cache_prep::is_managed(w, cfg);
    let pod_non_root = w.pod_security().and_then(|p| p.run_as_non_root);
    // The one init container that may be the canonical prep: the first of that name, judged
    // once against the canonical container for this pod, when modelgate manages one (a second
    // container of that name is a second root container, never canonical).
    // Not looked for when no init container is judged.
    let canonical_prep = (matches!(checks, Checks::All | Checks::EphemeralUpdate)
        && managed
        && scope.is_whole_pod())
    .then(|| {
        let i = w
            .spec
            .init_containers()
            .iter()
            .position(|c| c.container.name() == PREP_CONTAINER)?;
        let command = cache_prep::canonical_command(cfg, w.pod_run_as_user(), w.pod_fs_group());
        let volume = cache_prep::cache_volume_name(w, cfg);
        let canonical = cache_prep::canonical(cfg, volume, &command);
        cache_prep::is_canonical_at(w, i, &canonical).then_some(i)
    })
    .flatten();
    for c in w.containers().into_iter().filter(|c| scope.judges(c)) {
        let is_prep = c.name == PREP_CONTAINER;
        if is_prep {
            match checks {
                // The mutation replaces a prep container it owns; it is judged after that.
                Checks::RangesOnly if managed && c.list == ContainerList::Init => continue,
                Checks::RangesOnly | Checks::Present => {}
                Checks::All | Checks::EphemeralUpdate => {
                    if c.list == ContainerList::Init && canonical_prep == Some(c.index) {
                        continue;
                    }
                    out.push(Violation {
                        rule: Rule::CachePrep,
                        field: c.path(w).to_string(),
                        problem: "a container named model-cache-prep that is not modelgate's canonical one for this pod"
                            .into(),
                        advice: PREP_ADVICE,
                    });
                }
            }
        }
        let sc_path = || c.path(w).key("securityContext");
        // An exception's `non-root` lets its containers run as uid 0 and without
        // runAsNonRoot (docs/exceptions.md); the other ranges still hold.
        let waived = w.non_root_waived(&c);
        if let Some(sc) = c.security_context {
            check_range(
                &mut out,
                (&sc_path, "runAsUser"),
                sc.run_as_user,
                if waived { 0 } else { 1 },
                UID_ADVICE,
            );
            check_range(
                &mut out,
                (&sc_path, "runAsGroup"),
                sc.run_as_group,
                0,
                GID_ADVICE,
            );
        }
        let judged = match checks {
            Checks::RangesOnly => false,
            Checks::All => true,
            Checks::EphemeralUpdate => c.list == ContainerList::Ephemeral,
            Checks::Present => {
                if c.security_context.and_then(|s| s.run_as_non_root) == Some(false) && !waived {
                    out.push(Violation {
                        rule: Rule::NonRoot,
                        field: sc_path().key("runAsNonRoot").to_string(),
                        problem: "false is not allowed".into(),
                        advice: NONROOT_ADVICE,
                    });
                }
                false
            }
        };
        if judged && !waived {
            check_non_root(&mut out, &sc_path, c.security_context, pod_non_root);
        }
    }
    if out.is_empty() {
        Ok(())
    } else {
        Err(Denial { violations: out })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn denial(n: usize) -> Denial {
        Denial {
            violations: (0..n)
                .map(|i| Violation {
                    rule: Rule::NonRoot,
                    field: format!("spec.containers[{i}].securityContext.runAsUser"),
                    problem: "0 is outside 1..2147483647".into(),
                    advice: if i % 2 == 0 { UID_ADVICE } else { GID_ADVICE },
                })
                .collect(),
        }
    }

    #[test]
    fn a_message_names_twenty_violations_then_counts_the_rest_and_keeps_every_advice() {
        let twenty = denial(20).to_string();
        assert_eq!(twenty.matches("is outside").count(), 20);
        assert!(!twenty.contains("more"), "{twenty}");
        assert!(
            twenty.ends_with(&format!(". {UID_ADVICE} {GID_ADVICE}")),
            "{twenty}"
        );

        let many = denial(45_000).to_string();
        assert_eq!(many.matches("is outside").count(), 20);
        assert!(
            many.contains("spec.containers[19].securityContext.runAsUser: 0 is outside 1..2147483647; … and 44980 more. "),
            "{many}"
        );
        assert!(
            many.ends_with(&format!(". {UID_ADVICE} {GID_ADVICE}")),
            "{many}"
        );
        assert!(many.len() < 4096);

        let one = denial(1).to_string();
        assert_eq!(
            one,
            format!(
                "spec.containers[0].securityContext.runAsUser: 0 is outside 1..2147483647. {UID_ADVICE}"
            )
        );
    }
}
