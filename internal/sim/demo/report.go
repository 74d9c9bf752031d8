package demo

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"time"

	"github.com/ckfrelay/ckfrelay/client"
	"github.com/ckfrelay/ckfrelay/consumer"
	"github.com/ckfrelay/ckfrelay/internal/catalog"
	"github.com/ckfrelay/ckfrelay/internal/sim/replay"
	"github.com/ckfrelay/ckfrelay/internal/sim/replay/report"
)

// report lets the router catch up with what the relays published, measures
// the false-positive rate on the lanes at the load the relays report, stops
// the router and returns the demo's report.
func (l *demoLoop) report(ctx context.Context) *replay.Report {
	o := l.o
	cat := settle(ctx, l.relay.base, l.router.Router, o.dataCenters, 2*time.Second)
	rep := &replay.Report{Policy: replay.CacheAware.String(), DataCenters: o.dataCenters, RanksPerDC: l.fleet.Ranks(),
		BlocksPerRank: o.blocksPerRank, ExpectedBlocks: l.relay.expected, BucketCount: l.relay.format.BucketCount,
		Events: l.events, EventBlocks: l.eventBlocks, WallSeconds: l.wall.Seconds(),
		// Behind HTTP the demo sees neither the pools' exact state and
		// memory nor the deltas' publication (delivery is timed from
		// sending the events instead, deliveryLanes).
		Unmeasured: []string{"deltas", "images", "frame_bytes", "trace_seconds", "capacity_omissions",
			"freshness_p50_ms", "freshness_p99_ms",
			"producer_bytes_per_block", "exact_state_bytes_per_block", "producer_bytes"}}
	if ns := l.router.delivery.samples(); len(ns) > 0 {
		rep.DeliveryP50Ns, rep.DeliveryP99Ns = replay.Percentile(ns, 0.50), replay.Percentile(ns, 0.99)
	} else {
		rep.Unmeasured = append(rep.Unmeasured, "delivery_p50_ns", "delivery_p99_ns")
	}
	loads := make([]float64, o.dataCenters)
	fprOK := true
	for d := range o.dataCenters {
		p := cat.Pool(poolName(d))
		if p == nil || p.Stats == nil {
			fprOK = false
			break
		}
		loads[d] = p.Stats.Occupancy
		rep.TrackedBlocks += uint64(p.Stats.UniqueBlocks)
	}
	if fprOK {
		fprOK = l.scorer.ProbeFPR(l.router.Contains, loads, o.fprProbes, o.seed) == nil
	}
	if !fprOK { // a relay or a lane did not answer (the demo was interrupted)
		rep.Unmeasured = append(rep.Unmeasured, "filter_load", "fpr", "fpr_bound", "fpr_ratio", "tracked_blocks")
	}
	l.scorer.Fill(rep)
	l.placer.Fill(rep)
	if s := l.wall.Seconds(); s > 0 {
		rep.EventsPerSec = float64(l.events) / s
		rep.BlocksPerSec = float64(l.eventBlocks) / s
	}
	for d := range o.dataCenters {
		rep.HeldBlocks += uint64(l.fleet.HeldBlocks(d))
	}
	l.router.halt() // the lanes are ours alone from here
	if b, ok := consumerBytes(l.router.lanes); ok {
		rep.ConsumerBytes = b
	} else {
		rep.Unmeasured = append(rep.Unmeasured, "consumer_bytes")
	}
	return rep
}

// writeDemoReport writes the demo's report page (the same page as `relay
// replay --report`) into o.report.
func writeDemoReport(w io.Writer, o demoOptions, trace string, rep *replay.Report) error {
	cfg := o.replayConfig()
	page := report.Page{Title: "ckfrelay demo", Trace: trace, Command: o.command, Reports: []*replay.Report{rep},
		Sweep: replay.TradeOff(cfg.Latency, cfg.Routing, replay.DefaultSweepRTTs, replay.DefaultSweepPrompts)}
	if err := report.Write(o.report, page); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "report: %s\n", filepath.Join(o.report, report.IndexFile))
	return err
}

