package ckf

import (
	"math/bits"
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
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

// groupsCase draws a multi-group layout: up to 16 groups over disjoint lane
// sets, each of a random width (1, 2, 4, 8 or 16, at least its lane count),
// bucket count and seed (seeds often repeated, so same-seed runs occur),
// its slots holding its lanes in a random order (free slots too), its
// table random words with the drawn keys planted in random slots.
type groupsCase struct {
	ads    []Addresser
	words  [][]uint64
	widths []int
	maps   []*[2][256]uint16
	slots  [][MaxLanes]int // slot → lane, -1 free
	member []uint16
	keys   []uint64
}

func drawGroups(t *rapid.T) groupsCase {
	var c groupsCase
	perm := rapid.Permutation([]int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}).Draw(t, "lanes")
	seeds := []uint64{DefaultSeed, seedGen().Draw(t, "seed1"), seedGen().Draw(t, "seed2")}
	rng := NewRNG(rapid.Uint64().Draw(t, "rng"))
	c.keys = rapid.SliceOfN(rapid.Uint64(), 1, 40).Draw(t, "keys")
	used := 0
	for used < len(perm) && len(c.ads) < MaxLanes {
		n := rapid.IntRange(1, len(perm)-used).Draw(t, "group lanes")
		width := 1
		for width < n {
			width *= 2
		}
		width <<= rapid.IntRange(0, bits.TrailingZeros(uint(MaxLanes/width))).Draw(t, "spare")
		buckets := uint64(1) << rapid.IntRange(1, 9).Draw(t, "log2 buckets")
		ad := NewAddresser(seeds[rapid.IntRange(0, 2).Draw(t, "seed")], buckets)
		var slots [MaxLanes]int
		for s := range slots {
			slots[s] = -1
		}
		maps := new([2][256]uint16)
		var member uint16
		for k, s := range rapid.Permutation(seqInts(width)).Draw(t, "slots")[:n] {
			l := perm[used+k]
			slots[s] = l
			member |= 1 << l
		}
		for v := range 256 {
			for s := range 8 {
				if v&(1<<s) == 0 {
					continue
				}
				if l := slots[s]; l >= 0 {
					maps[0][v] |= 1 << l
				}
				if l := slots[s+8]; l >= 0 {
					maps[1][v] |= 1 << l
				}
			}
		}
		words := make([]uint64, buckets*uint64(width))
		for i := range words {
			words[i] = rng.Next()
		}
		for _, k := range c.keys {
			if rng.Next()%2 == 0 {
				a := ad.Address(k)
				bk := a.A
				if rng.Next()%2 == 0 {
					bk = a.B
				}
				i := bk*uint64(width) + rng.Next()%uint64(width)
				words[i] = uint64(Bucket(words[i]).WithSlot(int(rng.Next()%4), a.Fingerprint))
			}
		}
		c.ads, c.words, c.widths = append(c.ads, ad), append(c.words, words), append(c.widths, width)
		c.maps, c.slots, c.member = append(c.maps, maps), append(c.slots, slots), append(c.member, member)
		used += n
	}
	return c
}

func seqInts(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = i
	}
	return s
}

// TestGroupHits_MatchesRowHits: GroupHits and GroupProbe (the hand-written
// WebAssembly probe in wasm builds) and its Go reference equal the OR over
// groups of each group's RowHits mapped slot by slot to lanes, for every
// width, same- and different-seed neighbours, free slots and any ready or
// wanted mask: GroupProbe reads exactly the groups with a wanted lane (a
// run's key hash made by its first group read, not by the run's first
// group) and reports their lanes as covered.
func TestGroupHits_MatchesRowHits(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		c := drawGroups(t)
		// Groups in the drawn order: same-seed neighbours share a hash,
		// others hash again.
		order := seqInts(len(c.ads))
		var s PrefixSearch
		for _, i := range order {
			s.AddGroup(c.ads[i], c.words[i], c.widths[i], c.maps[i], c.member[i])
		}
		require.Equal(t, len(c.ads), s.Groups())
		ready := rapid.OneOf(rapid.Just(uint16(0xFFFF)), rapid.Uint16()).Draw(t, "ready")
		want := rapid.OneOf(rapid.Just(uint16(0xFFFF)), rapid.Uint16(), rapid.Just(uint16(1)<<rapid.IntRange(0, 15).Draw(t, "lane"))).Draw(t, "want")
		for _, k := range append(c.keys, rapid.Uint64().Draw(t, "other")) {
			hitsOf := func(lanes uint16) (hits, covered uint16) {
				for i, ad := range c.ads {
					if c.member[i]&lanes == 0 {
						continue
					}
					covered |= c.member[i]
					for m := ad.RowHits(c.words[i], c.widths[i], k); m != 0; m &= m - 1 {
						if l := c.slots[i][bits.TrailingZeros16(m)]; l >= 0 { // a free slot's word is noise
							hits |= 1 << l
						}
					}
				}
				return hits, covered
			}
			wantReady, _ := hitsOf(ready)
			wantReady &= ready
			hits, covered := hitsOf(want)
			gh, gc := groupHitsGo(s.formats, k, want)
			require.Equal(t, [2]uint16{hits, covered}, [2]uint16{gh, gc}, "Go reference, key %#x, want %#x", k, want)
			gh, gc = s.GroupProbe(k, want)
			require.Equal(t, [2]uint16{hits, covered}, [2]uint16{gh, gc}, "GroupProbe, key %#x, want %#x", k, want)
			require.Equal(t, wantReady, s.GroupHits(k, ready), "GroupHits, key %#x", k)
		}
		s.ResetGroups()
		require.Zero(t, s.Groups())
		require.Zero(t, s.GroupHits(c.keys[0], 0xFFFF))
	})
}

