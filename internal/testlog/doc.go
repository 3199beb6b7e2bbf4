// Package testlog owns Buffer, the log sink tests read while the code
// under test writes to it from other goroutines. It is imported by tests
// only and must not be imported by production code.
package testlog