// printSummary prints the lanes' final state, the load the latency model
// ran at and the report's table.
func printSummary(w io.Writer, rep *replay.Report, lanes []client.LaneInfo, grpc *grpcCounts, model *modelLoad) error {
	fmt.Fprintf(w, "\nsummary after %d requests (%d events, %d blocks) against the fleet's exact ground truth\n",
		rep.Requests, rep.Events, rep.EventBlocks)
	for d, li := range lanes {
		fmt.Fprintf(w, "  lane %d (%s)  sequence %d  resubscribes %d  staleness %v\n", d, li.Pool, li.Sequence, li.Resubscribes, li.Staleness.Round(time.Millisecond))
	}
	if grpc != nil {
		fmt.Fprintf(w, "  over gRPC: %d SubscribeKvPool streams, %d FilterUpdates received\n", grpc.streams.Load(), grpc.updates.Load())
	}
	if rep.LanesNotReady > 0 {
		fmt.Fprintf(w, "  %d lane answers missing (lane not ready), not scored\n", rep.LanesNotReady)
	}
	model.print(w, rep)
	return replay.WriteTable(w, rep)
}

// consumerBytes returns the consumer's table size, when the consumer tells.
// Call it only with the router stopped: the router serializes lane calls.
func consumerBytes(l client.Lanes) (uint64, bool) {
	switch c := l.(type) {
	case interface {
		Stats() (consumer.Stats, error)
	}:
		st, err := c.Stats()
		return st.TableBytes, err == nil
	}
	return 0, false
}

// fetchCatalog reads the relay's catalog; an unreachable relay reads as an
// empty catalog (the per-second line then shows zeros rather than stopping).
func fetchCatalog(ctx context.Context, base string) catalog.Catalog {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	cat, _ := catalog.Get(ctx, http.DefaultClient, base, "")
	return cat
}

// settle waits, bounded by timeout, until every lane's sequence reached its
// relay's hub sequence, and returns the last catalog read. It polls: the
// router has no callback, and the demo's end is not latency sensitive.
// An interrupted demo (ctx done) reads the catalog once and does not wait.
func settle(ctx context.Context, base string, router *client.Router, dcs int, timeout time.Duration) catalog.Catalog {
	deadline := time.Now().Add(timeout)
	for {
		cat := fetchCatalog(context.WithoutCancel(ctx), base)
		caughtUp := true
		for d := range dcs {
			p := cat.Pool(poolName(d))
			if p == nil || router.Lane(d).Sequence < uint64(p.Hub.Sequence) {
				caughtUp = false
			}
		}
		if caughtUp || ctx.Err() != nil || time.Now().After(deadline) {
			return cat
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// ticker prints the demo's one line per second.
type ticker struct {
	w      io.Writer
	base   string
	router *client.Router
	dcs    int

	events, blocks, sequences uint64 // totals at the last line
	mark                      int    // the scorer's query window
}

func (t *ticker) tick(elapsed time.Duration, events, blocks uint64, sc *replay.Scorer) {
	cat := fetchCatalog(context.Background(), t.base)
	tracked, occ, seqs, lag := 0, 0.0, uint64(0), uint64(0)
	for i, p := range cat.Pools {
		if p.Stats != nil {
			tracked += p.Stats.UniqueBlocks
			occ += p.Stats.Occupancy / float64(len(cat.Pools))
		}
		seqs += uint64(p.Hub.Sequence)
		if i < t.dcs {
			if ls := t.router.Lane(i).Sequence; uint64(p.Hub.Sequence) > ls {
				lag += uint64(p.Hub.Sequence) - ls
			}
		}
	}
	var p50, p99 time.Duration
	p50, p99, t.mark = sc.QueryWindow(t.mark)
	fmt.Fprintf(t.w, "t=%3.0fs  events/s %6d  blocks/s %7d  tracked %7d  filter load %5.1f%%  deltas/s %5d  router lag %3d deltas  agreement %7.3f%%  query p50 %v p99 %v\n",
		elapsed.Seconds(), events-t.events, blocks-t.blocks, tracked, 100*occ,
		seqs-min(seqs, t.sequences), lag, sc.AgreementPct(), p50, p99)
	t.events, t.blocks, t.sequences = events, blocks, seqs
}
