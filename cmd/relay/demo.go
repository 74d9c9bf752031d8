package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/client"
	"github.com/ckfrelay/ckfrelay/consumer"
	"github.com/ckfrelay/ckfrelay/internal/replay"
	"github.com/ckfrelay/ckfrelay/internal/server"
	"github.com/ckfrelay/ckfrelay/internal/workload"
	"github.com/ckfrelay/ckfrelay/wasm/host"
	"github.com/ckfrelay/ckfrelay/wire"
)

// demoOptions are the demo's flags.
type demoOptions struct {
	duration      time.Duration
	dataCenters   int
	workers       int
	ranks         int
	blocksPerRank int
	rate          int // requests per second, 0 = as fast as possible
	seed          uint64
	consumer      string // "wasm" or "native"
	readyTimeout  time.Duration
	trace         string // "" synthetic, "embedded", or a Mooncake-format file
	fprProbes     int
}

// embeddedTraceFlag selects replay's embedded Mooncake trace for --trace.
const embeddedTraceFlag = "embedded"

func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseDemo(args, stderr)
	if err != nil {
		return err
	}
	_, err = demo(ctx, o, stdout)
	return err
}

// parseDemo parses and checks the demo's flags; a bad one is errUsage, with
// the reason on stderr.
func parseDemo(args []string, stderr io.Writer) (demoOptions, error) {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o demoOptions
	fs.DurationVar(&o.duration, "duration", 20*time.Second, "how long to run (a trace may end sooner)")
	fs.IntVar(&o.dataCenters, "dcs", 3, "data centers (pools / router lanes), 1..16")
	fs.IntVar(&o.workers, "workers", 4, "workers per data center")
	fs.IntVar(&o.ranks, "ranks", 2, "dp ranks per worker")
	fs.IntVar(&o.blocksPerRank, "blocks-per-rank", 2048, "KV cache capacity of one rank, in blocks")
	fs.IntVar(&o.rate, "rate", 2000, "requests per second (0: as fast as possible)")
	fs.Uint64Var(&o.seed, "seed", 1, "workload seed (synthetic requests, serving ranks, FPR probes)")
	fs.StringVar(&o.consumer, "consumer", "wasm", "the router's consumer: wasm (the WebAssembly module under wazero) or native")
	fs.DurationVar(&o.readyTimeout, "ready-timeout", 60*time.Second, "give up if the router's lanes are not all ready within this")
	fs.StringVar(&o.trace, "trace", "", `requests from a Mooncake-format JSONL trace, in order at --rate (timestamps ignored), instead of the synthetic generator; "embedded" for the Mooncake synthetic trace`)
	fs.IntVar(&o.fprProbes, "probes", 200_000, "never-stored keys probed against every lane for the false-positive rate")
	if err := fs.Parse(args); err != nil {
		return o, errUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "demo: unexpected arguments %q\n", fs.Args())
		return o, errUsage
	}
	switch {
	case o.consumer != "wasm" && o.consumer != "native":
		fmt.Fprintf(stderr, "demo: --consumer must be wasm or native, not %q\n", o.consumer)
		return o, errUsage
	case o.dataCenters < 1 || o.dataCenters > ckf.MaxLanes:
		fmt.Fprintf(stderr, "demo: --dcs %d outside 1..%d\n", o.dataCenters, ckf.MaxLanes)
		return o, errUsage
	case o.duration <= 0 || o.readyTimeout <= 0 || o.rate < 0 || o.workers < 1 || o.ranks < 1 || o.blocksPerRank < 1 || o.fprProbes < 1:
		fmt.Fprintln(stderr, "demo: --duration and --ready-timeout must be > 0, --rate ≥ 0, --workers, --ranks, --blocks-per-rank, --probes ≥ 1")
		return o, errUsage
	}
	return o, nil
}

// requestSource yields the demo's requests: the synthetic generator (never
// ends) or a trace (ends after its last request).
type requestSource struct {
	name  string
	gen   *workload.Synthetic
	trace []workload.Request
	next  int
}

