// Package demo is the `relay demo` run: three data centers (pools on one relay,
// fed over HTTP, NATS or an emulated engine's ZMQ socket), a synthetic or
// Mooncake fleet, and a router whose answers are scored against exact truth.
//
// cmd/relay calls Run; nothing here imports the command.
package demo

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/internal/sim/replay"
	"github.com/ckfrelay/ckfrelay/internal/sim/workload"
)

// demoOptions are the demo's flags.
type demoOptions struct {
	duration      time.Duration
	dataCenters   int
	workers       int
	ranks         int
	blocksPerRank int
	rate          int     // wall-clock requests per second, 0 = as fast as possible
	modelRate     float64 // synthetic arrivals per second of model time, 0 = from modelLoad
	modelLoad     float64 // share of the fleet's prefill capacity offered when modelRate is 0
	seed          uint64
	consumer      string // "wasm" or "native"
	readyTimeout  time.Duration
	trace         string // "" synthetic, "embedded", or a Mooncake-format file
	fprProbes     int
	report        string // directory for the HTML report, "" for none
	transport     string // "http", "nats" (nats.go) or "grpc" (grpc.go)
	command       string // the command line, for the report
}

// embeddedTraceFlag selects replay's embedded Mooncake trace for --trace.
const embeddedTraceFlag = "embedded"

// ErrUsage reports a bad flag; the reason has been written to stderr.
var ErrUsage = errors.New("demo: usage")

// Run parses the demo's flags from args and runs it, printing its report to
// stdout.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseDemo(args, stderr)
	if err != nil {
		return err
	}
	_, err = demo(ctx, o, stdout)
	return err
}

// parseDemo parses and checks the demo's flags; a bad one is ErrUsage, with
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
	fs.IntVar(&o.rate, "rate", 2000, "requests per second of wall clock through the relay and router (0: as fast as possible)")
	fs.Float64Var(&o.modelRate, "model-rate", 0, "synthetic requests per second of the latency model's time, a Poisson process (0: derived from --model-load)")
	fs.Float64Var(&o.modelLoad, "model-load", defaultModelLoad, "share of the modelled fleet's prefill capacity the synthetic prompts offer, when --model-rate is 0")
	fs.Uint64Var(&o.seed, "seed", 1, "workload seed (synthetic requests, serving ranks, FPR probes)")
	fs.StringVar(&o.consumer, "consumer", "wasm", "the router's consumer: wasm (the WebAssembly module under wazero) or native")
	fs.DurationVar(&o.readyTimeout, "ready-timeout", 60*time.Second, "give up if the router's lanes are not all ready within this")
	fs.StringVar(&o.trace, "trace", "", `requests from a Mooncake-format JSONL trace, in order at --rate (timestamps ignored), instead of the synthetic generator; "embedded" for the Mooncake synthetic trace`)
	fs.IntVar(&o.fprProbes, "probes", 200_000, "never-stored keys probed against every lane for the false-positive rate")
	fs.StringVar(&o.transport, "transport", "http", "how the router hears the relay: http (a stream per pool), nats (JetStream, an embedded nats-server) or grpc (Dynamo's dynamo.kvrelay.v1 contract, which the relay serves beside HTTP)")
	fs.StringVar(&o.report, "report", "", "write an HTML report with SVG plots and its JSON into this directory at the end")
	if err := fs.Parse(args); err != nil {
		return o, ErrUsage
	}
	o.command = strings.TrimSpace("relay demo " + strings.Join(args, " "))
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "demo: unexpected arguments %q\n", fs.Args())
		return o, ErrUsage
	}
	switch {
	case o.transport != "http" && o.transport != "nats" && o.transport != "grpc":
		fmt.Fprintf(stderr, "demo: --transport must be http, nats or grpc, not %q\n", o.transport)
		return o, ErrUsage
	case o.consumer != "wasm" && o.consumer != "native":
		fmt.Fprintf(stderr, "demo: --consumer must be wasm or native, not %q\n", o.consumer)
		return o, ErrUsage
	case o.dataCenters < 1 || o.dataCenters > ckf.MaxLanes:
		fmt.Fprintf(stderr, "demo: --dcs %d outside 1..%d\n", o.dataCenters, ckf.MaxLanes)
		return o, ErrUsage
	case o.duration <= 0 || o.readyTimeout <= 0 || o.rate < 0 || o.workers < 1 || o.ranks < 1 || o.blocksPerRank < 1 || o.fprProbes < 1:
		fmt.Fprintln(stderr, "demo: --duration and --ready-timeout must be > 0, --rate ≥ 0, --workers, --ranks, --blocks-per-rank, --probes ≥ 1")
		return o, ErrUsage
	case !(o.modelRate == 0 || o.modelRate >= minModelRate && o.modelRate <= maxModelRate) || !(o.modelLoad > 0 && o.modelLoad <= maxModelLoad):
		fmt.Fprintf(stderr, "demo: --model-rate must be 0 or in %g..%g requests/s, --model-load in (0, %g]\n", minModelRate, maxModelRate, maxModelLoad)
		return o, ErrUsage
	}
	if o.trace != "" {
		modelFlag := ""
		fs.Visit(func(f *flag.Flag) {
			if f.Name == "model-rate" || f.Name == "model-load" {
				modelFlag = f.Name
			}
		})
		if modelFlag != "" {
			fmt.Fprintf(stderr, "demo: --%s applies to the synthetic workload; a trace's requests arrive at its timestamps\n", modelFlag)
			return o, ErrUsage
		}
	}
	return o, nil
}

