package devcluster

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// CPUList is a flag.Value of CPUs in ParseCPUs' syntax, for the
// drivers' --kvcar_cpus and --driver_cpus; empty is no pinning.
type CPUList []int

// Set parses s with ParseCPUs.
func (l *CPUList) Set(s string) error {
	cpus, err := ParseCPUs(s)
	if err != nil {
		return err
	}
	*l = cpus
	return nil
}

// String lists the CPUs as ParseCPUs reads them ("0,1"), "any" when
// empty.
func (l CPUList) String() string {
	if len(l) == 0 {
		return "any"
	}
	parts := make([]string, len(l))
	for i, c := range l {
		parts[i] = strconv.Itoa(c)
	}
	return strings.Join(parts, ",")
}

// ParseCPUs parses a CPU list as taskset and /proc write it ("1",
// "0,2", "0-3") into CPU numbers, each below runtime.NumCPU. The empty
// list is nil: no pinning.
func ParseCPUs(s string) ([]int, error) {
	if s == "" {
		return nil, nil
	}
	n := runtime.NumCPU()
	var cpus []int
	for part := range strings.SplitSeq(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		b := a
		if err == nil && isRange {
			b, err = strconv.Atoi(hi)
		}
		if err != nil || a < 0 || b < a || b >= n {
			return nil, fmt.Errorf("CPU list %q: %q is not a CPU or a range of CPUs in [0, %d]", s, part, n-1)
		}
		for c := a; c <= b; c++ {
			cpus = append(cpus, c)
		}
	}
	return cpus, nil
}

func cpuSet(cpus []int) *unix.CPUSet {
	var set unix.CPUSet
	for _, c := range cpus {
		set.Set(c)
	}
	return &set
}

// PinSelf keeps every thread of this process on cpus from now on: the
// threads there are now, and so those they start later, which inherit
// their creator's CPUs. A benchmark driver uses it to leave the other
// CPUs to the process it measures.
func PinSelf(cpus []int) error {
	if len(cpus) == 0 {
		return errors.New("pinning to no CPU")
	}
	set := cpuSet(cpus)
	// Twice: a thread started by one not yet pinned during the first
	// pass is caught by the second.
	for range 2 {
		tasks, err := os.ReadDir("/proc/self/task")
		if err != nil {
			return fmt.Errorf("pinning to CPUs %v: %w", cpus, err)
		}
		for _, t := range tasks {
			tid, err := strconv.Atoi(t.Name())
			if err != nil {
				continue
			}
			if err := unix.SchedSetaffinity(tid, set); err != nil && !errors.Is(err, syscall.ESRCH) {
				return fmt.Errorf("pinning thread %d to CPUs %v: %w", tid, cpus, err)
			}
		}
	}
	return nil
}

// StartOnCPUs starts cmd with its process, and so every thread it will
// have, on cpus (on any CPU when cpus is empty): the child inherits the
// CPUs of the thread that forks it, so that thread is given them for the
// fork and its own back after.
func StartOnCPUs(cmd *exec.Cmd, cpus []int) error {
	if len(cpus) == 0 {
		return cmd.Start()
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var old unix.CPUSet
	if err := unix.SchedGetaffinity(0, &old); err != nil {
		return fmt.Errorf("reading this thread's CPUs: %w", err)
	}
	if err := unix.SchedSetaffinity(0, cpuSet(cpus)); err != nil {
		return fmt.Errorf("pinning to CPUs %v: %w", cpus, err)
	}
	err := cmd.Start()
	if rerr := unix.SchedSetaffinity(0, &old); rerr != nil {
		return errors.Join(err, fmt.Errorf("restoring this thread's CPUs: %w", rerr))
	}
	return err
}

// AllowedCPUs reads the CPUs a process's main thread may run on
// (Cpus_allowed_list in /proc/<pid>/status).
func AllowedCPUs(pid int) (string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return "", fmt.Errorf("CPUs of %d: %w", pid, err)
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "Cpus_allowed_list:"); ok {
			return strings.TrimSpace(v), nil
		}
	}
	return "", fmt.Errorf("CPUs of %d: no Cpus_allowed_list in /proc/%d/status", pid, pid)
}

// RunOnCPUs runs f on a thread kept on cpus (on any CPU when cpus is
// empty) and waits for it: a driver measures there what the process it
// pins there will see. The thread gets its own CPUs back after f; if it
// cannot, it stays locked to f's goroutine, which the runtime then ends
// with the thread, so no other goroutine runs on it.
func RunOnCPUs(cpus []int, f func()) error {
	if len(cpus) == 0 {
		f()
		return nil
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		var old unix.CPUSet
		if err := unix.SchedGetaffinity(0, &old); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("reading this thread's CPUs: %w", err)
			return
		}
		if err := unix.SchedSetaffinity(0, cpuSet(cpus)); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("pinning to CPUs %v: %w", cpus, err)
			return
		}
		f()
		if err := unix.SchedSetaffinity(0, &old); err != nil {
			errc <- fmt.Errorf("restoring this thread's CPUs: %w", err)
			return
		}
		runtime.UnlockOSThread()
		errc <- nil
	}()
	return <-errc
}
