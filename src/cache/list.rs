//! A one-time list of the cluster's routing objects (`review --from-cluster`), converted as the
//! watch converts them ([`super::cluster::convert`]).

use kube::api::{Api, DynamicObject, ListParams};

use super::CacheIndex;
use super::cluster::{Kind, Reading, build_index, convert, describe, object_key};
use super::reflect::caps::{CacheLimits, Offer, Selection, cap_flags};

/// The kind's objects in every namespace.
pub(crate) fn api(kind: Kind, client: kube::Client) -> Api<DynamicObject> {
    Api::all_with(client, &kind.api_resource())
}

/// Why the cluster's caches could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ClusterCacheError {
    #[error(
        "cannot reach the cluster (kubeconfig or in-cluster configuration): {0}; \
         --no-cluster resolves against --caches only"
    )]
    Client(#[source] kube::Error),
    #[error("cannot list {kind}: {source}")]
    List {
        kind: Kind,
        #[source]
        source: kube::Error,
    },
    #[error("cannot start the runtime for the cluster client: {0}")]
    Runtime(#[source] std::io::Error),
}

/// A 404 on a kind's collection: its CustomResourceDefinition is not installed.
pub(crate) fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

/// What a one-time list found.
#[derive(Debug)]
pub struct Listed {
    /// The cluster's objects merged with the static ones.
    pub index: CacheIndex,
    /// Kinds whose CRD is not installed, and objects skipped as unusable, for the user.
    pub notes: Vec<String>,
}

/// One page of a kind's objects, whole or metadata only as the kind is read.
async fn list_page(
    kind: Kind,
    api: &Api<DynamicObject>,
    params: &ListParams,
) -> Result<kube::core::ObjectList<DynamicObject>, kube::Error> {
    match kind.reading() {
        Reading::Whole => api.list(params).await,
        Reading::Metadata => {
            let page = api.list_metadata(params).await?;
            Ok(kube::core::ObjectList {
                types: page.types,
                metadata: page.metadata,
                items: page.items.into_iter().map(from_metadata).collect(),
            })
        }
    }
}

/// A metadata-only object as a `DynamicObject` without data, so every kind converts alike.
pub(crate) fn from_metadata(p: kube::core::PartialObjectMeta<DynamicObject>) -> DynamicObject {
    DynamicObject {
        types: p.types,
        metadata: p.metadata,
        data: serde_json::Value::Null,
    }
}

/// Lists every kind once, in pages of 500, and merges `static_index` over them. Objects are
/// converted and bounded as `serve`'s watch converts them, and the namespace caches and
/// exceptions capped as `serve` caps them by default (`--max-caches-per-namespace`,
/// `--max-namespace-caches`, `--max-exceptions-per-namespace`, `--max-exceptions`).
pub async fn list_once(
    client: kube::Client,
    static_index: &CacheIndex,
) -> Result<Listed, ClusterCacheError> {
    let mut objects = Vec::new();
    let mut notes = Vec::new();
    let mut over_cap = Vec::new();
    for kind in Kind::ALL {
        let mut selection = cap_flags(kind).map(|_| {
            Selection::new(match kind {
                Kind::Exception => CacheLimits::DEFAULT_EXCEPTIONS,
                _ => CacheLimits::default(),
            })
        });
        let mut capped = std::collections::HashMap::new();
        let mut ignored = 0;
        let api = api(kind, client.clone());
        let mut params = ListParams::default().limit(500);
        loop {
            let page = match list_page(kind, &api, &params).await {
                Ok(page) => page,
                Err(e) if kind.is_custom() && is_not_found(&e) => {
                    notes.push(format!("{kind}: the CRD is not installed; none listed"));
                    break;
                }
                Err(source) => return Err(ClusterCacheError::List { kind, source }),
            };
            for obj in page.items {
                let key = object_key(&obj);
                let created = obj
                    .metadata
                    .creation_timestamp
                    .as_ref()
                    .map_or(i64::MAX, |t| t.0.as_second());
                match (convert(kind, obj), &mut selection) {
                    (Ok(c), Some(selection)) => match selection.offer(&key, created) {
                        Offer::Kept => {
                            capped.insert(key, c);
                        }
                        Offer::Admitted { displaced } => {
                            for (d, _) in displaced {
                                capped.remove(&d);
                                ignored += 1;
                            }
                            capped.insert(key, c);
                        }
                        Offer::Refused(_) => ignored += 1,
                    },
                    (Ok(c), None) => objects.push(c),
                    (Err(why), _) => notes.push(format!("{} skipped: {why}", describe(kind, &key))),
                }
            }
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(token) => params = params.continue_token(&token),
                None => break,
            }
        }
        objects.extend(capped.into_values());
        if let (Some((per_namespace, total)), true) = (cap_flags(kind), ignored > 0) {
            over_cap.push(format!(
                "{ignored} {kind} objects ignored past the caps (the newest past {per_namespace} \
                 or {total}, as serve's defaults)"
            ));
        }
    }
    notes.extend(over_cap);
    Ok(Listed {
        index: build_index(static_index, &objects),
        notes,
    })
}
