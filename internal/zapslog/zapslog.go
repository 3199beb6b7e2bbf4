package zapslog

import (
	"context"
	"log/slog"
	"slices"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// New returns a zap logger whose entries at min and above go to log,
// with prefix before each message. Entries for which drop (may be nil)
// reports true are discarded.
func New(log *slog.Logger, min zapcore.Level, prefix string, drop func(msg string, fields map[string]any) bool) *zap.Logger {
	return zap.New(&slogCore{log: log, min: min, prefix: prefix, drop: drop})
}

type slogCore struct {
	log    *slog.Logger
	min    zapcore.Level
	prefix string
	drop   func(string, map[string]any) bool
	fields map[string]any // of With, for drop
	attrs  []slog.Attr
}

func (c *slogCore) Enabled(l zapcore.Level) bool {
	return l >= c.min && c.log.Enabled(context.Background(), slogLevel(l))
}

func (c *slogCore) With(fields []zapcore.Field) zapcore.Core {
	m := encode(fields)
	for k, v := range c.fields {
		if _, ok := m[k]; !ok {
			m[k] = v
		}
	}
	return &slogCore{log: c.log, min: c.min, prefix: c.prefix, drop: c.drop, fields: m, attrs: append(slices.Clip(c.attrs), attrsOf(encode(fields))...)}
}

func (c *slogCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c *slogCore) Write(e zapcore.Entry, fields []zapcore.Field) error {
	m := encode(fields)
	if c.drop != nil {
		all := m
		if len(c.fields) > 0 {
			all = make(map[string]any, len(m)+len(c.fields))
			for k, v := range c.fields {
				all[k] = v
			}
			for k, v := range m {
				all[k] = v
			}
		}
		if c.drop(e.Message, all) {
			return nil
		}
	}
	attrs := append(slices.Clip(c.attrs), attrsOf(m)...)
	if e.LoggerName != "" {
		attrs = append(attrs, slog.String("logger", e.LoggerName))
	}
	c.log.LogAttrs(context.Background(), slogLevel(e.Level), c.prefix+e.Message, attrs...)
	return nil
}

func (c *slogCore) Sync() error { return nil }

func slogLevel(l zapcore.Level) slog.Level {
	switch {
	case l <= zapcore.DebugLevel:
		return slog.LevelDebug
	case l == zapcore.InfoLevel:
		return slog.LevelInfo
	case l == zapcore.WarnLevel:
		return slog.LevelWarn
	default:
		return slog.LevelError
	}
}

// encode renders zap fields through zap's own encoder so that every
// field type (errors, durations, objects) keeps its meaning.
func encode(fields []zapcore.Field) map[string]any {
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range fields {
		f.AddTo(enc)
	}
	return enc.Fields
}

// attrsOf turns encoded fields into attributes in key order.
func attrsOf(m map[string]any) []slog.Attr {
	if len(m) == 0 {
		return nil
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	attrs := make([]slog.Attr, 0, len(keys))
	for _, k := range keys {
		attrs = append(attrs, slog.Any(k, m[k]))
	}
	return attrs
}
