"""The webhooks' matchConditions evaluated as CEL (cel-rust through `common-expression-language`)
on the requests the API server would send: the API server calls modelgate only when every
condition is true, so each request kept out here is admitted even while modelgate is down.
The Pod and Job cases run against mutate.modelgate.io and validate.modelgate.io; the workload
controllers' (docs/policy.md §11) and the ML custom resources' (§12, the objects of
tests/fixtures/ml-kinds) against validate-controllers.modelgate.io, rendered from the workload-kind
table."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable

import cel
import pytest
import yaml

from checks import CONTROLLERS, WORKLOAD_KINDS, webhook_configurations
from k8s import deployment_container, load, of_kind
from tools import REPO, Assets

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


def anonymous(context: dict) -> dict:
    """The request without a username: the API server leaves an empty omitempty field out."""
    context = copy.deepcopy(context)
    del context["request"]["userInfo"]["username"]
    return context


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
    "a pod of a request without a username": (anonymous(request()), True),
    "a pod in kube-system": (request(namespace="kube-system"), False),
    "a pod in modelgate's namespace": (request(namespace="modelgate-system"), False),
    "a pod of an excluded priority class": (request(spec={"containers": [], "priorityClassName": "system-node-critical"}), False),
    "a pod of another priority class": (request(spec={"containers": [], "priorityClassName": "batch-low"}), True),
    "a Job whose pods have an excluded priority class": (
        request(kind="Job", spec={"containers": [], "priorityClassName": "system-cluster-critical"}), False),
}  # fmt: skip


POD_HOOKS = ("mutate.modelgate.io", "validate.modelgate.io")
CONTROLLERS_HOOK = "validate-controllers.modelgate.io"


# `a.b.?f.orValue('d')`: optional access to a field the API server may leave out of the request
# (it binds the AdmissionRequest with its omitempty fields absent). The pinned cel-rust bindings
# parse no optional syntax, so it is evaluated as what it means on a map, `has(a.b.f) ? a.b.f : 'd'`.
OPTIONAL_FIELD = re.compile(r"\b([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)\.\?([A-Za-z_]\w*)\.orValue\(('(?:[^'\\]|\\.)*')\)")


def evaluate(expression: str, context: dict):
    """cel.evaluate, with optional field access (OPTIONAL_FIELD) as its has() equivalent."""
    plain = OPTIONAL_FIELD.sub(lambda m: f"(has({m[1]}.{m[2]}) ? {m[1]}.{m[2]} : {m[3]})", expression)
    assert ".?" not in plain, f"optional syntax this test cannot evaluate: {expression}"
    return cel.evaluate(plain, context)


def called(conditions: list[dict], context: dict) -> bool:
    """The API server's rule: call the webhook only if every condition is true. An evaluation error
    is not a skip (the API server applies failurePolicy), so it fails the test; every condition is
    evaluated, so an error hidden behind another condition's false fails it too."""
    results = [evaluate(c["expression"], context) for c in conditions]
    assert all(isinstance(r, bool) for r in results), f"a condition is not a bool: {results}"
    return all(results)


@pytest.fixture(scope="module", params=["helm", "kustomize"])
def webhooks(request, assets: Assets) -> dict[str, list[dict]]:
    if request.param == "helm":
        path = assets.render("mc-cel", "--set", "matchConditions.excludePriorityClasses={system-node-critical,system-cluster-critical}")
    else:
        path = assets.kustomize("default")
    return {n: h["matchConditions"] for n, h in webhook_configurations(load(path)).items()}


@pytest.mark.parametrize("case", sorted(CASES))
def test_who_reaches_modelgate(webhooks, request, case: str) -> None:
    context, want = CASES[case]
    if "priority class" in case and request.node.callspec.params["webhooks"] == "kustomize":
        want = True  # the kustomize base has no priority-class condition
    for name in POD_HOOKS:
        assert called(webhooks[name], context) is want, f"{name}: {case}: called should be {want}"


# --- workload controllers (docs/policy.md §11) -----------------------------------------------------------
CONTAINER = {"name": "server", "image": "vllm/vllm-openai:v0.6.4", "args": ["--model", "/mnt/models"],
             "resources": {"limits": {"nvidia.com/gpu": 1}}, "securityContext": {"allowPrivilegeEscalation": False}}  # fmt: skip


