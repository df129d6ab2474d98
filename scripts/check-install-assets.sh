#!/usr/bin/env bash
# Checks the install assets (issue 5) with the tools of the ecosystem:
#   helm lint / helm template (Helm 4), kubectl kustomize, kubernetes-validate (schemas of
#   Kubernetes 1.33 and 1.37, strict), hadolint, openssl, and structural assertions on the
#   rendered objects (webhook configurations, Deployment, RBAC, CRDs).
# Installs its pinned tools first (scripts/install-tools.sh, into .tools/).
# Prints one line per check and ends with "N passed, M failed"; exits non-zero if any failed.
#
#   scripts/check-install-assets.sh            all checks
#   CHECK_FILTER=schema scripts/check-install-assets.sh   only checks whose name contains "schema"
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$REPO/scripts/install-tools.sh"

BIN="${MODELGATE_TOOLS_DIR:-$REPO/.tools}/bin"
HELM="$BIN/helm"
KUBECTL="$BIN/kubectl"
KV="$BIN/kubernetes-validate"
HADOLINT="$BIN/hadolint"
PY="$BIN/python"
CHART="$REPO/charts/modelgate"
MANIFESTS="$REPO/manifests"
CORPUS="${MODELGATE_CORPUS:-$REPO/../shared/corpus}"
NS=modelgate-system
# Validate against the oldest Kubernetes the assets target (1.33) and the newest the validator knows.
K8S_VERSIONS=(1.33.0 1.37.0)
CHECK_FILTER="${CHECK_FILTER:-}"

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
cd "$REPO"

die() { printf '%s\n' "$*" >&2; exit 1; }

passed=0
failed=0
failures=()
# check NAME COMMAND...: runs COMMAND in a subshell with errexit in force, prints ok/FAIL.
check() {
  local name="$1"; shift
  # Renders ("render: ...") always run: other checks read what they write.
  if [[ -n "$CHECK_FILTER" && "$name" != *"$CHECK_FILTER"* && "$name" != render:* ]]; then return 0; fi
  local log="$WORK/check.log" rc
  set +e
  ( set -e; "$@" ) >"$log" 2>&1
  rc=$?
  set -e
  if [[ $rc -eq 0 ]]; then
    passed=$((passed + 1))
    printf 'ok    %s\n' "$name"
  else
    failed=$((failed + 1))
    failures+=("$name")
    printf 'FAIL  %s\n' "$name"
    sed 's/^/      | /' "$log"
  fi
}

# ------------------------------------------------------------------------------------------------
# Python assertions on rendered YAML (PyYAML and jsonschema come with kubernetes-validate's venv).
cat >"$WORK/asserts.py" <<'PY'
import base64, glob, json, os, re, sys
import yaml, jsonschema

def fail(msg):
    print("assertion failed: " + msg, file=sys.stderr)
    sys.exit(1)

def expect(cond, msg):
    if not cond:
        fail(msg)

def load(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]

def of_kind(docs, kind):
    return [d for d in docs if d.get("kind") == kind]

def one(docs, kind):
    found = of_kind(docs, kind)
    expect(len(found) == 1, "expected exactly one %s, found %d" % (kind, len(found)))
    return found[0]

