//! What `audit --from-cluster` reads of the workloads (the Namespaces are
//! [`crate::namespaces::list`]'s): the audited kinds, with list calls only (never a watch, never
//! a write), in pages of `limit` objects followed by `continue` tokens, so that a cluster of
//! 50 000 pods is read a page at a time and each page is evaluated and dropped before the next
//! one is asked for.
//!
//! The kinds of the workload-kind table are listed only where the cluster serves them (its
//! discovery documents say which versions of which resources it serves); the others are named
//! in one note and skipped, since a cluster without Ray has no RayCluster to audit.
//!
//! The audit is all or nothing: when one list fails (a namespace the user may not read, an
//! expired `continue` token), the error names the resource and the namespace, and no report is
//! written, so that a partial count is never taken for the cluster's.

use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use serde_json::Value;

use crate::kinds::{Scope, WorkloadKinds};

use super::AuditedKind;

/// Why the cluster could not be audited.
#[derive(Debug, thiserror::Error)]
pub enum ListError {
    #[error(
        "cannot reach the cluster (kubeconfig or in-cluster configuration): {0}; \
         audit files instead, or fix the kubeconfig"
    )]
    Client(#[source] kube::Error),
    #[error(
        "cannot list {plural} in namespace {namespace}: {reason}; the audit is incomplete, so \
         no report is written (leave the namespace out, or get list permission on {plural} there)"
    )]
    Namespace {
        plural: String,
        namespace: String,
        reason: String,
    },
    #[error(
        "cannot list {plural} in all namespaces: {reason}; the audit is incomplete, so no report \
         is written (audit the namespaces you can read with --namespace NS)"
    )]
    AllNamespaces { plural: String, reason: String },
    #[error(
        "cannot read the API discovery of {api_version}: {reason}; the audit is incomplete, so \
         no report is written"
    )]
    Discovery { api_version: String, reason: String },
    #[error("cannot start the runtime for the cluster client: {0}")]
    Runtime(#[source] std::io::Error),
}

/// The API's own words for a failed call: `Forbidden (403): pods is forbidden: …`.
pub(crate) fn reason(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) if s.code == 410 => format!(
            "{} (410): {}; the list changed too much while it was paged: run the audit again, \
             or with a larger --page-size",
            s.reason, s.message
        ),
        kube::Error::Api(s) => format!("{} ({}): {}", s.reason, s.code, s.message),
        other => other.to_string(),
    }
}

fn api_resource(kind: AuditedKind, version: &str) -> ApiResource {
    let (group, _) = kind.group_version();
    ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: if group.is_empty() {
            version.into()
        } else {
            format!("{group}/{version}")
        },
        kind: kind.as_str().into(),
        plural: kind.plural().into(),
    }
}

/// The version of `kind` the cluster serves (the first of the row's versions it serves), or
/// `None` when it serves none. Discovery documents are read once per group and version.
async fn served_version(
    client: &kube::Client,
    kind: AuditedKind,
    seen: &mut std::collections::BTreeMap<String, Option<Vec<String>>>,
) -> Result<Option<String>, ListError> {
    let AuditedKind::Table(entry) = kind else {
        return Ok(Some(kind.group_version().1.to_string()));
    };
    for version in &entry.versions {
        let api_version = if entry.group.is_empty() {
            version.clone()
        } else {
            format!("{}/{version}", entry.group)
        };
        if !seen.contains_key(&api_version) {
            let listed = if entry.group.is_empty() {
                client.list_core_api_resources(version).await
            } else {
                client.list_api_group_resources(&api_version).await
            };
            let plurals = match listed {
                Ok(list) => Some(list.resources.into_iter().map(|r| r.name).collect()),
                Err(kube::Error::Api(s)) if s.code == 404 => None,
                Err(e) => {
                    return Err(ListError::Discovery {
                        api_version,
                        reason: reason(&e),
                    });
                }
            };
            seen.insert(api_version.clone(), plurals);
        }
        if seen[&api_version]
            .as_ref()
            .is_some_and(|plurals| plurals.contains(&entry.plural))
        {
            return Ok(Some(version.clone()));
        }
    }
    Ok(None)
}

/// Lists every audited kind the cluster serves, in every namespace (`namespaces` empty) or in
/// each of `namespaces` (cluster-scoped kinds only when `namespaces` is empty), `page_size`
/// objects per call, and hands each page to `on_page` (objects with their `apiVersion` and
/// `kind`, which list items do not carry). Returns the kinds of the table the cluster does not
/// serve, skipped.
pub async fn list_workloads(
    client: &kube::Client,
    table: &'static WorkloadKinds,
    namespaces: &[String],
    page_size: u32,
    mut on_page: impl FnMut(AuditedKind, Vec<Value>),
) -> Result<Vec<String>, ListError> {
    let scopes: Vec<Option<&str>> = if namespaces.is_empty() {
        vec![None]
    } else {
        namespaces.iter().map(|n| Some(n.as_str())).collect()
    };
    let mut seen = std::collections::BTreeMap::new();
    let mut skipped = Vec::new();
    for kind in AuditedKind::all(table) {
        let Some(version) = served_version(client, kind, &mut seen).await? else {
            skipped.push(kind.display());
            continue;
        };
        let ar = api_resource(kind, &version);
        let cluster_scoped = matches!(kind, AuditedKind::Table(e) if e.scope == Scope::Cluster);
        if cluster_scoped && !namespaces.is_empty() {
            continue;
        }
        let kind_scopes: &[Option<&str>] = if cluster_scoped { &[None] } else { &scopes };
        for scope in kind_scopes {
            let api: Api<DynamicObject> = match scope {
                Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
                None => Api::all_with(client.clone(), &ar),
            };
            let fail = |e: kube::Error| match scope {
                Some(ns) => ListError::Namespace {
                    plural: kind.plural().to_string(),
                    namespace: ns.to_string(),
                    reason: reason(&e),
                },
                None => ListError::AllNamespaces {
                    plural: kind.plural().to_string(),
                    reason: reason(&e),
                },
            };
            let mut params = ListParams::default().limit(page_size);
            loop {
                let page = api.list(&params).await.map_err(fail)?;
                let objects = page
                    .items
                    .into_iter()
                    .map(|mut o| {
                        o.types = Some(kube::api::TypeMeta {
                            api_version: ar.api_version.clone(),
                            kind: ar.kind.clone(),
                        });
                        serde_json::to_value(o).unwrap_or(Value::Null)
                    })
                    .collect();
                on_page(kind, objects);
                match page.metadata.continue_.filter(|c| !c.is_empty()) {
                    Some(token) => params = params.continue_token(&token),
                    None => break,
                }
            }
        }
    }
    Ok(skipped)
}
