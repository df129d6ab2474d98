//! Reading an image's OCI config through the registry API, with the oci-client crate.
//!
//! A registry is untrusted input. What is bounded here:
//! - every image is read within one deadline (`--image-timeout`): an unanswering, trickling or
//!   redirect-looping registry is a finding for that image, never a hang;
//! - a manifest or index over [`MAX_DOCUMENT`] bytes is refused (oci-client buffers a
//!   manifest's body whole before handing it over, so this is checked after the read; the
//!   deadline bounds how much can arrive before it);
//! - a config blob whose descriptor declares more than [`MAX_DOCUMENT`] bytes is not requested,
//!   and one whose body grows past it is refused and no longer read (it is streamed);
//! - an index with more than [`MAX_INDEX_ENTRIES`] entries is refused;
//! - a manifest asked for by digest must have that digest (oci-client checks it), and the
//!   config's bytes must hash to the digest the manifest names (checked here);
//! - a manifest or config that is not JSON is a finding.
//!
//! What oci-client (0.18) does not let this bound: a manifest, an error answer and a token
//! answer are buffered whole by it (`bytes()`/`text()`) before any size can be checked; its
//! reqwest client follows up to 10 redirects, HTTPS to HTTP included (credentials are dropped
//! across hosts); Basic credentials are sent to whatever token realm a `WWW-Authenticate`
//! challenge names, over whatever scheme. Only the deadline bounds those.
//!
//! The registries are read side by side, each at most `--image-concurrency` images at once, and
//! each config is read once per digest.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use base64::Engine as _;
use futures::StreamExt as _;
use oci_client::client::{Certificate, CertificateEncoding, ClientConfig, ClientProtocol};
use oci_client::manifest::{
    IMAGE_MANIFEST_LIST_MEDIA_TYPE, IMAGE_MANIFEST_MEDIA_TYPE, OCI_IMAGE_INDEX_MEDIA_TYPE,
    OCI_IMAGE_MEDIA_TYPE, OciDescriptor,
};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use serde_json::Value;
use sha2::Digest as _;

/// The largest manifest, index or config read (the distribution spec's manifest limit).
pub const MAX_DOCUMENT: usize = 4 * 1024 * 1024;
/// The most entries an index may have.
pub const MAX_INDEX_ENTRIES: usize = 1024;

const ACCEPT: &[&str] = &[
    OCI_IMAGE_MEDIA_TYPE,
    IMAGE_MANIFEST_MEDIA_TYPE,
    OCI_IMAGE_INDEX_MEDIA_TYPE,
    IMAGE_MANIFEST_LIST_MEDIA_TYPE,
];

/// `--platform OS/ARCH[/VARIANT]`: which manifest of a multi-platform index is read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Platform {
    pub os: String,
    pub architecture: String,
    pub variant: Option<String>,
}

impl Platform {
    /// linux and the architecture of this machine, as Go and OCI name it.
    pub fn host() -> Platform {
        let architecture = match std::env::consts::ARCH {
            "x86_64" => "amd64",
            "aarch64" => "arm64",
            "x86" => "386",
            "powerpc64" => "ppc64le",
            "loongarch64" => "loong64",
            other => other,
        };
        Platform {
            os: "linux".to_string(),
            architecture: architecture.to_string(),
            variant: None,
        }
    }

    fn matches(&self, p: &Value) -> bool {
        let field = |k: &str| p.get(k).and_then(Value::as_str);
        field("os") == Some(self.os.as_str())
            && field("architecture") == Some(self.architecture.as_str())
            && self
                .variant
                .as_deref()
                .is_none_or(|v| field("variant") == Some(v))
    }
}

impl std::fmt::Display for Platform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.os, self.architecture)?;
        if let Some(v) = &self.variant {
            write!(f, "/{v}")?;
        }
        Ok(())
    }
}

impl std::str::FromStr for Platform {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let parts: Vec<&str> = s.split('/').collect();
        let ok = |p: &&str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_alphanumeric());
        match parts.as_slice() {
            [os, arch] if ok(os) && ok(arch) => Ok(Platform {
                os: os.to_string(),
                architecture: arch.to_string(),
                variant: None,
            }),
            [os, arch, variant] if ok(os) && ok(arch) && ok(variant) => Ok(Platform {
                os: os.to_string(),
                architecture: arch.to_string(),
                variant: Some(variant.to_string()),
            }),
            _ => Err(format!(
                "{s:?}: expected OS/ARCH or OS/ARCH/VARIANT (e.g. linux/amd64, linux/arm64/v8)"
            )),
        }
    }
}

