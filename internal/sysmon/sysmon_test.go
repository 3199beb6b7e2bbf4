package sysmon

import (
	"slices"
	"testing"
)

func TestStateOf(t *testing.T) {
	for _, c := range []struct {
		godebug string
		want    State
	}{
		{"", Default},
		{"http2client=0,madvdontneed=1", Default},
		{"schedtraceX=5", Default},
		{Setting, Polling},
		{"gctrace=1," + Setting, Polling},
		{"schedtrace=1000", Polling},
		{"schedtrace=0", OptedOut},
		{"schedtrace=-1", OptedOut},
		// Not an int32: the runtime ignores it and keeps its default, and
		// the operator still named the key.
		{"schedtrace=2147483648", OptedOut},
		{"schedtrace=soon", OptedOut},
		// The runtime applies entries left to right.
		{"schedtrace=0,schedtrace=5", Polling},
		{"schedtrace=5,schedtrace=0", OptedOut},
		{"schedtrace=5,schedtrace=x", Polling},
	} {
		if got := StateOf(c.godebug); got != c.want {
			t.Errorf("StateOf(%q) = %v, want %v", c.godebug, got, c.want)
		}
	}
}

func TestEnv(t *testing.T) {
	for _, c := range []struct {
		name    string
		env     []string
		want    []string
		changed bool
	}{
		{"no GODEBUG", []string{"PATH=/bin"}, []string{"PATH=/bin", "GODEBUG=" + Setting}, true},
		{"empty GODEBUG", []string{"GODEBUG=", "A=1"}, []string{"GODEBUG=" + Setting, "A=1"}, true},
		{"other settings kept", []string{"GODEBUG=gctrace=1"}, []string{"GODEBUG=gctrace=1," + Setting}, true},
		{"operator opted out", []string{"GODEBUG=schedtrace=0"}, []string{"GODEBUG=schedtrace=0"}, false},
		{"operator's own period", []string{"GODEBUG=gctrace=1,schedtrace=1000"}, []string{"GODEBUG=gctrace=1,schedtrace=1000"}, false},
		{"already restarted", []string{"GODEBUG=" + Setting}, []string{"GODEBUG=" + Setting}, false},
		// The runtime and os.Getenv read the first of duplicates.
		{"first of two", []string{"GODEBUG=a=1", "GODEBUG=schedtrace=0"}, []string{"GODEBUG=a=1," + Setting, "GODEBUG=schedtrace=0"}, true},
		{"not a prefix match", []string{"XGODEBUG=1"}, []string{"XGODEBUG=1", "GODEBUG=" + Setting}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			in := slices.Clone(c.env)
			got, changed := Env(in)
			if !slices.Equal(got, c.want) || changed != c.changed {
				t.Errorf("Env(%q) = %q, %v; want %q, %v", c.env, got, changed, c.want, c.changed)
			}
			if !slices.Equal(in, c.env) {
				t.Errorf("Env modified its argument: %q", in)
			}
			if changed {
				if next, again := Env(got); again || !slices.Equal(next, got) {
					t.Errorf("Env of its own result changed it again: %q", next)
				}
			}
		})
	}
}
