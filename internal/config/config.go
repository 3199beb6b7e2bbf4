package config

import (
	"fmt"
	"io"
	"os"
	"time"
)

// MaxFileBytes bounds the size of a configuration file. The largest valid
// file (128 static streams with long names) is a few tens of KiB, so
// anything near this bound is a mistake, not a configuration.
const MaxFileBytes = 1 << 20

// Config is a validated KV events configuration with every default applied.
type Config struct {
	// MaxStreams bounds the number of subscribed streams (one per instance
	// and DP rank).
	MaxStreams int
	// MaxBlocksPerStream bounds the block metadata of one stream, including
	// mappings kept for parent chains and tokenless events.
	MaxBlocksPerStream int
	// MaxMessageBytes bounds one live message or one snapshot reply.
	MaxMessageBytes int
	// MaxBufferedBytes bounds the live deltas held while a snapshot is
	// being fetched (wire bytes plus decoded-record overhead).
	MaxBufferedBytes int
	// ReplayTimeout bounds the wait for one complete snapshot reply.
	ReplayTimeout time.Duration
	// ResyncInterval is the period of snapshot calibration; zero disables it.
	ResyncInterval time.Duration
	Discovery      Discovery
	// Streams is the static stream list; nil when none is configured.
	Streams []Stream
}

// Discovery holds the rules that derive stream endpoints from the
// instances registered in the instance registry (R-DISC-2).
type Discovery struct {
	Enabled          bool
	BlockSize        int
	Topic            string
	EventPortOffset  int
	ReplayPortOffset int
	RefreshInterval  time.Duration
	// HashSeed seeds the directory's internal content keys of discovered
	// streams; it need not match any engine-side hash.
	HashSeed uint64
}

// Stream is one statically configured instance / DP rank event stream.
type Stream struct {
	InstanceName   string
	DPRank         int
	BlockSize      int
	Endpoint       string
	ReplayEndpoint string
	Topic          string
	HashSeed       uint64
}

// Default returns the configuration of an empty file: no discovery, no
// streams, every limit at its default.
func Default() Config {
	var c Config
	t := target{cfg: &c, disc: &c.Discovery}
	for i := range keyTable {
		k := &keyTable[i]
		if k.scope != scopeStream {
			k.setDefault(t)
		}
	}
	return c
}

// Load reads and parses the configuration file at path.
func Load(path string) (*Config, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("config: open %s: %w", path, err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("config: read %s: %w", path, err)
	}
	c, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", path, err)
	}
	return c, nil
}