/// Credentials from a docker `config.json`, looked up for an image as the kubelet's keyring
/// does (`pkg/credentialprovider`, `BasicDockerKeyring`): an entry's key is a host whose labels
/// may be globs (`*.azurecr.io`), an optional port that must be the image's, and an optional
/// path that must start the image's (`registry.example/team`); every matching entry is a
/// credential to try, the most specific key first; Docker Hub's entry serves the images that
/// name no registry.
#[derive(Default)]
pub struct Credentials {
    /// By key, sorted in reverse (a longer key with the same start, and a host before a glob,
    /// come first, as in the kubelet's index).
    entries: BTreeMap<std::cmp::Reverse<String>, Vec<(String, String)>>,
    /// What the file holds that is not used (credential helpers, identity tokens).
    pub notes: Vec<String>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let keys: Vec<&String> = self.entries.keys().map(|k| &k.0).collect();
        f.debug_struct("Credentials").field("keys", &keys).finish()
    }
}

/// Docker Hub, as its `config.json` entry (`https://index.docker.io/v1/`) is keyed.
const DOCKER_HUB: &str = "index.docker.io";

/// A registry named in `config.json` (`https://index.docker.io/v1/`, `ghcr.io`,
/// `registry.example:5000/team`) as the kubelet keys it: no scheme, no `/v1` or `/v2` prefix of
/// the path, and no path at all when only `/` is left.
fn registry_key(name: &str) -> String {
    let rest = name
        .strip_prefix("https://")
        .or_else(|| name.strip_prefix("http://"))
        .unwrap_or(name);
    let (host, path) = rest.find('/').map_or((rest, ""), |i| rest.split_at(i));
    let path = if path.starts_with("/v1/") || path.starts_with("/v2/") {
        &path[3..]
    } else {
        path
    };
    let host = host.to_ascii_lowercase();
    match path {
        "" | "/" => host,
        _ => format!("{host}{path}"),
    }
}

/// A schemeless reference or key split as the kubelet splits its URL: host labels, port, path.
fn split_location(location: &str) -> (Vec<String>, &str, &str) {
    let (host_port, path) = location
        .find('/')
        .map_or((location, ""), |i| location.split_at(i));
    let (host, port) = match host_port.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') => (h, p),
        _ => (host_port, ""),
    };
    let labels = host
        .to_ascii_lowercase()
        .split('.')
        .map(str::to_string)
        .collect();
    (labels, port, path)
}

/// Whether an entry's key matches an image, as the kubelet's `URLsMatch`: the same port, as
/// many host labels each matching its glob, and the key's path a prefix of the image's.
fn key_matches(key: &str, image: &str) -> bool {
    let (key_labels, key_port, key_path) = split_location(key);
    let (image_labels, image_port, image_path) = split_location(image);
    key_port == image_port
        && key_labels.len() == image_labels.len()
        && image_path.starts_with(key_path)
        && key_labels
            .iter()
            .zip(&image_labels)
            .all(|(glob, label)| label_matches(glob.as_bytes(), label.as_bytes()))
}

/// A host label against a glob label: `*` any run of characters, `?` one, the rest literally.
/// Keys come from pull secrets tenants write, so the match backtracks only to the last `*`:
/// time glob × label at worst, never exponential in the number of `*`.
fn label_matches(glob: &[u8], label: &[u8]) -> bool {
    let (mut g, mut l) = (0, 0);
    // The last `*` seen, and the label position it currently stands up to.
    let mut star: Option<(usize, usize)> = None;
    while l < label.len() {
        match glob.get(g) {
            Some(b'*') => {
                star = Some((g, l));
                g += 1;
            }
            Some(&c) if c == b'?' || c == label[l] => {
                g += 1;
                l += 1;
            }
            _ => match star {
                // The `*` takes one more character, and the rest is tried again after it.
                Some((sg, sl)) => {
                    star = Some((sg, sl + 1));
                    g = sg + 1;
                    l = sl + 1;
                }
                None => return false,
            },
        }
    }
    glob[g..].iter().all(|&c| c == b'*')
}

