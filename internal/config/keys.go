package config

import (
	"math"
	"strconv"
	"strings"
	"time"
)

// scope says which object of the file a key belongs to.
type scope int

const (
	scopeTop scope = iota
	scopeDiscovery
	scopeStream
)

// valueKind is the JSON shape and Go representation of a key's value.
type valueKind int

const (
	kindInt      valueKind = iota // JSON integer -> int
	kindMillis                    // JSON integer of milliseconds -> time.Duration
	kindUint64                    // JSON integer -> uint64
	kindBool                      // JSON boolean -> bool
	kindString                    // JSON string -> string
	kindEndpoint                  // JSON string holding tcp://host:port -> string
	kindTopic                     // JSON string holding a topic template -> string
	kindBind                      // JSON string holding a bindable tcp://host:port, or empty -> string
	kindEnum                      // JSON string, one of keySpec.values -> string or SyncMode
	kindObject                    // JSON object (discovery)
	kindArray                     // JSON array of objects (streams)
)

func (k valueKind) jsonType() string {
	switch k {
	case kindInt, kindMillis, kindUint64:
		return "an integer"
	case kindBool:
		return "a boolean"
	case kindString, kindEndpoint, kindEnum, kindTopic, kindBind:
		return "a string"
	case kindObject:
		return "an object"
	default:
		return "an array"
	}
}

// target holds the values one key may write into; only the member of the
// key's scope is set.
type target struct {
	cfg    *Config
	disc   *Discovery
	stream *Stream
}

// keySpec describes one configuration key. For integer kinds, min and max
// bound the value as written in the file (milliseconds for kindMillis).
type keySpec struct {
	scope    scope
	name     string
	kind     valueKind
	required bool
	// zeroOff accepts 0, outside [min, max], as "disabled".
	zeroOff bool
	min     int64
	max     int64
	defInt  int64
	defStr  string
	// values lists the accepted strings of a kindEnum key.
	values []string
	// defDoc overrides the generated default text where the default
	// depends on another key.
	defDoc string
	// rangeDoc overrides the generated range text where a cross-key rule
	// applies.
	rangeDoc string
	desc     string
	// field returns the destination of the key inside t, one of *int,
	// *time.Duration, *uint64, *bool or *string; nil for containers.
	field func(t target) any
}

// maxBufferedLimit is 4 GiB, or less where int cannot hold it.
const maxBufferedLimit = min(int64(4)<<30, int64(math.MaxInt))

