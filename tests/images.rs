//! `modelgate images` against a real OCI registry on loopback (tests/support/registry.rs: Debian's
//! `docker-registry`, the CNCF distribution registry, started per test). The tests push images
//! they build themselves: config blobs with each kind of `User`, an index with two platforms
//! whose Users differ, and a private registry behind basic auth, read with a config.json or,
//! from the (fake) cluster, with the workloads' pull secrets. What no real registry does
//! (never answering, an index too large, a manifest too big) is played by small servers here.
//!
//! Without the registry binary the tests say so and pass, except under
//! `MODELGATE_REQUIRE_TOOLS=1`, where they fail naming it.

#[path = "common/cli.rs"]
mod cli;
#[path = "support/registry.rs"]
mod registry_support;
mod support;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{Value, json};

use cli::{Run, assert_exit, modelgate};
use registry_support::{Registry, registry_binary};

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
    std::fs::write(&config, docker_config(&registry.host, "ci:s3cret")).unwrap();
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
    std::fs::write(&wrong, docker_config(&registry.host, "ci:wrong")).unwrap();
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
    let (api, rt) = fake_cluster();
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

/// A pull secret of `kind` (`kubernetes.io/dockerconfigjson`) whose `key` holds `text`.
fn pull_secret(name: &str, kind: &str, key: &str, text: &str) -> Value {
    json!({
        "metadata": {"name": name, "namespace": "team-a"},
        "type": kind,
        "data": {key: base64::engine::general_purpose::STANDARD.encode(text)},
    })
}

/// `{"auths": {host: {"auth": base64(user:password)}}}`.
fn docker_config(host: &str, user_password: &str) -> String {
    let auth = base64::engine::general_purpose::STANDARD.encode(user_password);
    json!({"auths": {host: {"auth": auth}}}).to_string()
}

/// A fake cluster whose namespace team-a holds pull secrets, ServiceAccounts and workloads
/// that run `image`, a private image behind basic auth for `host` (and the runtime its tasks
/// run on, which must outlive it).
fn cluster_with_pull_secrets(
    host: &str,
    image: &str,
) -> (
    support::fake_apiserver::FakeApiServer,
    tokio::runtime::Runtime,
) {
    use support::fake_apiserver::{SECRETS, SERVICE_ACCOUNTS};
    let (api, rt) = fake_cluster();
    // The new format, the old one (no `auths`), a malformed one; `absent` is named, not there.
    api.apply(
        SECRETS,
        pull_secret(
            "regcred",
            "kubernetes.io/dockerconfigjson",
            ".dockerconfigjson",
            &docker_config(host, "ci:s3cret"),
        ),
    );
    let old = json!({host: {"username": "ci", "password": "s3cret"}}).to_string();
    api.apply(
        SECRETS,
        pull_secret("oldcfg", "kubernetes.io/dockercfg", ".dockercfg", &old),
    );
    api.apply(
        SECRETS,
        pull_secret(
            "broken",
            "kubernetes.io/dockerconfigjson",
            ".dockerconfigjson",
            "{\"auths\": ",
        ),
    );
    api.apply(
        SERVICE_ACCOUNTS,
        json!({"metadata": {"name": "builder", "namespace": "team-a"},
               "imagePullSecrets": [{"name": "regcred"}]}),
    );
    api.apply(
        SERVICE_ACCOUNTS,
        json!({"metadata": {"name": "default", "namespace": "team-a"}}),
    );
    // Kept from the reader: a secret and a ServiceAccount it may not get.
    api.apply(
        SECRETS,
        pull_secret(
            "locked",
            "kubernetes.io/dockerconfigjson",
            ".dockerconfigjson",
            &docker_config(host, "ci:s3cret"),
        ),
    );
    api.forbid_get(SECRETS, "team-a", "locked");
    api.apply(
        SERVICE_ACCOUNTS,
        json!({"metadata": {"name": "secretive", "namespace": "team-a"},
               "imagePullSecrets": [{"name": "regcred"}]}),
    );
    api.forbid_get(SERVICE_ACCOUNTS, "team-a", "secretive");
    let with = |name: &str, spec: Value| {
        let mut d = deployment(name, &[image]);
        for (k, v) in spec.as_object().unwrap() {
            d["spec"]["template"]["spec"][k] = v.clone();
        }
        d
    };
    let secrets =
        |names: &[&str]| json!(names.iter().map(|n| json!({"name": n})).collect::<Vec<_>>());
    for d in [
        with(
            "with-secret",
            json!({"imagePullSecrets": secrets(&["regcred"])}),
        ),
        with(
            "old-format",
            json!({"imagePullSecrets": secrets(&["oldcfg"])}),
        ),
        with("via-sa", json!({"serviceAccountName": "builder"})),
        with("without", json!({})),
        with("broken", json!({"imagePullSecrets": secrets(&["broken"])})),
        with("missing", json!({"imagePullSecrets": secrets(&["absent"])})),
        with(
            "forbidden",
            json!({"imagePullSecrets": secrets(&["locked"])}),
        ),
        with("sa-forbidden", json!({"serviceAccountName": "secretive"})),
        // Its own secrets win: the ServiceAccount's are not added to them.
        with(
            "own-wins",
            json!({"imagePullSecrets": secrets(&["absent"]), "serviceAccountName": "builder"}),
        ),
    ] {
        api.add_workload("deployments", d);
    }
    // A Pod went through the ServiceAccount admission plugin already: what it names is all.
    api.add_workload(
        "pods",
        json!({
            "metadata": {"name": "bare-pod", "namespace": "team-a"},
            "spec": {"serviceAccountName": "builder",
                     "containers": [{"name": "c0", "image": image}]},
        }),
    );
    (api, rt)
}

