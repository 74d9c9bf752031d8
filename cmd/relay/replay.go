package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/ckfrelay/ckfrelay/client"
	"github.com/ckfrelay/ckfrelay/consumer"
	"github.com/ckfrelay/ckfrelay/internal/replay"
	"github.com/ckfrelay/ckfrelay/internal/workload"
	"github.com/ckfrelay/ckfrelay/wasm/host"
)

// replayOptions are the replay command's flags beyond replay.Config.
type replayOptions struct {
	cfg      replay.Config
	policies []replay.Policy
	trace    string
	repeat   int
	json     bool
	consumer string
}

func runReplay(ctx context.Context, args []string, stdout, stderr io.Writer) error {
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
	policy := fs.String("policy", "cache-aware,random", "routing policies to run, comma-separated: cache-aware, random, round-robin, or all")
	fs.BoolVar(&c.Exact, "exact", false, "answer queries from the exact index instead of the filter (agreement must be 100%)")
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
		return errUsage
	}
	bad := func(format string, a ...any) error {
		fmt.Fprintf(stderr, "replay: "+format+"\n", a...)
		return errUsage
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
	if o.policies, err = parsePolicies(*policy); err != nil {
		return bad("%v", err)
	}
	// Validate before loading anything, so a bad flag is a usage error.
	for _, p := range o.policies {
		c.Policy = p
		if err := c.Validate(); err != nil {
			return bad("%v", err)
		}
	}
	return replayMain(ctx, o, stdout, stderr)
}

func parsePolicies(s string) ([]replay.Policy, error) {
	if strings.TrimSpace(s) == "all" {
		return []replay.Policy{replay.CacheAware, replay.Random, replay.RoundRobin}, nil
	}
	var out []replay.Policy
	for _, name := range strings.Split(s, ",") {
		p, err := replay.ParsePolicy(name)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

func replayMain(ctx context.Context, o replayOptions, stdout, stderr io.Writer) error {
	var reqs []workload.Request
	var err error
	name := replay.EmbeddedTraceName
	if o.trace != "" {
		name = o.trace
		reqs, err = replay.LoadTrace(o.trace)
	} else {
		reqs, err = replay.EmbeddedTrace()
	}
	if err != nil {
		return err // a *workload.TraceError names the line
	}
	reqs = replay.Repeat(reqs, o.repeat)

	if o.consumer == "wasm" {
		rt, err := host.NewRuntime(ctx, host.NewConfig())
		if err != nil {
			return fmt.Errorf("wasm runtime: %w", err)
		}
		defer rt.Close(context.Background())
		var inst *host.Instance
		defer func() {
			if inst != nil {
				inst.Close()
			}
		}()
		o.cfg.NewConsumer = func(m consumer.Manifest) (client.Lanes, error) {
			if inst != nil { // one policy's instance at a time
				inst.Close()
			}
			inst, err = rt.NewInstance(ctx, m)
			return inst, err
		}
	}
	progressOut := stdout
	if o.json {
		progressOut = stderr
	}
	fmt.Fprintf(progressOut, "ckfrelay replay: %s, %d requests; %d data centers × %d workers × %d ranks × %d blocks; %s consumer%s\n",
		name, len(reqs), o.cfg.DataCenters, o.cfg.WorkersPerDC, o.cfg.RanksPerWorker, o.cfg.BlocksPerRank, o.consumer,
		map[bool]string{true: "; exact index", false: ""}[o.cfg.Exact])
	var reports []*replay.Report
	for _, p := range o.policies {
		cfg := o.cfg
		cfg.Policy = p
		cfg.Progress = func(pr replay.Progress) {
			fmt.Fprintf(progressOut, "[%s] t=%4.0fs  trace %6.0fs  requests %8d  events/s %8.0f  blocks/s %9.0f  agreement %7.3f%%  in-flight %4d  query p50 %v p99 %v\n",
				p, pr.Elapsed.Seconds(), pr.TraceTime.Seconds(), pr.Requests, pr.EventsPerSec, pr.BlocksPerSec,
				pr.AgreementPct, pr.InFlight, pr.QueryP50, pr.QueryP99)
		}
		r, err := replay.Run(ctx, cfg, reqs)
		if err != nil {
			if errors.Is(err, replay.ErrInvariant) {
				return fmt.Errorf("%s: %w (a bug: please report it)", p, err)
			}
			return fmt.Errorf("%s: %w", p, err)
		}
		reports = append(reports, r)
	}
	if o.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(struct {
			Trace    string           `json:"trace"`
			Consumer string           `json:"consumer"`
			Reports  []*replay.Report `json:"reports"`
		}{name, o.consumer, reports})
	}
	return replay.WriteTable(stdout, reports...)
}
