"""`modelgate audit -o openreports` and `-o policyreport` (docs/policy.md §10) against the CRDs the report
readers install (crds/, pinned from openreports/reports-api and kubernetes-sigs/wg-policy-prototypes):
every report validates strictly (a field the API server would prune is an error), is named as the
API server accepts and once per workload, is scoped to its workload, and counts its results; a
denial is a `fail` with the rule's message, a patch a JSON Patch that applies to the workload."""

from __future__ import annotations

import copy
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

import checks
from k8s import Obj, crd_files, crd_validators, expect, load, structural
from tools import PINNED_CRDS, Assets, run

APIS = {
    "openreports": ("openreports.io/v1alpha1", "Report"),
    "policyreport": ("wgpolicyk8s.io/v1alpha2", "PolicyReport"),
}
RULES = ["cache-prep", "model-cache", "non-root", "root-equivalent", "schema"]
RESULTS = ("pass", "fail", "warn", "error", "skip")
# Pods, Jobs and every kind of the workload-kind table, in each version the table names.
AUDITED = {("v1", "Pod"), ("batch/v1", "Job")} | {
    (f"{r['group']}/{v}" if r["group"] else v, r["kind"]) for r in checks.WORKLOAD_KINDS for v in r["versions"]
}
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LONG_NAME = "a-replicaset-whose-name-is-as-long-as-the-api-server-allows-" + "x" * 193

# One denied, one patched Pod, controllers that are patched through their templates, a Pod that
# names a model, two workloads of one name, and a name as long as Kubernetes allows (the report's
# name must still be one).
WORKLOADS = f"""apiVersion: v1
kind: Pod
metadata: {{name: root, namespace: team-a}}
spec:
  containers: [{{name: app, image: nginx, securityContext: {{runAsUser: 0}}}}]
---
apiVersion: v1
kind: Pod
metadata: {{name: plain, namespace: team-a}}
spec:
  containers: [{{name: app, image: nginx}}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: web, namespace: team-b}}
spec:
  selector: {{matchLabels: {{app: web}}}}
  template:
    metadata: {{labels: {{app: web}}}}
    spec:
      containers: [{{name: app, image: vllm, volumeMounts: [{{name: model-cache, mountPath: /models}}]}}]
      volumes: [{{name: model-cache, persistentVolumeClaim: {{claimName: models}}}}]
---
apiVersion: v1
kind: Pod
metadata: {{name: web, namespace: team-b}}
spec:
  securityContext: {{runAsNonRoot: true, runAsUser: 1000, runAsGroup: 1000}}
  containers: [{{name: a, image: b}}]
---
apiVersion: batch/v1
kind: CronJob
metadata: {{name: nightly, namespace: team-b}}
spec:
  schedule: "@daily"
  jobTemplate:
    spec:
      template:
        spec:
          restartPolicy: Never
          containers: [{{name: fetch, image: curl}}]
---
apiVersion: v1
kind: Pod
metadata:
  name: llm
  namespace: team-b
  annotations: {{modelgate.io/model-uri: "hf://org/llama"}}
spec:
  securityContext: {{runAsNonRoot: true, runAsUser: 1000, runAsGroup: 1000}}
  containers: [{{name: vllm, image: vllm}}]
---
apiVersion: apps/v1
kind: ReplicaSet
metadata: {{name: {LONG_NAME}, namespace: team-c}}
spec:
  selector: {{matchLabels: {{app: x}}}}
  template:
    metadata: {{labels: {{app: x}}}}
    spec:
      securityContext: {{runAsNonRoot: true, runAsUser: 1000, runAsGroup: 1000}}
      containers: [{{name: a, image: b}}]
"""


@pytest.fixture(scope="module")
def validators() -> dict[tuple[str, str], Any]:
    """Strict validators of the pinned report CRDs, whose schemas must be structural."""
    paths = [p for p in crd_files(str(PINNED_CRDS)) if Path(p).name.startswith(("openreports.io_", "wgpolicyk8s.io_"))]
    for p in paths:
        for crd in load(p):
            for v in crd["spec"]["versions"]:
                if (crd["spec"]["group"] + "/" + v["name"], crd["spec"]["names"]["kind"]) in APIS.values():
                    structural(v["schema"]["openAPIV3Schema"])
    out = crd_validators(paths)
    for key in APIS.values():
        expect(key in out, f"no pinned CRD serves {key} in {PINNED_CRDS}")
    return out


def audit(modelgate_bin: Path, out: Path, output: str, *inputs: str | Path) -> tuple[int, str]:
    """`modelgate audit -o OUTPUT INPUTS` into OUT; its exit code (0 or 1: some would be denied)."""
    r = run(modelgate_bin, "audit", "-o", output, *inputs, ok=False, env={"KUBECONFIG": "/nonexistent"})
    expect(r.returncode in (0, 1), f"audit -o {output} exited {r.returncode}:\n{r.stderr}")
    out.write_text(r.stdout)
    return r.returncode, r.stdout


