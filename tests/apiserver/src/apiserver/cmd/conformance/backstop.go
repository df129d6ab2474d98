package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"

	"github.com/ghodss/yaml"

	"apiserver/admission"
	"apiserver/defaults"
	"apiserver/object"
)

// The backstop (docs/policy.md, section 13): the ValidatingAdmissionPolicy `modelgate backstop` prints,
// evaluated with kube-apiserver's own CEL: the kube-cel binaries ($MODELGATE_INPUTS_DIR/kube-cel as scripts/inputs.sh resolves it,
// README.md there), each the admission-policy code of one kube-apiserver minor version. Every
// request of the run is written as a kube-cel case file, and each binary evaluates all of them
// in one invocation (compiling the policy takes seconds).

// celVersion is one kube-cel binary and how to run it as the API server of that version runs.
type celVersion struct {
	label, binary string
	env           []string
}

var celVersions = []celVersion{
	{"1.30", "vap130", nil},
	{"1.31", "vap131", nil},
	{"1.32", "vap132", []string{"STRICT=1"}}, // strict cost is GA (always on) in 1.32
	{"1.36", "vap136", nil},                  // strict cost always on
}

// checkKubeCEL fails unless every binary is there and executable.
func checkKubeCEL(dir string) error {
	for _, v := range celVersions {
		p := filepath.Join(dir, v.binary)
		info, err := os.Stat(p)
		if err == nil && (info.IsDir() || info.Mode()&0o111 == 0) {
			err = fmt.Errorf("not an executable file")
		}
		if err != nil {
			return fmt.Errorf("kube-cel binary %s (kube-apiserver %s's CEL): %v; -kube-cel must name the directory of vap130, vap131, vap132 and vap136 (.inputs/kube-cel: scripts/inputs.sh)", p, v.label, err)
		}
	}
	return nil
}

// backstopPolicy is the rendered backstop: the ValidatingAdmissionPolicy and its binding.
type backstopPolicy struct {
	vap, binding object.Object
}

// loadBackstop reads the YAML (or JSON) stream of `modelgate backstop`; when path is "", it
// runs `bin backstop` to render it.
func loadBackstop(path, bin string) (*backstopPolicy, error) {
	var data []byte
	var err error
	if path == "" {
		cmd := exec.Command(bin, "backstop")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if data, err = cmd.Output(); err != nil {
			return nil, fmt.Errorf("%s backstop: %v: %s", bin, err, stderr.String())
		}
		path = bin + " backstop"
	} else if data, err = os.ReadFile(path); err != nil {
		return nil, err
	}
	p := &backstopPolicy{}
	for i, doc := range documentSeparator.Split(string(data), -1) {
		js, err := yaml.YAMLToJSON([]byte(doc))
		if err != nil {
			return nil, fmt.Errorf("%s document %d: %v", path, i, err)
		}
		o, err := object.Decode(js)
		if err != nil {
			continue // empty document
		}
		switch object.Str(o["kind"]) {
		case "ValidatingAdmissionPolicy":
			p.vap = o
		case "ValidatingAdmissionPolicyBinding":
			p.binding = o
		}
	}
	if p.vap == nil || p.binding == nil {
		return nil, fmt.Errorf("%s: no ValidatingAdmissionPolicy and ValidatingAdmissionPolicyBinding in it", path)
	}
	return p, nil
}

func (p *backstopPolicy) name() string {
	return object.Str(object.Get(p.vap, "metadata", "name"))
}

// The namespace every object of the harness is created in, as modelgate sees it (--no-cluster:
// each namespace in the default mode, enforce) and as a cluster that opted in labels it.
const optInLabel, optInValue = "modelgate.io/inject", "enabled"

func namespaceLabels(ns string) object.Object {
	return object.Object{optInLabel: optInValue, "kubernetes.io/metadata.name": ns}
}

// namespaceObject is the request's Namespace as the policy plugin trims it
// (metadata: name and labels here; no apiVersion or kind).
func namespaceObject(ns string) object.Object {
	return object.Object{"metadata": object.Object{"name": ns, "labels": namespaceLabels(ns)}}
}

