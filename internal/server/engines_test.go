package server

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvcar/kvcar/internal/etcdembed"
	"github.com/kvcar/kvcar/internal/instance"
	"github.com/kvcar/kvcar/internal/lb"
)

// policyRouter routes with a real policy over a real registry's
// snapshot, as the command wires it.
type policyRouter struct {
	policy lb.Policy
	reg    *instance.Registry
}

func (r policyRouter) Policy() string { return r.policy.Name() }

func (r policyRouter) Route(req lb.Request) (lb.Decision, error) {
	return r.policy.Route(req, r.reg.Snapshot())
}

// routerFor runs an embedded etcd and a registry in which each of names
// is a registered DEFAULT instance, and returns an RR router over them.
func routerFor(tb testing.TB, names ...string) policyRouter {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv, err := etcdembed.Start(ctx, etcdembed.Options{})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { srv.Close() })
	cfg, err := instance.ClientConfig(srv.Endpoints(), func(string) string { return "" }, nil)
	if err != nil {
		tb.Fatal(err)
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { cli.Close() })
	for _, name := range names {
		v := fmt.Sprintf(`{"name":%q,"rpc_address":%q,"type":0,"incarnation_id":"inc","dp_size":1}`, name, name)
		if _, err := cli.Put(ctx, "XLLM:DEFAULT:"+name, v); err != nil {
			tb.Fatal(err)
		}
	}
	reg, err := instance.New(instance.Options{Client: cli, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		tb.Fatal(err)
	}
	rctx, rcancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		reg.Run(rctx)
	}()
	tb.Cleanup(func() {
		rcancel()
		<-done
	})
	if err := reg.WaitFor(ctx, func(s *instance.Snapshot) bool { return len(s.Instances) == len(names) }); err != nil {
		tb.Fatal(err)
	}
	return policyRouter{policy: lb.NewRR(), reg: reg}
}

// startEngine runs a real HTTP engine on loopback and returns its
// host:port, the name it is registered under.
func startEngine(tb testing.TB, h http.HandlerFunc) string {
	tb.Helper()
	e := httptest.NewServer(h)
	tb.Cleanup(e.Close)
	return e.Listener.Addr().String()
}

// idsCompletion is a /v1/completions body with n realistic prompt ids.
func idsCompletion(n int) []byte {
	b := []byte(`{"model":"m","max_tokens":16,"prompt":[`)
	for i := range n {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendUint(b, uint64(i*7919%151936), 10)
	}
	return append(b, `],"temperature":0}`...)
}
