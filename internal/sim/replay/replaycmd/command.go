// Package replaycmd is the `relay replay` command: it parses the flags,
// loads the trace, replays it once per routing policy through
// internal/sim/replay, shows progress (a bar on a terminal, a line per second
// otherwise) and writes the table, the JSON or the HTML report
// (internal/sim/replay/report). It lives beside the harness rather than in it
// because the report package imports the harness.
package replaycmd

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/ckfrelay/ckfrelay/internal/sim/replay"
)

// replayOptions are the replay command's flags beyond replay.Config.
type replayOptions struct {
	cfg      replay.Config
	runs     []replayRun
	trace    string
	repeat   int
	json     bool
	consumer string
	report   string // directory for the HTML report, "" for none
}

// replayRun is one replay of the trace: a policy, with the router's answers
// from the filter or the exact index.
type replayRun struct {
	policy replay.Policy
	exact  bool
}

func (r replayRun) String() string {
	if r.exact {
		return r.policy.String() + exactSuffix
	}
	return r.policy.String()
}

// exactSuffix marks a --policy name whose router answers from the exact index.
const exactSuffix = "-exact"

// ErrUsage is returned when the flags are invalid; the message has been
// written to stderr already, and the command exits 2.
var ErrUsage = errors.New("replay: usage")

// Run is `relay replay`: it parses args, validates every run's configuration
// before loading anything, and replays the trace.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("replay", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, `usage: relay replay [flags]

Replays a Mooncake-format request trace through D simulated data centers (one
relay pool each) and a router consumer with one lane per data center, and
scores every routing answer against the exact ground truth.

