// Package prefillgen builds the live messages the decode+apply
// benchmarks of kvindex and kvdir feed a stream: an engine's prefill of
// blocks nobody has seen, rewritten in place for every iteration. It is
// benchmark support only; no production code imports it.
package prefillgen

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/kvcar/kvcar/internal/kvevent"
)

// Message is one encoded live message of an engine at steady state:
// the BlockRemoved of the blocks it evicted, then the BlockStored of a
// new prompt's blocks, or with Options.Chains of a block more for each of
// many requests. Every iteration rewrites it in place so that it carries
// blocks nobody has seen: new engine hashes (removals name those stored
// window iterations earlier) and a new chain, whose first two tokens
// hold the iteration number (with Chains, new links of the chains). The
// rewrite is a few hundred byte stores, but they land on a payload the
// variants below have left out of cache: with one block per event it
// took 2.6 µs of a 41 µs message in a CPU profile of the directory's
// decode + apply at 262,144 blocks (see docs/performance-log.md, "Two
// tries at that case, not kept"). It is left in the timed loop, since it
// also brings the payload into cache for the decode, as a receive does
// for a live message.
//
// A message cycles through Options.Variants encodings, each with token
// ids of its own: a decoder fed the same ids message after message runs
// faster than on live traffic, because the processor's branch predictor
// learns the sequence of encoded widths (several times faster on this
// project's reference machine; see docs/performance-log.md, "Fresh
// token ids in every message"). Live prompts never repeat that way.
type Message struct {
	// Payload is the encoded message of the last Rewrite (of the first
	// variant before any).
	Payload  []byte
	variants []variant
}

// variant is one encoding of the message, with the offsets Rewrite
// changes.
type variant struct {
	payload []byte
	stored  [][]int // offsets of the uint64 encodings of stored hash j
	removed [][]int // same for removed hash j; nil without removals
	parents []int   // offset of event k's parent hash; nil unless Chains
	first   [2]int  // offsets of the uint32 encodings of tokens 0 and 1
}

const (
	// Blocks is the number of blocks a message stores (and removes).
	Blocks = 64
	// BlockSize is the number of tokens per block.
	BlockSize = 128
	// Vocabulary bounds the token ids: Qwen-sized.
	Vocabulary = 151_936
	// DefaultVariants is how many token contents a message cycles
	// through unless told otherwise: 64 of Blocks*BlockSize ids are half
	// a million encoded widths in a row, far more than a branch
	// predictor holds.
	DefaultVariants = 64
	storedMark      = 0xa5a5_0000_0000_0000
	removedMark     = 0x5a5a_0000_0000_0000
	parentMark      = 0x3c3c_0000_0000_0000
	tokenMark       = 0x00fe_dc00 // above every vocabulary id
)

// Options shapes a Message.
type Options struct {
	// BlocksPerEvent is how many blocks each BlockStored event carries; it
	// must divide Blocks.
	BlocksPerEvent int
	// Removals puts a BlockRemoved of Blocks blocks before the stores.
	Removals bool
	// RemovalsPerBlock sends the removals as a BlockRemoved per block, as
	// SGLang sends them (an event a page).
	RemovalsPerBlock bool
	// Chains makes each event continue a chain of its own: its parent is
	// the last block of the same event in the message before, as in a
	// batch of decode steps, where each request that filled a block adds
	// an event of it. Without it the message is one prefill, each event
	// the child of the one before (SGLang sends every store so, an event
	// a page). A message with chains needs the one before it applied:
	// its first iteration is 1, after a message without.
	Chains bool
	// Text is the kind of text the token ids come from.
	Text Text
	// Variants is how many token contents the message cycles through; 0
	// means DefaultVariants. 1 replays the same ids in every message.
	Variants int
	// VLLM sends the message as vLLM 0.26 does by default: blocks of
	// VLLMBlockSize tokens, hashes as 32-byte strings (its sha256 block
	// hashes), events as maps with every field vLLM writes for plain text
	// (lora_name, extra_keys, group_idx, kv_cache_spec_kind) and the
	// medium as "GPU".
	VLLM bool
}

// VLLMBlockSize is vLLM's default block size.
const VLLMBlockSize = 16

// BlockSize is the number of tokens per block of messages of o.
func (o Options) BlockSize() int {
	if o.VLLM {
		return VLLMBlockSize
	}
	return BlockSize
}

// Fill is the shape of the messages that fill an index before messages
// of o arrive: one prefill in events of o's size, with o's block size
// and wire form.
func (o Options) Fill() Options {
	return Options{BlocksPerEvent: o.BlocksPerEvent, VLLM: o.VLLM}
}

