// Package devcluster runs a local kvcar deployment for the development
// programs (kvcar-demo, kvcar-scale, kvcar-bench) and for tests that need
// kvcar as a process of its own: emulated engines registered in an
// embedded etcd, the KV events config that discovers them, and the kvcar
// binary as a child process, with a wait until its streams are
// synchronised and a Stop that always ends it.
//
// What must agree between the engines and kvcar is decided here once:
// the topic the engines publish and the config subscribes (Topic), the
// discovery port offsets, registration as DEFAULT instances (xLLM
// engines, or vLLM servers registered as xllm-service's vllm_sidecar
// registers them, VLLMSidecar, followed in live mode), and the loopback
// address kvcar advertises for heartbeats.
//
// Ownership: a KVCar owns its child process and the one goroutine that
// waits for it; Stop ends the process (SIGTERM, then SIGKILL after
// StopTimeout) and returns once that goroutine has finished, so every
// caller that starts kvcar must Stop it. Engines are closed by their
// caller through Engines.Close; the etcd server is the caller's too
// (internal/etcdembed). The package holds no state outside these values.
//
// Memory and CPUTime read a process's use from /proc; what to make of it
// is the caller's; FreePort picks a loopback port for a listener a
// program sets up before kvcar starts. Revision names the commit a
// program was built from and KVCarRevision the one a kvcar binary was
// built from (its --version), for a report, which names both
// (Revisions) when they differ; BuildKVCar stamps the binary it builds
// as make build does. Query and Instances read kvcar's query API and
// registry view on its internal listener, for programs whose own routing
// policies must see what kvcar's see; HasFlag tells from --help whether a
// kvcar binary knows a flag, so a program can run with older and newer
// binaries alike. The package must not hold workloads, measurements or
// reports (those are the programs'), and must not import cmd packages.
// It sees kvcar only as an operator does, through its flags, its config
// file and its HTTP API: it uses internal/config for the file's format
// and internal/server for the API's path, and nothing of the directory,
// the registry or the routing policies.
package devcluster
