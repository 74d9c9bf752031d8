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
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/client"
	"github.com/ckfrelay/ckfrelay/consumer"
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
}

func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o demoOptions
	fs.DurationVar(&o.duration, "duration", 20*time.Second, "how long to run")
	fs.IntVar(&o.dataCenters, "dcs", 3, "data centers (pools / router lanes), 1..16")
	fs.IntVar(&o.workers, "workers", 4, "workers per data center")
	fs.IntVar(&o.ranks, "ranks", 2, "dp ranks per worker")
	fs.IntVar(&o.blocksPerRank, "blocks-per-rank", 2048, "KV cache capacity of one rank, in blocks")
	fs.IntVar(&o.rate, "rate", 2000, "requests per second (0: as fast as possible)")
	fs.Uint64Var(&o.seed, "seed", 1, "workload seed")
	fs.StringVar(&o.consumer, "consumer", "wasm", "the router's consumer: wasm (the WebAssembly module under wazero) or native")
	fs.DurationVar(&o.readyTimeout, "ready-timeout", 60*time.Second, "give up if the router's lanes are not all ready within this")
	if err := fs.Parse(args); err != nil {
		return errUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "demo: unexpected arguments %q\n", fs.Args())
		return errUsage
	}
	switch {
	case o.consumer != "wasm" && o.consumer != "native":
		fmt.Fprintf(stderr, "demo: --consumer must be wasm or native, not %q\n", o.consumer)
		return errUsage
	case o.dataCenters < 1 || o.dataCenters > ckf.MaxLanes:
		fmt.Fprintf(stderr, "demo: --dcs %d outside 1..%d\n", o.dataCenters, ckf.MaxLanes)
		return errUsage
	case o.duration <= 0 || o.readyTimeout <= 0 || o.rate < 0 || o.workers < 1 || o.ranks < 1 || o.blocksPerRank < 1:
		fmt.Fprintln(stderr, "demo: --duration and --ready-timeout must be > 0, --rate ≥ 0, --workers, --ranks, --blocks-per-rank ≥ 1")
		return errUsage
	}
	return demo(ctx, o, stdout)
}

// demoStats accumulates the demo's measurements.
type demoStats struct {
	requests, events, blocks  uint64
	agree, compared           uint64
	overReports, underReports uint64
	overBlocks, underBlocks   uint64
	queryNanos                []int64
	cacheHitBlocks, reqBlocks uint64
}

