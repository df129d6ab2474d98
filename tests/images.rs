//! `modelgate images` against a real OCI registry on loopback: Debian's `docker-registry`
//! package (the CNCF distribution registry), which scripts/install-tools.sh puts in
//! `.tools/bin`. Each test starts its own registries (a free port, a temporary storage
//! directory, a config file) and pushes images it builds itself with oci-client: config blobs
//! with each kind of `User`, an index with two platforms whose Users differ, and a private
//! registry behind basic auth (an htpasswd file of bcrypt hashes). What no real registry does
//! (never answering, an index too large, a manifest too big) is played by small servers here.
//!
//! Without the registry binary the tests say so and pass, except under
//! `MODELGATE_REQUIRE_TOOLS=1`, where they fail naming it.

#[path = "common/cli.rs"]
mod cli;
mod support;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use oci_client::client::{
    Certificate, CertificateEncoding, ClientConfig, ClientProtocol, Config, ImageLayer,
};
use oci_client::manifest::{OciImageIndex, OciImageManifest};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use serde_json::{Value, json};

use cli::{Run, assert_exit, modelgate};

/// The registry binary, or `None` after [`cli::missing`] said so.
fn registry_binary() -> Option<PathBuf> {
    let candidates = [
        std::env::var_os("MODELGATE_TOOLS_DIR")
            .map(|d| PathBuf::from(d).join("bin/docker-registry")),
        Some(Path::new(env!("CARGO_MANIFEST_DIR")).join(".tools/bin/docker-registry")),
    ];
    let found = candidates.into_iter().flatten().find(|p| p.is_file());
    if found.is_none() {
        cli::missing("docker-registry (the distribution registry; scripts/install-tools.sh)");
    }
    found
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A distribution registry on 127.0.0.1, killed when dropped.
struct Registry {
    child: Child,
    host: String,
    _dir: tempfile::TempDir,
    auth: RegistryAuth,
    /// The CA of its certificate, when it serves HTTPS.
    ca_pem: Option<String>,
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Registry {
    /// Starts a registry over plain HTTP; with `user`, behind basic auth for that user and
    /// password.
    fn start(binary: &Path, user: Option<(&str, &str)>) -> Registry {
        Registry::start_with(binary, user, false)
    }

    /// Starts a registry; `tls`: over HTTPS, with a certificate for 127.0.0.1 from a CA of
    /// its own.
    fn start_with(binary: &Path, user: Option<(&str, &str)>, tls: bool) -> Registry {
        let dir = tempfile::tempdir().unwrap();
        let mut tls_section = String::new();
        let mut ca_pem = None;
        if tls {
            let ca = modelgate::cli::certs::Authority::new("images test CA", 1).unwrap();
            let issued = ca.issue_server(&["127.0.0.1".to_string()], 1).unwrap();
            let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
            std::fs::write(&cert, &issued.cert_pem).unwrap();
            std::fs::write(&key, &issued.key_pem).unwrap();
            tls_section = format!(
                "  tls:\n    certificate: {}\n    key: {}\n",
                cert.display(),
                key.display()
            );
            ca_pem = Some(ca.cert_pem().to_string());
        }
        let port = free_port();
        let mut auth_section = String::new();
        let mut auth = RegistryAuth::Anonymous;
        if let Some((name, password)) = user {
            let hash = bcrypt::hash(password, 4).unwrap();
            let htpasswd = dir.path().join("htpasswd");
            std::fs::write(&htpasswd, format!("{name}:{hash}\n")).unwrap();
            auth_section = format!(
                "auth:\n  htpasswd:\n    realm: modelgate-test\n    path: {}\n",
                htpasswd.display()
            );
            auth = RegistryAuth::Basic(name.to_string(), password.to_string());
        }
        let config = format!(
            "version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\n\
             storage:\n  filesystem:\n    rootdirectory: {}\n\
             http:\n  addr: 127.0.0.1:{port}\n  secret: modelgate-test\n{tls_section}{auth_section}",
            dir.path().join("data").display()
        );
        let config_path = dir.path().join("config.yml");
        std::fs::write(&config_path, config).unwrap();
        let child = Command::new(binary)
            .arg("serve")
            .arg(&config_path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("docker-registry starts");
        let host = format!("127.0.0.1:{port}");
        let mut registry = Registry {
            child,
            host,
            _dir: dir,
            auth,
            ca_pem,
        };
        registry.wait_ready();
        registry
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(mut s) = TcpStream::connect(&self.host) {
                let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
                // Over TLS, any bytes back (an alert) say it listens.
                let _ = s.write_all(b"GET /v2/ HTTP/1.0\r\n\r\n");
                let mut head = [0u8; 7];
                if s.read_exact(&mut head).is_ok()
                    && (self.ca_pem.is_some() || head.starts_with(b"HTTP/1."))
                {
                    return;
                }
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("docker-registry exited: {status}");
            }
            assert!(Instant::now() < deadline, "docker-registry did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn client(&self) -> Client {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let config = match &self.ca_pem {
            Some(pem) => ClientConfig {
                extra_root_certificates: vec![Certificate {
                    encoding: CertificateEncoding::Pem,
                    data: pem.as_bytes().to_vec(),
                }],
                ..ClientConfig::default()
            },
            None => ClientConfig {
                protocol: ClientProtocol::Http,
                ..ClientConfig::default()
            },
        };
        Client::try_from(config).unwrap()
    }

    fn reference(&self, name: &str) -> Reference {
        format!("{}/{name}", self.host).parse().unwrap()
    }

    /// Pushes an image whose config has `user` (none: no `User`) for `arch`; its manifest's
    /// digest and size.
    fn push(&self, name: &str, user: Option<&str>, arch: &str) -> (String, usize) {
        let mut config = json!({
            "architecture": arch,
            "os": "linux",
            "config": {"Env": ["PATH=/usr/bin"]},
            "rootfs": {"type": "layers", "diff_ids": ["sha256:5f70bf18a086007016e948b04aed3b82103a36bea41755b6cddfaf10ace3c6ef"]},
        });
        if let Some(u) = user {
            config["config"]["User"] = json!(u);
        }
        let config = Config::oci_v1(serde_json::to_vec(&config).unwrap(), None);
        let layers = vec![ImageLayer::oci_v1_gzip(
            format!("layer of {name} for {arch}").into_bytes(),
            None,
        )];
        let manifest = OciImageManifest::build(&layers, &config, None);
        let reference = self.reference(name);
        let runtime = runtime();
        runtime.block_on(async {
            let client = self.client();
            client
                .push(&reference, &layers, config, &self.auth, Some(manifest))
                .await
                .expect("push");
            let (body, digest) = client
                .pull_manifest_raw(
                    &reference,
                    &self.auth,
                    &[oci_client::manifest::OCI_IMAGE_MEDIA_TYPE],
                )
                .await
                .expect("pull back");
            (digest, body.len())
        })
    }

    /// Pushes an index of `entries` (arch, manifest digest, size) as `name`.
    fn push_index(&self, name: &str, entries: &[(&str, String, usize)]) {
        let index: OciImageIndex = serde_json::from_value(json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": entries.iter().map(|(arch, digest, size)| json!({
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": digest,
                "size": size,
                "platform": {"architecture": arch, "os": "linux"},
            })).collect::<Vec<_>>(),
        }))
        .unwrap();
        let reference = self.reference(name);
        runtime().block_on(async {
            self.client()
                .push_manifest_list(&reference, &self.auth, index)
                .await
                .expect("push the index");
        });
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A Deployment with one container per image, and no securityContext.
fn deployment(name: &str, images: &[&str]) -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": "team-a"},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": images.iter().enumerate().map(|(i, image)| json!({
                    "name": format!("c{i}"),
                    "image": image,
                })).collect::<Vec<_>>()},
            },
        },
    })
}

