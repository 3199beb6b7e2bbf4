//go:build !amd64 || purego

package server

// machineClassifiers: there is no assembly here.
func machineClassifiers() map[string]func(*idClasses, []byte) { return nil }

// vectorIDs: takeIDs takes none here.
func vectorIDs() bool { return false }
