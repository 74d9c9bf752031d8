// Package wasmtime runs the consumer WebAssembly module (docs/abi.md) under
// wasmtime, the engine Rust routers embed (Cranelift), through
// github.com/bytecodealliance/wasmtime-go. [Instance] implements
// [client.Lanes], so the conformance suite and the side-by-side benchmarks
// drive it exactly as they drive the native consumer, wasm/host (wazero) and
// Node.
//
// It is a third host that shares no code with wasm/host beyond the record
// layouts of wasm/abi: it links WASI preview 1 (Linker.DefineWasi), calls
// _initialize once, checks abi_version, and follows docs/abi.md's call
// sequence, taking a fresh view of linear memory after every call that may
// grow it (alloc, configure, apply, …).
//
// wasmtime-go is cgo (its module carries the prebuilt static library), so this
// package is a Go module of its own: the main module's users never inherit
// cgo or the 207 MB dependency. `make wasmtime-test` runs it when a C
// compiler is installed.
package wasmtime

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sync"

	wt "github.com/bytecodealliance/wasmtime-go/v39"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/client"
	"github.com/ckfrelay/ckfrelay/consumer"
	"github.com/ckfrelay/ckfrelay/wasm/abi"
)

var _ client.Lanes = (*Instance)(nil)

// Errors of the host itself (not of the module's ABI).
var (
	// ErrModule: the module does not load, lacks an export or reports
	// another ABI version.
	ErrModule = errors.New("wasmtime: module")
	// ErrTrapped: a call trapped (an engine error); the instance is gone,
	// as docs/abi.md §2 tells a host to assume. Make a new one.
	ErrTrapped = errors.New("wasmtime: instance trapped")
	// ErrClosed: the instance was closed.
	ErrClosed = errors.New("wasmtime: instance closed")
	// ErrGuest: a negative ABI code that has no consumer or wire sentinel
	// (BadArgument, Internal, …).
	ErrGuest = errors.New("wasmtime: module error")
)

// Error is a negative status code from an export, with the module's
// last_error message. errors.Is matches the consumer or wire sentinel of the
// code, as the native consumer's errors do.
type Error struct {
	Op      string
	Code    abi.Code
	Message string
}

func (e *Error) Error() string {
	if e.Message == "" {
		return fmt.Sprintf("wasmtime: %s: %v", e.Op, e.Code)
	}
	return fmt.Sprintf("wasmtime: %s: %v: %s", e.Op, e.Code, e.Message)
}

// Unwrap returns the sentinel of the code.
func (e *Error) Unwrap() error {
	if s := e.Code.Sentinel(); s != nil {
		return s
	}
	return ErrGuest
}

// recordBytes is the size of the output buffer: the largest record.
const recordBytes = 256

// Runtime is a wasmtime engine with the module compiled once. Instances made
// from it are independent consumers.
type Runtime struct {
	engine *wt.Engine
	module *wt.Module
	linker *wt.Linker
}

// NewRuntime compiles wasm with Cranelift. With cacheDir set, the compiled
// code is kept there (Module.Serialize) and reloaded by later runtimes
// (NewModuleDeserializeFile), as wazero's compilation cache is by wasm/host.
func NewRuntime(wasm []byte, cacheDir string) (*Runtime, error) {
	return NewRuntimeWithConfig(nil, wasm, cacheDir)
}

// NewRuntimeWithConfig is NewRuntime on an engine built from cfg (nil: the
// defaults: Cranelift, optimized for speed), e.g. with
// a perf-map profiler (cfg.SetProfiler) to name the module's
// functions in `perf report`.
func NewRuntimeWithConfig(cfg *wt.Config, wasm []byte, cacheDir string) (*Runtime, error) {
	engine := wt.NewEngine()
	if cfg != nil {
		engine = wt.NewEngineWithConfig(cfg)
	}
	mod, err := compile(engine, wasm, cacheDir)
	if err != nil {
		return nil, err
	}
	have := map[string]bool{}
	for _, e := range mod.Exports() {
		have[e.Name()] = true
	}
	for _, n := range append(abi.ExportNames[:], "_initialize", "memory") {
		if !have[n] {
			return nil, fmt.Errorf("%w: missing export %q", ErrModule, n)
		}
	}
	linker := wt.NewLinker(engine)
	if err := linker.DefineWasi(); err != nil {
		return nil, fmt.Errorf("%w: wasi: %v", ErrModule, err)
	}
	return &Runtime{engine: engine, module: mod, linker: linker}, nil
}

