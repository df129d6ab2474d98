package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"

	jsonpatch "github.com/evanphx/json-patch"

	"apiserver/admission"
	"apiserver/defaults"
	"apiserver/jobcontroller"
	"apiserver/object"
	"apiserver/qos"
	"apiserver/validation"
	"apiserver/webhookclient"
)

// harness calls one modelgate as kube-apiserver does and records what it finds.
type harness struct {
	client *http.Client
	url    string
	outDir string
	rep    *report
	seq    int
	// cel: every request for the backstop to judge with kube-apiserver's CEL (backstop.go).
	cel []*celCase
}

// outcome of one object's admission.
type outcome struct {
	decision string        // "patched", "unchanged", "denied" or "" (the call failed)
	ops      []string      // the first round's patch operations
	stored   object.Object // the object as stored (after BeforeCreate), when admitted
	input    object.Object // the object as the webhook first saw it, after BeforeCreate
}

// admit is one CREATE through the API server's admission chain:
//  1. the object as the API server hands it to the webhooks (decoded with defaults, the
//     built-in mutating plugins run);
//  2. POST /mutate, the answer verified (VerifyAdmissionResponse), the patch applied with
//     evanphx/json-patch and the result defaulted (dispatcher.go callAttrMutatingHook);
//  3. the built-in plugins re-run after the webhook's change (admission/reinvocation.go), then
//     /mutate again with the result: docs/policy.md §4 wants no second round, so its patch must be empty;
//  4. BeforeCreate, then POST /validate: must allow;
//  5. the API server's validation (apiserver/validation): no error the input did not have;
//     and a Guaranteed pod stays Guaranteed;
//  6. for the backstop (backstop.go): the object as stored when both webhooks admit it (a Pod
//     also with another webhook's init container first), and for the outage (outage.go) the
//     object unmutated, with what /validate says of it as it is.
func (h *harness) admit(c testCase) outcome {
	obj := object.Copy(c.Object)
	admission.Prepare(c.Kind, obj, c.Namespace, c.User)
	if c.Kind == admission.PodKind {
		defaults.Pod(obj)
		defaults.AdmitPod(obj)
	} else {
		defaults.Job(obj)
	}
	input := object.Copy(obj)
	admission.BeforeCreate(c.Kind, input, podQoS(c.Kind, input))
	inputErrs := validate(c.Kind, input)
	out := outcome{input: input}
	// The outage's input: the object as the validating admission sees it when the mutating
	// webhook does not answer (failurePolicy Ignore), and /validate's word on it, asked now
	// that modelgate runs.
	if v, err := h.call(c, "/validate", input, false); err != nil {
		h.rep.fail(c, "call", "/validate of the unmutated object (the outage's input): %v", err)
	} else {
		oc := h.record(c, roleOutage, input)
		oc.validateAllowed, oc.validateMessage = v.Allowed, message(v)
	}

	first, err := h.call(c, "/mutate", obj, true)
	if err != nil {
		h.rep.fail(c, "call", "/mutate: %v", err)
		return out
	}
	if !first.Allowed {
		out.decision = "denied"
		h.rep.decision(c, out.decision, message(first))
		return out
	}
	patched, _, err := admission.ApplyPatch(obj, first.Patch)
	if err != nil {
		h.rep.fail(c, "patch", "%v", err)
		return out
	}
	out.ops = operations(first.Patch, obj)
	admission.Default(c.Kind, patched)
	out.decision = "unchanged"
	if !reflect.DeepEqual(obj, patched) {
		out.decision = "patched"
	}
	h.rep.decision(c, out.decision, "")
	if c.ExpectCache != "" && c.Kind == admission.JobKind {
		// A Job's template is not routed: its pods are, each when it is created (jobPods).
		if got := cacheAnnotation(c.Kind, patched); got != "" {
			h.rep.fail(c, "expectation", "a Job's template was routed: modelgate.io/model-cache is %q", got)
		}
	} else if c.ExpectCache != "" {
		if got := cacheAnnotation(c.Kind, patched); got != c.ExpectCache {
			h.rep.fail(c, "expectation", "modelgate.io/model-cache is %q, expected %q (%s)", got, c.ExpectCache,
				object.Str(annotations(c.Kind, patched)["modelgate.io/model-cache-reason"]))
		}
	}

	if c.Kind == admission.PodKind {
		defaults.AdmitPod(patched)
	}
	second, err := h.call(c, "/mutate", patched, true)
	switch {
	case err != nil:
		h.rep.fail(c, "call", "/mutate (second round): %v", err)
	case !second.Allowed:
		h.rep.fail(c, "second-round", "the second /mutate denied: %s", message(second))
	default:
		if ops := operations(second.Patch, patched); len(ops) > 0 {
			h.rep.fail(c, "second-round", "the second /mutate (after the API server's plugins re-ran) patched:\n%s", strings.Join(ops, "\n"))
		}
	}

	stored := object.Copy(patched)
	admission.BeforeCreate(c.Kind, stored, podQoS(c.Kind, stored))
	out.stored = stored
	if v, err := h.call(c, "/validate", stored, false); err != nil {
		h.rep.fail(c, "call", "/validate: %v", err)
	} else if !v.Allowed {
		h.rep.fail(c, "validate-denied", "%s", message(v))
	} else {
		h.record(c, roleAdmitted, stored)
		if c.Kind == admission.PodKind {
			h.record(c, roleIstio, withIstioInit(stored))
		}
	}
	known := map[string]bool{}
	for _, e := range inputErrs {
		known[e] = true
	}
	var introduced []string
	for _, e := range validate(c.Kind, stored) {
		if !known[e] {
			introduced = append(introduced, e)
		}
	}
	if len(introduced) > 0 {
		h.rep.fail(c, "apiserver-validation", "%s", strings.Join(introduced, "\n"))
	}
	// pkg/apis/core/v1/helper/qos: a pod built Guaranteed (or a Job's pod), or one that was
	// Guaranteed before the patch, must be Guaranteed as stored.
	if before, after := podQoS(c.Kind, input), podQoS(c.Kind, stored); (c.Guaranteed || before == "Guaranteed") && after != "Guaranteed" {
		h.rep.fail(c, "qos", "the QoS class is %s after the patch (before: %s)", after, before)
	}
	h.write(c, input, stored)
	return out
}

