"""Operations objects of the chart and of manifests/components/monitoring: what keeps the
webhooks from locking up the cluster, uninstall, and the optional monitoring, autoscaling and
network objects (all on: helm lint and kubernetes-validate with the pinned CRDs)."""

from __future__ import annotations

import filecmp
import json
from pathlib import Path

import pytest
import yaml

import checks
from k8s import load, named, of_kind, one, selector_matches
from tools import NS, Assets, run

ALL_ON = [
    "--set", "monitoring.serviceMonitor.enabled=true,monitoring.prometheusRule.enabled=true",
    "--set", "monitoring.dashboard.enabled=true,autoscaling.enabled=true,networkPolicy.enabled=true",
    "--set", "matchConditions.excludePriorityClasses={system-node-critical,system-cluster-critical}",
    "--set", "certManager.enabled=true,crds.install=true",
]  # fmt: skip
OPTIONAL_KINDS = ["ServiceMonitor", "PrometheusRule", "ConfigMap", "HorizontalPodAutoscaler", "NetworkPolicy"]
ALERTS = {
    "ModelgateNoReadyReplica", "ModelgateAdmissionErrors", "ModelgateLatencyHigh", "ModelgateCertificateExpiring",
    "ModelgateCachesNotSynced", "ModelgateWebhookCallsFailing", "ModelgateWebhookFailingOpen",
    "ModelgateWebhookSlowFromApiServer", "ModelgateConnectionCapReached", "ModelgateWatchFailing",
    "ModelgateSlowSendersCut", "ModelgateExceptionExpiresSoon",
}  # fmt: skip


@pytest.fixture(scope="module")
def all_on(assets: Assets):
    return assets.render("all-on", *ALL_ON)


CONTROLLERS_HOOK = "validate-controllers.modelgate.io"


def conditions(path) -> dict[str, dict[str, str]]:
    """matchConditions of each webhook, by webhook name: condition name -> expression."""
    return {
        n: {c["name"]: " ".join(c["expression"].split()) for c in h.get("matchConditions", [])}
        for n, h in checks.webhook_configurations(load(path)).items()
    }


# --- never lock up -------------------------------------------------------------------------------
def test_default_match_conditions_keep_out_mirror_pods_own_account_and_namespaces(assets: Assets) -> None:
    for name, conds in conditions(assets.render("default")).items():
        first = "exclude-unchanged-pod-template" if name == CONTROLLERS_HOOK else "exclude-mirror-pods"
        # The validating entry sees a Pod UPDATE only when an init container's image changed.
        more = ["only-pod-updates-that-change-init-images"] if name == "validate.modelgate.io" else []
        assert sorted(conds) == sorted([first, "exclude-exempt-namespaces", "exclude-own-service-account", *more]), (name, conds)
        if name != CONTROLLERS_HOOK:
            assert "'kubernetes.io/config.mirror' in object.metadata.annotations" in conds["exclude-mirror-pods"]
            assert "request.kind.kind != 'Pod'" in conds["exclude-mirror-pods"]
        # Fields the API server may leave out of the request (omitempty) are read with optional access.
        assert conds["exclude-own-service-account"] == (
            "request.userInfo.?username.orValue('') != 'system:serviceaccount:modelgate-system:modelgate'"
        )
        assert conds["exclude-exempt-namespaces"] == "!(request.?namespace.orValue('') in ['kube-system','modelgate-system'])"


def test_controllers_entry_skips_an_unchanged_template_and_is_never_mutated(assets: Assets) -> None:
    """docs/policy.md §11: the pod templates of the controllers are validated (their own entry, the
    validating webhook's failurePolicy and timeout), never patched: the mutating configuration
    has no controller rule. (test_match_conditions.py evaluates the condition.)"""
    path = assets.render("default")
    conds = conditions(path)[CONTROLLERS_HOOK]["exclude-unchanged-pod-template"]
    assert "object.spec.template != oldObject.spec.template" in conds, conds
    assert "object.spec.jobTemplate.spec.template != oldObject.spec.jobTemplate.spec.template" in conds, conds
    hooks = checks.webhook_configurations(load(path))
    mutated = {res for r in hooks["mutate.modelgate.io"]["rules"] for res in r["resources"]}
    assert not mutated & {res for _, res, _ in checks.CONTROLLERS.values()}, mutated
    assert len(one(load(path), "MutatingWebhookConfiguration")["webhooks"]) == 1
    for key in ("failurePolicy", "timeoutSeconds", "namespaceSelector", "clientConfig"):
        assert hooks[CONTROLLERS_HOOK][key] == hooks["validate.modelgate.io"][key], key


