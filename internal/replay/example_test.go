package replay_test

import (
	"context"
	"fmt"
	"time"

	"github.com/ckfrelay/ckfrelay/internal/replay"
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
	// exact=false: 1000 requests, agreement 99.7%, over 0, under 3, in flight 3, unexplained 0
	// exact=true: 1000 requests, agreement 100.0%, over 0, under 0, in flight 0, unexplained 0
}
