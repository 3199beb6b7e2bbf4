package server

import (
	"net/http"
	"net/http/pprof"
	"strconv"
)

// maxProfileSeconds bounds a profile's or trace's ?seconds=: the process
// has one CPU profiler, which a profile holds for its whole length, and
// the internal listener has no write timeout to end it.
const maxProfileSeconds = 300

// pprofRoutes serves the Go profiler under /debug/pprof/, behind the
// internal token like every internal route: profiles show memory and
// call paths, which an operator needs and an outsider must not get.
func (s *Server) pprofRoutes() {
	guard := func(h http.HandlerFunc) http.HandlerFunc {
		return allow(http.MethodGet, func(w http.ResponseWriter, r *http.Request) {
			if ok, why := s.authorized(r); !ok {
				s.reject(w, r, http.StatusUnauthorized, why)
				return
			}
			// Every profile taking seconds (profile, trace, and the
			// delta of heap, allocs and the rest) is bounded.
			if v := r.URL.Query().Get("seconds"); v != "" {
				if n, err := strconv.Atoi(v); err != nil || n < 1 || n > maxProfileSeconds {
					writeError(w, http.StatusBadRequest, "seconds="+strconv.Quote(v)+": must be an integer in [1, "+
						strconv.Itoa(maxProfileSeconds)+"]")
					return
				}
			}
			h(w, r)
		})
	}
	s.internal.HandleFunc("/debug/pprof/", guard(pprof.Index))
	s.internal.HandleFunc("/debug/pprof/cmdline", guard(pprof.Cmdline))
	s.internal.HandleFunc("/debug/pprof/profile", guard(pprof.Profile))
	s.internal.HandleFunc("/debug/pprof/symbol", guard(pprof.Symbol))
	s.internal.HandleFunc("/debug/pprof/trace", guard(pprof.Trace))
}
