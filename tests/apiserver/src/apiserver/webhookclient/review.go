package webhookclient

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Call is one webhook call as the dispatcher's callHook makes it.
type Call struct {
	// URL of the webhook (https://host:port/path).
	URL string
	// Review is the AdmissionReview to send, JSON; its request.uid and apiVersion are what the
	// answer is verified against.
	Review []byte
	// Mutating selects the verification: a mutating webhook may answer with a patch, a
	// validating one may not.
	Mutating bool
	// Timeout is the webhook's timeoutSeconds; zero means the default, 10 s.
	Timeout time.Duration
}

// Response is the answer to one call, verified as VerifyAdmissionResponse verifies it.
type Response struct {
	// StatusCode, Header and Body of the final HTTP answer.
	StatusCode int
	Header     http.Header
	Body       []byte
	// Close says the answer ended its connection ("Connection: close", which net/http removes
	// from Header): the client closed it and sends the next call on another.
	Close bool
	// TLS is the connection state of the final attempt (the serving certificate it saw).
	TLS *tls.ConnectionState
	// Conn says whether the final attempt reused a pooled connection, and how long it had
	// been idle (net/http/httptrace).
	Conn httptrace.GotConnInfo
	// Retries is how many times a Retry-After answer was retried (client-go's only retry).
	Retries int

	// The fields of AdmissionResponse (admissionreview.go), once verified.
	UID              string
	Allowed          bool
	Patch            []byte
	PatchType        string
	Result           map[string]interface{}
	Warnings         []string
	AuditAnnotations map[string]string
}

// Review calls the webhook at url with reviewJSON through client (see New) and verifies the
// answer, as the API server does. A URL whose path ends in "/validate" is called as a validating
// webhook, any other as a mutating one. The error is what would make the API server apply the
// webhook's failurePolicy: a transport error (never retried for a POST), an HTTP status outside
// 200..206, an answer that does not decode, or one that VerifyAdmissionResponse refuses. The
// Response is returned when there was an HTTP answer, also together with an error.
func Review(client *http.Client, url string, reviewJSON []byte) (*Response, error) {
	return Call{
		URL:      url,
		Review:   reviewJSON,
		Mutating: !strings.HasSuffix(strings.TrimRight(url, "/"), "/validate"),
	}.Do(context.Background(), client)
}

// Do makes the call: client-go's Request.Do with the body bytes of the review, inside the
// deadline callHook sets from timeoutSeconds.
func (c Call) Do(ctx context.Context, client *http.Client) (*Response, error) {
	sent, err := parseRequest(c.Review)
	if err != nil {
		return nil, err
	}
	timeout := c.Timeout
	if timeout == 0 {
		timeout = DefaultWebhookTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	target, err := withTimeoutParam(ctx, c.URL)
	if err != nil {
		return nil, err
	}

	resp, err := post(ctx, client, target, c.Review)
	if err != nil {
		return resp, err
	}
	// client-go's transformResponse: any status outside 200..206 is an error.
	if resp.StatusCode < http.StatusOK || resp.StatusCode > http.StatusPartialContent {
		return resp, fmt.Errorf("the server responded with the status code %d: %s",
			resp.StatusCode, truncate(resp.Body, 200))
	}
	if err := verify(resp, sent, c.Mutating); err != nil {
		return resp, err
	}
	return resp, nil
}

// withTimeoutParam adds "?timeout=<seconds>s" as callHook does (Request.Timeout with the time
// left until the deadline, rounded up to a whole second; Request.URL puts it in the query).
func withTimeoutParam(ctx context.Context, raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", err
	}
	if deadline, ok := ctx.Deadline(); ok {
		if left := time.Until(deadline); left > 0 {
			if truncated := left.Truncate(time.Second); truncated != left {
				left = truncated + time.Second
			}
			q := u.Query()
			q.Set("timeout", left.String())
			u.RawQuery = q.Encode()
		}
	}
	return u.String(), nil
}

// post is client-go's Request.request for a POST: each attempt gets a fresh reader over the same
// bytes (newHTTPRequest, so net/http can rewind it: GetBody is set), a transport error is
// returned at once (isErrRetryableFunc retries only GET), and only an answer 429 or 5xx with a
// Retry-After in seconds is retried, at most MaxRetries times (withRetry, checkWait).
func post(ctx context.Context, client *http.Client, target string, body []byte) (*Response, error) {
	var retries int
	for {
		var conn httptrace.GotConnInfo
		trace := &httptrace.ClientTrace{GotConn: func(info httptrace.GotConnInfo) { conn = info }}
		req, err := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, trace),
			http.MethodPost, target, bytes.NewReader(body))
		if err != nil {
			return nil, err
		}
		// Body(runtime.Object) sets the content type; NewRequest sets Accept from it; the
		// user-agent round tripper (HTTPWrappersForConfig) sets User-Agent.
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, */*")
		req.Header.Set("User-Agent", UserAgent)

		httpResp, err := client.Do(req)
		if err != nil {
			return nil, err
		}
		data, readErr := io.ReadAll(httpResp.Body)
		httpResp.Body.Close()
		resp := &Response{
			StatusCode: httpResp.StatusCode,
			Header:     httpResp.Header,
			Body:       data,
			Close:      httpResp.Close,
			TLS:        httpResp.TLS,
			Conn:       conn,
			Retries:    retries,
		}
		if readErr != nil {
			return resp, readErr
		}
		wait, ok := retryAfter(httpResp)
		if !ok || retries >= MaxRetries {
			return resp, nil
		}
		retries++
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return resp, ctx.Err()
		}
	}
}

// retryAfter is client-go's checkWait: a 429 or any 5xx with an integer Retry-After.
func retryAfter(resp *http.Response) (time.Duration, bool) {
	if resp.StatusCode != http.StatusTooManyRequests && resp.StatusCode < 500 {
		return 0, false
	}
	seconds, err := strconv.Atoi(resp.Header.Get("Retry-After"))
	if err != nil {
		return 0, false
	}
	return time.Duration(seconds) * time.Second, true
}

func truncate(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "..."
	}
	return string(b)
}
