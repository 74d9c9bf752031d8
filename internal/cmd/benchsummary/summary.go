package main

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// figure is one BENCH line. See the package comment.
type figure struct {
	Name   string // BENCH name
	Pkg    string // package directory, "./ckf"
	Bench  string // benchmark name without the -GOMAXPROCS suffix
	Metric string // unit column to read: "ns/op", "B/op", a ReportMetric unit
	Base   string // optional baseline benchmark: the figure is Bench/Base
	Unit   string // unit printed on the BENCH line
	// PerRound makes a ratio the median over the rounds of Bench/Base
	// measured in the same round, instead of the aggregates' ratio: for
	// metrics that swing with the machine's load from round to round (a
	// latency tail), only the same-round ratio compares like with like.
	PerRound bool
	// BaseMetric is the baseline's metric column when it is not Metric:
	// a benchmark that times both sides of a ratio in turns reports both
	// (Base then names the same benchmark), so they share every burst of
	// load on the machine.
	BaseMetric string
	// Needs names the programs the benchmark runs, space-separated (e.g.
	// "node", "gcc node"): without one of them on PATH the figure is
	// skipped with a note instead of failing the run, as the benchmark
	// itself skips.
	Needs string
	// Module is the directory of the nested Go module that holds Pkg
	// (e.g. "internal/integration/wasmtime", which is cgo and so kept out
	// of the main module); go test then runs there. Empty: the main module.
	Module string
	// Rounds caps the rounds that run Bench and Base (0: every round): a
	// benchmark too long to repeat (the pool at 32 M blocks) gives one
	// sample while the rest of its package gives -rounds.
	Rounds int
}

// inRound returns the figures whose benchmarks run in round (1-based).
func inRound(figs []figure, round int) []figure {
	var out []figure
	for _, f := range figs {
		if f.Rounds == 0 || round <= f.Rounds {
			out = append(out, f)
		}
	}
	return out
}

// available returns the figures whose Needs are met, and a note for each
// skipped one.
func available(figs []figure, lookPath func(string) (string, error)) (ok []figure, notes []string) {
	for _, f := range figs {
		missing := ""
		for _, prog := range strings.Fields(f.Needs) {
			if _, err := lookPath(prog); err != nil {
				missing = prog
				break
			}
		}
		if missing != "" {
			notes = append(notes, fmt.Sprintf("skipped %s: %s not found", f.Name, missing))
			continue
		}
		ok = append(ok, f)
	}
	return ok, notes
}

// result is one parsed benchmark line.
type result struct {
	Name       string             // without the -GOMAXPROCS suffix
	Iterations int64              // b.N
	Metrics    map[string]float64 // unit → value
}

var procsSuffix = regexp.MustCompile(`-[0-9]+$`)

// parseBench extracts the benchmark result lines of go test output:
// "BenchmarkName-P  N  v1 unit1  v2 unit2 …". Lines that are not results (pkg:
// headers, logs, a "--- FAIL" after a benchmark name) are skipped.
func parseBench(r io.Reader) []result {
	var out []result
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || len(f)%2 != 0 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		n, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			continue
		}
		res := result{Name: procsSuffix.ReplaceAllString(f[0], ""), Iterations: n, Metrics: map[string]float64{}}
		ok := true
		for i := 2; i < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				ok = false
				break
			}
			res.Metrics[f[i+1]] = v
		}
		if ok {
			out = append(out, res)
		}
	}
	return out
}

// samples holds every value seen: package → benchmark → metric → values.
type samples map[string]map[string]map[string][]float64

func (s samples) add(pkg string, results []result) {
	if s[pkg] == nil {
		s[pkg] = map[string]map[string][]float64{}
	}
	for _, r := range results {
		if s[pkg][r.Name] == nil {
			s[pkg][r.Name] = map[string][]float64{}
		}
		for unit, v := range r.Metrics {
			s[pkg][r.Name][unit] = append(s[pkg][r.Name][unit], v)
		}
	}
}

// value aggregates a bench's metric samples, and reports false if there are
// none. Interference on a shared machine only ever adds time, so a time per
// operation (a unit starting "ns/") takes the minimum and a rate (a unit
// ending "/s") the maximum: the best round is the one least disturbed. Any
// other metric (false-positive rate, bytes) takes the median.
func (s samples) value(pkg, bench, metric string) (float64, bool) {
	vs := s[pkg][bench][metric]
	if len(vs) == 0 {
		return 0, false
	}
	switch {
	case strings.HasPrefix(metric, "ns/"):
		return slices.Min(vs), true
	case strings.HasSuffix(metric, "/s"):
		return slices.Max(vs), true
	}
	return median(vs), true
}

