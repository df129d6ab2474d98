package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"apiserver/webhookclient"
)

// target is the webhook as one API server sees it: a URL, the webhook's caBundle and the
// review to send (each call gets a fresh request.uid, as CreateAdmissionObjects gives it).
type target struct {
	url      string
	caPEM    []byte
	review   []byte // template
	uid      []byte // request.uid in the template
	mutating bool
}

func newTarget(url string, caPEM, review []byte) (*target, error) {
	var r struct {
		Request struct {
			UID string `json:"uid"`
		} `json:"request"`
	}
	if err := json.Unmarshal(review, &r); err != nil || r.Request.UID == "" {
		return nil, fmt.Errorf("the review has no request.uid (%v)", err)
	}
	return &target{url: url, caPEM: caPEM, review: review, uid: []byte(r.Request.UID),
		mutating: !strings.HasSuffix(url, "/validate")}, nil
}

// client is a new API-server webhook client (its own connection pool) for t.
func (t *target) client() *http.Client { return webhookclient.New(t.caPEM, serviceName) }

// call sends one review through c and records the outcome in tally. A failed admission is any
// error webhookclient reports (transport, status, verification), a denial, or a patch that is
// not a JSON array.
func (t *target) call(c *http.Client, tally *tally) *webhookclient.Response {
	body := bytes.Replace(t.review, t.uid, []byte(newUID()), 1)
	resp, err := webhookclient.Call{URL: t.url, Review: body, Mutating: t.mutating}.Do(context.Background(), c)
	if err == nil && !resp.Allowed {
		err = fmt.Errorf("denied: %v", resp.Result)
	}
	if err == nil && len(resp.Patch) > 0 {
		var ops []map[string]interface{}
		if jerr := json.Unmarshal(resp.Patch, &ops); jerr != nil {
			err = fmt.Errorf("patch is not a JSON Patch: %v", jerr)
		}
	}
	tally.record(resp, err)
	if err != nil {
		return nil
	}
	return resp
}

func newUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// tally counts the requests and failed admissions of one scenario.
type tally struct {
	mu       sync.Mutex
	requests int
	failures int
	errors   map[string]int
	// connClose counts answers that carried "Connection: close".
	connClose int
}

func newTally() *tally { return &tally{errors: map[string]int{}} }

func (t *tally) record(resp *webhookclient.Response, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.requests++
	if resp != nil && resp.Close {
		t.connClose++
	}
	if err != nil {
		t.failures++
		t.errors[errorKind(err)]++
	}
}

func (t *tally) counts() (requests, failures int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.requests, t.failures
}

var addrPattern = regexp.MustCompile(`\d+\.\d+\.\d+\.\d+:\d+`)

// errorKind is err without the URL and the addresses, so that equal causes count together.
func errorKind(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	return addrPattern.ReplaceAllString(err.Error(), "addr")
}

// errorSummary lists the causes of failure, most frequent first.
func (t *tally) errorSummary() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	kinds := make([]string, 0, len(t.errors))
	for k := range t.errors {
		kinds = append(kinds, k)
	}
	sort.Slice(kinds, func(i, j int) bool { return t.errors[kinds[i]] > t.errors[kinds[j]] })
	var parts []string
	for _, k := range kinds {
		parts = append(parts, fmt.Sprintf("%d× %s", t.errors[k], k))
	}
	return strings.Join(parts, "; ")
}

// closedLoop runs workers that each send one review after another through the shared client c
// (one pool, as the API server has per webhook) until ctx ends.
func closedLoop(ctx context.Context, t *target, c *http.Client, workers int, tally *tally) {
	var wg sync.WaitGroup
	for i := 0; i < workers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				t.call(c, tally)
			}
		}()
	}
	wg.Wait()
}

// burst sends n reviews at the same instant through c and waits for all of them; the answers
// are returned in no particular order (nil for a failed call).
func burst(t *target, c *http.Client, n int, tally *tally) []*webhookclient.Response {
	start := make(chan struct{})
	out := make([]*webhookclient.Response, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			<-start
			out[i] = t.call(c, tally)
		}(i)
	}
	time.Sleep(10 * time.Millisecond) // let every goroutine reach the barrier
	close(start)
	wg.Wait()
	return out
}
