//! The pod under review, whether it is a Pod or a Job's pod template: borrowed views of the
//! fields the rules read ([`super::view`]), the init containers' raw JSON for the prep check, and
//! the paths for patches and messages.

use super::view::{
    ContainerView, PodSecurityContextView, PodSpecView, SecurityContextView, StrMap,
    VolumeMountView,
};
use std::cell::OnceCell;

use crate::cache::CacheIndex;
use crate::config::PREP_CONTAINER;
use crate::exceptions::{Exception, InScope, Waivable};
use crate::patch::FieldPath;

/// The well-known node label of the operating system, and its Windows value.
const OS_LABEL: &str = "kubernetes.io/os";
const WINDOWS: &str = "windows";

/// A pod spec and its metadata, as found in a Pod or a Job template.
pub(crate) struct Workload<'a> {
    /// The namespace the pod will run in (object metadata, else the request's).
    pub namespace: &'a str,
    /// The namespace enforces Pod Security `restricted`, which refuses root containers (§9).
    pub restricted_namespace: bool,
    /// The claims the cluster state knows (`None`: none is known), for the prep's decision on a
    /// claim whose volume the tenant picked (docs/policy.md).
    pub claims: Option<&'a CacheIndex>,
    /// Why the prep is withheld from this pod, if it is: worked out at the first question (the
    /// rules ask several times per admission) under the one configuration a request is judged
    /// with.
    pub prep_withheld: OnceCell<Option<super::cache_prep::Withheld<'a>>>,
    pub annotations: Option<&'a StrMap<'a>>,
    /// The admitted object's own annotations: a Pod's (as `annotations`), a Job's (not its
    /// template's); `None` for a template judged in memory. Where modelgate's
    /// MutatingAdmissionPolicy writes what it set (docs/policy.md §13, "The MAP").
    pub object_annotations: Option<&'a StrMap<'a>>,
    /// The Pod's labels, or the Job template's.
    pub labels: Option<&'a StrMap<'a>>,
    /// Whether the metadata object exists (a Job template may have none).
    pub has_metadata: bool,
    /// The pod spec; its init containers carry their JSON as received, so that the prep
    /// container is judged on every field, including those no view knows.
    pub spec: &'a PodSpecView<'a>,
    /// `metadata` or `spec.template.metadata`.
    pub meta_path: FieldPath,
    /// `spec` or `spec.template.spec`.
    pub spec_path: FieldPath,
    /// The exceptions in force in the namespace (docs/exceptions.md): empty, and free, where
    /// none is.
    pub exceptions: InScope<'a>,
    /// What they waive for this pod: worked out at the first question.
    pub waivers: OnceCell<Waivers<'a>>,
}

/// What the exceptions that match a pod waive for it.
#[derive(Debug, Default)]
pub(crate) struct Waivers<'a> {
    /// The containers whose non-root checks are waived, by list and index, sorted.
    pub non_root: Vec<(ContainerList, usize)>,
    /// The exception that waives the prep for the pod, if one does.
    pub cache_prep: Option<&'a str>,
    /// The exceptions that waived something, by name.
    pub used: Vec<&'a Exception>,
}

impl Workload<'_> {
    /// Whether this is a pod template (a Job's, a controller's) rather than a Pod: its pods
    /// are created later, each judged and routed when it is.
    pub(crate) fn is_template(&self) -> bool {
        self.spec_path != FieldPath::root().key("spec")
    }
}

/// The three container lists of a pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum ContainerList {
    Init,
    Regular,
    Ephemeral,
}

impl ContainerList {
    /// The list's field in a pod spec.
    fn field(self) -> &'static str {
        match self {
            ContainerList::Init => "initContainers",
            ContainerList::Regular => "containers",
            ContainerList::Ephemeral => "ephemeralContainers",
        }
    }
}

/// One container of any list, with its place in the object.
pub(crate) struct ContainerRef<'a> {
    pub list: ContainerList,
    /// Position within its own list.
    pub index: usize,
    pub name: &'a str,
    pub security_context: Option<&'a SecurityContextView>,
    pub volume_mounts: Option<&'a [VolumeMountView<'a>]>,
    pub image: Option<&'a str>,
}

impl ContainerRef<'_> {
    /// Where the container is in the object (`spec.containers[1]`), built when needed: most
    /// containers never need theirs.
    pub(crate) fn path(&self, w: &Workload) -> FieldPath {
        w.spec_path.key(self.list.field()).index(self.index)
    }
}

