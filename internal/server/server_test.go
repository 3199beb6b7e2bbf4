package server

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

type errorBody struct {
	Error struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

type queryBody struct {
	Matches      []map[string]any `json:"matches"`
	IndexEnabled *bool            `json:"index_enabled"`
}

// startServer serves the internal routes, where the query API, heartbeats
// and the operator routes are.
func startServer(t *testing.T, opts Options, ready bool) *httptest.Server {
	t.Helper()
	return serveRoutes(t, opts, ready, (*Server).InternalHandler)
}

// startPublicServer serves the public routes of a Server made from
// opts, ready (the request path), as kvcar does: by its own HTTP/1.1
// loop, HTTP1Server.
func startPublicServer(t *testing.T, opts Options) *httptest.Server {
	t.Helper()
	s := New(opts)
	s.SetReady(true)
	return serveH1(t, s.Handler(), HTTP1Options{})
}

func serveRoutes(t *testing.T, opts Options, ready bool, routes func(*Server) http.Handler) *httptest.Server {
	s := New(opts)
	s.SetReady(ready)
	ts := httptest.NewServer(routes(s))
	t.Cleanup(ts.Close)
	return ts
}

type reqOpt func(*http.Request)

func withHeader(k, v string) reqOpt { return func(r *http.Request) { r.Header.Set(k, v) } }

func do(t *testing.T, ts *httptest.Server, method, path string, body io.Reader, opts ...reqOpt) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, ts.URL+path, body)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range opts {
		o(req)
	}
	resp, err := ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

// checkError asserts the shared error body format and the status.
func checkError(t *testing.T, resp *http.Response, body []byte, status int, want string) {
	t.Helper()
	if resp.StatusCode != status {
		t.Fatalf("status %d, want %d; body %s", resp.StatusCode, status, body)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q", ct)
	}
	var eb errorBody
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&eb); err != nil {
		t.Fatalf("error body %s is not {\"error\":{code,message}}: %v", body, err)
	}
	if eb.Error.Code != status {
		t.Errorf("error code %d, want %d", eb.Error.Code, status)
	}
	if !strings.Contains(eb.Error.Message, want) {
		t.Errorf("error message %q does not contain %q", eb.Error.Message, want)
	}
}

func query(t *testing.T, ts *httptest.Server, body string, opts ...reqOpt) (*http.Response, []byte) {
	t.Helper()
	return do(t, ts, http.MethodPost, QueryPath, strings.NewReader(body), opts...)
}

func TestHealthAndReady(t *testing.T) {
	s := New(Options{})
	ts := httptest.NewServer(s.Handler())
	defer ts.Close()
	resp, body := do(t, ts, http.MethodGet, "/health", nil)
	if resp.StatusCode != http.StatusOK || !json.Valid(body) {
		t.Fatalf("health: %d %s", resp.StatusCode, body)
	}
	if resp, _ := do(t, ts, http.MethodHead, "/health", nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("HEAD health: %d", resp.StatusCode)
	}
	resp, body = do(t, ts, http.MethodGet, "/ready", nil)
	checkError(t, resp, body, http.StatusServiceUnavailable, "not ready")
	s.SetReady(true)
	if resp, body := do(t, ts, http.MethodGet, "/ready", nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("ready after SetReady: %d %s", resp.StatusCode, body)
	}
	s.SetReady(false)
	resp, body = do(t, ts, http.MethodGet, "/ready", nil)
	checkError(t, resp, body, http.StatusServiceUnavailable, "not ready")
	resp, body = do(t, ts, http.MethodPost, "/health", nil)
	checkError(t, resp, body, http.StatusMethodNotAllowed, "POST")
	if got := resp.Header.Get("Allow"); got != "GET, HEAD" {
		t.Errorf("Allow %q", got)
	}
}

