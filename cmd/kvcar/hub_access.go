package main

import (
	"fmt"
	"log/slog"

	"github.com/kvcar/kvcar/internal/config"
)

// checkHubExposure refuses a subscriber kvcar binds for engines to dial
// (discovery.subscribe_bind, or a stream with bind) on an address other
// than loopback, unless --insecure_internal_api: such a subscriber takes
// KV events for every engine's topic from anyone who can connect, and a
// peer publishing under an engine's topic makes kvcar report blocks that
// engine never held, steering CAR's routing. ZeroMQ's plain subscriber
// has no credentials and kvcar no peer filter for it, so keeping it off
// the network is the check there is.
func checkHubExposure(f *flags, cfg *config.Config, log *slog.Logger) error {
	if cfg == nil {
		return nil
	}
	type bind struct{ key, endpoint string }
	var binds []bind
	if e := cfg.Discovery.SubscribeBind; e != "" {
		binds = append(binds, bind{"discovery.subscribe_bind", e})
	}
	for i, s := range cfg.Streams {
		if s.Bind {
			binds = append(binds, bind{fmt.Sprintf("streams[%d].endpoint", i), s.Endpoint})
		}
	}
	for _, b := range binds {
		if config.BindIsLoopback(b.endpoint) {
			continue
		}
		if !f.insecureInternal {
			return fmt.Errorf("%s = %q: kvcar would bind a subscriber reachable from the network, which takes any peer's "+
				"KV events under any engine's topic; bind it on loopback (tcp://127.0.0.1:PORT) with the engines on this "+
				"host, or pass --insecure_internal_api to take them from anyone who can connect", b.key, b.endpoint)
		}
		log.Warn("--insecure_internal_api: a bound KV event subscriber is reachable from the network and takes any peer's events",
			"key", b.key, "endpoint", b.endpoint)
	}
	return nil
}
