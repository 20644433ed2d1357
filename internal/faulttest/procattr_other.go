//go:build !linux

package faulttest

import "syscall"

// sysProcAttr: only Linux can tie the child's life to ours.
func sysProcAttr() *syscall.SysProcAttr { return nil }
