package main

import (
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestKeepWarmFlagValidated: --car_keep_warm_interval_us is checked at
// start-up against its range, naming the key.
func TestKeepWarmFlagValidated(t *testing.T) {
	for _, arg := range []string{"--car_keep_warm_interval_us=-1", "--car_keep_warm_interval_us=1000001"} {
		_, err := parseFlags([]string{arg}, new(strings.Builder))
		if err == nil || !strings.Contains(err.Error(), "--car_keep_warm_interval_us") {
			t.Errorf("%s: err = %v, want one naming --car_keep_warm_interval_us", arg, err)
		}
	}
	for _, arg := range []string{"--car_keep_warm_interval_us=0", "--car_keep_warm_interval_us=1000000"} {
		if _, err := parseFlags([]string{arg}, new(strings.Builder)); err != nil {
			t.Errorf("%s: %v", arg, err)
		}
	}
}

// TestKeepWarmInKVCar: a kvcar routing with CAR makes no dry decision
// before its first real one, makes them after it, and stops a second
// (lb.DefaultKeepWarmIdle) after the last; its metrics count them. With
// --car_keep_warm_interval_us=0 it makes none and serves no such metric.
func TestKeepWarmInKVCar(t *testing.T) {
	c := startCluster(t, 2, nil, "--load_balance_policy=CAR")
	if n, ok := dryDecisions(t, c.internal); !ok || n != 0 {
		t.Fatalf("before any request: dry decisions %v (served: %v), want 0", n, ok)
	}
	if r := c.complete(t, "/v1/completions", idsPrompt(1, 32)); r.status != 200 {
		t.Fatalf("completion: %d %s", r.status, r.body)
	}
	waitUntil(t, "dry decisions after a real one", 10*time.Second, func() bool {
		n, _ := dryDecisions(t, c.internal)
		return n > 0
	})
	// Asleep once a second has passed without a real decision.
	var settled float64
	waitUntil(t, "dry decisions stopping", 20*time.Second, func() bool {
		before, _ := dryDecisions(t, c.internal)
		time.Sleep(1500 * time.Millisecond)
		settled, _ = dryDecisions(t, c.internal)
		return settled == before
	})
	if settled > 5000 {
		t.Fatalf("%v dry decisions after one real one, want at most about a second's worth at 1 ms", settled)
	}

	off := startCluster(t, 1, nil, "--load_balance_policy=CAR", "--car_keep_warm_interval_us=0")
	if r := off.complete(t, "/v1/completions", idsPrompt(1, 32)); r.status != 200 {
		t.Fatalf("completion: %d %s", r.status, r.body)
	}
	time.Sleep(50 * time.Millisecond)
	if n, ok := dryDecisions(t, off.internal); ok {
		t.Fatalf("with --car_keep_warm_interval_us=0: %v dry decisions served", n)
	}
}

// dryDecisions scrapes kvcar_routing_dry_decisions_total; ok is false
// when kvcar does not serve it.
func dryDecisions(t *testing.T, internal string) (n float64, ok bool) {
	t.Helper()
	v, ok := sample(t, internal, "kvcar_routing_dry_decisions_total")
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseFloat(v, 64)
	if err != nil {
		t.Fatalf("kvcar_routing_dry_decisions_total %q: %v", v, err)
	}
	return n, true
}
