package kvindex

import (
	"bytes"
	"testing"

	"github.com/zeebo/xxh3"
)

// The vectors below were computed once with XXH3_128bits_withSeed over the
// byte strings spelled out in each case (tokens as 32-bit little-endian,
// parent key as high64 then low64, both big-endian) and are kept as
// constants so that any change to the encoding fails here (R-IDX-1).

// TestXXH3ReferenceVector_RIDX1 pins the Hi/Lo convention to the published
// XXH3-128 value of the empty input with seed 0,
// 0x99aa06d3014798d8_6001c324468d497f (high64_low64).
func TestXXH3ReferenceVector_RIDX1(t *testing.T) {
	u := xxh3.Hash128Seed(nil, 0)
	if u.Hi != 0x99aa06d3014798d8 || u.Lo != 0x6001c324468d497f {
		t.Fatalf("XXH3-128(\"\", 0) = %#x %#x", u.Hi, u.Lo)
	}
	want := []byte{0x99, 0xaa, 0x06, 0xd3, 0x01, 0x47, 0x98, 0xd8, 0x60, 0x01, 0xc3, 0x24, 0x46, 0x8d, 0x49, 0x7f}
	got := Key{Hi: u.Hi, Lo: u.Lo}.Bytes()
	if !bytes.Equal(got[:], want) {
		t.Fatalf("Key.Bytes = %x, want %x", got, want)
	}
	if canon := u.Bytes(); canon != got {
		t.Fatalf("Key.Bytes %x differs from canonical digest %x", got, canon)
	}
}

func TestKeyVectors_RIDX1(t *testing.T) {
	h := NewHasher(4, 1024)
	k1 := h.BlockKey(Key{}, false, []uint32{1, 2, 3, 4})
	if want := (Key{Hi: 0x5f969e759c68d8e8, Lo: 0x2d5ea1377e03c6b0}); k1 != want {
		t.Fatalf("root key = %#x, want %#x", k1, want)
	}
	k2 := h.BlockKey(k1, true, []uint32{5, 6, 7, 0xffffffff})
	if want := (Key{Hi: 0xc0b586d2528ebdd4, Lo: 0xe15ea1e1bcdf9d0e}); k2 != want {
		t.Fatalf("child key = %#x, want %#x", k2, want)
	}
	if k := NewHasher(4, 0).BlockKey(Key{}, false, []uint32{1, 2, 3, 4}); k != (Key{Hi: 0x903ce79ac359c3eb, Lo: 0x2de5421794dd19f0}) {
		t.Fatalf("seed 0 root key = %#x", k)
	}
	keys := KeysFor([]uint32{1, 2, 3, 4, 5, 6, 7, 0xffffffff}, 4, 1024, nil)
	if len(keys) != 2 || keys[0] != k1 || keys[1] != k2 {
		t.Fatalf("KeysFor = %#x, want [%#x %#x]", keys, k1, k2)
	}
}

func TestKeyVectors128Tokens_RIDX1(t *testing.T) {
	tokens := make([]uint32, 256)
	for i := range 128 {
		tokens[i] = uint32(i*7 + 1)
		tokens[128+i] = uint32(100000 + i)
	}
	keys := NewHasher(128, 1024).Keys(tokens, nil)
	want := []Key{
		{Hi: 0xaa0ae4eea948eb8d, Lo: 0x580e24a9c074f543},
		{Hi: 0x9892e71a89034dc0, Lo: 0x83ef821cd8e9a18b},
	}
	if len(keys) != 2 || keys[0] != want[0] || keys[1] != want[1] {
		t.Fatalf("keys = %#x, want %#x", keys, want)
	}
}

// TestKeysForPartialBlock_RIDX3: only full blocks produce keys, and the
// keys of a prefix do not depend on what follows it.
func TestKeysForPartialBlock_RIDX3(t *testing.T) {
	tokens := make([]uint32, 10)
	for i := range tokens {
		tokens[i] = uint32(i + 1)
	}
	full := KeysFor(tokens[:8], 4, 7, nil)
	withTail := KeysFor(tokens, 4, 7, make([]Key, 5))
	if len(full) != 2 || len(withTail) != 2 {
		t.Fatalf("got %d and %d keys, want 2 and 2", len(full), len(withTail))
	}
	if full[0] != withTail[0] || full[1] != withTail[1] {
		t.Fatalf("partial tail changed the keys: %#x vs %#x", full, withTail)
	}
	if n := len(KeysFor(tokens[:3], 4, 7, nil)); n != 0 {
		t.Fatalf("3 tokens with block size 4 gave %d keys", n)
	}
	if full[0] == full[1] {
		t.Fatal("different blocks share a key")
	}
}

// TestKeysChainContext_RIDX1: a block's key depends on its whole prefix,
// not only its own tokens.
func TestKeysChainContext_RIDX1(t *testing.T) {
	a := KeysFor([]uint32{1, 2, 9, 9}, 2, 1024, nil)
	b := KeysFor([]uint32{3, 4, 9, 9}, 2, 1024, nil)
	if a[1] == b[1] {
		t.Fatal("same block under different parents has the same key")
	}
	if root := KeysFor([]uint32{9, 9}, 2, 1024, nil); root[0] == a[1] {
		t.Fatal("a child's key equals the root key of its tokens")
	}
}

func TestKeysForLargeBlockMatchesHasher(t *testing.T) {
	tokens := make([]uint32, 2*2048+5)
	for i := range tokens {
		tokens[i] = uint32(i * 31)
	}
	a := KeysFor(tokens, 2048, 3, nil)
	b := NewHasher(2048, 3).Keys(tokens, nil)
	if len(a) != 2 || a[0] != b[0] || a[1] != b[1] {
		t.Fatalf("KeysFor %#x != Hasher.Keys %#x", a, b)
	}
}

func TestKeysForNoAllocs(t *testing.T) {
	tokens := make([]uint32, 8192)
	dst := make([]Key, 0, 64)
	h := NewHasher(128, 1024)
	if n := testing.AllocsPerRun(20, func() { dst = KeysFor(tokens, 128, 1024, dst) }); n != 0 {
		t.Fatalf("KeysFor allocates %v times", n)
	}
	if n := testing.AllocsPerRun(20, func() { dst = h.Keys(tokens, dst) }); n != 0 {
		t.Fatalf("Hasher.Keys allocates %v times", n)
	}
}

// TestTokenBytesMatchPortable: the ids' bytes a key hashes are their
// explicit little-endian encoding, on any machine.
func TestTokenBytesMatchPortable(t *testing.T) {
	tokens := []uint32{0, 1, 0x01020304, 0xffffffff, 151935, 1 << 31}
	a := tokenBytes(make([]byte, 4*len(tokens)), tokens)
	b := make([]byte, 4*len(tokens))
	putTokensPortable(b, tokens)
	if !bytes.Equal(a, b) {
		t.Fatalf("tokenBytes %x, portable %x", a, b)
	}
	if want := []byte{4, 3, 2, 1}; !bytes.Equal(b[8:12], want) {
		t.Fatalf("0x01020304 encoded as %x, want %x", b[8:12], want)
	}
	if got := tokenBytes(nil, nil); len(got) != 0 {
		t.Fatalf("no tokens gave %x", got)
	}
}
