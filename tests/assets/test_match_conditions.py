"""The webhooks' matchConditions evaluated by kube-apiserver's own CEL (kube_cel.py: the offline
kube-cel binaries of kube-apiserver 1.30, 1.31, 1.32 and 1.36, each test once per version) on the
requests the API server would send, bound as it binds them: the API server calls modelgate only
when every condition is true, so each request kept out here is admitted even while modelgate is
down. The Pod and Job cases run against mutate.modelgate.io and validate.modelgate.io; the workload
controllers' (docs/policy.md §11) and the ML custom resources' (§12, the objects of
tests/fixtures/ml-kinds) against validate-controllers.modelgate.io, rendered from the workload-kind
table. Every case of a webhook is decided in one run of each version's binary (the `decided`
fixture); the tests read the verdicts."""

from __future__ import annotations

import copy
import functools
import time
from collections.abc import Callable

import pytest
import yaml

from checks import CONTROLLERS, WEBHOOKS, WORKLOAD_KINDS, webhook_configurations
from k8s import deployment_container, load, of_kind
from kube_cel import VERSIONS, Job, KubeCelError, Result, admission_request, check_webhook_environment, webhook_called
from tools import REPO, Assets

OWN_SA = "system:serviceaccount:modelgate-system:modelgate"
KUBE_VERSIONS = [v.label for v in VERSIONS]


def user_groups(user: str) -> list[str]:
    """The groups the API server's authenticators add: a service account's, and everyone's."""
    if user.startswith("system:serviceaccount:"):
        ns = user.split(":")[2]
        return ["system:serviceaccounts", f"system:serviceaccounts:{ns}", "system:authenticated"]
    return ["system:authenticated"]


def pod_spec(**fields) -> dict:
    return {"containers": [{"name": "server", "image": "vllm/vllm-openai:v0.6.4"}]} | fields


def request(kind="Pod", namespace="team-a", user="alice", operation="CREATE", sub=None, meta=None, spec=None):
    """A tenant's Pod or Job as the validating webhooks get it. A Pod is created with generateName:
    its name is generated before validating admission (and is absent at mutating admission:
    at_mutation). An UPDATE of the ephemeralcontainers subresource has the stored pod as oldObject
    and `subResource` set; the main resource has no `subResource` at all."""
    spec = spec or pod_spec()
    if kind == "Pod":
        name = "w-7x2kq"
        obj = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"generateName": "w-", "name": name, "namespace": namespace} | (meta or {}), "spec": spec}  # fmt: skip
        group, resource = "", "pods"
    elif kind == "ModelgateException":
        name = "vendor-root"
        obj = {"apiVersion": "modelgate.io/v1alpha1", "kind": kind, "metadata": {"name": name, "namespace": namespace},
               "spec": {"reason": "vendor image until its next release", "expires": "2030-01-01T00:00:00Z",
                        "rules": ["non-root"], "selector": {"matchLabels": {"app": "vendor"}}}}  # fmt: skip
        group, resource = "modelgate.io", "modelgateexceptions"
    else:
        name = "j"
        obj = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": namespace},
               "spec": {"template": {"metadata": meta or {}, "spec": spec}}}  # fmt: skip
        group, resource = "batch", "jobs"
    old = None
    if operation == "UPDATE":
        old = copy.deepcopy(obj)
        if sub == "ephemeralcontainers":
            obj["spec"]["ephemeralContainers"] = [{"name": "debugger", "image": "busybox:1.36", "targetContainerName": "server"}]
    req = admission_request(group, "v1", kind, resource, operation, namespace=namespace, name=name, sub_resource=sub,
                            username=user, groups=user_groups(user))  # fmt: skip
    return {"request": req, "object": obj, "oldObject": old}


def anonymous(context: dict) -> dict:
    """The request without a username: the API server leaves an empty omitempty field out."""
    context = copy.deepcopy(context)
    del context["request"]["userInfo"]["username"]
    return context


