package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Error reports one invalid part of a configuration.
type Error struct {
	// Key is the full key path, for example streams[2].dp_rank; empty when
	// the error concerns the file as a whole.
	Key string
	// Value is the offending value as written in the file, if any.
	Value string
	// Reason says what is wrong and what is allowed.
	Reason string
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("config: ")
	if e.Key != "" {
		b.WriteString(e.Key)
		if e.Value != "" {
			b.WriteString(" = ")
			b.WriteString(e.Value)
		}
		b.WriteString(": ")
	}
	b.WriteString(e.Reason)
	return b.String()
}

// maxShownValue keeps error messages readable when a value is huge.
const maxShownValue = 64

func shown(raw []byte) string {
	if len(raw) > maxShownValue {
		return string(raw[:maxShownValue]) + "..."
	}
	return string(raw)
}

// Parse parses and validates a configuration file's contents and applies
// the defaults of every absent key.
func Parse(data []byte) (*Config, error) {
	if len(data) > MaxFileBytes {
		return nil, &Error{Reason: fmt.Sprintf("file exceeds %d bytes", MaxFileBytes)}
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, &Error{Reason: "file is empty; write {} for an idle directory"}
	}
	c := Default()
	members, err := readObject(data, "", true)
	if err != nil {
		return nil, err
	}
	t := target{cfg: &c, disc: &c.Discovery}
	for _, m := range members {
		k := lookupKey(scopeTop, m.name)
		if k == nil {
			return nil, unknownKey(m.name)
		}
		switch k.kind {
		case kindObject:
			if err := parseDiscovery(m.raw, t); err != nil {
				return nil, err
			}
		case kindArray:
			streams, err := parseStreams(m.raw)
			if err != nil {
				return nil, err
			}
			c.Streams = streams
		default:
			if err := k.decode(m.raw, t, -1); err != nil {
				return nil, err
			}
		}
	}
	if err := validate(&c); err != nil {
		return nil, err
	}
	return &c, nil
}

func unknownKey(path string) error {
	return &Error{Key: path, Reason: "unknown key (misspelt keys are rejected, see the configuration reference)"}
}

type member struct {
	name string
	raw  json.RawMessage
}

// readObject splits one JSON object into its members, in file order,
// rejecting duplicate names. where is the object's key path.
func readObject(data []byte, where string, top bool) ([]member, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	syntax := func(err error) error {
		if where == "" {
			return &Error{Reason: "invalid JSON: " + err.Error()}
		}
		return &Error{Key: where, Reason: "invalid JSON: " + err.Error()}
	}
	tok, err := dec.Token()
	if err != nil {
		return nil, syntax(err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		if where == "" {
			return nil, &Error{Reason: "top level must be a JSON object, got " + jsonTypeOf(data)}
		}
		return nil, &Error{Key: where, Reason: "must be an object, got " + jsonTypeOf(data)}
	}
	var members []member
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, syntax(err)
		}
		name, ok := tok.(string)
		if !ok {
			return nil, syntax(errors.New("object key is not a string"))
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, syntax(err)
		}
		for _, m := range members {
			if m.name == name {
				return nil, &Error{Key: join(where, name), Reason: "key given more than once"}
			}
		}
		members = append(members, member{name: name, raw: raw})
	}
	if _, err := dec.Token(); err != nil {
		return nil, syntax(err)
	}
	if top {
		if _, err := dec.Token(); err != io.EOF {
			return nil, &Error{Reason: "trailing data after the top-level object"}
		}
	}
	return members, nil
}

func join(where, name string) string {
	if where == "" {
		return name
	}
	return where + "." + name
}

// jsonTypeOf names the JSON type of a syntactically valid value.
func jsonTypeOf(raw []byte) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return "nothing"
	}
	switch raw[0] {
	case '{':
		return "an object"
	case '[':
		return "an array"
	case '"':
		return "a string"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	default:
		return "a number"
	}
}