/// The fake API server, with the runtime its tasks run on while the binary runs (keep both).
fn fake_cluster() -> (
    support::fake_apiserver::FakeApiServer,
    tokio::runtime::Runtime,
) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let api = rt.block_on(support::fake_apiserver::FakeApiServer::start(&[]));
    (api, rt)
}

/// `modelgate <args>` with the kubeconfig of `api`.
fn against(api: &support::fake_apiserver::FakeApiServer, args: &[&str]) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig);
    let mut cmd = cli::command(args);
    cmd.env("KUBECONFIG", &kubeconfig);
    cli::run(cmd, None)
}

/// `images --from-cluster` against [`cluster_with_pull_secrets`] with `flags`: the run, and the
/// server (for its counts).
fn images_of_the_cluster(
    host: &str,
    image: &str,
    flags: &[&str],
) -> (
    Run,
    support::fake_apiserver::FakeApiServer,
    tokio::runtime::Runtime,
) {
    let (api, rt) = cluster_with_pull_secrets(host, image);
    let mut args = vec!["images", "--from-cluster", "--insecure-registry", host];
    args.extend_from_slice(flags);
    (against(&api, &args), api, rt)
}

fn container_of<'a>(report: &'a Value, workload: &str) -> &'a Value {
    report["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == workload)
        .unwrap_or_else(|| panic!("no container of {workload} in {report:#}"))
}

fn finding<'a>(report: &'a Value, object: &str) -> Vec<&'a Value> {
    report["pull_secret_findings"]
        .as_array()
        .map(|f| f.iter().filter(|f| f["object"] == object).collect())
        .unwrap_or_default()
}

