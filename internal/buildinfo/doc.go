// Package buildinfo names the revision a kvcar program was built from,
// for `kvcar --version`, the kvcar_build_info metric, the start-up log and
// the benchmark programs' reports.
//
// The revision is, in order: what the build stamped at link time
// (RevisionSymbol; `make build` and devcluster.BuildKVCar stamp it), the Go
// toolchain's VCS stamp (vcs.revision, "-dirty" after vcs.modified) when
// the build made one, else Unknown. Builds with -buildvcs=false, and every
// `go test` binary, carry no VCS stamp, so without the link-time stamp a
// binary cannot know its commit.
//
// It owns the version line's format (VersionLine, and ParseVersion for a
// program reading another binary's) and nothing else: it imports no kvcar
// package, opens nothing and runs no command (asking git is the caller's,
// for a working tree it knows).
package buildinfo
