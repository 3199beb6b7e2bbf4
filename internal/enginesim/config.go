package enginesim

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/kvcar/kvcar/internal/kvevent"

	"github.com/kvcar/kvcar/internal/tokenizer"
)

// Defaults an xLLM engine uses when its flags leave them out.
const (
	DefaultBlockSize           = 128
	DefaultDeviceBlocks        = 4096
	DefaultSnapshotBatchBlocks = 512
	DefaultSendHWM             = 1000
	DefaultReplaySlowDelay     = 100 * time.Millisecond

	// DefaultHistoryBatches is the history a ReplayHistory rank keeps,
	// vLLM's buffer_steps default.
	DefaultHistoryBatches = 10000

	// DefaultEventPortOffset and DefaultReplayPortOffset are the discovery
	// offsets from the business HTTP port (R-DISC-2).
	DefaultEventPortOffset  = 10000
	DefaultReplayPortOffset = 30000
)

// AnyPort binds a free loopback port; after Start the engine keeps the
// port it got, including across Restart.
const AnyPort = "tcp://127.0.0.1:0"

// Config describes one emulated engine instance.
type Config struct {
	// Name is the instance name, the business "ip:http_port" address.
	Name string
	// DPSize is the number of DP ranks, each with its own streams (1).
	DPSize int
	// DPRankBase is added to every rank's number in its batches: an
	// engine that is rank r of vLLM's external data parallelism, its own
	// HTTP server at port+r, tags its batches with r (0).
	DPRankBase int
	// BlockSize is the number of tokens per block (DefaultBlockSize).
	BlockSize int
	// DeviceBlocks is the Device capacity of each DP rank, in blocks
	// (DefaultDeviceBlocks).
	DeviceBlocks int
	// HostBlocks is the Host capacity of each DP rank; 0 disables Host
	// offload, so evicted Device blocks are simply dropped.
	HostBlocks int
	// Topic is the first frame of every live message.
	Topic string
	// EventEndpoints and ReplayEndpoints hold one bind address per DP
	// rank; empty means AnyPort for every rank. See DiscoveryEndpoints.
	EventEndpoints  []string
	ReplayEndpoints []string
	// DialEvents, when set, makes each rank's publisher dial a bound
	// subscriber at this tcp://host:port address's port + rank instead
	// of binding an event endpoint: vLLM with a non-wildcard endpoint,
	// and llm-d's convention of one subscriber every pod dials. The
	// replay endpoints are still bound.
	DialEvents string
	// Shape selects which of the engines' wire shapes is sent.
	Shape kvevent.Shape
	// Replay selects what the replay endpoint answers: the full current
	// state (ReplayState, the seed's xLLM engine), the buffered history
	// of live messages (ReplayHistory, vLLM and SGLang with a replay
	// endpoint) or nothing, with no endpoint bound (ReplayNone, their
	// default).
	Replay ReplayKind
	// HistoryBatches bounds the live messages a ReplayHistory rank keeps
	// for replay (DefaultHistoryBatches); older ones are forgotten.
	HistoryBatches int
	// ReplayTopicFrames sends replay replies as [empty, topic, seq,
	// payload] and the end marker as [empty, empty, END, empty], as
	// vLLM 0.26 and later do, instead of the 3-frame forms.
	ReplayTopicFrames bool
	// Logger receives the engine's own log lines (discarded when nil).
	Logger *slog.Logger
	// SendHWM is the send high-water mark of both sockets of every rank
	// (DefaultSendHWM); past it the engine drops, as libzmq does.
	SendHWM int
	// ReplaySendHWM overrides SendHWM for the replay ROUTER when
	// positive, so a test can make the live channel drop under a flood
	// without the snapshot replies dropping too.
	ReplaySendHWM int
	// HashSeed seeds the engine's own 64-bit block hash. It is unrelated
	// to kvcar's hash_seed: the two hashes are deliberately different.
	HashSeed uint64
	// SnapshotBatchBlocks caps the blocks in one replay reply batch
	// (DefaultSnapshotBatchBlocks).
	SnapshotBatchBlocks int
	// ReplaySlowDelay is the pause before each reply in ReplaySlow mode
	// (DefaultReplaySlowDelay); SetReplayDelay changes it per rank.
	ReplaySlowDelay time.Duration
	// Clock supplies batch timestamps (time.Now when nil), so runs can be
	// made byte-for-byte reproducible.
	Clock func() time.Time

	// Tokenizer, when set, tokenizes text and chat prompts as the model
	// would (the same files kvcar's --tokenizer_path loads); nil uses the
	// toy tokenizer.
	Tokenizer *tokenizer.Tokenizer

	// HTTPAddr, when set, is the business HTTP address Start listens on,
	// "127.0.0.1:0" for any free port. An empty Name becomes the bound
	// "ip:port", which is what the engine registers and what kvcar's
	// registry probes /health on.
	HTTPAddr string
	// DiscoveryOffsets, when set, derives every rank's event and replay
	// endpoints from the HTTP port the way kvcar's discovery does
	// (R-DISC-2), so EventEndpoints and ReplayEndpoints must be empty. An
	// empty HTTPAddr means "127.0.0.1:0"; a port 0 is replaced, in New, by
	// one for which the HTTP port and all derived ports are free.
	DiscoveryOffsets *DiscoveryOffsets
	// Etcd, when set, makes Start register the instance in etcd under a
	// lease it keeps alive, and Close revoke it.
	Etcd *EtcdConfig
	// Heartbeat, when set together with Etcd, makes the engine report its
	// load to the master service found in etcd.
	Heartbeat *HeartbeatConfig

	// The inference cost model of the HTTP request path (see serve.go).

	// ModelName is the one model /v1/models lists (DefaultModelName).
	ModelName string
	// TimeScale multiplies every emulated latency (1 when 0): 1 is
	// real-ish, tests use 0.001 or less so that a request costs
	// microseconds while keeping the proportions.
	TimeScale float64
	// PrefillPerToken is the compute time of one uncached prompt token
	// (DefaultPrefillPerToken).
	PrefillPerToken time.Duration
	// HostLoadPerToken is the time to load one Host-hit token back to
	// Device (PrefillPerToken/5 when 0): cheaper than computing it, not
	// free.
	HostLoadPerToken time.Duration
	// PrefillAttentionPer1KContext is the attention time of one computed
	// token per 1,024 tokens of context before it; 0 leaves attention
	// out, so prefill is linear in the uncached tokens (see CostModel).
	PrefillAttentionPer1KContext time.Duration
	// DecodePerToken is the time of one decode step, one output token
	// after the first (DefaultDecodePerToken).
	DecodePerToken time.Duration
	// BatchSlots is how many requests each DP rank serves at once
	// (DefaultBatchSlots); later ones wait in the rank's FIFO queue.
	BatchSlots int
	// MaxQueue caps the requests waiting for a slot over all ranks
	// (DefaultMaxQueue); one more is refused with 503.
	MaxQueue int
}