// keyTable is the single declaration of every configuration key.
//
// Ranges the design note leaves open are chosen for production use:
//   - max_blocks_per_stream up to 2^24: at roughly 100 B of metadata per
//     block that is about 1.6 GiB per stream, far above any real engine.
//   - max_message_bytes 1 KiB..256 MiB: below 1 KiB even a small batch does
//     not fit; above 256 MiB one message would dwarf the rest of the
//     process.
//   - max_buffered_bytes at least max_message_bytes (one message must fit
//     while a snapshot is pending) and at most 4 GiB.
//   - replay_timeout_ms 100..600000: shorter cannot carry a real snapshot,
//     longer leaves a stream unsynchronised for more than ten minutes.
//   - resync_interval_ms 0 (disabled) or 1 s..24 h: faster calibration
//     would keep engines busy sending snapshots.
//   - block_size 1..4096 tokens, port offsets 1..65535, dp_rank 0..1023.
var keyTable = []keySpec{
	{scope: scopeTop, name: "max_streams", kind: kindInt, min: 1, max: 128, defInt: 128,
		desc:  "Maximum number of subscribed streams; one instance DP rank is one stream. Instances beyond it are skipped whole, in name order.",
		field: func(t target) any { return &t.cfg.MaxStreams }},
	{scope: scopeTop, name: "max_blocks_per_stream", kind: kindInt, min: 1, max: 1 << 24, defInt: 262144,
		desc:  "Block metadata limit of one stream, including mappings kept for parent chains and tokenless events; bounds directory memory.",
		field: func(t target) any { return &t.cfg.MaxBlocksPerStream }},
	{scope: scopeTop, name: "max_message_bytes", kind: kindInt, min: 1024, max: 256 << 20, defInt: 8 << 20,
		desc:  "Size limit of one live message or one snapshot reply, in bytes.",
		field: func(t target) any { return &t.cfg.MaxMessageBytes }},
	{scope: scopeTop, name: "max_buffered_bytes", kind: kindInt, min: 1024, max: maxBufferedLimit, defInt: 16 << 20,
		rangeDoc: "[max_message_bytes, " + strconv.FormatInt(maxBufferedLimit, 10) + "]",
		desc:     "Budget for live deltas held while a snapshot is fetched, counting wire bytes and decoded-record overhead.",
		field:    func(t target) any { return &t.cfg.MaxBufferedBytes }},
	{scope: scopeTop, name: "replay_timeout_ms", kind: kindMillis, min: 100, max: 600000, defInt: 2000,
		desc:  "Time allowed for one complete snapshot reply; on timeout the stream stays unsynchronised and retries.",
		field: func(t target) any { return &t.cfg.ReplayTimeout }},
	{scope: scopeTop, name: "resync_interval_ms", kind: kindMillis, zeroOff: true, min: 1000, max: 86400000, defInt: 30000,
		desc:  "Longest interval between periodic snapshot calibrations that detect silently lost tail events (each stream's next one falls at random in the interval's last quarter); 0 disables them.",
		field: func(t target) any { return &t.cfg.ResyncInterval }},

	{scope: scopeTop, name: "discovery", kind: kindObject,
		desc: "Rules that derive stream endpoints from registered instances. Mutually exclusive with a non-empty streams list when enabled."},
	{scope: scopeDiscovery, name: "enabled", kind: kindBool,
		desc:  "Subscribe to every eligible registered instance.",
		field: func(t target) any { return &t.disc.Enabled }},
	{scope: scopeDiscovery, name: "sync_mode", kind: kindEnum, values: syncModes, defStr: string(SyncSnapshot),
		desc: "How streams of instances with backend_type xllm (or none, or one without a key below) learn the engine's state: " +
			"snapshot (the replay endpoint sends the full current state), history (it sends the batches the engine still buffers; " +
			"views may be partial) or live (no replay endpoint; a view starts empty at the first message).",
		field: func(t target) any { return &t.disc.SyncMode }},
	{scope: scopeDiscovery, name: "vllm_sync_mode", kind: kindEnum, values: syncModes, defStr: string(SyncLive),
		desc: "Sync mode of instances with backend_type vllm (vLLM behind xllm-service's vllm_sidecar): live for vLLM's default " +
			"--kv-events-config, history when it sets replay_endpoint at the replay port kvcar derives.",
		field: func(t target) any { return &t.disc.VLLMSyncMode }},
	{scope: scopeDiscovery, name: "sglang_sync_mode", kind: kindEnum, values: syncModes, defStr: string(SyncLive),
		desc:  "Sync mode of instances with backend_type sglang, as for vllm_sync_mode.",
		field: func(t target) any { return &t.disc.SGLangSyncMode }},
	{scope: scopeDiscovery, name: "block_size", kind: kindInt, min: 1, max: 4096, defInt: 128,
		desc:  "Tokens per block; must match the block_size of the engines' BlockStored events.",
		field: func(t target) any { return &t.disc.BlockSize }},
	{scope: scopeDiscovery, name: "topic", kind: kindTopic, defStr: "xllm-kv",
		desc: "Topic template of instances with backend_type xllm (or none, or one without a key below): {name}, {host}, {port} and " +
			"{dp_rank} are replaced by the instance name, its host and port and the stream's DP rank; the result is matched exactly, " +
			"and an empty template accepts every topic.",
		field: func(t target) any { return &t.disc.Topic }},
	{scope: scopeDiscovery, name: "vllm_topic", kind: kindTopic, defStr: "",
		desc:  "Topic template of instances with backend_type vllm (vLLM's default topic is empty).",
		field: func(t target) any { return &t.disc.VLLMTopic }},
	{scope: scopeDiscovery, name: "sglang_topic", kind: kindTopic, defStr: "",
		desc:  "Topic template of instances with backend_type sglang.",
		field: func(t target) any { return &t.disc.SGLangTopic }},
	{scope: scopeDiscovery, name: "event_port_offset", kind: kindInt, min: 1, max: 65535, defInt: 10000,
		desc:  "Event port = registered HTTP port + event_port_offset + dp_rank. Must differ from replay_port_offset.",
		field: func(t target) any { return &t.disc.EventPortOffset }},
	{scope: scopeDiscovery, name: "replay_port_offset", kind: kindInt, min: 1, max: 65535, defInt: 30000,
		desc:  "Replay port = registered HTTP port + replay_port_offset + dp_rank. Must differ from event_port_offset.",
		field: func(t target) any { return &t.disc.ReplayPortOffset }},
	{scope: scopeDiscovery, name: "subscribe_bind", kind: kindBind, defStr: "",
		desc: "Bound-subscriber mode: kvcar binds one subscriber at this address (and the subscribe_bind_ports-1 ports after it, " +
			"for DP rank r dialing port+r as vLLM does) and every engine's publisher dials it; streams are told apart by topic, " +
			"so every topic template must name the instance ({name}, or {host} and {port}). Empty: kvcar connects to each " +
			"engine's event port.",
		field: func(t target) any { return &t.disc.SubscribeBind }},
	{scope: scopeDiscovery, name: "subscribe_bind_ports", kind: kindInt, min: 1, max: 1024, defInt: 1,
		desc:  "Consecutive ports bound from subscribe_bind's port on; at least the largest DP size of the engines.",
		field: func(t target) any { return &t.disc.SubscribeBindPorts }},
	{scope: scopeDiscovery, name: "refresh_interval_ms", kind: kindMillis, min: 50, max: 60000, defInt: 1000,
		desc:  "Interval between reconciliations with the local instance registry snapshot.",
		field: func(t target) any { return &t.disc.RefreshInterval }},
	{scope: scopeDiscovery, name: "hash_seed", kind: kindUint64, min: 0, defInt: 1024,
		desc:  "Seed of the directory's internal content keys for discovered streams; need not match engine hashes.",
		field: func(t target) any { return &t.disc.HashSeed }},

	{scope: scopeTop, name: "streams", kind: kindArray,
		desc: "Static list of event streams, one element per instance DP rank; used by protocol tests. At most max_streams elements."},
	{scope: scopeStream, name: "instance_name", kind: kindString, required: true,
		desc:  "Instance identity; should match the instance registry. (instance_name, dp_rank) must be unique.",
		field: func(t target) any { return &t.stream.InstanceName }},
	{scope: scopeStream, name: "dp_rank", kind: kindInt, min: 0, max: 1023, defInt: 0,
		desc:  "DP rank of this stream; must match the dp_rank of its batches.",
		field: func(t target) any { return &t.stream.DPRank }},
	{scope: scopeStream, name: "block_size", kind: kindInt, min: 1, max: 4096, defInt: 128,
		desc:  "Tokens per block; must match the stream's BlockStored events.",
		field: func(t target) any { return &t.stream.BlockSize }},
	{scope: scopeStream, name: "endpoint", kind: kindEndpoint, required: true,
		rangeDoc: "tcp://host:port, host connectable (bindable when bind is true), port [1, 65535]",
		desc: "Live event address tcp://host:port that kvcar connects to; wildcard hosts (*, 0.0.0.0, ::) are rejected. " +
			"Unique across all endpoints, except that streams with bind true share theirs.",
		field: func(t target) any { return &t.stream.Endpoint }},
	{scope: scopeStream, name: "bind", kind: kindBool,
		desc:  "kvcar binds endpoint and the engine dials it (wildcard hosts allowed); streams binding one endpoint share it and need distinct non-empty topics or DP ranks.",
		field: func(t target) any { return &t.stream.Bind }},
	{scope: scopeStream, name: "sync_mode", kind: kindEnum, values: syncModes, defStr: string(SyncSnapshot),
		desc:  "What the replay endpoint answers: snapshot (full state), history (buffered batches) or live (there is none).",
		field: func(t target) any { return &t.stream.SyncMode }},
	{scope: scopeStream, name: "replay_endpoint", kind: kindEndpoint, defStr: "", defDoc: "(required unless live)",
		rangeDoc: "tcp://host:port, host connectable, port [1, 65535]; required unless sync_mode is live, absent when it is",
		desc:     "Connectable replay address tcp://host:port. Unique across all endpoints.",
		field:    func(t target) any { return &t.stream.ReplayEndpoint }},
	{scope: scopeStream, name: "topic", kind: kindString, defStr: "",
		desc:  "Topic the engine publishes; matched exactly. Empty accepts every topic.",
		field: func(t target) any { return &t.stream.Topic }},
	{scope: scopeStream, name: "hash_seed", kind: kindUint64, min: 0, defInt: 1024,
		desc:  "Seed of the directory's internal content keys; need not match engine hashes.",
		field: func(t target) any { return &t.stream.HashSeed }},
}

