"""The Helm chart: lint, render, kubernetes-validate, values.schema.json, and what the rendered
objects must be (checks.py)."""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml

import checks
from k8s import load
from tools import NS, Assets, run

BASE_KINDS = ["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Service", "Deployment", "PodDisruptionBudget"]
WEBHOOK_KINDS = ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"]
# docs/exceptions.md: the ModelgateException CRD and the editor ClusterRole (bound to nobody).
EXCEPTION_KINDS = ["CustomResourceDefinition", "ClusterRole"]


@pytest.fixture(scope="module")
def default(assets: Assets):
    return assets.render("default")


@pytest.fixture(scope="module")
def openshift(assets: Assets):
    return assets.render("openshift", "-f", str(assets.chart / "values-openshift.yaml"))


@pytest.fixture(scope="module")
def certmanager(assets: Assets):
    return assets.render("certmanager", "--set", "certManager.enabled=true,crds.install=true")


@pytest.mark.parametrize(
    "values",
    [[], ["-f", "values-openshift.yaml"], ["--set", "certManager.enabled=true,crds.install=true"]],
    ids=["default", "openshift", "cert-manager+crds"],
)
def test_helm_lint_strict(assets: Assets, values: list[str]) -> None:
    values = [str(assets.chart / v) if v.endswith(".yaml") else v for v in values]
    run(assets.helm, "lint", "--strict", assets.chart, *values)


def test_render_kinds(default, certmanager) -> None:
    checks.kinds(default, *BASE_KINDS, "Secret", *WEBHOOK_KINDS, *EXCEPTION_KINDS)
    checks.kinds(
        certmanager, *BASE_KINDS, "Issuer", "Issuer", "Certificate", "Certificate", *WEBHOOK_KINDS,
        *["CustomResourceDefinition"] * 3, *EXCEPTION_KINDS,
    )  # fmt: skip
    crds = [d["metadata"]["name"] for d in load(default) if d["kind"] == "CustomResourceDefinition"]
    assert crds == ["modelgateexceptions.modelgate.io"], "only modelgate's own CRD is rendered by default"


@pytest.mark.parametrize("render", ["default", "openshift", "certmanager"])
def test_render_passes_kubernetes_validate(assets: Assets, request, render: str) -> None:
    assert assets.validate(request.getfixturevalue(render)) >= 9


def test_every_optional_value_set(assets: Assets) -> None:
    f = assets.values_file(
        "knobs",
        """image:
  repository: registry.example.com/modelgate
  digest: "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
imagePullSecrets: [{name: regcred}]
replicaCount: 3
serviceAccount: {create: false, name: existing-sa}
podDisruptionBudget: {enabled: false}
priorityClassName: system-cluster-critical
nodeSelector: {kubernetes.io/os: linux}
tolerations: [{key: dedicated, operator: Equal, value: platform, effect: NoSchedule}]
topologySpreadConstraints:
  - {maxSkew: 1, topologyKey: topology.kubernetes.io/zone, whenUnsatisfiable: ScheduleAnyway,
     labelSelector: {matchLabels: {app.kubernetes.io/name: modelgate}}}
podAnnotations: {prometheus.io/scrape: "true"}
podLabels: {team: platform}
extraArgs: ["--max-body-bytes=1048576"]
extraEnv: [{name: RUST_LOG, value: info}]
namespaceSelector: {matchExpressions: [{key: tier, operator: In, values: [ml]}]}
exemptNamespaces: [monitoring]
preStopSleepSeconds: 0
logFormat: text
""",
    )
    path = assets.render("knobs", "-f", str(f))
    assets.validate(path)
    text = path.read_text()
    assert 'image: "registry.example.com/modelgate@sha256:0123' in text, "image digest not used"
    kinds = [d["kind"] for d in load(path)]
    assert "PodDisruptionBudget" not in kinds, "PodDisruptionBudget rendered although disabled"
    assert "ServiceAccount" not in kinds, "ServiceAccount rendered although create=false"
    assert "preStop" not in text, "preStop rendered with preStopSleepSeconds=0"


def test_refuses_kubernetes_older_than_1_30(assets: Assets) -> None:
    r = assets.helm_template("--kube-version", "1.29.0", ok=False)
    assert r.returncode != 0, "the chart rendered for Kubernetes 1.29 (its preStop sleep action needs 1.30)"
    assert "kubeVersion" in r.stderr, r.stderr


# --- values.schema.json --------------------------------------------------------------------------
def schema_rejects(assets: Assets, field: str, *args: str) -> None:
    r = assets.helm_template(*args, ok=False)
    assert r.returncode != 0, f"helm accepted {args}"
    assert "values don't meet the specifications of the schema" in r.stderr, "helm failed, but not on the schema:\n" + r.stderr
    assert f"'{field}'" in r.stderr, f"the schema error does not name {field}:\n{r.stderr}"


