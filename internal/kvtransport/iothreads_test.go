package kvtransport

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// libzmq's I/O thread and reaper run under SCHED_BATCH, so a KV event's
// arrival never preempts a running request, and no other thread of the
// process was left under that policy by starting them.
func TestIOThreadsYield(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("SCHED_BATCH is Linux's")
	}
	c := pubTestContext(t)
	if err := c.IOThreadsYield(); err != nil {
		t.Fatalf("IOThreadsYield: %v", err)
	}
	// A thread libzmq has just started still bears the process's name
	// until it names itself, so the check is repeated until it holds.
	var problems []string
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		problems = threadPolicyProblems(t)
		if len(problems) == 0 {
			return
		}
		if time.Now().After(deadline) {
			break
		}
	}
	for _, p := range problems {
		t.Error(p)
	}
}

// threadPolicyProblems lists this process's threads whose policy does not
// match their name (SCHED_BATCH exactly for libzmq's), and too few
// libzmq threads.
func threadPolicyProblems(t *testing.T) []string {
	tasks, err := filepath.Glob("/proc/self/task/*")
	if err != nil || len(tasks) == 0 {
		t.Fatalf("no tasks: %v", err)
	}
	var problems []string
	zmqThreads := 0
	for _, task := range tasks {
		comm, err := os.ReadFile(filepath.Join(task, "comm"))
		if err != nil {
			continue // the thread ended
		}
		tid, err := strconv.Atoi(filepath.Base(task))
		if err != nil {
			t.Fatal(err)
		}
		attr, err := unix.SchedGetAttr(tid, 0)
		if err != nil {
			continue
		}
		name := strings.TrimSpace(string(comm))
		isZMQ := strings.HasPrefix(name, "ZMQbg/")
		if isZMQ {
			zmqThreads++
		}
		if batch := attr.Policy == unix.SCHED_BATCH; batch != isZMQ {
			problems = append(problems, fmt.Sprintf("thread %d %q: policy %d", tid, name, attr.Policy))
		}
	}
	if zmqThreads < 2 {
		problems = append(problems, fmt.Sprintf("found %d libzmq threads, want the I/O thread and the reaper", zmqThreads))
	}
	return problems
}