// call sends obj to path and verifies the answer as the API server does.
func (h *harness) call(c testCase, path string, obj object.Object, mutating bool) (*webhookclient.Response, error) {
	_, review := admission.NewReview(c.Kind, obj, c.Namespace, c.User)
	return webhookclient.Call{URL: h.url + path, Review: object.Encode(review), Mutating: mutating}.Do(context.Background(), h.client)
}

// jobPods is step 8: the Pod the Job controller makes from the stored Job goes through the
// same admission and must get the same decision, and (the Job having been patched as its pods
// will be) no patch.
func (h *harness) jobPods(c testCase, job outcome) {
	source := job.stored
	if job.decision == "denied" {
		source = job.input
	}
	if source == nil {
		return
	}
	pc := testCase{Name: c.Name + " → its Pod", Group: "job-pods", Kind: admission.PodKind,
		Object: jobcontroller.PodForJob(source), Namespace: c.Namespace, User: admission.JobController, Guaranteed: c.Guaranteed,
		ExpectCache: c.ExpectCache}
	pod := h.admit(pc)
	if pod.decision == "" {
		return
	}
	if (pod.decision == "denied") != (job.decision == "denied") {
		h.rep.fail(pc, "job-pod-decision", "the Job was %s, its Pod %s", job.decision, pod.decision)
	}
	// The Pod of a patched Job needs nothing more than its model's routing (a template is not
	// routed): no security context and no init container is patched again.
	for _, op := range pod.ops {
		if strings.Contains(op, "securityContext") || strings.Contains(op, "/initContainers") {
			h.rep.fail(pc, "job-pod-patched", "the Pod of a patched Job was patched again:\n%s", strings.Join(pod.ops, "\n"))
			break
		}
	}
}

func validate(kind admission.Kind, obj object.Object) []string {
	if kind == admission.PodKind {
		return validation.Pod(obj)
	}
	return validation.Job(obj)
}

// podQoS is the QoS class of the object's pods: a Pod's own, a Job's template's as its pods
// will have it (SetDefaults_Pod defaults requests from limits there).
func podQoS(kind admission.Kind, obj object.Object) string {
	if kind == admission.PodKind {
		return qos.Pod(obj)
	}
	pod := object.Object{"spec": object.Copy(object.Map(object.Get(obj, "spec", "template", "spec")))}
	defaults.Pod(pod)
	return qos.Pod(pod)
}

