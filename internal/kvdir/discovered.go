package kvdir

// Discovered returns a channel closed once RunDiscovery has applied the
// streams of a registry snapshot that reflects etcd (Snapshot.Synced):
// from then on the directory has a stream for every instance discovery
// subscribes to, synchronised or not. Passes over the registry's empty
// start-up snapshot do not count. A directory whose discovery never runs
// never closes it.
func (d *Directory) Discovered() <-chan struct{} { return d.discovered }

func (d *Directory) markDiscovered() { d.discoveredOnce.Do(func() { close(d.discovered) }) }
