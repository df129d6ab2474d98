//! A small fake of the Kubernetes API server for the cache-watch tests: plain HTTP on 127.0.0.1,
//! speaking the list and watch protocol of custom resources the way the real server does.
//!
//! - `GET /apis/<group>/<version>/<plural>` (and `/namespaces/<ns>/<plural>`): a JSON list whose
//!   `metadata.resourceVersion` is the server's current revision, in pages when `limit` is given
//!   (`metadata.continue` names the next one).
//! - `?watch=true|1&resourceVersion=R`: newline-delimited `ADDED`/`MODIFIED`/`DELETED` events
//!   after `R` (replayed from history, then live), `BOOKMARK`s when `allowWatchBookmarks=true`,
//!   closed after `timeoutSeconds`. A resourceVersion older than the last compaction gets
//!   `200` with an `ERROR` event carrying a `410` Status (as the real server does), or an HTTP
//!   410 in [`FakeApiServer::set_http_410`] mode.
//! - A resource whose CRD is not installed answers 404: a JSON `Status` when other resources of
//!   the group exist, the plain `404 page not found` when none does.
//! - Core `v1` Namespaces, PersistentVolumeClaims and Nodes at `/api/v1/…`, always installed. A request that asks for
//!   metadata only (`Accept: …;as=PartialObjectMetadata[List];g=meta.k8s.io;v=v1`) gets
//!   `PartialObjectMetadata` objects, as the real server answers it.
//! - Workloads for `audit` (Pods, Jobs, CronJobs, Deployments, StatefulSets, DaemonSets,
//!   ReplicaSets) at their real paths, list only, paged by `limit` and `continue`; a namespace
//!   can be made forbidden (403, as RBAC answers), and continue tokens can be made to expire
//!   (410). See [`Workloads`].
//!
//! Tests drive it: install CRDs, apply and delete objects, drop or expire watches, compact the
//! history, make lists fail, and count requests.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::ops::Bound;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use futures::channel::mpsc;
use serde_json::{Value, json};

pub const GROUP: &str = "serving.kserve.io";
pub const VERSION: &str = "v1alpha1";

/// The three model-cache resources: plural, kind, namespaced.
pub const CACHES: &str = "localmodelcaches";
pub const NAMESPACE_CACHES: &str = "localmodelnamespacecaches";
pub const NODE_GROUPS: &str = "localmodelnodegroups";
/// Core Namespaces, PersistentVolumeClaims and Nodes (always installed).
pub const NAMESPACES: &str = "namespaces";
pub const PVCS: &str = "persistentvolumeclaims";
pub const NODES: &str = "nodes";
/// Every resource the model-cache watch reads (Namespaces are the rollout modes').
pub const ALL: [&str; 5] = [CACHES, NAMESPACE_CACHES, NODE_GROUPS, PVCS, NODES];
const KSERVE: &str = "serving.kserve.io/v1alpha1";
const CORE: &str = "v1";
/// Plural, kind, namespaced, apiVersion.
const RESOURCES: [(&str, &str, bool, &str); 6] = [
    (CACHES, "LocalModelCache", false, KSERVE),
    (NAMESPACE_CACHES, "LocalModelNamespaceCache", true, KSERVE),
    (NODE_GROUPS, "LocalModelNodeGroup", false, KSERVE),
    (NAMESPACES, "Namespace", false, CORE),
    (PVCS, "PersistentVolumeClaim", true, CORE),
    (NODES, "Node", false, CORE),
];

type Key = (String, String);

struct Resource {
    kind: &'static str,
    api_version: &'static str,
    namespaced: bool,
    installed: bool,
    objects: BTreeMap<Key, Value>,
    /// (resourceVersion, event type, object) of every change, oldest first.
    history: Vec<(u64, &'static str, Value)>,
    /// Forced status for list requests (a failing list).
    fail_lists: Option<u16>,
}

struct Watch {
    plural: String,
    namespace: Option<String>,
    bookmarks: bool,
    metadata_only: bool,
    tx: mpsc::UnboundedSender<Bytes>,
}

#[derive(Default, Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    pub lists: usize,
    pub watches: usize,
    /// Lists and watches that asked for metadata only.
    pub metadata_only: usize,
}

