//go:build !race

package kvdir

const raceEnabled = false
