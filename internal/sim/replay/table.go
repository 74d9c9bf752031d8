package replay

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"
)

// notApplicable is printed for a figure a report did not measure.
const notApplicable = "n/a"

// WriteTable prints reports side by side: one row per figure, one column per
// report (headed by its policy), after a blank line. Figures a report names
// in Unmeasured print as "n/a"; with Unclassified, over- and under-reports
// print without their causes and the unexplained count as "n/a". `relay
// replay` prints its runs with it and `relay demo` its summary.
func WriteTable(w io.Writer, reports ...*Report) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(label string, need []string, f func(r *Report) string) {
		fmt.Fprint(tw, label+"\t")
		for _, r := range reports {
			if r.measured(need...) {
				fmt.Fprint(tw, f(r)+"\t")
			} else {
				fmt.Fprint(tw, notApplicable+"\t")
			}
		}
		fmt.Fprintln(tw)
	}
	ns := func(v int64) string { return time.Duration(v).String() }
	fields := func(names ...string) []string { return names }
	if _, err := fmt.Fprintln(w); err != nil {
		return err
	}
	row("policy", nil, func(r *Report) string { return r.Name() })
	row("requests / events / blocks", nil, func(r *Report) string {
		return fmt.Sprintf("%d / %d / %d", r.Requests, r.Events, r.EventBlocks)
	})
	row("best-DC agreement", nil, func(r *Report) string {
		return fmt.Sprintf("%.3f%% (%d/%d)", r.AgreementPct, r.Agree, r.Requests)
	})
	row("  on warm requests", nil, func(r *Report) string {
		return fmt.Sprintf("%.3f%% (%d/%d)", r.WarmAgreementPct, r.WarmAgree, r.WarmRequests)
	})
	row("over-reports (lanes, blocks)", nil, func(r *Report) string {
		if r.Unclassified {
			return fmt.Sprintf("%d, %d (unclassified)", r.OverReports, r.OverBlocks)
		}
		return fmt.Sprintf("%d, %d (fp %d, stale %d)", r.OverReports, r.OverBlocks, r.OverFalsePositive, r.OverStale)
	})
	row("under-reports (lanes, blocks)", nil, func(r *Report) string {
		if r.Unclassified {
			return fmt.Sprintf("%d, %d (unclassified)", r.UnderReports, r.UnderBlocks)
		}
		return fmt.Sprintf("%d, %d (cap %d, in-flight %d)", r.UnderReports, r.UnderBlocks, r.UnderCapacity, r.UnderInFlight)
	})
	row("unexplained under-reports", nil, func(r *Report) string {
		if r.Unclassified {
			return notApplicable
		}
		return fmt.Sprint(r.UnexplainedUnderReports)
	})
	row("capacity omissions", fields("capacity_omissions"), func(r *Report) string { return fmt.Sprint(r.CapacityOmissions) })
	row("cache hit rate (DC / rank)", nil, func(r *Report) string {
		rank := notApplicable
		if r.measured("rank_hit_rate_pct") {
			rank = fmt.Sprintf("%.1f%%", r.RankHitRatePct)
		}
		return fmt.Sprintf("%.1f%% / %s", r.HitRatePct, rank)
	})
	row("TTFT p50 / p90 / p99 (model)", fields("ttft_p50_ms"), func(r *Report) string {
		return fmt.Sprintf("%.0fms / %.0fms / %.0fms", r.TTFTP50Ms, r.TTFTP90Ms, r.TTFTP99Ms)
	})
	row("queueing p50 / p99 / mean", fields("queue_p50_ms"), func(r *Report) string {
		return fmt.Sprintf("%.0fms / %.0fms / %.0fms", r.QueueP50Ms, r.QueueP99Ms, r.QueueMeanMs)
	})
	row("rank imbalance (max/mean)", fields("rank_imbalance"), func(r *Report) string { return fmt.Sprintf("%.2f", r.RankImbalance) })
	row("prefill tokens saved", fields("prefill_tokens_saved"), func(r *Report) string {
		return fmt.Sprintf("%.1f%% (%d of %d)", r.PrefillSavedPct, r.PrefillTokensSaved, r.PrefillTokensSaved+r.PrefillTokens)
	})
	row("served outside origin DC", fields("remote_pct"), func(r *Report) string { return fmt.Sprintf("%.1f%%", r.RemotePct) })
	row("false-positive rate", fields("fpr"), func(r *Report) string {
		return fmt.Sprintf("%.3g (bound %.3g, %.2f×)", r.FPR, r.FPRBound, r.FPRRatio)
	})
	row("filter load α", fields("filter_load"), func(r *Report) string { return fmt.Sprintf("%.1f%%", 100*r.FilterLoad) })
	row("events/s, blocks/s", nil, func(r *Report) string {
		return fmt.Sprintf("%.0f, %.0f", r.EventsPerSec, r.BlocksPerSec)
	})
	row("freshness p50 / p99 (trace)", fields("freshness_p50_ms"), func(r *Report) string {
		return fmt.Sprintf("%.1fms / %.1fms", r.FreshnessP50Ms, r.FreshnessP99Ms)
	})
	row("delivery p50 / p99 (wall)", fields("delivery_p50_ns"), func(r *Report) string {
		return ns(r.DeliveryP50Ns) + " / " + ns(r.DeliveryP99Ns)
	})
	row("query p50 / p99", nil, func(r *Report) string { return ns(r.QueryP50Ns) + " / " + ns(r.QueryP99Ns) })
	row("producer B/tracked block", fields("producer_bytes_per_block"), func(r *Report) string {
		return fmt.Sprintf("%.1f (exact %.1f) × %d", r.ProducerBytesPerBlock, r.ExactStateBytesPerBlock, r.TrackedBlocks)
	})
	row("consumer memory", fields("consumer_bytes"), func(r *Report) string {
		return fmt.Sprintf("%.1f MiB", float64(r.ConsumerBytes)/(1<<20))
	})
	row("wall time", nil, func(r *Report) string { return fmt.Sprintf("%.2fs", r.WallSeconds) })
	return tw.Flush()
}
