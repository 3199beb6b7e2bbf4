package enginesim

import (
	"strconv"
	"testing"
)

// The log keeps the last maxServedRecords requests and forgets older
// ones, so that its memory is bounded however long the engine serves.
func TestServedLogKeepsTheLast(t *testing.T) {
	var l servedLog
	for i := range maxServedRecords + 10 {
		l.put(strconv.Itoa(i), EngineUsage{DeviceHitTokens: i})
	}
	l.put("20", EngineUsage{DeviceHitTokens: -1}) // an update is not a new entry
	for i := range maxServedRecords + 10 {
		eu, ok := l.get(strconv.Itoa(i))
		if want := i >= 10; ok != want || (ok && i != 20 && eu.DeviceHitTokens != i) {
			t.Fatalf("record %d: %+v %v, want kept %v", i, eu, ok, want)
		}
	}
	if len(l.byID) != maxServedRecords || len(l.order) != maxServedRecords {
		t.Fatalf("%d records, ring of %d", len(l.byID), len(l.order))
	}
}
