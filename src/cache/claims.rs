//! The one API call an admission may make: a claim the PersistentVolumeClaim watch has not
//! delivered yet, read with a GET (docs/policy.md, "Claims whose volume the tenant picked"). A
//! StatefulSet creates a pod's claim milliseconds before the pod; without the read, that pod
//! would be taken as naming a claim that does not exist and get no prep.
//!
//! Bounded so that pods naming claims that never exist cannot turn admissions into API load or
//! latency: at most [`MAX_READS_IN_FLIGHT`] reads at once (beyond, the claim is taken as
//! missing), each under [`READ_TIMEOUT`]. Every outcome is counted in
//! `modelgate_claim_reads_total{result}`.

use std::sync::Arc;
use std::time::Duration;

use kube::api::{Api, DynamicObject};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tokio::sync::Semaphore;

use super::cluster::{Converted, Kind, convert};
use super::{CacheIndex, PvcState};
use crate::server::metrics::ResultLabels;

/// How long one read may take: a webhook call has seconds in all (the chart's timeoutSeconds
/// is 5), and the decision is made again after it.
pub const READ_TIMEOUT: Duration = Duration::from_secs(1);

/// Reads at once, over all admissions; a read past them is not made.
pub const MAX_READS_IN_FLIGHT: usize = 8;

/// What a read found.
#[derive(Debug, PartialEq)]
pub enum ClaimRead {
    Found(PvcState),
    /// The claim does not exist, or it could not be read: taken as missing.
    Missing(&'static str),
}

/// The outcomes, each a series of `modelgate_claim_reads_total` from the start.
const RESULTS: [&str; 5] = ["found", "not_found", "failed", "timeout", "busy"];

#[derive(Clone)]
pub struct ClaimReader {
    client: kube::Client,
    slots: Arc<Semaphore>,
    reads: Family<ResultLabels, Counter>,
}

impl ClaimReader {
    /// A reader through `client`, its counter registered in `registry`.
    pub fn new(client: kube::Client, registry: &mut Registry) -> Self {
        let reads = Family::<ResultLabels, Counter>::default();
        registry.register(
            "modelgate_claim_reads",
            "PersistentVolumeClaims read with a GET during an admission because the watch had \
             not delivered them yet, by result (busy: not read, too many reads in flight)",
            reads.clone(),
        );
        for result in RESULTS {
            let _ = reads.get_or_create(&ResultLabels { result });
        }
        ClaimReader {
            client,
            slots: Arc::new(Semaphore::new(MAX_READS_IN_FLIGHT)),
            reads,
        }
    }

    /// Reads the claim `namespace/name`.
    pub async fn read(&self, namespace: &str, name: &str) -> ClaimRead {
        let outcome = self.read_uncounted(namespace, name).await;
        let result = match &outcome {
            ClaimRead::Found(_) => "found",
            ClaimRead::Missing(result) => result,
        };
        self.reads.get_or_create(&ResultLabels { result }).inc();
        outcome
    }

    async fn read_uncounted(&self, namespace: &str, name: &str) -> ClaimRead {
        let Ok(_slot) = self.slots.clone().try_acquire_owned() else {
            return ClaimRead::Missing("busy");
        };
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), namespace, &Kind::Pvc.api_resource());
        let got = match tokio::time::timeout(READ_TIMEOUT, api.get_opt(name)).await {
            Err(_) => return ClaimRead::Missing("timeout"),
            Ok(Err(e)) => {
                tracing::warn!(namespace, claim = name, error = %e, "claim read failed");
                return ClaimRead::Missing("failed");
            }
            Ok(Ok(None)) => return ClaimRead::Missing("not_found"),
            Ok(Ok(Some(obj))) => obj,
        };
        match convert(Kind::Pvc, got) {
            Ok(Converted::Pvc { state, .. }) => ClaimRead::Found(state),
            _ => ClaimRead::Missing("failed"),
        }
    }
}

/// `index` with the claim read added: the state the decision is made again against. The index
/// is persistent, so this copies a path, not the cluster state; the watch's own copy is not
/// touched (its next event for the claim is the truth).
pub fn with_claim(index: &CacheIndex, namespace: &str, name: &str, state: PvcState) -> CacheIndex {
    let mut index = index.clone();
    index.upsert_pvc(namespace, name, state);
    index
}
