package prefillgen

import (
	"syscall"
	"time"
	"unsafe"
)

// ThreadCPU returns the CPU time the calling OS thread has used, and
// whether the platform can tell. A benchmark locks its goroutine to its
// thread (runtime.LockOSThread) and reports work per CPU second beside
// work per second: on cores shared with other work the wall clock counts
// the time others ran, the thread's CPU time does not.
func ThreadCPU() (time.Duration, bool) {
	const clockThreadCPUTime = 3 // CLOCK_THREAD_CPUTIME_ID
	var ts syscall.Timespec
	if _, _, e := syscall.Syscall(syscall.SYS_CLOCK_GETTIME, clockThreadCPUTime, uintptr(unsafe.Pointer(&ts)), 0); e != 0 {
		return 0, false
	}
	return time.Duration(ts.Nano()), true
}
