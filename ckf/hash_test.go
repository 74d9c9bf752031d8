package ckf

import (
	"encoding/binary"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/zeebo/xxh3"
	"pgregory.net/rapid"
)

func TestAppendSequenceHashes_Vector(t *testing.T) {
	locals := []uint64{0x0123456789ABCDEF, 0x1111222233334444, 0xDEADBEEFCAFEBABE}
	want := []uint64{0x0123456789ABCDEF, 0x98E7E55F299CF592, 0x65D53B99C5252D19}
	{
		got := AppendSequenceHashes(nil, locals)
		require.True(t, slices.Equal(got, want), "AppendSequenceHashes = %#x, want %#x", got, want)
	}
	// Appending to a non-empty dst must not chain off dst's contents.
	got := AppendSequenceHashes([]uint64{7}, locals)
	require.True(t, slices.Equal(got, append([]uint64{7}, want...)), "AppendSequenceHashes([7], …) = %#x, want 7 then %#x", got, want)
	{
		got := AppendSequenceHashes(nil, nil)
		require.Empty(t, got, "AppendSequenceHashes(nil, nil) = %#x, want empty", got)
	}
	{
		got := ChainHash(want[0], locals[1])
		require.Equal(t, want[1], got, "ChainHash(s0, l1) = %#x, want %#x", got, want[1])
	}
}

// leTokens encodes token ids as little-endian u32s, the SPEC §3 byte layout.
func leTokens(tokens []uint32) []byte {
	b := make([]byte, 0, 4*len(tokens))
	for _, tok := range tokens {
		b = binary.LittleEndian.AppendUint32(b, tok)
	}
	return b
}

func TestLocalBlockHash_Bytes(t *testing.T) {
	long := make([]uint32, 515) // past every xxh3 length class (≤16, ≤128, ≤240, long)
	for i := range long {
		long[i] = uint32(i) * 2654435761
	}
	cases := []struct {
		name   string
		tokens []uint32
		salt   uint64
	}{
		{"empty", nil, BaseSalt},
		{"one token", []uint32{42}, BaseSalt},
		{"block", []uint32{1, 2, 3, 0xFFFFFFFF}, BaseSalt},
		{"other salt", []uint32{1, 2, 3, 0xFFFFFFFF}, 99},
		{"16 tokens (64 bytes)", long[:16], BaseSalt},
		{"60 tokens (240 bytes)", long[:60], BaseSalt},
		{"61 tokens (244 bytes)", long[:61], BaseSalt},
		{"512 tokens", long[:512], BaseSalt},
		{"515 tokens", long, BaseSalt},
		{"offset sub-slice", long[3:19], BaseSalt},
	}
	for _, tc := range cases {
		want := xxh3.HashSeed(leTokens(tc.tokens), tc.salt)
		got := LocalBlockHash(tc.tokens, tc.salt)
		assert.Equal(t, want, got, "%s: LocalBlockHash = %#x, want %#x", tc.name, got, want)
	}
	assert.NotEqual(t, LocalBlockHash([]uint32{2, 1}, 1337), LocalBlockHash([]uint32{1, 2}, 1337), "LocalBlockHash ignores token order")
}

func TestSalt_Table(t *testing.T) {
	lora := xxh3.Hash([]byte("my-adapter"))
	ns := xxh3.HashSeed([]byte("tenant-a"), 1)
	cases := []struct {
		name, lora, ns string
		want           uint64
	}{
		{"base model", "", "", 1337},
		{"lora only", "my-adapter", "", 1337 + lora},
		{"namespace only", "", "tenant-a", 1337 + ns},
		{"both", "my-adapter", "tenant-a", 1337 + lora + ns},
	}
	for _, tc := range cases {
		got := Salt(tc.lora, tc.ns)
		assert.Equal(t, tc.want, got, "%s: Salt(%q, %q) = %#x, want %#x", tc.name, tc.lora, tc.ns, got, tc.want)
	}
	assert.NotEqual(t, Salt("", "x"), Salt("x", ""), "Salt does not separate a LoRA name from a namespace of the same text")
}

func TestAppendLocalBlockHashes_CompleteBlocksOnly(t *testing.T) {
	tokens := []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	salt := Salt("lora", "")
	b0 := LocalBlockHash(tokens[0:4], salt)
	b1 := LocalBlockHash(tokens[4:8], salt)
	cases := []struct {
		name      string
		dst       []uint64
		tokens    []uint32
		blockSize int
		want      []uint64
	}{
		{"partial tail ignored", nil, tokens, 4, []uint64{b0, b1}},
		{"exact blocks", nil, tokens[:8], 4, []uint64{b0, b1}},
		{"shorter than one block", nil, tokens[:3], 4, nil},
		{"appends to dst", []uint64{9}, tokens, 4, []uint64{9, b0, b1}},
		{"zero block size", []uint64{9}, tokens, 0, []uint64{9}},
		{"negative block size", nil, tokens, -1, nil},
		{"block size one", nil, tokens[:2], 1, []uint64{LocalBlockHash(tokens[:1], salt), LocalBlockHash(tokens[1:2], salt)}},
	}
	for _, tc := range cases {
		got := AppendLocalBlockHashes(tc.dst, tc.tokens, tc.blockSize, salt)
		assert.True(t, slices.Equal(got, tc.want), "%s: got %#x, want %#x", tc.name, got, tc.want)
	}
}

// TestLocalBlockHash_PathsAgree checks the target's LocalBlockHash (in place
// on little-endian targets) against the portable encoding path, for token
// slices of every length class and sub-slices at any offset.
func TestLocalBlockHash_PathsAgree(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		tokens := rapid.SliceOfN(rapid.Uint32(), 0, 600).Draw(t, "tokens")
		from := rapid.IntRange(0, len(tokens)).Draw(t, "from")
		salt := rapid.Uint64().Draw(t, "salt")
		view := tokens[from:]
		got, want := LocalBlockHash(view, salt), localBlockHashEncoded(view, salt)
		require.Equal(t, want, got, "LocalBlockHash(%d tokens) = %#x, want encoded path %#x", len(view), got, want)
	})
}
