package ckf

import (
	"testing"

	"pgregory.net/rapid"
)

type rapidChoices struct{ t *rapid.T }

func (r rapidChoices) intn(n int, label string) (int, bool) {
	return rapid.IntRange(0, n-1).Draw(r.t, label), true
}

// TestPool_MatchesModel runs long random histories (stores chaining off
// earlier stores, known and unknown removals, clears from any tier, rank
// replacements from a member's own history, RemoveRank resets, flushes and
// barrier snapshots) on small tables, so capacity omissions and relocation
// happen, and checks the pool against the map model after every step.
func TestPool_MatchesModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		cfg := DefaultConfig()
		cfg.ExpectedBlocks = rapid.SampledFrom([]uint64{1, 3, 7, 16, 40}).Draw(t, "expected")
		cfg.MaxKicks = rapid.IntRange(1, 30).Draw(t, "kicks")
		cfg.PublishEveryNEvents = rapid.Uint64Range(1, 5).Draw(t, "every")
		cfg.Seed = rapid.Uint64().Draw(t, "seed")
		// Exact-state bounds (SPEC §4.6): 0 is none; the harness has 4 members.
		cfg.MaxMembers = rapid.IntRange(0, 3).Draw(t, "maxMembers")
		cfg.MaxTrackedBlocks = rapid.SampledFrom([]uint64{0, 0, 3, 8, 20}).Draw(t, "maxTracked")
		h := newHarness(t, cfg)
		n := rapid.IntRange(1, 200).Draw(t, "steps")
		for range n {
			h.step(rapidChoices{t})
		}
		h.finish()
	})
}
