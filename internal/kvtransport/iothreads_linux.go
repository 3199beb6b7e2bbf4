//go:build linux

package kvtransport

import (
	"fmt"
	"runtime"

	zmq "github.com/pebbe/zmq4"
	"golang.org/x/sys/unix"
)

// startIOThreads starts z's background threads (its I/O thread and
// reaper, which libzmq creates with the first socket) under SCHED_BATCH.
// They take their fair share of the CPU but, woken by a message, never
// preempt a thread that is running: on a busy core a routing decision
// is no longer cut in two by the arrival of a KV event, which instead
// waits at most until the running thread blocks or its slice ends.
// The threads inherit the policy from the one that creates them, so that
// one is set to SCHED_BATCH, then back, and dies with its goroutine, so
// that it never serves other goroutines under a policy not theirs. The threads
// are started either way; the error says why they run under the normal
// policy.
func startIOThreads(z *zmq.Context) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with this goroutine
		errc <- startBatch(z)
	}()
	return <-errc
}

func startBatch(z *zmq.Context) error {
	var policyErr error
	old, err := unix.SchedGetAttr(0, 0)
	if err == nil {
		old.Size = unix.SizeofSchedAttr
		batch := *old
		batch.Policy, batch.Priority, batch.Flags = unix.SCHED_BATCH, 0, 0
		if err = unix.SchedSetAttr(0, &batch, 0); err == nil {
			// Back to its own policy once the threads exist, for the
			// moment until it exits.
			defer func() { _ = unix.SchedSetAttr(0, old, 0) }()
		}
	}
	if err != nil {
		policyErr = fmt.Errorf("kvtransport: I/O threads under the normal policy: SCHED_BATCH: %w", err)
	}
	s, err := z.NewSocket(zmq.PAIR)
	if err != nil {
		return fmt.Errorf("%w: %w", errStart, err)
	}
	_ = s.SetLinger(0)
	if err := s.Close(); err != nil {
		return fmt.Errorf("%w: %w", errStart, err)
	}
	return policyErr
}
