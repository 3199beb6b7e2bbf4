// Package kvindex owns one stream's tiered prefix index (R-IDX): the
// XXH3-128 content keys that identify a block by its whole prefix context,
// the engine_hash → content key mapping used by removals and tokenless
// replica announcements, the independent Device and Host replica bits of
// every block (orphans, whose parent it never knew, included, kept by
// engine hash without a content key), the contiguous-prefix query and the
// per-stream capacity accounting (R-CFG-2).
//
// It must not touch sockets, goroutines, locks, configuration files or
// other streams: it turns decoded kvevent.Event values into index state and
// answers queries over that state, nothing more. Stream health, recovery
// and publishing belong to internal/kvdir, which also serialises access:
// an Index holds no lock of its own.
package kvindex
