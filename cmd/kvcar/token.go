package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
)

// tokenEnv is the environment variable the internal API token may come
// from.
const tokenEnv = "KVCAR_INTERNAL_API_TOKEN"

// maxTokenBytes bounds what is read of a token file: a token is a header
// value, and a path mistakenly naming a large file must not be read whole.
const maxTokenBytes = 4096

// internalToken returns the internal API token from the one source that
// gives it: --internal_api_token, --internal_api_token_file or the
// KVCAR_INTERNAL_API_TOKEN variable (an empty variable counts as unset).
// A file or variable may end in a newline, as secrets written by editors
// and echo do; it is dropped. Two sources at once are refused rather than
// one silently preferred, so that a stale secret cannot hide behind a
// fresh one. No source means no token.
func internalToken(f *flags, getenv func(string) string, log *slog.Logger) (string, error) {
	var sources []string
	if f.internalAPIToken != "" {
		sources = append(sources, "--internal_api_token")
	}
	if f.tokenFile != "" {
		sources = append(sources, "--internal_api_token_file")
	}
	env := getenv(tokenEnv)
	if env != "" {
		sources = append(sources, tokenEnv)
	}
	if len(sources) > 1 {
		return "", fmt.Errorf("the internal API token is given by %s: give exactly one", strings.Join(sources, " and "))
	}
	var token, from string
	switch {
	case f.internalAPIToken != "":
		token, from = f.internalAPIToken, "--internal_api_token"
		log.Warn("--internal_api_token is visible to every local user in the process list; prefer --internal_api_token_file or " + tokenEnv)
	case f.tokenFile != "":
		from = fmt.Sprintf("--internal_api_token_file=%q", f.tokenFile)
		b, err := readTokenFile(f.tokenFile)
		if err != nil {
			return "", fmt.Errorf("%s: %w", from, err)
		}
		token = trimNewline(string(b))
		if token == "" {
			return "", fmt.Errorf("%s: the file is empty", from)
		}
	case env != "":
		token, from = trimNewline(env), tokenEnv
	default:
		return "", nil
	}
	if err := checkToken(token); err != nil {
		return "", fmt.Errorf("internal API token from %s: %w", from, err)
	}
	return token, nil
}

func readTokenFile(path string) ([]byte, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading the token: %w", err)
	}
	defer fh.Close()
	b, err := io.ReadAll(io.LimitReader(fh, maxTokenBytes+1))
	if err != nil {
		return nil, fmt.Errorf("reading the token: %w", err)
	}
	if len(b) > maxTokenBytes {
		return nil, fmt.Errorf("the file is longer than %d bytes; it should hold only the token", maxTokenBytes)
	}
	return b, nil
}

// trimNewline drops one trailing line ending, "\n" or "\r\n".
func trimNewline(s string) string {
	s, _ = strings.CutSuffix(s, "\n")
	s, _ = strings.CutSuffix(s, "\r")
	return s
}

// checkToken accepts visible ASCII only: HTTP trims spaces around a
// header value and cannot carry control bytes, so a token holding them
// could never be sent back and would lock every client out. The token
// itself is never put into an error.
func checkToken(t string) error {
	if t == "" {
		// A variable holding only a line ending: given, and empty once
		// it is dropped, which would leave the internal API open.
		return fmt.Errorf("the token is empty")
	}
	for i := 0; i < len(t); i++ {
		if c := t[i]; c < 0x21 || c > 0x7e {
			return fmt.Errorf("byte %d is 0x%02x: a token must be visible ASCII characters without spaces", i, c)
		}
	}
	if len(t) > maxTokenBytes {
		return fmt.Errorf("the token is longer than %d bytes", maxTokenBytes)
	}
	return nil
}