def selector_matches(sel, labels):
    """Kubernetes LabelSelector semantics."""
    for k, v in (sel.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for e in sel.get("matchExpressions") or []:
        k, op, vals = e["key"], e["operator"], e.get("values") or []
        if op == "In" and labels.get(k) not in vals: return False
        if op == "NotIn" and k in labels and labels[k] in vals: return False
        if op == "Exists" and k not in labels: return False
        if op == "DoesNotExist" and k in labels: return False
    return True

EXPECTED_RULES = sorted([
    ("", "v1", "CREATE", "pods"),
    ("", "v1", "UPDATE", "pods/ephemeralcontainers"),
    ("batch", "v1", "CREATE", "jobs"),
])

def flat_rules(rules):
    out = []
    for r in rules:
        for g in r["apiGroups"]:
            for v in r["apiVersions"]:
                for o in r["operations"]:
                    for res in r["resources"]:
                        out.append((g, v, o, res))
    return sorted(out)

def deployment_container(docs):
    d = one(docs, "Deployment")
    cs = d["spec"]["template"]["spec"]["containers"]
    expect(len(cs) == 1, "expected one container in the Deployment")
    return d, cs[0]

def policy_flags(docs):
    """The policy flags in force: MODELGATE_* from envFrom ConfigMaps and env, then args."""
    d, c = deployment_container(docs)
    flags = {}
    cms = {cm["metadata"]["name"]: cm for cm in of_kind(docs, "ConfigMap")}
    for src in c.get("envFrom") or []:
        ref = src.get("configMapRef")
        if ref:
            expect(ref["name"] in cms, "envFrom names a ConfigMap that is not rendered: " + ref["name"])
            for k, v in cms[ref["name"]].get("data", {}).items():
                if k.startswith("MODELGATE_"):
                    flags["--" + k[len("MODELGATE_"):].lower().replace("_", "-")] = str(v)
    for e in c.get("env") or []:
        if e["name"].startswith("MODELGATE_") and "value" in e:
            flags["--" + e["name"][len("MODELGATE_"):].lower().replace("_", "-")] = str(e["value"])
    for a in c.get("args") or []:
        if a.startswith("--") and "=" in a:
            k, v = a.split("=", 1)
            flags[k] = v
    return flags

def cmd_flags(path, *expected):
    """Each NAME=VALUE must be the value in force; for helm renders, also a literal argument."""
    docs = load(path)
    flags = policy_flags(docs)
    _, c = deployment_container(docs)
    args = c.get("args") or []
    for e in expected:
        k, v = e.split("=", 1)
        expect(flags.get(k) == v, "%s: expected %s=%s, found %r (args: %s)" % (path, k, v, flags.get(k), args))
        if any(a.startswith(k + "=") for a in args):
            expect(k + "=" + v in args, "argument %s=%s not rendered literally: %s" % (k, v, args))
    for k, v in flags.items():
        expect(not re.search(r"\d[eE][+-]?\d", v), "%s=%s: a number rendered in float notation" % (k, v))

def cmd_args_literal(path, *expected):
    _, c = deployment_container(load(path))
    args = c.get("args") or []
    for e in expected:
        expect(e in args, "argument %r not in %s" % (e, args))

def cmd_webhooks(path, ns, ca_mode, failure_policy="Fail", inject="enabled"):
    docs = load(path)
    svc = one(docs, "Service")
    d, c = deployment_container(docs)
    tls_secret = next(v["secret"]["secretName"] for v in d["spec"]["template"]["spec"]["volumes"] if "secret" in v)
    https = next(p for p in svc["spec"]["ports"] if p["name"] == "https")
    for kind, path_, mutating in (("MutatingWebhookConfiguration", "/mutate", True),
                                  ("ValidatingWebhookConfiguration", "/validate", False)):
        cfg = one(docs, kind)
        hooks = cfg["webhooks"]
        expect(len(hooks) == 1, kind + ": expected one webhook")
        h = hooks[0]
        where = kind + " " + h["name"]
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
        expect(s["name"] == svc["metadata"]["name"] and s["namespace"] == ns == svc["metadata"]["namespace"],
               where + ": clientConfig.service must name the Service %s/%s" % (ns, svc["metadata"]["name"]))
        expect(s["path"] == path_, where + ": path must be " + path_)
        expect(s.get("port", 443) == https["port"], where + ": port must be the Service's https port")
        expect(flat_rules(h["rules"]) == EXPECTED_RULES, where + ": rules are %s" % flat_rules(h["rules"]))
        expect(all(r.get("scope") == "Namespaced" for r in h["rules"]), where + ": rules must be Namespaced")
        sel = h["namespaceSelector"]
        def ns_labels(name, opted_in=True):
            l = {"kubernetes.io/metadata.name": name}
            if opted_in: l["modelgate.io/inject"] = inject
            return l
        expect(selector_matches(sel, ns_labels("team-a")), where + ": an opted-in namespace is not selected")
        expect(not selector_matches(sel, ns_labels("team-a", opted_in=False)), where + ": a namespace without the label is selected")
        for other in ("disabled", "enabled", "restricted"):
            if other != inject:
                expect(not selector_matches(sel, {"kubernetes.io/metadata.name": "team-a", "modelgate.io/inject": other}),
                       where + ": modelgate.io/inject=%s is selected" % other)
        expect(not selector_matches(sel, ns_labels("kube-system")), where + ": kube-system is selected")
        expect(not selector_matches(sel, ns_labels(ns)), where + ": the webhook's own namespace is selected")
        ann = cfg["metadata"].get("annotations") or {}
        bundle = h["clientConfig"].get("caBundle")
        if ca_mode == "cert-manager":
            ref = ann.get("cert-manager.io/inject-ca-from")
            expect(ref, where + ": no cert-manager.io/inject-ca-from annotation")
            cns, cname = ref.split("/")
            certs = [x for x in of_kind(docs, "Certificate")
                     if x["metadata"]["name"] == cname and x["metadata"]["namespace"] == cns]
            expect(certs, where + ": inject-ca-from names no rendered Certificate: " + ref)
            cert = certs[0]
            expect(cert["spec"]["secretName"] == tls_secret,
                   "Certificate %s writes %s, the Deployment mounts %s" % (ref, cert["spec"]["secretName"], tls_secret))
            host = "%s.%s.svc" % (svc["metadata"]["name"], ns)
            expect(host in cert["spec"]["dnsNames"], "Certificate %s lacks dnsName %s" % (ref, host))
            expect(not bundle, where + ": caBundle must be left to cert-manager's cainjector")
        elif ca_mode == "bundle":
            expect(bundle, where + ": no caBundle")
            secret = [x for x in of_kind(docs, "Secret") if x["metadata"]["name"] == tls_secret]
            expect(secret, "no Secret %s rendered for the Deployment" % tls_secret)
            expect(secret[0]["data"]["ca.crt"] == bundle, where + ": caBundle is not the Secret's ca.crt")
            expect(base64.b64decode(bundle).startswith(b"-----BEGIN CERTIFICATE-----"), where + ": caBundle is not a PEM certificate")
            expect("cert-manager.io/inject-ca-from" not in ann, where + ": inject-ca-from without cert-manager")
        else:
            expect(not bundle and "cert-manager.io/inject-ca-from" not in ann, where + ": unexpected CA source")

def cmd_deployment(path, ns, uid_mode):
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
    terms = [t.get("podAffinityTerm", t) for t in
             anti.get("preferredDuringSchedulingIgnoredDuringExecution", []) + anti.get("requiredDuringSchedulingIgnoredDuringExecution", [])]
    expect(any(selector_matches(t["labelSelector"], labels) and t["topologyKey"] == "kubernetes.io/hostname" for t in terms),
           "no pod anti-affinity on kubernetes.io/hostname that selects the webhook's own pods")
    grace = pod["terminationGracePeriodSeconds"]
    pre = ((c.get("lifecycle") or {}).get("preStop") or {})
    expect("sleep" in pre, "preStop must be the kubelet's sleep action (the image has no shell)")
    pause = pre["sleep"]["seconds"]
    args = c["args"]
    expect(args[0] == "serve", "the container must run `modelgate serve`")
    sd = [a for a in args if a.startswith("--shutdown-grace=")]
    expect(sd and sd[0].endswith("s"), "--shutdown-grace=<n>s missing")
    shutdown = int(sd[0].split("=")[1][:-1])
    expect(0 < pause < grace, "preStop pause %s must be shorter than terminationGracePeriodSeconds %s" % (pause, grace))
    expect(pause + shutdown < grace, "preStop %ss + shutdown grace %ss must fit in terminationGracePeriodSeconds %ss" % (pause, shutdown, grace))
    for a in ("--listen=0.0.0.0:8443", "--probe-listen=0.0.0.0:8080",
              "--tls-cert=/etc/modelgate/tls/tls.crt", "--tls-key=/etc/modelgate/tls/tls.key"):
        expect(a in args, "argument %s missing: %s" % (a, args))
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    expect(ports.get("https") == 8443, "container port https must be 8443")
    for probe, path_ in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        g = c[probe]["httpGet"]
        port = ports.get(g["port"], g["port"])
        expect(g["path"] == path_ and port == 8080 and g.get("scheme", "HTTP") == "HTTP",
               "%s must be HTTP GET %s on the probe port 8080, is %s" % (probe, path_, g))
    res = c.get("resources") or {}
    expect(res.get("requests", {}).get("cpu") and res.get("requests", {}).get("memory") and res.get("limits", {}).get("memory"),
           "resources: cpu and memory requests and a memory limit are required")
    psc = pod.get("securityContext") or {}
    csc = c.get("securityContext") or {}
    eff = dict(psc); eff.update(csc)
    expect(eff.get("runAsNonRoot") is True, "runAsNonRoot must be true")
    if uid_mode == "numeric":
        uid = csc.get("runAsUser")
        expect(isinstance(uid, int) and not isinstance(uid, bool) and uid > 0, "the container must run as a numeric non-root uid, has %r" % uid)
    else:  # OpenShift: the SCC assigns uid, gid and fsGroup
        for k in ("runAsUser", "runAsGroup", "fsGroup"):
            expect(k not in psc and k not in csc, "OpenShift: %s must be left to the SCC" % k)
    expect(csc.get("readOnlyRootFilesystem") is True, "readOnlyRootFilesystem must be true")
    expect(csc.get("allowPrivilegeEscalation") is False, "allowPrivilegeEscalation must be false")
    expect((csc.get("capabilities") or {}).get("drop") == ["ALL"], "capabilities.drop must be [ALL]")
    expect(not (csc.get("capabilities") or {}).get("add"), "no capability may be added")
    expect(not csc.get("privileged"), "must not be privileged")
    expect((eff.get("seccompProfile") or {}).get("type") == "RuntimeDefault", "seccompProfile must be RuntimeDefault")
    expect(not pod.get("hostNetwork") and not pod.get("hostPID"), "no host namespaces")
    envs = {e["name"]: e for e in c.get("env") or []}
    expect(envs.get("POD_NAMESPACE", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.namespace",
           "POD_NAMESPACE must come from the downward API (metadata.namespace)")
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    expect("/etc/modelgate/tls" in mounts and mounts["/etc/modelgate/tls"].get("readOnly"), "TLS Secret must be mounted read-only at /etc/modelgate/tls")
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
    expect(any(x["metadata"]["name"] == sa for x in of_kind(docs, "ServiceAccount")), "ServiceAccount %s not rendered" % sa)

def cmd_rbac(path, ns):
    docs = load(path)
    expect(not of_kind(docs, "Role") and not of_kind(docs, "RoleBinding"), "no namespaced Role is needed")
    cr = one(docs, "ClusterRole")
    rules = cr["rules"]
    expect(len(rules) == 2, "ClusterRole must have two rules, has %d" % len(rules))
    core = rules[1]
    expect(core["apiGroups"] == [""], "the second rule is for the core group")
    expect(sorted(core["resources"]) == ["nodes", "persistentvolumeclaims"],
           "core resources must be persistentvolumeclaims and nodes, are %s" % core["resources"])
    expect(sorted(core["verbs"]) == ["list", "watch"], "core verbs must be list, watch; are %s" % core["verbs"])
    expect("resourceNames" not in core and "nonResourceURLs" not in core, "no resourceNames or nonResourceURLs")
    r = rules[0]
    expect(r["apiGroups"] == ["serving.kserve.io"], "apiGroups must be [serving.kserve.io]")
    expect(sorted(r["resources"]) == ["localmodelcaches", "localmodelnamespacecaches", "localmodelnodegroups"],
           "resources must be the three cache resources, are %s" % r["resources"])
    expect(sorted(r["verbs"]) == ["get", "list", "watch"], "verbs must be get, list, watch; are %s" % r["verbs"])
    expect("resourceNames" not in r and "nonResourceURLs" not in r, "no resourceNames or nonResourceURLs")
    crb = one(docs, "ClusterRoleBinding")
    d, _ = deployment_container(docs)
    sa = d["spec"]["template"]["spec"]["serviceAccountName"]
    expect(crb["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cr["metadata"]["name"]},
           "ClusterRoleBinding must bind the ClusterRole")
    expect(crb["subjects"] == [{"kind": "ServiceAccount", "name": sa, "namespace": ns}],
           "ClusterRoleBinding must bind only ServiceAccount %s/%s" % (ns, sa))

def cmd_kinds(path, *kinds):
    docs = load(path)
    got = sorted(d["kind"] for d in docs)
    expect(got == sorted(kinds), "%s: kinds are %s, expected %s" % (path, got, sorted(kinds)))

def cmd_security_context_absent(path):
    """OpenShift: the webhook pod leaves uid, gid and fsGroup to the SCC."""
    d, c = deployment_container(load(path))
    psc = d["spec"]["template"]["spec"].get("securityContext") or {}
    csc = c.get("securityContext") or {}
    for k in ("runAsUser", "runAsGroup", "fsGroup"):
        expect(k not in psc and k not in csc, "%s is set; restricted-v2 would refuse it" % k)

# --- CRDs ----------------------------------------------------------------------------------------
CRD_EXPECT = {
    "LocalModelCache": ("localmodelcaches", "Cluster"),
    "LocalModelNamespaceCache": ("localmodelnamespacecaches", "Namespaced"),
    "LocalModelNodeGroup": ("localmodelnodegroups", "Cluster"),
}

def structural(schema, where="openAPIV3Schema"):
    """A few rules of structural schemas: every node typed (or int-or-string / preserve-unknown)."""
    if schema.get("x-kubernetes-int-or-string"):
        return
    expect("type" in schema or schema.get("x-kubernetes-preserve-unknown-fields"), where + ": no type")
    for k, sub in (schema.get("properties") or {}).items():
        structural(sub, where + "." + k)
    if isinstance(schema.get("items"), dict):
        structural(schema["items"], where + "[]")
    if isinstance(schema.get("additionalProperties"), dict):
        structural(schema["additionalProperties"], where + "{}")

def pruning(schema):
    """Turn an openAPIV3Schema into JSON schema that also rejects the fields the API server would
    prune (objects with properties and no x-kubernetes-preserve-unknown-fields)."""
    s = {k: v for k, v in schema.items() if not k.startswith("x-kubernetes-")}
    if "properties" in s:
        s["properties"] = {k: pruning(v) for k, v in s["properties"].items()}
        if not schema.get("x-kubernetes-preserve-unknown-fields") and "additionalProperties" not in s:
            s["additionalProperties"] = False
    if isinstance(s.get("items"), dict):
        s["items"] = pruning(s["items"])
    if isinstance(s.get("additionalProperties"), dict):
        s["additionalProperties"] = pruning(s["additionalProperties"])
    return s

def crd_validators(paths):
    out = {}
    for p in paths:
        for crd in load(p):
            expect(crd["kind"] == "CustomResourceDefinition", p + ": not a CRD")
            spec = crd["spec"]
            kind = spec["names"]["kind"]
            expect(kind in CRD_EXPECT, p + ": unexpected kind " + kind)
            plural, scope = CRD_EXPECT[kind]
            expect(spec["group"] == "serving.kserve.io", kind + ": group must be serving.kserve.io")
            expect(spec["names"]["plural"] == plural and crd["metadata"]["name"] == plural + ".serving.kserve.io",
                   kind + ": plural/name must be " + plural)
            expect(spec["scope"] == scope, kind + ": scope must be " + scope)
            vs = [v for v in spec["versions"] if v["name"] == "v1alpha1"]
            expect(len(vs) == 1 and vs[0]["served"] and vs[0]["storage"], kind + ": v1alpha1 must be served and stored")
            schema = vs[0]["schema"]["openAPIV3Schema"]
            structural(schema)
            out[kind] = jsonschema.Draft4Validator(pruning(schema))
    expect(sorted(out) == sorted(CRD_EXPECT), "CRDs found: %s" % sorted(out))
    return out

def cmd_crds(crd_dir, corpus_file):
    v = crd_validators(sorted(glob.glob(os.path.join(crd_dir, "*.serving.kserve.io.yaml"))))
    objs = [o for o in load(corpus_file) if o.get("apiVersion") == "serving.kserve.io/v1alpha1"]
    expect(len(objs) >= 4, "expected the KServe guide's cache objects in " + corpus_file)
    for o in objs:
        errs = [e.message for e in v[o["kind"]].iter_errors(o)]
        expect(not errs, "KServe's %s %s does not validate: %s" % (o["kind"], o["metadata"]["name"], errs))
    # Fields modelgate reads: refused when missing or malformed.
    good = {"apiVersion": "serving.kserve.io/v1alpha1", "kind": "LocalModelNamespaceCache",
            "metadata": {"name": "m", "namespace": "team-a"},
            "spec": {"sourceModelUri": "hf://org/m", "modelSize": "10Gi", "nodeGroups": ["workers"],
                     "someNewerKServeField": {"kept": True}}}
    expect(v["LocalModelNamespaceCache"].is_valid(good), "a valid namespace cache is refused")
    bad = [
        ("no sourceModelUri", {"modelSize": "1Gi", "nodeGroups": ["w"]}),
        ("no modelSize (required by KServe)", {"sourceModelUri": "s3://b/m", "nodeGroups": ["w"]}),
        ("no nodeGroups", {"sourceModelUri": "s3://b/m", "modelSize": "1Gi"}),
        ("empty sourceModelUri", {"sourceModelUri": "", "modelSize": "1Gi", "nodeGroups": ["w"]}),
        ("empty nodeGroups", {"sourceModelUri": "s3://b/m", "modelSize": "1Gi", "nodeGroups": []}),
        ("nodeGroups a string", {"sourceModelUri": "s3://b/m", "modelSize": "1Gi", "nodeGroups": "w"}),
        ("modelSize not a quantity", {"sourceModelUri": "s3://b/m", "modelSize": "ten gigs", "nodeGroups": ["w"]}),
        ("storage.parameters not strings", {"sourceModelUri": "s3://b/m", "modelSize": "1Gi", "nodeGroups": ["w"],
                                            "storage": {"parameters": {"region": 1}}}),
    ]
    for what, spec in bad:
        for kind in ("LocalModelCache", "LocalModelNamespaceCache"):
            obj = {"apiVersion": "serving.kserve.io/v1alpha1", "kind": kind, "metadata": {"name": "x"}, "spec": spec}
            expect(not v[kind].is_valid(obj), "%s with %s is accepted" % (kind, what))
    ng = {"apiVersion": "serving.kserve.io/v1alpha1", "kind": "LocalModelNodeGroup", "metadata": {"name": "w"},
          "spec": {"storageLimit": "1Ti", "persistentVolumeSpec": {}}}
    expect(not v["LocalModelNodeGroup"].is_valid(ng), "a node group without persistentVolumeClaimSpec is accepted")

def cmd_chart_crds(path, crd_dir):
    """The chart's CRDs (crds.install=true) carry the same spec as manifests/crds."""
    rendered = {d["metadata"]["name"]: d for d in of_kind(load(path), "CustomResourceDefinition")}
    files = {}
    for p in glob.glob(os.path.join(crd_dir, "*.serving.kserve.io.yaml")):
        for d in load(p):
            files[d["metadata"]["name"]] = d
    expect(sorted(rendered) == sorted(files), "chart renders CRDs %s, manifests have %s" % (sorted(rendered), sorted(files)))
    for name, d in files.items():
        expect(rendered[name]["spec"] == d["spec"], name + ": the chart's spec differs from manifests/crds")
        expect((rendered[name]["metadata"].get("annotations") or {}).get("helm.sh/resource-policy") == "keep",
               name + ": helm.sh/resource-policy: keep missing (crds.keep defaults to true)")

def cmd_no_crds(path):
    expect(not of_kind(load(path), "CustomResourceDefinition"), "CRDs rendered although crds.install is false")

def cmd_cert_manager_issuer(path, kind, name):
    docs = load(path)
    expect(not of_kind(docs, "Issuer"), "no Issuer may be rendered when certManager.issuerRef is set")
    cert = [c for c in of_kind(docs, "Certificate") if c["metadata"]["name"].endswith("-serving-cert") or c["metadata"]["name"] == "modelgate-serving-cert"]
    expect(len(cert) == 1, "one serving Certificate expected")
    ref = cert[0]["spec"]["issuerRef"]
    expect(ref.get("kind") == kind and ref.get("name") == name, "issuerRef is %s" % ref)

def cmd_extract_tls(path, out_dir):
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
    print("%s.%s.svc" % (svc["metadata"]["name"], svc["metadata"]["namespace"]))

def cmd_docs_paths(*docs):
    """Every repository path a doc names exists."""
    repo = os.getcwd()
    for doc in docs:
        text = open(doc).read()
        for m in sorted(set(re.findall(r"(?<![\w./-])((?:manifests|charts|scripts|docs)/[\w./-]*[\w/])", text))):
            expect(os.path.exists(os.path.join(repo, m)), "%s names %s, which does not exist" % (doc, m))

POLICY_FLAGS = {"--run-as-user", "--run-as-group", "--default-fsgroup", "--init-container-user",
                "--model-cache-prep", "--init-image", "--cache-volume", "--cache-mount-path",
                "--model-mount-path", "--exempt-namespace", "--cache-layout"}

def cmd_policy_cli(path):
    """How the Deployment hands the policy to the binary: `arg --flag=value` and `env NAME=value` lines."""
    docs = load(path)
    _, c = deployment_container(docs)
    cms = {cm["metadata"]["name"]: cm for cm in of_kind(docs, "ConfigMap")}
    for src in c.get("envFrom") or []:
        if src.get("configMapRef"):
            for k, v in sorted(cms[src["configMapRef"]["name"]].get("data", {}).items()):
                print("env\t%s=%s" % (k, v))
    for e in c.get("env") or []:
        if e["name"].startswith("MODELGATE_") and "value" in e:
            print("env\t%s=%s" % (e["name"], e["value"]))
    for a in c.get("args") or []:
        if a.split("=", 1)[0] in POLICY_FLAGS:
            print("arg\t" + a)

def cmd_serve_args(path):
    _, c = deployment_container(load(path))
    for a in c["args"][1:]:
        print(a.split("=", 1)[0])

if __name__ == "__main__":
    globals()["cmd_" + sys.argv[1].replace("-", "_")](*sys.argv[2:])
PY
py() { "$PY" "$WORK/asserts.py" "$@"; }

# kubernetes-validate, strict, against each version in K8S_VERSIONS. Every document must pass;
# only instances of custom resources (cert-manager.io, serving.kserve.io) may lack a schema.
# Also checks that every document was validated, so nothing is skipped silently.
validate() {
  local out="$WORK/kv.out" rc=0 docs expected f v
  local versions=()
  for f in "$@"; do [[ -s "$f" ]] || die "$f: nothing to validate"; done
  for v in "${K8S_VERSIONS[@]}"; do versions+=(-k "$v"); done
  "$KV" --strict "${versions[@]}" "$@" >"$out" 2>&1 || rc=$?
  if grep -vE "^(INFO .* passed for resource |WARN .* Couldn't find schema for kind [A-Za-z]+ with api version (cert-manager\.io|serving\.kserve\.io)/)" "$out"; then
    die "kubernetes-validate reported the lines above"
  fi
  [[ $rc -eq 0 ]] || { cat "$out"; die "kubernetes-validate exited $rc"; }
  docs=$("$PY" -c 'import sys,yaml; print(sum(1 for f in sys.argv[1:] for d in yaml.safe_load_all(open(f)) if d))' "$@")
  expected=$((docs * ${#K8S_VERSIONS[@]}))
  [[ $(wc -l <"$out") -eq $expected ]] || { cat "$out"; die "expected $expected results for $docs documents"; }
  grep -c "passed for resource" "$out" | sed 's/^/validated: /'
}

render() { # render NAME helm-template-args... -> $WORK/NAME.yaml
  "$HELM" template modelgate "$CHART" --namespace "$NS" --kube-version 1.33.0 "${@:2}" >"$WORK/$1.yaml"
}

# Expects helm to refuse the values because of the schema, naming the field.
schema_rejects() { # FIELD-POINTER helm-args...
  local field="$1"; shift
  if "$HELM" template modelgate "$CHART" --namespace "$NS" "$@" >"$WORK/out" 2>"$WORK/err"; then
    die "helm accepted $*: $(grep -E -- '--(init-container-user|run-as|default-fsgroup|model-cache-prep)' "$WORK/out")"
  fi
  grep -q "values don't meet the specifications of the schema" "$WORK/err" || { cat "$WORK/err"; die "helm failed, but not on the schema"; }
  grep -qF "'$field'" "$WORK/err" || { cat "$WORK/err"; die "the schema error does not name $field"; }
  sed -n 's/^- at /refused: at /p' "$WORK/err"
}
schema_accepts() { # EXPECTED-ARG helm-args...
  local want="$1"; shift
  "$HELM" template modelgate "$CHART" --namespace "$NS" "$@" >"$WORK/out" || die "helm refused $*"
  py args-literal "$WORK/out" "$want"
}
values_file() { # values_file NAME YAML -> path
  printf '%s\n' "$2" >"$WORK/$1.values.yaml"
  echo "$WORK/$1.values.yaml"
}

echo "== tools: $("$HELM" version --template '{{.Version}}'), kubectl $("$KUBECTL" version --client | sed -n 's/Client Version: //p'), kubernetes-validate $("$KV" --version), $("$HADOLINT" --version)"

# --- the validators themselves can fail ------------------------------------------------------
t_validator_live() {
  cat >"$WORK/bad-deploy.yaml" <<'EOF'
apiVersion: apps/v1
kind: Deployment
metadata: {name: x}
spec:
  replicas: two
  selector: {matchLabels: {a: b}}
  template: {metadata: {labels: {a: b}}, spec: {containers: [{name: c, image: i}]}}
EOF
  if (validate "$WORK/bad-deploy.yaml") >/dev/null 2>&1; then die "a Deployment with replicas: two passed"; fi
  printf 'apiVersion: apps/v1\nkind: Deploymnet\nmetadata: {name: x}\n' >"$WORK/typo.yaml"
  if (validate "$WORK/typo.yaml") >/dev/null 2>&1; then die "an unknown kind passed"; fi
  printf 'apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {portz: []}\n' >"$WORK/unknown-field.yaml"
  if (validate "$WORK/unknown-field.yaml") >/dev/null 2>&1; then die "an unknown field passed (strict mode off?)"; fi
  echo "kubernetes-validate refuses a bad value, an unknown kind and an unknown field"
}
check "kubernetes-validate harness refuses bad objects" t_validator_live

# --- Helm: lint and render ---------------------------------------------------------------------
check "helm lint --strict (default values)" "$HELM" lint --strict "$CHART"
check "helm lint --strict (values-openshift.yaml)" "$HELM" lint --strict "$CHART" -f "$CHART/values-openshift.yaml"
check "helm lint --strict (cert-manager, CRDs)" "$HELM" lint --strict "$CHART" --set certManager.enabled=true,crds.install=true

t_render_all() {
  render default
  render openshift -f "$CHART/values-openshift.yaml"
  render certmanager --set certManager.enabled=true,crds.install=true
  py kinds "$WORK/default.yaml" ServiceAccount ClusterRole ClusterRoleBinding Service Deployment PodDisruptionBudget \
    Secret MutatingWebhookConfiguration ValidatingWebhookConfiguration
  py kinds "$WORK/certmanager.yaml" ServiceAccount ClusterRole ClusterRoleBinding Service Deployment PodDisruptionBudget \
    Issuer Issuer Certificate Certificate MutatingWebhookConfiguration ValidatingWebhookConfiguration \
    CustomResourceDefinition CustomResourceDefinition CustomResourceDefinition
  py no-crds "$WORK/default.yaml"
}
check "render: helm template with default, OpenShift and cert-manager values" t_render_all
check "helm template (default) passes kubernetes-validate 1.33/1.37" validate "$WORK/default.yaml"
check "helm template (OpenShift) passes kubernetes-validate 1.33/1.37" validate "$WORK/openshift.yaml"
check "helm template (cert-manager + CRDs) passes kubernetes-validate 1.33/1.37" validate "$WORK/certmanager.yaml"

t_render_knobs() {
  local f
  f=$(values_file knobs 'image: {repository: registry.example.com/modelgate, digest: "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}
imagePullSecrets: [{name: regcred}]
replicaCount: 3
serviceAccount: {create: false, name: existing-sa}
podDisruptionBudget: {enabled: false}
priorityClassName: system-cluster-critical
nodeSelector: {kubernetes.io/os: linux}
tolerations: [{key: dedicated, operator: Equal, value: platform, effect: NoSchedule}]
topologySpreadConstraints: [{maxSkew: 1, topologyKey: topology.kubernetes.io/zone, whenUnsatisfiable: ScheduleAnyway, labelSelector: {matchLabels: {app.kubernetes.io/name: modelgate}}}]
podAnnotations: {prometheus.io/scrape: "true"}
podLabels: {team: platform}
extraArgs: ["--max-body-bytes=1048576"]
extraEnv: [{name: RUST_LOG, value: info}]
namespaceSelector: {matchExpressions: [{key: tier, operator: In, values: [ml]}]}
exemptNamespaces: [monitoring]
preStopSleepSeconds: 0
logFormat: text')
  render knobs -f "$f"
  validate "$WORK/knobs.yaml"
  grep -q 'image: "registry.example.com/modelgate@sha256:0123' "$WORK/knobs.yaml" || die "image digest not used"
  ! grep -q '^kind: PodDisruptionBudget' "$WORK/knobs.yaml" || die "PodDisruptionBudget rendered although disabled"
  ! grep -q '^kind: ServiceAccount$' "$WORK/knobs.yaml" || die "ServiceAccount rendered although create=false"
  ! grep -q 'preStop' "$WORK/knobs.yaml" || die "preStop rendered with preStopSleepSeconds=0"
}
check "helm template with every optional value set passes kubernetes-validate 1.33/1.37" t_render_knobs

t_kube_version() {
  if "$HELM" template modelgate "$CHART" --kube-version 1.29.0 >/dev/null 2>"$WORK/err"; then
    die "the chart rendered for Kubernetes 1.29 (its preStop sleep action needs 1.30)"
  fi
  grep -q "kubeVersion" "$WORK/err" || { cat "$WORK/err"; die "refused, but not for kubeVersion"; }
}
check "chart refuses Kubernetes older than 1.30" t_kube_version

# --- values.schema.json --------------------------------------------------------------------------
for v in 0 -1 2147483648 1.5; do
  check "schema rejects --set initContainer.user=$v" schema_rejects /initContainer/user --set "initContainer.user=$v"
  f=$(values_file "icu-$v" "initContainer:
  user: $v")
  check "schema rejects initContainer.user: $v in a values file" schema_rejects /initContainer/user -f "$f"
done
for v in 1 2147483647; do
  check "schema accepts --set initContainer.user=$v" schema_accepts "--init-container-user=$v" --set "initContainer.user=$v"
  f=$(values_file "icu-$v" "initContainer:
  user: $v")
  check "schema accepts initContainer.user: $v in a values file" schema_accepts "--init-container-user=$v" -f "$f"
done
check "schema rejects initContainer.user as a string" schema_rejects /initContainer/user --set-string initContainer.user=101
check "schema rejects runAsUser: 0" schema_rejects /runAsUser --set runAsUser=0
check "schema rejects runAsUser: 2147483648" schema_rejects /runAsUser --set runAsUser=2147483648
check "schema rejects runAsUser: root" schema_rejects /runAsUser --set runAsUser=root
check "schema accepts runAsUser: none" schema_accepts "--run-as-user=none" --set runAsUser=none
check "schema rejects runAsGroup: -1" schema_rejects /runAsGroup --set runAsGroup=-1
check "schema accepts runAsGroup: 0" schema_accepts "--run-as-group=0" --set runAsGroup=0
check "schema accepts runAsGroup: none" schema_accepts "--run-as-group=none" --set runAsGroup=none
check "schema rejects defaultFSGroup: -1" schema_rejects /defaultFSGroup --set defaultFSGroup=-1
check "schema rejects defaultFSGroup: 2147483648" schema_rejects /defaultFSGroup --set defaultFSGroup=2147483648
check "schema rejects defaultFSGroup: none" schema_rejects /defaultFSGroup --set defaultFSGroup=none
check "schema accepts defaultFSGroup: 0" schema_accepts "--default-fsgroup=0" --set defaultFSGroup=0
check "schema rejects modelCachePrep: sometimes" schema_rejects /modelCachePrep --set modelCachePrep=sometimes
check "schema accepts modelCachePrep: never" schema_accepts "--model-cache-prep=never" --set modelCachePrep=never
check "schema rejects failurePolicy: Retry" schema_rejects /failurePolicy --set failurePolicy=Retry
check "schema rejects a misspelt value (initcontainer.user)" schema_rejects "" --set initcontainer.user=5

# --- numbers render as integers ------------------------------------------------------------------
t_big_uid_set() {
  render big-set --set initContainer.user=1000680000
  py args-literal "$WORK/big-set.yaml" --init-container-user=1000680000
}
check "--set initContainer.user=1000680000 renders --init-container-user=1000680000" t_big_uid_set
t_big_uid_file() {
  local f
  f=$(values_file big "initContainer:
  user: 1000680000
runAsUser: 1000680000
runAsGroup: 1000680000
defaultFSGroup: 1000680000")
  render big-file -f "$f"
  py flags "$WORK/big-file.yaml" --init-container-user=1000680000 --run-as-user=1000680000 \
    --run-as-group=1000680000 --default-fsgroup=1000680000
}
check "values file with 1000680000 renders every id as an integer" t_big_uid_file

# --- OpenShift preset ----------------------------------------------------------------------------
t_openshift_helm() {
  py flags "$WORK/openshift.yaml" --default-fsgroup=0 --run-as-user=none --run-as-group=none
  py security-context-absent "$WORK/openshift.yaml"
}
check "OpenShift preset renders --default-fsgroup=0 and --run-as-user=none" t_openshift_helm
check "default values render the SPEC.md defaults" py flags "$WORK/default.yaml" --run-as-user=1000 --run-as-group=1000 \
  --default-fsgroup=102 --init-container-user=101 --model-cache-prep=always \
  --init-image=docker.io/curlimages/curl:8.18.0 --cache-volume=model-cache --cache-mount-path=/models \
  --model-mount-path=/mnt/models --cache-layout=storage-key

# --- webhook configurations, Deployment, RBAC (Helm) ---------------------------------------------
check "helm (default): webhook configurations, caBundle from the chart's CA" py webhooks "$WORK/default.yaml" "$NS" bundle
check "helm (cert-manager): webhook configurations with inject-ca-from" py webhooks "$WORK/certmanager.yaml" "$NS" cert-manager
check "helm (OpenShift): webhook configurations" py webhooks "$WORK/openshift.yaml" "$NS" bundle
t_other_namespace() {
  "$HELM" template mg "$CHART" --namespace ml-platform --set 'exemptNamespaces={team-x}' >"$WORK/other.yaml"
  py webhooks "$WORK/other.yaml" ml-platform bundle
  py args-literal "$WORK/other.yaml" --exempt-namespace=kube-system --exempt-namespace=ml-platform --exempt-namespace=team-x
  "$PY" - "$WORK/other.yaml" <<'EOF'
import sys, yaml
for d in yaml.safe_load_all(open(sys.argv[1])):
    if d and d["kind"].endswith("WebhookConfiguration"):
        vals = [e for e in d["webhooks"][0]["namespaceSelector"]["matchExpressions"] if e["operator"] == "NotIn"][0]["values"]
        assert vals == ["kube-system", "ml-platform", "team-x"], vals
EOF
}
check "helm in another namespace excludes it, kube-system and exemptNamespaces" t_other_namespace
t_ignore() {
  render ignore --set failurePolicy=Ignore
  py webhooks "$WORK/ignore.yaml" "$NS" bundle Ignore
}
check "helm failurePolicy=Ignore reaches both webhooks" t_ignore
t_second_release() {
  "$HELM" template modelgate-restricted "$CHART" --namespace "$NS" --set modelCachePrep=never \
    --set 'namespaceSelector.matchLabels.modelgate\.io/inject=restricted' >"$WORK/restricted.yaml"
  py webhooks "$WORK/restricted.yaml" "$NS" bundle Fail restricted
  py flags "$WORK/restricted.yaml" --model-cache-prep=never
  # Every object of the second release has its own name (docs/pod-security.md installs both).
  "$PY" - "$WORK/default.yaml" "$WORK/restricted.yaml" <<'EOF'
import sys, yaml
names = [set((d["kind"], d["metadata"]["name"]) for d in yaml.safe_load_all(open(f)) if d) for f in sys.argv[1:]]
assert not (names[0] & names[1]), "objects in both releases: %s" % sorted(names[0] & names[1])
EOF
}
check "helm: a second release for restricted namespaces (prep never, inject=restricted) coexists" t_second_release
check "helm (default): Deployment" py deployment "$WORK/default.yaml" "$NS" numeric
check "helm (OpenShift): Deployment leaves uid/gid/fsGroup to the SCC" py deployment "$WORK/openshift.yaml" "$NS" scc
check "helm: RBAC is get/list/watch on the three cache resources, list/watch on PVCs and Nodes, nothing more" py rbac "$WORK/default.yaml" "$NS"
t_grace() {
  if "$HELM" template modelgate "$CHART" --set terminationGracePeriodSeconds=20 >/dev/null 2>"$WORK/err"; then
    die "terminationGracePeriodSeconds=20 (< 5 + 15) rendered"
  fi
  grep -q "must be less than terminationGracePeriodSeconds" "$WORK/err" || { cat "$WORK/err"; die "wrong error"; }
}
check "helm refuses a grace period shorter than preStop + shutdown grace" t_grace
t_issuer_ref() {
  render issuer --set certManager.enabled=true,certManager.issuerRef.kind=ClusterIssuer,certManager.issuerRef.name=corp-ca
  py cert-manager-issuer "$WORK/issuer.yaml" ClusterIssuer corp-ca
  py webhooks "$WORK/issuer.yaml" "$NS" cert-manager
}
check "helm (cert-manager) with issuerRef uses that issuer" t_issuer_ref

t_generated_tls() {
  local host
  mkdir -p "$WORK/tls"
  host=$(py extract-tls "$WORK/default.yaml" "$WORK/tls")
  openssl verify -CAfile "$WORK/tls/ca.crt" "$WORK/tls/tls.crt"
  openssl x509 -in "$WORK/tls/tls.crt" -noout -ext subjectAltName >"$WORK/san.txt"
  grep -qF "DNS:$host" "$WORK/san.txt" || die "tls.crt has no SAN $host: $(cat "$WORK/san.txt")"
  openssl x509 -in "$WORK/tls/tls.crt" -noout -checkend $((300 * 86400)) >/dev/null || die "tls.crt expires within 300 days"
  [[ "$(openssl x509 -in "$WORK/tls/tls.crt" -noout -pubkey | openssl sha256)" == \
     "$(openssl pkey -in "$WORK/tls/tls.key" -pubout | openssl sha256)" ]] || die "tls.key does not match tls.crt"
}
check "helm (default): generated certificate is signed by the caBundle CA for the Service name" t_generated_tls

# --- CRDs ----------------------------------------------------------------------------------------
t_crd_copies() {
  local f
  for f in "$MANIFESTS"/crds/*.serving.kserve.io.yaml; do
    cmp "$f" "$CHART/files/crds/$(basename "$f")" || die "charts/modelgate/files/crds/$(basename "$f") differs from manifests/crds (copy it)"
  done
  [[ $(find "$CHART/files/crds" -name '*.yaml' | wc -l) -eq $(find "$MANIFESTS/crds" -name '*.serving.kserve.io.yaml' | wc -l) ]] \
    || die "different CRD sets"
  py chart-crds "$WORK/certmanager.yaml" "$MANIFESTS/crds"
}
check "chart CRDs are manifests/crds (files identical, rendered spec equal, kept on uninstall)" t_crd_copies
[[ -f "$CORPUS/kserve/localmodelcache_readme_objects.yaml" ]] || die "corpus not found at $CORPUS (set MODELGATE_CORPUS)"
check "CRDs: KServe's example objects validate, malformed caches are refused" \
  py crds "$MANIFESTS/crds" "$CORPUS/kserve/localmodelcache_readme_objects.yaml"

# --- kustomize -----------------------------------------------------------------------------------
t_manifest_files() {
  local files=()
  while IFS= read -r f; do
    # kustomization.yaml files are kustomize's own configuration; kubectl kustomize checks them below.
    [[ "$(basename "$f")" == kustomization.yaml ]] && continue
    files+=("$f")
  done < <(find "$MANIFESTS" -type f \( -name '*.yaml' -o -name '*.yml' \) | sort)
  [[ ${#files[@]} -ge 10 ]] || die "only ${#files[@]} manifest files found"
  validate "${files[@]}"
}
check "every file under manifests/ passes kubernetes-validate 1.33/1.37" t_manifest_files
kustomize_build() { "$KUBECTL" kustomize "$MANIFESTS/$1" >"$WORK/k-$1.yaml"; }
for k in crds base default openshift; do
  check "render: kubectl kustomize manifests/$k" kustomize_build "$k"
  check "kubectl kustomize manifests/$k passes kubernetes-validate 1.33/1.37" validate "$WORK/k-$k.yaml"
done
check "kustomize (default): webhook configurations with inject-ca-from" py webhooks "$WORK/k-default.yaml" "$NS" cert-manager
check "kustomize (base): webhook configurations" py webhooks "$WORK/k-base.yaml" "$NS" none
check "kustomize (default): Deployment" py deployment "$WORK/k-default.yaml" "$NS" numeric
check "kustomize (default): RBAC" py rbac "$WORK/k-default.yaml" "$NS"
check "kustomize (default): SPEC.md default policy" py flags "$WORK/k-default.yaml" --run-as-user=1000 --run-as-group=1000 \
  --default-fsgroup=102 --init-container-user=101 --model-cache-prep=always
t_kustomize_openshift() {
  py flags "$WORK/k-openshift.yaml" --default-fsgroup=0 --run-as-user=none --run-as-group=none
  py deployment "$WORK/k-openshift.yaml" "$NS" scc
  py webhooks "$WORK/k-openshift.yaml" "$NS" cert-manager
}
check "kustomize (OpenShift): preset policy, SCC-assigned uid" t_kustomize_openshift
check "kustomize (default): Namespace and CRD-free" py kinds "$WORK/k-default.yaml" Namespace ServiceAccount ClusterRole \
  ClusterRoleBinding ConfigMap Service Deployment PodDisruptionBudget Issuer Issuer Certificate Certificate \
  MutatingWebhookConfiguration ValidatingWebhookConfiguration

# --- the assets against the real binary ----------------------------------------------------------
# scripts/test.sh builds target/debug/modelgate (cargo test) before this script runs.
MG="${MODELGATE_BIN:-}"
for candidate in "$REPO/target/debug/modelgate" "$REPO/target/release/modelgate"; do
  [[ -z "$MG" && -x "$candidate" ]] && MG="$candidate"
done
cat >"$WORK/cache-pod.yaml" <<'EOF'
apiVersion: v1
kind: Pod
metadata: {name: p, namespace: team-a}
spec:
  containers:
    - {name: c, image: i, volumeMounts: [{name: model-cache, mountPath: /models}]}
  volumes:
    - {name: model-cache, persistentVolumeClaim: {claimName: cache}}
EOF
# review_with RENDER: runs `modelgate review -o patch` on a pod that mounts a PVC model cache,
# with the policy exactly as the rendered Deployment passes it (arguments or MODELGATE_* env).
review_with() {
  local kind value args=() envs=()
  while IFS=$'\t' read -r kind value; do
    case "$kind" in arg) args+=("$value") ;; env) envs+=("$value") ;; esac
  done < <(py policy-cli "$1")
  [[ ${#args[@]} -gt 0 || ${#envs[@]} -gt 0 ]] || die "no policy found in $1"
  env "${envs[@]}" "$MG" review -o patch "${args[@]}" "$WORK/cache-pod.yaml" >"$WORK/patch.json" \
    || die "modelgate review refused the rendered policy (exit $?): ${envs[*]} ${args[*]}"
}
patch_has() { grep -qF -- "$1" "$WORK/patch.json" || { cat "$WORK/patch.json"; die "patch lacks $1"; }; }
patch_uids() { grep -oE '"runAsUser":[0-9]+' "$WORK/patch.json" | sort -u | tr '\n' ' '; }
t_binary_default() { # RENDER
  review_with "$1"
  patch_has '"chown 0:102 /models && chmod g+rwX /models"'
  [[ "$(patch_uids)" == '"runAsUser":0 "runAsUser":1000 ' ]] || die "uids in the patch: $(patch_uids)"
}
t_binary_openshift() { # RENDER
  review_with "$1"
  patch_has '"chown 101:0 /models && chmod 770 /models"'
  [[ "$(patch_uids)" == '"runAsUser":0 ' ]] || die "the preset set a uid besides the prep's 0: $(patch_uids)"
  ! grep -qE '"(runAsGroup|fsGroup)"' "$WORK/patch.json" || die "the preset set runAsGroup or fsGroup"
}
t_binary_big() {
  local f
  f=$(values_file bin-big "initContainer:
  user: 1000680000
runAsUser: 1000680000
runAsGroup: 1000680000
defaultFSGroup: 1000680000")
  render bin-big -f "$f"
  review_with "$WORK/bin-big.yaml"
  patch_has '"chown 0:1000680000 /models && chmod g+rwX /models"'
  patch_has '"runAsUser":1000680000'
}
t_binary_never() {
  render bin-never --set modelCachePrep=never
  review_with "$WORK/bin-never.yaml"
  ! grep -q model-cache-prep "$WORK/patch.json" || die "a prep container under --model-cache-prep=never"
  [[ "$(patch_uids)" == '"runAsUser":101 ' ]] || die "expected the cache owner 101 as uid, got $(patch_uids)"
}
t_binary_serve_flags() {
  local f
  "$MG" serve --help >"$WORK/serve-help.txt" 2>&1 || die "modelgate serve --help failed"
  for r in "$WORK/default.yaml" "$WORK/k-default.yaml"; do
    while read -r f; do
      grep -qE -- "(^|[ ,])$f([ =,]|$)" "$WORK/serve-help.txt" || die "$(basename "$r") passes $f, which modelgate serve does not know"
    done < <(py serve-args "$r")
  done
}
if [[ -n "$MG" ]]; then
  echo "== binary: $MG"
  check "binary: helm default policy gives uid 1000 and the fsGroup prep" t_binary_default "$WORK/default.yaml"
  check "binary: kustomize default policy (MODELGATE_* env) gives uid 1000 and the fsGroup prep" t_binary_default "$WORK/k-default.yaml"
  check "binary: helm OpenShift preset sets no uid/gid/fsGroup, prep <uid>:0 770" t_binary_openshift "$WORK/openshift.yaml"
  check "binary: kustomize OpenShift overlay sets no uid/gid/fsGroup, prep <uid>:0 770" t_binary_openshift "$WORK/k-openshift.yaml"
  check "binary: 1000680000 from a values file reaches the binary as an integer" t_binary_big
  check "binary: modelCachePrep=never gives the cache owner's uid and no prep" t_binary_never
  if "$MG" serve --help >/dev/null 2>&1; then
    check "binary: modelgate serve knows every flag the Deployments pass" t_binary_serve_flags
  else
    echo "skip  binary: modelgate serve is not built yet; its flags are not checked"
  fi
else
  echo "skip  binary: no target/debug/modelgate (set MODELGATE_BIN); the assets are not run against it"
fi

# --- Dockerfile ----------------------------------------------------------------------------------
check "hadolint Dockerfile" "$HADOLINT" --no-color "$REPO/Dockerfile"
t_hadolint_live() {
  printf 'FROM debian:latest\nRUN apt-get update && apt-get install -y curl\nUSER root\n' >"$WORK/Dockerfile.bad"
  if "$HADOLINT" --no-color "$WORK/Dockerfile.bad" >"$WORK/out" 2>&1; then die "hadolint passed a bad Dockerfile"; fi
  grep -q DL3007 "$WORK/out" || { cat "$WORK/out"; die "hadolint did not report DL3007"; }
}
check "hadolint refuses a bad Dockerfile" t_hadolint_live
t_dockerfile_shape() {
  local froms user
  froms=$(grep -cE '^FROM ' Dockerfile)
  [[ $froms -ge 2 ]] || die "not a multi-stage build"
  grep -qE '^FROM rust:1\.95[^ ]* AS build' Dockerfile || die "no rust:1.95 build stage"
  [[ "$(grep -E '^FROM ' Dockerfile | tail -1)" =~ ^FROM\ gcr\.io/distroless/cc ]] || die "the runtime stage is not distroless cc"
  user=$(grep -E '^USER ' Dockerfile | tail -1)
  [[ "$user" == "USER 65532:65532" ]] || die "last USER is '$user', not numeric 65532:65532"
  grep -qE '^ENTRYPOINT \["/usr/local/bin/modelgate"\]' Dockerfile || die "ENTRYPOINT is not the modelgate binary (exec form)"
  ! grep -qE '^(RUN|SHELL)' <(sed -n '/^FROM gcr.io\/distroless/,$p' Dockerfile) || die "the runtime stage runs a shell"
}
check "Dockerfile: rust:1.95 builder, distroless runtime, USER 65532:65532, no shell at run time" t_dockerfile_shape

# --- docs ----------------------------------------------------------------------------------------
t_docs() {
  local d
  for d in docs/install.md docs/openshift.md docs/pod-security.md; do [[ -s $d ]] || die "$d is missing"; done
  py docs-paths docs/install.md docs/openshift.md docs/pod-security.md
}
check "docs exist and every repository path they name exists" t_docs

echo
if [[ $failed -gt 0 ]]; then
  printf 'failed: %s\n' "${failures[@]}"
fi
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