func parseDiscovery(raw json.RawMessage, t target) error {
	members, err := readObject(raw, "discovery", false)
	if err != nil {
		return err
	}
	for _, m := range members {
		k := lookupKey(scopeDiscovery, m.name)
		if k == nil {
			return unknownKey("discovery." + m.name)
		}
		if err := k.decode(m.raw, t, -1); err != nil {
			return err
		}
	}
	return nil
}

func parseStreams(raw json.RawMessage) ([]Stream, error) {
	if jsonTypeOf(raw) != "an array" {
		return nil, &Error{Key: "streams", Reason: "must be an array, got " + jsonTypeOf(raw)}
	}
	var elems []json.RawMessage
	if err := json.Unmarshal(raw, &elems); err != nil {
		return nil, &Error{Key: "streams", Reason: "invalid JSON: " + err.Error()}
	}
	if len(elems) == 0 {
		return nil, nil
	}
	streams := make([]Stream, len(elems))
	for i, elem := range elems {
		if err := parseStream(elem, i, &streams[i]); err != nil {
			return nil, err
		}
	}
	return streams, nil
}

func parseStream(raw json.RawMessage, index int, s *Stream) error {
	where := "streams[" + strconv.Itoa(index) + "]"
	members, err := readObject(raw, where, false)
	if err != nil {
		return err
	}
	t := target{stream: s}
	for i := range keyTable {
		if keyTable[i].scope == scopeStream {
			keyTable[i].setDefault(t)
		}
	}
	seen := make(map[string]bool, len(members))
	for _, m := range members {
		k := lookupKey(scopeStream, m.name)
		if k == nil {
			return unknownKey(where + "." + m.name)
		}
		if err := k.decode(m.raw, t, index); err != nil {
			return err
		}
		seen[m.name] = true
	}
	for i := range keyTable {
		k := &keyTable[i]
		if k.scope == scopeStream && k.required && !seen[k.name] {
			return &Error{Key: k.path(index), Reason: "is required"}
		}
	}
	return nil
}

// decode checks one scalar value against its key and stores it in t.
func (k *keySpec) decode(raw json.RawMessage, t target, index int) error {
	path := k.path(index)
	typeErr := func() error {
		return &Error{Key: path, Value: shown(raw), Reason: "must be " + k.kind.jsonType() + ", got " + jsonTypeOf(raw)}
	}
	got := jsonTypeOf(raw)
	switch k.kind {
	case kindInt, kindMillis:
		if got != "a number" {
			return typeErr()
		}
		if !isIntegerLiteral(raw) {
			return &Error{Key: path, Value: shown(raw), Reason: "must be an integer in " + k.rangeText()}
		}
		v, err := strconv.ParseInt(string(raw), 10, 64)
		if err != nil || !k.inRange(v) {
			return &Error{Key: path, Value: shown(raw), Reason: "must be in " + k.rangeText()}
		}
		switch p := k.field(t).(type) {
		case *int:
			*p = int(v)
		case *time.Duration:
			*p = time.Duration(v) * time.Millisecond
		}
	case kindUint64:
		if got != "a number" {
			return typeErr()
		}
		if !isIntegerLiteral(raw) {
			return &Error{Key: path, Value: shown(raw), Reason: "must be an integer in " + k.rangeText()}
		}
		v, err := strconv.ParseUint(string(raw), 10, 64)
		if err != nil {
			return &Error{Key: path, Value: shown(raw), Reason: "must be in " + k.rangeText()}
		}
		*k.field(t).(*uint64) = v
	case kindBool:
		if got != "a boolean" {
			return typeErr()
		}
		*k.field(t).(*bool) = string(raw) == "true"
	case kindString, kindEndpoint, kindEnum, kindTopic, kindBind:
		if got != "a string" {
			return typeErr()
		}
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return &Error{Key: path, Reason: "invalid JSON string: " + err.Error()}
		}
		if k.required && strings.TrimSpace(s) == "" {
			return &Error{Key: path, Value: shown(raw), Reason: "must be a non-empty string"}
		}
		// An optional endpoint written as "" is absent; validate decides
		// whether it may be. A stream's endpoint is checked in validate,
		// where bind is known.
		if k.kind == kindEndpoint && (k.required || s != "") && !(k.scope == scopeStream && k.name == "endpoint") {
			if _, reason := canonicalEndpoint(s); reason != "" {
				return &Error{Key: path, Value: shown(raw), Reason: reason}
			}
		}
		if k.kind == kindBind && s != "" {
			if reason := bindEndpointError(s); reason != "" {
				return &Error{Key: path, Value: shown(raw), Reason: reason}
			}
		}
		if k.kind == kindTopic {
			if reason := topicTemplateError(s); reason != "" {
				return &Error{Key: path, Value: shown(raw), Reason: "topic template " + reason}
			}
		}
		if k.kind == kindEnum && !slices.Contains(k.values, s) {
			return &Error{Key: path, Value: shown(raw), Reason: "must be one of " + strings.Join(k.values, ", ")}
		}
		switch p := k.field(t).(type) {
		case *string:
			*p = s
		case *SyncMode:
			*p = SyncMode(s)
		}
	}
	return nil
}

