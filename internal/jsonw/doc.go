// Package jsonw appends JSON strings to byte slices: the request path's
// answers are written into reused buffers, without encoding/json's
// reflection and allocations.
//
// It owns the escaping of strings, so that every writer of JSON in kvcar
// produces valid JSON text from any Go string (invalid UTF-8 included).
// It knows nothing of kvcar's messages and must not import any other
// part of kvcar.
package jsonw
