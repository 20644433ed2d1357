package dbtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// ErrNoBinary is returned when a server's binaries are not installed. The
// Start functions fail the test on it, naming the command to run.
var ErrNoBinary = errors.New("server binary not found")

// errExited reports a server that exited before it was ready.
var errExited = errors.New("exited before it was ready")

// onFreePort runs start on a free port, and again on another when the
// server exited before it was ready: a port is free only when FreePort
// looks, and another test's server can take it (or, for a cluster node,
// its bus port, 10000 above) before this one binds it.
func onFreePort(start func(port int) error) error {
	var err error
	for range 5 {
		var port int
		if port, err = FreePort(); err != nil {
			return err
		}
		if err = start(port); !errors.Is(err, errExited) {
			return err
		}
	}
	return err
}

const (
	// startTimeout bounds how long a server may take to become ready,
	// including crash recovery after Kill.
	startTimeout = 30 * time.Second
	// stopTimeout bounds an orderly shutdown before Stop kills the server.
	stopTimeout = 30 * time.Second
)

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// PostgresServer is a Postgres cluster of its own that a test may kill and
// restart. Its data directory survives Kill as it would a crash, except that
// with synchronous_commit=off the last few hundred milliseconds of commits
// may be lost, as they may be in a crash of a server so configured.
type PostgresServer struct {
	bin  string // directory holding initdb and postgres
	dir  string // holds data/, the unix socket and postgres.log
	port int
	cred *syscall.Credential // user to run as; nil for the current user
	// settings are -c name=value settings on top of the usual ones, kept
	// across restarts.
	settings []string
	proc     *process   // the latest run
	tb       testing.TB // set by StartPostgres, for Start
}

// StartPostgres initialises a cluster in a temporary directory, starts it on
// a free port, and in t.Cleanup stops it and removes the directory. Without
// the Postgres server binaries the test fails, naming the command to run.
func StartPostgres(t testing.TB) *PostgresServer {
	t.Helper()
	return startPostgres(t, postgresDir(t))
}

// StartPostgresTLS is StartPostgres with ssl=on, serving the certificate in
// certFile with the key in keyFile (both PEM). Clients may still connect
// without TLS, as URL does; sslmode=verify-full works for a client that
// trusts the certificate's issuer.
func StartPostgresTLS(t testing.TB, certFile, keyFile string) *PostgresServer {
	t.Helper()
	dir := postgresDir(t)
	settings, err := placeTLSFiles(dir, certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	return startPostgres(t, dir, settings...)
}

// postgresDir makes the directory for StartPostgres's server and removes it
// in t.Cleanup.
func postgresDir(t testing.TB) string {
	t.Helper()
	// Not t.TempDir: when root runs the server as the postgres user, that
	// user must be able to reach the directory, and t.TempDir's parent is
	// private to root.
	dir, err := os.MkdirTemp("", "dbtest-postgres-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("remove postgres directory: %v", err)
		}
	})
	return dir
}

// placeTLSFiles copies a certificate and its key into dir, owned by the
// user the server runs as, and returns the settings that serve them.
// Postgres refuses a key that others may read, and root's files would be
// out of reach of the postgres user it runs as under root.
func placeTLSFiles(dir, certFile, keyFile string) ([]string, error) {
	cred, err := serverCredential()
	if err != nil {
		return nil, err
	}
	place := func(from, name string, mode os.FileMode) (string, error) {
		b, err := os.ReadFile(from)
		if err != nil {
			return "", fmt.Errorf("postgres TLS: %w", err)
		}
		to := filepath.Join(dir, name)
		if err := os.WriteFile(to, b, mode); err != nil {
			return "", fmt.Errorf("postgres TLS: %w", err)
		}
		if cred != nil {
			if err := os.Chown(to, int(cred.Uid), int(cred.Gid)); err != nil {
				return "", fmt.Errorf("postgres TLS: hand %s to postgres user: %w", name, err)
			}
		}
		return to, nil
	}
	cert, err := place(certFile, "server.crt", 0o644)
	if err != nil {
		return nil, err
	}
	key, err := place(keyFile, "server.key", 0o600)
	if err != nil {
		return nil, err
	}
	return []string{"ssl=on", "ssl_cert_file=" + cert, "ssl_key_file=" + key}, nil
}

