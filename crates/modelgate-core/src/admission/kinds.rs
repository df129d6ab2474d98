//! The kinds modelgate handles (SPEC.md §1) and, for each, where the pod spec its rules read is
//! inside the object: the one place that says so, for admission, `review` and `audit` alike.

use crate::patch::FieldPath;

/// A kind whose objects carry a pod spec.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum WorkloadKind {
    Pod,
    Job,
    Deployment,
    StatefulSet,
    DaemonSet,
    ReplicaSet,
    ReplicationController,
    CronJob,
}

impl WorkloadKind {
    pub const ALL: [WorkloadKind; 8] = [
        WorkloadKind::Pod,
        WorkloadKind::Job,
        WorkloadKind::Deployment,
        WorkloadKind::StatefulSet,
        WorkloadKind::DaemonSet,
        WorkloadKind::ReplicaSet,
        WorkloadKind::ReplicationController,
        WorkloadKind::CronJob,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            WorkloadKind::Pod => "Pod",
            WorkloadKind::Job => "Job",
            WorkloadKind::Deployment => "Deployment",
            WorkloadKind::StatefulSet => "StatefulSet",
            WorkloadKind::DaemonSet => "DaemonSet",
            WorkloadKind::ReplicaSet => "ReplicaSet",
            WorkloadKind::ReplicationController => "ReplicationController",
            WorkloadKind::CronJob => "CronJob",
        }
    }

    /// API group and version, as served today.
    pub fn group_version(self) -> (&'static str, &'static str) {
        match self {
            WorkloadKind::Pod | WorkloadKind::ReplicationController => ("", "v1"),
            WorkloadKind::Job | WorkloadKind::CronJob => ("batch", "v1"),
            WorkloadKind::Deployment
            | WorkloadKind::StatefulSet
            | WorkloadKind::DaemonSet
            | WorkloadKind::ReplicaSet => ("apps", "v1"),
        }
    }

    /// The kind of a request or an object by group, version and kind; `None` for any other.
    pub fn of(group: &str, version: &str, kind: &str) -> Option<WorkloadKind> {
        WorkloadKind::ALL
            .into_iter()
            .find(|k| k.as_str() == kind && k.group_version() == (group, version))
    }

    /// [`of`](Self::of) for an object's `apiVersion` (`apps/v1`, `v1`) and `kind`.
    pub fn of_api_version(api_version: &str, kind: &str) -> Option<WorkloadKind> {
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        WorkloadKind::of(group, version, kind)
    }

    /// A workload controller (SPEC.md §11): its pod template is judged, never patched; its pods
    /// are mutated when they are created.
    pub fn is_controller(self) -> bool {
        !matches!(self, WorkloadKind::Pod | WorkloadKind::Job)
    }

    /// Where the pod template is inside an object of this kind (`metadata` and `spec` of the
    /// pods to be), or `None` for a Pod, which is its own pod.
    pub fn pod_template_path(self) -> Option<&'static [&'static str]> {
        match self {
            WorkloadKind::Pod => None,
            WorkloadKind::CronJob => Some(&["spec", "jobTemplate", "spec", "template"]),
            _ => Some(&["spec", "template"]),
        }
    }

    /// The pod template as a JSON pointer (`/spec/template`), `""` for a Pod.
    pub fn pod_template_pointer(self) -> String {
        self.pod_template_path()
            .unwrap_or_default()
            .iter()
            .map(|key| format!("/{key}"))
            .collect()
    }

    /// Where the pod's metadata and spec are: `metadata`/`spec` of a Pod,
    /// `spec.template.metadata`/`spec.template.spec` of a Job or a controller,
    /// `spec.jobTemplate.spec.template.…` of a CronJob. Denials name fields under these paths.
    pub(crate) fn pod_paths(self) -> (FieldPath, FieldPath) {
        let template = self
            .pod_template_path()
            .unwrap_or_default()
            .iter()
            .fold(FieldPath::root(), |path, key| path.key(*key));
        (template.key("metadata"), template.key("spec"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_is_found_by_its_group_version_and_name_only() {
        for kind in WorkloadKind::ALL {
            let (group, version) = kind.group_version();
            assert_eq!(WorkloadKind::of(group, version, kind.as_str()), Some(kind));
            let api_version = if group.is_empty() {
                version.to_string()
            } else {
                format!("{group}/{version}")
            };
            assert_eq!(
                WorkloadKind::of_api_version(&api_version, kind.as_str()),
                Some(kind)
            );
        }
        assert_eq!(WorkloadKind::of("apps", "v1beta2", "Deployment"), None);
        assert_eq!(
            WorkloadKind::of("extensions", "v1beta1", "Deployment"),
            None
        );
        assert_eq!(WorkloadKind::of("", "v1", "Deployment"), None);
        assert_eq!(WorkloadKind::of("batch", "v1beta1", "CronJob"), None);
        assert_eq!(WorkloadKind::of("", "v1", "Service"), None);
    }

    #[test]
    fn the_pod_spec_paths_are_the_kinds_own() {
        let paths = |k: WorkloadKind| {
            let (meta, spec) = k.pod_paths();
            (meta.to_string(), spec.to_string())
        };
        assert_eq!(paths(WorkloadKind::Pod), ("metadata".into(), "spec".into()));
        for k in WorkloadKind::ALL
            .into_iter()
            .filter(|k| !matches!(k, WorkloadKind::Pod | WorkloadKind::CronJob))
        {
            assert_eq!(
                paths(k),
                ("spec.template.metadata".into(), "spec.template.spec".into())
            );
            assert_eq!(k.pod_template_pointer(), "/spec/template");
        }
        assert_eq!(
            paths(WorkloadKind::CronJob),
            (
                "spec.jobTemplate.spec.template.metadata".into(),
                "spec.jobTemplate.spec.template.spec".into()
            )
        );
        assert_eq!(
            WorkloadKind::CronJob.pod_template_pointer(),
            "/spec/jobTemplate/spec/template"
        );
        assert_eq!(WorkloadKind::Pod.pod_template_pointer(), "");
    }
}
