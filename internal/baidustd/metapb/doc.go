// Package metapb is the generated protobuf code of brpc's RpcMeta, from
// ../proto/baidu_rpc_meta.proto by `make proto`. Data types only; package
// baidustd reads and writes them.
package metapb
