//! Rollout modes (docs/policy.md §9): the one place where the policy's verdict becomes the answer of
//! the namespace's mode.
//!
//! | mode | `/mutate` | `/validate` |
//! |---|---|---|
//! | `enforce` | the patch, or the denial | the denial |
//! | `warn` | allowed, no patch; `would …` warnings | allowed; `would deny: …` warnings |
//! | `audit` | allowed, no patch, no warning; audit annotations | allowed; audit annotation |
//! | `off` | allowed untouched | allowed |
//!
//! The audit annotation keys are `would-patch` and `would-deny`: the API server records each
//! under `<webhook name>/<key>` (`mutate.modelgate.io/would-patch`) and drops any key that
//! would then hold a second `/`.

use super::{Decision, MAX_WARNING_LEN};
use crate::namespaces::{Mode, NamespaceMode};
use crate::patch::Patch;
use crate::policy::view::DecodeFailure;
use crate::policy::{self, Denial, Mutation, Rule, listed};

pub(crate) use crate::patch::MAX_PATCH_BYTES;

/// The denial of a pod whose patch passed [`MAX_PATCH_BYTES`] (and stopped being built there),
/// naming `field` (the pod's spec, or a template's): `None` when the patch fits.
pub(super) fn patch_too_large(patch: &Patch, field: &str) -> Option<Denial> {
    patch.is_truncated().then(|| {
        Denial::single(
            Rule::Schema,
            field,
            format!(
                "the pod is too large for the changes modelgate must make: their patch is over \
                 {MAX_PATCH_BYTES} bytes (it was not built further), past what an object the API \
                 server stores can take"
            ),
            "Split the workload into smaller pods (fewer containers or node affinity terms), or \
             set what modelgate would set (runAsNonRoot, runAsUser) yourself.",
        )
    })
}

/// The denial of a pod (or template) whose lists hold more elements than an object the API
/// server stores can, named at `field` (the list where the decode stopped: `view::metered`),
/// with the failure's account of the bound (its `message`). Such an object is refused by etcd
/// whatever the webhook says; its views were never built past the bound.
pub(super) fn too_large(field: &str, failure: &DecodeFailure) -> Denial {
    Denial::single(
        Rule::Schema,
        policy::shorten_uri(field, MAX_WARNING_LEN).into_owned(),
        failure.message.clone(),
        "Split the workload into smaller pods (fewer containers, volumes, mounts or node \
         affinity terms).",
    )
}

/// Audit annotation: what the mutation would change, `; `-separated.
pub(super) const WOULD_PATCH: &str = "would-patch";
/// Audit annotation: the denial the request would get.
pub(super) const WOULD_DENY: &str = "would-deny";

/// What the policy did with one request, as `modelgate_policy_results_total` counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PolicyResult {
    Patched,
    Denied,
    Unchanged,
    WouldPatch,
    WouldDeny,
}

impl PolicyResult {
    pub const ALL: [PolicyResult; 5] = [
        PolicyResult::Patched,
        PolicyResult::Denied,
        PolicyResult::Unchanged,
        PolicyResult::WouldPatch,
        PolicyResult::WouldDeny,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            PolicyResult::Patched => "patched",
            PolicyResult::Denied => "denied",
            PolicyResult::Unchanged => "unchanged",
            PolicyResult::WouldPatch => "would_patch",
            PolicyResult::WouldDeny => "would_deny",
        }
    }
}

/// The policy's verdict on one request: the mutation (empty for the validating webhook when
/// it allows), or the denial.
pub(super) type Verdict = Result<Mutation, Denial>;

/// The warning a dry-run mode gives for one violation of a denial.
fn would_deny(denial: &Denial) -> impl Iterator<Item = String> + '_ {
    denial
        .violations
        .iter()
        .map(|v| format!("would deny: {}: {}", v.field, v.problem))
}

/// `off`: allowed untouched, the policy not even consulted.
pub(super) fn off() -> Decision {
    Decision {
        allowed: true,
        mode: Some(Mode::Off),
        result: Some(PolicyResult::Unchanged),
        ..Default::default()
    }
}

/// Shapes the verdict into the answer of `ns.mode` (`off` is [`off`]).
pub(super) fn answer(ns: NamespaceMode, verdict: Verdict) -> Decision {
    let mut d = Decision {
        allowed: true,
        mode: Some(ns.mode),
        ..Default::default()
    };
    d.warnings.extend(ns.label_warning);
    let model_cache = verdict.as_ref().ok().and_then(|m| m.model_cache);
    match (ns.mode, verdict) {
        (Mode::Off, _) => return off(),
        (Mode::Enforce, Ok(mut m)) => {
            // The warnings move to the answer; the changes stay on the decision, for reports
            // that count by rule (`audit`). Nothing is copied.
            d.warnings.extend(
                m.changes
                    .iter_mut()
                    .filter_map(|c| c.applied_warning.take()),
            );
            d.warnings.extend(m.notes);
            d.result = Some(if m.patch.is_empty() {
                PolicyResult::Unchanged
            } else {
                PolicyResult::Patched
            });
            let patch = (!m.patch.is_empty()).then(|| m.patch.into_patch());
            if let Some(denial) = patch.as_ref().and_then(|p| patch_too_large(p, "spec")) {
                return Decision {
                    warnings: d.warnings,
                    mode: d.mode,
                    result: Some(PolicyResult::Denied),
                    ..Decision::deny(&denial)
                };
            }
            d.patch = patch;
            d.changes = m.changes;
        }
        (Mode::Enforce, Err(denial)) => {
            d = Decision {
                warnings: d.warnings,
                mode: d.mode,
                result: Some(PolicyResult::Denied),
                ..Decision::deny(&denial)
            };
        }
        (Mode::Warn, Ok(m)) => {
            d.warnings.extend(m.changes.iter().map(|c| c.would()));
            d.warnings.extend(m.notes);
            d.result = Some(would_patch_or_unchanged(&m.changes));
        }
        (Mode::Warn, Err(denial)) => {
            d.warnings.extend(would_deny(&denial));
            d.result = Some(PolicyResult::WouldDeny);
        }
        (Mode::Audit, Ok(m)) => {
            if !m.changes.is_empty() {
                let facts = listed(m.changes.iter().map(|c| c.description()), "; ");
                d.audit_annotations.insert(WOULD_PATCH, facts);
            }
            d.result = Some(would_patch_or_unchanged(&m.changes));
        }
        (Mode::Audit, Err(denial)) => {
            d.audit_annotations.insert(WOULD_DENY, denial.to_string());
            d.result = Some(PolicyResult::WouldDeny);
        }
    }
    d.model_cache = model_cache;
    d
}

fn would_patch_or_unchanged(changes: &[crate::policy::Change]) -> PolicyResult {
    if changes.is_empty() {
        PolicyResult::Unchanged
    } else {
        PolicyResult::WouldPatch
    }
}