def at_mutation(context: dict) -> dict:
    """The request as a mutating webhook gets it: on a CREATE with generateName the name is
    generated after mutating admission, so `request.name` and `metadata.name` are still absent."""
    meta = (context["object"] or {}).get("metadata", {})
    if context["request"]["operation"] != "CREATE" or "generateName" not in meta:
        return context
    context = copy.deepcopy(context)
    context["request"].pop("name", None)
    context["object"]["metadata"].pop("name", None)
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
    "a pod of an excluded priority class": (request(spec=pod_spec(priorityClassName="system-node-critical")), False),
    "a pod of another priority class": (request(spec=pod_spec(priorityClassName="batch-low")), True),
    "a Job whose pods have an excluded priority class": (
        request(kind="Job", spec=pod_spec(priorityClassName="system-cluster-critical")), False),
    # The validating entry also judges exceptions objects: no condition may fail on a kind with no
    # pod spec (an error would refuse every exception under failurePolicy Fail).
    "a ModelgateException of a tenant": (request(kind="ModelgateException"), True),
}  # fmt: skip


POD_HOOKS = ("mutate.modelgate.io", "validate.modelgate.io")
CONTROLLERS_HOOK = "validate-controllers.modelgate.io"


def stage(hook: str, context: dict) -> dict:
    """The context as `hook` gets it: a mutating webhook's before the name is generated."""
    return at_mutation(context) if WEBHOOKS[hook][0] == "MutatingWebhookConfiguration" else context


@pytest.fixture(scope="module", params=["helm", "kustomize"])
def webhooks(request, assets: Assets) -> dict[str, list[dict]]:
    if request.param == "helm":
        path = assets.render("mc-cel", "--set", "matchConditions.excludePriorityClasses={system-node-critical,system-cluster-critical}")
    else:
        path = assets.kustomize("default")
    return {n: h["matchConditions"] for n, h in webhook_configurations(load(path)).items()}


@pytest.fixture(scope="module")
def decided(webhooks) -> dict[str, Result]:
    """Every case of every webhook, decided by each version's binary: one run per webhook and
    version (and one of the per-condition policy), whatever the number of cases."""
    cases = {hook: {key: stage(hook, ctx) for key, ctx in pod_cases().items()} for hook in POD_HOOKS}
    cases[CONTROLLERS_HOOK] = controller_cases() | ml_cases()
    start = time.monotonic()
    results = webhook_called([Job(hook, webhooks[hook], c) for hook, c in cases.items()])
    print(f"kube-cel: {sum(map(len, cases.values()))} cases x {len(VERSIONS)} versions in {time.monotonic() - start:.1f}s")
    return results


def verdict_of(results: dict[str, Result], version: str, hook: str, key: str) -> bool:
    """Whether kube-apiserver `version` calls `hook` on the case `key`: an evaluation error (a skip
    only under failurePolicy Ignore) fails the test, as does one behind another condition's false."""
    v = results[hook].verdicts[(version, key)]
    assert v.error is None, f"{hook}, kube-apiserver {version}, {key}: {v.error}"
    return v.called


@pytest.fixture(params=KUBE_VERSIONS)
def reaches(request, decided) -> Callable[[str, str], bool]:
    """reaches(hook, case key): whether this version's kube-apiserver calls the webhook."""
    return lambda hook, key: verdict_of(decided, request.param, hook, key)


def pod_cases() -> dict[str, dict]:
    return {f"pod: {name}": ctx for name, (ctx, _) in CASES.items()}


@pytest.mark.parametrize("case", sorted(CASES))
def test_who_reaches_modelgate(webhooks, reaches, request, case: str) -> None:
    _, want = CASES[case]
    if "excluded priority class" in case and request.node.callspec.params["webhooks"] == "kustomize":
        want = True  # the kustomize base has no priority-class condition
    for name in POD_HOOKS:
        assert reaches(name, f"pod: {case}") is want, f"{name}: {case}: called should be {want}"


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
    obj["metadata"]["namespace"] = namespace
    old = None
    if operation == "UPDATE":
        old = copy.deepcopy(obj)
        change(obj)
    group, resource, _ = CONTROLLERS[kind]
    req = admission_request(group, "v1", kind, resource, operation, namespace=namespace, name=obj["metadata"]["name"],
                            username=user, groups=user_groups(user))  # fmt: skip
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


