package server

import (
	"net/http"
	"strings"
)

// routes registers the routes of both listeners. The public handler has
// what an inference client needs and a load balancer probes; everything
// that reveals the fleet (instances, streams, engine addresses in
// metrics labels, profiles) or changes what routing believes (heartbeats)
// is internal, so that it can be kept off the network a client reaches.
func (s *Server) routes() {
	for _, m := range []*http.ServeMux{s.public, s.internal} {
		m.HandleFunc("/health", allow("GET", s.handleHealth))
		m.HandleFunc("/ready", allow("GET", s.handleReady))
	}
	s.public.HandleFunc(CompletionsPath, allow("POST", s.handleInference))
	s.public.HandleFunc(ChatCompletionsPath, allow("POST", s.handleInference))
	s.public.HandleFunc(ModelsPath, allow("GET", s.handleModels))
	// An operator used to finding these on the service port is told where
	// they went instead of getting a bare 404.
	for _, p := range []string{"/v1/internal/", "/debug/", "/metrics"} {
		s.public.HandleFunc(p, notPublic)
	}

	s.internal.HandleFunc(QueryPath, allow("POST", s.handleQuery))
	s.internal.HandleFunc(HeartbeatPath, allow("POST", s.handleHeartbeat))
	s.internal.HandleFunc(StreamsPath, allow("GET", s.handleStreams))
	s.internal.HandleFunc(InstancesPath, allow("GET", s.handleInstances))
	s.internal.HandleFunc(StatusPagePath, allow("GET", s.handleStatusPage))
	// Only the bare root: a catch-all "/" would turn every unknown path
	// into a redirect and hide 404s.
	s.internal.HandleFunc("/{$}", allow("GET", s.handleRoot))
	if s.gatherer != nil {
		s.internal.HandleFunc("/metrics", allow(http.MethodGet, s.handleMetrics(metricsHandler(s.gatherer))))
	}
	s.pprofRoutes()
}

// Handler returns the public routes: the OpenAI-compatible request path,
// /health and /ready.
func (s *Server) Handler() http.Handler { return s.instrument(s.public) }

// InternalHandler returns the internal routes: the query API, heartbeat
// intake, the operator routes and status page, /metrics, the profiler,
// and /health and /ready again. Every one of them but /health and /ready
// requires the internal token when one is set.
func (s *Server) InternalHandler() http.Handler { return s.instrument(s.internal) }

func (s *Server) instrument(h http.Handler) http.Handler {
	if s.metrics != nil {
		return s.metrics.instrument(h)
	}
	return h
}

func notPublic(w http.ResponseWriter, r *http.Request) {
	writeError(w, http.StatusNotFound, r.URL.Path+" is served on kvcar's internal listener, not on this port")
}

// handleMetrics guards /metrics with the internal token, which it also
// takes as "Authorization: Bearer <token>": that is the header Prometheus
// sends from a scrape job's authorization settings.
func (s *Server) handleMetrics(next http.Handler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if ok, why := s.metricsAuthorized(r); !ok {
			s.reject(w, r, http.StatusUnauthorized, why)
			return
		}
		next.ServeHTTP(w, r)
	}
}

// metricsAuthorized is authorized, with a bearer token accepted when no
// X-Internal-Token header is sent.
func (s *Server) metricsAuthorized(r *http.Request) (bool, string) {
	if !s.tokenSet {
		return true, ""
	}
	if _, present := r.Header["X-Internal-Token"]; present {
		return s.authorized(r)
	}
	got := r.Header.Values("Authorization")
	if len(got) == 0 {
		return false, "missing X-Internal-Token or Authorization: Bearer header"
	}
	scheme, cred, _ := strings.Cut(got[0], " ")
	if !strings.EqualFold(scheme, "Bearer") || !s.tokenMatches([]string{strings.TrimSpace(cred)}) || len(got) != 1 {
		return false, "invalid Authorization header"
	}
	return true, ""
}
