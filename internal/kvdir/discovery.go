package kvdir

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvcar/kvcar/internal/config"
	"github.com/kvcar/kvcar/internal/instance"
)

// InstanceSource is the instance registry's local snapshot, kept by its
// etcd watch. Discovery reads it and nothing else (R-DISC-1).
type InstanceSource interface {
	Snapshot() *instance.Snapshot
}

// Exclusion is an instance discovery will not subscribe to, and why.
type Exclusion struct {
	Instance string
	// Kind is one of the Exclude constants: the metric label.
	Kind   string
	Reason string
}

// Exclusion kinds. The first two are the rule (R-DISC-3/4) and are
// logged at info level; the others are faults, logged as errors.
const (
	ExcludeNotPrefill   = "not_prefill"
	ExcludeSuspect      = "suspect"
	ExcludeBadName      = "bad_name"
	ExcludePortOverflow = "port_overflow"
	ExcludePortConflict = "port_conflict"
	ExcludeMaxStreams   = "max_streams"
	// ExcludeTopicConflict: on a bound subscriber, two instances whose
	// topics are equal could not be told apart.
	ExcludeTopicConflict = "topic_conflict"
	// ExcludeBindPorts: on a bound subscriber, a DP rank dials a port
	// past subscribe_bind_ports.
	ExcludeBindPorts = "bind_ports"
)

// exclusionKinds lists every kind, for the metric.
var exclusionKinds = []string{ExcludeNotPrefill, ExcludeSuspect, ExcludeBadName, ExcludePortOverflow, ExcludePortConflict,
	ExcludeMaxStreams, ExcludeTopicConflict, ExcludeBindPorts}

// Fault reports whether the exclusion is a fault rather than the rule.
func (e Exclusion) Fault() bool { return e.Kind != ExcludeNotPrefill && e.Kind != ExcludeSuspect }

