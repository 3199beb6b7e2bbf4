package layout

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/kvcar/kvcar/"

// place is where a package sits in the layout.
type place struct {
	// layer: a package imports only module packages of lower layers.
	layer int
	// forbid lists what the package must not depend on, directly or
	// through anything it imports: import paths, or prefixes written
	// "path/..." (the path and everything below it). Module packages are
	// written without the module path.
	forbid []string
	// through lists module packages whose own dependencies are not
	// counted against forbid, for an edge the layout plans to remove;
	// the reason is in the comment of the entry.
	through []string
	// onlyFor, when set, lists the only packages (or "cmd/..." for every
	// program) that may import this one; empty when any higher layer may.
	onlyFor []string
	// testOnly: no package may import it; only tests do.
	testOnly bool
}

// Transports and process-level I/O that routing and the codecs must not
// reach.
var transports = []string{
	"internal/kvtransport", "internal/etcdembed",
	"github.com/pebbe/zmq4", "go.etcd.io/...", "google.golang.org/grpc/...",
	"net/http/...", "os/exec",
}

// sockets adds the net package to transports, for packages that have no
// address to parse either; net/netip stays allowed.
var sockets = slices.Concat(transports, []string{"net"})

// Packages that decide routing or hold its state: the codecs and the
// engine emulator know nothing of them.
var routing = []string{"internal/lb", "internal/instance", "internal/server", "internal/kvdir"}

// The layout, from the top. Layers as in design/ARCHITECTURE.md: cmd at
// the top, then the local deployment, HTTP, policies, directory and
// engine emulator, registry and index, leaves.
var layout = map[string]place{
	"cmd/kvcar":       {layer: 6},
	"cmd/kvcar-bench": {layer: 6},
	"cmd/kvcar-load":  {layer: 6},
	"cmd/kvcar-demo":  {layer: 6},
	"cmd/kvcar-scale": {layer: 6},
	"cmd/kvcar-soak":  {layer: 6},

	"internal/devcluster": {layer: 5},

	"internal/server": {layer: 4},

	// lb decides over a registry snapshot and a directory view with no
	// I/O and no transport. It imports kvdir for Match and instance for
	// Snapshot; their transports are excused until the planned leaf
	// types package takes those types.
	"internal/lb": {layer: 3, forbid: sockets, through: []string{"internal/kvdir", "internal/instance"}},

	"internal/kvdir": {layer: 2, forbid: []string{"internal/enginesim", "internal/etcdembed"}},
	// The emulated engine encodes with the codecs, never with kvcar's
	// own directory, index or registry.
	"internal/enginesim": {layer: 2, forbid: []string{"internal/kvdir", "internal/kvindex", "internal/instance", "internal/lb", "internal/server", "internal/etcdembed"}},

	// kvcar as xllm-service on the RPC side: the registry behind the
	// heartbeats and the engines' generations, never routing decisions.
	"internal/xllmrpc": {layer: 2, forbid: []string{"internal/lb", "internal/server", "internal/kvdir", "internal/kvindex", "internal/enginesim", "internal/etcdembed"}},

	// The registry knows instances, not KV cache metadata or engines'
	// event streams.
	"internal/instance": {layer: 1, forbid: []string{"internal/kvevent", "internal/kvindex", "internal/kvtransport", "internal/config", "internal/etcdembed"}},
	"internal/kvindex":  {layer: 1, forbid: slices.Concat(sockets, routing)},
	// The embedded etcd adds megabytes to a binary: only programs use it.
	"internal/etcdembed": {layer: 1, onlyFor: []string{"cmd/..."}},

	// config parses endpoint addresses with net, and opens nothing.
	"internal/config":      {layer: 0, forbid: slices.Concat(transports, routing)},
	"internal/kvevent":     {layer: 0, forbid: slices.Concat(sockets, routing)},
	"internal/kvtransport": {layer: 0, forbid: slices.Concat([]string{"go.etcd.io/...", "google.golang.org/grpc/...", "net/http/..."}, routing)},
	"internal/tokenizer":   {layer: 0, forbid: slices.Concat(sockets, routing)},
	"internal/zapslog":     {layer: 0},
	// The revision a program was built from: a leaf any program or the
	// harness may read, running no command and opening nothing.
	"internal/buildinfo": {layer: 0, forbid: slices.Concat(sockets, routing)},
	// JSON written into byte slices: the HTTP server and the xLLM
	// dispatcher share it, and it imports nothing of kvcar.
	"internal/jsonw": {layer: 0, forbid: slices.Concat(sockets, routing)},
	// A processor hint and nothing else: it imports nothing of kvcar.
	"internal/prefetch": {layer: 0, forbid: slices.Concat(sockets, routing)},
	// A kernel hint about memory and nothing else: it imports nothing of kvcar.
	"internal/hugepage": {layer: 0, forbid: slices.Concat(sockets, routing)},
	// XXH3 over bytes the index hands it: it imports nothing of kvcar.
	"internal/blockhash": {layer: 0, forbid: slices.Concat(sockets, routing)},
	// A count of bytes held, for the HTTP and baidu_std servers: it
	// opens nothing and imports nothing of kvcar.
	"internal/budget": {layer: 0, forbid: slices.Concat(sockets, routing)},
	// The Go runtime's monitor pace: environments in, environments out,
	// and the program's restart; it opens nothing.
	"internal/sysmon": {layer: 0, forbid: slices.Concat(sockets, routing)},
	// The C allocator's thresholds: mallopt, nothing opened.
	"internal/cmalloc": {layer: 0, forbid: slices.Concat(sockets, routing)},
	// How idle CPUs wait: sysfs files read, nothing changed.
	"internal/cpuidle": {layer: 0, forbid: slices.Concat(sockets, routing)},
	// A busy thread's interruptions and their arithmetic, for the
	// drivers' reports and the latency benchmarks' bounds (tests import
	// it freely): it reads the clock and imports nothing of kvcar.
	"internal/cpunoise": {layer: 0, forbid: slices.Concat(sockets, routing), onlyFor: []string{"cmd/..."}},
	// Raw socket reads and writes and accept retries: a leaf the HTTP
	// and baidu_std servers and the load driver share, knowing nothing
	// of HTTP or of kvcar's parts.
	"internal/sockio": {layer: 0, forbid: slices.Concat([]string{"net/http/...", "go.etcd.io/...", "github.com/pebbe/zmq4"}, routing)},
	// Loopback ports for the servers the development and test harnesses
	// start (the embedded etcd, emulated engines): a bind to check a port,
	// nothing served, nothing of kvcar imported.
	"internal/freeport": {layer: 0, forbid: slices.Concat([]string{"net/http/...", "go.etcd.io/...", "github.com/pebbe/zmq4"}, routing)},
	// brpc's protocol knows no xLLM message and no kvcar part; the
	// generated messages know nothing at all.
	"internal/baidustd":          {layer: 1, forbid: slices.Concat([]string{"internal/xllmpb/...", "go.etcd.io/...", "github.com/pebbe/zmq4"}, routing)},
	"internal/baidustd/metapb":   {layer: 0, forbid: slices.Concat(sockets, routing)},
	"internal/xllmpb":            {layer: 0, forbid: slices.Concat(sockets, routing)},
	"internal/xllmpb/xservicepb": {layer: 1, forbid: slices.Concat(sockets, routing)},
	"internal/leakcheck":         {layer: 0, testOnly: true},
	"internal/decodeheap":        {layer: 0, testOnly: true},
	"internal/testlog":           {layer: 0, testOnly: true},
	"internal/fuzzsrc":           {layer: 0, testOnly: true},
	"internal/closedloop":        {layer: 0, testOnly: true},
	// Benchmarks of kvindex and kvdir share its generated engine messages.
	"internal/kvindex/prefillgen": {layer: 1, testOnly: true, forbid: slices.Concat(sockets, routing)},
	"internal/layout":             {layer: 0, testOnly: true},
}

