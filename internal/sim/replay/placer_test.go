package replay

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/internal/sim/workload"
)

// sharedFirstBlock is a trace of n requests, one every gap, that all share
// their first block (one system prompt) and nothing else: 8 blocks of 512
// tokens, 100 output tokens.
func sharedFirstBlock(n int, gap time.Duration) []workload.Request {
	reqs := make([]workload.Request, n)
	next := uint64(1)
	for i := range reqs {
		ids := []uint64{0}
		for range 7 {
			ids = append(ids, next)
			next++
		}
		reqs[i] = workload.Request{TimestampMs: int64(time.Duration(i) * gap / time.Millisecond),
			InputLength: 8 * 512, OutputLength: 100, HashIDs: ids}
	}
	return reqs
}

// TestRun_SharedFirstBlockSpreadsLoad: when every request shares its first
// block, pure affinity sends them all to the rank that cached it first; the
// load-aware policy keeps every rank within a small multiple of the mean.
func TestRun_SharedFirstBlockSpreadsLoad(t *testing.T) {
	reqs := sharedFirstBlock(2000, 100*time.Millisecond)
	const bound = 2.0 // max/mean requests per rank
	for _, tc := range []struct {
		policy Policy
		spread bool
	}{{CacheAware, true}, {LoadOnly, true}, {Affinity, false}} {
		t.Run(tc.policy.String(), func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Policy, cfg.FPRProbes = tc.policy, 1000
			r, err := Run(context.Background(), cfg, reqs)
			require.NoError(t, err)
			ranks := float64(cfg.DataCenters * cfg.WorkersPerDC * cfg.RanksPerWorker)
			t.Logf("%s: rank imbalance %.2f, TTFT p50 %.0fms p99 %.0fms, queue p99 %.0fms", tc.policy, r.RankImbalance, r.TTFTP50Ms, r.TTFTP99Ms, r.QueueP99Ms)
			if tc.spread {
				assert.LessOrEqual(t, r.RankImbalance, bound, "a rank served more than %v× the mean", bound)
				for _, s := range r.Series {
					assert.LessOrEqual(t, s.RankImbalance, 2*bound, "window ending at request %d", s.Requests)
				}
			} else {
				// The degenerate fleet the load-aware cost exists to avoid:
				// one rank serves everything.
				assert.InDelta(t, ranks, r.RankImbalance, 0.01)
			}
		})
	}
}

// TestRun_ExactTTFTWithinFilterMisreports: the exact index is the upper
// bound of the filter; on the same trace, its TTFT figures are worse than
// the filter's by no more than the filter's misreported lanes per request
// (its over- plus under-reports over its requests: at least the share of
// requests with a wrong answer), plus 1%. (An exact index that reported no
// cache at all fails it: p50 1.7× the filter's.)
func TestRun_ExactTTFTWithinFilterMisreports(t *testing.T) {
	reqs := slice(t, 1500)
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"default", DefaultConfig()},
		{"pressured", pressured(3, CacheAware)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.FPRProbes = 1000
			filter, err := Run(context.Background(), tc.cfg, reqs)
			require.NoError(t, err)
			tc.cfg.Exact = true
			exact, err := Run(context.Background(), tc.cfg, reqs)
			require.NoError(t, err)
			misreported := float64(filter.OverReports+filter.UnderReports) / float64(filter.Requests)
			tol := 0.01 + misreported
			t.Logf("filter TTFT mean %.1fms p50 %.1fms p90 %.1fms; exact %.1fms %.1fms %.1fms; misreported %.2f%% of requests",
				filter.TTFTMeanMs, filter.TTFTP50Ms, filter.TTFTP90Ms, exact.TTFTMeanMs, exact.TTFTP50Ms, exact.TTFTP90Ms, 100*misreported)
			for _, f := range []struct {
				name          string
				exact, filter float64
			}{
				{"mean", exact.TTFTMeanMs, filter.TTFTMeanMs},
				{"p50", exact.TTFTP50Ms, filter.TTFTP50Ms},
				{"p90", exact.TTFTP90Ms, filter.TTFTP90Ms},
			} {
				assert.LessOrEqual(t, f.exact, f.filter*(1+tol), "exact %s TTFT %.1fms vs filter %.1fms (misreported %.2f%%)",
					f.name, f.exact, f.filter, 100*misreported)
			}
		})
	}
}