// Shape is a shape of live message the decode + apply benchmarks send,
// named as their sub-benchmarks are.
type Shape struct {
	Name    string
	Options Options // no Removals; the benchmarks add them
}

// Shapes returns the shapes of the decode + apply benchmarks: one prefill
// in events of one block, each the child of the one before (SGLang sends
// every store so, an event a page), after one removal of every evicted
// block or, as SGLang sends them, a removal a block; a batch of decode
// steps, 64 chains each a block longer (see Options.Chains); one prefill
// in one event. Then vLLM's (Options.VLLM, named vllm/...): its batch of
// decode steps and one prefill in one event, each after the removal of
// every evicted block in an event of its own, as vLLM's block pool sends
// its evictions. A benchmark gives each shape an index of its
// Options.BlockSize.
func Shapes() []Shape {
	return []Shape{
		{"blocks_per_event=1", Options{BlocksPerEvent: 1}},
		{"blocks_per_event=1/removals_per_event=1", Options{BlocksPerEvent: 1, RemovalsPerBlock: true}},
		{"blocks_per_event=1/chains=64", Options{BlocksPerEvent: 1, Chains: true}},
		{"blocks_per_event=64", Options{BlocksPerEvent: Blocks}},
		{"vllm/blocks_per_event=1/chains=64", Options{BlocksPerEvent: 1, Chains: true, RemovalsPerBlock: true, VLLM: true}},
		{"vllm/blocks_per_event=64", Options{BlocksPerEvent: Blocks, RemovalsPerBlock: true, VLLM: true}},
	}
}

// New returns a message of ids with real text's widths in DefaultVariants
// variants.
func New(tb testing.TB, blocksPerEvent int, withRemovals bool) *Message {
	return NewWith(tb, Options{BlocksPerEvent: blocksPerEvent, Removals: withRemovals})
}

// NewWith encodes the message as opts says. It encodes with marker
// values, finds them and keeps their offsets.
func NewWith(tb testing.TB, opts Options) *Message {
	tb.Helper()
	if opts.BlocksPerEvent <= 0 || Blocks%opts.BlocksPerEvent != 0 {
		tb.Fatalf("prefillgen: %d blocks per event do not divide %d", opts.BlocksPerEvent, Blocks)
	}
	n := opts.Variants
	if n == 0 {
		n = DefaultVariants
	}
	rng := rand.New(rand.NewPCG(7, 11))
	f := &Message{}
	for range n {
		f.variants = append(f.variants, newVariant(tb, opts, opts.Text.IDs(rng, Blocks*opts.BlockSize())))
	}
	f.Payload = f.variants[0].payload
	return f
}

func newVariant(tb testing.TB, opts Options, tokens []uint32) variant {
	per, bs := opts.BlocksPerEvent, opts.BlockSize()
	tokens[0], tokens[1] = tokenMark, tokenMark+1
	hashes := make([]kvevent.EngineHash, Blocks)
	gone := make([]kvevent.EngineHash, Blocks)
	for j := range hashes {
		hashes[j] = kvevent.IntHash(storedMark + uint64(j))
		gone[j] = kvevent.IntHash(removedMark + uint64(j))
	}
	b := &kvevent.Batch{Timestamp: 1.7e9, HasDPRank: true}
	switch {
	case opts.Removals && opts.RemovalsPerBlock:
		for j := range gone {
			b.AddRemoved(gone[j:j+1], kvevent.Device)
		}
	case opts.Removals:
		b.AddRemoved(gone, kvevent.Device)
	}
	for i := 0; i < Blocks; i += per {
		parent, hasParent := kvevent.EngineHash{}, i > 0
		switch {
		case opts.Chains:
			parent, hasParent = kvevent.IntHash(parentMark+uint64(i/per)), true
		case i > 0:
			parent = hashes[i-1]
		}
		b.AddStored(hashes[i:i+per], parent, hasParent, tokens[i*bs:(i+per)*bs], bs, kvevent.Device)
	}
	shape := kvevent.Shape{}
	if opts.VLLM {
		shape = kvevent.Shape{Hashes: kvevent.HashDigest32, UpperMedium: true, VLLMFields: true}
	}
	v := variant{payload: kvevent.AppendBatch(nil, b, shape)}
	find := func(enc []byte, want int) []int {
		var offs []int
		for at := 0; ; {
			i := bytes.Index(v.payload[at:], enc)
			if i < 0 {
				break
			}
			offs = append(offs, at+i+1) // past the type byte
			at += i + len(enc)
		}
		if len(offs) != want {
			tb.Fatalf("marker %x found %d times, want %d", enc, len(offs), want)
		}
		return offs
	}
	// Each hash's encoding is found by its marker; Rewrite writes the
	// first 8 bytes of its value. A 32-byte hash gets the same last 24
	// bytes as every other, so that the 8 bytes name it, as they name an
	// integer one.
	u64 := func(v uint64) []byte { return binary.BigEndian.AppendUint64([]byte{0xcf}, v) }
	if opts.VLLM {
		u64 = func(v uint64) []byte {
			d := kvevent.Digest32(kvevent.IntHash(v))
			return append([]byte{0xc4, 32}, d[:]...)
		}
	}
	findHash := func(enc []byte, want int) []int {
		offs := find(enc, want)
		if opts.VLLM {
			for k := range offs {
				offs[k]++ // past the length byte too
				copy(v.payload[offs[k]+8:offs[k]+32], digestTail)
			}
		}
		return offs
	}
	for j := range Blocks {
		// A stored hash is also the parent of the next event, unless
		// every event continues a chain of its own.
		want := 1
		if j%per == per-1 && j < Blocks-1 && !opts.Chains {
			want = 2
		}
		v.stored = append(v.stored, findHash(u64(hashes[j].Lo), want))
		if opts.Removals {
			v.removed = append(v.removed, findHash(u64(gone[j].Lo), 1))
		}
	}
	if opts.Chains {
		for k := range Blocks / per {
			v.parents = append(v.parents, findHash(u64(parentMark+uint64(k)), 1)[0])
		}
	}
	for k := range v.first {
		v.first[k] = find(binary.BigEndian.AppendUint32([]byte{0xce}, tokenMark+uint32(k)), 1)[0]
	}
	return v
}