// startPostgres launches a server in dir with settings and stops it in
// t.Cleanup.
func startPostgres(t testing.TB, dir string, settings ...string) *PostgresServer {
	t.Helper()
	s, err := launchPostgres(dir, settings...)
	if errors.Is(err, ErrNoBinary) {
		missingServer(t, err.Error())
	}
	if err != nil {
		t.Fatal(err)
	}
	s.tb = t
	t.Cleanup(func() {
		if err := s.Stop(); err != nil {
			t.Errorf("stop postgres: %v", err)
		}
	})
	return s
}

// LaunchPostgres initialises a cluster in dir/data and starts it on a free
// port of 127.0.0.1 (another, when a server that took the port first made
// it exit), with its unix socket in dir, tuned for speed over durability.
// It waits until the server accepts connections. The caller stops it with
// Stop and then removes dir.
//
// initdb and postgres refuse to run as root, so under root they run as the
// postgres user: dir is handed to that user, who must be able to reach it.
func LaunchPostgres(dir string) (*PostgresServer, error) {
	return launchPostgres(dir)
}

// LaunchDurablePostgres is LaunchPostgres with Postgres's own durability
// (fsync, synchronous_commit and full_page_writes on, as production runs
// it): for tools/bench to price a delivery whose commit reaches the disk.
func LaunchDurablePostgres(dir string) (*PostgresServer, error) {
	return launchPostgres(dir, "fsync=on", "synchronous_commit=on", "full_page_writes=on")
}

// launchPostgres is LaunchPostgres with extra -c name=value settings,
// which come after the usual ones and so win over them.
func launchPostgres(dir string, settings ...string) (*PostgresServer, error) {
	bin, err := postgresBin()
	if err != nil {
		return nil, err
	}
	cred, err := serverCredential()
	if err != nil {
		return nil, err
	}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			return nil, fmt.Errorf("hand directory to postgres user: %w", err)
		}
	}
	s := &PostgresServer{bin: bin, dir: dir, cred: cred, settings: settings}
	if err := s.initdb(); err != nil {
		return nil, err
	}
	err = onFreePort(func(port int) error {
		s.port = port
		return s.launch()
	})
	if err != nil {
		return nil, err
	}
	return s, nil
}

// URL returns a URL for the server's postgres database as user postgres.
func (s *PostgresServer) URL() string {
	return "postgres://postgres@127.0.0.1:" + strconv.Itoa(s.port) + "/postgres?sslmode=disable"
}

// Kill ends the postmaster with SIGKILL, as a crash would, and waits for it
// to exit. New connections fail from then on. Its children notice and exit
// within moments, but until they do, a connection that was already open may
// still answer a query.
func (s *PostgresServer) Kill() {
	if s.proc != nil {
		s.proc.kill()
	}
}

// Start starts the server again on the same port and data after Kill or
// Stop, and waits until it accepts connections. It fails the test on error,
// so it is only for servers from StartPostgres; code without a test calls
// Restart.
func (s *PostgresServer) Start() {
	if s.tb == nil {
		panic("dbtest: PostgresServer.Start needs a server from StartPostgres; use Restart")
	}
	s.tb.Helper()
	if err := s.Restart(); err != nil {
		s.tb.Fatal(err)
	}
}

// Restart starts the server again on the same port and data after Kill or
// Stop, and waits until it accepts connections, crash recovery included.
func (s *PostgresServer) Restart() error {
	if s.proc != nil && !s.proc.exited() {
		return errors.New("restart postgres: still running")
	}
	deadline := time.Now().Add(startTimeout)
	for {
		if err := waitPortFree(s.port, time.Until(deadline)); err != nil {
			return fmt.Errorf("restart postgres: %w", err)
		}
		err := s.launch()
		if err == nil || !errors.Is(err, errExited) || time.Now().After(deadline) {
			return err
		}
		// After Kill, the old postmaster's children live on until they
		// notice it is gone, and while they hold its shared memory a new
		// postmaster refuses to start. They go within moments.
		time.Sleep(100 * time.Millisecond)
	}
}

// Stop shuts the server down with SIGINT (fast shutdown: disconnect
// clients, checkpoint, exit), and kills it if it has not exited within
// stopTimeout. Stopping a server that is not running does nothing.
func (s *PostgresServer) Stop() error {
	if s.proc == nil {
		return nil
	}
	if err := s.proc.stop(syscall.SIGINT, stopTimeout); err != nil {
		return fmt.Errorf("stop postgres: %w", err)
	}
	return nil
}

func (s *PostgresServer) dataDir() string { return filepath.Join(s.dir, "data") }

