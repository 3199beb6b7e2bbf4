//go:build !amd64 || purego

package server

// classifyIDs fills m with the classes of the 64 bytes of p.
func classifyIDs(m *idClasses, p []byte) { classifyIDsGo(m, p) }
