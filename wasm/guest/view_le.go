//go:build 386 || amd64 || amd64p32 || arm || arm64 || loong64 || mips64le || mips64p32le || mipsle || ppc64le || riscv || riscv64 || wasm

package main

import (
	"unsafe"

	"github.com/ckfrelay/ckfrelay/consumer"
	"github.com/ckfrelay/ckfrelay/wasm/abi"
)

// uint64s returns the little-endian uint64s of b (len(b) a multiple of 8) as a
// typed view of b's memory when b is 8-byte aligned — on a little-endian
// target the bytes already are the values — and otherwise decodes them into
// *scratch. A view of an unaligned payload would be invalid Go, hence the
// check; buffers from the guest's own alloc export are always aligned.
func uint64s(b []byte, scratch *[]uint64) []uint64 {
	if len(b) == 0 {
		return (*scratch)[:0]
	}
	if uintptr(unsafe.Pointer(unsafe.SliceData(b)))%8 == 0 {
		return unsafe.Slice((*uint64)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/8)
	}
	return decodeUint64s(b, scratch)
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

// queryRecord is the query record of docs/abi.md as a little-endian target
// holds it in memory.
type queryRecord struct {
	depths                         [16]uint32
	mask, blocks, probes, reserved uint32
}

// putQueryRecord is abi.PutQueryRecord as one struct store when out is
// 4-byte aligned (the record buffer from alloc always is): in WebAssembly
// the field-by-field encoding costs ≈ 100 ns, a tenth of a sequence-hash
// query (BENCHMARKS.md, "Wasm kernels").
func putQueryRecord(out []byte, r *consumer.QueryResult) {
	if len(out) < abi.QueryRecordSize || uintptr(unsafe.Pointer(unsafe.SliceData(out)))%4 != 0 {
		abi.PutQueryRecord(out, r)
		return
	}
	*(*queryRecord)(unsafe.Pointer(unsafe.SliceData(out))) = queryRecord{
		depths: r.Depths, mask: uint32(r.Mask), blocks: uint32(r.Blocks), probes: uint32(r.Probes),
	}
}
