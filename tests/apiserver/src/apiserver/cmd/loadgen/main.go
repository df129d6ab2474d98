// Command loadgen measures modelgate's speed as kube-apiserver loads it (docs/benchmarks.md):
// it drives two servers, `serve` and the floor (the same TLS and HTTP stack
// answering the very bytes serve answers, without parsing), with the API server's own webhook
// client (package apiserver/webhookclient), alternating between them in the same run, and prints
// a markdown table of the ratios and of the server CPU per request.
//
// The servers are started by the Rust load harness, which passes their URLs and process ids:
//
//	cargo build --release --example loadgen
//	GO111MODULE=off GOPATH=$PWD/tests/apiserver:$PWD/.tools/gopath \
//	    .tools/go/bin/go build -o target/apiserver/loadgen apiserver/cmd/loadgen
//	target/release/examples/loadgen --go-client target/apiserver/loadgen [--go-args '-rounds 5']
//
// Two ways of calling, each with N workers (goroutines, each with one call in flight, one call
// after another: the API server's handlers each making their admission call):
//
//	pooled   one client per webhook, as the API server keeps it: HTTP/1.1 only, keep-alive, at most
//	         25 idle connections per host; a call finds an idle connection or dials a new one, and
//	         a connection given back while 25 are idle is closed (net/http's Transport with
//	         MaxIdleConnsPerHost 25). The dials and client-side closes are counted.
//	newconn  a new TLS connection for every call: what a call beyond the pool costs. By default
//	         each call gets a fresh copy of the same transport, and the connection is closed by
//	         the client once the answer is read (as an overflowing pool closes it; the request
//	         carries no "Connection: close"); -newconn close uses DisableKeepAlives instead (the
//	         request asks the server to close).
//
// Every call is webhookclient.Call.Do: the review POSTed with the API server's headers and
// ?timeout=10s, the answer read whole and verified as VerifyAdmissionResponse verifies it. The
// review is sent compact (json.Compact of the file), as the API server serialises it.
//
// CPU is the sum over all threads of /proc/<pid>/task/*/schedstat (time on CPU), read before and
// after each measurement, for each server and for this process (the client).
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io/ioutil"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"apiserver/webhookclient"
)

