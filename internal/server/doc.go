// Package server owns kvcar's HTTP surface, as two handlers registered in
// one place, Server.routes: Handler, the public routes (the
// OpenAI-compatible request path, /health, /ready), and InternalHandler,
// the internal ones (the KV cache query endpoint POST
// /v1/internal/kv-cache/query (R-API), heartbeat intake, the operator
// routes and status page, /metrics, the profiler, /health and /ready).
// The caller serves them on separate listeners so that the internal ones
// can be kept off the network clients reach; with a token set, every
// internal route but /health and /ready requires it.
//
// The query path reads only the in-process directory through the
// KVDirectory interface (R-DIR-4): it never does network I/O, never
// changes the directory, and reuses its request and response buffers
// across requests so that a query allocates next to nothing.
//
// Request policy of the query endpoint (R-API-5):
//   - The body must be one JSON object with exactly one member,
//     "token_ids", an array of integers in [0, 4294967295]. The key is
//     matched exactly (encoding/json would also accept "TOKEN_IDS").
//   - Unknown members are rejected with 400 naming the member, so that a
//     misspelt key is reported instead of silently querying nothing.
//     A repeated "token_ids" member is rejected too.
//   - Numbers written with a fraction or exponent (1.5, 1.0, 1e3) are not
//     integers and are rejected; -0 is the integer 0 and is accepted.
//     Strings, booleans, null, arrays and objects as elements are
//     rejected naming their index.
//   - "token_ids": null and a missing "token_ids" are rejected; an empty
//     array is a status query (R-API-3).
//   - Anything after the object other than JSON whitespace is rejected.
//
// The request path (/v1/completions, /v1/chat/completions) reads a body
// once, as a stream, with the same scanner: prompt ids go into reused
// storage, other members are checked for syntax only. Runs of plain ids
// are taken 64 bytes at a time from bitmaps of their bytes' classes,
// which SSE2 assembly computes on amd64 (idclass_amd64.s) and portable Go
// elsewhere and with -tags purego (idclass.go). After the routing
// decision, a request for an instance the Dispatcher serves (an xLLM
// engine) is handed to it with what the parse found (the prompt's span,
// text or messages, the ids) and reused encoding buffers, which are given
// back with the body's budget once the engine has the request; any other
// is relayed to the engine over HTTP byte for byte except for the value
// of a top-level "routing" member, which kvcar replaces with its own
// decision, by the package's own HTTP/1.1 client (engineclient.go) on
// the request's goroutine: it starts no goroutine, its connections are
// kept per engine under the rules in its doc, it reads answers' heads
// itself (answer.go) into the connection's storage, and a request's
// context ends its connection's reads and writes. Body size, prompt ids, tokenized text and the body bytes held
// across requests are all bounded (Options), and the decision goes back
// to the client only when ExposeRoutingHeaders asks for it.
//
// HTTP1Server (h1serve.go, h1head.go, h1write.go) is the package's own
// HTTP/1.1 server, which kvcar runs on the public listener: one goroutine
// per connection serves its requests in order, its head read in place
// within a byte limit and refused (400, 431, 417, 501 or 505, naming the
// fault, the connection then closed) when it is malformed, framed two
// ways or of another HTTP version; its timeouts and the watch for a
// client gone while its request is served are one goroutine's per
// server. The internal listener stays on net/http.
//
// Every error, on every route, has the body
// {"error":{"code":<status>,"message":"<text>"}}.
//
// The package must not subscribe to engines, decode KV events or hold
// directory state: it validates, asks the directory, and encodes. It
// speaks no baidu_std itself: the Dispatcher does.
package server