/// Writes `objects` as a JSON List into a file of `dir`.
fn workloads(dir: &Path, objects: &[Value]) -> String {
    let path = dir.join("workloads.json");
    std::fs::write(
        &path,
        serde_json::to_vec(&json!({"apiVersion": "v1", "kind": "List", "items": objects})).unwrap(),
    )
    .unwrap();
    path.display().to_string()
}

fn images(args: &[&str]) -> Run {
    let mut all = vec!["images"];
    all.extend_from_slice(args);
    modelgate(&all)
}

fn json_of(run: &Run) -> Value {
    serde_json::from_str(&run.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}):\n{}\nstderr:\n{}", run.stdout, run.stderr))
}

fn image<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["images"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["image"] == name)
        .unwrap_or_else(|| panic!("no image {name} in {report:#}"))
}

fn container<'a>(report: &'a Value, image: &str) -> &'a Value {
    report["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["image"] == image)
        .unwrap_or_else(|| panic!("no container of {image} in {report:#}"))
}

#[test]
fn each_kind_of_user_is_read_and_classified() {
    let Some(bin) = registry_binary() else { return };
    let registry = Registry::start(&bin, None);
    let kinds: [(&str, Option<&str>); 7] = [
        ("unset", None),
        ("root", Some("0")),
        ("rootgroup", Some("0:0")),
        ("named", Some("app")),
        ("uid", Some("1001")),
        ("uidgid", Some("1000:1000")),
        ("uidgroupname", Some("1000:staff")),
    ];
    let mut refs = Vec::new();
    for (name, user) in kinds {
        registry.push(&format!("{name}:1"), user, "amd64");
        refs.push(format!("{}/{name}:1", registry.host));
    }
    // The same image under a second tag: its config is read once (same digest) and reported
    // for both.
    registry.push("uid:again", Some("1001"), "amd64");
    refs.push(format!("{}/uid:again", registry.host));
    let dir = tempfile::tempdir().unwrap();
    let ref_strs: Vec<&str> = refs.iter().map(String::as_str).collect();
    let file = workloads(dir.path(), &[deployment("web", &ref_strs)]);
    let run = images(&[
        "--insecure-registry",
        &registry.host,
        "--platform",
        "linux/amd64",
        "-o",
        "json",
        &file,
    ]);
    assert_exit(&run, 0);
    let report = json_of(&run);
    let class = |name: &str| {
        let i = image(&report, &format!("{}/{name}", registry.host));
        assert!(i["error"].is_null(), "{i:#}");
        (
            i["user"]["class"].as_str().unwrap().to_string(),
            i["user"]["written"].clone(),
            i["user"]["uid"].clone(),
            i["user"]["group"].clone(),
        )
    };
    assert_eq!(
        class("unset:1"),
        ("unset".into(), Value::Null, Value::Null, Value::Null)
    );
    assert_eq!(
        class("root:1"),
        ("root".into(), json!("0"), json!(0), Value::Null)
    );
    assert_eq!(
        class("rootgroup:1"),
        ("root".into(), json!("0:0"), json!(0), json!(0))
    );
    assert_eq!(
        class("named:1"),
        ("name".into(), json!("app"), Value::Null, Value::Null)
    );
    assert_eq!(
        class("uid:1"),
        ("non-root".into(), json!("1001"), json!(1001), Value::Null)
    );
    assert_eq!(
        class("uidgid:1"),
        (
            "non-root".into(),
            json!("1000:1000"),
            json!(1000),
            json!(1000)
        )
    );
    assert_eq!(class("uidgroupname:1").3, json!("staff"));
    assert_eq!(
        image(&report, &format!("{}/uid:again", registry.host))["config_digest"],
        image(&report, &format!("{}/uid:1", registry.host))["config_digest"]
    );
    // The containers run as 1000 (the pod's runAsUser after modelgate's mutation): the image
    // built for 1001 is a warning that says which uid its files expect; 1000:1000 is not.
    let c = container(&report, &format!("{}/uid:1", registry.host));
    assert_eq!(c["run_as_user"], 1000, "{c:#}");
    assert_eq!(c["run_as_user_from"], "pod");
    assert_eq!(c["field"], "spec.template.spec.containers[4]");
    let w = c["warning"].as_str().unwrap();
    assert!(
        w.contains("runs as uid 1000") && w.contains("expect uid 1001"),
        "{w}"
    );
    let c = container(&report, &format!("{}/uidgid:1", registry.host));
    assert!(c["warning"].is_null(), "{c:#}");
    let c = container(&report, &format!("{}/unset:1", registry.host));
    assert!(
        c["warning"].as_str().unwrap().contains("uid 0 (root"),
        "{c:#}"
    );
    let c = container(&report, &format!("{}/named:1", registry.host));
    assert!(c["warning"].as_str().unwrap().contains("\"app\""), "{c:#}");

    // The table says the same.
    let run = images(&["--insecure-registry", &registry.host, &file]);
    assert_exit(&run, 0);
    assert!(run.stdout.contains("IMAGE"), "{}", run.stdout);
    assert!(
        run.stdout.contains("its files expect uid 1001"),
        "{}",
        run.stdout
    );
    // JUnit: a case per image and per container, a failure per warning.
    let run = images(&["--insecure-registry", &registry.host, "-o", "junit", &file]);
    assert_exit(&run, 0);
    assert!(
        run.stdout.contains("<testsuite name=\"images\""),
        "{}",
        run.stdout
    );
    assert!(run.stdout.contains("expect uid 1001"), "{}", run.stdout);
}

