package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"apiserver/admission"
	"apiserver/object"
	"apiserver/webhookclient"
)

// backstopSuffix ends every message of the backstop (docs/policy.md section 13).
const backstopSuffix = "(modelgate backstop: the webhook did not set this)"

// outageCounts is what the outage scenario did, for its summary line.
type outageCounts struct {
	created, refused, disagreed int
	// invalid: refused by the API server's validation (in BeforeCreate, before any
	// validating admission), whatever the backstop says.
	invalid int
	// refusedValidateAdmits: refused by the backstop, though /validate admits the object as it
	// is (stricter than the webhook, which would have patched it first).
	refusedValidateAdmits int
}

// outage is the scenario of an outage with the backstop installed: modelgate is stopped, its
// webhooks have failurePolicy Ignore (the chart's default with the backstop on), and the
// ValidatingAdmissionPolicy decides. Each object of the run, as the API server holds it
// unmutated (decoded with defaults, the built-in plugins run, BeforeCreate: the roleOutage
// cases), was sent to /validate while modelgate ran; kube-apiserver's CEL in every version
// evaluated the backstop on it (evaluateBackstop). Here each call must fail through
// kube-apiserver's client (nothing answers), so the dispatcher lets the object through
// unmutated; then every version must give the same decision, never an evaluation error: ADMIT
// or NOT MATCHED creates the object, which /validate must admit; a `validation i DENY` refuses
// it with the backstop's message.
func outage(url string, caPEM []byte, rep *report, cases []*celCase) outageCounts {
	var n outageCounts
	client := webhookclient.New(caPEM, "localhost")
	for _, c := range cases {
		if c.role != roleOutage {
			continue
		}
		_, review := admission.NewReview(c.tc.Kind, c.object, c.tc.Namespace, c.tc.User)
		for _, path := range []string{"/mutate", "/validate"} {
			call := webhookclient.Call{URL: url + path, Review: object.Encode(review), Mutating: path == "/mutate", Timeout: 2 * time.Second}
			if _, err := call.Do(context.Background(), client); err == nil {
				rep.fail(c.tc, "outage", "%s answered while modelgate is stopped", path)
			}
			// failurePolicy Ignore: the dispatcher logs the failed call and admits the object as it is.
		}
		created := func(how string) {
			n.created++
			if !c.validateAllowed {
				rep.fail(c.tc, "outage", "created during the outage (%s), but /validate denies it: %s", how, c.validateMessage)
			}
		}
		switch c.skip {
		case skipInvalid:
			n.invalid++
			continue
		case skipNotBound:
			created("the binding does not select it")
			continue
		}
		first, agree := "", true
		var all, evalErrors []string
		for i, v := range celVersions {
			lines := c.decisions[v.label]
			joined := strings.Join(lines, "\n")
			if i == 0 {
				first = joined
			} else if joined != first {
				agree = false
			}
			for _, l := range lines {
				all = append(all, v.label+": "+l)
				if class, _ := classify(l); class == decError {
					evalErrors = append(evalErrors, v.label+": "+l)
				}
			}
		}
		if len(all) == 0 {
			continue // no decision at all: reported by evaluateBackstop
		}
		if len(evalErrors) > 0 {
			rep.fail(c.tc, "outage", "the backstop failed to evaluate (it must never deny by error) (case %s):\n%s", c.file, strings.Join(groupVersions(evalErrors), "\n"))
		}
		if !agree {
			n.disagreed++
			rep.fail(c.tc, "outage", "the versions of kube-apiserver disagree (case %s):\n%s", c.file, strings.Join(groupVersions(all), "\n"))
			continue
		}
		lines := c.decisions[celVersions[0].label]
		switch verdict(lines) {
		case decAdmit:
			created("ADMIT")
		case decNotMatched:
			created("NOT MATCHED")
		case decDeny:
			n.refused++
			if c.validateAllowed {
				n.refusedValidateAdmits++
			}
			for _, l := range lines {
				if class, msg := classify(l); class == decDeny && !strings.HasSuffix(strings.TrimSpace(msg), backstopSuffix) {
					rep.fail(c.tc, "outage", "refused without the backstop's message (case %s): %s", c.file, l)
				}
			}
		}
	}
	if n.created == 0 || n.refused == 0 {
		rep.fail(testCase{Name: "outage"}, "outage", "%d created and %d refused: both must happen over the corpus", n.created, n.refused)
	}
	return n
}

func (n outageCounts) String() string {
	return fmt.Sprintf("%d created, %d refused by the backstop (%d of them admitted by /validate as they are), %d on which the versions disagree; %d refused by the API server's validation before admission policies run",
		n.created, n.refused, n.refusedValidateAdmits, n.disagreed, n.invalid)
}
