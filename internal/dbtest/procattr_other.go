//go:build !linux

package dbtest

import "syscall"

// setParentDeathSignal does nothing: only Linux can tie a child's life to
// its parent's.
func setParentDeathSignal(attr *syscall.SysProcAttr) {}
