package config

import (
	"encoding/json"
	"strconv"
	"time"
)

// MarshalJSON writes c in the file format with every key present, so
// that the effective configuration can be logged or saved and parsed back
// to the same value.
func (c *Config) MarshalJSON() ([]byte, error) {
	b := []byte{'{'}
	b = appendScope(b, scopeTop, target{cfg: c})
	b = append(b, `,"discovery":{`...)
	b = appendScope(b, scopeDiscovery, target{disc: &c.Discovery})
	b = append(b, `},"streams":[`...)
	for i := range c.Streams {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '{')
		b = appendScope(b, scopeStream, target{stream: &c.Streams[i]})
		b = append(b, '}')
	}
	return append(b, "]}"...), nil
}

func appendScope(b []byte, s scope, t target) []byte {
	first := true
	for i := range keyTable {
		k := &keyTable[i]
		if k.scope != s || k.field == nil {
			continue
		}
		if !first {
			b = append(b, ',')
		}
		first = false
		b = strconv.AppendQuote(b, k.name)
		b = append(b, ':')
		switch p := k.field(t).(type) {
		case *int:
			b = strconv.AppendInt(b, int64(*p), 10)
		case *time.Duration:
			b = strconv.AppendInt(b, p.Milliseconds(), 10)
		case *uint64:
			b = strconv.AppendUint(b, *p, 10)
		case *bool:
			b = strconv.AppendBool(b, *p)
		case *string:
			// encoding/json escapes strings exactly as JSON requires;
			// strconv.Quote would emit Go-only escapes such as \x00.
			q, _ := json.Marshal(*p)
			b = append(b, q...)
		case *SyncMode:
			b = strconv.AppendQuote(b, string(*p))
		}
	}
	return b
}
