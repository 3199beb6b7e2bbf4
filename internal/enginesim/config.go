package enginesim

import (
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"time"

	"github.com/kvcar/kvcar/internal/kvevent"
)

// Defaults an xLLM engine uses when its flags leave them out.
const (
	DefaultBlockSize           = 128
	DefaultDeviceBlocks        = 4096
	DefaultSnapshotBatchBlocks = 512
	DefaultSendHWM             = 1000
	DefaultReplaySlowDelay     = 100 * time.Millisecond

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
	// Shape selects which of the engines' wire shapes is sent.
	Shape kvevent.Shape
	// Logger receives the engine's own log lines (discarded when nil).
	Logger *slog.Logger
	// SendHWM is the send high-water mark of both sockets of every rank
	// (DefaultSendHWM); past it the engine drops, as libzmq does.
	SendHWM int
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
}

func (c Config) withDefaults() (Config, error) {
	if c.DPSize == 0 {
		c.DPSize = 1
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
	if c.SendHWM == 0 {
		c.SendHWM = DefaultSendHWM
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
	switch {
	case c.DPSize < 0:
		return c, fmt.Errorf("enginesim: DPSize %d is negative", c.DPSize)
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
	}
	var err error
	if c.EventEndpoints, err = endpointsFor("EventEndpoints", c.EventEndpoints, c.DPSize); err != nil {
		return c, err
	}
	if c.ReplayEndpoints, err = endpointsFor("ReplayEndpoints", c.ReplayEndpoints, c.DPSize); err != nil {
		return c, err
	}
	return c, nil
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
