package main

import (
	"encoding/binary"
	"slices"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/consumer"
	"github.com/ckfrelay/ckfrelay/wasm/abi"
)

// TestViews_AlignedAndUnalignedAgree checks the typed views of query input
// against plain little-endian decoding, at every alignment.
func TestViews_AlignedAndUnalignedAgree(t *testing.T) {
	backing := make([]uint64, 40) // 8-aligned
	raw := make([]byte, 8*len(backing))
	for i := range raw {
		raw[i] = byte(i*7 + 3)
	}
	for off := range 8 {
		b := asBytes(backing)[off : off+8*32]
		copy(b, raw[:len(b)])
		want64 := make([]uint64, 32)
		for i := range want64 {
			want64[i] = binary.LittleEndian.Uint64(b[8*i:])
		}
		var s64 []uint64
		got := uint64s(b, &s64)
		require.True(t, slices.Equal(got, want64), "offset %d: uint64s = %x, want %x", off, got, want64)
		want32 := make([]uint32, 64)
		for i := range want32 {
			want32[i] = binary.LittleEndian.Uint32(b[4*i:])
		}
		var s32 []uint32
		{
			got := uint32s(b, &s32)
			require.True(t, slices.Equal(got, want32), "offset %d: uint32s = %x, want %x", off, got, want32)
		}
	}
}

// asBytes views w's memory as bytes (8-aligned at offset 0).
func asBytes(w []uint64) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(w))), 8*len(w))
}

// TestPutQueryRecord_EqualsABI checks the struct store against the ABI's
// field-by-field encoding, at every alignment and over stale bytes.
func TestPutQueryRecord_EqualsABI(t *testing.T) {
	r := consumer.QueryResult{Mask: 0xA5C3, Blocks: 1024, Probes: 13}
	for l := range r.Depths {
		r.Depths[l] = uint32(l*l*977 + 1)
	}
	backing := make([]uint64, 16)
	for off := range 8 {
		got := asBytes(backing)[off : off+abi.QueryRecordSize]
		for i := range got {
			got[i] = 0xEE
		}
		putQueryRecord(got, &r)
		want := make([]byte, abi.QueryRecordSize)
		abi.PutQueryRecord(want, &r)
		require.Equal(t, want, got, "offset %d", off)
	}
}
