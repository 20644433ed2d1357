package deploy_test

import (
	"os/exec"
	"strings"
	"testing"
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
