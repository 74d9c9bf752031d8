package replay_test

import (
	"context"
	"fmt"
	"time"

	"github.com/ckfrelay/ckfrelay/internal/sim/replay"
)

// Replay the first 1,000 requests of the embedded Mooncake trace through
// three data centers with small rank caches and a 2 s relay-to-router lag,
// once with the filter and once with the exact index. The filter's
// under-reports are all in-flight deltas; the exact index has none. The
// replay runs on the trace's clock and seeded randomness, so its accuracy
// figures are reproducible.
func ExampleRun() {
	reqs, err := replay.EmbeddedTrace()
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, exact := range []bool{false, true} {
		cfg := replay.DefaultConfig()
		cfg.Exact = exact
		cfg.BlocksPerRank = 256
		cfg.Lag = 2 * time.Second
		cfg.FPRProbes = 1000
		r, err := replay.Run(context.Background(), cfg, reqs[:1000])
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("exact=%v: %d requests, agreement %.1f%%, over %d, under %d, in flight %d, unexplained %d\n",
			exact, r.Requests, r.AgreementPct, r.OverReports, r.UnderReports, r.UnderInFlight, r.UnexplainedUnderReports)
	}
	// Output:
	// exact=false: 1000 requests, agreement 99.8%, over 0, under 3, in flight 3, unexplained 0
	// exact=true: 1000 requests, agreement 100.0%, over 0, under 0, in flight 0, unexplained 0
}

// Score three routed requests over two data centers without an Explainer,
// as `relay demo` does, and print the report's accuracy figures.
func ExampleScorer() {
	s, err := replay.NewScorer(2, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	// truth per DC, router's answer per DC, chosen DC, serving DC, blocks, query time
	_ = s.Observe([]int{4, 0}, []int{4, 0}, 0, 0, 6, time.Microsecond)  // right
	_ = s.Observe([]int{2, 3}, []int{2, 1}, 0, 0, 3, time.Microsecond)  // lane 1 under-reports: wrong pick
	_ = s.Observe([]int{0, 0}, []int{1, -1}, 0, 0, 2, time.Microsecond) // lane 0 over-reports, lane 1 not ready
	var r replay.Report
	s.Fill(&r)
	fmt.Printf("agreement %.1f%% (%d/%d), hit rate %.1f%%\n", r.AgreementPct, r.Agree, r.Requests, r.HitRatePct)
	fmt.Printf("lanes %d (+%d not ready), over %d/%d blocks, under %d/%d blocks, unclassified %v\n",
		r.Lanes, r.LanesNotReady, r.OverReports, r.OverBlocks, r.UnderReports, r.UnderBlocks, r.Unclassified)
	// Output:
	// agreement 66.7% (2/3), hit rate 54.5%
	// lanes 5 (+1 not ready), over 1/1 blocks, under 1/2 blocks, unclassified true
}
