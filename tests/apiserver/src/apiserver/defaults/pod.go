package defaults

import "apiserver/object"

// Pod is SetObjectDefaults_Pod: SetDefaults_Pod (requests defaulted from limits in every
// container and init container, enableServiceLinks) and the PodSpec defaults. Only Pods get
// SetDefaults_Pod; a Job's template gets the PodSpec defaults alone.
func Pod(pod object.Object) {
	spec := object.Child(pod, "spec")
	for _, key := range []string{"containers", "initContainers"} {
		for _, c := range object.Maps(spec[key]) {
			RequestsFromLimits(c)
		}
	}
	object.SetDefault(spec, "enableServiceLinks", true)
	PodSpec(spec)
}

// RequestsFromLimits: "If limits are specified, but requests are not, default requests to
// limits" (SetDefaults_Pod).
func RequestsFromLimits(c object.Object) {
	res := object.Map(c["resources"])
	limits := object.Map(res["limits"])
	if limits == nil {
		return
	}
	requests := object.Child(res, "requests")
	for k, v := range limits {
		object.SetDefault(requests, k, v)
	}
}
