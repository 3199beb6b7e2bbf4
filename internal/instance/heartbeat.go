package instance

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
)

// Heartbeat is one engine heartbeat (HeartbeatRequest).
type Heartbeat struct {
	Name string
	// Load is nil when the heartbeat carries no load_metrics.
	Load *Load
	// Latency is nil when the heartbeat carries no latency_metrics.
	Latency       *Latency
	IncarnationID string
}

// ErrInvalidHeartbeat: a heartbeat carries a value out of its field's
// range. The HTTP intake answers it with 400; the registry applies
// nothing of such a heartbeat.
var ErrInvalidHeartbeat = errors.New("invalid heartbeat")

// Validate reports the first field of hb whose value is out of range,
// by its proto name: gpu_cache_usage_perc must be a fraction in [0, 1]
// (not NaN or infinite), and the recent maximum latencies must not be
// negative. Parsing accepts these values, as proto-JSON can spell them;
// every intake (HTTP, RPC) refuses them through Registry.Heartbeat, so
// a forged or broken report can neither replace a good load nor keep
// an instance alive.
func (hb *Heartbeat) Validate() error {
	if l := hb.Load; l != nil {
		if err := checkUsage(l.GPUCacheUsagePerc); err != nil {
			return fmt.Errorf("heartbeat from %q: load_metrics.gpu_cache_usage_perc %w: %w", hb.Name, err, ErrInvalidHeartbeat)
		}
	}
	if l := hb.Latency; l != nil {
		if l.RecentMaxTTFT < 0 {
			return fmt.Errorf("heartbeat from %q: latency_metrics.recent_max_ttft %d is negative: %w", hb.Name, l.RecentMaxTTFT, ErrInvalidHeartbeat)
		}
		if l.RecentMaxTBT < 0 {
			return fmt.Errorf("heartbeat from %q: latency_metrics.recent_max_tbt %d is negative: %w", hb.Name, l.RecentMaxTBT, ErrInvalidHeartbeat)
		}
	}
	return nil
}

// checkUsage says why u is not a usable gpu_cache_usage_perc, a
// fraction of the Device KV cache in use.
func checkUsage(u float64) error {
	if math.IsNaN(u) || math.IsInf(u, 0) || u < 0 || u > 1 {
		return fmt.Errorf("%v is not a fraction in [0, 1]", u)
	}
	return nil
}

// ParseHeartbeat decodes the proto-JSON body of
// POST /v1/internal/heartbeat. As proto-JSON allows, every field may be
// spelt as in the proto (waiting_requests_num) or in lowerCamelCase
// (waitingRequestsNum), 64-bit integers may be numbers or strings, floats
// may be "NaN", "Infinity" or "-Infinity", and null stands for an absent
// field. Members this version does not know are ignored, so that newer
// engines keep their heartbeats accepted; the deprecated cache_event is
// accepted whatever it holds and ignored (R-CAR-11). A field given twice
// (in either spelling) or of the wrong type is an error naming it.
func ParseHeartbeat(body []byte) (Heartbeat, error) {
	var hb Heartbeat
	fields, err := objectFields(body, "")
	if err != nil {
		return hb, err
	}
	err = fields.each(func(name string, raw json.RawMessage) error {
		var err error
		switch name {
		case "name":
			hb.Name, err = protoString(raw, name)
		case "incarnation_id":
			hb.IncarnationID, err = protoString(raw, name)
		case "load_metrics":
			hb.Load, err = parseLoadMetrics(raw, name)
		case "latency_metrics":
			hb.Latency, err = parseLatencyMetrics(raw, name)
		}
		return err
	}, "name", "cache_event", "load_metrics", "latency_metrics", "incarnation_id")
	if err != nil {
		return Heartbeat{}, err
	}
	if hb.Name == "" {
		return Heartbeat{}, errors.New("heartbeat: name missing")
	}
	return hb, nil
}

func parseLoadMetrics(raw json.RawMessage, path string) (*Load, error) {
	if isNull(raw) {
		return nil, nil
	}
	fields, err := objectFields(raw, path)
	if err != nil {
		return nil, err
	}
	var l Load
	err = fields.each(func(name string, raw json.RawMessage) error {
		var err error
		switch name {
		case "waiting_requests_num":
			l.WaitingRequests, err = protoUint64(raw, path+"."+name)
		case "gpu_cache_usage_perc":
			l.GPUCacheUsagePerc, err = protoFloat(raw, path+"."+name)
		}
		return err
	}, "waiting_requests_num", "gpu_cache_usage_perc")
	if err != nil {
		return nil, err
	}
	return &l, nil
}

func parseLatencyMetrics(raw json.RawMessage, path string) (*Latency, error) {
	if isNull(raw) {
		return nil, nil
	}
	fields, err := objectFields(raw, path)
	if err != nil {
		return nil, err
	}
	var l Latency
	err = fields.each(func(name string, raw json.RawMessage) error {
		var err error
		switch name {
		case "recent_max_ttft":
			l.RecentMaxTTFT, err = protoInt64(raw, path+"."+name)
		case "recent_max_tbt":
			l.RecentMaxTBT, err = protoInt64(raw, path+"."+name)
		}
		return err
	}, "recent_max_ttft", "recent_max_tbt")
	if err != nil {
		return nil, err
	}
	return &l, nil
}

