//go:build !linux

package dbtest

import "syscall"

// tieToParent does nothing: only Linux can tie a child's life to its
// parent's, and without that the server stays in its parent's process group,
// where a Ctrl-C at least stops it too.
func tieToParent(attr *syscall.SysProcAttr) {}

// killChildren does nothing: without /proc there is no portable way to find
// a server's children; they notice their parent's death themselves.
func killChildren(pid int) {}
