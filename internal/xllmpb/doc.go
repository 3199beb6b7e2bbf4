// Package xllmpb is the generated protobuf code of the xLLM messages that
// cross the wire between an xLLM engine and its service (protobuf package
// xllm.proto): CompletionRequest and ChatRequest with the fields the
// service sets (service_request_id, token_ids, routing,
// source_xservice_addr), their responses, and the Generations payload
// (DisaggStreamGenerations, StatusSet). The .proto files in proto/ are
// minimal extracts of xLLM's own, names and field numbers exact; `make
// proto` regenerates the Go code from them. Subpackage xservicepb holds
// xllm_service.proto's messages (HeartbeatRequest, InstanceMetaInfo, ...).
//
// The package holds data types only: no transport, no routing. Edit the
// .proto files, never the generated code.
package xllmpb

// Wire identities of the RPCs (baidu_std RpcRequestMeta service and
// method names).
const (
	// APIService is the engine's service, served on its business port.
	APIService            = "xllm.proto.XllmAPIService"
	MethodCompletions     = "Completions"
	MethodChatCompletions = "ChatCompletions"
	// RPCService is the service's service, served on its rpc port.
	RPCService                 = "xllm_service.proto.XllmRpcService"
	MethodHello                = "Hello"
	MethodRegisterInstance     = "RegisterInstance"
	MethodGetInstanceInfo      = "GetInstanceInfo"
	MethodHeartbeat            = "Heartbeat"
	MethodGetStaticDecodeList  = "GetStaticDecodeList"
	MethodGetStaticPrefillList = "GetStaticPrefillList"
	MethodGenerations          = "Generations"
)