#[test]
fn an_index_is_resolved_for_the_platform() {
    let Some(bin) = registry_binary() else { return };
    let registry = Registry::start(&bin, None);
    // The platforms' manifests live in the index's repository.
    let amd = registry.push("multi:amd64", Some("1000:1000"), "amd64");
    let arm = registry.push("multi:arm64", Some("2000"), "arm64");
    registry.push_index(
        "multi:1",
        &[
            ("amd64", amd.0.clone(), amd.1),
            ("arm64", arm.0.clone(), arm.1),
        ],
    );
    let dir = tempfile::tempdir().unwrap();
    let multi = format!("{}/multi:1", registry.host);
    let file = workloads(dir.path(), &[deployment("multi", &[&multi])]);
    let user_for = |platform: &str| {
        let run = images(&[
            "--insecure-registry",
            &registry.host,
            "--platform",
            platform,
            "-o",
            "json",
            &file,
        ]);
        assert_exit(&run, 0);
        image(&json_of(&run), &multi).clone()
    };
    let a = user_for("linux/amd64");
    assert_eq!(a["user"]["written"], "1000:1000", "{a:#}");
    assert_eq!(a["digest"], json!(amd.0));
    assert_eq!(a["platform"], "linux/amd64");
    assert!(a["index_digest"].as_str().unwrap().starts_with("sha256:"));
    let b = user_for("linux/arm64");
    assert_eq!(b["user"]["written"], "2000", "{b:#}");
    let c = user_for("linux/s390x");
    let e = c["error"].as_str().unwrap();
    assert!(
        e.contains("no manifest for linux/s390x") && e.contains("linux/arm64"),
        "{e}"
    );
}