// celRequest is the AdmissionRequest kube-apiserver binds to `request` (CreateAdmissionRequest,
// then runtime.DefaultUnstructuredConverter): a CREATE of the main resource, so no subResource
// and no requestSubResource; name only when set (the generated name, after BeforeCreate);
// userInfo with only its non-empty fields; uid ""; object, oldObject and options null.
func celRequest(kind admission.Kind, obj object.Object, namespace string, user admission.User) object.Object {
	gvk := object.Object{"group": kind.Group, "version": kind.Version, "kind": kind.Kind}
	gvr := object.Object{"group": kind.Group, "version": kind.Version, "resource": kind.Resource}
	userInfo := object.Object{}
	if user.Username != "" {
		userInfo["username"] = user.Username
	}
	if len(user.Groups) > 0 {
		groups := make([]interface{}, len(user.Groups))
		for i, g := range user.Groups {
			groups[i] = g
		}
		userInfo["groups"] = groups
	}
	request := object.Object{
		"uid":             "",
		"kind":            gvk,
		"resource":        gvr,
		"requestKind":     gvk,
		"requestResource": gvr,
		"namespace":       namespace,
		"operation":       "CREATE",
		"userInfo":        userInfo,
		"object":          nil,
		"oldObject":       nil,
		"dryRun":          false,
		"options":         nil,
	}
	if name := object.Str(object.Get(obj, "metadata", "name")); name != "" {
		request["name"] = name
	}
	return request
}

// The roles of a case.
const (
	roleAdmitted = "admitted" // what modelgate's /mutate and /validate admitted, as stored
	roleIstio    = "istio"    // the same Pod with another webhook's init container first
	roleOutage   = "outage"   // unmutated (modelgate down, failurePolicy Ignore)
)

var roles = []string{roleAdmitted, roleIstio, roleOutage}

// celCase is one request the backstop judges.
type celCase struct {
	tc     testCase
	role   string
	object object.Object // as the API server holds it when validating admission runs
	// outage: whether /validate (while modelgate ran) admits the unmutated object.
	validateAllowed bool
	validateMessage string

	file string // the case file, relative to the cases directory
	// skip says why the policy never sees the request: skipNotBound, or skipInvalid (BeforeCreate
	// runs the strategy's validation before the validating admission: an invalid object is
	// refused first); "" for a case kube-cel evaluates.
	skip      string
	invalid   []string            // the API server's validation errors (skipInvalid)
	decisions map[string][]string // version → its decision lines
}

// Why a case is not evaluated.
const (
	skipNotBound = "not bound"
	skipInvalid  = "invalid"
)

// record keeps a request for the backstop's evaluation.
func (h *harness) record(c testCase, role string, obj object.Object) *celCase {
	cc := &celCase{tc: c, role: role, object: object.Copy(obj)}
	h.cel = append(h.cel, cc)
	return cc
}

// istioInitContainer is what Istio's sidecar injector (another mutating webhook) puts first
// in a pod's init containers with the CNI plugin.
func istioInitContainer() object.Object {
	return object.Object{
		"name": "istio-validation", "image": "docker.io/istio/proxyv2:1.24.0",
		"securityContext": object.Object{
			"runAsNonRoot": true, "runAsUser": object.Num(1337), "runAsGroup": object.Num(1337),
			"allowPrivilegeEscalation": false, "capabilities": object.Object{"drop": []interface{}{"ALL"}},
		},
	}
}

// withIstioInit is a stored Pod as it is when another webhook also inserted its init
// container at index 0: the container defaulted after that webhook's patch
// (terminationMessagePath, terminationMessagePolicy, imagePullPolicy), the built-in plugins
// re-run (the ServiceAccount plugin mounts the token into it), and the QoS class recomputed
// by the strategy (PrepareForCreate).
func withIstioInit(stored object.Object) object.Object {
	pod := object.Copy(stored)
	spec := object.Child(pod, "spec")
	c := istioInitContainer()
	defaults.Container(c, false)
	spec["initContainers"] = append([]interface{}{c}, object.Slice(spec["initContainers"])...)
	defaults.AdmitPod(pod)
	object.Child(pod, "status")["qosClass"] = podQoS(admission.PodKind, pod)
	return pod
}