// TestPlacer_HandComputedTrace checks the latency model against a trace
// worked by hand: one data center, one rank, 1,000 prefill tokens/s, 10
// decode tokens/s, 100-token blocks.
//
//	req 0 at 0 ms:   blocks a b, 200 tokens, nothing cached: prefill 200 ms,
//	                 queue 0, TTFT 200 ms; decodes 50 tokens until 5,200 ms.
//	req 1 at 100 ms: blocks a b c, 300 tokens, a b cached: 100 tokens,
//	                 waits for req 0 until 200 ms (queue 100 ms), prefill
//	                 100 ms: TTFT 300-100 = 200 ms.
//	req 2 at 1000 ms: blocks d, 100 tokens, idle rank: TTFT 100 ms.
func TestPlacer_HandComputedTrace(t *testing.T) {
	cfg := DefaultConfig()
	cfg.DataCenters, cfg.WorkersPerDC, cfg.RanksPerWorker = 1, 1, 1
	cfg.Latency = Latency{BlockTokens: 100, PrefillTokensPerSec: 1000, DecodeTokensPerSec: 10}
	reqs := []workload.Request{
		{TimestampMs: 0, InputLength: 200, OutputLength: 50, HashIDs: []uint64{1, 2}},
		{TimestampMs: 100, InputLength: 300, OutputLength: 10, HashIDs: []uint64{1, 2, 3}},
		{TimestampMs: 1000, InputLength: 100, OutputLength: 10, HashIDs: []uint64{4}},
	}
	want := []Placement{
		{Prefill: 200, TTFT: 200 * time.Millisecond},
		{RankDepth: 2, Prefill: 100, Queue: 100 * time.Millisecond, TTFT: 200 * time.Millisecond},
		{Prefill: 100, TTFT: 100 * time.Millisecond},
	}
	fleet, err := workload.NewFleet(workload.FleetConfig{DataCenters: 1, WorkersPerDC: 1, RanksPerWorker: 1, BlocksPerRank: 64})
	require.NoError(t, err)
	p := NewPlacer(cfg, fleet)
	for i := range reqs {
		chain := workload.Chain(reqs[i].HashIDs)
		got := p.Place(i, time.Duration(reqs[i].TimestampMs)*time.Millisecond, &reqs[i], chain, []int{0})
		assert.Equal(t, want[i], got, "request %d", i)
		fleet.Serve(nil, 0, 0, chain, chain)
		if i == 1 {
			// The rank's load at 150 ms, as the cost sees it: req 0's
			// prefill running and req 1's queued (200 + 100 tokens), both
			// active (2 + 3 blocks).
			pre, blocks, n := p.queues[0][0].load(150 * time.Millisecond)
			assert.Equal(t, []int64{300, 5, 2}, []int64{pre, blocks, int64(n)})
		}
	}
	// By 6 s every request decoded its output: req 0 ends at 5.2 s.
	pre, blocks, n := p.queues[0][0].load(6 * time.Second)
	assert.Equal(t, []int64{0, 0, 0}, []int64{pre, blocks, int64(n)})

	var r Report
	p.Fill(&r)
	assert.InDelta(t, 500.0/3, r.TTFTMeanMs, 0.001)
	assert.InDelta(t, 100.0/3, r.QueueMeanMs, 0.001)
	assert.Equal(t, int64(400), r.PrefillTokens)
	assert.Equal(t, int64(200), r.PrefillTokensSaved) // of 600
	assert.InDelta(t, 100.0*2/6, r.RankHitRatePct, 0.001)
}

