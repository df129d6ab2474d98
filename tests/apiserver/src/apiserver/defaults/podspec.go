// Package defaults sets what kube-apiserver sets on a Pod or Job before an admission webhook
// sees it: the v1 defaulting functions (k8s.io/kubernetes pkg/apis/core/v1/defaults.go,
// pkg/apis/batch/v1/defaults.go and their zz_generated.defaults.go) and the built-in mutating
// admission plugins that run before MutatingAdmissionWebhook (plugin/pkg/admission/...).
// Objects are untyped JSON (apiserver/object); only absent fields are filled, as upstream does.
package defaults

import (
	"strings"

	"apiserver/object"
)

// PodSpec is SetDefaults_PodSpec plus the generated defaults of everything a PodSpec holds
// (zz_generated.defaults.go: volumes, init/regular/ephemeral containers).
func PodSpec(spec object.Object) {
	object.SetDefault(spec, "dnsPolicy", "ClusterFirst")
	object.SetDefault(spec, "restartPolicy", "Always")
	object.SetDefault(spec, "securityContext", object.Object{})
	object.SetDefault(spec, "terminationGracePeriodSeconds", object.Num(30))
	object.SetDefault(spec, "schedulerName", "default-scheduler")
	for _, v := range object.Maps(spec["volumes"]) {
		Volume(v)
	}
	hostNetwork, _ := object.Bool(spec["hostNetwork"])
	for _, key := range []string{"initContainers", "containers", "ephemeralContainers"} {
		for _, c := range object.Maps(spec[key]) {
			Container(c, hostNetwork && key != "ephemeralContainers")
		}
	}
}

// Container is SetDefaults_Container and the generated defaults of its parts: ports
// (protocol TCP; hostPort = containerPort under hostNetwork, SetDefaults_Pod), env fieldRef
// apiVersion, probes and lifecycle handlers.
func Container(c object.Object, hostNetwork bool) {
	if object.Str(c["imagePullPolicy"]) == "" {
		if imageTag(object.Str(c["image"])) == "latest" {
			c["imagePullPolicy"] = "Always"
		} else {
			c["imagePullPolicy"] = "IfNotPresent"
		}
	}
	object.SetDefault(c, "terminationMessagePath", "/dev/termination-log")
	object.SetDefault(c, "terminationMessagePolicy", "File")
	for _, p := range object.Maps(c["ports"]) {
		object.SetDefault(p, "protocol", "TCP")
		if hostNetwork {
			if hp, _ := object.Int(p["hostPort"]); hp == 0 {
				p["hostPort"] = p["containerPort"]
			}
		}
	}
	for _, e := range object.Maps(c["env"]) {
		if ref := object.Map(object.Get(e, "valueFrom", "fieldRef")); ref != nil {
			object.SetDefault(ref, "apiVersion", "v1")
		}
	}
	for _, key := range []string{"livenessProbe", "readinessProbe", "startupProbe"} {
		if p := object.Map(c[key]); p != nil {
			probe(p)
		}
	}
	if lc := object.Map(c["lifecycle"]); lc != nil {
		for _, key := range []string{"postStart", "preStop"} {
			if h := object.Map(object.Get(lc, key, "httpGet")); h != nil {
				httpGet(h)
			}
		}
	}
}

// SetDefaults_Probe and SetDefaults_HTTPGetAction.
func probe(p object.Object) {
	for key, v := range map[string]int64{"timeoutSeconds": 1, "periodSeconds": 10, "successThreshold": 1, "failureThreshold": 3} {
		if n, _ := object.Int(p[key]); n == 0 {
			p[key] = object.Num(v)
		}
	}
	if h := object.Map(p["httpGet"]); h != nil {
		httpGet(h)
	}
}

func httpGet(h object.Object) {
	if object.Str(h["path"]) == "" {
		h["path"] = "/"
	}
	if object.Str(h["scheme"]) == "" {
		h["scheme"] = "HTTP"
	}
}

// imageTag is the tag parsers.ParseImageName finds ("latest" when none, "" with a digest only).
func imageTag(image string) string {
	if i := strings.Index(image, "@"); i >= 0 {
		image = image[:i]
		if !strings.Contains(image[strings.LastIndex(image, "/")+1:], ":") {
			return ""
		}
	}
	last := image[strings.LastIndex(image, "/")+1:]
	if i := strings.LastIndex(last, ":"); i >= 0 {
		return last[i+1:]
	}
	return "latest"
}
