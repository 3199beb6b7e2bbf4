package kvindex

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

type keyTiers struct{ dev, host bool }

// modelKeyTiers is the union of tiers per content key in the model.
func modelKeyTiers(r *refModel) map[Key]keyTiers {
	out := map[Key]keyTiers{}
	for _, e := range r.entries {
		if e.unkeyed {
			continue
		}
		t := out[e.key]
		t.dev, t.host = t.dev || e.dev, t.host || e.host
		if t.dev || t.host {
			out[e.key] = t
		}
	}
	return out
}

// TestObserverMirrorsKeyTiers drives random event sequences (those of
// TestAgainstReferenceModel) with an observer that keeps a key → tiers
// mirror, and checks after every event that the mirror, KeyTiers and
// ForEachKey all equal the reference model's union of tiers per content
// key. The directory's shared key table is such a mirror (R-IDX-3,
// R-DIR-4), so a missed or stale call would be a wrong query answer.
// Every call that takes a tier away from a key must say so (dropped): the
// directory writes the other calls late, together, and a drop written
// late would report a block the engine no longer holds (R-DIR-1).
func TestObserverMirrorsKeyTiers(t *testing.T) {
	const bs = 2
	for seed := uint64(1); seed <= 16; seed++ {
		cfg := Config{BlockSize: bs, HashSeed: 7 + seed, MaxBlocks: 8 + int(seed%4)*8}
		ix := New(cfg)
		r := newRefModel(ix.Config())
		rng := rand.New(rand.NewPCG(seed, 0x6f6273))
		mirror := map[Key]keyTiers{}
		calls, additions := 0, 0
		var unflagged error
		ix.SetObserver(func(k Key, d, h, dropped bool) {
			calls++
			was := mirror[k]
			if !dropped {
				additions++
				if (was.dev && !d || was.host && !h) && unflagged == nil {
					unflagged = fmt.Errorf("key %v went from %+v to %v/%v without dropped", k, was, d, h)
				}
			}
			if d || h {
				mirror[k] = keyTiers{d, h}
			} else {
				delete(mirror, k)
			}
		})
		for step := 0; step < 1500; step++ {
			ev, mode := randomEvent(rng, r, bs)
			err, merr := ix.Apply(ev, mode), r.apply(ev, mode)
			if sentinel(err) != sentinel(merr) {
				t.Fatalf("seed %d step %d: err %v, model %v", seed, step, err, merr)
			}
			if err := compareMirror(ix, r, mirror); err != nil {
				t.Fatalf("seed %d step %d after %v %v: %v", seed, step, ev.Kind, mode, err)
			}
			if unflagged != nil {
				t.Fatalf("seed %d step %d after %v %v: %v", seed, step, ev.Kind, mode, unflagged)
			}
		}
		if calls == 0 || additions == 0 || additions == calls {
			t.Fatalf("seed %d: %d observer calls, %d of them additions", seed, calls, additions)
		}
	}
}

func compareMirror(ix *Index, r *refModel, mirror map[Key]keyTiers) error {
	want := modelKeyTiers(r)
	if len(mirror) != len(want) {
		return fmt.Errorf("mirror holds %d keys, model %d", len(mirror), len(want))
	}
	for k, w := range want {
		if g := mirror[k]; g != w {
			return fmt.Errorf("key %v: mirror %+v, model %+v", k, g, w)
		}
		if d, h := ix.KeyTiers(k); (keyTiers{d, h}) != w {
			return fmt.Errorf("KeyTiers(%v) = %v/%v, model %+v", k, d, h, w)
		}
	}
	var bad error
	ix.ForEachKey(func(k Key, d, h bool) {
		if w := want[k]; (keyTiers{d, h}) != w && bad == nil {
			bad = fmt.Errorf("ForEachKey %v: %v/%v, model %+v", k, d, h, w)
		}
	})
	return bad
}