def pod_template(priority: str | None = None) -> dict:
    spec = {"containers": [copy.deepcopy(CONTAINER)], "restartPolicy": "Always", "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst", "securityContext": {}, "schedulerName": "default-scheduler"}  # fmt: skip
    if priority:
        spec["priorityClassName"] = priority
    return {"metadata": {"labels": {"app": "llm"}, "annotations": {"prometheus.io/scrape": "true"}}, "spec": spec}


def controller(kind: str, priority: str | None = None) -> dict:
    """A controller as the API server hands it to a validating webhook: defaulted, with status."""
    group = CONTROLLERS[kind][0]
    meta = {"name": "llm", "namespace": "team-a", "uid": "7c9e", "resourceVersion": "4711", "generation": 1,
            "labels": {"app": "llm"}, "annotations": {"team": "ml"}}  # fmt: skip
    selector = {"matchLabels": {"app": "llm"}}
    if kind == "CronJob":
        template = pod_template(priority)
        template["spec"]["restartPolicy"] = "OnFailure"
        spec = {"schedule": "0 * * * *", "concurrencyPolicy": "Forbid", "suspend": False,
                "jobTemplate": {"metadata": {}, "spec": {"backoffLimit": 6, "template": template}}}  # fmt: skip
        status = {"lastScheduleTime": "2026-01-01T00:00:00Z"}
    elif kind == "ReplicationController":
        spec = {"replicas": 2, "selector": {"app": "llm"}, "template": pod_template(priority)}
        status = {"replicas": 2, "readyReplicas": 2}
    else:
        spec = {"selector": selector, "template": pod_template(priority)}
        if kind != "DaemonSet":
            spec["replicas"] = 2
        if kind == "StatefulSet":
            spec["serviceName"] = "llm"
        status = {"observedGeneration": 1, "replicas": 2}
        if kind == "DaemonSet":
            status = {"observedGeneration": 1, "currentNumberScheduled": 3, "desiredNumberScheduled": 3,
                      "numberMisscheduled": 0, "numberReady": 3}  # fmt: skip
    return {"apiVersion": f"{group}/v1" if group else "v1", "kind": kind, "metadata": meta, "spec": spec, "status": status}


def controller_request(kind: str, operation: str = "CREATE", change: Callable[[dict], None] | None = None,
                       namespace: str = "team-a", user: str = "alice", priority: str | None = None) -> dict:  # fmt: skip
    """An AdmissionRequest's CEL variables for a controller: on CREATE oldObject is null; on
    UPDATE object is oldObject with `change` applied."""
    obj = controller(kind, priority)
    old = None
    if operation == "UPDATE":
        old = copy.deepcopy(obj)
        change(obj)
    group = CONTROLLERS[kind][0]
    req = {"kind": {"group": group, "version": "v1", "kind": kind}, "resource": {"group": group, "version": "v1",
           "resource": CONTROLLERS[kind][1]}, "namespace": namespace, "operation": operation,
           "userInfo": {"username": user}}  # fmt: skip
    return {"request": req, "object": obj, "oldObject": old}


def template_of(obj: dict) -> dict:
    node = obj
    for key in CONTROLLERS[obj["kind"]][2]:
        node = node[key]
    return node


def in_template(f: Callable[[dict], None]) -> Callable[[dict], None]:
    return lambda obj: f(template_of(obj))


def set_in(*path_and_value) -> Callable[[dict], None]:
    *path, value = path_and_value

    def apply(node: dict) -> None:
        for key in path[:-1]:
            node = node[key] if isinstance(node, list) else node.setdefault(key, {})
        node[path[-1]] = value

    return apply


def all_of(*fs: Callable[[dict], None]) -> Callable[[dict], None]:
    def apply(obj: dict) -> None:
        for f in fs:
            f(obj)

    return apply


# Every UPDATE also moves what the API server moves on any write of the object.
BOOKKEEPING = all_of(set_in("metadata", "resourceVersion", "4712"),
                     set_in("metadata", "managedFields", [{"manager": "kubectl", "operation": "Update"}]))  # fmt: skip

