package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvcar/kvcar/internal/config"
	"github.com/kvcar/kvcar/internal/enginesim"
	"github.com/kvcar/kvcar/internal/kvdir"
	"github.com/kvcar/kvcar/internal/kvevent"
	"github.com/kvcar/kvcar/internal/server"
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
	kv := startKVCarProcess(t, "--kv_events_config_file="+cfgPath, "--etcd_addr="+etcd.Endpoint())
	waitStreamsSynced(t, kv.addr, streams)
	base, _ := procMemory(t, kv.pid())

	// 1-byte hashes in one BlockRemoved: 8 bytes of decoded records per
	// wire byte, the most any payload decodes to. The hashes are not
	// resident, so the stream applies every message and stays in sync.
	var worst kvevent.Batch
	hashes := make([]kvevent.EngineHash, maxMsg-64)
	for i := range hashes {
		hashes[i] = kvevent.EngineHash(i % 128)
	}
	worst.AddRemoved(hashes, kvevent.Device)
	payload := kvevent.AppendBatch(nil, &worst, kvevent.Shape{})
	if len(payload) > maxMsg {
		t.Fatalf("adversarial payload %d bytes, over the limit %d", len(payload), maxMsg)
	}

	began := time.Now()
	for r := range rounds {
		kv.signal(syscall.SIGSTOP)
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
		kv.signal(syscall.SIGCONT)
		time.Sleep(500 * time.Millisecond)
	}
	_, peak := procMemory(t, kv.pid())
	waitStreamsSynced(t, kv.addr, streams)
	t.Logf("%d rounds of %d messages of %d bytes per stream in %v: kvcar peak RSS %.1f MiB, %.1f MiB at start; bound %.1f MiB above the start",
		rounds, perRound, len(payload), time.Since(began).Round(time.Millisecond),
		float64(peak)/(1<<20), float64(base)/(1<<20), float64(bound)/(1<<20))
	if peak > base+bound {
		t.Fatalf("kvcar peak RSS %d bytes: over its %d at start plus the bound %d", peak, base, bound)
	}
}

// kvcarProcess is kvcar run as a process of its own.
type kvcarProcess struct {
	t    *testing.T
	cmd  *exec.Cmd
	addr string
}

func (k *kvcarProcess) pid() int { return k.cmd.Process.Pid }

func (k *kvcarProcess) signal(sig syscall.Signal) {
	k.t.Helper()
	if err := k.cmd.Process.Signal(sig); err != nil {
		k.t.Fatalf("signal %v: %v", sig, err)
	}
}

// buildKVCar builds the command as shipped, without the race detector
// whose shadow memory would swamp what is measured.
func buildKVCar(t *testing.T) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	bin := filepath.Join(t.TempDir(), "kvcar")
	out, err := exec.Command(goBin, "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

func startKVCarProcess(t *testing.T, args ...string) *kvcarProcess {
	t.Helper()
	bin := buildKVCar(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	cmd := exec.Command(bin, append([]string{"--port=" + strconv.Itoa(port), "--host=127.0.0.1",
		"--advertise_host=127.0.0.1", "--log_level=warn"}, args...)...)
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	k := &kvcarProcess{t: t, cmd: cmd, addr: "127.0.0.1:" + strconv.Itoa(port)}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Signal(syscall.SIGTERM)
		stopping := time.Now()
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("kvcar exited: %v\n%s", err, logs.String())
			}
			t.Logf("kvcar stopped %v after SIGTERM", time.Since(stopping).Round(time.Millisecond))
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-done
			t.Errorf("kvcar did not stop within 15s of SIGTERM\n%s", logs.String())
		}
	})
	return k
}

// waitStreamsSynced polls the query API until n streams are synchronised.
func waitStreamsSynced(t *testing.T, addr string, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		synced := 0
		// Connection errors are expected until the process listens.
		if resp, err := http.Post("http://"+addr+server.QueryPath, "application/json", strings.NewReader(`{"token_ids":[]}`)); err == nil {
			var qr queryResponse
			if resp.StatusCode == http.StatusOK && json.NewDecoder(resp.Body).Decode(&qr) == nil {
				for _, m := range qr.Matches {
					if m.Synchronized {
						synced++
					}
				}
			}
			resp.Body.Close()
		}
		if synced == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d streams synchronised after 30s", synced, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// procMemory reads a process's resident memory now and at its peak.
func procMemory(t *testing.T, pid int) (rss, peak int64) {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 {
			continue
		}
		kb, err := strconv.ParseInt(fields[1], 10, 64)
		if err != nil {
			continue
		}
		switch fields[0] {
		case "VmRSS:":
			rss = kb << 10
		case "VmHWM:":
			peak = kb << 10
		}
	}
	if rss == 0 || peak == 0 {
		t.Fatalf("no VmRSS/VmHWM in /proc/%d/status", pid)
	}
	return rss, peak
}
