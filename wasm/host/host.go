// Package host runs the ckfrelay consumer WebAssembly module (wasm/guest,
// docs/abi.md) under wazero. [Instance] and [Pool] implement the project's
// one consumer interface, [github.com/ckfrelay/ckfrelay/client.Lanes], as
// client.Native does in-process, so a router switches between the module and
// the native consumer with one line.
//
// The module is embedded ([EmbeddedModule]), so `go get` users need no build
// step; it was built by `go run ./cmd/wasmbuild` and a test fails when it is
// stale. A [Runtime] compiles the module once (optionally through a
// file-backed compilation cache) and makes any number of [Instance] values,
// each an isolated consumer with its own table. An Instance serializes its
// callers with a mutex: one call in flight per module instance is a wazero
// rule. [Pool] spreads queries over several instances that receive the same
// frames. See docs/RATIONALE.md for why the host is shaped this way.
//
// Inputs are capped as natively (consumer.MaxInputBytes, 64 MiB, the
// module's alloc limit): a larger frame is refused with
// wire.ErrFrameTooLarge and a larger query with consumer.ErrInvalidQuery
// before the module is called, and a token block size above 2^31−1 is passed
// as 2^31−1, which answers like any larger one (docs/abi.md §2).
package host

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/experimental"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"

	"github.com/ckfrelay/ckfrelay/wasm/abi"
)

//go:embed ckfconsumer.wasm
var embedded []byte

// EmbeddedModule returns the consumer module built from wasm/guest at this
// commit (`go run ./cmd/wasmbuild`). The slice is shared; do not modify it.
func EmbeddedModule() []byte { return embedded }

// maxPages is the wasm32 limit: 65536 pages of 64 KiB = 4 GiB.
const maxPages = 65536

// Config configures a [Runtime]. The zero value is not used directly: start
// from [NewConfig]; every With method returns a modified copy, so a Config is
// safe to share. Validation happens once, in [NewRuntime].
type Config struct {
	module     []byte
	cacheDir   string
	limitPages uint32
	stderr     io.Writer
	mmap       bool
}

// NewConfig returns the defaults: the embedded module, no file cache (each
// Runtime compiles anew, ≈ 1 s), the 4 GiB wasm32 memory limit, guest stderr
// discarded, and the mmap allocator where the platform has one.
func NewConfig() Config {
	return Config{module: embedded, limitPages: maxPages, mmap: true}
}

// WithModule uses wasm instead of the embedded module (a custom build).
func (c Config) WithModule(wasm []byte) Config { c.module = wasm; return c }

// WithCompilationCacheDir keeps compiled machine code in dir, shared by every
// process that uses the same dir; a warm cache turns a ≈ 1 s compile into
// tens of milliseconds.
func (c Config) WithCompilationCacheDir(dir string) Config { c.cacheDir = dir; return c }

// WithMemoryLimitPages bounds each instance's linear memory to pages × 64 KiB
// (1..65536). A guest that needs more traps, and the instance is rebuilt.
func (c Config) WithMemoryLimitPages(pages uint32) Config { c.limitPages = pages; return c }

// WithStderr sends the guest's stderr (Go runtime crash reports) to w.
func (c Config) WithStderr(w io.Writer) Config { c.stderr = w; return c }

// WithMmapAllocator turns the mmap-backed memory allocator on or off (on by
// default). Off, wazero's default copies the whole memory on every growth.
func (c Config) WithMmapAllocator(on bool) Config { c.mmap = on; return c }

// Errors of the host itself. Errors the module reports are [*Error] values.
var (
	// ErrInvalidConfig: a Config value is out of range.
	ErrInvalidConfig = errors.New("host: invalid config")
	// ErrModule: the module does not implement the expected ABI (a missing
	// export, another ABI version) or failed to instantiate.
	ErrModule = errors.New("host: module does not implement the consumer ABI")
	// ErrInstanceReset: a call trapped, so the instance was discarded and a
	// fresh one configured with the same manifest and lane epochs. Every lane
	// is then unassigned (SPEC §5 ConsumerWorkerFailureMidApply): assign a
	// new epoch and install a snapshot.
	ErrInstanceReset = errors.New("host: instance trapped and was reset")
	// ErrClosed: the instance or runtime was closed.
	ErrClosed = errors.New("host: closed")
	// ErrGuest is the category of module error codes that have no consumer
	// or wire sentinel (a bad argument, a recovered panic, out of memory).
	ErrGuest = errors.New("host: module reported an error")
)

// Error is a negative status code returned by a module export, with the
// module's message. errors.Is matches the consumer or wire sentinel of the
// code (consumer.ErrStaleAssignmentEpoch, wire.ErrMalformed, …) exactly as
// the native consumer's errors do, or [ErrGuest] for ABI-only codes.
type Error struct {
	Op      string   // the export, e.g. "assign"
	Code    abi.Code // negative
	Message string   // from last_error
}

