// Command transport is the transport conformance harness of modelgate (docs/policy.md §7): it
// starts the real `modelgate serve` binary and calls it with kube-apiserver's own webhook client
// (package apiserver/webhookclient) through the situations a production API server puts it in,
// counting failed admissions (a transport error, a status outside 200..206, an answer that
// VerifyAdmissionResponse refuses, a denial or a patch that is no JSON Patch). Every scenario
// must end with zero, and with no connection "at risk" (closed by the server while the client
// could still reuse it). Scenarios run on servers of their own, the long ones in parallel with
// the others: about 110 s in all. The summary also gives the server's RSS at the burst's peak
// and at its connection cap.
//
//	idle-boundary   requests on pooled connections at the idle timeouts that matter
//	idle-95s        connections idle 95 s, then used
//	burst-200       200 simultaneous calls, one connection each
//	connection-cap  --max-connections idle connections held, 50 more calls waiting for a slot
//	slow-senders    hundreds of trickling bodies (HTTP/1.1 and HTTP/2) while admissions are sent
//	rolling-restart two replicas behind a connection-level balancer, one sent SIGTERM under load
//	cert-rotation   the serving certificate replaced several times under load
//
// Usage (GOPATH mode, from the repository root; scripts/check-apiserver.sh runs it):
//
//	GO111MODULE=off GOPATH=$PWD/tests/apiserver go run apiserver/cmd/transport \
//	    [-bin path] [-run name,name] [-review file] [-keep]
//
// The binary is -bin, else $MODELGATE_BIN, else target/debug/modelgate; the scenarios follow its
// `serve --help` defaults. -keep keeps the server logs. Exit status 1 if any scenario failed, 2
// if the harness could not start.
package main

import (
	"flag"
	"fmt"
	"io/ioutil"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"text/tabwriter"
	"time"
)

// result is one line of the summary.
type result struct {
	name     string
	requests int
	failures int
	// atRisk counts connections the server closed while the client could still reuse them:
	// each is an admission that fails whenever a request meets the close. Any is a failure.
	atRisk int
	notes  []string
	err    error // the scenario could not run
}

func (r *result) note(format string, args ...interface{}) {
	r.notes = append(r.notes, fmt.Sprintf(format, args...))
}

func (r *result) failed() bool { return r.failures > 0 || r.atRisk > 0 || r.err != nil }

// harness is what the scenarios share: the binary, a scratch directory, the review, the CA.
type harness struct {
	bin      string
	workdir  string
	review   []byte
	defaults serveDefaults
	ca       *authority

	mu      sync.Mutex
	servers []*server
}

func (h *harness) track(s *server) {
	h.mu.Lock()
	h.servers = append(h.servers, s)
	h.mu.Unlock()
}

// startWithCerts starts a server with a certificate directory of its own.
func (h *harness) startWithCerts(name string, extra ...string) (*server, *certDir, error) {
	certs, err := newCertDir(filepath.Join(h.workdir, name+"-certs"), h.ca)
	if err != nil {
		return nil, nil, err
	}
	s, err := startServer(h, name, certs, extra...)
	return s, certs, err
}

// startTarget starts a server with certificates of its own and points the API server's client
// at its /mutate; when the client cannot be built, the server is stopped again.
func (h *harness) startTarget(name string) (*server, *certDir, *target, error) {
	s, certs, err := h.startWithCerts(name)
	if err != nil {
		return nil, nil, nil, err
	}
	t, err := h.target(s.url("/mutate"))
	if err != nil {
		s.kill()
		return nil, nil, nil, err
	}
	return s, certs, t, nil
}

func (h *harness) target(url string) (*target, error) {
	return newTarget(url, h.ca.certPEM, h.review)
}

type scenario struct {
	name string
	long bool // mostly waiting: runs beside the others
	run  func(h *harness) *result
}

var scenarios = []scenario{
	{"idle-boundary", true, idleBoundary},
	{"idle-95s", true, idle95s},
	{"burst-200", false, burst200},
	{"connection-cap", false, connectionCap},
	{"slow-senders", false, slowSenders},
	{"rolling-restart", false, rollingRestart},
	{"cert-rotation", false, certRotation},
}

