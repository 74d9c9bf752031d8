package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/internal/sim/replay/report"
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
		{"replay", "--prefill-tps", "0"},
		{"replay", "--decode-tps", "-5"},
		{"replay", "--block-tokens", "0"},
		{"replay", "--rtt", "-1ms"},
		{"replay", "--rtt-matrix", "0,1ms;1ms"},
		{"replay", "--rtt-matrix", "0,fast;1ms,0"},
		{"replay", "--rtt-matrix", "0,-1ms,0;0,0,0;0,0,0"},
		{"replay", "--overlap-weight", "-1"},
		{"replay", "--temperature", "NaN"},
		{"replay", "--policy", "random-exactly"},
	} {
		var out, errb bytes.Buffer
		assert.Equal(t, 2, run(context.Background(), args, &out, &errb), "run(%q)", args)
		assert.NotEmpty(t, errb.String(), "run(%q) says why", args)
	}
}

func TestReplay_MalformedTraceNamesTheLine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bad.jsonl")
	trace := `{"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [1, 2]}` + "\n" +
		`{"timestamp": 1, "hash_ids": [1, 2, oops]}` + "\n"
	require.NoError(t, os.WriteFile(path, []byte(trace), 0o644))
	var out, errb bytes.Buffer
	assert.Equal(t, 1, run(context.Background(), []string{"replay", "--trace", path}, &out, &errb))
	assert.Contains(t, errb.String(), "trace line 2")
	var out2, errb2 bytes.Buffer
	assert.Equal(t, 1, run(context.Background(), []string{"replay", "--trace", filepath.Join(t.TempDir(), "missing")}, &out2, &errb2),
		"missing trace: stderr %q", errb2.String())
}

// userTrace writes a small user trace: four conversations growing turn by
// turn, 40 requests.
func userTrace(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "trace.jsonl")
	var b strings.Builder
	for i := range 40 {
		conv, turn := i%4, i/4
		ids := []int{100 * conv}
		for k := range turn + 1 {
			ids = append(ids, 100*conv+k+1)
		}
		line, _ := json.Marshal(map[string]any{"timestamp": i * 10, "input_length": 512 * len(ids), "output_length": 8, "hash_ids": ids})
		b.Write(line)
		b.WriteByte('\n')
	}
	require.NoError(t, os.WriteFile(path, []byte(b.String()), 0o644))
	return path
}

// TestReplay_UserTraceJSON replays a user's trace with every policy and the
// exact index: the JSON report has one entry per policy, each at 100%.
func TestReplay_UserTraceJSON(t *testing.T) {
	var out, errb bytes.Buffer
	args := []string{"replay", "--trace", userTrace(t), "--policy", "all", "--exact", "--json", "--probes", "1000", "--dcs", "4"}
	require.Equal(t, 0, run(context.Background(), args, &out, &errb), "stderr %q", errb.String())
	var doc struct {
		Reports []struct {
			Policy       string  `json:"policy"`
			Exact        bool    `json:"exact"`
			Requests     int     `json:"requests"`
			AgreementPct float64 `json:"agreement_pct"`
			OverReports  int     `json:"over_reports"`
			UnderReports int     `json:"under_reports"`
			HitRatePct   float64 `json:"hit_rate_pct"`
			TTFTP50Ms    float64 `json:"ttft_p50_ms"`
		} `json:"reports"`
	}
	require.NoError(t, json.Unmarshal(out.Bytes(), &doc), "stdout is not JSON:\n%s", out.String())
	var names []string
	hit := map[string]float64{}
	for _, r := range doc.Reports {
		names = append(names, r.Policy)
		hit[r.Policy] = r.HitRatePct
		assert.True(t, r.Exact, r.Policy)
		assert.Equal(t, 40, r.Requests, r.Policy)
		assert.Equal(t, 100.0, r.AgreementPct, r.Policy)
		assert.Zero(t, r.OverReports+r.UnderReports, r.Policy)
		assert.Positive(t, r.TTFTP50Ms, r.Policy)
	}
	assert.Equal(t, []string{"cache-aware", "affinity", "load-only", "random", "round-robin"}, names, "one run per policy, exact ones merged")
	assert.Greater(t, hit["cache-aware"], hit["random"])
	assert.Contains(t, errb.String(), "ckfrelay replay:", "the header goes to stderr when --json owns stdout")
}

// TestReplay_ReportWritesHTMLAndJSON: --report writes the page, its plots
// and the JSON beside them.
func TestReplay_ReportWritesHTMLAndJSON(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "report")
	var out, errb bytes.Buffer
	args := []string{"replay", "--trace", userTrace(t), "--policy", "cache-aware,cache-aware-exact,random", "--probes", "1000", "--report", dir}
	require.Equal(t, 0, run(context.Background(), args, &out, &errb), "stderr %q", errb.String())
	for _, f := range []string{report.IndexFile, report.TTFTFile, report.HitRateFile, report.ImbalanceFile, report.TradeOffFile} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		require.NoError(t, err)
		if strings.HasSuffix(f, ".svg") {
			assert.Contains(t, string(b), "<svg", f)
		}
	}
	var page report.Page
	b, err := os.ReadFile(filepath.Join(dir, report.JSONFile))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &page))
	require.Len(t, page.Reports, 3)
	assert.Equal(t, "cache-aware (exact)", page.Reports[1].Name())
	assert.Len(t, page.Reports[0].TTFTCDFMs, 101)
	assert.NotEmpty(t, page.Sweep.SavingMs)
	assert.True(t, strings.HasPrefix(page.Command, "relay replay --trace "), "the page's reproduce command is runnable: %q", page.Command)
	html, err := os.ReadFile(filepath.Join(dir, report.IndexFile))
	require.NoError(t, err)
	assert.Contains(t, string(html), "cache-aware (exact)")
	assert.Contains(t, out.String(), filepath.Join(dir, report.IndexFile))
}

func TestReplay_TableOnEmbeddedTrace(t *testing.T) {
	if testing.Short() {
		t.Skip("replays the whole embedded trace")
	}
	var out, errb bytes.Buffer
	require.Equal(t, 0, run(context.Background(), []string{"replay", "--probes", "1000"}, &out, &errb), "stderr %q", errb.String())
	for _, want := range []string{"best-DC agreement", "cache-aware", "random", "unexplained under-reports", "false-positive rate",
		"freshness p50 / p99", "TTFT p50 / p90 / p99", "rank imbalance"} {
		assert.Contains(t, out.String(), want)
	}
}