func (s *PostgresServer) initdb() error {
	// --no-sync and the C locale keep initdb to about a second; trust auth
	// for user postgres is what URL promises.
	cmd := exec.Command(filepath.Join(s.bin, "initdb"),
		"-D", s.dataDir(),
		"--auth=trust",
		"-U", "postgres",
		"--no-sync",
		"--encoding=UTF8",
		"--locale=C",
	)
	cmd.Dir = s.dir // the postgres user may not be able to enter ours
	cmd.SysProcAttr = sysProcAttr(s.cred)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("initdb: %w\n%s", err, out)
	}
	return nil
}

func (s *PostgresServer) launch() error {
	cmd := exec.Command(filepath.Join(s.bin, "postgres"),
		"-D", s.dataDir(),
		"-p", strconv.Itoa(s.port),
		"-k", s.dir,
		"-c", "listen_addresses=127.0.0.1",
		// A throwaway server needs no durability; skipping it makes writes
		// and shutdown fast.
		"-c", "fsync=off",
		"-c", "synchronous_commit=off",
		"-c", "full_page_writes=off",
		"-c", "max_connections=200",
	)
	for _, setting := range s.settings {
		cmd.Args = append(cmd.Args, "-c", setting)
	}
	cmd.Dir = s.dir
	logPath := filepath.Join(s.dir, "postgres.log")
	proc, err := startProcess(cmd, logPath, s.cred)
	if err != nil {
		return fmt.Errorf("start postgres: %w", err)
	}
	s.proc = proc
	if err := proc.waitReady(func() error { return pingPostgres(s.URL(), s.dataDir()) }, logPath); err != nil {
		return fmt.Errorf("postgres on port %d: %w", s.port, err)
	}
	return nil
}

// pingPostgres connects once, which succeeds only when the server accepts
// connections: not while it starts up or recovers. It also wants the
// server's data directory to be dataDir: a free port is free only when
// FreePort looks, and another test's server that took it first would
// answer for this one, which exits (as pingOwnRedis tells Redis apart).
func pingPostgres(url, dataDir string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	conn, err := pgconn.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	res, err := conn.Exec(ctx, "SHOW data_directory").ReadAll()
	if err != nil {
		return err
	}
	if len(res) != 1 || len(res[0].Rows) != 1 || filepath.Clean(string(res[0].Rows[0][0])) != filepath.Clean(dataDir) {
		return fmt.Errorf("%s is another server's (its data directory is not %s)", url, dataDir)
	}
	return nil
}

// postgresBin returns the directory holding initdb and postgres: $PG_BIN if
// set, else the newest /usr/lib/postgresql/<version>/bin that has them (the
// Debian layout, where a newer client-only version may sit beside the
// server), else the directory of postgres on PATH.
func postgresBin() (string, error) {
	if dir := os.Getenv("PG_BIN"); dir != "" {
		if !hasServerBinaries(dir) {
			return "", fmt.Errorf("PG_BIN=%s: no initdb and postgres there", dir)
		}
		return dir, nil
	}
	dirs, err := filepath.Glob("/usr/lib/postgresql/*/bin")
	if err != nil {
		return "", fmt.Errorf("find postgres: %w", err)
	}
	slices.SortFunc(dirs, func(a, b string) int {
		return slices.Compare(versionOf(b), versionOf(a)) // newest first
	})
	for _, dir := range dirs {
		if hasServerBinaries(dir) {
			return dir, nil
		}
	}
	if path, err := exec.LookPath("postgres"); err == nil && hasServerBinaries(filepath.Dir(path)) {
		return filepath.Dir(path), nil
	}
	return "", fmt.Errorf("%w: no initdb and postgres in $PG_BIN, /usr/lib/postgresql/*/bin or PATH", ErrNoBinary)
}

// versionOf parses the version out of /usr/lib/postgresql/<version>/bin, so
// that 15 sorts above 9.6.
func versionOf(binDir string) []int {
	var v []int
	for part := range strings.SplitSeq(filepath.Base(filepath.Dir(binDir)), ".") {
		n, err := strconv.Atoi(part)
		if err != nil {
			return nil // not a version: sorts last
		}
		v = append(v, n)
	}
	return v
}

func hasServerBinaries(dir string) bool {
	for _, name := range []string{"initdb", "postgres"} {
		if info, err := os.Stat(filepath.Join(dir, name)); err != nil || info.IsDir() {
			return false
		}
	}
	return true
}

