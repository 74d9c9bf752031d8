// Package report writes a replay's results as a self-contained directory:
// an HTML page with SVG plots (the TTFT CDF per run, the rank hit rate and
// rank imbalance over time, the multi-DC trade-off sweep) and the JSON they
// are drawn from. `relay replay --report DIR` and `relay demo --report DIR`
// write it. Plots are drawn with gonum.org/v1/plot.
package report

import (
	"encoding/json"
	"fmt"
	"html/template"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/ckfrelay/ckfrelay/internal/sim/replay"
)

// Page is what a report shows.
type Page struct {
	Title   string           `json:"title"`
	Trace   string           `json:"trace"`
	Command string           `json:"command"` // how to reproduce it
	Reports []*replay.Report `json:"reports"`
	Sweep   replay.Sweep     `json:"sweep"`
}

// Files a report directory holds.
const (
	IndexFile     = "index.html"
	JSONFile      = "report.json"
	TTFTFile      = "ttft_cdf.svg"
	HitRateFile   = "hit_rate.svg"
	ImbalanceFile = "imbalance.svg"
	TradeOffFile  = "tradeoff.svg"
)

// Write writes the page into dir (created if missing): IndexFile, JSONFile
// and the four SVG plots.
func Write(dir string, p Page) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(p, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, JSONFile), append(b, '\n'), 0o644); err != nil {
		return err
	}
	plots := []struct {
		file string
		draw func(Page) (*plot.Plot, error)
	}{
		{TTFTFile, TTFTCDF}, {HitRateFile, HitRate}, {ImbalanceFile, Imbalance}, {TradeOffFile, TradeOff},
	}
	for _, pl := range plots {
		plt, err := pl.draw(p)
		if err != nil {
			return fmt.Errorf("report: %s: %w", pl.file, err)
		}
		if err := Save(plt, 18*vg.Centimeter, 10*vg.Centimeter, filepath.Join(dir, pl.file)); err != nil {
			return fmt.Errorf("report: %s: %w", pl.file, err)
		}
	}
	f, err := os.Create(filepath.Join(dir, IndexFile))
	if err != nil {
		return err
	}
	if err := page.Execute(f, p); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// TTFTCDF plots every run's TTFT distribution (log time axis).
func TTFTCDF(p Page) (*plot.Plot, error) {
	plt := newPlot("Time to first token (latency model)", "TTFT (ms, log scale)", "fraction of requests")
	plt.X.Scale = plot.LogScale{}
	plt.X.Tick.Marker = plot.LogTicks{Prec: -1}
	var lines []any
	for _, r := range p.Reports {
		var xy plotter.XYs
		for q, ms := range r.TTFTCDFMs {
			xy = append(xy, plotter.XY{X: math.Max(ms, 0.1), Y: float64(q) / 100})
		}
		if len(xy) > 0 {
			lines = append(lines, r.Name(), xy)
		}
	}
	return plt, plotutil.AddLines(plt, lines...)
}

// HitRate plots every run's rank hit rate per window of requests.
func HitRate(p Page) (*plot.Plot, error) {
	return series(p, "Rank cache hit rate per 100 requests", "hit rate (%)",
		func(s replay.SeriesPoint) float64 { return s.RankHitRatePct })
}

// Imbalance plots every run's rank imbalance per window of requests.
func Imbalance(p Page) (*plot.Plot, error) {
	return series(p, "Rank load imbalance per 100 requests", "max / mean requests per rank",
		func(s replay.SeriesPoint) float64 { return s.RankImbalance })
}

func series(p Page, title, ylabel string, y func(replay.SeriesPoint) float64) (*plot.Plot, error) {
	plt := newPlot(title, "requests", ylabel)
	var lines []any
	for _, r := range p.Reports {
		var xy plotter.XYs
		for _, s := range r.Series {
			xy = append(xy, plotter.XY{X: float64(s.Requests), Y: y(s)})
		}
		if len(xy) > 0 {
			lines = append(lines, r.Name(), xy)
		}
	}
	return plt, plotutil.AddLines(plt, lines...)
}

// TradeOff plots the sweep: how many times faster the first token comes
// from the remote data center holding the prefix than from recomputing it at
// home, per round trip, against prompt length (both log scales; above the
// dashed line at 1 the remote data center wins).
func TradeOff(p Page) (*plot.Plot, error) {
	plt := newPlot("Remote cached prefix vs recompute at home (idle ranks)", "prompt tokens (log scale)",
		"home TTFT / remote TTFT (log scale)")
	plt.X.Scale = plot.LogScale{}
	plt.X.Tick.Marker = plot.LogTicks{Prec: -1}
	// Y is plotted as log10 on a linear axis with decade labels: gonum places
	// an axis label at the middle of the axis's value range, which on a log
	// scale sits near the top, and pads the plot down by the label's overhang
	// (an empty band under the title).
	plt.Y.Tick.Marker = decadeTicks{}
	s := p.Sweep
	var lines []any
	for i, rtt := range s.RTTMs {
		var xy plotter.XYs
		for j, tok := range s.PromptTokens {
			xy = append(xy, plotter.XY{X: float64(tok), Y: math.Log10(math.Max(s.Speedup[i][j], 1e-3))})
		}
		lines = append(lines, fmt.Sprintf("RTT %g ms", rtt), xy)
	}
	if err := plotutil.AddLines(plt, lines...); err != nil {
		return nil, err
	}
	one := plotter.NewFunction(func(float64) float64 { return 0 }) // log10(1)
	one.Color = color.Gray{Y: 128}
	one.Dashes = []vg.Length{vg.Points(2), vg.Points(2)}
	plt.Add(one)
	return plt, nil
}

