package main

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// server is one `modelgate serve` process under test.
type server struct {
	cmd    *exec.Cmd
	URL    string // https://127.0.0.1:PORT
	CAPEM  []byte
	logOut *os.File
}

// startServer runs `modelgate serve --dev` (a throwaway CA and a localhost certificate in
// workDir/certs) on free loopback ports, with the cluster state from cachesFiles only, and
// waits for /readyz.
func startServer(bin, workDir string, cachesFiles []string) (*server, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	probe, err := freePort()
	if err != nil {
		return nil, err
	}
	args := []string{"serve", "--dev", "--no-cluster",
		"--certs-dir", filepath.Join(workDir, "certs"),
		"--listen", fmt.Sprintf("127.0.0.1:%d", port),
		"--probe-listen", fmt.Sprintf("127.0.0.1:%d", probe),
		"--shutdown-grace", "1s",
	}
	for _, f := range cachesFiles {
		args = append(args, "--caches", f)
	}
	logOut, err := os.Create(filepath.Join(workDir, "modelgate.log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logOut, logOut
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %v", bin, err)
	}
	s := &server{cmd: cmd, URL: fmt.Sprintf("https://127.0.0.1:%d", port), logOut: logOut}
	ready := fmt.Sprintf("http://127.0.0.1:%d/readyz", probe)
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if resp, err := http.Get(ready); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				s.CAPEM, err = os.ReadFile(filepath.Join(workDir, "certs", "ca.crt"))
				return s, err
			}
		}
		if cmd.ProcessState != nil {
			break
		}
	}
	s.stop()
	return nil, fmt.Errorf("modelgate did not become ready; see %s", logOut.Name())
}

// stop sends SIGTERM and waits; after 10 s it kills the process.
func (s *server) stop() {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = s.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = s.cmd.Process.Kill()
		<-done
	}
	s.logOut.Close()
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
