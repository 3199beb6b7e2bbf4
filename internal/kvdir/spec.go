package kvdir

import (
	"fmt"
	"time"

	"github.com/kvcar/kvcar/internal/config"
)

// StreamSpec says where one instance/DP stream is published and how its
// blocks are keyed. Two specs with the same Key but any other field
// different describe different streams: the old one is retired.
type StreamSpec struct {
	InstanceName string
	DPRank       int
	Endpoint     string
	// ReplayEndpoint is empty in SyncLive mode.
	ReplayEndpoint string
	// Topic is the topic the engine's messages must carry; empty accepts
	// every topic.
	Topic string
	// Mode says what the replay endpoint answers; empty means
	// config.SyncSnapshot.
	Mode config.SyncMode
	// AnyRank accepts batches tagged with any DP rank: the stream of an
	// instance with one rank, which may be rank r of an engine whose
	// ranks run as separate servers (vLLM's external data parallelism).
	AnyRank bool
	// Bind, when set, is the address of a subscriber kvcar binds (with
	// BindPorts consecutive ports) and the engine dials, shared by every
	// stream with the same Bind and told apart by Topic and DPRank;
	// Endpoint is then informational.
	Bind      string
	BindPorts int
	BlockSize int
	HashSeed  uint64
	// Incarnation identifies the engine process when the registry knows
	// it (incarnation_id, else register_ts_ms); empty for static streams
	// and for engines registered without either.
	Incarnation string
	// Discovered is true for a stream derived from a registered instance
	// (Plan), false for a static one. A discovered stream without an
	// Incarnation belongs to whatever process holds the instance's
	// address: a new one there is found by reconnect and snapshot
	// (R-DISC-5), so routing may count its hits; a static stream has no
	// tie to the registry at all (R-CAR-7).
	Discovered bool
}

// StreamKey names a stream in the directory.
type StreamKey struct {
	InstanceName string
	DPRank       int
}

// SyncMode returns the spec's mode, SyncSnapshot when unset.
func (s StreamSpec) SyncMode() config.SyncMode {
	if s.Mode == "" {
		return config.SyncSnapshot
	}
	return s.Mode
}

// ordered reports the modes whose view follows the engine's sequence
// from wherever it could start: history and live.
func (s StreamSpec) ordered() bool { return s.SyncMode() != config.SyncSnapshot }

// Key returns the directory key of the spec.
func (s StreamSpec) Key() StreamKey { return StreamKey{s.InstanceName, s.DPRank} }

func (s StreamSpec) String() string {
	return fmt.Sprintf("%s/dp%d", s.InstanceName, s.DPRank)
}

// Limits are the per-stream resource bounds and recovery timings
// (R-CFG-2).
type Limits struct {
	MaxBlocksPerStream int
	MaxMessageBytes    int
	MaxBufferedBytes   int
	ReplayTimeout      time.Duration
	ResyncInterval     time.Duration
}

// receiveHWM is the receive high-water mark of a stream's sockets, in
// messages. libzmq counts messages, not bytes, and each may be
// max_message_bytes long, so it is derived from the byte budgets: what
// libzmq queues outside the Go heap fits in max_buffered_bytes, as the
// deltas buffered during a snapshot must. A full queue does not lose
// anything at this end: libzmq stops reading the connection, TCP pushes
// back, and the engine's publisher drops past its own send HWM, which
// the stream sees as a gap and repairs (R-REC-3). The floor of 2 keeps
// one message queued while another is read; the ceiling is libzmq's
// usual default, past which a small-message budget buys nothing.
func (l Limits) receiveHWM() int {
	if l.MaxMessageBytes <= 0 {
		return minReceiveHWM
	}
	return min(max(l.MaxBufferedBytes/l.MaxMessageBytes, minReceiveHWM), maxReceiveHWM)
}

const (
	minReceiveHWM = 2
	maxReceiveHWM = 10000
)

// LimitsFromConfig takes the top-level bounds of a parsed config.
func LimitsFromConfig(c *config.Config) Limits {
	return Limits{
		MaxBlocksPerStream: c.MaxBlocksPerStream,
		MaxMessageBytes:    c.MaxMessageBytes,
		MaxBufferedBytes:   c.MaxBufferedBytes,
		ReplayTimeout:      c.ReplayTimeout,
		ResyncInterval:     c.ResyncInterval,
	}
}

// StaticSpecs turns the config's static streams into specs.
func StaticSpecs(c *config.Config) []StreamSpec {
	specs := make([]StreamSpec, 0, len(c.Streams))
	for _, st := range c.Streams {
		specs = append(specs, StreamSpec{
			InstanceName:   st.InstanceName,
			DPRank:         st.DPRank,
			Endpoint:       st.Endpoint,
			ReplayEndpoint: st.ReplayEndpoint,
			Topic:          st.Topic,
			Mode:           st.SyncMode,
			BlockSize:      st.BlockSize,
			Bind:           bindOf(st),
			BindPorts:      1,
			HashSeed:       st.HashSeed,
		})
	}
	return specs
}

func bindOf(st config.Stream) string {
	if st.Bind {
		return st.Endpoint
	}
	return ""
}

func (s StreamSpec) hubKey() hubKey { return hubKey{bind: s.Bind, ports: max(s.BindPorts, 1)} }