/// Whether an image pulls from Docker Hub by its name, as the kubelet decides it: no registry
/// part (`ubuntu`, `library/ubuntu`), or `docker.io`/`index.docker.io`.
fn is_docker_hub(image: &str) -> bool {
    match image.split_once('/') {
        _ if image.is_empty() => false,
        None => true,
        Some((first, _)) => {
            first == "docker.io" || first == DOCKER_HUB || !first.contains(['.', ':'])
        }
    }
}

impl Credentials {
    /// Reads a docker `config.json`: `auths.<registry>.auth` (base64 `user:password`) or
    /// `username` and `password`.
    pub fn parse(text: &str) -> Result<Credentials, String> {
        let doc: Value =
            serde_json::from_str(text).map_err(|e| format!("not a docker config.json: {e}"))?;
        let mut creds = Credentials::default();
        for key in ["credsStore", "credHelpers"] {
            if doc.get(key).is_some() {
                creds.notes.push(format!(
                    "{key}: credential helpers are not run; only `auths` entries are used"
                ));
            }
        }
        let Some(auths) = doc.get("auths") else {
            return Ok(creds);
        };
        let auths = auths
            .as_object()
            .ok_or("not a docker config.json: `auths` is not an object")?;
        for (registry, entry) in auths {
            let text = |k: &str| {
                entry
                    .get(k)
                    .and_then(Value::as_str)
                    .filter(|s| !s.is_empty())
            };
            let pair = if let Some(auth) = text("auth") {
                let decoded = base64::engine::general_purpose::STANDARD
                    .decode(auth.trim())
                    .ok()
                    .and_then(|b| String::from_utf8(b).ok())
                    .ok_or_else(|| {
                        format!("auths.{registry}.auth is not base64 of user:password")
                    })?;
                let (u, p) = decoded.split_once(':').ok_or_else(|| {
                    format!("auths.{registry}.auth is not base64 of user:password")
                })?;
                Some((u.to_string(), p.to_string()))
            } else if let (Some(u), Some(p)) = (text("username"), text("password")) {
                Some((u.to_string(), p.to_string()))
            } else {
                if text("identitytoken").is_some() {
                    creds.notes.push(format!(
                        "auths.{registry}: identity tokens are not used; reading it anonymously"
                    ));
                }
                None
            };
            if let Some(pair) = pair {
                creds
                    .entries
                    .entry(std::cmp::Reverse(registry_key(registry)))
                    .or_default()
                    .push(pair);
            }
        }
        Ok(creds)
    }

    /// Reads the older `.dockercfg` format (a `kubernetes.io/dockercfg` Secret): the entries by
    /// registry at the top level, without `auths`.
    pub fn parse_dockercfg(text: &str) -> Result<Credentials, String> {
        let doc: Value =
            serde_json::from_str(text).map_err(|e| format!("not a .dockercfg: {e}"))?;
        if !doc.is_object() {
            return Err("not a .dockercfg: not a JSON object".to_string());
        }
        Credentials::parse(&serde_json::json!({ "auths": doc }).to_string())
    }

    /// Whether it holds no user and password for any registry.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The users and passwords to try for `image` (as the workload writes it), in the
    /// kubelet's order: every entry whose key matches, the most specific first; else, for an
    /// image of Docker Hub, its entry.
    fn lookup(&self, image: &str) -> Vec<&(String, String)> {
        let matched: Vec<&(String, String)> = self
            .entries
            .iter()
            .filter(|(key, _)| key_matches(&key.0, image))
            .flat_map(|(_, pairs)| pairs)
            .collect();
        if !matched.is_empty() || !is_docker_hub(image) {
            return matched;
        }
        self.entries
            .get(&std::cmp::Reverse(DOCKER_HUB.to_string()))
            .map_or_else(Vec::new, |pairs| pairs.iter().collect())
    }

    #[cfg(test)]
    fn auth_for(&self, image: &str) -> RegistryAuth {
        match self.lookup(image).first() {
            Some((u, p)) => RegistryAuth::Basic(u.clone(), p.clone()),
            None => RegistryAuth::Anonymous,
        }
    }
}

