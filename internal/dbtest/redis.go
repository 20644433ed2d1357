package dbtest

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// RedisServer is a redis-server of its own that a test may kill and restart.
// It keeps nothing on disk, so a restarted server is empty.
type RedisServer struct {
	bin   string
	dir   string
	port  int
	extra []string   // arguments after the usual ones (cluster mode, replicaof, a password)
	tls   *redisTLS  // nil: plain TCP
	proc  *process   // the latest run
	tb    testing.TB // set by StartRedis, for Start
}

// redisTLS is what a TLS-only server serves, and how its readiness check
// trusts it.
type redisTLS struct {
	certFile, keyFile, caFile string
	client                    *tls.Config // trusts caFile
}

// StartRedis starts a redis-server on a free port and stops it in t.Cleanup.
// Without redis-server on PATH the test fails, naming the command to run.
func StartRedis(t testing.TB) *RedisServer {
	t.Helper()
	return startRedisArgs(t, t.TempDir()) // dir is removed after the Stop, as cleanups run in reverse
}

// StartRedisTLS is StartRedis speaking only TLS (rediss://): it serves the
// certificate in certFile with the key in keyFile, both PEM, and caFile is
// the CA that issued it. Clients need no certificate of their own.
func StartRedisTLS(t testing.TB, certFile, keyFile, caFile string) *RedisServer {
	t.Helper()
	client, err := trusting(caFile)
	if err != nil {
		t.Fatal(err)
	}
	return startRedis(t, &RedisServer{
		dir: t.TempDir(),
		tls: &redisTLS{certFile: certFile, keyFile: keyFile, caFile: caFile, client: client},
	})
}

// trusting is a client configuration that trusts the CA in caFile alone.
func trusting(caFile string) (*tls.Config, error) {
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("read CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s holds no PEM certificate", caFile)
	}
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}

// LaunchRedis starts redis-server on 127.0.0.1:port with dir as its working
// directory and log location, and waits until it answers PING. The caller
// stops it with Stop and owns dir.
func LaunchRedis(dir string, port int) (*RedisServer, error) {
	bin, err := redisBin()
	if err != nil {
		return nil, err
	}
	s := &RedisServer{bin: bin, dir: dir, port: port}
	if err := s.launch(); err != nil {
		return nil, err
	}
	return s, nil
}

func redisBin() (string, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return "", fmt.Errorf("%w: redis-server: %w", ErrNoBinary, err)
	}
	return bin, nil
}

// URL returns the server's redis:// URL, rediss:// when it speaks TLS.
func (s *RedisServer) URL() string {
	if s.tls != nil {
		return "rediss://" + s.Addr()
	}
	return "redis://" + s.Addr()
}

// Addr returns the server's host:port.
func (s *RedisServer) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// Kill ends the server with SIGKILL, as a crash would, and waits for it to
// exit.
func (s *RedisServer) Kill() {
	if s.proc != nil {
		s.proc.kill()
	}
}

// Start starts the server again on the same port after Kill or Stop, and
// waits until it answers PING. It fails the test on error, so it is only for
// servers from StartRedis; code without a test calls Restart.
func (s *RedisServer) Start() {
	if s.tb == nil {
		panic("dbtest: RedisServer.Start needs a server from StartRedis; use Restart")
	}
	s.tb.Helper()
	if err := s.Restart(); err != nil {
		s.tb.Fatal(err)
	}
}

// Restart starts the server again on the same port after Kill or Stop, and
// waits until it answers PING.
func (s *RedisServer) Restart() error {
	if s.proc != nil && !s.proc.exited() {
		return errors.New("restart redis-server: still running")
	}
	if err := waitPortFree(s.port, startTimeout); err != nil {
		return fmt.Errorf("restart redis-server: %w", err)
	}
	return s.launch()
}

// Stop shuts the server down with SIGTERM, and kills it if it has not exited
// within stopTimeout. Stopping a server that is not running does nothing.
func (s *RedisServer) Stop() error {
	if s.proc == nil {
		return nil
	}
	if err := s.proc.stop(syscall.SIGTERM, stopTimeout); err != nil {
		return fmt.Errorf("stop redis-server: %w", err)
	}
	return nil
}

