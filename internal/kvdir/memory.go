package kvdir

import (
	"github.com/kvcar/kvcar/internal/kvevent"
	"github.com/kvcar/kvcar/internal/kvindex"
	"github.com/kvcar/kvcar/internal/kvtransport"
)

// MemoryBound is the most memory one stream can make the directory hold
// under its Limits, whatever its engine sends (R-CFG-2): every part is
// bounded by a limit, and this adds the bounds up.
type MemoryBound struct {
	// Index is the served index (during a recovery, the view the fault
	// withdrew, kept for its keys) plus the one a snapshot builds beside
	// it, each bounded by max_blocks_per_stream.
	Index int64
	// Buffered is max_buffered_bytes: live deltas held while a snapshot
	// is fetched.
	Buffered int64
	// Message is the receive buffers of the stream's two sockets, each
	// holding at most one message (max_message_bytes and
	// kvtransport.FrameSlack), and one message's decoded records
	// (kvevent.MaxStorageBytes of max_message_bytes).
	Message int64
	// Queued is what libzmq may hold outside the Go heap: each of the
	// two sockets' receive queues (the receive HWM of max_message_bytes
	// messages) plus the message it is reading.
	Queued int64

	// maxBlocks is max_blocks_per_stream, which bounds the stream's
	// share of the shared key table (see Process).
	maxBlocks int
}

// MemoryBound returns the per-stream bound of l.
func (l Limits) MemoryBound() MemoryBound {
	msg := int64(l.MaxMessageBytes)
	ix := kvindex.Config{MaxBlocks: l.MaxBlocksPerStream}.MaxStorageBytes()
	return MemoryBound{
		Index:     2 * ix,
		Buffered:  int64(l.MaxBufferedBytes),
		Message:   2*(msg+kvtransport.FrameSlack) + int64(kvevent.MaxStorageBytes(l.MaxMessageBytes)),
		Queued:    2 * int64(l.receiveHWM()+1) * msg,
		maxBlocks: maxBlocksOf(l),
	}
}

// Heap is the Go-heap part of the bound.
func (b MemoryBound) Heap() int64 { return b.Index + b.Buffered + b.Message }

// Process is what streams streams may add to a process's resident
// memory: the Go heap part, the shared key tables, and the receive
// buffers and decode storage the streams gave back to their pools
// (kvtransport.PoolBytes, batchPoolBytes) twice over, since the
// collector lets the heap grow to twice what is live at the default
// GOGC of 100, plus what libzmq queues.
func (b MemoryBound) Process(streams int) int64 {
	return int64(streams)*(2*b.Heap()+b.Queued) + 2*KeyTableBound(streams, b.maxBlocks) + 2*(kvtransport.PoolBytes+batchPoolBytes)
}

// KeyTableBound bounds the shared key tables of streams streams of at
// most maxBlocks blocks each, whatever their engines send (R-CFG-2). A
// stream has bits on at most the keys of its view, of two views while a
// calibration swaps them (keyTable.replace), so the tables hold at most
// R = 2·streams·maxBlocks keys: a cell array sized for at most R+keyBatch
// keys at the rebuild load, of 16-byte cells, with the old one (no
// larger) beside it while it is rebuilt, while its successor is made or
// while it grows a step at a time (migration), each with an 8-byte stamp
// per stripe of 256 cells; at most one dense entry of 16·W bytes per
// key, W = ⌈streams/64⌉, in pages of 4096, copied once more while W
// grows; and a free list of 4 bytes per dense entry.
func KeyTableBound(streams, maxBlocks int) int64 {
	if streams <= 0 {
		return 0
	}
	w := int64(streams+63) / 64
	r := 2 * int64(streams) * int64(maxBlocks)
	pool := 2 * (r + pageRecords) * 16 * w
	cells := max((r+keyBatch)*rebuildLoadDen/rebuildLoadNum+1, minCells)
	stamps := (cells + stripeCells - 1) / stripeCells * 8
	return pool + 2*(cells*16+stamps) + r*4
}

// maxBlocksOf is the block limit an index of l applies (kvindex.New's
// default and clamp).
func maxBlocksOf(l Limits) int {
	n := l.MaxBlocksPerStream
	if n <= 0 {
		n = kvindex.DefaultMaxBlocks
	}
	return min(n, 1<<24-1)
}