// matches says whether the policy's matchConstraints and the binding's matchResources select
// a CREATE of kind in namespace ns (namespace labels as namespaceLabels gives them) for obj:
// the part of the API server's matching kube-cel leaves out.
func (p *backstopPolicy) matches(kind admission.Kind, ns string, obj object.Object) (bool, error) {
	for _, m := range []object.Object{object.Map(object.Get(p.vap, "spec", "matchConstraints")), object.Map(object.Get(p.binding, "spec", "matchResources"))} {
		if m == nil {
			continue
		}
		for _, sel := range []struct {
			key    string
			labels object.Object
		}{{"namespaceSelector", namespaceLabels(ns)}, {"objectSelector", object.Map(object.Get(obj, "metadata", "labels"))}} {
			if s := object.Map(m[sel.key]); s != nil {
				ok, err := selects(s, sel.labels)
				if err != nil || !ok {
					return false, err
				}
			}
		}
		if rules, ok := m["resourceRules"]; ok && !anyRule(object.Maps(rules), kind) {
			return false, nil
		}
		if anyRule(object.Maps(m["excludeResourceRules"]), kind) {
			return false, nil
		}
	}
	return true, nil
}

func anyRule(rules []object.Object, kind admission.Kind) bool {
	for _, r := range rules {
		if has(r["operations"], "CREATE") && has(r["apiGroups"], kind.Group) && has(r["apiVersions"], kind.Version) && has(r["resources"], kind.Resource) {
			return true
		}
	}
	return false
}

func has(list interface{}, v string) bool {
	for _, e := range object.Slice(list) {
		if s := object.Str(e); s == v || s == "*" {
			return true
		}
	}
	return false
}

// selects is metav1.LabelSelectorAsSelector(s).Matches(labels).
func selects(s, labels object.Object) (bool, error) {
	for k, v := range object.Map(s["matchLabels"]) {
		if l, ok := labels[k]; !ok || object.Str(l) != object.Str(v) {
			return false, nil
		}
	}
	for _, e := range object.Maps(s["matchExpressions"]) {
		l, present := labels[object.Str(e["key"])]
		in := false
		for _, v := range object.Slice(e["values"]) {
			in = in || object.Str(v) == object.Str(l)
		}
		switch op := object.Str(e["operator"]); op {
		case "In":
			if !present || !in {
				return false, nil
			}
		case "NotIn":
			if present && in {
				return false, nil
			}
		case "Exists":
			if !present {
				return false, nil
			}
		case "DoesNotExist":
			if present {
				return false, nil
			}
		default:
			return false, fmt.Errorf("label selector operator %q", op)
		}
	}
	return true, nil
}

