package faulttest

import "syscall"

// sysProcAttr has the kernel kill the service if the process that started it
// dies without cleaning up (a test binary killed by go test's -timeout), so
// no service outlives its test. The signal strictly follows the starting
// thread (go.dev/issue/27505); nothing here ends threads.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
