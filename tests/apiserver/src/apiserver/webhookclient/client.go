// Package webhookclient is kube-apiserver's HTTP client for admission webhooks, rebuilt from the
// upstream code with the standard library only, so that a harness can call modelgate exactly as
// the API server does: the same transport settings, the same request, the same (lack of) retries,
// and the same verification of the answer.
//
// Upstream (kubernetes/kubernetes, staging/src/k8s.io/...):
//   - apiserver/pkg/util/webhook/client.go         ClientManager.HookClient: NextProtos http/1.1, CA
//   - apiserver/pkg/util/webhook/authentication.go setGlobalDefaults: UserAgent, 30 s client timeout
//   - client-go/transport/cache.go                  tlsTransportCache.get: the http.Transport
//   - client-go/transport/transport.go              TLSConfigFor: the tls.Config
//   - apimachinery/pkg/util/net/http.go             SetTransportDefaults / SetOldTransportDefaults
//   - client-go/rest/request.go                     Request.request / Do: no retry of a failed POST
//   - apiserver/pkg/admission/plugin/webhook/mutating/dispatcher.go (and validating/): callHook
//   - apiserver/pkg/admission/plugin/webhook/request/admissionreview.go: VerifyAdmissionResponse
package webhookclient

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"net/http"
	"time"
)

// Values kube-apiserver uses; each names the upstream code it comes from.
const (
	// client-go/transport/cache.go: const idleConnsPerHost = 25.
	MaxIdleConnsPerHost = 25
	// net/http.DefaultTransport.IdleConnTimeout, copied in by SetOldTransportDefaults because
	// tlsTransportCache.get leaves IdleConnTimeout unset.
	IdleConnTimeout = 90 * time.Second
	// client-go/transport/cache.go: TLSHandshakeTimeout: 10 * time.Second.
	TLSHandshakeTimeout = 10 * time.Second
	// client-go/transport/cache.go: the dialer used when rest.Config.Dial is nil (URL webhooks).
	DialTimeout   = 30 * time.Second
	DialKeepAlive = 30 * time.Second
	// apiserver/pkg/util/webhook/authentication.go setGlobalDefaults: config.Timeout, which
	// rest.RESTClientFor turns into http.Client.Timeout.
	ClientTimeout = 30 * time.Second
	// setGlobalDefaults: config.UserAgent.
	UserAgent = "kube-apiserver-admission"
	// admissionregistration/v1 defaulting: timeoutSeconds defaults to 10; callHook turns it into
	// the request context's deadline.
	DefaultWebhookTimeout = 10 * time.Second
	// client-go/rest/request.go NewRequest: maxRetries: 10 (only for Retry-After answers).
	MaxRetries = 10
)

// New returns the *http.Client kube-apiserver builds for one webhook whose clientConfig has
// caBundle caPEM; serverName is the name the serving certificate must carry (for a Service
// webhook "<service>.<namespace>.svc", which HookClient sets as TLSClientConfig.ServerName).
//
// Like upstream, one client (one connection pool) serves every call to that webhook: callers
// share it between goroutines, as the API server shares its cached RESTClient.
func New(caPEM []byte, serverName string) *http.Client {
	return &http.Client{
		Transport: NewTransport(caPEM, serverName),
		Timeout:   ClientTimeout,
	}
}

// NewTransport is the http.Transport of New.
func NewTransport(caPEM []byte, serverName string) *http.Transport {
	return &http.Transport{
		// tlsTransportCache.get sets http.ProxyFromEnvironment; SetOldTransportDefaults wraps it
		// in NewProxierWithNoProxyCIDR (CIDRs in NO_PROXY). Loopback is never proxied either way.
		Proxy:               http.ProxyFromEnvironment,
		TLSHandshakeTimeout: TLSHandshakeTimeout,
		TLSClientConfig:     TLSConfig(caPEM, serverName),
		MaxIdleConnsPerHost: MaxIdleConnsPerHost,
		DialContext: (&net.Dialer{
			Timeout:   DialTimeout,
			KeepAlive: DialKeepAlive,
		}).DialContext,
		// SetOldTransportDefaults: IdleConnTimeout from http.DefaultTransport (90 s).
		IdleConnTimeout: IdleConnTimeout,
		// Left at their zero values upstream, so at Go's defaults here too: MaxIdleConns 0 (no
		// total limit), MaxConnsPerHost 0 (no limit: every concurrent call beyond the idle pool
		// opens a new connection), DisableKeepAlives false, DisableCompression false (the
		// transport asks for gzip). SetTransportDefaults does not configure HTTP/2 because
		// NextProtos is set and lacks "h2" (allowsHTTP2), and net/http does not either for a
		// transport with its own TLSClientConfig and dialer.
	}
}

// TLSConfig is client-go's TLSConfigFor for a webhook: TLS 1.2 or later, the caBundle as the
// only roots, the service name as ServerName, and ALPN "http/1.1" only (HookClient:
// cfg.NextProtos = []string{"http/1.1"}, kubernetes#75791). The API server presents no client
// certificate to a webhook unless its admission kubeconfig says so.
func TLSConfig(caPEM []byte, serverName string) *tls.Config {
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		// Upstream refuses to build the client; a harness that gets here has a bug.
		panic(errors.New("webhookclient: caBundle holds no PEM certificate"))
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		ServerName: serverName,
		NextProtos: []string{"http/1.1"},
		RootCAs:    roots,
	}
}
