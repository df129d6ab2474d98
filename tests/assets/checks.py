"""What the rendered install assets must be: one function per object family, shared by the Helm
and kustomize tests. Each raises AssertionError naming what is wrong."""

from __future__ import annotations

import base64
import os
import re
from pathlib import Path

import yaml

from k8s import (
    Obj,
    deployment_container,
    expect,
    flat_rules,
    load,
    of_kind,
    one,
    policy_flags,
    selector_matches,
)

POD_RULES = sorted(
    [
        ("", "v1", "CREATE", "pods"),
        ("", "v1", "UPDATE", "pods/ephemeralcontainers"),
        ("batch", "v1", "CREATE", "jobs"),
    ]
)
# The validating entry also sees a Pod UPDATE (its matchConditions keep only those that change an
# init container's image): the model-cache-prep image may not change after admission.
# ... and the exceptions themselves (docs/exceptions.md).
VALIDATE_POD_RULES = sorted(
    [
        *POD_RULES,
        ("", "v1", "UPDATE", "pods"),
        ("modelgate.io", "v1alpha1", "CREATE", "modelgateexceptions"),
        ("modelgate.io", "v1alpha1", "UPDATE", "modelgateexceptions"),
    ]
)
# docs/policy.md §11, §12: the pod templates of the workload controllers and of the ML custom resources,
# CREATE and UPDATE (the entry's matchConditions skip an UPDATE that leaves every template as it
# was). The kinds are the rows of the workload-kind table, which the server and the chart share.
CONTROLLERS = {
    # kind: (group, resource, path of the pod template)
    "Deployment": ("apps", "deployments", ("spec", "template")),
    "StatefulSet": ("apps", "statefulsets", ("spec", "template")),
    "DaemonSet": ("apps", "daemonsets", ("spec", "template")),
    "ReplicaSet": ("apps", "replicasets", ("spec", "template")),
    "ReplicationController": ("", "replicationcontrollers", ("spec", "template")),
    "CronJob": ("batch", "cronjobs", ("spec", "jobTemplate", "spec", "template")),
}
WORKLOAD_KINDS_FILE = Path(__file__).resolve().parents[2] / "charts/modelgate/files/workload-kinds.yaml"
WORKLOAD_KINDS = yaml.safe_load(WORKLOAD_KINDS_FILE.read_text())


def table_rules(rows: list[dict]) -> list[tuple[str, str, str, str]]:
    """The (group, version, operation, resource) a validating entry registers for these rows."""
    return sorted((r.get("group") or "", v, op, r["plural"]) for r in rows for v in r["versions"] for op in ("CREATE", "UPDATE"))


CONTROLLER_RULES = table_rules(WORKLOAD_KINDS)
CLUSTER_SCOPED = {(r["plural"],): "Cluster" for r in WORKLOAD_KINDS if r.get("scope") == "Cluster"}

# Every webhook entry: name -> (configuration kind, path, rules).
WEBHOOKS = {
    "mutate.modelgate.io": ("MutatingWebhookConfiguration", "/mutate", POD_RULES),
    "validate.modelgate.io": ("ValidatingWebhookConfiguration", "/validate", VALIDATE_POD_RULES),
    "validate-controllers.modelgate.io": ("ValidatingWebhookConfiguration", "/validate", CONTROLLER_RULES),
}

POLICY_FLAGS = {
    "--run-as-user",
    "--run-as-group",
    "--default-fsgroup",
    "--init-container-user",
    "--model-cache-prep",
    "--init-image",
    "--cache-volume",
    "--cache-mount-path",
    "--model-mount-path",
    "--exempt-namespace",
    "--cache-layout",
    "--prep-host-path",
    "--prep-volume-type",
    "--pod-security-default",
}


