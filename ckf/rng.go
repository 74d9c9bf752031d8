package ckf

// splitMixGamma is SplitMix64's increment (and the RNG seed mix of SPEC §2.4).
const splitMixGamma uint64 = 0x9E3779B97F4A7C15

// RNG is the SplitMix64 generator that picks relocation victims (SPEC §2.4).
// One RNG belongs to one pool state and persists across events; draws made by
// a failed insertion are not rolled back. The zero value is a valid generator
// with state 0, but pools start from [NewRNG].
type RNG struct{ state uint64 }

// NewRNG returns the initial pool generator for seed: its state is
// next(seed ^ 0x9E3779B97F4A7C15). The default seed yields state 0xC050D0A84124DB84.
func NewRNG(seed uint64) RNG {
	r := RNG{state: seed ^ splitMixGamma}
	return RNG{state: r.Next()}
}

// State returns the generator state (for tests and diagnostics).
func (r *RNG) State() uint64 { return r.state }

// Next advances the generator and returns the next value (wrapping arithmetic).
func (r *RNG) Next() uint64 {
	r.state += splitMixGamma
	z := r.state
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	return z ^ (z >> 31)
}
