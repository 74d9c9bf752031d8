package ckf

import (
	"slices"
	"testing"
)

func TestAppendSequenceHashes_Vector(t *testing.T) {
	locals := []uint64{0x0123456789ABCDEF, 0x1111222233334444, 0xDEADBEEFCAFEBABE}
	want := []uint64{0x0123456789ABCDEF, 0x98E7E55F299CF592, 0x65D53B99C5252D19}
	if got := AppendSequenceHashes(nil, locals); !slices.Equal(got, want) {
		t.Fatalf("AppendSequenceHashes = %#x, want %#x", got, want)
	}
}