#[test]
fn expect_user_is_the_image_contract() {
    let Some(bin) = registry_binary() else { return };
    let registry = Registry::start(&bin, None);
    registry.push("good:1", Some("1000:1000"), "amd64");
    registry.push("other:1", Some("1001"), "amd64");
    let good = format!("{}/good:1", registry.host);
    let other = format!("{}/other:1", registry.host);
    let absent = format!("{}/absent:1", registry.host);
    let dir = tempfile::tempdir().unwrap();
    let only_good = workloads(dir.path(), &[deployment("a", &[&good])]);
    let flags = [
        "--insecure-registry",
        registry.host.as_str(),
        "--expect-user",
        "1000:1000",
    ];
    let run = images(&[&flags[..], &[only_good.as_str()]].concat());
    assert_exit(&run, 0);

    let dir2 = tempfile::tempdir().unwrap();
    let with_other = workloads(dir2.path(), &[deployment("a", &[&good, &other])]);
    let run = images(&[&flags[..], &[with_other.as_str()]].concat());
    assert_exit(&run, 1);
    assert!(
        run.stdout.contains("not the expected user 1000:1000"),
        "{}",
        run.stdout
    );
    // `1000` is not `1000:1000`: exactly that user.
    let run = images(&[
        "--insecure-registry",
        &registry.host,
        "--expect-user",
        "1000",
        &only_good,
    ]);
    assert_exit(&run, 1);

    // An image that cannot be read: 2 with --expect-user, a finding (exit 0) without.
    let dir3 = tempfile::tempdir().unwrap();
    let with_absent = workloads(dir3.path(), &[deployment("a", &[&good, &absent])]);
    let run = images(&[&flags[..], &[with_absent.as_str()]].concat());
    assert_exit(&run, 2);
    let run = images(&[
        "--insecure-registry",
        &registry.host,
        "-o",
        "json",
        &with_absent,
    ]);
    assert_exit(&run, 0);
    assert!(image(&json_of(&run), &absent)["error"].is_string());
    // The variable sets the contract as the flag does.
    let run = cli::modelgate_env(
        &["images", "--insecure-registry", &registry.host, &with_other],
        &[("MODELGATE_EXPECT_USER", "1000:1000")],
        None,
    );
    assert_exit(&run, 1);
    // A contract that is not numeric is refused before anything is read.
    let run = images(&["--expect-user", "app", &only_good]);
    assert_exit(&run, 2);
}

#[test]
fn run_as_user_none_lets_the_image_user_apply() {
    let Some(bin) = registry_binary() else { return };
    let registry = Registry::start(&bin, None);
    registry.push("unset:1", None, "amd64");
    registry.push("uid:1", Some("1001"), "amd64");
    let unset = format!("{}/unset:1", registry.host);
    let uid = format!("{}/uid:1", registry.host);
    let mut own = deployment("own", &[&uid]);
    own["spec"]["template"]["spec"]["containers"][0]["securityContext"] =
        json!({"runAsUser": 1001});
    let dir = tempfile::tempdir().unwrap();
    let file = workloads(dir.path(), &[deployment("plain", &[&unset, &uid]), own]);
    let run = images(&[
        "--insecure-registry",
        &registry.host,
        "--run-as-user",
        "none",
        "-o",
        "json",
        &file,
    ]);
    assert_exit(&run, 0);
    let report = json_of(&run);
    let containers = report["containers"].as_array().unwrap();
    let plain_unset = containers
        .iter()
        .find(|c| c["name"] == "plain" && c["image"] == unset.as_str())
        .unwrap();
    assert!(plain_unset["run_as_user"].is_null(), "{plain_unset:#}");
    assert!(
        plain_unset["warning"]
            .as_str()
            .unwrap()
            .contains("runs as root")
    );
    let plain_uid = containers
        .iter()
        .find(|c| c["name"] == "plain" && c["image"] == uid.as_str())
        .unwrap();
    assert!(plain_uid["warning"].is_null(), "{plain_uid:#}");
    // The container's own runAsUser, as the image expects: no warning.
    let own = containers.iter().find(|c| c["name"] == "own").unwrap();
    assert_eq!(own["run_as_user"], 1001);
    assert_eq!(own["run_as_user_from"], "container");
    assert!(own["warning"].is_null(), "{own:#}");
}

