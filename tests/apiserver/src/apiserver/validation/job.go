package validation

import (
	"apiserver/object"
)

// Job is ValidateJob's subset: metadata, the template's metadata and PodSpec, the template's
// restartPolicy (OnFailure or Never), and the selector matching the template's labels (after
// the Job strategy generated them).
func Job(job object.Object) Errors {
	var errs Errors
	ObjectMeta(object.Map(job["metadata"]), "metadata", &errs)
	spec := object.Map(job["spec"])
	template := object.Map(spec["template"])
	tmeta := object.Map(template["metadata"])
	Labels(object.Map(tmeta["labels"]), "spec.template.metadata.labels", &errs)
	Annotations(object.Map(tmeta["annotations"]), "spec.template.metadata.annotations", &errs)
	tspec := object.Map(template["spec"])
	PodSpec(tspec, "spec.template.spec", true, &errs)
	switch p := object.Str(tspec["restartPolicy"]); p {
	case "OnFailure", "Never":
	default:
		errs.add("spec.template.spec.restartPolicy", "Unsupported value: %q: supported values: \"OnFailure\", \"Never\"", p)
	}
	labels := object.Map(tmeta["labels"])
	for k, v := range object.Map(object.Get(spec, "selector", "matchLabels")) {
		if labels[k] != v {
			errs.add("spec.template.metadata.labels", "Invalid value: `selector` does not match template `labels`")
			break
		}
	}
	return errs
}
