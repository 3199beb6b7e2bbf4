package xllmrpc

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/kvcar/kvcar/internal/baidustd"
	"github.com/kvcar/kvcar/internal/baidustd/metapb"
	"github.com/kvcar/kvcar/internal/instance"
	"github.com/kvcar/kvcar/internal/xllmpb"
	"github.com/kvcar/kvcar/internal/xllmpb/xservicepb"
)

func codeOf(err error) baidustd.Errno { return baidustd.CodeOf(err) }

// TestXllmRpcBadCalls: bad calls to XllmRpcService over real TCP, each
// answered on its call with brpc's code; the connection serves on, and
// nothing reaches the registry.
func TestXllmRpcBadCalls(t *testing.T) {
	c := startCluster(t, "h:1")
	c.register(t, instance.Prefill, "10.0.0.1:8000", "inc-a", nil)
	cl := c.client(t)
	ctx := ctxT(t)

	hb := func(name, inc string, waiting uint64) []byte {
		b, _ := proto.Marshal(&xservicepb.HeartbeatRequest{Name: name, IncarnationId: inc,
			LoadMetrics: &xservicepb.LoadMetrics{WaitingRequestsNum: waiting}})
		return b
	}
	// A method of one service called on the other.
	_, err := cl.Call(ctx, xllmpb.APIService, xllmpb.MethodHeartbeat, hb("10.0.0.1:8000", "inc-a", 1), nil)
	if codeOf(err) != baidustd.ENOMETHOD {
		t.Errorf("Heartbeat on XllmAPIService: %v", err)
	}
	_, err = cl.Call(ctx, xllmpb.RPCService, "heartbeat", nil, nil)
	if codeOf(err) != baidustd.ENOMETHOD {
		t.Errorf("lower-case method: %v", err)
	}
	// Invalid UTF-8 in the proto3 name: EREQUEST.
	bad := protowire.AppendTag(nil, 1, protowire.BytesType)
	bad = protowire.AppendBytes(bad, []byte("10.0.0.1:8000\xff"))
	_, err = cl.Call(ctx, xllmpb.RPCService, xllmpb.MethodHeartbeat, bad, nil)
	if codeOf(err) != baidustd.EREQUEST {
		t.Errorf("invalid UTF-8 name: %v", err)
	}
	// A huge repeated field (8 MiB of packed free pages): refused
	// undecoded.
	var pages []byte
	pages = protowire.AppendTag(pages, 1, protowire.BytesType)
	pages = protowire.AppendBytes(pages, bytes.Repeat([]byte{1}, 8<<20))
	big := protowire.AppendTag(hb("10.0.0.1:8000", "inc-a", 99), 5, protowire.BytesType)
	big = protowire.AppendBytes(big, pages)
	_, err = cl.Call(ctx, xllmpb.RPCService, xllmpb.MethodHeartbeat, big, nil)
	if codeOf(err) != baidustd.ELIMIT {
		t.Errorf("8 MiB of free pages: %v", err)
	}
	// Deep nesting of unknown groups: refused, the connection served on.
	var deep []byte
	for range 20000 {
		deep = protowire.AppendTag(deep, 15, protowire.StartGroupType)
	}
	for range 20000 {
		deep = protowire.AppendTag(deep, 15, protowire.EndGroupType)
	}
	_, err = cl.Call(ctx, xllmpb.RPCService, xllmpb.MethodHeartbeat, deep, nil)
	t.Logf("20000 nested groups: %v", err)
	if err == nil {
		t.Errorf("20000 nested groups taken")
	}
	// A huge string name: decoded within the budget, refused as unknown.
	var st xservicepb.Status
	if err := cl.CallProto(ctx, xllmpb.RPCService, xllmpb.MethodHeartbeat,
		&xservicepb.HeartbeatRequest{Name: strings.Repeat("n", 4<<20), IncarnationId: "inc-a"}, &st, nil); err != nil || st.Ok {
		t.Errorf("4 MiB name: %v %v", err, st.Ok)
	}
	in, _ := c.reg.Snapshot().Lookup("10.0.0.1:8000")
	if in.HasLoad {
		t.Errorf("a refused call left a load: %+v", in.Load)
	}
	if err := cl.CallProto(ctx, xllmpb.RPCService, xllmpb.MethodHello, &xservicepb.Empty{}, &st, nil); err != nil || !st.Ok {
		t.Errorf("the connection after the bad calls: %v", err)
	}
}