// baseMetric is the metric read from f.Base.
func (f figure) baseMetric() string {
	if f.BaseMetric != "" {
		return f.BaseMetric
	}
	return f.Metric
}

// perRound is the median over the rounds of f.Bench/f.Base in the same
// round. Both must have a non-zero sample in every round.
func (s samples) perRound(f figure) (float64, error) {
	vs, bs := s[f.Pkg][f.Bench][f.Metric], s[f.Pkg][f.Base][f.baseMetric()]
	if len(vs) == 0 || len(vs) != len(bs) {
		return 0, fmt.Errorf("%w %s: %d rounds of %q for %s and %d of %q for %s in %s", errMissing, f.Name, len(vs), f.Metric, f.Bench, len(bs), f.baseMetric(), f.Base, f.Pkg)
	}
	rs := make([]float64, len(vs))
	for i := range vs {
		if bs[i] == 0 {
			return 0, fmt.Errorf("%w %s: %q of %s is 0 in round %d", errMissing, f.Name, f.baseMetric(), f.Base, i+1)
		}
		rs[i] = vs[i] / bs[i]
	}
	return median(rs), nil
}

func median(vs []float64) float64 {
	vs = slices.Sorted(slices.Values(vs))
	if len(vs)%2 == 1 {
		return vs[len(vs)/2]
	}
	return (vs[len(vs)/2-1] + vs[len(vs)/2]) / 2
}

// summarize computes every figure's BENCH line, in table order, and an error
// for each figure whose inputs are missing.
func summarize(figs []figure, s samples) (lines []string, missing []error) {
	for _, f := range figs {
		v, ok := s.value(f.Pkg, f.Bench, f.Metric)
		if !ok {
			missing = append(missing, fmt.Errorf("%w %s: no %q for %s in %s", errMissing, f.Name, f.Metric, f.Bench, f.Pkg))
			continue
		}
		if f.PerRound {
			r, err := s.perRound(f)
			if err != nil {
				missing = append(missing, err)
				continue
			}
			lines = append(lines, fmt.Sprintf("BENCH %s %s %s", f.Name, formatValue(r), f.Unit))
			continue
		}
		if f.Base != "" {
			base, ok := s.value(f.Pkg, f.Base, f.baseMetric())
			if !ok || base == 0 {
				missing = append(missing, fmt.Errorf("%w %s: no non-zero %q for %s in %s", errMissing, f.Name, f.baseMetric(), f.Base, f.Pkg))
				continue
			}
			v /= base
		}
		lines = append(lines, fmt.Sprintf("BENCH %s %s %s", f.Name, formatValue(v), f.Unit))
	}
	return lines, missing
}

// formatValue prints v with four significant digits and no exponent, so that
// 0.000108 and 861800 read as plain numbers.
func formatValue(v float64) string {
	if v == 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		return strconv.FormatFloat(v, 'f', -1, 64)
	}
	r, _ := strconv.ParseFloat(strconv.FormatFloat(v, 'g', 4, 64), 64)
	return strconv.FormatFloat(r, 'f', -1, 64)
}

// packages returns the distinct packages of figs in first-use order.
func packages(figs []figure) []string {
	var out []string
	for _, f := range figs {
		if !slices.Contains(out, f.Pkg) {
			out = append(out, f.Pkg)
		}
	}
	return out
}

// benchRegexp selects every top-level benchmark that pkg's figures name (and
// so all their sub-benchmarks).
func benchRegexp(pkg string, figs []figure) string {
	var tops []string
	for _, f := range figs {
		if f.Pkg != pkg {
			continue
		}
		for _, name := range []string{f.Bench, f.Base} {
			if name == "" {
				continue
			}
			top, _, _ := strings.Cut(name, "/")
			top = regexp.QuoteMeta(top)
			if !slices.Contains(tops, top) {
				tops = append(tops, top)
			}
		}
	}
	return "^(" + strings.Join(tops, "|") + ")$"
}

// testArgs returns the go test arguments of one package run and the
// directory to run them in: the main module's root (""), or for a package
// of a nested module that module's directory, with the package named
// relative to it.
func testArgs(pkg string, figs []figure, passthrough []string) (args []string, dir string) {
	args = []string{"test", "-run", "^$", "-bench", benchRegexp(pkg, figs), "-benchmem"}
	args = append(args, defaultTestFlags...)
	args = append(args, passthrough...)
	target := pkg
	for _, f := range figs {
		if f.Pkg == pkg && f.Module != "" {
			dir = f.Module
			rel, err := filepath.Rel(filepath.FromSlash(f.Module), filepath.FromSlash(pkg))
			if err != nil {
				rel = "."
			}
			target = "."
			if rel != "." {
				target = "./" + filepath.ToSlash(rel)
			}
			break
		}
	}
	return append(args, target), dir
}
