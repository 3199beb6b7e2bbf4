package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
)

// TraceBlockTokens is the block size of the Mooncake traces' hash_ids:
// each id stands for 512 prompt tokens, the last one possibly fewer.
const TraceBlockTokens = 512

// Limits on a trace file, so that a wrong or hostile file costs bounded
// memory: a line holds one request, and the whole trace is kept in
// memory as hash ids (never as token ids).
const (
	maxTraceLineBytes  = 1 << 20
	maxTraceRequests   = 1 << 20
	maxTraceHashIDs    = 1 << 14 // 8 M tokens in one prompt
	maxTraceOutputLen  = 1 << 16
	maxTraceHashIDsSum = 1 << 26 // 256 MiB of ids in memory
)

// traceRequest is one line of a Mooncake trace.
type traceRequest struct {
	// Line is the 1-based line of the file, for error messages and the
	// per-request records.
	Line int
	// ArrivalMs is the trace's timestamp: milliseconds from its start.
	ArrivalMs int64
	Input     int
	Output    int
	// HashIDs name the prompt's 512-token blocks; equal ids at the same
	// position are the same prefix block.
	HashIDs []uint64
}

// fullBlocks is the number of whole 512-token blocks of the prompt: an
// engine caches only full blocks, so only these can ever be reused.
func (r *traceRequest) fullBlocks() int { return r.Input / TraceBlockTokens }

type traceLine struct {
	Timestamp    *int64   `json:"timestamp"`
	InputLength  *int     `json:"input_length"`
	OutputLength *int     `json:"output_length"`
	HashIDs      []uint64 `json:"hash_ids"`
}

// loadTrace reads a Mooncake JSONL trace. Every line must be a request
// whose input_length fits its hash_ids (more than 512 × (n−1) tokens and
// at most 512 × n), with timestamps that never go back; an error names
// the line and the field.
func loadTrace(path string) ([]traceRequest, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("trace: %w", err)
	}
	defer f.Close()
	reqs, err := parseTrace(f)
	if err != nil {
		return nil, fmt.Errorf("trace %s: %w", path, err)
	}
	return reqs, nil
}

func parseTrace(r io.Reader) ([]traceRequest, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxTraceLineBytes)
	var (
		reqs  []traceRequest
		ids   int
		prev  int64
		lineN int
	)
	for sc.Scan() {
		lineN++
		b := sc.Bytes()
		if len(b) == 0 {
			continue
		}
		if len(reqs) == maxTraceRequests {
			return nil, fmt.Errorf("line %d: more than %d requests", lineN, maxTraceRequests)
		}
		var tl traceLine
		if err := json.Unmarshal(b, &tl); err != nil {
			return nil, fmt.Errorf("line %d: %w", lineN, err)
		}
		req, err := tl.check(prev)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", lineN, err)
		}
		if ids += len(req.HashIDs); ids > maxTraceHashIDsSum {
			return nil, fmt.Errorf("line %d: more than %d hash ids in the trace", lineN, maxTraceHashIDsSum)
		}
		req.Line = lineN
		prev = req.ArrivalMs
		reqs = append(reqs, req)
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, fmt.Errorf("line %d: longer than %d bytes", lineN+1, maxTraceLineBytes)
		}
		return nil, err
	}
	if len(reqs) == 0 {
		return nil, errors.New("no requests")
	}
	return reqs, nil
}

func (tl *traceLine) check(prev int64) (traceRequest, error) {
	switch {
	case tl.Timestamp == nil:
		return traceRequest{}, errors.New("timestamp is missing")
	case tl.InputLength == nil:
		return traceRequest{}, errors.New("input_length is missing")
	case tl.OutputLength == nil:
		return traceRequest{}, errors.New("output_length is missing")
	case *tl.Timestamp < prev:
		return traceRequest{}, fmt.Errorf("timestamp %d is before the previous line's %d", *tl.Timestamp, prev)
	case len(tl.HashIDs) == 0 || len(tl.HashIDs) > maxTraceHashIDs:
		return traceRequest{}, fmt.Errorf("hash_ids has %d ids, want 1..%d", len(tl.HashIDs), maxTraceHashIDs)
	case *tl.OutputLength < 0 || *tl.OutputLength > maxTraceOutputLen:
		return traceRequest{}, fmt.Errorf("output_length %d is outside [0, %d]", *tl.OutputLength, maxTraceOutputLen)
	}
	n := len(tl.HashIDs)
	if in := *tl.InputLength; in <= TraceBlockTokens*(n-1) || in > TraceBlockTokens*n {
		return traceRequest{}, fmt.Errorf("input_length %d does not fit %d hash ids of %d tokens (want %d..%d)",
			in, n, TraceBlockTokens, TraceBlockTokens*(n-1)+1, TraceBlockTokens*n)
	}
	return traceRequest{ArrivalMs: *tl.Timestamp, Input: *tl.InputLength, Output: *tl.OutputLength, HashIDs: tl.HashIDs}, nil
}

// traceWindow returns the requests arriving in [startMs, startMs+durMs),
// all from startMs when durMs ≤ 0.
func traceWindow(reqs []traceRequest, startMs, durMs int64) []traceRequest {
	var out []traceRequest
	for _, r := range reqs {
		if r.ArrivalMs < startMs || durMs > 0 && r.ArrivalMs >= startMs+durMs {
			continue
		}
		out = append(out, r)
	}
	return out
}

// traceVocab bounds the expanded token ids (Llama 3's vocabulary size;
// the value only has to keep ids valid for any engine).
const traceVocab = 128256

// appendTokens appends the request's prompt as token ids, the trace
// README's way: each hash id becomes 512 pseudo-random ids derived from
// the id alone (so equal ids give equal tokens wherever they appear),
// concatenated and cut to input_length. With perBlock < 512 each id
// becomes the first perBlock of its 512 ids and the cut is scaled alike
// (rounded up), a prompt 512/perBlock times shorter with the same blocks.
func appendTokens(dst []uint32, r *traceRequest, perBlock int) []uint32 {
	left := r.Input
	for _, id := range r.HashIDs {
		n := min(left, TraceBlockTokens)
		dst = appendBlockTokens(dst, id, (n*perBlock+TraceBlockTokens-1)/TraceBlockTokens)
		left -= n
	}
	return dst
}

// promptLen is the length of appendTokens' prompt.
func promptLen(r *traceRequest, perBlock int) int {
	last := r.Input - (len(r.HashIDs)-1)*TraceBlockTokens
	return (len(r.HashIDs)-1)*perBlock + (last*perBlock+TraceBlockTokens-1)/TraceBlockTokens
}

// appendBlockTokens appends the first n tokens of hash id's block:
// token j is splitmix64 of id·512+j, reduced to the vocabulary.
func appendBlockTokens(dst []uint32, id uint64, n int) []uint32 {
	base := id * TraceBlockTokens
	for j := range n {
		dst = append(dst, uint32(splitmix64(base+uint64(j))%traceVocab))
	}
	return dst
}

// splitmix64 is the finaliser of Vigna's SplitMix64 generator: a
// bijective mix, so distinct inputs never collide before the reduction.
func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}
