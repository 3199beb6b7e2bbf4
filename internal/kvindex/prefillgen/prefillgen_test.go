package prefillgen

import (
	"testing"

	"github.com/kvcar/kvcar/internal/kvevent"
)

// TestRewriteNamesBlocks decodes rewritten messages of each shape and
// checks the hashes Rewrite writes: iteration i stores blocks i of its
// own, removes those of iteration i-window, and chains them as its shape
// says, one prefill (each event the child of the one before) or, with
// Chains, an event a chain continued from the message before.
func TestRewriteNamesBlocks(t *testing.T) {
	const window = 7
	for _, opts := range []Options{
		{BlocksPerEvent: 1, Removals: true},
		{BlocksPerEvent: 1, Removals: true, RemovalsPerBlock: true},
		{BlocksPerEvent: 64},
		{BlocksPerEvent: 1, Removals: true, Chains: true},
		{BlocksPerEvent: 4, Chains: true, Variants: 2},
		{BlocksPerEvent: 1, Removals: true, RemovalsPerBlock: true, Chains: true, VLLM: true},
		{BlocksPerEvent: 64, Removals: true, RemovalsPerBlock: true, VLLM: true},
	} {
		f := NewWith(t, opts)
		dec := kvevent.NewDecoder(8 << 20)
		var b kvevent.Batch
		for i := 1; i < 4; i++ {
			f.Rewrite(i, window)
			if err := dec.DecodeBatch(f.Payload, &b); err != nil {
				t.Fatalf("%+v iteration %d: %v", opts, i, err)
			}
			j, r := 0, 0
			for e, ev := range b.Events {
				if ev.Kind == kvevent.BlockRemoved {
					if opts.RemovalsPerBlock != (len(ev.BlockHashes) == 1) {
						t.Fatalf("%+v iteration %d: a removal of %d blocks", opts, i, len(ev.BlockHashes))
					}
					for _, h := range ev.BlockHashes {
						if want := opts.EngineHash(freshHash(i-window, r)); h != want {
							t.Fatalf("%+v iteration %d: removed %d is %v, want %v", opts, i, r, h, want)
						}
						r++
					}
					continue
				}
				var want kvevent.EngineHash
				hasParent := j > 0
				switch {
				case opts.Chains:
					want, hasParent = opts.EngineHash(freshHash(i-1, j+len(ev.BlockHashes)-1)), true
				case j > 0:
					want = opts.EngineHash(freshHash(i, j-1))
				}
				if ev.HasParent != hasParent || hasParent && ev.ParentHash != want {
					t.Fatalf("%+v iteration %d event %d: parent %v (%v), want %v (%v)", opts, i, e, ev.ParentHash, ev.HasParent, want, hasParent)
				}
				if ev.BlockSize != opts.BlockSize() || len(ev.TokenIDs) != len(ev.BlockHashes)*opts.BlockSize() || !ev.PlainText {
					t.Fatalf("%+v iteration %d event %d: %d tokens in blocks of %d, plain text %v", opts, i, e, len(ev.TokenIDs), ev.BlockSize, ev.PlainText)
				}
				for _, h := range ev.BlockHashes {
					if want := opts.EngineHash(freshHash(i, j)); h != want {
						t.Fatalf("%+v iteration %d: block %d is %v, want %v", opts, i, j, h, want)
					}
					j++
				}
			}
			if want := map[bool]int{true: Blocks}[opts.Removals]; j != Blocks || r != want {
				t.Fatalf("%+v iteration %d: %d blocks stored and %d removed, want %d and %d", opts, i, j, r, Blocks, want)
			}
		}
	}
}
