package hugepage

// MinBytes is the smallest array Advise advises; pageSize is the huge
// page size of amd64 and arm64 Linux with 4 KiB base pages.
const (
	MinBytes = 8 << 20
	pageSize = 2 << 20
)
