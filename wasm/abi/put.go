package abi

import (
	"encoding/binary"
	"unsafe"
)

// littleEndianHost reports whether this machine stores integers the way the
// module reads them (wasm is little-endian).
var littleEndianHost = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// PutUint32s writes v into b as the little-endian u32s a query's input
// holds. On a little-endian host that is one copy of v's memory: the
// per-element loop cost ≈ 11 µs for a 1024-block token query, a third of
// the query's time in the module (BENCHMARKS.md, "Wasm kernels"). Every Go
// host of the module writes query input through it.
func PutUint32s(b []byte, v []uint32) {
	if littleEndianHost && len(v) > 0 {
		copy(b[:4*len(v)], unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(v))), 4*len(v)))
		return
	}
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], x)
	}
}

// PutUint64s is PutUint32s for u64s.
func PutUint64s(b []byte, v []uint64) {
	if littleEndianHost && len(v) > 0 {
		copy(b[:8*len(v)], unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(v))), 8*len(v)))
		return
	}
	for i, x := range v {
		binary.LittleEndian.PutUint64(b[8*i:], x)
	}
}