func main() {
	var (
		serveURL   = flag.String("serve", "", "URL of serve's /mutate")
		floorURL   = flag.String("floor", "", "URL of the floor's /mutate")
		caFile     = flag.String("ca", "", "CA certificate (PEM) of both servers: the webhook's caBundle")
		reviewFile = flag.String("review", "", "AdmissionReview to send (JSON; sent compact)")
		servePid   = flag.Int("serve-pid", 0, "process id of serve (CPU accounting)")
		floorPid   = flag.Int("floor-pid", 0, "process id of the floor (CPU accounting)")
		serverName = flag.String("server-name", "localhost", "name the serving certificate must carry")
		workers    = flag.String("workers", "1,16,64", "worker counts for pooled calls")
		ncWorkers  = flag.String("newconn-workers", "1,16", "worker counts for a new connection per call")
		newconn    = flag.String("newconn", "fresh", "fresh: a fresh transport per call, closed by the client; close: DisableKeepAlives")
		rounds     = flag.Int("rounds", 3, "rounds; each measures every case on floor and serve")
		seconds    = flag.Float64("seconds", 3, "measured seconds per case, server and round")
		warmup     = flag.Float64("warmup", 1, "warm-up seconds before each measurement")
		only       = flag.String("only", "", "pooled or newconn: run only those cases")
	)
	flag.Parse()
	if *serveURL == "" || *floorURL == "" || *caFile == "" || *reviewFile == "" {
		fmt.Fprintln(os.Stderr, "usage: loadgen -serve URL -floor URL -ca FILE -review FILE [-serve-pid N -floor-pid N] [flags]")
		os.Exit(2)
	}
	if *newconn != "fresh" && *newconn != "close" {
		die("-newconn must be fresh or close")
	}
	caPEM, err := ioutil.ReadFile(*caFile)
	check(err)
	pretty, err := ioutil.ReadFile(*reviewFile)
	check(err)
	var review bytes.Buffer
	check(json.Compact(&review, pretty))

	servers := []*server{
		{name: "floor", url: *floorURL, pid: *floorPid},
		{name: "serve", url: *serveURL, pid: *servePid},
	}
	for _, s := range servers {
		s.pool = newCountingTransport(webhookclient.NewTransport(caPEM, *serverName))
		s.template = newCountingTransport(webhookclient.NewTransport(caPEM, *serverName))
		if *newconn == "close" {
			s.template.DisableKeepAlives = true
		}
	}

	// Both answer the same bytes (the floor's answer is serve's, computed once at its start).
	var answers [2][]byte
	for i, s := range servers {
		c := &http.Client{Transport: s.pool.Transport, Timeout: webhookclient.ClientTimeout}
		resp, err := webhookclient.Call{URL: s.url, Review: review.Bytes(), Mutating: true}.Do(context.Background(), c)
		if err != nil {
			die(fmt.Sprintf("%s: %v", s.name, err))
		}
		answers[i] = resp.Body
	}
	same := "identical"
	if !bytes.Equal(answers[0], answers[1]) {
		same = "DIFFERENT"
	}

	var cases []kase
	if *only != "newconn" {
		for _, n := range ints(*workers) {
			cases = append(cases, kase{mode: "pooled", workers: n})
		}
	}
	if *only != "pooled" {
		for _, n := range ints(*ncWorkers) {
			cases = append(cases, kase{mode: "newconn", workers: n})
		}
	}

	fmt.Printf("apiserver loadgen: review %s, %d bytes compact (%d as written); answers of serve and floor: %s (%d bytes); "+
		"%d rounds × %.1f s per case and server after %.1f s warm-up; new connection per call: %s; "+
		"GOMAXPROCS %d; load average before: %s\n",
		filepath.Base(*reviewFile), review.Len(), len(pretty), same, len(answers[1]),
		*rounds, *seconds, *warmup, *newconn, runtime.GOMAXPROCS(0), loadAverage())

	results := map[string]*total{}
	key := func(k kase, s *server) string { return fmt.Sprintf("%s/%d/%s", k.mode, k.workers, s.name) }
	for r := 0; r < *rounds; r++ {
		for _, k := range cases {
			order := servers
			if r%2 == 1 { // alternate which server goes first
				order = []*server{servers[1], servers[0]}
			}
			for _, s := range order {
				run(s, k, review.Bytes(), secs(*warmup), nil)
				m := &measurement{}
				run(s, k, review.Bytes(), secs(*seconds), m)
				t := results[key(k, s)]
				if t == nil {
					t = &total{}
					results[key(k, s)] = t
				}
				t.add(m)
			}
		}
	}

	fmt.Printf("\nload average after: %s; pooled connections dialed / closed by the client / still open, floor: %s, serve: %s\n\n",
		loadAverage(), poolCounts(servers[0].pool), poolCounts(servers[1].pool))
	fmt.Println("| calls | workers | server | req/s | p50 µs | p99 µs | req/s ÷ floor (rounds) | p50 ÷ floor | server CPU µs/req | ÷ floor (− floor µs) | client CPU µs/req | CPU-bound req/s ÷ floor | dials per 1000 req | client closes per 1000 req | failed |")
	fmt.Println("|---|---:|---|---:|---:|---:|---|---:|---:|---|---:|---:|---:|---:|---:|")
	for _, k := range cases {
		f, s := results[key(k, servers[0])], results[key(k, servers[1])]
		for _, row := range []struct {
			name string
			t    *total
		}{{"floor", f}, {"serve", s}} {
			t := row.t
			var ratio, p50r, cpur, bound string
			if row.name == "serve" {
				lo, hi := math.Inf(1), math.Inf(-1)
				for i := range t.rounds {
					x := t.rounds[i].rps() / f.rounds[i].rps()
					lo, hi = math.Min(lo, x), math.Max(hi, x)
				}
				ratio = fmt.Sprintf("%.2f (%.2f–%.2f)", t.rps()/f.rps(), lo, hi)
				p50r = fmt.Sprintf("%.2f", t.quantile(0.5)/f.quantile(0.5))
				cpur = fmt.Sprintf("%.2f (%+.1f)", t.serverCPU()/f.serverCPU(), t.serverCPU()-f.serverCPU())
				bound = fmt.Sprintf("%.2f", (f.serverCPU()+f.clientCPU())/(t.serverCPU()+t.clientCPU()))
			}
			fmt.Printf("| %s | %d | %s | %.0f | %.0f | %.0f | %s | %s | %.1f | %s | %.1f | %s | %.1f | %.1f | %d |\n",
				k.mode, k.workers, row.name, t.rps(), t.quantile(0.5), t.quantile(0.99), ratio, p50r,
				t.serverCPU(), cpur, t.clientCPU(), bound,
				1000*float64(t.dials)/float64(t.requests), 1000*float64(t.closes)/float64(t.requests), t.failed)
		}
	}

	// What a new connection costs the server: a call on a new connection less a pooled call.
	pooled := map[int]bool{}
	for _, k := range cases {
		if k.mode == "pooled" {
			pooled[k.workers] = true
		}
	}
	header := false
	for _, k := range cases {
		if k.mode != "newconn" || !pooled[k.workers] {
			continue
		}
		if !header {
			fmt.Println("\n| workers | server | server CPU µs per call on a new connection | pooled | the connection (TLS handshake, accept, close) |")
			fmt.Println("|---:|---|---:|---:|---:|")
			header = true
		}
		for _, s := range servers {
			n := results[key(k, s)]
			p := results[key(kase{mode: "pooled", workers: k.workers}, s)]
			fmt.Printf("| %d | %s | %.1f | %.1f | %.1f |\n", k.workers, s.name, n.serverCPU(), p.serverCPU(), n.serverCPU()-p.serverCPU())
		}
	}
	for _, t := range results {
		if t.failed > 0 {
			fmt.Printf("\nfailed calls: %s\n", strings.Join(errorLines(results), "; "))
			os.Exit(1)
		}
	}
}

