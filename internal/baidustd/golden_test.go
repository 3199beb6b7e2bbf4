package baidustd

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// The recorded frames (testdata/README.md) and what the golden README
// says each holds.
var goldenVersions = []string{"brpc-1.12.1", "brpc-1.17.0"}

const (
	svcRPC = "xllm_service.proto.XllmRpcService"
	svcAPI = "xllm.proto.XllmAPIService"

	cidA  = 4294967298    // 0x100000002
	cidHB = 1103806595074 // 0x10100000002
	cidX2 = 1112396529666 // 0x10300000002, frame 1 of heartbeat_x2
	cidCG = 2203318222850 // 0x20100000002

	hbMessage     = "0a0f3132372e302e302e313a31383030301a070807150000803e22040878101e3205696e632d31"
	hbIdleMessage = "0a0f3132372e302e302e313a31383030301a003205696e632d31"
	hbCacheEvent  = "0a0f3132372e302e302e313a3138303030" +
		"12360a10000102030405060708090a0b0c0d0e0f0a10101112131415161718191a1b1c1d1e1f1210f0f1f2f3f4f5f6f7f8f9fafbfcfdfeff" +
		"1a070807150000803e22040878101e3205696e632d31"
	complMessage = "0a0a66616b652d6d6f64656c120568656c6c6f2002ba01057376632d31c2010401020304" +
		"ca01110a0f3132372e302e302e313a3138303030b2020e3132372e302e302e313a38383839"
	complGenMessage = "0a3a0a0b636d706c2d66616b652d3112057376632d311a00" +
		"2218120a207431303020743130311a02646522066c656e677468" + "2a060804100218063001"
	genMessage = "0a400a06636d706c2d3112057376632d311a00" +
		"2211120548656c6c6f1a02b24d220473746f70" + "22100801120248691a02a368220473746f70" +
		"2a060804100218063001"
	nameMessage = "0a0f3132372e302e302e313a3138303030"
)

type goldenRequest struct {
	file       string
	service    string
	method     string
	logID      int64
	requestID  string
	cid        int64
	message    string // hex
	attachment string
	// reply is what the service answered: message hex, attachment.
	reply      string
	replyAtt   string
	errCode    Errno
	errSuffix  string // error_text after the "[127.0.0.1:28600]" prefix
	replyBytes int    // 1.12.1 size of the .resp.bin
}

var goldenRequests = []goldenRequest{
	{file: "heartbeat", service: svcRPC, method: "Heartbeat", cid: cidHB, message: hbMessage, reply: "0801", replyBytes: 27},
	{file: "heartbeat_idle", service: svcRPC, method: "Heartbeat", cid: cidHB, message: hbIdleMessage, reply: "0801", replyBytes: 27},
	{file: "heartbeat_cache_event", service: svcRPC, method: "Heartbeat", cid: cidHB, message: hbCacheEvent, reply: "0801", replyBytes: 27},
	{file: "heartbeat_log_id", service: svcRPC, method: "Heartbeat", cid: cidA, logID: 123456789, requestID: "req-abc",
		message: hbMessage, reply: "0801", replyBytes: 26},
	{file: "heartbeat_attachment", service: svcRPC, method: "Heartbeat", cid: cidA, message: hbMessage, attachment: "ATTACH-1",
		reply: "0801", replyAtt: "ATTACH-1", replyBytes: 36},
	{file: "completions", service: svcAPI, method: "Completions", cid: cidA, message: complMessage, reply: "", replyBytes: 24},
	{file: "completions_generations", service: svcRPC, method: "Generations", cid: cidCG, message: complGenMessage, reply: "0a020801", replyBytes: 29},
	{file: "generations", service: svcRPC, method: "Generations", cid: cidA, message: genMessage, reply: "0a020801", replyBytes: 28},
	{file: "unknown_method", service: svcRPC, method: "NoSuchMethod", cid: cidA, message: nameMessage, errCode: ENOMETHOD,
		errSuffix: "[E1002]Fail to find method=xllm_service.proto.XllmRpcService/NoSuchMethod", replyBytes: 117},
	{file: "unknown_service", service: "xllm_service.proto.NoSuchService", method: "Heartbeat", cid: cidA, message: nameMessage,
		errCode: ENOMETHOD, errSuffix: "[E1002]Fail to find method=xllm_service.proto.NoSuchService/Heartbeat", replyBytes: 113},
}

