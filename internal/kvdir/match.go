package kvdir

// Match is one stream's answer to a prefix query (R-API-4).
type Match struct {
	InstanceName string
	DPRank       int
	// Incarnation is the engine process identity the stream was
	// subscribed for; routing counts hits only when it matches the
	// registry's current one (R-CAR-7).
	Incarnation string
	// Discovered: the stream was derived from the registry, not listed
	// statically (StreamSpec.Discovered).
	Discovered   bool
	Synchronized bool
	// Complete is true when the synchronised view started from the
	// engine's whole state (a snapshot, or a history or live stream seen
	// from the engine's sequence 0 or an AllBlocksCleared); false when it
	// may lack blocks the engine stored before the view began, which it
	// then under-reports, never over-reports.
	Complete bool
	Sequence uint64
	// Hit tokens of the contiguous full-block prefix (R-IDX-3). A block
	// on both tiers counts once, as Device.
	DeviceHitTokens      int
	HostOnlyHitTokens    int
	ReusablePrefixTokens int
	// Resident replica counts; the tiers may overlap.
	DeviceBlocks int
	HostBlocks   int
	// Error says why an unsynchronised stream reports no hits.
	Error string
}
