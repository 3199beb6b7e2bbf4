package main

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvcar/kvcar/internal/config"
	"github.com/kvcar/kvcar/internal/devcluster"
	"github.com/kvcar/kvcar/internal/enginesim"
	"github.com/kvcar/kvcar/internal/kvdir"
	"github.com/kvcar/kvcar/internal/kvevent"
)

// TestMemoryBoundUnderAdversary covers R-CFG-2: whatever the engines
// send, kvcar's resident memory stays within what its limits allow
// (kvdir.MemoryBound). kvcar runs as its own process; its engines send
// the messages that cost a subscriber the most (at max_message_bytes,
// decoding to the most records per byte) while kvcar is stopped with
// SIGSTOP, so that on SIGCONT everything the sockets can hold arrives at
// once, as after a stall. With libzmq's default receive HWM the queues
// alone would exceed the bound many times over.
func TestMemoryBoundUnderAdversary(t *testing.T) {
	if testing.Short() {
		t.Skip("runs kvcar as a process and floods it")
	}
	const (
		streams   = 4
		block     = 16
		maxBlocks = 16384
		maxMsg    = 256 << 10
		maxBuf    = 512 << 10
		rounds    = 6
		perRound  = 200 // per engine, below its send HWM of 1000
	)
	var cfgs []enginesim.Config
	for i := range streams {
		cfgs = append(cfgs, enginesim.Config{Name: fmt.Sprintf("127.0.0.1:%d", 8300+i), BlockSize: block, DeviceBlocks: 1024, Topic: "xllm-kv"})
	}
	engines, specs := startStaticEngines(t, cfgs...)
	cfgText := fmt.Sprintf(`{"max_blocks_per_stream":%d,"max_message_bytes":%d,"max_buffered_bytes":%d,"resync_interval_ms":0,"streams":[%s]}`,
		maxBlocks, maxMsg, maxBuf, strings.Join(specs, ","))
	cfgPath := writeConfig(t, cfgText)
	cfg, err := config.Load(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	bound := kvdir.LimitsFromConfig(cfg).MemoryBound().Process(streams)

	etcd := startEtcd(t)
	kv := startKVCarProcess(t, etcd.Endpoints(), cfgPath)
	if err := kv.WaitSynced(t.Context(), streams, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	base, _, err := devcluster.Memory(kv.Pid())
	if err != nil {
		t.Fatal(err)
	}

	// 1-byte hashes in one BlockRemoved: 8 bytes of decoded records per
	// wire byte, the most any payload decodes to. The hashes are not
	// resident, so the stream applies every message and stays in sync.
	var worst kvevent.Batch
	hashes := make([]kvevent.EngineHash, maxMsg-64)
	for i := range hashes {
		hashes[i] = kvevent.IntHash(uint64(i % 128))
	}
	worst.AddRemoved(hashes, kvevent.Device)
	payload := kvevent.AppendBatch(nil, &worst, kvevent.Shape{})
	if len(payload) > maxMsg {
		t.Fatalf("adversarial payload %d bytes, over the limit %d", len(payload), maxMsg)
	}

	began := time.Now()
	for r := range rounds {
		if err := kv.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for _, e := range engines {
			wg.Go(func() {
				for range perRound {
					if err := e.SendRaw(0, payload); err != nil {
						t.Errorf("round %d: %v", r, err)
						return
					}
				}
			})
		}
		wg.Wait()
		if err := kv.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	_, peak, err := devcluster.Memory(kv.Pid())
	if err != nil {
		t.Fatal(err)
	}
	if err := kv.WaitSynced(t.Context(), streams, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d rounds of %d messages of %d bytes per stream in %v: kvcar peak RSS %.1f MiB, %.1f MiB at start; bound %.1f MiB above the start",
		rounds, perRound, len(payload), time.Since(began).Round(time.Millisecond),
		float64(peak)/(1<<20), float64(base)/(1<<20), float64(bound)/(1<<20))
	if peak > base+bound {
		t.Fatalf("kvcar peak RSS %d bytes: over its %d at start plus the bound %d", peak, base, bound)
	}
}

// startKVCarProcess builds kvcar and runs it as a process of its own,
// stopped at the end of the test.
func startKVCarProcess(t *testing.T, etcd []string, cfgPath string) *devcluster.KVCar {
	t.Helper()
	bin, err := devcluster.BuildKVCar(t.Context(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	// Read only once Stop has returned: until then kvcar's output is
	// still being copied into it.
	var logs bytes.Buffer
	kv, err := devcluster.StartKVCar(devcluster.KVCarOptions{
		Binary: bin, Etcd: etcd, ConfigFile: cfgPath,
		Args: []string{"--host=127.0.0.1", "--log_level=warn"}, Stdout: &logs, Stderr: &logs,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stopping := time.Now()
		if err := kv.Stop(); err != nil {
			t.Error(err)
		} else {
			t.Logf("kvcar stopped %v after SIGTERM", time.Since(stopping).Round(time.Millisecond))
		}
		if t.Failed() {
			t.Logf("kvcar output:\n%s", logs.String())
		}
	})
	return kv
}
