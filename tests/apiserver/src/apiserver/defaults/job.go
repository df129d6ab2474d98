package defaults

import "apiserver/object"

// Job is SetObjectDefaults_Job (pkg/apis/batch/v1/defaults.go SetDefaults_Job, then the
// template's PodSpec defaults).
func Job(job object.Object) {
	spec := object.Child(job, "spec")
	_, hasCompletions := spec["completions"]
	_, hasParallelism := spec["parallelism"]
	if !hasCompletions && !hasParallelism {
		spec["completions"] = object.Num(1)
		spec["parallelism"] = object.Num(1)
	}
	object.SetDefault(spec, "parallelism", object.Num(1))
	if _, perIndex := spec["backoffLimitPerIndex"]; perIndex {
		object.SetDefault(spec, "backoffLimit", object.Num(2147483647))
	} else {
		object.SetDefault(spec, "backoffLimit", object.Num(6))
	}
	template := object.Child(spec, "template")
	if labels := object.Map(object.Get(template, "metadata", "labels")); labels != nil {
		meta := object.Child(job, "metadata")
		if len(object.Map(meta["labels"])) == 0 {
			copied := object.Object{}
			for k, v := range labels {
				copied[k] = v
			}
			meta["labels"] = copied
		}
	}
	object.SetDefault(spec, "completionMode", "NonIndexed")
	object.SetDefault(spec, "suspend", false)
	if _, ok := spec["podFailurePolicy"]; ok {
		object.SetDefault(spec, "podReplacementPolicy", "Failed")
	} else {
		object.SetDefault(spec, "podReplacementPolicy", "TerminatingOrFailed")
	}
	object.SetDefault(spec, "manualSelector", false)
	PodSpec(object.Child(template, "spec"))
}
