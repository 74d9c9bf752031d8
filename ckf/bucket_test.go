package ckf

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

func TestBucket_Slots(t *testing.T) {
	b := Bucket(0).WithSlot(0, 0x1111).WithSlot(2, 0x3333)
	{
		got, want := uint64(b), uint64(0x0000_3333_0000_1111)
		require.Equal(t, want, got, "packed word = %#016x, want %#016x (slot 0 least significant)", got, want)
	}
	cases := []struct {
		name string
		got  int
		want int
	}{
		{"Find 0x1111", b.Find(0x1111), 0},
		{"Find 0x3333", b.Find(0x3333), 2},
		{"Find absent", b.Find(0x2222), -1},
		{"LowestEmpty", b.LowestEmpty(), 1},
		{"Occupied", b.Occupied(), 2},
		{"full LowestEmpty", Bucket(0x0004_0003_0002_0001).LowestEmpty(), -1},
		{"full Occupied", Bucket(0x0004_0003_0002_0001).Occupied(), 4},
		{"empty LowestEmpty", Bucket(0).LowestEmpty(), 0},
		{"empty Occupied", Bucket(0).Occupied(), 0},
		{"duplicate Find is lowest", Bucket(0x0007_0000_0007_0000).Find(7), 1},
	}
	for _, tc := range cases {
		assert.Equal(t, tc.want, tc.got, "%s = %d, want %d", tc.name, tc.got, tc.want)
	}
	{
		got := b.WithSlot(0, 0).Slot(0)
		assert.Equal(t, uint16(0), got, "WithSlot(0, 0).Slot(0) = %#x, want 0", got)
	}
	{
		got := b.WithSlot(2, 0xFFFF)
		assert.Equal(t, uint64(0x0000_FFFF_0000_1111), uint64(got), "WithSlot(2, 0xFFFF) = %#016x, want 0x0000ffff00001111 (other slots untouched)", uint64(got))
	}
}

func TestBucket_ContainsTable(t *testing.T) {
	cases := []struct {
		word uint64
		fp   uint16
		want bool
	}{
		{0, 1, false},
		{0x0000_0000_0000_0001, 1, true},
		{0x0001_0000_0000_0000, 1, true},
		{0xFFFF_FFFF_FFFF_FFFF, 0xFFFF, true},
		{0xFFFF_FFFF_FFFF_FFFE, 0xFFFE, true},
		{0xFFFF_FFFF_FFFF_FFFE, 0xFFFD, false},
		// Borrow traps: a lane equal to fp+1 next to a matching lane.
		{0x0002_0001_0002_0002, 2, true},
		{0x0002_0003_0002_0003, 1, false},
		{0x8000_0000_0000_0000, 0x8000, true},
		{0x0000_8001_0000_0000, 0x8000, false},
		{0x0001_0000_0000_0000, 0x0101, false},
	}
	for _, tc := range cases {
		got := Bucket(tc.word).Contains(tc.fp)
		assert.Equal(t, tc.want, got, "Bucket(%#016x).Contains(%#x) = %v, want %v", tc.word, tc.fp, got, tc.want)
		got = Bucket(tc.word).containsScalar(tc.fp)
		assert.Equal(t, tc.want, got, "Bucket(%#016x).containsScalar(%#x) = %v, want %v", tc.word, tc.fp, got, tc.want)
	}
}

// TestBucket_ContainsMatchesScalar is the SPEC §2.3 property: the SWAR test
// equals the slot-by-slot scan. Lanes are drawn so that zero lanes, the
// probed fingerprint itself and its neighbours (borrow/carry edges) are common.
func TestBucket_ContainsMatchesScalar(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		fp := rapid.Uint16Min(1).Draw(t, "fp")
		var word uint64
		for i := range 4 {
			lane := rapid.OneOf(
				rapid.Just(uint16(0)),
				rapid.Just(fp),
				rapid.Just(fp+1),
				rapid.Just(fp-1),
				rapid.Just(fp^0x8000),
				rapid.Uint16(),
			).Draw(t, "lane")
			word |= uint64(lane) << (16 * i)
		}
		b := Bucket(word)
		got, want := b.Contains(fp), b.containsScalar(fp)
		require.Equal(t, want, got, "Bucket(%#016x).Contains(%#x) = %v, want scalar %v", word, fp, got, want)
	})
}

func TestBucket_ContainsMatchesScalarRandomWords(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		word := rapid.Uint64().Draw(t, "word")
		fp := rapid.Uint16Min(1).Draw(t, "fp")
		b := Bucket(word)
		got, want := b.Contains(fp), b.containsScalar(fp)
		require.Equal(t, want, got, "Bucket(%#016x).Contains(%#x) = %v, want scalar %v", word, fp, got, want)
	})
}

// TestBucket_FindMatchesScalar checks the SWAR Find (and so LowestEmpty,
// which is Find(0)) against the slot-by-slot scan on every word built from
// lanes that exercise borrows: zero, the probed value, its neighbours, its
// sign-flipped twin and the extremes, for probes including 0 and 0xFFFF.
func TestBucket_FindMatchesScalar(t *testing.T) {
	for _, fp := range []uint16{0, 1, 2, 0x7FFF, 0x8000, 0x8001, 0xFFFE, 0xFFFF, 0x1234} {
		lanes := []uint16{0, fp, fp + 1, fp - 1, fp ^ 0x8000, 1, 0xFFFF}
		for i0 := range lanes {
			for i1 := range lanes {
				for i2 := range lanes {
					for i3 := range lanes {
						word := uint64(lanes[i0]) | uint64(lanes[i1])<<16 | uint64(lanes[i2])<<32 | uint64(lanes[i3])<<48
						b := Bucket(word)
						got, want := b.Find(fp), b.findScalar(fp)
						require.Equal(t, want, got, "Bucket(%#016x).Find(%#x) = %d, want scalar %d", word, fp, got, want)
					}
				}
			}
		}
	}
}

func TestBucket_FindMatchesScalarRandomWords(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		b := Bucket(rapid.Uint64().Draw(t, "word"))
		fp := rapid.Uint16().Draw(t, "fp")
		got, want := b.Find(fp), b.findScalar(fp)
		require.Equal(t, want, got, "Bucket(%#016x).Find(%#x) = %d, want scalar %d", uint64(b), fp, got, want)
		got, want = b.LowestEmpty(), b.findScalar(0)
		require.Equal(t, want, got, "Bucket(%#016x).LowestEmpty() = %d, want scalar %d", uint64(b), got, want)
	})
}
