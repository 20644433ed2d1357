package main

// The README's quick start, run as a newcomer runs it: its first terminal
// (make dev, in the README's variant with the example app receiving the
// app's webhooks) in the repository, its second terminal's commands one by
// one in a shell, each documented output checked, then, in the same shell,
// the README's Stripe and app blocks and every block of docs/OPERATIONS.md,
// docs/DRIFT-AND-RECOVERY.md and docs/APP.md marked to run against make
// dev. A change that makes those docs wrong fails here.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/munchable/munchable-webhooks/deploy"
	"github.com/munchable/munchable-webhooks/internal/dbtest"
)

// quickstartStep is one command of a quick start block and what the doc
// says it prints: the beginning of its first line (a comment on the same
// line) or whole lines (comment lines under it, up to a blank line). A
// comment line "(exit status N)" under it is the status it exits with
// (else 0).
type quickstartStep struct {
	file    string
	line    int
	command string
	prefix  string
	lines   []string
	status  int
}

func (s quickstartStep) String() string {
	return fmt.Sprintf("%s:%d: %s", s.file, s.line, s.command)
}

// quickstartSection is the fenced block after one marker.
type quickstartSection struct {
	name  string
	steps []quickstartStep
}

// quickstartMarker is the comment before a block that make dev runs as
// written: <!-- quickstart: NAME -->.
var quickstartMarker = regexp.MustCompile(`^<!-- quickstart: (.+) -->$`)

// quickstartSections returns every marked block of a doc, in its order.
func quickstartSections(t *testing.T, file, doc string) []quickstartSection {
	t.Helper()
	var (
		sections []quickstartSection
		state    = 0 // 0: before a marker, 1: before its fence, 2: in the block
		inOut    bool
		inline   = regexp.MustCompile(`^(.*?\S)\s+# (.*)$`)
		status   = regexp.MustCompile(`^\(exit status (\d+)\)$`)
		lineNum  int
	)
	sc := bufio.NewScanner(strings.NewReader(doc))
	for sc.Scan() {
		lineNum++
		l := sc.Text()
		switch state {
		case 0:
			if m := quickstartMarker.FindStringSubmatch(strings.TrimSpace(l)); m != nil {
				sections = append(sections, quickstartSection{name: m[1]})
				state = 1
			}
			continue
		case 1:
			if strings.HasPrefix(l, "```") {
				state = 2
			} else if strings.TrimSpace(l) != "" {
				t.Fatalf("%s:%d: the quickstart marker is not followed by a fenced block", file, lineNum)
			}
			continue
		}
		cur := &sections[len(sections)-1]
		switch {
		case strings.HasPrefix(l, "```"):
			if len(cur.steps) == 0 {
				t.Fatalf("%s: the %s block has no command", file, cur.name)
			}
			state, inOut = 0, false
		case strings.TrimSpace(l) == "":
			inOut = false
		case strings.HasPrefix(l, "#"):
			if inOut {
				out := strings.TrimPrefix(strings.TrimPrefix(l, "#"), " ")
				step := &cur.steps[len(cur.steps)-1]
				if m := status.FindStringSubmatch(out); m != nil {
					step.status, _ = strconv.Atoi(m[1])
				} else {
					step.lines = append(step.lines, out)
				}
			}
		default:
			s := quickstartStep{file: file, line: lineNum, command: l}
			if m := inline.FindStringSubmatch(l); m != nil {
				s.command, s.prefix = m[1], m[2]
			}
			cur.steps = append(cur.steps, s)
			inOut = true
		}
	}
	if state != 0 {
		t.Fatalf("%s: the %s block is not closed", file, sections[len(sections)-1].name)
	}
	return sections
}

// quickstartBlock returns the commands of the README's block named name.
func quickstartBlock(t *testing.T, readme, name string) []quickstartStep {
	t.Helper()
	for _, s := range quickstartSections(t, "README.md", readme) {
		if s.name == name {
			return s.steps
		}
	}
	t.Fatalf("README.md has no %s block (a fenced block after <!-- quickstart: %s -->)", name, name)
	return nil
}