def schema_accepts(assets: Assets, want_arg: str, *args: str) -> None:
    out = assets.work / "accepts.yaml"
    out.write_text(assets.helm_template(*args).stdout)
    checks.args_literal(out, want_arg)


@pytest.mark.parametrize("v", ["0", "-1", "2147483648", "1.5"])
def test_schema_rejects_init_container_user(assets: Assets, v: str) -> None:
    schema_rejects(assets, "/initContainer/user", "--set", f"initContainer.user={v}")
    f = assets.values_file(f"icu-{v}", f"initContainer:\n  user: {v}\n")
    schema_rejects(assets, "/initContainer/user", "-f", str(f))


@pytest.mark.parametrize("v", ["1", "2147483647"])
def test_schema_accepts_init_container_user(assets: Assets, v: str) -> None:
    schema_accepts(assets, f"--init-container-user={v}", "--set", f"initContainer.user={v}")
    f = assets.values_file(f"icu-{v}", f"initContainer:\n  user: {v}\n")
    schema_accepts(assets, f"--init-container-user={v}", "-f", str(f))


@pytest.mark.parametrize(
    ("field", "args"),
    [
        ("/initContainer/user", ["--set-string", "initContainer.user=101"]),
        ("/runAsUser", ["--set", "runAsUser=0"]),
        ("/runAsUser", ["--set", "runAsUser=2147483648"]),
        ("/runAsUser", ["--set", "runAsUser=root"]),
        ("/runAsGroup", ["--set", "runAsGroup=-1"]),
        ("/defaultFSGroup", ["--set", "defaultFSGroup=-1"]),
        ("/defaultFSGroup", ["--set", "defaultFSGroup=2147483648"]),
        ("/defaultFSGroup", ["--set", "defaultFSGroup=none"]),
        ("/modelCachePrep", ["--set", "modelCachePrep=sometimes"]),
        ("/defaultMode", ["--set", "defaultMode=dry-run"]),
        ("/failurePolicy", ["--set", "failurePolicy=Retry"]),
        ("/webhooks/mutate/failurePolicy", ["--set", "webhooks.mutate.failurePolicy=Retry"]),
        ("/webhooks/validate/timeoutSeconds", ["--set", "webhooks.validate.timeoutSeconds=31"]),
        ("/matchConditions/excludePriorityClasses/0", ["--set", "matchConditions.excludePriorityClasses={Not_A_Name}"]),
        ("/monitoring/serviceMonitor/interval", ["--set", "monitoring.serviceMonitor.interval=often"]),
        ("/monitoring/prometheusRule/errorRatio", ["--set", "monitoring.prometheusRule.errorRatio=2"]),
        ("/limits/maxConnections", ["--set", "limits.maxConnections=0"]),
        ("/limits/bodyProgressTimeoutSeconds", ["--set", "limits.bodyProgressTimeoutSeconds=31"]),
        ("/limits", ["--set", "limits.maxStreams=1"]),
        ("", ["--set", "initcontainer.user=5"]),
        # The audit CronJob: the report kinds `audit --report-api` writes, and never two runs at once.
        ("/audit/reportApi", ["--set", "audit.reportApi=kyverno"]),
        ("/audit/reportApi", ["--set", "audit.reportApi=OpenReports"]),
        ("/audit/concurrencyPolicy", ["--set", "audit.concurrencyPolicy=Allow"]),
        ("/audit/schedule", ["--set", "audit.schedule=hourly"]),
        ("/audit/namespaces/0", ["--set", "audit.namespaces={Team_A}"]),
        ("/audit/pageSize", ["--set", "audit.pageSize=0"]),
        ("/audit", ["--set", "audit.reportAPI=openreports"]),
        ("/prepHostPaths/0", ["--set", "prepHostPaths={data/models}"]),
        ("/prepVolumeTypes/0", ["--set", "prepVolumeTypes={hostPath}"]),
        ("/prepStorageClasses/0", ["--set", "prepStorageClasses={Fast_NFS}"]),
        ("/podSecurityDefault", ["--set", "podSecurityDefault=strict"]),
        ("/cacheMountPath", ["--set", "cacheMountPath=/my models"]),
    ],
    ids=lambda v: v if isinstance(v, str) else " ".join(v),
)
def test_schema_rejects(assets: Assets, field: str, args: list[str]) -> None:
    schema_rejects(assets, field, *args)


