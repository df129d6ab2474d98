package main

import (
	"fmt"
	"io"
	"sort"
	"strings"
)

// failureKinds, in report order, with what each means.
var failureKinds = []struct{ kind, meaning string }{
	{"call", "the call failed or its answer failed VerifyAdmissionResponse (the API server would fail the admission)"},
	{"patch", "the patch did not decode or apply with evanphx/json-patch"},
	{"expectation", "a generated object did not get the outcome it was built for (a hit, a miss, Guaranteed)"},
	{"second-round", "after the API server re-ran its plugins, /mutate patched again (docs/policy.md §4: no second round)"},
	{"validate-denied", "/validate denied an object /mutate had allowed and patched"},
	{"apiserver-validation", "the patched object fails the API server's validation (an error the input did not have)"},
	{"qos", "a Guaranteed pod is no longer Guaranteed after the patch"},
	{"job-pod-decision", "the Pod the Job controller makes got another decision than its Job"},
	{"job-pod-patched", "the Pod of a patched Job was patched again beyond its model routing"},
	{"ml-kept-out", "the matchConditions kept the CREATE of an ML custom resource out of modelgate"},
	{"ml-refused", "an ML custom resource was refused although every pod of its templates would be admitted"},
	{"ml-admitted", "an ML custom resource was admitted although the pod of a complete template would be refused"},
	{"backstop-kube-cel", "kube-apiserver's CEL (kube-cel) did not compile the backstop, failed, or gave no decision for a request"},
	{"backstop-admitted", "the backstop (kube-apiserver's CEL, some version) did not ADMIT an object modelgate admitted, as stored"},
	{"backstop-istio", "the same, for the Pod with another webhook's init container (istio-validation) at initContainers[0]"},
	{"outage", "outage (modelgate stopped): the backstop erred or the versions disagreed, refused without its message, created what /validate denies, or a webhook answered"},
}

type report struct {
	cases     map[string]int            // by group
	decisions map[string]map[string]int // group → decision → count
	failures  map[string][]string       // kind → "case: detail"
	verbose   io.Writer
}

func newReport(verbose io.Writer) *report {
	return &report{cases: map[string]int{}, decisions: map[string]map[string]int{}, failures: map[string][]string{}, verbose: verbose}
}

func (r *report) decision(c testCase, decision, msg string) {
	r.cases[c.Group]++
	if r.decisions[c.Group] == nil {
		r.decisions[c.Group] = map[string]int{}
	}
	r.decisions[c.Group][decision]++
	if r.verbose != nil {
		fmt.Fprintf(r.verbose, "%-9s %s %s\n", decision, c.Name, msg)
	}
}

func (r *report) fail(c testCase, kind, format string, args ...interface{}) {
	detail := fmt.Sprintf(format, args...)
	r.failures[kind] = append(r.failures[kind], c.Name+": "+detail)
}

func (r *report) failed() int {
	n := 0
	for _, f := range r.failures {
		n += len(f)
	}
	return n
}

// print writes every failure, then the summary: objects by source and decision, and the
// count of each kind of failure.
func (r *report) print(w io.Writer) {
	for _, k := range failureKinds {
		for _, f := range r.failures[k.kind] {
			fmt.Fprintf(w, "FAIL [%s] %s\n", k.kind, strings.ReplaceAll(f, "\n", "\n    "))
		}
	}
	fmt.Fprintf(w, "\nkube-apiserver conformance (objects through the API server's admission chain):\n")
	groups := make([]string, 0, len(r.cases))
	for g := range r.cases {
		groups = append(groups, g)
	}
	sort.Strings(groups)
	total := 0
	for _, g := range groups {
		d := r.decisions[g]
		fmt.Fprintf(w, "  %-10s %4d objects: %d patched, %d unchanged, %d denied\n", g, r.cases[g], d["patched"], d["unchanged"], d["denied"])
		total += r.cases[g]
	}
	fmt.Fprintf(w, "  %-10s %4d objects\n", "total", total)
	fmt.Fprintf(w, "failures by kind:\n")
	for _, k := range failureKinds {
		fmt.Fprintf(w, "  %-21s %4d  %s\n", k.kind, len(r.failures[k.kind]), k.meaning)
	}
}
