package ckf

import "testing"

func TestNewRNG_DefaultSeedState(t *testing.T) {
	r := NewRNG(DefaultSeed)
	if got, want := r.State(), uint64(0xC050D0A84124DB84); got != want {
		t.Fatalf("NewRNG(DefaultSeed).State() = %#x, want %#x", got, want)
	}
}
