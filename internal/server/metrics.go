package server

import (
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvcar/kvcar/internal/lb"
)

// httpMetrics are the service's request and routing series.
type httpMetrics struct {
	requests  *prometheus.CounterVec
	latency   *prometheus.HistogramVec
	decisions *prometheus.CounterVec
	decision  *prometheus.HistogramVec
	hitRatio  *prometheus.HistogramVec
}

func newHTTPMetrics(reg prometheus.Registerer) *httpMetrics {
	m := &httpMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvcar_http_requests_total",
			Help: "HTTP requests by route and status code.",
		}, []string{"route", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvcar_http_request_duration_seconds",
			Help:    "HTTP request latency by route, to the end of the response (streams included).",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 12),
		}, []string{"route"}),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvcar_routing_decisions_total",
			Help: "Routing decisions by policy and by the role of the chosen pair: default (a DEFAULT alone) or pd (prefill and decode).",
		}, []string{"policy", "role"}),
		decision: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvcar_routing_decision_seconds",
			Help:    "Time to make a routing decision (in-process: registry snapshot and directory).",
			Buckets: prometheus.ExponentialBuckets(0.000001, 2.5, 12),
		}, []string{"policy"}),
		hitRatio: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvcar_routing_hit_ratio",
			Help:    "Prefix hit ratio of the chosen prefill instance (CAR).",
			Buckets: []float64{0, .1, .2, .3, .4, .5, .6, .7, .8, .9, .95, 1},
		}, []string{"policy"}),
	}
	reg.MustRegister(m.requests, m.latency, m.decisions, m.decision, m.hitRatio)
	return m
}

func (m *httpMetrics) observeDecision(d lb.Decision, took time.Duration) {
	role := "default"
	if d.Decode != "" {
		role = "pd"
	}
	m.decisions.WithLabelValues(d.Policy, role).Inc()
	m.decision.WithLabelValues(d.Policy).Observe(took.Seconds())
	m.hitRatio.WithLabelValues(d.Policy).Observe(d.HitRatio)
}

// instrument counts and times every request by its mux pattern, so the
// route label has a fixed, small set of values.
func (m *httpMetrics) instrument(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec := &statusRecorder{ResponseWriter: w, code: http.StatusOK}
		next.ServeHTTP(rec, r)
		route := r.Pattern
		if route == "" {
			route = "unmatched"
		}
		m.requests.WithLabelValues(route, strconv.Itoa(rec.code)).Inc()
		m.latency.WithLabelValues(route).Observe(time.Since(start).Seconds())
	})
}

// statusRecorder remembers the status code; Unwrap keeps flushing and
// deadlines working through http.ResponseController.
type statusRecorder struct {
	http.ResponseWriter
	code        int
	wroteHeader bool
}

func (s *statusRecorder) WriteHeader(code int) {
	if !s.wroteHeader {
		s.code, s.wroteHeader = code, true
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }

func metricsHandler(g prometheus.Gatherer) http.Handler {
	return promhttp.HandlerFor(g, promhttp.HandlerOpts{})
}