def check_reports(docs: list[Obj], api: str, validators: dict) -> None:
    """What every report of `api` must be, whatever the workloads."""
    api_version, kind = APIS[api]
    workload_of: dict[tuple[str, str], tuple] = {}
    for d in docs:
        meta = d["metadata"]
        what = f"{kind} {meta.get('namespace')}/{meta.get('name')}"
        expect((d["apiVersion"], d["kind"]) == (api_version, kind), f"{what}: {d['apiVersion']} {d['kind']}")
        errors = [f"{'.'.join(map(str, e.path))}: {e.message}" for e in validators[(api_version, kind)].iter_errors(d)]
        expect(not errors, f"{what} does not match its CRD (or has fields it would prune): {errors}")
        name = meta["name"]
        expect(len(name) <= 253 and DNS_SUBDOMAIN.match(name), f"{what}: not a DNS-1123 subdomain")
        expect(name.startswith("modelgate-"), f"{what}: not named modelgate-…")
        expect((meta.get("labels") or {}).get("app.kubernetes.io/managed-by") == "modelgate", f"{what}: no managed-by label")
        scope = d["scope"]
        expect((scope["apiVersion"], scope["kind"]) in AUDITED, f"{what}: scope {scope}")
        expect(scope.get("name") and scope.get("namespace") == meta["namespace"], f"{what}: scope {scope} not in its namespace")
        # One name per workload: a name seen twice is the same workload given twice.
        identity = (scope["apiVersion"], scope["kind"], scope["namespace"], scope["name"], scope.get("uid"))
        seen = workload_of.setdefault((meta["namespace"], name), identity)
        expect(seen == identity, f"{what}: one name for two workloads, {seen} and {identity}")
        if scope.get("uid"):
            owner = {k: scope[k] for k in ("apiVersion", "kind", "name", "uid")}
            refs = [{k: r.get(k) for k in owner} for r in meta.get("ownerReferences") or []]
            expect(refs == [owner], f"{what}: owned by {refs}, not by its workload {owner}")
        else:
            expect(not meta.get("ownerReferences"), f"{what}: an owner without a uid")
        if api == "openreports":
            expect(d.get("source") == "modelgate", f"{what}: source {d.get('source')}")
        results = d["results"]
        expect(sorted(r["rule"] for r in results) == RULES, f"{what}: one result per rule: {[r['rule'] for r in results]}")
        for r in results:
            expect(r["policy"] == "modelgate" and r.get("source") == "modelgate", f"{what}: {r}")
            expect(r.get("severity") and isinstance(r.get("message"), str), f"{what}: {r}")
        counts = Counter(r["result"] for r in results)
        summary = {k: d.get("summary", {}).get(k, 0) for k in RESULTS}
        expect(summary == {k: counts.get(k, 0) for k in RESULTS}, f"{what}: summary {d.get('summary')} counts {dict(counts)}")


def result(report: Obj, rule: str) -> Obj:
    found = [r for r in report["results"] if r["rule"] == rule]
    expect(len(found) == 1, f"{rule} in {report['metadata']['name']}: {found}")
    return found[0]


def apply_patch(doc: Obj, patch: list[Obj]) -> Obj:
    """RFC 6902 add, replace, remove and test, enough for the policy's patches."""
    doc = copy.deepcopy(doc)
    for op in patch:
        *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        target = doc
        for p in parents:
            target = target[int(p)] if isinstance(target, list) else target[p]
        if isinstance(target, list):
            index = len(target) if last == "-" else int(last)
            if op["op"] == "add":
                target.insert(index, op["value"])
            elif op["op"] == "replace":
                target[index] = op["value"]
            elif op["op"] == "remove":
                del target[index]
            else:
                expect(op["op"] == "test" and target[index] == op["value"], f"unsupported or failed op {op}")
        elif op["op"] in ("add", "replace"):
            expect(op["op"] == "add" or last in target, f"replace of a missing member: {op}")
            target[last] = op["value"]
        elif op["op"] == "remove":
            del target[last]
        else:
            expect(op["op"] == "test" and target[last] == op["value"], f"unsupported or failed op {op}")
    return doc


