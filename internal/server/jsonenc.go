package server

import (
	"net/http"
	"strconv"

	"github.com/kvcar/kvcar/internal/jsonw"
)

// appendError appends the error body used by every route.
func appendError(b []byte, code int, message string) []byte {
	b = append(b, `{"error":{"code":`...)
	b = strconv.AppendInt(b, int64(code), 10)
	b = append(b, `,"message":`...)
	b = jsonw.String(b, message)
	return append(b, "}}\n"...)
}

// writeJSON sends a complete JSON body.
func writeJSON(w http.ResponseWriter, code int, body []byte) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	// A failed write means the client went away; there is nobody to tell.
	_, _ = w.Write(body)
}

// writeError sends the error body for code.
func writeError(w http.ResponseWriter, code int, message string) {
	writeJSON(w, code, appendError(make([]byte, 0, 64+len(message)), code, message))
}
