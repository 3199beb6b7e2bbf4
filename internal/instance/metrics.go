package instance

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

var (
	descInstances = prometheus.NewDesc("kvcar_instances",
		"Instances in the registry by registered type and state.", []string{"type", "state"}, nil)
	descLoaded = prometheus.NewDesc("kvcar_instances_with_load",
		"Instances with a usable load report (schedulable by CAR and SLO_AWARE).", nil, nil)
	descMaster = prometheus.NewDesc("kvcar_service_is_master",
		"1 while this replica holds XLLM:SERVICE:MASTER.", nil, nil)
	descSynced = prometheus.NewDesc("kvcar_instance_registry_synced",
		"1 while the registry follows etcd: listed, and the watch since neither failed nor stalled. "+
			"0 meanwhile: the last snapshot is served.", nil, nil)
	descContactAge = prometheus.NewDesc("kvcar_instance_registry_contact_age_seconds",
		"Seconds since etcd last answered the registry's listing or watch (events or a progress notification).", nil, nil)
	descListings = prometheus.NewDesc("kvcar_instance_registry_listings_total",
		"Listings of the registry's etcd range: the first, and one after every compaction, watch failure or stall.", nil, nil)
	descStalls = prometheus.NewDesc("kvcar_instance_registry_watch_stalls_total",
		"Registry watches abandoned because etcd answered nothing, not even progress requests, within the stall timeout.", nil, nil)
)

// Collector reports the registry's snapshot at scrape time.
func (r *Registry) Collector() prometheus.Collector { return registryCollector{r} }

type registryCollector struct{ r *Registry }

func (c registryCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descInstances
	ch <- descLoaded
	ch <- descMaster
	ch <- descSynced
	ch <- descContactAge
	ch <- descListings
	ch <- descStalls
}

func (c registryCollector) Collect(ch chan<- prometheus.Metric) {
	snap := c.r.Snapshot()
	type key struct{ t, s string }
	counts := map[key]int{}
	for _, t := range []Type{Default, Prefill, Decode, Mix} {
		for _, s := range []State{Active, LeaseLost, Suspect} {
			counts[key{t.String(), s.String()}] = 0
		}
	}
	loaded := 0
	for i := range snap.Instances {
		in := &snap.Instances[i]
		counts[key{in.Type.String(), in.State.String()}]++
		if in.LoadUsable() {
			loaded++
		}
	}
	for k, n := range counts {
		ch <- prometheus.MustNewConstMetric(descInstances, prometheus.GaugeValue, float64(n), k.t, k.s)
	}
	ch <- prometheus.MustNewConstMetric(descLoaded, prometheus.GaugeValue, float64(loaded))
	ch <- prometheus.MustNewConstMetric(descMaster, prometheus.GaugeValue, boolValue(c.r.IsMaster()))

	ws := c.r.WatchState()
	ch <- prometheus.MustNewConstMetric(descSynced, prometheus.GaugeValue, boolValue(ws.Live))
	if !ws.LastContact.IsZero() {
		ch <- prometheus.MustNewConstMetric(descContactAge, prometheus.GaugeValue, max(0, time.Since(ws.LastContact).Seconds()))
	}
	ch <- prometheus.MustNewConstMetric(descListings, prometheus.CounterValue, float64(ws.Listings))
	ch <- prometheus.MustNewConstMetric(descStalls, prometheus.CounterValue, float64(ws.Stalls))
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