/// One user and password to try for a registry, with where it comes from (`pull secret
/// team-a/regcred`, `--registry-config`): the label is what output names, never the secret.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Candidate {
    pub label: String,
    user: String,
    password: String,
}

impl std::fmt::Debug for Candidate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Candidate")
            .field("label", &self.label)
            .finish_non_exhaustive()
    }
}

/// One read of an image: with the credentials to try in turn, as the kubelet tries those of a
/// pod (its pull secrets' in order, then the node's), or anonymously when none names the
/// image's registry.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Read {
    pub image: String,
    pub candidates: Vec<Candidate>,
}

impl Read {
    /// What the read tries, for output: `anonymous`, or the labels of the candidates.
    pub fn tried(&self) -> String {
        if self.candidates.is_empty() {
            "anonymous".to_string()
        } else {
            self.candidates
                .iter()
                .map(|c| c.label.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        }
    }

    /// `text` with every user:password of the candidates (plain, or as base64 in a Basic
    /// header) and every password replaced: nothing a registry or a client error echoes may
    /// print a credential.
    fn redact(&self, text: String) -> String {
        let mut text = text;
        for c in &self.candidates {
            let pair = format!("{}:{}", c.user, c.password);
            let b64 = base64::engine::general_purpose::STANDARD.encode(&pair);
            for secret in [b64.as_str(), pair.as_str(), c.password.as_str()] {
                if !secret.is_empty() {
                    text = text.replace(secret, "<redacted>");
                }
            }
        }
        text
    }
}

/// The label of the credentials of `--registry-config`.
pub const REGISTRY_CONFIG: &str = "--registry-config";

/// How the registries are reached.
#[derive(Debug)]
pub struct Settings {
    pub platform: Platform,
    pub credentials: Credentials,
    /// `HOST:PORT` of the registries reached over plain HTTP.
    pub insecure: Vec<String>,
    /// PEM certificates trusted besides the system's roots.
    pub ca_pem: Vec<Vec<u8>>,
    pub timeout: Duration,
    pub concurrency: usize,
}

/// What was read of one image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fetched {
    /// The image manifest's digest (the platform's, for an index).
    pub digest: String,
    pub index_digest: Option<String>,
    /// The platform chosen, for an index.
    pub platform: Option<String>,
    pub config_digest: String,
    /// `config.User`, as written.
    pub user: Option<String>,
    /// The credentials the read succeeded with: `anonymous`, `pull secret NS/NAME`,
    /// `--registry-config`.
    pub read_with: String,
}

/// Reads image configs, each config digest once.
pub struct Fetcher {
    /// The anonymous client.
    client: Client,
    /// A client per credential: oci-client keeps one login (and its tokens) per registry for
    /// the life of a client, so one client shared by two credentials would read with
    /// whichever came first.
    clients: Mutex<HashMap<Candidate, Client>>,
    settings: Settings,
    /// config digest → `config.User`.
    configs: Mutex<HashMap<String, Option<String>>>,
}

fn new_client(settings: &Settings) -> Result<Client, String> {
    let protocol = if settings.insecure.is_empty() {
        ClientProtocol::Https
    } else {
        ClientProtocol::HttpsExcept(settings.insecure.clone())
    };
    let config = ClientConfig {
        protocol,
        extra_root_certificates: settings
            .ca_pem
            .iter()
            .map(|pem| Certificate {
                encoding: CertificateEncoding::Pem,
                data: pem.clone(),
            })
            .collect(),
        // Indexes are resolved here, with their size and entries bounded.
        platform_resolver: None,
        connect_timeout: Some(settings.timeout),
        read_timeout: Some(settings.timeout),
        ..ClientConfig::default()
    };
    // `Client::new` would fall back to a default client on a bad certificate: not that.
    Client::try_from(config).map_err(|e| format!("registry client: {e}"))
}

impl Fetcher {
    pub fn new(settings: Settings) -> Result<Fetcher, String> {
        // reqwest is built without a crypto provider of its own: ring's, as everywhere here.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = new_client(&settings)?;
        Ok(Fetcher {
            client,
            clients: Mutex::new(HashMap::new()),
            settings,
            configs: Mutex::new(HashMap::new()),
        })
    }

