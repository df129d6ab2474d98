package validation

import (
	"fmt"
	"strconv"

	"apiserver/object"
)

// Affinity is validateAffinity's node affinity part (ValidateNodeSelector,
// ValidateNodeSelectorTerm, ValidateNodeSelectorRequirement, validateNodeFieldSelectorRequirement,
// ValidatePreferredSchedulingTerms).
func Affinity(affinity object.Object, path string, errs *Errors) {
	na := object.Map(affinity["nodeAffinity"])
	if na == nil {
		return
	}
	path += ".nodeAffinity"
	if req := object.Map(na["requiredDuringSchedulingIgnoredDuringExecution"]); req != nil {
		p := path + ".requiredDuringSchedulingIgnoredDuringExecution"
		terms := object.Slice(req["nodeSelectorTerms"])
		if len(terms) == 0 {
			errs.add(p+".nodeSelectorTerms", "Required value: must have at least one node selector term")
		}
		for i, t := range terms {
			nodeSelectorTerm(object.Map(t), fmt.Sprintf("%s.nodeSelectorTerms[%d]", p, i), errs)
		}
	}
	for i, t := range object.Maps(na["preferredDuringSchedulingIgnoredDuringExecution"]) {
		p := fmt.Sprintf("%s.preferredDuringSchedulingIgnoredDuringExecution[%d]", path, i)
		if w, _ := object.Int(t["weight"]); w <= 0 || w > 100 {
			errs.add(p+".weight", "Invalid value: %v: must be in the range 1-100", t["weight"])
		}
		nodeSelectorTerm(object.Map(t["preference"]), p+".preference", errs)
	}
}

func nodeSelectorTerm(term object.Object, path string, errs *Errors) {
	for j, r := range object.Maps(term["matchExpressions"]) {
		nodeSelectorRequirement(r, fmt.Sprintf("%s.matchExpressions[%d]", path, j), errs)
	}
	for j, r := range object.Maps(term["matchFields"]) {
		nodeFieldSelectorRequirement(r, fmt.Sprintf("%s.matchFields[%d]", path, j), errs)
	}
}

func nodeSelectorRequirement(r object.Object, path string, errs *Errors) {
	values := object.Slice(r["values"])
	switch op := object.Str(r["operator"]); op {
	case "In", "NotIn":
		if len(values) == 0 {
			errs.add(path+".values", "Required value: must be specified when `operator` is 'In' or 'NotIn'")
		}
	case "Exists", "DoesNotExist":
		if len(values) > 0 {
			errs.add(path+".values", "Forbidden: may not be specified when `operator` is 'Exists' or 'DoesNotExist'")
		}
	case "Gt", "Lt":
		if len(values) != 1 {
			errs.add(path+".values", "Required value: must be specified single value when `operator` is 'Lt' or 'Gt'")
		} else if _, err := strconv.ParseInt(object.Str(values[0]), 10, 64); err != nil {
			errs.add(path+".values[0]", "Invalid value: %q: must be an integer", object.Str(values[0]))
		}
	default:
		errs.add(path+".operator", "Invalid value: %q: not a valid selector operator", op)
	}
	key := object.Str(r["key"])
	errs.addAll(path+".key", key, IsQualifiedName(key))
}

func nodeFieldSelectorRequirement(r object.Object, path string, errs *Errors) {
	values := object.Slice(r["values"])
	switch op := object.Str(r["operator"]); op {
	case "In", "NotIn":
		if len(values) != 1 {
			errs.add(path+".values", "Required value: must be only one value when `operator` is 'In' or 'NotIn' for node field selector")
		}
	default:
		errs.add(path+".operator", "Invalid value: %q: not a valid selector operator", op)
	}
	if key := object.Str(r["key"]); key != "metadata.name" {
		errs.add(path+".key", "Invalid value: %q: not a valid field selector key", key)
		return
	}
	for i, v := range values {
		errs.addAll(fmt.Sprintf("%s.values[%d]", path, i), v, IsDNS1123Subdomain(object.Str(v)))
	}
}
