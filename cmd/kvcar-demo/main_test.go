package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvcar/kvcar/internal/devcluster"
	"github.com/kvcar/kvcar/internal/testlog"
)

// TestPrintedCommandsWork runs the demo as make run does and then every
// command it prints for a new user to copy, against the live kvcar
// (issue 10 item 9: the printed query command had no Content-Type, so
// curl sent a form type and kvcar answered 415). Each command is sent as
// curl would send it, and through curl itself when it is installed.
func TestPrintedCommandsWork(t *testing.T) {
	if testing.Short() {
		t.Skip("builds kvcar and runs the demo")
	}
	bin, err := devcluster.BuildKVCar(t.Context(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var out testlog.Buffer
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() {
		errc <- run(ctx, []string{"--kvcar=" + bin, "--port=0", "--internal_port=0", "--requests=3", "--duration=10m"}, &out)
	}()
	defer func() {
		cancel()
		if err := <-errc; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("demo: %v", err)
		}
		if t.Failed() {
			t.Logf("demo output:\n%s", out.String())
		}
	}()
	deadline := time.Now().Add(2 * time.Minute)
	for !strings.Contains(out.String(), "keeps serving") {
		select {
		case err := <-errc:
			errc <- err
			t.Fatalf("demo ended before serving: %v", err)
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("demo not serving within 2 minutes")
		}
	}
	// Issue 11: a vLLM engine registered as xllm-service's sidecar
	// registers it runs beside the xLLM engines, and kvcar follows its
	// stream live, synchronised by the warm-up request's KV events.
	vllmLine := regexp.MustCompile(`engine (127\.0\.0\.1:\d+): vLLM \(backend_type vllm, registered as the vllm_sidecar does, HTTP heartbeats`)
	m := vllmLine.FindStringSubmatch(out.String())
	if m == nil {
		t.Fatal("no vLLM engine in the demo's output")
	}
	if want := "  " + m[1] + " dp0: live mode, synchronized true"; !strings.Contains(out.String(), want) {
		t.Fatalf("the streams summary lacks %q", want)
	}

	_, curlErr := exec.LookPath("curl")
	var commands, pages int
	for line := range strings.Lines(out.String()) {
		line = strings.TrimSpace(line)
		if i := strings.Index(line, "curl "); i >= 0 {
			commands++
			cmd := line[i:]
			req, err := curlRequest(cmd)
			if err != nil {
				t.Errorf("%s: %v", cmd, err)
				continue
			}
			checkAnswer(t, cmd, req)
			if curlErr == nil {
				runCurl(t, cmd)
			}
		}
		if url, ok := strings.CutPrefix(line, "status page:"); ok {
			pages++
			url, _, _ = strings.Cut(strings.TrimSpace(url), " ")
			req, err := http.NewRequest(http.MethodGet, url, nil)
			if err != nil {
				t.Fatal(err)
			}
			checkAnswer(t, url, req)
		}
	}
	if commands < 3 || pages != 1 {
		t.Fatalf("found %d curl commands and %d status page URLs in the output, want the completions, query and metrics commands and the page", commands, pages)
	}
}

// checkAnswer sends req and wants a 200 with a body.
func checkAnswer(t *testing.T, what string, req *http.Request) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Errorf("%s: %v", what, err)
		return
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK || len(body) == 0 {
		t.Errorf("%s: %d %.300s %v", what, resp.StatusCode, body, err)
	}
}

// runCurl runs the printed command through the shell as a user would and
// wants curl to succeed with HTTP 200.
func runCurl(t *testing.T, cmd string) {
	t.Helper()
	out, err := exec.Command("sh", "-c", cmd+` -o /dev/null -w '%{http_code}'`).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "200" {
		t.Errorf("curl: %s: %s %v", cmd, out, err)
	}
}

