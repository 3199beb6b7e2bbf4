package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/kvcar/kvcar/internal/config"
	"github.com/kvcar/kvcar/internal/lb"
)

const dashboardFile = "../../deploy/grafana/kvcar-dashboard.json"

type dashboard struct {
	SchemaVersion int           `json:"schemaVersion"`
	UID           string        `json:"uid"`
	Title         string        `json:"title"`
	Panels        []grafanaItem `json:"panels"`
	Templating    struct {
		List []struct {
			Name       string `json:"name"`
			Type       string `json:"type"`
			Query      any    `json:"query"`
			Definition string `json:"definition"`
		} `json:"list"`
	} `json:"templating"`
}

type grafanaItem struct {
	ID         int    `json:"id"`
	Type       string `json:"type"`
	Title      string `json:"title"`
	Datasource *struct {
		Type string `json:"type"`
		UID  string `json:"uid"`
	} `json:"datasource"`
	GridPos struct{ H, W, X, Y int } `json:"gridPos"`
	Targets []struct {
		Expr  string `json:"expr"`
		RefID string `json:"refId"`
	} `json:"targets"`
	Panels []grafanaItem `json:"panels"`
}

var (
	promString   = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	promMatchers = regexp.MustCompile(`\{[^}]*\}`)
	promRanges   = regexp.MustCompile(`\[[^\]]*\]`)
	promGrouping = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promIdent    = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
	promKeywords = map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "offset": true, "inf": true, "nan": true}
)

// promMetricNames returns the metric names an expression reads: what is
// left once strings, label matchers, ranges, grouping clauses, function
// calls and operators are taken out.
func promMetricNames(expr string) []string {
	e := promString.ReplaceAllString(expr, " ")
	e = promMatchers.ReplaceAllString(e, " ")
	e = promRanges.ReplaceAllString(e, " ")
	e = promGrouping.ReplaceAllString(e, " ")
	var out []string
	for _, loc := range promIdent.FindAllStringIndex(e, -1) {
		name := e[loc[0]:loc[1]]
		// Part of a number (1e3, 0.5) or a variable ($job), not a name.
		if loc[0] > 0 && strings.ContainsRune("0123456789.$", rune(e[loc[0]-1])) {
			continue
		}
		// A function call.
		if strings.HasPrefix(strings.TrimLeft(e[loc[1]:], " \t\n"), "(") {
			continue
		}
		if !promKeywords[strings.ToLower(name)] {
			out = append(out, name)
		}
	}
	return out
}

func TestPromMetricNames(t *testing.T) {
	for expr, want := range map[string][]string{
		`histogram_quantile(0.99, sum by (le, route) (rate(kvcar_http_request_duration_seconds_bucket{job=~"$job"}[$__rate_interval])))`: {"kvcar_http_request_duration_seconds_bucket"},
		`sum(rate(a_sum[5m])) / sum(rate(a_count[5m])) > 0.5e3`:                                                                          {"a_sum", "a_count"},
		`max by (type, state) (kvcar_instances{state!="x"}) > 0 and on (type) b`:                                                         {"kvcar_instances", "b"},
		`max(kvcar_streams{job=~"$job"}) - 1e3 * rate ( c [1m] offset 5m)`:                                                               {"kvcar_streams", "c"},
	} {
		if got := promMetricNames(expr); !slices.Equal(got, want) {
			t.Errorf("%s: %v, want %v", expr, got, want)
		}
	}
}

// scrapeNames returns the sample names and the metric families (from
// the # TYPE lines) of a Prometheus text exposition.
func scrapeNames(body string) (samples, families map[string]bool) {
	samples, families = map[string]bool{}, map[string]bool{}
	for line := range strings.Lines(body) {
		line = strings.TrimSpace(line)
		if rest, ok := strings.CutPrefix(line, "# TYPE "); ok {
			if f := strings.Fields(rest); len(f) > 0 {
				families[f[0]] = true
			}
			continue
		}
		if line == "" || line[0] == '#' {
			continue
		}
		if i := strings.IndexAny(line, "{ "); i > 0 {
			samples[line[:i]] = true
		}
	}
	return samples, families
}

// familyOf strips the suffixes of histogram and summary samples.
func familyOf(sample string) string {
	for _, s := range []string{"_bucket", "_sum", "_count"} {
		if f, ok := strings.CutSuffix(sample, s); ok {
			return f
		}
	}
	return sample
}

