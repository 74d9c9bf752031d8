package ckf

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/zeebo/xxh3"
)

func TestLocalBlockHashMM_Definition(t *testing.T) {
	toks := []uint32{1, 2, 3, 0xFFFFFFFF}
	mm := []uint64{9, 3, 1 << 63}
	var b []byte
	for _, x := range toks {
		b = binary.LittleEndian.AppendUint32(b, x)
	}
	for _, h := range []uint64{3, 9, 1 << 63} { // sorted
		b = binary.LittleEndian.AppendUint64(b, h)
	}
	salt := Salt("ad", "tenant-a")
	assert.Equal(t, xxh3.HashSeed(b, salt), LocalBlockHashMM(toks, mm, salt))
	assert.Equal(t, []uint64{9, 3, 1 << 63}, mm, "mm is not modified")
	assert.Equal(t, LocalBlockHash(toks, salt), LocalBlockHashMM(toks, nil, salt))
	assert.NotEqual(t, LocalBlockHashMM(toks, []uint64{1}, salt), LocalBlockHashMM(toks, []uint64{2}, salt),
		"the same placeholder tokens with other images do not share a key")
}

// Dynamo protocols.rs test_compute_block_hash_for_seq_eagle_windows: tokens
// 0..5, block size 2, Eagle: two blocks over [0 1 2] and [2 3 4], each unlike
// the default block over [0 1].
func TestAppendTokenSequenceHashesWith_EagleWindows(t *testing.T) {
	toks := []uint32{0, 1, 2, 3, 4, 5}
	got := AppendTokenSequenceHashesWith(nil, toks, 2, BaseSalt, HashOptions{Eagle: true})
	first, second := LocalBlockHash([]uint32{0, 1, 2}, BaseSalt), LocalBlockHash([]uint32{2, 3, 4}, BaseSalt)
	require.Equal(t, []uint64{first, ChainHash(first, second)}, got)
	def := AppendTokenSequenceHashesWith(nil, toks, 2, BaseSalt, HashOptions{})
	require.Len(t, def, 3)
	assert.Equal(t, AppendTokenSequenceHashes(nil, toks, 2, BaseSalt), def)
	assert.NotEqual(t, def[0], got[0])
	assert.Equal(t, 2, BlockCount(6, 2, true))
	assert.Equal(t, 2, BlockCount(5, 2, true))
	assert.Equal(t, 1, BlockCount(4, 2, true))
}

func TestAppendTokenSequenceHashesWith_MM(t *testing.T) {
	toks := []uint32{1, 2, 3, 4, 5, 6, 7, 8}
	salt := Salt("", "tenant-a")
	got := AppendTokenSequenceHashesWith(nil, toks, 4, salt, HashOptions{MM: [][]uint64{nil, {7, 5}}})
	a, b := LocalBlockHash(toks[:4], salt), LocalBlockHashMM(toks[4:], []uint64{5, 7}, salt)
	assert.Equal(t, []uint64{a, ChainHash(a, b)}, got)
}

func TestPadValue(t *testing.T) {
	// Dynamo pad_value_for_mm_hash: 1,000,000 + the low 30 bits.
	assert.Equal(t, uint32(1_000_000+(9_533_257_059_414_191_570&(1<<30-1))), PadValue(9_533_257_059_414_191_570))
	assert.Equal(t, uint32(1_000_000), PadValue(0))
}
