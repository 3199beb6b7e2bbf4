package server

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/kvcar/kvcar/internal/instance"
	"github.com/kvcar/kvcar/internal/lb"
)

// policyRouter routes with a real policy over a registry snapshot, as
// the command wires it to the registry.
type policyRouter struct {
	policy lb.Policy
	snap   *instance.Snapshot
}

func (r policyRouter) Policy() string { return r.policy.Name() }

func (r policyRouter) Route(req lb.Request) (lb.Decision, error) {
	return r.policy.Route(req, r.snap)
}

// routerFor returns an RR router over a snapshot in which each of names
// is an active DEFAULT instance with a load report. The snapshot is
// fixed, so that no registry runs in the process: measurements of the
// request path then count its own allocations only.
func routerFor(tb testing.TB, names ...string) policyRouter {
	tb.Helper()
	ins := make([]instance.Instance, len(names))
	for i, name := range names {
		ins[i] = instance.Instance{Meta: instance.Meta{Name: name, IncarnationID: "inc", DPSize: 1},
			Type: instance.Default, Role: instance.Default, State: instance.Active,
			HasLoad: true, LoadValid: true}
	}
	slices.SortFunc(ins, func(a, b instance.Instance) int { return strings.Compare(a.Meta.Name, b.Meta.Name) })
	return policyRouter{policy: lb.NewRR(), snap: &instance.Snapshot{Instances: ins, Version: 1, Synced: true}}
}

// startEngine runs a real HTTP engine on loopback and returns its
// host:port, the name it is registered under.
func startEngine(tb testing.TB, h http.HandlerFunc) string {
	tb.Helper()
	e := httptest.NewServer(h)
	tb.Cleanup(e.Close)
	return e.Listener.Addr().String()
}

// idsCompletion is a /v1/completions body with n realistic prompt ids.
func idsCompletion(n int) []byte {
	b := []byte(`{"model":"m","max_tokens":16,"prompt":[`)
	for i := range n {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendUint(b, uint64(i*7919%151936), 10)
	}
	return append(b, `],"temperature":0}`...)
}

// answeringEngine is a real HTTP engine on loopback that reads the body
// and answers a short completion, about the least an engine can do.
func answeringEngine(tb testing.TB) string {
	return startEngine(tb, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"c","object":"text_completion","choices":[{"text":"ok","index":0,"finish_reason":"length"}]}`)
	})
}

// completionLoop returns a func that serves one /v1/completions of body
// through h, reusing the request and the writer so that only the
// handler's own work is counted.
func completionLoop(tb testing.TB, h http.Handler, body []byte) func() {
	r := bytes.NewReader(body)
	w := &discardWriter{h: http.Header{}}
	req := httptest.NewRequest(http.MethodPost, CompletionsPath, io.NopCloser(r))
	req.Header.Set("Content-Type", "application/json")
	return func() {
		r.Reset(body)
		req.Body = io.NopCloser(r)
		req.ContentLength = int64(len(body))
		clear(w.h)
		w.code = 0
		h.ServeHTTP(w, req)
		if w.code != http.StatusOK {
			tb.Fatalf("status %d", w.code)
		}
	}
}
