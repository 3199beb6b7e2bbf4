package main

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvcar/kvcar/internal/baidustd"
	"github.com/kvcar/kvcar/internal/freeport"
	"github.com/kvcar/kvcar/internal/xllmpb"
	"github.com/kvcar/kvcar/internal/xllmpb/xservicepb"
)

// freeTCPPort returns a loopback port that is free right now, outside
// the kernel's ephemeral range (freeport).
func freeTCPPort(t *testing.T) string {
	t.Helper()
	p, err := freeport.Loopback(1)
	if err != nil {
		t.Fatal(err)
	}
	return strconv.Itoa(p[0])
}

func TestPortFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string // error substring, "" for none
		port int
	}{
		{[]string{"--http_server_port=9000"}, "", 9000},
		{[]string{"--port=9001"}, "", 9001},
		{[]string{"--port=9001", "--http_server_port=9001"}, "", 9001},
		{[]string{"--port=9001", "--http_server_port=9002"}, "--port is a deprecated alias", 0},
		{[]string{"--port=70000"}, "--port = 70000", 0},
		{[]string{"--rpc_server_port=-1"}, "--rpc_server_port = -1: must be in [0, 65535]", 0},
		{[]string{"--rpc_max_inflight_bytes=1000"}, "--rpc_max_inflight_bytes = 1000: must be in [67108864, 1099511627776]", 0},
		{[]string{"--rpc_max_queued_output_bytes=1000"}, "--rpc_max_queued_output_bytes = 1000: must be in [4194304, 1099511627776]", 0},
	} {
		f, err := parseFlags(c.args, io.Discard)
		if c.want != "" {
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%v: got %v, want an error with %q", c.args, err, c.want)
			}
			continue
		}
		if err != nil || f.port != c.port || f.rpcPort != 8889 {
			t.Errorf("%v: %v, port %d rpc %d", c.args, err, f.port, f.rpcPort)
		}
	}
}

// kvcar is the master on its rpc address and takes an engine's baidu_std
// heartbeat there.
func TestMasterIsTheRPCAddress(t *testing.T) {
	etcd := startEtcd(t)
	rpcPort := freeTCPPort(t)
	addr := startKVCar(t, "--etcd_addr="+etcd.Endpoint(), "--rpc_server_port="+rpcPort, "--advertise_host=127.0.0.1")
	cli, err := etcd.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	want := "127.0.0.1:" + rpcPort
	get := func(key string) string {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		resp, err := cli.Get(ctx, key)
		if err != nil || len(resp.Kvs) == 0 {
			return ""
		}
		return string(resp.Kvs[0].Value)
	}
	waitUntil(t, "master elected", 10*time.Second, func() bool { return get("XLLM:SERVICE:MASTER") == want })
	if got := get("XLLM:SERVICE:" + want); got != want {
		t.Fatalf("XLLM:SERVICE:%s = %q", want, got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, "XLLM:DEFAULT:127.0.0.1:18000", `{"name":"127.0.0.1:18000","rpc_address":"x","type":0,"incarnation_id":"inc-1"}`); err != nil {
		t.Fatal(err)
	}
	rc := baidustd.NewClient(get("XLLM:SERVICE:MASTER"), baidustd.ClientOptions{})
	defer rc.Close()
	waitUntil(t, "heartbeat taken over baidu_std", 10*time.Second, func() bool {
		var st xservicepb.Status
		err := rc.CallProto(ctx, xllmpb.RPCService, xllmpb.MethodHeartbeat, &xservicepb.HeartbeatRequest{Name: "127.0.0.1:18000",
			IncarnationId: "inc-1", LoadMetrics: &xservicepb.LoadMetrics{WaitingRequestsNum: 5, GpuCacheUsagePerc: 0.5}}, &st, nil)
		return err == nil && st.Ok
	})
	var inst struct {
		Instances []struct {
			Name    string  `json:"name"`
			Waiting uint64  `json:"waiting"`
			Usage   float64 `json:"gpu_cache_usage_perc"`
			Source  string  `json:"load_source"`
		} `json:"instances"`
	}
	waitUntil(t, "load visible over HTTP", 5*time.Second, func() bool {
		getJSON(t, addr.internal, "/v1/internal/instances", &inst)
		return len(inst.Instances) == 1 && inst.Instances[0].Waiting == 5 && inst.Instances[0].Usage == 0.5 && inst.Instances[0].Source == "heartbeat"
	})
}

// --rpc_max_inflight_bytes bounds what the rpc port's calls hold: with it
// at its least, 64 MiB, a frame half sent holds it all, a call on another
// connection is answered ELIMIT, and once the half frame's connection
// closes the same call is served.
func TestRPCInflightBudget(t *testing.T) {
	etcd := startEtcd(t)
	rpcPort := freeTCPPort(t)
	startKVCar(t, "--etcd_addr="+etcd.Endpoint(), "--rpc_server_port="+rpcPort, "--advertise_host=127.0.0.1",
		"--rpc_max_inflight_bytes=67108864")
	addr := "127.0.0.1:" + rpcPort
	half, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer half.Close()
	// A frame announcing brpc's largest body; past its first 32 MiB its
	// buffer has grown to the whole 64 MiB.
	head := binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32([]byte(baidustd.Magic), baidustd.DefaultMaxBodySize), 16)
	if _, err := half.Write(append(head, make([]byte, 40<<20)...)); err != nil {
		t.Fatal(err)
	}
	rc := baidustd.NewClient(addr, baidustd.ClientOptions{})
	defer rc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	hello := func() error {
		var st xservicepb.Status
		return rc.CallProto(ctx, xllmpb.RPCService, xllmpb.MethodHello, &xservicepb.Empty{}, &st, nil)
	}
	var last error
	waitUntil(t, "a call refused with ELIMIT", 10*time.Second, func() bool {
		last = hello()
		return baidustd.CodeOf(last) == baidustd.ELIMIT
	})
	if !strings.Contains(last.Error(), "does not fit in 67108864") {
		t.Fatalf("ELIMIT text: %v", last)
	}
	half.Close()
	waitUntil(t, "the call served once the half frame is gone", 10*time.Second, func() bool { return hello() == nil })
}
