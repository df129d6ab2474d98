"""The webhooks' matchConditions evaluated as CEL (cel-rust through `common-expression-language`)
on the requests the API server would send: the API server calls modelgate only when every
condition is true, so each request kept out here is admitted even while modelgate is down."""

from __future__ import annotations

import cel
import pytest

from checks import webhook_configurations
from k8s import load
from tools import Assets

OWN_SA = "system:serviceaccount:modelgate-system:modelgate"


def request(kind="Pod", namespace="team-a", user="alice", operation="CREATE", sub=None, meta=None, spec=None):
    if kind == "Pod":
        obj = {"apiVersion": "v1", "kind": "Pod", "metadata": meta or {"generateName": "w-"}, "spec": spec or {"containers": []}}
    else:
        obj = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"},
               "spec": {"template": {"metadata": meta or {}, "spec": spec or {"containers": []}}}}  # fmt: skip
    req = {"kind": {"group": "" if kind == "Pod" else "batch", "version": "v1", "kind": kind}, "namespace": namespace,
           "operation": operation, "userInfo": {"username": user}}  # fmt: skip
    if sub:
        req["subResource"] = sub
    return {"request": req, "object": obj}


CASES = {
    # name: (request, is modelgate called?)
    "a pod of a tenant": (request(), True),
    "a Job of a tenant": (request(kind="Job"), True),
    "an ephemeral container added to a tenant's pod": (request(operation="UPDATE", sub="ephemeralcontainers"), True),
    "a pod with other annotations": (request(meta={"annotations": {"a": "b"}}), True),
    "a mirror pod": (request(meta={"annotations": {"kubernetes.io/config.mirror": "8f1c"}}), False),
    "a Job whose template carries the mirror annotation": (
        request(kind="Job", meta={"annotations": {"kubernetes.io/config.mirror": "x"}}), True),
    "a pod created by modelgate's own service account": (request(user=OWN_SA), False),
    "a pod created by another service account of its namespace": (request(user="system:serviceaccount:modelgate-system:other"), True),
    "a pod in kube-system": (request(namespace="kube-system"), False),
    "a pod in modelgate's namespace": (request(namespace="modelgate-system"), False),
    "a pod of an excluded priority class": (request(spec={"containers": [], "priorityClassName": "system-node-critical"}), False),
    "a pod of another priority class": (request(spec={"containers": [], "priorityClassName": "batch-low"}), True),
    "a Job whose pods have an excluded priority class": (
        request(kind="Job", spec={"containers": [], "priorityClassName": "system-cluster-critical"}), False),
}  # fmt: skip


def called(conditions: list[dict], context: dict) -> bool:
    """The API server's rule: call the webhook only if every condition is true. An evaluation error
    is not a skip (the API server applies failurePolicy), so it fails the test."""
    return all(cel.evaluate(c["expression"], context) is True for c in conditions)


@pytest.fixture(scope="module", params=["helm", "kustomize"])
def webhooks(request, assets: Assets) -> dict[str, list[dict]]:
    if request.param == "helm":
        path = assets.render("mc-cel", "--set", "matchConditions.excludePriorityClasses={system-node-critical,system-cluster-critical}")
    else:
        path = assets.kustomize("default")
    return {p: h["matchConditions"] for p, h in webhook_configurations(load(path)).items()}


@pytest.mark.parametrize("case", sorted(CASES))
def test_who_reaches_modelgate(webhooks, request, case: str) -> None:
    context, want = CASES[case]
    if "priority class" in case and request.node.callspec.params["webhooks"] == "kustomize":
        want = True  # the kustomize base has no priority-class condition
    for path, conditions in webhooks.items():
        assert called(conditions, context) is want, f"{path}: {case}: called should be {want}"


def test_a_broken_expression_fails_to_evaluate() -> None:
    with pytest.raises(ValueError):
        cel.evaluate("request.kind.kind == ", request())
