package server

import (
	"crypto/sha256"
	"crypto/subtle"
	"log/slog"
	"mime"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// DefaultMaxTokenIDs bounds the ids of one query: 1M tokens is far above
// any model context in use.
const DefaultMaxTokenIDs = 1 << 20

// bytesPerTokenID is the widest compact encoding of one id, "4294967295,".
const bytesPerTokenID = 11

// bodySlack covers the object framing and moderate whitespace.
const bodySlack = 64 << 10

// readChunk is the size of the pooled buffer a body is read through.
const readChunk = 32 << 10

// QueryPath is the route of the internal KV cache query (R-API-1).
const QueryPath = "/v1/internal/kv-cache/query"

// Options configures a Server.
type Options struct {
	// Directory answers queries; nil means the index is disabled
	// (R-CFG-1) and queries return no matches.
	Directory KVDirectory
	// InternalAPIToken, when not empty, must be sent in the
	// X-Internal-Token header of every query (R-API-2).
	InternalAPIToken string
	// Logger receives request diagnostics; nil discards them.
	Logger *slog.Logger
	// MaxBodyBytes bounds a query body. Zero or less selects
	// 11 bytes per allowed id plus 64 KiB, so that MaxTokenIDs ids fit in
	// compact JSON (about 11 MiB for the default 1M ids).
	MaxBodyBytes int64
	// MaxTokenIDs bounds the ids of one query and of one completion's
	// prompt; zero or less selects DefaultMaxTokenIDs.
	MaxTokenIDs int
	// Heartbeats takes engine heartbeats; nil answers them with 503.
	Heartbeats HeartbeatSink
	// Router decides where inference requests go; nil answers them
	// with 503.
	Router Router
	// Tokenizer, when set, gives text and chat prompts their token ids
	// so they are routed by prefix too.
	Tokenizer Tokenizer
	// Dispatcher, when set, serves the requests whose prefill instance it
	// Serves (xLLM engines) over their own RPC; the others, and every
	// request without it, are relayed as OpenAI HTTP.
	Dispatcher Dispatcher
	// MaxRequestBodyBytes bounds a completion body; zero or less selects
	// DefaultMaxRequestBodyBytes. Prompt ids are bounded by MaxTokenIDs,
	// as in a query.
	MaxRequestBodyBytes int64
	// MaxInflightRequestBytes bounds the completion body bytes held at
	// once across all requests (503 with Retry-After past it); zero or
	// less selects DefaultMaxInflightRequestBytes. It is raised to admit
	// one body of MaxRequestBodyBytes.
	MaxInflightRequestBytes int64
	// MaxPromptTextBytes bounds the prompt text or chat content of one
	// request given to the Tokenizer (413 past it); zero or less selects
	// DefaultMaxPromptTextBytes.
	MaxPromptTextBytes int
	// ExposeRoutingHeaders sends the decision back to the client in the
	// X-Prefill-Name, X-Decode-Name and X-Kvcar-* headers. They name
	// engines, so they are off unless asked for.
	ExposeRoutingHeaders bool
	// Metrics, when set, receives the HTTP and routing series and is
	// served on /metrics with everything else registered in it.
	Metrics *prometheus.Registry
	// Streams lists the directory's streams for the operator routes
	// (/v1/internal/kv-cache/streams, /debug/kvcar); nil reports the
	// index as disabled.
	Streams StreamLister
	// Instances gives the registry's view for /v1/internal/instances and
	// the status page; nil shows no instances.
	Instances InstanceLister
	// Policy names the routing policy on the status page; empty takes
	// Router's.
	Policy string
	// IsMaster reports whether this replica is the master, for the
	// operator routes; nil leaves it unknown.
	IsMaster func() bool
}

// Server serves kvcar's HTTP API. Its methods are safe for concurrent use.
type Server struct {
	dir         KVDirectory
	heartbeats  HeartbeatSink
	proxy       *proxy
	metrics     *httpMetrics
	gatherer    prometheus.Gatherer
	tokenSet    bool
	tokenDigest [sha256.Size]byte
	log         *slog.Logger
	maxBody     int64
	maxIDs      int
	ready       atomic.Bool
	notReadyWhy atomic.Pointer[string]
	buffers     sync.Pool
	public      *http.ServeMux
	internal    *http.ServeMux
	status      statusSources
}

// queryBuffers are the per-request buffers reused across queries.
type queryBuffers struct {
	read    []byte
	ids     []uint32
	matches []Match
	out     []byte
}

// New returns a Server that is not yet ready: until SetReady(true) the
// query endpoint answers 503.
func New(opts Options) *Server {
	s := &Server{
		dir:        opts.Directory,
		heartbeats: opts.Heartbeats,
		log:        opts.Logger,
		maxIDs:     opts.MaxTokenIDs,
		maxBody:    opts.MaxBodyBytes,
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.maxIDs <= 0 {
		s.maxIDs = DefaultMaxTokenIDs
	}
	if s.maxBody <= 0 {
		s.maxBody = int64(s.maxIDs)*bytesPerTokenID + bodySlack
	}
	if opts.InternalAPIToken != "" {
		s.tokenSet = true
		s.tokenDigest = sha256.Sum256([]byte(opts.InternalAPIToken))
	}
	if opts.Metrics != nil {
		s.metrics = newHTTPMetrics(opts.Metrics)
		s.gatherer = opts.Metrics
	}
	if opts.Router != nil {
		s.proxy = newProxy(opts, s.maxIDs, s.log)
		if s.metrics != nil {
			s.proxy.observe = s.metrics.observeDecision
		}
	}
	s.buffers.New = func() any { return &queryBuffers{read: make([]byte, readChunk)} }
	s.status = newStatusSources(opts)
	s.public = http.NewServeMux()
	s.internal = http.NewServeMux()
	s.routes()
	return s
}

// SetReady opens (true) or closes (false) the routes that are served only
// once the service is ready (R-API-1).
func (s *Server) SetReady(ready bool) { s.ready.Store(ready) }

// allow rejects other methods with 405 and a JSON body; GET also admits
// HEAD, as probes commonly use it.
func allow(method string, h http.HandlerFunc) http.HandlerFunc {
	allowHeader := method
	if method == http.MethodGet {
		allowHeader = "GET, HEAD"
	}
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Method != method && (method != http.MethodGet || r.Method != http.MethodHead) {
			w.Header().Set("Allow", allowHeader)
			writeError(w, http.StatusMethodNotAllowed, "method "+r.Method+" not allowed; use "+allowHeader)
			return
		}
		h(w, r)
	}
}

func (s *Server) handleHealth(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, []byte(`{"status":"ok"}`+"\n"))
}

