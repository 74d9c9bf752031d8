package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// sampleOutput is go test -bench output as Go 1.26 prints it, including a
// failed sub-benchmark, a log line and a second package header.
const sampleOutput = `goos: linux
goarch: amd64
pkg: github.com/ckfrelay/ckfrelay/ckf
cpu: AMD EPYC
BenchmarkFilterInsert/lib=ckf/n=1M-2         	       8	  75351135 ns/op	        16.78 bits/key	         0.0001087 fpr	        75.35 ns/insert	   16368 B/op	      10 allocs/op
BenchmarkFilterInsert/lib=seiflotfy/n=1M-2   	      12	  46117522 ns/op	         8.389 bits/key	         0.02935 fpr	        46.12 ns/insert	       0 B/op	       0 allocs/op
BenchmarkPoolApplyEvent/load=90/impl=pool-2            	--- FAIL: BenchmarkPoolApplyEvent/load=90/impl=pool-2
    bench_test.go:466: step: ckf: parent block not found: worker 0 rank 0 block 0xe0aee4fd525a15c5
BenchmarkSingleProc      	 1000	  12.5 ns/op
BenchmarkPoolApplyEvent/load=50/impl=pool-2            	   12724	     18565 ns/op	    861826 blocks/s	     518 B/op	       0 allocs/op
PASS
ok  	github.com/ckfrelay/ckfrelay/ckf	8.866s
`

func TestParseBench_Lines(t *testing.T) {
	got := parseBench(strings.NewReader(sampleOutput))
	want := []result{
		{Name: "BenchmarkFilterInsert/lib=ckf/n=1M", Iterations: 8, Metrics: map[string]float64{
			"ns/op": 75351135, "bits/key": 16.78, "fpr": 0.0001087, "ns/insert": 75.35, "B/op": 16368, "allocs/op": 10}},
		{Name: "BenchmarkFilterInsert/lib=seiflotfy/n=1M", Iterations: 12, Metrics: map[string]float64{
			"ns/op": 46117522, "bits/key": 8.389, "fpr": 0.02935, "ns/insert": 46.12, "B/op": 0, "allocs/op": 0}},
		{Name: "BenchmarkSingleProc", Iterations: 1000, Metrics: map[string]float64{"ns/op": 12.5}},
		{Name: "BenchmarkPoolApplyEvent/load=50/impl=pool", Iterations: 12724, Metrics: map[string]float64{
			"ns/op": 18565, "blocks/s": 861826, "B/op": 518, "allocs/op": 0}},
	}
	assert.Equal(t, want, got, "parseBench:\ngot  %+v\nwant %+v", got, want)
}

func TestParseBench_Malformed(t *testing.T) {
	for _, line := range []string{
		"",
		"Benchmark",
		"BenchmarkX-2 notanumber 12 ns/op",
		"BenchmarkX-2 10 twelve ns/op",
		"BenchmarkX-2 10 12",          // value without unit
		"NotABenchmark-2 10 12 ns/op", // wrong prefix
	} {
		got := parseBench(strings.NewReader(line))
		assert.Empty(t, got, "parseBench(%q) = %+v, want nothing", line, got)
	}
}

var testFigures = []figure{
	{Name: "insert_vs_peer", Pkg: "./ckf", Bench: "BenchmarkFilterInsert/lib=ckf/n=1M", Base: "BenchmarkFilterInsert/lib=seiflotfy/n=1M", Metric: "ns/insert", Unit: "ratio"},
	{Name: "fpr", Pkg: "./ckf", Bench: "BenchmarkFilterInsert/lib=ckf/n=1M", Metric: "fpr", Unit: "fraction"},
	{Name: "apply", Pkg: "./ckf", Bench: "BenchmarkPoolApplyEvent/load=50/impl=pool", Metric: "blocks/s", Unit: "blocks/s"},
}