    /// The read of `image` for a workload whose pull secrets are `secrets` (label, parsed
    /// `.dockerconfigjson`), in their order: the secrets' entries for the image's registry,
    /// then `--registry-config`'s, each tried in turn as the kubelet does; none: anonymous.
    pub fn read_for(&self, image: &str, secrets: &[(String, std::sync::Arc<Credentials>)]) -> Read {
        let config = (REGISTRY_CONFIG.to_string(), &self.settings.credentials);
        let candidates = secrets
            .iter()
            .map(|(label, c)| (label.clone(), &**c))
            .chain(std::iter::once(config))
            .flat_map(|(label, c)| {
                c.lookup(image)
                    .into_iter()
                    .map(move |(user, password)| Candidate {
                        label: label.clone(),
                        user: user.clone(),
                        password: password.clone(),
                    })
            })
            .collect();
        Read {
            image: image.to_string(),
            candidates,
        }
    }

    /// Reads every image, each within the per-image timeout: the registries side by side, and
    /// from each registry at most `concurrency` images at once, so that a registry that does
    /// not answer delays no other registry's images. The anonymous reads go first; an image
    /// read anonymously is not read again with credentials (it is public: what a workload's
    /// credentials would read is the same), and its result is given to every read of it.
    pub async fn fetch_all(&self, reads: Vec<Read>) -> BTreeMap<Read, Result<Fetched, String>> {
        let (anonymous, credentialed): (Vec<Read>, Vec<Read>) =
            reads.into_iter().partition(|r| r.candidates.is_empty());
        let mut done = self.fetch_batch(anonymous).await;
        let public: HashMap<String, Fetched> = done
            .iter()
            .filter_map(|(r, f)| Some((r.image.clone(), f.as_ref().ok()?.clone())))
            .collect();
        let (reused, rest): (Vec<Read>, Vec<Read>) = credentialed
            .into_iter()
            .partition(|r| public.contains_key(&r.image));
        for r in reused {
            let f = public[&r.image].clone();
            done.insert(r, Ok(f));
        }
        done.extend(self.fetch_batch(rest).await);
        done
    }

    async fn fetch_batch(&self, reads: Vec<Read>) -> BTreeMap<Read, Result<Fetched, String>> {
        let timeout = self.settings.timeout;
        let mut by_registry: BTreeMap<String, Vec<Read>> = BTreeMap::new();
        for read in reads {
            // An image that does not parse is its own group: it fails at once.
            let registry = read
                .image
                .parse::<Reference>()
                .map(|r| r.resolve_registry().to_string())
                .unwrap_or_else(|_| read.image.clone());
            by_registry.entry(registry).or_default().push(read);
        }
        let per_registry = by_registry.into_values().map(|reads| {
            futures::stream::iter(reads)
                .map(|read| async move {
                    let r = match tokio::time::timeout(timeout, self.fetch_read(&read)).await {
                        Ok(r) => r,
                        Err(_) => Err(format!(
                            "no complete answer from the registry within {timeout:?} \
                             (--image-timeout)"
                        )),
                    };
                    let r = r.map_err(|e| read.redact(e));
                    (read, r)
                })
                .buffer_unordered(self.settings.concurrency.max(1))
                .collect::<Vec<_>>()
        });
        futures::future::join_all(per_registry)
            .await
            .into_iter()
            .flatten()
            .collect()
    }

    /// One read: anonymously, or with each candidate in turn until one succeeds (the kubelet
    /// tries every credential that matches, and none anonymously once one matches).
    async fn fetch_read(&self, read: &Read) -> Result<Fetched, String> {
        if read.candidates.is_empty() {
            return self
                .fetch_with(
                    &self.client,
                    &read.image,
                    &RegistryAuth::Anonymous,
                    "anonymous",
                )
                .await;
        }
        let mut errors = Vec::new();
        for c in &read.candidates {
            let client = {
                let mut clients = self.clients.lock().unwrap_or_else(|e| e.into_inner());
                match clients.get(c) {
                    Some(client) => client.clone(),
                    None => {
                        let client = new_client(&self.settings)?;
                        clients.insert(c.clone(), client.clone());
                        client
                    }
                }
            };
            let auth = RegistryAuth::Basic(c.user.clone(), c.password.clone());
            match self.fetch_with(&client, &read.image, &auth, &c.label).await {
                Ok(f) => return Ok(f),
                Err(e) => errors.push(format!("with {}: {e}", c.label)),
            }
        }
        Err(errors.join("; "))
    }