#[test]
fn a_private_registry_needs_the_registry_config() {
    let Some(bin) = registry_binary() else { return };
    let registry = Registry::start(&bin, Some(("ci", "s3cret")));
    registry.push("private:1", Some("1000:1000"), "amd64");
    let private = format!("{}/private:1", registry.host);
    let dir = tempfile::tempdir().unwrap();
    let file = workloads(dir.path(), &[deployment("p", &[&private])]);
    // Anonymous: refused, a finding.
    let run = images(&["--insecure-registry", &registry.host, "-o", "json", &file]);
    assert_exit(&run, 0);
    let e = image(&json_of(&run), &private)["error"].clone();
    assert!(e.is_string(), "{e}");
    // With a docker config.json for that registry.
    let config = dir.path().join("config.json");
    let auth = base64::engine::general_purpose::STANDARD.encode("ci:s3cret");
    std::fs::write(
        &config,
        json!({"auths": {registry.host.clone(): {"auth": auth}}}).to_string(),
    )
    .unwrap();
    let run = images(&[
        "--insecure-registry",
        &registry.host,
        "--registry-config",
        config.to_str().unwrap(),
        "--expect-user",
        "1000:1000",
        "-o",
        "json",
        &file,
    ]);
    assert_exit(&run, 0);
    assert_eq!(
        image(&json_of(&run), &private)["user"]["written"],
        "1000:1000"
    );
    // A wrong password is a finding too.
    let wrong = dir.path().join("wrong.json");
    let auth = base64::engine::general_purpose::STANDARD.encode("ci:wrong");
    std::fs::write(
        &wrong,
        json!({"auths": {registry.host.clone(): {"auth": auth}}}).to_string(),
    )
    .unwrap();
    let run = images(&[
        "--insecure-registry",
        &registry.host,
        "--registry-config",
        wrong.to_str().unwrap(),
        "--expect-user",
        "1000:1000",
        &file,
    ]);
    assert_exit(&run, 2);
}

#[test]
fn a_private_ca_is_trusted_through_registry_ca() {
    let Some(bin) = registry_binary() else { return };
    let registry = Registry::start_with(&bin, None, true);
    registry.push("tls:1", Some("1000:1000"), "amd64");
    let tls = format!("{}/tls:1", registry.host);
    let dir = tempfile::tempdir().unwrap();
    let file = workloads(dir.path(), &[deployment("t", &[&tls])]);
    // HTTPS (no --insecure-registry), and a CA the system does not know: refused.
    let run = images(&["--expect-user", "1000:1000", "-o", "json", &file]);
    assert_exit(&run, 2);
    let e = image(&json_of(&run), &tls)["error"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(e.contains("https://"), "{e}");
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, registry.ca_pem.as_deref().unwrap()).unwrap();
    let run = images(&[
        "--registry-ca",
        ca.to_str().unwrap(),
        "--expect-user",
        "1000:1000",
        "-o",
        "json",
        &file,
    ]);
    assert_exit(&run, 0);
    assert_eq!(image(&json_of(&run), &tls)["user"]["written"], "1000:1000");
}

#[test]
fn the_workloads_of_the_cluster_are_read_with_list_calls() {
    let Some(bin) = registry_binary() else { return };
    let registry = Registry::start(&bin, None);
    registry.push("served:1", Some("1001"), "amd64");
    let served = format!("{}/served:1", registry.host);
    // The fake API server's tasks run on this runtime's workers while the binary runs.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let api = rt.block_on(support::fake_apiserver::FakeApiServer::start(&[]));
    api.add_workload("deployments", deployment("in-cluster", &[&served]));
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig);
    let mut cmd = cli::command(&[
        "images",
        "--from-cluster",
        "--insecure-registry",
        &registry.host,
        "-o",
        "json",
    ]);
    cmd.env("KUBECONFIG", &kubeconfig);
    let run = cli::run(cmd, None);
    assert_exit(&run, 0);
    let report = json_of(&run);
    assert_eq!(image(&report, &served)["user"]["written"], "1001");
    let c = container(&report, &served);
    assert_eq!(c["name"], "in-cluster");
    assert_eq!(c["namespace"], "team-a");
    assert!(
        c["warning"].as_str().unwrap().contains("expect uid 1001"),
        "{c:#}"
    );
    // Files and --from-cluster together are refused.
    let file = workloads(dir.path(), &[deployment("a", &[&served])]);
    let run = images(&["--from-cluster", &file]);
    assert_exit(&run, 2);
    drop(api);
    drop(rt);
}

