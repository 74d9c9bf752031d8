# ckfrelay — see README.md.
GO        ?= go
PKGS      := ./...
# Packages that must also build for the WebAssembly consumer.
WASM_PKGS := ./ckf/... ./wire/... ./consumer/... ./wasm/guest
FUZZTIME  ?= 20s

.PHONY: all run test js-test check vet fmt-check tidy-check wasm-check port-check wasm bench fuzz

all: check test

## run: run the main job on its embedded default
run:
	$(GO) run ./cmd/relay demo

## test: every test, race detector on packages with goroutines
test: check
	$(GO) test -count=1 $(PKGS)
	$(GO) test -count=1 -race -short $(PKGS)
	$(MAKE) js-test

## js-test: the JavaScript router's tests under Node against the real relay, and the type-check of index.d.ts (npm ci when js/node_modules is missing)
js-test:
	@if ! command -v node >/dev/null 2>&1; then \
	  echo "js-test: skipped: node not found (install nodejs >= 20 and npm to run the JavaScript router's tests)"; \
	elif ! command -v npm >/dev/null 2>&1; then \
	  echo "js-test: skipped: npm not found (install npm: the tests need the devDependencies typescript and @types/node from js/package-lock.json)"; \
	else \
	  cd js && { [ -d node_modules ] || npm ci --no-audit --no-fund; } && GO="$(GO)" node --test test/*.test.mjs; \
	fi

## check: formatting, vet, cross-build for wasip1
check: fmt-check tidy-check vet wasm-check port-check

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

# go.mod and go.sum must be exactly what `go mod tidy` writes.
tidy-check:
	$(GO) mod tidy -diff

vet:
	$(GO) vet $(PKGS)

wasm-check:
	GOOS=wasip1 GOARCH=wasm $(GO) build $(WASM_PKGS)

# A 32-bit build catches int/uint64 constant overflows that 64-bit hides.
port-check:
	GOARCH=386 $(GO) build ./...

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
