package faulttest

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
)

// servicePackage is built by import path, so Build works from any directory
// inside the module (a test's package directory, or wherever `go run
// ./tools/soak` was started).
const servicePackage = "github.com/munchable/munchable-webhooks/cmd/munchable-webhooks"

// Build compiles the service into dir and returns the binary's path. It
// needs the go command on PATH, which go test and go run provide. It builds
// with the caller's environment, as a plain `go build` does, so that it
// shares the build cache with the developer's other builds (the Makefile's
// CGO_ENABLED=0 would recompile the standard library on a cold cache; the
// service resolves no names, so cgo makes no difference to what is tested).
func Build(ctx context.Context, dir string) (string, error) {
	goCmd, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("build service: %w", err)
	}
	bin := filepath.Join(dir, "munchable-webhooks")
	cmd := exec.CommandContext(ctx, goCmd, "build", "-o", bin, servicePackage)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s: %w\n%s", servicePackage, err, out)
	}
	return bin, nil
}
