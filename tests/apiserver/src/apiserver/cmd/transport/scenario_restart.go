package main

import (
	"context"
	"math/rand"
	"sync"
	"syscall"
	"time"
)

// rollingRestart: two replicas behind a connection-level balancer (as a Service through
// kube-proxy), continuous load from one API-server client (32 workers on one pool) plus a few
// sparse callers whose connections sit idle for seconds between calls. Then one replica's pod is
// deleted: its endpoint leaves the rotation and it gets SIGTERM at the same moment; it must keep
// answering its existing connections and move them off itself (Connection: close on every
// HTTP/1.1 answer from SIGTERM on), so that no call fails when it exits at the end of
// --shutdown-grace.
func rollingRestart(h *harness) *result {
	const (
		workers = 32
		sparse  = 4
	)
	r := &result{}
	a, _, err := h.startWithCerts("replica-a")
	if err != nil {
		r.err = err
		return r
	}
	defer a.kill()
	b, _, err := h.startWithCerts("replica-b")
	if err != nil {
		r.err = err
		return r
	}
	defer b.kill()
	lb, err := newBalancer(a.addr, b.addr)
	if err != nil {
		r.err = err
		return r
	}
	defer lb.close()
	t, err := h.target("https://" + lb.addr() + "/mutate")
	if err != nil {
		r.err = err
		return r
	}

	tally := newTally()
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); closedLoop(ctx, t, t.client(), workers, tally) }()
	for i := 0; i < sparse; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := t.client()
			for ctx.Err() == nil {
				t.call(c, tally)
				sleepCtx(ctx, time.Second+time.Duration(rand.Int63n(int64(3*time.Second))))
			}
		}()
	}

	time.Sleep(3 * time.Second)
	openAtTerm, _ := lb.stats(a.addr)
	beforeTerm, _ := tally.counts()
	lb.remove(a.addr)
	if err := a.signal(syscall.SIGTERM); err != nil {
		r.err = err
	}
	termAt := time.Now()
	select {
	case <-a.exited:
		r.note("replica A exited %.1fs after SIGTERM (grace %v)", a.exitedAt.Sub(termAt).Seconds(), h.defaults.shutdownGrace)
	case <-time.After(h.defaults.shutdownGrace + 60*time.Second):
		r.note("replica A still running %v after SIGTERM", h.defaults.shutdownGrace+60*time.Second)
	}
	afterExit, _ := tally.counts()
	time.Sleep(3 * time.Second)
	stop()
	wg.Wait()

	r.requests, r.failures = tally.counts()
	_, toA := lb.stats(a.addr)
	_, toB := lb.stats(b.addr)
	r.note("%d connections open to A at SIGTERM; connections made: A %d, B %d", openAtTerm, toA, toB)
	r.note("%d calls before SIGTERM, %d until A exited", beforeTerm, afterExit-beforeTerm)
	r.note("%d answers with Connection: close", tally.connClose)
	if e := tally.errorSummary(); e != "" {
		r.note("errors: %s", e)
	}
	return r
}

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