TEMPLATE_CHANGES = {
    # name: change of the pod template (the API server calls modelgate)
    "a new image": in_template(set_in("spec", "containers", 0, "image", "vllm/vllm-openai:v0.7.0")),
    "runAsUser 0 in a container": in_template(set_in("spec", "containers", 0, "securityContext", "runAsUser", 0)),
    "a pod securityContext": in_template(set_in("spec", "securityContext", "runAsNonRoot", True)),
    "kubectl rollout restart (a template annotation)": in_template(
        set_in("metadata", "annotations", "kubectl.kubernetes.io/restartedAt", "2026-01-02T03:04:05Z")),
    "a template label": in_template(set_in("metadata", "labels", "version", "v2")),
    "a model cache volume": in_template(set_in("spec", "volumes", [{"name": "model-cache", "emptyDir": {}}])),
    "a container removed": in_template(set_in("spec", "containers", [])),
}  # fmt: skip

OTHER_CHANGES = {
    # name: (kinds it applies to, a change outside the pod template: the API server skips modelgate)
    "scaling spec.replicas": (("Deployment", "StatefulSet", "ReplicaSet", "ReplicationController"), set_in("spec", "replicas", 5)),
    "the controller's own label": (tuple(CONTROLLERS), set_in("metadata", "labels", "team", "b")),
    "the controller's own annotation (deployment revision)": (
        tuple(CONTROLLERS), set_in("metadata", "annotations", "deployment.kubernetes.io/revision", "2")),
    "a finalizer and an ownerReference (garbage collector)": (tuple(CONTROLLERS), all_of(
        set_in("metadata", "finalizers", ["foregroundDeletion"]),
        set_in("metadata", "ownerReferences", [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "llm", "uid": "1"}]))),
    "status only": (tuple(CONTROLLERS), set_in("status", "observedGeneration", 2)),
    "nothing but the bookkeeping (a no-op apply)": (tuple(CONTROLLERS), lambda obj: None),
    "a Deployment's strategy and paused": (("Deployment",), all_of(
        set_in("spec", "strategy", {"type": "Recreate"}), set_in("spec", "paused", True))),
    "a StatefulSet's update strategy": (("StatefulSet",), set_in("spec", "updateStrategy", {"type": "OnDelete"})),
    "a DaemonSet's minReadySeconds": (("DaemonSet",), set_in("spec", "minReadySeconds", 10)),
    "a CronJob's schedule": (("CronJob",), set_in("spec", "schedule", "*/5 * * * *")),
    "a CronJob suspended": (("CronJob",), set_in("spec", "suspend", True)),
    "a CronJob's job settings (backoffLimit, jobTemplate labels)": (("CronJob",), all_of(
        set_in("spec", "jobTemplate", "spec", "backoffLimit", 2),
        set_in("spec", "jobTemplate", "metadata", "labels", {"team": "b"}))),
}  # fmt: skip

KINDS = sorted(CONTROLLERS)
PRIORITY_CLASS_CASES = {
    # name: (priority class of the template, called with the chart's excludePriorityClasses?)
    "an excluded priority class": ("system-cluster-critical", False),
    "another priority class": ("batch-low", True),
}


def test_the_sample_controllers_are_valid_objects(assets: Assets) -> None:
    """The samples below are what the API server would hand over: kubernetes-validate, strict."""
    path = assets.work / "controller-samples.yaml"
    path.write_text(yaml.safe_dump_all([controller(k, "batch-low") for k in KINDS]))
    assert assets.validate(path) == len(KINDS)


@pytest.mark.parametrize("kind", KINDS)
def test_controller_create_reaches_modelgate(webhooks, kind: str) -> None:
    assert called(webhooks[CONTROLLERS_HOOK], controller_request(kind)) is True, f"CREATE of a {kind} is not sent"


@pytest.mark.parametrize("change", sorted(TEMPLATE_CHANGES))
@pytest.mark.parametrize("kind", KINDS)
def test_controller_update_of_the_template_reaches_modelgate(webhooks, kind: str, change: str) -> None:
    ctx = controller_request(kind, "UPDATE", all_of(BOOKKEEPING, TEMPLATE_CHANGES[change]))
    assert template_of(ctx["object"]) != template_of(ctx["oldObject"]), "the sample change did not change the template"
    assert called(webhooks[CONTROLLERS_HOOK], ctx) is True, f"{kind} UPDATE with {change}: not sent"