// isIntegerLiteral reports whether a JSON number is written without a
// fraction or exponent; 1.0 and 1e3 are rejected so that a value is never
// silently truncated or rounded.
func isIntegerLiteral(raw []byte) bool {
	return bytes.IndexAny(raw, ".eE") < 0
}

func (k *keySpec) inRange(v int64) bool {
	if k.zeroOff && v == 0 {
		return true
	}
	return v >= k.min && v <= k.max
}

// validate applies the rules that span more than one key.
func validate(c *Config) error {
	if c.MaxBufferedBytes < c.MaxMessageBytes {
		return &Error{Key: "max_buffered_bytes", Value: strconv.Itoa(c.MaxBufferedBytes),
			Reason: fmt.Sprintf("must be at least max_message_bytes (%d) so that one message fits while a snapshot is pending", c.MaxMessageBytes)}
	}
	if c.Discovery.EventPortOffset == c.Discovery.ReplayPortOffset {
		return &Error{Key: "discovery.replay_port_offset", Value: strconv.Itoa(c.Discovery.ReplayPortOffset),
			Reason: "must differ from discovery.event_port_offset, or every event port would equal a replay port"}
	}
	if d := &c.Discovery; d.SubscribeBind != "" {
		for _, tk := range []struct{ key, template string }{
			{"discovery.topic", d.Topic}, {"discovery.vllm_topic", d.VLLMTopic}, {"discovery.sglang_topic", d.SGLangTopic},
		} {
			t := tk.template
			if !strings.Contains(t, "{name}") && !(strings.Contains(t, "{host}") && strings.Contains(t, "{port}")) {
				return &Error{Key: tk.key, Value: strconv.Quote(t),
					Reason: "must contain {name}, or {host} and {port}, when discovery.subscribe_bind is set: engines dialing one subscriber are told apart by topic"}
			}
		}
		if ports := BindPorts(d.SubscribeBind, d.SubscribeBindPorts); len(ports) > 0 {
			if p := lastPort(ports[len(ports)-1]); p > 65535 {
				return &Error{Key: "discovery.subscribe_bind_ports", Value: strconv.Itoa(d.SubscribeBindPorts),
					Reason: fmt.Sprintf("ports from discovery.subscribe_bind on reach %d, above 65535", p)}
			}
		}
	}
	if c.Discovery.Enabled && len(c.Streams) > 0 {
		return &Error{Key: "streams", Reason: "must be empty when discovery.enabled is true; the two sources would manage the same subscriptions (R-CFG-5)"}
	}
	if len(c.Streams) > c.MaxStreams {
		return &Error{Key: "streams", Value: fmt.Sprintf("%d elements", len(c.Streams)),
			Reason: fmt.Sprintf("must have at most max_streams (%d) elements", c.MaxStreams)}
	}
	for i := range c.Streams {
		s := &c.Streams[i]
		switch {
		case s.SyncMode == SyncLive && s.ReplayEndpoint != "":
			return &Error{Key: fmt.Sprintf("streams[%d].replay_endpoint", i), Value: strconv.Quote(s.ReplayEndpoint),
				Reason: "must be absent when sync_mode is live: a live stream has no replay endpoint"}
		case s.SyncMode != SyncLive && s.ReplayEndpoint == "":
			return &Error{Key: fmt.Sprintf("streams[%d].replay_endpoint", i),
				Reason: fmt.Sprintf("is required when sync_mode is %s", s.SyncMode)}
		}
	}
	if err := validateStreamEndpoints(c.Streams); err != nil {
		return err
	}
	type streamID struct {
		name string
		rank int
	}
	ids := make(map[streamID]int, len(c.Streams))
	endpoints := make(map[string]string, 2*len(c.Streams))
	for i := range c.Streams {
		s := &c.Streams[i]
		id := streamID{s.InstanceName, s.DPRank}
		if j, dup := ids[id]; dup {
			return &Error{Key: fmt.Sprintf("streams[%d]", i),
				Reason: fmt.Sprintf("instance_name %q with dp_rank %d duplicates streams[%d]", s.InstanceName, s.DPRank, j)}
		}
		ids[id] = i
		for _, ep := range []struct{ key, value string }{
			{fmt.Sprintf("streams[%d].endpoint", i), s.Endpoint},
			{fmt.Sprintf("streams[%d].replay_endpoint", i), s.ReplayEndpoint},
		} {
			if ep.value == "" {
				continue
			}
			if s.Bind && ep.value == s.Endpoint {
				// Bound streams share their endpoint; checked below.
				continue
			}
			canon, _ := canonicalEndpoint(ep.value)
			if other, dup := endpoints[canon]; dup {
				return &Error{Key: ep.key, Value: strconv.Quote(ep.value), Reason: "duplicates " + other}
			}
			endpoints[canon] = ep.key
		}
	}
	return nil
}

