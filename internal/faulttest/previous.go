package faulttest

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// PreviousRelease reads deploy/previous-release under root: the tag or
// commit of the release before this build.
func PreviousRelease(root string) (string, error) {
	f, err := os.Open(filepath.Join(root, "deploy", "previous-release"))
	if err != nil {
		return "", fmt.Errorf("previous release: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if line := strings.TrimSpace(sc.Text()); line != "" && !strings.HasPrefix(line, "#") {
			return line, nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("previous release: %w", err)
	}
	return "", fmt.Errorf("previous release: %s names no release", f.Name())
}

// BuildRelease builds the service as it was at rev (a tag or a commit of
// the git repository at root) and returns the binary's path. The binary is
// kept under the user's cache directory, by commit, so a machine builds
// each release once; the source is taken with git archive, which leaves
// the repository and its worktrees as they are. A rev the clone does not
// have is an error, never a reason to skip: CI clones the whole history.
func BuildRelease(ctx context.Context, root, rev string) (string, error) {
	out, err := exec.CommandContext(ctx, "git", "-C", root, "rev-parse", "--verify", "--quiet", rev+"^{commit}").Output()
	if err != nil {
		return "", fmt.Errorf("release %s is not in the clone at %s (git fetch --tags, or a full clone): %w", rev, root, err)
	}
	commit := strings.TrimSpace(string(out))
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("build release %s: %w", rev, err)
	}
	dir := filepath.Join(cache, "munchable-webhooks", "releases", commit)
	bin := filepath.Join(dir, "munchable-webhooks")
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}

	src, err := os.MkdirTemp("", "release-src-")
	if err != nil {
		return "", fmt.Errorf("build release %s: %w", rev, err)
	}
	defer os.RemoveAll(src)
	archive := exec.CommandContext(ctx, "sh", "-c", `git -C "$1" archive "$2" | tar -x -C "$3"`, "sh", root, commit, src)
	if out, err := archive.CombinedOutput(); err != nil {
		return "", fmt.Errorf("git archive %s: %w\n%s", commit, err, out)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("build release %s: %w", rev, err)
	}
	// Built to a temporary name and renamed, so that a build cut short
	// never leaves a binary another run would take for whole.
	tmp := bin + ".tmp" + fmt.Sprint(os.Getpid())
	build := exec.CommandContext(ctx, "go", "build", "-o", tmp,
		"-ldflags", "-X main.version="+rev, "./cmd/munchable-webhooks")
	build.Dir = src
	if out, err := build.CombinedOutput(); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("go build of release %s: %w\n%s", rev, err, out)
	}
	if err := os.Rename(tmp, bin); err != nil {
		return "", fmt.Errorf("build release %s: %w", rev, err)
	}
	return bin, nil
}