@pytest.mark.parametrize(
    ("want", "args"),
    [
        ("--run-as-user=none", ["--set", "runAsUser=none"]),
        ("--run-as-group=0", ["--set", "runAsGroup=0"]),
        ("--run-as-group=none", ["--set", "runAsGroup=none"]),
        ("--default-fsgroup=0", ["--set", "defaultFSGroup=0"]),
        ("--model-cache-prep=never", ["--set", "modelCachePrep=never"]),
        ("--default-mode=audit", ["--set", "defaultMode=audit"]),
        ("--max-connections=1000", ["--set", "limits.maxConnections=1000"]),
        ("--idle-timeout=300s", ["--set", "limits.idleTimeoutSeconds=300"]),
        ("--prep-host-path=/data/models", ["--set", "prepHostPaths={/data/models,/srv/cache}"]),
        ("--prep-host-path=/srv/cache", ["--set", "prepHostPaths={/data/models,/srv/cache}"]),
        ("--prep-volume-type=nfs", ["--set", "prepVolumeTypes={nfs,csi}"]),
        ("--prep-volume-type=csi", ["--set", "prepVolumeTypes={nfs,csi}"]),
        ("--prep-volume-type=prebound", ["--set", "prepVolumeTypes={prebound}"]),
        ("--prep-storage-class=fast-nfs", ["--set", "prepStorageClasses={fast-nfs,local.path}"]),
        ("--prep-storage-class=local.path", ["--set", "prepStorageClasses={fast-nfs,local.path}"]),
        ("--pod-security-default=restricted", ["--set", "podSecurityDefault=restricted"]),
    ],
)
def test_schema_accepts(assets: Assets, want: str, args: list[str]) -> None:
    schema_accepts(assets, want, *args)


# --- numbers render as integers ------------------------------------------------------------------
def test_big_uid_from_set(assets: Assets) -> None:
    checks.args_literal(assets.render("big-set", "--set", "initContainer.user=1000680000"), "--init-container-user=1000680000")


def test_big_ids_from_values_file(assets: Assets) -> None:
    f = assets.values_file(
        "big", "initContainer:\n  user: 1000680000\nrunAsUser: 1000680000\nrunAsGroup: 1000680000\ndefaultFSGroup: 1000680000\n"
    )
    checks.flags(
        assets.render("big-file", "-f", str(f)),
        "--init-container-user=1000680000", "--run-as-user=1000680000",
        "--run-as-group=1000680000", "--default-fsgroup=1000680000",
    )  # fmt: skip


def test_cache_layout_value(assets: Assets, default) -> None:
    checks.flags(default, "--cache-layout=storage-key")
    checks.flags(assets.render("layout", "--set", "cacheLayout=cache-name"), "--cache-layout=cache-name")
    r = assets.helm_template("--set", "cacheLayout=by-name", ok=False)
    assert r.returncode != 0, "cacheLayout=by-name rendered"
    assert "cacheLayout" in r.stderr, r.stderr


# --- OpenShift preset ----------------------------------------------------------------------------
def test_openshift_preset(openshift) -> None:
    checks.flags(openshift, "--default-fsgroup=0", "--run-as-user=none", "--run-as-group=none")
    checks.security_context_absent(openshift)


# --- webhook configurations, Deployment, RBAC ----------------------------------------------------
def test_webhooks_default(default) -> None:
    checks.webhooks(default, NS, "bundle")


def test_webhooks_cert_manager(certmanager) -> None:
    checks.webhooks(certmanager, NS, "cert-manager")


def test_webhooks_openshift(openshift) -> None:
    checks.webhooks(openshift, NS, "bundle")


def test_other_namespace_excludes_itself_kube_system_and_exempt_namespaces(assets: Assets) -> None:
    path = assets.render("other", "--set", "exemptNamespaces={team-x}", release="mg", namespace="ml-platform")
    checks.webhooks(path, "ml-platform", "bundle")
    checks.args_literal(path, "--exempt-namespace=kube-system", "--exempt-namespace=ml-platform", "--exempt-namespace=team-x")
    for hook in checks.webhook_configurations(load(path)).values():
        vals = next(e for e in hook["namespaceSelector"]["matchExpressions"] if e["operator"] == "NotIn")["values"]
        assert vals == ["kube-system", "ml-platform", "team-x"], vals


def test_failure_policy_ignore_reaches_both_webhooks(assets: Assets) -> None:
    checks.webhooks(assets.render("ignore", "--set", "failurePolicy=Ignore"), NS, "bundle", "Ignore")


def test_second_release_for_restricted_namespaces_coexists(assets: Assets, default) -> None:
    path = assets.render(
        "restricted", "--set", "modelCachePrep=never,exceptions.enabled=false",
        "--set", "namespaceSelector.matchLabels.modelgate\\.io/inject=restricted",
        release="modelgate-restricted",
    )  # fmt: skip
    checks.webhooks(path, NS, "bundle", "Fail", "restricted")
    checks.flags(path, "--model-cache-prep=never")
    # Every object of the second release has its own name (docs/pod-security.md installs both).
    names = [{(d["kind"], d["metadata"]["name"]) for d in load(p)} for p in (default, path)]
    assert not (names[0] & names[1]), f"objects in both releases: {sorted(names[0] & names[1])}"


