// Package xllmrpc is kvcar's side of xLLM's own RPCs over brpc baidu_std:
// it plays xllm-service to xLLM engines.
//
// Service serves xllm_service.proto.XllmRpcService on kvcar's rpc port:
// Heartbeat into the instance registry (the HTTP intake's semantics,
// Status{ok: false} for an unknown instance or a stale incarnation, as
// xllm-service answers), Generations into Outputs, the registry of
// requests waiting for their engines' output, and Hello,
// GetInstanceInfo, GetStaticDecodeList and GetStaticPrefillList answered
// as xllm-service answers them. RegisterInstance is declared but not
// implemented, as in xllm-service: engines register through etcd.
//
// Dispatcher sends OpenAI requests to xLLM engines as xllm-service does:
// Completions or ChatCompletions over baidu_std to the prefill instance,
// with service_request_id, token_ids, routing and source_xservice_addr,
// then turns the Generations that come back into the OpenAI response.
// Serves tells which instances take requests this way (backend_type
// "xllm" or none). The message is written in field order from a prompt
// the caller has already parsed (Prompt), copied once from the caller's
// storage into reused Buffers, or from the body alone; the client's
// error texts name no engine, the log does.
//
// The package owns its RPC clients and per-request state; it reads the
// instance registry through an interface and must not import the HTTP
// server, the policies or the directory. It does not choose instances:
// the caller brings the decision.
package xllmrpc
