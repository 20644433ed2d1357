package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// child is a process the harness started: the service, a ceiling server or
// a durable Postgres. Its goroutine owns Wait.
type child struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{}
}

// startChild starts cmd with its output in logPath. The child is killed if
// the harness dies first.
func startChild(name string, cmd *exec.Cmd, logPath string, cred *syscall.Credential) (*child, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	c := &child{name: name, cmd: cmd, logPath: logPath, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(c.done)
	}()
	return c, nil
}

func (c *child) pid() int { return c.cmd.Process.Pid }

func (c *child) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// stop sends sig and waits up to grace before killing.
func (c *child) stop(sig os.Signal, grace time.Duration) error {
	if c.exited() {
		return nil
	}
	if err := c.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	select {
	case <-c.done:
		return nil
	case <-time.After(grace):
		_ = c.cmd.Process.Kill()
		<-c.done
		return fmt.Errorf("%s: still running %v after %v, killed", c.name, grace, sig)
	}
}

// logTail is the end of the child's log, for error messages.
func (c *child) logTail() string {
	b, err := os.ReadFile(c.logPath)
	if err != nil {
		return ""
	}
	if len(b) > 3000 {
		b = b[len(b)-3000:]
	}
	return strings.TrimSpace(string(b))
}

// waitReady polls ready until it succeeds, the child exits or timeout
// passes.
func (c *child) waitReady(timeout time.Duration, ready func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := ready()
		if err == nil {
			return nil
		}
		if c.exited() {
			return fmt.Errorf("%s exited before it was ready:\n%s", c.name, c.logTail())
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after %v: %w\n%s", c.name, timeout, err, c.logTail())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// httpReady succeeds once url answers 200.
func httpReady(url string) func() error {
	return func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s answered %d", url, resp.StatusCode)
		}
		return nil
	}
}

// clockTick is the unit of utime and stime in /proc: USER_HZ, 100 on every
// Linux configuration Go supports.
const clockTick = 10 * time.Millisecond

// procCPU returns the CPU time (user + system) a process has used.
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name may hold spaces; the fields after it do not.
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(fields) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: too few fields", pid)
	}
	utime, err1 := strconv.ParseInt(fields[11], 10, 64)
	stime, err2 := strconv.ParseInt(fields[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return time.Duration(utime+stime) * clockTick, nil
}

// procStatusKiB returns a kB field of /proc/PID/status, such as VmHWM (peak
// resident set).
func procStatusKiB(pid int, field string) (int64, error) {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok || name != field {
			continue
		}
		return strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
	}
	return 0, fmt.Errorf("/proc/%d/status: no %s", pid, field)
}

// treeCPU returns the CPU time used by process root and every process
// below it, by command name (root itself is "generator"), including
// descendants that have exited (their time is in their parents' cutime and
// cstime once reaped). Everything the harness starts is below it.
func treeCPU(root int) (counters, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	type proc struct {
		ppid  int
		comm  string
		ticks int64
	}
	procs := map[int]proc{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // gone meanwhile
		}
		s := string(b)
		open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || end < open {
			continue
		}
		fields := strings.Fields(s[end+1:])
		if len(fields) < 15 {
			continue
		}
		ppid, _ := strconv.Atoi(fields[1])
		var ticks int64
		for _, f := range fields[11:15] { // utime stime cutime cstime
			n, _ := strconv.ParseInt(f, 10, 64)
			ticks += n
		}
		procs[pid] = proc{ppid: ppid, comm: s[open+1 : end], ticks: ticks}
	}
	children := map[int][]int{}
	for pid, p := range procs {
		children[p.ppid] = append(children[p.ppid], pid)
	}
	by := counters{}
	queue := []int{root}
	for len(queue) > 0 {
		pid := queue[0]
		queue = queue[1:]
		name := procs[pid].comm
		if pid == root {
			name = "generator"
		}
		by[name] += float64(time.Duration(procs[pid].ticks) * clockTick)
		queue = append(queue, children[pid]...)
	}
	return by, nil
}

// ourCPU is the CPU time of the harness and everything it started.
func ourCPU() (time.Duration, error) {
	c, err := treeCPU(os.Getpid())
	return time.Duration(c.sum()), err
}