func TestSummarize_AggregatesAndRatio(t *testing.T) {
	figs := append(slices.Clone(testFigures),
		figure{Name: "bytes", Pkg: "./ckf", Bench: "BenchmarkPoolExactState/impl=pool/n=1M", Metric: "B/block", Unit: "bytes"})
	s := samples{}
	for _, round := range []struct{ ckf, peer, rate, bytes float64 }{
		{90, 40, 500000, 72},
		{60, 50, 861826, 70},
		{70, 1000, 300000, 90}, // a disturbed round
	} {
		s.add("./ckf", []result{
			{Name: "BenchmarkFilterInsert/lib=ckf/n=1M", Metrics: map[string]float64{"ns/insert": round.ckf, "fpr": 0.0001}},
			{Name: "BenchmarkFilterInsert/lib=seiflotfy/n=1M", Metrics: map[string]float64{"ns/insert": round.peer}},
			{Name: "BenchmarkPoolApplyEvent/load=50/impl=pool", Metrics: map[string]float64{"blocks/s": round.rate}},
			{Name: "BenchmarkPoolExactState/impl=pool/n=1M", Metrics: map[string]float64{"B/block": round.bytes}},
		})
	}
	lines, missing := summarize(figs, s)
	want := []string{
		"BENCH insert_vs_peer 1.5 ratio", // min 60 over min 40
		"BENCH fpr 0.0001 fraction",      // median
		"BENCH apply 861800 blocks/s",    // max rate
		"BENCH bytes 72 bytes",           // median
	}
	assert.False(t, !slices.Equal(lines, want) || len(missing) != 0, "summarize:\ngot  %q, missing %v\nwant %q, none missing", lines, missing, want)
}

// TestSummarize_PerRoundRatio: a PerRound figure is the median of the
// same-round ratios, not the ratio of the aggregates; rounds that do not
// pair up are missing.
func TestSummarize_PerRoundRatio(t *testing.T) {
	f := figure{Name: "tail_vs_base", Pkg: "./p", Bench: "BenchmarkX/a", Base: "BenchmarkX/b", Metric: "fresh-p90-ns", Unit: "ratio", PerRound: true}
	s := samples{}
	for _, round := range [][2]float64{{10, 5}, {30, 10}, {4, 4}} { // ratios 2, 3, 1; aggregates' ratio 10/5 = 2
		s.add("./p", []result{{Name: "BenchmarkX/a", Metrics: map[string]float64{"fresh-p90-ns": round[0]}},
			{Name: "BenchmarkX/b", Metrics: map[string]float64{"fresh-p90-ns": round[1]}}})
	}
	s.add("./p", []result{{Name: "BenchmarkX/a", Metrics: map[string]float64{"fresh-p90-ns": 1}},
		{Name: "BenchmarkX/b", Metrics: map[string]float64{"fresh-p90-ns": 2}}}) // ratio 0.5: median of 0.5, 1, 2, 3
	lines, missing := summarize([]figure{f}, s)
	assert.Empty(t, missing)
	assert.Equal(t, []string{"BENCH tail_vs_base 1.5 ratio"}, lines)

	s.add("./p", []result{{Name: "BenchmarkX/a", Metrics: map[string]float64{"fresh-p90-ns": 1}}}) // a round without its base
	lines, missing = summarize([]figure{f}, s)
	assert.Empty(t, lines)
	require.Len(t, missing, 1)
	assert.ErrorIs(t, missing[0], errMissing)
}

// TestSummarize_BaseMetric: a figure whose two sides are two metrics of one
// benchmark (timed in turns) divides Metric by BaseMetric, round by round
// with PerRound, and is missing when the base column is.
func TestSummarize_BaseMetric(t *testing.T) {
	f := figure{Name: "mixed_vs_uniform", Pkg: "./p", Bench: "BenchmarkM/seeds=4", Base: "BenchmarkM/seeds=4",
		Metric: "mixed4-p50-ns", BaseMetric: "uniform-p50-ns", Unit: "ratio", PerRound: true}
	s := samples{}
	// Same-round ratios 1.5, 1.6, 1.2: median 1.5. The ratio of the
	// columns' medians (1800/1100 ≈ 1.64) would pair rounds that differ.
	for _, round := range [][2]float64{{1500, 1000}, {1600, 1000}, {1800, 1500}} {
		s.add("./p", []result{{Name: "BenchmarkM/seeds=4", Metrics: map[string]float64{"mixed4-p50-ns": round[0], "uniform-p50-ns": round[1]}}})
	}
	lines, missing := summarize([]figure{f}, s)
	assert.Empty(t, missing)
	assert.Equal(t, []string{"BENCH mixed_vs_uniform 1.5 ratio"}, lines)

	f.PerRound = false // the aggregates' ratio: median 1600 over median 1000
	lines, missing = summarize([]figure{f}, s)
	assert.Empty(t, missing)
	assert.Equal(t, []string{"BENCH mixed_vs_uniform 1.6 ratio"}, lines)

	f.BaseMetric = "other-p50-ns"
	for _, perRound := range []bool{true, false} {
		f.PerRound = perRound
		lines, missing = summarize([]figure{f}, s)
		assert.Empty(t, lines, "PerRound %v", perRound)
		require.Len(t, missing, 1, "PerRound %v", perRound)
		assert.ErrorIs(t, missing[0], errMissing)
	}
}

