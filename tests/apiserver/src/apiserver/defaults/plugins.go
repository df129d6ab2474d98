package defaults

import (
	"math/rand"
	"strings"

	"apiserver/object"
)

// ServiceAccountTokenMountPath is where the ServiceAccount plugin mounts the token.
const ServiceAccountTokenMountPath = "/var/run/secrets/kubernetes.io/serviceaccount"

// AdmitPod runs, in kube-apiserver's order, the default-enabled mutating admission plugins
// that change a Pod before (and, on reinvocation, after) the mutating webhooks: ServiceAccount,
// Priority, DefaultTolerationSeconds. The same chain runs again after a webhook changed the
// object (k8s.io/apiserver/pkg/admission/reinvocation.go), so it must be idempotent.
func AdmitPod(pod object.Object) {
	ServiceAccount(pod)
	Priority(pod)
	DefaultTolerationSeconds(pod)
}

// ServiceAccount is plugin/pkg/admission/serviceaccount/admission.go (Admit, with the default
// ServiceAccount and no automount opt-out on it): serviceAccountName defaults to "default";
// unless the pod opts out, a projected volume kube-api-access-<5 random chars> (reused if a
// volume of that prefix exists) is mounted read-only at the token path into every init
// container and container that has no mount at that path; the volume is added only if a
// container needed it.
func ServiceAccount(pod object.Object) {
	if _, mirror := object.Map(object.Get(pod, "metadata", "annotations"))["kubernetes.io/config.mirror"]; mirror {
		return
	}
	spec := object.Child(pod, "spec")
	if object.Str(spec["serviceAccountName"]) == "" {
		spec["serviceAccountName"] = "default"
	}
	if automount, ok := object.Bool(spec["automountServiceAccountToken"]); ok && !automount {
		return
	}
	volumeName, hasVolume := "", false
	for _, v := range object.Maps(spec["volumes"]) {
		if name := object.Str(v["name"]); strings.HasPrefix(name, "kube-api-access-") {
			volumeName, hasVolume = name, true
			break
		}
	}
	if volumeName == "" {
		volumeName = GenerateName("kube-api-access-")
	}
	needsVolume := false
	for _, key := range []string{"initContainers", "containers"} {
		for _, c := range object.Maps(spec[key]) {
			mounted := false
			for _, m := range object.Maps(c["volumeMounts"]) {
				if object.Str(m["mountPath"]) == ServiceAccountTokenMountPath {
					mounted = true
					break
				}
			}
			if !mounted {
				c["volumeMounts"] = append(object.Slice(c["volumeMounts"]), object.Object{
					"name": volumeName, "readOnly": true, "mountPath": ServiceAccountTokenMountPath,
				})
				needsVolume = true
			}
		}
	}
	if !hasVolume && needsVolume {
		spec["volumes"] = append(object.Slice(spec["volumes"]), object.Object{
			"name":      volumeName,
			"projected": tokenVolumeSource(),
		})
	}
}

// tokenVolumeSource is TokenVolumeSource() as the v1 object serializes it (defaultMode 420,
// expirationSeconds serviceaccount.WarnOnlyBoundTokenExpirationSeconds = 3607).
func tokenVolumeSource() object.Object {
	return object.Object{
		"defaultMode": object.Num(420),
		"sources": []interface{}{
			object.Object{"serviceAccountToken": object.Object{"path": "token", "expirationSeconds": object.Num(3607)}},
			object.Object{"configMap": object.Object{
				"name":  "kube-root-ca.crt",
				"items": []interface{}{object.Object{"key": "ca.crt", "path": "ca.crt"}},
			}},
			object.Object{"downwardAPI": object.Object{
				"items": []interface{}{object.Object{
					"path":     "namespace",
					"fieldRef": object.Object{"apiVersion": "v1", "fieldPath": "metadata.namespace"},
				}},
			}},
		},
	}
}

// Priority is plugin/pkg/admission/priority/admission.go for a pod without priorityClassName
// in a cluster without a global default class: priority 0, preemptionPolicy
// PreemptLowerPriority.
func Priority(pod object.Object) {
	spec := object.Child(pod, "spec")
	if object.Str(spec["priorityClassName"]) != "" {
		return
	}
	object.SetDefault(spec, "priority", object.Num(0))
	object.SetDefault(spec, "preemptionPolicy", "PreemptLowerPriority")
}

// DefaultTolerationSeconds is plugin/pkg/admission/defaulttolerationseconds/admission.go:
// tolerate node.kubernetes.io/not-ready and unreachable (NoExecute) for 300 s unless a
// toleration already covers that taint.
func DefaultTolerationSeconds(pod object.Object) {
	spec := object.Child(pod, "spec")
	for _, taint := range []string{"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"} {
		tolerated := false
		for _, t := range object.Maps(spec["tolerations"]) {
			effect, key := object.Str(t["effect"]), object.Str(t["key"])
			if (effect == "" || effect == "NoExecute") && (key == "" || key == taint) {
				tolerated = true
			}
		}
		if !tolerated {
			spec["tolerations"] = append(object.Slice(spec["tolerations"]), object.Object{
				"key": taint, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": object.Num(300),
			})
		}
	}
}

// GenerateName is names.SimpleNameGenerator: the prefix and 5 random characters.
func GenerateName(prefix string) string {
	const alphanums = "bcdfghjklmnpqrstvwxz2456789"
	b := make([]byte, 5)
	for i := range b {
		b[i] = alphanums[rand.Intn(len(alphanums))]
	}
	return prefix + string(b)
}