func (s *RedisServer) launch() error {
	cmd := exec.Command(s.bin,
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--dir", s.dir,
	)
	if s.tls == nil {
		cmd.Args = append(cmd.Args, "--port", strconv.Itoa(s.port))
	} else {
		cmd.Args = append(cmd.Args,
			"--port", "0", // no plain listener: a client without TLS gets nothing
			"--tls-port", strconv.Itoa(s.port),
			"--tls-cert-file", s.tls.certFile,
			"--tls-key-file", s.tls.keyFile,
			"--tls-ca-cert-file", s.tls.caFile,
			"--tls-auth-clients", "no",
		)
	}
	cmd.Args = append(cmd.Args, s.extra...)
	cmd.Dir = s.dir
	logPath := filepath.Join(s.dir, "redis.log")
	proc, err := startProcess(cmd, logPath, nil)
	if err != nil {
		return fmt.Errorf("start redis-server: %w", err)
	}
	s.proc = proc
	ready := func() error { return pingOwnRedis(s.Addr(), s.password(), s.tlsClient(), proc) }
	if err := proc.waitReady(ready, logPath); err != nil {
		return fmt.Errorf("redis-server on port %d: %w", s.port, err)
	}
	return nil
}

// password is the server's --requirepass, if any.
func (s *RedisServer) password() string {
	for i, a := range s.extra {
		if a == "--requirepass" && i+1 < len(s.extra) {
			return s.extra[i+1]
		}
	}
	return ""
}

// tlsClient is how a client trusts the server; nil for plain TCP.
func (s *RedisServer) tlsClient() *tls.Config {
	if s.tls == nil {
		return nil
	}
	return s.tls.client
}

// pingRedis sends an inline PING (after an AUTH when password is set),
// which needs no client library and works before any configuration the
// tests might apply.
func pingRedis(addr, password string) error {
	conn, r, err := dialRedis(addr, password, nil)
	if err != nil {
		return err
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "PING\r\n"); err != nil {
		return err
	}
	line, err := r.ReadString('\n')
	if err != nil {
		return err
	}
	if line != "+PONG\r\n" {
		return fmt.Errorf("PING answered %q", line)
	}
	return nil
}

// dialRedis connects to addr, over TLS when tlsConf is set, with a
// second's deadline, and AUTHs when password is set.
func dialRedis(addr, password string, tlsConf *tls.Config) (net.Conn, *bufio.Reader, error) {
	d := &net.Dialer{Timeout: time.Second} // covers the TLS handshake too
	var conn net.Conn
	var err error
	if tlsConf != nil {
		conn, err = tls.DialWithDialer(d, "tcp", addr, tlsConf)
	} else {
		conn, err = d.Dial("tcp", addr)
	}
	if err != nil {
		return nil, nil, err
	}
	if err := conn.SetDeadline(time.Now().Add(time.Second)); err != nil {
		conn.Close()
		return nil, nil, err
	}
	r := bufio.NewReader(conn)
	if password != "" {
		if _, err := io.WriteString(conn, "AUTH "+password+"\r\n"); err != nil {
			conn.Close()
			return nil, nil, err
		}
		if line, err := r.ReadString('\n'); err != nil || line != "+OK\r\n" {
			conn.Close()
			return nil, nil, fmt.Errorf("AUTH answered %q: %v", line, err)
		}
	}
	return conn, r, nil
}

// pingOwnRedis asks the server at addr for its process id and wants
// proc's. A free port is free only when FreePort looks: another
// test's server can take it first, and then this one exits ("Address
// already in use") while a plain PING is answered by the other one.
func pingOwnRedis(addr, password string, tlsConf *tls.Config, proc *process) error {
	conn, r, err := dialRedis(addr, password, tlsConf)
	if err != nil {
		return err
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "INFO server\r\n"); err != nil {
		return err
	}
	// The answer is a bulk string: $length, then that many bytes.
	head, err := r.ReadString('\n')
	if err != nil {
		return err
	}
	n, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(head, "$")))
	if err != nil || !strings.HasPrefix(head, "$") {
		return fmt.Errorf("INFO answered %q", head)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return err
	}
	want := "process_id:" + strconv.Itoa(proc.cmd.Process.Pid) + "\r\n"
	if !strings.Contains(string(b), want) {
		return fmt.Errorf("%s is another process's (INFO server has no %q)", addr, strings.TrimSpace(want))
	}
	return nil
}
