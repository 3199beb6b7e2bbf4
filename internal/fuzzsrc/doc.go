// Package fuzzsrc owns Source, a rand.Source that gives a fuzzer's bytes,
// so that fuzz targets can drive the random generators of randomized
// tests (event sequences, directory steps) and the fuzzer steer their
// choices. It is imported by tests only and must not be imported by
// production code.
package fuzzsrc
