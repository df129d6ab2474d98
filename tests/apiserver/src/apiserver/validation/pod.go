package validation

import (
	"fmt"

	"apiserver/object"
)

// Pod is ValidatePodCreate's checks on the fields listed in the package comment.
func Pod(pod object.Object) Errors {
	var errs Errors
	ObjectMeta(object.Map(pod["metadata"]), "metadata", &errs)
	PodSpec(object.Map(pod["spec"]), "spec", false, &errs)
	return errs
}

// PodSpec is ValidatePodSpec's subset. A template (Job) may leave restartPolicy to the Job's
// own rule (Never or OnFailure), checked by the caller.
func PodSpec(spec object.Object, path string, template bool, errs *Errors) {
	if spec == nil {
		errs.add(path, "Required value")
		return
	}
	volumes := Volumes(object.Maps(spec["volumes"]), path+".volumes", errs)
	names := map[string]bool{}
	for _, key := range []string{"initContainers", "containers", "ephemeralContainers"} {
		list := object.Maps(spec[key])
		if key == "containers" && len(list) == 0 {
			errs.add(path+".containers", "Required value")
		}
		for i, c := range list {
			cpath := fmt.Sprintf("%s.%s[%d]", path, key, i)
			name := object.Str(c["name"])
			errs.addAll(cpath+".name", name, IsDNS1123Label(name))
			if names[name] {
				errs.add(cpath+".name", "Duplicate value: %q", name)
			}
			names[name] = true
			if object.Str(c["image"]) == "" {
				errs.add(cpath+".image", "Required value")
			}
			VolumeMounts(object.Maps(c["volumeMounts"]), volumes, cpath+".volumeMounts", errs)
			Resources(object.Map(c["resources"]), cpath+".resources", errs)
			ContainerSecurityContext(object.Map(c["securityContext"]), cpath+".securityContext", errs)
		}
	}
	PodSecurityContext(object.Map(spec["securityContext"]), path+".securityContext", errs)
	Affinity(object.Map(spec["affinity"]), path+".affinity", errs)
	Labels(object.Map(spec["nodeSelector"]), path+".nodeSelector", errs)
	Tolerations(object.Maps(spec["tolerations"]), path+".tolerations", errs)
	if !template {
		switch p := object.Str(spec["restartPolicy"]); p {
		case "Always", "OnFailure", "Never":
		default:
			errs.add(path+".restartPolicy", "Unsupported value: %q", p)
		}
	}
}

// Tolerations is validateTolerations' key, operator and effect rules.
func Tolerations(tolerations []object.Object, path string, errs *Errors) {
	for i, t := range tolerations {
		p := fmt.Sprintf("%s[%d]", path, i)
		key := object.Str(t["key"])
		if key != "" {
			errs.addAll(p+".key", key, IsQualifiedName(key))
		}
		op := object.Str(t["operator"])
		if key == "" && op != "Exists" {
			errs.add(p+".operator", "Invalid value: %q: operator must be Exists when `key` is empty, which means \"match all values and all keys\"", op)
		}
		if _, ok := t["tolerationSeconds"]; ok && object.Str(t["effect"]) != "NoExecute" {
			errs.add(p+".effect", "Invalid value: %q: effect must be 'NoExecute' when `tolerationSeconds` is set", object.Str(t["effect"]))
		}
		switch op {
		case "", "Equal":
			errs.addAll(p+".value", t["value"], IsValidLabelValue(object.Str(t["value"])))
		case "Exists":
			if object.Str(t["value"]) != "" {
				errs.add(p+".operator", "Invalid value: value must be empty when `operator` is 'Exists'")
			}
		default:
			errs.add(p+".operator", "Unsupported value: %q", op)
		}
	}
}
