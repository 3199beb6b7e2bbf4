package main

import (
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestInternalTokenSources covers issue 10 item 7: the token comes from
// exactly one of the flag, a file or the environment; a file's trailing
// newline is dropped; an empty, unreadable, oversized or unsendable token
// is refused naming its source and never showing the token.
func TestInternalTokenSources(t *testing.T) {
	dir := t.TempDir()
	file := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	const secret = "s3cr3t-Value"
	for _, tc := range []struct {
		name       string
		flag, path string
		env        string
		want       string
		errHas     []string
	}{
		{name: "none"},
		{name: "flag", flag: secret, want: secret},
		{name: "file", path: file("plain", secret), want: secret},
		{name: "file with newline", path: file("nl", secret+"\n"), want: secret},
		{name: "file with CRLF", path: file("crlf", secret+"\r\n"), want: secret},
		{name: "env", env: secret, want: secret},
		{name: "env with newline", env: secret + "\n", want: secret},
		{name: "empty file", path: file("empty", ""), errHas: []string{"--internal_api_token_file", "empty"}},
		{name: "newline only", path: file("newline", "\n"), errHas: []string{"--internal_api_token_file", "empty"}},
		{name: "missing file", path: filepath.Join(dir, "absent"), errHas: []string{"--internal_api_token_file", "absent", "no such file"}},
		{name: "directory", path: dir, errHas: []string{"--internal_api_token_file", "reading the token"}},
		{name: "oversized file", path: file("big", strings.Repeat("a", maxTokenBytes+1)), errHas: []string{"longer than 4096 bytes"}},
		{name: "two lines", path: file("two", secret+"\nmore\n"), errHas: []string{"--internal_api_token_file", "0x0a", "visible ASCII"}},
		{name: "inner space", env: "s3cr3t Value", errHas: []string{tokenEnv, "byte 6 is 0x20"}},
		{name: "flag and env", flag: secret, env: secret, errHas: []string{"--internal_api_token and " + tokenEnv, "exactly one"}},
		{name: "file and env", path: file("both", secret), env: secret, errHas: []string{"--internal_api_token_file and " + tokenEnv}},
		{name: "flag and file", flag: secret, path: file("both2", secret), errHas: []string{"--internal_api_token and --internal_api_token_file"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &flags{internalAPIToken: tc.flag, tokenFile: tc.path}
			getenv := func(k string) string {
				if k == tokenEnv {
					return tc.env
				}
				return ""
			}
			got, err := internalToken(f, getenv, slog.New(slog.DiscardHandler))
			if len(tc.errHas) == 0 {
				if err != nil || got != tc.want {
					t.Fatalf("token %q, %v; want %q", got, err, tc.want)
				}
				return
			}
			if err == nil {
				t.Fatalf("token %q accepted; want an error", got)
			}
			for _, want := range tc.errHas {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not say %q", err, want)
				}
			}
			if strings.Contains(err.Error(), "s3cr3t") {
				t.Errorf("error %q shows the token", err)
			}
		})
	}
}

// TestInternalTokenFromEnvironment runs the command with the token only
// in KVCAR_INTERNAL_API_TOKEN: internal routes then require it, and the
// process list would show no token.
func TestInternalTokenFromEnvironment(t *testing.T) {
	t.Setenv(tokenEnv, "from-env\n")
	addrs := startKVCar(t)
	if code, body := query(t, addrs.internal, "", `{"token_ids":[]}`); code != http.StatusUnauthorized {
		t.Fatalf("without the token: %d %s", code, body)
	}
	if code, body := query(t, addrs.internal, "from-env", `{"token_ids":[]}`); code != http.StatusOK {
		t.Fatalf("with the token from the environment: %d %s", code, body)
	}
	t.Setenv(tokenEnv, "from-env")
	err := run(t.Context(), []string{"--port=0", "--internal_port=0", "--internal_api_token=x"}, io.Discard, nil)
	if err == nil || !strings.Contains(err.Error(), "exactly one") {
		t.Fatalf("flag and environment together: %v", err)
	}
}