#[test]
fn each_workload_reads_its_images_with_its_own_pull_secrets() {
    let Some(bin) = registry_binary() else { return };
    let registry = Registry::start(&bin, Some(("ci", "s3cret")));
    registry.push("private:1", Some("1000:1000"), "amd64");
    let private = format!("{}/private:1", registry.host);
    let (run, api, _rt) = images_of_the_cluster(&registry.host, &private, &["-o", "json"]);
    assert_exit(&run, 0);
    let report = json_of(&run);
    // The workloads whose credentials the kubelet would have read it; the others not.
    for (workload, via) in [
        ("with-secret", "pull secret team-a/regcred"),
        ("old-format", "pull secret team-a/oldcfg"),
        ("via-sa", "pull secret team-a/regcred"),
    ] {
        let c = container_of(&report, workload);
        assert_eq!(c["image_user"]["written"], "1000:1000", "{c:#}");
        assert_eq!(c["read_with"], via, "{c:#}");
    }
    assert_eq!(
        container_of(&report, "via-sa")["pull_secrets"],
        json!(["team-a/regcred"])
    );
    for workload in [
        "without",
        "broken",
        "missing",
        "own-wins",
        "bare-pod",
        "forbidden",
        "sa-forbidden",
    ] {
        let c = container_of(&report, workload);
        assert!(c["image_user"].is_null(), "{c:#}");
        let e = c["image_error"].as_str().unwrap_or_else(|| panic!("{c:#}"));
        assert!(e.contains("Not authorized"), "{e}");
        assert_eq!(c["read_with"], "anonymous", "{c:#}");
    }
    // The unusable secrets are findings naming them and the workload, never a failure.
    let broken = finding(&report, "secret team-a/broken");
    assert_eq!(broken.len(), 1, "{report:#}");
    assert_eq!(broken[0]["workload"], "Deployment team-a/broken");
    assert!(
        broken[0]["problem"]
            .as_str()
            .unwrap()
            .starts_with("malformed .dockerconfigjson"),
        "{report:#}"
    );
    let absent = finding(&report, "secret team-a/absent");
    let workloads: Vec<&Value> = absent.iter().map(|f| &f["workload"]).collect();
    assert_eq!(
        workloads,
        [
            &json!("Deployment team-a/missing"),
            &json!("Deployment team-a/own-wins")
        ]
    );
    assert!(absent[0]["problem"].as_str().unwrap().contains("not found"));
    // Each Secret and ServiceAccount asked for once, whoever names it; the ServiceAccount of
    // a template that names secrets, and of a Pod, not at all.
    assert_eq!(
        api.counts("secrets").gets,
        5,
        "regcred, oldcfg, broken, absent, locked"
    );
    assert_eq!(
        api.counts("serviceaccounts").gets,
        3,
        "builder, default, secretive"
    );
    // What may not be read is a finding that says which permission is missing.
    let locked = finding(&report, "secret team-a/locked");
    assert_eq!(locked.len(), 1, "{report:#}");
    let p = locked[0]["problem"].as_str().unwrap();
    assert!(
        p.contains("Forbidden (403)") && p.contains("get on secrets"),
        "{p}"
    );
    let sa = finding(&report, "serviceaccount team-a/secretive");
    assert_eq!(sa.len(), 1, "{report:#}");
    assert_eq!(sa[0]["workload"], "Deployment team-a/sa-forbidden");
    assert!(
        sa[0]["problem"]
            .as_str()
            .unwrap()
            .contains("get on serviceaccounts"),
        "{report:#}"
    );
    // No credential in the output.
    let b64 = base64::engine::general_purpose::STANDARD.encode("ci:s3cret");
    for text in [&run.stdout, &run.stderr] {
        assert!(!text.contains("s3cret") && !text.contains(&b64), "{text}");
    }
    // The table names them too, with the credentials each image was read with.
    let (run, _api, _rt) = images_of_the_cluster(&registry.host, &private, &[]);
    assert_exit(&run, 0);
    assert!(
        run.stdout
            .contains("pull secret: secret team-a/broken (Deployment team-a/broken): malformed"),
        "{}",
        run.stdout
    );
    assert!(run.stdout.contains("READ WITH"), "{}", run.stdout);
    assert!(!run.stdout.contains("s3cret") && !run.stdout.contains(&b64));
}

