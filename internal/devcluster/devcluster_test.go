package devcluster

import (
	"context"
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvcar/kvcar/internal/config"
	"github.com/kvcar/kvcar/internal/enginesim"
	"github.com/kvcar/kvcar/internal/etcdembed"
)

// TestClusterSyncsAndStops runs the whole harness on the real binary: an
// engine with two DP ranks registered in etcd is discovered, both streams
// synchronise, the engine's heartbeats are accepted, and Stop ends kvcar
// cleanly well within its timeout.
func TestClusterSyncsAndStops(t *testing.T) {
	if testing.Short() {
		t.Skip("builds kvcar and runs it as a process")
	}
	bin, err := BuildKVCar(t.Context(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	// Stamped as make build stamps it.
	if rev, err := KVCarRevision(t.Context(), bin); err != nil || rev != Revision() {
		t.Errorf("built kvcar reports revision %q (%v), want the working tree's %q", rev, err, Revision())
	}
	etcd, err := etcdembed.Start(t.Context(), etcdembed.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { etcd.Close() })
	engines, err := StartEngines([]enginesim.Config{
		Discoverable(enginesim.Config{DPSize: 2, BlockSize: 16, DeviceBlocks: 64}, etcd.Endpoints(), "devcluster-test", 100*time.Millisecond),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := engines.Close(); err != nil {
			t.Error(err)
		}
	})
	cfgPath, err := WriteConfig(t.TempDir(), DiscoveryConfig(16, 50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	// A file, not a buffer: it can be read while kvcar still writes.
	logPath := filepath.Join(t.TempDir(), "kvcar.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	kv, err := StartKVCar(KVCarOptions{
		Binary: bin, Etcd: etcd.Endpoints(), Namespace: "devcluster-test", ConfigFile: cfgPath,
		Args: []string{"--host=127.0.0.1", "--log_level=warn"}, Stdout: logFile, Stderr: logFile,
		CPUs: []int{runtime.NumCPU() - 1},
	})
	if err != nil {
		t.Fatal(err)
	}
	if cpus, err := AllowedCPUs(kv.Pid()); err != nil || cpus != strconv.Itoa(runtime.NumCPU()-1) {
		t.Errorf("kvcar runs on CPUs %q (%v), want only the last", cpus, err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = kv.Stop()
		}
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("kvcar output:\n%s", b)
		}
	})

	if err := kv.WaitSynced(t.Context(), engines.Streams(), 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := engines.WaitHeartbeats(t.Context(), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	checkVLLMSidecar(t, etcd, kv)
	if err := kv.Exited(); err != nil {
		t.Fatalf("running kvcar: %v", err)
	}
	rss, peak, err := Memory(kv.Pid())
	if err != nil || rss <= 0 || peak < rss {
		t.Fatalf("kvcar memory: rss %d, peak %d, %v", rss, peak, err)
	}

	began := time.Now()
	err = kv.Stop()
	stopped = true
	took := time.Since(began)
	if err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if took >= StopTimeout {
		t.Fatalf("Stop took %v, not under its timeout %v", took, StopTimeout)
	}
	t.Logf("kvcar stopped %v after SIGTERM", took.Round(time.Millisecond))
	if err := kv.Exited(); err == nil {
		t.Fatal("Exited reports a stopped kvcar as running")
	}
	if err := kv.Stop(); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
}

// checkVLLMSidecar starts a VLLMSidecar engine beside the running
// cluster: etcd holds exactly the sidecar's meta fields, kvcar accepts its
// HTTP heartbeats, lists its stream in live mode and synchronises it from
// its first KV event.
func checkVLLMSidecar(t *testing.T, etcd *etcdembed.Server, kv *KVCar) {
	t.Helper()
	vllm, err := StartEngines([]enginesim.Config{VLLMSidecar(enginesim.Config{BlockSize: 16, DeviceBlocks: 64},
		etcd.Endpoints(), "devcluster-test", 100*time.Millisecond, kv.InternalURL())})
	if err != nil {
		t.Fatal(err)
	}
	defer vllm.Close()
	vl := vllm[0]
	cli, err := etcd.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	got, err := cli.Get(t.Context(), "/devcluster-test/XLLM:DEFAULT:"+vl.Name())
	if err != nil || len(got.Kvs) != 1 {
		t.Fatalf("sidecar key of %s: %v %v", vl.Name(), got, err)
	}
	var meta map[string]any
	if err := json.Unmarshal(got.Kvs[0].Value, &meta); err != nil {
		t.Fatal(err)
	}
	keys := slices.Sorted(maps.Keys(meta))
	if want := []string{"backend_type", "incarnation_id", "name", "register_ts_ms", "rpc_address", "type"}; !slices.Equal(keys, want) ||
		meta["backend_type"] != "vllm" || meta["name"] != vl.Name() || meta["type"] != float64(0) {
		t.Fatalf("sidecar meta %s, want the keys %v", got.Kvs[0].Value, want)
	}
	if err := vllm.WaitHeartbeats(t.Context(), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	st, err := kv.WaitStream(t.Context(), vl.Name(), 10*time.Second)
	if err != nil || st.SyncMode != "live" || st.Synchronized {
		t.Fatalf("vLLM stream before any event: %+v %v", st, err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := vl.WaitSubscribed(ctx, 0, 1); err != nil {
		t.Fatal(err)
	}
	if _, _, err := vl.Prefill(0, make([]uint32, 32)); err != nil {
		t.Fatal(err)
	}
	for {
		if st, err = kv.WaitStream(ctx, vl.Name(), 10*time.Second); err != nil {
			t.Fatal(err)
		}
		if st.Synchronized && st.Complete && st.DeviceBlocks == 2 {
			break
		}
		if err := sleep(ctx, pollInterval); err != nil {
			t.Fatalf("vLLM stream after its first event: %+v", st)
		}
	}
}

// TestWaitSyncedReturnsWhenKVCarExits: a kvcar that cannot start ends the
// wait at once with its exit, instead of the wait running out.
func TestWaitSyncedReturnsWhenKVCarExits(t *testing.T) {
	if testing.Short() {
		t.Skip("builds kvcar and runs it as a process")
	}
	bin, err := BuildKVCar(t.Context(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	kv, err := StartKVCar(KVCarOptions{Binary: bin, ConfigFile: "/nonexistent/kv_events.json", Args: []string{"--no_such_flag"}})
	if err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	err = kv.WaitSynced(t.Context(), 1, time.Minute)
	if err == nil || !strings.Contains(err.Error(), "exited") {
		t.Fatalf("WaitSynced: %v, want kvcar's exit", err)
	}
	if took := time.Since(began); took > 30*time.Second {
		t.Fatalf("WaitSynced took %v to notice the exit", took)
	}
	if err := kv.Stop(); err == nil {
		t.Fatal("Stop of a kvcar that failed reports no error")
	}
}

func TestWriteConfigRoundTrips(t *testing.T) {
	c := DiscoveryConfig(16, 200*time.Millisecond)
	c.MaxBlocksPerStream, c.MaxMessageBytes, c.MaxBufferedBytes = 16384, 1<<20, 2<<20
	path, err := WriteConfig(t.TempDir(), c)
	if err != nil {
		t.Fatal(err)
	}
	got, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	d := got.Discovery
	if !d.Enabled || d.BlockSize != 16 || d.Topic != Topic || d.RefreshInterval != 200*time.Millisecond ||
		d.EventPortOffset != enginesim.DefaultEventPortOffset || d.ReplayPortOffset != enginesim.DefaultReplayPortOffset {
		t.Fatalf("discovery read back as %+v", d)
	}
	if got.MaxBlocksPerStream != 16384 || got.MaxMessageBytes != 1<<20 || got.MaxBufferedBytes != 2<<20 || len(got.Streams) != 0 {
		t.Fatalf("limits read back as %d blocks, %d message bytes, %d buffered bytes, %d streams",
			got.MaxBlocksPerStream, got.MaxMessageBytes, got.MaxBufferedBytes, len(got.Streams))
	}

	c.MaxBufferedBytes = c.MaxMessageBytes - 1
	if _, err := WriteConfig(t.TempDir(), c); err == nil || !strings.Contains(err.Error(), "max_buffered_bytes") {
		t.Fatalf("a buffer below max_message_bytes: %v, want the key named", err)
	}
}

func TestProcessReadings(t *testing.T) {
	rss, peak, err := Memory(os.Getpid())
	if err != nil || rss <= 0 || peak < rss {
		t.Fatalf("Memory: rss %d, peak %d, %v", rss, peak, err)
	}
	// Burn a little CPU so that at least one tick is counted.
	deadline := time.Now().Add(50 * time.Millisecond)
	for x := 0; time.Now().Before(deadline); x++ {
		_ = x * x
	}
	cpu, err := CPUTime(os.Getpid())
	if err != nil || cpu <= 0 {
		t.Fatalf("CPUTime: %v, %v", cpu, err)
	}
	if _, _, err := Memory(-1); err == nil {
		t.Fatal("Memory of pid -1 gave no error")
	}
}