def flags(path, *expected: str) -> None:
    """Each NAME=VALUE must be the value in force; for Helm renders, also a literal argument."""
    docs = load(path)
    found = policy_flags(docs)
    _, c = deployment_container(docs)
    args = c.get("args") or []
    for e in expected:
        k, v = e.split("=", 1)
        expect(found.get(k) == v, f"{path}: expected {k}={v}, found {found.get(k)!r} (args: {args})")
        if any(a.startswith(k + "=") for a in args):
            expect(k + "=" + v in args, f"argument {k}={v} not rendered literally: {args}")
    for k, v in found.items():
        expect(not re.fullmatch(r"-?\d+(\.\d+)?[eE][+-]?\d+", v), f"{k}={v}: a number rendered in float notation")


def args_literal(path, *expected: str) -> None:
    _, c = deployment_container(load(path))
    args = c.get("args") or []
    for e in expected:
        expect(e in args, f"argument {e!r} not in {args}")


def webhook_configurations(docs: list[Obj]) -> dict[str, Obj]:
    """Every webhook entry of the two configurations, by name (the keys of WEBHOOKS, each in the
    configuration WEBHOOKS names)."""
    out = {}
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        for h in one(docs, kind)["webhooks"]:
            expect(h["name"] not in out, f"{kind}: webhook {h['name']} twice")
            expect(WEBHOOKS.get(h["name"], (None,))[0] == kind, f"{kind}: unexpected webhook {h['name']}")
            out[h["name"]] = h
    expect(sorted(out) == sorted(WEBHOOKS), f"webhooks are {sorted(out)}, expected {sorted(WEBHOOKS)}")
    return out


