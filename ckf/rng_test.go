package ckf

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestNewRNG_DefaultSeedState(t *testing.T) {
	r := NewRNG(DefaultSeed)
	got, want := r.State(), uint64(0xC050D0A84124DB84)
	require.Equal(t, want, got, "NewRNG(DefaultSeed).State() = %#x, want %#x", got, want)
}

// TestRNG_SplitMix64Reference checks Next against the published SplitMix64
// outputs for state 0 (Vigna's reference implementation).
func TestRNG_SplitMix64Reference(t *testing.T) {
	var r RNG // the zero value is the generator with state 0
	want := []uint64{0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F}
	for i, w := range want {
		got := r.Next()
		require.Equal(t, w, got, "Next() #%d = %#x, want %#x", i, got, w)
	}
	g := splitMixGamma
	{
		got, want := r.State(), g+g+g
		require.Equal(t, want, got, "State() after 3 draws = %#x, want %#x (3 × gamma, wrapping)", got, want)
	}
}

func TestNewRNG_IsNextOfMixedSeed(t *testing.T) {
	for _, seed := range []uint64{0, 1, DefaultSeed, 0xFFFFFFFFFFFFFFFF, splitMixGamma} {
		ref := RNG{state: seed ^ splitMixGamma}
		want := ref.Next()
		got := NewRNG(seed)
		assert.Equal(t, want, got.State(), "NewRNG(%#x).State() = %#x, want next(seed^gamma) = %#x", seed, got.State(), want)
	}
}

func TestRNG_Deterministic(t *testing.T) {
	a, b := NewRNG(7), NewRNG(7)
	c := NewRNG(8)
	same := 0
	for i := range 1000 {
		x, y, z := a.Next(), b.Next(), c.Next()
		require.Equal(t, y, x, "draw %d: two generators with one seed differ: %#x vs %#x", i, x, y)
		if x == z {
			same++
		}
	}
	require.LessOrEqual(t, same, 1, "generators with different seeds agreed on %d of 1000 draws, want ≤ 1", same)
}