// setDefault writes the key's default into t.
func (k *keySpec) setDefault(t target) {
	if k.field == nil {
		return
	}
	switch p := k.field(t).(type) {
	case *int:
		*p = int(k.defInt)
	case *time.Duration:
		*p = time.Duration(k.defInt) * time.Millisecond
	case *uint64:
		*p = uint64(k.defInt)
	case *bool:
		*p = false
	case *string:
		*p = k.defStr
	case *SyncMode:
		*p = SyncMode(k.defStr)
	}
}

// path renders the key's full path; index is used for stream keys.
func (k *keySpec) path(index int) string {
	switch k.scope {
	case scopeDiscovery:
		return "discovery." + k.name
	case scopeStream:
		if index < 0 {
			return "streams[]." + k.name
		}
		return "streams[" + strconv.Itoa(index) + "]." + k.name
	default:
		return k.name
	}
}

func (k *keySpec) rangeText() string {
	if k.rangeDoc != "" {
		return k.rangeDoc
	}
	switch k.kind {
	case kindInt, kindMillis:
		r := "[" + strconv.FormatInt(k.min, 10) + ", " + strconv.FormatInt(k.max, 10) + "]"
		if k.zeroOff {
			return "0 or " + r
		}
		return r
	case kindUint64:
		return "[0, " + strconv.FormatUint(math.MaxUint64, 10) + "]"
	case kindBool:
		return "true or false"
	case kindEndpoint:
		return "tcp://host:port, host connectable, port [1, 65535]"
	case kindEnum:
		return strings.Join(k.values, ", ")
	case kindTopic:
		return "any string; placeholders {name}, {host}, {port}, {dp_rank}"
	case kindBind:
		return "empty, or tcp://host:port with host bindable (*, 0.0.0.0, an address or a name)"
	case kindString:
		if k.required {
			return "non-empty string"
		}
		return "any string"
	case kindObject:
		return "object"
	default:
		return "array of objects"
	}
}

