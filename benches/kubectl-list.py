"""A `kubectl get pod,deploy,job -A -o yaml|json` List of N workloads, for measuring the documented
pipe `... | modelgate audit -` (docs/benchmarks.md, "Audit at scale"): each object as kubectl
prints it, with managedFields and status; one in ten runs as root.

    python3 benches/kubectl-list.py N yaml|json > list.yaml
"""

import sys, json, yaml
n = int(sys.argv[1])
items = []
for i in range(n):
    ns = f"team-{i % 50}"
    kind = ["Pod", "Deployment", "Job"][i % 3]
    spec = {"containers": [{"name": "server", "image": f"registry.example/app:{i % 7}",
            "args": ["--port", "8080"], "ports": [{"containerPort": 8080, "protocol": "TCP"}],
            "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
            "securityContext": {"runAsUser": 0 if i % 10 == 0 else 1000},
            "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
            "imagePullPolicy": "IfNotPresent"}],
            "restartPolicy": "Always" if kind != "Job" else "Never", "dnsPolicy": "ClusterFirst",
            "schedulerName": "default-scheduler", "terminationGracePeriodSeconds": 30,
            "volumes": [{"name": "model-cache", "persistentVolumeClaim": {"claimName": "cache"}}]}
    meta = {"name": f"w-{i}", "namespace": ns, "uid": f"00000000-0000-4000-8000-{i:012d}",
            "resourceVersion": str(1000 + i), "creationTimestamp": "2026-11-30T10:00:00Z",
            "labels": {"app": f"w-{i}"},
            "managedFields": [{"apiVersion": "v1", "fieldsType": "FieldsV1", "manager": "kubectl-client-side-apply",
                               "operation": "Update", "time": "2026-11-30T10:00:00Z",
                               "fieldsV1": {"f:metadata": {"f:labels": {".": {}, "f:app": {}}},
                                            "f:spec": {"f:containers": {'k:{"name":"server"}': {".": {}, "f:image": {}, "f:name": {}}}}}}]}
    if kind == "Pod":
        obj = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec,
               "status": {"phase": "Running", "podIP": "10.0.0.1", "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-30T10:00:05Z"}]}}
    elif kind == "Deployment":
        obj = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
               "spec": {"replicas": 2, "selector": {"matchLabels": {"app": f"w-{i}"}},
                        "template": {"metadata": {"labels": {"app": f"w-{i}"}}, "spec": spec}},
               "status": {"replicas": 2, "readyReplicas": 2, "observedGeneration": 1}}
    else:
        obj = {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta,
               "spec": {"backoffLimit": 1, "template": {"metadata": {"labels": {"app": f"w-{i}"}}, "spec": spec}},
               "status": {"succeeded": 1}}
    items.append(obj)
doc = {"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""}, "items": items}
if sys.argv[2] == "yaml":
    yaml.safe_dump(doc, sys.stdout, default_flow_style=False, sort_keys=False, width=1000)
else:
    json.dump(doc, sys.stdout, indent=4)