// TestPlacer_RoundTripIsPaid: a request served outside its origin pays the
// round trip in its TTFT, and the cost sends it remote only when the cached
// prefix there saves more prefill time than the round trip costs.
func TestPlacer_RoundTripIsPaid(t *testing.T) {
	cfg := DefaultConfig()
	cfg.DataCenters, cfg.WorkersPerDC, cfg.RanksPerWorker = 2, 1, 1
	cfg.Latency = Latency{BlockTokens: 100, PrefillTokensPerSec: 1000, DecodeTokensPerSec: 10, RTT: 50 * time.Millisecond}
	fleet, err := workload.NewFleet(workload.FleetConfig{DataCenters: 2, WorkersPerDC: 1, RanksPerWorker: 1, BlocksPerRank: 64})
	require.NoError(t, err)
	long := workload.Request{InputLength: 1000, HashIDs: []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}}
	chain := workload.Chain(long.HashIDs)
	fleet.Serve(nil, 1, 0, chain[:9], chain[:9]) // DC 1 holds 9 of 10 blocks
	p := NewPlacer(cfg, fleet)
	// Request 0 originates at DC 0: remote saves 900 ms of prefill for a
	// 50 ms round trip. TTFT = 50 + 100.
	got := p.Place(0, 0, &long, chain, []int{0, 9})
	assert.Equal(t, Placement{DC: 1, RankDepth: 9, Prefill: 100, TTFT: 150 * time.Millisecond, Remote: true}, got)

	// With a 150 ms round trip, a one-block prompt cached remotely saves
	// 100 ms of prefill: not worth it, it stays home.
	cfg.Latency.RTT = 150 * time.Millisecond
	p = NewPlacer(cfg, fleet)
	short := workload.Request{InputLength: 100, HashIDs: []uint64{1}}
	got = p.Place(2, 10*time.Second, &short, chain[:1], []int{0, 1})
	assert.Equal(t, Placement{DC: 0, Prefill: 100, TTFT: 100 * time.Millisecond}, got)
}

func TestRouting_Pick(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	r := DefaultRouting()
	assert.Equal(t, 2, r.pick([]float64{5, 3.5, 3, 7}, rng), "temperature 0 is argmin")
	seen := map[int]int{}
	for range 1000 {
		seen[r.pick([]float64{2, 1, 1}, rng)]++
	}
	assert.Zero(t, seen[0])
	assert.InDelta(t, 500, seen[1], 100, "ties are broken at random")

	r.Temperature = 1
	seen = map[int]int{}
	for range 10000 {
		seen[r.pick([]float64{1, 2}, rng)]++
	}
	// Dynamo's softmax: costs normalised by the max (0.5, 1), divided by
	// max-min (0.5): -1 and -2, so p(0) = e^-1 / (e^-1 + e^-2) ≈ 0.731.
	assert.InDelta(t, 7311, seen[0], 200)
}

func TestRouting_Imbalanced(t *testing.T) {
	r := DefaultRouting() // abs 64, rel 1.5
	assert.False(t, r.imbalanced([]int{0, 64}), "max-min must exceed 64")
	assert.True(t, r.imbalanced([]int{0, 65}))
	assert.False(t, r.imbalanced([]int{200, 290}), "290 ≤ 1.5 × 200")
	assert.True(t, r.imbalanced([]int{200, 301}))
	r.BalanceAbs = -1
	assert.False(t, r.imbalanced([]int{0, 1000}))
}

func TestTradeOff_BreakEven(t *testing.T) {
	l := Latency{BlockTokens: 512, PrefillTokensPerSec: 8192, DecodeTokensPerSec: 50}
	s := TradeOff(l, DefaultRouting(), []time.Duration{10 * time.Millisecond, 100 * time.Millisecond}, []int64{512, 8192, 65536})
	// 8192 tokens: 7680 cached remotely = 937.5 ms of prefill.
	assert.InDelta(t, 937.5, s.BreakEvenRTTMs[1], 0.01)
	assert.InDelta(t, 0, s.BreakEvenRTTMs[0], 0.01, "one block: nothing to reuse")
	assert.InDelta(t, 937.5-10, s.SavingMs[0][1], 0.01)
	assert.InDelta(t, -10, s.SavingMs[0][0], 0.01)
	for i := range s.RTTMs {
		for j := range s.PromptTokens {
			assert.Equal(t, s.SavingMs[i][j] > 0, s.RouterRemote[i][j], "rtt %v prompt %d", s.RTTMs[i], s.PromptTokens[j])
		}
	}
}
