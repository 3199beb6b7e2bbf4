package kvdir

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvcar/kvcar/internal/enginesim"
	"github.com/kvcar/kvcar/internal/kvevent"
)

// TestDecodeStorageGoesBackToThePool: a stream that decoded a snapshot's
// large reply batches gives their storage back to its directory's pool
// once no reply is left, so that after a round of snapshots the streams
// do not each keep a reply batch's storage for good (R-CFG-2: what the
// streams hold stays within what the memory bound counts), and the pool
// keeps at most batchPoolSize of them. The snapshots' contents arrive
// whole.
func TestDecodeStorageGoesBackToThePool(t *testing.T) {
	const (
		engines = batchPoolSize + 4
		blocks  = 1024
		block   = 128
	)
	var es []*enginesim.Engine
	var specs []StreamSpec
	for i := range engines {
		// 256 blocks of 128 ids a reply: some 128 KiB of ids decoded.
		e := startEngine(t, enginesim.Config{
			Name: fmt.Sprintf("127.0.0.1:%d", 8000+i), BlockSize: block,
			DeviceBlocks: blocks, SnapshotBatchBlocks: 256,
		})
		if _, err := e.StoreChain(0, seqTokens(1+i*blocks*block, blocks*block), kvevent.Device); err != nil {
			t.Fatal(err)
		}
		es = append(es, e)
		specs = append(specs, specOf(e, 0))
	}
	d := newDirectory(t, testLimits(), specs...)
	for _, e := range es {
		waitSynced(t, d, StreamKey{e.Name(), 0}, 0)
	}
	eventually(t, "every stream gave its decode storage back", 5*time.Second, func() (bool, string) {
		for _, e := range es {
			k := StreamKey{e.Name(), 0}
			if held := d.streamOf(k).decodeHeld.Load(); held >= batchPoolMinBytes {
				return false, fmt.Sprintf("%v holds %d bytes of decode storage", k, held)
			}
		}
		return true, ""
	})
	if n := d.batches.held(); n < 1 || n > batchPoolSize {
		t.Fatalf("the pool holds %d batches, want 1 to %d", n, batchPoolSize)
	}
	for _, e := range es[:2] {
		assertMatchesEngine(t, d, e, 0)
	}
}