// evaluateBackstop writes every bound case to DIR/cases, the policy to DIR/vap.json, and runs
// each kube-cel binary once over all of them (two at a time: the policy's compile is the
// cost). Problems of the tool or the policy itself (a compile error, a case without a
// decision) are returned as failures.
func evaluateBackstop(p *backstopPolicy, cases []*celCase, celDir, dir string) ([]string, error) {
	casesDir := filepath.Join(dir, "cases")
	if err := os.RemoveAll(dir); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(casesDir, 0o755); err != nil {
		return nil, err
	}
	vapFile := filepath.Join(dir, "vap.json")
	if err := os.WriteFile(vapFile, object.Encode(p.vap), 0o644); err != nil {
		return nil, err
	}
	var files []string
	byFile := map[string]*celCase{}
	for i, c := range cases {
		kind := c.tc.Kind
		bound, err := p.matches(kind, c.tc.Namespace, c.object)
		if err != nil {
			return nil, fmt.Errorf("the backstop's match rules: %v", err)
		}
		if c.invalid = validate(kind, c.object); len(c.invalid) > 0 {
			c.skip = skipInvalid
			continue
		}
		if !bound {
			c.skip = skipNotBound
			continue
		}
		c.file = fmt.Sprintf("%05d-%s.json", i, c.role)
		doc := object.Object{
			"name":            c.role + ": " + c.tc.Name,
			"object":          c.object,
			"oldObject":       nil,
			"request":         celRequest(kind, c.object, c.tc.Namespace, c.tc.User),
			"namespaceObject": namespaceObject(c.tc.Namespace),
		}
		if err := os.WriteFile(filepath.Join(casesDir, c.file), object.Encode(doc), 0o644); err != nil {
			return nil, err
		}
		files = append(files, c.file)
		byFile[c.file] = c
		c.decisions = map[string][]string{}
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("the backstop's binding selects none of the %d requests", len(cases))
	}
	absVAP, err := filepath.Abs(vapFile)
	if err != nil {
		return nil, err
	}
	failures := make([][]string, len(celVersions))
	var mu sync.Mutex
	var wg sync.WaitGroup
	slots := make(chan struct{}, 2)
	for i, v := range celVersions {
		wg.Add(1)
		go func(i int, v celVersion) {
			defer wg.Done()
			slots <- struct{}{}
			defer func() { <-slots }()
			bin, _ := filepath.Abs(filepath.Join(celDir, v.binary))
			cmd := exec.Command(bin, append([]string{absVAP}, files...)...)
			cmd.Dir = casesDir
			cmd.Env = append(os.Environ(), v.env...)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			out, runErr := cmd.Output()
			logFile := filepath.Join(dir, "kube-cel-"+v.label+".log")
			_ = os.WriteFile(logFile, append(out, stderr.Bytes()...), 0o644)
			var fs []string
			name := fmt.Sprintf("kube-apiserver %s (%s%s)", v.label, strings.Join(v.env, " "), v.binary)
			if runErr != nil {
				fs = append(fs, fmt.Sprintf("%s exited with %v: %s (output: %s)", name, runErr, strings.TrimSpace(lastLines(stderr.String(), 5)), logFile))
			}
			decisions, parseFailures := parseKubeCEL(out)
			for _, f := range parseFailures {
				fs = append(fs, name+": "+f)
			}
			mu.Lock()
			for file, lines := range decisions {
				if c := byFile[file]; c != nil {
					c.decisions[v.label] = lines
				} else {
					fs = append(fs, fmt.Sprintf("%s: a decision for %s, which is not a case of this run", name, file))
				}
			}
			missing := 0
			for _, f := range files {
				if len(byFile[f].decisions[v.label]) == 0 {
					missing++
				}
			}
			if missing > 0 {
				fs = append(fs, fmt.Sprintf("%s: no decision for %d of %d cases (output: %s)", name, missing, len(files), logFile))
			}
			failures[i] = fs
			mu.Unlock()
		}(i, v)
	}
	wg.Wait()
	var all []string
	for _, fs := range failures {
		all = append(all, fs...)
	}
	return all, nil
}

var caseLine = regexp.MustCompile(`^-- case .* \(([^()]+)\)$`)
var compileLine = regexp.MustCompile(`^-- (create-time|runtime) compile .*: (\d+) errors$`)

// parseKubeCEL reads a kube-cel run: the decision lines of each case file, and as failures
// any compile error (at creation the API server refuses the policy; at runtime every request
// fails).
func parseKubeCEL(out []byte) (map[string][]string, []string) {
	decisions := map[string][]string{}
	var failures, compileErrors []string
	current := ""
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "-- case "):
			m := caseLine.FindStringSubmatch(line)
			if m == nil {
				failures = append(failures, "unreadable line: "+line)
				current = ""
				continue
			}
			current = m[1]
		case strings.HasPrefix(line, "-- "):
			current = ""
			if m := compileLine.FindStringSubmatch(line); m != nil {
				if n, _ := strconv.Atoi(m[2]); n > 0 {
					failures = append(failures, fmt.Sprintf("%s compile: %d errors: %s", m[1], n, strings.Join(compileErrors, "; ")))
				}
				compileErrors = nil
			}
		case current == "" && strings.HasPrefix(line, "   ERROR "):
			compileErrors = append(compileErrors, strings.TrimPrefix(line, "   ERROR "))
		case current != "" && strings.HasPrefix(line, "   decision: "):
			decisions[current] = append(decisions[current], strings.TrimPrefix(line, "   decision: "))
		}
	}
	if err := sc.Err(); err != nil {
		failures = append(failures, "reading the output: "+err.Error())
	}
	return decisions, failures
}

// The classes of a decision line.
const (
	decAdmit      = "ADMIT"
	decNotMatched = "NOT MATCHED"
	decDeny       = "DENY"
	decError      = "ERROR"
)

var decisionClasses = []string{decAdmit, decNotMatched, decDeny, decError}

var denyLine = regexp.MustCompile(`^validation \d+ DENY: (.*)$`)

