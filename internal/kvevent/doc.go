// Package kvevent owns the KV event wire format of the engines: the
// 3-frame live envelope, the replay frames (with and without a topic
// frame) and the MessagePack batches and events inside them, in every
// shape the seed's xLLM engine, vLLM and SGLang send (R-WIRE,
// ../shared/spec/DIALECTS.md). It decodes into reusable typed values
// without generic interfaces, bounded by a maximum message size before
// any allocation proportional to a claimed length, and encodes the same
// shapes for the engine emulator.
//
// The decoder's choices where the formats leave room:
//   - engine hashes are 128-bit EngineHash values: integers exactly,
//     8- and 16-byte strings exactly, other strings (vLLM's 32-byte
//     sha256) through XXH3-128, so none is truncated into a collision;
//   - media are read by name in any case into Device, Host, Disk,
//     External or OtherMedium; only Device and Host are ever hits;
//   - LoRA ids and names, non-nil extra_keys entries, a cache_salt, a KV
//     cache group other than 0, a spec kind other than full attention,
//     locality other than LOCAL and token ids that are not integers make
//     an event not plain text (R-WIRE-5);
//   - a parent of 0 is a root in the legacy array events, a hash in maps;
//   - unknown keys and trailing elements are skipped.
//
// Token ids, most of a message's bytes, are read by a walk over
// precomputed widths (tokens.go); on amd64 processors with SSSE3 the
// widths come from assembly, elsewhere (and with the purego build tag)
// from portable Go that computes the same; a test checks both byte by
// byte.
//
// An event that repeats the bytes of the event of its kind before it
// but for its hashes, parent and token ids (one-block stores and
// removals, as SGLang and vLLM send them) is read through a template
// (template.go): its fixed bytes are compared and only those values
// read, by the functions the general decoder uses. Tests and a fuzzer
// hold both ways to the same result for every input.
//
// It must not know about streams, indexes or sockets: it turns bytes into
// events and events into bytes, nothing more.
package kvevent
