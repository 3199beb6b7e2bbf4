package server

import (
	"strconv"

	"github.com/kvcar/kvcar/internal/jsonw"
	"github.com/kvcar/kvcar/internal/kvdir"
)

// Match is the prefix-hit observation of one stream (one instance and DP
// rank) for one query (R-API-4, R-IDX-3), as the directory reports it.
//
// All knowledge of Match in this package is in this file: the directory
// interface and the response encoder.
type Match = kvdir.Match

// KVDirectory is the read side of the KV cache directory.
type KVDirectory interface {
	// Query appends to dst one Match per configured stream, sorted by
	// instance name then DP rank, and returns the extended slice. With
	// empty tokenIDs every hit count is zero and only status and
	// resident block counts are reported (R-API-3).
	Query(tokenIDs []uint32, dst []Match) []Match
}

// appendMatches encodes the "matches" array. "error" is always present,
// "" for a synchronised stream, so that clients need not distinguish an
// absent field from an empty one.
func appendMatches(b []byte, ms []Match) []byte {
	b = append(b, '[')
	for i := range ms {
		m := &ms[i]
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"instance_name":`...)
		b = jsonw.String(b, m.InstanceName)
		b = append(b, `,"dp_rank":`...)
		b = strconv.AppendInt(b, int64(m.DPRank), 10)
		b = append(b, `,"synchronized":`...)
		b = strconv.AppendBool(b, m.Synchronized)
		b = append(b, `,"complete":`...)
		b = strconv.AppendBool(b, m.Complete)
		b = append(b, `,"sequence":`...)
		b = strconv.AppendUint(b, m.Sequence, 10)
		b = append(b, `,"device_hit_tokens":`...)
		b = strconv.AppendInt(b, int64(m.DeviceHitTokens), 10)
		b = append(b, `,"host_only_hit_tokens":`...)
		b = strconv.AppendInt(b, int64(m.HostOnlyHitTokens), 10)
		b = append(b, `,"reusable_prefix_tokens":`...)
		b = strconv.AppendInt(b, int64(m.ReusablePrefixTokens), 10)
		b = append(b, `,"device_blocks":`...)
		b = strconv.AppendInt(b, int64(m.DeviceBlocks), 10)
		b = append(b, `,"host_blocks":`...)
		b = strconv.AppendInt(b, int64(m.HostBlocks), 10)
		b = append(b, `,"error":`...)
		b = jsonw.String(b, m.Error)
		b = append(b, '}')
	}
	return append(b, ']')
}

// queryDirectory runs one query into the reusable match slice.
func queryDirectory(d KVDirectory, ids []uint32, dst []Match) []Match {
	return d.Query(ids, dst[:0])
}

// releaseMatches drops string references held by a pooled slice so that
// a returned buffer does not keep old instance names alive.
func releaseMatches(ms []Match) []Match {
	clear(ms)
	return ms[:0]
}