// goldenIdentity is the listening address of the recorded brpc server,
// which prefixes its error texts.
const goldenIdentity = "127.0.0.1:28600"

func readGolden(t testing.TB, version, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", version, name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func unhex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatalf("bad hex %q: %v", s, err)
	}
	return b
}

// The copies in testdata must be the recorded bytes.
func TestGoldenCopiesIdentical(t *testing.T) {
	orig := filepath.Join("..", "..", "..", "shared", "golden", "brpc")
	if _, err := os.Stat(orig); err != nil {
		t.Skipf("originals not present (%v)", err)
	}
	for _, v := range goldenVersions {
		want, err := filepath.Glob(filepath.Join(orig, v, "*.bin"))
		if err != nil || len(want) == 0 {
			t.Fatalf("no originals in %s: %v", v, err)
		}
		got, _ := filepath.Glob(filepath.Join("testdata", v, "*.bin"))
		if len(got) != len(want) {
			t.Errorf("%s: %d copies, %d originals", v, len(got), len(want))
		}
		for _, o := range want {
			a, err := os.ReadFile(o)
			if err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(filepath.Join("testdata", v, filepath.Base(o)))
			if err != nil {
				t.Errorf("missing copy: %v", err)
				continue
			}
			if !bytes.Equal(a, b) {
				t.Errorf("%s/%s differs from the original", v, filepath.Base(o))
			}
		}
	}
}

// Every recorded request decodes to the values the golden README gives,
// field by field, from both brpc versions.
func TestDecodeGoldenRequests(t *testing.T) {
	for _, v := range goldenVersions {
		for _, g := range goldenRequests {
			t.Run(v+"/"+g.file, func(t *testing.T) {
				b := readGolden(t, v, g.file+".req.bin")
				f, n, err := ParseFrame(b, DefaultMaxBodySize)
				if err != nil {
					t.Fatal(err)
				}
				if n != len(b) {
					t.Fatalf("frame takes %d of %d bytes", n, len(b))
				}
				m := f.Meta
				rm := m.GetRequest()
				if rm == nil || m.Response != nil {
					t.Fatalf("not a request meta: %v", m)
				}
				if rm.GetServiceName() != g.service || rm.GetMethodName() != g.method {
					t.Errorf("service/method %q/%q, want %q/%q", rm.GetServiceName(), rm.GetMethodName(), g.service, g.method)
				}
				if (rm.LogId != nil) != (g.logID != 0) || rm.GetLogId() != g.logID {
					t.Errorf("log_id %v, want %d", rm.LogId, g.logID)
				}
				if (rm.RequestId != nil) != (g.requestID != "") || rm.GetRequestId() != g.requestID {
					t.Errorf("request_id %v, want %q", rm.RequestId, g.requestID)
				}
				if rm.TraceId != nil || rm.SpanId != nil || rm.ParentSpanId != nil || rm.TimeoutMs != nil {
					t.Errorf("unexpected trace or timeout fields: %v", rm)
				}
				if m.CompressType == nil || m.GetCompressType() != 0 {
					t.Errorf("compress_type %v, want present 0", m.CompressType)
				}
				if m.CorrelationId == nil || m.GetCorrelationId() != g.cid {
					t.Errorf("correlation_id %v, want %d", m.CorrelationId, g.cid)
				}
				if (m.AttachmentSize != nil) != (g.attachment != "") || int(m.GetAttachmentSize()) != len(g.attachment) {
					t.Errorf("attachment_size %v, want %d", m.AttachmentSize, len(g.attachment))
				}
				wantExt := v == "brpc-1.17.0"
				if extended(m) != wantExt {
					t.Errorf("content_type/checksum fields present = %v, want %v", extended(m), wantExt)
				}
				if wantExt && (m.GetContentType() != 0 || m.GetChecksumType() != 0 || m.ChecksumValue == nil || len(m.ChecksumValue) != 0) {
					t.Errorf("1.17 extras %v %v %v, want 0 0 empty", m.ContentType, m.ChecksumType, m.ChecksumValue)
				}
				if m.ChunkInfo != nil || m.AuthenticationData != nil || m.StreamSettings != nil || len(m.UserFields) != 0 {
					t.Errorf("unexpected meta fields: %v", m)
				}
				msg, att, ok := f.Parts()
				if !ok {
					t.Fatal("attachment_size does not fit")
				}
				if hex.EncodeToString(msg) != g.message {
					t.Errorf("message\n got %x\nwant %s", msg, g.message)
				}
				if string(att) != g.attachment {
					t.Errorf("attachment %q, want %q", att, g.attachment)
				}
			})
		}
	}
}

