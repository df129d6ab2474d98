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
//!   (410). Each gets a `metadata.uid` as the real server gives one. See [`Workloads`].
//! - The policy reports `audit --write-reports` writes (`openreports.io/v1alpha1` `reports`,
//!   `wgpolicyk8s.io/v1alpha2` `policyreports`): server-side apply checked against the CRDs
//!   pinned in tests/assets/crds (unknown fields pruned and recorded), get, lists by label
//!   selector in pages, delete; writes in a namespace can be forbidden, one report refused, a
//!   CRD left uninstalled, and every request is recorded. See [`Reports`].
//!
//! - `PATCH …/<plural>/<name>/status` with a JSON merge patch: the object's `status` merged, a
//!   `MODIFIED` event; counted, and refusable (403) as RBAC without the subresource answers.
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
/// modelgate's own ModelgateException (docs/exceptions.md), watched with the caches.
pub const EXCEPTIONS: &str = "modelgateexceptions";
const MODELGATE: &str = "modelgate.io/v1alpha1";
/// Every resource the model-cache watch reads (Namespaces are the rollout modes').
pub const ALL: [&str; 5] = [CACHES, NAMESPACE_CACHES, NODE_GROUPS, PVCS, NODES];
const KSERVE: &str = "serving.kserve.io/v1alpha1";
const CORE: &str = "v1";
/// Read one by one by `images --from-cluster` (a workload's pull credentials).
pub const SECRETS: &str = "secrets";
pub const SERVICE_ACCOUNTS: &str = "serviceaccounts";
/// Plural, kind, namespaced, apiVersion.
const RESOURCES: [(&str, &str, bool, &str); 9] = [
    (CACHES, "LocalModelCache", false, KSERVE),
    (NAMESPACE_CACHES, "LocalModelNamespaceCache", true, KSERVE),
    (NODE_GROUPS, "LocalModelNodeGroup", false, KSERVE),
    (NAMESPACES, "Namespace", false, CORE),
    (PVCS, "PersistentVolumeClaim", true, CORE),
    (NODES, "Node", false, CORE),
    (EXCEPTIONS, "ModelgateException", true, MODELGATE),
    (SECRETS, "Secret", true, CORE),
    (SERVICE_ACCOUNTS, "ServiceAccount", true, CORE),
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
    /// Reads of one object by name.
    pub gets: usize,
    /// Lists and watches that asked for metadata only.
    pub metadata_only: usize,
    /// Merge patches of the `status` subresource.
    pub status_patches: usize,
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
    reports: Reports,
    /// (plural, namespace, name) whose GET is refused with 403.
    forbidden_gets: std::collections::HashSet<(String, String, String)>,
    /// `status` patches are refused with 403 (a ClusterRole without the subresource).
    forbid_status_patches: bool,
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
            reports: Reports::default(),
            forbidden_gets: Default::default(),
            forbid_status_patches: false,
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

    /// The API server goes away (used by benches/harnesses/fault_load.rs): the listener closes (connections are refused), open watches
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

    /// Refuses (403) every patch of a `status` subresource from now on.
    #[allow(dead_code)]
    pub fn forbid_status_patches(&self, on: bool) {
        self.lock().forbid_status_patches = on;
    }

    /// The stored object, as a GET returns it.
    #[allow(dead_code)]
    pub fn object(&self, plural: &str, namespace: &str, name: &str) -> Option<Value> {
        let inner = self.lock();
        let r = inner.resources.get(plural)?;
        r.objects
            .get(&(namespace.to_string(), name.to_string()))
            .cloned()
    }

    /// A GET of `plural` `namespace/name` is refused with 403 Forbidden (no `get` permission).
    pub fn forbid_get(&self, plural: &str, namespace: &str, name: &str) {
        self.lock().forbidden_gets.insert((
            plural.to_string(),
            namespace.to_string(),
            name.to_string(),
        ));
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

    /// [`FakeApiServer::apply`] of every object, under one lock (a burst of thousands, as a
    /// controller or a script creates them). Each is one event with its own resourceVersion.
    #[allow(dead_code)]
    pub fn apply_all(&self, plural: &str, objects: impl IntoIterator<Item = Value>) {
        let mut inner = self.lock();
        for mut object in objects {
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
        }
    }

    /// [`FakeApiServer::delete`] of every `(namespace, name)`, under one lock.
    #[allow(dead_code)]
    pub fn delete_all<'a>(
        &self,
        plural: &str,
        keys: impl IntoIterator<Item = (Option<&'a str>, &'a str)>,
    ) {
        let mut inner = self.lock();
        for (namespace, name) in keys {
            inner.revision += 1;
            let rv = inner.revision;
            let r = inner.resources.get_mut(plural).unwrap();
            let key = (namespace.unwrap_or("").to_string(), name.to_string());
            let mut object = r.objects.remove(&key).expect("no such object");
            object["metadata"]["resourceVersion"] = json!(rv.to_string());
            r.history.push((rv, "DELETED", object.clone()));
            inner.broadcast(plural, "DELETED", &object);
        }
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
    let (api_version, rest) = api_path(path)?;
    let parts: Vec<&str> = rest.split('/').collect();
    match parts.as_slice() {
        [plural] => Some((api_version, None, plural.to_string())),
        ["namespaces", ns, plural] => Some((api_version, Some(ns.to_string()), plural.to_string())),
        _ => None,
    }
}

fn api_path(path: &str) -> Option<(&'static str, &str)> {
    if let Some(rest) = path.strip_prefix(&format!("/apis/{MODELGATE}/")) {
        return Some((MODELGATE, rest));
    }
    match path.strip_prefix(&format!("/apis/{GROUP}/{VERSION}/")) {
        Some(rest) => Some((KSERVE, rest)),
        None => Some((CORE, path.strip_prefix("/api/v1/")?)),
    }
}

/// `GET /api/v1/namespaces/<ns>/<plural>/<name>` (and the same under the KServe group): one
/// object, or a `404` NotFound Status as the real server answers.
fn get_one(inner: &mut Inner, path: &str) -> Option<Response> {
    let (api_version, rest) = api_path(path)?;
    let ["namespaces", ns, plural, name] = rest.split('/').collect::<Vec<_>>()[..] else {
        return None;
    };
    inner.counts.entry(plural.to_string()).or_default().gets += 1;
    if inner
        .forbidden_gets
        .contains(&(plural.to_string(), ns.to_string(), name.to_string()))
    {
        let message = format!(
            "{plural} \"{name}\" is forbidden: User \"fake\" cannot get resource \"{plural}\" in API group \"\" in the namespace \"{ns}\""
        );
        return Some(json_response(403, &status(403, "Forbidden", &message)));
    }
    let found = inner
        .resources
        .get(plural)
        .filter(|r| r.installed && r.api_version == api_version)
        .and_then(|r| r.objects.get(&(ns.to_string(), name.to_string())));
    Some(match found {
        Some(object) => json_response(200, object),
        None => json_response(
            404,
            &status(404, "NotFound", &format!("{plural} \"{name}\" not found")),
        ),
    })
}

/// `PATCH …/namespaces/<ns>/<plural>/<name>/status` with a JSON merge patch: the object's
/// `status` merged (RFC 7386, the rest of the body ignored as the real server ignores it on
/// this subresource), a new resourceVersion and a `MODIFIED` event.
fn patch_status(
    inner: &mut Inner,
    path: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> Option<Response> {
    let (api_version, rest) = api_path(path)?;
    let ["namespaces", ns, plural, name, "status"] = rest.split('/').collect::<Vec<_>>()[..] else {
        return None;
    };
    inner
        .counts
        .entry(plural.to_string())
        .or_default()
        .status_patches += 1;
    if inner.forbid_status_patches {
        let message = format!(
            "{plural}.{api_version} \"{name}\" is forbidden: User \"fake\" cannot patch resource \
             \"{plural}/status\" in the namespace \"{ns}\""
        );
        return Some(json_response(403, &status(403, "Forbidden", &message)));
    }
    let media = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.split(';').next().unwrap_or_default().trim());
    if media != Some("application/merge-patch+json") {
        return Some(json_response(
            415,
            &status(
                415,
                "UnsupportedMediaType",
                "this fake takes merge patches only",
            ),
        ));
    }
    let Ok(patch) = serde_json::from_slice::<Value>(body) else {
        return Some(json_response(400, &status(400, "BadRequest", "not JSON")));
    };
    inner.revision += 1;
    let rv = inner.revision;
    let r = inner
        .resources
        .get_mut(plural)
        .filter(|r| r.installed && r.api_version == api_version)?;
    let Some(object) = r.objects.get_mut(&(ns.to_string(), name.to_string())) else {
        return Some(json_response(
            404,
            &status(404, "NotFound", &format!("{plural} \"{name}\" not found")),
        ));
    };
    let mut merged = object.get("status").cloned().unwrap_or(json!({}));
    json_patch::merge(&mut merged, &patch["status"]);
    object["status"] = merged;
    object["metadata"]["resourceVersion"] = json!(rv.to_string());
    let object = object.clone();
    r.history.push((rv, "MODIFIED", object.clone()));
    inner.broadcast(plural, "MODIFIED", &object);
    Some(json_response(200, &object))
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
    body: Bytes,
) -> Response {
    let metadata_only_request = headers
        .get(header::ACCEPT)
        .and_then(|a| a.to_str().ok())
        .is_some_and(|a| a.contains("as=PartialObjectMetadata"));
    // A report apply may be held, to see how many a client sends at once.
    let hold = (method == Method::PATCH)
        .then(|| inner.lock().unwrap().reports.apply_hold)
        .flatten();
    if let Some(hold) = hold {
        {
            let mut g = inner.lock().unwrap();
            g.reports.applies_in_flight += 1;
            g.reports.most_applies_in_flight = g
                .reports
                .most_applies_in_flight
                .max(g.reports.applies_in_flight);
        }
        tokio::time::sleep(hold).await;
        inner.lock().unwrap().reports.applies_in_flight -= 1;
    }
    let mut guard = inner.lock().unwrap();
    let inner = &mut *guard;
    if inner.down {
        return json_response(503, &status(503, "ServiceUnavailable", "taken down"));
    }
    inner.requests += 1;
    if let Some(answer) = inner.workloads.answer(&method, &uri, &query) {
        return answer;
    }
    if let Some(answer) = inner
        .reports
        .answer(&method, uri.path(), &query, &headers, &body)
    {
        return answer;
    }
    if method == Method::GET
        && let Some(answer) = get_one(inner, uri.path())
    {
        return answer;
    }
    if method == Method::PATCH
        && let Some(answer) = patch_status(inner, uri.path(), &headers, &body)
    {
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

/// The workload kinds `audit` lists: plural, API path prefix, apiVersion, kind. The built-in
/// ones are always served; a custom resource's only once [`FakeApiServer::serve_workload_kind`]
/// installed it (its discovery document says so, as the real server's does).
const WORKLOAD_RESOURCES: [(&str, &str, &str, &str); 10] = [
    ("pods", "/api/v1", "v1", "Pod"),
    ("jobs", "/apis/batch/v1", "batch/v1", "Job"),
    ("cronjobs", "/apis/batch/v1", "batch/v1", "CronJob"),
    ("deployments", "/apis/apps/v1", "apps/v1", "Deployment"),
    ("statefulsets", "/apis/apps/v1", "apps/v1", "StatefulSet"),
    ("daemonsets", "/apis/apps/v1", "apps/v1", "DaemonSet"),
    ("replicasets", "/apis/apps/v1", "apps/v1", "ReplicaSet"),
    (
        "replicationcontrollers",
        "/api/v1",
        "v1",
        "ReplicationController",
    ),
    ("rayclusters", "/apis/ray.io/v1", "ray.io/v1", "RayCluster"),
    (
        "leaderworkersets",
        "/apis/leaderworkerset.x-k8s.io/v1",
        "leaderworkerset.x-k8s.io/v1",
        "LeaderWorkerSet",
    ),
];

/// Whether a workload resource is built into the API server (served without a CRD).
fn built_in(prefix: &str) -> bool {
    matches!(prefix, "/api/v1" | "/apis/batch/v1" | "/apis/apps/v1")
}

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
    /// uids given so far.
    uids: u64,
    /// The custom workload resources installed (by plural).
    served: std::collections::BTreeSet<&'static str>,
    /// Discovery documents asked for, by path.
    pub(crate) discovery: Vec<String>,
}

/// `plural` as the `&'static str` of [`WORKLOAD_RESOURCES`].
fn workload_plural(plural: &str) -> &'static str {
    workload_resource(plural).0
}

fn workload_resource(plural: &str) -> (&'static str, &'static str, &'static str, &'static str) {
    WORKLOAD_RESOURCES
        .iter()
        .copied()
        .find(|r| r.0 == plural)
        .unwrap_or_else(|| panic!("{plural}: not a workload resource"))
}

impl Workloads {
    fn answer(
        &mut self,
        method: &Method,
        uri: &Uri,
        query: &HashMap<String, String>,
    ) -> Option<Response> {
        let path = uri.path();
        if method == Method::GET
            && (path == "/api/v1" || path.matches('/').count() == 3 && path.starts_with("/apis/"))
        {
            return self.discovery(path);
        }
        let (plural, prefix, api_version, kind) = WORKLOAD_RESOURCES
            .iter()
            .copied()
            .filter(|(plural, prefix, _, _)| built_in(prefix) || self.served.contains(plural))
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

impl Workloads {
    /// The discovery document of a group version (`/apis/apps/v1`, `/api/v1`): the workload
    /// resources served there (and, for the core group, what the watches read). `None` (the
    /// plain 404) for a group version that serves no workload resource.
    fn discovery(&mut self, path: &str) -> Option<Response> {
        self.discovery.push(path.to_string());
        let resource = |name: &str, kind: &str, namespaced: bool| {
            json!({"name": name, "singularName": kind.to_lowercase(), "namespaced": namespaced,
                   "kind": kind, "verbs": ["get", "list", "watch"]})
        };
        let mut resources: Vec<Value> = WORKLOAD_RESOURCES
            .iter()
            .filter(|(plural, prefix, _, _)| {
                *prefix == path && (built_in(prefix) || self.served.contains(plural))
            })
            .map(|(plural, _, _, kind)| resource(plural, kind, true))
            .collect();
        if path == "/api/v1" {
            resources.push(resource("namespaces", "Namespace", false));
            resources.push(resource("nodes", "Node", false));
            resources.push(resource(
                "persistentvolumeclaims",
                "PersistentVolumeClaim",
                true,
            ));
        }
        if resources.is_empty() {
            return None;
        }
        let group_version = path
            .trim_start_matches("/api/")
            .trim_start_matches("/apis/");
        Some(json_response(
            200,
            &json!({"kind": "APIResourceList", "apiVersion": "v1",
                    "groupVersion": group_version, "resources": resources}),
        ))
    }
}

impl FakeApiServer {
    /// Installs the CRD of a custom workload resource of [`WORKLOAD_RESOURCES`] (`rayclusters`,
    /// `leaderworkersets`): from then on discovery names it and its objects are listed.
    pub fn serve_workload_kind(&self, plural: &str) {
        let plural = workload_plural(plural);
        self.lock().workloads.served.insert(plural);
    }

    /// The discovery documents asked for so far, by path.
    pub fn discovery_requests(&self) -> Vec<String> {
        self.lock().workloads.discovery.clone()
    }

    /// Adds a workload (`plural` one of pods, jobs, cronjobs, deployments, statefulsets,
    /// daemonsets, replicasets); `apiVersion` and `kind` are filled in, and a `metadata.uid`
    /// when it has none (the real server gives every object one; [`Self::workload_uid`]).
    pub fn add_workload(&self, plural: &str, mut object: Value) {
        let plural = workload_plural(plural);
        let (_, _, api_version, kind) = workload_resource(plural);
        object["apiVersion"] = json!(api_version);
        object["kind"] = json!(kind);
        let mut inner = self.lock();
        if object.pointer("/metadata/uid").is_none_or(Value::is_null) {
            inner.workloads.uids += 1;
            // Deterministic, so that failures read the same from one run to the next.
            object["metadata"]["uid"] = json!(format!(
                "00000000-0000-4000-8000-{:012x}",
                inner.workloads.uids
            ));
        }
        let key = key_of(&object);
        inner
            .workloads
            .objects
            .entry(plural)
            .or_default()
            .insert(key, object);
    }

    /// A workload as it is served (with its uid), if it exists.
    pub fn workload(&self, plural: &str, namespace: &str, name: &str) -> Option<Value> {
        let key = (namespace.to_string(), name.to_string());
        self.lock()
            .workloads
            .objects
            .get(workload_plural(plural))?
            .get(&key)
            .cloned()
    }

    /// The `metadata.uid` of a workload added before.
    pub fn workload_uid(&self, plural: &str, namespace: &str, name: &str) -> String {
        let object = self
            .workload(plural, namespace, name)
            .unwrap_or_else(|| panic!("no {plural} {namespace}/{name}"));
        object["metadata"]["uid"].as_str().unwrap().to_string()
    }

    /// Removes a workload (it was deleted); returns it.
    pub fn remove_workload(&self, plural: &str, namespace: &str, name: &str) -> Value {
        let key = (namespace.to_string(), name.to_string());
        self.lock()
            .workloads
            .objects
            .get_mut(workload_plural(plural))
            .and_then(|m| m.remove(&key))
            .unwrap_or_else(|| panic!("no {plural} {namespace}/{name}"))
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

/// The report resources `audit --write-reports` writes: the OpenReports `Report` and the older
/// wgpolicyk8s.io `PolicyReport`, both namespaced.
pub const REPORTS: &str = "reports";
pub const POLICY_REPORTS: &str = "policyreports";

/// A report kind as its CRD serves it.
#[derive(Clone, Copy, Debug)]
struct ReportResource {
    plural: &'static str,
    group: &'static str,
    version: &'static str,
    kind: &'static str,
    /// The pinned CRD (tests/assets/crds) whose schema the applied objects must match.
    crd: &'static str,
}

const REPORT_RESOURCES: [ReportResource; 2] = [
    ReportResource {
        plural: REPORTS,
        group: "openreports.io",
        version: "v1alpha1",
        kind: "Report",
        crd: "openreports.io_reports.yaml",
    },
    ReportResource {
        plural: POLICY_REPORTS,
        group: "wgpolicyk8s.io",
        version: "v1alpha2",
        kind: "PolicyReport",
        crd: "wgpolicyk8s.io_policyreports.yaml",
    },
];

impl ReportResource {
    fn api_version(&self) -> String {
        format!("{}/{}", self.group, self.version)
    }

    /// `reports.openreports.io`, as the API server names the resource in its messages.
    fn qualified(&self) -> String {
        format!("{}.{}", self.plural, self.group)
    }

    /// The `openAPIV3Schema` of this version in the pinned CRD, read once.
    fn schema(&self) -> &'static Value {
        static SCHEMAS: std::sync::OnceLock<HashMap<&'static str, Value>> =
            std::sync::OnceLock::new();
        let schemas = SCHEMAS.get_or_init(|| {
            REPORT_RESOURCES
                .iter()
                .map(|r| {
                    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                        .join("tests/assets/crds")
                        .join(r.crd);
                    let text = std::fs::read_to_string(&path)
                        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                    let docs = modelgate::documents::read_documents(r.crd, &text).unwrap();
                    let crd = &docs[0].value;
                    let schema = crd["spec"]["versions"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .find(|v| v["name"] == r.version)
                        .unwrap_or_else(|| panic!("{}: no version {}", r.crd, r.version))["schema"]
                        ["openAPIV3Schema"]
                        .clone();
                    (r.plural, schema)
                })
                .collect()
        });
        &schemas[self.plural]
    }
}

/// The `openAPIV3Schema` of the pinned CRD (tests/assets/crds) that applies of `plural`
/// ([`REPORTS`] or [`POLICY_REPORTS`]) are checked against: what the tests validate `audit`'s
/// reports with, whether applied here or written to stdout.
pub fn report_schema(plural: &str) -> &'static Value {
    REPORT_RESOURCES
        .iter()
        .find(|r| r.plural == plural)
        .unwrap_or_else(|| panic!("{plural}: not a report resource"))
        .schema()
}

/// One request to a report resource, as the server saw it and answered it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReportRequest {
    pub method: String,
    /// The resource the path names (`reports`, `policyreports`, or what else was asked for in
    /// their API groups).
    pub plural: String,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub query: BTreeMap<String, String>,
    pub content_type: Option<String>,
    /// A DELETE's `preconditions` (`{"uid": …, "resourceVersion": …}`), if it sent any.
    pub preconditions: Option<Value>,
    /// The status code of the answer.
    pub code: u16,
}

impl ReportRequest {
    /// A server-side apply (a PATCH; whether it was well-formed is in `content_type`, `query`
    /// and `code`).
    pub fn is_apply(&self) -> bool {
        self.method == "PATCH"
    }

    pub fn is_delete(&self) -> bool {
        self.method == "DELETE"
    }

    pub fn is_list(&self) -> bool {
        self.method == "GET" && self.name.is_none()
    }

    /// Any request that would change a report.
    pub fn is_write(&self) -> bool {
        !matches!(self.method.as_str(), "GET" | "HEAD")
    }
}

/// Reports, served as the API server serves a custom resource to one field manager:
/// server-side apply (`PATCH` with `application/apply-patch+yaml` and a `fieldManager`) creates
/// or replaces an object after checking it against the pinned CRD's schema, and prunes the
/// fields the schema does not know; `GET` of one or a list (`labelSelector`, `fieldSelector` on
/// name and namespace, `limit` and `continue`); `DELETE`, with `preconditions`. Writes in a
/// namespace can be forbidden (403, as RBAC answers), one report refused (422), a CRD taken
/// away (the plain 404 of an unknown group).
#[derive(Default)]
struct Reports {
    /// By plural, each in (namespace, name) order.
    objects: HashMap<&'static str, BTreeMap<Key, Value>>,
    not_installed: std::collections::BTreeSet<&'static str>,
    forbidden_writes: std::collections::BTreeSet<String>,
    /// Namespaces whose lists are forbidden (403); `""` for the list in all namespaces.
    forbidden_lists: std::collections::BTreeSet<String>,
    /// A list's continue token has expired (410, as after etcd's compaction).
    expire_continue: bool,
    /// A report written again (a new resourceVersion) right after the next list that returns
    /// it, as another writer beside the client would.
    rewrite_after_list: Option<Key>,
    /// How long each report apply is held before it is answered.
    apply_hold: Option<std::time::Duration>,
    applies_in_flight: usize,
    most_applies_in_flight: usize,
    /// Report name → the message its apply is refused with.
    refused: BTreeMap<String, String>,
    requests: Vec<ReportRequest>,
    /// Fields dropped from applied objects: `Kind ns/name: path`.
    pruned: Vec<String>,
    revision: u64,
    uids: u64,
}

/// A custom resource's metadata fields the API server keeps (ObjectMeta); others are dropped.
const OBJECT_META: [&str; 15] = [
    "name",
    "generateName",
    "namespace",
    "selfLink",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "labels",
    "annotations",
    "ownerReferences",
    "finalizers",
    "managedFields",
];

impl Reports {
    fn answer(
        &mut self,
        method: &Method,
        path: &str,
        query: &HashMap<String, String>,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Option<Response> {
        let rest = path.strip_prefix("/apis/")?;
        let (resource, rest) = REPORT_RESOURCES.iter().find_map(|r| {
            rest.strip_prefix(&format!("{}/{}/", r.group, r.version))
                .map(|rest| (*r, rest))
        })?;
        let parts: Vec<&str> = rest.split('/').collect();
        let (namespace, plural, name) = match parts.as_slice() {
            [plural] => (None, *plural, None),
            ["namespaces", ns, plural] => (Some(ns.to_string()), *plural, None),
            ["namespaces", ns, plural, name] => {
                (Some(ns.to_string()), *plural, Some(name.to_string()))
            }
            // A subresource, a cluster-scoped path: nothing this fake serves.
            _ => (None, rest, None),
        };
        let content_type = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let response = if plural != resource.plural || self.not_installed.contains(plural) {
            // The group has no other resource here: the API server does not know it at all.
            (StatusCode::NOT_FOUND, "404 page not found\n").into_response()
        } else {
            self.serve(
                resource,
                method,
                namespace.as_deref(),
                name.as_deref(),
                query,
                content_type.as_deref(),
                body,
            )
        };
        self.requests.push(ReportRequest {
            method: method.to_string(),
            plural: plural.to_string(),
            namespace,
            name,
            query: query.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            content_type,
            preconditions: (*method == Method::DELETE)
                .then(|| serde_json::from_slice::<Value>(body).ok())
                .flatten()
                .map(|o| o["preconditions"].clone())
                .filter(|p| !p.is_null()),
            code: response.status().as_u16(),
        });
        Some(response)
    }

    #[allow(clippy::too_many_arguments)]
    fn serve(
        &mut self,
        r: ReportResource,
        method: &Method,
        namespace: Option<&str>,
        name: Option<&str>,
        query: &HashMap<String, String>,
        content_type: Option<&str>,
        body: &[u8],
    ) -> Response {
        if query.contains_key("watch") {
            return json_response(
                405,
                &status(
                    405,
                    "MethodNotAllowed",
                    "this fake serves no watch of reports",
                ),
            );
        }
        let write = *method == Method::PATCH || *method == Method::DELETE;
        if let (true, Some(ns), Some(name)) = (write, namespace, name)
            && self.forbidden_writes.contains(ns)
        {
            let verb = method.as_str().to_lowercase();
            let message = format!(
                "{} \"{name}\" is forbidden: User \"fake\" cannot {verb} resource \"{}\" in API group \"{}\" in the namespace \"{ns}\"",
                r.qualified(),
                r.plural,
                r.group
            );
            return json_response(403, &status(403, "Forbidden", &message));
        }
        if let (&Method::GET, None) = (method, name)
            && self.forbidden_lists.contains(namespace.unwrap_or_default())
        {
            let place = namespace.map_or("at the cluster scope".to_string(), |ns| {
                format!("in the namespace \"{ns}\"")
            });
            let message = format!(
                "{} is forbidden: User \"fake\" cannot list resource \"{}\" in API group \"{}\" {place}",
                r.qualified(),
                r.plural,
                r.group
            );
            return json_response(403, &status(403, "Forbidden", &message));
        }
        if let (&Method::GET, None, true) = (method, name, self.expire_continue)
            && query.get("continue").is_some_and(|c| !c.is_empty())
        {
            let message = "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.";
            return json_response(410, &status(410, "Expired", message));
        }
        match (method, namespace, name) {
            (&Method::GET, _, None) => self.list(r, namespace, query),
            (&Method::GET, Some(ns), Some(name)) => {
                match self.stored(r.plural).get(&(ns.into(), name.into())) {
                    Some(o) => json_response(200, o),
                    None => not_found_status(r, name),
                }
            }
            (&Method::PATCH, Some(ns), Some(name)) => {
                self.apply(r, ns, name, query, content_type, body)
            }
            (&Method::DELETE, Some(ns), Some(name)) => self.delete(r, ns, name, body),
            _ => json_response(
                405,
                &status(
                    405,
                    "MethodNotAllowed",
                    "this fake takes reports by server-side apply (PATCH) only",
                ),
            ),
        }
    }

    fn stored(&mut self, plural: &str) -> &mut BTreeMap<Key, Value> {
        let plural = REPORT_RESOURCES
            .iter()
            .find(|r| r.plural == plural)
            .unwrap_or_else(|| panic!("{plural}: not a report resource"))
            .plural;
        self.objects.entry(plural).or_default()
    }

    fn list(
        &mut self,
        r: ReportResource,
        namespace: Option<&str>,
        query: &HashMap<String, String>,
    ) -> Response {
        let selector = match LabelSelector::parse(query.get("labelSelector").map_or("", |s| s)) {
            Ok(s) => s,
            Err(e) => return json_response(400, &status(400, "BadRequest", &e)),
        };
        let mut fields = Vec::new();
        for term in query
            .get("fieldSelector")
            .map_or("", |s| s)
            .split(',')
            .filter(|t| !t.is_empty())
        {
            let (field, value) = term
                .split_once("==")
                .or_else(|| term.split_once('='))
                .unwrap_or((term, ""));
            if field != "metadata.name" && field != "metadata.namespace" {
                let message = format!(
                    "\"{field}\" is not a known field selector: only \"metadata.name\", \"metadata.namespace\""
                );
                return json_response(400, &status(400, "BadRequest", &message));
            }
            fields.push((field.trim_start_matches("metadata.").to_string(), value));
        }
        let limit = query
            .get("limit")
            .and_then(|l| l.parse::<usize>().ok())
            .filter(|l| *l > 0);
        let after = match query.get("continue").filter(|c| !c.is_empty()) {
            None => None,
            Some(token) => match token.strip_prefix("after:").and_then(|k| k.split_once('/')) {
                Some((ns, name)) => Some((ns.to_string(), name.to_string())),
                None => {
                    return json_response(400, &status(400, "BadRequest", "bad continue token"));
                }
            },
        };
        let revision = self.revision;
        let objects = self.stored(r.plural);
        let rest: Box<dyn Iterator<Item = (&Key, &Value)>> = match after {
            Some(k) => Box::new(objects.range((Bound::Excluded(k), Bound::Unbounded))),
            None => Box::new(objects.iter()),
        };
        let matching: Vec<(&Key, &Value)> = rest
            .filter(|(_, o)| {
                namespace.is_none_or(|ns| o["metadata"]["namespace"] == ns)
                    && selector.matches(&o["metadata"]["labels"])
                    && fields
                        .iter()
                        .all(|(field, value)| o["metadata"][field] == *value)
            })
            .collect();
        let end = limit.map_or(matching.len(), |l| l.min(matching.len()));
        let mut metadata = json!({"resourceVersion": revision.to_string()});
        if end < matching.len() {
            let (ns, name) = matching[end - 1].0;
            metadata["continue"] = json!(format!("after:{ns}/{name}"));
            metadata["remainingItemCount"] = json!(matching.len() - end);
        }
        let items: Vec<Value> = matching[..end].iter().map(|(_, o)| (*o).clone()).collect();
        let listed = |key: &Key| {
            items.iter().any(|o| {
                o["metadata"]["namespace"] == key.0.as_str()
                    && o["metadata"]["name"] == key.1.as_str()
            })
        };
        if let Some(key) = self.rewrite_after_list.take_if(|k| listed(k)) {
            self.revision += 1;
            let revision = self.revision.to_string();
            if let Some(o) = self.stored(r.plural).get_mut(&key) {
                o["metadata"]["resourceVersion"] = json!(revision);
            }
        }
        json_response(
            200,
            &json!({
                "apiVersion": r.api_version(),
                "kind": format!("{}List", r.kind),
                "metadata": metadata,
                "items": items,
            }),
        )
    }

    fn apply(
        &mut self,
        r: ReportResource,
        namespace: &str,
        name: &str,
        query: &HashMap<String, String>,
        content_type: Option<&str>,
        body: &[u8],
    ) -> Response {
        let media = content_type
            .and_then(|c| c.split(';').next())
            .map(str::trim);
        if media != Some("application/apply-patch+yaml") {
            // The real server would take a JSON or merge patch too; a report must be applied.
            let message = format!(
                "the body of the request was in an unknown format ({}) - this fake accepts application/apply-patch+yaml (server-side apply) only",
                media.unwrap_or("no Content-Type")
            );
            return json_response(415, &status(415, "UnsupportedMediaType", &message));
        }
        let Some(manager) = query.get("fieldManager").filter(|m| !m.is_empty()) else {
            return invalid(
                "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch",
            );
        };
        let force = match query.get("force").map(String::as_str) {
            None | Some("false") => false,
            Some("true") => true,
            Some(other) => {
                let message = format!("force: Invalid value: \"{other}\": not a boolean");
                return json_response(400, &status(400, "BadRequest", &message));
            }
        };
        let text = match std::str::from_utf8(body) {
            Ok(t) => t,
            Err(_) => return bad_request("the body is not UTF-8"),
        };
        let mut object = match modelgate::documents::read_documents("body", text) {
            Ok(docs) if docs.len() == 1 => docs.into_iter().next().unwrap().value,
            Ok(docs) => {
                return bad_request(&format!("expected one object, found {}", docs.len()));
            }
            Err(e) => return bad_request(&format!("error decoding YAML: {e}")),
        };
        if object["apiVersion"] != r.api_version().as_str() || object["kind"] != r.kind {
            return bad_request(&format!(
                "the object's apiVersion and kind ({} {}) are not those of the URL ({} {})",
                object["apiVersion"],
                object["kind"],
                r.api_version(),
                r.kind
            ));
        }
        if object["metadata"]["name"] != name {
            return bad_request(&format!(
                "the name of the object ({}) does not match the name on the URL ({name})",
                object["metadata"]["name"]
            ));
        }
        match &object["metadata"]["namespace"] {
            Value::Null => object["metadata"]["namespace"] = json!(namespace),
            ns if ns == namespace => {}
            _ => {
                return bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                );
            }
        }
        if !object["metadata"]["managedFields"].is_null() {
            return bad_request("metadata.managedFields must be nil");
        }
        let what = format!("{}.{} \"{name}\"", r.kind, r.group);
        if let Some(message) = self.refused.get(name) {
            return invalid(&format!("{what} is invalid: {message}"));
        }
        let mut errors = Vec::new();
        let mut pruned = Vec::new();
        check_metadata(&mut object["metadata"], &mut errors, &mut pruned);
        if let Some(fields) = object.as_object_mut() {
            let schema = r.schema();
            for (key, value) in fields.iter_mut() {
                if !matches!(key.as_str(), "apiVersion" | "kind" | "metadata") {
                    check_schema(
                        &schema["properties"][key],
                        value,
                        key,
                        &mut errors,
                        &mut pruned,
                    );
                }
            }
            fields.retain(|key, value| {
                let known = !schema["properties"][key].is_null();
                if !known {
                    pruned.push(key.clone());
                }
                known && !value.is_null()
            });
        }
        if !errors.is_empty() {
            let list = if errors.len() == 1 {
                errors.remove(0)
            } else {
                format!("[{}]", errors.join(", "))
            };
            return invalid(&format!("{what} is invalid: {list}"));
        }
        let key = (namespace.to_string(), name.to_string());
        let existing = self.stored(r.plural).get(&key).cloned();
        if let Some(existing) = &existing {
            let owner = existing["metadata"]["managedFields"][0]["manager"]
                .as_str()
                .unwrap_or_default();
            if owner != manager && !force {
                let message =
                    format!("Apply failed with 1 conflict: conflict with \"{owner}\": .results");
                return json_response(409, &status(409, "Conflict", &message));
            }
        }
        if let Some(rv) = object["metadata"]["resourceVersion"].as_str()
            && existing
                .as_ref()
                .is_none_or(|e| e["metadata"]["resourceVersion"] != rv)
        {
            return json_response(
                409,
                &status(
                    409,
                    "Conflict",
                    &format!(
                        "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
                        r.qualified()
                    ),
                ),
            );
        }
        for p in pruned {
            self.pruned
                .push(format!("{} {namespace}/{name}: {p}", r.kind));
        }
        let (uid, created, generation, rv) = match &existing {
            Some(e) => (
                e["metadata"]["uid"].clone(),
                e["metadata"]["creationTimestamp"].clone(),
                e["metadata"]["generation"].as_u64().unwrap_or(1),
                e["metadata"]["resourceVersion"].clone(),
            ),
            None => {
                self.uids += 1;
                (
                    json!(format!("00000000-0000-4000-9000-{:012x}", self.uids)),
                    json!("2026-01-01T00:00:00Z"),
                    1,
                    Value::Null,
                )
            }
        };
        let meta = &mut object["metadata"];
        meta["uid"] = uid;
        meta["creationTimestamp"] = created;
        meta["generation"] = json!(generation);
        meta["resourceVersion"] = rv;
        meta["managedFields"] = json!([{
            "manager": manager, "operation": "Apply", "apiVersion": r.api_version(),
            "fieldsType": "FieldsV1", "fieldsV1": {}, "time": "2026-01-01T00:00:00Z",
        }]);
        // As the real server: an apply that changes nothing changes no resourceVersion.
        if existing.as_ref() != Some(&object) {
            self.revision += 1;
            object["metadata"]["resourceVersion"] = json!(self.revision.to_string());
            if existing.is_some() {
                object["metadata"]["generation"] = json!(generation + 1);
            }
        }
        self.stored(r.plural).insert(key, object.clone());
        json_response(if existing.is_some() { 200 } else { 201 }, &object)
    }

    fn delete(&mut self, r: ReportResource, namespace: &str, name: &str, body: &[u8]) -> Response {
        let key = (namespace.to_string(), name.to_string());
        let Some(existing) = self.stored(r.plural).get(&key).cloned() else {
            return not_found_status(r, name);
        };
        let options: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        for field in ["uid", "resourceVersion"] {
            let wanted = &options["preconditions"][field];
            if !wanted.is_null() && *wanted != existing["metadata"][field] {
                let message = format!(
                    "Precondition failed: {field} in precondition: {}, {field} in object meta: {}",
                    wanted, existing["metadata"][field]
                );
                return json_response(409, &status(409, "Conflict", &message));
            }
        }
        self.stored(r.plural).remove(&key);
        self.revision += 1;
        json_response(200, &existing)
    }
}

fn bad_request(message: &str) -> Response {
    json_response(400, &status(400, "BadRequest", message))
}

fn invalid(message: &str) -> Response {
    json_response(422, &status(422, "Invalid", message))
}

fn not_found_status(r: ReportResource, name: &str) -> Response {
    let message = format!("{} \"{name}\" not found", r.qualified());
    let mut body = status(404, "NotFound", &message);
    body["details"] = json!({"name": name, "group": r.group, "kind": r.plural});
    json_response(404, &body)
}

/// An equality-based label selector (`k=v`, `k==v`, `k!=v`, `k`, `!k`, comma-separated), as
/// far as the fake understands selectors; a set-based one is refused rather than ignored.
struct LabelSelector(Vec<Requirement>);

enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    Exists(String),
    NotExists(String),
}

impl LabelSelector {
    fn parse(text: &str) -> Result<Self, String> {
        let mut terms = Vec::new();
        for term in text.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            if term.contains('(') || term.contains(' ') {
                return Err(format!(
                    "unable to parse requirement: {term:?} (this fake takes equality selectors only)"
                ));
            }
            let parsed = if let Some((k, v)) = term.split_once("!=") {
                Requirement::NotEquals(k.into(), v.into())
            } else if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
                Requirement::Equals(k.into(), v.into())
            } else if let Some(k) = term.strip_prefix('!') {
                Requirement::NotExists(k.into())
            } else {
                Requirement::Exists(term.into())
            };
            terms.push(parsed);
        }
        Ok(LabelSelector(terms))
    }

    fn matches(&self, labels: &Value) -> bool {
        let label = |k: &str| labels.get(k).and_then(Value::as_str);
        self.0.iter().all(|r| match r {
            Requirement::Equals(k, v) => label(k) == Some(v.as_str()),
            Requirement::NotEquals(k, v) => label(k) != Some(v.as_str()),
            Requirement::Exists(k) => label(k).is_some(),
            Requirement::NotExists(k) => label(k).is_none(),
        })
    }
}

