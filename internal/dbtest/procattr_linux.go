package dbtest

import (
	"bytes"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

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

// killChildren SIGKILLs the children of pid, pid itself stopped first so
// that it forks no more, and waits until they are gone. A process group is
// not enough for Postgres: every backend calls setsid() and leads a group
// of its own, so a backend outlives a killed postmaster long enough to
// commit one more write on a connection it holds, and then says
// "terminating connection due to unexpected postmaster exit".
func killChildren(pid int) {
	_ = syscall.Kill(pid, syscall.SIGSTOP)
	children := childrenOf(pid)
	for _, c := range children {
		_ = syscall.Kill(c, syscall.SIGKILL)
	}
	// The children are pid's to reap, and pid is about to die too, so wait
	// for each to be gone or a zombie, which holds no sockets.
	deadline := time.Now().Add(5 * time.Second)
	for _, c := range children {
		for alive(c) && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
	}
}

// childrenOf lists the processes whose parent is pid, from /proc.
func childrenOf(pid int) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		c, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ppid, _, ok := procStat(c); ok && ppid == pid {
			out = append(out, c)
		}
	}
	return out
}

// alive says whether pid exists and is not a zombie.
func alive(pid int) bool {
	_, state, ok := procStat(pid)
	return ok && state != 'Z'
}

// procStat reads a process's parent and state from /proc/PID/stat.
func procStat(pid int) (ppid int, state byte, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, false
	}
	// "pid (comm) state ppid ...": comm may hold spaces and parentheses,
	// so read from the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 {
		return 0, 0, false
	}
	ppid, err = strconv.Atoi(f[1])
	return ppid, f[0][0], err == nil
}
