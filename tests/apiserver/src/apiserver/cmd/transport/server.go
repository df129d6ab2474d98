package main

import (
	"bufio"
	"errors"
	"fmt"
	"math/rand"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// server is one `modelgate serve` process on loopback ports of its own.
type server struct {
	name      string
	cmd       *exec.Cmd
	addr      string // webhook listener, host:port
	probeAddr string // plain-HTTP probe listener
	logPath   string
	exited    chan struct{}
	exitErr   error
	exitedAt  time.Time
}

// startServer starts the binary with the serving pair in certs and extra flags, and waits until
// /readyz answers 200. It retries with other ports if the chosen ones were taken meanwhile.
func startServer(h *harness, name string, certs *certDir, extra ...string) (*server, error) {
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		s, err := tryStartServer(h, name, certs, extra)
		if err == nil {
			h.track(s)
			return s, nil
		}
		lastErr = err
	}
	return nil, lastErr
}

func tryStartServer(h *harness, name string, certs *certDir, extra []string) (*server, error) {
	webhookPort, probePort := freePort(), freePort()
	s := &server{
		name:      name,
		addr:      fmt.Sprintf("127.0.0.1:%d", webhookPort),
		probeAddr: fmt.Sprintf("127.0.0.1:%d", probePort),
		logPath:   filepath.Join(h.workdir, name+".log"),
		exited:    make(chan struct{}),
	}
	args := append([]string{
		"serve",
		"--listen", s.addr,
		"--probe-listen", s.probeAddr,
		"--tls-cert", certs.certFile(),
		"--tls-key", certs.keyFile(),
		"--no-cluster",
	}, extra...)
	logFile, err := os.Create(s.logPath)
	if err != nil {
		return nil, err
	}
	s.cmd = exec.Command(h.bin, args...)
	s.cmd.Stdout, s.cmd.Stderr = logFile, logFile
	s.cmd.Env = cleanEnv()
	// The server dies with the harness, however the harness ends.
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		logFile.Close()
		return nil, err
	}
	go func() {
		s.exitErr = s.cmd.Wait()
		s.exitedAt = time.Now()
		logFile.Close()
		close(s.exited)
	}()
	if err := s.waitReady(30 * time.Second); err != nil {
		s.kill()
		return nil, fmt.Errorf("%s: %v (log: %s)", name, err, s.logPath)
	}
	return s, nil
}

// cleanEnv is this process's environment without MODELGATE_* settings, which would change the
// server's defaults under the harness.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "MODELGATE_") {
			env = append(env, kv)
		}
	}
	return env
}

func (s *server) waitReady(limit time.Duration) error {
	deadline := time.Now().Add(limit)
	probe := &http.Client{Timeout: time.Second}
	for time.Now().Before(deadline) {
		select {
		case <-s.exited:
			return fmt.Errorf("exited before it was ready: %v", s.exitErr)
		default:
		}
		resp, err := probe.Get("http://" + s.probeAddr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return errors.New("/readyz not 200 in time")
}

func (s *server) url(path string) string { return "https://" + s.addr + path }

func (s *server) signal(sig syscall.Signal) error { return s.cmd.Process.Signal(sig) }

func (s *server) kill() {
	select {
	case <-s.exited:
	default:
		_ = s.cmd.Process.Kill()
		<-s.exited
	}
}

// memory reads VmRSS and VmHWM (peak RSS) of the process, in KiB.
func (s *server) memory() (rss, hwm int64) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", s.cmd.Process.Pid))
	if err != nil {
		return 0, 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 {
			continue
		}
		v, _ := strconv.ParseInt(fields[1], 10, 64)
		switch fields[0] {
		case "VmRSS:":
			rss = v
		case "VmHWM:":
			hwm = v
		}
	}
	return rss, hwm
}

// rssSampler records the largest VmRSS seen while it runs.
type rssSampler struct {
	stop chan struct{}
	done chan struct{}
	peak int64
}

func sampleRSS(s *server, every time.Duration) *rssSampler {
	r := &rssSampler{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(r.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			if rss, _ := s.memory(); rss > r.peak {
				r.peak = rss
			}
			select {
			case <-r.stop:
				return
			case <-t.C:
			}
		}
	}()
	return r
}

func (r *rssSampler) finish() int64 {
	close(r.stop)
	<-r.done
	return r.peak
}

var ports = struct {
	sync.Mutex
	used map[int]bool
}{used: map[int]bool{}}

// freePort picks a loopback port below the kernel's ephemeral range (32768 and up on Linux),
// so that the harness's own outgoing connections cannot take it before the server binds it.
func freePort() int {
	ports.Lock()
	defer ports.Unlock()
	for {
		p := 20000 + rand.Intn(12000)
		if ports.used[p] {
			continue
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			continue
		}
		l.Close()
		ports.used[p] = true
		return p
	}
}

// serveDefaults are defaults of `serve` flags, read from `serve --help` so that the scenarios
// follow the binary under test.
type serveDefaults struct {
	idleTimeout    time.Duration
	maxConnections int
	shutdownGrace  time.Duration
}

func readServeDefaults(bin string) (serveDefaults, error) {
	out, err := exec.Command(bin, "serve", "--help").Output()
	if err != nil {
		return serveDefaults{}, fmt.Errorf("%s serve --help: %v", bin, err)
	}
	text := string(out)
	var d serveDefaults
	if d.idleTimeout, err = durationDefault(text, "--idle-timeout"); err != nil {
		return d, err
	}
	if d.shutdownGrace, err = durationDefault(text, "--shutdown-grace"); err != nil {
		return d, err
	}
	v, err := flagDefault(text, "--max-connections")
	if err != nil {
		return d, err
	}
	if d.maxConnections, err = strconv.Atoi(v); err != nil {
		return d, fmt.Errorf("--max-connections default %q: %v", v, err)
	}
	return d, nil
}

// flagDefault finds "[default: X]" in the help text of one flag (from its "  --flag <VALUE>"
// line to the next option line).
func flagDefault(help, flag string) (string, error) {
	start := regexp.MustCompile(`(?m)^ +` + regexp.QuoteMeta(flag) + ` <`).FindStringIndex(help)
	if start == nil {
		return "", fmt.Errorf("serve --help has no %s", flag)
	}
	rest := help[start[1]:]
	if next := regexp.MustCompile(`(?m)^ +-`).FindStringIndex(rest); next != nil {
		rest = rest[:next[0]]
	}
	m := regexp.MustCompile(`\[default: ([^\]]+)\]`).FindStringSubmatch(rest)
	if m == nil {
		return "", fmt.Errorf("serve --help shows no default for %s", flag)
	}
	return m[1], nil
}

func durationDefault(help, flag string) (time.Duration, error) {
	v, err := flagDefault(help, flag)
	if err != nil {
		return 0, err
	}
	d, err := time.ParseDuration(strings.ReplaceAll(v, " ", ""))
	if err != nil {
		return 0, fmt.Errorf("%s default %q: %v", flag, v, err)
	}
	return d, nil
}