func compile(engine *wt.Engine, wasm []byte, cacheDir string) (*wt.Module, error) {
	if cacheDir == "" {
		m, err := wt.NewModule(engine, wasm)
		if err != nil {
			return nil, fmt.Errorf("%w: compile: %v", ErrModule, err)
		}
		return m, nil
	}
	sum := sha256.Sum256(wasm)
	path := filepath.Join(cacheDir, hex.EncodeToString(sum[:16])+".cwasm")
	// A file from another wasmtime version or target fails to deserialize
	// (wasmtime checks both); it is then recompiled and replaced.
	if m, err := wt.NewModuleDeserializeFile(engine, path); err == nil {
		return m, nil
	}
	m, err := wt.NewModule(engine, wasm)
	if err != nil {
		return nil, fmt.Errorf("%w: compile: %v", ErrModule, err)
	}
	if b, err := m.Serialize(); err == nil {
		if os.MkdirAll(cacheDir, 0o755) == nil {
			tmp := path + ".tmp"
			if os.WriteFile(tmp, b, 0o644) == nil {
				_ = os.Rename(tmp, path)
			}
		}
	}
	return m, nil
}

// Close releases the runtime. Instances hold their own references and stay
// usable until closed.
func (r *Runtime) Close() {
	r.linker.Close()
	r.module.Close()
	r.engine.Close()
}

// Instance is one module instance (its own wasmtime Store) configured with a
// manifest. A mutex serializes callers: the module runs one call at a time.
type Instance struct {
	mu       sync.Mutex
	store    *wt.Store // nil once closed
	mem      *wt.Memory
	fns      [abi.NumExports]*wt.Func
	manifest consumer.Manifest
	dead     error // the trap that ended the instance

	scratch, scratchCap uint32 // guest input buffer, grown on demand
	out                 uint32 // guest buffer of recordBytes
}

// NewInstance instantiates the module in a new store, links WASI preview 1
// (stderr inherited, for Go crash reports; no files, no preopens), calls
// _initialize, checks abi_version and configures the manifest.
func (r *Runtime) NewInstance(m consumer.Manifest) (*Instance, error) {
	store := wt.NewStore(r.engine)
	wasi := wt.NewWasiConfig()
	wasi.InheritStderr()
	store.SetWasi(wasi)
	inst, err := r.linker.Instantiate(store, r.module)
	if err != nil {
		store.Close()
		return nil, fmt.Errorf("%w: instantiate: %v", ErrModule, err)
	}
	in := &Instance{store: store, manifest: m}
	fail := func(err error) (*Instance, error) { store.Close(); return nil, err }
	if _, err := inst.GetFunc(store, "_initialize").Call(store); err != nil {
		return fail(fmt.Errorf("%w: _initialize: %v", ErrModule, err))
	}
	in.mem = inst.GetExport(store, "memory").Memory()
	for i, n := range abi.ExportNames {
		in.fns[i] = inst.GetFunc(store, n)
	}
	if v, err := in.call(abi.ExportABIVersion); err != nil || v != abi.Version {
		return fail(fmt.Errorf("%w: abi version %d, want %d (%v)", ErrModule, v, abi.Version, err))
	}
	p, err := in.alloc(recordBytes)
	if err != nil {
		return fail(err)
	}
	in.out = p
	enc := abi.AppendManifest(nil, &m)
	if err := in.withInput(enc, func(p, n uint32) error {
		return in.check("configure", abi.ExportConfigure, int32(p), int32(n))
	}); err != nil {
		return fail(err)
	}
	return in, nil
}

// Close releases the instance's store. Later calls return [ErrClosed].
func (in *Instance) Close() error {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.store != nil {
		in.store.Close()
		in.store = nil
	}
	return nil
}

// Manifest returns the manifest the instance was configured with.
func (in *Instance) Manifest() consumer.Manifest { return in.manifest }

