package validation

import (
	"sort"
	"strings"

	"apiserver/object"
)

// totalAnnotationSizeLimit is apimachinery's TotalAnnotationSizeLimitB (256 KiB).
const totalAnnotationSizeLimit = 256 * 1024

// ObjectMeta is ValidateObjectMeta's checks for a namespaced object whose name is a DNS
// subdomain (Pods and Jobs): name or generateName, namespace, labels, annotations.
func ObjectMeta(meta object.Object, path string, errs *Errors) {
	if name := object.Str(meta["name"]); name != "" {
		errs.addAll(path+".name", name, IsDNS1123Subdomain(name))
	} else if object.Str(meta["generateName"]) == "" {
		errs.add(path+".name", "Required value: name or generateName is required")
	}
	if ns := object.Str(meta["namespace"]); ns != "" {
		errs.addAll(path+".namespace", ns, IsDNS1123Label(ns))
	}
	Labels(object.Map(meta["labels"]), path+".labels", errs)
	Annotations(object.Map(meta["annotations"]), path+".annotations", errs)
}

// Labels is ValidateLabels: each key a qualified name, each value a label value.
func Labels(labels object.Object, path string, errs *Errors) {
	for _, k := range sortedKeys(labels) {
		errs.addAll(path, k, IsQualifiedName(k))
		v, ok := labels[k].(string)
		if !ok {
			errs.add(path+"["+k+"]", "Invalid value: label values must be strings")
			continue
		}
		errs.addAll(path, v, IsValidLabelValue(v))
	}
}

// Annotations is ValidateAnnotations: keys are qualified names (checked lower-cased), and
// keys and values together stay within 256 KiB.
func Annotations(annotations object.Object, path string, errs *Errors) {
	total := 0
	for _, k := range sortedKeys(annotations) {
		errs.addAll(path, k, IsQualifiedName(strings.ToLower(k)))
		v, ok := annotations[k].(string)
		if !ok {
			errs.add(path+"["+k+"]", "Invalid value: annotation values must be strings")
		}
		total += len(k) + len(v)
	}
	if total > totalAnnotationSizeLimit {
		errs.add(path, "Too long: must have at most %d bytes", totalAnnotationSizeLimit)
	}
}

func sortedKeys(m object.Object) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