def webhooks(path, ns: str, ca_mode: str, failure_policy: str = "Fail", inject: str = "enabled", match_conditions: bool = True) -> None:
    """Every webhook entry as WEBHOOKS says. Without matchConditions the controllers' entry has
    CREATE only: nothing would keep the API server from calling modelgate on every scale."""
    docs = load(path)
    svc = one(docs, "Service")
    d, _ = deployment_container(docs)
    tls_secret = next(v["secret"]["secretName"] for v in d["spec"]["template"]["spec"]["volumes"] if "secret" in v)
    https = next(p for p in svc["spec"]["ports"] if p["name"] == "https")
    for name, h in webhook_configurations(docs).items():
        kind, path_, rules = WEBHOOKS[name]
        mutating = kind == "MutatingWebhookConfiguration"
        cfg = one(docs, kind)
        where = kind + " " + name
        expect(h["admissionReviewVersions"] == ["v1"], where + ": admissionReviewVersions must be [v1]")
        expect(h["sideEffects"] == "None", where + ": sideEffects must be None")
        expect(h["timeoutSeconds"] == 5, where + ": timeoutSeconds must be 5")
        expect(h["matchPolicy"] == "Equivalent", where + ": matchPolicy must be Equivalent")
        expect(h["failurePolicy"] == failure_policy, where + ": failurePolicy must be " + failure_policy)
        if mutating:
            expect(h.get("reinvocationPolicy") == "IfNeeded", where + ": reinvocationPolicy must be IfNeeded")
        else:
            expect("reinvocationPolicy" not in h, where + ": a validating webhook has no reinvocationPolicy")
        s = h["clientConfig"]["service"]
        expect(
            s["name"] == svc["metadata"]["name"] and s["namespace"] == ns == svc["metadata"]["namespace"],
            where + f": clientConfig.service must name the Service {ns}/{svc['metadata']['name']}",
        )
        expect(s["path"] == path_, where + ": path must be " + path_)
        expect(s.get("port", 443) == https["port"], where + ": port must be the Service's https port")
        if not match_conditions:
            rules = [r for r in rules if r[2] == "CREATE" or rules in (POD_RULES, VALIDATE_POD_RULES)]
        expect(bool(h.get("matchConditions")) == match_conditions, where + f": matchConditions present should be {match_conditions}")
        expect(flat_rules(h["rules"]) == rules, where + f": rules are {flat_rules(h['rules'])}")
        # Namespaced, but for a cluster-scoped row of the table (ClusterTrainingRuntime): the
        # namespaceSelector cannot apply to it, so it reaches the webhook wherever it is made.
        expect(
            all(r.get("scope") == CLUSTER_SCOPED.get(tuple(r["resources"]), "Namespaced") for r in h["rules"]),
            where + ": rules must be Namespaced (Cluster for a cluster-scoped row of the table)",
        )
        sel = h["namespaceSelector"]

        def ns_labels(name, opted_in=True):
            labels = {"kubernetes.io/metadata.name": name}
            if opted_in:
                labels["modelgate.io/inject"] = inject
            return labels

        expect(selector_matches(sel, ns_labels("team-a")), where + ": an opted-in namespace is not selected")
        expect(not selector_matches(sel, ns_labels("team-a", False)), where + ": a namespace without the label is selected")
        for other in ("disabled", "enabled", "restricted"):
            if other != inject:
                labels = {"kubernetes.io/metadata.name": "team-a", "modelgate.io/inject": other}
                expect(not selector_matches(sel, labels), where + f": modelgate.io/inject={other} is selected")
        expect(not selector_matches(sel, ns_labels("kube-system")), where + ": kube-system is selected")
        expect(not selector_matches(sel, ns_labels(ns)), where + ": the webhook's own namespace is selected")
        ann = cfg["metadata"].get("annotations") or {}
        bundle = h["clientConfig"].get("caBundle")
        if ca_mode == "cert-manager":
            ref = ann.get("cert-manager.io/inject-ca-from")
            expect(ref, where + ": no cert-manager.io/inject-ca-from annotation")
            cns, cname = ref.split("/")
            certs = [x for x in of_kind(docs, "Certificate") if x["metadata"]["name"] == cname and x["metadata"]["namespace"] == cns]
            expect(certs, where + ": inject-ca-from names no rendered Certificate: " + ref)
            cert = certs[0]
            expect(
                cert["spec"]["secretName"] == tls_secret,
                f"Certificate {ref} writes {cert['spec']['secretName']}, the Deployment mounts {tls_secret}",
            )
            host = f"{svc['metadata']['name']}.{ns}.svc"
            expect(host in cert["spec"]["dnsNames"], f"Certificate {ref} lacks dnsName {host}")
            expect(not bundle, where + ": caBundle must be left to cert-manager's cainjector")
        elif ca_mode == "bundle":
            expect(bundle, where + ": no caBundle")
            secret = [x for x in of_kind(docs, "Secret") if x["metadata"]["name"] == tls_secret]
            expect(secret, f"no Secret {tls_secret} rendered for the Deployment")
            expect(secret[0]["data"]["ca.crt"] == bundle, where + ": caBundle is not the Secret's ca.crt")
            expect(
                base64.b64decode(bundle).startswith(b"-----BEGIN CERTIFICATE-----"),
                where + ": caBundle is not a PEM certificate",
            )
            expect("cert-manager.io/inject-ca-from" not in ann, where + ": inject-ca-from without cert-manager")
        else:
            expect(not bundle and "cert-manager.io/inject-ca-from" not in ann, where + ": unexpected CA source")


