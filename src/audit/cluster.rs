//! What `audit --from-cluster` reads of the workloads (the Namespaces are
//! [`crate::namespaces::list`]'s): the audited kinds, with list calls only (never a watch, never
//! a write), in pages of `limit` objects followed by `continue` tokens, so that a cluster of
//! 50 000 pods is read a page at a time and each page is evaluated and dropped before the next
//! one is asked for.
//!
//! The audit is all or nothing: when one list fails (a namespace the user may not read, an
//! expired `continue` token), the error names the resource and the namespace, and no report is
//! written, so that a partial count is never taken for the cluster's.

use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use serde_json::Value;

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
        plural: &'static str,
        namespace: String,
        reason: String,
    },
    #[error(
        "cannot list {plural} in all namespaces: {reason}; the audit is incomplete, so no report \
         is written (audit the namespaces you can read with --namespace NS)"
    )]
    AllNamespaces {
        plural: &'static str,
        reason: String,
    },
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

fn api_resource(kind: AuditedKind) -> ApiResource {
    let (group, version) = kind.group_version();
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

/// Lists every audited kind, in every namespace (`namespaces` empty) or in each of
/// `namespaces`, `page_size` objects per call, and hands each page to `on_page` (objects with
/// their `apiVersion` and `kind`, which list items do not carry).
pub async fn list_workloads(
    client: &kube::Client,
    namespaces: &[String],
    page_size: u32,
    mut on_page: impl FnMut(AuditedKind, Vec<Value>),
) -> Result<(), ListError> {
    let scopes: Vec<Option<&str>> = if namespaces.is_empty() {
        vec![None]
    } else {
        namespaces.iter().map(|n| Some(n.as_str())).collect()
    };
    for kind in AuditedKind::ALL {
        let ar = api_resource(kind);
        for scope in &scopes {
            let api: Api<DynamicObject> = match scope {
                Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
                None => Api::all_with(client.clone(), &ar),
            };
            let fail = |e: kube::Error| match scope {
                Some(ns) => ListError::Namespace {
                    plural: kind.plural(),
                    namespace: ns.to_string(),
                    reason: reason(&e),
                },
                None => ListError::AllNamespaces {
                    plural: kind.plural(),
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
    Ok(())
}
