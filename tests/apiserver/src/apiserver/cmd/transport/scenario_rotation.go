package main

import (
	"context"
	"fmt"
	"math/big"
	"sync"
	"time"
)

// certRotation: the serving certificate is replaced (new key, same CA) several times under load,
// written as the kubelet updates a Secret volume. No call may fail, connections made before a
// rotation keep working, and new connections must get the new certificate within a few seconds
// (the server polls its files).
func certRotation(h *harness) *result {
	const (
		workers   = 16
		rotations = 4
		every     = 2500 * time.Millisecond
		maxLag    = 5 * time.Second
	)
	r := &result{}
	s, certs, t, err := h.startTarget("rotation")
	if err != nil {
		r.err = err
		return r
	}
	defer s.kill()

	tally := newTally()
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); closedLoop(ctx, t, t.client(), workers, tally) }()

	// A prober makes every call on a new connection (a client of its own) and notes when it
	// first saw each certificate.
	var mu sync.Mutex
	firstSeen := map[string]time.Time{}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			c := t.client()
			resp := t.call(c, tally)
			c.CloseIdleConnections()
			if resp != nil && resp.TLS != nil && len(resp.TLS.PeerCertificates) > 0 {
				serial := resp.TLS.PeerCertificates[0].SerialNumber.String()
				mu.Lock()
				if _, ok := firstSeen[serial]; !ok {
					firstSeen[serial] = time.Now()
				}
				mu.Unlock()
			}
			sleepCtx(ctx, 50*time.Millisecond)
		}
	}()

	type rotation struct {
		serial *big.Int
		at     time.Time
	}
	var done []rotation
	for i := 0; i < rotations && r.err == nil; i++ {
		time.Sleep(every)
		if err := certs.rotate(h.ca); err != nil {
			r.err = err
			break
		}
		done = append(done, rotation{certs.serial, time.Now()})
	}
	time.Sleep(every)
	stop()
	wg.Wait()

	r.requests, r.failures = tally.counts()
	var lags []string
	for i, rot := range done {
		seen, ok := firstSeen[rot.serial.String()]
		switch {
		case !ok:
			lags = append(lags, "never")
			r.err = fmt.Errorf("no new connection got certificate %d within %v", i+1, every)
		default:
			lag := seen.Sub(rot.at)
			lags = append(lags, fmt.Sprintf("%.1fs", lag.Seconds()))
			if lag > maxLag {
				r.err = fmt.Errorf("rotation %d reached new connections only after %v", i+1, lag)
			}
		}
	}
	r.note("%d rotations; new connections had the new certificate after %v", len(done), lags)
	if e := tally.errorSummary(); e != "" {
		r.note("errors: %s", e)
	}
	return r
}
