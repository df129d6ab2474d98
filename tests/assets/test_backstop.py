"""The backstop (docs/policy.md section 13): `modelgate backstop` prints objects that pass the Kubernetes
schema strictly, and the chart's backstop.enabled renders the same objects as the binary does for
the same values (the chart cannot run the binary, so this test is what keeps them equal)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from k8s import load, of_kind, one, policy_flags, selector_matches
from tools import NS, Assets, run

KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")


def binary(modelgate_bin: Path, work: Path, name: str, *args: str) -> Path:
    out = run(modelgate_bin, "backstop", *args, env={"PATH": "/usr/bin:/bin"}).stdout
    path = work / f"printed-{name}.yaml"
    path.write_text(out)
    return path


def without_labels(doc: dict) -> dict:
    doc = dict(doc)
    doc["metadata"] = {k: v for k, v in doc["metadata"].items() if k != "labels"}
    return doc


def test_the_binarys_objects_pass_the_schema_strictly(assets: Assets, modelgate_bin: Path) -> None:
    path = binary(modelgate_bin, assets.work, "default")
    docs = load(str(path))
    assert [d["kind"] for d in docs] == list(KINDS)
    assert assets.validate(path) == 2
    policy = one(docs, "ValidatingAdmissionPolicy")
    assert policy["spec"]["failurePolicy"] == "Fail"
    assert "paramKind" not in policy["spec"]
    assert one(docs, "ValidatingAdmissionPolicyBinding")["spec"]["validationActions"] == ["Deny"]


def test_the_help_says_what_it_prints(modelgate_bin: Path) -> None:
    out = run(modelgate_bin, "backstop", "--help").stdout
    assert "ValidatingAdmissionPolicy" in out and "--default-mode" in out and "--opt-in-label" in out


VALUES = {
    "defaults": [],
    "other policy": [
        "--set",
        "runAsUser=none,runAsGroup=none,defaultFSGroup=0,modelCachePrep=never,defaultMode=audit",
        "--set",
        "initContainer.user=4242,cacheVolume=weights,cacheMountPath=/var/cache/models",
        "--set-string",
        "initContainer.image=registry.example/busybox:1.36",
    ],
    "exemptions and priority classes": [
        "--set",
        "exemptNamespaces={team-x,team-y}",
        "--set",
        "matchConditions.excludePriorityClasses={system-node-critical}",
    ],
    # A kind of its own (two templates, a list and a map of them) and a shipped row replaced
    # (RayCluster with its head only), with priority classes: the table's rows in every
    # expression. The binary reads the same entries from the ConfigMap the server mounts.
    "workload kinds and priority classes": [
        "--set",
        "matchConditions.excludePriorityClasses={system-node-critical}",
        "--set-json",
        'workloadKinds.extra=[{"group":"example.com","versions":["v1"],"kind":"Trainer","plural":"trainers",'
        '"templates":[{"path":"spec.workers[*].template"},{"path":"spec.roles.*.pod","shape":"PodSpec"}]},'
        '{"group":"ray.io","versions":["v1"],"kind":"RayCluster","plural":"rayclusters",'
        '"templates":[{"path":"spec.headGroupSpec.template"}]}]',
    ],
}


@pytest.mark.parametrize("name", VALUES)
def test_the_chart_renders_what_the_binary_prints(assets: Assets, modelgate_bin: Path, name: str) -> None:
    rendered = assets.render(f"backstop-{name}", "--set", "backstop.enabled=true", *VALUES[name])
    docs = load(str(rendered))
    chart = [d for d in docs if d["kind"] in KINDS]
    assert [d["kind"] for d in chart] == list(KINDS)
    # The binary gets the flags the chart gives `serve`, and the chart's names.
    known = run(modelgate_bin, "backstop", "--help").stdout
    flags = [f"{k}={v}" for k, v in policy_flags(docs).items() if f"{k} " in known and k not in ("--exempt-namespace", "--workload-kinds")]
    # The table's extra entries: the file the server reads, from the rendered ConfigMap.
    table = [cm for cm in of_kind(docs, "ConfigMap") if "workload-kinds.yaml" in cm.get("data", {})]
    if table:
        extra = assets.work / f"workload-kinds-{name.replace(' ', '-')}.yaml"
        extra.write_text(table[0]["data"]["workload-kinds.yaml"])
        flags.append(f"--workload-kinds={extra}")
    args = [a for a in one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]]
    exempt = [a for a in args if a.startswith("--exempt-namespace=")]
    classes = [f"--exclude-priority-class={c}" for c in (["system-node-critical"] if "priority" in name else [])]
    sa = one(docs, "ServiceAccount")["metadata"]["name"]
    out = binary(
        modelgate_bin,
        assets.work,
        name,
        *flags,
        *exempt,
        *classes,
        "--name",
        chart[0]["metadata"]["name"],
        "--namespace",
        NS,
        "--service-account",
        sa,
    )
    printed = load(str(out))
    for got, want in zip(chart, printed, strict=True):
        assert without_labels(got) == without_labels(want), got["kind"]


def test_the_charts_objects_pass_the_schema_strictly(assets: Assets) -> None:
    path = assets.render("backstop-defaults", "--set", "backstop.enabled=true")
    docs = load(str(path))
    assert len([d for d in docs if d["kind"] in KINDS]) == 2
    assets.validate(path)


def hooks_of(path: Path) -> list[dict]:
    return [
        h
        for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
        for c in of_kind(load(str(path)), kind)
        for h in c["webhooks"]
    ]


def test_the_backstop_makes_ignore_the_webhooks_default(assets: Assets) -> None:
    def policies(path: Path) -> list[str]:
        return sorted({h["failurePolicy"] for h in hooks_of(path)})

    assert policies(assets.render("no-backstop")) == ["Fail"]
    assert not [d for d in load(str(assets.render("no-backstop"))) if d["kind"] in KINDS]
    # Ignore where the backstop is bound or nothing blocks; Fail where it cannot be bound (the
    # namespaces opened for exceptions, below).
    assert policies(assets.render("backstop-defaults", "--set", "backstop.enabled=true")) == ["Fail", "Ignore"]
    explicit = assets.render("backstop-fail", "--set", "backstop.enabled=true,failurePolicy=Fail")
    assert policies(explicit) == ["Fail"]
    assert len(hooks_of(explicit)) == 3, "an explicit failurePolicy: one entry per webhook"


HOOKS = ("mutate", "validate", "validate-controllers")
SCOPES = ("", "-exceptions", "-exceptions-nonblocking", "-exceptions-unlabelled")


@pytest.mark.parametrize("default_mode", ["enforce", "warn", "audit"])
def test_with_the_backstop_the_webhooks_fail_open_only_where_an_outage_lets_no_root_pod_in(assets: Assets, default_mode: str) -> None:
    """Over a table of namespace labels: every opted-in namespace is selected by exactly one
    entry of each webhook; its failurePolicy is Ignore where the backstop's binding selects the
    namespace or its mode never blocks, and Fail only in the enforce namespaces opened for
    exceptions, which the binding leaves out (docs/exceptions.md, "During an outage")."""
    path = assets.render(f"backstop-scopes-{default_mode}", "--set", f"backstop.enabled=true,defaultMode={default_mode}")
    hooks = hooks_of(path)
    binding = one(load(str(path)), "ValidatingAdmissionPolicyBinding")["spec"]["matchResources"]["namespaceSelector"]
    names = {h["name"] for h in hooks}
    assert names <= {f"{hook}{scope}.modelgate.io" for hook in HOOKS for scope in SCOPES}, names
    fails = 0
    for opted_in in (True, False):
        for mode in (None, "enforce", "warn", "audit", "off", "strict"):
            for exceptions in (None, "allowed", "closed"):
                labels = {"kubernetes.io/metadata.name": "team-a"}
                if opted_in:
                    labels["modelgate.io/inject"] = "enabled"
                if mode:
                    labels["modelgate.io/mode"] = mode
                if exceptions:
                    labels["modelgate.io/exceptions"] = exceptions
                effective = mode or default_mode
                blocks = effective not in ("warn", "audit", "off")
                bound = selector_matches(binding, labels)
                assert bound == (opted_in and blocks and exceptions != "allowed"), (labels, binding)
                for hook in HOOKS:
                    selecting = [h for h in hooks if h["name"].startswith(hook + ".") or h["name"].startswith(hook + "-e")]
                    selecting = [h for h in selecting if selector_matches(h["namespaceSelector"], labels)]
                    if not opted_in:
                        assert not selecting, (hook, labels)
                        continue
                    assert len(selecting) == 1, (hook, labels, [h["name"] for h in selecting])
                    want = "Fail" if blocks and not bound else "Ignore"
                    assert selecting[0]["failurePolicy"] == want, (hook, labels, selecting[0]["name"])
                    fails += want == "Fail"
    assert fails == 3 * (3 if default_mode == "enforce" else 2), fails


def test_auto_installs_the_backstop_where_the_cluster_serves_it(assets: Assets) -> None:
    """backstop.enabled defaults to auto: on where the API server serves ValidatingAdmissionPolicy
    v1 (what helm install reads from discovery; --api-versions stands in for it here)."""
    vap = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"
    served = load(str(assets.render("backstop-auto-served", "--api-versions", vap)))
    assert sorted(d["kind"] for d in served if d["kind"] in KINDS) == sorted(KINDS)
    hooks = [h for d in served if d["kind"].endswith("WebhookConfiguration") for h in d["webhooks"]]
    assert {h["failurePolicy"] for h in hooks if "-exceptions." not in h["name"]} == {"Ignore"}
    assert not [d for d in load(str(assets.render("no-backstop"))) if d["kind"] in KINDS]
    off = load(str(assets.render("backstop-off-served", "--api-versions", vap, "--set", "backstop.enabled=false")))
    assert not [d for d in off if d["kind"] in KINDS]


def test_the_kustomize_component_is_the_binarys_output_for_the_base_policy(assets: Assets, modelgate_bin: Path) -> None:
    component = assets.manifests / "components" / "backstop"
    overlay = assets.work / "overlay-backstop"
    overlay.mkdir(exist_ok=True)
    rel = os.path.relpath(assets.manifests, overlay)
    (overlay / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources: [{rel}/base]\ncomponents: [{rel}/components/backstop]\n"
    )
    rendered = assets.work / "k-backstop.yaml"
    rendered.write_text(run(assets.tool("kubectl"), "kustomize", overlay).stdout)
    docs = load(str(rendered))
    known = run(modelgate_bin, "backstop", "--help").stdout
    flags = [f"{k}={v}" for k, v in policy_flags(docs).items() if f"{k} " in known]
    printed = load(str(binary(modelgate_bin, assets.work, "base", *flags, "--namespace", NS)))
    assert load(str(component / "backstop.yaml")) == printed
    hooks = [
        h for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration") for c in of_kind(docs, kind) for h in c["webhooks"]
    ]
    # The base's Fail: a component cannot register the per-namespace entries the chart does.
    assert {h["failurePolicy"] for h in hooks} == {"Fail"} and len(hooks) == 3
    assets.validate(rendered)
