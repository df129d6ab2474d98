//! `audit --from-cluster --write-reports`: the policy reports ([`super::output::reports`])
//! written to the cluster, and modelgate's reports whose workload is no longer audited removed.
//!
//! The calls are the plain Kubernetes ones, so that the RBAC is `create`, `patch`, `list` and
//! `delete` on the report resource and nothing else (an apply that creates the object is
//! authorized as `create` too):
//! - each report by server-side apply (`PATCH …/<plural>/<name>?fieldManager=modelgate&force=true`,
//!   `application/apply-patch+yaml`), which creates it or updates modelgate's fields of it: the
//!   first alone (a CRD that is not installed is then one error, not one per workload), the
//!   others [`REPORT_WRITES_IN_FLIGHT`] at a time;
//! - then the prune: the reports labelled `app.kubernetes.io/managed-by=modelgate`, listed in
//!   pages of `page_size` (in each audited namespace, or in all namespaces), and each one that
//!   is modelgate's by its name and source too ([`reports::is_modelgates`]) and whose name this
//!   run did not write deleted: its workload is gone, exempt, or now counted through its owner.
//!   The delete carries the listed uid and resourceVersion as preconditions, so that a report
//!   another run wrote or changed since the listing is kept (409: not counted as refused).
//!
//! The caller writes only after a complete listing of the workloads: a report missing from an
//! incomplete listing must never be taken for a workload that is gone. A refused call (apply,
//! list or delete) is recorded with the object and the API's reason, and the others are still
//! made.

use std::collections::HashSet;

use super::WorkloadResults;
use super::cluster::reason;
use super::output::reports::{self, MANAGED_BY_KEY, MANAGED_BY_VALUE, ReportApi, Timestamp};
use futures::StreamExt as _;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, Preconditions,
};

/// Report applies in flight at once. One at a time, a run's time is one round trip per
/// workload (100 000 workloads at a few milliseconds each would take minutes of the CronJob's
/// deadline); eight keep that an eighth while staying a small share of the API server's
/// priority-and-fairness queue for one service account.
const REPORT_WRITES_IN_FLIGHT: usize = 8;

/// The field manager of modelgate's server-side applies.
pub const FIELD_MANAGER: &str = "modelgate";

/// What the writes did.
#[derive(Debug, Default)]
pub struct Written {
    pub applied: usize,
    pub deleted: usize,
    /// One line per refused call: the object (`Report team-a/modelgate-…`) and the reason.
    pub refused: Vec<String>,
}

impl Written {
    /// `reports: N applied, M deleted, K refused`.
    pub fn summary(&self) -> String {
        format!(
            "reports: {} applied, {} deleted, {} refused",
            self.applied,
            self.deleted,
            self.refused.len()
        )
    }
}

fn api_resource(api: ReportApi) -> ApiResource {
    ApiResource {
        group: api.group().into(),
        version: api.version().into(),
        api_version: api.api_version(),
        kind: api.kind().into(),
        plural: api.plural().into(),
    }
}