struct Inner {
    revision: u64,
    /// Watches from a resourceVersion below this get 410 Gone.
    compacted: u64,
    http_410: bool,
    /// Changes are not delivered to open watches (a stuck connection).
    partitioned: bool,
    resources: HashMap<String, Resource>,
    watches: Vec<Watch>,
    requests: usize,
    counts: HashMap<String, Counts>,
    /// Taken away ([`FakeApiServer::take_down`]): requests on connections still open get 503.
    down: bool,
    workloads: Workloads,
}

#[derive(Clone)]
pub struct FakeApiServer {
    addr: SocketAddr,
    inner: Arc<Mutex<Inner>>,
    /// The accept loop, aborted by [`FakeApiServer::take_down`].
    serving: Arc<Mutex<Option<tokio::task::JoinHandle<()>>>>,
}

fn line(kind: &str, object: &Value) -> Bytes {
    let mut s = json!({"type": kind, "object": object}).to_string();
    s.push('\n');
    Bytes::from(s)
}

fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": reason, "code": code,
    })
}

fn json_response(code: u16, body: &Value) -> Response {
    (
        StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

impl FakeApiServer {
    /// Starts the server with the CRDs of `installed` (plurals) installed.
    pub async fn start(installed: &[&str]) -> Self {
        let resources = RESOURCES
            .iter()
            .map(|&(plural, kind, namespaced, api_version)| {
                let r = Resource {
                    kind,
                    api_version,
                    namespaced,
                    installed: installed.contains(&plural) || api_version == CORE,
                    objects: BTreeMap::new(),
                    history: Vec::new(),
                    fail_lists: None,
                };
                (plural.to_string(), r)
            })
            .collect();
        let inner = Arc::new(Mutex::new(Inner {
            revision: 1,
            compacted: 0,
            http_410: false,
            partitioned: false,
            resources,
            watches: Vec::new(),
            requests: 0,
            counts: HashMap::new(),
            down: false,
            workloads: Workloads::default(),
        }));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = FakeApiServer {
            addr,
            inner,
            serving: Arc::new(Mutex::new(None)),
        };
        server.serve(listener);
        server
    }

    fn serve(&self, listener: tokio::net::TcpListener) {
        let app = Router::new()
            .fallback(handle)
            .with_state(self.inner.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        *self.serving.lock().unwrap() = Some(task);
    }

    /// The API server goes away (used by examples/fault_load.rs): the listener closes (connections are refused), open watches
    /// end, and a request on a connection that is still open gets 503.
    #[allow(dead_code)]
    pub fn take_down(&self) {
        if let Some(task) = self.serving.lock().unwrap().take() {
            task.abort();
        }
        let mut inner = self.lock();
        inner.down = true;
        inner.watches.clear();
    }

    /// Back on the same address, with the objects and history it had.
    #[allow(dead_code)]
    pub async fn bring_back(&self) {
        let listener = loop {
            match tokio::net::TcpListener::bind(self.addr).await {
                Ok(l) => break l,
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        };
        self.lock().down = false;
        self.serve(listener);
    }

    /// Writes a kubeconfig whose current context is this server, for a `modelgate` process.
    pub fn write_kubeconfig(&self, path: &std::path::Path) {
        std::fs::write(
            path,
            format!(
                "apiVersion: v1\nkind: Config\ncurrent-context: fake\n\
                 clusters: [{{name: fake, cluster: {{server: 'http://{}'}}}}]\n\
                 users: [{{name: fake, user: {{}}}}]\n\
                 contexts: [{{name: fake, context: {{cluster: fake, user: fake}}}}]\n",
                self.addr
            ),
        )
        .expect("write kubeconfig");
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A client of this server, as a kubeconfig pointing at it would give.
    pub fn client(&self) -> kube::Client {
        let config = kube::Config::new(format!("http://{}", self.addr).parse().unwrap());
        kube::Client::try_from(config).unwrap()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap()
    }

    pub fn install(&self, plural: &str) {
        self.lock().resources.get_mut(plural).unwrap().installed = true;
    }

    /// Creates or replaces an object (`apiVersion` and `kind` are filled in); returns its new
    /// resourceVersion.
    pub fn apply(&self, plural: &str, mut object: Value) -> u64 {
        let mut inner = self.lock();
        inner.revision += 1;
        let rv = inner.revision;
        let r = inner.resources.get_mut(plural).unwrap();
        assert!(r.installed, "{plural}: CRD not installed");
        object["apiVersion"] = json!(r.api_version);
        object["kind"] = json!(r.kind);
        object["metadata"]["resourceVersion"] = json!(rv.to_string());
        let key = key_of(&object);
        let kind = if r.objects.insert(key, object.clone()).is_some() {
            "MODIFIED"
        } else {
            "ADDED"
        };
        r.history.push((rv, kind, object.clone()));
        inner.broadcast(plural, kind, &object);
        rv
    }

    pub fn delete(&self, plural: &str, namespace: Option<&str>, name: &str) {
        let mut inner = self.lock();
        inner.revision += 1;
        let rv = inner.revision;
        let r = inner.resources.get_mut(plural).unwrap();
        let key = (namespace.unwrap_or("").to_string(), name.to_string());
        let mut object = r.objects.remove(&key).expect("no such object");
        object["metadata"]["resourceVersion"] = json!(rv.to_string());
        r.history.push((rv, "DELETED", object.clone()));
        inner.broadcast(plural, "DELETED", &object);
    }

    /// Ends every open watch cleanly, as a restarting API server or a load balancer does.
    pub fn drop_watches(&self) -> usize {
        let mut inner = self.lock();
        let n = inner.watches.len();
        inner.watches.clear();
        n
    }

    /// Forgets the history up to now: a watch from an older resourceVersion gets 410 Gone.
    pub fn compact(&self) {
        let mut inner = self.lock();
        inner.compacted = inner.revision;
        for r in inner.resources.values_mut() {
            r.history.clear();
        }
    }

    /// Sends every open watch an `ERROR` event with a 410 Status, then closes it.
    pub fn expire_watches(&self) {
        let mut inner = self.lock();
        let gone = status(410, "Expired", "too old resource version");
        for w in inner.watches.drain(..) {
            let _ = w.tx.unbounded_send(line("ERROR", &gone));
        }
    }

    /// While partitioned, open watches receive no events (they stay open, as a stuck
    /// connection does); the events are lost to them, not queued.
    pub fn set_partitioned(&self, on: bool) {
        self.lock().partitioned = on;
    }

    /// Answer a stale watch with HTTP 410 instead of a 200 carrying an ERROR event.
    pub fn set_http_410(&self, on: bool) {
        self.lock().http_410 = on;
    }

    /// Makes list requests of `plural` fail with `code` (or succeed again with `None`).
    pub fn fail_lists(&self, plural: &str, code: Option<u16>) {
        self.lock().resources.get_mut(plural).unwrap().fail_lists = code;
    }

    /// Sends a BOOKMARK at the current revision to every watch that allowed them.
    pub fn send_bookmarks(&self) {
        let mut inner = self.lock();
        let rv = inner.revision.to_string();
        let mut kinds = HashMap::new();
        for (plural, r) in &inner.resources {
            kinds.insert(plural.clone(), (r.api_version, r.kind));
        }
        inner.watches.retain(|w| {
            if !w.bookmarks {
                return true;
            }
            let (api_version, kind) = kinds[&w.plural];
            let bookmark = json!({
                "apiVersion": api_version, "kind": kind,
                "metadata": {"resourceVersion": rv},
            });
            w.tx.unbounded_send(line("BOOKMARK", &bookmark)).is_ok()
        });
    }

    /// All requests served so far.
    pub fn requests(&self) -> usize {
        self.lock().requests
    }

    pub fn counts(&self, plural: &str) -> Counts {
        self.lock().counts.get(plural).copied().unwrap_or_default()
    }

    /// Watches of `plural` currently open.
    pub fn open_watches(&self, plural: &str) -> usize {
        let mut inner = self.lock();
        inner.watches.retain(|w| !w.tx.is_closed());
        inner.watches.iter().filter(|w| w.plural == plural).count()
    }
}

fn key_of(object: &Value) -> Key {
    let get = |k: &str| {
        object["metadata"][k]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    (get("namespace"), get("name"))
}

impl Inner {
    fn broadcast(&mut self, plural: &str, kind: &'static str, object: &Value) {
        if self.partitioned {
            return;
        }
        let ns = object["metadata"]["namespace"].as_str();
        self.watches.retain(|w| {
            if w.plural != plural || (w.namespace.is_some() && w.namespace.as_deref() != ns) {
                return !w.tx.is_closed();
            }
            let sent = if w.metadata_only {
                metadata_only(object)
            } else {
                object.clone()
            };
            w.tx.unbounded_send(line(kind, &sent)).is_ok()
        });
    }
}

/// `/apis/<group>/<version>[/namespaces/<ns>]/<plural>` or `/api/v1/…` → (apiVersion,
/// namespace, plural).
fn parse_path(path: &str) -> Option<(&'static str, Option<String>, String)> {
    let (api_version, rest) = match path.strip_prefix(&format!("/apis/{GROUP}/{VERSION}/")) {
        Some(rest) => (KSERVE, rest),
        None => (CORE, path.strip_prefix("/api/v1/")?),
    };
    let parts: Vec<&str> = rest.split('/').collect();
    match parts.as_slice() {
        [plural] => Some((api_version, None, plural.to_string())),
        ["namespaces", ns, plural] => Some((api_version, Some(ns.to_string()), plural.to_string())),
        _ => None,
    }
}

/// An object as a metadata-only request sees it.
fn metadata_only(object: &Value) -> Value {
    json!({
        "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
        "metadata": object["metadata"],
    })
}

async fn handle(
    State(inner): State<Arc<Mutex<Inner>>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let metadata_only_request = headers
        .get(header::ACCEPT)
        .and_then(|a| a.to_str().ok())
        .is_some_and(|a| a.contains("as=PartialObjectMetadata"));
    let mut guard = inner.lock().unwrap();
    let inner = &mut *guard;
    if inner.down {
        return json_response(503, &status(503, "ServiceUnavailable", "taken down"));
    }
    inner.requests += 1;
    if let Some(answer) = inner.workloads.answer(&method, &uri, &query) {
        return answer;
    }
    let parsed = parse_path(uri.path());
    let group_of_request = parsed.as_ref().map(|p| p.0);
    let not_found = |inner: &Inner| {
        if inner
            .resources
            .values()
            .any(|r| r.installed && Some(r.api_version) == group_of_request)
        {
            json_response(
                404,
                &status(
                    404,
                    "NotFound",
                    "the server could not find the requested resource",
                ),
            )
        } else {
            (StatusCode::NOT_FOUND, "404 page not found\n").into_response()
        }
    };
    let Some((api_version, namespace, plural)) = parsed else {
        return not_found(inner);
    };
    if method != Method::GET {
        return json_response(405, &status(405, "MethodNotAllowed", "read-only fake"));
    }
    let watch = matches!(query.get("watch").map(String::as_str), Some("true" | "1"));
    let counts = inner.counts.entry(plural.clone()).or_default();
    if watch {
        counts.watches += 1;
    } else {
        counts.lists += 1;
    }
    if metadata_only_request {
        counts.metadata_only += 1;
    }
    let revision = inner.revision;
    let (compacted, http_410) = (inner.compacted, inner.http_410);
    let Some(r) = inner
        .resources
        .get(&plural)
        .filter(|r| r.installed && r.api_version == api_version)
    else {
        return not_found(inner);
    };
    if namespace.is_some() && !r.namespaced {
        return not_found(inner);
    }
    let in_scope = |o: &Value| {
        namespace.is_none() || o["metadata"]["namespace"].as_str() == namespace.as_deref()
    };
    if !watch {
        if let Some(code) = r.fail_lists {
            return json_response(code, &status(code, "InternalError", "list failed (fake)"));
        }
        // Pages as the real server gives them (`limit`, `continue`), in key order; the token is
        // the last key served. Unlike the real server, later pages see changes made meanwhile.
        let limit = query
            .get("limit")
            .and_then(|l| l.parse::<usize>().ok())
            .filter(|l| *l > 0);
        let after = query
            .get("continue")
            .and_then(|c| c.split_once('/'))
            .map(|(ns, name)| (ns.to_string(), name.to_string()));
        let rest: Box<dyn Iterator<Item = (&Key, &Value)>> = match after {
            Some(k) => Box::new(r.objects.range((Bound::Excluded(k), Bound::Unbounded))),
            None => Box::new(r.objects.iter()),
        };
        let mut page: Vec<(&Key, &Value)> = rest
            .filter(|(_, o)| in_scope(o))
            .take(limit.map_or(usize::MAX, |l| l + 1))
            .collect();
        let more = limit.is_some_and(|l| page.len() > l);
        if more {
            page.pop();
        }
        let next = page
            .last()
            .filter(|_| more)
            .map(|((ns, name), _)| format!("{ns}/{name}"));
        let items: Vec<Value> = page
            .into_iter()
            .map(|(_, o)| {
                if metadata_only_request {
                    metadata_only(o)
                } else {
                    o.clone()
                }
            })
            .collect();
        let (list_api_version, list_kind) = if metadata_only_request {
            ("meta.k8s.io/v1", "PartialObjectMetadataList".to_string())
        } else {
            (r.api_version, format!("{}List", r.kind))
        };
        return json_response(
            200,
            &json!({
                "apiVersion": list_api_version,
                "kind": list_kind,
                "metadata": {"resourceVersion": revision.to_string(), "continue": next},
                "items": items,
            }),
        );
    }

    let from = query.get("resourceVersion").map(String::as_str);
    let (tx, rx) = mpsc::unbounded::<Bytes>();
    match from.unwrap_or("") {
        // "Any": the current objects as ADDED, then live.
        "" | "0" => {
            for o in r.objects.values().filter(|o| in_scope(o)) {
                let o = if metadata_only_request {
                    metadata_only(o)
                } else {
                    o.clone()
                };
                let _ = tx.unbounded_send(line("ADDED", &o));
            }
        }
        rv => {
            let Ok(rv) = rv.parse::<u64>() else {
                return json_response(400, &status(400, "BadRequest", "bad resourceVersion"));
            };
            if rv < compacted {
                let message = format!("too old resource version: {rv} ({compacted})");
                if http_410 {
                    return json_response(410, &status(410, "Gone", &message));
                }
                let _ = tx.unbounded_send(line("ERROR", &status(410, "Expired", &message)));
                drop(tx);
                return stream_response(rx, None);
            }
            for (_, kind, o) in r.history.iter().filter(|(v, _, o)| *v > rv && in_scope(o)) {
                let o = if metadata_only_request {
                    metadata_only(o)
                } else {
                    o.clone()
                };
                let _ = tx.unbounded_send(line(kind, &o));
            }
        }
    }
    let bookmarks = query.get("allowWatchBookmarks").map(String::as_str) == Some("true");
    inner.watches.push(Watch {
        plural,
        namespace,
        bookmarks,
        metadata_only: metadata_only_request,
        tx,
    });
    let timeout = query
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .map(Duration::from_secs);
    stream_response(rx, timeout)
}

fn stream_response(rx: mpsc::UnboundedReceiver<Bytes>, timeout: Option<Duration>) -> Response {
    let events = rx.map(Ok::<_, Infallible>);
    let body = match timeout {
        Some(t) => Body::from_stream(events.take_until(tokio::time::sleep(t))),
        None => Body::from_stream(events),
    };
    Response::builder()
        .header(header::CONTENT_TYPE, "application/json")
        .body(body)
        .unwrap()
}

/// The workload kinds `audit` lists: plural, API path prefix, apiVersion, kind.
const WORKLOAD_RESOURCES: [(&str, &str, &str, &str); 7] = [
    ("pods", "/api/v1", "v1", "Pod"),
    ("jobs", "/apis/batch/v1", "batch/v1", "Job"),
    ("cronjobs", "/apis/batch/v1", "batch/v1", "CronJob"),
    ("deployments", "/apis/apps/v1", "apps/v1", "Deployment"),
    ("statefulsets", "/apis/apps/v1", "apps/v1", "StatefulSet"),
    ("daemonsets", "/apis/apps/v1", "apps/v1", "DaemonSet"),
    ("replicasets", "/apis/apps/v1", "apps/v1", "ReplicaSet"),
];

/// One list call of a workload resource, as the server saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkloadList {
    pub plural: String,
    pub namespace: Option<String>,
    pub limit: Option<usize>,
    pub continued: bool,
}

/// Workloads, served list-only with the paging of the real server: `limit` caps a page, and a
/// `metadata.continue` token (opaque to clients) leads to the next one.
#[derive(Default)]
struct Workloads {
    /// By plural, each list in (namespace, name) order.
    objects: HashMap<&'static str, BTreeMap<Key, Value>>,
    forbidden: std::collections::BTreeSet<String>,
    expire_continue: bool,
    lists: Vec<WorkloadList>,
}

impl Workloads {
    fn answer(
        &mut self,
        method: &Method,
        uri: &Uri,
        query: &HashMap<String, String>,
    ) -> Option<Response> {
        let path = uri.path();
        let (plural, prefix, api_version, kind) =
            WORKLOAD_RESOURCES
                .iter()
                .copied()
                .find(|(plural, prefix, _, _)| {
                    path.strip_prefix(prefix).is_some_and(|rest| {
                        rest == format!("/{plural}")
                            || (rest.starts_with("/namespaces/")
                                && rest.ends_with(&format!("/{plural}")))
                    })
                })?;
        let rest = &path[prefix.len()..];
        let namespace = rest
            .strip_prefix("/namespaces/")
            .and_then(|r| r.strip_suffix(&format!("/{plural}")))
            .map(str::to_string);
        if method != Method::GET || query.contains_key("watch") {
            return Some(json_response(
                405,
                &status(405, "MethodNotAllowed", "list-only fake"),
            ));
        }
        let limit = query
            .get("limit")
            .and_then(|l| l.parse::<usize>().ok())
            .filter(|&l| l > 0);
        let token = query.get("continue").filter(|c| !c.is_empty());
        self.lists.push(WorkloadList {
            plural: plural.to_string(),
            namespace: namespace.clone(),
            limit,
            continued: token.is_some(),
        });
        let group = api_version.rsplit_once('/').map_or("", |(g, _)| g);
        match &namespace {
            Some(ns) if self.forbidden.contains(ns) => {
                let message = format!(
                    "{plural} is forbidden: User \"fake\" cannot list resource \"{plural}\" in API group \"{group}\" in the namespace \"{ns}\""
                );
                return Some(json_response(403, &status(403, "Forbidden", &message)));
            }
            None if !self.forbidden.is_empty() => {
                let message = format!(
                    "{plural} is forbidden: User \"fake\" cannot list resource \"{plural}\" in API group \"{group}\" at the cluster scope"
                );
                return Some(json_response(403, &status(403, "Forbidden", &message)));
            }
            _ => {}
        }
        let start = match token {
            None => 0,
            Some(_) if self.expire_continue => {
                let message = "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.";
                return Some(json_response(410, &status(410, "Expired", message)));
            }
            Some(t) => match t
                .strip_prefix("offset-")
                .and_then(|o| o.parse::<usize>().ok())
            {
                Some(o) => o,
                None => {
                    return Some(json_response(
                        400,
                        &status(400, "BadRequest", "bad continue token"),
                    ));
                }
            },
        };
        let all: Vec<&Value> = self
            .objects
            .get(plural)
            .into_iter()
            .flat_map(|m| m.values())
            .filter(|o| {
                namespace.is_none() || o["metadata"]["namespace"].as_str() == namespace.as_deref()
            })
            .collect();
        let end = limit.map_or(all.len(), |l| (start + l).min(all.len()));
        let items: Vec<Value> = all[start.min(end)..end]
            .iter()
            .map(|o| {
                // List items carry no apiVersion and kind; the list does.
                let mut o = (*o).clone();
                if let Some(m) = o.as_object_mut() {
                    m.remove("apiVersion");
                    m.remove("kind");
                }
                o
            })
            .collect();
        let mut metadata = json!({"resourceVersion": "1"});
        if end < all.len() {
            metadata["continue"] = json!(format!("offset-{end}"));
            metadata["remainingItemCount"] = json!(all.len() - end);
        }
        Some(json_response(
            200,
            &json!({"apiVersion": api_version, "kind": format!("{kind}List"), "metadata": metadata, "items": items}),
        ))
    }
}

impl FakeApiServer {
    /// Adds a workload (`plural` one of pods, jobs, cronjobs, deployments, statefulsets,
    /// daemonsets, replicasets); `apiVersion` and `kind` are filled in.
    pub fn add_workload(&self, plural: &str, mut object: Value) {
        let (plural, _, api_version, kind) = WORKLOAD_RESOURCES
            .iter()
            .copied()
            .find(|r| r.0 == plural)
            .unwrap_or_else(|| panic!("{plural}: not a workload resource"));
        object["apiVersion"] = json!(api_version);
        object["kind"] = json!(kind);
        let key = key_of(&object);
        self.lock()
            .workloads
            .objects
            .entry(plural)
            .or_default()
            .insert(key, object);
    }

    /// Lists in `namespace` are refused with 403, and so are lists in all namespaces (the user
    /// has no cluster-wide list permission).
    pub fn forbid_namespace(&self, namespace: &str) {
        self.lock()
            .workloads
            .forbidden
            .insert(namespace.to_string());
    }

    /// Continue tokens are refused with 410 Expired (the list changed too long ago).
    pub fn expire_continue_tokens(&self, on: bool) {
        self.lock().workloads.expire_continue = on;
    }

    /// Every list call of a workload resource so far, in order.
    pub fn workload_lists(&self) -> Vec<WorkloadList> {
        self.lock().workloads.lists.clone()
    }
}