CHANGED_IMAGE = in_template(set_in("spec", "containers", 0, "image", "x"))


def exempt_cases(kind: str) -> dict[str, dict]:
    return {
        "in kube-system": controller_request(kind, namespace="kube-system"),
        "in modelgate's namespace": controller_request(kind, namespace="modelgate-system"),
        "by modelgate's own service account": controller_request(kind, user=OWN_SA),
        "changed in kube-system": controller_request(kind, "UPDATE", CHANGED_IMAGE, namespace="kube-system"),
    }


def priority_cases(kind: str, case: str) -> dict[str, dict]:
    priority, _ = PRIORITY_CLASS_CASES[case]
    return {
        f"CREATE, {case}": controller_request(kind, priority=priority),
        f"UPDATE, {case}": controller_request(kind, "UPDATE", CHANGED_IMAGE, priority=priority),
    }


@functools.cache
def controller_cases() -> dict[str, dict]:
    """Every controller case of the tests below, by key (`KIND: what`). Read only."""
    out = {}
    for kind in KINDS:
        out[f"{kind}: CREATE"] = controller_request(kind)
        for change, f in TEMPLATE_CHANGES.items():
            out[f"{kind}: UPDATE of the template: {change}"] = controller_request(kind, "UPDATE", all_of(BOOKKEEPING, f))
        out |= {f"{kind}: {who}": ctx for who, ctx in exempt_cases(kind).items()}
        for case in PRIORITY_CLASS_CASES:
            out |= {f"{kind}: {what}": ctx for what, ctx in priority_cases(kind, case).items()}
    for change, (kinds, f) in OTHER_CHANGES.items():
        for kind in kinds:
            out[f"{kind}: UPDATE outside the template: {change}"] = controller_request(kind, "UPDATE", all_of(BOOKKEEPING, f))
    return out


@pytest.mark.parametrize("kind", KINDS)
def test_controller_create_reaches_modelgate(reaches, kind: str) -> None:
    assert reaches(CONTROLLERS_HOOK, f"{kind}: CREATE") is True, f"CREATE of a {kind} is not sent"


@pytest.mark.parametrize("change", sorted(TEMPLATE_CHANGES))
@pytest.mark.parametrize("kind", KINDS)
def test_controller_update_of_the_template_reaches_modelgate(reaches, kind: str, change: str) -> None:
    key = f"{kind}: UPDATE of the template: {change}"
    ctx = controller_cases()[key]
    assert template_of(ctx["object"]) != template_of(ctx["oldObject"]), "the sample change did not change the template"
    assert reaches(CONTROLLERS_HOOK, key) is True, f"{kind} UPDATE with {change}: not sent"


@pytest.mark.parametrize(("kind", "change"), [(k, c) for c in sorted(OTHER_CHANGES) for k in sorted(OTHER_CHANGES[c][0])], ids=lambda v: v)
def test_controller_update_leaving_the_template_is_kept_out(reaches, kind: str, change: str) -> None:
    key = f"{kind}: UPDATE outside the template: {change}"
    ctx = controller_cases()[key]
    assert ctx["object"] != ctx["oldObject"], "the sample change changed nothing"
    assert template_of(ctx["object"]) == template_of(ctx["oldObject"]), "the sample change touched the template"
    assert reaches(CONTROLLERS_HOOK, key) is False, f"{kind} UPDATE with {change}: sent to modelgate"


@pytest.mark.parametrize("kind", KINDS)
def test_controllers_of_exempt_namespaces_and_own_account_are_kept_out(reaches, kind: str) -> None:
    for who in exempt_cases(kind):
        assert reaches(CONTROLLERS_HOOK, f"{kind}: {who}") is False, f"a {kind} {who} is sent to modelgate"


