//go:build !amd64 || purego

package xllmrpc

// packIDs writes nothing here: appendPackedIDs writes ids one by one.
func packIDs(dst *byte, ids *uint32, n int) int { return -1 }