// lock takes the instance lock, or returns why the instance is unusable.
func (in *Instance) lock() error {
	in.mu.Lock()
	switch {
	case in.store == nil:
		in.mu.Unlock()
		return ErrClosed
	case in.dead != nil:
		in.mu.Unlock()
		return fmt.Errorf("%w: %v", ErrTrapped, in.dead)
	}
	return nil
}

// call invokes an export (every one returns an i32). A trap marks the
// instance dead.
func (in *Instance) call(fn abi.Export, args ...any) (int32, error) {
	v, err := in.fns[fn].Call(in.store, args...)
	if err != nil {
		in.dead = fmt.Errorf("%s: %v", abi.ExportNames[fn], err)
		return 0, fmt.Errorf("%w: %v", ErrTrapped, in.dead)
	}
	return v.(int32), nil
}

// check calls an export that returns 0 or a negative code.
func (in *Instance) check(op string, fn abi.Export, args ...any) error {
	v, err := in.call(fn, args...)
	if err != nil {
		return err
	}
	if v < 0 {
		return &Error{Op: op, Code: abi.Code(v), Message: in.lastError()}
	}
	return nil
}

func (in *Instance) alloc(n uint32) (uint32, error) {
	p, err := in.call(abi.ExportAlloc, int32(n))
	if err != nil {
		return 0, err
	}
	if p == 0 {
		return 0, &Error{Op: "alloc", Code: abi.ErrOutOfMemory, Message: fmt.Sprintf("alloc of %d bytes refused", n)}
	}
	return uint32(p), nil
}

// view returns linear memory as it is now. alloc and any export may grow
// memory, and a host must not assume a view taken before a call is still
// valid after it (docs/abi.md §1), so every read and write goes through a
// view taken after the last call.
func (in *Instance) view() []byte { return in.mem.UnsafeData(in.store) }

// input makes the scratch buffer hold at least n bytes and returns it.
func (in *Instance) input(n int) (uint32, error) {
	if uint64(n) > abi.MaxAlloc {
		return 0, &Error{Op: "alloc", Code: abi.ErrOutOfMemory, Message: fmt.Sprintf("input of %d bytes above the module's %d", n, abi.MaxAlloc)}
	}
	if uint32(n) <= in.scratchCap && in.scratch != 0 {
		return in.scratch, nil
	}
	if in.scratch != 0 {
		if _, err := in.call(abi.ExportFree, int32(in.scratch)); err != nil {
			return 0, err
		}
		in.scratch, in.scratchCap = 0, 0
	}
	size := min(max(uint32(n), 4096, in.scratchCap*2), abi.MaxAlloc)
	p, err := in.alloc(size)
	if err != nil {
		return 0, err
	}
	in.scratch, in.scratchCap = p, size
	return p, nil
}

// withInput copies b into the scratch buffer (after any alloc that may have
// moved memory) and runs f with its pointer and length.
func (in *Instance) withInput(b []byte, f func(p, n uint32) error) error {
	p, err := in.input(len(b))
	if err != nil {
		return err
	}
	copy(in.view()[p:], b)
	return f(p, uint32(len(b)))
}

// record returns a copy of the first n bytes of the output buffer.
func (in *Instance) record(n uint32) []byte {
	return append([]byte(nil), in.view()[in.out:in.out+n]...)
}

// lastError reads the module's last error message.
func (in *Instance) lastError() string {
	n, err := in.call(abi.ExportLastError, int32(in.out), int32(recordBytes))
	if err != nil || n <= 0 {
		return ""
	}
	if n <= recordBytes {
		return string(in.record(uint32(n)))
	}
	p, err := in.input(int(n))
	if err != nil {
		return ""
	}
	if _, err := in.call(abi.ExportLastError, int32(p), n); err != nil {
		return ""
	}
	return string(in.view()[p : p+uint32(n)])
}

// laneArg converts a lane to the module's signed i32, or reports WrongLane
// for values an i32 cannot carry.
func laneArg(op string, lane int) (int32, error) {
	if lane < math.MinInt32 || lane > math.MaxInt32 {
		return 0, &Error{Op: op, Code: abi.ErrWrongLane, Message: fmt.Sprintf("lane %d", lane)}
	}
	return int32(lane), nil
}

