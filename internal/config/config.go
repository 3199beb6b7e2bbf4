package config

import (
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
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

// SyncMode says how a stream learns its engine's state (see the README,
// "vLLM and SGLang engines").
type SyncMode string

const (
	// SyncSnapshot: the replay endpoint answers with the engine's full
	// current state (the seed's xLLM engine). Views are complete.
	SyncSnapshot SyncMode = "snapshot"
	// SyncHistory: the replay endpoint answers with the batches the
	// engine still buffers from the requested sequence on (vLLM and
	// SGLang with a replay endpoint). A view is complete only when that
	// history reaches back to the engine's sequence 0 or to an
	// AllBlocksCleared; otherwise it is partial.
	SyncHistory SyncMode = "history"
	// SyncLive: no replay endpoint (vLLM's and SGLang's default). A view
	// starts empty at the first message, partial unless that message is
	// the engine's sequence 0.
	SyncLive SyncMode = "live"
)

// syncModes lists the accepted values in documentation order.
var syncModes = []string{string(SyncSnapshot), string(SyncHistory), string(SyncLive)}

// Discovery holds the rules that derive stream endpoints from the
// instances registered in the instance registry (R-DISC-2).
type Discovery struct {
	Enabled bool
	// SyncMode applies to instances whose backend_type is "xllm", empty,
	// or none of those below; VLLMSyncMode and SGLangSyncMode to
	// backend_type "vllm" and "sglang".
	SyncMode       SyncMode
	VLLMSyncMode   SyncMode
	SGLangSyncMode SyncMode
	BlockSize      int
	// Topic, VLLMTopic and SGLangTopic are topic templates (see
	// ExpandTopic) for the same backends as the sync modes.
	Topic            string
	VLLMTopic        string
	SGLangTopic      string
	EventPortOffset  int
	ReplayPortOffset int
	// SubscribeBind, when set, makes kvcar bind one subscriber there
	// (and on the SubscribeBindPorts-1 ports after it) that every
	// engine's publisher dials, instead of connecting to each engine.
	SubscribeBind      string
	SubscribeBindPorts int
	RefreshInterval    time.Duration
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
	// SyncMode says what ReplayEndpoint answers; it is empty in SyncLive.
	SyncMode SyncMode
	// Bind makes Endpoint an address kvcar binds and the engine dials;
	// streams with the same Endpoint share it, told apart by Topic and
	// DPRank.
	Bind bool
}

// TopicFor returns the topic template discovery uses for an instance of
// the given backend_type.
func (d *Discovery) TopicFor(backendType string) string {
	switch backendType {
	case "vllm":
		return d.VLLMTopic
	case "sglang":
		return d.SGLangTopic
	}
	return d.Topic
}

// ExpandTopic fills a topic template for one stream: {name} is the
// instance name, {host} and {port} its two parts, {dp_rank} the stream's
// DP rank. The empty template stays empty, which accepts every topic.
// The template was checked by Parse (topicTemplateError).
func ExpandTopic(template, name, host, port string, dpRank int) string {
	if !strings.Contains(template, "{") {
		return template
	}
	return strings.NewReplacer("{name}", name, "{host}", host, "{port}", port,
		"{dp_rank}", strconv.Itoa(dpRank)).Replace(template)
}

// topicTemplateError returns why s is not a valid topic template, or "".
func topicTemplateError(s string) string {
	rest := s
	for {
		i := strings.IndexAny(rest, "{}")
		if i < 0 {
			return ""
		}
		if rest[i] == '}' {
			return "has a } without a {"
		}
		j := strings.IndexByte(rest[i:], '}')
		if j < 0 {
			return "has a { without a }"
		}
		switch ph := rest[i : i+j+1]; ph {
		case "{name}", "{host}", "{port}", "{dp_rank}":
		default:
			return "has the unknown placeholder " + ph + "; known are {name}, {host}, {port} and {dp_rank}"
		}
		rest = rest[i+j+1:]
	}
}

// ModeFor returns the sync mode discovery uses for an instance of the
// given backend_type.
func (d *Discovery) ModeFor(backendType string) SyncMode {
	switch backendType {
	case "vllm":
		return d.VLLMSyncMode
	case "sglang":
		return d.SGLangSyncMode
	}
	return d.SyncMode
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
