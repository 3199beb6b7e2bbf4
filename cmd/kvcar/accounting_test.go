package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvcar/kvcar/internal/enginesim"
)

// pauseHeartbeats stops the engines' load reports once kvcar has their
// first, so every request of a test sees the same stale load picture, as
// a burst between two 0.5 s heartbeats does.
func (c *cluster) pauseHeartbeats() {
	for _, e := range c.engines {
		e.SetHeartbeatPaused(true)
	}
	// A report already on its way lands before the test goes on.
	time.Sleep(200 * time.Millisecond)
}

// prefixPrompt is the 64 ids from 5000 on, then n more starting at tail.
func prefixPrompt(tail, n int) string {
	ids := make([]string, 0, 64+n)
	for i := range 64 {
		ids = append(ids, fmt.Sprint(5000+i))
	}
	for i := range n {
		ids = append(ids, fmt.Sprint(tail+i))
	}
	return `{"model":"m","max_tokens":2,"prompt":[` + strings.Join(ids, ",") + `]}`
}

func prefixIDs() []uint32 {
	ids := make([]uint32, 64)
	for i := range ids {
		ids[i] = uint32(5000 + i)
	}
	return ids
}

// burst sends n requests sharing the 64-token prefix at once and counts
// the instances they were routed to. The posting goroutines only record
// what happened; the test goroutine judges it.
func (c *cluster) burst(t *testing.T, n int) map[string]int {
	t.Helper()
	type result struct {
		answer completion
		err    error
	}
	results := make([]result, n)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			resp, b, err := sendCtx(ctx, http.MethodPost, "http://"+c.addr+"/v1/completions", "", prefixPrompt(100000+i*100, 16))
			if err != nil {
				results[i].err = err
				return
			}
			results[i].answer = c.completionOf(resp, b)
		})
	}
	wg.Wait()
	got := map[string]int{}
	for i, r := range results {
		switch {
		case r.err != nil:
			t.Errorf("burst request %d: %v", i, r.err)
		case r.answer.status != http.StatusOK:
			t.Errorf("burst request %d: %d %s", i, r.answer.status, r.answer.body)
		default:
			got[r.answer.prefill]++
		}
	}
	return got
}

// TestDispatchAccountingSpreadsBurst: one instance holds a prefix; a
// burst of requests sharing it arrives before any new load report. With
// the seed's formula (R-CAR-3) all of them go to that instance, whose
// load looks idle; with --car_dispatch_accounting each dispatch counts
// in its queue term and the burst spreads (issue 14 item 3a).
func TestDispatchAccountingSpreadsBurst(t *testing.T) {
	for _, tc := range []struct {
		name  string
		flags []string
		check func(got map[string]int, holder string) error
	}{
		{"seed formula herds", nil, func(got map[string]int, holder string) error {
			if got[holder] != 9 {
				return fmt.Errorf("want all 9 on %s", holder)
			}
			return nil
		}},
		{"accounting spreads", []string{"--car_dispatch_accounting", "--car_dispatch_max_age_ms=60000"},
			func(got map[string]int, holder string) error {
				if len(got) != 3 || got[holder] > 5 {
					return fmt.Errorf("want the burst over all 3 instances, at most 5 on %s", holder)
				}
				return nil
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := startCluster(t, 3, nil, append([]string{"--load_balance_policy=CAR", "--expose_routing_headers"}, tc.flags...)...)
			c.pauseHeartbeats()
			first := c.complete(t, "/v1/completions", prefixPrompt(1, 16))
			if first.status != 200 {
				t.Fatalf("first: %+v", first)
			}
			waitUntil(t, "prefix indexed", 5*time.Second, func() bool {
				_, body := query(t, c.internal, "", tokensJSON(prefixIDs()))
				return strings.Contains(string(body), `"device_hit_tokens":64`)
			})
			got := c.burst(t, 9)
			if err := tc.check(got, first.prefill); err != nil {
				t.Fatalf("burst of 9 routed %v: %v", got, err)
			}
		})
	}
}