// classify is one decision line's class and, for a denial, the message the API server
// returns. An evaluation error (`validation i ERROR -> DENY (Fail)`, `DENY (failurePolicy
// Fail...)`) and anything unknown are ERROR.
func classify(line string) (class, message string) {
	switch {
	case line == "ADMIT":
		return decAdmit, ""
	case strings.HasPrefix(line, "NOT MATCHED ") && strings.HasSuffix(line, "-> ADMIT"):
		return decNotMatched, ""
	}
	if m := denyLine.FindStringSubmatch(line); m != nil {
		return decDeny, m[1]
	}
	return decError, ""
}

// verdict is the class of a case in one version: ERROR if any line is one, else DENY if any
// line is, else the first line's class ("" when there is none).
func verdict(lines []string) string {
	v := ""
	for _, l := range lines {
		switch class, _ := classify(l); {
		case class == decError:
			return decError
		case class == decDeny:
			v = decDeny
		case v == "":
			v = class
		}
	}
	return v
}

// backstopCounts are the verdicts of each version, by role.
type backstopCounts map[string]map[string]map[string]int // version → role → class → count

// judgeBackstop checks the admitted and Istio cases (every version must admit them) and
// counts the verdicts; the outage cases are judged by outage().
func judgeBackstop(rep *report, cases []*celCase) backstopCounts {
	counts := backstopCounts{}
	for _, v := range celVersions {
		counts[v.label] = map[string]map[string]int{}
		for _, r := range roles {
			counts[v.label][r] = map[string]int{}
		}
	}
	for _, c := range cases {
		if c.skip != "" {
			for _, v := range celVersions {
				counts[v.label][c.role][c.skip]++
			}
			continue
		}
		var bad []string
		for _, v := range celVersions {
			lines := c.decisions[v.label]
			if d := verdict(lines); d != "" {
				counts[v.label][c.role][d]++
			}
			if c.role == roleOutage {
				continue
			}
			for _, l := range lines {
				if class, _ := classify(l); class != decAdmit && class != decNotMatched {
					bad = append(bad, v.label+": "+l)
				}
			}
		}
		if len(bad) == 0 {
			continue
		}
		kind, what := "backstop-admitted", "modelgate admitted it (as stored), the backstop did not"
		if c.role == roleIstio {
			kind, what = "backstop-istio", "with istio-validation at initContainers[0], the backstop did not admit it"
		}
		rep.fail(c.tc, kind, "%s (case %s):\n%s", what, c.file, strings.Join(groupVersions(bad), "\n"))
	}
	return counts
}

// groupVersions turns "1.30: line" entries into one line per distinct line, its versions
// listed: "1.30, 1.31: line".
func groupVersions(entries []string) []string {
	var order []string
	versions := map[string][]string{}
	for _, e := range entries {
		i := strings.Index(e, ": ")
		v, line := e[:i], e[i+2:]
		if _, ok := versions[line]; !ok {
			order = append(order, line)
		}
		versions[line] = append(versions[line], v)
	}
	out := make([]string, len(order))
	for i, line := range order {
		out[i] = "kube-apiserver " + strings.Join(versions[line], ", ") + ": " + line
	}
	return out
}

// printBackstop writes the counts per version and role.
func printBackstop(w *os.File, p *backstopPolicy, celDir string, counts backstopCounts, cases []*celCase) {
	n := map[string]int{}
	for _, c := range cases {
		n[c.role]++
	}
	fmt.Fprintf(w, "\nbackstop (ValidatingAdmissionPolicy %s evaluated by kube-apiserver's own CEL, %s): %d objects admitted by modelgate as stored, %d of those Pods with istio-validation first, %d unmutated (outage); not evaluated: %q (the binding does not select it), %q (the API server's validation refuses it before admission policies run)\n",
		p.name(), celDir, n[roleAdmitted], n[roleIstio], n[roleOutage], skipNotBound, skipInvalid)
	for _, v := range celVersions {
		var parts []string
		for _, r := range roles {
			var cs []string
			for _, class := range append(decisionClasses, skipNotBound, skipInvalid) {
				if k := counts[v.label][r][class]; k > 0 || (class != skipNotBound && class != skipInvalid) {
					cs = append(cs, fmt.Sprintf("%d %s", k, class))
				}
			}
			parts = append(parts, r+": "+strings.Join(cs, ", "))
		}
		fmt.Fprintf(w, "  %-5s %-15s %s\n", v.label, strings.TrimSpace(strings.Join(v.env, " ")+" "+v.binary), strings.Join(parts, " | "))
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}