`)
		fs.PrintDefaults()
	}
	o := replayOptions{cfg: replay.DefaultConfig()}
	c := &o.cfg
	fs.IntVar(&c.DataCenters, "dcs", c.DataCenters, "data centers (pools / router lanes), 1..16")
	fs.IntVar(&c.WorkersPerDC, "workers", c.WorkersPerDC, "workers per data center")
	fs.IntVar(&c.RanksPerWorker, "ranks", c.RanksPerWorker, "dp ranks per worker")
	fs.IntVar(&c.BlocksPerRank, "blocks-per-rank", c.BlocksPerRank, "KV cache capacity of one rank, in blocks (LRU)")
	fs.Uint64Var(&c.ExpectedBlocks, "expected-blocks", 0, "filter size per pool in blocks (0: one data center's capacity)")
	policy := fs.String("policy", "cache-aware,random", "routing policies to run, comma-separated: cache-aware, affinity, load-only, random, round-robin, a name with -exact (the router answers from the exact index), or all (every policy and cache-aware-exact)")
	fs.BoolVar(&c.Exact, "exact", false, "answer every run's queries from the exact index instead of the filter (agreement must be 100%)")
	l, rt := &c.Latency, &c.Routing
	fs.DurationVar(&l.RTT, "rtt", l.RTT, "round trip between two data centers (latency model)")
	rttMatrix := fs.String("rtt-matrix", "", `round trips [origin][serving] as rows of durations, e.g. "0,20ms;20ms,0" (overrides --rtt)`)
	fs.Float64Var(&l.PrefillTokensPerSec, "prefill-tps", l.PrefillTokensPerSec, "one rank's prefill throughput, tokens/s (latency model)")
	fs.Float64Var(&l.DecodeTokensPerSec, "decode-tps", l.DecodeTokensPerSec, "one request's decode speed, tokens/s (latency model)")
	fs.IntVar(&l.BlockTokens, "block-tokens", l.BlockTokens, "tokens per trace block")
	fs.Float64Var(&rt.OverlapWeight, "overlap-weight", rt.OverlapWeight, "cache-aware cost: weight of prefill blocks (Dynamo kv_overlap_score_weight)")
	fs.Float64Var(&rt.Temperature, "temperature", rt.Temperature, "cache-aware cost: softmax temperature, 0 picks the lowest cost (Dynamo router_temperature)")
	fs.IntVar(&rt.BalanceAbs, "balance-abs", rt.BalanceAbs, "load guard: least-loaded rank when max-min active requests exceed this (SGLang balance_abs_threshold; < 0 off)")
	fs.Float64Var(&rt.BalanceRel, "balance-rel", rt.BalanceRel, "load guard: and max exceeds this × min (SGLang balance_rel_threshold)")
	fs.StringVar(&o.report, "report", "", "write an HTML report with SVG plots and its JSON into this directory")
	fs.Float64Var(&c.Speed, "speed", 0, "trace clock scale: 0 as fast as possible, 1 trace speed, 2 twice as fast")
	fs.DurationVar(&c.Lag, "lag", 0, "relay-to-router propagation delay of each delta, in trace time")
	fs.Uint64Var(&c.PublishEveryNEvents, "publish-every", c.PublishEveryNEvents, "pool publication cadence, in events")
	fs.DurationVar(&c.PublicationDelay, "publication-delay", c.PublicationDelay, "pool publication timer, in trace time")
	fs.Uint64Var(&c.Seed, "seed", c.Seed, "seed of the random policy and the FPR probes")
	fs.IntVar(&c.FPRProbes, "probes", 0, "never-stored keys probed per lane set for the FPR (0: 16M lane probes)")
	fs.StringVar(&o.trace, "trace", "", "Mooncake-format JSONL trace (default: the embedded Mooncake synthetic trace)")
	fs.IntVar(&o.repeat, "repeat", 1, "play the trace this many times, each pass with fresh block ids (scale)")
	fs.BoolVar(&o.json, "json", false, "print the reports as JSON on stdout (progress goes to stderr)")
	fs.StringVar(&o.consumer, "consumer", "native", "the router's consumer: native or wasm (the WebAssembly module under wazero)")
	if err := fs.Parse(args); err != nil {
		return ErrUsage
	}
	bad := func(format string, a ...any) error {
		fmt.Fprintf(stderr, "replay: "+format+"\n", a...)
		return ErrUsage
	}
	if fs.NArg() > 0 {
		return bad("unexpected argument %q", fs.Arg(0))
	}
	if o.consumer != "native" && o.consumer != "wasm" {
		return bad("--consumer must be native or wasm, not %q", o.consumer)
	}
	if o.repeat < 1 {
		return bad("--repeat must be ≥ 1, not %d", o.repeat)
	}
	var err error
	if o.runs, err = parseRuns(*policy, c.Exact); err != nil {
		return bad("%v", err)
	}
	if *rttMatrix != "" {
		if l.RTTMatrix, err = parseRTTMatrix(*rttMatrix); err != nil {
			return bad("--rtt-matrix: %v", err)
		}
	}
	// Validate before loading anything, so a bad flag is a usage error.
	for _, r := range o.runs {
		c.Policy = r.policy
		if err := c.Validate(); err != nil {
			return bad("%v", err)
		}
	}
	return replayMain(ctx, o, args, stdout, stderr)
}

// parseRuns parses --policy: names, each optionally with -exact, or all.
// With --exact every run answers from the exact index.
func parseRuns(s string, exact bool) ([]replayRun, error) {
	var out []replayRun
	add := func(r replayRun) {
		r.exact = r.exact || exact
		if !slices.Contains(out, r) {
			out = append(out, r)
		}
	}
	if strings.TrimSpace(s) == "all" {
		add(replayRun{policy: replay.CacheAware})
		add(replayRun{policy: replay.CacheAware, exact: true})
		for _, p := range replay.Policies()[1:] {
			add(replayRun{policy: p})
		}
		return out, nil
	}
	for _, name := range strings.Split(s, ",") {
		name = strings.TrimSpace(name)
		base, isExact := strings.CutSuffix(name, exactSuffix)
		p, err := replay.ParsePolicy(base)
		if err != nil {
			return nil, err
		}
		add(replayRun{policy: p, exact: isExact})
	}
	return out, nil
}

// parseRTTMatrix parses rows separated by ";" of durations separated by ","
// ("0" alone is allowed for zero).
func parseRTTMatrix(s string) ([][]time.Duration, error) {
	var m [][]time.Duration
	for _, row := range strings.Split(s, ";") {
		var r []time.Duration
		for _, f := range strings.Split(row, ",") {
			f = strings.TrimSpace(f)
			if f == "0" {
				r = append(r, 0)
				continue
			}
			d, err := time.ParseDuration(f)
			if err != nil {
				return nil, err
			}
			r = append(r, d)
		}
		m = append(m, r)
	}
	return m, nil
}
