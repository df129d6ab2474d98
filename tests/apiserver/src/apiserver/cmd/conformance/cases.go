package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"github.com/ghodss/yaml"

	"apiserver/admission"
	"apiserver/jobcontroller"
	"apiserver/object"
)

// testCase is one object a user or a controller creates.
type testCase struct {
	Name      string // where it comes from
	Group     string // corpus, examples, generated, controller
	Kind      admission.Kind
	Object    object.Object // as written (not defaulted)
	Namespace string
	User      admission.User
	// ExpectCache, when set, is the modelgate.io/model-cache annotation the patched object
	// must carry (a generated hit that must really be a hit).
	ExpectCache string
	// Guaranteed: the object is built so that its pods are Guaranteed.
	Guaranteed bool
}

var documentSeparator = regexp.MustCompile(`(?m)^---\s*$`)

// loadFiles reads every YAML and JSON file under dir (recursively) as kubectl reads them
// (sigs.k8s.io/yaml's predecessor ghodss/yaml for YAML, several documents, Lists flattened) and
// returns the Pods and Jobs in them, the objects of CREATE AdmissionReviews and bare
// AdmissionRequests, and the Pods that workload controllers make from the templates they hold.
func loadFiles(dir, group string) ([]testCase, error) {
	var files []string
	err := filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		name := info.Name()
		if info.IsDir() || strings.HasPrefix(name, "_") {
			return nil
		}
		if strings.HasSuffix(name, ".yaml") || strings.HasSuffix(name, ".yml") ||
			strings.HasSuffix(name, ".yaml.injected") || strings.HasSuffix(name, ".json") {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	sort.Strings(files)
	var cases []testCase
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		rel, _ := filepath.Rel(dir, f)
		for i, doc := range documentSeparator.Split(string(data), -1) {
			js, err := yaml.YAMLToJSON([]byte(doc))
			if err != nil {
				return nil, fmt.Errorf("%s document %d: %v", f, i, err)
			}
			o, err := object.Decode(js)
			if err != nil {
				continue // empty document or not an object
			}
			for j, item := range flatten(o) {
				name := fmt.Sprintf("%s/%s#%d.%d", group, rel, i, j)
				cases = append(cases, casesFor(name, group, item)...)
			}
		}
	}
	return cases, nil
}

func flatten(o object.Object) []object.Object {
	if strings.HasSuffix(object.Str(o["kind"]), "List") {
		return object.Maps(o["items"])
	}
	return []object.Object{o}
}

// casesFor turns one document into the CREATE calls it stands for.
func casesFor(name, group string, o object.Object) []testCase {
	if req := reviewRequest(o); req != nil {
		if object.Str(req["operation"]) != "CREATE" || object.Str(req["subResource"]) != "" {
			return nil
		}
		obj := object.Map(req["object"])
		if obj == nil {
			return nil
		}
		if object.Str(object.Get(obj, "metadata", "namespace")) == "" && object.Str(req["namespace"]) != "" {
			object.Child(obj, "metadata")["namespace"] = req["namespace"]
		}
		o = obj
	}
	apiVersion, kind := object.Str(o["apiVersion"]), object.Str(o["kind"])
	ns := object.Str(object.Get(o, "metadata", "namespace"))
	if ns == "" {
		ns = "default"
	}
	meta := object.Map(o["metadata"])
	spec := object.Map(o["spec"])
	switch {
	case apiVersion == "v1" && kind == "Pod":
		return []testCase{{Name: name, Group: group, Kind: admission.PodKind, Object: o, Namespace: ns, User: admission.Admin}}
	case apiVersion == "batch/v1" && kind == "Job":
		return []testCase{{Name: name, Group: group, Kind: admission.JobKind, Object: o, Namespace: ns, User: admission.Admin}}
	case apiVersion == "batch/v1" && kind == "CronJob":
		// The CronJob controller creates a Job from spec.jobTemplate (getJobFromTemplate2).
		jt := object.Map(spec["jobTemplate"])
		job := object.Object{"apiVersion": "batch/v1", "kind": "Job", "metadata": object.Object{
			"name": object.Str(meta["name"]) + "-29000000", "namespace": ns,
			"labels": object.Get(jt, "metadata", "labels"), "annotations": object.Get(jt, "metadata", "annotations"),
		}, "spec": object.Copy(object.Map(jt["spec"]))}
		return []testCase{{Name: name + " (CronJob's Job)", Group: "controller", Kind: admission.JobKind, Object: job, Namespace: ns, User: admission.JobController}}
	case kind == "Deployment" || kind == "ReplicaSet" || kind == "StatefulSet" || kind == "DaemonSet" || kind == "ReplicationController":
		template := object.Map(spec["template"])
		if template == nil {
			return nil
		}
		return []testCase{{Name: name + " (" + kind + "'s Pod)", Group: "controller", Kind: admission.PodKind,
			Object: controllerPod(kind, apiVersion, object.Str(meta["name"]), ns, object.Copy(template)), Namespace: ns, User: admission.ReplicaSetController}}
	}
	return nil
}

// reviewRequest returns the request of an AdmissionReview or a bare AdmissionRequest.
func reviewRequest(o object.Object) object.Object {
	if object.Str(o["kind"]) == "AdmissionReview" {
		return object.Map(o["request"])
	}
	if _, ok := o["operation"]; ok {
		if _, ok := o["uid"]; ok {
			return o
		}
	}
	return nil
}

// controllerPod is the Pod a workload controller makes from its template (GetPodFromTemplate):
// a Deployment's through its ReplicaSet (pkg/controller/deployment: name and label
// pod-template-hash), a DaemonSet's pinned to its node (pkg/controller/daemon/util
// ReplaceDaemonSetPodNodeNameNodeAffinity: matchFields metadata.name In [node] in every term)
// with the DaemonSet controller's tolerations (AddOrUpdateDaemonPodTolerations).
func controllerPod(kind, apiVersion, name, ns string, template object.Object) object.Object {
	parent := object.Object{"name": name, "namespace": ns, "uid": admission.NewUID()}
	if kind == "Deployment" {
		const hash = "5d8f7c6b9"
		parent["name"] = name + "-" + hash
		kind, apiVersion = "ReplicaSet", "apps/v1"
		object.Child(object.Child(template, "metadata"), "labels")["pod-template-hash"] = hash
	}
	pod := jobcontroller.PodFromTemplate(template, parent, apiVersion, kind, "")
	if kind == "DaemonSet" {
		spec := object.Child(pod, "spec")
		field := []interface{}{object.Object{"key": "metadata.name", "operator": "In", "values": []interface{}{"worker-1"}}}
		required := object.Child(object.Child(object.Child(spec, "affinity"), "nodeAffinity"), "requiredDuringSchedulingIgnoredDuringExecution")
		terms := object.Maps(required["nodeSelectorTerms"])
		if len(terms) == 0 {
			required["nodeSelectorTerms"] = []interface{}{object.Object{"matchFields": field}}
		}
		for _, t := range terms {
			t["matchFields"] = field
		}
		for _, taint := range []string{"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"} {
			spec["tolerations"] = append(object.Slice(spec["tolerations"]), object.Object{"key": taint, "operator": "Exists", "effect": "NoExecute"})
		}
		for _, taint := range []string{"node.kubernetes.io/disk-pressure", "node.kubernetes.io/memory-pressure", "node.kubernetes.io/pid-pressure", "node.kubernetes.io/unschedulable"} {
			spec["tolerations"] = append(object.Slice(spec["tolerations"]), object.Object{"key": taint, "operator": "Exists", "effect": "NoSchedule"})
		}
	}
	return pod
}
