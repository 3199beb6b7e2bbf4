package main

import (
	"bufio"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
)

// traceWriter writes one CSV line per request and policy.
type traceWriter struct {
	f *os.File
	w *bufio.Writer
}

const traceHeader = "policy,index,session,conv,turn,prompt_tokens,engine,dp_rank,device_hit,host_hit," +
	"best_available,probe,queue_ms,prefill_ms,decode_ms,latency_us,decision_us,error\n"

func newTraceWriter(path string) (*traceWriter, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("trace: %w", err)
	}
	t := &traceWriter{f: f, w: bufio.NewWriter(f)}
	if _, err := t.w.WriteString(traceHeader); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("trace: %w", err)
	}
	return t, nil
}

// write adds a policy's records; engines are named by their position
// (e0, e1, …), and probe lists every rank's reusable tokens as
// e0:r0/r1;e1:….
func (t *traceWriter) write(policy string, wl *workload, recs []record, names []string) error {
	for i := range recs {
		r := &recs[i]
		req := &wl.requests[r.Index]
		engine := ""
		if j := slices.Index(names, r.Instance); j >= 0 {
			engine = "e" + strconv.Itoa(j)
		}
		best := 0
		var probe []string
		for j, ranks := range r.Probe {
			parts := make([]string, len(ranks))
			for k, h := range ranks {
				parts[k] = strconv.Itoa(h)
				best = max(best, h)
			}
			probe = append(probe, "e"+strconv.Itoa(j)+":"+strings.Join(parts, "/"))
		}
		errText := ""
		if r.Err != nil {
			errText = strconv.Quote(r.Err.Error())
		}
		_, err := fmt.Fprintf(t.w, "%s,%d,%d,%d,%d,%d,%s,%d,%d,%d,%d,%s,%.3f,%.3f,%.3f,%d,%d,%s\n",
			policy, r.Index, req.Session, req.Conv, req.Turn, r.Prompt, engine, r.DPRank, r.DeviceHit, r.HostHit,
			best, strings.Join(probe, ";"), r.QueueMs, r.PrefillMs, r.DecodeMs, r.Latency.Microseconds(), r.Decision.Microseconds(), errText)
		if err != nil {
			return fmt.Errorf("trace: %w", err)
		}
	}
	if err := t.w.Flush(); err != nil {
		return fmt.Errorf("trace: %w", err)
	}
	return nil
}

func (t *traceWriter) close() { _ = t.f.Close() }
