// Package baidustd speaks brpc's baidu_std protocol over TCP: the frame
// ("PRPC", body_size, meta_size, RpcMeta, message, attachment), the
// RpcMeta (generated from proto/baidu_rpc_meta.proto into metapb), a
// server and a client.
//
// # Frames
//
// A frame is a 12-byte header, "PRPC" then body_size and meta_size as
// big-endian uint32, followed by body_size bytes: meta_size bytes of
// RpcMeta, the serialized message, and RpcMeta.attachment_size bytes of
// attachment at the end. Every reader bounds body_size (MaxBodySize) and
// grows a frame's buffer as its bytes arrive, so a header alone costs at
// most a first chunk whatever body_size it announces; a
// frame that breaks the framing (bad magic, oversize body, meta larger
// than the body, an RpcMeta that does not parse) closes its connection
// with a logged reason, as brpc closes it, and affects no other
// connection. Everything a frame can get wrong after that is answered on
// the call itself.
//
// # Server
//
// Each accepted connection has one goroutine reading its frames; each
// call runs its Handler on a worker goroutine of its own, kept for the
// connection's later calls while they come within a second, so calls
// pipelined on one connection run concurrently and are answered as they
// finish, each response carrying its request's correlation_id unchanged.
// Responses are written as brpc writes them: RpcResponseMeta{error_code,
// [error_text]}, compress_type 0, the correlation_id, [attachment_size],
// and, when the request carried them, the three fields newer brpc adds
// (content_type, checksum_type, checksum_value). Errors are numbered and
// worded as brpc numbers and words them (Errno, Error), prefixed with
// "[<identity>]", the server's address. Per-call handler timeouts, a bound
// on calls in flight per connection and on connections, one on the bytes
// all calls hold together (MaxInflightBytes: frames, a bound on what
// their RpcMeta decodes to, decompressed messages, for Unary handlers a
// bound on what the message decodes to, read off the wire first, and a
// fixed cost a call; a call that does not fit is answered ELIMIT and its
// connection serves on; held until the handler returns, not until the
// answer is written, so a peer that reads nothing holds none of it),
// idle connection reaping and a
// graceful Shutdown bound what a peer can make the server hold.
//
// # Client
//
// A Client keeps one TCP connection to one address, as brpc's default
// "single" connection type does, pipelines calls on it and matches
// responses by correlation_id. Each call's deadline comes from its
// context; a broken connection fails the calls in flight on it and the
// next call dials again.
//
// The package knows nothing of the services carried: no xLLM names, no
// routing. It owns its connections and goroutines; of kvcar it imports
// only the leaves sockio and budget.
package baidustd
