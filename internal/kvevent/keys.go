package kvevent

// Field names of the map shapes, shared by the decoder and the encoder.
const (
	keyTS          = "ts"
	keyEvents      = "events"
	keyDPRank      = "data_parallel_rank"
	keyType        = "type"
	keyBlockHashes = "block_hashes"
	keyParent      = "parent_block_hash"
	keyTokenIDs    = "token_ids"
	keyBlockSize   = "block_size"
	keyLoraID      = "lora_id"
	keyMedium      = "medium"
	keyLoraName    = "lora_name"
	keyExtraKeys   = "extra_keys"
)