// smallWindowConn dials addr with a 4 KiB receive buffer.
func smallWindowConn(t *testing.T, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
	}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestNonReadingPeersDoNotStarveHeartbeats: the real XllmRpcService
// with kvcar's default limits (128 MiB in flight). Three connections send
// well-formed calls and never read their answers, so the server's writes
// to them block; a call gives its bytes back to the budget when its
// handler returns, not once its answer is written, so a registered
// engine's heartbeat on its own connection is still taken. A hostile
// peer affects only its own connection.
func TestNonReadingPeersDoNotStarveHeartbeats(t *testing.T) {
	c := startCluster(t, "h:1")
	c.register(t, instance.Prefill, "10.0.0.1:8000", "inc-a", nil)
	engine := c.client(t)
	beat := func() error {
		var st xservicepb.Status
		err := engine.CallProto(ctxT(t), xllmpb.RPCService, xllmpb.MethodHeartbeat, &xservicepb.HeartbeatRequest{Name: "10.0.0.1:8000",
			IncarnationId: "inc-a", LoadMetrics: &xservicepb.LoadMetrics{WaitingRequestsNum: 3}}, &st, nil)
		if err == nil && !st.Ok {
			err = errors.New("heartbeat not taken")
		}
		return err
	}
	if err := beat(); err != nil {
		t.Fatal(err)
	}
	frame := func(method string, cid int64, att int) []byte {
		m := &metapb.RpcMeta{Request: &metapb.RpcRequestMeta{ServiceName: proto.String(xllmpb.RPCService), MethodName: proto.String(method)},
			CorrelationId: proto.Int64(cid)}
		if att > 0 {
			m.AttachmentSize = proto.Int32(int32(att))
		}
		mb, _ := proto.Marshal(m)
		b := binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32([]byte(baidustd.Magic), uint32(len(mb)+att)), uint32(len(mb)))
		return append(append(b, mb...), make([]byte, att)...)
	}
	send := func(conn net.Conn, frames [][]byte) {
		go func() {
			for _, f := range frames {
				conn.SetWriteDeadline(time.Now().Add(20 * time.Second))
				if _, err := conn.Write(f); err != nil {
					return
				}
			}
		}()
	}
	conns := []net.Conn{smallWindowConn(t, c.rpcAddr), smallWindowConn(t, c.rpcAddr), smallWindowConn(t, c.rpcAddr)}
	// Each first gets 6 MiB of ENOMETHOD answers (the text repeats the
	// 1 MiB method name), more than the path to it holds.
	for _, conn := range conns {
		var echoes [][]byte
		for i := range 6 {
			echoes = append(echoes, frame(strings.Repeat("m", 1<<20), int64(i+1), 0))
		}
		send(conn, echoes)
	}
	time.Sleep(500 * time.Millisecond)
	// Then Hello calls with attachments: 1 MiB, 64 KiB and 64 bytes.
	for i, size := range []int{1 << 20, 64 << 10, 64} {
		var hellos [][]byte
		for j := range 1000 {
			hellos = append(hellos, frame(xllmpb.MethodHello, int64(j+100), size))
		}
		send(conns[i], hellos)
		time.Sleep(700 * time.Millisecond)
	}
	start := time.Now()
	err := beat()
	t.Logf("the engine's heartbeat while three peers read nothing: %v (after %v)", err, time.Since(start))
	if err != nil {
		t.Errorf("an engine's heartbeat on its own connection failed because other connections do not read: %v", err)
	}
	for _, conn := range conns {
		conn.Close()
	}
}
