package etcdembed

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvcar/kvcar/internal/freeport"
	"github.com/kvcar/kvcar/internal/testlog"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func testLogger() *slog.Logger {
	level := slog.LevelError
	if os.Getenv("KVCAR_TEST_LOG") != "" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

func start(t *testing.T) *Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	begin := time.Now()
	s, err := Start(ctx, Options{Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("embedded etcd ready in %v at %s", time.Since(begin), s.Endpoint())
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	})
	return s
}

func client(t *testing.T, s *Server) *clientv3.Client {
	t.Helper()
	cli, err := s.Client()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// cutOffPair returns a client through the relay that has written key,
// and one on the direct endpoint that faults do not reach.
func cutOffPair(t *testing.T, ctx context.Context, s *Server, key string) (cli, direct *clientv3.Client) {
	t.Helper()
	cli = client(t, s)
	direct, err := s.DirectClient()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { direct.Close() })
	if _, err := cli.Put(ctx, key, "before"); err != nil {
		t.Fatal(err)
	}
	return cli, direct
}

// The registry tests (R-DISC, R-TEST) rely on a real server that keeps
// data, revisions and watches across a restart on the same port.
func TestRestartKeepsDataAndWatchResumes(t *testing.T) {
	s := start(t)
	cli := client(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	put, err := cli.Put(ctx, "k", "v1")
	if err != nil {
		t.Fatal(err)
	}
	wch := cli.Watch(ctx, "k", clientv3.WithRev(put.Header.Revision+1))

	begin := time.Now()
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	t.Logf("stop with an open watch took %v", time.Since(begin))
	if err := s.Stop(); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	begin = time.Now()
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("restart took %v", time.Since(begin))

	get, err := cli.Get(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if len(get.Kvs) != 1 || string(get.Kvs[0].Value) != "v1" {
		t.Fatalf("after restart k = %v, want v1", get.Kvs)
	}
	if get.Header.Revision != put.Header.Revision {
		t.Fatalf("revision after restart %d, want %d", get.Header.Revision, put.Header.Revision)
	}
	if _, err := cli.Put(ctx, "k", "v2"); err != nil {
		t.Fatal(err)
	}
	select {
	case resp := <-wch:
		if err := resp.Err(); err != nil {
			t.Fatal(err)
		}
		if len(resp.Events) != 1 || string(resp.Events[0].Kv.Value) != "v2" {
			t.Fatalf("watch after restart got %v, want the put of v2", resp.Events)
		}
	case <-ctx.Done():
		t.Fatal("watch did not resume after restart")
	}
}

// A restart binds the same three ports again (the client's, the inner
// client's and the peer's). They must lie outside the kernel's ephemeral
// range, where no other socket gets one unasked: inside it, any
// process's connection could take one while the server was stopped, and
// the restart failed with "address already in use" (R-TEST: the registry
// tests restart etcd while other packages' tests run).
func TestPortsLieOutsideTheEphemeralRange(t *testing.T) {
	lo, hi := freeport.EphemeralRange()
	if lo <= 1024 && hi >= 65535 {
		t.Skipf("the ephemeral range %d..%d leaves no port outside it", lo, hi)
	}
	s := start(t)
	for _, u := range []url.URL{s.clientURL, s.innerURL, s.peerURL} {
		port, err := strconv.Atoi(u.Port())
		if err != nil {
			t.Fatalf("%s: %v", u.String(), err)
		}
		if !freeport.Quiet(port, lo, hi) {
			t.Errorf("%s lies in the ephemeral range %d..%d", u.String(), lo, hi)
		}
	}
}

func TestCloseRemovesOwnDir(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := Start(ctx, Options{Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	dir := s.Dir()
	if _, err := os.Stat(dir); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("data directory %s still there after Close: %v", dir, err)
	}
	if err := s.Start(ctx); err == nil {
		t.Fatal("Start after Close succeeded")
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

func TestGivenDirIsKeptAndReused(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := Start(ctx, Options{Dir: dir, Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	cli, err := s.Client()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, "kept", "yes"); err != nil {
		t.Fatal(err)
	}
	cli.Close()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s2, err := Start(ctx, Options{Dir: dir, Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	cli2 := client(t, s2)
	get, err := cli2.Get(ctx, "kept")
	if err != nil {
		t.Fatal(err)
	}
	if len(get.Kvs) != 1 || string(get.Kvs[0].Value) != "yes" {
		t.Fatalf("data in a given directory not kept: %v", get.Kvs)
	}
}

// Two servers in one process must not collide on ports.
func TestTwoServers(t *testing.T) {
	a, b := start(t), start(t)
	if a.Endpoint() == b.Endpoint() {
		t.Fatalf("both servers on %s", a.Endpoint())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ca, cb := client(t, a), client(t, b)
	if _, err := ca.Put(ctx, "only-a", "1"); err != nil {
		t.Fatal(err)
	}
	get, err := cb.Get(ctx, "only-a")
	if err != nil {
		t.Fatal(err)
	}
	if len(get.Kvs) != 0 {
		t.Fatal("servers share data")
	}
}

// A one-second lease must lapse within about a second (the registry's
// lease-expiry tests depend on it).
func TestShortLeaseExpires(t *testing.T) {
	s := start(t)
	cli := client(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	grant, err := cli.Grant(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	put, err := cli.Put(ctx, "leased", "x", clientv3.WithLease(grant.ID))
	if err != nil {
		t.Fatal(err)
	}
	begin := time.Now()
	wch := cli.Watch(ctx, "leased", clientv3.WithRev(put.Header.Revision+1))
	for resp := range wch {
		if len(resp.Events) > 0 && resp.Events[0].Type == clientv3.EventTypeDelete {
			took := time.Since(begin)
			t.Logf("1 s lease lapsed after %v", took)
			if took > 3*time.Second {
				t.Fatalf("1 s lease took %v to lapse", took)
			}
			return
		}
	}
	t.Fatal("lease never lapsed")
}

func TestPartitionCutsClientsOnly(t *testing.T) {
	s := start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cli, direct := cutOffPair(t, ctx, s, "p")

	s.Partition()
	short, scancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err := cli.Get(short, "p")
	scancel()
	if err == nil {
		t.Fatal("client reached etcd through a partition")
	}
	if _, err := direct.Put(ctx, "p", "during"); err != nil {
		t.Fatalf("direct client during partition: %v", err)
	}

	if err := s.Heal(); err != nil {
		t.Fatal(err)
	}
	get, err := cli.Get(ctx, "p")
	if err != nil {
		t.Fatal(err)
	}
	if string(get.Kvs[0].Value) != "during" {
		t.Fatalf("after heal p = %q, want the value written during the partition", get.Kvs[0].Value)
	}
}

// rawConn opens a plain TCP connection to the relay, the way a
// client's connection exists before and during a fault.
func rawConn(t *testing.T, s *Server) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", strings.TrimPrefix(s.Endpoint(), "http://"), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

const versionRequest = "GET /version HTTP/1.1\r\nHost: etcd\r\n\r\n"

// readSome reads what arrives within d: the bytes, or the error.
func readSome(c net.Conn, d time.Duration) (string, error) {
	c.SetReadDeadline(time.Now().Add(d))
	buf := make([]byte, 4096)
	n, err := c.Read(buf)
	return string(buf[:n]), err
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// A stall passes no byte in either direction but closes nothing, on a
// connection open before it and on one opened during it; Resume then
// delivers what was held back on the same connections.
func TestStallHoldsBytesAndResumeDelivers(t *testing.T) {
	s := start(t)
	before := rawConn(t, s)
	if _, err := before.Write([]byte(versionRequest)); err != nil {
		t.Fatal(err)
	}
	if got, err := readSome(before, 5*time.Second); err != nil || !strings.HasPrefix(got, "HTTP/1.1 200") {
		t.Fatalf("before the stall: %q, %v", got, err)
	}

	s.Stall()
	during := rawConn(t, s)
	for _, c := range []net.Conn{before, during} {
		if _, err := c.Write([]byte(versionRequest)); err != nil {
			t.Fatalf("write during the stall: %v", err)
		}
	}
	for name, c := range map[string]net.Conn{"open before": before, "opened during": during} {
		if got, err := readSome(c, 300*time.Millisecond); !isTimeout(err) {
			t.Fatalf("connection %s the stall: read %q, %v; want a timeout with the connection open", name, got, err)
		}
	}
	if err := s.Resume(); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]net.Conn{"open before": before, "opened during": during} {
		if got, err := readSome(c, 5*time.Second); err != nil || !strings.HasPrefix(got, "HTTP/1.1 200") {
			t.Fatalf("connection %s the stall, after Resume: %q, %v; want the held answer", name, got, err)
		}
	}
}

// Heal after a stall closes the connections it held, without delivering
// the held bytes, and new connections work.
func TestStallHealDropsHeldConnections(t *testing.T) {
	s := start(t)
	s.Stall()
	held := rawConn(t, s)
	if _, err := held.Write([]byte(versionRequest)); err != nil {
		t.Fatal(err)
	}
	if _, err := readSome(held, 200*time.Millisecond); !isTimeout(err) {
		t.Fatalf("read during the stall: %v, want a timeout", err)
	}
	if err := s.Heal(); err != nil {
		t.Fatal(err)
	}
	if got, err := readSome(held, 5*time.Second); err == nil || isTimeout(err) {
		t.Fatalf("held connection after Heal: read %q, %v; want it closed without the answer", got, err)
	}
	fresh := rawConn(t, s)
	if _, err := fresh.Write([]byte(versionRequest)); err != nil {
		t.Fatal(err)
	}
	if got, err := readSome(fresh, 5*time.Second); err != nil || !strings.HasPrefix(got, "HTTP/1.1 200") {
		t.Fatalf("new connection after Heal: %q, %v", got, err)
	}
}

// An etcd client sees a stall only as requests that never answer; the
// server keeps taking writes on DirectEndpoint. After Heal the client
// reconnects by itself; after Resume a request sent during the stall is
// answered on its old connection.
func TestStallWithClient(t *testing.T) {
	for _, heal := range []string{"Heal", "Resume"} {
		t.Run(heal, func(t *testing.T) {
			s := start(t)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			cli, direct := cutOffPair(t, ctx, s, "s")

			s.Stall()
			short, scancel := context.WithTimeout(ctx, 300*time.Millisecond)
			_, err := cli.Get(short, "s")
			scancel()
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Get through a stall: %v, want the caller's deadline", err)
			}
			if _, err := direct.Put(ctx, "s", "during"); err != nil {
				t.Fatalf("direct client during the stall: %v", err)
			}
			pending := make(chan error, 1)
			go func() {
				get, err := cli.Get(ctx, "s")
				if err == nil && string(get.Kvs[0].Value) != "during" {
					err = fmt.Errorf("got %q, want the value written during the stall", get.Kvs[0].Value)
				}
				pending <- err
			}()
			select {
			case err := <-pending:
				t.Fatalf("Get answered during the stall: %v", err)
			case <-time.After(200 * time.Millisecond):
			}

			began := time.Now()
			if heal == "Heal" {
				err = s.Heal()
			} else {
				err = s.Resume()
			}
			if err != nil {
				t.Fatal(err)
			}
			if err := <-pending; err != nil {
				t.Fatalf("Get sent during the stall, after %s: %v", heal, err)
			}
			t.Logf("Get sent during the stall answered %v after %s", time.Since(began), heal)
		})
	}
}

// Stop and Close do not wait for connections a stall holds, and a stall
// lasts across a restart until Heal.
func TestStallAcrossRestart(t *testing.T) {
	s := start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	held := rawConn(t, s)
	s.Stall()
	if _, err := held.Write([]byte(versionRequest)); err != nil {
		t.Fatal(err)
	}
	if _, err := readSome(held, 100*time.Millisecond); !isTimeout(err) {
		t.Fatalf("read during the stall: %v", err)
	}
	began := time.Now()
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(began); took > 2*time.Second {
		t.Errorf("Stop with a held connection took %v", took)
	}
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	c := rawConn(t, s)
	if _, err := c.Write([]byte(versionRequest)); err != nil {
		t.Fatal(err)
	}
	if _, err := readSome(c, 200*time.Millisecond); !isTimeout(err) {
		t.Fatalf("after a restart the stall is gone: %v", err)
	}
	if err := s.Heal(); err != nil {
		t.Fatal(err)
	}
	if _, err := readSome(c, 5*time.Second); err == nil || isTimeout(err) {
		t.Fatalf("held connection after Heal: %v, want closed", err)
	}
	cli := client(t, s)
	if _, err := cli.Put(ctx, "after", "heal"); err != nil {
		t.Fatalf("client after Heal: %v", err)
	}
}

// Starting, restarting and closing a healthy server logs no errors: the
// noise etcd writes on every start and stop is filtered, so that an
// error in a test log means something.
func TestQuietLog(t *testing.T) {
	var buf testlog.Buffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelError}))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := Start(ctx, Options{Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	cli, err := s.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	wch := cli.Watch(ctx, "w")
	if _, err := cli.Put(ctx, "w", "1"); err != nil {
		t.Fatal(err)
	}
	<-wch
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if out := buf.String(); out != "" {
		t.Errorf("a healthy start, restart and close logged:\n%s", out)
	}
}