func newRequestSource(o demoOptions) (*requestSource, error) {
	switch o.trace {
	case "":
		return &requestSource{name: "synthetic workload", gen: workload.NewSynthetic(workload.SyntheticConfig{SystemPrompts: 64,
			PromptBlocks: 8, ZipfS: 1.2, Conversations: 256 * o.dataCenters, TurnBlocks: 4, MaxTurns: 8,
			ContinueChance: 0.7, Seed: o.seed})}, nil
	case embeddedTraceFlag:
		reqs, err := replay.EmbeddedTrace()
		return &requestSource{name: replay.EmbeddedTraceName, trace: reqs}, err
	default:
		reqs, err := replay.LoadTrace(o.trace) // a *workload.TraceError names the line
		return &requestSource{name: o.trace, trace: reqs}, err
	}
}

// Next returns the next request, or false when a trace is exhausted.
func (s *requestSource) Next() (workload.Request, bool) {
	if s.gen != nil {
		return s.gen.Next(), true
	}
	if s.next >= len(s.trace) {
		return workload.Request{}, false
	}
	s.next++
	return s.trace[s.next-1], true
}

// demo runs the demo and prints its progress and summary to stdout. It
// returns the summary's report (nil with an error before the first request).
func demo(ctx context.Context, o demoOptions, stdout io.Writer) (*replay.Report, error) {
	src, err := newRequestSource(o)
	if err != nil {
		return nil, err
	}
	fleet, err := workload.NewFleet(workload.FleetConfig{DataCenters: o.dataCenters, WorkersPerDC: o.workers,
		RanksPerWorker: o.ranks, BlocksPerRank: o.blocksPerRank})
	if err != nil {
		return nil, err
	}
	scorer, err := replay.NewScorer(o.dataCenters, nil) // the pools are behind HTTP: nothing to explain with
	if err != nil {
		return nil, err
	}
	expected := uint64(o.workers * o.ranks * o.blocksPerRank)
	cfg := server.Config{Listen: "127.0.0.1:0", HeartbeatInterval: server.Duration(200 * time.Millisecond)}
	for d := range o.dataCenters {
		cfg.Pools = append(cfg.Pools, server.PoolSpec{Name: fmt.Sprintf("dc-%d", d), DCID: uint64(d + 1),
			ExpectedBlocks: expected, PublishEveryNEvents: 16})
	}
	// ZMQ demo hook (demo_zmq.go): one data center's engines publish over ZMQ.
	zd, err := newZMQDemo(&cfg, o, stdout)
	if err != nil {
		return nil, err
	}
	defer zd.Close()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	srv, err := server.New(cfg, quiet)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	go func() { _ = srv.Serve(ln) }()
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	base := "http://" + ln.Addr().String()
	cfg = srv.Config()

	// The router: one consumer with a lane per data center.
	format, _ := ckf.Config{ExpectedBlocks: expected, Seed: ckf.DefaultSeed, MaxKicks: ckf.DefaultMaxKicks,
		VerificationWindow: ckf.DefaultVerificationWindow, PublishEveryNEvents: 1}.Format()
	m := consumer.Manifest{ConsumerInstance: 77, Domain: cfg.Domain(), Format: format, VerificationWindow: 2}
	var targets []client.Target
	for d := range o.dataCenters {
		m.Lanes[d] = &ckf.PoolID{Domain: cfg.Domain(), DCID: uint64(d + 1)}
		targets = append(targets, client.Target{Pool: fmt.Sprintf("dc-%d", d), Lane: d})
	}
	fmt.Fprintf(stdout, "ckfrelay demo: %d data centers × %d workers × %d ranks, %d blocks per rank; relay %s; %d buckets per pool; %s consumer; %s\n",
		o.dataCenters, o.workers, o.ranks, o.blocksPerRank, base, format.BucketCount, o.consumer, src.name)
	lanes, closeLanes, err := newLanes(ctx, o.consumer, m)
	if err != nil {
		return nil, err
	}
	defer closeLanes()
	router, err := client.New(client.Config{RelayURL: base, ConsumerInstance: 77, Targets: targets,
		IdleTimeout: 5 * time.Second}, lanes)
	if err != nil {
		return nil, err
	}
	rctx, stopRouter := context.WithCancel(ctx)
	routerDone := make(chan struct{})
	go func() {
		defer close(routerDone)
		_ = router.Run(rctx)
	}()
	stop := func() { stopRouter(); <-routerDone }
	defer stop()

	if err := waitReady(ctx, router, o.dataCenters, o.readyTimeout); err != nil {
		return nil, err
	}

	rng := rand.New(rand.NewPCG(o.seed, 99))
	load := make([]int, o.dataCenters)
	truth := make([]int, o.dataCenters)
	reported := make([]int, o.dataCenters)
	var events, eventBlocks, rankHits uint64
	var res consumer.QueryResult
	var evs []ckf.RouterEvent
	var body []byte
	httpc := &http.Client{Timeout: 10 * time.Second}
	start := time.Now()
	tk := ticker{w: stdout, base: base, router: router, dcs: o.dataCenters}
	nextTick := start.Add(time.Second)
	var interval time.Duration
	if o.rate > 0 {
		interval = time.Second / time.Duration(o.rate)
	}
	deadline := start.Add(o.duration)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		req, ok := src.Next()
		if !ok {
			break // the trace ended
		}
		chain := workload.Chain(req.HashIDs)
		locals := make([]uint64, len(req.HashIDs))
		for i, id := range req.HashIDs {
			locals[i] = workload.TokensHash(id)
		}
		t0 := time.Now()
		qerr := router.QuerySequenceHashes(chain, &res)
		took := time.Since(t0)

		// Route: deepest reported prefix, ties to the least loaded DC; a
		// lane without an answer reports -1 and is not scored.
		best := 0
		for d := range o.dataCenters {
			reported[d] = -1
			if qerr == nil && res.Mask&(1<<d) != 0 {
				reported[d] = int(res.Depths[d])
			}
			if reported[d] > reported[best] || (reported[d] == reported[best] && load[d] < load[best]) {
				best = d
			}
			truth[d] = fleet.Depth(d, chain)
		}
		if err := scorer.Observe(truth, reported, best, best, len(chain), took); err != nil {
			return nil, err
		}

		r := rng.IntN(fleet.Ranks())
		rankHits += uint64(fleet.RankDepth(best, r, chain))
		load[best]++
		evs = fleet.Serve(evs[:0], best, r, chain, locals)
		if len(evs) > 0 && zd.Handles(best) { // ZMQ demo hook: this data center's engines publish over ZMQ
			if err := zd.Publish(r, evs, req.HashIDs, locals); err != nil {
				return nil, err
			}
			for i := range evs {
				events++
				eventBlocks += uint64(evs[i].BlockCount())
			}
		} else if len(evs) > 0 {
			body, _ = wire.AppendRouterEventsJSON(body[:0], evs)
			resp, err := postEvents(ctx, httpc, fmt.Sprintf("%s/v1/pools/dc-%d/events?source_epoch=1", base, best), body)
			if ctx.Err() != nil {
				break // interrupted: still print the summary
			}
			if err != nil {
				return nil, err
			}
			if resp.StatusCode != http.StatusAccepted {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				return nil, fmt.Errorf("relay refused events: %s %s", resp.Status, b)
			}
			resp.Body.Close()
			for i := range evs {
				events++
				eventBlocks += uint64(evs[i].BlockCount())
			}
		}
		if now := time.Now(); now.After(nextTick) {
			tk.tick(now.Sub(start), events, eventBlocks, scorer)
			nextTick = nextTick.Add(time.Second)
		}
		if interval > 0 {
			if wait := time.Until(start.Add(time.Duration(scorer.Requests()) * interval)); wait > 0 {
				time.Sleep(wait)
			}
		}
	}
	wall := time.Since(start)

	// Let the router catch up with what the relays published, so the FPR is
	// measured on the lanes at the load the relays report.
	cat := settle(ctx, base, router, o.dataCenters, 2*time.Second)
	rep := &replay.Report{Policy: replay.CacheAware.String(), DataCenters: o.dataCenters, RanksPerDC: fleet.Ranks(),
		BlocksPerRank: o.blocksPerRank, ExpectedBlocks: expected, BucketCount: format.BucketCount,
		Events: events, EventBlocks: eventBlocks, WallSeconds: wall.Seconds(),
		// Behind HTTP the demo sees neither the pools' exact state and
		// memory nor the deltas' publication.
		Unmeasured: []string{"deltas", "images", "frame_bytes", "trace_seconds", "capacity_omissions",
			"freshness_p50_ms", "freshness_p99_ms", "delivery_p50_ns", "delivery_p99_ns",
			"producer_bytes_per_block", "exact_state_bytes_per_block", "producer_bytes"}}
	loads := make([]float64, o.dataCenters)
	fprOK := true
	for d := range o.dataCenters {
		p := cat.pool(fmt.Sprintf("dc-%d", d))
		if p == nil || p.Stats == nil {
			fprOK = false
			break
		}
		loads[d] = p.Stats.Occupancy
		rep.TrackedBlocks += uint64(p.Stats.UniqueBlocks)
	}
	if fprOK {
		fprOK = scorer.ProbeFPR(router.Contains, loads, o.fprProbes, o.seed) == nil
	}
	if !fprOK { // a relay or a lane did not answer (the demo was interrupted)
		rep.Unmeasured = append(rep.Unmeasured, "filter_load", "fpr", "fpr_bound", "fpr_ratio", "tracked_blocks")
	}
	scorer.Fill(rep)
	if rep.RequestBlocks > 0 {
		rep.RankHitRatePct = 100 * float64(rankHits) / float64(rep.RequestBlocks)
	}
	if s := wall.Seconds(); s > 0 {
		rep.EventsPerSec = float64(events) / s
		rep.BlocksPerSec = float64(eventBlocks) / s
	}
	for d := range o.dataCenters {
		rep.HeldBlocks += uint64(fleet.HeldBlocks(d))
	}
	laneInfo := make([]client.LaneInfo, o.dataCenters)
	for d := range laneInfo {
		laneInfo[d] = router.Lane(d)
	}
	stop() // the lanes are ours alone from here
	if b, ok := consumerBytes(lanes); ok {
		rep.ConsumerBytes = b
	} else {
		rep.Unmeasured = append(rep.Unmeasured, "consumer_bytes")
	}

	fmt.Fprintf(stdout, "\nsummary after %d requests (%d events, %d blocks) against the fleet's exact ground truth\n",
		rep.Requests, rep.Events, rep.EventBlocks)
	for d, li := range laneInfo {
		fmt.Fprintf(stdout, "  lane %d (%s)  sequence %d  resubscribes %d  staleness %v\n", d, li.Pool, li.Sequence, li.Resubscribes, li.Staleness.Round(time.Millisecond))
	}
	if rep.LanesNotReady > 0 {
		fmt.Fprintf(stdout, "  %d lane answers missing (lane not ready), not scored\n", rep.LanesNotReady)
	}
	if err := replay.WriteTable(stdout, rep); err != nil {
		return rep, err
	}
	return rep, nil
}

