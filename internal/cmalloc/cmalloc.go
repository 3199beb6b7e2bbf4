package cmalloc

import "strings"

const (
	// MmapThreshold is the size from which malloc maps a request alone:
	// above replay frames (256 KB) and the live messages of prompts of a
	// few hundred thousand tokens, below kvcar's largest accepted message
	// (max_message_bytes, 8 MiB by default), whose rare copies may pay
	// for a mapping.
	MmapThreshold = 4 << 20
	// TrimThreshold is the free space at the top of a heap that glibc
	// keeps before it gives any back: room for the messages a burst
	// leaves queued, at most this much memory per heap left idle.
	TrimThreshold = 32 << 20
)

// State says what Keep did.
type State string

const (
	// Kept: the settings are in force.
	Kept State = "kept"
	// OperatorSet: GLIBC_TUNABLES names a malloc threshold; Keep left it.
	OperatorSet State = "operator"
	// Unsupported: the C library takes no such setting (not glibc, or
	// not Linux, or a build without cgo); freed memory goes back as it
	// decides.
	Unsupported State = "unsupported"
)

// The environment variables through which glibc takes the thresholds
// Keep sets: GLIBC_TUNABLES, parsed by operatorSet, and the older
// variables glibc still reads.
const (
	tunablesEnv = "GLIBC_TUNABLES"
	mmapEnv     = "MALLOC_MMAP_THRESHOLD_"
	trimEnv     = "MALLOC_TRIM_THRESHOLD_"
)

// operatorSet reports whether an environment, read through lookup, sets
// either threshold Keep sets. An older variable counts when present,
// even empty: glibc then reads it as 0.
func operatorSet(lookup func(string) (string, bool)) bool {
	tunables, _ := lookup(tunablesEnv)
	for _, t := range strings.Split(tunables, ":") {
		name, _, _ := strings.Cut(t, "=")
		if name == "glibc.malloc.mmap_threshold" || name == "glibc.malloc.trim_threshold" {
			return true
		}
	}
	for _, v := range [...]string{mmapEnv, trimEnv} {
		if _, ok := lookup(v); ok {
			return true
		}
	}
	return false
}

// Keep applies MmapThreshold and TrimThreshold unless the process's
// environment, read through lookup (os.LookupEnv), sets either. Call it
// once, at start, before any socket is opened; it is safe to call again.
func Keep(lookup func(string) (string, bool)) State {
	if operatorSet(lookup) {
		return OperatorSet
	}
	if !keep(MmapThreshold, TrimThreshold) {
		return Unsupported
	}
	return Kept
}
