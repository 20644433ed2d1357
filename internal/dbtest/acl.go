package dbtest

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
)

// ACLUser is the Redis user docs/WHERE-IT-RUNS.md's ACL creates, and
// aclPlaceholder the password it shows.
const (
	ACLUser        = "munchable-webhooks"
	aclPlaceholder = "CHANGE-ME"
)

// DocumentedACL is the ACL SETUSER command docs/WHERE-IT-RUNS.md gives, as
// arguments, with password for its placeholder. The docs hold it on one
// line so that the tests read exactly what an operator copies.
func DocumentedACL(t testing.TB, password string) []any {
	t.Helper()
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile(filepath.Join(root, "docs", "WHERE-IT-RUNS.md"))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(doc), "\n") {
		if !strings.HasPrefix(line, "ACL SETUSER "+ACLUser+" ") {
			continue
		}
		var args []any
		for _, f := range strings.Fields(line) {
			args = append(args, strings.ReplaceAll(f, aclPlaceholder, password))
		}
		return args
	}
	t.Fatal("docs/WHERE-IT-RUNS.md has no line starting ACL SETUSER " + ACLUser)
	return nil
}

// ApplyACL runs acl on each server at addrs (an ACL is per server, each
// cluster node's included).
func ApplyACL(t testing.TB, acl []any, addrs ...string) {
	t.Helper()
	for _, addr := range addrs {
		c := redis.NewClient(&redis.Options{Addr: addr})
		err := c.Do(context.Background(), acl...).Err()
		c.Close()
		if err != nil {
			t.Fatalf("ACL SETUSER on %s: %v", addr, err)
		}
	}
}

// moduleRoot is the directory of go.mod above the working directory (a
// test's package directory).
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
}
