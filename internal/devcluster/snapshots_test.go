package devcluster

import "testing"

// TestSnapshotsBetweenCountsRemadeStreams: a stream kvcar made anew
// between two listings (its counters went back) counts from zero, one
// new in the second listing counts whole, and one gone counts nothing;
// no difference can wrap around.
func TestSnapshotsBetweenCountsRemadeStreams(t *testing.T) {
	before := []StreamState{
		{Instance: "a", SnapshotsSucceeded: 10, SnapshotsFailed: 1},
		{Instance: "b", SnapshotsSucceeded: 50, SnapshotsFailed: 4},
		{Instance: "b", DPRank: 1, SnapshotsSucceeded: 7},
		{Instance: "gone", SnapshotsSucceeded: 99},
	}
	after := []StreamState{
		{Instance: "a", SnapshotsSucceeded: 13, SnapshotsFailed: 1},  // 3 and 0
		{Instance: "b", SnapshotsSucceeded: 2, SnapshotsFailed: 5},   // remade: 2 and 5
		{Instance: "b", DPRank: 1, SnapshotsSucceeded: 9},            // 2
		{Instance: "new", SnapshotsSucceeded: 4, SnapshotsFailed: 2}, // 4 and 2
	}
	ok, failed := SnapshotsBetween(before, after)
	if ok != 11 || failed != 7 {
		t.Fatalf("SnapshotsBetween = %d succeeded, %d failed; want 11 and 7", ok, failed)
	}
}
