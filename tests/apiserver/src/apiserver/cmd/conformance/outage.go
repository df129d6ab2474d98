package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"

	"apiserver/admission"
	"apiserver/object"
	"apiserver/webhookclient"
)

// backstopSuffix ends every message of the backstop (SPEC.md section 13).
const backstopSuffix = "(modelgate backstop: the webhook did not set this)"

// outageCase is one object of tests/backstop.rs's export: the backstop's verdict on it as it
// comes (nothing mutated it), and whether /validate admits it as it comes.
type outageCase struct {
	Label           string         `json:"label"`
	Kind            admission.Kind `json:"kind"`
	Object          object.Object  `json:"object"`
	Backstop        string         `json:"backstop"` // admit, deny or not-matched
	Message         string         `json:"message"`
	ValidateAllowed bool           `json:"validateAllowed"`
}

// outage is the scenario of an outage with the backstop installed: modelgate is stopped, its
// webhooks have failurePolicy Ignore (the chart's default with the backstop on), and the
// ValidatingAdmissionPolicy decides, with the verdicts of the Rust evaluator for the same
// objects. Each call must fail through kube-apiserver's client (nothing answers), so the
// dispatcher lets the object through unmutated; then compliant objects are created,
// non-compliant ones refused with the backstop's message, and none is created that /validate
// would have denied. It returns the failures, and how many were created and refused.
func outage(url string, caPEM []byte, verdicts string) (failures []string, created, refused int, err error) {
	data, err := os.ReadFile(verdicts)
	if err != nil {
		return nil, 0, 0, fmt.Errorf("%v (tests/backstop.rs writes it: run cargo test first)", err)
	}
	var cases []outageCase
	if err := json.Unmarshal(data, &cases); err != nil {
		return nil, 0, 0, fmt.Errorf("%s: %v", verdicts, err)
	}
	client := webhookclient.New(caPEM, "localhost")
	for _, c := range cases {
		_, review := admission.NewReview(c.Kind, c.Object, "team-a", admission.Admin)
		for _, path := range []string{"/mutate", "/validate"} {
			call := webhookclient.Call{URL: url + path, Review: object.Encode(review), Mutating: path == "/mutate", Timeout: 2 * time.Second}
			if _, err := call.Do(context.Background(), client); err == nil {
				failures = append(failures, fmt.Sprintf("%s: %s answered while modelgate is stopped", c.Label, path))
			}
			// failurePolicy Ignore: the dispatcher logs the failed call and admits the object as it is.
		}
		switch c.Backstop {
		case "deny":
			refused++
			if !strings.HasSuffix(strings.TrimSpace(c.Message), backstopSuffix) {
				failures = append(failures, fmt.Sprintf("%s: refused without the backstop's message: %q", c.Label, c.Message))
			}
		case "admit", "not-matched":
			created++
			if !c.ValidateAllowed {
				failures = append(failures, fmt.Sprintf("%s: created during the outage, but /validate denies it", c.Label))
			}
		default:
			failures = append(failures, fmt.Sprintf("%s: unknown verdict %q", c.Label, c.Backstop))
		}
	}
	if created == 0 || refused == 0 {
		failures = append(failures, fmt.Sprintf("%d created and %d refused: both must happen over the corpus", created, refused))
	}
	return failures, created, refused, nil
}
