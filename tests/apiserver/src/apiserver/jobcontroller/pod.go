// Package jobcontroller makes the Pod the Job controller creates for a Job (k8s.io/kubernetes
// pkg/controller/job/job_controller.go manageJob and pkg/controller/controller_utils.go
// GetPodFromTemplate), and the Pods of the other workload controllers, which use the same
// GetPodFromTemplate.
package jobcontroller

import (
	"apiserver/object"
)

// JobTrackingFinalizer is batch.JobTrackingFinalizer, added to every pod of a Job.
const JobTrackingFinalizer = "batch.kubernetes.io/job-tracking"

// PodForJob is the pod of a NonIndexed Job (an Indexed one also gets its completion index:
// annotation, label and hostname; the harness's Jobs are NonIndexed, as is the default).
func PodForJob(job object.Object) object.Object {
	template := object.Copy(object.Map(object.Get(job, "spec", "template")))
	meta := object.Child(template, "metadata")
	finalizers := object.Slice(meta["finalizers"])
	found := false
	for _, f := range finalizers {
		found = found || object.Str(f) == JobTrackingFinalizer
	}
	if !found {
		meta["finalizers"] = append(finalizers, JobTrackingFinalizer)
	}
	return PodFromTemplate(template, object.Map(job["metadata"]), "batch/v1", "Job", "")
}

// PodFromTemplate is GetPodFromTemplate: the template's labels, annotations and finalizers,
// generateName "<parent>-" (or prefix when given), the controller reference, the template's
// spec, and the parent's namespace (createPods).
func PodFromTemplate(template object.Object, parent object.Object, apiVersion, kind, prefix string) object.Object {
	tmeta := object.Map(template["metadata"])
	if prefix == "" {
		prefix = object.Str(parent["name"]) + "-"
	}
	meta := object.Object{
		"generateName": prefix,
		"namespace":    parent["namespace"],
		"ownerReferences": []interface{}{object.Object{
			"apiVersion":         apiVersion,
			"kind":               kind,
			"name":               parent["name"],
			"uid":                parent["uid"],
			"controller":         true,
			"blockOwnerDeletion": true,
		}},
	}
	for _, key := range []string{"labels", "annotations", "finalizers"} {
		if v, ok := tmeta[key]; ok && v != nil {
			meta[key] = v
		}
	}
	spec := object.Map(template["spec"])
	if spec == nil {
		spec = object.Object{}
	}
	return object.Object{"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": object.Copy(spec)}
}