func TestSummarize_Missing(t *testing.T) {
	s := samples{}
	s.add("./ckf", []result{
		{Name: "BenchmarkFilterInsert/lib=ckf/n=1M", Metrics: map[string]float64{"ns/insert": 70, "fpr": 0.0001}},
		{Name: "BenchmarkFilterInsert/lib=seiflotfy/n=1M", Metrics: map[string]float64{"ns/op": 50}}, // wrong metric
	})
	lines, missing := summarize(testFigures, s)
	want := []string{"BENCH fpr 0.0001 fraction"}
	assert.True(t, slices.Equal(lines, want), "lines: got %q, want %q", lines, want)
	require.Len(t, missing, 2, "missing: got %v, want 2 errors (baseline metric, pool benchmark)", missing)
	for _, err := range missing {
		assert.ErrorIs(t, err, errMissing, "missing error %v: got not errMissing, want errors.Is(err, errMissing)", err)
	}
	assert.False(t, !strings.Contains(missing[0].Error(), "insert_vs_peer") || !strings.Contains(missing[1].Error(), "apply"), "missing: got %v, want insert_vs_peer then apply", missing)
}

func TestFormatValue(t *testing.T) {
	for _, tc := range []struct {
		v    float64
		want string
	}{
		{0, "0"},
		{1.4, "1.4"},
		{1.53456, "1.535"},
		{0.000108711, "0.0001087"},
		{861826.3, "861800"},
		{75.35, "75.35"},
		{72.16666, "72.17"},
	} {
		got := formatValue(tc.v)
		assert.Equal(t, tc.want, got, "formatValue(%v): got %q, want %q", tc.v, got, tc.want)
	}
}

func TestBenchRegexp_SelectsTopLevels(t *testing.T) {
	figs := append(slices.Clone(testFigures),
		figure{Name: "other", Pkg: "./consumer", Bench: "BenchmarkLaneQuery/impl=wasm", Metric: "ns/op", Unit: "ns"})
	got, want := benchRegexp("./ckf", figs), "^(BenchmarkFilterInsert|BenchmarkPoolApplyEvent)$"
	assert.Equal(t, want, got, "benchRegexp(./ckf): got %q, want %q", got, want)
	{
		got, want := packages(figs), []string{"./ckf", "./consumer"}
		assert.True(t, slices.Equal(got, want), "packages: got %q, want %q", got, want)
	}
	args, dir := testArgs("./ckf", figs, []string{"-benchtime=1s"})
	assert.False(t, args[len(args)-1] != "./ckf" || args[len(args)-2] != "-benchtime=1s", "testArgs: got %q, want passthrough flags last before the package", args)
	assert.Empty(t, dir, "testArgs: a main-module package runs in the root")
}

// TestInRound_CapsRounds: a figure with Rounds n runs its benchmarks in the
// first n rounds only; the others run in every round.
func TestInRound_CapsRounds(t *testing.T) {
	figs := append(slices.Clone(testFigures),
		figure{Name: "scale", Pkg: "./ckf", Bench: "BenchmarkPoolApplyScale/blocks=32M", Metric: "ns/op", Unit: "ns", Rounds: 1})
	assert.Equal(t, "^(BenchmarkFilterInsert|BenchmarkPoolApplyEvent|BenchmarkPoolApplyScale)$", benchRegexp("./ckf", inRound(figs, 1)))
	assert.Equal(t, "^(BenchmarkFilterInsert|BenchmarkPoolApplyEvent)$", benchRegexp("./ckf", inRound(figs, 2)))
}