func TestQueryNotReady(t *testing.T) {
	// R-API-1: not served before the service is ready.
	s := New(Options{})
	ts := httptest.NewServer(s.InternalHandler())
	defer ts.Close()
	resp, body := query(t, ts, `{"token_ids":[1]}`)
	checkError(t, resp, body, http.StatusServiceUnavailable, "not ready")
	s.SetReady(true)
	if resp, body := query(t, ts, `{"token_ids":[1]}`); resp.StatusCode != http.StatusOK {
		t.Fatalf("after ready: %d %s", resp.StatusCode, body)
	}
}

func TestQueryAuth(t *testing.T) {
	// R-API-2: X-Internal-Token required when configured.
	ts := startServer(t, Options{InternalAPIToken: "s3cret"}, true)
	resp, body := query(t, ts, `{"token_ids":[1]}`)
	checkError(t, resp, body, http.StatusUnauthorized, "missing X-Internal-Token")
	// Surrounding blanks are not part of a header value in HTTP, so
	// "s3cret " is the right token and is not tested as a wrong one.
	for _, wrong := range []string{"", "s3cre", "s3cret!", "S3CRET", strings.Repeat("s3cret", 100)} {
		resp, body = query(t, ts, `{"token_ids":[1]}`, withHeader("X-Internal-Token", wrong))
		checkError(t, resp, body, http.StatusUnauthorized, "X-Internal-Token")
	}
	resp, body = query(t, ts, `{"token_ids":[1]}`, func(r *http.Request) {
		r.Header.Add("X-Internal-Token", "s3cret")
		r.Header.Add("X-Internal-Token", "other")
	})
	checkError(t, resp, body, http.StatusUnauthorized, "invalid X-Internal-Token")
	resp, body = query(t, ts, `{"token_ids":[1]}`, withHeader("X-Internal-Token", "s3cret"))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("right token: %d %s", resp.StatusCode, body)
	}
	// Without a configured token, no header is needed (R-API-2 "if configured").
	open := startServer(t, Options{}, true)
	if resp, body := query(t, open, `{"token_ids":[1]}`); resp.StatusCode != http.StatusOK {
		t.Fatalf("no token configured: %d %s", resp.StatusCode, body)
	}
}

func TestQueryMethod(t *testing.T) {
	ts := startServer(t, Options{}, true)
	for _, m := range []string{http.MethodGet, http.MethodPut, http.MethodDelete} {
		resp, body := do(t, ts, m, QueryPath, nil)
		checkError(t, resp, body, http.StatusMethodNotAllowed, "use POST")
		if got := resp.Header.Get("Allow"); got != "POST" {
			t.Errorf("%s: Allow %q", m, got)
		}
	}
}

func TestQueryContentType(t *testing.T) {
	ts := startServer(t, Options{}, true)
	for _, ct := range []string{"application/json", "application/json; charset=utf-8", "Application/JSON"} {
		if resp, body := query(t, ts, `{"token_ids":[1]}`, withHeader("Content-Type", ct)); resp.StatusCode != http.StatusOK {
			t.Errorf("%q: %d %s", ct, resp.StatusCode, body)
		}
	}
	// Absent Content-Type is accepted (curl -d sends a form type; scripts may send none).
	req, _ := http.NewRequest(http.MethodPost, ts.URL+QueryPath, strings.NewReader(`{"token_ids":[1]}`))
	req.Header.Del("Content-Type")
	resp, err := ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("absent Content-Type: %d", resp.StatusCode)
	}
	for _, ct := range []string{"text/plain", "application/x-www-form-urlencoded", "application/", "application/jsonx"} {
		resp, body := query(t, ts, `{"token_ids":[1]}`, withHeader("Content-Type", ct))
		checkError(t, resp, body, http.StatusUnsupportedMediaType, "application/json")
	}
	// curl -d's default type: the answer says how to fix the command.
	resp, body := query(t, ts, `{"token_ids":[1]}`, withHeader("Content-Type", "application/x-www-form-urlencoded"))
	checkError(t, resp, body, http.StatusUnsupportedMediaType, "-H 'Content-Type: application/json'")
}

// onlyReader hides the length of a body so that it is sent chunked.
type onlyReader struct{ r io.Reader }

func (o onlyReader) Read(p []byte) (int, error) { return o.r.Read(p) }

