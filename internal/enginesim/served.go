package enginesim

import (
	"sync"
)

// maxServedRecords is how many requests served over baidu_std the engine
// remembers for Served.
const maxServedRecords = 4096

// servedLog remembers what the engine reported about the last requests it
// served over baidu_std. Over HTTP the report travels in the answer
// (EngineUsageField); over baidu_std the service writes the answer from
// Generations, which have no room for it, so callers ask the engine.
type servedLog struct {
	mu    sync.Mutex
	byID  map[string]EngineUsage
	order []string // ring of the ids in byID, oldest at next
	next  int
}

func (l *servedLog) put(id string, eu EngineUsage) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.byID == nil {
		l.byID = make(map[string]EngineUsage, maxServedRecords)
		l.order = make([]string, 0, maxServedRecords)
	}
	if _, ok := l.byID[id]; !ok {
		if len(l.order) < maxServedRecords {
			l.order = append(l.order, id)
		} else {
			delete(l.byID, l.order[l.next])
			l.order[l.next] = id
			l.next = (l.next + 1) % maxServedRecords
		}
	}
	l.byID[id] = eu
}

func (l *servedLog) get(id string) (EngineUsage, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	eu, ok := l.byID[id]
	return eu, ok
}

// Served returns what the engine reported about a request it prefilled
// over baidu_std, by the engine request id its output carried (the id of
// the OpenAI answer the service wrote): the same EngineUsage an HTTP
// answer carries in EngineUsageField, DecodeMs the decode it planned. It
// is recorded before the first output is sent; the last 4096 are kept.
func (e *Engine) Served(reqID string) (EngineUsage, bool) { return e.served.get(reqID) }