#[test]
fn pull_secrets_come_before_the_registry_config_as_the_kubelet_tries_them() {
    let Some(bin) = registry_binary() else { return };
    let registry = Registry::start(&bin, Some(("ci", "s3cret")));
    registry.push("private:1", Some("1000:1000"), "amd64");
    let private = format!("{}/private:1", registry.host);
    let dir = tempfile::tempdir().unwrap();
    // The node's credentials (--registry-config) are right: every workload reads the image,
    // those with a pull secret with it (tried first), the others with the config's.
    let right = dir.path().join("right.json");
    std::fs::write(&right, docker_config(&registry.host, "ci:s3cret")).unwrap();
    let (run, _api, _rt) = images_of_the_cluster(
        &registry.host,
        &private,
        &["--registry-config", right.to_str().unwrap(), "-o", "json"],
    );
    assert_exit(&run, 0);
    let report = json_of(&run);
    assert_eq!(
        container_of(&report, "with-secret")["read_with"],
        "pull secret team-a/regcred"
    );
    for workload in ["without", "broken", "missing"] {
        let c = container_of(&report, workload);
        assert_eq!(c["read_with"], "--registry-config", "{c:#}");
        assert_eq!(c["image_user"]["written"], "1000:1000", "{c:#}");
    }
    // Wrong ones: the pull secret still reads it; without one, the error says what was tried.
    let wrong = dir.path().join("wrong.json");
    std::fs::write(&wrong, docker_config(&registry.host, "ci:wrong")).unwrap();
    let (run, _api, _rt) = images_of_the_cluster(
        &registry.host,
        &private,
        &["--registry-config", wrong.to_str().unwrap(), "-o", "json"],
    );
    assert_exit(&run, 0);
    let report = json_of(&run);
    assert_eq!(
        container_of(&report, "via-sa")["image_user"]["written"],
        "1000:1000"
    );
    let c = container_of(&report, "without");
    assert_eq!(c["read_with"], "--registry-config", "{c:#}");
    assert!(
        c["image_error"]
            .as_str()
            .unwrap()
            .contains("with --registry-config"),
        "{c:#}"
    );
}

#[test]
fn an_image_read_anonymously_is_not_read_again_with_credentials() {
    let Some(bin) = registry_binary() else { return };
    // A public registry: it takes any credentials, and none.
    let registry = Registry::start(&bin, None);
    registry.push("pub:1", Some("1000:1000"), "amd64");
    let public = format!("{}/pub:1", registry.host);
    let (api, rt) = fake_cluster();
    api.apply(
        support::fake_apiserver::SECRETS,
        pull_secret(
            "pubcred",
            "kubernetes.io/dockerconfigjson",
            ".dockerconfigjson",
            &docker_config(&registry.host, "someone:pw"),
        ),
    );
    let mut with = deployment("with-secret", &[&public]);
    with["spec"]["template"]["spec"]["imagePullSecrets"] = json!([{"name": "pubcred"}]);
    api.add_workload("deployments", with);
    api.add_workload("deployments", deployment("anonymous", &[&public]));
    let run = against(
        &api,
        &[
            "images",
            "--from-cluster",
            "--insecure-registry",
            &registry.host,
            "-o",
            "json",
        ],
    );
    assert_exit(&run, 0);
    let report = json_of(&run);
    // One read, anonymous, given to both; one row.
    assert_eq!(report["images"].as_array().unwrap().len(), 1, "{report:#}");
    assert_eq!(report["images"][0]["read_with"], "anonymous");
    assert_eq!(report["images"][0]["containers"], 2);
    assert_eq!(
        container_of(&report, "with-secret")["read_with"],
        "anonymous"
    );
    assert_eq!(
        container_of(&report, "with-secret")["pull_secrets"],
        json!(["team-a/pubcred"])
    );
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

// --- audit --images -------------------------------------------------------------------------

/// A listener that counts the connections made to it, for as long as it lives.
fn counting() -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let host = listener.local_addr().unwrap().to_string();
    let seen = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = seen.clone();
    std::thread::spawn(move || {
        for _ in listener.incoming() {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    });
    (host, seen)
}

/// The documents of a YAML stream.
fn documents(text: &str) -> Vec<Value> {
    modelgate::documents::read_documents("stdout", text)
        .unwrap_or_else(|e| panic!("{e}: {text}"))
        .into_iter()
        .map(|d| d.value)
        .collect()
}

/// The `image-user` result of the report of Deployment `name`, and the report's summary.
fn image_user_result<'a>(reports: &'a [Value], name: &str) -> (&'a Value, &'a Value) {
    let report = reports
        .iter()
        .find(|r| r["scope"]["name"] == name)
        .unwrap_or_else(|| panic!("no report of {name}"));
    let results: Vec<&Value> = report["results"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["rule"] == "image-user")
        .collect();
    assert_eq!(results.len(), 1, "{report:#}");
    (results[0], &report["summary"])
}

