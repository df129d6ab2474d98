package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"

	"apiserver/admission"
	"apiserver/jobcontroller"
	"apiserver/object"
	"apiserver/webhookclient"
)

// mlRequest is one request of tests/ml_kinds.rs's export: an ML custom resource (docs/policy.md
// section 12) as the API server sends it to validate-controllers.modelgate.io, with the verdict
// of the installed matchConditions (evaluated as CEL) on whether the webhook is called, and the
// object's pod templates.
type mlRequest struct {
	Label     string         `json:"label"`
	Kind      admission.Kind `json:"kind"`
	Operation string         `json:"operation"`
	Object    object.Object  `json:"object"`
	OldObject object.Object  `json:"oldObject"`
	Namespace string         `json:"namespace"`
	Called    bool           `json:"called"`
	Templates []struct {
		Path     string        `json:"path"`
		Template object.Object `json:"template"`
		Partial  bool          `json:"partial"`
	} `json:"templates"`
}

// mlCounts is what the scenario did, for its summary line.
type mlCounts struct {
	requests, sent, keptOut, refused, pods int
}

// mlKinds sends the ML custom resources as the API server would: each request the
// matchConditions let through goes to /validate with kube-apiserver's webhook client (a
// validating webhook: no patch allowed), the others are admitted without a call. The pods the
// kind's controller would make from each complete template (GetPodFromTemplate) go through the
// whole admission chain (harness.admit). Then, per request: a resource whose pods would all be
// admitted must not be refused, and one with a pod that would be refused must be (a complete
// template is judged as its pod); a partial template's findings are never a refusal.
func (h *harness) mlKinds(path string) (mlCounts, error) {
	var counts mlCounts
	data, err := os.ReadFile(path)
	if err != nil {
		return counts, fmt.Errorf("%v (tests/ml_kinds.rs writes it: run cargo test first)", err)
	}
	var requests []mlRequest
	if err := json.Unmarshal(data, &requests); err != nil {
		return counts, fmt.Errorf("%s: %v", path, err)
	}
	for _, r := range requests {
		counts.requests++
		c := testCase{Name: r.Label, Group: "ml-kinds", Kind: r.Kind, Object: r.Object, Namespace: r.Namespace, User: admission.Admin}
		if !r.Called {
			counts.keptOut++
			if r.Operation == "CREATE" {
				h.rep.fail(c, "ml-kept-out", "a CREATE was kept out by the matchConditions")
			}
			continue
		}
		counts.sent++
		var review object.Object
		if r.Operation == "UPDATE" {
			_, review = admission.NewUpdateReview(r.Kind, r.Object, r.OldObject, r.Namespace, admission.Admin)
		} else {
			_, review = admission.NewReview(r.Kind, r.Object, r.Namespace, admission.Admin)
		}
		answer, err := webhookclient.Call{URL: h.url + "/validate", Review: object.Encode(review)}.Do(context.Background(), h.client)
		if err != nil {
			h.rep.fail(c, "call", "/validate: %v", err)
			continue
		}
		decision := "unchanged"
		if !answer.Allowed {
			decision = "denied"
			counts.refused++
		}
		h.rep.decision(c, decision, message(answer))

		podDenied, complete := "", false
		parent := object.Object{"name": object.Str(object.Get(r.Object, "metadata", "name")), "namespace": r.Namespace, "uid": admission.NewUID()}
		for _, t := range r.Templates {
			if t.Partial {
				continue
			}
			complete = true
			pod := jobcontroller.PodFromTemplate(object.Copy(t.Template), parent, r.Kind.APIVersion(), r.Kind.Kind, "")
			pc := testCase{Name: r.Label + " → the Pod of " + t.Path, Group: "ml-pods", Kind: admission.PodKind,
				Object: pod, Namespace: r.Namespace, User: admission.ReplicaSetController}
			counts.pods++
			if out := h.admit(pc); out.decision == "denied" && podDenied == "" {
				podDenied = t.Path
			}
		}
		switch {
		case !answer.Allowed && podDenied == "":
			h.rep.fail(c, "ml-refused", "refused, but every pod of its templates would be admitted: %s", message(answer))
		case answer.Allowed && podDenied != "" && complete:
			h.rep.fail(c, "ml-admitted", "admitted, but the pod of %s would be refused", podDenied)
		}
	}
	if counts.sent == 0 || counts.keptOut == 0 || counts.refused == 0 || counts.pods == 0 {
		return counts, fmt.Errorf("%s: %d requests sent, %d kept out, %d refused, %d pods: each must happen", path, counts.sent, counts.keptOut, counts.refused, counts.pods)
	}
	return counts, nil
}
