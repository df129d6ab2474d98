//! KServe's local model cache objects (`serving.kserve.io/v1alpha1`), with the fields modelgate
//! reads. Other fields (modelSize, storage, serviceAccountName, …) are accepted and ignored.

use k8s_openapi::api::core::v1::PersistentVolumeSpec;
use kube::CustomResource;
use serde::{Deserialize, Serialize};

/// `LocalModelCache` (cluster-scoped). kube's derive makes one kind per spec struct, so the
/// namespaced kind below repeats these two fields rather than sharing the struct.
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[kube(
    group = "serving.kserve.io",
    version = "v1alpha1",
    kind = "LocalModelCache",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct LocalModelCacheSpec {
    pub source_model_uri: String,
    #[serde(default)]
    pub node_groups: Vec<String>,
}

#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[kube(
    group = "serving.kserve.io",
    version = "v1alpha1",
    kind = "LocalModelNamespaceCache",
    namespaced,
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct LocalModelNamespaceCacheSpec {
    pub source_model_uri: String,
    #[serde(default)]
    pub node_groups: Vec<String>,
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