fn dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|part| {
            !part.is_empty()
                && part
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !part.starts_with('-')
                && !part.ends_with('-')
        })
}

/// A label value, or the name part of a label key.
fn label_name(s: &str) -> bool {
    s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && s.bytes().next().is_none_or(|b| b.is_ascii_alphanumeric())
        && s.bytes().last().is_none_or(|b| b.is_ascii_alphanumeric())
}

/// ObjectMeta as the API server validates it for a custom resource: a DNS-subdomain name,
/// well-formed labels, complete owner references; unknown fields are dropped.
fn check_metadata(meta: &mut Value, errors: &mut Vec<String>, pruned: &mut Vec<String>) {
    let Some(fields) = meta.as_object_mut() else {
        errors.push("metadata: Invalid value: not an object".into());
        return;
    };
    fields.retain(|k, _| {
        let known = OBJECT_META.contains(&k.as_str());
        if !known {
            pruned.push(format!("metadata.{k}"));
        }
        known
    });
    let name = fields.get("name").and_then(Value::as_str).unwrap_or("");
    if !dns_subdomain(name) {
        errors.push(format!(
            "metadata.name: Invalid value: {name:?}: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"
        ));
    }
    for map in ["labels", "annotations"] {
        match fields.get(map) {
            None | Some(Value::Null) => {}
            Some(Value::Object(m)) => {
                for (k, v) in m {
                    if !v.is_string() {
                        errors.push(format!("metadata.{map}.{k}: Invalid value: not a string"));
                    }
                    let (prefix, key) = k.rsplit_once('/').unwrap_or(("", k));
                    if key.is_empty()
                        || !label_name(key)
                        || (!prefix.is_empty() && !dns_subdomain(prefix))
                    {
                        errors.push(format!(
                            "metadata.{map}: Invalid value: {k:?}: not a qualified name"
                        ));
                    }
                    if map == "labels" && !label_name(v.as_str().unwrap_or("")) {
                        errors.push(format!(
                            "metadata.labels: Invalid value: {v}: not a valid label value"
                        ));
                    }
                }
            }
            Some(_) => errors.push(format!("metadata.{map}: Invalid value: not an object")),
        }
    }
    if let Some(refs) = fields.get("ownerReferences") {
        let Some(refs) = refs.as_array() else {
            errors.push("metadata.ownerReferences: Invalid value: not an array".into());
            return;
        };
        let mut controllers = 0;
        for r in refs {
            for (field, what) in [
                ("apiVersion", "version"),
                ("kind", "kind"),
                ("name", "name"),
                ("uid", "uid"),
            ] {
                if r[field].as_str().is_none_or(str::is_empty) {
                    errors.push(format!(
                        "metadata.ownerReferences.{field}: Invalid value: \"\": {what} must not be empty"
                    ));
                }
            }
            if r["controller"] == true {
                controllers += 1;
            }
        }
        if controllers > 1 {
            errors.push(
                "metadata.ownerReferences: Invalid value: only one reference can have Controller set to true".into(),
            );
        }
    }
}

