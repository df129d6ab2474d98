// Package validation is the subset of kube-apiserver's Pod and Job validation
// (k8s.io/kubernetes pkg/apis/core/validation/validation.go, apimachinery's
// pkg/util/validation and pkg/apis/meta/v1/validation) that covers every field modelgate
// writes: metadata labels and annotations, node affinity, volumes and mounts, resources,
// security contexts. Messages follow upstream's, prefixed with the field path.
package validation

import (
	"fmt"
	"regexp"
	"strings"
)

// apimachinery/pkg/util/validation/validation.go
var (
	dns1123Label     = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	dns1123Subdomain = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
	qualifiedName    = regexp.MustCompile(`^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$`)
	labelValue       = regexp.MustCompile(`^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$`)
)

// IsDNS1123Label: at most 63 characters of [a-z0-9-], alphanumeric at both ends.
func IsDNS1123Label(v string) []string {
	var errs []string
	if len(v) > 63 {
		errs = append(errs, "must be no more than 63 characters")
	}
	if !dns1123Label.MatchString(v) {
		errs = append(errs, "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character")
	}
	return errs
}

// IsDNS1123Subdomain: at most 253 characters, dot-separated labels.
func IsDNS1123Subdomain(v string) []string {
	var errs []string
	if len(v) > 253 {
		errs = append(errs, "must be no more than 253 characters")
	}
	if !dns1123Subdomain.MatchString(v) {
		errs = append(errs, "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character")
	}
	return errs
}

// IsQualifiedName: an optional DNS subdomain prefix and '/', then a name of at most 63.
func IsQualifiedName(v string) []string {
	var errs []string
	parts := strings.Split(v, "/")
	name := parts[0]
	switch len(parts) {
	case 1:
	case 2:
		prefix := parts[0]
		name = parts[1]
		if prefix == "" {
			errs = append(errs, "prefix part must be non-empty")
		} else {
			for _, msg := range IsDNS1123Subdomain(prefix) {
				errs = append(errs, "prefix part "+msg)
			}
		}
	default:
		return append(errs, "a qualified name must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character with an optional DNS subdomain prefix and '/'")
	}
	if name == "" {
		errs = append(errs, "name part must be non-empty")
	} else if len(name) > 63 {
		errs = append(errs, "name part must be no more than 63 characters")
	}
	if name != "" && !qualifiedName.MatchString(name) {
		errs = append(errs, "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character")
	}
	return errs
}

// IsValidLabelValue: empty, or at most 63 characters, alphanumeric at both ends.
func IsValidLabelValue(v string) []string {
	var errs []string
	if len(v) > 63 {
		errs = append(errs, "must be no more than 63 characters")
	}
	if !labelValue.MatchString(v) {
		errs = append(errs, "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character")
	}
	return errs
}

// Errors collects "path: message" lines.
type Errors []string

func (e *Errors) add(path, format string, args ...interface{}) {
	*e = append(*e, path+": "+fmt.Sprintf(format, args...))
}

func (e *Errors) addAll(path string, value interface{}, msgs []string) {
	for _, m := range msgs {
		e.add(path, "Invalid value: %q: %s", fmt.Sprint(value), m)
	}
}