type member struct {
	name string
	raw  json.RawMessage
}

type members struct {
	path string
	list []member
}

// objectFields splits one JSON object into its members in order, and
// rejects anything after it.
func objectFields(data []byte, path string) (members, error) {
	where := "heartbeat"
	if path != "" {
		where = "heartbeat: " + path
	}
	ms := members{path: path}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil {
		return ms, fmt.Errorf("%s: %w", where, err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return ms, fmt.Errorf("%s: want a JSON object", where)
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return ms, fmt.Errorf("%s: %w", where, err)
		}
		name, _ := tok.(string)
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return ms, fmt.Errorf("%s: member %q: %w", where, name, err)
		}
		ms.list = append(ms.list, member{name: name, raw: raw})
	}
	if _, err := dec.Token(); err != nil {
		return ms, fmt.Errorf("%s: %w", where, err)
	}
	if path == "" {
		if _, err := dec.Token(); err != io.EOF {
			return ms, errors.New("heartbeat: data after the object")
		}
	}
	return ms, nil
}

// each calls fn for the members whose name, in proto or lowerCamelCase
// spelling, is one of known, with the proto name; the others are
// skipped.
func (ms members) each(fn func(name string, raw json.RawMessage) error, known ...string) error {
	seen := make(map[string]bool, len(known))
	for _, m := range ms.list {
		name := ""
		for _, k := range known {
			if m.name == k || m.name == lowerCamel(k) {
				name = k
				break
			}
		}
		if name == "" {
			continue
		}
		full := name
		if ms.path != "" {
			full = ms.path + "." + name
		}
		if seen[name] {
			return fmt.Errorf("heartbeat: %s given twice", full)
		}
		seen[name] = true
		if err := fn(name, m.raw); err != nil {
			return err
		}
	}
	return nil
}

// lowerCamel is protobuf's JSON name of a field: waiting_requests_num
// becomes waitingRequestsNum.
func lowerCamel(s string) string {
	b := make([]byte, 0, len(s))
	up := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '_' {
			up = true
			continue
		}
		if up && 'a' <= c && c <= 'z' {
			c -= 'a' - 'A'
		}
		up = false
		b = append(b, c)
	}
	return string(b)
}

func isNull(raw json.RawMessage) bool { return string(bytes.TrimSpace(raw)) == "null" }

func protoString(raw json.RawMessage, path string) (string, error) {
	if isNull(raw) {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", fmt.Errorf("heartbeat: %s: want a string, got %s", path, clip(raw))
	}
	return s, nil
}

// numberText returns the text of a JSON number, or of a JSON string
// holding one, as proto-JSON writes 64-bit integers.
func numberText(raw json.RawMessage) (string, bool) {
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, true
	}
	var n json.Number
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&n); err != nil {
		return "", false
	}
	return n.String(), true
}

func protoUint64(raw json.RawMessage, path string) (uint64, error) {
	if isNull(raw) {
		return 0, nil
	}
	if text, ok := numberText(raw); ok {
		if v, err := strconv.ParseUint(text, 10, 64); err == nil {
			return v, nil
		}
		// proto-JSON accepts an integral value in exponent or fraction form.
		if f, err := strconv.ParseFloat(text, 64); err == nil && f >= 0 && f == math.Trunc(f) && f < 1<<64 {
			return uint64(f), nil
		}
	}
	return 0, fmt.Errorf("heartbeat: %s: want a non-negative 64-bit integer, got %s", path, clip(raw))
}

func protoInt64(raw json.RawMessage, path string) (int64, error) {
	if isNull(raw) {
		return 0, nil
	}
	if text, ok := numberText(raw); ok {
		if v, err := strconv.ParseInt(text, 10, 64); err == nil {
			return v, nil
		}
		if f, err := strconv.ParseFloat(text, 64); err == nil && f == math.Trunc(f) && f >= -(1<<63) && f < 1<<63 {
			return int64(f), nil
		}
	}
	return 0, fmt.Errorf("heartbeat: %s: want a 64-bit integer, got %s", path, clip(raw))
}

func protoFloat(raw json.RawMessage, path string) (float64, error) {
	if isNull(raw) {
		return 0, nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		switch s {
		case "NaN":
			return math.NaN(), nil
		case "Infinity":
			return math.Inf(1), nil
		case "-Infinity":
			return math.Inf(-1), nil
		}
		if f, err := strconv.ParseFloat(s, 64); err == nil && !math.IsNaN(f) && !math.IsInf(f, 0) {
			return f, nil
		}
		return 0, fmt.Errorf("heartbeat: %s: want a number, got %s", path, clip(raw))
	}
	var f float64
	if err := json.Unmarshal(raw, &f); err != nil {
		return 0, fmt.Errorf("heartbeat: %s: want a number, got %s", path, clip(raw))
	}
	return f, nil
}

// clip keeps error messages short whatever a client sends.
func clip(raw json.RawMessage) string {
	const max = 40
	if len(raw) > max {
		return string(raw[:max]) + "..."
	}
	return string(raw)
}
