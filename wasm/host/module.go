package host

import (
	"context"
	"fmt"

	"github.com/tetratelabs/wazero/api"

	"github.com/ckfrelay/ckfrelay/wasm/abi"
)

// recordBytes is the size of the fixed output buffer: the largest record.
const recordBytes = 256

// module is one instantiated guest and the buffers the host keeps in it. It
// is not safe for concurrent use (wazero: one call in flight per instance).
type module struct {
	mod   api.Module
	mem   api.Memory
	fns   [abi.NumExports]api.Function
	stack [6]uint64
	ctx   context.Context

	scratch    uint32 // guest buffer for inputs, grown on demand
	scratchCap uint32
	out        uint32 // guest buffer of recordBytes for records
}

func newModule(mod api.Module) *module {
	m := &module{mod: mod, mem: mod.Memory(), ctx: context.Background()}
	for i, n := range abi.ExportNames {
		m.fns[i] = mod.ExportedFunction(n)
	}
	return m
}

// testHookCall, when set (by tests only, before any instance runs), is
// called before every export call, under the instance's lock: a pause point
// that holds a call in flight.
var testHookCall func(fn abi.Export)

// call invokes export fn with params and returns its single result. An
// error means the call trapped (the module's state is undefined).
func (m *module) call(fn abi.Export, params ...uint64) (uint64, error) {
	st := m.stack[:max(len(params), 1)]
	copy(st, params)
	if testHookCall != nil {
		testHookCall(fn)
	}
	if err := m.fns[fn].CallWithStack(m.ctx, st); err != nil {
		return 0, fmt.Errorf("%s: %w", abi.ExportNames[fn], err)
	}
	return st[0], nil
}

func (m *module) call0(name string) (uint64, error) {
	for i, n := range abi.ExportNames {
		if n == name {
			return m.call(abi.Export(i))
		}
	}
	return 0, fmt.Errorf("no export %q", name)
}

// setup allocates the record buffer.
func (m *module) setup() error {
	p, err := m.alloc(recordBytes)
	if err != nil {
		return err
	}
	m.out = p
	return nil
}

func (m *module) alloc(n uint32) (uint32, error) {
	p, err := m.call(abi.ExportAlloc, uint64(n))
	if err != nil {
		return 0, err
	}
	if p == 0 {
		return 0, &Error{Op: "alloc", Code: abi.ErrOutOfMemory, Message: fmt.Sprintf("alloc of %d bytes refused", n)}
	}
	return uint32(p), nil
}

// input returns a guest buffer of at least n bytes and a host view of its
// first n bytes. The view stays valid until the next input call (the mmap
// allocator never moves memory; the copying fallback is only re-read here).
func (m *module) input(n int) (uint32, []byte, error) {
	if uint64(n) > abi.MaxAlloc {
		return 0, nil, &Error{Op: "alloc", Code: abi.ErrOutOfMemory, Message: fmt.Sprintf("input of %d bytes above the module's %d", n, abi.MaxAlloc)}
	}
	if uint32(n) > m.scratchCap || m.scratch == 0 {
		if m.scratch != 0 {
			if _, err := m.call(abi.ExportFree, uint64(m.scratch)); err != nil {
				return 0, nil, err
			}
			m.scratch, m.scratchCap = 0, 0
		}
		size := max(uint32(n), 4096, m.scratchCap*2)
		size = min(size, abi.MaxAlloc)
		p, err := m.alloc(size)
		if err != nil {
			return 0, nil, err
		}
		m.scratch, m.scratchCap = p, size
	}
	v, ok := m.mem.Read(m.scratch, uint32(n))
	if !ok {
		return 0, nil, fmt.Errorf("%w: scratch buffer outside memory", ErrModule)
	}
	return m.scratch, v, nil
}

// record returns a host view of the n-byte record buffer.
func (m *module) record(n uint32) []byte {
	v, _ := m.mem.Read(m.out, n)
	return v
}

// lastError reads the module's last error message.
func (m *module) lastError() string {
	n, err := m.call(abi.ExportLastError, uint64(m.out), recordBytes)
	if err != nil || int32(n) <= 0 {
		return ""
	}
	l := min(uint32(n), recordBytes)
	if int32(n) > recordBytes {
		// Long message: read it through a scratch buffer.
		p, _, err := m.input(int(n))
		if err == nil {
			if _, err := m.call(abi.ExportLastError, uint64(p), n); err == nil {
				v, _ := m.mem.Read(p, uint32(n))
				return string(v)
			}
		}
	}
	return string(m.record(l))
}

func (m *module) close() { _ = m.mod.Close(context.Background()) }