// consumerBytes returns the consumer's table size, when the consumer tells.
// Call it only with the router stopped: the router serializes lane calls.
func consumerBytes(l client.Lanes) (uint64, bool) {
	switch c := l.(type) {
	case *client.Native:
		return c.C.Stats().TableBytes, true
	case interface {
		Stats() (consumer.Stats, error)
	}:
		st, err := c.Stats()
		return st.TableBytes, err == nil
	}
	return 0, false
}

// catalog is the part of GET /v1/pools the demo reads.
type catalog struct {
	Pools []catalogPool `json:"pools"`
}

type catalogPool struct {
	Name  string                    `json:"name"`
	Hub   struct{ Sequence uint64 } `json:"hub"`
	Stats *struct {
		UniqueBlocks int     `json:"unique_blocks"`
		Occupancy    float64 `json:"filter_occupancy"`
	} `json:"stats"`
}

// pool returns the named pool's entry, or nil.
func (c *catalog) pool(name string) *catalogPool {
	for i := range c.Pools {
		if c.Pools[i].Name == name {
			return &c.Pools[i]
		}
	}
	return nil
}

// fetchCatalog reads the relay's catalog; an unreachable relay reads as an
// empty catalog (the per-second line then shows zeros rather than stopping).
func fetchCatalog(ctx context.Context, base string) catalog {
	var cat catalog
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/pools", nil)
	if err != nil {
		return cat
	}
	if resp, err := http.DefaultClient.Do(req); err == nil {
		_ = json.NewDecoder(resp.Body).Decode(&cat)
		resp.Body.Close()
	}
	return cat
}