func demo(ctx context.Context, o demoOptions, stdout io.Writer) error {
	fleet, err := workload.NewFleet(workload.FleetConfig{DataCenters: o.dataCenters, WorkersPerDC: o.workers,
		RanksPerWorker: o.ranks, BlocksPerRank: o.blocksPerRank})
	if err != nil {
		return err
	}
	expected := uint64(o.workers * o.ranks * o.blocksPerRank)
	cfg := server.Config{Listen: "127.0.0.1:0", HeartbeatInterval: server.Duration(200 * time.Millisecond)}
	for d := range o.dataCenters {
		cfg.Pools = append(cfg.Pools, server.PoolSpec{Name: fmt.Sprintf("dc-%d", d), DCID: uint64(d + 1),
			ExpectedBlocks: expected, PublishEveryNEvents: 16})
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	srv, err := server.New(cfg, quiet)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
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
	fmt.Fprintf(stdout, "ckfrelay demo: %d data centers × %d workers × %d ranks, %d blocks per rank; relay %s; %d buckets per pool; %s consumer\n",
		o.dataCenters, o.workers, o.ranks, o.blocksPerRank, base, format.BucketCount, o.consumer)
	lanes, closeLanes, err := newLanes(ctx, o.consumer, m)
	if err != nil {
		return err
	}
	defer closeLanes()
	router, err := client.New(client.Config{RelayURL: base, ConsumerInstance: 77, Targets: targets,
		IdleTimeout: 5 * time.Second}, lanes)
	if err != nil {
		return err
	}
	rctx, stopRouter := context.WithCancel(ctx)
	routerDone := make(chan struct{})
	go func() {
		defer close(routerDone)
		_ = router.Run(rctx)
	}()
	defer func() { stopRouter(); <-routerDone }()

	if err := waitReady(ctx, router, o.dataCenters, o.readyTimeout); err != nil {
		return err
	}

	gen := workload.NewSynthetic(workload.SyntheticConfig{SystemPrompts: 64, PromptBlocks: 8, ZipfS: 1.2,
		Conversations: 256 * o.dataCenters, TurnBlocks: 4, MaxTurns: 8, ContinueChance: 0.7, Seed: o.seed})
	rng := rand.New(rand.NewPCG(o.seed, 99))
	load := make([]int, o.dataCenters)
	var st demoStats
	var res consumer.QueryResult
	var events []ckf.RouterEvent
	var body []byte
	httpc := &http.Client{Timeout: 10 * time.Second}
	start := time.Now()
	nextTick := start.Add(time.Second)
	var last demoStats
	var interval time.Duration
	if o.rate > 0 {
		interval = time.Second / time.Duration(o.rate)
	}
	deadline := start.Add(o.duration)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		req := gen.Next()
		chain := workload.Chain(req.HashIDs)
		locals := make([]uint64, len(req.HashIDs))
		for i, id := range req.HashIDs {
			locals[i] = workload.TokensHash(id)
		}
		t0 := time.Now()
		qerr := router.QuerySequenceHashes(chain, &res)
		st.queryNanos = append(st.queryNanos, time.Since(t0).Nanoseconds())

		// Route: deepest reported prefix, ties to the least loaded DC.
		best, bestDepth := 0, -1
		for d := range o.dataCenters {
			depth := -1
			if qerr == nil && res.Mask&(1<<d) != 0 {
				depth = int(res.Depths[d])
			}
			if depth > bestDepth || (depth == bestDepth && load[d] < load[best]) {
				best, bestDepth = d, depth
			}
		}
		// Compare against the exact ground truth of every DC.
		truthBest, truthDepth := 0, -1
		for d := range o.dataCenters {
			truth := fleet.Depth(d, chain)
			if truth > truthDepth {
				truthBest, truthDepth = d, truth
			}
			if qerr == nil && res.Mask&(1<<d) != 0 {
				got := int(res.Depths[d])
				if got > truth {
					st.overReports++
					st.overBlocks += uint64(got - truth)
				} else if got < truth {
					st.underReports++
					st.underBlocks += uint64(truth - got)
				}
			}
		}
		st.compared++
		if fleet.Depth(best, chain) == truthDepth {
			st.agree++
		}
		_ = truthBest
		st.cacheHitBlocks += uint64(fleet.Depth(best, chain))
		st.reqBlocks += uint64(len(chain))

		r := rng.IntN(fleet.Ranks())
		load[best]++
		events = fleet.Serve(events[:0], best, r, chain, locals)
		if len(events) > 0 {
			body, _ = wire.AppendRouterEventsJSON(body[:0], events)
			resp, err := postEvents(ctx, httpc, fmt.Sprintf("%s/v1/pools/dc-%d/events?source_epoch=1", base, best), body)
			if ctx.Err() != nil {
				break // interrupted: still print the summary
			}
			if err != nil {
				return err
			}
			if resp.StatusCode != http.StatusAccepted {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				return fmt.Errorf("relay refused events: %s %s", resp.Status, b)
			}
			resp.Body.Close()
			for i := range events {
				st.events++
				st.blocks += uint64(events[i].BlockCount())
			}
		}
		st.requests++
		if now := time.Now(); now.After(nextTick) {
			printTick(stdout, base, now.Sub(start), &st, &last, router, o.dataCenters)
			nextTick = nextTick.Add(time.Second)
		}
		if interval > 0 {
			if wait := time.Until(start.Add(time.Duration(st.requests) * interval)); wait > 0 {
				time.Sleep(wait)
			}
		}
	}
	printSummary(stdout, &st, fleet, router, o, format)
	return nil
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

func percentile(ns []int64, p float64) time.Duration {
	if len(ns) == 0 {
		return 0
	}
	s := slices.Clone(ns)
	slices.Sort(s)
	return time.Duration(s[min(len(s)-1, int(p*float64(len(s))))])
}

type catalog struct {
	Pools []struct {
		Name  string                    `json:"name"`
		Hub   struct{ Sequence uint64 } `json:"hub"`
		Stats *struct {
			UniqueBlocks int     `json:"unique_blocks"`
			Occupancy    float64 `json:"filter_occupancy"`
		} `json:"stats"`
	} `json:"pools"`
}

var tickMu sync.Mutex

func printTick(w io.Writer, base string, elapsed time.Duration, st, last *demoStats, router *client.Router, dcs int) {
	tickMu.Lock()
	defer tickMu.Unlock()
	var cat catalog
	if resp, err := (&http.Client{Timeout: 5 * time.Second}).Get(base + "/v1/pools"); err == nil {
		_ = json.NewDecoder(resp.Body).Decode(&cat)
		resp.Body.Close()
	}
	tracked, occ, seqs := 0, 0.0, uint64(0)
	lag := uint64(0)
	for i, p := range cat.Pools {
		if p.Stats != nil {
			tracked += p.Stats.UniqueBlocks
			occ += p.Stats.Occupancy / float64(len(cat.Pools))
		}
		seqs += p.Hub.Sequence
		if i < dcs {
			if ls := router.Lane(i).Sequence; p.Hub.Sequence > ls {
				lag += p.Hub.Sequence - ls
			}
		}
	}
	recent := st.queryNanos[len(last.queryNanos):]
	fmt.Fprintf(w, "t=%3.0fs  events/s %6d  blocks/s %7d  tracked %7d  filter load %5.1f%%  deltas/s %5d  router lag %3d deltas  query p50 %v p99 %v\n",
		elapsed.Seconds(), st.events-last.events, st.blocks-last.blocks, tracked, 100*occ,
		seqs-last.compared, lag, percentile(recent, 0.5), percentile(recent, 0.99))
	*last = demoStats{events: st.events, blocks: st.blocks, compared: seqs, queryNanos: st.queryNanos}
}

func printSummary(w io.Writer, st *demoStats, fleet *workload.Fleet, router *client.Router, o demoOptions, format ckf.Format) {
	// Measured false-positive rate: probe keys no one stored against every lane.
	rng := rand.New(rand.NewPCG(o.seed^0xABCDEF, 7))
	const probes = 200_000
	hits := 0
	for range probes {
		mask, err := router.Contains(rng.Uint64() | 1<<63)
		if err == nil {
			for d := range o.dataCenters {
				if mask&(1<<d) != 0 {
					hits++
				}
			}
		}
	}
	fpr := float64(hits) / float64(probes*o.dataCenters)
	held := 0
	for d := range o.dataCenters {
		held += fleet.HeldBlocks(d)
	}
	load := float64(held) / float64(o.dataCenters) / float64(4*format.BucketCount)
	bound := 2 * 4 * load / 65535 // two buckets × four slots × load, 16-bit fingerprints
	pct := func(a, b uint64) float64 {
		if b == 0 {
			return 0
		}
		return 100 * float64(a) / float64(b)
	}
	fmt.Fprintf(w, "\nsummary after %d requests (%d events, %d blocks)\n", st.requests, st.events, st.blocks)
	fmt.Fprintf(w, "  best-DC agreement        %.2f%% (%d of %d)\n", pct(st.agree, st.compared), st.agree, st.compared)
	fmt.Fprintf(w, "  depth over-reports       %d lanes, %d blocks\n", st.overReports, st.overBlocks)
	fmt.Fprintf(w, "  depth under-reports      %d lanes, %d blocks (in-flight deltas at query time)\n", st.underReports, st.underBlocks)
	fmt.Fprintf(w, "  cache hit rate           %.1f%% of request blocks were cached where routed\n", pct(st.cacheHitBlocks, st.reqBlocks))
	fmt.Fprintf(w, "  false-positive rate      %.5f%% measured, %.5f%% theoretical at %.1f%% load\n", 100*fpr, 100*bound, 100*load)
	fmt.Fprintf(w, "  query latency            p50 %v  p99 %v\n", percentile(st.queryNanos, 0.5), percentile(st.queryNanos, 0.99))
	for d := range o.dataCenters {
		li := router.Lane(d)
		fmt.Fprintf(w, "  lane %d (%s)  sequence %d  resubscribes %d  staleness %v\n", d, li.Pool, li.Sequence, li.Resubscribes, li.Staleness.Round(time.Millisecond))
	}
}