/// A Pod whose one container mounts a writable model cache on a PVC (it gets the prep).
fn cache_pod(name: &str, image: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {
            "containers": [{
                "name": "server",
                "image": image,
                "volumeMounts": [{"name": "model-cache", "mountPath": "/models"}],
            }],
            "volumes": [{"name": "model-cache", "persistentVolumeClaim": {"claimName": "scratch"}}],
        },
    })
}

#[test]
fn a_container_that_could_not_write_the_cache_is_warned_of() {
    let Some(bin) = registry_binary() else { return };
    let registry = Registry::start(&bin, None);
    registry.push("uid:1", Some("1001"), "amd64");
    let uid = format!("{}/uid:1", registry.host);
    let dir = tempfile::tempdir().unwrap();
    let file = workloads(dir.path(), &[cache_pod("p", &uid)]);
    let cache_of = |flags: &[&str]| {
        let run = images(
            &[
                &["--insecure-registry", registry.host.as_str(), "-o", "json"][..],
                flags,
                &[file.as_str()],
            ]
            .concat(),
        );
        assert_exit(&run, 0);
        container(&json_of(&run), &uid).clone()
    };
    // The default fsGroup (102): the prep opens the cache to that group, which every container
    // of the pod has. Only the uid mismatch is a warning.
    let c = cache_of(&[]);
    assert_eq!(c["cache"]["owner_gid"], 102, "{c:#}");
    assert_eq!(c["cache"]["mode"], "g+rwX");
    assert!(c.get("cache_warning").is_none(), "{c:#}");
    // No fsGroup and no uid set (the image's User applies): the prep gives the cache to
    // --init-container-user (101) and group 0, mode 770; the image's uid 1001 cannot write it.
    let c = cache_of(&[
        "--default-fsgroup",
        "0",
        "--run-as-user",
        "none",
        "--run-as-group",
        "none",
    ]);
    assert_eq!(c["cache"]["owner_uid"], 101, "{c:#}");
    let w = c["cache_warning"]
        .as_str()
        .unwrap_or_else(|| panic!("{c:#}"));
    assert!(w.contains("owned by uid 101, gid 0, mode 770"), "{w}");
    assert!(w.contains("runs as uid 1001"), "{w}");
    // The pod's own uid: the prep gives the cache to it, and the container can write it.
    let c = cache_of(&["--default-fsgroup", "0"]);
    assert_eq!(c["cache"]["owner_uid"], 1000, "{c:#}");
    assert!(c.get("cache_warning").is_none(), "{c:#}");
}

/// A listener that accepts connections and never answers, for as long as it lives.
struct Silent {
    host: String,
    _thread: std::thread::JoinHandle<()>,
}

fn silent() -> Silent {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let host = listener.local_addr().unwrap().to_string();
    let thread = std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming().flatten() {
            held.push(stream);
        }
    });
    Silent {
        host,
        _thread: thread,
    }
}

/// A server that answers every request with `body` (`content_type`), after reading the
/// request head (`GET /v2/` with `{}`).
fn answering(content_type: &'static str, body: Vec<u8>) -> String {
    routed(vec![("", content_type, body, Delivery::Whole)])
}

/// How a [`routed`] server sends a body.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Delivery {
    Whole,
    /// One byte a second, after a Content-Length that says the whole.
    Trickle,
    /// No Content-Length: the body ends when the connection closes.
    Unsized,
}

/// A server that answers a request whose head contains a route's text with that route's body
/// (the first route that matches), sent as the route says. `GET /v2/` gets `{}`.
fn routed(routes: Vec<(&'static str, &'static str, Vec<u8>, Delivery)>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let host = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let routes = routes.clone();
            std::thread::spawn(move || {
                let mut stream = stream;
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if stream.read(&mut byte).unwrap_or(0) == 0 {
                        return;
                    }
                    head.push(byte[0]);
                }
                let text = String::from_utf8_lossy(&head).to_string();
                let (ctype, body, send) = if text.starts_with("GET /v2/ ") {
                    ("application/json", b"{}".to_vec(), Delivery::Whole)
                } else {
                    match routes.iter().find(|(needle, ..)| text.contains(needle)) {
                        Some((_, ctype, body, send)) => (*ctype, body.clone(), *send),
                        None => ("application/json", b"{}".to_vec(), Delivery::Whole),
                    }
                };
                if send == Delivery::Unsized {
                    let _ = write!(
                        stream,
                        "HTTP/1.1 200 OK\r\nContent-Type: {ctype}\r\nConnection: close\r\n\r\n"
                    );
                    let _ = stream.write_all(&body);
                    return;
                }
                let _ = write!(
                    stream,
                    "HTTP/1.1 200 OK\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\n\
                     Connection: close\r\n\r\n",
                    body.len()
                );
                if send == Delivery::Trickle {
                    for b in &body {
                        if stream.write_all(&[*b]).is_err() {
                            return;
                        }
                        std::thread::sleep(Duration::from_secs(1));
                    }
                } else {
                    let _ = stream.write_all(&body);
                }
            });
        }
    });
    host
}