def test_match_conditions_priority_classes_and_service_account_name(assets: Assets) -> None:
    path = assets.render(
        "mc-knobs", "--set", "matchConditions.excludePriorityClasses={system-node-critical}",
        "--set", "serviceAccount.create=false,serviceAccount.name=platform-sa", "--set", "exemptNamespaces={infra}",
        release="mg", namespace="ml-platform",
    )  # fmt: skip
    for name, conds in conditions(path).items():
        pc = conds["exclude-priority-classes"]
        if name == CONTROLLERS_HOOK:
            assert "object.spec.jobTemplate.spec.template.spec.priorityClassName in ['system-node-critical']" in pc, pc
        else:
            assert "object.spec.priorityClassName in ['system-node-critical']" in pc, pc
        assert "object.spec.template.spec.priorityClassName in ['system-node-critical']" in pc, pc
        assert conds["exclude-own-service-account"].endswith("'system:serviceaccount:ml-platform:platform-sa'")
        assert "['kube-system','ml-platform','infra']" in conds["exclude-exempt-namespaces"]
    assets.validate(path)


def test_match_conditions_can_be_turned_off(assets: Assets) -> None:
    path = assets.render("mc-off", "--set", "matchConditions.enabled=false")
    assert all(not c for c in conditions(path).values())
    # Without the condition that skips an unchanged template, the controllers are judged on
    # CREATE only: an UPDATE rule would route every ReplicaSet scale through modelgate.
    checks.webhooks(path, NS, "bundle", match_conditions=False)


def test_kustomize_match_conditions_are_the_charts(assets: Assets) -> None:
    assert conditions(assets.kustomize("default")) == conditions(assets.render("default"))


def test_failure_policy_and_timeout_per_webhook(assets: Assets) -> None:
    path = assets.render(
        "per-hook", "--set", "webhooks.validate.failurePolicy=Ignore,webhooks.validate.timeoutSeconds=3",
        "--set", "webhooks.mutate.timeoutSeconds=10",
    )  # fmt: skip
    hooks = checks.webhook_configurations(load(path))
    assert (hooks["mutate.modelgate.io"]["failurePolicy"], hooks["mutate.modelgate.io"]["timeoutSeconds"]) == ("Fail", 10)
    for name in ("validate.modelgate.io", CONTROLLERS_HOOK):  # the controllers' entry follows webhooks.validate
        assert (hooks[name]["failurePolicy"], hooks[name]["timeoutSeconds"]) == ("Ignore", 3), name
    # The chart-wide value still reaches a webhook whose own value is empty.
    hooks = checks.webhook_configurations(
        load(assets.render("per-hook-2", "--set", "failurePolicy=Ignore,webhooks.mutate.failurePolicy=Fail"))
    )
    assert [hooks[n]["failurePolicy"] for n in sorted(hooks)] == ["Fail", "Ignore", "Ignore"], sorted(hooks)


def test_uninstall_removes_the_webhook_configurations(assets: Assets, all_on) -> None:
    """helm uninstall deletes every object of the release manifest except hooks and objects
    marked helm.sh/resource-policy: keep. The webhook configurations must be neither, and carry
    the labels the kustomize uninstall command of docs/operations.md selects by."""
    for path in (assets.render("default"), all_on):
        for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            cfg = one(load(path), kind)
            ann = cfg["metadata"].get("annotations") or {}
            assert not [a for a in ann if a.startswith("helm.sh/hook")], f"{kind} is a Helm hook: {ann}"
            assert ann.get("helm.sh/resource-policy") != "keep", f"{kind} is kept on uninstall"
            assert cfg["metadata"]["labels"]["app.kubernetes.io/part-of"] == "modelgate"
    # `helm template` lists them in the release manifest (what uninstall deletes), not as hooks.
    out = assets.helm_template("--kube-version", "1.33.0", "--no-hooks").stdout
    kinds = [d["kind"] for d in yaml.safe_load_all(out) if d]
    assert "MutatingWebhookConfiguration" in kinds and "ValidatingWebhookConfiguration" in kinds
    for overlay in ("base", "default", "monitoring"):
        for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            labels = one(load(assets.kustomize(overlay)), kind)["metadata"]["labels"]
            assert selector_matches({"matchLabels": {"app.kubernetes.io/name": "modelgate"}}, labels), labels