// digestTail is the last 24 bytes of every 32-byte hash of a VLLM
// message.
const digestTail = "\x5c\x5c\x5c\x5c\x5c\x5c\x5c\x5c\x5c\x5c\x5c\x5c\x5c\x5c\x5c\x5c\x5c\x5c\x5c\x5c\x5c\x5c\x5c\x5c"

// EngineHash is the engine hash a decoder reads for a hash Rewrite wrote
// as v in messages of o.
func (o Options) EngineHash(v uint64) kvevent.EngineHash {
	if !o.VLLM {
		return kvevent.IntHash(v)
	}
	var d [32]byte
	binary.BigEndian.PutUint64(d[:], v)
	copy(d[8:], digestTail)
	return kvevent.BytesHash(d[:])
}

// freshHash is engine hash j of iteration i: spread over 64 bits like a
// real one, distinct, and at least 2^32 so its encoding keeps its width.
func freshHash(i, j int) uint64 {
	x := uint64(i)*Blocks + uint64(j) + 1
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	if x < 1<<32 {
		x |= 1 << 63
	}
	return x
}

// Rewrite makes the message iteration i's, in variant i modulo the
// variants; removals name the blocks of iteration i-window, and with
// Chains parents those of iteration i-1.
func (f *Message) Rewrite(i, window int) {
	v := &f.variants[i%len(f.variants)]
	for j, offs := range v.stored {
		for _, o := range offs {
			binary.BigEndian.PutUint64(v.payload[o:], freshHash(i, j))
		}
	}
	for j, offs := range v.removed {
		binary.BigEndian.PutUint64(v.payload[offs[0]:], freshHash(i-window, j))
	}
	per := Blocks / max(len(v.parents), 1)
	for k, o := range v.parents {
		binary.BigEndian.PutUint64(v.payload[o:], freshHash(i-1, (k+1)*per-1))
	}
	// Ids in [65536, 131072): the same 5-byte encoding, 2^32 chains.
	binary.BigEndian.PutUint32(v.payload[v.first[0]:], 1<<16+uint32(i)&0xffff)
	binary.BigEndian.PutUint32(v.payload[v.first[1]:], 1<<16+uint32(i>>16)&0xffff)
	f.Payload = v.payload
}

// CPUClock measures the CPU time of the goroutine that starts it, which
// it locks to its OS thread until Report.
type CPUClock struct {
	start time.Duration
	ok    bool
}

// StartCPU locks the calling goroutine to its thread and starts a clock.
func StartCPU() *CPUClock {
	runtime.LockOSThread()
	c := &CPUClock{}
	c.start, c.ok = ThreadCPU()
	return c
}

// Report unlocks the goroutine and reports blocks stored per CPU second
// of the thread as blocks/cpu-s, when the platform can tell.
func (c *CPUClock) Report(b *testing.B, blocks float64) {
	end, ok := ThreadCPU()
	runtime.UnlockOSThread()
	if c.ok && ok && end > c.start {
		b.ReportMetric(blocks/(end-c.start).Seconds(), "blocks/cpu-s")
	}
}
