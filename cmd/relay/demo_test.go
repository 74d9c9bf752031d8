package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/internal/replay"
	"github.com/ckfrelay/ckfrelay/internal/replay/report"
	"github.com/ckfrelay/ckfrelay/internal/workload"
)

// runDemoReport runs the demo with args and returns its report and output.
func runDemoReport(t *testing.T, args ...string) (*replay.Report, string) {
	t.Helper()
	o, err := parseDemo(args, io.Discard)
	if err != nil {
		t.Fatalf("parseDemo(%q): %v", args, err)
	}
	var out bytes.Buffer
	rep, err := demo(context.Background(), o, &out)
	if err != nil {
		t.Fatalf("demo(%q): %v\n%s", args, err, out.String())
	}
	return rep, out.String()
}

// checkSummary asserts the demo's summary is the replay table of a report
// the shared replay.Scorer filled: agreement, over/under and FPR rows with
// values, consistent counts, and an unclassified (not a falsely explained)
// under-report row.
func checkSummary(t *testing.T, rep *replay.Report, out string, dcs int) {
	t.Helper()
	var table bytes.Buffer
	if err := replay.WriteTable(&table, rep); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, table.String()) {
		t.Errorf("demo output does not end in the replay table of its report:\n%s\nwant:\n%s", out, table.String())
	}
	if rep.Requests == 0 || rep.RequestBlocks == 0 {
		t.Fatalf("got %d requests, %d blocks; want some", rep.Requests, rep.RequestBlocks)
	}
	if rep.Lanes+rep.LanesNotReady != rep.Requests*uint64(dcs) {
		t.Errorf("got %d lanes compared + %d not ready, want %d × %d", rep.Lanes, rep.LanesNotReady, rep.Requests, dcs)
	}
	if rep.Agree > rep.Requests || rep.WarmAgree > rep.WarmRequests || rep.HitBlocks > rep.RequestBlocks {
		t.Errorf("inconsistent counts: agree %d/%d, warm %d/%d, hits %d/%d", rep.Agree, rep.Requests,
			rep.WarmAgree, rep.WarmRequests, rep.HitBlocks, rep.RequestBlocks)
	}
	if !rep.Unclassified || rep.UnexplainedUnderReports != 0 || rep.UnderCapacity != 0 {
		t.Errorf("got unclassified %v (unexplained %d, capacity %d), want unclassified reports: the demo cannot see the pools",
			rep.Unclassified, rep.UnexplainedUnderReports, rep.UnderCapacity)
	}
	if rep.FPRProbes != 20_000 || rep.FPRBound <= 0 || rep.FilterLoad <= 0 {
		t.Errorf("got %d FPR probes, bound %v at load %v; want 20000 probes at a measured load", rep.FPRProbes, rep.FPRBound, rep.FilterLoad)
	}
	for _, row := range []string{"best-DC agreement", "over-reports (lanes, blocks)", "under-reports (lanes, blocks)", "false-positive rate"} {
		i := strings.Index(out, "\n"+row)
		if i < 0 {
			t.Errorf("summary lacks the %q row:\n%s", row, out)
			continue
		}
		line, _, _ := strings.Cut(out[i+1:], "\n")
		if strings.Contains(line, "n/a") {
			t.Errorf("row %q is not measured: %q", row, line)
		}
	}
}

func TestDemo_SummaryIsTheReplayReport(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the demo for a second")
	}
	rep, out := runDemoReport(t, "--duration", "1s", "--consumer", "native", "--rate", "1000", "--probes", "20000")
	checkSummary(t, rep, out, 3)
	if !strings.Contains(out, "synthetic workload") {
		t.Errorf("header does not name the synthetic workload:\n%s", out)
	}
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
	if err != nil {
		t.Fatal(err)
	}
	if rep.Requests > uint64(len(reqs)) {
		t.Fatalf("got %d requests from a %d-request trace", rep.Requests, len(reqs))
	}
	if want := traceBlocks(reqs[:rep.Requests]); rep.RequestBlocks != want {
		t.Errorf("got %d request blocks, want %d: the trace's first %d requests", rep.RequestBlocks, want, rep.Requests)
	}
	if !strings.Contains(out, replay.EmbeddedTraceName) {
		t.Errorf("header does not name the trace:\n%s", out)
	}
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
	assert.Equal(t, uint64(60), rep.Requests, "all 60 requests")
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

func TestDemo_BadTraceExits1(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bad.jsonl")
	trace := `{"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [1, 2]}` + "\n" + `{"timestamp": 1, "hash_ids": [oops]}` + "\n"
	if err := os.WriteFile(path, []byte(trace), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ path, want string }{
		{path, "trace line 2"},
		{filepath.Join(t.TempDir(), "missing.jsonl"), "no such file"},
	} {
		var out, errb bytes.Buffer
		if code := run(context.Background(), []string{"demo", "--consumer", "native", "--trace", tc.path}, &out, &errb); code != 1 || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("demo --trace %s = %d, stderr %q; want 1 naming %q", tc.path, code, errb.String(), tc.want)
		}
		if out.Len() != 0 {
			t.Errorf("demo --trace %s started before failing:\n%s", tc.path, out.String())
		}
	}
}

func traceBlocks(reqs []workload.Request) uint64 {
	var n uint64
	for _, r := range reqs {
		n += uint64(len(r.HashIDs))
	}
	return n
}