// Plan derives the streams discovery wants from a registry snapshot
// (R-DISC-2..7): DEFAULT and PREFILL instances and MIX instances acting
// as PREFILL, not SUSPECT, whatever their backend_type (an xLLM engine
// and a vLLM server behind xllm-service's vllm_sidecar publish the same
// events), one stream per DP rank at the business port plus the
// configured offsets, with the sync mode and topic template of their
// backend_type. Every instance left out is returned with the reason:
// DECODE and MIX acting as DECODE, SUSPECT, and instances whose ports
// overflow or collide with another's, or that no longer fit in
// maxStreams, taken in name order.
//
// An instance registered with one DP rank accepts batches tagged with any
// rank: vLLM's external data parallelism runs each rank as its own HTTP
// server, registered as its own instance, whose batches carry the rank
// (item 7).
func Plan(snap *instance.Snapshot, d config.Discovery, maxStreams int) ([]StreamSpec, []Exclusion) {
	type candidate struct {
		inst  *instance.Instance
		host  string
		specs []StreamSpec
	}
	var (
		cands    []candidate
		excluded []Exclusion
	)
	exclude := func(name, kind, reason string) { excluded = append(excluded, Exclusion{name, kind, reason}) }
	for i := range snap.Instances {
		inst := &snap.Instances[i]
		if kind, why := leftOut(inst); kind != "" {
			exclude(inst.Meta.Name, kind, why)
			continue
		}
		host, portStr, err := net.SplitHostPort(inst.Meta.Name)
		port, perr := strconv.Atoi(portStr)
		if err != nil || perr != nil || port <= 0 || port > 65535 || host == "" {
			exclude(inst.Meta.Name, ExcludeBadName, "instance name is not a host:port business address")
			continue
		}
		c := candidate{inst: inst, host: host}
		dp := max(inst.Meta.DPSize, 1)
		var bindPorts []string
		if d.SubscribeBind != "" {
			bindPorts = config.BindPorts(d.SubscribeBind, d.SubscribeBindPorts)
			if dp > len(bindPorts) {
				exclude(inst.Meta.Name, ExcludeBindPorts, fmt.Sprintf("%d DP ranks dial %d bound ports: raise discovery.subscribe_bind_ports", dp, len(bindPorts)))
				continue
			}
		}
		mode := d.ModeFor(inst.Meta.BackendType)
		topic := d.TopicFor(inst.Meta.BackendType)
		for r := range dp {
			ev, rp := port+d.EventPortOffset+r, port+d.ReplayPortOffset+r
			if mode == config.SyncLive {
				rp = 0 // no replay endpoint to derive or claim
			}
			if ev > 65535 || rp > 65535 {
				exclude(inst.Meta.Name, ExcludePortOverflow, fmt.Sprintf("port overflow: dp %d needs event port %d and replay port %d", r, ev, rp))
				c.specs = nil
				break
			}
			spec := StreamSpec{
				InstanceName: inst.Meta.Name,
				DPRank:       r,
				Endpoint:     "tcp://" + net.JoinHostPort(host, strconv.Itoa(ev)),
				Topic:        config.ExpandTopic(topic, inst.Meta.Name, host, portStr, r),
				Mode:         mode,
				AnyRank:      dp == 1,
				BlockSize:    d.BlockSize,
				HashSeed:     d.HashSeed,
				Incarnation:  inst.Incarnation(),
				Discovered:   true,
			}
			if rp != 0 {
				spec.ReplayEndpoint = "tcp://" + net.JoinHostPort(host, strconv.Itoa(rp))
			}
			if bindPorts != nil {
				// Rank r dials the bound port + r (vLLM offsets its
				// endpoint by the rank), shown as the stream's endpoint.
				spec.Bind, spec.BindPorts, spec.Endpoint = d.SubscribeBind, d.SubscribeBindPorts, bindPorts[r]
			}
			c.specs = append(c.specs, spec)
		}
		if c.specs != nil {
			cands = append(cands, c)
		}
	}

	// R-DISC-6: a port claimed twice on one host (by two instances, two
	// DP ranks, an event and a replay range, or another's HTTP port) would
	// mix one engine's events into another's stream: exclude every
	// instance involved.
	type hostPort struct {
		host string
		port string
	}
	users := map[hostPort][]string{}
	claim := func(host, endpoint, who string) {
		if endpoint == "" {
			return
		}
		_, p, _ := net.SplitHostPort(strings.TrimPrefix(endpoint, "tcp://"))
		k := hostPort{host, p}
		users[k] = append(users[k], who)
	}
	for _, c := range cands {
		_, httpPort, _ := net.SplitHostPort(c.inst.Meta.Name)
		users[hostPort{c.host, httpPort}] = append(users[hostPort{c.host, httpPort}], c.inst.Meta.Name)
		for _, s := range c.specs {
			if s.Bind == "" {
				claim(c.host, s.Endpoint, s.InstanceName)
			}
			claim(c.host, s.ReplayEndpoint, s.InstanceName)
		}
	}
	// On a bound subscriber the topic is all that tells engines apart.
	topics := map[string][]string{}
	for _, c := range cands {
		for _, s := range c.specs {
			if s.Bind != "" && !slices.Contains(topics[s.Topic], s.InstanceName) {
				topics[s.Topic] = append(topics[s.Topic], s.InstanceName)
			}
		}
	}
	topicConflict := map[string]string{}
	for topic, who := range topics {
		if len(who) < 2 {
			continue
		}
		slices.Sort(who)
		for _, name := range who {
			topicConflict[name] = fmt.Sprintf("topic %q on the bound subscriber is also %s's", topic, strings.Join(who, ", "))
		}
	}
	conflicted := map[string]string{}
	// Walk the ports in order so that an instance's reason names the
	// same (lowest) conflicting port on every round.
	ports := slices.SortedFunc(maps.Keys(users), func(a, b hostPort) int {
		return cmp.Or(strings.Compare(a.host, b.host), cmp.Compare(len(a.port), len(b.port)), strings.Compare(a.port, b.port))
	})
	for _, k := range ports {
		who := users[k]
		if len(who) < 2 {
			continue
		}
		involved := slices.Compact(slices.Sorted(slices.Values(who)))
		for _, name := range involved {
			if _, seen := conflicted[name]; !seen {
				conflicted[name] = fmt.Sprintf("port conflict on %s:%s between %s", k.host, k.port, strings.Join(involved, ", "))
			}
		}
	}

	slices.SortFunc(cands, func(a, b candidate) int { return strings.Compare(a.inst.Meta.Name, b.inst.Meta.Name) })
	var specs []StreamSpec
	for _, c := range cands {
		if reason, bad := conflicted[c.inst.Meta.Name]; bad {
			exclude(c.inst.Meta.Name, ExcludePortConflict, reason)
			continue
		}
		if reason, bad := topicConflict[c.inst.Meta.Name]; bad {
			exclude(c.inst.Meta.Name, ExcludeTopicConflict, reason)
			continue
		}
		// R-DISC-7: whole instances only, in name order.
		if len(specs)+len(c.specs) > maxStreams {
			exclude(c.inst.Meta.Name, ExcludeMaxStreams, fmt.Sprintf("max_streams (%d) reached: %d DP streams do not fit", maxStreams, len(c.specs)))
			continue
		}
		specs = append(specs, c.specs...)
	}
	slices.SortFunc(excluded, func(a, b Exclusion) int { return strings.Compare(a.Instance, b.Instance) })
	return specs, excluded
}

