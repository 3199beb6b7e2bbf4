package instance

import (
	"slices"
	"testing"
	"time"
)

// A brief says what the instance says of everything the routing scan
// reads; types and states past int8 stay none of the defined ones.
func TestBriefsMatchInstances(t *testing.T) {
	t0 := time.Now()
	ins := []Instance{
		{Meta: Meta{Name: "a", BackendType: "xllm"}, Type: Mix, Role: Decode, State: LeaseLost, HasLoad: true, LoadValid: true, Load: Load{WaitingRequests: 1 << 40}},
		{Meta: Meta{Name: "b"}, Type: Prefill, Role: Prefill, State: Suspect, HasLoad: true, LoadUpdated: t0.Add(time.Second)},
		{Meta: Meta{Name: "c", BackendType: "vllm"}, Type: Type(1000), Role: Type(-5), State: State(300), LoadUpdated: t0.Add(-time.Hour)},
	}
	s := NewSnapshot(ins, 7, true)
	bs := s.Briefs()
	if len(bs) != len(ins) {
		t.Fatalf("%d briefs for %d instances", len(bs), len(ins))
	}
	for i := range ins {
		in, b := &ins[i], &bs[i]
		if b.WaitingRequests != in.Load.WaitingRequests || b.BackendType != in.Meta.BackendType ||
			b.HasLoad != in.HasLoad || b.LoadValid != in.LoadValid || b.Schedulable() != in.Schedulable() {
			t.Errorf("instance %s: brief %+v", in.Meta.Name, *b)
		}
		// The load reports' times, from the same origin, by the
		// monotonic clock (the wall clock's reading is stripped).
		want := int64(NoLoadAt)
		if !in.LoadUpdated.IsZero() {
			want = int64(in.LoadUpdated.Sub(ins[1].LoadUpdated))
		}
		if at := LoadEpoch(ins).Round(0).Add(time.Duration(b.LoadAt)); b.LoadAt != want || (want != NoLoadAt && !at.Equal(in.LoadUpdated.Round(0))) {
			t.Errorf("instance %s: LoadAt %d, want %d", in.Meta.Name, b.LoadAt, want)
		}
		for _, v := range []struct{ got, want int }{{int(b.Type()), int(in.Type)}, {int(b.Role()), int(in.Role)}, {int(b.State()), int(in.State)}} {
			if v.got != v.want && (v.got != -1 || (v.want >= 0 && v.want <= 127)) {
				t.Errorf("instance %s: brief type/role/state %d, instance %d", in.Meta.Name, v.got, v.want)
			}
		}
	}
	if s.Version != 7 || !s.Synced {
		t.Errorf("snapshot %+v", s)
	}
}

// A snapshot without briefs, or a copy given other Instances, has none:
// its reader makes them from the Instances it has, never reading briefs
// of others.
func TestBriefsOnlyForTheirInstances(t *testing.T) {
	s := NewSnapshot([]Instance{{Meta: Meta{Name: "a"}, Load: Load{WaitingRequests: 3}}}, 1, true)
	other := *s
	other.Instances = slices.Clone(s.Instances)
	other.Instances[0].Load.WaitingRequests = 9
	if b := other.Briefs(); b != nil {
		t.Errorf("a copy with other instances reads briefs %+v", b)
	}
	if b := (&Snapshot{Instances: s.Instances}).Briefs(); b != nil {
		t.Errorf("a snapshot built without briefs reads %+v", b)
	}
	if b := (&Snapshot{}).Briefs(); b != nil {
		t.Errorf("an empty snapshot reads briefs %+v", b)
	}
	if b := AppendBriefs(nil, other.Instances); len(b) != 1 || b[0].WaitingRequests != 9 {
		t.Errorf("AppendBriefs of the copy: %+v", b)
	}
}

// TestSnapshotIndex finds every instance of a snapshot sorted by name at
// its position, and no name that is not there, before the first, between
// two or after the last; Lookup returns what is at that position.
func TestSnapshotIndex(t *testing.T) {
	names := []string{"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"}
	ins := make([]Instance, len(names))
	for i, n := range names {
		ins[i].Meta.Name = n
	}
	s := NewSnapshot(ins, 1, true)
	for i, n := range names {
		if j, ok := s.Index(n); !ok || j != i {
			t.Errorf("Index(%q) = %d, %v; want %d, true", n, j, ok, i)
		}
		if in, ok := s.Lookup(n); !ok || in.Meta.Name != n {
			t.Errorf("Lookup(%q) = %q, %v", n, in.Meta.Name, ok)
		}
	}
	for _, n := range []string{"", "10.0.0.0:8000", "10.0.0.15:8000", "10.0.0.9:8000"} {
		if j, ok := s.Index(n); ok {
			t.Errorf("Index(%q) = %d, true; it is not in the snapshot", n, j)
		}
		if _, ok := s.Lookup(n); ok {
			t.Errorf("Lookup(%q) found an instance not in the snapshot", n)
		}
	}
	if _, ok := (&Snapshot{}).Index(names[0]); ok {
		t.Error("an empty snapshot holds an instance")
	}
}
