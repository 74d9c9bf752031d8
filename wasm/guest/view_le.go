//go:build 386 || amd64 || amd64p32 || arm || arm64 || loong64 || mips64le || mips64p32le || mipsle || ppc64le || riscv || riscv64 || wasm

package main

import (
	"unsafe"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/consumer"
	"github.com/ckfrelay/ckfrelay/wasm/abi"
)

// uint64s returns the little-endian uint64s of b (len(b) a multiple of 8) as a
// typed view of b's memory when b is 8-byte aligned — on a little-endian
// target the bytes already are the values — and otherwise decodes them into
// *scratch. A view of an unaligned payload would be invalid Go, hence the
// check; buffers from the guest's own alloc export are always aligned.
func uint64s(b []byte, scratch *[]uint64) []uint64 {
	if uintptr(unsafe.Pointer(unsafe.SliceData(b)))%8 == 0 { // nil or empty: an empty view
		return unsafe.Slice((*uint64)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/8)
	}
	return decodeUint64s(b, scratch) // small enough to inline the fast path
}

// uint32s is uint64s for 4-byte values.
func uint32s(b []byte, scratch *[]uint32) []uint32 {
	if len(b) == 0 {
		return (*scratch)[:0]
	}
	if uintptr(unsafe.Pointer(unsafe.SliceData(b)))%4 == 0 {
		return unsafe.Slice((*uint32)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/4)
	}
	return decodeUint32s(b, scratch)
}

// putQueryRecord is abi.PutQueryRecord as storeRecord when out is 8-byte
// aligned (the record buffer from alloc always is): in WebAssembly the
// field-by-field encoding, or a copy through a temporary struct, costs
// 100–180 ns, a sixth of a sequence-hash query (BENCHMARKS.md, "Wasm
// kernels").
func putQueryRecord(out []byte, r *consumer.QueryResult) {
	if len(out) < abi.QueryRecordSize || uintptr(unsafe.Pointer(unsafe.SliceData(out)))%8 != 0 {
		abi.PutQueryRecord(out, r)
		return
	}
	storeRecord((*[abi.QueryRecordSize / 8]uint64)(unsafe.Pointer(unsafe.SliceData(out))), r)
}

// storeRecord writes r's query record into w: on a little-endian target the
// 16 depths are the record's first 64 bytes as they lie in r (one
// memory.copy in WebAssembly), then two words. It is small enough to
// inline, so the query export writes the record with no Go call (an
// unrolled form is too large to inline; a loop was ≈ 30 ns slower).
func storeRecord(w *[abi.QueryRecordSize / 8]uint64, r *consumer.QueryResult) {
	*(*[ckf.MaxLanes]uint32)(unsafe.Pointer(w)) = r.Depths // one memory.copy
	w[8] = uint64(r.Mask) | uint64(uint32(r.Blocks))<<32
	w[9] = uint64(uint32(r.Probes))
}