# --- every optional object on ----------------------------------------------------------------------
def test_all_optional_objects_pass_helm_lint(assets: Assets) -> None:
    run(assets.helm, "lint", "--strict", assets.chart, *ALL_ON)


def test_all_optional_objects_pass_kubernetes_validate(assets: Assets, all_on) -> None:
    kinds = [d["kind"] for d in load(all_on)]
    for kind in OPTIONAL_KINDS:
        assert kind in kinds, f"{kind} not rendered with every optional object on"
    assets.validate(all_on)


def test_optional_objects_are_off_by_default(assets: Assets) -> None:
    kinds = {d["kind"] for d in load(assets.render("default"))}
    assert not kinds & set(OPTIONAL_KINDS), kinds & set(OPTIONAL_KINDS)


def test_service_monitor_scrapes_the_metrics_port_of_the_service(all_on) -> None:
    docs = load(all_on)
    sm, svc = one(docs, "ServiceMonitor"), one(docs, "Service")
    assert selector_matches(sm["spec"]["selector"], svc["metadata"]["labels"]), "the ServiceMonitor does not select the Service"
    assert sm["spec"]["namespaceSelector"] == {"matchNames": [NS]}
    port = {p["name"]: p for p in svc["spec"]["ports"]}[sm["spec"]["endpoints"][0]["port"]]
    assert port["targetPort"] == "probes" and sm["spec"]["endpoints"][0]["path"] == "/metrics"


def test_prometheus_rule_has_the_alerts_with_severity_and_runbook(all_on) -> None:
    rule = one(load(all_on), "PrometheusRule")
    rules = [r for g in rule["spec"]["groups"] for r in g["rules"]]
    assert {r["alert"] for r in rules} == ALERTS
    for r in rules:
        assert r["labels"]["severity"] in ("critical", "warning"), r
        assert r["annotations"]["summary"] and r["annotations"]["description"], r


def test_latency_alerts_follow_each_webhooks_timeout(assets: Assets) -> None:
    path = assets.render(
        "budget", "--set", "monitoring.prometheusRule.enabled=true,webhooks.mutate.timeoutSeconds=10",
        "--set-json", "monitoring.prometheusRule.latencyBudgetRatio=0.4",
    )  # fmt: skip
    rules = {r["alert"]: r for g in one(load(path), "PrometheusRule")["spec"]["groups"] for r in g["rules"]}
    for alert in ("ModelgateLatencyHigh", "ModelgateWebhookSlowFromApiServer"):
        lines = rules[alert]["expr"].splitlines()
        mutate = next(line for line in lines if "mutate" in line)
        validate = next(line for line in lines if "validate" in line)
        assert mutate.endswith("> 4"), mutate  # 10 s x 0.4
        assert validate.endswith("> 2"), validate  # 5 s x 0.4