    /// Reads one image's manifest (through its index) and config, anonymously (with the
    /// credentials of `--registry-config` for its registry, if any).
    pub async fn fetch(&self, image: &str) -> Result<Fetched, String> {
        let read = self.read_for(image, &[]);
        self.fetch_read(&read).await.map_err(|e| read.redact(e))
    }

    async fn fetch_with(
        &self,
        client: &Client,
        image: &str,
        auth: &RegistryAuth,
        label: &str,
    ) -> Result<Fetched, String> {
        let reference: Reference = image
            .parse()
            .map_err(|e| format!("not an image reference: {e}"))?;
        let (doc, digest) = self.manifest(client, &reference, auth).await?;
        let (manifest, digest, index_digest, platform) = if is_index(&doc) {
            let entries = doc
                .get("manifests")
                .and_then(Value::as_array)
                .ok_or("the index has no `manifests` list")?;
            if entries.len() > MAX_INDEX_ENTRIES {
                return Err(format!(
                    "the index has {} entries, more than the {MAX_INDEX_ENTRIES} read",
                    entries.len()
                ));
            }
            let want = &self.settings.platform;
            let chosen = entries
                .iter()
                .find(|e| e.get("platform").is_some_and(|p| want.matches(p)))
                .ok_or_else(|| {
                    let offered: Vec<String> = entries
                        .iter()
                        .filter_map(|e| e.get("platform"))
                        .map(|p| {
                            let f = |k| p.get(k).and_then(Value::as_str).unwrap_or("?");
                            match p.get("variant").and_then(Value::as_str) {
                                Some(v) => format!("{}/{}/{v}", f("os"), f("architecture")),
                                None => format!("{}/{}", f("os"), f("architecture")),
                            }
                        })
                        .collect();
                    format!(
                        "the index has no manifest for {want} (--platform); it has: {}",
                        if offered.is_empty() {
                            "none with a platform".to_string()
                        } else {
                            offered.join(", ")
                        }
                    )
                })?;
            let child = chosen
                .get("digest")
                .and_then(Value::as_str)
                .ok_or("an index entry has no digest")?;
            let declared = chosen.get("size").and_then(Value::as_i64).unwrap_or(0);
            if declared < 0 || declared as u64 > MAX_DOCUMENT as u64 {
                return Err(format!(
                    "the index declares the manifest for {want} as {declared} bytes, over the \
                     {MAX_DOCUMENT} read"
                ));
            }
            let child_ref = reference.clone_with_digest(child.to_string());
            let (child_doc, child_digest) = self.manifest(client, &child_ref, auth).await?;
            if is_index(&child_doc) {
                return Err(format!(
                    "the index's manifest for {want} is itself an index"
                ));
            }
            (
                child_doc,
                child_digest,
                Some(digest),
                Some(want.to_string()),
            )
        } else {
            (doc, digest, None, None)
        };
        let config = manifest
            .get("config")
            .ok_or("the manifest names no config")?;
        let config_digest = config
            .get("digest")
            .and_then(Value::as_str)
            .ok_or("the manifest's config has no digest")?
            .to_string();
        let size = config.get("size").and_then(Value::as_i64).unwrap_or(0);
        if size < 0 || size as u64 > MAX_DOCUMENT as u64 {
            return Err(format!(
                "the config is declared as {size} bytes, over the {MAX_DOCUMENT} read"
            ));
        }
        let cached = self
            .configs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&config_digest)
            .cloned();
        let user = match cached {
            Some(user) => user,
            None => {
                let media_type = config
                    .get("mediaType")
                    .and_then(Value::as_str)
                    .unwrap_or("application/vnd.oci.image.config.v1+json");
                let user = self
                    .config_user(client, &reference, &config_digest, size, media_type)
                    .await?;
                self.configs
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(config_digest.clone(), user.clone());
                user
            }
        };
        Ok(Fetched {
            digest,
            index_digest,
            platform,
            config_digest,
            user,
            read_with: label.to_string(),
        })
    }

    /// A manifest or index as JSON, with its digest.
    async fn manifest(
        &self,
        client: &Client,
        reference: &Reference,
        auth: &RegistryAuth,
    ) -> Result<(Value, String), String> {
        let (body, digest) = client
            .pull_manifest_raw(reference, auth, ACCEPT)
            .await
            .map_err(|e| describe(&e))?;
        if body.len() > MAX_DOCUMENT {
            return Err(format!(
                "the manifest is {} bytes, over the {MAX_DOCUMENT} read",
                body.len()
            ));
        }
        let doc: Value =
            serde_json::from_slice(&body).map_err(|e| format!("the manifest is not JSON: {e}"))?;
        if !doc.is_object() {
            return Err("the manifest is not a JSON object".to_string());
        }
        Ok((doc, digest))
    }

    /// The config blob, streamed and bounded, checked against its digest; its `config.User`.
    async fn config_user(
        &self,
        client: &Client,
        reference: &Reference,
        digest: &str,
        size: i64,
        media_type: &str,
    ) -> Result<Option<String>, String> {
        let descriptor = OciDescriptor {
            media_type: media_type.to_string(),
            digest: digest.to_string(),
            size,
            ..OciDescriptor::default()
        };
        let mut stream = client
            .pull_blob_stream(reference, &descriptor)
            .await
            .map_err(|e| describe(&e))?;
        if stream
            .content_length
            .is_some_and(|n| n > MAX_DOCUMENT as u64)
        {
            return Err(format!(
                "the config is {} bytes, over the {MAX_DOCUMENT} read",
                stream.content_length.unwrap_or_default()
            ));
        }
        let mut body = Vec::new();
        while let Some(chunk) = stream.stream.next().await {
            let chunk = chunk.map_err(|e| format!("reading the config: {}", describe(&e)))?;
            if body.len() + chunk.len() > MAX_DOCUMENT {
                return Err(format!(
                    "the config is over the {MAX_DOCUMENT} bytes read; no longer read"
                ));
            }
            body.extend_from_slice(&chunk);
        }
        let actual = format!("sha256:{:x}", sha2::Sha256::digest(&body));
        if digest.starts_with("sha256:") && actual != digest {
            return Err(format!(
                "the config's digest is {actual}, not the {digest} its manifest names"
            ));
        }
        let config: Value =
            serde_json::from_slice(&body).map_err(|e| format!("the config is not JSON: {e}"))?;
        Ok(config
            .pointer("/config/User")
            .and_then(Value::as_str)
            .map(str::to_string))
    }
}

