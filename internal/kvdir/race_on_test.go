//go:build race

package kvdir

// raceEnabled: the race detector makes sync.Pool drop items at random,
// so allocation counts are not meaningful; `make test` runs the
// allocation tests again without it.
const raceEnabled = true
