package faulttest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/munchable/munchable-webhooks/internal/dbtest"
)

// Service is the service binary run as a child process. It keeps its
// address across restarts, as a provider's endpoint does, and appends every
// run's output (JSON log lines) to one log file.
type Service struct {
	bin     string
	env     []string
	addr    string
	logPath string
	client  *http.Client // for the harness's own probes

	mu       sync.Mutex
	cur      *serviceRun // the latest run; nil before the first Launch
	launches int
}

// serviceRun is one run of the binary. Its goroutine owns cmd.Wait, records
// the exit state and closes done.
type serviceRun struct {
	cmd   *exec.Cmd
	done  chan struct{}
	state *os.ProcessState // set before done is closed
}

// NewService prepares a service from bin with env as its whole environment.
// Unless env sets LISTEN_ADDR, the service listens on a free port on
// 127.0.0.1. Nothing runs until Launch or Start.
func NewService(bin string, env map[string]string, logPath string) (*Service, error) {
	addr := env["LISTEN_ADDR"]
	if addr == "" {
		port, err := dbtest.FreePort()
		if err != nil {
			return nil, err
		}
		addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	}
	vars := make([]string, 0, len(env)+1)
	for k, v := range env {
		if k != "LISTEN_ADDR" {
			vars = append(vars, k+"="+v)
		}
	}
	vars = append(vars, "LISTEN_ADDR="+addr)
	return &Service{
		bin:     bin,
		env:     vars,
		addr:    addr,
		logPath: logPath,
		client: &http.Client{
			// /readyz may take its own 2 s ping timeout to answer.
			Timeout:   5 * time.Second,
			Transport: &http.Transport{DisableKeepAlives: true},
		},
	}, nil
}

// URL is the service's base URL, e.g. http://127.0.0.1:41234.
func (s *Service) URL() string { return "http://" + s.addr }

// Addr is the service's listen address.
func (s *Service) Addr() string { return s.addr }

// LogPath is the file the service's output goes to.
func (s *Service) LogPath() string { return s.logPath }

// Launch starts the binary and returns without waiting for it to serve.
func (s *Service) Launch() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur != nil && !s.cur.exited() {
		return errors.New("launch service: already running")
	}
	logFile, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("launch service: %w", err)
	}
	defer logFile.Close() // the child has its own descriptor once started
	cmd := exec.Command(s.bin, "serve")
	cmd.Env = s.env
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("launch service: %w", err)
	}
	r := &serviceRun{cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait() // the state says how it ended
		r.state = cmd.ProcessState
		close(r.done)
	}()
	s.cur = r
	s.launches++
	return nil
}

// Start launches the binary and waits until /readyz answers 200 (so
// Postgres is up and migrated). A run that exits or does not get ready
// before ctx ends is killed and reported with the end of its log.
func (s *Service) Start(ctx context.Context) error {
	if err := s.Launch(); err != nil {
		return err
	}
	if err := s.WaitReady(ctx); err != nil {
		s.Kill()
		return fmt.Errorf("%w\n%s", err, s.LogTail(20))
	}
	return nil
}

// WaitReady polls /readyz until it answers 200, the run exits, or ctx ends.
func (s *Service) WaitReady(ctx context.Context) error { return s.waitFor(ctx, "/readyz") }

// WaitHealthy polls /healthz until it answers 200: the service listens,
// whether or not Postgres is up.
func (s *Service) WaitHealthy(ctx context.Context) error { return s.waitFor(ctx, "/healthz") }

func (s *Service) waitFor(ctx context.Context, path string) error {
	r := s.run()
	if r == nil {
		return errors.New("service not launched")
	}
	for {
		if s.Probe(ctx, path) == http.StatusOK {
			return nil
		}
		select {
		case <-r.done:
			return fmt.Errorf("service exited before %s answered 200: %v", path, r.state)
		case <-ctx.Done():
			return fmt.Errorf("service: %s not 200: %w", path, ctx.Err())
		case <-time.After(25 * time.Millisecond):
		}
	}
}

// Probe returns the status of GET path on a fresh connection, or 0 when
// there is no answer (nothing listens, or the connection breaks).
func (s *Service) Probe(ctx context.Context, path string) int {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.URL()+path, nil)
	if err != nil {
		return 0
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return 0
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

func (s *Service) run() *serviceRun {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur
}

// Kill ends the current run with SIGKILL, as the OOM killer or a lost node
// would, and waits for it to exit. It does nothing when nothing runs.
func (s *Service) Kill() {
	r := s.run()
	if r == nil || r.exited() {
		return
	}
	_ = r.cmd.Process.Kill() // fails only if it has exited already
	<-r.done
}

// Signal sends sig to the current run.
func (s *Service) Signal(sig os.Signal) error {
	r := s.run()
	if r == nil || r.exited() {
		return errors.New("service not running")
	}
	return r.cmd.Process.Signal(sig)
}

// Terminate sends SIGTERM and waits up to grace for the run to exit, then
// kills it. It returns the run's exit state.
func (s *Service) Terminate(grace time.Duration) (*os.ProcessState, error) {
	r := s.run()
	if r == nil || r.exited() {
		return nil, errors.New("service not running")
	}
	if err := r.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return nil, fmt.Errorf("sigterm: %w", err)
	}
	select {
	case <-r.done:
		return r.state, nil
	case <-time.After(grace):
		s.Kill()
		return r.state, fmt.Errorf("service still running %v after SIGTERM: killed", grace)
	}
}

// Wait waits for the current run to exit and returns its exit state.
func (s *Service) Wait(ctx context.Context) (*os.ProcessState, error) {
	r := s.run()
	if r == nil {
		return nil, errors.New("service not launched")
	}
	select {
	case <-r.done:
		return r.state, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Exited returns a channel closed when the current run exits (nil before
// the first launch).
func (s *Service) Exited() <-chan struct{} {
	if r := s.run(); r != nil {
		return r.done
	}
	return nil
}

// Running reports whether a run is alive.
func (s *Service) Running() bool {
	r := s.run()
	return r != nil && !r.exited()
}

// PID is the process id of the current run, 0 before the first launch.
func (s *Service) PID() int {
	if r := s.run(); r != nil {
		return r.cmd.Process.Pid
	}
	return 0
}

// Launches counts the runs started so far.
func (s *Service) Launches() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.launches
}

// LogTail returns the last n lines of the service's log.
func (s *Service) LogTail(n int) string {
	b, err := os.ReadFile(s.logPath)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Metrics scrapes the current run's /metrics.
func (s *Service) Metrics(ctx context.Context) (Metrics, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.URL()+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scrape metrics: status %d", resp.StatusCode)
	}
	return ParseMetrics(resp.Body)
}

func (r *serviceRun) exited() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}