def deployment(path, ns: str, uid_mode: str) -> None:
    docs = load(path)
    d, c = deployment_container(docs)
    spec = d["spec"]
    pod = spec["template"]["spec"]
    labels = spec["template"]["metadata"]["labels"]
    expect(d["metadata"]["namespace"] == ns, "Deployment not in " + ns)
    expect(spec["replicas"] == 2, "replicas must be 2")
    expect(selector_matches(spec["selector"], labels), "Deployment selector does not match its pods")
    expect(spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0, "maxUnavailable must be 0")
    anti = (pod.get("affinity") or {}).get("podAntiAffinity") or {}
    terms = [
        t.get("podAffinityTerm", t)
        for t in anti.get("preferredDuringSchedulingIgnoredDuringExecution", [])
        + anti.get("requiredDuringSchedulingIgnoredDuringExecution", [])
    ]
    expect(
        any(selector_matches(t["labelSelector"], labels) and t["topologyKey"] == "kubernetes.io/hostname" for t in terms),
        "no pod anti-affinity on kubernetes.io/hostname that selects the webhook's own pods",
    )
    grace = pod["terminationGracePeriodSeconds"]
    pre = (c.get("lifecycle") or {}).get("preStop") or {}
    expect("sleep" in pre, "preStop must be the kubelet's sleep action (the image has no shell)")
    pause = pre["sleep"]["seconds"]
    args = c["args"]
    expect(args[0] == "serve", "the container must run `modelgate serve`")
    sd = [a for a in args if a.startswith("--shutdown-grace=")]
    expect(sd and sd[0].endswith("s"), "--shutdown-grace=<n>s missing")
    shutdown = int(sd[0].split("=")[1][:-1])
    expect(0 < pause < grace, f"preStop pause {pause} must be shorter than terminationGracePeriodSeconds {grace}")
    expect(
        pause + shutdown < grace,
        f"preStop {pause}s + shutdown grace {shutdown}s must fit in terminationGracePeriodSeconds {grace}s",
    )
    for a in (
        "--listen=0.0.0.0:8443",
        "--probe-listen=0.0.0.0:8080",
        "--tls-cert=/etc/modelgate/tls/tls.crt",
        "--tls-key=/etc/modelgate/tls/tls.key",
    ):
        expect(a in args, f"argument {a} missing: {args}")
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    expect(ports.get("https") == 8443, "container port https must be 8443")
    for probe, path_ in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        g = c[probe]["httpGet"]
        port = ports.get(g["port"], g["port"])
        expect(
            g["path"] == path_ and port == 8080 and g.get("scheme", "HTTP") == "HTTP",
            f"{probe} must be HTTP GET {path_} on the probe port 8080, is {g}",
        )
    res = c.get("resources") or {}
    expect(
        res.get("requests", {}).get("cpu") and res.get("requests", {}).get("memory") and res.get("limits", {}).get("memory"),
        "resources: cpu and memory requests and a memory limit are required",
    )
    psc = pod.get("securityContext") or {}
    csc = c.get("securityContext") or {}
    eff = dict(psc)
    eff.update(csc)
    expect(eff.get("runAsNonRoot") is True, "runAsNonRoot must be true")
    if uid_mode == "numeric":
        uid = csc.get("runAsUser")
        expect(
            isinstance(uid, int) and not isinstance(uid, bool) and uid > 0,
            f"the container must run as a numeric non-root uid, has {uid!r}",
        )
    else:  # OpenShift: the SCC assigns uid, gid and fsGroup
        for k in ("runAsUser", "runAsGroup", "fsGroup"):
            expect(k not in psc and k not in csc, f"OpenShift: {k} must be left to the SCC")
    expect(csc.get("readOnlyRootFilesystem") is True, "readOnlyRootFilesystem must be true")
    expect(csc.get("allowPrivilegeEscalation") is False, "allowPrivilegeEscalation must be false")
    expect((csc.get("capabilities") or {}).get("drop") == ["ALL"], "capabilities.drop must be [ALL]")
    expect(not (csc.get("capabilities") or {}).get("add"), "no capability may be added")
    expect(not csc.get("privileged"), "must not be privileged")
    expect((eff.get("seccompProfile") or {}).get("type") == "RuntimeDefault", "seccompProfile must be RuntimeDefault")
    expect(not pod.get("hostNetwork") and not pod.get("hostPID"), "no host namespaces")
    envs = {e["name"]: e for e in c.get("env") or []}
    expect(
        envs.get("POD_NAMESPACE", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.namespace",
        "POD_NAMESPACE must come from the downward API (metadata.namespace)",
    )
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    expect(
        "/etc/modelgate/tls" in mounts and mounts["/etc/modelgate/tls"].get("readOnly"),
        "TLS Secret must be mounted read-only at /etc/modelgate/tls",
    )
    vols = {v["name"]: v for v in pod["volumes"]}
    expect("secret" in vols[mounts["/etc/modelgate/tls"]["name"]], "/etc/modelgate/tls must be a Secret volume")
    svc = one(docs, "Service")
    expect(selector_matches({"matchLabels": svc["spec"]["selector"]}, labels), "Service selector does not match the pods")
    https = [p for p in svc["spec"]["ports"] if p["port"] == 443]
    expect(https and https[0]["targetPort"] in ("https", 8443), "Service port 443 must target the container's 8443")
    pdb = one(docs, "PodDisruptionBudget")
    expect(selector_matches(pdb["spec"]["selector"], labels), "PodDisruptionBudget does not select the pods")
    expect(pdb["spec"].get("minAvailable") == 1, "PodDisruptionBudget minAvailable must be 1")
    sa = pod["serviceAccountName"]
    expect(any(x["metadata"]["name"] == sa for x in of_kind(docs, "ServiceAccount")), f"ServiceAccount {sa} not rendered")


def rbac(path, ns: str) -> None:
    docs = load(path)
    expect(not of_kind(docs, "Role") and not of_kind(docs, "RoleBinding"), "no namespaced Role is needed")
    crb = one(docs, "ClusterRoleBinding")
    bound = [r for r in of_kind(docs, "ClusterRole") if r["metadata"]["name"] == crb["roleRef"]["name"]]
    expect(len(bound) == 1, "the ClusterRoleBinding must bind one of the rendered ClusterRoles")
    cr = bound[0]
    exception_editor(docs)
    # (apiGroup, resources) -> verbs: read-only, and nothing else.
    expected = {
        ("serving.kserve.io", ("localmodelcaches", "localmodelnamespacecaches", "localmodelnodegroups")): [
            "get",
            "list",
            "watch",
        ],
        # PVCs (routing, docs/model-cache.md; the prep's claim decision, docs/policy.md: one get
        # for a claim the watch has not delivered), Nodes and namespace labels (modes and Pod
        # Security levels): list and watch only, a get for claims.
        ("", ("persistentvolumeclaims",)): ["get", "list", "watch"],
        ("", ("nodes",)): ["list", "watch"],
        ("", ("namespaces",)): ["list", "watch"],
        # Exceptions (docs/exceptions.md): watched; only their status is written.
        ("modelgate.io", ("modelgateexceptions",)): ["list", "watch"],
        ("modelgate.io", ("modelgateexceptions/status",)): ["patch"],
    }
    seen = set()
    for r in cr["rules"]:
        expect(len(r.get("apiGroups", [])) == 1, f"one apiGroup per rule: {r}")
        key = (r["apiGroups"][0], tuple(sorted(r["resources"])))
        expect(key in expected, f"unexpected ClusterRole rule {r}")
        expect(sorted(r["verbs"]) == expected[key], f"verbs of {key} must be {expected[key]}; are {r['verbs']}")
        expect("resourceNames" not in r and "nonResourceURLs" not in r, "no resourceNames or nonResourceURLs")
        seen.add(key)
    expect(seen == set(expected), f"ClusterRole rules missing: {sorted(set(expected) - seen)}")
    crb = one(docs, "ClusterRoleBinding")
    d, _ = deployment_container(docs)
    sa = d["spec"]["template"]["spec"]["serviceAccountName"]
    expect(
        crb["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cr["metadata"]["name"]},
        "ClusterRoleBinding must bind the ClusterRole",
    )
    expect(
        crb["subjects"] == [{"kind": "ServiceAccount", "name": sa, "namespace": ns}],
        f"ClusterRoleBinding must bind only ServiceAccount {ns}/{sa}",
    )


def exception_editor(docs) -> None:
    """The exception editor ClusterRole: bound by nobody, its rights only on the exceptions, and
    aggregated into admin only when asked (docs/exceptions.md)."""
    editors = [r for r in of_kind(docs, "ClusterRole") if r["metadata"]["name"].endswith("modelgate-exception-editor")]
    expect(len(editors) == 1, "one modelgate-exception-editor ClusterRole expected")
    editor = editors[0]
    for r in editor["rules"]:
        expect(r["apiGroups"] == ["modelgate.io"] and r["resources"] == ["modelgateexceptions"], f"editor rule {r}")
    verbs = sorted({v for r in editor["rules"] for v in r["verbs"]})
    expect(verbs == sorted(["get", "list", "watch", "create", "update", "patch", "delete"]), f"editor verbs {verbs}")
    for b in of_kind(docs, "ClusterRoleBinding") + of_kind(docs, "RoleBinding"):
        expect(b["roleRef"]["name"] != editor["metadata"]["name"], f"{b['metadata']['name']} binds the exception editor")


def kinds(path, *expected: str) -> None:
    got = sorted(d["kind"] for d in load(path))
    expect(got == sorted(expected), f"{path}: kinds are {got}, expected {sorted(expected)}")


def security_context_absent(path) -> None:
    """OpenShift: the webhook pod leaves uid, gid and fsGroup to the SCC."""
    d, c = deployment_container(load(path))
    psc = d["spec"]["template"]["spec"].get("securityContext") or {}
    csc = c.get("securityContext") or {}
    for k in ("runAsUser", "runAsGroup", "fsGroup"):
        expect(k not in psc and k not in csc, f"{k} is set; restricted-v2 would refuse it")


def cert_manager_issuer(path, kind: str, name: str) -> None:
    docs = load(path)
    expect(not of_kind(docs, "Issuer"), "no Issuer may be rendered when certManager.issuerRef is set")
    cert = [c for c in of_kind(docs, "Certificate") if c["metadata"]["name"].endswith("-serving-cert")]
    expect(len(cert) == 1, "one serving Certificate expected")
    ref = cert[0]["spec"]["issuerRef"]
    expect(ref.get("kind") == kind and ref.get("name") == name, f"issuerRef is {ref}")


def extract_tls(path, out_dir) -> str:
    """Writes the Deployment's TLS Secret to out_dir; returns the Service's host name."""
    docs = load(path)
    d, _ = deployment_container(docs)
    name = next(v["secret"]["secretName"] for v in d["spec"]["template"]["spec"]["volumes"] if "secret" in v)
    s = [x for x in of_kind(docs, "Secret") if x["metadata"]["name"] == name]
    expect(s, "no Secret " + name)
    expect(s[0]["type"] == "kubernetes.io/tls", "Secret type must be kubernetes.io/tls")
    for k in ("tls.crt", "tls.key", "ca.crt"):
        with open(os.path.join(out_dir, k), "wb") as f:
            f.write(base64.b64decode(s[0]["data"][k]))
    svc = one(docs, "Service")
    return f"{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc"


def docs_paths(repo, *docs: str) -> None:
    """Every repository path a doc names exists."""
    for doc in docs:
        with open(os.path.join(repo, doc)) as f:
            text = f.read()
        for m in sorted(set(re.findall(r"(?<![\w./-])((?:manifests|charts|scripts|docs|tests)/[\w./-]*[\w/])", text))):
            expect(os.path.exists(os.path.join(repo, m)), f"{doc} names {m}, which does not exist")


def policy_cli(path) -> tuple[list[str], dict[str, str]]:
    """How the Deployment hands the policy to the binary: (arguments, MODELGATE_* environment)."""
    docs = load(path)
    _, c = deployment_container(docs)
    cms = {cm["metadata"]["name"]: cm for cm in of_kind(docs, "ConfigMap")}
    env: dict[str, str] = {}
    for src in c.get("envFrom") or []:
        if src.get("configMapRef"):
            env.update({k: str(v) for k, v in cms[src["configMapRef"]["name"]].get("data", {}).items()})
    for e in c.get("env") or []:
        if e["name"].startswith("MODELGATE_") and "value" in e:
            env[e["name"]] = str(e["value"])
    args = [a for a in c.get("args") or [] if a.split("=", 1)[0] in POLICY_FLAGS]
    return args, env


def serve_args(path) -> list[str]:
    _, c = deployment_container(load(path))
    return [a.split("=", 1)[0] for a in c["args"][1:]]
