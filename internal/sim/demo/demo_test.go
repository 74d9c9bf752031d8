package demo

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/internal/sim/replay"
	"github.com/ckfrelay/ckfrelay/internal/sim/replay/report"
	"github.com/ckfrelay/ckfrelay/internal/sim/workload"
)

// runDemoReport runs the demo with args and returns its report and output.
func runDemoReport(t *testing.T, args ...string) (*replay.Report, string) {
	t.Helper()
	o, err := parseDemo(args, io.Discard)
	require.NoError(t, err, "parseDemo(%q)", args)
	var out bytes.Buffer
	rep, err := demo(context.Background(), o, &out)
	require.NoError(t, err, "demo(%q): %v\n%s", args, err, out.String())
	return rep, out.String()
}

// checkSummary asserts the demo's summary is the replay table of a report
// the shared replay.Scorer filled: agreement, over/under and FPR rows with
// values, consistent counts, and an unclassified (not a falsely explained)
// under-report row.
func checkSummary(t *testing.T, rep *replay.Report, out string, dcs int) {
	t.Helper()
	var table bytes.Buffer
	require.NoError(t, replay.WriteTable(&table, rep))
	assert.Contains(t, out, table.String(), "demo output does not end in the replay table of its report:\n%s\nwant:\n%s", out, table.String())
	require.NotEqual(t, uint64(0), rep.Requests, "got %d requests, %d blocks; want some", rep.Requests, rep.RequestBlocks)
	require.NotEqual(t, uint64(0), rep.RequestBlocks, "got %d requests, %d blocks; want some", rep.Requests, rep.RequestBlocks)
	assert.Equal(t, rep.Requests*uint64(dcs), rep.Lanes+rep.LanesNotReady, "got %d lanes compared + %d not ready, want %d × %d", rep.Lanes, rep.LanesNotReady, rep.Requests, dcs)
	assert.False(t, rep.Agree > rep.Requests || rep.WarmAgree > rep.WarmRequests || rep.HitBlocks > rep.RequestBlocks, "inconsistent counts: agree %d/%d, warm %d/%d, hits %d/%d", rep.Agree, rep.Requests, rep.WarmAgree, rep.WarmRequests, rep.HitBlocks, rep.RequestBlocks)
	assert.False(t, !rep.Unclassified || rep.UnexplainedUnderReports != 0 || rep.UnderCapacity != 0, "got unclassified %v (unexplained %d, capacity %d), want unclassified reports: the demo cannot see the pools", rep.Unclassified, rep.UnexplainedUnderReports, rep.UnderCapacity)
	assert.False(t, rep.FPRProbes != 20_000 || rep.FPRBound <= 0 || rep.FilterLoad <= 0, "got %d FPR probes, bound %v at load %v; want 20000 probes at a measured load", rep.FPRProbes, rep.FPRBound, rep.FilterLoad)
	assert.False(t, rep.DeliveryP50Ns <= 0 || rep.DeliveryP99Ns < rep.DeliveryP50Ns, "got delivery p50 %d ns, p99 %d ns; want a measured delivery time", rep.DeliveryP50Ns, rep.DeliveryP99Ns)
	for _, row := range []string{"best-DC agreement", "over-reports (lanes, blocks)", "under-reports (lanes, blocks)", "false-positive rate", "delivery p50 / p99 (wall)"} {
		i := strings.Index(out, "\n"+row)
		if !assert.GreaterOrEqual(t, i, 0, "summary lacks the %q row:\n%s", row, out) {
			continue
		}
		line, _, _ := strings.Cut(out[i+1:], "\n")
		assert.False(t, strings.Contains(line, "n/a"), "row %q is not measured: %q", row, line)
	}
}

func TestDemo_SummaryIsTheReplayReport(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the demo for a second")
	}
	rep, out := runDemoReport(t, "--duration", "1s", "--consumer", "native", "--rate", "1000", "--probes", "20000")
	checkSummary(t, rep, out, 3)
	assert.Contains(t, out, "synthetic workload", "header does not name the synthetic workload:\n%s", out)
}

