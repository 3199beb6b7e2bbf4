package server

import (
	"bytes"
	"embed"
	"encoding/json"
	"fmt"
	"html/template"
	"net/http"
	"strconv"
	"time"

	"github.com/kvcar/kvcar/internal/instance"
	"github.com/kvcar/kvcar/internal/kvdir"
)

// Operator routes: read-only views of the directory's streams and the
// registry's instances, as JSON for tools and as one HTML page for people.
const (
	StreamsPath    = "/v1/internal/kv-cache/streams"
	InstancesPath  = "/v1/internal/instances"
	StatusPagePath = "/debug/kvcar"
)

// statusRefreshSeconds is how often the status page reloads itself: often
// enough to watch a recovery, rare enough to read a table between loads.
const statusRefreshSeconds = 5

// StreamLister reports the status of every stream of the directory;
// *kvdir.Directory satisfies it.
type StreamLister interface {
	Streams() []kvdir.StreamStatus
}

// InstanceLister gives the registry's current view; *instance.Registry
// satisfies it.
type InstanceLister interface {
	Snapshot() *instance.Snapshot
}

// watchReporter is the part of *instance.Registry that says whether its
// view still follows etcd; a lister without it reports no watch state.
type watchReporter interface {
	WatchState() instance.WatchState
}

//go:embed statuspage.html
var statusFiles embed.FS

// statusSources is what the operator routes read, taken from Options once
// so that a handler never has to ask whether an optional part was wired.
type statusSources struct {
	streams   StreamLister
	instances InstanceLister
	policy    string
	isMaster  func() bool
	started   time.Time
	page      *template.Template
}

func newStatusSources(opts Options) statusSources {
	src := statusSources{
		streams:   opts.Streams,
		instances: opts.Instances,
		policy:    opts.Policy,
		isMaster:  opts.IsMaster,
		started:   time.Now(),
		// The template is part of the binary: a parse error is a
		// programming error that every test run would catch first.
		page: template.Must(template.ParseFS(statusFiles, "statuspage.html")),
	}
	if src.policy == "" && opts.Router != nil {
		src.policy = opts.Router.Policy()
	}
	return src
}

// streamJSON is one entry of the streams answer. Durations are in
// milliseconds; the two "last" ones are null until the event happened,
// because 0 would read as "just now".
type streamJSON struct {
	InstanceName       string   `json:"instance_name"`
	DPRank             int      `json:"dp_rank"`
	Endpoint           string   `json:"endpoint"`
	ReplayEndpoint     string   `json:"replay_endpoint"`
	Incarnation        string   `json:"incarnation"`
	SyncMode           string   `json:"sync_mode"`
	Topic              string   `json:"topic"`
	Synchronized       bool     `json:"synchronized"`
	Complete           bool     `json:"complete"`
	Sequence           uint64   `json:"sequence"`
	Error              string   `json:"error"`
	DeviceBlocks       int      `json:"device_blocks"`
	HostBlocks         int      `json:"host_blocks"`
	BatchesApplied     uint64   `json:"batches_applied"`
	EventsApplied      uint64   `json:"events_applied"`
	DecodeErrors       uint64   `json:"decode_errors"`
	Gaps               uint64   `json:"gaps"`
	Disconnects        uint64   `json:"disconnects"`
	SnapshotsStarted   uint64   `json:"snapshots_started"`
	SnapshotsSucceeded uint64   `json:"snapshots_succeeded"`
	SnapshotsFailed    uint64   `json:"snapshots_failed"`
	PartialStarts      uint64   `json:"partial_starts"`
	TailRepairs        uint64   `json:"tail_repairs"`
	BufferedBytes      int64    `json:"buffered_bytes"`
	LastSnapshotMs     *float64 `json:"last_snapshot_ms"`
	LastEventAgeMs     *float64 `json:"last_event_age_ms"`
}

type streamsJSON struct {
	// Streams is never null, so that clients can range over it without
	// a nil check when the index is disabled.
	Streams      []streamJSON `json:"streams"`
	IndexEnabled bool         `json:"index_enabled"`
}

