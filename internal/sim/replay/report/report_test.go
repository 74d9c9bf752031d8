package report_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/vg"
	vgdraw "gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/ckfrelay/ckfrelay/internal/sim/replay"
	"github.com/ckfrelay/ckfrelay/internal/sim/replay/report"
)

func TestWrite_PageJSONAndPlots(t *testing.T) {
	cdf := make([]float64, 101)
	for i := range cdf {
		cdf[i] = float64(i * i) // includes 0: the log axis must cope
	}
	runs := []*replay.Report{
		{Policy: "cache-aware", TTFTCDFMs: cdf, TTFTP50Ms: 2500, Series: []replay.SeriesPoint{{Requests: 100, RankHitRatePct: 40, RankImbalance: 1.5}}},
		{Policy: "cache-aware", Exact: true, TTFTCDFMs: cdf},
		{Policy: "random"}, // no latency figures: drawn as nothing, not an error
	}
	l := replay.DefaultLatency()
	page := report.Page{Title: "t", Trace: "tiny", Command: "relay replay", Reports: runs,
		Sweep: replay.TradeOff(l, replay.DefaultRouting(), replay.DefaultSweepRTTs, replay.DefaultSweepPrompts)}
	dir := filepath.Join(t.TempDir(), "out")
	require.NoError(t, report.Write(dir, page))

	for _, f := range []string{report.TTFTFile, report.HitRateFile, report.ImbalanceFile, report.TradeOffFile} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		require.NoError(t, err, f)
		assert.True(t, strings.HasPrefix(strings.TrimSpace(string(b)), "<?xml") || strings.Contains(string(b), "<svg"), f)
	}
	html, err := os.ReadFile(filepath.Join(dir, report.IndexFile))
	require.NoError(t, err)
	for _, want := range []string{"cache-aware (exact)", "random", report.TTFTFile, report.TradeOffFile, "2500"} {
		assert.Contains(t, string(html), want)
	}
	var back report.Page
	b, err := os.ReadFile(filepath.Join(dir, report.JSONFile))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &back))
	assert.Equal(t, page, back, "the JSON holds exactly what the page shows")
}

func TestWrite_UnwritableDirFails(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(file, nil, 0o644))
	assert.Error(t, report.Write(filepath.Join(file, "sub"), report.Page{}))
}

// Every plot's legend sits in its own column right of the data, and no plot
// leaves a band between its title and its data (a Y label longer than the
// axis pushed TradeOff's data down by a quarter of the image).
func TestPlots_LegendBesideTheDataAndNoEmptyBand(t *testing.T) {
	cdf := make([]float64, 101)
	for i := range cdf {
		cdf[i] = float64(i * i)
	}
	series := []replay.SeriesPoint{{Requests: 100, RankHitRatePct: 40, RankImbalance: 1.5}, {Requests: 200, RankHitRatePct: 90, RankImbalance: 3}}
	page := report.Page{Reports: []*replay.Report{
		{Policy: "cache-aware", TTFTCDFMs: cdf, Series: series},
		{Policy: "random", TTFTCDFMs: cdf, Series: series},
	}, Sweep: replay.TradeOff(replay.DefaultLatency(), replay.DefaultRouting(), replay.DefaultSweepRTTs, replay.DefaultSweepPrompts)}
	const w, h = 18 * vg.Centimeter, 10 * vg.Centimeter
	for name, draw := range map[string]func(report.Page) (*plot.Plot, error){
		report.TTFTFile: report.TTFTCDF, report.HitRateFile: report.HitRate,
		report.ImbalanceFile: report.Imbalance, report.TradeOffFile: report.TradeOff,
	} {
		plt, err := draw(page)
		require.NoError(t, err, name)
		c := vgdraw.New(vgimg.New(w, h))
		data, legend := report.Split(plt, c)
		area := plt.DataCanvas(data)
		assert.GreaterOrEqual(t, legend.Min.X, area.Max.X, "%s: the legend column starts right of the data", name)
		assert.Greater(t, legend.Size().X, vg.Length(0), "%s: the plot has a legend", name)
		band := c.Max.Y - area.Max.Y
		assert.Less(t, float64(band), 0.12*float64(h), "%s: %.1f pt between the image's top and the data", name, float64(band))
	}
}