/// `sha256:<hex>` of `bytes`.
fn sha256(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    format!("sha256:{:x}", sha2::Sha256::digest(bytes))
}

/// A manifest whose config is `config` (its digest and size as given).
fn manifest_for(digest: &str, size: usize) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": digest, "size": size},
        "layers": [],
    }))
    .unwrap()
}

#[test]
fn what_a_hostile_registry_sends_in_blobs_is_bounded() {
    const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
    const BLOB: &str = "application/octet-stream";
    let dir = tempfile::tempdir().unwrap();
    // A config that is not JSON, with the right digest.
    let not_json = b"<html>not a config</html>".to_vec();
    let garbage = routed(vec![
        (
            "/manifests/",
            MANIFEST,
            manifest_for(&sha256(&not_json), not_json.len()),
            Delivery::Whole,
        ),
        ("/blobs/", BLOB, not_json.clone(), Delivery::Whole),
    ]);
    // A config whose bytes are not those its manifest names.
    let swapped = routed(vec![
        (
            "/manifests/",
            MANIFEST,
            manifest_for(&sha256(b"{}"), 2),
            Delivery::Whole,
        ),
        (
            "/blobs/",
            BLOB,
            br#"{"config":{"User":"0"}}"#.to_vec(),
            Delivery::Whole,
        ),
    ]);
    // A config declared small that keeps coming past 4 MiB.
    let endless = vec![b' '; 5 * 1024 * 1024];
    let growing = routed(vec![
        (
            "/manifests/",
            MANIFEST,
            manifest_for(&sha256(b"{}"), 2),
            Delivery::Whole,
        ),
        ("/blobs/", BLOB, endless.clone(), Delivery::Whole),
    ]);
    // The same, with no Content-Length: read until 4 MiB, then no longer.
    let unsized_blob = routed(vec![
        (
            "/manifests/",
            MANIFEST,
            manifest_for(&sha256(b"{}"), 2),
            Delivery::Whole,
        ),
        ("/blobs/", BLOB, endless, Delivery::Unsized),
    ]);
    // A manifest that trickles, one byte a second.
    let slow = routed(vec![(
        "/manifests/",
        MANIFEST,
        manifest_for(&sha256(b"{}"), 2),
        Delivery::Trickle,
    )]);
    // A manifest asked for by digest whose bytes have another digest.
    let other = routed(vec![(
        "/manifests/",
        MANIFEST,
        manifest_for(&sha256(b"{}"), 2),
        Delivery::Whole,
    )]);
    let refs = [
        format!("{garbage}/garbage:1"),
        format!("{swapped}/swapped:1"),
        format!("{growing}/growing:1"),
        format!("{slow}/slow:1"),
        format!("{other}/other@{}", sha256(b"something else")),
        format!("{unsized_blob}/unsized:1"),
    ];
    let ref_strs: Vec<&str> = refs.iter().map(String::as_str).collect();
    let file = workloads(dir.path(), &[deployment("h", &ref_strs)]);
    let insecure = [
        garbage.as_str(),
        &swapped,
        &growing,
        &slow,
        &other,
        &unsized_blob,
    ]
    .join(",");
    let started = Instant::now();
    let run = images(&[
        "--insecure-registry",
        &insecure,
        "--image-timeout",
        "3s",
        "-o",
        "json",
        &file,
    ]);
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    assert_exit(&run, 0);
    let report = json_of(&run);
    let error = |r: &str| {
        image(&report, r)["error"]
            .as_str()
            .unwrap_or("")
            .to_string()
    };
    assert!(error(&refs[0]).contains("not JSON"), "{}", error(&refs[0]));
    assert!(
        error(&refs[1]).to_lowercase().contains("digest"),
        "{}",
        error(&refs[1])
    );
    assert!(
        error(&refs[2]).contains("over the 4194304"),
        "{}",
        error(&refs[2])
    );
    assert!(
        error(&refs[3]).contains("--image-timeout"),
        "{}",
        error(&refs[3])
    );
    assert!(
        error(&refs[4]).to_lowercase().contains("digest"),
        "{}",
        error(&refs[4])
    );
}