// Assign implements client.Lanes.
func (in *Instance) Assign(identity ckf.ProducerIdentity, lease ckf.LaneLease) error {
	if err := in.lock(); err != nil {
		return err
	}
	defer in.mu.Unlock()
	enc := abi.AppendAssignment(nil, &identity, &lease)
	return in.withInput(enc, func(p, n uint32) error { return in.check("assign", abi.ExportAssign, int32(p), int32(n)) })
}

// Retire implements client.Lanes.
func (in *Instance) Retire(lane int) error {
	if err := in.lock(); err != nil {
		return err
	}
	defer in.mu.Unlock()
	l, err := laneArg("retire", lane)
	if err != nil {
		return err
	}
	return in.check("retire", abi.ExportRetire, l)
}

// ApplyFrame implements client.Lanes.
func (in *Instance) ApplyFrame(frame []byte) (consumer.Result, error) {
	res := consumer.Result{Lane: -1}
	if len(frame) > consumer.MaxInputBytes { // as natively: wire.ErrFrameTooLarge
		return res, &Error{Op: "apply", Code: abi.ErrFrameTooLarge, Message: fmt.Sprintf("frame of %d bytes exceeds the consumer's %d", len(frame), consumer.MaxInputBytes)}
	}
	if err := in.lock(); err != nil {
		return res, err
	}
	defer in.mu.Unlock()
	err := in.withInput(frame, func(p, n uint32) error {
		code, err := in.call(abi.ExportApply, int32(p), int32(n))
		if err != nil {
			return err
		}
		if code < 0 {
			return &Error{Op: "apply", Code: abi.Code(code), Message: in.lastError()}
		}
		if _, err := in.call(abi.ExportLastResult, int32(in.out)); err != nil {
			return err
		}
		res = abi.ReadResult(in.record(abi.ResultSize)).Result
		return nil
	})
	return res, err
}

// query writes the input, calls query and reads the 80-byte record into res.
func (in *Instance) query(kind int32, count, width int, fill func(b []byte), blockSize int, salt uint64, res *consumer.QueryResult) error {
	if res == nil {
		return consumer.ErrInvalidQuery
	}
	// The module takes a signed i32 block size: ≤ 0 is InvalidQuery as
	// natively; one above 2^31-1 spans more tokens than a query holds, so
	// it hashes no complete block, like 2^31-1.
	bs := int32(min(max(blockSize, 0), math.MaxInt32))
	if n := uint64(count) * uint64(width); n > consumer.MaxInputBytes { // as natively
		return fmt.Errorf("%w: input of %d bytes exceeds the %d-byte limit", consumer.ErrInvalidQuery, n, consumer.MaxInputBytes)
	}
	if err := in.lock(); err != nil {
		return err
	}
	defer in.mu.Unlock()
	p, err := in.input(count * width)
	if err != nil {
		return err
	}
	fill(in.view()[p : p+uint32(count*width)])
	code, err := in.call(abi.ExportQuery, kind, int32(p), int32(count), bs, int64(salt), int32(in.out))
	if err != nil {
		return err
	}
	if code >= 0 || abi.Code(code) == abi.ErrUnavailable {
		abi.ReadQueryRecord(in.view()[in.out:in.out+abi.QueryRecordSize], res)
	}
	if code < 0 {
		return &Error{Op: "query", Code: abi.Code(code), Message: in.lastError()}
	}
	return nil
}

// Query implements client.Lanes.
func (in *Instance) Query(locals []uint64, res *consumer.QueryResult) error {
	return in.query(abi.QueryLocalHashes, len(locals), 8, func(b []byte) { abi.PutUint64s(b, locals) }, 0, 0, res)
}

// QuerySequenceHashes implements client.Lanes.
func (in *Instance) QuerySequenceHashes(seq []uint64, res *consumer.QueryResult) error {
	return in.query(abi.QuerySequenceHashes, len(seq), 8, func(b []byte) { abi.PutUint64s(b, seq) }, 0, 0, res)
}

// QueryTokens implements client.Lanes.
func (in *Instance) QueryTokens(tokens []uint32, blockSize int, salt uint64, res *consumer.QueryResult) error {
	return in.query(abi.QueryTokens, len(tokens), 4, func(b []byte) { abi.PutUint32s(b, tokens) }, blockSize, salt, res)
}