fn is_index(doc: &Value) -> bool {
    match doc.get("mediaType").and_then(Value::as_str) {
        Some(t) if t == OCI_IMAGE_INDEX_MEDIA_TYPE || t == IMAGE_MANIFEST_LIST_MEDIA_TYPE => true,
        Some(_) => false,
        None => doc.get("manifests").is_some() && doc.get("config").is_none(),
    }
}

/// An error with its causes, on one line.
fn describe(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let s_text = s.to_string();
        if !text.contains(&s_text) {
            text.push_str(": ");
            text.push_str(&s_text);
        }
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn platforms_parse() {
        let p: Platform = "linux/arm64/v8".parse().unwrap();
        assert_eq!(p.variant.as_deref(), Some("v8"));
        assert_eq!(p.to_string(), "linux/arm64/v8");
        assert!("amd64".parse::<Platform>().is_err());
        assert!("linux//".parse::<Platform>().is_err());
        assert_eq!(Platform::host().os, "linux");
    }

    #[test]
    fn errors_never_carry_a_credential() {
        let c =
            Credentials::parse(r#"{"auths": {"r.example": {"auth": "Y2k6czNjcmV0"}}}"#).unwrap();
        let creds = std::sync::Arc::new(c);
        let settings = Settings {
            platform: Platform::host(),
            credentials: Credentials::default(),
            insecure: Vec::new(),
            ca_pem: Vec::new(),
            timeout: Duration::from_secs(1),
            concurrency: 1,
        };
        let fetcher = Fetcher::new(settings).unwrap();
        let read = fetcher.read_for("r.example/app:1", &[("pull secret a/b".into(), creds)]);
        assert_eq!(read.tried(), "pull secret a/b");
        let text = read.redact("sent Y2k6czNjcmV0, ci:s3cret and s3cret back".to_string());
        assert_eq!(text, "sent <redacted>, <redacted> and <redacted> back");
        assert!(!format!("{read:?}").contains("s3cret"));
        // Another registry's image is read anonymously.
        assert!(
            fetcher
                .read_for("other.example/app:1", &[])
                .candidates
                .is_empty()
        );
    }

    #[test]
    fn docker_config_is_read() {
        let text = r#"{"auths": {
            "https://index.docker.io/v1/": {"auth": "dXNlcjpwYXNz"},
            "127.0.0.1:5000": {"username": "u", "password": "p:q"},
            "ghcr.io": {"identitytoken": "x"}},
            "credHelpers": {"gcr.io": "gcloud"}}"#;
        let c = Credentials::parse(text).unwrap();
        assert_eq!(
            c.auth_for("ubuntu:24.04"),
            RegistryAuth::Basic("user".into(), "pass".into())
        );
        assert_eq!(
            c.auth_for("127.0.0.1:5000/team/app:1"),
            RegistryAuth::Basic("u".into(), "p:q".into())
        );
        assert_eq!(c.auth_for("ghcr.io/org/app"), RegistryAuth::Anonymous);
        assert_eq!(c.notes.len(), 2);
        assert!(Credentials::parse("[").is_err());
    }

    /// The kubelet keyring's matching (`pkg/credentialprovider`): globs per host label, the
    /// port exactly, the key's path a prefix of the image's, the most specific key first, and
    /// Docker Hub's entry for the images that name no registry.
    #[test]
    fn credentials_are_matched_as_the_kubelet_matches_them() {
        let entry = |user: &str| serde_json::json!({"username": user, "password": "p"});
        let text = serde_json::json!({"auths": {
            "quay.io": entry("quay"),
            "quay.io/coreos": entry("coreos"),
            "*.azurecr.io": entry("azure"),
            "k8s.*": entry("k8s-tld"),
            "app*.example.com": entry("apps"),
            "registry.example:5000": entry("port"),
            "registry.example/team": entry("team"),
            "https://index.docker.io/v1/": entry("hub"),
        }})
        .to_string();
        let c = Credentials::parse(&text).unwrap();
        let users = |image: &str| -> Vec<String> {
            c.lookup(image)
                .into_iter()
                .map(|(u, _)| u.clone())
                .collect()
        };
        assert_eq!(users("quay.io/coreos/etcd:v3"), ["coreos", "quay"]);
        assert_eq!(users("quay.io/prometheus/node-exporter"), ["quay"]);
        assert_eq!(users("myreg.azurecr.io/app:1"), ["azure"]);
        assert!(
            users("a.myreg.azurecr.io/app").is_empty(),
            "a glob is one label"
        );
        assert_eq!(users("k8s.io/pause"), ["k8s-tld"]);
        assert_eq!(users("apps.example.com/x"), ["apps"]);
        assert!(users("web.example.com/x").is_empty());
        assert_eq!(users("registry.example:5000/x"), ["port"]);
        assert!(
            users("registry.example:5001/x").is_empty(),
            "the port must be the key's"
        );
        assert_eq!(users("registry.example/team/app"), ["team"]);
        assert!(users("registry.example/other/app").is_empty());
        for hub in [
            "ubuntu",
            "library/ubuntu:24.04",
            "docker.io/library/ubuntu",
            "bitnami/redis",
        ] {
            assert_eq!(users(hub), ["hub"], "{hub}");
        }
        assert!(users("ghcr.io/org/app").is_empty());
        assert!(users("localhost:5000/app").is_empty());
    }

    #[test]
    fn a_glob_label_matches_as_a_shell_glob_in_linear_time() {
        for (glob, label, want) in [
            ("*", "", true),
            ("*", "abc", true),
            ("a*c", "abbbc", true),
            ("a*c", "abcd", false),
            ("?b*", "abzz", true),
            ("a?", "a", false),
            ("*a*b", "xaxxb", true),
            ("*a*b", "xaxxbc", false),
            ("k8s", "k8s", true),
            ("", "x", false),
        ] {
            assert_eq!(
                label_matches(glob.as_bytes(), label.as_bytes()),
                want,
                "{glob} {label}"
            );
        }
        // A key a tenant wrote to make the match backtrack: answered at once.
        let glob = "*a".repeat(2_000) + "b";
        let label = "a".repeat(10_000);
        assert!(!label_matches(glob.as_bytes(), label.as_bytes()));
    }
}
