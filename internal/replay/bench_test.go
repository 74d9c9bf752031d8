package replay

import (
	"context"
	"fmt"
	"testing"
)

// BenchmarkReplay replays the whole embedded Mooncake trace once per
// iteration at 3 and 16 data centers (the default fleet: 4 workers × 2
// ranks × 2048 blocks each, the relay's cadence, no propagation lag) under
// cache-aware and random placement, and reports the accuracy and throughput
// figures `make bench` prints. Wall-clock rates are from the last iteration.
func BenchmarkReplay(b *testing.B) {
	reqs, err := EmbeddedTrace()
	if err != nil {
		b.Fatal(err)
	}
	for _, dcs := range []int{3, 16} {
		for _, p := range []Policy{CacheAware, Random} {
			b.Run(fmt.Sprintf("dcs=%d/policy=%v", dcs, p), func(b *testing.B) {
				cfg := DefaultConfig()
				cfg.DataCenters, cfg.Policy = dcs, p
				var r *Report
				for b.Loop() {
					if r, err = Run(context.Background(), cfg, reqs); err != nil {
						b.Fatal(err)
					}
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
			})
		}
	}
}