func (s *Server) handleReady(w http.ResponseWriter, _ *http.Request) {
	if !s.ready.Load() {
		writeError(w, http.StatusServiceUnavailable, s.notReadyMessage())
		return
	}
	writeJSON(w, http.StatusOK, []byte(`{"ready":true}`+"\n"))
}

// authorized checks the X-Internal-Token header when a token is set.
func (s *Server) authorized(r *http.Request) (bool, string) {
	if !s.tokenSet {
		return true, ""
	}
	got, present := r.Header["X-Internal-Token"]
	if !present || len(got) == 0 {
		return false, "missing X-Internal-Token header"
	}
	if !s.tokenMatches(got) {
		return false, "invalid X-Internal-Token header"
	}
	return true, ""
}

// tokenMatches reports whether got is exactly one value equal to the
// token. It compares digests, not the tokens themselves, so that the
// comparison time depends on neither the token's content nor its length.
func (s *Server) tokenMatches(got []string) bool {
	if len(got) == 0 {
		return false
	}
	d := sha256.Sum256([]byte(got[0]))
	return subtle.ConstantTimeCompare(d[:], s.tokenDigest[:]) == 1 && len(got) == 1
}

func (s *Server) reject(w http.ResponseWriter, r *http.Request, code int, message string) {
	s.log.Debug("kv cache query rejected", "remote", r.RemoteAddr, "status", code, "reason", message)
	writeError(w, code, message)
}

// handleQuery serves POST /v1/internal/kv-cache/query (R-API).
func (s *Server) handleQuery(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	if ok, why := s.authorized(r); !ok {
		s.reject(w, r, http.StatusUnauthorized, why)
		return
	}
	if !s.ready.Load() {
		w.Header().Set("Retry-After", "1")
		s.reject(w, r, http.StatusServiceUnavailable, s.notReadyMessage())
		return
	}
	// An absent Content-Type is taken as JSON; only a wrong one is refused.
	if ct := r.Header.Get("Content-Type"); ct != "" {
		if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
			msg := "Content-Type must be application/json or absent, got " + strconv.Quote(ct)
			if mt == "application/x-www-form-urlencoded" {
				// What curl -d sends unless told otherwise.
				msg += " (curl -d sends that: add -H 'Content-Type: application/json')"
			}
			s.reject(w, r, http.StatusUnsupportedMediaType, msg)
			return
		}
	}
	if r.ContentLength > s.maxBody {
		s.reject(w, r, http.StatusRequestEntityTooLarge, "request body exceeds "+strconv.FormatInt(s.maxBody, 10)+" bytes")
		return
	}

	buf := s.buffers.Get().(*queryBuffers)
	defer s.buffers.Put(buf)
	sc := scanner{r: http.MaxBytesReader(w, r.Body, s.maxBody), buf: buf.read, limit: s.maxBody}
	ids, perr := parseQuery(&sc, buf.ids[:0], s.maxIDs)
	buf.ids = ids[:0]
	if perr != nil {
		s.reject(w, r, perr.status, perr.message)
		return
	}

	out := append(buf.out[:0], `{"matches":`...)
	if s.dir == nil {
		out = append(out, `[],"index_enabled":false}`...)
	} else {
		ms := queryDirectory(s.dir, ids, buf.matches)
		out = appendMatches(out, ms)
		out = append(out, `,"index_enabled":true}`...)
		buf.matches = releaseMatches(ms)
	}
	out = append(out, '\n')
	buf.out = out[:0]
	// Server-Timing separates kvcar's own time (parse, lookup, encode)
	// from the network and the client in any measurement.
	w.Header().Set("Server-Timing", "kvcar;dur="+strconv.FormatFloat(float64(time.Since(start).Microseconds())/1000, 'f', 3, 64))
	writeJSON(w, http.StatusOK, out)
}
