package deploy_test

import (
	"bufio"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// make dev, test and lint install what each needs first (scripts/ensure-deps
// with the target's name), and CI runs the same script for all of them before
// anything else: what CI installs is what a newcomer gets.
func TestEnsureDepsRunsFirst(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make not installed")
	}
	for _, target := range []string{"dev", "test", "lint"} {
		// --no-print-directory: under `make test` this runs as a sub-make,
		// which would otherwise print "Entering directory" first.
		cmd := exec.Command("make", "--no-print-directory", "-n", target)
		cmd.Dir = root
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("make -n %s: %v", target, err)
		}
		if first, _, _ := strings.Cut(string(out), "\n"); first != "scripts/ensure-deps "+target {
			t.Errorf("make %s runs %q first, want scripts/ensure-deps %s", target, first, target)
		}
	}
	var steps []string
	for line := range strings.SplitSeq(readFile(t, ".ci/run"), "\n") {
		if f := strings.Fields(line); len(f) > 0 && (f[0] == "make" || f[0] == "scripts/ensure-deps") {
			steps = append(steps, strings.Join(f, " "))
		}
	}
	// Without an argument: everything any target needs.
	if len(steps) < 2 || steps[0] != "scripts/ensure-deps" {
		t.Errorf(".ci/run steps %q, want scripts/ensure-deps (no argument: all) before make", steps)
	}
}

// make lint runs shellcheck on every shell script git tracks. The Makefile
// finds them by their first line with awk; this reads each shebang's
// interpreter the other way round, so a pattern that stops matching (a
// script with flags on its #! line, /bin/sh instead of env) cannot drop a
// script from the lint unseen.
func TestLintShellchecksEveryScript(t *testing.T) {
	t.Parallel()
	for _, tool := range []string{"make", "git"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skip(tool + " not installed")
		}
	}
	ls := exec.Command("git", "ls-files")
	ls.Dir = root
	files, err := ls.Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	var want []string
	for name := range strings.SplitSeq(strings.TrimSpace(string(files)), "\n") {
		if isShellScript(t, filepath.Join(root, name)) {
			want = append(want, name)
		}
	}
	if len(want) == 0 {
		t.Fatal("found no tracked shell script, though scripts/ensure-deps is one")
	}

	cmd := exec.Command("make", "--no-print-directory", "-n", "lint")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("make -n lint: %v", err)
	}
	var got []string
	for line := range strings.SplitSeq(string(out), "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[0] == "shellcheck" {
			got = append(got, f[1:]...)
		}
	}
	slices.Sort(got)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("make lint shellchecks other files than the tracked shell scripts (-want +got):\n%s", diff)
	}
}

// isShellScript reports whether a file's #! line runs sh, bash or dash,
// directly or through env.
func isShellScript(t *testing.T, name string) bool {
	t.Helper()
	f, err := os.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	first, _ := bufio.NewReader(f).ReadString('\n')
	shebang, ok := strings.CutPrefix(first, "#!")
	args := strings.Fields(shebang)
	if !ok || len(args) == 0 {
		return false
	}
	interp := path.Base(args[0])
	if interp == "env" && len(args) > 1 {
		interp = args[1]
	}
	return interp == "sh" || interp == "bash" || interp == "dash"
}

// make build stamps the version and the commit from the same checkout, so
// they agree on whether it had changes: both end in -dirty, or neither.
func TestBuildStampsDirtyAlike(t *testing.T) {
	t.Parallel()
	for _, tool := range []string{"make", "git"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skip(tool + " not installed")
		}
	}
	makefile, err := filepath.Abs(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	git := func(args ...string) {
		t.Helper()
		cmd := exec.Command("git", append([]string{"-c", "user.name=t", "-c", "user.email=t@example.com"}, args...)...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %s: %v\n%s", args, err, out)
		}
	}
	git("init", "-q")
	if err := os.WriteFile(filepath.Join(dir, "f"), []byte("a\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	git("add", "f")
	git("commit", "-q", "-m", "f")
	stamps := func() (version, commit string) {
		t.Helper()
		cmd := exec.Command("make", "--no-print-directory", "-f", makefile, "-n", "build")
		cmd.Dir = dir
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("make -n build: %v", err)
		}
		for f := range strings.FieldsSeq(strings.ReplaceAll(string(out), `"`, " ")) {
			if v, ok := strings.CutPrefix(f, "main.version="); ok {
				version = v
			}
			if c, ok := strings.CutPrefix(f, "main.commit="); ok {
				commit = c
			}
		}
		return version, commit
	}
	for _, dirty := range []bool{false, true} {
		if dirty {
			if err := os.WriteFile(filepath.Join(dir, "f"), []byte("b\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		version, commit := stamps()
		if commit == "" || strings.HasSuffix(version, "-dirty") != dirty || strings.HasSuffix(commit, "-dirty") != dirty {
			t.Errorf("changed tree %v: make build stamps version %q and commit %q, want -dirty on both or neither, as the tree is",
				dirty, version, commit)
		}
	}
}