// TestPendingPrefixRoutesBeforeEvents: the engines' KV events are held
// back (they change their caches without publishing), so the directory
// never learns what the first request left behind. With
// --car_pending_prefixes a follow-up sharing its prefix goes to the
// instance that got the first, and reuses the prefix there; the query
// API still reports no hit anywhere (never over-report, R-API-4). The
// seed's formula sees equal instances and rotates (R-CAR-5) (issue 14
// item 3b).
func TestPendingPrefixRoutesBeforeEvents(t *testing.T) {
	for _, pending := range []bool{false, true} {
		t.Run(fmt.Sprintf("pending=%v", pending), func(t *testing.T) {
			flags := []string{"--load_balance_policy=CAR", "--car_prefill_lambda=0.9", "--expose_routing_headers"}
			if pending {
				flags = append(flags, "--car_pending_prefixes", "--car_pending_prefix_timeout_ms=60000")
			}
			c := startCluster(t, 3, nil, flags...)
			c.pauseHeartbeats()
			for _, e := range c.engines {
				if err := e.SetDropTail(0, true); err != nil {
					t.Fatal(err)
				}
			}
			first := c.complete(t, "/v1/completions", prefixPrompt(1, 16))
			if first.status != 200 {
				t.Fatalf("first: %+v", first)
			}
			same := 0
			for i := range 3 {
				r := c.complete(t, "/v1/completions", prefixPrompt(200+i*100, 16))
				if r.status != 200 {
					t.Fatalf("follow-up %d: %+v", i, r)
				}
				if r.prefill == first.prefill {
					same++
					if pending && r.engine.DeviceHitTokens < 64 {
						t.Fatalf("follow-up %d on %s reused %d tokens, want the 64 of the prefix", i, r.prefill, r.engine.DeviceHitTokens)
					}
				}
				if r.hit != "0.0000" {
					t.Fatalf("follow-up %d: X-Kvcar-Hit-Ratio %q, want the directory's 0", i, r.hit)
				}
			}
			_, body := query(t, c.internal, "", tokensJSON(prefixIDs()))
			if n := strings.Count(string(body), `"device_hit_tokens":0`); n != 3 || strings.Contains(string(body), `"synchronized":false`) {
				t.Fatalf("query API: %s; want 3 synchronised streams with no hit", body)
			}
			switch {
			case pending && same != 3:
				t.Fatalf("with pending prefixes %d of 3 follow-ups went to %s", same, first.prefill)
			case !pending && same == 3:
				t.Fatalf("without pending prefixes every follow-up still went to %s: the test shows nothing", first.prefill)
			}
		})
	}
}

// TestAccountingFlagsValidated: every accounting flag is checked at
// start-up against its range, naming the key.
func TestAccountingFlagsValidated(t *testing.T) {
	for _, tc := range []struct{ arg, key string }{
		{"--car_dispatch_token_weight=2", "--car_dispatch_token_weight"},
		{"--car_dispatch_heartbeat_lag_ms=-1", "--car_dispatch_heartbeat_lag_ms"},
		{"--car_dispatch_max_age_ms=0", "--car_dispatch_max_age_ms"},
		{"--car_max_pending_dispatches=0", "--car_max_pending_dispatches"},
		{"--car_pending_prefix_timeout_ms=600001", "--car_pending_prefix_timeout_ms"},
		{"--car_max_pending_blocks=99999999", "--car_max_pending_blocks"},
	} {
		_, err := parseFlags([]string{tc.arg}, new(strings.Builder))
		if err == nil || !strings.Contains(err.Error(), tc.key) {
			t.Errorf("%s: err = %v, want one naming %s", tc.arg, err, tc.key)
		}
	}
	f, err := parseFlags([]string{"--car_dispatch_accounting", "--car_pending_prefixes"}, new(strings.Builder))
	if err != nil {
		t.Fatal(err)
	}
	if o := accountingOptions(f, nil); !o.Dispatched || !o.PendingPrefixes || o.Validate() != nil {
		t.Fatalf("options %+v: %v", o, o.Validate())
	}
	if o := accountingOptions(&flags{acctMaxAgeMs: 1, acctMaxDispatch: 1, acctPendingMs: 1, acctMaxPendBlock: 1}, nil); o.Dispatched || o.PendingPrefixes {
		t.Fatalf("accounting on without its flags: %+v", o)
	}
}

// TestDispatchTokensCountUntilAnswered: the uncached prompt tokens of
// a request count on its instance until the request path releases it
// at the request's end, not until a load report. X gets a small
// request that stays in flight (a slow decode), Y a large one that
// ends at once; the next request goes to Y, whose tokens were released
// when its request ended, although Y's prompt was larger. Heartbeats
// are paused, so without the release Y would still count its 256
// tokens against X's 16 and the request would go to X.
func TestDispatchTokensCountUntilAnswered(t *testing.T) {
	slowDecode := func(c *enginesim.Config) { c.DecodePerToken = 20 * time.Second } // 20 ms at the tests' time scale
	c := startCluster(t, 2, slowDecode, "--load_balance_policy=CAR", "--car_prefill_lambda=0", "--expose_routing_headers",
		"--car_dispatch_accounting", "--car_dispatch_token_weight=1", "--car_dispatch_max_age_ms=60000")
	c.pauseHeartbeats()
	long := postAsync(t, t.Context(), "http://"+c.addr+"/v1/completions",
		strings.Replace(idsPrompt(1, 16), `"max_tokens":2`, `"max_tokens":100`, 1))
	// The long request is routed first: wait until an engine has it.
	var x string
	waitUntil(t, "the long request on an engine", 5*time.Second, func() bool {
		for _, e := range c.engines {
			if e.Stats().Requests > 0 {
				x = e.Name()
				return true
			}
		}
		return false
	})
	big := c.complete(t, "/v1/completions", idsPrompt(1000, 256))
	if big.status != 200 || big.prefill == x {
		t.Fatalf("large request: %+v; want it on the instance other than %s", big, x)
	}
	next := c.complete(t, "/v1/completions", idsPrompt(5000, 16))
	if next.status != 200 || next.prefill != big.prefill {
		t.Fatalf("next request went to %s, want %s, whose 256 tokens were released when its request ended (%s still has 16 in flight)",
			next.prefill, big.prefill, x)
	}
	resp := long.wait(t)
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if r := c.completionOf(resp, b); r.status != 200 || r.prefill != x {
		t.Fatalf("long request: %+v", r)
	}
}
