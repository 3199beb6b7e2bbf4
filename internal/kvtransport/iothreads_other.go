//go:build !linux

package kvtransport

import (
	"errors"

	zmq "github.com/pebbe/zmq4"
)

// startIOThreads leaves libzmq to start its threads with the first socket,
// under the normal policy.
func startIOThreads(*zmq.Context) error {
	return errors.New("kvtransport: I/O threads under the normal policy: SCHED_BATCH is Linux's")
}
