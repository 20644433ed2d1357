package dbtest

import "syscall"

// setParentDeathSignal has the kernel kill the server when the process that
// started it dies, so a test binary that dies mid-test leaks no servers.
// Strictly the signal follows the starting thread, not the process (see
// go.dev/issue/27505); Go ends a thread only when a goroutine exits while
// locked to it, which nothing in our tests does.
func setParentDeathSignal(attr *syscall.SysProcAttr) {
	attr.Pdeathsig = syscall.SIGKILL
}
