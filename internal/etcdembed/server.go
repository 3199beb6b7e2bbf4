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
	"sync"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap/zapcore"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/kvcar/kvcar/internal/freeport"
	"github.com/kvcar/kvcar/internal/zapslog"
)

// DefaultReadyTimeout bounds how long Start waits for the server to
// accept requests when Options.ReadyTimeout is zero.
const DefaultReadyTimeout = 20 * time.Second

// portAttempts is how many sets of free ports Start tries: a port found
// free can be taken by another process before the server binds it.
const portAttempts = 5

// Options configures a Server.
type Options struct {
	// Dir holds the server's data. Empty means a new temporary directory,
	// removed by Close; a directory given here is left in place.
	Dir string
	// Logger receives the server's errors; nil discards them.
	Logger *slog.Logger
	// ReadyTimeout bounds each wait for the server to become ready;
	// zero means DefaultReadyTimeout.
	ReadyTimeout time.Duration
}

// Server is an embedded single-member etcd. Its methods are safe for
// concurrent use.
type Server struct {
	log          *slog.Logger
	dir          string
	ownDir       bool
	readyTimeout time.Duration
	clientURL    url.URL // public, relayed by proxy
	innerURL     url.URL // the server's own client listener
	peerURL      url.URL

	mu          sync.Mutex
	etcd        *embed.Etcd
	proxy       *proxy
	partitioned bool
	stalled     bool
	closed      bool
}

// Start creates a server on free loopback ports (the public client
// port, the server's own client port behind it, and the peer port) and
// waits until it serves requests, or until ctx ends or the ready timeout
// passes.
func Start(ctx context.Context, opts Options) (*Server, error) {
	s := &Server{log: opts.Logger, readyTimeout: opts.ReadyTimeout}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.readyTimeout <= 0 {
		s.readyTimeout = DefaultReadyTimeout
	}
	if opts.Dir == "" {
		dir, err := os.MkdirTemp("", "etcdembed-")
		if err != nil {
			return nil, fmt.Errorf("etcdembed: data directory: %w", err)
		}
		s.dir, s.ownDir = dir, true
	} else {
		if err := os.MkdirAll(opts.Dir, 0o700); err != nil {
			return nil, fmt.Errorf("etcdembed: data directory: %w", err)
		}
		s.dir = opts.Dir
	}

	var err error
	for range portAttempts {
		var ports [3]int
		if ports, err = freePorts(); err != nil {
			break
		}
		s.clientURL = loopbackURL(ports[0])
		s.innerURL = loopbackURL(ports[1])
		s.peerURL = loopbackURL(ports[2])
		s.proxy = newProxy(s.innerURL.Host)
		if err = s.Start(ctx); err == nil || !addrInUse(err) {
			break
		}
		s.log.Debug("etcdembed: port taken, retrying", "ports", ports)
	}
	if err != nil {
		s.removeDir()
		return nil, err
	}
	return s, nil
}

// Endpoint is the client URL, for example "http://127.0.0.1:41234".
func (s *Server) Endpoint() string { return s.clientURL.String() }

// Endpoints is Endpoint as the list clientv3.Config wants.
func (s *Server) Endpoints() []string { return []string{s.Endpoint()} }

// Dir is the data directory.
func (s *Server) Dir() string { return s.dir }

// Client returns a new client of Endpoint. The caller closes it.
func (s *Server) Client() (*clientv3.Client, error) { return s.client(s.Endpoint()) }

// DirectClient returns a new client of DirectEndpoint. The caller closes
// it.
func (s *Server) DirectClient() (*clientv3.Client, error) { return s.client(s.DirectEndpoint()) }

func (s *Server) client(endpoint string) (*clientv3.Client, error) {
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{endpoint},
		DialTimeout: 2 * time.Second,
		Logger:      zapslog.New(s.log, zapcore.ErrorLevel, "etcd: ", nil),
		// Reconnect soon after a restart: gRPC's default backoff grows
		// to two minutes.
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: time.Second,
		})},
	})
	if err != nil {
		return nil, fmt.Errorf("etcdembed: client: %w", err)
	}
	return cli, nil
}

// Start starts a stopped server again on the same directory and ports,
// so that its clients reconnect to the same data. Starting a running
// server does nothing.
func (s *Server) Start(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errors.New("etcdembed: server closed")
	}
	if s.etcd != nil {
		return nil
	}
	cfg := embed.NewConfig()
	cfg.Name = "etcdembed"
	cfg.Dir = s.dir
	cfg.ListenClientUrls = []url.URL{s.innerURL}
	cfg.AdvertiseClientUrls = []url.URL{s.clientURL}
	cfg.ListenPeerUrls = []url.URL{s.peerURL}
	cfg.AdvertisePeerUrls = []url.URL{s.peerURL}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	// A 10 ms tick makes etcd's minimum lease TTL one second instead of
	// two, and elects the single member at once.
	cfg.TickMs = 10
	cfg.ElectionMs = 100
	// Nothing here must survive a machine crash, only a server restart
	// inside the process, which the page cache already guarantees.
	cfg.UnsafeNoFsync = true
	cfg.LogLevel = "error"
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zapslog.New(s.log, zapcore.ErrorLevel, "etcd: ", routineServerNoise))

	begin := time.Now()
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return fmt.Errorf("etcdembed: start on %s: %w", s.clientURL.Host, err)
	}
	timer := time.NewTimer(s.readyTimeout)
	defer timer.Stop()
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return fmt.Errorf("etcdembed: server failed before ready: %w", err)
	case <-timer.C:
		e.Close()
		return fmt.Errorf("etcdembed: server not ready after %v", s.readyTimeout)
	case <-ctx.Done():
		e.Close()
		return fmt.Errorf("etcdembed: waiting for ready: %w", ctx.Err())
	}
	if !s.partitioned {
		if err := s.proxy.open(s.clientURL.Host); err != nil {
			e.Close()
			return err
		}
	}
	s.etcd = e
	s.log.Debug("etcdembed: ready", "endpoint", s.Endpoint(), "dir", s.dir, "took", time.Since(begin))
	return nil
}