@pytest.mark.parametrize(("kind", "change"), [(k, c) for c in sorted(OTHER_CHANGES) for k in sorted(OTHER_CHANGES[c][0])], ids=lambda v: v)
def test_controller_update_leaving_the_template_is_kept_out(webhooks, kind: str, change: str) -> None:
    f = OTHER_CHANGES[change][1]
    ctx = controller_request(kind, "UPDATE", all_of(BOOKKEEPING, f))
    assert ctx["object"] != ctx["oldObject"], "the sample change changed nothing"
    assert template_of(ctx["object"]) == template_of(ctx["oldObject"]), "the sample change touched the template"
    assert called(webhooks[CONTROLLERS_HOOK], ctx) is False, f"{kind} UPDATE with {change}: sent to modelgate"


@pytest.mark.parametrize("kind", KINDS)
def test_controllers_of_exempt_namespaces_and_own_account_are_kept_out(webhooks, kind: str) -> None:
    hook = webhooks[CONTROLLERS_HOOK]
    for ctx, who in (
        (controller_request(kind, namespace="kube-system"), "in kube-system"),
        (controller_request(kind, namespace="modelgate-system"), "in modelgate's namespace"),
        (controller_request(kind, user=OWN_SA), "by modelgate's own service account"),
        (controller_request(kind, "UPDATE", in_template(set_in("spec", "containers", 0, "image", "x")),
                            namespace="kube-system"), "changed in kube-system"),
    ):  # fmt: skip
        assert called(hook, ctx) is False, f"a {kind} {who} is sent to modelgate"


@pytest.mark.parametrize("case", sorted(PRIORITY_CLASS_CASES))
@pytest.mark.parametrize("kind", KINDS)
def test_controllers_of_an_excluded_priority_class(webhooks, request, kind: str, case: str) -> None:
    """Their pods never reach the Pod webhook: their templates must not be judged either."""
    priority, want = PRIORITY_CLASS_CASES[case]
    if request.node.callspec.params["webhooks"] == "kustomize":
        want = True  # the kustomize base has no priority-class condition
    hook = webhooks[CONTROLLERS_HOOK]
    assert called(hook, controller_request(kind, priority=priority)) is want, f"CREATE of a {kind}: {case}"
    ctx = controller_request(kind, "UPDATE", in_template(set_in("spec", "containers", 0, "image", "x")), priority=priority)
    assert called(hook, ctx) is want, f"UPDATE of a {kind}: {case}"


def test_a_broken_expression_fails_to_evaluate() -> None:
    with pytest.raises(ValueError):
        cel.evaluate("request.kind.kind == ", request())


# --- docs/policy.md §12: the ML workload custom resources of the workload-kind table -------------------------
# The objects of tests/fixtures/ml-kinds (every default kind), sent as the API server sends them,
# against the entry rendered from the table: CREATE is sent; an UPDATE is sent exactly when one of
# the kind's templates changed (a worker group's replicas, a label of the resource, status: kept out).
ML_FIXTURES = sorted((REPO / "tests/fixtures/ml-kinds").glob("*.yaml"))
ROWS = {(r.get("group") or "", r["kind"]): r for r in WORKLOAD_KINDS}


def ml_objects() -> list[dict]:
    return [d for f in ML_FIXTURES for d in yaml.safe_load_all(f.read_text()) if d]


def templates_at(node, steps: list[str]) -> list:
    """What a table path finds in an object: `a.b[*].c`, `a.*.c` (the server's rule)."""
    if not steps:
        return [node] if node is not None else []
    step, rest = steps[0], steps[1:]
    if step == "*":
        return [t for v in (node.values() if isinstance(node, dict) else []) for t in templates_at(v, rest)]
    key, every = (step[:-3], True) if step.endswith("[*]") else (step, False)
    child = node.get(key) if isinstance(node, dict) else None
    if every:
        return [t for e in (child if isinstance(child, list) else []) for t in templates_at(e, rest)]
    return templates_at(child, rest)