/// Applies a report for each of `workloads`, then deletes modelgate's other reports in
/// `namespaces` (all namespaces when empty).
pub async fn write_reports(
    client: &kube::Client,
    api: ReportApi,
    workloads: &[WorkloadResults],
    namespaces: &[String],
    page_size: u32,
    at: Timestamp,
) -> Written {
    let ar = api_resource(api);
    let kind = api.kind();
    let mut written = Written::default();
    // Where each workload's report goes, in the workloads' order.
    let targets: Vec<(String, String)> = workloads
        .iter()
        .map(|w| (w.scope.namespace.clone(), reports::report_name(&w.scope)))
        .collect();
    // Every report this run stands for, applied or refused: a refused apply leaves the old
    // report of a workload that still exists, which is no reason to delete it.
    let names: HashSet<(&str, &str)> = targets
        .iter()
        .map(|(namespace, name)| (namespace.as_str(), name.as_str()))
        .collect();
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let apply = |(w, (namespace, name)): (&WorkloadResults, &(String, String))| {
        let report = reports::report(api, w, at);
        let reports: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &ar);
        let (namespace, name, params) = (namespace.clone(), name.clone(), &params);
        async move {
            let result = reports.patch(&name, params, &Patch::Apply(&report)).await;
            (format!("{kind} {namespace}/{name}"), result.map(|_| ()))
        }
    };
    let mut jobs = workloads.iter().zip(&targets);
    // The first alone: without the CRD every apply fails alike, and that is said once.
    let Some(first) = jobs.next() else {
        prune(client, &ar, &names, namespaces, page_size, &mut written).await;
        return written;
    };
    match apply(first).await {
        (_, Ok(())) => written.applied += 1,
        (object, Err(e)) if is_not_served(&e) => {
            written.refused.push(format!(
                "{object} and the {} other reports: {} is not served by the cluster ({}): \
                 install the {} CRD",
                workloads.len() - 1,
                api.api_version(),
                reason(&e),
                ar.plural
            ));
            return written;
        }
        (object, Err(e)) => written.refused.push(format!("{object}: {}", reason(&e))),
    }
    let mut applies =
        futures::stream::iter(jobs.map(apply)).buffer_unordered(REPORT_WRITES_IN_FLIGHT);
    while let Some((object, result)) = applies.next().await {
        match result {
            Ok(()) => written.applied += 1,
            Err(e) => written.refused.push(format!("{object}: {}", reason(&e))),
        }
    }
    prune(client, &ar, &names, namespaces, page_size, &mut written).await;
    written
}

/// A 404 on an apply (which creates what is missing) means the resource itself is unknown,
/// unless it is the namespace that is gone.
fn is_not_served(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404
        && s.details.as_ref().is_none_or(|d| d.kind != "namespaces"))
}

async fn prune(
    client: &kube::Client,
    ar: &ApiResource,
    keep: &HashSet<(&str, &str)>,
    namespaces: &[String],
    page_size: u32,
    written: &mut Written,
) {
    let scopes: Vec<Option<&str>> = if namespaces.is_empty() {
        vec![None]
    } else {
        namespaces.iter().map(|n| Some(n.as_str())).collect()
    };
    let selector = format!("{MANAGED_BY_KEY}={MANAGED_BY_VALUE}");
    for scope in scopes {
        let list_api: Api<DynamicObject> = match scope {
            Some(ns) => Api::namespaced_with(client.clone(), ns, ar),
            None => Api::all_with(client.clone(), ar),
        };
        let mut params = ListParams::default().labels(&selector).limit(page_size);
        let mut stale = Vec::new();
        loop {
            let page = match list_api.list(&params).await {
                Ok(page) => page,
                Err(e) => {
                    let place =
                        scope.map_or("all namespaces".to_string(), |ns| format!("namespace {ns}"));
                    written.refused.push(format!(
                        "list {} in {place} (nothing pruned there): {}",
                        ar.plural,
                        reason(&e)
                    ));
                    stale.clear();
                    break;
                }
            };
            for item in page.items {
                let name = item.metadata.name.unwrap_or_default();
                if !reports::is_modelgates(&name, &item.data) {
                    continue;
                }
                let key = (item.metadata.namespace.unwrap_or_default(), name);
                if !keep.contains(&(key.0.as_str(), key.1.as_str())) {
                    let listed = Preconditions {
                        uid: item.metadata.uid,
                        resource_version: item.metadata.resource_version,
                    };
                    stale.push((key, listed));
                }
            }
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(token) => params = params.continue_token(&token),
                None => break,
            }
        }
        // Deleted after the listing, so that deletions never shift the pages being read.
        for ((namespace, name), listed) in stale {
            let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, ar);
            let params = DeleteParams {
                preconditions: Some(listed),
                ..DeleteParams::default()
            };
            match api.delete(&name, &params).await {
                Ok(_) => written.deleted += 1,
                // Gone already (its workload's garbage collection came first), or written again
                // since the listing (another run): nothing to do.
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                Err(e) => {
                    written
                        .refused
                        .push(format!("{} {namespace}/{name}: {}", ar.kind, reason(&e)))
                }
            }
        }
    }
}