// leftOut says why discovery does not index the instance (R-DISC-3,
// R-DISC-4), or returns "" when it does: DEFAULT, PREFILL and MIX
// currently acting as PREFILL, of any backend, not SUSPECT (an instance
// whose lease is lost but still in its grace period keeps its streams).
func leftOut(inst *instance.Instance) (kind, reason string) {
	if inst.State == instance.Suspect {
		return ExcludeSuspect, "SUSPECT: no heartbeat and no health; its streams are dropped"
	}
	switch inst.Type {
	case instance.Default, instance.Prefill:
		return "", ""
	case instance.Mix:
		if inst.Role == instance.Prefill {
			return "", ""
		}
		return ExcludeNotPrefill, fmt.Sprintf("MIX instance acting as %v: only a prefill's cache saves prefill work", inst.Role)
	}
	return ExcludeNotPrefill, fmt.Sprintf("%v instance: only a prefill's cache saves prefill work", inst.Type)
}

// RunDiscovery keeps the directory's streams equal to what Plan derives
// from src, every d.RefreshInterval, until ctx ends. It runs on its own
// goroutine, never on a request path, and reads only the local snapshot.
func (dir *Directory) RunDiscovery(ctx context.Context, src InstanceSource, d config.Discovery, maxStreams int) {
	t := time.NewTicker(d.RefreshInterval)
	defer t.Stop()
	var (
		lastVersion uint64
		seen        bool
		lastExcl    = map[Exclusion]bool{}
	)
	for {
		snap := src.Snapshot()
		if snap != nil && (!seen || snap.Version != lastVersion) {
			seen, lastVersion = true, snap.Version
			specs, excl := Plan(snap, d, maxStreams)
			now := map[Exclusion]bool{}
			for _, e := range excl {
				now[e] = true
				if lastExcl[e] {
					continue
				}
				if e.Fault() {
					dir.log.Error("discovery excludes instance", "instance", e.Instance, "kind", e.Kind, "reason", e.Reason)
				} else {
					dir.log.Info("discovery leaves out instance", "instance", e.Instance, "kind", e.Kind, "reason", e.Reason)
				}
			}
			lastExcl = now
			byKind := map[string]int{}
			for _, e := range excl {
				byKind[e.Kind]++
			}
			dir.exclusions.Store(&byKind)
			if err := dir.SetStreams(specs); err != nil {
				dir.log.Error("discovery could not apply streams", "err", err)
			} else {
				dir.log.Debug("discovery applied", "version", snap.Version, "streams", len(specs), "excluded", len(excl))
				if snap.Synced {
					dir.markDiscovered()
				}
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