def ml_templates(obj: dict) -> list[dict]:
    row = ROWS[(obj["apiVersion"].rsplit("/", 1)[0] if "/" in obj["apiVersion"] else "", obj["kind"])]
    return [t for p in row["templates"] for t in templates_at(obj, p["path"].split("."))]


def ml_request(obj: dict, operation: str = "CREATE", change: Callable[[dict], None] | None = None) -> dict:
    """The request as the API server binds it: a cluster-scoped kind's (ClusterTrainingRuntime) has
    no namespace at all (an omitempty field, absent)."""
    obj = copy.deepcopy(obj)
    group, version = obj["apiVersion"].rsplit("/", 1)
    row = ROWS[(group, obj["kind"])]
    namespaced = row.get("scope", "Namespaced") == "Namespaced"
    if namespaced:
        obj["metadata"].setdefault("namespace", "team-a")
    old = None
    if operation == "UPDATE":
        old = copy.deepcopy(obj)
        change(obj)
    req = {"kind": {"group": group, "version": version, "kind": obj["kind"]},
           "resource": {"group": group, "version": version, "resource": row["plural"]},
           "operation": operation, "userInfo": {"username": "alice"}}  # fmt: skip
    if namespaced:
        req["namespace"] = obj["metadata"]["namespace"]
    return {"request": req, "object": obj, "oldObject": old}


def change_last_template(obj: dict) -> None:
    """A change in the last template the object has (a worker group, a replica type, a predictor):
    a service account, which a PodTemplateSpec's spec and a bare pod spec both have."""
    template = ml_templates(obj)[-1]
    spec = template.get("spec", template)
    spec["serviceAccountName"] = "other"


def ml_ids(objs: list[dict]) -> list[str]:
    return [f"{o['kind']}-{o['metadata']['name']}" for o in objs]


ML_OBJECTS = ml_objects()


def test_every_row_of_the_table_is_registered_and_has_a_fixture(webhooks) -> None:
    kinds = {(r.get("group") or "", r["kind"]) for r in WORKLOAD_KINDS}
    fixtures = {(o["apiVersion"].rsplit("/", 1)[0] if "/" in o["apiVersion"] else "", o["kind"]) for o in ML_OBJECTS}
    assert {k for k in kinds if k[0] not in ("", "apps", "batch")} <= fixtures


@pytest.mark.parametrize("obj", ML_OBJECTS, ids=ml_ids(ML_OBJECTS))
def test_ml_create_reaches_modelgate(webhooks, obj: dict) -> None:
    assert called(webhooks[CONTROLLERS_HOOK], ml_request(obj)) is True


@pytest.mark.parametrize("obj", ML_OBJECTS, ids=ml_ids(ML_OBJECTS))
def test_ml_update_of_a_template_reaches_modelgate(webhooks, obj: dict) -> None:
    ctx = ml_request(obj, "UPDATE", all_of(BOOKKEEPING, change_last_template))
    assert ml_templates(ctx["object"]) != ml_templates(ctx["oldObject"])
    assert called(webhooks[CONTROLLERS_HOOK], ctx) is True


@pytest.mark.parametrize("obj", ML_OBJECTS, ids=ml_ids(ML_OBJECTS))
def test_ml_update_leaving_the_templates_is_kept_out(webhooks, obj: dict) -> None:
    hook = webhooks[CONTROLLERS_HOOK]
    for change in (set_in("metadata", "labels", "team", "b"), set_in("status", "phase", "Running"), lambda o: None):
        ctx = ml_request(obj, "UPDATE", all_of(BOOKKEEPING, change))
        assert called(hook, ctx) is False, f"{obj['kind']} {obj['metadata']['name']}: sent"


SCALE_CHANGES = {
    # kind: a change of replicas next to (not in) a template
    "RayCluster": set_in("spec", "workerGroupSpecs", 0, "replicas", 4),
    "PyTorchJob": set_in("spec", "pytorchReplicaSpecs", "Worker", "replicas", 8),
    "JobSet": set_in("spec", "replicatedJobs", 0, "replicas", 3),
    "Job": set_in("spec", "tasks", 0, "replicas", 9),
    "LeaderWorkerSet": set_in("spec", "replicas", 5),
}


