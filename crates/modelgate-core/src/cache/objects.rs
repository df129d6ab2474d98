//! The objects routing reads, with the fields modelgate reads: KServe's local model cache kinds
//! (`serving.kserve.io/v1alpha1`, field names as in KServe's `pkg/apis/serving/v1alpha1`) and what
//! is kept of PersistentVolumeClaims and Nodes. Other fields (modelSize, storage,
//! serviceAccountName, …) are accepted and ignored.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PersistentVolumeSpec;
use kube::CustomResource;
use serde::{Deserialize, Serialize};

use super::index::{CacheStatus, PvcPhase, PvcState};

/// `LocalModelCache` (cluster-scoped). kube's derive makes one kind per spec struct, so the
/// namespaced kind below repeats these fields rather than sharing the struct.
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[kube(
    group = "serving.kserve.io",
    version = "v1alpha1",
    kind = "LocalModelCache",
    status = "LocalModelCacheStatus",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct LocalModelCacheSpec {
    pub source_model_uri: String,
    #[serde(default)]
    pub node_groups: Vec<String>,
}

/// `LocalModelNamespaceCache`: like the cluster kind, plus KServe's shared-PVC mode (`pvcRef`,
/// mutually exclusive with `nodeGroups`).
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[kube(
    group = "serving.kserve.io",
    version = "v1alpha1",
    kind = "LocalModelNamespaceCache",
    namespaced,
    status = "LocalModelCacheStatus",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct LocalModelNamespaceCacheSpec {
    pub source_model_uri: String,
    #[serde(default)]
    pub node_groups: Vec<String>,
    #[serde(default)]
    pub pvc_ref: Option<String>,
}

/// KServe's `LocalModelCacheStatus`, shared by both cache kinds.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct LocalModelCacheStatus {
    /// Node name → `NodeDownloaded`, `NodeDownloading`, `NodeDownloadPending`,
    /// `NodeDownloadError`, `NodeNotReady`.
    #[serde(default)]
    pub node_status: BTreeMap<String, String>,
    /// `copies` in JSON (`ModelCopies` in Go).
    #[serde(default)]
    pub copies: Option<ModelCopies>,
    /// Shared-PVC mode reports a `Ready` condition.
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct ModelCopies {
    #[serde(default)]
    pub available: i64,
    #[serde(default)]
    pub total: i64,
    #[serde(default)]
    pub failed: i64,
}

/// The two fields of a `metav1.Condition` routing reads.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct Condition {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: String,
}

impl LocalModelCacheStatus {
    /// What the index keeps: the node statuses, and whether a shared-PVC import finished.
    pub fn to_index(&self) -> CacheStatus {
        self.to_index_bounded().0
    }

    /// [`to_index`](Self::to_index), and how many node statuses routing could use were left
    /// out ([`CacheStatus::bounded`]).
    pub fn to_index_bounded(&self) -> (CacheStatus, usize) {
        let ready = self
            .conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        let available = self.copies.as_ref().is_some_and(|c| c.available >= 1);
        CacheStatus::bounded(
            self.node_status
                .iter()
                .map(|(n, s)| (n.as_str(), s.as_str())),
            ready || available,
        )
    }
}

#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[kube(
    group = "serving.kserve.io",
    version = "v1alpha1",
    kind = "LocalModelNodeGroup",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct LocalModelNodeGroupSpec {
    #[serde(default)]
    pub persistent_volume_spec: Option<PersistentVolumeSpec>,
}

/// The annotation the PV controller puts on a claim it bound itself (to a volume it chose or
/// provisioned). A `spec.volumeName` without it was written by whoever wrote the claim.
pub(crate) const BOUND_BY_CONTROLLER: &str = "pv.kubernetes.io/bound-by-controller";

/// A PVC's state from its metadata and the rest of the object (`spec`, `status.phase`).
pub(crate) fn pvc_state(metadata: &kube::core::ObjectMeta, object: &serde_json::Value) -> PvcState {
    let text = |pointer: &str| object.pointer(pointer).and_then(|v| v.as_str());
    let by_controller = metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(BOUND_BY_CONTROLLER))
        .is_some_and(|v| v == "yes");
    let named = text("/spec/volumeName").is_some_and(|v| !v.is_empty());
    let selects = object
        .pointer("/spec/selector")
        .is_some_and(|s| !s.is_null());
    PvcState {
        phase: PvcPhase::parse(text("/status/phase")),
        deleting: metadata.deletion_timestamp.is_some(),
        picked: (named && !by_controller) || selects,
        storage_class: text("/spec/storageClassName").map(Into::into),
    }
}
