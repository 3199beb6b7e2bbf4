// Package blockhash computes XXH3-128 with a seed (XXH3_128bits_withSeed)
// of a block's ids, alone or after its parent's 16-byte key: the content
// key of R-IDX-1.
//
// It owns XXH3's long-input path (over 240 bytes: a block of 57 or more
// ids), where a general implementation derives the seed's secret again for
// every call and needs its input in one piece. A Hasher derives the secret
// once; the parent's key comes in as two words and the ids are read where
// they lie, so nothing is copied; with AVX-512 one routine takes every
// stripe and the merge. A block of 8 to 28 ids after its parent (vLLM's
// default of 16 among them) takes XXH3's path for 17 to 128 bytes, also
// read in place. Other short inputs go, copied into the caller's scratch,
// to github.com/zeebo/xxh3, whose seeded short paths need no secret; its
// output is also what the tests and the fuzz target hold this package's
// to, bit for bit.
//
// It must not know what a token or an index is: callers give it bytes
// and words.
package blockhash