func (e *Error) Error() string {
	if e.Message == "" {
		return fmt.Sprintf("host: %s: %v", e.Op, e.Code)
	}
	return fmt.Sprintf("host: %s: %v: %s", e.Op, e.Code, e.Message)
}

// Unwrap returns the sentinel of the code.
func (e *Error) Unwrap() error {
	if s := e.Code.Sentinel(); s != nil {
		return s
	}
	return ErrGuest
}

// Runtime is a wazero runtime with the consumer module compiled. It is safe
// for concurrent use; [Runtime.NewInstance] may be called from any goroutine.
type Runtime struct {
	cfg      Config
	rt       wazero.Runtime
	compiled wazero.CompiledModule
	cache    wazero.CompilationCache

	// mu guards closed and live: Close must close every instance under the
	// instance's own lock, so no call is running when its memory is unmapped.
	mu     sync.Mutex
	closed bool
	live   map[*Instance]struct{}
}

// NewRuntime validates cfg, creates a compiler-engine runtime with WASI and
// compiles the module (from the file cache when warm). Close it when done.
func NewRuntime(ctx context.Context, cfg Config) (*Runtime, error) {
	if cfg.limitPages == 0 || cfg.limitPages > maxPages {
		return nil, fmt.Errorf("%w: memory limit %d pages outside 1..%d", ErrInvalidConfig, cfg.limitPages, maxPages)
	}
	if len(cfg.module) == 0 {
		return nil, fmt.Errorf("%w: empty module", ErrInvalidConfig)
	}
	rc := wazero.NewRuntimeConfigCompiler().WithMemoryLimitPages(cfg.limitPages)
	var cache wazero.CompilationCache
	if cfg.cacheDir != "" {
		var err error
		if cache, err = wazero.NewCompilationCacheWithDir(cfg.cacheDir); err != nil {
			return nil, fmt.Errorf("%w: compilation cache: %v", ErrInvalidConfig, err)
		}
		rc = rc.WithCompilationCache(cache)
	}
	rt := wazero.NewRuntimeWithConfig(ctx, rc)
	if _, err := wasi_snapshot_preview1.Instantiate(ctx, rt); err != nil {
		rt.Close(ctx)
		return nil, fmt.Errorf("%w: wasi: %v", ErrModule, err)
	}
	compiled, err := rt.CompileModule(ctx, cfg.module)
	if err != nil {
		rt.Close(ctx)
		return nil, fmt.Errorf("%w: compile: %v", ErrModule, err)
	}
	for _, name := range abi.ExportNames {
		if _, ok := compiled.ExportedFunctions()[name]; !ok {
			rt.Close(ctx)
			return nil, fmt.Errorf("%w: missing export %q", ErrModule, name)
		}
	}
	return &Runtime{cfg: cfg, rt: rt, compiled: compiled, cache: cache, live: map[*Instance]struct{}{}}, nil
}

// Close releases the runtime, its compiled module and every instance made
// from it. It is safe while other goroutines call those instances: each
// instance is closed under its own lock, so a call in flight finishes first
// (freeing a linear memory under a running call would fault the process),
// and every later call returns an error matching [ErrClosed], as does
// [Runtime.NewInstance].
func (r *Runtime) Close(ctx context.Context) error {
	r.mu.Lock()
	r.closed = true
	live := make([]*Instance, 0, len(r.live))
	for in := range r.live {
		live = append(live, in)
	}
	r.mu.Unlock()
	for _, in := range live {
		in.Close()
	}
	err := r.rt.Close(ctx)
	if r.cache != nil {
		_ = r.cache.Close(ctx)
	}
	return err
}

// instantiate makes one module instance and runs _initialize: a Go reactor
// has no _start, and every export traps until _initialize ran once.
func (r *Runtime) instantiate(ctx context.Context) (*module, error) {
	if r.cfg.mmap {
		ctx = experimental.WithMemoryAllocator(ctx, newAllocator())
	}
	mc := wazero.NewModuleConfig().WithName("").WithStartFunctions("_initialize")
	if r.cfg.stderr != nil {
		mc = mc.WithStderr(r.cfg.stderr)
	}
	mod, err := r.rt.InstantiateModule(ctx, r.compiled, mc)
	if err != nil {
		return nil, fmt.Errorf("%w: instantiate: %v", ErrModule, err)
	}
	m := newModule(mod)
	if v, err := m.call0("abi_version"); err != nil || v != abi.Version {
		mod.Close(ctx)
		return nil, fmt.Errorf("%w: abi version %d, want %d (%v)", ErrModule, v, abi.Version, err)
	}
	return m, nil
}
