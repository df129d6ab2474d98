"""The audit CronJob (`modelgate audit --from-cluster --write-reports` on a schedule) of the chart
(audit.enabled) and of manifests/components/audit-cronjob: it renders and validates for both
report APIs and the OpenShift preset, runs the audit with the webhook's policy and security
context, and its ServiceAccount may list what the audit reads and write the chosen report kind,
nothing more. Its alert fires when the last run could not finish, not when it found denials."""

from __future__ import annotations

import copy
import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

import checks
from k8s import Obj, crd_files, crd_validators, deployment_container, expect, load, of_kind, one, selector_matches
from tools import NS, PINNED_CRDS, REPO, Assets, run

AUDIT_ON = ["--set", "audit.enabled=true"]
# report API value -> (group, resource) the CronJob may write, and the other one it may not.
REPORTS = {"openreports": ("openreports.io", "reports"), "policyreport": ("wgpolicyk8s.io", "policyreports")}
WRITE_VERBS = {"create", "patch", "list", "delete"}  # server-side apply (+ create of a new one), prune
# What `audit --from-cluster` lists wherever it audits: Pods, Jobs and the rows of the
# workload-kind table (it lists those the cluster serves).
WORKLOADS = {("", "pods"), ("batch", "jobs")} | {(r["group"], r["plural"]) for r in checks.WORKLOAD_KINDS}
# ... and cluster-wide in any case: model routing and the namespaces' Pod Security labels.
CLUSTER_READS = {
    ("serving.kserve.io", "localmodelcaches"), ("serving.kserve.io", "localmodelnamespacecaches"),
    ("serving.kserve.io", "localmodelnodegroups"), ("", "persistentvolumeclaims"), ("", "nodes"), ("", "namespaces"),
    ("modelgate.io", "modelgateexceptions"),
}  # fmt: skip
# The flags of the policy (docs/policy.md section 2), which the audit must take as the webhook does.
POLICY_FLAGS = checks.POLICY_FLAGS | {"--default-mode"}


@pytest.fixture(scope="module")
def openreports(assets: Assets) -> Path:
    return assets.render("audit-openreports", *AUDIT_ON)


@pytest.fixture(scope="module")
def policyreport(assets: Assets) -> Path:
    return assets.render("audit-policyreport", *AUDIT_ON, "--set", "audit.reportApi=policyreport")


@pytest.fixture(scope="module")
def openshift(assets: Assets) -> Path:
    return assets.render("audit-openshift", "-f", str(assets.chart / "values-openshift.yaml"), *AUDIT_ON)


@pytest.fixture(scope="module")
def namespaced(assets: Assets) -> Path:
    return assets.render("audit-namespaces", *AUDIT_ON, "--set", "audit.namespaces={team-a,team-b}")


RENDERS = ["openreports", "policyreport", "openshift", "namespaced"]