// curlRequest is the request curl sends for a command of the options the
// demo prints; any other option is an error, so that a command printed
// with one is not passed unchecked. Like curl, -d posts its data and,
// without a Content-Type header, labels it as a form.
func curlRequest(cmd string) (*http.Request, error) {
	words, err := shellWords(cmd)
	if err != nil {
		return nil, err
	}
	if len(words) == 0 || words[0] != "curl" {
		return nil, fmt.Errorf("not a curl command")
	}
	var (
		url, method = "", http.MethodGet
		data        *string
		header      = http.Header{}
	)
	for i := 1; i < len(words); i++ {
		switch w := words[i]; {
		case w == "-s" || w == "-S" || w == "-sS":
		case (w == "-H" || w == "-d") && i+1 == len(words):
			return nil, fmt.Errorf("%s without a value", w)
		case w == "-H":
			i++
			k, v, ok := strings.Cut(words[i], ":")
			if !ok {
				return nil, fmt.Errorf("header %q without a colon", words[i])
			}
			header.Add(strings.TrimSpace(k), strings.TrimSpace(v))
		case w == "-d":
			i++
			data, method = &words[i], http.MethodPost
		case strings.HasPrefix(w, "-"):
			return nil, fmt.Errorf("option %s: this test does not know what curl does with it", w)
		case url != "":
			return nil, fmt.Errorf("two URLs: %s and %s", url, w)
		default:
			url = w
		}
	}
	var body io.Reader
	if data != nil {
		body = strings.NewReader(*data)
		if header.Get("Content-Type") == "" {
			header.Set("Content-Type", "application/x-www-form-urlencoded")
		}
	}
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		return nil, err
	}
	req.Header = header
	return req, nil
}

// shellWords splits a command as sh does for words that are plain or in
// single quotes, which is all the demo prints; anything else is refused.
func shellWords(cmd string) ([]string, error) {
	var words []string
	var cur strings.Builder
	inWord, quoted := false, false
	for i := 0; i < len(cmd); i++ {
		c := cmd[i]
		switch {
		case quoted && c == '\'':
			quoted = false
		case quoted:
			cur.WriteByte(c)
		case c == '\'':
			quoted, inWord = true, true
		case c == ' ' || c == '\t':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		case strings.IndexByte(`"\$`+"`;&|<>()*?", c) >= 0:
			return nil, fmt.Errorf("character %q at %d: only plain and single-quoted words are understood", c, i)
		default:
			cur.WriteByte(c)
			inWord = true
		}
	}
	if quoted {
		return nil, fmt.Errorf("unterminated single quote")
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words, nil
}

// TestCurlRequestIsCurl pins the emulation to what curl does: -d without
// a Content-Type sends a form type, which is how the old printed query
// command failed.
func TestCurlRequestIsCurl(t *testing.T) {
	req, err := curlRequest(`curl -sS http://127.0.0.1:1/q -d '{"token_ids":[]}'`)
	if err != nil || req.Method != http.MethodPost || req.Header.Get("Content-Type") != "application/x-www-form-urlencoded" {
		t.Fatalf("%+v %v", req, err)
	}
	req, err = curlRequest(`curl -sS http://127.0.0.1:1/q -H 'Content-Type: application/json' -d '{"a b":1}'`)
	if err != nil || req.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("%+v %v", req, err)
	}
	if b, _ := io.ReadAll(req.Body); string(b) != `{"a b":1}` {
		t.Fatalf("body %q", b)
	}
	for _, bad := range []string{`curl -X POST http://h/`, `curl "http://h/"`, `curl http://h/ -d '{`, `wget http://h/`} {
		if _, err := curlRequest(bad); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}

// TestDemoRoutesChatWithTokenizer runs the demo as make run does with a
// tokenizer (here the small Qwen2-style fixture, whose chat template is
// Qwen's): kvcar tokenizes the multi-turn chat and text requests, and the
// engines reuse cached prefixes of them (R-CAR-2).
func TestDemoRoutesChatWithTokenizer(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	bin, err := devcluster.BuildKVCar(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var out testlog.Buffer
	err = run(ctx, []string{"--kvcar=" + bin, "--port=0", "--internal_port=0", "--requests=3", "--duration=1ms",
		"--tokenizer_path=../../internal/tokenizer/testdata/qwen2like"}, &out)
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, out.String())
	}
	m := regexp.MustCompile(`(\d+) chat and text requests, (\d+) prompt tokens: the engines reused (\d+)`).FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("no chat summary in the output:\n%s", out.String())
	}
	requests, _ := strconv.Atoi(m[1])
	prompt, _ := strconv.Atoi(m[2])
	reused, _ := strconv.Atoi(m[3])
	if requests != 16 || reused <= 0 || reused > prompt {
		t.Fatalf("chat workload: %d requests, %d prompt tokens, %d reused; want 16 requests and some reuse:\n%s", requests, prompt, reused, out.String())
	}
	t.Logf("%d chat and text requests, %d prompt tokens, %d reused", requests, prompt, reused)
}