// quickstartDocs are the docs whose marked blocks the second terminal
// runs, in this order, after the README's: their blocks take the state
// the quick start leaves (its events sent, Stripe's drift repaired).
var quickstartDocs = []string{"docs/OPERATIONS.md", "docs/DRIFT-AND-RECOVERY.md", "docs/APP.md"}

// appFirstTerminal is the README's block that starts the example app and
// make dev with the app's webhook at it; appPort is the port it and the
// app block use, which the test swaps for a free one.
const (
	appFirstTerminal = "app first terminal"
	appPort          = "127.0.0.1:8090"
)

// isFirstTerminal reports whether a block runs in the first terminal.
func isFirstTerminal(name string) bool { return strings.HasSuffix(name, "first terminal") }

// secondTerminal is every command the second terminal runs: the README's
// marked blocks other than the first terminal's (second terminal first),
// then the docs' marked blocks.
func secondTerminal(t *testing.T, readme string) (steps []quickstartStep, blocks []string) {
	t.Helper()
	sections := quickstartSections(t, "README.md", readme)
	for _, s := range sections {
		if isFirstTerminal(s.name) {
			continue
		}
		if len(blocks) == 0 && s.name != "second terminal" {
			t.Fatalf("README.md: the first block after make dev's is %q, want \"second terminal\": it sets up the shell", s.name)
		}
		steps = append(steps, s.steps...)
		blocks = append(blocks, "README.md: "+s.name)
	}
	for _, file := range quickstartDocs {
		for _, s := range quickstartSections(t, file, readRepoFile(t, file)) {
			steps = append(steps, s.steps...)
			blocks = append(blocks, file+": "+s.name)
		}
	}
	return steps, blocks
}

// newcomerEnv is the environment of a fresh terminal: this one's, without
// anything the service, make dev, psql or a parent make would read from it.
func newcomerEnv(t *testing.T) []string {
	t.Helper()
	service := envNames[config]()
	dev, err := deploy.MakeDevVars(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch {
		case service[k], dev[k] != "", strings.HasPrefix(k, "PG"), strings.HasPrefix(k, "TEST_"),
			k == "MAKEFLAGS", k == "MAKELEVEL", k == "MFLAGS", k == "DEV_DIR":
			continue
		}
		env = append(env, kv)
	}
	return env
}

