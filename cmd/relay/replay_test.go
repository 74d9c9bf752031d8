package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReplay_UsageErrorsExit2(t *testing.T) {
	for _, args := range [][]string{
		{"replay", "--dcs", "17"},
		{"replay", "--dcs", "0"},
		{"replay", "--policy", "best"},
		{"replay", "--consumer", "python"},
		{"replay", "--repeat", "0"},
		{"replay", "--speed", "-1"},
		{"replay", "--publish-every", "0"},
		{"replay", "now"},
	} {
		var out, errb bytes.Buffer
		if got := run(context.Background(), args, &out, &errb); got != 2 || errb.Len() == 0 {
			t.Errorf("run(%q) = %d, stderr %q; want 2 and a message", args, got, errb.String())
		}
	}
}

func TestReplay_MalformedTraceNamesTheLine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bad.jsonl")
	trace := `{"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [1, 2]}` + "\n" +
		`{"timestamp": 1, "hash_ids": [1, 2, oops]}` + "\n"
	if err := os.WriteFile(path, []byte(trace), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if got := run(context.Background(), []string{"replay", "--trace", path}, &out, &errb); got != 1 || !strings.Contains(errb.String(), "trace line 2") {
		t.Fatalf("run = %d, stderr %q; want 1 and the line number", got, errb.String())
	}
	var out2, errb2 bytes.Buffer
	if got := run(context.Background(), []string{"replay", "--trace", filepath.Join(t.TempDir(), "missing")}, &out2, &errb2); got != 1 {
		t.Fatalf("missing trace: run = %d, want 1 (stderr %q)", got, errb2.String())
	}
}

// TestReplay_UserTraceJSON replays a user's trace with every policy and the
// exact index: the JSON report has one entry per policy, each at 100%.
func TestReplay_UserTraceJSON(t *testing.T) {
	path := filepath.Join(t.TempDir(), "trace.jsonl")
	var b strings.Builder
	for i := range 40 { // four conversations growing turn by turn
		conv, turn := i%4, i/4
		ids := []int{100 * conv}
		for k := range turn + 1 {
			ids = append(ids, 100*conv+k+1)
		}
		line, _ := json.Marshal(map[string]any{"timestamp": i * 10, "input_length": 512 * len(ids), "output_length": 8, "hash_ids": ids})
		b.Write(line)
		b.WriteByte('\n')
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	args := []string{"replay", "--trace", path, "--policy", "all", "--exact", "--json", "--probes", "1000", "--dcs", "4"}
	if got := run(context.Background(), args, &out, &errb); got != 0 {
		t.Fatalf("run = %d, stderr %q", got, errb.String())
	}
	var doc struct {
		Reports []struct {
			Policy       string  `json:"policy"`
			Requests     int     `json:"requests"`
			AgreementPct float64 `json:"agreement_pct"`
			OverReports  int     `json:"over_reports"`
			UnderReports int     `json:"under_reports"`
			HitRatePct   float64 `json:"hit_rate_pct"`
		} `json:"reports"`
	}
	if err := json.Unmarshal(out.Bytes(), &doc); err != nil {
		t.Fatalf("stdout is not JSON: %v\n%s", err, out.String())
	}
	if len(doc.Reports) != 3 {
		t.Fatalf("got %d reports, want 3 (one per policy)", len(doc.Reports))
	}
	for _, r := range doc.Reports {
		if r.Requests != 40 || r.AgreementPct != 100 || r.OverReports != 0 || r.UnderReports != 0 {
			t.Errorf("%s: got %+v, want 40 requests at 100%% and no over/under-report", r.Policy, r)
		}
	}
	if ca := doc.Reports[0]; ca.Policy != "cache-aware" || ca.HitRatePct <= doc.Reports[1].HitRatePct {
		t.Errorf("got cache-aware %+v vs random %+v; want cache-aware first with the higher hit rate", ca, doc.Reports[1])
	}
	if !strings.Contains(errb.String(), "ckfrelay replay:") {
		t.Errorf("stderr %q: want the header there when --json owns stdout", errb.String())
	}
}

func TestReplay_TableOnEmbeddedTrace(t *testing.T) {
	if testing.Short() {
		t.Skip("replays the whole embedded trace")
	}
	var out, errb bytes.Buffer
	if got := run(context.Background(), []string{"replay", "--probes", "1000"}, &out, &errb); got != 0 {
		t.Fatalf("run = %d, stderr %q", got, errb.String())
	}
	for _, want := range []string{"best-DC agreement", "cache-aware", "random", "unexplained under-reports", "false-positive rate", "freshness p50 / p99"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
}