func TestAddGroup_RefusesBadGroups(t *testing.T) {
	ad := NewAddresser(DefaultSeed, 8)
	maps := new([2][256]uint16)
	var s PrefixSearch
	for _, w := range []int{0, 3, 32, -1} {
		require.Panics(t, func() { s.AddGroup(ad, make([]uint64, 8*32), w, maps, 1) }, "width %d", w)
	}
	require.Panics(t, func() { s.AddGroup(ad, make([]uint64, 8*4-1), 4, maps, 1) }, "short table")
	require.Panics(t, func() { s.AddGroup(ad, make([]uint64, 8*4), 4, nil, 1) }, "nil maps")
	for range MaxLanes {
		s.AddGroup(ad, make([]uint64, 8), 1, maps, 1)
	}
	require.Panics(t, func() { s.AddGroup(ad, make([]uint64, 8), 1, maps, 1) }, "a 17th group")
	require.Zero(t, s.formats[0].sameSeed, "the first group hashes")
	require.Equal(t, uint64(1), s.formats[1].sameSeed, "same seed as the previous group")
	s.ResetGroups()
	s.AddGroup(NewAddresser(1, 8), make([]uint64, 8), 1, maps, 1)
	s.AddGroup(NewAddresser(2, 8), make([]uint64, 8), 1, maps, 1)
	require.Zero(t, s.formats[1].sameSeed, "another seed hashes again")
}

// FuzzGroupHits: GroupHits (the WebAssembly kernel in wasm builds) against
// its Go reference and each group's RowHits, on layouts and tables built
// from the input: each group takes a width (1..16), a bucket count (2..64),
// a seed (one of three, so same-seed runs occur) and a slot order from the
// first bytes, its table words from the rest.
func FuzzGroupHits(f *testing.F) {
	f.Add([]byte{3, 0x21, 0x42, 0x13, 0x84, 0xff, 0x00, 0x55}, uint64(1), uint16(0xFFFF))
	f.Add([]byte("sixteen lanes of one width each, tables from these bytes ................................"), ^uint64(0), uint16(0x8001))
	f.Fuzz(func(t *testing.T, data []byte, key uint64, ready uint16) {
		if len(data) == 0 {
			return
		}
		next := func() byte {
			b := data[0]
			data = append(data[1:], b) // cycle through the input
			return b
		}
		seeds := []uint64{DefaultSeed, 7, 1 << 40}
		var s PrefixSearch
		type grp struct {
			ad    Addresser
			words []uint64
			width int
			slots [MaxLanes]int
		}
		var gs []grp
		lane := 0
		for n := 1 + int(next())%MaxLanes; len(gs) < n && lane < MaxLanes; {
			b := next()
			width := 1 << (b % 5)
			members := min(1+int(b>>3)%width, MaxLanes-lane)
			g := grp{ad: NewAddresser(seeds[int(b>>6)%3], uint64(2)<<(next()%6)), width: width}
			for i := range g.slots {
				g.slots[i] = -1
			}
			maps := new([2][256]uint16)
			var m uint16
			for k := range members {
				slot := (k*int(1+2*(next()%8)) + int(next())) % width // odd stride: distinct slots
				for g.slots[slot] >= 0 {
					slot = (slot + 1) % width
				}
				g.slots[slot] = lane
				m |= 1 << lane
				lane++
			}
			for v := range 256 {
				for sl := range 8 {
					if v&(1<<sl) != 0 && g.slots[sl] >= 0 {
						maps[0][v] |= 1 << g.slots[sl]
					}
					if v&(1<<sl) != 0 && sl+8 < MaxLanes && g.slots[sl+8] >= 0 {
						maps[1][v] |= 1 << g.slots[sl+8]
					}
				}
			}
			g.words = make([]uint64, (g.ad.mask+1)*uint64(width))
			for i := range g.words {
				g.words[i] = uint64(next()) * 0x0101010101010101 & (0x00FF00FF00FF00FF << (next() % 9))
			}
			if next()%2 == 0 { // plant the key in one slot of its bucket A or B
				a := g.ad.Address(key)
				bk := a.A
				if next()%2 == 0 {
					bk = a.B
				}
				i := bk*uint64(width) + uint64(next())%uint64(width)
				g.words[i] = uint64(Bucket(g.words[i]).WithSlot(int(next()%4), a.Fingerprint))
			}
			s.AddGroup(g.ad, g.words, width, maps, m)
			gs = append(gs, g)
		}
		// ready doubles as GroupProbe's wanted lanes.
		var want, covered uint16
		for i, g := range gs {
			if uint16(s.formats[i].members)&ready == 0 {
				continue
			}
			covered |= uint16(s.formats[i].members)
			for h := g.ad.RowHits(g.words, g.width, key); h != 0; h &= h - 1 {
				if l := g.slots[bits.TrailingZeros16(h)]; l >= 0 {
					want |= 1 << l
				}
			}
		}
		gh, gc := groupHitsGo(s.formats, key, ready)
		require.Equal(t, [2]uint16{want, covered}, [2]uint16{gh, gc}, "Go reference")
		gh, gc = s.GroupProbe(key, ready)
		require.Equal(t, [2]uint16{want, covered}, [2]uint16{gh, gc}, "GroupProbe")
		require.Equal(t, want&ready, s.GroupHits(key, ready), "GroupHits")
	})
}
