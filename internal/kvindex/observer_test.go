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
// mirror, and checks after every event that the mirror never shows a key
// on a tier no entry holding it is on, and shows exactly the model's tiers
// for every key no two entries have held at once; that a KeyLookup gives
// the model's union of tiers per content key; and that ForEachKey gives
// each entry's own tiers. The directory's shared key table is such a
// mirror (R-IDX-3, R-DIR-4), so a missed or stale call would be a wrong
// query answer, and a tier shown that no entry holds an over-report
// (R-DIR-1). Every call that takes a tier away from a key must say so
// (dropped) unless another entry holding the key is still on that tier
// once the event is applied: the directory writes the other calls late,
// together, and a drop written late would report a block the engine no
// longer holds.
func TestObserverMirrorsKeyTiers(t *testing.T) {
	const bs = 2
	sharedSeen := 0
	for seed := uint64(1); seed <= 16; seed++ {
		cfg := Config{BlockSize: bs, HashSeed: 7 + seed, MaxBlocks: 8 + int(seed%4)*8}
		ix := New(cfg)
		r := newRefModel(ix.Config())
		rng := rand.New(rand.NewPCG(seed, 0x6f6273))
		mirror := map[Key]keyTiers{}
		shared := map[Key]bool{}
		r.shared = shared
		calls, additions := 0, 0
		// lowered holds, per key, the tiers calls took away without
		// saying dropped since the last call that did.
		lowered := map[Key]keyTiers{}
		ix.SetObserver(func(k Key, d, h, dropped bool) {
			calls++
			was := mirror[k]
			if dropped {
				delete(lowered, k)
			} else {
				additions++
				if was.dev && !d || was.host && !h {
					l := lowered[k]
					lowered[k] = keyTiers{l.dev || was.dev && !d, l.host || was.host && !h}
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
			if err := compareMirror(ix, r, mirror, shared); err != nil {
				t.Fatalf("seed %d step %d after %v %v: %v", seed, step, ev.Kind, mode, err)
			}
			want := modelKeyTiers(r)
			for k, l := range lowered {
				if w := want[k]; l.dev && !w.dev || l.host && !w.host {
					t.Fatalf("seed %d step %d after %v %v: key %v lost %+v (now %+v) without dropped", seed, step, ev.Kind, mode, k, l, w)
				}
			}
			clear(lowered)
		}
		if calls == 0 || additions == 0 || additions == calls {
			t.Fatalf("seed %d: %d observer calls, %d of them additions", seed, calls, additions)
		}
		sharedSeen += len(shared)
	}
	t.Logf("%d keys held by two entries at once over all seeds", sharedSeen)
}

func compareMirror(ix *Index, r *refModel, mirror map[Key]keyTiers, shared map[Key]bool) error {
	want := modelKeyTiers(r)
	for k, g := range mirror {
		w := want[k]
		if g.dev && !w.dev || g.host && !w.host {
			return fmt.Errorf("key %v: mirror %+v, model %+v: over-reported", k, g, w)
		}
		if !shared[k] && g != w {
			return fmt.Errorf("key %v, never shared: mirror %+v, model %+v", k, g, w)
		}
	}
	var l KeyLookup
	l.Build(ix)
	for k, w := range want {
		if g := mirror[k]; !shared[k] && g != w {
			return fmt.Errorf("key %v, never shared: mirror %+v, model %+v", k, g, w)
		}
		if d, h := l.Tiers(k); (keyTiers{d, h}) != w {
			return fmt.Errorf("KeyLookup.Tiers(%v) = %v/%v, model %+v", k, d, h, w)
		}
	}
	own := map[keyTiers]map[Key]int{}
	count := func(k Key, t keyTiers, d int) {
		if own[t] == nil {
			own[t] = map[Key]int{}
		}
		if own[t][k] += d; own[t][k] == 0 {
			delete(own[t], k)
		}
	}
	for _, e := range r.entries {
		if !e.unkeyed && (e.dev || e.host) {
			count(e.key, keyTiers{e.dev, e.host}, 1)
		}
	}
	ix.ForEachKey(func(k Key, d, h bool) { count(k, keyTiers{d, h}, -1) })
	for t, m := range own {
		for k, n := range m {
			return fmt.Errorf("key %v on %+v: model has %d more entries than ForEachKey", k, t, n)
		}
	}
	return nil
}
