package server

import (
	"bufio"
	"bytes"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// FuzzHeadReader runs the request head parser on arbitrary bytes, read
// through buffers as small as 16 bytes, against net/http's ReadRequest.
// The parser must not panic, must stay within its byte limit, and must
// never be more lenient than net/http: a head it takes, net/http takes
// too, with the same method, target, Host, length or chunking and fields.
// It is stricter by design in a few places, checked only in this
// direction: obsolete line folding, Transfer-Encoding beside a
// Content-Length or in HTTP/1.0, HTTP versions other than 1.0 and 1.1,
// and a missing Host in HTTP/1.1, which net/http's server (not
// ReadRequest) refuses.
func FuzzHeadReader(f *testing.F) {
	for _, s := range []string{
		"GET / HTTP/1.1\r\nHost: a\r\n\r\n",
		"POST /v1/completions HTTP/1.1\r\nHost: kvcar:8080\r\nContent-Length: 12\r\nContent-Type: application/json\r\n\r\n",
		"POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n",
		"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\n",
		"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
		"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
		"GET http://h/p?q=1 HTTP/1.0\nConnection: keep-alive\n\n",
		"GET / HTTP/1.1\r\nHost: a\r\nX: b\r\n c\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: [::1]:80\r\nExpect: 100-continue\r\n\r\n",
		"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
		"GET / HTTP/1.1\r\nhost: a\r\nHOST: b\r\n\r\n",
		"\r\nGET / HTTP/1.1\r\n\r\n",
		"POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chun\u212aed\r\nConnection: clo\u017fe\r\n\r\n",
	} {
		f.Add([]byte(s), uint8(0))
	}
	f.Fuzz(func(t *testing.T, data []byte, size uint8) {
		const limit = 1 << 10
		hr := headReader{br: bufio.NewReaderSize(bytes.NewReader(data), 16+int(size)), maxBytes: limit}
		var h reqHead
		err := hr.read(&h)
		if hr.used > limit+16+int(size)+1 {
			t.Fatalf("read %d bytes of a head limited to %d", hr.used, limit)
		}
		var he *headError
		if err != nil {
			if errors.As(err, &he) && (he.status < 400 || he.status > 599 || he.message == "") {
				t.Fatalf("refusal %d %q", he.status, he.message)
			}
			return
		}
		// The target is parsed as the request is served, as serveRequest
		// does.
		if _, uerr := url.ParseRequestURI(h.target); uerr != nil && (h.target != "*" || h.method != http.MethodOptions) {
			return
		}
		ref, rerr := http.ReadRequest(bufio.NewReader(bytes.NewReader(data)))
		if rerr != nil {
			t.Fatalf("took %q, which net/http refuses: %v", data, rerr)
		}
		if ref.Method != h.method || ref.RequestURI != h.target || ref.ProtoMinor != h.minor {
			t.Fatalf("%q: %s %s 1.%d, net/http %s %s 1.%d", data, h.method, h.target, h.minor, ref.Method, ref.RequestURI, ref.ProtoMinor)
		}
		if h.chunked != (len(ref.TransferEncoding) == 1) || (!h.chunked && max(h.contentLength, 0) != ref.ContentLength) {
			t.Fatalf("%q: length %d chunked %v, net/http %d %v", data, h.contentLength, h.chunked, ref.ContentLength, ref.TransferEncoding)
		}
		if h.minor >= 1 && h.host != ref.Host && !strings.Contains(h.target, "://") {
			t.Fatalf("%q: Host %q, net/http %q", data, h.host, ref.Host)
		}
		if h.close != ref.Close {
			t.Fatalf("%q: close %v, net/http %v", data, h.close, ref.Close)
		}
		// Both move Host out of the fields; the rest must agree.
		got := hr.header
		for k, v := range ref.Header {
			if strings.Join(got[k], "\x00") != strings.Join(v, "\x00") {
				t.Fatalf("%q: field %s %q, net/http %q", data, k, got[k], v)
			}
		}
		if len(got) != len(ref.Header) {
			t.Fatalf("%q: fields %v, net/http %v", data, got, ref.Header)
		}
	})
}