// Defaults of the inference cost model, scaled by Config.TimeScale.
const (
	DefaultModelName       = "enginesim"
	DefaultPrefillPerToken = 100 * time.Microsecond
	DefaultDecodePerToken  = 20 * time.Millisecond
	DefaultBatchSlots      = 4
	DefaultMaxQueue        = 1024
)

func (c Config) withDefaults() (Config, error) {
	if c.DPSize == 0 {
		c.DPSize = 1
	}
	if c.DPSize < 0 {
		return c, fmt.Errorf("enginesim: DPSize %d is negative", c.DPSize)
	}
	// The engine keeps its own copies, so that a caller reusing a Config
	// cannot change a running engine.
	if c.DiscoveryOffsets != nil {
		o := *c.DiscoveryOffsets
		c.DiscoveryOffsets = &o
	}
	if c.Etcd != nil {
		ec := *c.Etcd
		ec.Endpoints = append([]string(nil), ec.Endpoints...)
		ec.ExtraMeta = maps.Clone(ec.ExtraMeta)
		c.Etcd = &ec
	}
	if c.Heartbeat != nil {
		hc := *c.Heartbeat
		c.Heartbeat = &hc
	}
	if err := c.resolveHTTP(); err != nil {
		return c, err
	}
	if err := c.Etcd.validate(c.Name, c.HTTPAddr); err != nil {
		return c, err
	}
	if err := c.Heartbeat.validate(c.Etcd != nil); err != nil {
		return c, err
	}
	if c.BlockSize == 0 {
		c.BlockSize = DefaultBlockSize
	}
	if c.DeviceBlocks == 0 {
		c.DeviceBlocks = DefaultDeviceBlocks
	}
	if c.SnapshotBatchBlocks == 0 {
		c.SnapshotBatchBlocks = DefaultSnapshotBatchBlocks
	}
	if c.HistoryBatches == 0 {
		c.HistoryBatches = DefaultHistoryBatches
	}
	switch {
	case c.DPRankBase < 0:
		return c, fmt.Errorf("enginesim: DPRankBase %d is negative", c.DPRankBase)
	case c.HistoryBatches < 0:
		return c, fmt.Errorf("enginesim: HistoryBatches %d is negative", c.HistoryBatches)
	case c.Replay < ReplayState || c.Replay > ReplayNone:
		return c, fmt.Errorf("enginesim: unknown Replay kind %d", c.Replay)
	}
	if c.SendHWM == 0 {
		c.SendHWM = DefaultSendHWM
	}
	if c.ReplaySendHWM == 0 {
		c.ReplaySendHWM = c.SendHWM
	}
	if c.ReplaySlowDelay == 0 {
		c.ReplaySlowDelay = DefaultReplaySlowDelay
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Clock == nil {
		c.Clock = time.Now
	}
	if err := c.servingDefaults(); err != nil {
		return c, err
	}
	switch {
	case c.BlockSize < 0:
		return c, fmt.Errorf("enginesim: BlockSize %d is negative", c.BlockSize)
	case c.DeviceBlocks < 0:
		return c, fmt.Errorf("enginesim: DeviceBlocks %d is negative", c.DeviceBlocks)
	case c.HostBlocks < 0:
		return c, fmt.Errorf("enginesim: HostBlocks %d is negative", c.HostBlocks)
	case c.SnapshotBatchBlocks < 0:
		return c, fmt.Errorf("enginesim: SnapshotBatchBlocks %d is negative", c.SnapshotBatchBlocks)
	case c.SendHWM < 0:
		return c, fmt.Errorf("enginesim: SendHWM %d is negative", c.SendHWM)
	case c.ReplaySendHWM < 0:
		return c, fmt.Errorf("enginesim: ReplaySendHWM %d is negative", c.ReplaySendHWM)
	}
	var err error
	if c.DialEvents != "" {
		if c.EventEndpoints, err = dialEndpoints(c.DialEvents, c.DPSize); err != nil {
			return c, err
		}
	}
	if c.EventEndpoints, err = endpointsFor("EventEndpoints", c.EventEndpoints, c.DPSize); err != nil {
		return c, err
	}
	if c.ReplayEndpoints, err = endpointsFor("ReplayEndpoints", c.ReplayEndpoints, c.DPSize); err != nil {
		return c, err
	}
	return c, nil
}

// servingDefaults fills in and checks the cost model.
func (c *Config) servingDefaults() error {
	switch {
	case math.IsNaN(c.TimeScale) || math.IsInf(c.TimeScale, 0) || c.TimeScale < 0:
		return fmt.Errorf("enginesim: TimeScale %v is not a finite non-negative number", c.TimeScale)
	case c.PrefillPerToken < 0 || c.HostLoadPerToken < 0 || c.DecodePerToken < 0 || c.PrefillAttentionPer1KContext < 0:
		return fmt.Errorf("enginesim: negative per-token cost (prefill %v, host load %v, decode %v, attention per 1K context %v)",
			c.PrefillPerToken, c.HostLoadPerToken, c.DecodePerToken, c.PrefillAttentionPer1KContext)
	case c.BatchSlots < 0:
		return fmt.Errorf("enginesim: BatchSlots %d is negative", c.BatchSlots)
	case c.MaxQueue < 0:
		return fmt.Errorf("enginesim: MaxQueue %d is negative", c.MaxQueue)
	}
	if c.ModelName == "" {
		c.ModelName = DefaultModelName
	}
	if c.TimeScale == 0 {
		c.TimeScale = 1
	}
	if c.PrefillPerToken == 0 {
		c.PrefillPerToken = DefaultPrefillPerToken
	}
	if c.HostLoadPerToken == 0 {
		c.HostLoadPerToken = c.PrefillPerToken / 5
	}
	if c.DecodePerToken == 0 {
		c.DecodePerToken = DefaultDecodePerToken
	}
	if c.BatchSlots == 0 {
		c.BatchSlots = DefaultBatchSlots
	}
	if c.MaxQueue == 0 {
		c.MaxQueue = DefaultMaxQueue
	}
	return nil
}

// resolveHTTP applies the discovery rule and names the instance after a
// concrete HTTP address when no name is given.
func (c *Config) resolveHTTP() error {
	if c.DiscoveryOffsets != nil {
		if len(c.EventEndpoints) > 0 || len(c.ReplayEndpoints) > 0 {
			return errors.New("enginesim: DiscoveryOffsets derives the endpoints; EventEndpoints and ReplayEndpoints must be empty")
		}
		if c.DialEvents != "" {
			defer func() { c.EventEndpoints = nil }() // dialEndpoints fills them
		}
		if c.HTTPAddr == "" {
			c.HTTPAddr = "127.0.0.1:0"
		}
		host, port, err := splitHostPort(c.HTTPAddr)
		if err != nil {
			return err
		}
		off := *c.DiscoveryOffsets
		if port == 0 {
			if port, err = freeDiscoveryPort(host, c.DPSize, false, off.Event, off.Replay); err != nil {
				return err
			}
			c.HTTPAddr = net.JoinHostPort(host, strconv.Itoa(port))
		}
		if c.EventEndpoints, c.ReplayEndpoints, err = DiscoveryEndpoints(c.HTTPAddr, c.DPSize, off.Event, off.Replay); err != nil {
			return err
		}
	}
	if c.HTTPAddr == "" {
		return nil
	}
	_, port, err := splitHostPort(c.HTTPAddr)
	if err != nil {
		return err
	}
	if c.Name == "" && port != 0 {
		c.Name = c.HTTPAddr
	}
	return nil
}

func splitHostPort(addr string) (string, int, error) {
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, fmt.Errorf("enginesim: http address %q: %w", addr, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("enginesim: http address %q: bad port", addr)
	}
	return host, port, nil
}

func endpointsFor(key string, eps []string, dpSize int) ([]string, error) {
	if len(eps) == 0 {
		out := make([]string, dpSize)
		for i := range out {
			out[i] = AnyPort
		}
		return out, nil
	}
	if len(eps) != dpSize {
		return nil, fmt.Errorf("enginesim: %s has %d entries for DPSize %d", key, len(eps), dpSize)
	}
	return append([]string(nil), eps...), nil
}

// DiscoveryEndpoints derives the bind addresses of every DP rank from the
// business HTTP address the way kvcar's discovery derives the addresses it
// connects to (R-DISC-2): events on port+eventOffset+dp, replay on
// port+replayOffset+dp. "127.0.0.1:8000" with DP 2 and the default offsets
// gives events 18000/18001 and replay 38000/38001.
func DiscoveryEndpoints(httpAddr string, dpSize, eventOffset, replayOffset int) (events, replay []string, err error) {
	host, portStr, err := net.SplitHostPort(httpAddr)
	if err != nil {
		return nil, nil, fmt.Errorf("enginesim: http address %q: %w", httpAddr, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port <= 0 || port > 65535 {
		return nil, nil, fmt.Errorf("enginesim: http address %q: bad port", httpAddr)
	}
	if dpSize <= 0 {
		return nil, nil, fmt.Errorf("enginesim: dp size %d is not positive", dpSize)
	}
	mk := func(offset, dp int) (string, error) {
		p := port + offset + dp
		if p <= 0 || p > 65535 {
			return "", fmt.Errorf("enginesim: http address %q, offset %d, dp %d: port %d out of range", httpAddr, offset, dp, p)
		}
		return "tcp://" + net.JoinHostPort(host, strconv.Itoa(p)), nil
	}
	for dp := 0; dp < dpSize; dp++ {
		ev, err := mk(eventOffset, dp)
		if err != nil {
			return nil, nil, err
		}
		rp, err := mk(replayOffset, dp)
		if err != nil {
			return nil, nil, err
		}
		events = append(events, ev)
		replay = append(replay, rp)
	}
	return events, replay, nil
}

// dialEndpoints gives rank r the address base's port + r, as vLLM offsets
// its endpoint by the DP rank.
func dialEndpoints(base string, dpSize int) ([]string, error) {
	rest, ok := strings.CutPrefix(base, "tcp://")
	host, portStr, err := net.SplitHostPort(rest)
	port, perr := strconv.Atoi(portStr)
	if !ok || err != nil || perr != nil || port <= 0 || port+dpSize-1 > 65535 {
		return nil, fmt.Errorf("enginesim: DialEvents %q is not tcp://host:port with room for %d ranks", base, dpSize)
	}
	out := make([]string, dpSize)
	for r := range out {
		out[r] = "tcp://" + net.JoinHostPort(host, strconv.Itoa(port+r))
	}
	return out, nil
}
