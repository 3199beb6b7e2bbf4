// Package decodeheap measures what a protobuf message holds on the heap
// once decoded, for the tests that check a bound charged for a decode
// before it happens (baidustd's decode cost, xllmrpc's queued output).
//
// It decodes and reads the runtime's heap statistics, nothing else. It
// is imported by tests only; it must not import any kvcar package.
package decodeheap
