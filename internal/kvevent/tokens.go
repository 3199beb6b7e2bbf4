package kvevent

import "encoding/binary"

// Token ids dominate a BlockStored message: 128 per block, each a
// MessagePack integer of 1 (positive fixint), 2 (uint8), 3 (uint16) or 5
// (uint32) bytes. Where each id starts depends on the width of every id
// before it, so reading them is one long chain of dependent steps, and
// how fast it goes depends on how short each step is.
//
// A loop that branches on each id's type byte keeps the chain short only
// while the processor predicts the widths. Replaying one message lets it
// learn them all (0.9–1.0 ns an id on this project's reference machine);
// English text and code it predicts well enough (2.6–2.7 ns); Chinese
// text, whose ids change between two and four value bytes at random, it
// does not (4.5–4.7 ns), nor widths drawn at random (4.5–5.0 ns). See
// docs/performance-log.md, "Fresh token ids in every message".
//
// readIDs takes the chain apart, so that its cost does not depend on the
// text (1.4–1.8 ns an id in all those cases when it went two ids a step;
// see README for today's). For a window of bytes it first computes, for
// every byte, the width an id would have if it started there, and the
// distances to the id after that one and to the fourth id on: 32 or 16
// bytes at a time and without a branch (AVX2 or SSSE3, fillWindow), most
// results belonging to bytes inside ids and never used. The walk then
// goes four ids at a time with one load and one add; the ids in between,
// and reading each id's value, hang off the walk instead of lengthening
// it: the eight bytes that end where an id ends hold its value in their
// low bytes.
//
// Where the processor has AVX-512's byte permutes (VBMI), decodeIDs
// first reads the array 64 bytes at a time: from the widths of a
// window's bytes it computes where each id starts by repeated squaring
// of the next-id function, so that the chain of dependent steps is one
// permute a window, and then permutes sixteen ids' value bytes into place
// at once (about half the walk's time an id; see README). The walk reads
// what it leaves: the last window's worth of bytes, and an array with an
// element of another encoding from the window that holds it.

// idChunk is the size of readIDs' windows: big enough to amortise
// starting one (128 bytes cost 6-7 % of decode + apply against 512). A
// window the array's last ids cannot fill is filled only as far as they
// can reach, so that an event of one short block does not pay for a
// whole one (docs/performance-log.md, "Fresh token ids in every message").
const idChunk = 512

// idWidths returns, for each byte of x (read little-endian, so byte k of
// the input is lane k), the width of an id whose type byte it is: 1 below
// 0x80, 2 for 0xcc, 3 for 0xcd, 5 for 0xce. Other bytes of 0x80 and above
// get a width of 2 to 6, which keeps the walk within the window's slack
// until it sees their notID flag (notIDFlags) and stops there.
// fillWindow computes the same for a whole window, in assembly where
// there is some.
func idWidths(x uint64) uint64 {
	const ones = 0x0101010101010101
	hi := x >> 7 & ones                 // 1 in lanes of 0x80 and above
	t := x & (0x03 * ones)              // 0xcc→0, 0xcd→1, 0xce→2
	extra := ones + t + (t >> 1 & ones) // 1, 2, 4: the value bytes
	return ones + extra&(hi<<8-hi)
}

// notIDFlags returns, for each byte of x (read as idWidths reads it),
// notID in the lanes of bytes that are not the first byte of a positive
// fixint, uint8, uint16 or uint32 and 0 in the others, without a branch.
// fillWindow adds them to the widths it writes, so that the walk checks
// two type bytes with one test of bytes it loads anyway: a lane of v is
// below 3 only for 0xcc to 0xce, and only lanes of 0x80 and above count.
func notIDFlags(x uint64) uint64 {
	const ones = 0x0101010101010101
	v := x ^ 0xcc*ones
	ge3 := (v&(0x7f*ones) + 0x7d*ones) | v // bit 7: lane of v at least 3
	return ge3 & x & (notID * ones)
}

// notID marks a width whose byte is no id's type byte; the width itself
// is in the low three bits.
const notID = 0x80

// readPlainID reads a token id encoded as a positive fixint, uint8,
// uint16 or uint32 at the start of p and returns it with its size; size
// is 0 for any other encoding, and when p holds fewer than 5 bytes.
func readPlainID(p []byte) (id uint32, size int) {
	if len(p) < 5 {
		return 0, 0
	}
	switch c := p[0]; {
	case c <= 0x7f:
		return uint32(c), 1
	case c == 0xcc:
		return uint32(p[1]), 2
	case c == 0xcd:
		return uint32(binary.BigEndian.Uint16(p[1:3])), 3
	case c == 0xce:
		return binary.BigEndian.Uint32(p[1:5]), 5
	}
	return 0, 0
}

