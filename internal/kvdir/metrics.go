package kvdir

import (
	"math"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvcar/kvcar/internal/kvevent"
)

// metrics are the directory's Prometheus series. Counters and gauges are
// read from the streams' own counters at scrape time, so the event path
// pays nothing for them; only the two latency histograms and the
// calibration drift are observed as they happen.
type metrics struct {
	snapshotSeconds *prometheus.HistogramVec
	eventLag        *prometheus.HistogramVec
	calibration     *prometheus.CounterVec
}

// streamObservers are one stream's pre-bound series, so an observation
// costs no label lookup.
type streamObservers struct {
	snapshot   prometheus.Observer
	lag        prometheus.Observer
	calAdded   prometheus.Counter
	calRemoved prometheus.Counter
}

var streamLabels = []string{"instance", "dp_rank"}

func newMetrics(reg prometheus.Registerer, d *Directory) *metrics {
	m := &metrics{
		snapshotSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvcar_stream_snapshot_duration_seconds",
			Help:    "Time from snapshot request to publish of successful snapshots.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, streamLabels),
		eventLag: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvcar_stream_event_lag_seconds",
			Help:    "Freshness of live events: engine batch timestamp to applied in the directory (includes clock skew).",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 5},
		}, streamLabels),
		calibration: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvcar_stream_calibration_blocks_total",
			Help: "Block replicas a periodic calibration snapshot found that the live view lacked (added) or held in excess (removed): lost-event drift.",
		}, []string{"instance", "dp_rank", "change"}),
	}
	reg.MustRegister(m.snapshotSeconds, m.eventLag, m.calibration, &streamCollector{d: d})
	return m
}

func (m *metrics) observers(spec StreamSpec) *streamObservers {
	if m == nil {
		return nil
	}
	dp := strconv.Itoa(spec.DPRank)
	return &streamObservers{
		snapshot:   m.snapshotSeconds.WithLabelValues(spec.InstanceName, dp),
		lag:        m.eventLag.WithLabelValues(spec.InstanceName, dp),
		calAdded:   m.calibration.WithLabelValues(spec.InstanceName, dp, "added"),
		calRemoved: m.calibration.WithLabelValues(spec.InstanceName, dp, "removed"),
	}
}

// forget drops the series of a retired stream; a replacement stream of the
// same instance and rank starts them anew.
func (m *metrics) forget(spec StreamSpec) {
	if m == nil {
		return
	}
	dp := strconv.Itoa(spec.DPRank)
	m.snapshotSeconds.DeleteLabelValues(spec.InstanceName, dp)
	m.eventLag.DeleteLabelValues(spec.InstanceName, dp)
	m.calibration.DeleteLabelValues(spec.InstanceName, dp, "added")
	m.calibration.DeleteLabelValues(spec.InstanceName, dp, "removed")
}

// observeLag observes a live batch's lag behind its engine timestamp
// ts, in seconds since the epoch. A ts that is no time (0 or less,
// infinite, NaN, which a publisher may send) is not observed: a NaN
// would make the histogram's sum NaN for good.
func (o *streamObservers) observeLag(ts float64, now time.Time) {
	if o == nil || !(ts > 0) || math.IsInf(ts, 1) {
		return
	}
	lag := float64(now.UnixNano())/1e9 - ts
	o.lag.Observe(max(lag, 0))
}

func (o *streamObservers) observeSnapshot(d time.Duration) {
	if o != nil {
		o.snapshot.Observe(d.Seconds())
	}
}

func (o *streamObservers) observeDrift(added, removed int) {
	if o != nil {
		o.calAdded.Add(float64(added))
		o.calRemoved.Add(float64(removed))
	}
}

// streamCollector reports every stream's state and counters at scrape.
type streamCollector struct{ d *Directory }