// decadeTicks labels a log10-valued axis at its integer values as the
// powers of ten they stand for (0 → "1", 2 → "100", -1 → "0.1").
type decadeTicks struct{}

func (decadeTicks) Ticks(lo, hi float64) []plot.Tick {
	var ticks []plot.Tick
	for e := math.Floor(lo); e <= math.Ceil(hi); e++ {
		if e >= lo && e <= hi {
			ticks = append(ticks, plot.Tick{Value: e, Label: strconv.FormatFloat(math.Pow(10, e), 'g', -1, 64)})
		}
	}
	return ticks
}

// legendGap separates the data area from the legend beside it.
const legendGap = 4 * vg.Millimeter

// Save writes plt to file (the format from its extension, as plot.Save) with
// the legend in a column right of the data instead of over it: the curves
// of every plot here reach every corner at some point.
func Save(plt *plot.Plot, w, h vg.Length, file string) error {
	format := strings.TrimPrefix(strings.ToLower(filepath.Ext(file)), ".")
	c, err := draw.NewFormattedCanvas(w, h, format)
	if err != nil {
		return err
	}
	data, legend := Split(plt, draw.New(c))
	leg := plt.Legend
	plt.Legend = plot.NewLegend()
	plt.Draw(data)
	plt.Legend = leg
	leg.Draw(legend)
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := c.WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// Split divides c into the plot's data area and, right of it, the column
// its legend is drawn in (top-aligned, below the title's height).
func Split(plt *plot.Plot, c draw.Canvas) (data, legend draw.Canvas) {
	width := plt.Legend.Rectangle(c).Size().X
	if width == 0 {
		return c, draw.Crop(c, c.Size().X, 0, 0, 0)
	}
	data = draw.Crop(c, 0, -(width + legendGap), 0, 0)
	legend = draw.Crop(c, c.Size().X-width, 0, 0, -plt.Title.TextStyle.Height(plt.Title.Text)-plt.Title.Padding)
	legend.Rectangle.Min.X = data.Max.X + legendGap
	return data, legend
}

func newPlot(title, x, y string) *plot.Plot {
	plt := plot.New()
	plt.Title.Text = title
	plt.X.Label.Text = x
	plt.Y.Label.Text = y
	plt.Legend.Top = true // in its own column (Save), from the top
	plt.Legend.Left = true
	plt.Add(plotter.NewGrid())
	return plt
}

var page = template.Must(template.New("report").Funcs(template.FuncMap{
	"f1": func(v float64) string { return fmt.Sprintf("%.1f", v) },
	"f2": func(v float64) string { return fmt.Sprintf("%.2f", v) },
	"f0": func(v float64) string { return fmt.Sprintf("%.0f", v) },
}).Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{{.Title}}</title>
<style>body{font-family:sans-serif;max-width:70em;margin:2em auto;padding:0 1em}
table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.2em .6em;text-align:right}
th:first-child,td:first-child{text-align:left}img{max-width:100%}code{background:#f4f4f4}</style></head>
<body><h1>{{.Title}}</h1>
<p>Trace: {{.Trace}}. Reproduce: <code>{{.Command}}</code>. Figures: <a href="report.json">report.json</a>.</p>
<h2>Runs</h2>
<table><tr><th>run</th><th>TTFT p50 ms</th><th>p90</th><th>p99</th><th>queue p50 ms</th><th>p99</th>
<th>rank imbalance</th><th>prefill saved %</th><th>DC hit %</th><th>rank hit %</th><th>remote %</th><th>agreement %</th></tr>
{{range .Reports}}<tr><td>{{.Name}}</td><td>{{f0 .TTFTP50Ms}}</td><td>{{f0 .TTFTP90Ms}}</td><td>{{f0 .TTFTP99Ms}}</td>
<td>{{f0 .QueueP50Ms}}</td><td>{{f0 .QueueP99Ms}}</td><td>{{f2 .RankImbalance}}</td><td>{{f1 .PrefillSavedPct}}</td>
<td>{{f1 .HitRatePct}}</td><td>{{f1 .RankHitRatePct}}</td><td>{{f1 .RemotePct}}</td><td>{{printf "%.3f" .AgreementPct}}</td></tr>
{{end}}</table>
<h2>Time to first token</h2><img src="ttft_cdf.svg" alt="TTFT CDF per run">
<h2>Over time</h2><img src="hit_rate.svg" alt="rank hit rate over time"><img src="imbalance.svg" alt="rank imbalance over time">
<h2>Multi-DC trade-off</h2>
<p>A request whose prompt another data center holds (all but its last block): how many times sooner its first
token comes when served there, paying the round trip, than when recomputed at home, on idle ranks. It pays to go
remote while the round trip is shorter than the cached prefix's prefill time (break-even per prompt length
below); the cache-aware cost makes the same call (<code>router_remote</code> in report.json).</p>
<img src="tradeoff.svg" alt="trade-off sweep">
<table><tr><th>prompt tokens</th>{{range .Sweep.PromptTokens}}<th>{{.}}</th>{{end}}</tr>
<tr><td>break-even RTT ms</td>{{range .Sweep.BreakEvenRTTMs}}<td>{{f1 .}}</td>{{end}}</tr></table>
</body></html>
`))
