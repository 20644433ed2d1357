package faulttest_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/munchable/munchable-webhooks/internal/faulttest"
)

// A release the clone does not have fails the build, saying what to do:
// the upgrade test must fail, never skip, where history is missing.
func TestBuildReleaseNotInTheClone(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := faulttest.PreviousRelease(root); err != nil {
		t.Fatalf("deploy/previous-release: %v", err)
	}
	_, err = faulttest.BuildRelease(t.Context(), root, "v0.0.0-never-tagged")
	if err == nil || !strings.Contains(err.Error(), "is not in the clone") {
		t.Errorf("BuildRelease of a missing tag: %v, want an error saying it is not in the clone", err)
	}
}