// DirectEndpoint is the server's own client URL, which neither
// Partition nor Stall affects: a test uses it to change data while its
// subjects are cut off.
func (s *Server) DirectEndpoint() string { return s.innerURL.String() }

// Partition cuts every connection to Endpoint and refuses new ones while
// the server keeps running, as a network partition between the clients
// and etcd would: clients fail fast. Heal ends it.
func (s *Server) Partition() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.partitioned = true
	s.proxy.shut()
}

// Stall black-holes Endpoint while the server keeps running: every
// connection stays open and new ones are accepted, but no byte passes
// in either direction, so nothing fails fast and a client notices only
// by its own timeouts. Heal or Resume ends it. A stall lasts across Stop
// and Start.
func (s *Server) Stall() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stalled = true
	s.proxy.stall()
}

// Heal lets clients reach Endpoint again after Partition or Stall. The
// connections a stall held are closed, with the bytes it held back, as
// TCP connections through a black hole time out in the end: clients
// reconnect, and a request sent during the stall either failed or is
// sent again by its client.
func (s *Server) Heal() error { return s.heal(true) }

// Resume ends a stall keeping its connections: the bytes held back are
// delivered and the connections carry on, as TCP does when a black hole
// lasts less than its retransmission timeouts. After a Partition it is
// Heal.
func (s *Server) Resume() error { return s.heal(false) }

func (s *Server) heal(drop bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stalled {
		s.stalled = false
		s.proxy.unstall(drop)
	}
	if !s.partitioned {
		return nil
	}
	s.partitioned = false
	if s.etcd == nil {
		return nil // stopped: Start opens the endpoint
	}
	return s.proxy.open(s.clientURL.Host)
}

// Stop stops the server and keeps its data, as an etcd outage would;
// Start brings it back. Stopping a stopped server does nothing.
func (s *Server) Stop() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stopLocked()
}

func (s *Server) stopLocked() error {
	if s.etcd == nil {
		return nil
	}
	e := s.etcd
	s.etcd = nil
	s.proxy.shut()
	e.Close()
	// Close has closed Err; a value left in it is a failure while
	// serving that nobody has seen yet.
	for err := range e.Err() {
		if err != nil && !benignServeError(err) {
			return fmt.Errorf("etcdembed: server error: %w", err)
		}
	}
	return nil
}

// Close stops the server and removes its data directory if Start made it.
func (s *Server) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	err := s.stopLocked()
	if rerr := s.removeDir(); err == nil {
		err = rerr
	}
	return err
}

func (s *Server) removeDir() error {
	if !s.ownDir {
		return nil
	}
	if err := os.RemoveAll(s.dir); err != nil {
		return fmt.Errorf("etcdembed: remove data directory: %w", err)
	}
	return nil
}

// freePorts finds three distinct free loopback ports, outside the
// kernel's ephemeral range: Stop lets them go and Start binds them again,
// and inside that range any other process's connection could take one
// meanwhile (freeport).
func freePorts() ([3]int, error) {
	var ports [3]int
	p, err := freeport.Loopback(len(ports))
	if err != nil {
		return ports, fmt.Errorf("etcdembed: find free ports: %w", err)
	}
	copy(ports[:], p)
	return ports, nil
}

func loopbackURL(port int) url.URL {
	return url.URL{Scheme: "http", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(port))}
}

func addrInUse(err error) bool {
	return errors.Is(err, syscall.EADDRINUSE) || strings.Contains(err.Error(), "address already in use")
}

// routineServerNoise reports the error entries that every start and stop
// of a healthy embedded server writes: listeners closed under their
// servers by Close, and a fresh member's schema check before its first
// raft term.
func routineServerNoise(msg string, fields map[string]any) bool {
	errText, _ := fields["error"].(string)
	switch msg {
	case "setting up serving from embedded etcd failed.":
		return benignServeError(errors.New(errText))
	case "failed to update storage version":
		return strings.Contains(errText, "missing term information")
	}
	return false
}

// benignServeError reports the errors that closing the listeners under a
// running server produces by design.
func benignServeError(err error) bool {
	if errors.Is(err, net.ErrClosed) {
		return true
	}
	msg := strings.ToLower(err.Error())
	return strings.Contains(msg, "use of closed network connection") ||
		strings.Contains(msg, "server closed") ||
		strings.Contains(msg, "server has been stopped") ||
		strings.Contains(msg, "mux: listener closed")
}