#[test]
fn audit_images_adds_the_image_user_check_to_every_output() {
    let Some(bin) = registry_binary() else { return };
    let registry = Registry::start(&bin, None);
    registry.push("uid:1", Some("1001"), "amd64");
    registry.push("good:1", Some("1000:1000"), "amd64");
    let uid = format!("{}/uid:1", registry.host);
    let good = format!("{}/good:1", registry.host);
    let absent = format!("{}/absent:1", registry.host);
    let dir = tempfile::tempdir().unwrap();
    let file = workloads(
        dir.path(),
        &[
            deployment("mismatch", &[&uid]),
            deployment("matches", &[&good]),
            deployment("unreadable", &[&absent]),
        ],
    );
    let audit = |flags: &[&str]| {
        let mut args = vec!["audit", "--images", "--insecure-registry", &registry.host];
        args.extend_from_slice(flags);
        args.push(&file);
        modelgate(&args)
    };
    // JSON: a result per workload, and what was read.
    let run = audit(&["-o", "json"]);
    let without = modelgate(&["audit", &file]);
    // The image check never changes the exit code.
    assert_eq!(run.code, without.code, "{}", run.stderr);
    let report = json_of(&run);
    let result = |name: &str| {
        report["images"]["results"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == name)
            .unwrap_or_else(|| panic!("no {name} in {report:#}"))
            .clone()
    };
    let r = result("mismatch");
    assert_eq!(r["status"], "warn", "{r:#}");
    assert!(
        r["message"].as_str().unwrap().contains("expect uid 1001"),
        "{r:#}"
    );
    assert_eq!(result("matches")["status"], "pass");
    let r = result("unreadable");
    assert_eq!(r["status"], "error", "{r:#}");
    assert!(
        r["message"]
            .as_str()
            .unwrap()
            .contains("cannot read its config"),
        "{r:#}"
    );
    assert_eq!(
        report["images"]["counts"],
        json!({"pass": 1, "warn": 1, "error": 1})
    );
    assert_eq!(report["images"]["images"].as_array().unwrap().len(), 3);
    // Both report APIs: a result of its own, counted in the summary.
    for output in ["openreports", "policyreport"] {
        let run = audit(&["-o", output]);
        let reports = documents(&run.stdout);
        let (r, summary) = image_user_result(&reports, "mismatch");
        assert_eq!(r["result"], "warn", "{r:#}");
        assert_eq!(r["severity"], "medium");
        assert_eq!(r["source"], "modelgate");
        let (r, summary_ok) = image_user_result(&reports, "matches");
        assert_eq!(r["result"], "pass");
        assert_eq!(
            summary["warn"].as_u64().unwrap(),
            summary_ok["warn"].as_u64().unwrap() + 1,
            "{summary} {summary_ok}"
        );
        assert_eq!(
            image_user_result(&reports, "unreadable").0["result"],
            "error"
        );
    }
    // The table and JUnit say the same.
    let run = audit(&[]);
    assert!(
        run.stdout.contains("IMAGE USER (2 of 3 workloads):")
            && run
                .stdout
                .contains("Deployment team-a/mismatch: warn: container c0"),
        "{}",
        run.stdout
    );
    let run = audit(&["-o", "junit"]);
    assert!(run.stdout.contains("image-user: warn: "), "{}", run.stdout);
    // The registry flags also come from their variables, --images from its own.
    let run = cli::modelgate_env(
        &["audit", "-o", "json", &file],
        &[
            ("MODELGATE_AUDIT_IMAGES", "true"),
            ("MODELGATE_INSECURE_REGISTRY", &registry.host),
        ],
        None,
    );
    assert_eq!(
        json_of(&run)["images"]["counts"]["pass"],
        1,
        "{}",
        run.stdout
    );
}

