package main

import (
	"fmt"
	"net/http"
	"sync"
	"time"
)

// burst200: 200 admissions at the same instant, as when a Deployment of 200 replicas is
// created: the API server's pool holds at most 25 idle connections, so every concurrent call
// beyond them opens a new TLS connection (docs/policy.md §7). Against the default --max-connections, none
// may fail: a server at its cap must leave the excess in the listen backlog, not accept and
// close it. Also measures the server's RSS at the burst's peak.
func burst200(h *harness) *result {
	const calls = 200
	r := &result{}
	s, _, t, err := h.startTarget("burst")
	if err != nil {
		r.err = err
		return r
	}
	defer s.kill()
	before, _ := s.memory()
	sampler := sampleRSS(s, 5*time.Millisecond)
	tally := newTally()
	answers := burst(t, t.client(), calls, tally)
	peak := sampler.finish()
	_, hwm := s.memory()

	r.requests, r.failures = tally.counts()
	opened := 0
	for _, a := range answers {
		if a != nil && !a.Conn.Reused {
			opened++
		}
	}
	r.note("%d answered on new connections", opened)
	r.note("RSS %s before, %s at the burst's peak (VmHWM %s)", mib(before), mib(peak), mib(hwm))
	if e := tally.errorSummary(); e != "" {
		r.note("errors: %s", e)
	}
	return r
}

// connectionCap: --max-connections connections held open and idle (each after one request, as
// the pools of several API servers hold them), then 50 more calls on new connections. Those must
// wait in the listen backlog and be served once held connections close (here: 1 s later, well
// inside the client's 10 s TLS handshake timeout), not be accepted and closed. Measures the RSS
// the server needs at its connection cap.
func connectionCap(h *harness) *result {
	const (
		extra   = 50
		maxHeld = 8192 // beyond it the harness would measure itself more than the server
	)
	max := h.defaults.maxConnections
	r := &result{}
	if max > maxHeld {
		r.err = fmt.Errorf("--max-connections default %d: more than this scenario holds (%d)", max, maxHeld)
		return r
	}
	s, _, t, err := h.startTarget("cap")
	if err != nil {
		r.err = err
		return r
	}
	defer s.kill()
	before, _ := s.memory()
	tally := newTally()

	// One client per held connection, so that each keeps exactly one idle connection; 32 at a
	// time, so that opening them does not itself overflow anything.
	holders := make([]*http.Client, max)
	sem := make(chan struct{}, 32)
	var wg sync.WaitGroup
	for i := range holders {
		holders[i] = t.client()
		wg.Add(1)
		sem <- struct{}{}
		go func(c *http.Client) {
			defer wg.Done()
			t.call(c, tally)
			<-sem
		}(holders[i])
	}
	wg.Wait()
	held, heldFailed := tally.counts()
	time.Sleep(200 * time.Millisecond)
	atCap, hwm := s.memory()

	done := make(chan struct{})
	go func() {
		burst(t, t.client(), extra, tally)
		close(done)
	}()
	time.Sleep(time.Second)
	for _, c := range holders[:extra] {
		c.CloseIdleConnections()
	}
	<-done
	for _, c := range holders[extra:] {
		c.CloseIdleConnections()
	}

	r.requests, r.failures = tally.counts()
	r.note("%d connections held (%d failed to open), then %d more calls", held-heldFailed, heldFailed, extra)
	perConn := "n/a"
	if max > 0 {
		perConn = fmt.Sprintf("%.1f KiB", float64(atCap-before)/float64(max))
	}
	r.note("RSS %s before, %s at the cap of %d connections (%s each; VmHWM %s)",
		mib(before), mib(atCap), max, perConn, mib(hwm))
	if e := tally.errorSummary(); e != "" {
		r.note("errors: %s", e)
	}
	return r
}

func mib(kib int64) string { return fmt.Sprintf("%.1f MiB", float64(kib)/1024) }