// quickstartNeeds skips the test (fails it under CI) when what make dev
// needs is not installed: make test installs it first.
func quickstartNeeds(t *testing.T) {
	t.Helper()
	var missing []string
	for _, p := range []string{"make", "psql", "redis-server", "bash"} {
		if _, err := exec.LookPath(p); err != nil {
			missing = append(missing, p)
		}
	}
	initdb, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if _, err := exec.LookPath("initdb"); err != nil && len(initdb) == 0 && os.Getenv("PG_BIN") == "" {
		missing = append(missing, "initdb")
	}
	if len(missing) == 0 {
		return
	}
	msg := fmt.Sprintf("the quick start needs %s (scripts/ensure-deps dev installs them)", strings.Join(missing, ", "))
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

func TestReadmeQuickStart(t *testing.T) {
	if testing.Short() {
		t.Skip("runs make dev: not in -short")
	}
	quickstartNeeds(t)
	t.Parallel()
	readme := readRepoFile(t, "README.md")
	first := appVariant(t, quickstartBlock(t, readme, "first terminal"), quickstartBlock(t, readme, appFirstTerminal))
	second, blocks := secondTerminal(t, readme)
	t.Logf("the second terminal runs %d commands of these blocks:\n%s", len(second), strings.Join(blocks, "\n"))

	// The second terminal's working directory stands for the repository's
	// root: make dev's binaries and the sample events are the repository's,
	// .dev is make dev's DEV_DIR here, so a developer's own make dev and
	// .dev/env are left alone. Postgres runs as the postgres user under
	// root, so the directory must be reachable: not t.TempDir.
	root, err := filepath.Abs(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	work, err := os.MkdirTemp("", "quickstart-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(work) })
	if err := os.Chmod(work, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"bin", "testdata"} {
		if err := os.Symlink(filepath.Join(root, name), filepath.Join(work, name)); err != nil {
			t.Fatal(err)
		}
	}
	port, err := dbtest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	listen := "127.0.0.1:" + strconv.Itoa(port)
	devDir := filepath.Join(work, ".dev")
	// The example app's port, free, in place of the README's.
	if port, err = dbtest.FreePort(); err != nil {
		t.Fatal(err)
	}
	appAddr := "127.0.0.1:" + strconv.Itoa(port)
	for _, steps := range [][]quickstartStep{first, second} {
		for i := range steps {
			steps[i].command = strings.ReplaceAll(steps[i].command, appPort, appAddr)
		}
	}

	// First terminal.
	env := newcomerEnv(t)
	devLog := filepath.Join(work, "make-dev.log")
	logFile, err := os.Create(devLog)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	var script strings.Builder
	for _, s := range first {
		script.WriteString(s.command + "\n")
	}
	dev := exec.Command("bash", "--noprofile", "--norc", "-c", script.String())
	dev.Dir = root
	dev.Env = append(env, "LISTEN_ADDR="+listen, "DEV_DIR="+devDir)
	dev.Stdout, dev.Stderr = logFile, logFile
	// A group of its own, signalled as a terminal's Ctrl-C signals its
	// foreground group.
	dev.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	start := time.Now()
	if err := dev.Start(); err != nil {
		t.Fatal(err)
	}
	// exited is closed once make dev has exited, with its error in
	// exitErr: readable by the wait for readiness and by stop alike (a
	// make dev that exits by itself must not leave stop waiting forever).
	var exitErr error
	exited := make(chan struct{})
	go func() { exitErr = dev.Wait(); close(exited) }()
	stopped := false
	stop := func() error {
		if stopped {
			return nil
		}
		stopped = true
		_ = syscall.Kill(-dev.Process.Pid, syscall.SIGINT)
		select {
		case <-exited:
			return exitErr
		case <-time.After(time.Minute):
			_ = syscall.Kill(-dev.Process.Pid, syscall.SIGKILL)
			<-exited
			return errors.New("make dev did not stop within a minute of Ctrl-C")
		}
	}
	t.Cleanup(func() {
		_ = stop()
		// The example app, started in the background as the README
		// does, is left running by make dev's end: a terminal's
		// kill %1.
		_ = syscall.Kill(-dev.Process.Pid, syscall.SIGKILL)
	})
	showLog := func() {
		t.Helper()
		b, _ := os.ReadFile(devLog)
		t.Logf("make dev's output:\n%s", b)
	}

	// The first build may take minutes on a cold cache: wait as long as the
	// test may, less a minute for the rest.
	ready := time.Now().Add(8 * time.Minute)
	if d, ok := t.Deadline(); ok && d.Add(-time.Minute).Before(ready) {
		ready = d.Add(-time.Minute)
	}
	if err := waitReady(listen, ready, exited, &exitErr); err != nil {
		showLog()
		t.Fatalf("make dev: %v", err)
	}
	t.Logf("make dev ready in %s", time.Since(start).Round(time.Millisecond))

	// Second terminal: one shell, so that what a line sets stays set, and
	// a marker around each command to cut the output apart.
	var sh strings.Builder
	sh.WriteString("exec 2>&1\n")
	for i, s := range second {
		fmt.Fprintf(&sh, "printf '\\n@@quickstart-begin %d\\n'\n%s\nprintf '\\n@@quickstart-end %d %%d\\n' $?\n", i, s.command, i)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	term := exec.CommandContext(ctx, "bash", "--noprofile", "--norc", "-c", sh.String())
	term.Dir = work
	// Nothing but .dev/env tells it make dev's LISTEN_ADDR, secrets and
	// stand-ins.
	term.Env = newcomerEnv(t)
	out, err := term.Output()
	if err != nil {
		showLog()
		t.Fatalf("second terminal: %v\n%s", err, out)
	}
	outputs, statuses := cutOutputs(out, len(second))
	failed := false
	for i, s := range second {
		got := outputs[i]
		switch {
		case statuses[i] != s.status:
			t.Errorf("%s\nexit status %d (want %d), output:\n%s", s, statuses[i], s.status, got)
		case s.prefix != "" && !strings.HasPrefix(got, s.prefix):
			t.Errorf("%s\nprints:\n%s\nthe doc says it begins: %s", s, got, s.prefix)
		case len(s.lines) > 0 && !containsLines(got, s.lines):
			t.Errorf("%s\nprints:\n%s\nthe doc says:\n%s", s, got, strings.Join(s.lines, "\n"))
		default:
			continue
		}
		failed = true
	}

	// "The team got it": the README says the mail's forward reaches the
	// stand-in's POST /emails, to SUPPORT_FORWARD_TO with Reply-To the
	// customer and the receipt, and relay list shows it delivered. The
	// relay runs beside deliveries, so give it a moment.
	if !forwardSeen(t, devLog, work) {
		failed = true
	}

	// Ctrl-C in the first terminal: the service drains, then the stand-in
	// and the servers stop and .dev/env goes.
	if err := stop(); err != nil && !isInterrupt(err) {
		t.Errorf("make dev after Ctrl-C: %v", err)
		failed = true
	}
	if _, err := os.Stat(filepath.Join(devDir, "env")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after Ctrl-C, .dev/env is still there (%v)", err)
		failed = true
	}
	if failed {
		showLog()
	}
}

// appVariant checks that the README's app first terminal is its plain
// first terminal (make dev) with the example app in front and the app's
// webhook variables before make dev, and returns it: the quick start runs
// that variant, so that both blocks are run.
func appVariant(t *testing.T, plain, app []quickstartStep) []quickstartStep {
	t.Helper()
	if len(plain) != 1 || len(app) == 0 {
		t.Fatalf("README.md: the first terminal is %v and its app variant %v; want make dev alone, and make dev last", plain, app)
	}
	last := app[len(app)-1].command
	if !strings.HasSuffix(last, " "+plain[0].command) {
		t.Fatalf("README.md: the %s block ends with %q, want the first terminal's %q after the app's variables", appFirstTerminal, last, plain[0].command)
	}
	script := ""
	for _, s := range app {
		script += s.command + "\n"
	}
	for _, want := range []string{"APP_WEBHOOK_SECRET=", "APP_WEBHOOK_URL=http://" + appPort + "/hooks", "APP_WEBHOOK_ALLOW_HTTP=true",
		"go run ./examples/appreceiver -addr " + appPort + " &"} {
		if !strings.Contains(script, want) {
			t.Errorf("README.md: the %s block has no %q", appFirstTerminal, want)
		}
	}
	return app
}

// waitReady polls the service's /readyz until it answers 200, make dev
// exits, or the deadline passes.
func waitReady(listen string, deadline time.Time, exited <-chan struct{}, exitErr *error) error {
	client := &http.Client{Timeout: 2 * time.Second}
	for {
		select {
		case <-exited:
			return fmt.Errorf("exited before the service was ready: %v", *exitErr)
		default:
		}
		if resp, err := client.Get("http://" + listen + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the service on %s not ready by %s", listen, deadline.Format(time.TimeOnly))
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// cutOutputs splits the second terminal's output at its markers into each
// command's output (surrounding blank lines trimmed) and exit status (-1:
// the command never finished).
func cutOutputs(out []byte, n int) ([]string, []int) {
	outputs := make([]string, n)
	statuses := make([]int, n)
	for i := range statuses {
		statuses[i] = -1
	}
	cur := -1
	var b strings.Builder
	for _, l := range strings.Split(string(out), "\n") {
		if rest, ok := strings.CutPrefix(l, "@@quickstart-begin "); ok {
			cur, _ = strconv.Atoi(rest)
			b.Reset()
			continue
		}
		if rest, ok := strings.CutPrefix(l, "@@quickstart-end "); ok {
			f := strings.Fields(rest)
			if len(f) == 2 && cur >= 0 && cur < n {
				statuses[cur], _ = strconv.Atoi(f[1])
				outputs[cur] = strings.Trim(b.String(), "\n")
			}
			cur = -1
			continue
		}
		if cur >= 0 {
			b.WriteString(l + "\n")
		}
	}
	return outputs, statuses
}

// containsLines reports whether want appears in got as consecutive whole
// lines, trailing spaces aside (psql pads its headers; READMEs are trimmed).
func containsLines(got string, want []string) bool {
	lines := strings.Split(got, "\n")
	for i := range lines {
		lines[i] = strings.TrimRight(lines[i], " ")
	}
	for start := 0; start+len(want) <= len(lines); start++ {
		match := true
		for j, w := range want {
			if lines[start+j] != strings.TrimRight(w, " ") {
				match = false
				break
			}
		}
		if match {
			return true
		}
	}
	return false
}

// isInterrupt reports whether make dev ended the way Ctrl-C ends it: make
// passes the interrupt on once its recipe has finished.
func isInterrupt(err error) bool {
	var exitErr *exec.ExitError
	if !errors.As(err, &exitErr) {
		return false
	}
	if st, ok := exitErr.Sys().(syscall.WaitStatus); ok && st.Signaled() {
		return st.Signal() == syscall.SIGINT
	}
	return exitErr.ExitCode() == 128+int(syscall.SIGINT)
}

// The parser reads what the doc means: inline comments, output lines, an
// exit status, prose, and every marked block in order.
func TestQuickstartBlock(t *testing.T) {
	t.Parallel()
	readme := "intro\n<!-- quickstart: x -->\n\n```sh\nset -a\n\n# prose\n$B send a.json   # 200 first\npsql -c \"q\"\n#  col\n# ---\n#  1\n\n# more prose\necho done\n# (exit status 3)\n```\n" +
		"<!-- quickstart: y -->\n```sh\ntrue\n```\n"
	got := quickstartBlock(t, readme, "x")
	want := []quickstartStep{
		{file: "README.md", line: 5, command: "set -a"},
		{file: "README.md", line: 8, command: "$B send a.json", prefix: "200 first"},
		{file: "README.md", line: 9, command: `psql -c "q"`, lines: []string{" col", "---", " 1"}},
		{file: "README.md", line: 15, command: "echo done", status: 3},
	}
	if diff := cmp.Diff(want, got, cmp.AllowUnexported(quickstartStep{})); diff != "" {
		t.Errorf("quickstartBlock (-want +got):\n%s", diff)
	}
	if y := quickstartBlock(t, readme, "y"); len(y) != 1 || y[0].line != 20 {
		t.Errorf("the second block = %v, want true on line 20", y)
	}
	if !containsLines("a\n b  \n---\nc", []string{" b", "---"}) || containsLines("a\nb", []string{"b", "c"}) {
		t.Error("containsLines")
	}
	outs, sts := cutOutputs([]byte("\n@@quickstart-begin 0\nhello\n\n@@quickstart-end 0 0\n\n@@quickstart-begin 1\n"), 2)
	if outs[0] != "hello" || sts[0] != 0 || sts[1] != -1 {
		t.Errorf("cutOutputs = %q %v", outs, sts)
	}
}

func readRepoFile(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// forwardSeen waits up to 30 s for the README's "the team got it": the
// stand-in printing the forward of the quick start's mail, and
// `relay list --consumer forward` run as the second terminal runs it
// printing it delivered.
func forwardSeen(t *testing.T, devLog, dir string) bool {
	t.Helper()
	want := []string{
		"devresend: POST /emails: would have sent",
		"To:       team@munchable.app",
		"Reply-To: ada@example.com",
		"Attached: receipt.png",
	}
	var log, list []byte
	deadline := time.Now().Add(30 * time.Second)
	for {
		log, _ = os.ReadFile(devLog)
		cmd := exec.Command("bash", "--noprofile", "--norc", "-c",
			`set -a; . .dev/env; set +a; export PATH="$PWD/bin:$PATH"; munchable-webhooks relay list --consumer forward`)
		cmd.Dir, cmd.Env = dir, newcomerEnv(t)
		list, _ = cmd.CombinedOutput()
		seen := bytes.Contains(list, []byte(`"state":"delivered"`))
		for _, w := range want {
			seen = seen && bytes.Contains(log, []byte(w))
		}
		if seen {
			return true
		}
		if time.Now().After(deadline) {
			t.Errorf("the README's forward to the team: make dev's output lacks one of %q, or relay list --consumer forward printed no delivered row:\n%s", want, list)
			return false
		}
		time.Sleep(250 * time.Millisecond)
	}
}
