package main

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"
)

// vocabSize bounds the random token ids: [0, vocabSize).
const vocabSize = 150_000

// tokenRange is an inclusive range of token counts, written "lo-hi" or
// "n" on the command line.
type tokenRange struct{ lo, hi int }

func (r *tokenRange) String() string {
	if r == nil {
		return ""
	}
	if r.lo == r.hi {
		return strconv.Itoa(r.lo)
	}
	return strconv.Itoa(r.lo) + "-" + strconv.Itoa(r.hi)
}

func (r *tokenRange) Set(s string) error {
	lo, hi, found := strings.Cut(strings.TrimSpace(s), "-")
	a, err := strconv.Atoi(lo)
	if err != nil {
		return fmt.Errorf("range %q: %w", s, err)
	}
	b := a
	if found {
		if b, err = strconv.Atoi(hi); err != nil {
			return fmt.Errorf("range %q: %w", s, err)
		}
	}
	if a < 0 || b < a {
		return fmt.Errorf("range %q: want 0 <= lo <= hi", s)
	}
	r.lo, r.hi = a, b
	return nil
}

func (r tokenRange) draw(rng *rand.Rand) int { return r.lo + rng.IntN(r.hi-r.lo+1) }

// workloadConfig describes the prefix-sharing workload.
type workloadConfig struct {
	Seed uint64 `json:"seed"`
	// Systems shared system prompts of SystemTokens each.
	Systems      int        `json:"systems"`
	SystemTokens tokenRange `json:"-"`
	// Sessions multi-turn users; each turn adds UserTokens of new input,
	// and the answer of AnswerTokens (also the request's max_tokens)
	// joins the history the next turn sends.
	Sessions     int        `json:"sessions"`
	UserTokens   tokenRange `json:"-"`
	AnswerTokens tokenRange `json:"-"`
	// Requests in total, sessions interleaved at random.
	Requests int `json:"requests"`
	// MaxPromptTokens ends a conversation: a turn that would exceed it
	// starts a new one (a fresh system prompt pick and an empty history).
	MaxPromptTokens int `json:"max_prompt_tokens"`
}

func (c workloadConfig) validate() error {
	var errs []error
	if c.Systems < 1 {
		errs = append(errs, fmt.Errorf("--systems = %d: must be at least 1", c.Systems))
	}
	if c.Sessions < 1 {
		errs = append(errs, fmt.Errorf("--sessions = %d: must be at least 1", c.Sessions))
	}
	if c.Requests < 1 {
		errs = append(errs, fmt.Errorf("--requests = %d: must be at least 1", c.Requests))
	}
	if c.UserTokens.lo < 1 {
		errs = append(errs, errors.New("--user_tokens: every turn needs at least 1 new token"))
	}
	if c.AnswerTokens.lo < 1 {
		errs = append(errs, errors.New("--answer_tokens: every answer needs at least 1 token"))
	}
	if need := c.SystemTokens.hi + c.UserTokens.hi; c.MaxPromptTokens < need {
		errs = append(errs, fmt.Errorf("--max_prompt_tokens = %d: must hold the longest first turn, %d tokens", c.MaxPromptTokens, need))
	}
	return errors.Join(errs...)
}

// benchRequest is one request of the workload.
type benchRequest struct {
	Index int
	// Session is the user slot; a session's requests are sent one after
	// the other, each after the previous one has been answered.
	Session int
	// Conv numbers conversations over the whole workload; consecutive
	// requests of one conversation extend each other's prompts.
	Conv   int
	Turn   int
	System int
	Prompt []uint32
	// MaxTokens is the emulated answer's length, whose tokens begin the
	// next turn's new part.
	MaxTokens int
	// Prev is the index of the session's previous request, -1 for its
	// first.
	Prev int
}

// workload is the generated request sequence.
type workload struct {
	cfg      workloadConfig
	systems  [][]uint32
	requests []benchRequest
}

// generate builds the workload from cfg alone: the same config gives the
// same prompts, token for token.
func generate(cfg workloadConfig) (*workload, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x6b76636172)) // "kvcar"
	w := &workload{cfg: cfg, systems: make([][]uint32, cfg.Systems)}
	for i := range w.systems {
		w.systems[i] = randTokens(rng, cfg.SystemTokens.draw(rng))
	}
	type session struct {
		history []uint32
		conv    int
		turn    int
		system  int
		last    int
	}
	sessions := make([]session, cfg.Sessions)
	convs := 0
	start := func(s *session) {
		s.system = rng.IntN(cfg.Systems)
		s.history = slices.Clone(w.systems[s.system])
		s.conv, s.turn = convs, 0
		convs++
	}
	for i := range sessions {
		sessions[i].last = -1
		start(&sessions[i])
	}
	w.requests = make([]benchRequest, cfg.Requests)
	for i := range w.requests {
		si := rng.IntN(cfg.Sessions)
		s := &sessions[si]
		user := cfg.UserTokens.draw(rng)
		if len(s.history)+user > cfg.MaxPromptTokens {
			start(s)
		}
		s.history = append(s.history, randTokens(rng, user)...)
		answer := cfg.AnswerTokens.draw(rng)
		w.requests[i] = benchRequest{
			Index: i, Session: si, Conv: s.conv, Turn: s.turn, System: s.system,
			Prompt: slices.Clip(s.history), MaxTokens: answer, Prev: s.last,
		}
		// The answer joins the history behind the prompt just taken, so
		// the prompt's own tokens are never written again.
		s.history = append(s.history, randTokens(rng, answer)...)
		s.turn++
		s.last = i
	}
	return w, nil
}

// promptTokens is the sum of the prompt lengths.
func (w *workload) promptTokens() int64 {
	var n int64
	for i := range w.requests {
		n += int64(len(w.requests[i].Prompt))
	}
	return n
}

// arrivals are the open-loop send times of the requests: a Poisson
// process of rate per second from the seed (independent of the prompts).
func arrivals(seed uint64, n int, rate float64) []time.Duration {
	rng := rand.New(rand.NewPCG(seed, 0x617272)) // "arr"
	out := make([]time.Duration, n)
	var t float64
	for i := range out {
		out[i] = time.Duration(t * float64(time.Second))
		t += rng.ExpFloat64() / rate
	}
	return out
}

func randTokens(rng *rand.Rand, n int) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = uint32(rng.IntN(vocabSize))
	}
	return t
}

// idealReuse is what one cache of unbounded size would reuse serving the
// workload in order: per request, the full blocks of its prompt that an
// earlier prompt already had (prefixes as chains, as engines key them).
// No routing over several caches can do better in that order.
func (w *workload) idealReuse(blockSize int) int64 {
	type key struct {
		parent int
		block  string
	}
	ids := map[key]int{}
	var reused int64
	buf := make([]byte, 0, 4*blockSize)
	for i := range w.requests {
		p := w.requests[i].Prompt
		parent, hit := -1, true
		for b := 0; b+blockSize <= len(p); b += blockSize {
			buf = buf[:0]
			for _, t := range p[b : b+blockSize] {
				buf = append(buf, byte(t), byte(t>>8), byte(t>>16), byte(t>>24))
			}
			k := key{parent, string(buf)}
			id, ok := ids[k]
			if !ok {
				hit = false
				id = len(ids)
				ids[k] = id
			} else if hit {
				reused += int64(blockSize)
			}
			parent = id
		}
	}
	return reused
}