// settle waits, bounded by timeout, until every lane's sequence reached its
// relay's hub sequence, and returns the last catalog read. It polls: the
// router has no callback, and the demo's end is not latency sensitive.
// An interrupted demo (ctx done) reads the catalog once and does not wait.
func settle(ctx context.Context, base string, router *client.Router, dcs int, timeout time.Duration) catalog {
	deadline := time.Now().Add(timeout)
	for {
		cat := fetchCatalog(context.WithoutCancel(ctx), base)
		caughtUp := true
		for d := range dcs {
			p := cat.pool(fmt.Sprintf("dc-%d", d))
			if p == nil || router.Lane(d).Sequence < p.Hub.Sequence {
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
		seqs += p.Hub.Sequence
		if i < t.dcs {
			if ls := t.router.Lane(i).Sequence; p.Hub.Sequence > ls {
				lag += p.Hub.Sequence - ls
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

// newLanes builds the router's consumer: the WebAssembly module under wazero,
// or the native package.
func newLanes(ctx context.Context, kind string, m consumer.Manifest) (client.Lanes, func(), error) {
	if kind == "native" {
		c, err := consumer.New(m)
		if err != nil {
			return nil, nil, err
		}
		return &client.Native{C: c}, func() {}, nil
	}
	rt, err := host.NewRuntime(ctx, host.NewConfig())
	if err != nil {
		return nil, nil, fmt.Errorf("wasm runtime: %w", err)
	}
	in, err := rt.NewInstance(ctx, m)
	if err != nil {
		_ = rt.Close(context.Background())
		return nil, nil, fmt.Errorf("wasm consumer: %w", err)
	}
	return in, func() { _ = in.Close(); _ = rt.Close(context.Background()) }, nil
}

// waitReady waits, bounded by timeout, until every lane installed a snapshot.
// It polls (the router has no readiness callback) and says which lanes failed
// and why, so a demo that cannot converge ends instead of hanging silently.
func waitReady(ctx context.Context, router *client.Router, lanes int, timeout time.Duration) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		var notReady []string
		for d := range lanes {
			if li := router.Lane(d); !li.Ready {
				notReady = append(notReady, fmt.Sprintf("lane %d (%s): %s", d, li.Pool, cmpStr(li.LastError, "no snapshot yet")))
			}
		}
		if len(notReady) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline.C:
			return fmt.Errorf("router lanes not ready after %v: %s", timeout, strings.Join(notReady, "; "))
		case <-tick.C:
		}
	}
}

func cmpStr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func postEvents(ctx context.Context, c *http.Client, url string, body []byte) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	return c.Do(req)
}