// The demo's default run (what `make run` runs, shortened) offers its latency
// model a load the modelled fleet serves, whatever the wall-clock loop's
// pace: the model's median TTFT stays within a small multiple of the
// uncontended service time of the median request (its whole prompt
// prefilled on an idle rank across a data-center round trip), queueing does
// not dominate it, and the summary says the load the model ran at. Tied to
// the wall clock, the model saw ≈ 2,000 requests a second against ≈ 19 it
// can serve, and its median TTFT was minutes of queueing.
func TestDemo_DefaultRunModelsAServableLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the demo for a second")
	}
	rep, out := runDemoReport(t, "--duration", "1s", "--consumer", "native", "--probes", "20000")
	checkSummary(t, rep, out, 3)

	o, err := parseDemo(nil, io.Discard)
	require.NoError(t, err)
	lat := o.replayConfig().Latency
	gen := workload.NewSynthetic(o.syntheticConfig()) // the requests the run placed, in order
	prompts := make([]int64, rep.Requests)
	for i := range prompts {
		prompts[i] = gen.Next().InputLength
	}
	slices.Sort(prompts)
	median := prompts[len(prompts)/2]
	require.Positive(t, median)
	service := time.Duration(float64(median)/lat.PrefillTokensPerSec*float64(time.Second)) + lat.RTT
	serviceMs := float64(service) / float64(time.Millisecond)
	t.Logf("%d requests; median prompt %d tokens, uncontended service %v; TTFT p50 %.0fms p99 %.0fms, queueing p50 %.0fms p99 %.0fms",
		rep.Requests, median, service, rep.TTFTP50Ms, rep.TTFTP99Ms, rep.QueueP50Ms, rep.QueueP99Ms)
	assert.LessOrEqual(t, rep.TTFTP50Ms, 2*serviceMs, "model TTFT p50 beyond twice the median request's uncontended service time")
	assert.LessOrEqual(t, rep.QueueP50Ms, rep.TTFTP50Ms/2, "queueing dominates the model's median TTFT")

	// The summary says what the model ran at: Poisson arrivals offering
	// about --model-load (70%) of the fleet's prefill capacity.
	assert.Contains(t, out, "latency model: arrivals Poisson at ")
	m := regexp.MustCompile(`prompts offered ([0-9.]+)% of the fleet's prefill capacity \(24 ranks × 8192 tokens/s\)`).FindStringSubmatch(out)
	require.NotNil(t, m, "summary lacks the model's load:\n%s", out)
	offered, err := strconv.ParseFloat(m[1], 64)
	require.NoError(t, err)
	assert.InDelta(t, 100*defaultModelLoad, offered, 15, "offered prompt load, percent of capacity")
}

// --model-rate sets the synthetic arrivals' rate, which the summary then
// measures; the model flags do not apply to a trace, whose requests arrive at
// its timestamps, nor take nonsense.
func TestDemo_ModelRate(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the demo for a second")
	}
	rep, out := runDemoReport(t, "--duration", "1s", "--consumer", "native", "--probes", "20000", "--model-rate", "5")
	checkSummary(t, rep, out, 3)
	m := regexp.MustCompile(`arrivals Poisson at 5\.00 req/s \(--model-rate\); measured ([0-9.]+) req/s`).FindStringSubmatch(out)
	require.NotNil(t, m, "summary lacks the model's arrival rate:\n%s", out)
	measured, err := strconv.ParseFloat(m[1], 64)
	require.NoError(t, err)
	// ≥ 100 Poisson gaps: the rate's relative error is about 1/√n.
	require.GreaterOrEqual(t, rep.Requests, uint64(100))
	assert.InDelta(t, 5, measured, 5*4/math.Sqrt(float64(rep.Requests)))
}

func TestParseDemo_ModelFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--model-rate", "-1"},
		{"--model-rate", "NaN"},
		{"--model-rate", "+Inf"},
		{"--model-rate", "0.001"},
		{"--model-rate", "2e6"},
		{"--model-load", "11"},
		{"--model-load", "NaN"},
		{"--model-load", "0"},
		{"--model-load", "-0.5"},
		{"--trace", "embedded", "--model-rate", "10"},
		{"--trace", "embedded", "--model-load", "0.5"},
	} {
		var errb bytes.Buffer
		_, err := parseDemo(args, &errb)
		assert.ErrorIs(t, err, ErrUsage, "%q", args)
		assert.Contains(t, errb.String(), "--model-", "%q: the message names the flag", args)
	}
	o, err := parseDemo([]string{"--model-load", "0.5"}, io.Discard)
	require.NoError(t, err)
	full, _ := parseDemo([]string{"--model-load", "1"}, io.Discard)
	half, _ := o.arrivalRate()
	whole, _ := full.arrivalRate()
	assert.InDelta(t, whole/2, half, 1e-9*whole, "the derived rate is proportional to --model-load")
	cfg := full.replayConfig()
	assert.InDelta(t, prefillCapacity(cfg)/meanPromptTokens(cfg.Latency, full.syntheticConfig(), promptSample), whole, 1e-9*whole)
}