// requestSource yields the demo's requests and their arrival times in the
// latency model: the synthetic generator with Poisson arrivals (never ends)
// or a trace at its timestamps (ends after its last request).
type requestSource struct {
	name     string
	arrivals string // how requests arrive in the latency model
	gen      *workload.Synthetic
	poisson  *poissonArrivals
	trace    []workload.Request
	next     int
}

func newRequestSource(o demoOptions) (*requestSource, error) {
	const atTimestamps = "at the trace's timestamps"
	switch o.trace {
	case "":
		rate, why := o.arrivalRate()
		return &requestSource{name: "synthetic workload", gen: workload.NewSynthetic(o.syntheticConfig()),
			poisson:  newPoissonArrivals(rate, o.seed),
			arrivals: fmt.Sprintf("Poisson at %.2f req/s (%s)", rate, why)}, nil
	case embeddedTraceFlag:
		reqs, err := replay.EmbeddedTrace()
		return &requestSource{name: replay.EmbeddedTraceName, trace: reqs, arrivals: atTimestamps}, err
	default:
		reqs, err := replay.LoadTrace(o.trace) // a *workload.TraceError names the line
		return &requestSource{name: o.trace, trace: reqs, arrivals: atTimestamps}, err
	}
}

// Next returns the next request and its arrival time in the latency model,
// or false when a trace is exhausted.
func (s *requestSource) Next() (workload.Request, time.Duration, bool) {
	if s.gen != nil {
		return s.gen.Next(), s.poisson.next(), true
	}
	if s.next >= len(s.trace) {
		return workload.Request{}, 0, false
	}
	s.next++
	req := s.trace[s.next-1]
	return req, time.Duration(req.TimestampMs) * time.Millisecond, true
}

// demo runs the demo and prints its progress and summary to stdout. It
// returns the summary's report (nil with an error before the first request).
//
// The pieces, each in its own file: the relay and its pools (demo_relay.go),
// the router with a lane per data center (demo_router.go), how a data
// center's events reach its pool (demo_feed.go: the seam for other
// transports), the request loop (demo_loop.go) and the summary
// (demo_report.go).
func demo(ctx context.Context, o demoOptions, stdout io.Writer) (*replay.Report, error) {
	src, err := newRequestSource(o)
	if err != nil {
		return nil, err
	}
	feeds, err := newFeeds(o, stdout)
	if err != nil {
		return nil, err
	}
	defer closeFeeds(feeds)
	relay, err := startDemoRelay(o, feeds)
	if err != nil {
		return nil, err
	}
	defer relay.close()
	if err := openFeeds(ctx, feeds, relay.base); err != nil {
		return nil, err
	}
	relayAddr := relay.base
	if relay.grpc != "" {
		relayAddr += " (gRPC " + relay.grpc + ")"
	}
	fmt.Fprintf(stdout, "ckfrelay demo: %d data centers × %d workers × %d ranks, %d blocks per rank; relay %s; %d buckets per pool; %s consumer; %s; router over %s\n",
		o.dataCenters, o.workers, o.ranks, o.blocksPerRank, relayAddr, relay.format.BucketCount, o.consumer, src.name, o.transport)
	router, err := startDemoRouter(ctx, o, relay)
	if err != nil {
		return nil, err
	}
	defer router.stop()

	loop, err := newDemoLoop(o, relay, router, feeds, stdout, src.arrivals)
	if err != nil {
		return nil, err
	}
	if err := loop.run(ctx, src); err != nil {
		return nil, err
	}
	rep := loop.report(ctx)
	if err := printSummary(stdout, rep, router.laneInfo, router.grpc, &loop.model); err != nil {
		return rep, err
	}
	if o.report != "" {
		return rep, writeDemoReport(stdout, o, src.name+"; latency model arrivals "+src.arrivals, rep)
	}
	return rep, nil
}