// TestGrafanaDashboardMatchesMetrics keeps deploy/grafana in step with
// the code: the dashboard is valid Grafana JSON with a Prometheus data
// source variable, every metric its PromQL reads is served by a real
// kvcar's /metrics (with a cluster, after routed traffic, so that every
// series exists), and every kvcar_ family served has a panel.
func TestGrafanaDashboardMatchesMetrics(t *testing.T) {
	raw, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	if d.SchemaVersion < 36 || d.UID == "" || d.Title == "" {
		t.Errorf("dashboard header: schemaVersion %d, uid %q, title %q", d.SchemaVersion, d.UID, d.Title)
	}
	hasDS := false
	for _, v := range d.Templating.List {
		if v.Name == "datasource" && v.Type == "datasource" && v.Query == "prometheus" {
			hasDS = true
		}
	}
	if !hasDS {
		t.Error("no Prometheus data source variable named datasource")
	}

	exprs := map[string][]string{} // metric name -> panels that read it
	ids := map[int]bool{}
	var walk func(items []grafanaItem)
	walk = func(items []grafanaItem) {
		for _, p := range items {
			if ids[p.ID] {
				t.Errorf("panel id %d used twice", p.ID)
			}
			ids[p.ID] = true
			if p.GridPos.W <= 0 || p.GridPos.X < 0 || p.GridPos.X+p.GridPos.W > 24 || p.GridPos.H <= 0 {
				t.Errorf("panel %q: gridPos %+v outside the 24-column grid", p.Title, p.GridPos)
			}
			walk(p.Panels)
			if p.Type == "row" {
				continue
			}
			if p.Datasource == nil || p.Datasource.UID != "${datasource}" || len(p.Targets) == 0 {
				t.Errorf("panel %q: data source %+v, %d targets", p.Title, p.Datasource, len(p.Targets))
			}
			refs := map[string]bool{}
			for _, tg := range p.Targets {
				if refs[tg.RefID] || tg.RefID == "" {
					t.Errorf("panel %q: refId %q missing or repeated", p.Title, tg.RefID)
				}
				refs[tg.RefID] = true
				names := promMetricNames(tg.Expr)
				if len(names) == 0 {
					t.Errorf("panel %q: no metric in %q", p.Title, tg.Expr)
				}
				for _, n := range names {
					exprs[n] = append(exprs[n], p.Title)
				}
			}
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		if v.Type == "query" {
			// label_values(<selector>, <label>): the selector is PromQL.
			sel, _, _ := strings.Cut(strings.TrimPrefix(v.Definition, "label_values("), ",")
			for _, n := range promMetricNames(sel) {
				exprs[n] = append(exprs[n], "variable "+v.Name)
			}
		}
	}

	c := startCluster(t, 1, nil, "--load_balance_policy=CAR")
	if r := c.complete(t, "/v1/completions", idsPrompt(1, 32)); r.status != 200 {
		t.Fatalf("completion: %d %s", r.status, r.body)
	}
	resp, err := http.Get("http://" + c.internal + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("/metrics: %d %v", resp.StatusCode, err)
	}
	samples, families := scrapeNames(string(body))

	var missing []string
	for n, panels := range exprs {
		if !samples[n] {
			missing = append(missing, fmt.Sprintf("%s (in %s)", n, strings.Join(panels, ", ")))
		}
	}
	slices.Sort(missing)
	for _, m := range missing {
		t.Errorf("dashboard reads a metric kvcar does not serve: %s", m)
	}
	used := map[string]bool{}
	for n := range exprs {
		used[familyOf(n)] = true
	}
	var unused []string
	for f := range families {
		if strings.HasPrefix(f, "kvcar_") && !used[f] {
			unused = append(unused, f)
		}
	}
	slices.Sort(unused)
	for _, f := range unused {
		t.Errorf("kvcar serves %s but %s has no panel for it", f, dashboardFile)
	}
	t.Logf("%d metric names in %d panels, all served", len(exprs), len(ids))
}

// deployArgs returns the kvcar flags of the systemd unit's ExecStart and
// of the Kubernetes container's args, as written.
func deployArgs(t *testing.T) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	unit, err := os.ReadFile("../../deploy/systemd/kvcar.service")
	if err != nil {
		t.Fatal(err)
	}
	joined := strings.ReplaceAll(string(unit), "\\\n", " ")
	for line := range strings.Lines(joined) {
		if rest, ok := strings.CutPrefix(line, "ExecStart="); ok {
			f := strings.Fields(rest)
			out["systemd"] = append(out["systemd"], f[1:]...)
		}
	}
	manifest, err := os.ReadFile("../../deploy/kubernetes/kvcar.yaml")
	if err != nil {
		t.Fatal(err)
	}
	inArgs := false
	for line := range strings.Lines(string(manifest)) {
		trimmed := strings.TrimSpace(line)
		switch {
		case trimmed == "args:":
			inArgs = true
		case inArgs && strings.HasPrefix(trimmed, "- "):
			out["kubernetes"] = append(out["kubernetes"], strings.TrimPrefix(trimmed, "- "))
		case inArgs && trimmed != "" && !strings.HasPrefix(trimmed, "#"):
			inArgs = false
		}
	}
	return out
}

