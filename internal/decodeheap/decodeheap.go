package decodeheap

import (
	"runtime"

	"google.golang.org/protobuf/proto"
)

// PerDecode decodes wire into fresh messages from newMsg, enough of them
// to hold a megabyte or more so that anything else the process allocates
// meanwhile is noise next to them, and returns the live heap each one
// holds and one of them.
func PerDecode(wire []byte, newMsg func() proto.Message) (int64, proto.Message, error) {
	copies := max(20, 1<<20/max(len(wire), 1))
	kept := make([]proto.Message, copies)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := range kept {
		kept[i] = newMsg()
		if err := proto.Unmarshal(wire, kept[i]); err != nil {
			return 0, nil, err
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(kept)
	return (int64(after.HeapAlloc) - int64(before.HeapAlloc)) / int64(copies), kept[0], nil
}