def test_dashboard_config_map_carries_the_sidecar_label_and_valid_json(assets: Assets, all_on) -> None:
    cm = named(load(all_on), "ConfigMap", "modelgate-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    dash = json.loads(cm["data"]["modelgate.json"])
    assert dash == json.loads((assets.chart / "files" / "dashboards" / "modelgate.json").read_text())
    assert dash["uid"] == "modelgate" and len(dash["panels"]) >= 10


def test_hpa_scales_the_deployment_on_cpu_and_replicas_are_left_to_it(all_on) -> None:
    docs = load(all_on)
    hpa, d = one(docs, "HorizontalPodAutoscaler"), one(docs, "Deployment")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": d["metadata"]["name"]}
    assert hpa["spec"]["minReplicas"] >= 2
    assert hpa["spec"]["metrics"][0]["resource"]["name"] == "cpu"
    assert "replicas" not in d["spec"], "replicas rendered although the HPA owns them"


def test_hpa_refuses_min_above_max(assets: Assets) -> None:
    r = assets.helm_template("--set", "autoscaling.enabled=true,autoscaling.minReplicas=5,autoscaling.maxReplicas=3", ok=False)
    assert r.returncode != 0 and "must not exceed" in r.stderr, r.stderr


def test_network_policy_opens_the_webhook_port_and_the_probe_port_to_monitoring(assets: Assets, all_on) -> None:
    docs = load(all_on)
    np, d = one(docs, "NetworkPolicy"), one(docs, "Deployment")
    assert selector_matches(np["spec"]["podSelector"], d["spec"]["template"]["metadata"]["labels"])
    webhook, probes = np["spec"]["ingress"]
    assert webhook["ports"] == [{"port": "https", "protocol": "TCP"}] and "from" not in webhook, webhook
    assert probes["ports"] == [{"port": "probes", "protocol": "TCP"}]
    assert probes["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    path = assets.render(
        "np", "--set", "networkPolicy.enabled=true,networkPolicy.monitoringNamespace=observability",
        "--set-json", 'networkPolicy.webhookFrom=[{"ipBlock":{"cidr":"10.0.0.0/24"}}]',
    )  # fmt: skip
    webhook, probes = one(load(path), "NetworkPolicy")["spec"]["ingress"]
    assert webhook["from"] == [{"ipBlock": {"cidr": "10.0.0.0/24"}}]
    assert probes["from"][0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] == "observability"
    assets.validate(path)


# --- the kustomize component is the chart's ---------------------------------------------------------
def test_kustomize_monitoring_is_the_charts(assets: Assets, all_on) -> None:
    k = load(assets.kustomize("monitoring"))
    h = load(
        assets.render(
            "monitoring-like",
            "--set",
            "monitoring.serviceMonitor.enabled=true,monitoring.prometheusRule.enabled=true,monitoring.dashboard.enabled=true",
        )
    )
    assert one(k, "PrometheusRule")["spec"] == one(h, "PrometheusRule")["spec"], (
        "manifests/components/monitoring/prometheusrule.yaml differs from the chart's rules "
        "(render the chart's for release modelgate in modelgate-system and copy the spec)"
    )
    ksm, hsm = one(k, "ServiceMonitor"), one(h, "ServiceMonitor")
    assert ksm["spec"]["endpoints"] == hsm["spec"]["endpoints"]
    assert selector_matches(ksm["spec"]["selector"], one(k, "Service")["metadata"]["labels"])
    assert filecmp.cmp(
        assets.manifests / "components" / "monitoring" / "dashboards" / "modelgate.json",
        assets.chart / "files" / "dashboards" / "modelgate.json",
        shallow=False,
    ), "the kustomize dashboard is not a copy of the chart's"
    cm = named(k, "ConfigMap", "modelgate-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert [d for d in of_kind(k, "ConfigMap") if d["metadata"]["name"] == "modelgate-dashboard"]


@pytest.mark.parametrize("source", ["helm", "kustomize"])
def test_the_pod_update_condition_is_the_binarys(assets: Assets, modelgate_bin: Path, source: str) -> None:
    """The validating webhook's Pod UPDATE condition (docs/policy.md §6: only updates that change
    an init container's image reach it) is written in the chart and the manifests by hand; it
    must say exactly what the backstop's policy says, which `modelgate backstop` renders."""
    name = "only-pod-updates-that-change-init-images"
    printed = run(modelgate_bin, "backstop", env={"PATH": "/usr/bin:/bin"}).stdout
    policy = next(d for d in yaml.safe_load_all(printed) if d and d["kind"] == "ValidatingAdmissionPolicy")
    want = " ".join(next(c["expression"] for c in policy["spec"]["matchConditions"] if c["name"] == name).split())
    path = assets.render("default") if source == "helm" else assets.kustomize("default")
    assert conditions(path)["validate.modelgate.io"][name] == want
