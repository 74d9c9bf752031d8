package replay

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// BenchmarkReplay replays the whole embedded Mooncake trace once per
// iteration at 3 and 16 data centers (the default fleet: 4 workers × 2
// ranks × 2048 blocks each, the relay's cadence, no propagation lag, the
// default latency model) under each policy the report compares, and reports
// the accuracy, latency-model and throughput figures `make bench` prints.
// Wall-clock rates are from the last iteration.
func BenchmarkReplay(b *testing.B) {
	reqs, err := EmbeddedTrace()
	require.NoError(b, err)
	runs := []struct {
		name   string
		policy Policy
		exact  bool
	}{
		{"cache-aware", CacheAware, false},
		{"cache-aware-exact", CacheAware, true},
		{"load-only", LoadOnly, false},
		{"random", Random, false},
		{"round-robin", RoundRobin, false},
	}
	for _, dcs := range []int{3, 16} {
		for _, run := range runs {
			b.Run(fmt.Sprintf("dcs=%d/policy=%s", dcs, run.name), func(b *testing.B) {
				cfg := DefaultConfig()
				cfg.DataCenters, cfg.Policy, cfg.Exact = dcs, run.policy, run.exact
				var r *Report
				for b.Loop() {
					r, err = Run(context.Background(), cfg, reqs)
					require.NoError(b, err)
				}
				b.ReportMetric(r.AgreementPct, "agreement-pct")
				b.ReportMetric(r.WarmAgreementPct, "warm-agreement-pct")
				b.ReportMetric(float64(r.UnexplainedUnderReports), "unexplained-under")
				b.ReportMetric(float64(r.OverReports), "over-reports")
				b.ReportMetric(float64(r.UnderReports), "under-reports")
				b.ReportMetric(r.FPR, "fpr")
				b.ReportMetric(r.FPRBound, "fpr-bound")
				b.ReportMetric(r.FPRRatio, "fpr-ratio")
				b.ReportMetric(r.HitRatePct, "hit-pct")
				b.ReportMetric(r.EventsPerSec, "events/s")
				b.ReportMetric(r.BlocksPerSec, "blocks/s")
				b.ReportMetric(float64(r.QueryP50Ns), "query-p50-ns")
				b.ReportMetric(float64(r.QueryP99Ns), "query-p99-ns")
				b.ReportMetric(r.FreshnessP99Ms, "freshness-p99-ms")
				b.ReportMetric(r.ProducerBytesPerBlock, "producer-B/block")
				b.ReportMetric(r.TTFTP50Ms, "ttft-p50-ms")
				b.ReportMetric(r.TTFTP99Ms, "ttft-p99-ms")
				b.ReportMetric(r.RankImbalance, "rank-imbalance")
				b.ReportMetric(r.PrefillSavedPct, "prefill-saved-pct")
			})
		}
	}
}
