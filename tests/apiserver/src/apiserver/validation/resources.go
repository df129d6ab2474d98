package validation

import (
	"fmt"
	"sort"
	"strings"

	"apiserver/object"
	"apiserver/quantity"
)

// Resources is ValidateContainerResourceRequirements: quantities parse and are not negative,
// a request is at most its limit, and a resource that cannot be overcommitted (extended
// resources such as nvidia.com/gpu, hugepages) has requests equal to limits and a limit.
func Resources(res object.Object, p string, errs *Errors) {
	limits, requests := object.Map(res["limits"]), object.Map(res["requests"])
	for _, name := range keys(limits) {
		q, err := quantity.Parse(limits[name])
		if err != nil {
			errs.add(p+".limits["+name+"]", "Invalid value: %q: %v", fmt.Sprint(limits[name]), err)
			continue
		}
		if q.Sign() < 0 {
			errs.add(p+".limits["+name+"]", "Invalid value: %q: must be greater than or equal to 0", fmt.Sprint(limits[name]))
		}
	}
	for _, name := range keys(requests) {
		rp := p + ".requests[" + name + "]"
		r, err := quantity.Parse(requests[name])
		if err != nil {
			errs.add(rp, "Invalid value: %q: %v", fmt.Sprint(requests[name]), err)
			continue
		}
		if r.Sign() < 0 {
			errs.add(rp, "Invalid value: %q: must be greater than or equal to 0", fmt.Sprint(requests[name]))
		}
		lv, hasLimit := limits[name]
		if !hasLimit {
			if !overcommitAllowed(name) {
				errs.add(p+".limits", "Required value: Limit must be set for non overcommitable resources")
			}
			continue
		}
		l, err := quantity.Parse(lv)
		if err != nil {
			continue
		}
		if overcommitAllowed(name) {
			if r.Cmp(l) > 0 {
				errs.add(rp, "Invalid value: %q: must be less than or equal to %s limit of %s", fmt.Sprint(requests[name]), name, fmt.Sprint(lv))
			}
		} else if r.Cmp(l) != 0 {
			errs.add(rp, "Invalid value: %q: must be equal to %s limit of %s", fmt.Sprint(requests[name]), name, fmt.Sprint(lv))
		}
	}
}

// overcommitAllowed is helper.IsOvercommitAllowed: native resources except hugepages.
func overcommitAllowed(name string) bool {
	native := !strings.Contains(name, "/") || strings.Contains(name, "kubernetes.io/")
	return native && !strings.HasPrefix(name, "hugepages-")
}

func keys(m object.Object) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
