package devcluster

import (
	"flag"
	"io"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

func TestParseCPUs(t *testing.T) {
	n := runtime.NumCPU()
	last := strconv.Itoa(n - 1)
	for _, c := range []struct {
		in   string
		want []int
	}{{"", nil}, {"0", []int{0}}, {"0-" + last, slices.Collect(func(yield func(int) bool) {
		for i := range n {
			if !yield(i) {
				return
			}
		}
	})}, {"0," + last, []int{0, n - 1}}} {
		got, err := ParseCPUs(c.in)
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("ParseCPUs(%q) = %v, %v; want %v", c.in, got, err, c.want)
		}
	}
	for _, bad := range []string{"x", "-1", strconv.Itoa(n), "1-0", "0-" + strconv.Itoa(n), "0,", ","} {
		if got, err := ParseCPUs(bad); err == nil {
			t.Errorf("ParseCPUs(%q) = %v, want an error", bad, got)
		}
	}
}

// CPUList is the drivers' flag: it takes what ParseCPUs takes, refuses
// what it refuses, and prints a list Set reads back.
func TestCPUListFlag(t *testing.T) {
	fs := flag.NewFlagSet("driver", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var l CPUList
	fs.Var(&l, "kvcar_cpus", "")
	if l.String() != "any" {
		t.Fatalf("empty list prints %q, want any", l.String())
	}
	last := strconv.Itoa(runtime.NumCPU() - 1)
	if err := fs.Parse([]string{"--kvcar_cpus=0," + last}); err != nil {
		t.Fatal(err)
	}
	var back CPUList
	if err := back.Set(l.String()); err != nil || !slices.Equal(back, l) || !slices.Equal(l, CPUList{0, runtime.NumCPU() - 1}) {
		t.Fatalf("--kvcar_cpus=0,%s gave %v, printed %q, read back %v (%v)", last, l, l.String(), back, err)
	}
	if err := fs.Parse([]string{"--kvcar_cpus=x"}); err == nil || !strings.Contains(err.Error(), "kvcar_cpus") {
		t.Fatalf("--kvcar_cpus=x: %v, want an error naming the flag", err)
	}
}

// threadCPUs returns the allowed CPU list of every thread of this
// process.
func threadCPUs(t *testing.T) map[string]string {
	t.Helper()
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, task := range tasks {
		tid, _ := strconv.Atoi(task.Name())
		// A thread's status is under the process's task directory; the
		// main thread's id is the process's, so AllowedCPUs reads any.
		if cpus, err := AllowedCPUs(tid); err == nil {
			out[task.Name()] = cpus
		}
	}
	return out
}

// threadsKeptCPUs checks that every thread of before still has its CPUs
// after what.
func threadsKeptCPUs(t *testing.T, before map[string]string, what string) {
	t.Helper()
	for tid, cpus := range threadCPUs(t) {
		if was, ok := before[tid]; ok && was != cpus {
			t.Errorf("thread %s of this process: CPUs %q after %s, %q before", tid, cpus, what, was)
		}
	}
}

// TestStartOnCPUs starts a child on the last CPU alone: the child runs
// there, and this process's threads keep the CPUs they had.
func TestStartOnCPUs(t *testing.T) {
	before := threadCPUs(t)
	last := runtime.NumCPU() - 1
	cmd := exec.Command("sleep", "10")
	if err := StartOnCPUs(cmd, []int{last}); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	got, err := AllowedCPUs(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if got != strconv.Itoa(last) {
		t.Errorf("child's CPUs = %q, want %d", got, last)
	}
	threadsKeptCPUs(t, before, "starting the child")

	// Without CPUs the child runs where this process may.
	mine, err := AllowedCPUs(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	free := exec.Command("sleep", "10")
	if err := StartOnCPUs(free, nil); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = free.Process.Kill()
		_ = free.Wait()
	}()
	if got, err := AllowedCPUs(free.Process.Pid); err != nil || got != mine {
		t.Errorf("child started without CPUs runs on %q (%v), want this process's %q", got, err, mine)
	}
}

// TestPinSelf pins this process to CPU 0 and back to the CPUs it had: every
// thread follows, and threads started after the pin inherit it.
func TestPinSelf(t *testing.T) {
	allList, err := AllowedCPUs(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	all, err := ParseCPUs(allList)
	if err != nil {
		t.Fatal(err)
	}
	if err := PinSelf([]int{0}); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := PinSelf(all); err != nil {
			t.Fatal(err)
		}
		for tid, cpus := range threadCPUs(t) {
			if cpus != allList {
				t.Errorf("thread %s: CPUs %q after unpinning, want %q", tid, cpus, allList)
			}
		}
	}()
	// A thread the runtime starts now, for a goroutine locked to it.
	done := make(chan string)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		done <- strconv.Itoa(syscall.Gettid())
	}()
	tid := <-done
	for th, cpus := range threadCPUs(t) {
		if cpus != "0" {
			t.Errorf("thread %s: CPUs %q, want 0", th, cpus)
		}
	}
	if cpus, err := AllowedCPUs(mustAtoi(t, tid)); err == nil && cpus != "0" {
		t.Errorf("thread %s started after the pin: CPUs %q, want 0", tid, cpus)
	}
	if err := PinSelf(nil); err == nil {
		t.Error("PinSelf(nil) succeeded")
	}
}

func mustAtoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestRunOnCPUs runs a function on the last CPU: its thread is there
// while it runs, and every thread has its CPUs of before after it.
func TestRunOnCPUs(t *testing.T) {
	before := threadCPUs(t)
	last := runtime.NumCPU() - 1
	var where string
	if err := RunOnCPUs([]int{last}, func() {
		where, _ = AllowedCPUs(syscall.Gettid())
	}); err != nil {
		t.Fatal(err)
	}
	if where != strconv.Itoa(last) {
		t.Errorf("f ran on a thread allowed CPUs %q, want %d", where, last)
	}
	threadsKeptCPUs(t, before, "RunOnCPUs")
	ran := false
	if err := RunOnCPUs(nil, func() { ran = true }); err != nil || !ran {
		t.Errorf("RunOnCPUs(nil, f): ran %v, error %v", ran, err)
	}
	if err := RunOnCPUs([]int{runtime.NumCPU() + 64}, func() { t.Error("f ran on no CPU") }); err == nil {
		t.Error("RunOnCPUs on a CPU this machine lacks: no error")
	}
}
