//go:build !purego

package server

// machineClassifiers are the assembly classifications this processor
// runs, each checked on its own whichever classifyIDs picks.
func machineClassifiers() map[string]func(*idClasses, []byte) {
	m := map[string]func(*idClasses, []byte){
		"classifyIDsSSE2": func(m *idClasses, p []byte) { classifyIDsSSE2(m, &p[0]) },
	}
	if idsAVX512 {
		m["classifyIDsAVX512"] = func(m *idClasses, p []byte) { classifyIDsAVX512(m, &p[0]) }
	}
	return m
}

// vectorIDs is whether takeIDs takes ids on this processor.
func vectorIDs() bool { return idsAVX512 }