// Poisson arrivals increase and their mean gap is 1/rate.
func TestPoissonArrivals(t *testing.T) {
	a := newPoissonArrivals(20, 7)
	const n = 20_000
	var last time.Duration
	for range n {
		at := a.next()
		require.Greater(t, at, last)
		last = at
	}
	assert.InDelta(t, 20, n/last.Seconds(), 20*4/math.Sqrt(n))

	slow := newPoissonArrivals(minModelRate, 7)
	slow.at = math.MaxInt64 - time.Second
	assert.Equal(t, time.Duration(math.MaxInt64), slow.next(), "arrivals saturate, never wrap")
	assert.Equal(t, time.Duration(math.MaxInt64), slow.next())
}

// With --trace embedded the demo serves the Mooncake trace's requests in
// order: the scored blocks are exactly those of the trace's first requests.
func TestDemo_EmbeddedTrace(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the demo for a second")
	}
	rep, out := runDemoReport(t, "--duration", "1s", "--consumer", "native", "--rate", "1000", "--probes", "20000", "--trace", "embedded")
	checkSummary(t, rep, out, 3)
	reqs, err := replay.EmbeddedTrace()
	require.NoError(t, err)
	require.LessOrEqual(t, rep.Requests, uint64(len(reqs)), "got %d requests from a %d-request trace", rep.Requests, len(reqs))
	want := traceBlocks(reqs[:rep.Requests])
	assert.Equal(t, want, rep.RequestBlocks, "got %d request blocks, want %d: the trace's first %d requests", rep.RequestBlocks, want, rep.Requests)
	assert.Contains(t, out, replay.EmbeddedTraceName, "header does not name the trace:\n%s", out)
}

// A user's trace ends the demo when it runs out, before --duration; with
// --report the demo writes the replay's report page for its run.
func TestDemo_UserTraceEndsTheDemo(t *testing.T) {
	path := filepath.Join(t.TempDir(), "trace.jsonl")
	var b strings.Builder
	var reqs []workload.Request
	for i := range 60 { // six conversations growing turn by turn
		conv, turn := i%6, i/6
		ids := []uint64{uint64(100 * conv)}
		for k := range turn + 1 {
			ids = append(ids, uint64(100*conv+k+1))
		}
		reqs = append(reqs, workload.Request{HashIDs: ids})
		line, _ := json.Marshal(map[string]any{"timestamp": i * 10, "input_length": 512 * len(ids), "output_length": 8, "hash_ids": ids})
		b.Write(line)
		b.WriteByte('\n')
	}
	require.NoError(t, os.WriteFile(path, []byte(b.String()), 0o644))
	dir := filepath.Join(t.TempDir(), "report")
	rep, out := runDemoReport(t, "--duration", "1m", "--consumer", "native", "--rate", "0", "--probes", "20000", "--trace", path, "--report", dir)
	checkSummary(t, rep, out, 3)
	assert.EqualValues(t, uint64(60), rep.Requests, "all 60 requests")
	assert.Equal(t, traceBlocks(reqs), rep.RequestBlocks)
	assert.Positive(t, rep.WarmRequests, "conversations must find their earlier turns")
	assert.Positive(t, rep.HitBlocks)
	// The latency model ran: every request has a TTFT, and the prompt
	// tokens of cached turns were saved.
	assert.Len(t, rep.TTFTCDFMs, 101)
	assert.Positive(t, rep.TTFTP50Ms)
	assert.Positive(t, rep.PrefillTokensSaved)
	for _, f := range []string{report.IndexFile, report.JSONFile, report.TTFTFile, report.TradeOffFile} {
		assert.FileExists(t, filepath.Join(dir, f))
	}
	assert.Contains(t, out, filepath.Join(dir, report.IndexFile))
}

func traceBlocks(reqs []workload.Request) uint64 {
	var n uint64
	for _, r := range reqs {
		n += uint64(len(r.HashIDs))
	}
	return n
}