// instanceJSON is one entry of the instances answer.
type instanceJSON struct {
	Name               string   `json:"name"`
	Type               string   `json:"type"`
	Role               string   `json:"role"`
	State              string   `json:"state"`
	StateAgeMs         float64  `json:"state_age_ms"`
	Incarnation        string   `json:"incarnation"`
	DPSize             int      `json:"dp_size"`
	HasLoad            bool     `json:"has_load"`
	LoadValid          bool     `json:"load_valid"`
	Waiting            uint64   `json:"waiting"`
	GPUCacheUsagePerc  float64  `json:"gpu_cache_usage_perc"`
	LoadSource         string   `json:"load_source"`
	LastHeartbeatAgeMs *float64 `json:"last_heartbeat_age_ms"`
}

type instancesJSON struct {
	Instances       []instanceJSON `json:"instances"`
	RegistryEnabled bool           `json:"registry_enabled"`
	Synced          bool           `json:"synced"`
	Version         uint64         `json:"version"`
	IsMaster        bool           `json:"is_master"`
	Watch           *watchJSON     `json:"watch,omitempty"`
}

// watchJSON is instance.WatchState: live is false while the last snapshot
// is served without etcd (a failed or stalled watch).
type watchJSON struct {
	Live             bool     `json:"live"`
	LastContactAgeMs *float64 `json:"last_contact_age_ms"`
	Listings         uint64   `json:"listings"`
	Stalls           uint64   `json:"stalls"`
}

func (src statusSources) watch(now time.Time) *watchJSON {
	wr, ok := src.instances.(watchReporter)
	if !ok {
		return nil
	}
	ws := wr.WatchState()
	w := &watchJSON{Live: ws.Live, Listings: ws.Listings, Stalls: ws.Stalls}
	if !ws.LastContact.IsZero() {
		w.LastContactAgeMs = optionalMs(max(now.Sub(ws.LastContact), time.Nanosecond))
	}
	return w
}

// handleStreams serves GET /v1/internal/kv-cache/streams, with the query
// API's token and readiness rules (R-API-1, R-API-2).
func (s *Server) handleStreams(w http.ResponseWriter, r *http.Request) {
	if !s.internalReadable(w, r) {
		return
	}
	out := streamsJSON{Streams: []streamJSON{}, IndexEnabled: s.status.streams != nil}
	if s.status.streams != nil {
		for _, st := range s.status.streams.Streams() {
			out.Streams = append(out.Streams, streamToJSON(st))
		}
	}
	s.writeValue(w, out)
}

// handleInstances serves GET /v1/internal/instances with the same rules.
func (s *Server) handleInstances(w http.ResponseWriter, r *http.Request) {
	if !s.internalReadable(w, r) {
		return
	}
	out := instancesJSON{Instances: []instanceJSON{}, RegistryEnabled: s.status.instances != nil}
	if snap := s.snapshot(); snap != nil {
		now := time.Now()
		out.Synced, out.Version = snap.Synced, snap.Version
		for i := range snap.Instances {
			out.Instances = append(out.Instances, instanceToJSON(&snap.Instances[i], now))
		}
	}
	out.IsMaster = s.status.isMaster != nil && s.status.isMaster()
	out.Watch = s.status.watch(time.Now())
	s.writeValue(w, out)
}

// internalReadable applies the query API's rules to a read-only internal
// route and answers the request itself when they refuse it.
func (s *Server) internalReadable(w http.ResponseWriter, r *http.Request) bool {
	if ok, why := s.authorized(r); !ok {
		s.reject(w, r, http.StatusUnauthorized, why)
		return false
	}
	if !s.ready.Load() {
		w.Header().Set("Retry-After", "1")
		s.reject(w, r, http.StatusServiceUnavailable, s.notReadyMessage())
		return false
	}
	return true
}

func (s *Server) snapshot() *instance.Snapshot {
	if s.status.instances == nil {
		return nil
	}
	return s.status.instances.Snapshot()
}

func (s *Server) writeValue(w http.ResponseWriter, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		// Only plain fields are encoded; this cannot fail short of a bug.
		s.log.Error("status encoding failed", "err", err)
		writeError(w, http.StatusInternalServerError, "encoding the answer failed")
		return
	}
	writeJSON(w, http.StatusOK, append(b, '\n'))
}

