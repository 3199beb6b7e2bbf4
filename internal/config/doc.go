// Package config owns the KV events configuration file named by
// --kv_events_config_file (R-CFG): its JSON keys, their defaults and
// allowed ranges, and every validation that can be done before the
// service starts.
//
// Every key, its default, its range and its meaning are declared once, in
// the key table in keys.go. Parsing, defaulting, re-encoding and the
// generated configuration reference (Reference) all read that table, so a
// key cannot be documented without being accepted or accepted without
// being documented.
//
// Policy on unexpected input: an unknown key, a key given twice in one
// object, a value of the wrong JSON type, a non-integer where an integer is
// expected (1.5, 1e3), a value outside its range, trailing data after the
// top-level object and a file larger than MaxFileBytes are all rejected
// with an error naming the full key path (for example streams[2].dp_rank).
// A misspelt key must stop the service at start-up rather than silently
// fall back to a default.
//
// Beyond the keys of the design note, discovery accepts an optional
// hash_seed (default 1024) so that streams found by discovery can use the
// same content-key seed choice as static streams; a sync mode and a topic
// template per backend_type (xllm, vllm, sglang), topic templates with
// {name}, {host}, {port} and {dp_rank}; and subscribe_bind for engines
// that dial one subscriber. Static streams take a sync_mode (a live one
// has no replay_endpoint) and bind.
//
// The package must not open sockets, resolve host names or know about
// streams at run time: it turns a file into a validated Config and nothing
// more. Configuration changes take effect on restart (R-CFG-5).
package config
