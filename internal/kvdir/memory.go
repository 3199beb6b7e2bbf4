package kvdir

import (
	"github.com/kvcar/kvcar/internal/kvevent"
	"github.com/kvcar/kvcar/internal/kvindex"
)

// MemoryBound is the most memory one stream can make the directory hold
// under its Limits, whatever its engine sends (R-CFG-2): every part is
// bounded by a limit, and this adds the bounds up.
type MemoryBound struct {
	// Index is the served index plus the one a snapshot builds beside
	// it, each bounded by max_blocks_per_stream.
	Index int64
	// Buffered is max_buffered_bytes: live deltas held while a snapshot
	// is fetched.
	Buffered int64
	// Message is one received message copied into the Go heap and its
	// decoded records (kvevent.MaxStorageBytes of max_message_bytes).
	Message int64
	// Queued is what libzmq may hold outside the Go heap: each of the
	// two sockets' receive queues (the receive HWM of max_message_bytes
	// messages) plus the message it is reading.
	Queued int64
}

// MemoryBound returns the per-stream bound of l.
func (l Limits) MemoryBound() MemoryBound {
	msg := int64(l.MaxMessageBytes)
	ix := kvindex.Config{MaxBlocks: l.MaxBlocksPerStream}.MaxStorageBytes()
	return MemoryBound{
		Index:    2 * ix,
		Buffered: int64(l.MaxBufferedBytes),
		Message:  msg + int64(kvevent.MaxStorageBytes(l.MaxMessageBytes)),
		Queued:   2 * int64(l.receiveHWM()+1) * msg,
	}
}

// Heap is the Go-heap part of the bound.
func (b MemoryBound) Heap() int64 { return b.Index + b.Buffered + b.Message }

// Process is what streams streams may add to a process's resident
// memory: the Go heap part twice over, since the collector lets the heap
// grow to twice what is live at the default GOGC of 100, plus what
// libzmq queues.
func (b MemoryBound) Process(streams int) int64 {
	return int64(streams) * (2*b.Heap() + b.Queued)
}