// A package of a nested module runs in that module's directory, named
// relative to it (go test from the root would refuse it).
func TestTestArgs_NestedModule(t *testing.T) {
	figs := []figure{{Name: "w", Pkg: "./internal/integration/wasmtime", Module: "internal/integration/wasmtime",
		Bench: "BenchmarkRuntimes/op=seq/depth=32/impl=wasmtime", Metric: "p50-ns", Unit: "ns"}}
	args, dir := testArgs("./internal/integration/wasmtime", figs, nil)
	require.Equal(t, "internal/integration/wasmtime", dir)
	require.Equal(t, ".", args[len(args)-1])
	require.Equal(t, "^(BenchmarkRuntimes)$", args[4])
}

// TestFigures_Valid checks the real figure table: every entry complete, names
// unique and in snake_case, benchmark names free of a -N suffix the parser
// would strip.
func TestFigures_Valid(t *testing.T) {
	nameRE := regexp.MustCompile(`^[a-z][a-z0-9_]*$`)
	seen := map[string]bool{}
	for _, f := range figures {
		assert.False(t, !nameRE.MatchString(f.Name) || seen[f.Name], "figure %q: got a duplicate or non-snake_case name", f.Name)
		seen[f.Name] = true
		assert.False(t, f.Pkg == "" || f.Metric == "" || f.Unit == "" || !strings.HasPrefix(f.Bench, "Benchmark"), "figure %q: got %+v, want Pkg, Bench, Metric and Unit set", f.Name, f)
		for _, b := range []string{f.Bench, f.Base} {
			assert.False(t, procsSuffix.MatchString(b), "figure %q: benchmark %q ends in -<digits>, which the parser strips", f.Name, b)
		}
		assert.False(t, (f.Base != "") != (f.Unit == "ratio"), "figure %q: got Base %q with unit %q, want a Base exactly for ratios", f.Name, f.Base, f.Unit)
		assert.False(t, f.BaseMetric != "" && f.Base == "", "figure %q: got BaseMetric %q without a Base", f.Name, f.BaseMetric)
		assert.False(t, f.Bench == f.Base && f.baseMetric() == f.Metric, "figure %q: got a ratio of %s's %q over itself", f.Name, f.Bench, f.Metric)
		// The package must exist: a moved package otherwise fails only in
		// `make bench` ("setup failed"), which no test runs.
		info, err := os.Stat(filepath.Join("..", "..", "..", f.Pkg))
		assert.True(t, err == nil && info.IsDir(), "figure %q: package directory %s does not exist", f.Name, f.Pkg)
		if f.Module != "" {
			_, err := os.Stat(filepath.Join("..", "..", "..", f.Module, "go.mod"))
			assert.NoError(t, err, "figure %q: module %q: want a directory with a go.mod", f.Name, f.Module)
			assert.True(t, strings.HasPrefix(f.Pkg, "./"+f.Module), "figure %q: package %s outside its module %s", f.Name, f.Pkg, f.Module)
		}
	}
}

// fakeGoEnv makes the test binary act as a fake go command (see TestMain).
const fakeGoEnv = "BENCHSUMMARY_FAKE_GO"

