package enginesim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvcar/kvcar/internal/kvevent"
	"github.com/kvcar/kvcar/internal/xllmpb/xservicepb"
)

const (
	// testScale makes the default costs tiny: 100 ns per prompt token,
	// 20 µs per decode step.
	testScale = 0.001
	// reqTimeout bounds every request a test expects to finish.
	reqTimeout = 10 * time.Second
	// longStep makes a decode step last a second at testScale, for
	// requests that must hold their slot until the test lets them go.
	longStep = 1000 * time.Second
)

// inferEngine starts an engine serving the request path on a free port.
func inferEngine(t *testing.T, mod func(*Config)) *Engine {
	t.Helper()
	cfg := Config{HTTPAddr: "127.0.0.1:0", TimeScale: testScale, DeviceBlocks: 64}
	if mod != nil {
		mod(&cfg)
	}
	return startEngine(t, cfg)
}

// apiResponse is an OpenAI response, chunk or error as a client decodes
// it.
type apiResponse struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Index   int     `json:"index"`
		Text    *string `json:"text"`
		Message *struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		Delta *struct {
			Role    string  `json:"role"`
			Content *string `json:"content"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
		TotalTokens      int `json:"total_tokens"`
	} `json:"usage"`
	Engine *EngineUsage `json:"kvcar_engine"`
	Error  *struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    int    `json:"code"`
	} `json:"error"`
}

// apiClient talks to one engine over its own transport.
type apiClient struct {
	t    *testing.T
	base string
	c    *http.Client
}

func newClient(t *testing.T, e *Engine) *apiClient {
	t.Helper()
	tr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(tr.CloseIdleConnections)
	return &apiClient{t: t, base: "http://" + e.HTTPAddr(), c: &http.Client{Transport: tr}}
}

// send posts body (raw bytes or a value to encode) to path.
func (c *apiClient) send(ctx context.Context, path string, body any, hdr http.Header) (*http.Response, error) {
	raw, ok := body.([]byte)
	if !ok {
		var err error
		if raw, err = json.Marshal(body); err != nil {
			return nil, err
		}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+path, bytes.NewReader(raw))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header[k] = v
	}
	return c.c.Do(req)
}

// call posts body and decodes the whole answer.
func (c *apiClient) call(path string, body any, hdr http.Header) (int, apiResponse) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), reqTimeout)
	defer cancel()
	resp, err := c.send(ctx, path, body, hdr)
	if err != nil {
		c.t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	var out apiResponse
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		c.t.Fatalf("POST %s: status %d, undecodable body: %v", path, resp.StatusCode, err)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		c.t.Fatalf("POST %s: Content-Type %q", path, ct)
	}
	return resp.StatusCode, out
}

// ok is call for requests that must succeed.
func (c *apiClient) ok(path string, body any) apiResponse {
	c.t.Helper()
	code, out := c.call(path, body, nil)
	if code != http.StatusOK || out.Engine == nil || out.Usage == nil || len(out.Choices) != 1 {
		c.t.Fatalf("POST %s = %d %+v", path, code, out)
	}
	return out
}

// pending is a request running in the background until it ends or the
// test cancels it.
type pending struct {
	cancel context.CancelFunc
	done   chan pendingResult
}

type pendingResult struct {
	code int
	resp apiResponse
	err  error
}

func (c *apiClient) start(path string, body any) *pending {
	ctx, cancel := context.WithTimeout(context.Background(), reqTimeout)
	p := &pending{cancel: cancel, done: make(chan pendingResult, 1)}
	go func() {
		var r pendingResult
		resp, err := c.send(ctx, path, body, nil)
		if err != nil {
			r.err = err
		} else {
			r.code = resp.StatusCode
			r.err = json.NewDecoder(resp.Body).Decode(&r.resp)
			resp.Body.Close()
		}
		p.done <- r
	}()
	c.t.Cleanup(func() {
		cancel()
		<-p.done
	})
	return p
}

// result waits for the request to end.
func (p *pending) result(t *testing.T) pendingResult {
	t.Helper()
	select {
	case r := <-p.done:
		p.done <- r // for the cleanup
		return r
	case <-time.After(reqTimeout + time.Second):
		t.Fatal("background request never ended")
		return pendingResult{}
	}
}

// cancelled cancels the request and checks that the client saw it end.
func (p *pending) cancelled(t *testing.T) {
	t.Helper()
	p.cancel()
	if r := p.result(t); !errors.Is(r.err, context.Canceled) {
		t.Fatalf("cancelled request ended with %d %v", r.code, r.err)
	}
}

func waitStats(t *testing.T, e *Engine, what string, ok func(EngineStats) bool) {
	t.Helper()
	waitFor(t, reqTimeout, what, func() bool { return ok(e.Stats()) })
}

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(1, math.Abs(b)) }

// wantMs checks a reported duration against the cost model.
func wantMs(t *testing.T, what string, got float64, want time.Duration) {
	t.Helper()
	if !near(got, float64(want)/float64(time.Millisecond)) {
		t.Fatalf("%s = %v ms, want %v", what, got, want)
	}
}

func scaledCost(per time.Duration, n int, scale float64) time.Duration {
	return time.Duration(float64(time.Duration(n)*per) * scale)
}

// R-IDX-3: a token-id prompt is served on the rank's own cache: the
// second identical prompt hits its full blocks on Device, the engine
// publishes the stored blocks as Prefill does, and the cost model
// charges only uncached tokens.
func TestCompletionsTokenIDsHitOnRepeatRIDX3(t *testing.T) {
	e := inferEngine(t, nil)
	p := newPeer(t, e, 0)
	c := newClient(t, e)
	prompt := tokens(500, 2*testBS+2) // two full blocks and a partial one

	first := c.ok("/v1/completions", map[string]any{"prompt": prompt})
	if first.Object != "text_completion" || first.Model != DefaultModelName || !strings.HasPrefix(first.ID, "cmpl-") {
		t.Fatalf("response %+v", first)
	}
	ch := first.Choices[0]
	if ch.Text == nil || *ch.Text != fillerText(defaultMaxTokens) || ch.FinishReason == nil || *ch.FinishReason != "length" {
		t.Fatalf("choice %+v", ch)
	}
	if u := first.Usage; u.PromptTokens != len(prompt) || u.CompletionTokens != defaultMaxTokens || u.TotalTokens != len(prompt)+defaultMaxTokens {
		t.Fatalf("usage %+v", *u)
	}
	eu := first.Engine
	if eu.Instance != e.Name() || eu.DPRank != 0 || eu.DeviceHitTokens != 0 || eu.HostHitTokens != 0 || eu.QueueMs != 0 || eu.TimeScale != testScale {
		t.Fatalf("kvcar_engine %+v", *eu)
	}
	wantMs(t, "cold prefill_ms", eu.PrefillMs, scaledCost(DefaultPrefillPerToken, len(prompt), testScale))
	wantMs(t, "decode_ms", eu.DecodeMs, scaledCost(DefaultDecodePerToken, defaultMaxTokens-1, testScale))

	m := p.liveOK()
	if ev := m.batch.Events; len(ev) != 1 || ev[0].Kind != kvevent.BlockStored || len(ev[0].BlockHashes) != 2 ||
		!slices.Equal(ev[0].TokenIDs, prompt[:2*testBS]) {
		t.Fatalf("live events %+v", m.batch.Events)
	}
	if st := e.State(0); len(st) != 2 {
		t.Fatalf("state holds %d blocks, want 2", len(st))
	}

	second := c.ok("/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 3})
	if eu := second.Engine; eu.DeviceHitTokens != 2*testBS || eu.HostHitTokens != 0 {
		t.Fatalf("repeat hits %+v", *eu)
	}
	wantMs(t, "warm prefill_ms", second.Engine.PrefillMs, scaledCost(DefaultPrefillPerToken, 2, testScale))
	if *second.Choices[0].Text != "tok1 tok2 tok3" || second.Usage.CompletionTokens != 3 {
		t.Fatalf("max_tokens 3 gave %q, usage %+v", *second.Choices[0].Text, *second.Usage)
	}
	if dev, _ := e.Oracle(0, prompt); dev != 2*testBS {
		t.Fatalf("oracle %d", dev)
	}
	p.noLive() // nothing new to announce

	// The same text as a string and as its toy ids is the same prompt.
	text := "one two three four five six seven eight nine"
	c.ok("/v1/completions", map[string]any{"prompt": text})
	byIDs := c.ok("/v1/completions", map[string]any{"prompt": [][]uint32{ToyTokenize(text)}, "max_tokens": 0})
	if byIDs.Engine.DeviceHitTokens != 2*testBS || byIDs.Usage.PromptTokens != 9 || *byIDs.Choices[0].Text != "" {
		t.Fatalf("ids of the string prompt: %+v %+v", *byIDs.Engine, *byIDs.Usage)
	}
	wantMs(t, "max_tokens 0 decode_ms", byIDs.Engine.DecodeMs, 0)

	st := e.Stats()
	want := EngineStats{
		Requests: 4, Completed: 4, PromptTokens: uint64(2*len(prompt) + 18),
		DeviceHitTokens: 4 * testBS, CompletionTokens: 2*defaultMaxTokens + 3,
	}
	if st.Requests != want.Requests || st.Completed != want.Completed || st.PromptTokens != want.PromptTokens ||
		st.DeviceHitTokens != want.DeviceHitTokens || st.HostHitTokens != 0 || st.CompletionTokens != want.CompletionTokens ||
		st.Waiting != 0 || st.Running != 0 || st.PrefillTime <= 0 || st.DecodeTime <= 0 {
		t.Fatalf("stats %+v, want %+v", st, want)
	}
	e.ResetStats()
	if st := e.Stats(); st != (EngineStats{}) {
		t.Fatalf("stats after reset %+v", st)
	}
}

// R-IDX-2: a prompt whose blocks were offloaded hits on Host, and the
// cost model charges the Host load instead of the compute.
func TestCompletionsHostHitCostRIDX2(t *testing.T) {
	e := inferEngine(t, func(c *Config) {
		c.DeviceBlocks, c.HostBlocks = 2, 4
		c.PrefillPerToken, c.HostLoadPerToken = time.Millisecond, 300*time.Microsecond
	})
	c := newClient(t, e)
	a, b := tokens(0, 2*testBS), tokens(100, 2*testBS)
	c.ok("/v1/completions", map[string]any{"prompt": a, "max_tokens": 1})
	c.ok("/v1/completions", map[string]any{"prompt": b, "max_tokens": 1}) // pushes a to Host
	again := c.ok("/v1/completions", map[string]any{"prompt": a, "max_tokens": 1})
	if eu := again.Engine; eu.DeviceHitTokens != 0 || eu.HostHitTokens != 2*testBS {
		t.Fatalf("hits after offload %+v", *eu)
	}
	wantMs(t, "host-hit prefill_ms", again.Engine.PrefillMs, scaledCost(300*time.Microsecond, 2*testBS, testScale))
	if st := e.Stats(); st.HostHitTokens != 2*testBS {
		t.Fatalf("stats %+v", st)
	}
}

// Chat messages are flattened and tokenized deterministically; the
// kvcar_token_ids extension replaces them with exact ids, which share the
// cache with completion prompts. A follow-up turn reuses the blocks of
// the turn before.
func TestChatCompletions(t *testing.T) {
	e := inferEngine(t, nil)
	c := newClient(t, e)
	turn1 := []map[string]any{
		{"role": "system", "content": "you are a terse assistant for the test"},
		{"role": "user", "content": []map[string]any{{"type": "text", "text": "say"}, {"type": "image_url"}, {"type": "text", "text": "something short"}}},
	}
	resp := c.ok("/v1/chat/completions", map[string]any{"messages": turn1, "max_tokens": 2, "model": "asked"})
	want := ChatTokenIDs([]ChatMessage{
		{Role: "system", Content: "you are a terse assistant for the test"},
		{Role: "user", Content: "say something short"},
	})
	msg := resp.Choices[0].Message
	if resp.Object != "chat.completion" || !strings.HasPrefix(resp.ID, "chatcmpl-") || resp.Model != "asked" ||
		msg == nil || msg.Role != "assistant" || msg.Content != "tok1 tok2" || resp.Usage.PromptTokens != len(want) {
		t.Fatalf("chat response %+v, want %d prompt tokens", resp, len(want))
	}

	turn2 := append(slices.Clone(turn1),
		map[string]any{"role": "assistant", "content": "tok1 tok2"},
		map[string]any{"role": "user", "content": "again"})
	resp = c.ok("/v1/chat/completions", map[string]any{"messages": turn2, "max_completion_tokens": 1})
	if hit := resp.Engine.DeviceHitTokens; hit != len(want)/testBS*testBS || hit == 0 || resp.Usage.CompletionTokens != 1 {
		t.Fatalf("follow-up turn hit %d of the %d tokens of the first, usage %+v", hit, len(want), *resp.Usage)
	}

	ids := tokens(7000, 3*testBS)
	c.ok("/v1/completions", map[string]any{"prompt": ids, "max_tokens": 1})
	resp = c.ok("/v1/chat/completions", map[string]any{TokenIDsField: ids, "messages": turn1, "max_tokens": 1})
	if resp.Engine.DeviceHitTokens != 3*testBS || resp.Usage.PromptTokens != len(ids) {
		t.Fatalf("chat with %s: %+v %+v", TokenIDsField, *resp.Engine, *resp.Usage)
	}
}

// sse reads a whole event stream and returns the data of each event, and
// fails unless every event is exactly "data: ...\n\n".
func sse(t *testing.T, r io.Reader) []string {
	t.Helper()
	raw, err := io.ReadAll(r)
	if err != nil {
		t.Fatalf("reading stream: %v", err)
	}
	var out []string
	for rest := string(raw); rest != ""; {
		ev, after, found := strings.Cut(rest, "\n\n")
		if !found || !strings.HasPrefix(ev, "data: ") || strings.Contains(ev, "\n") {
			t.Fatalf("malformed event %q in stream %q", ev, raw)
		}
		out = append(out, strings.TrimPrefix(ev, "data: "))
		rest = after
	}
	return out
}

func openStream(t *testing.T, c *apiClient, ctx context.Context, path string, body any) *http.Response {
	t.Helper()
	resp, err := c.send(ctx, path, body, nil)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		resp.Body.Close()
		t.Fatalf("stream answered %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	return resp
}

// A stream is one chunk per output token, the finish chunk with the
// engine report, the usage chunk when asked for, and [DONE].
func TestStreamingSSE(t *testing.T) {
	e := inferEngine(t, nil)
	c := newClient(t, e)
	ctx, cancel := context.WithTimeout(context.Background(), reqTimeout)
	defer cancel()
	prompt := tokens(0, 2*testBS)

	resp := openStream(t, c, ctx, "/v1/completions", map[string]any{
		"prompt": prompt, "max_tokens": 4, "stream": true, "stream_options": map[string]any{"include_usage": true},
	})
	events := sse(t, resp.Body)
	resp.Body.Close()
	if len(events) != 4+3 || events[len(events)-1] != "[DONE]" {
		t.Fatalf("events %q", events)
	}
	var text strings.Builder
	var chunks []apiResponse
	for _, ev := range events[:len(events)-1] {
		var ch apiResponse
		must(t, json.Unmarshal([]byte(ev), &ch))
		chunks = append(chunks, ch)
	}
	for _, ch := range chunks[:4] {
		if ch.Object != "text_completion" || len(ch.Choices) != 1 || ch.Choices[0].FinishReason != nil || ch.Engine != nil || ch.Usage != nil {
			t.Fatalf("token chunk %+v", ch)
		}
		text.WriteString(*ch.Choices[0].Text)
	}
	if text.String() != fillerText(4) {
		t.Fatalf("streamed text %q", text.String())
	}
	fin := chunks[4]
	if len(fin.Choices) != 1 || fin.Choices[0].FinishReason == nil || *fin.Choices[0].FinishReason != "length" ||
		fin.Engine == nil || fin.Engine.Instance != e.Name() {
		t.Fatalf("finish chunk %s", events[4])
	}
	wantMs(t, "stream decode_ms", fin.Engine.DecodeMs, scaledCost(DefaultDecodePerToken, 3, testScale))
	if u := chunks[5]; len(u.Choices) != 0 || u.Usage == nil || u.Usage.PromptTokens != len(prompt) || u.Usage.CompletionTokens != 4 {
		t.Fatalf("usage chunk %s", events[5])
	}

	// Chat: the first delta has the role, the last is empty; no usage
	// chunk unless asked for.
	resp = openStream(t, c, ctx, "/v1/chat/completions", map[string]any{
		TokenIDsField: prompt, "messages": []map[string]any{{"role": "user", "content": "x"}}, "max_tokens": 2, "stream": true,
	})
	events = sse(t, resp.Body)
	resp.Body.Close()
	if len(events) != 2+2 || events[3] != "[DONE]" {
		t.Fatalf("chat events %q", events)
	}
	var first, last apiResponse
	must(t, json.Unmarshal([]byte(events[0]), &first))
	must(t, json.Unmarshal([]byte(events[2]), &last))
	if first.Object != "chat.completion.chunk" || first.Choices[0].Delta == nil || first.Choices[0].Delta.Role != "assistant" ||
		*first.Choices[0].Delta.Content != "tok1" {
		t.Fatalf("first chat chunk %s", events[0])
	}
	if d := last.Choices[0].Delta; d == nil || d.Content != nil || *last.Choices[0].FinishReason != "length" ||
		last.Engine == nil || last.Engine.DeviceHitTokens != 2*testBS {
		t.Fatalf("last chat chunk %s", events[2])
	}
	if st := e.Stats(); st.Completed != 2 || st.CompletionTokens != 6 {
		t.Fatalf("stats %+v", st)
	}
}

// The cost model's time is really spent: at TimeScale 1 a request takes
// at least its prefill and decode time.
func TestCostModelTakesTime(t *testing.T) {
	e := inferEngine(t, func(c *Config) {
		c.TimeScale = 1
		c.PrefillPerToken, c.DecodePerToken = time.Millisecond, 10*time.Millisecond
	})
	c := newClient(t, e)
	start := time.Now()
	resp := c.ok("/v1/completions", map[string]any{"prompt": tokens(0, 30), "max_tokens": 3})
	if took, want := time.Since(start), 30*time.Millisecond+2*10*time.Millisecond; took < want {
		t.Fatalf("request took %v, cost model says %v", took, want)
	}
	wantMs(t, "prefill_ms", resp.Engine.PrefillMs, 30*time.Millisecond)
	wantMs(t, "decode_ms", resp.Engine.DecodeMs, 20*time.Millisecond)
}

// With one slot a second request waits in the queue for the first and
// reports how long; the first never queued.
func TestQueueingWithOneSlot(t *testing.T) {
	e := inferEngine(t, func(c *Config) {
		c.BatchSlots = 1
		c.DecodePerToken = 100 * time.Second // 100 ms per step at testScale
	})
	c := newClient(t, e)
	a := c.start("/v1/completions", map[string]any{"prompt": tokens(0, testBS), "max_tokens": 3})
	waitStats(t, e, "first request running", func(st EngineStats) bool { return st.Running == 1 })
	b := c.ok("/v1/completions", map[string]any{"prompt": tokens(100, testBS), "max_tokens": 1})
	ra := a.result(t)
	if ra.err != nil || ra.code != http.StatusOK {
		t.Fatalf("first request: %d %v", ra.code, ra.err)
	}
	if ra.resp.Engine.QueueMs != 0 || b.Engine.QueueMs <= 0 {
		t.Fatalf("queue_ms first %v second %v", ra.resp.Engine.QueueMs, b.Engine.QueueMs)
	}
	if st := e.Stats(); st.QueueTime <= 0 || st.Completed != 2 || st.Waiting != 0 || st.Running != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// R-CAR-3, R-CAR-10: waiting_requests_num is the number of requests
// queued for a slot, as the router's queue term needs, plus SetWaiting's
// value; it falls as requests leave the queue.
func TestHeartbeatReportsQueuedRequestsRCAR10(t *testing.T) {
	te := startEtcd(t)
	m := startRPCMaster(t, true)
	te.put(t, MasterKey("hbq"), m.addr())
	e := heartbeatEngine(t, te, "hbq", func(c *Config) {
		c.TimeScale, c.BatchSlots, c.DecodePerToken = testScale, 1, longStep
	})
	c := newClient(t, e)
	waiting := func(n uint64) {
		t.Helper()
		m.waitBeat(t, e.Name(), func(b *xservicepb.HeartbeatRequest) bool { return b.LoadMetrics.GetWaitingRequestsNum() == n })
	}
	long := map[string]any{"prompt": tokens(0, testBS), "max_tokens": 100}
	a := c.start("/v1/completions", long)
	waitStats(t, e, "first request running", func(st EngineStats) bool { return st.Running == 1 })
	b := c.start("/v1/completions", long)
	c2 := c.start("/v1/completions", long)
	waitStats(t, e, "two requests queued", func(st EngineStats) bool { return st.Waiting == 2 })
	waiting(2)
	e.SetWaiting(3)
	waiting(5)
	if lm, err := e.LoadMetrics(); err != nil || lm.WaitingRequests != 5 {
		t.Fatalf("LoadMetrics %+v %v", lm, err)
	}
	e.SetWaiting(0)
	b.cancelled(t)
	waiting(1)
	a.cancelled(t) // c2 takes the slot
	waitStats(t, e, "queue empty", func(st EngineStats) bool { return st.Waiting == 0 && st.Running == 1 })
	waiting(0)
	c2.cancelled(t)
	waitStats(t, e, "all cancelled", func(st EngineStats) bool { return st.Cancelled == 3 && st.Running == 0 })
}

// A client that goes away, queued, running or streaming, frees its place
// at once: the next request is served without queueing.
func TestClientCancellationFreesSlot(t *testing.T) {
	e := inferEngine(t, func(c *Config) { c.BatchSlots, c.DecodePerToken = 1, longStep })
	c := newClient(t, e)
	long := map[string]any{"prompt": tokens(0, testBS), "max_tokens": 100}
	a := c.start("/v1/completions", long)
	waitStats(t, e, "first request running", func(st EngineStats) bool { return st.Running == 1 })
	b := c.start("/v1/completions", long)
	waitStats(t, e, "second request queued", func(st EngineStats) bool { return st.Waiting == 1 })

	b.cancelled(t)
	waitStats(t, e, "queued request cancelled", func(st EngineStats) bool {
		return st.Cancelled == 1 && st.Waiting == 0 && st.Running == 1
	})
	a.cancelled(t)
	waitStats(t, e, "running request cancelled", func(st EngineStats) bool { return st.Cancelled == 2 && st.Running == 0 })

	// A stream cancelled after its first token.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp := openStream(t, c, ctx, "/v1/completions", map[string]any{"prompt": tokens(0, testBS), "max_tokens": 100, "stream": true})
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("first stream line %q %v", line, err)
	}
	cancel()
	resp.Body.Close()
	waitStats(t, e, "stream cancelled", func(st EngineStats) bool { return st.Cancelled == 3 && st.Running == 0 })

	next := c.ok("/v1/completions", map[string]any{"prompt": tokens(0, testBS), "max_tokens": 1})
	if next.Engine.QueueMs != 0 || next.Engine.DeviceHitTokens != testBS {
		t.Fatalf("request after cancellations %+v", *next.Engine)
	}
	if st := e.Stats(); st.Requests != 3 || st.Completed != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// Malformed requests get 400 with an OpenAI error body and change
// nothing.
func TestBadRequests(t *testing.T) {
	e := inferEngine(t, nil)
	c := newClient(t, e)
	chatMsg := []map[string]any{{"role": "user", "content": "hi"}}
	cases := []struct {
		name, path string
		body       any
	}{
		{"not JSON", "/v1/completions", []byte("{")},
		{"trailing data", "/v1/completions", []byte(`{"prompt":[1]} x`)},
		{"no prompt", "/v1/completions", map[string]any{}},
		{"number prompt", "/v1/completions", map[string]any{"prompt": 7}},
		{"negative id", "/v1/completions", map[string]any{"prompt": []int{1, -1}}},
		{"fractional id", "/v1/completions", []byte(`{"prompt":[1.5]}`)},
		{"id beyond uint32", "/v1/completions", []byte(`{"prompt":[4294967296]}`)},
		{"empty ids", "/v1/completions", map[string]any{"prompt": []int{}}},
		{"blank string", "/v1/completions", map[string]any{"prompt": "   "}},
		{"batch of strings", "/v1/completions", map[string]any{"prompt": []string{"a", "b"}}},
		{"batch of ids", "/v1/completions", map[string]any{"prompt": [][]int{{1}, {2}}}},
		{"negative max_tokens", "/v1/completions", map[string]any{"prompt": "a", "max_tokens": -1}},
		{"huge max_tokens", "/v1/completions", map[string]any{"prompt": "a", "max_tokens": maxCompletionTokens + 1}},
		{"n 2", "/v1/completions", map[string]any{"prompt": "a", "n": 2}},
		{"bad routing", "/v1/completions", map[string]any{"prompt": "a", "routing": "x"}},
		{"bad token_ids", "/v1/completions", map[string]any{TokenIDsField: []int{-3}}},
		{"no messages", "/v1/chat/completions", map[string]any{"prompt": "a"}},
		{"no role", "/v1/chat/completions", map[string]any{"messages": []map[string]any{{"content": "hi"}}}},
		{"number content", "/v1/chat/completions", map[string]any{"messages": []map[string]any{{"role": "user", "content": 3}}}},
		{"bad max_completion_tokens", "/v1/chat/completions", map[string]any{"messages": chatMsg, "max_completion_tokens": -2}},
	}
	for _, tc := range cases {
		code, resp := c.call(tc.path, tc.body, nil)
		if code != http.StatusBadRequest || resp.Error == nil || resp.Error.Type != "invalid_request_error" ||
			resp.Error.Message == "" || resp.Error.Code != http.StatusBadRequest {
			t.Errorf("%s: %d %+v", tc.name, code, resp.Error)
		}
	}
	if st := e.Stats(); st.BadRequests != uint64(len(cases)) || st.Requests != 0 {
		t.Fatalf("stats %+v", st)
	}
	if st := e.State(0); len(st) != 0 {
		t.Fatalf("bad requests cached %d blocks", len(st))
	}
	if code, _, err := httpGet(t, e.HTTPAddr(), "/v1/completions"); err != nil || code != http.StatusMethodNotAllowed {
		t.Fatalf("GET /v1/completions = %d %v", code, err)
	}
}

// Past MaxQueue waiting requests the engine answers 503; SetFailRequests
// forces a status until it is turned off.
func TestOverloadAndInjectedFailures(t *testing.T) {
	e := inferEngine(t, func(c *Config) { c.BatchSlots, c.MaxQueue, c.DecodePerToken = 1, 1, longStep })
	c := newClient(t, e)
	long := map[string]any{"prompt": tokens(0, testBS), "max_tokens": 100}
	c.start("/v1/completions", long)
	waitStats(t, e, "first request running", func(st EngineStats) bool { return st.Running == 1 })
	c.start("/v1/completions", long)
	waitStats(t, e, "second request queued", func(st EngineStats) bool { return st.Waiting == 1 })
	code, resp := c.call("/v1/completions", long, nil)
	if code != http.StatusServiceUnavailable || resp.Error == nil || resp.Error.Type != "server_error" {
		t.Fatalf("overloaded engine answered %d %+v", code, resp.Error)
	}
	if st := e.Stats(); st.Rejected != 1 || st.Waiting != 1 {
		t.Fatalf("stats %+v", st)
	}

	for _, tc := range []struct{ set, want int }{{500, 500}, {429, 429}, {42, 500}} {
		e.SetFailRequests(tc.set)
		code, resp := c.call("/v1/chat/completions", map[string]any{"messages": []map[string]any{{"role": "user", "content": "hi"}}}, nil)
		if code != tc.want || resp.Error == nil || resp.Error.Code != tc.want {
			t.Fatalf("SetFailRequests(%d): %d %+v", tc.set, code, resp.Error)
		}
	}
	must(t, e.Restart()) // the fault survives a restart; the queue does not
	code, _ = c.call("/v1/completions", long, nil)
	if code != http.StatusInternalServerError {
		t.Fatalf("after restart: %d", code)
	}
	e.SetFailRequests(0)
	c.ok("/v1/completions", map[string]any{"prompt": "a", "max_tokens": 1})
	waitStats(t, e, "requests aborted by the restart", func(st EngineStats) bool { return st.Aborted == 2 })
	if st := e.Stats(); st.Failed != 4 || st.Rejected != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// The routing names arrive in the body or in headers, the body winning
// name by name, and are reported back; a prefill name that is not this
// instance counts as misrouted.
func TestRoutingNamesRecorded(t *testing.T) {
	e := inferEngine(t, nil)
	c := newClient(t, e)
	body := func(routing map[string]any) map[string]any {
		b := map[string]any{"prompt": "route me", "max_tokens": 1}
		if routing != nil {
			b["routing"] = routing
		}
		return b
	}
	hdr := http.Header{PrefillNameHeader: {"10.0.0.9:1"}, DecodeNameHeader: {"10.0.0.2:9000"}}
	for _, tc := range []struct {
		name                 string
		routing              map[string]any
		hdr                  http.Header
		wantPrefill, wantDec string
	}{
		{"none", nil, nil, "", ""},
		{"body", map[string]any{"prefill_name": e.Name(), "decode_name": "10.0.0.1:9000"}, nil, e.Name(), "10.0.0.1:9000"},
		{"headers", nil, hdr, "10.0.0.9:1", "10.0.0.2:9000"},
		{"body first", map[string]any{"prefill_name": e.Name()}, hdr, e.Name(), "10.0.0.2:9000"},
	} {
		code, resp := c.call("/v1/completions", body(tc.routing), tc.hdr)
		if code != http.StatusOK || resp.Engine.PrefillName != tc.wantPrefill || resp.Engine.DecodeName != tc.wantDec {
			t.Fatalf("%s: %d %+v", tc.name, code, resp.Engine)
		}
	}
	if st := e.Stats(); st.Misrouted != 1 {
		t.Fatalf("misrouted %d, want 1", st.Misrouted)
	}
}

// /v1/models lists the one configured model.
func TestModelsEndpoint(t *testing.T) {
	for _, name := range []string{"", "my-model"} {
		e := inferEngine(t, func(c *Config) { c.ModelName = name })
		code, body, err := httpGet(t, e.HTTPAddr(), "/v1/models")
		must(t, err)
		var list struct {
			Object string `json:"object"`
			Data   []struct {
				ID     string `json:"id"`
				Object string `json:"object"`
			} `json:"data"`
		}
		must(t, json.Unmarshal([]byte(body), &list))
		want := name
		if want == "" {
			want = DefaultModelName
		}
		if code != http.StatusOK || list.Object != "list" || len(list.Data) != 1 || list.Data[0].ID != want || list.Data[0].Object != "model" {
			t.Fatalf("GET /v1/models = %d %s", code, body)
		}
		resp := newClient(t, e).ok("/v1/completions", map[string]any{"prompt": "a", "max_tokens": 1})
		if resp.Model != want {
			t.Fatalf("response model %q, want %q", resp.Model, want)
		}
	}
}

// R-CAR-6: a request goes to the least loaded DP rank, ties taking turns,
// so the same prompt hits only on the rank that served it before.
func TestDPRankChoiceRCAR6(t *testing.T) {
	// Requests of one output token have no decode step, so only the
	// long one below lasts.
	e := inferEngine(t, func(c *Config) { c.DPSize, c.DecodePerToken = 2, longStep })
	c := newClient(t, e)
	prompt := map[string]any{"prompt": tokens(0, 2*testBS), "max_tokens": 1}
	var ranks, hits []int
	for range 3 {
		r := c.ok("/v1/completions", prompt)
		ranks, hits = append(ranks, r.Engine.DPRank), append(hits, r.Engine.DeviceHitTokens)
	}
	if !slices.Equal(ranks, []int{0, 1, 0}) || !slices.Equal(hits, []int{0, 0, 2 * testBS}) {
		t.Fatalf("ranks %v hits %v", ranks, hits)
	}

	// A long request on rank 1, next in turn, makes rank 0 the least
	// loaded for everything that follows.
	c.start("/v1/completions", map[string]any{"prompt": tokens(0, testBS), "max_tokens": 100})
	waitStats(t, e, "long request running", func(st EngineStats) bool { return st.Running == 1 })
	for range 3 {
		if r := c.ok("/v1/completions", prompt); r.Engine.DPRank != 0 {
			t.Fatalf("request went to the busy rank %d", r.Engine.DPRank)
		}
	}
}

// Restart and Close end the process: its requests in flight are cut off
// with their connections, Close does not wait for them, and the new
// process serves new requests from an empty cache.
func TestRestartAndCloseAbortRequests(t *testing.T) {
	e := inferEngine(t, func(c *Config) { c.BatchSlots, c.DecodePerToken = 1, longStep })
	c := newClient(t, e)
	long := map[string]any{"prompt": tokens(0, testBS), "max_tokens": 100}
	a := c.start("/v1/completions", long)
	waitStats(t, e, "first request running", func(st EngineStats) bool { return st.Running == 1 })
	b := c.start("/v1/completions", long)
	waitStats(t, e, "second request queued", func(st EngineStats) bool { return st.Waiting == 1 })

	must(t, e.Restart())
	for _, p := range []*pending{a, b} {
		if r := p.result(t); r.err == nil || errors.Is(r.err, context.Canceled) {
			t.Fatalf("request across a restart ended with %d %v", r.code, r.err)
		}
	}
	waitStats(t, e, "requests aborted", func(st EngineStats) bool { return st.Aborted == 2 && st.Running == 0 && st.Waiting == 0 })
	if r := c.ok("/v1/completions", map[string]any{"prompt": tokens(0, testBS), "max_tokens": 1}); r.Engine.DeviceHitTokens != 0 {
		t.Fatalf("new process hit %d tokens", r.Engine.DeviceHitTokens)
	}

	// A stream cut off mid-way ends without its terminating chunk.
	ctx, cancel := context.WithTimeout(context.Background(), reqTimeout)
	defer cancel()
	resp := openStream(t, c, ctx, "/v1/completions", map[string]any{"prompt": tokens(0, testBS), "max_tokens": 100, "stream": true})
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if line, err := br.ReadString('\n'); err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("first stream line %q %v", line, err)
	}
	start := time.Now()
	must(t, e.Close())
	if took := time.Since(start); took >= httpShutdownTimeout {
		t.Fatalf("Close waited %v for a request in flight", took)
	}
	if rest, err := io.ReadAll(br); err == nil || strings.Contains(string(rest), "[DONE]") {
		t.Fatalf("stream across Close ended cleanly: %q", rest)
	}
	if st := e.Stats(); st.Aborted != 3 || st.Running != 0 {
		t.Fatalf("stats after close %+v", st)
	}
	if st := e.Stats(); st.Aborted != 3 || st.Running != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// The cost model's knobs are checked like the rest of the Config.
func TestCostModelConfig(t *testing.T) {
	for _, c := range []Config{
		{TimeScale: -1}, {TimeScale: math.NaN()}, {TimeScale: math.Inf(1)},
		{PrefillPerToken: -1}, {HostLoadPerToken: -1}, {DecodePerToken: -1},
		{BatchSlots: -1}, {MaxQueue: -1},
	} {
		if _, err := New(c); err == nil {
			t.Errorf("New(%+v) accepted", c)
		}
	}
	e, err := New(Config{PrefillPerToken: time.Millisecond})
	must(t, err)
	if c := e.cfg; c.TimeScale != 1 || c.HostLoadPerToken != 200*time.Microsecond || c.DecodePerToken != DefaultDecodePerToken ||
		c.BatchSlots != DefaultBatchSlots || c.MaxQueue != DefaultMaxQueue || c.ModelName != DefaultModelName {
		t.Fatalf("defaults %+v", c)
	}
}
