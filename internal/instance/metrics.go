package instance

import (
	"github.com/prometheus/client_golang/prometheus"
)

var (
	descInstances = prometheus.NewDesc("kvcar_instances",
		"Instances in the registry by registered type and state.", []string{"type", "state"}, nil)
	descLoaded = prometheus.NewDesc("kvcar_instances_with_load",
		"Instances with a usable load report (schedulable by CAR and SLO_AWARE).", nil, nil)
	descMaster = prometheus.NewDesc("kvcar_service_is_master",
		"1 while this replica holds XLLM:SERVICE:MASTER.", nil, nil)
)

// Collector reports the registry's snapshot at scrape time.
func (r *Registry) Collector() prometheus.Collector { return registryCollector{r} }

type registryCollector struct{ r *Registry }

func (c registryCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descInstances
	ch <- descLoaded
	ch <- descMaster
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
	master := 0.0
	if c.r.IsMaster() {
		master = 1
	}
	ch <- prometheus.MustNewConstMetric(descMaster, prometheus.GaugeValue, master)
}
