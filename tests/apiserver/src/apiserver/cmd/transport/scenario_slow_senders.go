package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"
)

// slowSenders: hundreds of requests whose bodies trickle in (the head of a 100 KB /mutate
// body, its first KiB, then a byte every 1.5 s, starting over when cut), over HTTP/1.1
// connections of their own and HTTP/2 streams, while the API server's client sends admissions
// through its pool (docs/policy.md §7: a slow sender never starves the API server). Reading a body
// holds none of the server's decision slots, so none of the admissions may fail; the tricklers
// must be cut by the minimum body rate (408) about a second after they start, long before the
// request's deadline. Also notes the server's peak RSS.
func slowSenders(h *harness) *result {
	const (
		h1Tricklers   = 200
		h2Connections = 16
		h2Streams     = 4
		attack        = 10 * time.Second
		workers       = 8
		declared      = 100000
		first         = 1024
		every         = 1500 * time.Millisecond
		// Well before the request's 9 s budget (timeout=10s), and a byte comes within every
		// --body-progress-timeout (2 s): only the rate rule cuts a trickler this early.
		cutBy = 5 * time.Second
	)
	r := &result{}
	s, _, t, err := h.startTarget("slow-senders")
	if err != nil {
		r.err = err
		return r
	}
	defer s.kill()
	sampler := sampleRSS(s, 20*time.Millisecond)

	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(h.ca.certPEM)
	var cutsMu sync.Mutex
	var cuts []time.Duration
	other := map[string]int{}
	record := func(d time.Duration, what string) {
		cutsMu.Lock()
		defer cutsMu.Unlock()
		if what == "" && d < cutBy {
			cuts = append(cuts, d)
			return
		}
		if what == "" {
			what = fmt.Sprintf("cut after %v", d.Round(100*time.Millisecond))
		}
		other[what]++
	}

	ctx, stop := context.WithTimeout(context.Background(), attack)
	defer stop()
	var wg sync.WaitGroup
	// HTTP/2 first: a connection holds one of the server's HTTP/2 slots until its handshake
	// tells its protocol, and 200 HTTP/1.1 handshakes at once could take them all.
	for i := 0; i < h2Connections; i++ {
		tr := &http.Transport{
			TLSClientConfig:   &tls.Config{RootCAs: roots, ServerName: serviceName, NextProtos: []string{"h2"}},
			ForceAttemptHTTP2: true,
		}
		c := &http.Client{Transport: tr}
		for j := 0; j < h2Streams; j++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					d, what := trickleH2(c, s.url("/mutate?timeout=10s"), declared, first, every)
					if ctx.Err() == nil || what == "" {
						record(d, what)
					}
				}
			}()
		}
		defer tr.CloseIdleConnections()
	}
	for i := 0; i < h1Tricklers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				d, what := trickleH1(s.addr, roots, declared, first, every)
				if ctx.Err() == nil || what == "" {
					record(d, what)
				}
			}
		}()
	}
	time.Sleep(500 * time.Millisecond)
	tally := newTally()
	closedLoop(ctx, t, t.client(), workers, tally)
	wg.Wait()
	peak := sampler.finish()
	_, hwm := s.memory()

	r.requests, r.failures = tally.counts()
	sort.Slice(cuts, func(i, j int) bool { return cuts[i] < cuts[j] })
	if len(cuts) == 0 {
		r.err = fmt.Errorf("no trickler was cut within %v: %v", cutBy, other)
	} else {
		r.note("%d trickling requests (%d HTTP/1.1, %d×%d HTTP/2) cut with 408 after %v to %v (median %v)",
			len(cuts), h1Tricklers, h2Connections, h2Streams, cuts[0].Round(time.Millisecond),
			cuts[len(cuts)-1].Round(time.Millisecond), cuts[len(cuts)/2].Round(time.Millisecond))
	}
	// A few tricklers may end otherwise (a handshake the busy machine did not finish in time);
	// more than one in twenty means the rule is not what cuts them.
	if n := sum(other); n > len(cuts)/20 {
		r.err = fmt.Errorf("%d tricklers not cut by the rate rule: %v", n, other)
	}
	r.note("RSS peak %s (VmHWM %s)", mib(peak), mib(hwm))
	if e := tally.errorSummary(); e != "" {
		r.note("errors: %s", e)
	}
	return r
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// trickleH1 sends one trickling request on a new HTTP/1.1 connection and returns how long after
// its first part the server answered 408 and closed the connection, or what happened instead.
func trickleH1(addr string, roots *x509.CertPool, declared, first int, every time.Duration) (time.Duration, string) {
	dialer := &net.Dialer{Timeout: 10 * time.Second}
	conn, err := tls.DialWithDialer(dialer, "tcp", addr, &tls.Config{RootCAs: roots, ServerName: serviceName, NextProtos: []string{"http/1.1"}})
	if err != nil {
		return 0, "connect: " + addrPattern.ReplaceAllString(err.Error(), "addr")
	}
	defer conn.Close()
	head := fmt.Sprintf("POST /mutate?timeout=10s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", serviceName, declared)
	if _, err := conn.Write(append([]byte(head), []byte(strings.Repeat(" ", first))...)); err != nil {
		return 0, "write: " + err.Error()
	}
	start := time.Now()
	done := make(chan struct{})
	go func() {
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				if _, err := conn.Write([]byte(" ")); err != nil {
					return
				}
			}
		}
	}()
	defer close(done)
	_ = conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return time.Since(start), "no answer: " + err.Error()
	}
	after := time.Since(start)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestTimeout {
		return after, fmt.Sprintf("HTTP %d", resp.StatusCode)
	}
	if !resp.Close {
		return after, "408 without Connection: close"
	}
	return after, ""
}

// trickleH2 sends one trickling request as a stream of c's HTTP/2 connection.
func trickleH2(c *http.Client, url string, declared, first int, every time.Duration) (time.Duration, string) {
	pr, pw := io.Pipe()
	req, err := http.NewRequest("POST", url, pr)
	if err != nil {
		return 0, err.Error()
	}
	req.ContentLength = int64(declared)
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	go func() {
		if _, err := pw.Write([]byte(strings.Repeat(" ", first))); err != nil {
			return
		}
		for {
			time.Sleep(every)
			if _, err := pw.Write([]byte(" ")); err != nil {
				return
			}
		}
	}()
	defer pw.CloseWithError(io.ErrClosedPipe)
	resp, err := c.Do(req)
	after := time.Since(start)
	if err != nil {
		return after, "no answer: " + addrPattern.ReplaceAllString(err.Error(), "addr")
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.ProtoMajor != 2 {
		return after, "not HTTP/2: " + resp.Proto
	}
	if resp.StatusCode != http.StatusRequestTimeout {
		return after, fmt.Sprintf("HTTP %d", resp.StatusCode)
	}
	return after, ""
}
