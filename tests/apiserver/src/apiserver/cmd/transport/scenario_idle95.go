package main

import "time"

// idle95s: connections left idle 95 s, longer than the client keeps them, then used: the client
// has retired them itself at 90 s, and the calls must all succeed on new connections.
func idle95s(h *harness) *result {
	const calls = 40 // 25 stay in the pool, 15 are closed by the client at once
	r := &result{}
	s, _, t, err := h.startTarget("idle-95s")
	if err != nil {
		r.err = err
		return r
	}
	defer s.kill()
	tally := newTally()
	c := t.client()
	burst(t, c, calls, tally)
	time.Sleep(95 * time.Second)
	answers := burst(t, c, calls, tally)
	reused := 0
	for _, a := range answers {
		if a != nil && a.Conn.Reused {
			reused++
		}
	}
	r.requests, r.failures = tally.counts()
	r.note("%d calls after 95 s idle, %d on a reused connection", calls, reused)
	if e := tally.errorSummary(); e != "" {
		r.note("errors: %s", e)
	}
	return r
}