# --- what a rendered audit must be --------------------------------------------------------------------
def audit_container(docs: list[Obj]) -> tuple[Obj, Obj, Obj]:
    """The CronJob, its pod spec and its one container."""
    cj = one(docs, "CronJob")
    pod = cj["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    expect(len(pod["containers"]) == 1, "expected one container in the audit CronJob")
    return cj, pod, pod["containers"][0]


def env_policy(docs: list[Obj], c: Obj) -> dict[str, str]:
    """MODELGATE_* variables of a container (envFrom ConfigMaps, then env), and its policy arguments."""
    cms = {cm["metadata"]["name"]: cm for cm in of_kind(docs, "ConfigMap")}
    out: dict[str, str] = {}
    for src in c.get("envFrom") or []:
        ref = src["configMapRef"]["name"]
        expect(ref in cms, f"envFrom names a ConfigMap that is not rendered: {ref}")
        out.update({k: str(v) for k, v in cms[ref].get("data", {}).items()})
    out.update({e["name"]: str(e["value"]) for e in c.get("env") or [] if e["name"].startswith("MODELGATE_") and "value" in e})
    out.update({"arg " + a: "" for a in c.get("args") or [] if a.split("=", 1)[0] in POLICY_FLAGS})
    return out


def audit_cronjob(path, report_api: str, namespaces: tuple[str, ...] = ()) -> None:
    docs = load(path)
    cj, pod, c = audit_container(docs)
    d, dc = deployment_container(docs)
    dpod = d["spec"]["template"]["spec"]
    spec, job = cj["spec"], cj["spec"]["jobTemplate"]["spec"]
    name = cj["metadata"]["name"]
    expect(cj["metadata"]["namespace"] == d["metadata"]["namespace"], "the CronJob is not in the webhook's namespace")
    expect(len(name) <= 52, f"CronJob name {name} is longer than 52 (its Jobs' names would not fit in 63)")
    expect(spec["concurrencyPolicy"] in ("Forbid", "Replace"), "two audits at once would write and prune the same reports")
    expect(spec.get("startingDeadlineSeconds"), "no startingDeadlineSeconds")
    expect(0 < job["activeDeadlineSeconds"] <= 86400, "the run needs a deadline")
    # Findings are the reports' content: the run exits 0 with them (docs/policy.md section 10), so no rule of
    # the Job's podFailurePolicy looks at exit codes; disruptions are retried without counting.
    rules = (job.get("podFailurePolicy") or {}).get("rules") or []
    expect(not any("onExitCodes" in r for r in rules), f"a podFailurePolicy rule on exit codes: {rules}")
    expect(
        any(r["action"] == "Ignore" and {"type": "DisruptionTarget", "status": "True"} in r.get("onPodConditions", []) for r in rules),
        f"a disruption counts against backoffLimit: {rules}",
    )
    expect("--fail-on-findings" not in c["args"], "--fail-on-findings would fail the Job for its findings")
    expect(pod["restartPolicy"] == "Never", "podFailurePolicy needs restartPolicy Never")
    # The command.
    args = c["args"]
    expect(args[0] == "audit", f"the container must run `modelgate audit`: {args}")
    for a in ("--from-cluster", "--write-reports"):
        expect(a in args, f"{a} missing: {args}")
    apis = [a for a in args if a.startswith("--report-api")]
    expect(apis == [f"--report-api={report_api}"], f"expected --report-api={report_api} once, found {apis}")
    got_ns = tuple(a.split("=", 1)[1] for a in args if a.startswith("--namespace=") or a.startswith("-n="))
    expect(got_ns == namespaces, f"--namespace arguments are {got_ns}, expected {namespaces}")
    expect(c["image"] == dc["image"], f"the audit runs {c['image']}, the webhook {dc['image']}")
    # The webhook's policy, handed over the same way.
    expect(env_policy(docs, c) == env_policy(docs, dc), "the audit's policy differs from the webhook's")
    envs = {e["name"]: e for e in c.get("env") or []}
    expect(
        envs.get("POD_NAMESPACE", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.namespace",
        "POD_NAMESPACE must come from the downward API: the audit exempts its own namespace as the webhook does",
    )
    # The webhook's security context, exactly (so the OpenShift preset reaches it too).
    expect(pod.get("securityContext") == dpod.get("securityContext"), "pod securityContext differs from the webhook's")
    expect(c.get("securityContext") == dc.get("securityContext"), "container securityContext differs from the webhook's")
    csc = c["securityContext"]
    eff = {**(pod.get("securityContext") or {}), **csc}
    expect(eff.get("runAsNonRoot") is True and csc.get("readOnlyRootFilesystem") is True, "runAsNonRoot, readOnlyRootFilesystem")
    expect(csc.get("allowPrivilegeEscalation") is False and csc["capabilities"]["drop"] == ["ALL"], "no escalation, drop ALL")
    expect((eff.get("seccompProfile") or {}).get("type") == "RuntimeDefault", "seccompProfile RuntimeDefault")
    res = c.get("resources") or {}
    expect(res.get("requests", {}).get("cpu") and res.get("requests", {}).get("memory"), "cpu and memory requests")
    expect(res.get("limits", {}).get("memory"), "a memory limit")
    # Its own ServiceAccount, with a token.
    sa = pod["serviceAccountName"]
    expect(sa != dpod["serviceAccountName"], "the audit must not run as the webhook's ServiceAccount")
    sas = [x for x in of_kind(docs, "ServiceAccount") if x["metadata"]["name"] == sa]
    expect(sas, f"ServiceAccount {sa} not rendered")
    expect(pod.get("automountServiceAccountToken", sas[0].get("automountServiceAccountToken", True)) is True, "no token")
    # Its pods are none of the webhook's: no Service, PDB or Deployment selects them.
    labels = cj["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["labels"]
    for kind in ("Service", "PodDisruptionBudget", "Deployment"):
        for o in of_kind(docs, kind):
            sel = o["spec"]["selector"]
            sel = sel if kind != "Service" else {"matchLabels": sel}
            expect(not selector_matches(sel, labels), f"{kind} {o['metadata']['name']} selects the audit pods")


def permissions(docs: list[Obj], sa: str, ns: str) -> set[tuple[str, str, str, str]]:
    """What a ServiceAccount may do through the rendered bindings: (scope, group, resource, verb),
    scope "*" for a ClusterRoleBinding, else the RoleBinding's namespace."""
    roles = {("ClusterRole", None, r["metadata"]["name"]): r for r in of_kind(docs, "ClusterRole")}
    roles |= {("Role", r["metadata"]["namespace"], r["metadata"]["name"]): r for r in of_kind(docs, "Role")}
    out = set()
    for b in of_kind(docs, "ClusterRoleBinding") + of_kind(docs, "RoleBinding"):
        if {"kind": "ServiceAccount", "name": sa, "namespace": ns} not in b["subjects"]:
            continue
        scope = "*" if b["kind"] == "ClusterRoleBinding" else b["metadata"]["namespace"]
        ref = b["roleRef"]
        key = (ref["kind"], None if ref["kind"] == "ClusterRole" else b["metadata"]["namespace"], ref["name"])
        expect(key in roles, f"{b['kind']} {b['metadata']['name']} binds {key}, which is not rendered")
        for r in roles[key]["rules"]:
            expect("resourceNames" not in r and "nonResourceURLs" not in r, f"unexpected rule {r}")
            out |= {(scope, g, res, v) for g in r["apiGroups"] for res in r["resources"] for v in r["verbs"]}
    return out


def expected_permissions(report_api: str, namespaces: tuple[str, ...], images: bool = False) -> set[tuple[str, str, str, str]]:
    scopes = namespaces or ("*",)
    group, resource = REPORTS[report_api]
    return (
        {("*", g, r, "list") for g, r in CLUSTER_READS}
        | {(s, g, r, "list") for s in scopes for g, r in WORKLOADS}
        | {(s, group, resource, v) for s in scopes for v in WRITE_VERBS}
        # --images: each workload's pull secrets, its own or its ServiceAccount's.
        | {(s, "", r, "get") for s in scopes for r in ("secrets", "serviceaccounts") if images}
    )


def audit_rbac(path, report_api: str, namespaces: tuple[str, ...] = (), images: bool = False) -> None:
    docs = load(path)
    _, pod, _ = audit_container(docs)
    ns = one(docs, "CronJob")["metadata"]["namespace"]
    got = permissions(docs, pod["serviceAccountName"], ns)
    want = expected_permissions(report_api, namespaces, images)
    expect(got == want, f"audit RBAC: extra {sorted(got - want)}, missing {sorted(want - got)}")


# --- the chart -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "values",
    [AUDIT_ON, [*AUDIT_ON, "--set", "audit.reportApi=policyreport"], ["-f", "values-openshift.yaml", *AUDIT_ON]],
    ids=["openreports", "policyreport", "openshift"],
)
def test_helm_lint_strict_with_audit(assets: Assets, values: list[str]) -> None:
    values = [str(assets.chart / v) if v.endswith(".yaml") else v for v in values]
    run(assets.helm, "lint", "--strict", assets.chart, *values)


@pytest.mark.parametrize("render", RENDERS)
def test_audit_render_passes_kubernetes_validate(assets: Assets, request, render: str) -> None:
    assets.validate(request.getfixturevalue(render))


@pytest.mark.parametrize(
    ("render", "api"), [("openreports", "openreports"), ("policyreport", "policyreport"), ("openshift", "openreports")]
)
def test_audit_cronjob(request, render: str, api: str) -> None:
    path = request.getfixturevalue(render)
    audit_cronjob(path, api)
    audit_rbac(path, api)


def test_audit_openshift_leaves_ids_to_the_scc(openshift) -> None:
    _, pod, c = audit_container(load(openshift))
    for k in ("runAsUser", "runAsGroup", "fsGroup"):
        expect(k not in (pod.get("securityContext") or {}) and k not in c["securityContext"], f"{k} is set; restricted-v2 refuses it")
    args = c["args"]
    for a in ("--run-as-user=none", "--run-as-group=none", "--default-fsgroup=0"):
        expect(a in args, f"{a} missing: the audit must judge with the OpenShift policy")


def test_audit_numeric_ids_elsewhere(openreports) -> None:
    _, _, c = audit_container(load(openreports))
    uid = c["securityContext"].get("runAsUser")
    expect(isinstance(uid, int) and not isinstance(uid, bool) and uid > 0, f"runAsUser {uid!r}")


def test_audit_namespaces_get_roles_of_their_own(namespaced) -> None:
    """audit.namespaces: the workload lists and the report writes are granted in those namespaces
    only (a Role each); the cluster-wide reads stay in the ClusterRole."""
    audit_cronjob(namespaced, "openreports", ("team-a", "team-b"))
    audit_rbac(namespaced, "openreports", ("team-a", "team-b"))


@pytest.mark.parametrize("namespaces", [(), ("team-a",)])
def test_audit_images_reads_pull_secrets_where_it_lists_workloads(assets: Assets, namespaces: tuple[str, ...]) -> None:
    """audit.images: `--images`, get on Secrets and ServiceAccounts wherever the workloads are
    listed (no more), and the nodes' credentials mounted from a Secret as --registry-config."""
    scope = ["--set", "audit.namespaces={" + ",".join(namespaces) + "}"] if namespaces else []
    path = assets.render(
        f"audit-images-{len(namespaces)}", *AUDIT_ON, *scope,
        "--set", "audit.images.enabled=true,audit.images.registryConfigSecret=node-pull-creds",
    )  # fmt: skip
    assets.validate(path)
    audit_rbac(path, "openreports", namespaces, images=True)
    _, pod, c = audit_container(load(path))
    config = "/etc/modelgate/registry/.dockerconfigjson"
    assert "--images" in c["args"] and f"--registry-config={config}" in c["args"], c["args"]
    [mount] = [m for m in c["volumeMounts"] if m["name"] == "registry-config"]
    [volume] = [v for v in pod["volumes"] if v["name"] == "registry-config"]
    assert volume["secret"]["secretName"] == "node-pull-creds"
    assert f"{mount['mountPath']}/{volume['secret']['items'][0]['path']}" == config
    # Without it: no --images, no Secret read.
    plain = assets.render("audit-images-off", *AUDIT_ON, "--set", "audit.images.registryConfigSecret=node-pull-creds")
    _, pod, c = audit_container(load(plain))
    assert "--images" not in c["args"] and not [a for a in c["args"] if a.startswith("--registry-config")]
    assert "volumes" not in pod
    audit_rbac(plain, "openreports")


def test_audit_knobs(assets: Assets) -> None:
    f = assets.values_file(
        "audit-knobs",
        """audit:
  enabled: true
  schedule: "@daily"
  timeZone: Europe/Berlin
  pageSize: 100
  backoffLimit: 0
  ttlSecondsAfterFinished: 172800
  priorityClassName: low
  nodeSelector: {kubernetes.io/os: linux}
  tolerations: [{key: dedicated, operator: Exists, effect: NoSchedule}]
  affinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms:
    [{matchExpressions: [{key: kubernetes.io/arch, operator: In, values: [amd64]}]}]}}}
  podLabels: {team: platform}
  podAnnotations: {example.com/audit: "yes"}
  serviceAccount: {annotations: {example.com/role: audit}}
  extraArgs: ["--caches=/dev/null"]
  extraEnv: [{name: RUST_LOG, value: debug}]
exemptNamespaces: [monitoring]
fullnameOverride: modelgate-with-a-rather-long-full-name-that-leaves-no-room-left
""",
    )
    path = assets.render("audit-knobs", "-f", str(f))
    assets.validate(path)
    audit_cronjob(path, "openreports")
    docs = load(path)
    cj, pod, c = audit_container(docs)
    job = cj["spec"]["jobTemplate"]["spec"]
    assert (cj["spec"]["schedule"], cj["spec"]["timeZone"]) == ("@daily", "Europe/Berlin")
    assert (job["backoffLimit"], job["ttlSecondsAfterFinished"]) == (0, 172800)
    assert pod["priorityClassName"] == "low" and pod["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert pod["tolerations"][0]["key"] == "dedicated" and "nodeAffinity" in pod["affinity"]
    assert cj["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["labels"]["team"] == "platform"
    assert "--page-size=100" in c["args"] and c["args"][-1] == "--caches=/dev/null"
    assert "--exempt-namespace=monitoring" in c["args"]
    assert {"name": "RUST_LOG", "value": "debug"} in c["env"]
    sa = next(s for s in of_kind(docs, "ServiceAccount") if s["metadata"]["name"] == pod["serviceAccountName"])
    assert sa["metadata"]["annotations"] == {"example.com/role": "audit"}


def test_audit_defaults_render_no_ttl_and_no_audit_when_disabled(assets: Assets, openreports) -> None:
    job = one(load(openreports), "CronJob")["spec"]["jobTemplate"]["spec"]
    assert "ttlSecondsAfterFinished" not in job, "the history limits keep the last failed run's Job for the alert"
    for doc in load(assets.render("default")):
        labels = doc["metadata"].get("labels") or {}
        assert labels.get("app.kubernetes.io/component") != "audit", f"{doc['kind']} {doc['metadata']['name']} rendered while disabled"
        assert doc["kind"] not in ("CronJob", "Role", "RoleBinding"), doc["kind"]


def test_audit_leaves_the_webhooks_objects_as_they_were(assets: Assets, openreports) -> None:
    """Enabling the audit adds objects and changes none of the webhook's (its RBAC above all)."""

    def objects(path) -> dict:
        out = {}
        for d in load(path):
            if d["kind"] in ("Secret", "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
                continue  # a new certificate per render
            if d["kind"] == "Deployment":
                d["spec"]["template"]["metadata"].pop("annotations", None)  # its checksum
            out[(d["kind"], d["metadata"]["name"])] = d
        return out

    default, audit = objects(assets.render("default")), objects(openreports)
    for key, d in default.items():
        assert audit.get(key) == d, f"{key} changes when the audit is enabled"
    added = sorted(k for k in audit if k not in default)
    assert added == [("ClusterRole", "modelgate-audit"), ("ClusterRoleBinding", "modelgate-audit"), ("CronJob", "modelgate-audit"),
                     ("ServiceAccount", "modelgate-audit")], added  # fmt: skip


def test_audit_checks_can_fail(assets: Assets, openreports, policyreport) -> None:
    """The checks above refuse a watch verb, a write on the workloads, a CronJob without
    --write-reports and a report API that is not the one asked for."""

    def broken(name: str, change) -> Path:
        docs = load(openreports)
        change(docs)
        path = assets.work / f"audit-broken-{name}.yaml"
        path.write_text(yaml.safe_dump_all(docs))
        return path

    def audit_role(docs: list[Obj]) -> Obj:
        return next(r for r in of_kind(docs, "ClusterRole") if r["metadata"]["name"].endswith("-audit"))

    def deployments(role: Obj) -> Obj:
        return next(r for r in role["rules"] if "deployments" in r["resources"])

    with pytest.raises(AssertionError, match=r"extra.*watch"):
        audit_rbac(broken("watch", lambda docs: audit_role(docs)["rules"][0]["verbs"].append("watch")), "openreports")
    with pytest.raises(AssertionError, match=r"extra.*deployments', 'patch'"):
        audit_rbac(broken("write", lambda docs: deployments(audit_role(docs))["verbs"].append("patch")), "openreports")
    with pytest.raises(AssertionError, match="--write-reports"):
        audit_cronjob(broken("args", lambda docs: audit_container(docs)[2]["args"].remove("--write-reports")), "openreports")
    with pytest.raises(AssertionError, match="--report-api=openreports"):
        audit_cronjob(policyreport, "openreports")
    with pytest.raises(AssertionError, match=r"extra.*wgpolicyk8s"):
        audit_rbac(policyreport, "openreports")


# --- the alert -----------------------------------------------------------------------------------------
AUDIT_JOB = 'namespace="modelgate-system",job_name="modelgate-audit-{n}"'
REASONS = ("BackoffLimitExceeded", "DeadlineExceeded", "Evicted")


def job_series(n: int, start: int, failed_reason: str | None) -> dict[str, str]:
    """kube-state-metrics' series of one finished Job: its start time, and kube_job_status_failed
    as it exports it (a series per known reason, or reason="" for another one such as PodFailurePolicy)."""
    sel = AUDIT_JOB.format(n=n)
    out = {f"kube_job_status_start_time{{{sel}}}": f"{start}x40"}
    if failed_reason is None:
        out[f"kube_job_status_failed{{{sel}}}"] = "0x40"
    elif failed_reason in REASONS:
        out |= {f'kube_job_status_failed{{{sel},reason="{r}"}}': ("1x40" if r == failed_reason else "0x40") for r in REASONS}
    else:
        out[f'kube_job_status_failed{{{sel},reason=""}}'] = "1x40"
    return out


def alert_case(series: dict[str, str], fires: list[dict[str, str]]) -> dict:
    return {
        "interval": "1m",
        "input_series": [{"series": s, "values": v} for s, v in series.items()],
        "alert_rule_test": [
            {
                "eval_time": "10m",
                "alertname": "ModelgateAuditFailing",
                "exp_alerts": [{"exp_labels": {"alertname": "ModelgateAuditFailing", "severity": "warning", **f}} for f in fires],
            }
        ],
    }


def failing(n: int, reason: str) -> dict[str, str]:
    return {"namespace": NS, "job_name": f"modelgate-audit-{n}", "reason": reason}


ALERT_CASES = {
    "the last run gave up after its retries": alert_case(
        job_series(1, 1000, None) | job_series(2, 2000, "BackoffLimitExceeded"), [failing(2, "BackoffLimitExceeded")]
    ),
    "the last run hit activeDeadlineSeconds": alert_case(job_series(2, 2000, "DeadlineExceeded"), [failing(2, "DeadlineExceeded")]),
    "a Job failed by a podFailurePolicy rule the operator added": alert_case(
        job_series(1, 1000, None) | job_series(2, 2000, "PodFailurePolicy"), []
    ),
    "a failed run, then a good one": alert_case(job_series(1, 1000, "BackoffLimitExceeded") | job_series(2, 2000, None), []),
    "another CronJob's Job failed": alert_case(
        {
            'kube_job_status_start_time{namespace="modelgate-system",job_name="backup-123"}': "3000x40",
            'kube_job_status_failed{namespace="modelgate-system",job_name="backup-123",reason="BackoffLimitExceeded"}': "1x40",
        }
        | job_series(2, 2000, None),
        [],
    ),
}


@pytest.fixture(scope="module")
def audit_rules(assets: Assets) -> Path:
    path = assets.render("audit-rules", *AUDIT_ON, "--set", "monitoring.prometheusRule.enabled=true")
    return assets.rules_for_tests("audit-rules-for-tests", path)


@pytest.mark.parametrize("name", sorted(ALERT_CASES))
def test_audit_alert(assets: Assets, audit_rules: Path, name: str) -> None:
    assets.promtool_test(audit_rules, "audit-alert-" + name, ALERT_CASES[name])


def test_audit_alert_test_can_fail(assets: Assets, audit_rules: Path) -> None:
    wrong = alert_case(job_series(2, 2000, "PodFailurePolicy"), [failing(2, "")])
    assert assets.promtool_test(audit_rules, "audit-alert-wrong", wrong, ok=False).returncode != 0


def test_audit_alert_only_with_the_audit_and_with_a_runbook(assets: Assets, audit_rules: Path) -> None:
    rules = one(load(assets.render("audit-rules", *AUDIT_ON, "--set", "monitoring.prometheusRule.enabled=true")), "PrometheusRule")
    groups = {g["name"]: g["rules"] for g in rules["spec"]["groups"]}
    (alert,) = groups["modelgate-audit"]
    assert alert["labels"]["severity"] in ("critical", "warning") and alert["annotations"]["summary"]
    assert 'Runbook: docs/audit.md, "When a run fails"' in " ".join(alert["annotations"]["description"].split())
    assert "\n### When a run fails\n" in (REPO / "docs" / "audit.md").read_text(), "the runbook section is missing"
    plain = one(load(assets.render("rules-no-audit", "--set", "monitoring.prometheusRule.enabled=true")), "PrometheusRule")
    assert [g["name"] for g in plain["spec"]["groups"]] == ["modelgate"], "the audit alert renders without the audit"
    out = run(assets.tool("promtool"), "check", "rules", audit_rules).stdout
    assert "SUCCESS" in out, out


# --- the kustomize component ---------------------------------------------------------------------------
COMPONENT = "components/audit-cronjob"


def overlay(assets: Assets, name: str, base: str, *components: str) -> Path:
    """An overlay of manifests/BASE with the components, built with kubectl kustomize (which
    takes relative paths only)."""
    d = assets.work / "overlays" / name
    d.mkdir(parents=True, exist_ok=True)
    rel = os.path.relpath(assets.manifests, d)
    (d / "kustomization.yaml").write_text(
        yaml.safe_dump({"resources": [f"{rel}/{base}"], "components": [f"{rel}/{c}" for c in components]})
    )
    out = assets.work / f"k-audit-{name}.yaml"
    out.write_text(run(assets.tool("kubectl"), "kustomize", d).stdout)
    return out


@pytest.fixture(scope="module")
def k_openreports(assets: Assets) -> Path:
    return overlay(assets, "openreports", "default", COMPONENT)


@pytest.fixture(scope="module")
def k_policyreport(assets: Assets) -> Path:
    return overlay(assets, "policyreport", "default", COMPONENT, COMPONENT + "/policyreport")


@pytest.fixture(scope="module")
def k_openshift(assets: Assets) -> Path:
    return overlay(assets, "openshift", "openshift", COMPONENT, COMPONENT + "/openshift")


@pytest.fixture(scope="module")
def k_monitoring(assets: Assets) -> Path:
    return overlay(assets, "monitoring", "monitoring", COMPONENT, COMPONENT + "/monitoring")


@pytest.mark.parametrize(
    ("render", "api"),
    [("k_openreports", "openreports"), ("k_policyreport", "policyreport"), ("k_openshift", "openreports"), ("k_monitoring", "openreports")],
)
def test_kustomize_audit_component(assets: Assets, request, render: str, api: str) -> None:
    path = request.getfixturevalue(render)
    assets.validate(path)
    audit_cronjob(path, api)
    audit_rbac(path, api)


def test_kustomize_audit_openshift(k_openshift) -> None:
    docs = load(k_openshift)
    _, pod, c = audit_container(docs)
    for k in ("runAsUser", "runAsGroup", "fsGroup"):
        expect(k not in pod["securityContext"] and k not in c["securityContext"], f"{k} is set; restricted-v2 refuses it")
    assert env_policy(docs, c)["MODELGATE_RUN_AS_USER"] == "none"


def test_kustomize_audit_is_the_charts(openreports, k_openreports) -> None:
    """The component's CronJob and rules are the chart's (release modelgate): only labels and the
    way the policy reaches the container (arguments or the modelgate-policy ConfigMap) differ."""

    def comparable(path) -> tuple[Obj, list]:
        docs = load(path)
        cj = copy.deepcopy(one(docs, "CronJob"))
        c = cj["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]
        c["args"] = [a for a in c["args"] if a.split("=", 1)[0] not in POLICY_FLAGS]
        c.pop("envFrom", None)
        for meta in (cj["metadata"], cj["spec"]["jobTemplate"]["metadata"], cj["spec"]["jobTemplate"]["spec"]["template"]["metadata"]):
            meta.pop("labels", None)
        cr = [r for r in of_kind(docs, "ClusterRole") if r["metadata"]["name"].endswith("-audit")]
        return cj, sorted(yaml.safe_dump(r, sort_keys=True) for r in cr[0]["rules"])

    chart, kustomize = comparable(openreports), comparable(k_openreports)
    assert kustomize[0] == chart[0], "manifests/components/audit-cronjob/cronjob.yaml differs from the chart's CronJob"
    assert kustomize[1] == chart[1], "manifests/components/audit-cronjob/rbac.yaml differs from the chart's ClusterRole"


def test_kustomize_audit_alert_is_the_charts(assets: Assets, k_monitoring) -> None:
    chart = one(load(assets.render("audit-rules", *AUDIT_ON, "--set", "monitoring.prometheusRule.enabled=true")), "PrometheusRule")
    rules = {r["metadata"]["name"]: r for r in of_kind(load(k_monitoring), "PrometheusRule")}
    assert sorted(rules) == ["modelgate", "modelgate-audit"], sorted(rules)
    (group,) = rules["modelgate-audit"]["spec"]["groups"]
    assert group == next(g for g in chart["spec"]["groups"] if g["name"] == "modelgate-audit"), (
        "manifests/components/audit-cronjob/monitoring/prometheusrule.yaml differs from the chart's modelgate-audit group"
    )


# --- docs/audit.md ------------------------------------------------------------------------------------
def test_audit_doc_names_only_existing_paths() -> None:
    checks.docs_paths(REPO, "docs/audit.md")


def doc_sample() -> tuple[str, str, str]:
    """The sample of docs/audit.md: SOURCE_DATE_EPOCH, the input objects, the reports shown."""
    m = re.search(
        r"```sh\nSOURCE_DATE_EPOCH=(\d+) modelgate audit -o openreports - <<'EOF'\n(.*?)\nEOF\n```\n\n```yaml\n(.*?)\n```",
        (REPO / "docs" / "audit.md").read_text(),
        re.S,
    )
    expect(m, "docs/audit.md has no sample report (a sh block running audit -o openreports -, then a yaml block)")
    return m.group(1), m.group(2), m.group(3)


def test_audit_doc_sample_report_passes_the_openreports_crd() -> None:
    validators = crd_validators(crd_files(str(PINNED_CRDS), "openreports.io_*.yaml"))
    validator = validators.get(("openreports.io/v1alpha1", "Report"))
    expect(validator, f"no pinned OpenReports Report CRD in {PINNED_CRDS}")
    reports = [d for d in yaml.safe_load_all(doc_sample()[2]) if d]
    assert [r["summary"]["fail"] for r in reports] == [0, 1], "the sample shows a patched and a denied workload"
    for r in reports:
        errors = [f"{'.'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(r)]
        assert not errors, f"{r['metadata']['name']}: {errors}"
        assert r["metadata"]["ownerReferences"][0]["uid"] == r["scope"]["uid"]


def test_audit_doc_sample_report_is_what_the_binary_writes(modelgate_bin: Path) -> None:
    epoch, objects, shown = doc_sample()
    r = subprocess.run(
        [str(modelgate_bin), "audit", "-o", "openreports", "-"],
        input=objects + "\n",
        capture_output=True,
        text=True,
        env={**os.environ, "SOURCE_DATE_EPOCH": epoch},
        check=False,
    )
    assert r.returncode == 1, f"exit {r.returncode} (one workload would be denied: 1):\n{r.stderr}"
    assert r.stdout.rstrip() == shown.rstrip(), "docs/audit.md's sample is not what `audit -o openreports` writes:\n" + r.stdout
