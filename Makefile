# ckfrelay — see README.md.
GO        ?= go
PKGS      := ./...
# Packages that must also build for the WebAssembly consumer.
WASM_PKGS := ./ckf/... ./wire/... ./consumer/... ./wasm/guest
FUZZTIME  ?= 20s

.PHONY: all run test js-test wasmtime-test check vet fmt-check tidy-check staticcheck wasm-check port-check generate-check proto proto-check wasm bench fuzz

all: check test

## run: run the main job on its embedded default
run:
	$(GO) run ./cmd/relay demo

## test: every test, race detector on packages with goroutines
test: check
	$(GO) test -count=1 $(PKGS)
	$(GO) test -count=1 -race -short $(PKGS)
	$(MAKE) js-test
	$(MAKE) wasmtime-test

## js-test: the JavaScript router's tests under Node against the real relay, and the type-check of index.d.ts (npm ci when js/node_modules is missing)
js-test:
	@if ! command -v node >/dev/null 2>&1; then \
	  echo "js-test: skipped: node not found (install nodejs >= 20 and npm to run the JavaScript router's tests)"; \
	elif ! command -v npm >/dev/null 2>&1; then \
	  echo "js-test: skipped: npm not found (install npm: the tests need the devDependencies typescript and @types/node from js/package-lock.json)"; \
	else \
	  cd js && { [ -d node_modules ] || npm ci --no-audit --no-fund; } && GO="$(GO)" node --test test/*.test.mjs; \
	fi

## wasmtime-test: the conformance suite on wasmtime (internal/integration/wasmtime, a nested
## module: wasmtime-go is cgo, so it needs a C compiler; tidy, vet and staticcheck are checked there too)
WASMTIME_MOD := internal/integration/wasmtime
wasmtime-test:
	@cc=$$($(GO) env CC); \
	if [ "$$($(GO) env CGO_ENABLED)" = 1 ] && command -v "$${cc%% *}" >/dev/null 2>&1; then \
	  cd $(WASMTIME_MOD) && $(GO) mod tidy -diff && $(GO) vet ./... && $(GO) run $(STATICCHECK) ./... && \
	  $(GO) test -count=1 ./...; \
	else \
	  echo "wasmtime-test: skipped: no C compiler ($$cc not found or CGO_ENABLED=0; install gcc to run the conformance suite on wasmtime)"; \
	fi

STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2

## check: formatting, tidy modules, vet, staticcheck, cross-builds, and generators that leave the tree as committed
check: fmt-check tidy-check vet staticcheck wasm-check port-check generate-check proto-check

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

# go.mod and go.sum must be exactly what `go mod tidy` writes.
tidy-check:
	$(GO) mod tidy -diff

vet:
	$(GO) vet $(PKGS)

# staticcheck, pinned; a finding is fixed or suppressed with //lint:ignore and its reason.
staticcheck:
	$(GO) run $(STATICCHECK) $(PKGS)

# Every generator must reproduce what is committed (as wazero's check does):
# run them and fail if that changed the tree. Changes that were already in the
# tree before the run (a developer's edits) are not the generators' and pass.
generate-check:
	@before=$$( (git status --porcelain; git diff) 2>/dev/null | cksum ); \
	$(MAKE) --no-print-directory wasm >/dev/null || exit 1; \
	after=$$( (git status --porcelain; git diff) 2>/dev/null | cksum ); \
	if [ "$$before" != "$$after" ]; then \
	  echo "generate-check: make wasm changed the tree; commit what it wrote:"; git status --short; exit 1; \
	fi

wasm-check:
	GOOS=wasip1 GOARCH=wasm $(GO) build $(WASM_PKGS)

# A 32-bit build catches int/uint64 constant overflows that 64-bit hides.
port-check:
	GOARCH=386 $(GO) build ./...

## proto: regenerate wire/kvrelay/kvrelaypb from its .proto (protoc from Debian's protobuf-compiler,
## plugins pinned in internal/tools/go.mod); commit the result with the .proto
proto:
	GO="$(GO)" wire/kvrelay/proto/gen.sh

# The committed generated code must be what `make proto` writes.
proto-check:
	@if ! command -v protoc >/dev/null 2>&1; then \
	  echo "proto-check: skipped: protoc not found (apt-get install -y protobuf-compiler to check wire/kvrelay/kvrelaypb)"; \
	else \
	  tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	  GO="$(GO)" wire/kvrelay/proto/gen.sh "$$tmp" && \
	  for f in relay.pb.go relay_grpc.pb.go; do \
	    diff -u wire/kvrelay/kvrelaypb/$$f "$$tmp/wire/kvrelay/kvrelaypb/$$f" || \
	      { echo "proto-check: wire/kvrelay/kvrelaypb/$$f is stale: run make proto and commit it"; exit 1; }; \
	  done; \
	fi

## wasm: rebuild the embedded consumer module (commit it with the change that needed it)
wasm:
	$(GO) run ./cmd/wasmbuild

## bench: side-by-side benchmarks, ending in BENCH summary lines
bench:
	$(GO) run ./internal/cmd/benchsummary -go=$(GO) $(if $(BENCHROUNDS),-rounds=$(BENCHROUNDS)) -- $(BENCHFLAGS)

## fuzz: run every fuzz target for FUZZTIME each
fuzz:
	@for pkg in $$($(GO) list $(PKGS)); do \
	  for f in $$($(GO) test -list '^Fuzz' $$pkg 2>/dev/null | grep '^Fuzz'); do \
	    echo "== $$pkg $$f"; \
	    $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; \
	  done; \
	done
