// Package xservicepb is the generated protobuf code of xllm_service.proto
// (protobuf package xllm_service.proto): the messages of the service's
// XllmRpcService (HeartbeatRequest, Status, InstanceMetaInfo, InstanceID,
// InstanceIDs, StatusCode). Generated from ../proto/xservice.proto by
// `make proto`; data types only.
package xservicepb
