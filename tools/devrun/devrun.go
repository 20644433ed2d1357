// Package devrun holds what make dev's stand-ins (tools/devresend,
// tools/devstripe) share as wrappers of the next command in the chain:
// running it, and writing what the second terminal needs to .dev/env.
package devrun

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strings"
	"syscall"
)

// Run runs command with env added to environ and returns its exit code.
// SIGINT and SIGTERM are caught and left to the command: the process
// group they were sent to holds it too (forwarding them would make them
// arrive twice).
func Run(command, environ, env []string, stdout, stderr io.Writer) (int, error) {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	go func() {
		for range sigs {
		}
	}()

	cmd := exec.Command(command[0], command[1:]...)
	cmd.Env = append(slices.Clone(environ), env...)
	cmd.Stdout, cmd.Stderr = stdout, stderr
	err := cmd.Run()
	if err == nil {
		return 0, nil
	}
	var exitErr *exec.ExitError
	if !errors.As(err, &exitErr) {
		return 1, fmt.Errorf("run %s: %w", command[0], err)
	}
	if status, ok := exitErr.Sys().(syscall.WaitStatus); ok && status.Signaled() {
		return 128 + int(status.Signal()), nil
	}
	return exitErr.ExitCode(), nil
}

// AppendEnv appends name='value' lines to the env file ("": none), quoted
// for a shell as withservers writes it.
func AppendEnv(file string, vars ...[2]string) error {
	if file == "" {
		return nil
	}
	var b strings.Builder
	for _, kv := range vars {
		fmt.Fprintf(&b, "%s='%s'\n", kv[0], strings.ReplaceAll(kv[1], "'", `'\''`))
	}
	f, err := os.OpenFile(file, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("env file: %w", err)
	}
	_, err = f.WriteString(b.String())
	return errors.Join(err, f.Close())
}

// Lookup returns the value of key in environ, or "".
func Lookup(environ []string, key string) string {
	v := ""
	for _, kv := range environ {
		if val, ok := strings.CutPrefix(kv, key+"="); ok {
			v = val // the last one wins, as in exec
		}
	}
	return v
}
