// Package layout holds no code: its test enforces the import rules of
// the module's layout (design/ARCHITECTURE.md) on the real import graph,
// read with `go list -deps -json ./...`.
//
// Every package of the module has a place in the test's table: a layer,
// and the imports it must not depend on, even indirectly. A package may
// import only packages of lower layers, so data flows one way and
// nothing imports cmd/. A package missing from the table, or a table
// entry without a package, fails the test: a new package must be placed
// before it can be merged.
//
// A second test holds the module's amd64 assembly to one rule of
// encoding: a function that uses 256- or 512-bit registers runs no
// legacy-encoded SSE instruction, which on Intel processors costs a
// state change each (asm_test.go).
//
// Nothing imports this package.
package layout
