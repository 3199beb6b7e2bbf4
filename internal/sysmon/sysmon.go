package sysmon

import (
	"strconv"
	"strings"
)

const (
	// Key is the GODEBUG setting sysmon's pace hangs on.
	Key = "schedtrace"
	// Setting is what kvcar runs with: the largest trace period the
	// runtime accepts (int32 milliseconds, 24.8 days).
	Setting = Key + "=2147483647"
)

// State is how a process's GODEBUG sets sysmon's pace.
type State int

const (
	// Default: GODEBUG does not name schedtrace; sysmon deep-sleeps.
	Default State = iota
	// Polling: schedtrace is positive; sysmon never deep-sleeps.
	Polling
	// OptedOut: GODEBUG names schedtrace but sets no positive value
	// (schedtrace=0 is the operator's way to keep the runtime's
	// default).
	OptedOut
)

func (s State) String() string {
	switch s {
	case Polling:
		return "polling"
	case OptedOut:
		return "opted-out"
	default:
		return "default"
	}
}

// StateOf returns the state a GODEBUG value sets. As the runtime does,
// the last schedtrace entry with a valid value wins; one that names
// schedtrace with no valid value at all still counts as the operator's
// choice (OptedOut), since the runtime keeps its default.
func StateOf(godebug string) State {
	named, n := false, int64(0)
	for f := range strings.SplitSeq(godebug, ",") {
		k, v, ok := strings.Cut(f, "=")
		if !ok || k != Key {
			continue
		}
		named = true
		if x, err := strconv.ParseInt(v, 10, 32); err == nil {
			n = x
		}
	}
	switch {
	case n > 0:
		return Polling
	case named:
		return OptedOut
	default:
		return Default
	}
}

// Env returns env with Setting added to GODEBUG, and whether it added
// it. An env whose GODEBUG already names schedtrace is returned as it
// is. The runtime reads the first GODEBUG of an environment, so that is
// the one extended; env itself is not modified.
func Env(env []string) ([]string, bool) {
	for i, kv := range env {
		v, ok := strings.CutPrefix(kv, "GODEBUG=")
		if !ok {
			continue
		}
		if StateOf(v) != Default {
			return env, false
		}
		out := append([]string(nil), env...)
		if v == "" {
			out[i] = "GODEBUG=" + Setting
		} else {
			out[i] = "GODEBUG=" + v + "," + Setting
		}
		return out, true
	}
	return append(append([]string(nil), env...), "GODEBUG="+Setting), true
}