@pytest.mark.parametrize("kind", sorted(SCALE_CHANGES))
def test_scaling_a_group_of_an_ml_kind_is_kept_out(webhooks, kind: str) -> None:
    """A RayCluster autoscaler or an elastic job changes replicas all the time: never sent."""
    obj = next(o for o in ML_OBJECTS if o["kind"] == kind)
    ctx = ml_request(obj, "UPDATE", all_of(BOOKKEEPING, SCALE_CHANGES[kind]))
    assert ctx["object"] != ctx["oldObject"]
    assert called(webhooks[CONTROLLERS_HOOK], ctx) is False


def test_ml_templates_added_or_removed_reach_modelgate(webhooks) -> None:
    hook = webhooks[CONTROLLERS_HOOK]
    ray = next(o for o in ML_OBJECTS if o["kind"] == "RayCluster")
    group = copy.deepcopy(ray["spec"]["workerGroupSpecs"][0]) | {"groupName": "new"}
    assert called(hook, ml_request(ray, "UPDATE", lambda o: o["spec"]["workerGroupSpecs"].append(group))) is True
    assert called(hook, ml_request(ray, "UPDATE", lambda o: o["spec"]["workerGroupSpecs"].pop())) is True
    torch = next(o for o in ML_OBJECTS if o["kind"] == "PyTorchJob")
    assert called(hook, ml_request(torch, "UPDATE", lambda o: o["spec"]["pytorchReplicaSpecs"].pop("Worker"))) is True
    lws = next(o for o in ML_OBJECTS if o["kind"] == "LeaderWorkerSet" and "leaderTemplate" not in o["spec"]["leaderWorkerTemplate"])
    leader = {"spec": {"containers": [{"name": "leader", "image": "x"}]}}
    assert called(hook, ml_request(lws, "UPDATE", set_in("spec", "leaderWorkerTemplate", "leaderTemplate", leader))) is True


CLONESET = {
    "group": "apps.kruise.io", "versions": ["v1alpha1"], "kind": "CloneSet", "plural": "clonesets",
    "templates": [{"path": "spec.template"}],
}  # fmt: skip


def test_an_extra_kind_is_registered_and_its_unchanged_template_kept_out(assets: Assets) -> None:
    values = assets.values_file("cloneset", yaml.safe_dump({"workloadKinds": {"extra": [CLONESET]}}))
    docs = load(assets.render("extra-kinds", "-f", str(values)))
    hook = webhook_configurations(docs)[CONTROLLERS_HOOK]
    rules = [(r["apiGroups"], r["apiVersions"], r["resources"], r["operations"]) for r in hook["rules"]]
    assert (["apps.kruise.io"], ["v1alpha1"], ["clonesets"], ["CREATE", "UPDATE"]) in rules
    clone = {"apiVersion": "apps.kruise.io/v1alpha1", "kind": "CloneSet", "metadata": {"name": "web", "namespace": "team-a"},
             "spec": {"replicas": 2, "template": pod_template()}}  # fmt: skip

    def req(operation: str, change=None) -> dict:
        obj = copy.deepcopy(clone)
        old = None
        if operation == "UPDATE":
            old = copy.deepcopy(obj)
            change(obj)
        kind = {"group": "apps.kruise.io", "version": "v1alpha1", "kind": "CloneSet"}
        return {"request": {"kind": kind, "namespace": "team-a", "operation": operation, "userInfo": {"username": "alice"}},
                "object": obj, "oldObject": old}  # fmt: skip

    conditions = hook["matchConditions"]
    assert called(conditions, req("CREATE")) is True
    assert called(conditions, req("UPDATE", set_in("spec", "replicas", 5))) is False
    assert called(conditions, req("UPDATE", set_in("spec", "template", "spec", "containers", 0, "image", "x"))) is True
    # The server gets the same entry.
    cm = next(d for d in of_kind(docs, "ConfigMap") if d["metadata"]["name"].endswith("-workload-kinds"))
    assert yaml.safe_load(cm["data"]["workload-kinds.yaml"]) == [CLONESET]
    _, c = deployment_container(docs)
    assert any(a.startswith("--workload-kinds=") for a in c["args"])
