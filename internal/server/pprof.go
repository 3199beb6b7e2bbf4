package server

import (
	"net/http"
	"net/http/pprof"
)

// pprofRoutes serves the Go profiler under /debug/pprof/, behind the
// internal token like every internal route: profiles show memory and
// call paths, which an operator needs and an outsider must not get.
func (s *Server) pprofRoutes() {
	guard := func(h http.HandlerFunc) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			if ok, why := s.authorized(r); !ok {
				s.reject(w, r, http.StatusUnauthorized, why)
				return
			}
			h(w, r)
		}
	}
	s.internal.HandleFunc("GET /debug/pprof/", guard(pprof.Index))
	s.internal.HandleFunc("GET /debug/pprof/cmdline", guard(pprof.Cmdline))
	s.internal.HandleFunc("GET /debug/pprof/profile", guard(pprof.Profile))
	s.internal.HandleFunc("GET /debug/pprof/symbol", guard(pprof.Symbol))
	s.internal.HandleFunc("GET /debug/pprof/trace", guard(pprof.Trace))
}
