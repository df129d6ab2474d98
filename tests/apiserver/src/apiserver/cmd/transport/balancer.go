package main

import (
	"errors"
	"io"
	"net"
	"sync"
	"syscall"
	"time"
)

// balancer is a connection-level (L4) load balancer in front of webhook replicas, as a Service's
// kube-proxy rules are: each new connection goes to the next backend in rotation, and a backend
// taken out of rotation (its pod deleted: its endpoint removed) keeps the connections it already
// has, which live on until one side closes them. It splices bytes and never looks into TLS.
type balancer struct {
	listener net.Listener

	mu       sync.Mutex
	active   []string       // backends in rotation
	next     int            // round-robin position
	open     map[string]int // connections open per backend
	accepted map[string]int // connections ever sent to each backend
	refused  int            // connections that found no backend
}

func newBalancer(backends ...string) (*balancer, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	b := &balancer{
		listener: l,
		active:   append([]string(nil), backends...),
		open:     map[string]int{},
		accepted: map[string]int{},
	}
	go b.serve()
	return b, nil
}

func (b *balancer) addr() string { return b.listener.Addr().String() }

func (b *balancer) close() { b.listener.Close() }

// remove takes backend out of rotation; its open connections are left alone.
func (b *balancer) remove(backend string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i, a := range b.active {
		if a == backend {
			b.active = append(b.active[:i], b.active[i+1:]...)
			return
		}
	}
}

// stats returns the open and total connections of backend.
func (b *balancer) stats(backend string) (open, total int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.open[backend], b.accepted[backend]
}

func (b *balancer) pick() (string, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.active) == 0 {
		b.refused++
		return "", false
	}
	backend := b.active[b.next%len(b.active)]
	b.next++
	b.open[backend]++
	b.accepted[backend]++
	return backend, true
}

func (b *balancer) done(backend string) {
	b.mu.Lock()
	b.open[backend]--
	b.mu.Unlock()
}

func (b *balancer) serve() {
	for {
		c, err := b.listener.Accept()
		if err != nil {
			return
		}
		go b.handle(c.(*net.TCPConn))
	}
}

func (b *balancer) handle(client *net.TCPConn) {
	backend, ok := b.pick()
	if !ok {
		// No endpoint: kube-proxy rejects the connection.
		reset(client)
		return
	}
	defer b.done(backend)
	c, err := net.DialTimeout("tcp", backend, 5*time.Second)
	if err != nil {
		// DNAT to a closed port: the client's connection is refused (reset).
		reset(client)
		return
	}
	server := c.(*net.TCPConn)
	_ = client.SetNoDelay(true)
	_ = server.SetNoDelay(true)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); splice(server, client) }()
	go func() { defer wg.Done(); splice(client, server) }()
	wg.Wait()
	client.Close()
	server.Close()
}

// splice copies from src to dst until src ends, then passes the end on as the packet path would:
// a FIN as a FIN (half-close), a reset as a reset.
func splice(dst, src *net.TCPConn) {
	_, err := io.Copy(dst, src)
	if err != nil && errors.Is(err, syscall.ECONNRESET) {
		reset(dst)
		return
	}
	_ = dst.CloseWrite()
}

// reset closes c with an RST instead of a FIN.
func reset(c *net.TCPConn) {
	_ = c.SetLinger(0)
	c.Close()
}