func main() {
	defaultBin := os.Getenv("MODELGATE_BIN")
	if defaultBin == "" {
		defaultBin = "target/debug/modelgate"
	}
	bin := flag.String("bin", defaultBin, "the modelgate binary")
	reviewPath := flag.String("review", "examples/admissionreview-pod.json", "the AdmissionReview to send")
	only := flag.String("run", "", "comma-separated scenarios to run (default: all)")
	keep := flag.Bool("keep", false, "keep the scratch directory (server logs)")
	flag.Parse()

	h, err := setup(*bin, *reviewPath)
	if err != nil {
		fmt.Fprintln(os.Stderr, "transport:", err)
		os.Exit(2)
	}
	fmt.Printf("transport: %s (defaults: idle timeout %v, max connections %d, shutdown grace %v)\n",
		h.bin, h.defaults.idleTimeout, h.defaults.maxConnections, h.defaults.shutdownGrace)

	results := runAll(h, selected(*only))
	for _, s := range h.servers {
		s.kill()
	}
	failed := printSummary(results)
	if *keep {
		fmt.Println("server logs kept in", h.workdir)
	} else {
		os.RemoveAll(h.workdir)
	}
	if failed {
		os.Exit(1)
	}
}

func setup(bin, reviewPath string) (*harness, error) {
	abs, err := filepath.Abs(bin)
	if err != nil {
		return nil, err
	}
	review, err := ioutil.ReadFile(reviewPath)
	if err != nil {
		return nil, err
	}
	defaults, err := readServeDefaults(abs)
	if err != nil {
		return nil, err
	}
	ca, err := newAuthority()
	if err != nil {
		return nil, err
	}
	workdir, err := ioutil.TempDir("", "modelgate-transport-")
	if err != nil {
		return nil, err
	}
	return &harness{bin: abs, workdir: workdir, review: review, defaults: defaults, ca: ca}, nil
}

func selected(only string) []scenario {
	if only == "" {
		return scenarios
	}
	var out []scenario
	for _, name := range strings.Split(only, ",") {
		found := false
		for _, s := range scenarios {
			if s.name == strings.TrimSpace(name) {
				out = append(out, s)
				found = true
			}
		}
		if !found {
			fmt.Fprintf(os.Stderr, "transport: no scenario %q\n", name)
			os.Exit(2)
		}
	}
	return out
}

// runAll starts each long scenario in a goroutine of its own and, once they have opened their
// connections, runs the short ones one after the other beside them (they load the CPU, and a
// burst should not meet a restart), each on servers of its own.
func runAll(h *harness, list []scenario) []*result {
	results := make([]*result, len(list))
	var wg sync.WaitGroup
	run := func(i int) {
		start := time.Now()
		r := list[i].run(h)
		r.name = list[i].name
		r.note("%.0fs", time.Since(start).Seconds())
		results[i] = r
		fmt.Printf("transport: %s done: %d requests, %d failed\n", r.name, r.requests, r.failures)
	}
	for i := range list {
		if list[i].long {
			wg.Add(1)
			go func(i int) { defer wg.Done(); run(i) }(i)
		}
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		if len(list) > 1 {
			// Let the long scenarios open their connections first.
			time.Sleep(5 * time.Second)
		}
		for i := range list {
			if !list[i].long {
				run(i)
			}
		}
	}()
	wg.Wait()
	return results
}

// printSummary prints the table and says whether anything failed.
func printSummary(results []*result) bool {
	fmt.Println()
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "scenario\trequests\tfailed\tat risk\tresult\tnotes")
	anyFailed := false
	for _, r := range results {
		verdict := "ok"
		if r.failed() {
			verdict = "FAIL"
			anyFailed = true
		}
		notes := strings.Join(r.notes, "; ")
		if r.err != nil {
			notes = "error: " + r.err.Error() + "; " + notes
		}
		fmt.Fprintf(w, "%s\t%d\t%d\t%d\t%s\t%s\n", r.name, r.requests, r.failures, r.atRisk, verdict, notes)
	}
	w.Flush()
	return anyFailed
}
