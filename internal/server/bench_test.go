package server

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/kvcar/kvcar/internal/closedloop"
	"github.com/kvcar/kvcar/internal/kvindex/prefillgen"
)

func tokenBody(n int) []byte { return tokenBodySep(n, ",") }

// tokenBodySep separates the ids with sep: "," as Go's and httpx's
// encoders write, ", " as Python's json.dumps does by default.
func tokenBodySep(n int, sep string) []byte {
	ids := make([]uint32, n)
	for i := range ids {
		// Realistic vocabulary ids: up to six digits.
		ids[i] = uint32(i * 7919 % 151936)
	}
	return tokenBodyOf(ids, sep)
}

// tokenBodyOf is a query body of ids, separated by sep.
func tokenBodyOf(ids []uint32, sep string) []byte {
	b := []byte(`{"token_ids":[`)
	for i, id := range ids {
		if i > 0 {
			b = append(b, sep...)
		}
		b = strconv.AppendUint(b, uint64(id), 10)
	}
	return append(b, "]}"...)
}

func benchmarkParse(b *testing.B, n int, sep string) {
	benchmarkParseBodies(b, n, [][]byte{tokenBodySep(n, sep)})
}

// benchmarkParseBodies parses bodies of n ids each, in turn.
func benchmarkParseBodies(b *testing.B, n int, bodies [][]byte) {
	r := bytes.NewReader(nil)
	buf := make([]byte, readChunk)
	var ids []uint32
	b.SetBytes(int64(len(bodies[0])))
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		body := bodies[i%len(bodies)]
		i++
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
		b.Run(fmt.Sprintf("ids=%d", n), func(b *testing.B) { benchmarkParse(b, n, ",") })
	}
	b.Run("ids=8192/spaced", func(b *testing.B) { benchmarkParse(b, 8192, ", ") })
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

// sentStatus makes the handler's metrics read the status from the writer,
// as they do from kvcar's own server's.
func (d *discardWriter) sentStatus() int { return d.code }

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

// BenchmarkDispatchOverhead measures what a request costs to pass
// through kvcar to an engine and back, by the two ways kvcar reaches
// engines: baidu_std to an xLLM engine (Completions, then the output
// through one Generations call to kvcar's rpc port) and the HTTP relay to
// a vLLM engine. The whole path is real: an HTTP client on loopback,
// kvcar's public handler with an RR router (the instance's backend_type
// picks the path), and engines that do the least their protocol allows
// (frugalXLLMEngine, answeringEngine), so that the latency is kvcar's and
// the protocols'. A 2048-id prompt, one output token; p50 and p99 of the
// client's round trip at concurrency 1 and 64.
func BenchmarkDispatchOverhead(b *testing.B) {
	xl := frugalXLLMEngine(b)
	vl := answeringEngine(b)
	body := idsCompletion(2048)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 128}}
	b.Cleanup(client.CloseIdleConnections)
	for _, path := range []struct{ name, engine, backend string }{
		{"baidu_std", xl, ""}, {"http_relay", vl, "vllm"},
	} {
		router, reg := backendRouter(b, map[string]string{path.engine: path.backend})
		x := startXLLMSide(b, reg)
		s := New(Options{Router: router, Dispatcher: x.disp})
		s.SetReady(true)
		ts := httptest.NewServer(s.Handler())
		b.Cleanup(ts.Close)
		for _, conc := range []int{1, 64} {
			b.Run(fmt.Sprintf("%s/concurrency=%d", path.name, conc), func(b *testing.B) {
				closedloop.Run(b, client, ts.URL+CompletionsPath, body, conc)
			})
		}
	}
}

// BenchmarkParseTokenIDsFresh parses 8192-id query bodies by the text the
// ids come from (see prefillgen.Text), with variants=1 the same body every
// time against variants=64 bodies in turn: a parser that branches on each
// id's digit count runs faster on a body it has seen, which live traffic
// never sends twice in a row.
func BenchmarkParseTokenIDsFresh(b *testing.B) {
	for _, text := range []prefillgen.Text{prefillgen.Real, prefillgen.Uniform} {
		for _, variants := range []int{1, 64} {
			b.Run(fmt.Sprintf("text=%v/variants=%d", text, variants), func(b *testing.B) {
				rng := rand.New(rand.NewPCG(1, 2))
				bodies := make([][]byte, variants)
				for v := range bodies {
					bodies[v] = tokenBodyOf(text.IDs(rng, 8192), ",")
				}
				benchmarkParseBodies(b, 8192, bodies)
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/8192, "ns/id")
			})
		}
	}
}