func TestMain(m *testing.M) {
	switch os.Getenv(fakeGoEnv) {
	case "ok":
		fmt.Print(sampleOutput)
		os.Exit(0)
	case "fail":
		fmt.Print(sampleOutput)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

func TestRun_EndToEnd(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Skipf("no executable path: %v", err)
	}
	saved := figures
	t.Cleanup(func() { figures = saved })
	figures = testFigures

	for _, tc := range []struct {
		mode       string
		wantStatus int
	}{{"ok", 0}, {"fail", 1}} {
		t.Run(tc.mode, func(t *testing.T) {
			t.Setenv(fakeGoEnv, tc.mode)
			var stdout, stderr bytes.Buffer
			status := run([]string{"-go", exe, "-rounds", "2", "--", "-benchtime=10ms"}, &stdout, &stderr)
			assert.Equal(t, tc.wantStatus, status, "status: got %d, want %d (stderr %q)", status, tc.wantStatus, stderr.String())
			out := stdout.String()
			assert.Contains(t, out, "BenchmarkFilterInsert/lib=ckf/n=1M-2", "stdout: got %q, want the raw benchmark output streamed", out)
			lines := strings.Split(strings.TrimSpace(out), "\n")
			want := []string{"BENCH insert_vs_peer 1.634 ratio", "BENCH fpr 0.0001087 fraction", "BENCH apply 861800 blocks/s"}
			got := lines[len(lines)-3:]
			assert.True(t, slices.Equal(got, want), "last lines: got %q, want %q", got, want)
			rounds := strings.Count(out, "# round ")
			wantRounds := map[string]int{"ok": 2, "fail": 1}[tc.mode]
			assert.Equal(t, wantRounds, rounds, "rounds run: got %d, want %d (a failing go test stops further rounds)", rounds, wantRounds)
		})
	}
}

func TestRun_BadFlags(t *testing.T) {
	for _, args := range [][]string{{"-rounds", "0"}, {"-nosuchflag"}} {
		var stdout, stderr bytes.Buffer
		status := run(args, &stdout, &stderr)
		assert.Equal(t, 2, status, "run(%q): got status %d, want 2", args, status)
	}
}

func TestAvailable_SkipsFiguresWhoseProgramIsMissing(t *testing.T) {
	figs := []figure{{Name: "a"}, {Name: "b", Needs: "node"}, {Name: "c", Needs: "go"}, {Name: "d", Needs: "go node"}}
	look := func(p string) (string, error) {
		if p == "node" {
			return "", errors.New("not found")
		}
		return "/usr/bin/" + p, nil
	}
	ok, notes := available(figs, look)
	require.Equal(t, []figure{{Name: "a"}, {Name: "c", Needs: "go"}}, ok)
	require.Equal(t, []string{"skipped b: node not found", "skipped d: node not found"}, notes)
}

// -figures selects figures by name: the four-runtime table alone is one go
// test run, in its nested module.
func TestRun_FiguresFilter(t *testing.T) {
	var out, errOut strings.Builder
	require.Equal(t, 0, run([]string{"-n", "-rounds=1", "-figures", "^runtimes_"}, &out, &errOut), errOut.String())
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.Len(t, lines, 1, out.String())
	require.Contains(t, lines[0], "BenchmarkRuntimes")
	require.Contains(t, lines[0], "(in internal/integration/wasmtime)")
	require.Equal(t, 2, run([]string{"-n", "-figures", "("}, &out, &errOut))
}

// TestFigures_FanoutSideBySide checks that the fan-out table reports every
// transport of BenchmarkFanout (HTTP, NATS and gRPC) with the same five
// metrics, and each other transport's CPU and relay egress as a ratio to
// HTTP's measured in the same rounds.
func TestFigures_FanoutSideBySide(t *testing.T) {
	const top, base = "BenchmarkFanout/transport=", "BenchmarkFanout/transport=http/routers=64"
	have := map[[3]string]bool{} // bench, base, metric
	for _, f := range figures {
		if f.Pkg == "./internal/server" && strings.HasPrefix(f.Bench, top) {
			have[[3]string{f.Bench, f.Base, f.Metric}] = true
		}
	}
	for _, tr := range []string{"http", "nats", "grpc"} {
		bench := top + tr + "/routers=64"
		for _, m := range []string{"fresh-p50-ns", "fresh-p99-ns", "cpu-ns/op/sub", "heap-B/sub", "relay-out-B/op"} {
			assert.True(t, have[[3]string{bench, "", m}], "no figure for %s %s", bench, m)
		}
		if tr == "grpc" {
			assert.True(t, have[[3]string{bench, base, "fresh-p90-ns"}], "no fresh-p90-ns ratio of gRPC to HTTP")
		}
		if tr != "http" {
			for _, m := range []string{"cpu-ns/op/sub", "relay-out-B/op"} {
				assert.True(t, have[[3]string{bench, base, m}], "no %s ratio of %s to HTTP", m, bench)
			}
		}
	}
}
