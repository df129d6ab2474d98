"""The kustomize assets (manifests/): every file and every overlay pass kubernetes-validate, and
the rendered objects are what checks.py requires."""

from __future__ import annotations

import pytest

import checks
from k8s import load
from tools import NS, Assets

OVERLAYS = ["crds", "base", "default", "openshift", "monitoring"]


def test_every_manifest_file_passes_kubernetes_validate(assets: Assets) -> None:
    files = sorted(
        p
        for p in assets.manifests.rglob("*")
        if p.suffix in (".yaml", ".yml") and p.name != "kustomization.yaml"  # kustomize's own config
    )
    assert len(files) >= 10, f"only {len(files)} manifest files found"
    assets.validate(*files)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_passes_kubernetes_validate(assets: Assets, overlay: str) -> None:
    assets.validate(assets.kustomize(overlay))


def test_default_webhooks_with_inject_ca_from(assets: Assets) -> None:
    checks.webhooks(assets.kustomize("default"), NS, "cert-manager")


def test_base_webhooks(assets: Assets) -> None:
    checks.webhooks(assets.kustomize("base"), NS, "none")


def test_default_deployment(assets: Assets) -> None:
    checks.deployment(assets.kustomize("default"), NS, "numeric")


def test_default_rbac(assets: Assets) -> None:
    checks.rbac(assets.kustomize("default"), NS)


def test_default_cache_layout(assets: Assets) -> None:
    checks.flags(assets.kustomize("default"), "--cache-layout=storage-key")


def test_openshift_preset_with_scc_assigned_ids(assets: Assets) -> None:
    path = assets.kustomize("openshift")
    checks.flags(path, "--default-fsgroup=0", "--run-as-user=none", "--run-as-group=none")
    checks.deployment(path, NS, "scc")
    checks.webhooks(path, NS, "cert-manager")


def test_default_kinds_namespace_and_only_modelgates_own_crd(assets: Assets) -> None:
    """No KServe CRD (manifests/crds is apart); modelgate's own ModelgateException CRD and its
    editor ClusterRole, bound to nobody (docs/exceptions.md)."""
    path = assets.kustomize("default")
    checks.kinds(
        path,
        "Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ConfigMap", "Service", "Deployment",
        "PodDisruptionBudget", "Issuer", "Issuer", "Certificate", "Certificate",
        "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration",
        "CustomResourceDefinition", "ClusterRole",
    )  # fmt: skip
    crds = [d["metadata"]["name"] for d in load(path) if d["kind"] == "CustomResourceDefinition"]
    assert crds == ["modelgateexceptions.modelgate.io"], crds


def test_base_registers_the_workload_kind_table_as_the_chart_renders_it(assets: Assets) -> None:
    """The kustomize base cannot read the table: its rules and unchanged-template condition are
    the chart's render of the shipped rows, kept equal by this test (docs/policy.md §12)."""

    def entry(path) -> dict:
        return checks.webhook_configurations(load(path))["validate-controllers.modelgate.io"]

    def unchanged(hook: dict) -> str:
        return next(c["expression"] for c in hook["matchConditions"] if c["name"] == "exclude-unchanged-pod-template")

    chart, base = entry(assets.render("default")), entry(assets.kustomize("base"))
    assert base["rules"] == chart["rules"]
    assert unchanged(base) == unchanged(chart)
