package replaycmd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"

	"github.com/ckfrelay/ckfrelay/client"
	"github.com/ckfrelay/ckfrelay/consumer"
	"github.com/ckfrelay/ckfrelay/internal/sim/replay"
	"github.com/ckfrelay/ckfrelay/internal/sim/replay/report"
	"github.com/ckfrelay/ckfrelay/internal/sim/workload"
	"github.com/ckfrelay/ckfrelay/wasm/host"
)

// replayMain loads the trace and replays it once per run of o; args is the
// command line, for the report's reproduce command.
func replayMain(ctx context.Context, o replayOptions, args []string, stdout, stderr io.Writer) error {
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
	fmt.Fprintf(progressOut, "ckfrelay replay: %s, %d requests; %d data centers × %d workers × %d ranks × %d blocks; %s consumer\n",
		name, len(reqs), o.cfg.DataCenters, o.cfg.WorkersPerDC, o.cfg.RanksPerWorker, o.cfg.BlocksPerRank, o.consumer)
	var reports []*replay.Report
	for _, run := range o.runs {
		cfg := o.cfg
		cfg.Policy, cfg.Exact = run.policy, run.exact
		bar := newProgress(stderr, run.String(), len(reqs))
		if bar == nil { // not a terminal: a line per second
			cfg.Progress = func(pr replay.Progress) {
				fmt.Fprintf(progressOut, "[%s] t=%4.0fs  trace %6.0fs  requests %8d  events/s %8.0f  blocks/s %9.0f  agreement %7.3f%%  in-flight %4d  query p50 %v p99 %v\n",
					run, pr.Elapsed.Seconds(), pr.TraceTime.Seconds(), pr.Requests, pr.EventsPerSec, pr.BlocksPerSec,
					pr.AgreementPct, pr.InFlight, pr.QueryP50, pr.QueryP99)
			}
		} else {
			cfg.Progress = bar.update
		}
		r, err := replay.Run(ctx, cfg, reqs)
		bar.finish()
		if err != nil {
			if errors.Is(err, replay.ErrInvariant) {
				return fmt.Errorf("%s: %w (a bug: please report it)", run, err)
			}
			return fmt.Errorf("%s: %w", run, err)
		}
		reports = append(reports, r)
	}
	if o.report != "" {
		page := report.Page{Title: "ckfrelay replay", Trace: name, Command: "relay replay " + strings.Join(args, " "),
			Reports: reports, Sweep: replay.TradeOff(o.cfg.Latency, o.cfg.Routing, replay.DefaultSweepRTTs, replay.DefaultSweepPrompts)}
		if err := report.Write(o.report, page); err != nil {
			return err
		}
		fmt.Fprintf(progressOut, "report: %s\n", filepath.Join(o.report, report.IndexFile))
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