// The client's encoder writes the recorded requests byte for byte, given
// the recorded correlation id: as 1.12.1 by default, as 1.17.0 with
// ExtendedMeta.
func TestEncodeGoldenRequests(t *testing.T) {
	for _, v := range goldenVersions {
		for _, g := range goldenRequests {
			o := &CallOptions{LogID: g.logID, RequestID: g.requestID, Attachment: []byte(g.attachment)}
			got, err := AppendFrame(nil, requestMeta(g.service, g.method, g.cid, o, v == "brpc-1.17.0"),
				unhex(t, g.message), o.Attachment)
			if err != nil {
				t.Fatal(err)
			}
			if want := readGolden(t, v, g.file+".req.bin"); !bytes.Equal(got, want) {
				t.Errorf("%s/%s:\n got %x\nwant %x", v, g.file, got, want)
			}
		}
	}
}

// goldenServer is a real Server whose methods answer as the recorded
// service did: Heartbeat Status{ok} with the request's attachment
// echoed, Generations StatusSet{[ok]}, Completions an empty response.
func goldenServer(t *testing.T) (addr string, srv *Server) {
	t.Helper()
	srv = NewServer(ServerOptions{Identity: goldenIdentity})
	reply := func(hexMsg string) Handler {
		return func(_ context.Context, r *Request) (Response, error) {
			return Response{Message: unhex(t, hexMsg), Attachment: r.Attachment}, nil
		}
	}
	for _, m := range []struct{ svc, method, reply string }{
		{svcRPC, "Heartbeat", "0801"}, {svcRPC, "Generations", "0a020801"}, {svcAPI, "Completions", ""},
	} {
		if err := srv.Register(m.svc, m.method, reply(m.reply)); err != nil {
			t.Fatal(err)
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String(), srv
}

// exchange writes req on a new connection and reads n response frames.
func exchange(t *testing.T, addr string, req []byte, n int) [][]byte {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write(req); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(c)
	var out [][]byte
	for range n {
		h := make([]byte, HeaderSize)
		if _, err := io.ReadFull(r, h); err != nil {
			t.Fatalf("reading response header: %v", err)
		}
		body, _, err := ParseHeader(h, DefaultMaxBodySize)
		if err != nil {
			t.Fatal(err)
		}
		rest := make([]byte, body)
		if _, err := io.ReadFull(r, rest); err != nil {
			t.Fatal(err)
		}
		out = append(out, append(h, rest...))
	}
	return out
}

// The server answers every recorded request with the recorded response,
// byte for byte, in the dialect of the request's brpc version; unknown
// services and methods get brpc's ENOMETHOD worded as brpc words it.
func TestServerAnswersGoldenBytes(t *testing.T) {
	addr, _ := goldenServer(t)
	for _, v := range goldenVersions {
		for _, g := range goldenRequests {
			want := readGolden(t, v, g.file+".resp.bin")
			got := exchange(t, addr, readGolden(t, v, g.file+".req.bin"), 1)[0]
			if !bytes.Equal(got, want) {
				t.Errorf("%s/%s:\n got %x\nwant %x", v, g.file, got, want)
			}
			if v == "brpc-1.12.1" && len(want) != g.replyBytes {
				t.Errorf("%s: recorded response has %d bytes, README says %d", g.file, len(want), g.replyBytes)
			}
		}
	}
}

// The client reads every recorded response as the outcome the service
// meant.
func TestDecodeGoldenResponses(t *testing.T) {
	for _, v := range goldenVersions {
		for _, g := range goldenRequests {
			b := readGolden(t, v, g.file+".resp.bin")
			f, n, err := ParseFrame(b, DefaultMaxBodySize)
			if err != nil || n != len(b) {
				t.Fatalf("%s/%s: %v (%d of %d bytes)", v, g.file, err, n, len(b))
			}
			if f.Meta.GetCorrelationId() != g.cid {
				t.Errorf("%s/%s: correlation_id %d, want %d echoed", v, g.file, f.Meta.GetCorrelationId(), g.cid)
			}
			rm := f.Meta.GetResponse()
			if rm == nil || rm.ErrorCode == nil {
				t.Fatalf("%s/%s: response meta without error_code: %v", v, g.file, f.Meta)
			}
			r := decodeResponse(f, DefaultMaxBodySize)
			if g.errCode != 0 {
				e, ok := r.err.(*Error)
				if !ok || e.Code != g.errCode || e.Text != "["+goldenIdentity+"]"+g.errSuffix {
					t.Errorf("%s/%s: got %v, want code %d text %q", v, g.file, r.err, g.errCode, g.errSuffix)
				}
				if len(f.Payload) != 0 {
					t.Errorf("%s/%s: an error response carries %d message bytes", v, g.file, len(f.Payload))
				}
				continue
			}
			if r.err != nil || rm.ErrorText != nil {
				t.Fatalf("%s/%s: %v, error_text %v", v, g.file, r.err, rm.ErrorText)
			}
			if hex.EncodeToString(r.res.Message) != g.reply || string(r.res.Attachment) != g.replyAtt {
				t.Errorf("%s/%s: message %x attachment %q, want %s %q", v, g.file, r.res.Message, r.res.Attachment, g.reply, g.replyAtt)
			}
		}
	}
}

// The recorded connection with two pipelined heartbeats: both frames in
// one write, two answers, each byte-identical to the recorded one for its
// correlation id (the server may answer concurrent calls in either
// order, as brpc may).
func TestPipelinedHeartbeatCapture(t *testing.T) {
	addr, _ := goldenServer(t)
	for _, v := range goldenVersions {
		c2s := readGolden(t, v, "heartbeat_x2.c2s.bin")
		s2c := readGolden(t, v, "heartbeat_x2.s2c.bin")
		// The capture is two heartbeat frames, identical but for their
		// correlation ids.
		f0, n0, err := ParseFrame(c2s, DefaultMaxBodySize)
		if err != nil {
			t.Fatal(err)
		}
		f1, n1, err := ParseFrame(c2s[n0:], DefaultMaxBodySize)
		if err != nil || n0+n1 != len(c2s) {
			t.Fatalf("%s: second frame: %v (%d+%d of %d)", v, err, n0, n1, len(c2s))
		}
		if f0.Meta.GetCorrelationId() != cidHB || f1.Meta.GetCorrelationId() != cidX2 {
			t.Errorf("%s: correlation ids %d %d", v, f0.Meta.GetCorrelationId(), f1.Meta.GetCorrelationId())
		}
		if hex.EncodeToString(f0.Payload) != hbMessage || hex.EncodeToString(f1.Payload) != hbMessage {
			t.Errorf("%s: heartbeat messages differ from the recorded one", v)
		}
		want := map[int64][]byte{}
		for off := 0; off < len(s2c); {
			f, n, err := ParseFrame(s2c[off:], DefaultMaxBodySize)
			if err != nil {
				t.Fatal(err)
			}
			want[f.Meta.GetCorrelationId()] = s2c[off : off+n]
			off += n
		}
		got := exchange(t, addr, c2s, 2)
		for _, g := range got {
			f, _, err := ParseFrame(g, DefaultMaxBodySize)
			if err != nil {
				t.Fatal(err)
			}
			cid := f.Meta.GetCorrelationId()
			if !bytes.Equal(g, want[cid]) {
				t.Errorf("%s: answer for %d\n got %x\nwant %x", v, cid, g, want[cid])
			}
			delete(want, cid)
		}
		if len(want) != 0 {
			t.Errorf("%s: no answer for %v", v, want)
		}
	}
}
