// Command conformance calls modelgate as kube-apiserver does, with kube-apiserver's own
// client-side behaviour rebuilt in Go (see the packages it imports), and checks that every
// Pod and Job, from the shared corpus, the examples and generated cache hits, comes out of
// the API server's admission chain admitted, valid and without a second webhook round; the ML
// custom resources (mlkinds.go) judged as the pods their controllers would make. Then,
// modelgate stopped, the outage with the backstop installed (outage.go).
//
//	conformance -modelgate target/debug/modelgate -corpus .inputs/corpus -examples examples -out DIR
//
// The corpus and the kube-cel binaries are the inputs scripts/inputs.sh resolves
// ($MODELGATE_INPUTS_DIR, default .inputs: docs/test-inputs.md).
//
// It exits 1 if anything failed, after printing each failure and a summary; 2 if it could not
// run (a kube-cel binary or the backstop missing, ...).
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"apiserver/webhookclient"
)

func main() {
	bin := flag.String("modelgate", "target/debug/modelgate", "the modelgate binary under test")
	corpus := flag.String("corpus", inputs("corpus"), "the corpus (Pods, Jobs, workloads, AdmissionReviews), as scripts/inputs.sh resolves it")
	examples := flag.String("examples", "examples", "the examples directory (pod.yaml, job.yaml, cluster-state.yaml)")
	out := flag.String("out", "target/apiserver/conformance", "where to write the objects as stored (final/), as first seen (input/), and the backstop's kube-cel cases and output (backstop/)")
	verbose := flag.Bool("v", false, "print each object's decision")
	backstopVAP := flag.String("backstop-vap", "", "the backstop as `modelgate backstop` prints it (YAML or JSON stream: the ValidatingAdmissionPolicy and its binding); empty: render it with the -modelgate binary")
	kubeCEL := flag.String("kube-cel", inputs("kube-cel"), "the directory of the kube-cel binaries (vap130, vap131, vap132, vap136: kube-apiserver's admission-policy CEL)")
	mlRequests := flag.String("ml-kinds-requests", "target/apiserver/ml-kinds-requests.json", "the ML custom resources' requests and matchConditions verdicts (written by cargo test --test ml_kinds)")
	flag.Parse()
	if err := checkKubeCEL(*kubeCEL); err != nil {
		fmt.Fprintf(os.Stderr, "conformance: %v\n", err)
		os.Exit(2)
	}
	policy, err := loadBackstop(*backstopVAP, *bin)
	if err != nil {
		fmt.Fprintf(os.Stderr, "conformance: the backstop: %v\n", err)
		os.Exit(2)
	}
	if err := run(*bin, *corpus, *examples, *out, *mlRequests, *kubeCEL, policy, *verbose); err != nil {
		fmt.Fprintf(os.Stderr, "conformance: %v\n", err)
		os.Exit(2)
	}
}

// inputs is where scripts/inputs.sh resolves the input name: $MODELGATE_INPUTS_DIR (default
// .inputs, relative to the repository, the working directory of scripts/check-apiserver.sh).
func inputs(name string) string {
	dir := os.Getenv("MODELGATE_INPUTS_DIR")
	if dir == "" {
		dir = ".inputs"
	}
	return filepath.Join(dir, name)
}

func run(bin, corpus, examples, out, mlRequests, kubeCEL string, policy *backstopPolicy, verbose bool) error {
	for _, d := range []string{"final", "input"} {
		if err := os.RemoveAll(filepath.Join(out, d)); err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Join(out, d), 0o755); err != nil {
			return err
		}
	}
	state := filepath.Join(out, "generated-cluster-state.yaml")
	if err := writeClusterState(state); err != nil {
		return err
	}
	var cases []testCase
	for _, src := range []struct{ dir, group string }{{corpus, "corpus"}, {examples, "examples"}} {
		found, err := loadFiles(src.dir, src.group)
		if err != nil {
			return err
		}
		cases = append(cases, found...)
	}
	cases = append(cases, generatedCases()...)

	srv, err := startServer(bin, out, []string{filepath.Join(examples, "cluster-state.yaml"), state})
	if err != nil {
		return err
	}
	rep := newReport(nil)
	if verbose {
		rep.verbose = os.Stdout
	}
	h := &harness{client: webhookclient.New(srv.CAPEM, "localhost"), url: srv.URL, outDir: out, rep: rep}
	for _, c := range cases {
		o := h.admit(c)
		if c.Kind.Kind == "Job" {
			h.jobPods(c, o)
		}
	}
	ml, err := h.mlKinds(mlRequests)
	srv.stop()
	if err != nil {
		return err
	}
	toolFailures, err := evaluateBackstop(policy, h.cel, kubeCEL, filepath.Join(out, "backstop"))
	if err != nil {
		return err
	}
	for _, f := range toolFailures {
		rep.fail(testCase{Name: "kube-cel"}, "backstop-kube-cel", "%s", f)
	}
	counts := judgeBackstop(rep, h.cel)
	outageCounts := outage(srv.URL, srv.CAPEM, rep, h.cel)
	rep.print(os.Stdout)
	fmt.Printf("\nML custom resources (validate-controllers.modelgate.io): %d requests, %d kept out by the matchConditions, %d sent (%d refused); %d pods of their complete templates through the admission chain\n",
		ml.requests, ml.keptOut, ml.sent, ml.refused, ml.pods)
	printBackstop(os.Stdout, policy, kubeCEL, counts, h.cel)
	fmt.Printf("\noutage with the backstop (modelgate stopped, failurePolicy Ignore, every version of kube-apiserver's CEL): %s\n", outageCounts)
	if n := rep.failed(); n > 0 {
		fmt.Printf("\nFAILED: %d failures (modelgate's log: %s; kube-cel's cases and output: %s)\n", n, filepath.Join(out, "modelgate.log"), filepath.Join(out, "backstop"))
		os.Exit(1)
	}
	fmt.Println("\nok: every object admitted as the API server would, valid, in one round, and by the backstop in every version; during an outage the backstop created none that /validate denies")
	return nil
}
