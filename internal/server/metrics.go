package server

import (
	"maps"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
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

	// routes and policies keep the series of each route and policy seen,
	// so that a request finds them with one map read instead of hashing
	// its labels into each vector (WithLabelValues) several times.
	routes   seriesMap[routeSeries]
	policies seriesMap[policySeries]
}

// seriesMap maps a label value to the series kept for it. Its set of
// keys is small and fixed (mux patterns, policies), so an insert copies
// the map and readers take no lock.
type seriesMap[T any] struct {
	mu sync.Mutex
	m  atomic.Pointer[map[string]*T]
}

// get returns key's series, made by mk the first time.
func (s *seriesMap[T]) get(key string, mk func(string) *T) *T {
	if m := s.m.Load(); m != nil {
		if v, ok := (*m)[key]; ok {
			return v
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.m.Load()
	if old != nil {
		if v, ok := (*old)[key]; ok {
			return v
		}
	}
	next := map[string]*T{}
	if old != nil {
		next = maps.Clone(*old)
	}
	v := mk(key)
	next[key] = v
	s.m.Store(&next)
	return v
}

// routeSeries are one route's request series.
type routeSeries struct {
	route   string
	latency prometheus.Observer
	// codes holds the request counter of each status code from 100 to
	// 599, set the first time the code is seen.
	codes [500]atomic.Pointer[counterRef]
}

type counterRef struct{ prometheus.Counter }

// count adds one request answered with code.
func (r *routeSeries) count(requests *prometheus.CounterVec, code int) {
	if code < 100 || code > 599 {
		requests.WithLabelValues(r.route, strconv.Itoa(code)).Inc()
		return
	}
	c := r.codes[code-100].Load()
	if c == nil {
		c = &counterRef{requests.WithLabelValues(r.route, strconv.Itoa(code))}
		r.codes[code-100].Store(c)
	}
	c.Inc()
}

// policySeries are one policy's decision series.
type policySeries struct {
	byDefault, byPD    prometheus.Counter
	decision, hitRatio prometheus.Observer
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
	p := m.policies.get(d.Policy, m.newPolicySeries)
	if d.Decode != "" {
		p.byPD.Inc()
	} else {
		p.byDefault.Inc()
	}
	p.decision.Observe(took.Seconds())
	p.hitRatio.Observe(d.HitRatio)
}

func (m *httpMetrics) newPolicySeries(policy string) *policySeries {
	return &policySeries{
		byDefault: m.decisions.WithLabelValues(policy, "default"),
		byPD:      m.decisions.WithLabelValues(policy, "pd"),
		decision:  m.decision.WithLabelValues(policy),
		hitRatio:  m.hitRatio.WithLabelValues(policy),
	}
}

func (m *httpMetrics) newRouteSeries(route string) *routeSeries {
	return &routeSeries{route: route, latency: m.latency.WithLabelValues(route)}
}

// instrument counts and times every request by its mux pattern, so the
// route label has a fixed, small set of values.
func (m *httpMetrics) instrument(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		// A handler that aborts its answer (http.ErrAbortHandler: the
		// engine's answer broke off while it was relayed) is counted as
		// a 502, whatever status went out before, and the panic goes on
		// to the server, which closes the connection.
		code := http.StatusBadGateway
		defer func() {
			route := r.Pattern
			if route == "" {
				route = "unmatched"
			}
			rs := m.routes.get(route, m.newRouteSeries)
			rs.count(m.requests, code)
			rs.latency.Observe(time.Since(start).Seconds())
		}()
		if sr, ok := w.(statusReporter); ok {
			next.ServeHTTP(w, r)
			code = http.StatusOK
			if c := sr.sentStatus(); c != 0 {
				code = c
			}
		} else {
			rec := &statusRecorder{ResponseWriter: w, code: http.StatusOK}
			next.ServeHTTP(rec, r)
			code = rec.code
		}
	})
}

// statusReporter is a ResponseWriter that tells the final status it
// sent (kvcar's own HTTP/1 server's), so that instrument needs no
// wrapper of its own, which would cost an allocation a request.
type statusReporter interface {
	http.ResponseWriter
	// sentStatus is the final status sent, 0 while none was.
	sentStatus() int
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
