package server

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
)

func tokenBody(n int) []byte {
	b := []byte(`{"token_ids":[`)
	for i := range n {
		if i > 0 {
			b = append(b, ',')
		}
		// Realistic vocabulary ids: up to six digits.
		b = strconv.AppendUint(b, uint64(i*7919%151936), 10)
	}
	return append(b, "]}"...)
}

func benchmarkParse(b *testing.B, n int) {
	body := tokenBody(n)
	r := bytes.NewReader(body)
	buf := make([]byte, readChunk)
	var ids []uint32
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		r.Reset(body)
		sc := scanner{r: r, buf: buf, limit: int64(len(body))}
		var err *requestError
		ids, err = parseQuery(&sc, ids[:0], DefaultMaxTokenIDs)
		if err != nil || len(ids) != n {
			b.Fatalf("parse: %v (%d ids)", err, len(ids))
		}
	}
}

// BenchmarkParseTokenIDs measures the streaming request parser with
// reused buffers, as the handler uses it.
func BenchmarkParseTokenIDs(b *testing.B) {
	for _, n := range []int{8192, 1 << 20} {
		b.Run(fmt.Sprintf("ids=%d", n), func(b *testing.B) { benchmarkParse(b, n) })
	}
}

// BenchmarkParseTokenIDsEncodingJSON is the baseline the parser replaces.
func BenchmarkParseTokenIDsEncodingJSON(b *testing.B) {
	body := tokenBody(8192)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		var req struct {
			TokenIDs []uint32 `json:"token_ids"`
		}
		if err := json.Unmarshal(body, &req); err != nil || len(req.TokenIDs) != 8192 {
			b.Fatal(err)
		}
	}
}

// BenchmarkAppendMatches encodes a full directory of 128 streams.
func BenchmarkAppendMatches(b *testing.B) {
	ms := make([]Match, 128)
	for i := range ms {
		ms[i] = Match{InstanceName: fmt.Sprintf("prefill-%03d", i/8), DPRank: i % 8, Synchronized: i%5 != 0,
			Sequence: uint64(i) * 100003, DeviceHitTokens: 4096, HostOnlyHitTokens: 1024, ReusablePrefixTokens: 5120,
			DeviceBlocks: 200000, HostBlocks: 150000}
		if !ms[i].Synchronized {
			ms[i].Error = "snapshot pending"
		}
	}
	var out []byte
	b.ReportAllocs()
	for b.Loop() {
		out = appendMatches(out[:0], ms)
	}
	b.SetBytes(int64(len(out)))
}

// BenchmarkQueryHandler runs the whole handler (auth, parse, encode) for
// an 8k-id query with the index disabled.
func BenchmarkQueryHandler(b *testing.B) {
	s := New(Options{InternalAPIToken: "t"})
	s.SetReady(true)
	h := s.InternalHandler()
	body := tokenBody(8192)
	r := bytes.NewReader(body)
	w := &discardWriter{h: http.Header{}}
	req := httptest.NewRequest(http.MethodPost, QueryPath, io.NopCloser(r))
	req.Header.Set("X-Internal-Token", "t")
	req.Header.Set("Content-Type", "application/json")
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		r.Reset(body)
		req.Body = io.NopCloser(r)
		w.code = 0
		h.ServeHTTP(w, req)
		if w.code != http.StatusOK {
			b.Fatalf("status %d", w.code)
		}
	}
}

// discardWriter is a ResponseWriter that keeps only the status, so that
// the benchmark measures the handler rather than a recorder.
type discardWriter struct {
	h    http.Header
	code int
}

func (d *discardWriter) Header() http.Header         { return d.h }
func (d *discardWriter) WriteHeader(code int)        { d.code = code }
func (d *discardWriter) Write(p []byte) (int, error) { return len(p), nil }

// BenchmarkInferenceHandler runs a /v1/completions of 2k and 16k prompt
// ids through the whole handler, in process: parse, an RR decision, the
// relay to a real HTTP engine on loopback that reads the body and answers
// a short JSON, and the relay of that answer.
func BenchmarkInferenceHandler(b *testing.B) {
	s := New(Options{Router: routerFor(b, answeringEngine(b))})
	s.SetReady(true)
	h := s.Handler()
	for _, n := range []int{2048, 16384} {
		b.Run(fmt.Sprintf("ids=%d", n), func(b *testing.B) {
			body := idsCompletion(n)
			serve := completionLoop(b, h, body)
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				serve()
			}
		})
	}
}