// readIDs reads token ids of dst from p as long as they are positive
// fixint, uint8, uint16 or uint32 integers, all of them but at most the
// last one and those in p's last 32 bytes. It returns how many it read
// and the rest of p after them; the caller reads the others one by one,
// which also reports every error. It walks in sc.
func readIDs(p []byte, dst []uint32, sc *walkScratch) (int, []byte) {
	i, o := readIDsAt(p, 0, dst, sc)
	return i, p[o:]
}

// readIDsAt is readIDs of the ids from p[o] on, which may read the bytes
// before o: where eight lie behind the first id, as in a message, where
// at least a header precedes an array, the walk starts at once. It
// returns how many ids it read and the offset after them.
func readIDsAt(p []byte, o int, dst []uint32, sc *walkScratch) (int, int) {
	// The eight bytes that end an id start up to seven bytes before it:
	// read the first ids one by one until eight bytes lie behind.
	i := 0
	for ; o < 8 && i < len(dst); i++ {
		id, size := readPlainID(p[o:])
		if size == 0 {
			return i, o
		}
		dst[i], o = id, o+size
	}
	if o < 8 {
		return i, o
	}
	k, used := decodeIDs(p[o:], dst[i:])
	i, o = i+k, o+used
	i, o = walkIDs(p, o, dst, i, sc)
	if i+1 >= len(dst) || o+idChunk+32 <= len(p) {
		// Done (an odd last id is left to the caller), or stopped at a
		// byte that is no id with a window's bytes still ahead.
		return i, o
	}
	return walkTail(p, o, dst, i, sc)
}

// walkTail walks the ids in the last bytes of p, from o on, too few for
// the window walkIDs needs: it walks a copy of them, so that the last ids
// of a message are not read one at a time. The bytes after the copy are
// whatever an earlier one left there. Only a walk past the copy's end
// reads them, where an array claims more ids than the message holds: an
// id's position comes from the widths of the ids before it alone, so a
// walk ends at or before the copy's end only if every id it read lies
// inside. A walk past the end therefore reads none, leaving them all to
// the caller's reading one by one, which reports the error.
func walkTail(p []byte, o int, dst []uint32, i int, sc *walkScratch) (int, int) {
	// The caller makes sure p holds fewer than idChunk+32 bytes from o
	// on: the copy, with the eight bytes before o, fits t, and so does a
	// second window, which the walk needs for the bytes past the first
	// one's stride.
	t := &sc.tail
	n := copy(t[:], p[o-8:])
	ti, to := walkIDs(t[:], 8, dst, i, sc)
	if to > n {
		return i, o
	}
	return ti, o + to - 8
}

// walkIDs walks the ids of dst from dst[i], at p[o] with at least eight
// bytes of p before o, a window at a time while p holds a whole one,
// idChunk+32 bytes from the window's start. It returns how many ids of
// dst it has read and the offset after them.
func walkIDs(p []byte, o int, dst []uint32, i int, sc *walkScratch) (int, int) {
	if o+idChunk+32 > len(p) {
		return i, o
	}
	masks := idMasks()
	const stride = walkStride
	win := &sc.win
	j := uint(0)
	for i < len(dst) {
		// The walk reads widths only where an id starts, and an id
		// takes at most 5 bytes: the last one left starts before
		// j+5*(ids left), so the widths stop there. An event of one
		// block, whose ids end early in a window, is not charged a
		// whole one.
		n := min(idChunk, (int(j)+5*(len(dst)-i)+15)&^15)
		// The steps of four pay for their distances past a few dozen
		// ids; an array of one 16-token block goes two at a time.
		quads := len(dst)-i >= quadsFrom
		if quads {
			fillWindow(win, p[o:], n)
		} else {
			fillPairs(win.w[:], win.w2[:], p[o:], n)
		}
		// q[j : j+8] are the eight bytes that end at p[o+j]. A walk
		// position stays below idChunk, so masking it with idChunk-1
		// changes nothing and lets the compiler drop the bounds check,
		// outside the chain of dependent steps.
		q := (*[idChunk + 8]byte)(p[o-8 : o+idChunk])
		if quads {
			k, at := walkQuads(win, q, dst[i:], j)
			i, j = i+k, at
		}
		// Two ids a step for the last two or three ids of the array, and
		// to stop at the first byte that is no id's type byte.
		for ; j < stride && i+1 < len(dst); i += 2 {
			w := uint(win.w[j])
			mid := j + w&7
			next := j + uint(win.w2[j])
			wm := uint(win.w[mid&(idChunk-1)])
			x := binary.BigEndian.Uint64(q[mid&(idChunk-1):])
			y := binary.BigEndian.Uint64(q[next&(idChunk-1):])
			if (w|wm)&notID != 0 {
				if w&notID != 0 {
					return i, o + int(j)
				}
				dst[i] = uint32(x) & masks[w&7]
				return i + 1, o + int(mid)
			}
			dst[i] = uint32(x) & masks[w&7]
			dst[i+1] = uint32(y) & masks[wm&7]
			j = next
		}
		if j < stride || o+stride+idChunk+32 > len(p) {
			break
		}
		o, j = o+stride, j-stride
	}
	return i, o + int(j)
}