#[test]
fn audit_calls_no_registry_without_images() {
    let (host, seen) = counting();
    let dir = tempfile::tempdir().unwrap();
    let image = format!("{host}/app:1");
    let file = workloads(dir.path(), &[deployment("web", &[&image])]);
    for output in ["table", "json", "openreports"] {
        let run = modelgate(&["audit", "--insecure-registry", &host, "-o", output, &file]);
        assert!(!run.stdout.contains("image-user"), "{}", run.stdout);
        assert!(!run.stdout.contains("IMAGE USER"), "{}", run.stdout);
    }
    let run = modelgate(&["audit", "-o", "json", &file]);
    assert!(json_of(&run).get("images").is_none(), "{}", run.stdout);
    assert_eq!(seen.load(std::sync::atomic::Ordering::SeqCst), 0);
    // With it, the same input calls it.
    let run = modelgate(&[
        "audit",
        "--images",
        "--insecure-registry",
        &host,
        "--image-timeout",
        "1s",
        &file,
    ]);
    assert!(run.stdout.contains("IMAGE USER (1 of 1"), "{}", run.stdout);
    assert!(seen.load(std::sync::atomic::Ordering::SeqCst) > 0);
}

#[test]
fn audit_images_from_the_cluster_reads_with_each_workloads_pull_secrets() {
    let Some(bin) = registry_binary() else { return };
    let registry = Registry::start(&bin, Some(("ci", "s3cret")));
    registry.push("private:1", Some("1000:1000"), "amd64");
    let private = format!("{}/private:1", registry.host);
    let (api, _rt) = cluster_with_pull_secrets(&registry.host, &private);
    let run = against(
        &api,
        &[
            "audit",
            "--from-cluster",
            "--images",
            "--insecure-registry",
            &registry.host,
            "-o",
            "openreports",
        ],
    );
    let reports = documents(&run.stdout);
    // The image declares the uid the pods run as (1000): pass, for those that can read it.
    for name in ["with-secret", "old-format", "via-sa"] {
        let (r, _) = image_user_result(&reports, name);
        assert_eq!(r["result"], "pass", "{name}: {r:#}");
    }
    let (r, _) = image_user_result(&reports, "without");
    assert_eq!(r["result"], "error", "{r:#}");
    assert!(
        r["message"].as_str().unwrap().contains("Not authorized"),
        "{r:#}"
    );
    let (r, _) = image_user_result(&reports, "broken");
    assert_eq!(r["result"], "error", "{r:#}");
    let m = r["message"].as_str().unwrap();
    assert!(
        m.contains("pull secret: secret team-a/broken: malformed"),
        "{m}"
    );
    let b64 = base64::engine::general_purpose::STANDARD.encode("ci:s3cret");
    assert!(!run.stdout.contains("s3cret") && !run.stdout.contains(&b64));
    assert!(!run.stderr.contains("s3cret") && !run.stderr.contains(&b64));
    // --write-reports writes the same results to the cluster.
    let run = against(
        &api,
        &[
            "audit",
            "--from-cluster",
            "--images",
            "--insecure-registry",
            &registry.host,
            "--write-reports",
        ],
    );
    assert_exit(&run, 0);
    let written = api.reports(support::fake_apiserver::REPORTS);
    assert_eq!(
        image_user_result(&written, "with-secret").0["result"],
        "pass"
    );
    assert_eq!(image_user_result(&written, "without").0["result"], "error");
    let text = serde_json::to_string(&written).unwrap();
    assert!(!text.contains("s3cret") && !text.contains(&b64));
}