/// `value` (at `path`) against a structural schema as the API server checks a custom resource:
/// `type`, `enum`, `required`; fields the schema does not know are dropped (and named in
/// `pruned`), and so are nulls where the schema does not allow them.
fn check_schema(
    schema: &Value,
    value: &mut Value,
    path: &str,
    errors: &mut Vec<String>,
    pruned: &mut Vec<String>,
) {
    if value.is_null() {
        return;
    }
    let ty = schema["type"].as_str().unwrap_or("");
    let actual = match value {
        Value::Object(_) => "object",
        Value::Array(_) => "array",
        Value::String(_) => "string",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_f64() => "number",
        Value::Number(_) => "integer",
        Value::Null => "null",
    };
    let fits = ty.is_empty() || ty == actual || (ty == "number" && actual == "integer");
    if !fits {
        errors.push(format!(
            "{path}: Invalid value: \"{actual}\": {path} in body must be of type {ty}: \"{actual}\""
        ));
        return;
    }
    if let Some(allowed) = schema["enum"].as_array()
        && !allowed.contains(value)
    {
        let list: Vec<String> = allowed.iter().map(Value::to_string).collect();
        errors.push(format!(
            "{path}: Unsupported value: {value}: supported values: {}",
            list.join(", ")
        ));
    }
    match value {
        Value::Object(fields) => {
            for required in schema["required"].as_array().into_iter().flatten() {
                let key = required.as_str().unwrap_or_default();
                if fields.get(key).is_none_or(Value::is_null) {
                    errors.push(format!("{path}.{key}: Required value"));
                }
            }
            let preserve = schema["x-kubernetes-preserve-unknown-fields"] == true;
            let additional = &schema["additionalProperties"];
            fields.retain(|key, v| {
                let sub = if additional.is_object() {
                    additional
                } else {
                    &schema["properties"][key]
                };
                if sub.is_null() && !preserve {
                    pruned.push(format!("{path}.{key}"));
                    return false;
                }
                !v.is_null()
            });
            for (key, v) in fields.iter_mut() {
                let sub = if additional.is_object() {
                    additional
                } else {
                    &schema["properties"][key]
                };
                if !sub.is_null() {
                    check_schema(sub, v, &format!("{path}.{key}"), errors, pruned);
                }
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter_mut().enumerate() {
                if item.is_null() {
                    errors.push(format!(
                        "{path}[{i}]: Invalid value: \"null\": must not be null"
                    ));
                    continue;
                }
                check_schema(
                    &schema["items"],
                    item,
                    &format!("{path}[{i}]"),
                    errors,
                    pruned,
                );
            }
        }
        _ => {}
    }
}

impl FakeApiServer {
    /// Stores a report as another writer would have made it (`manager` its field manager);
    /// `apiVersion`, `kind`, `uid` and `resourceVersion` are filled in. Returns it as stored.
    pub fn seed_report(&self, plural: &str, manager: &str, mut object: Value) -> Value {
        let mut inner = self.lock();
        let reports = &mut inner.reports;
        let r = *REPORT_RESOURCES
            .iter()
            .find(|r| r.plural == plural)
            .unwrap_or_else(|| panic!("{plural}: not a report resource"));
        reports.revision += 1;
        reports.uids += 1;
        object["apiVersion"] = json!(r.api_version());
        object["kind"] = json!(r.kind);
        let meta = &mut object["metadata"];
        meta["uid"] = json!(format!("00000000-0000-4000-a000-{:012x}", reports.uids));
        meta["resourceVersion"] = json!(reports.revision.to_string());
        meta["creationTimestamp"] = json!("2025-06-01T00:00:00Z");
        meta["managedFields"] = json!([{"manager": manager, "operation": "Apply",
            "apiVersion": r.api_version(), "fieldsType": "FieldsV1", "fieldsV1": {}}]);
        let key = key_of(&object);
        reports.stored(plural).insert(key, object.clone());
        object
    }

    /// One stored report.
    pub fn report(&self, plural: &str, namespace: &str, name: &str) -> Option<Value> {
        let key = (namespace.to_string(), name.to_string());
        self.lock().reports.stored(plural).get(&key).cloned()
    }

    /// Every stored report of `plural`, in (namespace, name) order.
    pub fn reports(&self, plural: &str) -> Vec<Value> {
        self.lock()
            .reports
            .stored(plural)
            .values()
            .cloned()
            .collect()
    }

    /// Whether the CRD of `plural` is installed (both are, at the start); without it its API
    /// group is unknown and every request gets the plain `404 page not found`.
    pub fn set_report_crd(&self, plural: &str, installed: bool) {
        let plural = REPORT_RESOURCES
            .iter()
            .find(|r| r.plural == plural)
            .unwrap_or_else(|| panic!("{plural}: not a report resource"))
            .plural;
        let mut inner = self.lock();
        if installed {
            inner.reports.not_installed.remove(plural);
        } else {
            inner.reports.not_installed.insert(plural);
        }
    }

    /// Applies and deletes of reports in `namespace` are refused with 403, as RBAC refuses a
    /// user without write permission there (lists stay allowed).
    /// Report lists in `namespace` (`""`: in all namespaces) are forbidden from now on (403).
    pub fn forbid_report_lists(&self, namespace: &str) {
        self.lock()
            .reports
            .forbidden_lists
            .insert(namespace.to_string());
    }

    /// The report `namespace/name` is written again (a new resourceVersion) right after the next
    /// list that returns it.
    pub fn rewrite_report_after_list(&self, namespace: &str, name: &str) {
        self.lock().reports.rewrite_after_list = Some((namespace.to_string(), name.to_string()));
    }

    /// Holds each report apply this long before answering it, from now on.
    pub fn hold_report_applies(&self, hold: std::time::Duration) {
        self.lock().reports.apply_hold = Some(hold);
    }

    /// The most report applies that were held at once.
    pub fn most_report_applies_at_once(&self) -> usize {
        self.lock().reports.most_applies_in_flight
    }

    /// Continue tokens of report lists have expired from now on (410).
    pub fn expire_report_continue_tokens(&self) {
        self.lock().reports.expire_continue = true;
    }

    pub fn forbid_report_writes(&self, namespace: &str) {
        self.lock()
            .reports
            .forbidden_writes
            .insert(namespace.to_string());
    }

    /// Applies of the report `name` (any namespace, any API) are refused with 422 Invalid and
    /// `message`, as a validating admission policy or webhook would refuse it.
    pub fn refuse_report(&self, name: &str, message: &str) {
        self.lock()
            .reports
            .refused
            .insert(name.to_string(), message.to_string());
    }

    /// Every request to a report resource so far, in order.
    pub fn report_requests(&self) -> Vec<ReportRequest> {
        self.lock().reports.requests.clone()
    }

    /// Fields the server dropped from applied reports (outside the CRD's schema), as
    /// `Kind ns/name: path`: a field there is one the writer meant and the cluster lost.
    pub fn pruned_report_fields(&self) -> Vec<String> {
        self.lock().reports.pruned.clone()
    }
}