func streamToJSON(st kvdir.StreamStatus) streamJSON {
	return streamJSON{
		InstanceName:       st.InstanceName,
		DPRank:             st.DPRank,
		Endpoint:           st.Endpoint,
		ReplayEndpoint:     st.ReplayEndpoint,
		Incarnation:        st.Incarnation,
		SyncMode:           st.SyncMode,
		Topic:              st.Topic,
		Synchronized:       st.Synchronized,
		Complete:           st.Complete,
		Sequence:           st.Sequence,
		Error:              st.Error,
		DeviceBlocks:       st.DeviceBlocks,
		HostBlocks:         st.HostBlocks,
		BatchesApplied:     st.BatchesApplied,
		EventsApplied:      st.EventsApplied,
		DecodeErrors:       st.DecodeErrors,
		Gaps:               st.Gaps,
		Disconnects:        st.Disconnects,
		SnapshotsStarted:   st.SnapshotsStarted,
		SnapshotsSucceeded: st.SnapshotsOK,
		SnapshotsFailed:    st.SnapshotsFailed,
		PartialStarts:      st.PartialStarts,
		TailRepairs:        st.TailRepairs,
		BufferedBytes:      st.BufferedBytes,
		LastSnapshotMs:     optionalMs(st.LastSnapshot),
		LastEventAgeMs:     optionalMs(st.LastEventAge),
	}
}

func instanceToJSON(in *instance.Instance, now time.Time) instanceJSON {
	out := instanceJSON{
		Name:              in.Name(),
		Type:              in.Type.String(),
		Role:              in.Role.String(),
		State:             in.State.String(),
		StateAgeMs:        durationMs(max(now.Sub(in.StateSince), 0)),
		Incarnation:       in.Incarnation(),
		DPSize:            in.Meta.DPSize,
		HasLoad:           in.HasLoad,
		LoadValid:         in.LoadValid,
		Waiting:           in.Load.WaitingRequests,
		GPUCacheUsagePerc: in.Load.GPUCacheUsagePerc,
		LoadSource:        in.LoadSource.String(),
	}
	if !in.LastHeartbeat.IsZero() {
		out.LastHeartbeatAgeMs = optionalMs(max(now.Sub(in.LastHeartbeat), time.Nanosecond))
	}
	return out
}

// durationMs rounds to microseconds: finer digits are noise in a status
// answer and only make it longer.
func durationMs(d time.Duration) float64 {
	return float64(d.Round(time.Microsecond)) / float64(time.Millisecond)
}

func optionalMs(d time.Duration) *float64 {
	if d <= 0 {
		return nil
	}
	v := durationMs(d)
	return &v
}

// pageAuthorized is authorized for the status page, which also takes the
// token as the "token" query parameter because a browser cannot easily
// send a header. A header, when present, is the one that counts.
func (s *Server) pageAuthorized(r *http.Request) (bool, string) {
	if !s.tokenSet {
		return true, ""
	}
	if _, present := r.Header["X-Internal-Token"]; present {
		return s.authorized(r)
	}
	got, present := r.URL.Query()["token"]
	if !present || len(got) == 0 {
		return false, "missing X-Internal-Token header or token query parameter"
	}
	if !s.tokenMatches(got) {
		return false, "invalid token query parameter"
	}
	return true, ""
}

// handleRoot sends a browser opened on the service's address to the
// status page, keeping the query so that ?token= still applies.
func (s *Server) handleRoot(w http.ResponseWriter, r *http.Request) {
	target := StatusPagePath
	if r.URL.RawQuery != "" {
		target += "?" + r.URL.RawQuery
	}
	w.Header().Set("Referrer-Policy", "no-referrer")
	http.Redirect(w, r, target, http.StatusFound)
}

