//! docs/policy.md §3: every container runs as a non-root, numeric user.

use super::validate::EphemeralScope;
use super::view::SecurityContextView;
use super::workload::{ContainerList, ContainerRef, Workload};
use super::{Change, Mutation, Rule, Scalar, cache_prep, set_security_fields};
use crate::config::{PREP_CONTAINER, PolicyConfig, PrepMode};
use crate::patch::PatchBuilder;

/// Pod-level `securityContext` fields this rule sets (each `None`/`false` when already right).
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct PodIdentity {
    pub run_as_non_root: bool,
    pub run_as_user: Option<i64>,
    pub run_as_group: Option<i64>,
}

/// Containers this rule governs: all but a prep container that modelgate owns (and replaces).
fn governed<'a>(w: &Workload<'a>, prep_managed: bool) -> impl Iterator<Item = ContainerRef<'a>> {
    w.containers().into_iter().filter(move |c| {
        !(prep_managed && c.list == ContainerList::Init && c.name == PREP_CONTAINER)
    })
}

/// What the pod's own security context must gain.
pub(super) fn pod_identity(w: &Workload, cfg: &PolicyConfig, prep_managed: bool) -> PodIdentity {
    let pod = w.pod_security();
    let run_as_non_root = pod.and_then(|p| p.run_as_non_root) != Some(true);
    if w.is_windows() {
        return PodIdentity {
            run_as_non_root,
            ..Default::default()
        };
    }
    let containers: Vec<_> = governed(w, prep_managed).collect();
    let lacks = |f: fn(&SecurityContextView) -> Option<i64>| {
        containers
            .iter()
            .any(|c| c.security_context.and_then(f).is_none())
    };
    let run_as_user = if pod.and_then(|p| p.run_as_user).is_none() && lacks(|s| s.run_as_user) {
        // Under `never`, nothing fixes the cache's owner: the pod runs as that owner instead.
        if cache_prep::prep_mode(w, cfg) == PrepMode::Never
            && cache_prep::has_writable_cache(w, cfg)
        {
            Some(cfg.init_container_user)
        } else {
            cfg.run_as_user.value()
        }
    } else {
        None
    };
    let run_as_group = if pod.and_then(|p| p.run_as_group).is_none() && lacks(|s| s.run_as_group) {
        cfg.run_as_group.value()
    } else {
        None
    };
    PodIdentity {
        run_as_non_root,
        run_as_user,
        run_as_group,
    }
}

fn run_as_non_root_changed(name: &str) -> String {
    format!("container {name}: runAsNonRoot false changed to true")
}

/// A container that says `runAsNonRoot: false` is switched to `true`, with a warning.
pub(super) fn container_fixes(
    w: &Workload,
    prep_managed: bool,
    patch: &mut PatchBuilder,
    changes: &mut Vec<Change>,
) {
    for c in governed(w, prep_managed) {
        if c.security_context.and_then(|s| s.run_as_non_root) == Some(false)
            && !w.non_root_waived(&c)
        {
            let path = c.path(w).keys(["securityContext", "runAsNonRoot"]);
            patch.replace(&path, true);
            changes.push(
                Change::set(Rule::NonRoot, path, Scalar::Bool(true))
                    .warned(run_as_non_root_changed(c.name)),
            );
        }
    }
}

/// An ephemeral container added to a running pod cannot change the pod's security context, so
/// it gets its own: non-root always, and a uid/gid where neither it nor the pod has one. Only
/// the containers `scope` judges are patched: the stored pod's own are left as they are (the
/// API server refuses an update that changes them).
pub(super) fn ephemeral_fixes(
    w: &Workload,
    cfg: &PolicyConfig,
    scope: EphemeralScope,
    m: &mut Mutation,
) {
    let pod = w.pod_security();
    for c in w
        .containers()
        .into_iter()
        .filter(|c| c.list == ContainerList::Ephemeral && scope.judges(c))
    {
        // An exception's container keeps its own security context (docs/exceptions.md).
        if w.non_root_waived(&c) {
            continue;
        }
        let sc = c.security_context;
        let mut fields = Vec::new();
        let first_change = m.changes.len();
        let mut warning = None;
        match sc.and_then(|s| s.run_as_non_root) {
            Some(true) => {}
            Some(false) => {
                fields.push(("runAsNonRoot", Scalar::Bool(true), Rule::NonRoot));
                warning = Some(run_as_non_root_changed(c.name));
            }
            None if pod.and_then(|p| p.run_as_non_root) != Some(true) => {
                fields.push(("runAsNonRoot", Scalar::Bool(true), Rule::NonRoot));
            }
            None => {}
        }
        if !w.is_windows() {
            if sc.and_then(|s| s.run_as_user).is_none()
                && pod.and_then(|p| p.run_as_user).is_none()
                && let Some(uid) = cfg.run_as_user.value()
            {
                fields.push(("runAsUser", Scalar::Int(uid), Rule::NonRoot));
            }
            if sc.and_then(|s| s.run_as_group).is_none()
                && pod.and_then(|p| p.run_as_group).is_none()
                && let Some(gid) = cfg.run_as_group.value()
            {
                fields.push(("runAsGroup", Scalar::Int(gid), Rule::NonRoot));
            }
        }
        set_security_fields(m, &c.path(w).key("securityContext"), sc.is_some(), fields);
        if let Some(w) = warning {
            m.changes[first_change].applied_warning = Some(w);
        }
    }
}
