# kvcar — two commands do everything on a fresh machine:
#   make run    embedded etcd, emulated engines and kvcar routing real requests
#   make test   vet, format check, and the whole test suite with -race
GO      ?= go
BIN     := bin
PKGS    := ./...
# FUZZTIME is a duration (20s) or an execution count (100000x).
FUZZTIME ?= 20s

.PHONY: all deps build run test vet fmt-check bench fuzz clean

all: build

deps:
	@./scripts/deps.sh

build: deps
	$(GO) build -o $(BIN)/ ./cmd/...

run: build
	$(BIN)/kvcar-demo

vet: deps
	$(GO) vet $(PKGS)

fmt-check:
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

test: deps fmt-check vet
	$(GO) test -race -count=1 -timeout 20m $(PKGS)

bench: deps
	$(GO) test -run '^$$' -bench . -benchmem $(PKGS)

fuzz: deps
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeBatch$$' -fuzztime $(FUZZTIME) ./internal/kvevent/
	$(GO) test -run '^$$' -fuzz '^FuzzParseReplay$$' -fuzztime $(FUZZTIME) ./internal/kvevent/
	$(GO) test -run '^$$' -fuzz '^FuzzParseLive$$' -fuzztime $(FUZZTIME) ./internal/kvevent/
	$(GO) test -run '^$$' -fuzz '^FuzzParse$$' -fuzztime $(FUZZTIME) ./internal/config/
	$(GO) test -run '^$$' -fuzz '^FuzzQueryRequest$$' -fuzztime $(FUZZTIME) ./internal/server/
	$(GO) test -run '^$$' -fuzz '^FuzzInferenceRequest$$' -fuzztime $(FUZZTIME) ./internal/server/
	$(GO) test -run '^$$' -fuzz '^FuzzEncode$$' -fuzztime $(FUZZTIME) ./internal/tokenizer/
	$(GO) test -run '^$$' -fuzz '^FuzzSplit$$' -fuzztime $(FUZZTIME) ./internal/tokenizer/

clean:
	rm -rf $(BIN)
