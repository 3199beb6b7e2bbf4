package baidustd

import (
	"bytes"
	"compress/gzip"
	"compress/zlib"
	"errors"
	"fmt"
	"io"

	"google.golang.org/protobuf/proto"

	"github.com/kvcar/kvcar/internal/baidustd/metapb"
	"github.com/kvcar/kvcar/internal/budget"
)

// brpc's CompressType values.
const (
	CompressNone   int32 = 0
	CompressSnappy int32 = 1
	CompressGzip   int32 = 2
	CompressZlib   int32 = 3
)

// compressName is brpc's name of a compress type in its error texts.
func compressName(t int32) string {
	switch t {
	case CompressNone:
		return "none"
	case CompressSnappy:
		return "snappy"
	case CompressGzip:
		return "gzip"
	case CompressZlib:
		return "zlib"
	}
	return "unknown"
}

// decompress undoes compress type t on b, producing at most limit bytes,
// each growth of its output taken from bud first; held is what it took
// (0 for none, whose output is b). It supports none, gzip and zlib; the
// error is errCompress for the others and for data that does not
// decompress within limit, errBudget when bud refuses.
func decompress(t int32, b []byte, limit int, bud *budget.Bytes) (out []byte, held int64, err error) {
	var r io.ReadCloser
	switch t {
	case CompressNone:
		return b, 0, nil
	case CompressGzip:
		r, err = gzip.NewReader(bytes.NewReader(b))
	case CompressZlib:
		r, err = zlib.NewReader(bytes.NewReader(b))
	default:
		return nil, 0, errCompress
	}
	if err != nil {
		return nil, 0, errCompress
	}
	defer r.Close()
	for {
		if len(out) == cap(out) {
			if cap(out) > limit {
				bud.Give(held)
				return nil, 0, errCompress // past limit
			}
			var ok bool
			if out, ok = grow(out, 4<<10, limit+1, bud, &held); !ok {
				bud.Give(held)
				return nil, 0, errBudget
			}
		}
		n, err := r.Read(out[len(out):cap(out)])
		out = out[:len(out)+n]
		if err == io.EOF {
			return out, held, nil
		}
		if err != nil {
			bud.Give(held)
			return nil, 0, errCompress
		}
	}
}

var (
	errCompress = errors.New("baidu_std: message does not decompress within the limit")
	errBudget   = errors.New("baidu_std: decompressed message does not fit the in-flight budget")
)

// extended reports whether m carries the fields newer brpc adds to every
// RpcMeta (content_type, checksum_type, checksum_value); a response
// carries them when its request did, as the peer's brpc would write them.
func extended(m *metapb.RpcMeta) bool {
	return m.ContentType != nil || m.ChecksumType != nil || m.ChecksumValue != nil
}

func setExtended(m *metapb.RpcMeta) {
	m.ContentType = proto.Int32(0)
	m.ChecksumType = proto.Int32(0)
	m.ChecksumValue = []byte{}
}

// requestMeta is the RpcMeta of a call, in brpc's field order and
// presence: request{service, method, [log_id], [request_id],
// [timeout_ms]}, compress_type, correlation_id.
func requestMeta(service, method string, cid int64, o *CallOptions, ext bool) *metapb.RpcMeta {
	rm := &metapb.RpcRequestMeta{ServiceName: proto.String(service), MethodName: proto.String(method)}
	if o != nil {
		if o.LogID != 0 {
			rm.LogId = proto.Int64(o.LogID)
		}
		if o.RequestID != "" {
			rm.RequestId = proto.String(o.RequestID)
		}
	}
	m := &metapb.RpcMeta{Request: rm, CompressType: proto.Int32(CompressNone), CorrelationId: proto.Int64(cid)}
	if ext {
		setExtended(m)
	}
	return m
}

// responseMeta is the RpcMeta of a response as brpc writes it: the
// error_code always, the error_text only on error.
func responseMeta(cid int64, code Errno, text string, ext bool) *metapb.RpcMeta {
	rm := &metapb.RpcResponseMeta{ErrorCode: proto.Int32(int32(code))}
	if text != "" {
		rm.ErrorText = proto.String(text)
	}
	m := &metapb.RpcMeta{Response: rm, CompressType: proto.Int32(CompressNone), CorrelationId: proto.Int64(cid)}
	if ext {
		setExtended(m)
	}
	return m
}

// errorText words a server-side error as brpc's Controller::SetFailed
// does: "[<identity>]" then "[E<code>]" for a coded error, then the text.
// A handler's plain error has no code part (brpc records it as -1 and
// sends EINTERNAL).
func errorText(identity string, code Errno, coded bool, text string) string {
	if coded {
		return fmt.Sprintf("[%s][E%d]%s", identity, int32(code), text)
	}
	return "[" + identity + "]" + text
}