func (k *keySpec) defaultText() string {
	switch {
	case k.defDoc != "":
		return k.defDoc
	case k.required:
		return "(required)"
	case k.kind == kindObject:
		return "{}"
	case k.kind == kindArray:
		return "[]"
	case k.kind == kindBool:
		return "false"
	case k.kind == kindString, k.kind == kindEnum, k.kind == kindEndpoint, k.kind == kindTopic, k.kind == kindBind:
		return strconv.Quote(k.defStr)
	default:
		return strconv.FormatInt(k.defInt, 10)
	}
}

// KeyDoc is one row of the configuration reference.
type KeyDoc struct {
	// Key is the full key path; elements of streams are written streams[].
	Key         string
	Default     string
	Range       string
	Description string
}

// Reference returns the configuration reference in file order, generated
// from the same table the parser uses.
func Reference() []KeyDoc {
	docs := make([]KeyDoc, 0, len(keyTable))
	for i := range keyTable {
		k := &keyTable[i]
		docs = append(docs, KeyDoc{
			Key:         k.path(-1),
			Default:     k.defaultText(),
			Range:       k.rangeText(),
			Description: k.desc,
		})
	}
	return docs
}

func lookupKey(s scope, name string) *keySpec {
	for i := range keyTable {
		if keyTable[i].scope == s && keyTable[i].name == name {
			return &keyTable[i]
		}
	}
	return nil
}
