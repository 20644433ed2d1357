package dbtest

import "syscall"

// tieToParent has the kernel kill the server when the process that started
// it dies, so a test binary that dies mid-test leaks no servers. Strictly
// the signal follows the starting thread, not the process (see
// go.dev/issue/27505); Go ends a thread only when a goroutine exits while
// locked to it, which nothing in our tests does.
//
// The server also gets a process group of its own, so that a Ctrl-C in the
// terminal (which signals the whole foreground group) does not stop it at
// the same moment as the program using it: tools/withservers stops its
// servers only after its command has drained. With the death signal above,
// a group of its own cannot make it outlive its parent.
func tieToParent(attr *syscall.SysProcAttr) {
	attr.Pdeathsig = syscall.SIGKILL
	attr.Setpgid = true
}
