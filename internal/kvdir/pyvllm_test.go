package kvdir

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvcar/kvcar/internal/config"
)

// pyVLLM drives testdata/vllm_publisher.py: a vLLM-format publisher that
// nobody here wrote the encoder of, on Debian's python3-zmq and
// python3-msgpack.
type pyVLLM struct {
	t      *testing.T
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string
	pub    string
	router string
}

const pythonBin = "/usr/bin/python3"

func requirePyVLLM(t *testing.T) {
	t.Helper()
	if err := exec.Command(pythonBin, "-c", "import zmq, msgpack").Run(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("python3-zmq and python3-msgpack are required in CI (scripts/deps.sh): %v", err)
		}
		t.Skipf("skipping the vLLM-format interop test: %s cannot import zmq and msgpack (install Debian's python3-zmq and python3-msgpack): %v", pythonBin, err)
	}
}

func startPyVLLM(t *testing.T, args ...string) *pyVLLM {
	t.Helper()
	requirePyVLLM(t)
	cmd := exec.Command(pythonBin, append([]string{"testdata/vllm_publisher.py"}, args...)...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &pyVLLM{t: t, cmd: cmd, stdin: stdin, lines: make(chan string, 64)}
	go func() {
		defer close(p.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
	}()
	t.Cleanup(func() {
		_, _ = io.WriteString(stdin, "quit\n")
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(3 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	var pubPort, routerPort string
	fmt.Sscanf(p.expect("ready "), "ready %s %s", &pubPort, &routerPort)
	p.pub, p.router = "tcp://127.0.0.1:"+pubPort, "tcp://127.0.0.1:"+routerPort
	return p
}

func (p *pyVLLM) expect(prefix string) string {
	p.t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case line, ok := <-p.lines:
			if !ok {
				p.t.Fatalf("publisher exited while waiting for %q", prefix)
			}
			if strings.HasPrefix(line, prefix) {
				return line
			}
		case <-deadline:
			p.t.Fatalf("timed out waiting for %q from the publisher", prefix)
		}
	}
}

func (p *pyVLLM) do(cmd string, tokens []uint32) {
	p.t.Helper()
	var b strings.Builder
	b.WriteString(cmd)
	for _, tok := range tokens {
		b.WriteByte(' ')
		b.WriteString(strconv.FormatUint(uint64(tok), 10))
	}
	if _, err := io.WriteString(p.stdin, b.String()+"\n"); err != nil {
		p.t.Fatal(err)
	}
	p.expect("ok")
}

// pyWorkload stores, extends, evicts and clears prompts on the Python
// publisher and checks after each step that the stream reports exactly
// the prefix the publisher holds, at sequence seq on.
func pyWorkload(t *testing.T, d *Directory, k StreamKey, p *pyVLLM, seq uint64) {
	t.Helper()
	a, b := seqTokens(151600, 3*testBlock), seqTokens(9000, 2*testBlock+1)
	ab := concat(a, b)
	step := func(what string, want map[string]int) {
		t.Helper()
		eventually(t, what, 10*time.Second, func() (bool, string) {
			m := matchOf(t, d, k, nil)
			if !m.Synchronized || m.Sequence < seq {
				return false, describe(m)
			}
			for name, tokens := range map[string][]uint32{"a": a, "ab": ab} {
				if got := matchOf(t, d, k, tokens).DeviceHitTokens; got != want[name] {
					return false, fmt.Sprintf("%s: hit %d, want %d", name, got, want[name])
				}
			}
			return true, ""
		})
		seq++
	}
	p.do("store", a)
	step("prompt a stored", map[string]int{"a": 3 * testBlock, "ab": 3 * testBlock})
	p.do("store", ab)
	step("prompt a+b stored on a's prefix", map[string]int{"a": 3 * testBlock, "ab": 5 * testBlock})
	p.do("evict", ab)
	step("last block of a+b evicted", map[string]int{"a": 3 * testBlock, "ab": 4 * testBlock})
	p.do("clear", nil)
	step("all blocks cleared", map[string]int{"a": 0, "ab": 0})
	if m := matchOf(t, d, k, nil); m.Error != "" || !m.Complete {
		t.Fatalf("after the clear: %s complete=%v", describe(m), m.Complete)
	}
}

// Step 4's independent peer, live mode: vLLM's default configuration (a
// bound PUB, topic "", no replay endpoint), sha256 block hashes, batches
// packed by Python's msgpack.
func TestPythonVLLMPublisherLive(t *testing.T) {
	p := startPyVLLM(t, "bind", "tcp://127.0.0.1:0", "-", "-", strconv.Itoa(testBlock), "10000")
	d := newDirectory(t, testLimits(), StreamSpec{InstanceName: "py-vllm", Endpoint: p.pub, Mode: config.SyncLive,
		AnyRank: true, BlockSize: testBlock, HashSeed: 1024})
	p.expect("subscribed")
	pyWorkload(t, d, StreamKey{"py-vllm", 0}, p, 0)
}

// History mode with vLLM 0.26's topic frames and a per-pod topic: what
// the publisher sent before the directory existed comes from its
// history.
func TestPythonVLLMPublisherHistory(t *testing.T) {
	p := startPyVLLM(t, "bind", "tcp://127.0.0.1:0", "tcp://127.0.0.1:0", "kv@pod-1@model", strconv.Itoa(testBlock), "10000", "topic-frames")
	early := seqTokens(70000, 2*testBlock)
	p.do("store", early)
	d := newDirectory(t, testLimits(), StreamSpec{InstanceName: "py-vllm", Endpoint: p.pub, ReplayEndpoint: p.router,
		Topic: "kv@pod-1@model", Mode: config.SyncHistory, AnyRank: true, BlockSize: testBlock, HashSeed: 1024})
	k := StreamKey{"py-vllm", 0}
	m := waitMatch(t, d, k, "history replayed", func(m Match) bool { return m.Synchronized })
	if !m.Complete || matchOf(t, d, k, early).DeviceHitTokens != len(early) {
		t.Fatalf("history view: %s complete=%v", describe(m), m.Complete)
	}
	pyWorkload(t, d, k, p, 1)
}

// Bound-subscriber mode: kvcar binds, the Python PUB connects, as vLLM
// does with a non-wildcard endpoint.
func TestPythonVLLMPublisherDials(t *testing.T) {
	port := freePorts(t, 1)
	bind := fmt.Sprintf("tcp://127.0.0.1:%d", port)
	d := newDirectory(t, testLimits(), StreamSpec{InstanceName: "py-vllm", Endpoint: bind, Topic: "kv@py", Mode: config.SyncLive,
		AnyRank: true, Bind: bind, BindPorts: 1, BlockSize: testBlock, HashSeed: 1024})
	waitRelayed(t, d, bind, 1)
	p := startPyVLLM(t, "connect", bind, "-", "kv@py", strconv.Itoa(testBlock), "10000")
	// A PUB that dials drops what it sends before the subscription
	// reaches it; the view is complete only if its first message is the
	// publisher's sequence 0, so wait for the link first.
	p.expect("subscribed")
	pyWorkload(t, d, StreamKey{"py-vllm", 0}, p, 0)
}
