// Command kvcar is a KV-cache-aware router for xLLM engines: it keeps a
// prefix directory fed by the engines' KV events and serves prefix-hit
// queries on its HTTP port.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/kvcar/kvcar/internal/config"
	"github.com/kvcar/kvcar/internal/kvdir"
	"github.com/kvcar/kvcar/internal/server"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stderr, nil); err != nil {
		fmt.Fprintln(os.Stderr, "kvcar:", err)
		os.Exit(1)
	}
}

// flags are named as xllm_master_serving names them.
type flags struct {
	host             string
	port             int
	kvEventsConfig   string
	internalAPIToken string
	logLevel         string
	logFormat        string
}

func parseFlags(args []string, out io.Writer) (*flags, error) {
	fs := flag.NewFlagSet("kvcar", flag.ContinueOnError)
	fs.SetOutput(out)
	f := &flags{}
	fs.StringVar(&f.host, "host", "", "address to listen on (empty: all interfaces)")
	fs.IntVar(&f.port, "port", 8888, "HTTP port of the service (OpenAI API, internal API, metrics)")
	fs.StringVar(&f.kvEventsConfig, "kv_events_config_file", "", "path of the KV events config JSON; empty disables the KV index")
	fs.StringVar(&f.internalAPIToken, "internal_api_token", "", "when set, internal endpoints require this X-Internal-Token")
	fs.StringVar(&f.logLevel, "log_level", "info", "log level: debug, info, warn or error")
	fs.StringVar(&f.logFormat, "log_format", "text", "log format: text or json")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	if f.port < 0 || f.port > 65535 {
		return nil, fmt.Errorf("--port = %d: must be in [0, 65535]", f.port)
	}
	return f, nil
}

func newLogger(f *flags, out io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(f.logLevel)); err != nil {
		return nil, fmt.Errorf("--log_level = %q: must be one of debug, info, warn, error", f.logLevel)
	}
	opts := &slog.HandlerOptions{Level: level}
	switch strings.ToLower(f.logFormat) {
	case "text":
		return slog.New(slog.NewTextHandler(out, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(out, opts)), nil
	}
	return nil, fmt.Errorf("--log_format = %q: must be text or json", f.logFormat)
}

// run starts the service and blocks until ctx ends. When ready is not
// nil it receives the listening address once the service is ready.
func run(ctx context.Context, args []string, logOut io.Writer, ready chan<- string) error {
	f, err := parseFlags(args, logOut)
	if err != nil {
		return err
	}
	log, err := newLogger(f, logOut)
	if err != nil {
		return err
	}

	var dir *kvdir.Directory
	if f.kvEventsConfig == "" {
		log.Warn("--kv_events_config_file is empty: the KV index is disabled and every prefix hit ratio is 0")
	} else {
		cfg, err := config.Load(f.kvEventsConfig)
		if err != nil {
			return err
		}
		dir, err = kvdir.New(kvdir.LimitsFromConfig(cfg), kvdir.Options{Logger: log})
		if err != nil {
			return err
		}
		defer dir.Close()
		if err := dir.SetStreams(kvdir.StaticSpecs(cfg)); err != nil {
			return err
		}
		log.Info("KV index enabled", "config", f.kvEventsConfig, "static_streams", len(cfg.Streams))
	}

	opts := server.Options{InternalAPIToken: f.internalAPIToken, Logger: log}
	if dir != nil {
		opts.Directory = dir
	}
	srv := server.New(opts)
	ln, err := net.Listen("tcp", net.JoinHostPort(f.host, fmt.Sprint(f.port)))
	if err != nil {
		return fmt.Errorf("listen on port %d: %w", f.port, err)
	}
	hs := &http.Server{
		Handler:           srv.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       60 * time.Second,
		IdleTimeout:       120 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	srv.SetReady(true)
	log.Info("kvcar serving", "addr", ln.Addr().String(),
		"query", fmt.Sprintf("http://%s/v1/internal/kv-cache/query", ln.Addr()))
	if ready != nil {
		ready <- ln.Addr().String()
	}

	select {
	case err := <-errc:
		return fmt.Errorf("http server: %w", err)
	case <-ctx.Done():
	}
	srv.SetReady(false)
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := hs.Shutdown(shutdownCtx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("http shutdown: %w", err)
	}
	log.Info("kvcar stopped")
	return nil
}
