package kvdir

import (
	"context"
	"testing"
	"time"

	"github.com/kvcar/kvcar/internal/enginesim"
	"github.com/kvcar/kvcar/internal/etcdembed"
	"github.com/kvcar/kvcar/internal/instance"
)

// TestDiscoveredWaitsForTheFirstListing: while etcd does not answer, the
// registry has only its empty start-up snapshot and discovery passes over
// it do not count as discovery having run; once etcd answers, Discovered
// closes only after the registered engine's stream is in the directory
// (issue 10 item 8: readiness means the first discovery pass has run).
func TestDiscoveredWaitsForTheFirstListing(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	etcd, err := etcdembed.Start(ctx, etcdembed.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer etcd.Close()
	// The engine registers past the relay that Stall black-holes.
	e, err := enginesim.New(enginesim.Config{
		BlockSize: testBlock, DeviceBlocks: 64, Topic: "xllm-kv",
		DiscoveryOffsets: enginesim.DefaultDiscoveryOffsets(),
		Etcd:             &enginesim.EtcdConfig{Endpoints: []string{etcd.DirectEndpoint()}, Type: enginesim.TypeDefault},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Start(); err != nil {
		t.Fatal(err)
	}
	defer e.Close()

	etcd.Stall()
	client, err := etcd.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	reg, err := instance.New(instance.Options{Client: client, Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	dir := newDirectory(t, testLimits())
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{}, 2)
	go func() { reg.Run(runCtx); done <- struct{}{} }()
	go func() { dir.RunDiscovery(runCtx, reg, discoveryConfig4(), 128); done <- struct{}{} }()
	defer func() {
		stop()
		<-done
		<-done
	}()

	// Several refresh intervals pass over the unsynchronised snapshot.
	select {
	case <-dir.Discovered():
		t.Fatalf("Discovered closed while etcd was unreachable, with %d streams", dir.Len())
	case <-time.After(10 * discoveryConfig4().RefreshInterval):
	}
	if err := etcd.Heal(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-dir.Discovered():
	case <-time.After(20 * time.Second):
		t.Fatal("Discovered not closed 20s after etcd answered")
	}
	if got := dir.Len(); got != 1 {
		t.Fatalf("Discovered closed with %d streams, want the registered engine's one", got)
	}
}