// kubernetesConfig returns the KV events config embedded in the
// manifest's ConfigMap (the indented block under kv_events.json: |).
func kubernetesConfig(t *testing.T) string {
	t.Helper()
	manifest, err := os.ReadFile("../../deploy/kubernetes/kvcar.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	indent := -1
	for line := range strings.Lines(string(manifest)) {
		if indent < 0 {
			if strings.TrimSpace(line) == "kv_events.json: |" {
				indent = len(line) - len(strings.TrimLeft(line, " ")) + 1
			}
			continue
		}
		if strings.TrimSpace(line) != "" && len(line)-len(strings.TrimLeft(line, " ")) < indent {
			break
		}
		b.WriteString(strings.TrimSpace(line) + "\n")
	}
	return b.String()
}

// TestDeployFilesMatchTheCommand keeps deploy/systemd and
// deploy/kubernetes runnable: their kvcar arguments, with the variables
// they reference filled in, pass the command's own flag parsing and
// range checks and its start-up checks of the internal listener, and the
// discovery config they load is valid. The internal API token comes from
// a file the platform provides (a systemd credential, a mounted Secret),
// never from the command line where the process list shows it (issue 10
// item 7), and the internal listener the engines must reach is guarded
// by it.
func TestDeployFilesMatchTheCommand(t *testing.T) {
	vars := strings.NewReplacer(
		"$(KVCAR_ETCD_ADDR)", "127.0.0.1:2379", "${KVCAR_ETCD_ADDR}", "127.0.0.1:2379",
		"$(POD_IP)", "10.1.2.3", "${KVCAR_ADVERTISE_HOST}", "10.1.2.3", "${KVCAR_ENGINE_NETWORKS}", "10.0.0.0/16")
	k8sConfig := writeConfig(t, kubernetesConfig(t))
	configs := map[string]string{"systemd": "../../examples/kv_events_discovery_config.json", "kubernetes": k8sConfig}
	tokenFile := writeConfig(t, "t0ken\n")
	unit, err := os.ReadFile("../../deploy/systemd/kvcar.service")
	if err != nil {
		t.Fatal(err)
	}
	manifest, err := os.ReadFile("../../deploy/kubernetes/kvcar.yaml")
	if err != nil {
		t.Fatal(err)
	}
	// Where each platform puts the token file it is given.
	tokenProvided := map[string]func(path string) bool{
		// %d is the unit's credentials directory.
		"systemd": func(path string) bool {
			name, ok := strings.CutPrefix(path, "%d/")
			return ok && regexp.MustCompile(`(?m)^LoadCredential=`+regexp.QuoteMeta(name)+`:/`).Match(unit)
		},
		"kubernetes": func(path string) bool {
			dir, name := filepath.Split(path)
			return strings.Contains(string(manifest), "mountPath: "+strings.TrimSuffix(dir, "/")+"\n") &&
				strings.Contains(string(manifest), "path: "+name+"\n") && strings.Contains(string(manifest), "secretName: kvcar-internal-api")
		},
	}
	all := deployArgs(t)
	for _, where := range []string{"systemd", "kubernetes"} {
		args := all[where]
		if len(args) < 5 {
			t.Fatalf("%s: only %d kvcar arguments found: %q", where, len(args), args)
		}
		var filled []string
		sawConfig, sawTokenFile := false, false
		for _, a := range args {
			if strings.ContainsAny(vars.Replace(a), "$%") && !strings.HasPrefix(a, "--internal_api_token_file=") {
				t.Errorf("%s: %q references a variable this test does not know", where, a)
			}
			if strings.HasPrefix(a, "--internal_api_token=") {
				t.Errorf("%s: %q puts the token on the command line, where the process list shows it", where, a)
			}
			if strings.HasPrefix(a, "--kv_events_config_file=") {
				a, sawConfig = "--kv_events_config_file="+configs[where], true
			}
			if path, ok := strings.CutPrefix(a, "--internal_api_token_file="); ok {
				if !tokenProvided[where](path) {
					t.Errorf("%s: %q names a file the deployment does not provide", where, a)
				}
				a, sawTokenFile = "--internal_api_token_file="+tokenFile, true
			}
			filled = append(filled, vars.Replace(a))
		}
		if !sawConfig {
			t.Errorf("%s: no --kv_events_config_file", where)
		}
		if !sawTokenFile {
			t.Errorf("%s: no --internal_api_token_file", where)
		}
		f, err := parseFlags(filled, io.Discard)
		if err != nil {
			t.Errorf("%s: kvcar refuses %q: %v", where, args, err)
			continue
		}
		// What run checks after parsing: the log settings, the policy, the
		// token and the internal listener it guards.
		log, err := newLogger(f, io.Discard)
		if err != nil {
			t.Errorf("%s: %v", where, err)
		}
		if _, err := lb.New(f.policy, lb.Options{CARPrefillLambda: f.carLambda, CARHostHitWeight: f.carHostW,
			TargetTTFTms: f.targetTTFT, TargetTPOTms: f.targetTPOT}); err != nil {
			t.Errorf("%s: %v", where, err)
		}
		if f.etcdAddr == "" {
			t.Errorf("%s: no --etcd_addr: kvcar would run an embedded etcd", where)
		}
		token, err := internalToken(f, func(string) string { return "" }, log)
		if err != nil || token != "t0ken" {
			t.Errorf("%s: token %q, %v", where, token, err)
		}
		internal := &net.TCPAddr{IP: net.ParseIP(f.internalHost), Port: f.internalPort}
		if internal.IP == nil || internal.IP.IsLoopback() || f.internalPort == f.port {
			t.Errorf("%s: internal listener %s:%d, want one engines on other hosts reach, apart from --port %d",
				where, f.internalHost, f.internalPort, f.port)
		}
		if err := checkInternalExposure(f, token != "", internal, log); err != nil {
			t.Errorf("%s: %v", where, err)
		}
		rpc := &net.TCPAddr{IP: internal.IP, Port: f.rpcPort}
		nets, err := parseNetworks(f.rpcNetworks)
		if err != nil {
			t.Errorf("%s: %v", where, err)
		}
		if err := checkRPCExposure(f, nets, rpc, log); err != nil || f.insecureInternal {
			t.Errorf("%s: the brpc port is not limited to the engines' networks (%v)", where, err)
		}
		if self, err := advertisedAddr(f, rpc); err != nil || self != net.JoinHostPort("10.1.2.3", fmt.Sprint(f.rpcPort)) {
			t.Errorf("%s: engines are sent to %q (%v), want the advertised host and the rpc port", where, self, err)
		}
		if where == "kubernetes" {
			if want := fmt.Sprintf("prometheus.io/port: \"%d\"", f.internalPort); !strings.Contains(string(manifest), want) {
				t.Errorf("kubernetes: no %s: /metrics is on the internal listener", want)
			}
			for _, port := range []int{f.internalPort, f.rpcPort} {
				if want := fmt.Sprintf("containerPort: %d", port); !strings.Contains(string(manifest), want) {
					t.Errorf("kubernetes: no %s for an internal listener", want)
				}
			}
		}
	}
	for where, text := range map[string][]byte{"systemd": unit, "kubernetes": manifest} {
		if bytes.Contains(text, []byte(tokenEnv+"=")) || bytes.Contains(text, []byte("name: "+tokenEnv)) {
			t.Errorf("%s sets %s as well as the token file: kvcar refuses two token sources", where, tokenEnv)
		}
	}
	for where, path := range configs {
		cfg, err := config.Load(path)
		if err != nil {
			t.Errorf("%s config %s: %v", where, path, err)
		} else if !cfg.Discovery.Enabled {
			t.Errorf("%s config: discovery is disabled", where)
		}
	}
}