// poolCounts is what the pooled transport has dialed and closed over the whole run: what stays
// open is the idle pool, at most MaxIdleConnsPerHost (25) once the workers have stopped.
func poolCounts(t *countingTransport) string {
	d, c := atomic.LoadInt64(&t.dials), atomic.LoadInt64(&t.closes)
	return fmt.Sprintf("%d / %d / %d", d, c, d-c)
}

type kase struct {
	mode    string // pooled or newconn
	workers int
}

type server struct {
	name string
	url  string
	pid  int
	// pool is the client's transport for pooled calls, kept for the whole run as the API server
	// keeps its client per webhook; template is copied for each call on a new connection.
	pool     *countingTransport
	template *countingTransport
}

// countingTransport is webhookclient's transport with its dialer wrapped to count the
// connections dialed and the ones the client closed. Nothing else changes.
type countingTransport struct {
	*http.Transport
	dials, closes int64
}

func newCountingTransport(t *http.Transport) *countingTransport {
	ct := &countingTransport{Transport: t}
	dial := t.DialContext
	t.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		atomic.AddInt64(&ct.dials, 1)
		return &countingConn{Conn: c, closes: &ct.closes}, nil
	}
	return ct
}

type countingConn struct {
	net.Conn
	once   sync.Once
	closes *int64
}

func (c *countingConn) Close() error {
	c.once.Do(func() { atomic.AddInt64(c.closes, 1) })
	return c.Conn.Close()
}

// measurement is one case on one server for one round.
type measurement struct {
	requests, failed int
	seconds          float64
	latencies        []time.Duration
	serverNs         uint64
	clientNs         uint64
	dials, closes    int64
	errors           map[string]int
}

func (m *measurement) rps() float64 { return float64(m.requests) / m.seconds }