impl<'a> Workload<'a> {
    /// What the exceptions in force waive for this pod.
    pub(crate) fn waivers(&self) -> &Waivers<'a> {
        self.waivers.get_or_init(|| {
            let mut out = Waivers::default();
            if self.exceptions.is_empty() {
                return out;
            }
            let containers = self.containers();
            let matching: Vec<&'a Exception> = self.exceptions.matching(self.labels).collect();
            let mut used = vec![false; matching.len()];
            // Each container once, whatever number of exceptions cover it: the list the
            // rules search holds at most one entry per container.
            for c in &containers {
                let mut covered = false;
                for (e, used) in matching.iter().zip(used.iter_mut()) {
                    // Never the prep's name (only the canonical prep may have it), and an
                    // ephemeral container only when the exception names it.
                    let eligible = c.name != PREP_CONTAINER
                        && (c.list != ContainerList::Ephemeral || e.containers.is_some());
                    if e.waives(Waivable::NonRoot) && eligible && e.covers(c.name, c.image) {
                        *used = true;
                        covered = true;
                    }
                }
                if covered {
                    out.non_root.push((c.list, c.index));
                }
            }
            for (e, used) in matching.into_iter().zip(used) {
                if e.waives(Waivable::CachePrep) {
                    out.cache_prep.get_or_insert(&e.name[..]);
                }
                if used || e.waives(Waivable::CachePrep) {
                    out.used.push(e);
                }
            }
            // Sorted once, so that each container's question is a binary search: a pod of
            // 50 000 containers an exception covers costs C log C, never C².
            out.non_root.sort_unstable();
            out
        })
    }

    /// Whether an exception waives the non-root checks for container `c`.
    pub(crate) fn non_root_waived(&self, c: &ContainerRef) -> bool {
        !self.exceptions.is_empty()
            && self
                .waivers()
                .non_root
                .binary_search(&(c.list, c.index))
                .is_ok()
    }

    pub(crate) fn annotation(&self, key: &str) -> Option<&'a str> {
        self.annotations?.get(key)
    }

    pub(crate) fn has_label(&self, key: &str) -> bool {
        self.labels.is_some_and(|l| l.contains_key(key))
    }

    pub(crate) fn has_annotation(&self, key: &str) -> bool {
        self.annotations.is_some_and(|a| a.contains_key(key))
    }

    pub(crate) fn annotations_path(&self) -> FieldPath {
        self.meta_path.key("annotations")
    }

    /// A Windows pod (docs/policy.md §1), where the API forbids uids, gids and fsGroup: `spec.os.name:
    /// windows`, or, without `spec.os`, a pod that selects Windows nodes: `nodeSelector`
    /// `kubernetes.io/os: windows`, or a required node affinity whose every term admits only
    /// that value.
    pub(crate) fn is_windows(&self) -> bool {
        if let Some(os) = &self.spec.os {
            return os.name() == WINDOWS;
        }
        let by_selector = self
            .spec
            .node_selector
            .as_ref()
            .and_then(|s| s.get(OS_LABEL))
            .is_some_and(|os| os == WINDOWS);
        by_selector || self.required_affinity_admits_only_windows()
    }

    fn required_affinity_admits_only_windows(&self) -> bool {
        let terms = self
            .spec
            .required_node_selector()
            .map(|r| r.terms())
            .unwrap_or_default();
        // Terms are ORed and the expressions of a term ANDed: each term must pin the OS itself.
        !terms.is_empty()
            && terms.iter().all(|term| {
                term.match_expressions.iter().flatten().any(|e| {
                    e.key() == OS_LABEL
                        && e.operator() == "In"
                        && e.values
                            .as_deref()
                            .is_some_and(|v| !v.is_empty() && v.iter().all(|os| *os == WINDOWS))
                })
            })
    }

    pub(crate) fn pod_security(&self) -> Option<&'a PodSecurityContextView> {
        self.spec.security_context.as_ref()
    }

    pub(crate) fn pod_run_as_user(&self) -> Option<i64> {
        self.pod_security()?.run_as_user
    }

    pub(crate) fn pod_fs_group(&self) -> Option<i64> {
        self.pod_security()?.fs_group
    }

    /// Every container, in the order init, regular, ephemeral.
    pub(crate) fn containers(&self) -> Vec<ContainerRef<'a>> {
        let s = self.spec;
        let mut out = Vec::with_capacity(
            s.init_containers().len() + s.containers().len() + s.ephemeral_containers().len(),
        );
        let mut push = |list: ContainerList, i: usize, c: &'a ContainerView<'a>| {
            out.push(ContainerRef {
                list,
                index: i,
                name: c.name(),
                security_context: c.security_context.as_ref(),
                volume_mounts: c.volume_mounts.as_deref(),
                image: c.image.as_deref(),
            });
        };
        for (i, c) in s.init_containers().iter().enumerate() {
            push(ContainerList::Init, i, &c.container);
        }
        for (i, c) in s.containers().iter().enumerate() {
            push(ContainerList::Regular, i, c);
        }
        for (i, c) in s.ephemeral_containers().iter().enumerate() {
            push(ContainerList::Ephemeral, i, c);
        }
        out
    }
}