// pkg is the part of `go list -json` the rules read.
type pkg struct {
	ImportPath string
	Imports    []string
	Standard   bool
	DepOnly    bool
}

// listPackages returns the module's packages and every dependency, by
// import path, with module paths shortened.
func listPackages(t *testing.T) (own []string, all map[string]*pkg) {
	t.Helper()
	gomod, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatalf("go env GOMOD: %v", err)
	}
	cmd := exec.Command("go", "list", "-deps", "-json", "./...")
	cmd.Dir = filepath.Dir(strings.TrimSpace(string(gomod)))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	all = map[string]*pkg{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p pkg
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("go list output: %v", err)
		}
		p.ImportPath = short(p.ImportPath)
		for i, imp := range p.Imports {
			p.Imports[i] = short(imp)
		}
		all[p.ImportPath] = &p
		if strings.HasPrefix(p.ImportPath, "internal/") || strings.HasPrefix(p.ImportPath, "cmd/") {
			if !p.DepOnly && !p.Standard {
				own = append(own, p.ImportPath)
			}
		}
	}
	slices.Sort(own)
	if len(own) == 0 {
		t.Fatal("go list found no packages of the module")
	}
	return own, all
}

func short(path string) string { return strings.TrimPrefix(path, module) }

// matches reports whether path is pattern, or below it for "p/...".
func matches(pattern, path string) bool {
	if base, ok := strings.CutSuffix(pattern, "/..."); ok {
		return path == base || strings.HasPrefix(path, base+"/")
	}
	return path == pattern
}