def test_deployment_default(default) -> None:
    checks.deployment(default, NS, "numeric")


def test_deployment_openshift_leaves_ids_to_the_scc(openshift) -> None:
    checks.deployment(openshift, NS, "scc")


def test_rbac(default) -> None:
    checks.rbac(default, NS)


def test_refuses_a_grace_period_shorter_than_prestop_plus_shutdown(assets: Assets) -> None:
    r = assets.helm_template("--set", "terminationGracePeriodSeconds=20", ok=False)
    assert r.returncode != 0, "terminationGracePeriodSeconds=20 (< 5 + 15) rendered"
    assert "must be less than terminationGracePeriodSeconds" in r.stderr, r.stderr


def test_cert_manager_issuer_ref(assets: Assets) -> None:
    path = assets.render(
        "issuer", "--set", "certManager.enabled=true,certManager.issuerRef.kind=ClusterIssuer,certManager.issuerRef.name=corp-ca"
    )
    checks.cert_manager_issuer(path, "ClusterIssuer", "corp-ca")
    checks.webhooks(path, NS, "cert-manager")


def test_generated_certificate_is_signed_by_the_ca_bundle_for_the_service(assets: Assets, default) -> None:
    tls = assets.work / "tls"
    tls.mkdir(exist_ok=True)
    host = checks.extract_tls(default, tls)
    run("openssl", "verify", "-CAfile", tls / "ca.crt", tls / "tls.crt")
    san = run("openssl", "x509", "-in", tls / "tls.crt", "-noout", "-ext", "subjectAltName").stdout
    assert f"DNS:{host}" in san, f"tls.crt has no SAN {host}: {san}"
    run("openssl", "x509", "-in", tls / "tls.crt", "-noout", "-checkend", str(300 * 86400))

    def pub(*cmd):
        return subprocess.run(cmd, capture_output=True, check=True).stdout

    assert pub("openssl", "x509", "-in", str(tls / "tls.crt"), "-noout", "-pubkey") == pub(
        "openssl", "pkey", "-in", str(tls / "tls.key"), "-pubout"
    ), "tls.key does not match tls.crt"


def tls_objects(path) -> tuple[list[dict], list[str], str]:
    """The TLS Secrets, every webhook's caBundle and the pods' checksum/tls of a render."""
    docs = load(path)
    secrets = [d for d in docs if d["kind"] == "Secret" and d.get("type") == "kubernetes.io/tls"]
    bundles = [w["clientConfig"].get("caBundle", "") for d in docs if d["kind"] in WEBHOOK_KINDS for w in d["webhooks"]]
    deploy = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "modelgate")
    return secrets, bundles, deploy["spec"]["template"]["metadata"]["annotations"].get("checksum/tls", "")


def test_generated_pair_the_ca_bundle_and_the_checksum_agree_and_only_the_ca_is_hashed(assets: Assets, default) -> None:
    """One render makes one pair: the Secret's CA is every caBundle and what checksum/tls hashes,
    so a webhook setting that changes leaves the checksum (and the pods) alone."""
    import hashlib

    (secret,), bundles, checksum = tls_objects(default)
    ca = secret["data"]["ca.crt"]
    assert set(bundles) == {ca}
    assert checksum == hashlib.sha256(ca.encode()).hexdigest()


def test_an_existing_secret_is_the_gitops_path_and_renders_the_same_every_time(assets: Assets) -> None:
    args = ["--set", "tls.existingSecret=modelgate-serving,tls.caBundle=Q0EgUEVN"]
    first, second = assets.render("existing-tls-1", *args), assets.render("existing-tls-2", *args)
    assert first.read_text() == second.read_text(), "two renders differ"
    secrets, bundles, checksum = tls_objects(first)
    assert secrets == [], "the chart rendered a TLS Secret of its own"
    assert set(bundles) == {"Q0EgUEVN"}
    assert checksum
    deploy = next(d for d in load(first) if d["kind"] == "Deployment")
    volumes = {v["name"]: v for v in deploy["spec"]["template"]["spec"]["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == "modelgate-serving"
    assert assets.validate(first) == len(load(first))
    # Without the CA the render fails, naming the value.
    failed = subprocess.run(
        [str(assets.helm), "template", "m", str(assets.chart), "--set", "tls.existingSecret=x"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert failed.returncode != 0
    assert "tls.caBundle is required" in failed.stderr, failed.stderr


def test_values_yaml_is_valid_yaml_with_every_key_in_the_schema(assets: Assets) -> None:
    values = yaml.safe_load((assets.chart / "values.yaml").read_text())
    schema = json.loads((assets.chart / "values.schema.json").read_text())
    missing = sorted(set(values) - set(schema["properties"]))
    assert not missing, f"values.yaml keys without a schema: {missing}"