// run drives s for d with k.workers workers; m nil is a warm-up.
func run(s *server, k kase, review []byte, d time.Duration, m *measurement) {
	var (
		mu       sync.Mutex
		wg       sync.WaitGroup
		failed   int
		errs     = map[string]int{}
		all      [][]time.Duration
		counters = s.pool
	)
	if k.mode == "newconn" {
		counters = s.template
	}
	dials0, closes0 := atomic.LoadInt64(&counters.dials), atomic.LoadInt64(&counters.closes)
	serverNs0, clientNs0 := cpuNs(s.pid), cpuNs(os.Getpid())
	start := time.Now()
	deadline := start.Add(d)
	pooled := &http.Client{Transport: s.pool.Transport, Timeout: webhookclient.ClientTimeout}
	for w := 0; w < k.workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lat := make([]time.Duration, 0, 4096)
			var nfailed int
			myErrs := map[string]int{}
			for time.Now().Before(deadline) {
				client := pooled
				var tr *http.Transport
				if k.mode == "newconn" {
					tr = s.template.Transport.Clone()
					client = &http.Client{Transport: tr, Timeout: webhookclient.ClientTimeout}
				}
				t0 := time.Now()
				resp, err := webhookclient.Call{URL: s.url, Review: review, Mutating: true}.Do(context.Background(), client)
				if err == nil && !resp.Allowed {
					err = fmt.Errorf("denied")
				}
				elapsed := time.Since(t0)
				if tr != nil {
					tr.CloseIdleConnections() // the pool is full: the client closes the connection
				}
				if err != nil {
					nfailed++
					myErrs[err.Error()]++
					continue
				}
				lat = append(lat, elapsed)
			}
			mu.Lock()
			all = append(all, lat)
			failed += nfailed
			for e, n := range myErrs {
				errs[e] += n
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	if m == nil {
		return
	}
	m.seconds = time.Since(start).Seconds()
	m.serverNs = cpuNs(s.pid) - serverNs0
	m.clientNs = cpuNs(os.Getpid()) - clientNs0
	m.dials = atomic.LoadInt64(&counters.dials) - dials0
	m.closes = atomic.LoadInt64(&counters.closes) - closes0
	for _, l := range all {
		m.latencies = append(m.latencies, l...)
	}
	m.requests = len(m.latencies)
	m.failed = failed
	m.errors = errs
}

// total is one case on one server over all rounds: their measurements added up.
type total struct {
	measurement
	rounds []*measurement
	sorted bool
}

func (t *total) add(m *measurement) {
	t.rounds = append(t.rounds, m)
	t.requests += m.requests
	t.failed += m.failed
	t.seconds += m.seconds
	t.latencies = append(t.latencies, m.latencies...)
	t.serverNs += m.serverNs
	t.clientNs += m.clientNs
	t.dials += m.dials
	t.closes += m.closes
	if t.errors == nil {
		t.errors = map[string]int{}
	}
	for e, n := range m.errors {
		t.errors[e] += n
	}
	t.sorted = false
}

func (m *measurement) serverCPU() float64 { return float64(m.serverNs) / 1e3 / float64(m.requests) }
func (m *measurement) clientCPU() float64 { return float64(m.clientNs) / 1e3 / float64(m.requests) }

// quantile in µs, nearest rank over every sample of every round.
func (t *total) quantile(q float64) float64 {
	if len(t.latencies) == 0 {
		return math.NaN()
	}
	if !t.sorted {
		sort.Slice(t.latencies, func(i, j int) bool { return t.latencies[i] < t.latencies[j] })
		t.sorted = true
	}
	rank := int(math.Ceil(q * float64(len(t.latencies))))
	if rank < 1 {
		rank = 1
	}
	if rank > len(t.latencies) {
		rank = len(t.latencies)
	}
	return float64(t.latencies[rank-1]) / 1e3
}

func errorLines(results map[string]*total) []string {
	var out []string
	for k, t := range results {
		for e, n := range t.errors {
			out = append(out, fmt.Sprintf("%s: %d× %s", k, n, e))
		}
	}
	sort.Strings(out)
	return out
}

// cpuNs is the time all threads of pid have run, from /proc/<pid>/task/*/schedstat (0 if pid
// is 0 or gone). Threads that exited between two readings are not counted: the servers' tokio
// workers live as long as the process.
func cpuNs(pid int) uint64 {
	if pid <= 0 {
		return 0
	}
	dir := fmt.Sprintf("/proc/%d/task", pid)
	tasks, err := ioutil.ReadDir(dir)
	if err != nil {
		return 0
	}
	var sum uint64
	for _, t := range tasks {
		b, err := ioutil.ReadFile(filepath.Join(dir, t.Name(), "schedstat"))
		if err != nil {
			continue
		}
		if f := strings.Fields(string(b)); len(f) > 0 {
			if n, err := strconv.ParseUint(f[0], 10, 64); err == nil {
				sum += n
			}
		}
	}
	return sum
}

func loadAverage() string {
	b, err := ioutil.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func ints(s string) []int {
	var out []int
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		n, err := strconv.Atoi(p)
		if err != nil || n <= 0 {
			die("not a positive count: " + p)
		}
		out = append(out, n)
	}
	return out
}

func secs(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

func check(err error) {
	if err != nil {
		die(err.Error())
	}
}

func die(msg string) {
	fmt.Fprintln(os.Stderr, "loadgen:", msg)
	os.Exit(2)
}