// Every package is placed, and every place has a package.
func TestEveryPackageIsPlaced(t *testing.T) {
	own, _ := listPackages(t)
	for _, p := range own {
		if _, ok := layout[p]; !ok {
			t.Errorf("%s is not in the layout table of internal/layout/layout_test.go: give it a layer "+
				"(it may import only lower layers) and what it must not depend on", p)
		}
	}
	for p := range layout {
		if !slices.Contains(own, p) {
			t.Errorf("the layout table places %s, which is not a package of the module", p)
		}
	}
}

// No upward or sideways imports: each module import goes to a lower
// layer, so nothing imports cmd/ and the graph has no cycle of rooms.
func TestImportsGoDown(t *testing.T) {
	own, all := listPackages(t)
	for _, p := range own {
		from, ok := layout[p]
		if !ok {
			continue // reported by TestEveryPackageIsPlaced
		}
		for _, imp := range all[p].Imports {
			to, ok := layout[imp]
			if !ok {
				if strings.HasPrefix(imp, "cmd/") || strings.HasPrefix(imp, "internal/") {
					t.Errorf("%s imports %s, which has no place in the layout", p, imp)
				}
				continue
			}
			if to.layer >= from.layer {
				t.Errorf("%s (layer %d) imports %s (layer %d): a package imports only lower layers", p, from.layer, imp, to.layer)
			}
			if to.testOnly {
				t.Errorf("%s imports %s, which only tests may import", p, imp)
			}
			if len(to.onlyFor) > 0 && !slices.ContainsFunc(to.onlyFor, func(pat string) bool { return matches(pat, p) }) {
				t.Errorf("%s imports %s, which only %s may import", p, imp, strings.Join(to.onlyFor, ", "))
			}
		}
	}
}

// Forbidden dependencies, direct or indirect, with the import chain
// that reaches them.
func TestForbiddenDependencies(t *testing.T) {
	own, all := listPackages(t)
	for _, p := range own {
		pl := layout[p]
		if len(pl.forbid) == 0 {
			continue
		}
		deps := reach(all, p, pl.through)
		for _, f := range pl.forbid {
			// One line per rule, with the shortest chain that breaks it.
			var worst []string
			for dep, chain := range deps {
				if matches(f, dep) && (worst == nil || len(chain) < len(worst) ||
					len(chain) == len(worst) && slices.Compare(chain, worst) < 0) {
					worst = chain
				}
			}
			if worst != nil {
				t.Errorf("%s must not depend on %s, but does: %s", p, f, strings.Join(worst, " -> "))
			}
		}
	}
}

// reach returns every package p depends on, not looking inside the
// packages of through, each with one import chain from p.
func reach(all map[string]*pkg, p string, through []string) map[string][]string {
	chains := map[string][]string{}
	queue := []string{p}
	chains[p] = []string{p}
	for len(queue) > 0 {
		cur := queue[0]
		queue = queue[1:]
		if cur != p && slices.Contains(through, cur) {
			continue
		}
		node := all[cur]
		if node == nil {
			continue
		}
		for _, imp := range node.Imports {
			if _, seen := chains[imp]; seen {
				continue
			}
			chains[imp] = append(slices.Clip(chains[cur]), imp)
			queue = append(queue, imp)
		}
	}
	delete(chains, p)
	return chains
}

// The rules catch what they are for: checked on a made-up graph, so a
// rule that can never fire is noticed.
func TestRulesFire(t *testing.T) {
	all := map[string]*pkg{
		"internal/lb":    {ImportPath: "internal/lb", Imports: []string{"internal/x", "internal/kvdir"}},
		"internal/x":     {ImportPath: "internal/x", Imports: []string{"net/http"}},
		"internal/kvdir": {ImportPath: "internal/kvdir", Imports: []string{"internal/kvtransport"}},
		"net/http":       {ImportPath: "net/http", Imports: []string{"net"}},
	}
	got := reach(all, "internal/lb", []string{"internal/kvdir"})
	if c := got["net"]; strings.Join(c, " ") != "internal/lb internal/x net/http net" {
		t.Errorf("chain to net: %v", c)
	}
	if _, ok := got["internal/kvtransport"]; ok {
		t.Error("a dependency behind a through package was counted")
	}
	if !slices.ContainsFunc(transports, func(f string) bool { return matches(f, "net/http") }) ||
		!slices.ContainsFunc(sockets, func(f string) bool { return matches(f, "net") }) ||
		slices.ContainsFunc(sockets, func(f string) bool { return matches(f, "net/netip") }) {
		t.Error("transports and sockets do not say what they mean")
	}
	if matches("net/...", "netip") || !matches("net/...", "net/http") || !matches("go.etcd.io/...", "go.etcd.io/etcd/client/v3") || matches("os/exec", "os") {
		t.Error("pattern matching is wrong")
	}
}
