package kvevent

// Field names of the map shapes, shared by the decoder and the encoder.
const (
	keyTS          = "ts"
	keyEvents      = "events"
	keyDPRank      = "data_parallel_rank"
	keyAttnDPRank  = "attn_dp_rank"
	keyType        = "type"
	keyBlockHashes = "block_hashes"
	keyParent      = "parent_block_hash"
	keyTokenIDs    = "token_ids"
	keyBlockSize   = "block_size"
	keyLoraID      = "lora_id"
	keyMedium      = "medium"
	keyLoraName    = "lora_name"
	keyExtraKeys   = "extra_keys"
	keyGroupIdx    = "group_idx"
	keySpecKind    = "kv_cache_spec_kind"
	keyLocality    = "locality"
	keyCacheSalt   = "cache_salt"
)

// Values of the fields that leave a block plain text, in lower case (the
// decoder ignores their case): kv_cache_spec_kind of full-attention KV,
// the only kind whose blocks are a plain prefix of their tokens, and the
// locality of this instance's own cache.
const (
	specFullAttention = "full_attention"
	localityLocal     = "local"
)
