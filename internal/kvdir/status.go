package kvdir

import "time"

// StreamStatus is one stream's state for operators: what it serves, why
// not, and what it has been through.
type StreamStatus struct {
	InstanceName   string
	DPRank         int
	Endpoint       string
	ReplayEndpoint string
	Incarnation    string
	// SyncMode is snapshot, history or live.
	SyncMode     string
	Topic        string
	Synchronized bool
	// Complete: see Match.Complete.
	Complete     bool
	Sequence     uint64
	Error        string
	DeviceBlocks int
	HostBlocks   int

	BatchesApplied uint64
	EventsApplied  uint64
	// EventsByKind counts applied events by kvevent.Kind (index 0 unused).
	EventsByKind     [4]uint64
	DecodeErrors     uint64
	Gaps             uint64
	Disconnects      uint64
	SnapshotsStarted uint64
	SnapshotsOK      uint64
	SnapshotsFailed  uint64
	// PartialStarts counts views started without the engine's whole
	// state (history window too short, live stream joining late, gap).
	PartialStarts uint64
	// TailRepairs counts batches a history calibration recovered that
	// the live channel had lost.
	TailRepairs   uint64
	BufferedBytes int64
	// LastSnapshot is how long the last successful snapshot took.
	LastSnapshot time.Duration
	// LastEventAge is how long ago the last live batch was applied; zero
	// when none has been.
	LastEventAge time.Duration
}

// Streams returns the status of every stream, sorted by instance then DP
// rank. It reads in-process state only.
func (d *Directory) Streams() []StreamStatus {
	set := d.set.Load()
	out := make([]StreamStatus, 0, len(set.streams))
	now := time.Now()
	for _, s := range set.streams {
		out = append(out, s.report(now))
	}
	return out
}

// report reads the stream's view and counters; the metrics collector
// reports the same reading.
func (s *stream) report(now time.Time) StreamStatus {
	var m Match
	id := s.spec.info()
	s.match(&id, s.slot, nil, &m)
	c := &s.counters
	st := StreamStatus{
		InstanceName:     s.spec.InstanceName,
		DPRank:           s.spec.DPRank,
		Endpoint:         s.spec.Endpoint,
		ReplayEndpoint:   s.spec.ReplayEndpoint,
		Incarnation:      s.spec.Incarnation,
		SyncMode:         string(s.spec.SyncMode()),
		Topic:            s.spec.Topic,
		Synchronized:     m.Synchronized,
		Complete:         m.Complete,
		Sequence:         m.Sequence,
		Error:            m.Error,
		DeviceBlocks:     m.DeviceBlocks,
		HostBlocks:       m.HostBlocks,
		BatchesApplied:   c.batchesApplied.Load(),
		EventsApplied:    c.eventsApplied.Load(),
		DecodeErrors:     c.decodeErrors.Load(),
		Gaps:             c.gaps.Load(),
		Disconnects:      c.disconnects.Load(),
		SnapshotsStarted: c.snapshotsStarted.Load(),
		SnapshotsOK:      c.snapshotsOK.Load(),
		SnapshotsFailed:  c.snapshotsFailed.Load(),
		PartialStarts:    c.partialStarts.Load(),
		TailRepairs:      c.tailRepairs.Load(),
		BufferedBytes:    c.bufferedBytes.Load(),
		LastSnapshot:     time.Duration(c.lastSnapshot.Load()),
	}
	for k := range c.eventsByKind {
		st.EventsByKind[k] = c.eventsByKind[k].Load()
	}
	if t := c.lastApplied.Load(); t != 0 {
		st.LastEventAge = now.Sub(time.Unix(0, t))
	}
	return st
}