#[test]
fn a_registry_that_does_not_answer_is_a_finding_not_a_hang() {
    let Some(bin) = registry_binary() else { return };
    let registry = Registry::start(&bin, None);
    registry.push("good:1", Some("1000:1000"), "amd64");
    let good = format!("{}/good:1", registry.host);
    let quiet = silent();
    let stuck = format!("{}/stuck:1", quiet.host);
    let dir = tempfile::tempdir().unwrap();
    let file = workloads(dir.path(), &[deployment("a", &[&good, &stuck])]);
    let started = Instant::now();
    let run = images(&[
        "--insecure-registry",
        &format!("{},{}", registry.host, quiet.host),
        "--image-timeout",
        "2s",
        "-o",
        "json",
        &file,
    ]);
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    assert_exit(&run, 0);
    let report = json_of(&run);
    let e = image(&report, &stuck)["error"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(e.contains("--image-timeout"), "{e}");
    // The other registry's image is read all the same.
    assert_eq!(image(&report, &good)["user"]["written"], "1000:1000");
    let run = images(&[
        "--insecure-registry",
        &quiet.host,
        "--image-timeout",
        "1s",
        "--expect-user",
        "1000:1000",
        &file,
    ]);
    assert_exit(&run, 2);
}

#[test]
fn what_a_hostile_registry_sends_is_bounded() {
    // These need no real registry: what they check, none would send.
    let dir = tempfile::tempdir().unwrap();
    // An index with more entries than are read.
    let entries: Vec<Value> = (0..1025)
        .map(|i| {
            json!({
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": format!("sha256:{i:064x}"),
                "size": 100,
                "platform": {"architecture": "amd64", "os": "linux"},
            })
        })
        .collect();
    let index = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": entries,
    });
    let wide = answering(
        "application/vnd.oci.image.index.v1+json",
        serde_json::to_vec(&index).unwrap(),
    );
    // A manifest over 4 MiB.
    let big_manifest = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "annotations": {"padding": "x".repeat(5 * 1024 * 1024)},
    });
    let big = answering(
        "application/vnd.oci.image.manifest.v1+json",
        serde_json::to_vec(&big_manifest).unwrap(),
    );
    // A manifest whose config is declared over 4 MiB: never requested.
    let huge_config = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": format!("sha256:{:064x}", 1), "size": 5 * 1024 * 1024},
        "layers": [],
    });
    let declared = answering(
        "application/vnd.oci.image.manifest.v1+json",
        serde_json::to_vec(&huge_config).unwrap(),
    );
    // Not JSON.
    let garbage = answering(
        "application/vnd.oci.image.manifest.v1+json",
        b"<html>".to_vec(),
    );
    let refs = [
        format!("{wide}/wide:1"),
        format!("{big}/big:1"),
        format!("{declared}/declared:1"),
        format!("{garbage}/garbage:1"),
    ];
    let ref_strs: Vec<&str> = refs.iter().map(String::as_str).collect();
    let file = workloads(dir.path(), &[deployment("h", &ref_strs)]);
    let insecure = [wide.as_str(), &big, &declared, &garbage].join(",");
    let run = images(&[
        "--insecure-registry",
        &insecure,
        "--platform",
        "linux/amd64",
        "--image-timeout",
        "10s",
        "-o",
        "json",
        &file,
    ]);
    assert_exit(&run, 0);
    let report = json_of(&run);
    let error = |r: &str| {
        image(&report, r)["error"]
            .as_str()
            .unwrap_or("")
            .to_string()
    };
    assert!(
        error(&refs[0]).contains("1025 entries"),
        "{}",
        error(&refs[0])
    );
    assert!(
        error(&refs[1]).contains("over the 4194304"),
        "{}",
        error(&refs[1])
    );
    assert!(
        error(&refs[2]).contains("declared as 5242880 bytes"),
        "{}",
        error(&refs[2])
    );
    assert!(!error(&refs[3]).is_empty(), "{report:#}");
}

#[test]
fn bad_flags_are_refused_before_any_registry_call() {
    let dir = tempfile::tempdir().unwrap();
    let file = workloads(dir.path(), &[deployment("a", &["example.invalid/x:1"])]);
    for args in [
        vec!["--platform", "amd64"],
        vec!["--image-timeout", "0"],
        vec!["--image-concurrency", "0"],
        vec!["--registry-config", "/nonexistent/config.json"],
        vec!["--registry-ca", "/nonexistent/ca.pem"],
        vec!["--insecure-registry", "http://x/"],
    ] {
        let run = images(&[&args[..], &[file.as_str()]].concat());
        assert_exit(&run, 2);
    }
}

/// The admission path never calls a registry: nothing under src/server/ or the core names the
/// registry client or the images module.
#[test]
fn the_admission_path_has_no_registry_client() {
    fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                rust_files(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in [
        "src/server",
        "src/cache",
        "src/namespaces",
        "crates/modelgate-core/src",
    ] {
        rust_files(&root.join(dir), &mut files);
    }
    files.push(root.join("src/cli/serve.rs"));
    assert!(files.len() > 10, "{files:?}");
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for needle in [
            "oci_client",
            "crate::images",
            "modelgate::images",
            "reqwest",
        ] {
            assert!(!text.contains(needle), "{} names {needle}", file.display());
        }
    }
    let core = std::fs::read_to_string(root.join("crates/modelgate-core/Cargo.toml")).unwrap();
    assert!(!core.contains("oci-client") && !core.contains("reqwest"));
}