// walkQuadsGo is walkQuads in portable Go.
func walkQuadsGo(win *window, q *[idChunk + 8]byte, dst []uint32, j uint) (int, uint) {
	masks := idMasks()
	i := 0
	// Four ids a step: the chain is the load of w4 and an add, and the
	// ids in between hang off it, found through w and w2. A walk
	// position stays below idChunk, so masking it with idChunk-1 changes
	// nothing and lets the compiler drop the bounds check.
	for ; j < walkStride && i+3 < len(dst); i += 4 {
		w0 := uint(win.w[j])
		m1 := j + w0&7
		m2 := j + uint(win.w2[j])
		next := j + uint(win.w4[j])
		w1 := uint(win.w[m1&(idChunk-1)])
		w2 := uint(win.w[m2&(idChunk-1)])
		m3 := m2 + w2&7
		w3 := uint(win.w[m3&(idChunk-1)])
		// The walk trusted the widths of the bytes at j, m1, m2 and m3:
		// they hold only if those bytes are type bytes, which their
		// flags tell with one test.
		if (w0|w1|w2|w3)&notID != 0 {
			break
		}
		dst[i] = uint32(binary.BigEndian.Uint64(q[m1&(idChunk-1):])) & masks[w0&7]
		dst[i+1] = uint32(binary.BigEndian.Uint64(q[m2&(idChunk-1):])) & masks[w1&7]
		dst[i+2] = uint32(binary.BigEndian.Uint64(q[m3&(idChunk-1):])) & masks[w2&7]
		dst[i+3] = uint32(binary.BigEndian.Uint64(q[next&(idChunk-1):])) & masks[w3&7]
		j = next
	}
	return i, j
}

// idMasks returns the masks of the value bytes of an id of each width,
// by width (a fixint is its own value); walkQuadsAMD64 has the same.
func idMasks() [8]uint32 {
	return [8]uint32{1: 0xff, 2: 0xff, 3: 0xffff, 5: 0xffffffff}
}

// quadsFrom is the fewest ids left for which a window is walked four ids
// a step.
const quadsFrom = 32

// Windows of idChunk bytes follow each other every walkStride bytes.
// Four steps of the walk go at most 24 bytes on, so it enters the next
// window within the last 32 bytes of this one, which both share.
const walkStride = idChunk - 32

// window is what fillWindow computes for a window: for each byte, the
// width of an id starting there with its notIDFlags flag (w), the
// distance to the id after next (w2), and to the fourth id on (w4). w
// and w2 go 16 bytes further than w4, which is computed from w2.
type window struct {
	w, w2 [idChunk + 16]byte
	w4    [idChunk]byte
}

// fillWindow fills win for the first n bytes of p, n a multiple of 16
// from 16 to idChunk; p holds n+32 bytes.
func fillWindow(win *window, p []byte, n int) {
	fillPairs(win.w[:], win.w2[:], p, n+16)
	fillQuads(win.w2[:], win.w4[:], n)
}

// walkScratch is the memory a walk works in. A decoder keeps one across
// arrays (Batch.walk): a walk's own 2.6 KB would be cleared for every
// array, a tenth of the time to read an event's 16 ids. Nothing in it
// carries over from one walk to the next that a walk's result depends
// on: the walk reads only the widths it filled, and walkTail's bytes past
// its copy only when it reads none of them (see walkTail).
type walkScratch struct {
	win  window
	tail [8 + 2*idChunk]byte
}