// validateStreamEndpoints checks each stream's endpoint for its role:
// connectable, or bindable with bind. Streams binding one endpoint share
// it and must be told apart by topic and DP rank; a bound endpoint is
// nobody's connect endpoint.
func validateStreamEndpoints(streams []Stream) error {
	type shared struct {
		topic string
		rank  int
	}
	bound := map[string]map[shared]int{}
	for i := range streams {
		s := &streams[i]
		key := fmt.Sprintf("streams[%d].endpoint", i)
		if !s.Bind {
			if _, reason := canonicalEndpoint(s.Endpoint); reason != "" {
				return &Error{Key: key, Value: strconv.Quote(s.Endpoint), Reason: reason}
			}
			continue
		}
		if reason := bindEndpointError(s.Endpoint); reason != "" {
			return &Error{Key: key, Value: strconv.Quote(s.Endpoint), Reason: reason}
		}
		if s.Topic == "" {
			return &Error{Key: fmt.Sprintf("streams[%d].topic", i),
				Reason: "must not be empty when bind is true: streams sharing a bound endpoint are told apart by topic"}
		}
		m := bound[s.Endpoint]
		if m == nil {
			m = map[shared]int{}
			bound[s.Endpoint] = m
		}
		if j, dup := m[shared{s.Topic, s.DPRank}]; dup {
			return &Error{Key: fmt.Sprintf("streams[%d].topic", i), Value: strconv.Quote(s.Topic),
				Reason: fmt.Sprintf("with dp_rank %d duplicates streams[%d] on the bound endpoint %s", s.DPRank, j, s.Endpoint)}
		}
		m[shared{s.Topic, s.DPRank}] = i
	}
	for i := range streams {
		if s := &streams[i]; !s.Bind && bound[s.Endpoint] != nil {
			return &Error{Key: fmt.Sprintf("streams[%d].endpoint", i), Value: strconv.Quote(s.Endpoint),
				Reason: "is bound by another stream"}
		}
	}
	return nil
}

// lastPort returns the port of a tcp://host:port address, 0 if none.
func lastPort(endpoint string) int {
	i := strings.LastIndexByte(endpoint, ':')
	if i < 0 {
		return 0
	}
	p, _ := strconv.Atoi(endpoint[i+1:])
	return p
}