// QueryTokensWith implements client.Lanes: query kind abi.QueryTokensWith,
// the request in the token query layout (abi.PutTokenQuery).
func (in *Instance) QueryTokensWith(tokens []uint32, blockSize int, salt uint64, o ckf.HashOptions, res *consumer.QueryResult) error {
	n := abi.TokenQuerySize(len(tokens), o)
	if n < 0 || n > consumer.MaxInputBytes {
		return fmt.Errorf("%w: token query of %d tokens and %d multimodal lists exceeds the %d-byte limit", consumer.ErrInvalidQuery, len(tokens), len(o.MM), consumer.MaxInputBytes)
	}
	return in.query(abi.QueryTokensWith, n, 1, func(b []byte) { abi.PutTokenQuery(b, tokens, o) }, blockSize, salt, res)
}

// Contains implements client.Lanes.
func (in *Instance) Contains(seqHash uint64) (uint16, error) {
	if err := in.lock(); err != nil {
		return 0, err
	}
	defer in.mu.Unlock()
	v, err := in.call(abi.ExportContains, int64(seqHash))
	if err != nil {
		return 0, err
	}
	if v < 0 {
		return 0, &Error{Op: "contains", Code: abi.Code(v), Message: in.lastError()}
	}
	return uint16(v), nil
}

// LaneStatus implements client.Lanes. The producer identity is rebuilt from
// the manifest (see abi.ReadLaneStatus).
func (in *Instance) LaneStatus(lane int) (consumer.LaneStatus, error) {
	if err := in.lock(); err != nil {
		return consumer.LaneStatus{}, err
	}
	defer in.mu.Unlock()
	l, err := laneArg("lane_status", lane)
	if err != nil {
		return consumer.LaneStatus{}, err
	}
	if err := in.check("lane_status", abi.ExportLaneStatus, l, int32(in.out)); err != nil {
		return consumer.LaneStatus{}, err
	}
	return abi.ReadLaneStatus(in.record(abi.LaneStatusSize), &in.manifest, lane), nil
}

// AppendLaneWords implements client.Lanes: the buffer is sized by the
// lane's own format, read from its lane_status record.
func (in *Instance) AppendLaneWords(dst []uint64, lane int) ([]uint64, error) {
	if err := in.lock(); err != nil {
		return dst, err
	}
	defer in.mu.Unlock()
	l, err := laneArg("lane_words", lane)
	if err != nil {
		return dst, err
	}
	if err := in.check("lane_status", abi.ExportLaneStatus, l, int32(in.out)); err != nil {
		return dst, err
	}
	n := int(abi.ReadLaneStatus(in.record(abi.LaneStatusSize), &in.manifest, lane).Format.BucketCount)
	p, err := in.input(8 * n)
	if err != nil {
		return dst, err
	}
	c, err := in.call(abi.ExportLaneWords, l, int32(p), int32(8*n))
	if err != nil {
		return dst, err
	}
	if c < 0 {
		return dst, &Error{Op: "lane_words", Code: abi.Code(c), Message: in.lastError()}
	}
	v := in.view()[p : p+uint32(8*c)]
	for i := range int(c) {
		dst = append(dst, binary.LittleEndian.Uint64(v[8*i:]))
	}
	return dst, nil
}

// Stats implements client.Lanes.
func (in *Instance) Stats() (consumer.Stats, error) {
	if err := in.lock(); err != nil {
		return consumer.Stats{}, err
	}
	defer in.mu.Unlock()
	if err := in.check("stats", abi.ExportStats, int32(in.out)); err != nil {
		return consumer.Stats{}, err
	}
	return abi.ReadStats(in.record(abi.StatsSize)), nil
}

// LiveBuffers returns the module's count of live buffers (a leak check: the
// scratch and record buffers, so 2 in steady state).
func (in *Instance) LiveBuffers() (int, error) {
	if err := in.lock(); err != nil {
		return 0, err
	}
	defer in.mu.Unlock()
	v, err := in.call(abi.ExportLiveBuffers)
	return int(v), err
}