@pytest.mark.parametrize("case", sorted(PRIORITY_CLASS_CASES))
@pytest.mark.parametrize("kind", KINDS)
def test_controllers_of_an_excluded_priority_class(reaches, request, kind: str, case: str) -> None:
    """Their pods never reach the Pod webhook: their templates must not be judged either."""
    _, want = PRIORITY_CLASS_CASES[case]
    if request.node.callspec.params["webhooks"] == "kustomize":
        want = True  # the kustomize base has no priority-class condition
    for what in priority_cases(kind, case):
        assert reaches(CONTROLLERS_HOOK, f"{kind}: {what}") is want, f"{what} of a {kind}"


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
    no namespace at all (an omitempty field, absent), in the request as in the object."""
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
    req = admission_request(group, version, obj["kind"], row["plural"], operation, name=obj["metadata"]["name"],
                            namespace=obj["metadata"]["namespace"] if namespaced else None, username="alice",
                            groups=user_groups("alice"))  # fmt: skip
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


ML_KEPT_OUT = {
    # name: a change that leaves every template as it was
    "a label of the resource": set_in("metadata", "labels", "team", "b"),
    "status": set_in("status", "phase", "Running"),
    "nothing but the bookkeeping": lambda o: None,
}

SCALE_CHANGES = {
    # kind: a change of replicas next to (not in) a template
    "RayCluster": set_in("spec", "workerGroupSpecs", 0, "replicas", 4),
    "PyTorchJob": set_in("spec", "pytorchReplicaSpecs", "Worker", "replicas", 8),
    "JobSet": set_in("spec", "replicatedJobs", 0, "replicas", 3),
    "Job": set_in("spec", "tasks", 0, "replicas", 9),
    "LeaderWorkerSet": set_in("spec", "replicas", 5),
}


def ml_key(obj: dict, what: str) -> str:
    return f"{obj['kind']}-{obj['metadata']['name']}: {what}"


def added_or_removed() -> dict[str, dict]:
    """Templates added or removed: sent."""
    ray = next(o for o in ML_OBJECTS if o["kind"] == "RayCluster")
    group = copy.deepcopy(ray["spec"]["workerGroupSpecs"][0]) | {"groupName": "new"}
    torch = next(o for o in ML_OBJECTS if o["kind"] == "PyTorchJob")
    lws = next(o for o in ML_OBJECTS if o["kind"] == "LeaderWorkerSet" and "leaderTemplate" not in o["spec"]["leaderWorkerTemplate"])
    leader = set_in("spec", "leaderWorkerTemplate", "leaderTemplate", {"spec": {"containers": [{"name": "leader", "image": "x"}]}})
    return {
        "a RayCluster worker group added": ml_request(ray, "UPDATE", lambda o: o["spec"]["workerGroupSpecs"].append(group)),
        "a RayCluster worker group removed": ml_request(ray, "UPDATE", lambda o: o["spec"]["workerGroupSpecs"].pop()),
        "a PyTorchJob replica type removed": ml_request(torch, "UPDATE", lambda o: o["spec"]["pytorchReplicaSpecs"].pop("Worker")),
        "a LeaderWorkerSet leader template added": ml_request(lws, "UPDATE", leader),
    }


@functools.cache
def ml_cases() -> dict[str, dict]:
    """Every ML case of the tests below, by key. Read only."""
    out = {}
    for obj in ML_OBJECTS:
        out[ml_key(obj, "CREATE")] = ml_request(obj)
        out[ml_key(obj, "UPDATE of a template")] = ml_request(obj, "UPDATE", all_of(BOOKKEEPING, change_last_template))
        for what, change in ML_KEPT_OUT.items():
            out[ml_key(obj, f"UPDATE of {what}")] = ml_request(obj, "UPDATE", all_of(BOOKKEEPING, change))
    for kind, change in SCALE_CHANGES.items():
        obj = next(o for o in ML_OBJECTS if o["kind"] == kind)
        out[f"{kind}: scaled"] = ml_request(obj, "UPDATE", all_of(BOOKKEEPING, change))
    return out | added_or_removed()


@pytest.mark.parametrize("obj", ML_OBJECTS, ids=ml_ids(ML_OBJECTS))
def test_ml_create_reaches_modelgate(reaches, obj: dict) -> None:
    assert reaches(CONTROLLERS_HOOK, ml_key(obj, "CREATE")) is True


@pytest.mark.parametrize("obj", ML_OBJECTS, ids=ml_ids(ML_OBJECTS))
def test_ml_update_of_a_template_reaches_modelgate(reaches, obj: dict) -> None:
    key = ml_key(obj, "UPDATE of a template")
    ctx = ml_cases()[key]
    assert ml_templates(ctx["object"]) != ml_templates(ctx["oldObject"])
    assert reaches(CONTROLLERS_HOOK, key) is True


@pytest.mark.parametrize("obj", ML_OBJECTS, ids=ml_ids(ML_OBJECTS))
def test_ml_update_leaving_the_templates_is_kept_out(reaches, obj: dict) -> None:
    for what in ML_KEPT_OUT:
        assert reaches(CONTROLLERS_HOOK, ml_key(obj, f"UPDATE of {what}")) is False, f"{ml_key(obj, what)}: sent"


@pytest.mark.parametrize("kind", sorted(SCALE_CHANGES))
def test_scaling_a_group_of_an_ml_kind_is_kept_out(reaches, kind: str) -> None:
    """A RayCluster autoscaler or an elastic job changes replicas all the time: never sent."""
    ctx = ml_cases()[f"{kind}: scaled"]
    assert ctx["object"] != ctx["oldObject"]
    assert reaches(CONTROLLERS_HOOK, f"{kind}: scaled") is False


def test_ml_templates_added_or_removed_reach_modelgate(reaches) -> None:
    for key in added_or_removed():
        assert reaches(CONTROLLERS_HOOK, key) is True, f"{key}: not sent"


CLONESET = {
    "group": "apps.kruise.io", "versions": ["v1alpha1"], "kind": "CloneSet", "plural": "clonesets",
    "templates": [{"path": "spec.template"}],
}  # fmt: skip


CLONESET_CASES = {
    # name: (change of the CloneSet on UPDATE, or None for its CREATE; called?)
    "CREATE": (None, True),
    "UPDATE of spec.replicas": (set_in("spec", "replicas", 5), False),
    "UPDATE of the template": (set_in("spec", "template", "spec", "containers", 0, "image", "x"), True),
}


def cloneset_request(change: Callable[[dict], None] | None) -> dict:
    obj = {"apiVersion": "apps.kruise.io/v1alpha1", "kind": "CloneSet", "metadata": {"name": "web", "namespace": "team-a"},
           "spec": {"replicas": 2, "template": pod_template()}}  # fmt: skip
    old = None
    if change:
        old = copy.deepcopy(obj)
        change(obj)
    req = admission_request("apps.kruise.io", "v1alpha1", "CloneSet", "clonesets", "UPDATE" if change else "CREATE",
                            namespace="team-a", name="web", username="alice", groups=user_groups("alice"))  # fmt: skip
    return {"request": req, "object": obj, "oldObject": old}


@pytest.fixture(scope="module")
def extra_kinds(assets: Assets) -> tuple[list[dict], Result]:
    """The chart rendered with a CloneSet in workloadKinds.extra, and its cases decided."""
    values = assets.values_file("cloneset", yaml.safe_dump({"workloadKinds": {"extra": [CLONESET]}}))
    docs = load(assets.render("extra-kinds", "-f", str(values)))
    conditions = webhook_configurations(docs)[CONTROLLERS_HOOK]["matchConditions"]
    cases = {name: cloneset_request(change) for name, (change, _) in CLONESET_CASES.items()}
    return docs, webhook_called([Job(CONTROLLERS_HOOK, conditions, cases)])[CONTROLLERS_HOOK]


def test_an_extra_kind_is_registered(extra_kinds) -> None:
    docs, _ = extra_kinds
    hook = webhook_configurations(docs)[CONTROLLERS_HOOK]
    rules = [(r["apiGroups"], r["apiVersions"], r["resources"], r["operations"]) for r in hook["rules"]]
    assert (["apps.kruise.io"], ["v1alpha1"], ["clonesets"], ["CREATE", "UPDATE"]) in rules
    # The server gets the same entry.
    cm = next(d for d in of_kind(docs, "ConfigMap") if d["metadata"]["name"].endswith("-workload-kinds"))
    assert yaml.safe_load(cm["data"]["workload-kinds.yaml"]) == [CLONESET]
    _, c = deployment_container(docs)
    assert any(a.startswith("--workload-kinds=") for a in c["args"])


@pytest.mark.parametrize("version", KUBE_VERSIONS)
def test_an_extra_kinds_unchanged_template_is_kept_out(extra_kinds, version: str) -> None:
    _, result = extra_kinds
    for name, (_, want) in CLONESET_CASES.items():
        assert verdict_of({CONTROLLERS_HOOK: result}, version, CONTROLLERS_HOOK, name) is want, f"CloneSet {name}"


# --- the oracle itself --------------------------------------------------------------------------------------
# What the tests above rely on: a broken condition is a compile error, not a skip; an absent
# omitempty field read without optional access is an evaluation error (the reason the requests
# are bound as the API server binds them); an error behind another condition's false is reported;
# a policy-only variable is refused.

POD_CREATE = request()
CLUSTER_SCOPED = ml_request(next(o for o in ML_OBJECTS if ROWS[(o["apiVersion"].rsplit("/", 1)[0], o["kind"])].get("scope") == "Cluster"))


def test_a_broken_expression_does_not_compile() -> None:
    with pytest.raises(KubeCelError, match="does not compile"):
        webhook_called([Job("broken", [{"name": "broken", "expression": "request.kind.kind == "}], {"pod": POD_CREATE})])


ABSENT = {
    # job: (condition, case, the field it reads that the API server leaves out)
    "subResource": ("request.subResource == ''", "a pod", "subResource"),
    "namespace": ("request.namespace != 'kube-system'", "a cluster-scoped object", "namespace"),
}


@pytest.fixture(scope="module")
def oracle() -> dict[str, Result]:
    conditions = {job: [{"name": "c", "expression": e}] for job, (e, _, _) in ABSENT.items()}
    conditions |= {
        "subResource, optional": [{"name": "c", "expression": "request.?subResource.orValue('') == ''"}],
        "namespace, optional": [{"name": "c", "expression": "request.?namespace.orValue('') != 'kube-system'"}],
        "error behind a false": [{"name": "pod", "expression": "request.kind.kind != 'Pod'"},
                                 {"name": "sub", "expression": "request.subResource == ''"}],
    }  # fmt: skip
    cases = {"a pod": POD_CREATE, "a cluster-scoped object": CLUSTER_SCOPED}
    return webhook_called([Job(name, c, cases) for name, c in conditions.items()])


@pytest.mark.parametrize("job", sorted(ABSENT))
@pytest.mark.parametrize("version", KUBE_VERSIONS)
def test_an_absent_field_is_an_error_not_a_skip(oracle, version: str, job: str) -> None:
    _, case, field = ABSENT[job]
    v = oracle[job].verdicts[(version, case)]
    assert v.called is None and f"no such key: {field}" in (v.error or ""), v
    assert v.conditions == {"c": None}, v
    read = oracle[f"{job}, optional"].verdicts[(version, case)]
    assert (read.called, read.error) == (True, None), read


@pytest.mark.parametrize("version", KUBE_VERSIONS)
def test_an_error_behind_a_false_condition_is_reported(oracle, version: str) -> None:
    v = oracle["error behind a false"].verdicts[(version, "a pod")]
    assert v.called is False, v  # kube-apiserver skips the webhook: a false condition wins
    assert v.conditions == {"pod": False, "sub": None}, v
    assert v.error and "sub failed to evaluate" in v.error, v


def test_a_variable_a_webhook_lacks_is_refused() -> None:
    for variable in ("namespaceObject", "variables", "params"):
        with pytest.raises(KubeCelError, match=variable):
            check_webhook_environment([{"name": "x", "expression": f"has({variable}.metadata)"}])
    check_webhook_environment([{"name": "x", "expression": "object.spec.params == 'namespaceObject' && has(object.variables)"}])
