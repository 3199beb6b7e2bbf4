package kvevent

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// batchView is the canonical, shape-independent form of a decoded batch.
// Golden files store it as JSON; hashes are hex strings because JSON
// numbers cannot carry 64 bits.
type batchView struct {
	TS     float64     `json:"ts"`
	DPRank *int        `json:"dp_rank"`
	Events []eventView `json:"events"`
}

type eventView struct {
	Type        string    `json:"type"`
	Medium      string    `json:"medium"`
	BlockHashes []hexHash `json:"block_hashes"`
	Parent      *hexHash  `json:"parent_block_hash"`
	TokenIDs    []uint32  `json:"token_ids"`
	BlockSize   int       `json:"block_size"`
	PlainText   bool      `json:"plain_text"`
}

// hexHash writes an integer hash as 16 hex digits and a 128-bit one as
// 32 (EngineHash.String).
type hexHash EngineHash

func (h hexHash) MarshalJSON() ([]byte, error) {
	return json.Marshal(EngineHash(h).String())
}

func (h *hexHash) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	digits, ok := strings.CutPrefix(s, "0x")
	if !ok || len(digits) == 0 || len(digits) > 32 {
		return fmt.Errorf("hash %q: want 0x and up to 32 hex digits", s)
	}
	var v EngineHash
	if len(digits) > 16 {
		hi, err := strconv.ParseUint(digits[:len(digits)-16], 16, 64)
		if err != nil {
			return fmt.Errorf("hash %q: %w", s, err)
		}
		v.Hi, digits = hi, digits[len(digits)-16:]
	}
	lo, err := strconv.ParseUint(digits, 16, 64)
	if err != nil {
		return fmt.Errorf("hash %q: %w", s, err)
	}
	v.Lo = lo
	*h = hexHash(v)
	return nil
}

func viewOf(b *Batch) batchView {
	v := batchView{TS: b.Timestamp, Events: []eventView{}}
	if b.HasDPRank {
		r := b.DPRank
		v.DPRank = &r
	}
	for _, ev := range b.Events {
		e := eventView{
			Type:        ev.Kind.String(),
			Medium:      ev.Medium.String(),
			BlockHashes: []hexHash{},
			TokenIDs:    []uint32{},
			BlockSize:   ev.BlockSize,
			PlainText:   ev.PlainText,
		}
		for _, h := range ev.BlockHashes {
			e.BlockHashes = append(e.BlockHashes, hexHash(h))
		}
		e.TokenIDs = append(e.TokenIDs, ev.TokenIDs...)
		if ev.HasParent {
			p := hexHash(ev.ParentHash)
			e.Parent = &p
		}
		v.Events = append(v.Events, e)
	}
	return v
}

// batchOf rebuilds a Batch from its view with the public builders.
func batchOf(v batchView) *Batch {
	b := &Batch{Timestamp: v.TS}
	if v.DPRank != nil {
		b.HasDPRank, b.DPRank = true, *v.DPRank
	}
	for _, e := range v.Events {
		m := MediumOf([]byte(e.Medium))
		hs := make([]EngineHash, len(e.BlockHashes))
		for i, h := range e.BlockHashes {
			hs[i] = EngineHash(h)
		}
		switch e.Type {
		case BlockStored.String():
			var parent EngineHash
			if e.Parent != nil {
				parent = EngineHash(*e.Parent)
			}
			b.AddStored(hs, parent, e.Parent != nil, e.TokenIDs, e.BlockSize, m)
			b.Events[len(b.Events)-1].PlainText = e.PlainText
		case BlockRemoved.String():
			b.AddRemoved(hs, m)
		case AllBlocksCleared.String():
			b.AddCleared()
		}
	}
	return b
}

func viewJSON(b *Batch) string {
	out, err := json.Marshal(viewOf(b))
	if err != nil {
		panic(err)
	}
	return string(out)
}
