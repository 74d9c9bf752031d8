// Benchsummary runs the project's side-by-side benchmarks and ends with one
// summary line per figure:
//
//	BENCH <name> <value> <unit>
//
// It is what `make bench` runs. For every package named in the figure table it
// runs
//
//	go test -run '^$' -bench '^(BenchmarkA|BenchmarkB)$' -benchmem <defaults> <passthrough> <pkg>
//
// streaming the raw output, repeats that -rounds times (package by package, so
// the rounds interleave in time and a burst of load on the shared machine hits
// one sample, not one variant), then prints the figures. A figure's value
// aggregates its samples: the minimum of a time per op (ns/…), the maximum of
// a rate (…/s), the median of anything else, because interference only ever
// makes a run slower; a ratio divides the benchmark's aggregate by the
// baseline's, both from the same runs. A figure whose benchmark needs a
// program that is not installed (Needs, e.g. node) is skipped with a note.
// -figures=REGEXP runs only the figures whose name matches (`go run
// ./internal/cmd/benchsummary -figures '^runtimes_'` is the four-runtime
// table alone). Arguments after
// "--" are passed to go test after the defaults, so `make bench
// BENCHFLAGS='-benchtime=1s'` overrides the default -benchtime; the Makefile
// passes BENCHROUNDS as -rounds.
//
// # Adding a figure
//
// Append one entry to the figures table in figures.go:
//
//	{Name: "consumer_query_vs_native", Pkg: "./consumer",
//	 Bench: "BenchmarkLaneQuery/impl=wasm", Base: "BenchmarkLaneQuery/impl=native",
//	 Metric: "ns/op", Unit: "ratio"},
//
// Name is the BENCH name (snake_case, prefixed by the package); Pkg is the
// package directory relative to the module root; Bench is the benchmark as go
// test prints it without the -GOMAXPROCS suffix (so names must not end in
// "-<digits>"); Metric is the unit column to read (ns/op, B/op, or any
// b.ReportMetric unit); Base, when set, makes the figure Bench/Base
// (BaseMetric, when set, is the column read from Base: a benchmark that times
// both sides of a ratio in turns reports both, and PerRound then makes the
// figure the median of the same-round ratios). The
// package's benchmark run selects every top-level benchmark the table names,
// with all their sub-benchmarks, so keep those bounded. A missing figure
// (benchmark failed or not found) is reported on stderr and makes the exit
// status 1; the other figures are still printed.
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
)

// defaultTestFlags keep one round of `make bench` to about 6 s of CPU (five
// rounds ≈ 30 s; wall time grows with the shared machine's load); passthrough
// flags come later and win.
var defaultTestFlags = []string{"-benchtime=200ms"}

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

// run is the whole command; it returns the exit status.
func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("benchsummary", flag.ContinueOnError)
	fs.SetOutput(stderr)
	goCmd := fs.String("go", "go", "go command to run")
	rounds := fs.Int("rounds", 5, "times to run each package's benchmarks (samples are interleaved)")
	dryRun := fs.Bool("n", false, "print the go test commands without running them")
	only := fs.String("figures", "", "run only the figures whose name matches this regexp (e.g. ^runtimes_)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *rounds < 1 {
		fmt.Fprintf(stderr, "benchsummary: -rounds %d: want ≥ 1\n", *rounds)
		return 2
	}
	passthrough := fs.Args()
	selected := figures
	if *only != "" {
		re, err := regexp.Compile(*only)
		if err != nil {
			fmt.Fprintf(stderr, "benchsummary: -figures: %v\n", err)
			return 2
		}
		selected = nil
		for _, f := range figures {
			if re.MatchString(f.Name) {
				selected = append(selected, f)
			}
		}
	}
	figs, notes := available(selected, exec.LookPath)
	for _, n := range notes {
		fmt.Fprintf(stderr, "benchsummary: %s\n", n)
	}

	samples := samples{}
	status := 0
	for round := 1; round <= *rounds && status == 0; round++ {
		rfigs := inRound(figs, round)
		for _, pkg := range packages(rfigs) {
			argv, dir := testArgs(pkg, rfigs, passthrough)
			where := ""
			if dir != "" {
				where = " (in " + dir + ")"
			}
			fmt.Fprintf(stdout, "# round %d/%d: %s %q%s\n", round, *rounds, *goCmd, argv, where)
			if *dryRun {
				continue
			}
			var raw bytes.Buffer
			cmd := exec.Command(*goCmd, argv...)
			cmd.Dir = dir
			cmd.Stdout = io.MultiWriter(stdout, &raw)
			cmd.Stderr = stderr
			err := cmd.Run()
			samples.add(pkg, parseBench(&raw))
			if err != nil {
				fmt.Fprintf(stderr, "benchsummary: %s: %v\n", pkg, err)
				status = 1
				break
			}
		}
	}
	if *dryRun {
		return 0
	}
	lines, missing := summarize(figs, samples)
	for _, l := range lines {
		fmt.Fprintln(stdout, l)
	}
	for _, err := range missing {
		fmt.Fprintf(stderr, "benchsummary: %v\n", err)
	}
	if len(missing) > 0 {
		status = 1
	}
	return status
}

// errMissing reports a figure whose inputs were not in the output.
var errMissing = errors.New("missing figure")