@pytest.mark.parametrize("api", sorted(APIS))
def test_reports_of_crafted_workloads(assets: Assets, modelgate_bin: Path, validators, api: str) -> None:
    inputs = assets.work / "report-workloads.yaml"
    inputs.write_text(WORKLOADS)
    workloads = {(w["kind"], w["metadata"]["name"]): w for w in yaml.safe_load_all(WORKLOADS)}
    out = assets.work / f"reports-{api}.yaml"
    code, text = audit(modelgate_bin, out, api, inputs)
    expect(code == 1, "the root Pod would be denied: exit 1")
    docs = [d for d in yaml.safe_load_all(text) if d]
    check_reports(docs, api, validators)
    assets.validate(out)
    by_scope = {(d["scope"]["kind"], d["scope"]["name"]): d for d in docs}
    expect(sorted(by_scope) == sorted(workloads), f"one report per workload: {sorted(by_scope)}")
    # From files there is no uid: named after kind and name, and owned by nothing.
    web = by_scope[("Deployment", "web")]
    expect(web["metadata"]["name"] == "modelgate-deployment-web", web["metadata"]["name"])
    expect(by_scope[("Pod", "web")]["metadata"]["name"] == "modelgate-pod-web", "kind in the name")
    expect(web["metadata"]["namespace"] == "team-b" and web["scope"]["apiVersion"] == "apps/v1", str(web["scope"]))

    root = result(by_scope[("Pod", "root")], "non-root")
    expect(root["result"] == "fail", str(root))
    expect("spec.containers[0].securityContext.runAsUser: 0 is outside 1..2147483647" in root["message"], root["message"])

    plain = result(by_scope[("Pod", "plain")], "non-root")
    expect(plain["result"] == "warn", str(plain))
    patched = apply_patch(workloads[("Pod", "plain")], json.loads(plain["properties"]["patch"]))
    sc = patched["spec"]["securityContext"]
    expect(sc["runAsNonRoot"] is True and sc["runAsUser"] > 0, f"the patch makes the Pod non-root: {sc}")

    prep = result(web, "cache-prep")
    expect(prep["result"] == "warn", str(prep))
    deployment = apply_patch(workloads[("Deployment", "web")], json.loads(prep["properties"]["patch"]))
    init = deployment["spec"]["template"]["spec"].get("initContainers") or []
    expect([c["name"] for c in init] == ["model-cache-prep"], f"the patch preps the template's cache: {init}")

    cron = result(by_scope[("CronJob", "nightly")], "non-root")
    job = apply_patch(workloads[("CronJob", "nightly")], json.loads(cron["properties"]["patch"]))
    expect(job["spec"]["jobTemplate"]["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True, str(job))

    cache = result(by_scope[("Pod", "llm")], "model-cache")
    expect(cache["properties"].get("modelCacheOutcome") and cache["properties"].get("modelCacheReason"), str(cache))

    ok = by_scope[("Pod", "web")]["summary"]
    expect(ok.get("fail", 0) == 0 and ok.get("warn", 0) == 0, f"a compliant Pod: {ok}")


@pytest.mark.parametrize("api", sorted(APIS))
def test_reports_of_the_corpus(assets: Assets, modelgate_bin: Path, corpus: Path, validators, api: str) -> None:
    """Every workload of the corpus (.inputs/corpus), in one run: one valid report each, and
    the reports' fails and warnings are the denials and patches `audit -o json` counts."""
    files = sorted(p for p in corpus.rglob("*") if p.suffix in (".yaml", ".json") and p.name != "_manifest.json")
    _, summary = audit(modelgate_bin, assets.work / "corpus-audit.json", "json", *files)
    counts = json.loads(summary)
    expect(counts["objects"] >= 100, f"the corpus's workloads: {counts['objects']}")
    out = assets.work / f"corpus-{api}.yaml"
    _, text = audit(modelgate_bin, out, api, *files)
    docs = [d for d in yaml.safe_load_all(text) if d]
    expect(len(docs) == counts["objects"], f"{len(docs)} reports for {counts['objects']} workloads")
    check_reports(docs, api, validators)
    assets.validate(out)

    def has(d: Obj, *results: str) -> bool:
        return any(r["result"] in results for r in d["results"])

    def patches(d: Obj) -> bool:
        # A partial template's finding (docs/policy.md §12) is a warn that patches nothing.
        return any(r["result"] == "warn" and "patch" in (r.get("properties") or {}) for r in d["results"])

    denied = sum(1 for d in docs if has(d, "fail", "error"))
    patched = sum(1 for d in docs if not has(d, "fail", "error") and patches(d))
    expect((denied, patched) == (counts["denied"], counts["patched"]), f"{(denied, patched)} against audit -o json {counts}")
    expect(denied > 0 and patched > 0, f"the corpus has denials and patches to compare: {(denied, patched)}")
    # A fail says what the denial says, in the same words (the corpus has workloads of one name
    # in several files: any of theirs).
    denials: dict[tuple[str, str, str], list[str]] = {}
    for x in counts["denials"]:
        denials.setdefault((x["kind"], x["namespace"], x["name"]), []).append(x["message"])
    for d in docs:
        s = d["scope"]
        for r in d["results"]:
            if r["result"] == "fail":
                theirs = denials.get((s["kind"], s["namespace"], s["name"]), [])
                expect(r["message"] and any(r["message"] in m for m in theirs), f"{r['message']!r} is not in the denials {theirs}")