func TestQueryBodyLimit(t *testing.T) {
	// R-API-5: oversize body gets 413.
	ts := startServer(t, Options{MaxBodyBytes: 1024}, true)
	big := `{"token_ids":[` + strings.Repeat("1,", 2000) + `1]}`
	resp, body := query(t, ts, big)
	checkError(t, resp, body, http.StatusRequestEntityTooLarge, "exceeds 1024 bytes")
	resp, body = do(t, ts, http.MethodPost, QueryPath, onlyReader{strings.NewReader(big)})
	checkError(t, resp, body, http.StatusRequestEntityTooLarge, "exceeds 1024 bytes")
	// Valid JSON followed by padding past the limit is also refused.
	resp, body = do(t, ts, http.MethodPost, QueryPath, onlyReader{strings.NewReader(`{"token_ids":[1]}` + strings.Repeat(" ", 2000))})
	checkError(t, resp, body, http.StatusRequestEntityTooLarge, "exceeds 1024 bytes")
	// Exactly at the limit is fine.
	exact := `{"token_ids":[1]}`
	exact += strings.Repeat(" ", 1024-len(exact))
	if resp, body := do(t, ts, http.MethodPost, QueryPath, onlyReader{strings.NewReader(exact)}); resp.StatusCode != http.StatusOK {
		t.Fatalf("body at the limit: %d %s", resp.StatusCode, body)
	}
}

func TestDefaultLimits(t *testing.T) {
	s := New(Options{})
	if s.maxIDs != 1<<20 || s.maxBody != (1<<20)*11+64<<10 {
		t.Fatalf("defaults: ids %d body %d", s.maxIDs, s.maxBody)
	}
	s = New(Options{MaxTokenIDs: 10})
	if s.maxBody != 110+64<<10 {
		t.Fatalf("body default follows MaxTokenIDs: %d", s.maxBody)
	}
	// The default body limit admits MaxTokenIDs ids of the widest form.
	ts := startServer(t, Options{MaxTokenIDs: 5000}, true)
	body := `{"token_ids":[` + strings.TrimSuffix(strings.Repeat("4294967295,", 5000), ",") + `]}`
	if resp, b := query(t, ts, body); resp.StatusCode != http.StatusOK {
		t.Fatalf("widest ids: %d %s", resp.StatusCode, b)
	}
}

