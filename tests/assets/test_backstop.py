"""The backstop (docs/policy.md section 13): `modelgate backstop` prints objects that pass the Kubernetes
schema strictly, and the chart's backstop.enabled renders the same objects as the binary does for
the same values (the chart cannot run the binary, so this test is what keeps them equal)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from k8s import load, of_kind, one, policy_flags, selector_matches
from tools import NS, REPO, Assets, run

KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
MUTATING_KINDS = ("MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding")
MAP_API = "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy"


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


def test_the_mutating_policy_passes_the_schema_strictly(assets: Assets, modelgate_bin: Path) -> None:
    """`backstop --mutating` adds the MutatingAdmissionPolicy and its binding (docs/policy.md,
    "The MAP"), admissionregistration.k8s.io/v1 from Kubernetes 1.36: checked against the newest
    schema only (the older one has no v1 MutatingAdmissionPolicy)."""
    path = binary(modelgate_bin, assets.work, "mutating", "--mutating")
    docs = load(str(path))
    assert [d["kind"] for d in docs] == [*KINDS, "MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding"]
    r = run(assets.tool("kubernetes-validate"), "--strict", "-k", "1.37.0", path)
    assert r.stdout.count("passed for resource") == 4, r.stdout + r.stderr
    policy = one(docs, "MutatingAdmissionPolicy")
    assert policy["spec"]["failurePolicy"] == "Ignore"
    assert policy["spec"]["reinvocationPolicy"] == "IfNeeded"
    assert "paramKind" not in policy["spec"]
    vap = one(docs, "ValidatingAdmissionPolicy")
    assert policy["spec"]["matchConditions"] == vap["spec"]["matchConditions"]


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
    "what the mutating policy reads": [
        "--set",
        "runAsUser=2000,runAsGroup=3000,podSecurityDefault=restricted",
        "--set",
        "prepVolumeTypes={nfs},prepHostPaths={/mnt/models/},prepStorageClasses={local-path}",
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
    """The ValidatingAdmissionPolicy, the MutatingAdmissionPolicy and their bindings: the
    binary's objects for the flags the chart gives `serve`."""
    rendered = assets.render(f"backstop-both-{name}", "--set", "backstop.enabled=true,backstop.mutating=true", *VALUES[name])
    docs = load(str(rendered))
    order = [*KINDS, *MUTATING_KINDS]
    chart = sorted((d for d in docs if d["kind"] in order), key=lambda d: order.index(d["kind"]))
    assert [d["kind"] for d in chart] == order
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
        "--mutating",
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


def test_the_generated_backstop_files_are_the_scripts_output(assets: Assets, modelgate_bin: Path) -> None:
    """scripts/backstop-files.sh writes the three files that are the binary's output (the two
    kustomize components' and the chart's MutatingAdmissionPolicy); the committed ones are what
    it writes now, to the byte."""
    out = assets.work / "backstop-files"
    run(REPO / "scripts" / "backstop-files.sh", modelgate_bin, out)
    for path in (
        "manifests/components/backstop/backstop.yaml",
        "manifests/components/backstop-mutating/backstop-mutating.yaml",
        "charts/modelgate/files/backstop-mutating.yaml",
    ):
        assert (out / path).read_text() == (REPO / path).read_text(), f"{path}: run scripts/backstop-files.sh"


def test_auto_adds_the_mutating_policy_where_the_cluster_serves_it(assets: Assets) -> None:
    """backstop.mutating defaults to auto: with the backstop, on where the API server serves
    MutatingAdmissionPolicy v1 (Kubernetes 1.36+); never without the backstop."""
    vap = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"

    def kinds(name: str, *args: str) -> list[str]:
        return sorted(d["kind"] for d in load(str(assets.render(name, *args))) if d["kind"] in (*KINDS, *MUTATING_KINDS))

    assert kinds("map-auto-both", "--api-versions", vap, "--api-versions", MAP_API) == sorted((*KINDS, *MUTATING_KINDS))
    assert kinds("map-auto-vap-only", "--api-versions", vap) == sorted(KINDS)
    assert kinds("map-off", "--api-versions", vap, "--api-versions", MAP_API, "--set", "backstop.mutating=false") == sorted(KINDS)
    assert kinds("map-without-backstop", "--set", "backstop.enabled=false,backstop.mutating=true") == []


def test_the_charts_mutating_policy_passes_the_schema_strictly(assets: Assets) -> None:
    path = assets.render("map-schema", "--set", "backstop.enabled=true,backstop.mutating=true")
    assert len([d for d in load(str(path)) if d["kind"] in MUTATING_KINDS]) == 2
    assets.validate(path)


def test_the_kustomize_component_is_the_binarys_output_for_the_base_policy(assets: Assets, modelgate_bin: Path) -> None:
    components = assets.manifests / "components"
    overlay = assets.work / "overlay-backstop"
    overlay.mkdir(exist_ok=True)
    rel = os.path.relpath(assets.manifests, overlay)
    (overlay / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources: [{rel}/base]\ncomponents: [{rel}/components/backstop, {rel}/components/backstop-mutating]\n"
    )
    rendered = assets.work / "k-backstop.yaml"
    rendered.write_text(run(assets.tool("kubectl"), "kustomize", overlay).stdout)
    docs = load(str(rendered))
    known = run(modelgate_bin, "backstop", "--help").stdout
    flags = [f"{k}={v}" for k, v in policy_flags(docs).items() if f"{k} " in known]
    printed = load(str(binary(modelgate_bin, assets.work, "base", *flags, "--namespace", NS, "--mutating")))
    assert load(str(components / "backstop" / "backstop.yaml")) == printed[:2]
    assert load(str(components / "backstop-mutating" / "backstop-mutating.yaml")) == printed[2:]
    assert [d["kind"] for d in printed[2:]] == list(MUTATING_KINDS)
    hooks = [
        h for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration") for c in of_kind(docs, kind) for h in c["webhooks"]
    ]
    # The base's Fail: a component cannot register the per-namespace entries the chart does.
    assert {h["failurePolicy"] for h in hooks} == {"Fail"} and len(hooks) == 3
    assets.validate(rendered)