// serverCredential returns the user to run initdb and postgres as. They
// refuse to run as root, so root runs them as the postgres user; anyone else
// runs them as themselves (nil).
func serverCredential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("running as root, so postgres must run as user postgres: %w", err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("postgres uid %q: %w", u.Uid, err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("postgres gid %q: %w", u.Gid, err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// waitPortFree waits until port on 127.0.0.1 can be bound again, so that a
// restart does not race the exit of the process it replaces.
func waitPortFree(port int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	for {
		l, err := net.Listen("tcp", addr)
		if err == nil {
			return l.Close()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("port %d still in use: %w", port, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// process is one run of a server. Its goroutine owns cmd.Wait and closes
// done when the process has exited, so Kill, Stop and the readiness checks
// can all wait on it.
type process struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// startProcess starts cmd as cred (nil: as ourselves) with its output
// appended to logPath, where startup errors can be read back.
func startProcess(cmd *exec.Cmd, logPath string, cred *syscall.Credential) (*process, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open log: %w", err)
	}
	// The child has its own copy of the descriptor once started.
	defer logFile.Close()
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.SysProcAttr = sysProcAttr(cred)
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		// The exit status says nothing useful: we killed it, or the log
		// says why it stopped.
		_ = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// kill sends SIGKILL and waits for the exit.
func (p *process) kill() {
	// The server dies whole, as in a crash of its machine: SIGKILL to the
	// postmaster alone would leave its backends serving the connections
	// they hold for a moment.
	if !p.exited() {
		killChildren(p.cmd.Process.Pid)
	}
	_ = p.cmd.Process.Kill() // fails only if it has already exited
	<-p.done
}

// stop sends sig and waits up to grace for the process to exit, then kills
// it.
func (p *process) stop(sig os.Signal, grace time.Duration) error {
	if p.exited() {
		return nil
	}
	if err := p.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("signal %v: %w", sig, err)
	}
	select {
	case <-p.done:
		return nil
	case <-time.After(grace):
		p.kill()
		return fmt.Errorf("still running %v after %v: killed", grace, sig)
	}
}

// waitReady polls ready until it succeeds, the process exits, or
// startTimeout passes; in the last case it kills the process. Errors carry
// the end of the log, which is where a server says why it did not start.
func (p *process) waitReady(ready func() error, logPath string) error {
	deadline := time.Now().Add(startTimeout)
	for {
		err := ready()
		if err == nil {
			return nil
		}
		if p.exited() {
			return fmt.Errorf("%w:\n%s", errExited, logTail(logPath))
		}
		if time.Now().After(deadline) {
			p.kill()
			return fmt.Errorf("not ready after %v: %w\n%s", startTimeout, err, logTail(logPath))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// logTail returns the last lines of a server log for an error message.
func logTail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	const limit = 2000
	if len(b) > limit {
		b = b[len(b)-limit:]
	}
	return strings.TrimSpace(string(b))
}

// sysProcAttr runs a server as cred (nil: as ourselves), and where the
// platform allows, has it killed if the test binary dies without running its
// cleanups, as it does when go test's -timeout fires.
func sysProcAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	attr := &syscall.SysProcAttr{Credential: cred}
	tieToParent(attr)
	return attr
}

// ErrUnreachable: the user the server runs as cannot enter a directory
// on the way to its files.
var ErrUnreachable = errors.New("the postgres user cannot reach the directory")

// ServerCanReach reports whether the user Postgres runs as (under root,
// the postgres user) can enter dir: every directory from the root down
// must grant it search (x) permission. A clone under root's 0700 home, or
// any mktemp -d, does not; initdb then fails with a bare "permission
// denied" that blames the binary. ACLs and supplementary groups are not
// looked at: the answer errs on the side of "cannot".
func ServerCanReach(dir string) error {
	cred, err := serverCredential()
	if err != nil || cred == nil {
		return err
	}
	dir, err = filepath.Abs(dir)
	if err != nil {
		return err
	}
	for p := dir; ; p = filepath.Dir(p) {
		if info, err := os.Stat(p); err == nil {
			st, ok := info.Sys().(*syscall.Stat_t)
			if ok && !searchable(info.Mode().Perm(), st.Uid, st.Gid, cred) {
				return fmt.Errorf("%w %s: %s is mode %04o", ErrUnreachable, dir, p, info.Mode().Perm())
			}
		}
		if p == filepath.Dir(p) {
			return nil
		}
	}
}

// searchable reports whether a directory of mode perm owned by uid:gid
// lets cred enter it.
func searchable(perm os.FileMode, uid, gid uint32, cred *syscall.Credential) bool {
	switch {
	case uid == cred.Uid:
		return perm&0o100 != 0
	case gid == cred.Gid:
		return perm&0o010 != 0
	}
	return perm&0o001 != 0
}