func TestQueryValidation(t *testing.T) {
	// R-API-5: bad input gets 400 naming the field or index.
	ts := startServer(t, Options{MaxTokenIDs: 4}, true)
	cases := []struct{ body, want string }{
		{``, "body is empty"},
		{`   `, "body is empty"},
		{`not json`, "invalid JSON"},
		{`[1,2]`, "must be a JSON object"},
		{`"x"`, "must be a JSON object"},
		{`null`, "must be a JSON object {\"token_ids\":[...]}, got null"},
		{`nul`, "invalid JSON"},
		{`{"token_ids":[tru]}`, "invalid JSON"},
		{`{"token_ids":nulx}`, "invalid JSON"},
		{`42`, "must be a JSON object"},
		{`{}`, "token_ids: missing"},
		{`{"token_ids":null}`, "token_ids: must be an array of integers, got null"},
		{`{"token_ids":"1,2"}`, "token_ids: must be an array of integers, got a string"},
		{`{"token_ids":{"0":1}}`, "token_ids: must be an array of integers, got an object"},
		{`{"token_ids":7}`, "token_ids: must be an array of integers, got a number"},
		{`{"token_ids":[1,2,3,-1]}`, "token_ids[3]: must be an integer in [0, 4294967295], got -1"},
		{`{"token_ids":[1.5]}`, "token_ids[0]: must be an integer in [0, 4294967295], got 1.5"},
		{`{"token_ids":[1.0]}`, "token_ids[0]: must be an integer in [0, 4294967295], got 1.0"},
		{`{"token_ids":[0,1e3]}`, "token_ids[1]: must be an integer in [0, 4294967295], got 1e3"},
		{`{"token_ids":[4294967296]}`, "token_ids[0]: must be an integer in [0, 4294967295], got 4294967296"},
		{`{"token_ids":[99999999999999999999999999999999999999]}`, "token_ids[0]: must be an integer in [0, 4294967295], got 99999999999999999999999999999999..."},
		{`{"token_ids":["1"]}`, "token_ids[0]: must be an integer in [0, 4294967295], got a string"},
		{`{"token_ids":[1,null]}`, "token_ids[1]: must be an integer in [0, 4294967295], got null"},
		{`{"token_ids":[true]}`, "token_ids[0]: must be an integer in [0, 4294967295], got a boolean"},
		{`{"token_ids":[[1]]}`, "token_ids[0]: must be an integer in [0, 4294967295], got an array"},
		{`{"token_ids":[1,2,3,4,5]}`, "token_ids: more than 4 ids"},
		{`{"token_ids":[1],"model":"x"}`, `unknown field "model"`},
		{`{"tokens":[1]}`, `unknown field "tokens"`},
		{`{"TOKEN_IDS":[1]}`, `unknown field "TOKEN_IDS"`},
		{`{"token_ids":[1],"token_ids":[2]}`, "given more than once"},
		{`{"token_ids":[1]} x`, "unexpected data after the JSON object"},
		{`{"token_ids":[1]}{}`, "unexpected data after the JSON object"},
		{`{"token_ids":[1,]}`, "invalid JSON"},
		{`{"token_ids":[,1]}`, "invalid JSON"},
		{`{"token_ids":[01]}`, "invalid JSON"},
		{`{"token_ids":[-]}`, "invalid JSON"},
		{`{"token_ids":[1 2]}`, "invalid JSON"},
		{`{"token_ids":[1]`, "unexpected end of body"},
		{`{"token_ids":[1,2`, "unexpected end of body"},
		{`{"token_ids"`, "unexpected end of body"},
		{`{"token_ids" [1]}`, "invalid JSON"},
		{`{token_ids:[1]}`, "invalid JSON"},
		{`{"token_ids":[1]`, "unexpected end"},
		{`{"tok\x01en":[1]}`, "invalid JSON"},
		{`{"tok\qen":[1]}`, "invalid JSON"},
		{`{,}`, "invalid JSON"},
		{`{"token_ids":[1],}`, "invalid JSON"},
	}
	for _, c := range cases {
		resp, body := query(t, ts, c.body, withHeader("Content-Type", "application/json"))
		t.Run(c.body, func(t *testing.T) { checkError(t, resp, body, http.StatusBadRequest, c.want) })
	}
}

func TestQueryAcceptedForms(t *testing.T) {
	// Escaped keys, whitespace and -0 are valid JSON integers; accept them.
	ts := startServer(t, Options{}, true)
	for _, body := range []string{
		`{"token_ids":[]}`,
		" \t\r\n{ \"token_ids\" : [ 1 , 2 ,\n3 ] } \n",
		`{"token\u005fids":[0,-0,4294967295]}`,
	} {
		resp, b := query(t, ts, body)
		if resp.StatusCode != http.StatusOK {
			t.Errorf("%q: %d %s", body, resp.StatusCode, b)
		}
	}
}

func TestQueryNilDirectory(t *testing.T) {
	// R-CFG-1: an empty config path disables the index; the endpoint
	// still answers, with no matches and index_enabled false.
	ts := startServer(t, Options{}, true)
	for _, body := range []string{`{"token_ids":[]}`, `{"token_ids":[1,2,3,4]}`} {
		resp, b := query(t, ts, body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%d %s", resp.StatusCode, b)
		}
		var qb queryBody
		if err := json.Unmarshal(b, &qb); err != nil {
			t.Fatalf("%s: %v", b, err)
		}
		if qb.Matches == nil || len(qb.Matches) != 0 || qb.IndexEnabled == nil || *qb.IndexEnabled {
			t.Fatalf("nil directory body %s", b)
		}
		if resp.Header.Get("Content-Type") != "application/json" {
			t.Errorf("Content-Type %q", resp.Header.Get("Content-Type"))
		}
	}
}