// handleStatusPage serves GET /debug/kvcar. Before the service is ready
// the page is still rendered, since an operator wants to see why, but
// with 503 so that a probe pointed at it is not misled.
func (s *Server) handleStatusPage(w http.ResponseWriter, r *http.Request) {
	if ok, why := s.pageAuthorized(r); !ok {
		s.reject(w, r, http.StatusUnauthorized, why)
		return
	}
	var buf bytes.Buffer
	// Rendered in full before anything is sent, so that a failure is a
	// clean 500 rather than half a page.
	if err := s.status.page.Execute(&buf, s.pageData()); err != nil {
		s.log.Error("status page rendering failed", "err", err)
		writeError(w, http.StatusInternalServerError, "rendering the status page failed")
		return
	}
	code := http.StatusOK
	if !s.ready.Load() {
		code = http.StatusServiceUnavailable
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Content-Length", strconv.Itoa(buf.Len()))
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	// The URL may carry the token: never let it leave in a Referer, and
	// let the page run no script and load nothing from elsewhere.
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'none'; form-action 'none'")
	h.Set("X-Frame-Options", "DENY")
	w.WriteHeader(code)
	// A failed write means the browser went away; there is nobody to tell.
	_, _ = w.Write(buf.Bytes())
}

// statusPage is what the template shows; every value is already a
// display string or a flag, so the template holds no logic beyond layout.
type statusPage struct {
	RefreshSeconds int
	Policy         string
	MasterKnown    bool
	Master         bool
	Ready          bool
	// NotReady says what the service waits for while it is not ready.
	NotReady        string
	IndexEnabled    bool
	RegistryEnabled bool
	RegistrySynced  bool
	// RegistryStale is how long etcd has been silent to a registry whose
	// watch failed or stalled; empty while it follows etcd.
	RegistryStale string
	Generated     string
	Uptime        string
	Streams       []streamRow
	SyncedStreams int
	Instances     []instanceRow
}

type streamRow struct {
	Instance    string
	DPRank      int
	Endpoint    string
	Incarnation string
	// IncarnationShort fits a table cell; the full id is in a tooltip.
	IncarnationShort string
	Synced           bool
	Reason           string
	// SyncMode and Complete tell an operator whether a synchronised
	// view can lack blocks the engine stored before kvcar joined
	// (history and live modes start partial).
	SyncMode     string
	Complete     bool
	Sequence     uint64
	Lag          string
	DeviceBlocks int
	HostBlocks   int
	Events       uint64
	SnapshotsOK  uint64
	SnapshotsBad uint64
	LastSnapshot string
	Gaps         uint64
	DecodeErrors uint64
	Buffered     string
}

type instanceRow struct {
	Name             string
	Type             string
	Role             string
	State            string
	StateClass       string
	StateFor         string
	Incarnation      string
	IncarnationShort string
	DPSize           int
	HasLoad          bool
	LoadValid        bool
	Waiting          uint64
	GPUCacheUsage    string
	LoadSource       string
	LastHeartbeat    string
}

// pageData reads the sources first and the clock after, so that an age is
// never negative because a heartbeat landed between the two.
func (s *Server) pageData() statusPage {
	var streams []kvdir.StreamStatus
	if s.status.streams != nil {
		streams = s.status.streams.Streams()
	}
	snap := s.snapshot()
	now := time.Now()
	p := statusPage{
		RefreshSeconds:  statusRefreshSeconds,
		Policy:          s.status.policy,
		MasterKnown:     s.status.isMaster != nil,
		Ready:           s.ready.Load(),
		NotReady:        s.notReadyReason(),
		IndexEnabled:    s.status.streams != nil,
		RegistryEnabled: s.status.instances != nil,
		Generated:       now.UTC().Format("2006-01-02 15:04:05 UTC"),
		Uptime:          humanDuration(now.Sub(s.status.started)),
	}
	if p.MasterKnown {
		p.Master = s.status.isMaster()
	}
	for _, st := range streams {
		if st.Synchronized {
			p.SyncedStreams++
		}
		p.Streams = append(p.Streams, streamRow{
			Instance:         st.InstanceName,
			DPRank:           st.DPRank,
			Endpoint:         st.Endpoint,
			Incarnation:      st.Incarnation,
			IncarnationShort: shorten(st.Incarnation),
			Synced:           st.Synchronized,
			Reason:           st.Error,
			SyncMode:         st.SyncMode,
			Complete:         st.Complete,
			Sequence:         st.Sequence,
			Lag:              ageOrDash(st.LastEventAge),
			DeviceBlocks:     st.DeviceBlocks,
			HostBlocks:       st.HostBlocks,
			Events:           st.EventsApplied,
			SnapshotsOK:      st.SnapshotsOK,
			SnapshotsBad:     st.SnapshotsFailed,
			LastSnapshot:     durationOrDash(st.LastSnapshot),
			Gaps:             st.Gaps,
			DecodeErrors:     st.DecodeErrors,
			Buffered:         humanBytes(st.BufferedBytes),
		})
	}
	if w := s.status.watch(now); w != nil && !w.Live && w.LastContactAgeMs != nil {
		p.RegistryStale = humanDuration(time.Duration(*w.LastContactAgeMs * float64(time.Millisecond)))
	}
	if snap != nil {
		p.RegistrySynced = snap.Synced
		for i := range snap.Instances {
			in := &snap.Instances[i]
			row := instanceRow{
				Name:             in.Name(),
				Type:             in.Type.String(),
				Role:             in.Role.String(),
				State:            in.State.String(),
				StateClass:       stateClass(in.State),
				StateFor:         humanDuration(now.Sub(in.StateSince)),
				Incarnation:      in.Incarnation(),
				IncarnationShort: shorten(in.Incarnation()),
				DPSize:           in.Meta.DPSize,
				HasLoad:          in.HasLoad,
				LoadValid:        in.LoadValid,
				Waiting:          in.Load.WaitingRequests,
				GPUCacheUsage:    strconv.FormatFloat(in.Load.GPUCacheUsagePerc*100, 'f', 1, 64) + "%",
				LoadSource:       in.LoadSource.String(),
				LastHeartbeat:    "never",
			}
			if !in.LastHeartbeat.IsZero() {
				row.LastHeartbeat = ago(now.Sub(in.LastHeartbeat))
			}
			p.Instances = append(p.Instances, row)
		}
	}
	return p
}

// stateClass names the badge colour of a registry state: schedulable and
// healthy, schedulable on borrowed time, or not schedulable.
func stateClass(st instance.State) string {
	switch st {
	case instance.Active:
		return "ok"
	case instance.LeaseLost:
		return "warn"
	}
	return "bad"
}

func ageOrDash(d time.Duration) string {
	if d <= 0 {
		return "—"
	}
	return ago(d)
}

// ago words an age; below a millisecond the clock's resolution makes
// digits meaningless.
func ago(d time.Duration) string {
	if d < time.Millisecond {
		return "just now"
	}
	return humanDuration(d) + " ago"
}

func durationOrDash(d time.Duration) string {
	if d <= 0 {
		return "—"
	}
	return humanDuration(d)
}

// humanDuration keeps two or three significant digits: an operator reads
// "850 ms" or "4.2 s" at a glance, not "4.213371s".
func humanDuration(d time.Duration) string {
	switch {
	case d < 0:
		d = 0
		fallthrough
	case d < time.Millisecond:
		return strconv.FormatInt(d.Microseconds(), 10) + " µs"
	case d < time.Second:
		return strconv.FormatInt(d.Milliseconds(), 10) + " ms"
	case d < time.Minute:
		return strconv.FormatFloat(d.Seconds(), 'f', 1, 64) + " s"
	case d < time.Hour:
		return fmt.Sprintf("%dm %02ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh %02dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd %02dh", int(d.Hours())/24, int(d.Hours())%24)
}

func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return strconv.FormatInt(n, 10) + " B"
	}
	v, suffix := float64(n)/unit, "KiB"
	for _, next := range []string{"MiB", "GiB", "TiB"} {
		if v < unit {
			break
		}
		v, suffix = v/unit, next
	}
	return strconv.FormatFloat(v, 'f', 1, 64) + " " + suffix
}

// shorten keeps the first 12 characters of an identifier: enough to tell
// incarnations apart by eye.
func shorten(id string) string {
	const keep = 12
	if r := []rune(id); len(r) > keep {
		return string(r[:keep]) + "…"
	}
	return id
}