func annotations(kind admission.Kind, obj object.Object) object.Object {
	if kind == admission.JobKind {
		return object.Map(object.Get(obj, "spec", "template", "metadata", "annotations"))
	}
	return object.Map(object.Get(obj, "metadata", "annotations"))
}

func cacheAnnotation(kind admission.Kind, obj object.Object) string {
	return object.Str(annotations(kind, obj)["modelgate.io/model-cache"])
}

// operations decodes a patch (evanphx/json-patch) into lines, one per operation; an operation
// that replaces a value of obj is shown as what it changes in that value.
func operations(patch []byte, obj object.Object) []string {
	if len(patch) == 0 {
		return nil
	}
	ops, err := jsonpatch.DecodePatch(patch)
	if err != nil {
		return []string{"undecodable patch: " + err.Error()}
	}
	var lines []string
	for _, op := range ops {
		path, _ := op.Path()
		line := "  " + op.Kind() + " " + path
		var value interface{}
		if v, ok := op["value"]; ok && v != nil {
			if err := json.Unmarshal(*v, &value); err != nil {
				value = string(*v)
			}
		}
		if old, found := pointer(obj, path); found && op.Kind() == "replace" {
			lines = append(lines, line+" changes:")
			for _, d := range diff(path, old, value) {
				lines = append(lines, "      "+d)
			}
			continue
		}
		if value != nil {
			line += " " + short(value)
		}
		lines = append(lines, line)
	}
	return lines
}

// pointer resolves an RFC 6901 JSON pointer in obj.
func pointer(obj object.Object, path string) (interface{}, bool) {
	var v interface{} = obj
	for _, tok := range strings.Split(path, "/")[1:] {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		switch c := v.(type) {
		case map[string]interface{}:
			var ok bool
			if v, ok = c[tok]; !ok {
				return nil, false
			}
		case []interface{}:
			i, err := strconv.Atoi(tok)
			if err != nil || i < 0 || i >= len(c) {
				return nil, false
			}
			v = c[i]
		default:
			return nil, false
		}
	}
	return v, true
}

// diff lists the leaves where a and b differ (numbers compared by their text).
func diff(path string, a, b interface{}) []string {
	am, aok := a.(map[string]interface{})
	bm, bok := b.(map[string]interface{})
	if aok && bok {
		var out []string
		for _, k := range unionKeys(am, bm) {
			out = append(out, diff(path+"/"+k, am[k], bm[k])...)
		}
		return out
	}
	as, aok := a.([]interface{})
	bs, bok := b.([]interface{})
	if aok && bok && len(as) == len(bs) {
		var out []string
		for i := range as {
			out = append(out, diff(fmt.Sprintf("%s/%d", path, i), as[i], bs[i])...)
		}
		return out
	}
	if short(a) == short(b) {
		return nil
	}
	return []string{fmt.Sprintf("%s: %s -> %s", path, short(a), short(b))}
}

func unionKeys(a, b map[string]interface{}) []string {
	seen := map[string]bool{}
	var keys []string
	for _, m := range []map[string]interface{}{a, b} {
		for k := range m {
			if !seen[k] {
				seen[k] = true
				keys = append(keys, k)
			}
		}
	}
	sort.Strings(keys)
	return keys
}

func short(v interface{}) string {
	if v == nil {
		return "(absent)"
	}
	b, _ := json.Marshal(v)
	if len(b) > 300 {
		return string(b[:300]) + "..."
	}
	return string(b)
}

func message(r *webhookclient.Response) string {
	if msg, ok := r.Result["message"].(string); ok {
		return msg
	}
	b, _ := json.Marshal(r.Result)
	return string(b)
}

var unsafeChars = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

// write keeps the object as stored (final/) and as the webhook first saw it (input/), for the
// schema check (kubernetes-validate --strict) of scripts/check-apiserver.sh.
func (h *harness) write(c testCase, input, stored object.Object) {
	if h.outDir == "" {
		return
	}
	h.seq++
	name := fmt.Sprintf("%04d-%s.json", h.seq, strings.Trim(unsafeChars.ReplaceAllString(c.Name, "_"), "_"))
	if len(name) > 150 {
		name = name[:150] + ".json"
	}
	for dir, o := range map[string]object.Object{"final": stored, "input": input} {
		p := filepath.Join(h.outDir, dir, name)
		if err := os.WriteFile(p, object.Encode(o), 0o644); err != nil {
			h.rep.fail(c, "call", "writing %s: %v", p, err)
		}
	}
}
