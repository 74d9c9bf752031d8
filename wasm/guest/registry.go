package main

import (
	"slices"
	"unsafe"

	"github.com/ckfrelay/ckfrelay/wasm/abi"
)

// registry keeps every buffer handed to the host reachable until the host
// frees it (Go's GC does not move objects but would reuse an unreferenced
// one), and checks every (pointer, length) pair the host passes against
// them: a pointer the module did not hand out, or a length that runs past its
// buffer, is rejected instead of being dereferenced (a load outside linear
// memory would trap, and one inside Go's heap would corrupt it).
type registry struct {
	bufs [][]byte // sorted by base address; never empty slices
	// recent are the buffers the last two views found (cleared by free):
	// hosts pass the same input and record buffers on every query, and a
	// search of bufs costs ≈ 65 ns in WebAssembly (BENCHMARKS.md, "Wasm
	// kernels").
	recent [2][]byte
	// queryIn and queryOut are the buffers that held the last query's
	// input and record (cleared by free): the query export checks them
	// inline, with no Go call (see exportQuery).
	queryIn, queryOut []byte
}

func base(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

// alloc returns a zeroed buffer of n bytes (at least 1, so every allocation
// has a distinct address), or nil when n exceeds abi.MaxAlloc.
func (r *registry) alloc(n uint32) []byte {
	if n > abi.MaxAlloc {
		return nil
	}
	b := make([]byte, max(n, 1))
	at, _ := slices.BinarySearchFunc(r.bufs, base(b), func(e []byte, p uintptr) int { return cmpPtr(base(e), p) })
	r.bufs = slices.Insert(r.bufs, at, b)
	return b
}

// free forgets the buffer whose base address is p; false when p is not one.
func (r *registry) free(p uintptr) bool {
	i, ok := slices.BinarySearchFunc(r.bufs, p, func(e []byte, p uintptr) int { return cmpPtr(base(e), p) })
	if !ok {
		return false
	}
	r.bufs[i] = nil
	r.bufs = slices.Delete(r.bufs, i, i+1)
	r.recent = [2][]byte{}
	r.queryIn, r.queryOut = nil, nil
	return true
}

// view returns the n bytes at p when they lie inside one live allocation.
// A zero length is always valid (an empty slice), whatever p is.
func (r *registry) view(p uintptr, n uint64) ([]byte, bool) {
	if n == 0 {
		return []byte{}, true
	}
	_, v, ok := r.find(p, n)
	return v, ok
}

// find returns the live allocation holding the n ≥ 1 bytes at p and the
// view of them.
func (r *registry) find(p uintptr, n uint64) (buf, v []byte, ok bool) {
	for _, b := range r.recent {
		if v, ok := within(b, p, n); ok {
			return b, v, true
		}
	}
	// The last buffer whose base is ≤ p.
	i, ok := slices.BinarySearchFunc(r.bufs, p, func(e []byte, p uintptr) int { return cmpPtr(base(e), p) })
	if !ok {
		i--
	}
	if i < 0 {
		return nil, nil, false
	}
	v, ok = within(r.bufs[i], p, n)
	if ok {
		r.recent[0], r.recent[1] = r.bufs[i], r.recent[0]
	}
	return r.bufs[i], v, ok
}

// queryViews is view of a query's input (p, n) and record (q, m), for the
// query export when its inline check of queryIn and queryOut failed: it
// remembers the buffers found there for the next query.
func (r *registry) queryViews(p uintptr, n uint64, q uintptr, m uint64) (a, b []byte, ok bool) {
	if n == 0 || m == 0 {
		if a, ok = r.view(p, n); ok {
			b, ok = r.view(q, m)
		}
		return a, b, ok
	}
	in, a, ok := r.find(p, n)
	if !ok {
		return nil, nil, false
	}
	out, b, ok := r.find(q, m)
	if !ok {
		return nil, nil, false
	}
	r.queryIn, r.queryOut = in, out
	return a, b, true
}

// within returns the n bytes at p when they lie inside b.
func within(b []byte, p uintptr, n uint64) ([]byte, bool) {
	if len(b) == 0 || p < base(b) {
		return nil, false
	}
	off := uint64(p - base(b))
	if off >= uint64(len(b)) || n > uint64(len(b))-off {
		return nil, false
	}
	return b[off : off+n], true
}

func (r *registry) live() int { return len(r.bufs) }

func cmpPtr(a, b uintptr) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
