package ckf

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/zeebo/xxh3"
	"pgregory.net/rapid"
)

// The specialised hashes must return exactly what xxh3.HashSeed returns for
// the same bytes: they feed the SPEC's addressing and chain hash.

// seedGen draws seeds that stress xxh3Flip8's byte swap: zero, all ones,
// only-low-half and only-high-half patterns besides uniform ones.
func seedGen() *rapid.Generator[uint64] {
	return rapid.OneOf(
		rapid.Uint64(),
		rapid.Just(uint64(0)),
		rapid.Just(^uint64(0)),
		rapid.Just(DefaultSeed),
		rapid.Map(rapid.Uint32(), func(v uint32) uint64 { return uint64(v) }),
		rapid.Map(rapid.Uint32(), func(v uint32) uint64 { return uint64(v) << 32 }),
	)
}

func TestXXH3Hash8_MatchesHashSeed(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		v := rapid.Uint64().Draw(t, "v")
		seed := seedGen().Draw(t, "seed")
		want := xxh3.HashSeed(binary.LittleEndian.AppendUint64(nil, v), seed)
		got := xxh3Hash8(v, xxh3Flip8(seed))
		require.Equal(t, want, got, "xxh3Hash8(%#x, seed %#x) = %#x, want xxh3.HashSeed %#x", v, seed, got, want)
	})
}

// TestXXH3Hash2_MatchesHashSeed checks every 2-byte input, for a few seeds.
func TestXXH3Hash2_MatchesHashSeed(t *testing.T) {
	for _, seed := range []uint64{0, 1, ^uint64(0), DefaultSeed ^ altSeedMix, 0x123456789ABCDEF0 ^ altSeedMix, 1 << 63} {
		flip := xxh3Flip2(seed)
		for v := range 1 << 16 {
			want := xxh3.HashSeed(binary.LittleEndian.AppendUint16(nil, uint16(v)), seed)
			got := xxh3Hash2(uint16(v), flip)
			require.Equal(t, want, got, "xxh3Hash2(%#x, seed %#x) = %#x, want xxh3.HashSeed %#x", v, seed, got, want)
		}
	}
}

func TestXXH3Hash16_MatchesHashSeed(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		first, last := rapid.Uint64().Draw(t, "first"), rapid.Uint64().Draw(t, "last")
		seed := seedGen().Draw(t, "seed")
		buf := binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint64(nil, first), last)
		lo, hi := xxh3Flip16(seed)
		got, want := xxh3Hash16(first, last, lo, hi), xxh3.HashSeed(buf, seed)
		require.Equal(t, want, got, "xxh3Hash16(%#x, %#x, seed %#x) = %#x, want xxh3.HashSeed %#x", first, last, seed, got, want)
		got, want = ChainHash(first, last), xxh3.HashSeed(buf, sequenceSeed)
		require.Equal(t, want, got, "ChainHash(%#x, %#x) = %#x, want xxh3.HashSeed(…, 1337) %#x", first, last, got, want)
	})
}
