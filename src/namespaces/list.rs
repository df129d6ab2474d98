//! A one-time list of the cluster's Namespaces (`review --from-cluster`, `audit --from-cluster`):
//! metadata only, as `serve`'s watch reads them, kept by the same rules
//! ([`super::reflect::NamespaceRules`]).

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ListParams};

use super::Namespaces;
use super::reflect::NamespaceRules;
use crate::reflector::{Objects, Rules};

/// Every Namespace's labels, `page_size` namespaces per list call.
pub async fn list_once(client: &kube::Client, page_size: u32) -> Result<Namespaces, kube::Error> {
    let api: Api<Namespace> = Api::all(client.clone());
    let mut params = ListParams::default().limit(page_size);
    let mut namespaces = Namespaces::default();
    loop {
        let page = api.list_metadata(&params).await?;
        for ns in page.items {
            // Every namespace converts (see NamespaceRules).
            if let Ok((name, labels)) = NamespaceRules.convert(ns) {
                namespaces.insert(name, labels);
            }
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(namespaces),
        }
    }
}
