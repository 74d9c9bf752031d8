package ckf

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestRowHits_MatchesAddressAndContains: for every row width, RowHits and
// RowHitsHashed (with a key hashed by another Addresser of the same seed
// and another bucket count) set bit l exactly when lane l's bucket A or B
// of the key's Address holds its fingerprint; width 16 equals LaneRowHits.
func TestRowHits_MatchesAddressAndContains(t *testing.T) {
	rng := NewRNG(9)
	for _, width := range []int{1, 2, 4, 8, 16} {
		for _, buckets := range []uint64{2, 64, 4096} {
			ad := NewAddresser(77, buckets)
			other := NewAddresser(77, buckets*4)
			require.True(t, ad.SameSeed(other))
			require.False(t, ad.SameSeed(NewAddresser(78, buckets)))
			words := make([]uint64, buckets*uint64(width))
			for i := range words {
				words[i] = rng.Next()
			}
			for i := range 2000 {
				key := rng.Next()
				a := ad.Address(key)
				if i%2 == 0 { // plant the key in a random lane's bucket
					l := uint64(rng.Next() % uint64(width))
					bk := a.A
					if i%4 == 0 {
						bk = a.B
					}
					words[bk*uint64(width)+l] = uint64(Bucket(words[bk*uint64(width)+l]).WithSlot(int(rng.Next()%4), a.Fingerprint))
				}
				var want uint16
				for l := range width {
					if Bucket(words[a.A*uint64(width)+uint64(l)]).Contains(a.Fingerprint) || Bucket(words[a.B*uint64(width)+uint64(l)]).Contains(a.Fingerprint) {
						want |= 1 << l
					}
				}
				require.Equal(t, want, ad.RowHits(words, width, key), "width %d, %d buckets", width, buckets)
				require.Equal(t, want, ad.RowHitsHashed(words, width, other.HashKey(key)), "width %d, %d buckets, hashed by a same-seed addresser", width, buckets)
				if width == MaxLanes {
					require.Equal(t, want, ad.LaneRowHits(words, key))
				}
			}
		}
	}
}