var (
	descSynced = prometheus.NewDesc("kvcar_stream_synchronized",
		"1 when the stream serves a snapshot plus contiguous deltas, 0 while it reports no hits.", streamLabels, nil)
	descSequence = prometheus.NewDesc("kvcar_stream_sequence",
		"Last live sequence number applied to the stream's view.", streamLabels, nil)
	descResident = prometheus.NewDesc("kvcar_stream_resident_blocks",
		"Blocks resident per tier in the stream's view; tiers may overlap.", append(streamLabels, "tier"), nil)
	descEvents = prometheus.NewDesc("kvcar_stream_events_applied_total",
		"KV events applied to the stream's index, live and snapshot, by type.", append(streamLabels, "type"), nil)
	descDecodeErrors = prometheus.NewDesc("kvcar_stream_decode_errors_total",
		"Messages that failed to decode; each invalidates the stream.", streamLabels, nil)
	descGaps = prometheus.NewDesc("kvcar_stream_gaps_total",
		"Sequence gaps and regressions detected on the live channel.", streamLabels, nil)
	descDisconnects = prometheus.NewDesc("kvcar_stream_disconnects_total",
		"Losses of the live channel's connection; each invalidates the stream.", streamLabels, nil)
	descSnapshots = prometheus.NewDesc("kvcar_stream_snapshots_total",
		"Snapshot attempts by result.", append(streamLabels, "result"), nil)
	descComplete = prometheus.NewDesc("kvcar_stream_complete",
		"1 when the synchronised view started from the engine's whole state; 0 when it may lack blocks stored before it began (history and live modes) or is not synchronised.", streamLabels, nil)
	descPartialStarts = prometheus.NewDesc("kvcar_stream_partial_starts_total",
		"Views (re)started without the engine's whole state: a history window that did not reach back far enough, a live stream joining late, a gap nothing could repair.", streamLabels, nil)
	descTailRepairs = prometheus.NewDesc("kvcar_stream_tail_repairs_total",
		"Batches a history calibration replayed that the live channel had lost.", streamLabels, nil)
	descBuffered = prometheus.NewDesc("kvcar_stream_buffered_bytes",
		"Live deltas held while a snapshot is in progress (wire plus decoded bytes).", streamLabels, nil)
	descStreams = prometheus.NewDesc("kvcar_streams",
		"Streams in the directory.", nil, nil)
	descLockedWalks = prometheus.NewDesc("kvcar_directory_locked_walks_total",
		"Walks of a shared key table (one per query or routing decision and block-size group) that took the table's lock after three walks without it met writes to what they read: queries and event intake contending.", nil, nil)
	descExclusions = prometheus.NewDesc("kvcar_discovery_exclusions",
		"Instances discovery does not subscribe to, by reason.", []string{"reason"}, nil)
)

func (c *streamCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descSynced, descComplete, descSequence, descResident, descEvents,
		descDecodeErrors, descGaps, descDisconnects, descSnapshots, descPartialStarts, descTailRepairs,
		descBuffered, descStreams, descLockedWalks, descExclusions} {
		ch <- d
	}
}

func (c *streamCollector) Collect(ch chan<- prometheus.Metric) {
	set := c.d.set.Load()
	ch <- prometheus.MustNewConstMetric(descStreams, prometheus.GaugeValue, float64(len(set.streams)))
	ch <- prometheus.MustNewConstMetric(descLockedWalks, prometheus.CounterValue, float64(c.d.lockedWalks.Load()))
	if ex := c.d.exclusions.Load(); ex != nil {
		for _, kind := range exclusionKinds {
			ch <- prometheus.MustNewConstMetric(descExclusions, prometheus.GaugeValue, float64((*ex)[kind]), kind)
		}
	}
	now := time.Now()
	for _, s := range set.streams {
		st := s.report(now)
		inst, dp := st.InstanceName, strconv.Itoa(st.DPRank)
		gauge := func(d *prometheus.Desc, v float64, extra ...string) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, append([]string{inst, dp}, extra...)...)
		}
		counter := func(d *prometheus.Desc, v uint64, extra ...string) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), append([]string{inst, dp}, extra...)...)
		}
		synced := 0.0
		if st.Synchronized {
			synced = 1
		}
		gauge(descSynced, synced)
		complete := 0.0
		if st.Complete {
			complete = 1
		}
		gauge(descComplete, complete)
		counter(descPartialStarts, st.PartialStarts)
		counter(descTailRepairs, st.TailRepairs)
		gauge(descSequence, float64(st.Sequence))
		gauge(descResident, float64(st.DeviceBlocks), "device")
		gauge(descResident, float64(st.HostBlocks), "host")
		gauge(descBuffered, float64(st.BufferedBytes))
		for _, k := range []kvevent.Kind{kvevent.BlockStored, kvevent.BlockRemoved, kvevent.AllBlocksCleared} {
			counter(descEvents, st.EventsByKind[k], k.String())
		}
		counter(descDecodeErrors, st.DecodeErrors)
		counter(descGaps, st.Gaps)
		counter(descDisconnects, st.Disconnects)
		counter(descSnapshots, st.SnapshotsStarted, "started")
		counter(descSnapshots, st.SnapshotsOK, "succeeded")
		counter(descSnapshots, st.SnapshotsFailed, "failed")
	}
}
