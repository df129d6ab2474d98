//! docs/policy.md §3: every container runs as a non-root, numeric user.

use std::collections::HashMap;

use super::validate::EphemeralScope;
use super::view::SecurityContextView;
use super::workload::{ContainerList, ContainerRef, Workload};
use super::{Change, Mutation, Rule, Scalar, cache_prep, set_security_fields};
use crate::config::{PREP_CONTAINER, PolicyConfig, PrepMode};
use crate::patch::{FieldPath, PatchBuilder};

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
    let own = PodIdentity {
        run_as_non_root: pod.and_then(|p| p.run_as_non_root) == Some(true),
        run_as_user: pod.and_then(|p| p.run_as_user),
        run_as_group: pod.and_then(|p| p.run_as_group),
    };
    identity_given(w, cfg, prep_managed, &own)
}

/// What the pod's security context would gain if it had none of the three fields: what
/// modelgate's MutatingAdmissionPolicy sets where they are absent (docs/policy.md §13, "The MAP").
fn identity_if_unset(w: &Workload, cfg: &PolicyConfig, prep_managed: bool) -> PodIdentity {
    identity_given(w, cfg, prep_managed, &PodIdentity::default())
}

/// [`pod_identity`] for a pod whose own `runAsNonRoot` is `own.run_as_non_root` (whether it is
/// `true`) and whose own ids are `own`'s.
fn identity_given(
    w: &Workload,
    cfg: &PolicyConfig,
    prep_managed: bool,
    own: &PodIdentity,
) -> PodIdentity {
    let run_as_non_root = !own.run_as_non_root;
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
    let run_as_user = if own.run_as_user.is_none() && lacks(|s| s.run_as_user) {
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
    let run_as_group = if own.run_as_group.is_none() && lacks(|s| s.run_as_group) {
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

/// A container that says `runAsNonRoot: false` is switched to `true`, with a warning. One that
/// modelgate's MutatingAdmissionPolicy switched already (`mark`) is reported as switched here,
/// with the same warning, and left as it is.
pub(super) fn container_fixes(
    w: &Workload,
    prep_managed: bool,
    mut mark: Option<&mut SetByPolicy>,
    patch: &mut PatchBuilder,
    changes: &mut Vec<Change>,
) {
    for c in governed(w, prep_managed) {
        let own = c.security_context.and_then(|s| s.run_as_non_root);
        if own.is_none() || w.non_root_waived(&c) {
            continue;
        }
        let already = own == Some(true)
            && mark
                .as_deref_mut()
                .is_some_and(|mark| mark.take(&container_entry(c.list, c.name)));
        if own == Some(false) || already {
            let path = c.path(w).keys(["securityContext", "runAsNonRoot"]);
            if !already {
                patch.replace(&path, true);
            }
            changes.push(
                Change::set(Rule::NonRoot, path, Scalar::Bool(true))
                    .warned(run_as_non_root_changed(c.name)),
            );
        }
    }
}

/// The annotation in which modelgate's MutatingAdmissionPolicy lists the fields it set
/// (docs/policy.md §13, "The MAP"; docs/annotations.md): entries separated by `,`, each one of
/// [`pod_entry`] or [`container_entry`].
pub const SET_BY_POLICY: &str = "modelgate.io/set-by-policy";

/// The three pod-level fields the MAP may set, in the order `/mutate` reports them.
pub(crate) const POD_FIELDS: [&str; 3] = ["runAsNonRoot", "runAsUser", "runAsGroup"];

/// The entry of a pod-level field: `securityContext.runAsUser` (of the pod's spec, a Job's
/// `spec.template.spec`).
pub(crate) fn pod_entry(field: &str) -> String {
    format!("securityContext.{field}")
}

/// The entry of a container's `runAsNonRoot`, by its list and name:
/// `initContainers[setup].securityContext.runAsNonRoot`, `containers[server]…`. Only these two
/// lists: ephemeral containers are not created with the pod.
pub(crate) fn container_entry(list: ContainerList, name: &str) -> String {
    match list {
        ContainerList::Init => format!("initContainers[{name}].securityContext.runAsNonRoot"),
        ContainerList::Regular => format!("containers[{name}].securityContext.runAsNonRoot"),
        // Never written by the MAP: an entry that cannot be one of its.
        ContainerList::Ephemeral => String::new(),
    }
}

/// What [`SET_BY_POLICY`] lists, as `/mutate` reads it: each entry is trusted once, and only
/// for a field whose value is exactly what the MAP sets there (a tenant who writes the
/// annotation by hand gains nothing: the annotation is removed, and what it lists that the MAP
/// did not set is named in a warning).
pub(crate) struct SetByPolicy<'a> {
    /// Each entry once, in the order written, with whether it was taken.
    entries: Vec<(&'a str, bool)>,
    /// Where each entry is in `entries`: one lookup per question, so that reading a pod of
    /// many containers against an annotation of many entries stays linear in both.
    index: HashMap<&'a str, usize>,
}

impl<'a> SetByPolicy<'a> {
    /// The admitted object's annotation (a Pod's, a Job's own), if it has one.
    pub(crate) fn read(w: &Workload<'a>) -> Option<Self> {
        let value = w.object_annotations?.get(SET_BY_POLICY)?;
        let mut mark = SetByPolicy {
            entries: Vec::new(),
            index: HashMap::new(),
        };
        for entry in value.split(',').filter(|e| !e.is_empty()) {
            if !mark.index.contains_key(entry) {
                mark.index.insert(entry, mark.entries.len());
                mark.entries.push((entry, false));
            }
        }
        Some(mark)
    }

    /// Where the annotation is: the admitted object's own (a Job's, never its template's).
    pub(crate) fn path() -> FieldPath {
        FieldPath::root()
            .keys(["metadata", "annotations"])
            .key(SET_BY_POLICY)
    }

    /// Whether `entry` is listed and not taken yet; takes it.
    fn take(&mut self, entry: &str) -> bool {
        match self.index.get(entry).map(|&i| &mut self.entries[i].1) {
            Some(taken) if !*taken => {
                *taken = true;
                true
            }
            _ => false,
        }
    }

    /// The pod-level fields the MAP set, as [`PodIdentity`]: each listed whose value is the
    /// one the MAP sets where it is absent.
    pub(super) fn pod_fields(
        &mut self,
        w: &Workload,
        cfg: &PolicyConfig,
        prep_managed: bool,
    ) -> PodIdentity {
        let pod = w.pod_security();
        let unset = identity_if_unset(w, cfg, prep_managed);
        let [non_root, user, group] = POD_FIELDS.map(pod_entry);
        let mut out = PodIdentity::default();
        if pod.and_then(|p| p.run_as_non_root) == Some(true) && self.take(&non_root) {
            out.run_as_non_root = true;
        }
        let own_user = pod.and_then(|p| p.run_as_user);
        if own_user.is_some() && own_user == unset.run_as_user && self.take(&user) {
            out.run_as_user = own_user;
        }
        let own_group = pod.and_then(|p| p.run_as_group);
        if own_group.is_some() && own_group == unset.run_as_group && self.take(&group) {
            out.run_as_group = own_group;
        }
        out
    }

    /// The warning naming what the annotation listed that the MAP did not set, if anything.
    pub(super) fn untrusted_warning(&self) -> Option<String> {
        let untrusted: Vec<&str> = self
            .entries
            .iter()
            .filter(|(_, taken)| !taken)
            .map(|(e, _)| *e)
            .collect();
        if untrusted.is_empty() {
            return None;
        }
        const TEXT: &str = " lists what modelgate's MutatingAdmissionPolicy did not set (ignored, \
                            the annotation removed): ";
        let list = super::listed(untrusted.iter(), ", ");
        let room = super::MAX_WARNING_LEN.saturating_sub(SET_BY_POLICY.len() + TEXT.len());
        Some(format!(
            "{SET_BY_POLICY}{TEXT}{}",
            super::shorten_uri(&list, room)
        ))
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
