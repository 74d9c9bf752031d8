package replay

import (
	"context"
	"errors"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/client"
	"github.com/ckfrelay/ckfrelay/consumer"
	"github.com/ckfrelay/ckfrelay/internal/sim/workload"
	"github.com/ckfrelay/ckfrelay/wasm/host"
)

// slice returns the first n requests of the embedded trace.
func slice(t testing.TB, n int) []workload.Request {
	t.Helper()
	reqs, err := EmbeddedTrace()
	require.NoError(t, err, "EmbeddedTrace")
	return reqs[:min(n, len(reqs))]
}

// pressured is a configuration that makes both excuses for an under-report
// happen on a slice of the trace: small rank caches (evictions), a filter
// sized for far fewer blocks than a data center holds (capacity omissions)
// and a propagation lag longer than the gap between turns (in-flight deltas).
func pressured(dcs int, p Policy) Config {
	cfg := DefaultConfig()
	cfg.DataCenters, cfg.Policy = dcs, p
	cfg.BlocksPerRank = 256
	cfg.ExpectedBlocks = 1200
	cfg.Lag = 2 * time.Second
	cfg.FPRProbes = 1000
	return cfg
}

// small shrinks the filter for spread-out placements, where each of many
// data centers holds few blocks.
func small(c Config) Config { c.ExpectedBlocks = 400; return c }

func TestEmbeddedTrace_Shape(t *testing.T) {
	reqs := slice(t, 1<<30)
	distinct := map[uint64]bool{}
	refs := 0
	for _, r := range reqs {
		refs += len(r.HashIDs)
		for _, id := range r.HashIDs {
			distinct[id] = true
		}
	}
	require.Len(t, reqs, 3993, "got %d requests, %d block refs, %d distinct blocks; want 3993, 121877, 43924", len(reqs), refs, len(distinct))
	require.Equal(t, 121877, refs, "got %d requests, %d block refs, %d distinct blocks; want 3993, 121877, 43924", len(reqs), refs, len(distinct))
	require.Len(t, distinct, 43924, "got %d requests, %d block refs, %d distinct blocks; want 3993, 121877, 43924", len(reqs), refs, len(distinct))
}

func TestRun_ExactIndexIsExact(t *testing.T) {
	reqs := slice(t, 800)
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"dcs=1", pressured(1, CacheAware)},
		{"dcs=3/cache-aware", pressured(3, CacheAware)},
		{"dcs=3/random", pressured(3, Random)},
		{"dcs=3/round-robin", pressured(3, RoundRobin)},
		{"dcs=16/random", small(pressured(16, Random))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Exact = true
			r, err := Run(context.Background(), tc.cfg, reqs)
			require.NoError(t, err, "Run")
			assert.False(t, r.Requests != uint64(len(reqs)) || r.Agree != r.Requests || r.AgreementPct != 100, "got agreement %d of %d (%.3f%%), want all %d", r.Agree, r.Requests, r.AgreementPct, len(reqs))
			assert.False(t, r.OverReports != 0 || r.UnderReports != 0 || r.UnexplainedUnderReports != 0, "got over %d under %d unexplained %d, want 0", r.OverReports, r.UnderReports, r.UnexplainedUnderReports)
			// The slice must really stress the harness, or "exact" proves little.
			assert.False(t, r.WarmRequests == 0 || r.CapacityOmissions == 0 || r.Lanes != r.Requests*uint64(tc.cfg.DataCenters), "got warm %d, omissions %d, lanes %d: the slice does not exercise sharing and capacity", r.WarmRequests, r.CapacityOmissions, r.Lanes)
		})
	}
}

func TestRun_EveryUnderReportIsExplained(t *testing.T) {
	reqs := slice(t, 1500)
	for _, tc := range []struct {
		name               string
		cfg                Config
		wantCap, wantInfly bool
	}{
		{"capacity+lag/cache-aware", pressured(3, CacheAware), true, true},
		{"capacity+lag/random", pressured(3, Random), true, true},
		{"capacity+lag/dcs=16", small(pressured(16, RoundRobin)), true, true},
		{"lag-only", func() Config { c := pressured(3, CacheAware); c.ExpectedBlocks = 0; return c }(), false, true},
		{"capacity-only", func() Config { c := pressured(3, CacheAware); c.Lag = 0; return c }(), true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := Run(context.Background(), tc.cfg, reqs)
			require.NoError(t, err, "Run")
			assert.Equal(t, uint64(0), r.UnexplainedUnderReports, "got %d unexplained under-reports of %d, want 0", r.UnexplainedUnderReports, r.UnderReports)
			assert.Equal(t, tc.wantCap, r.UnderCapacity > 0, "got %d under-reports explained by capacity, want some: %v", r.UnderCapacity, tc.wantCap)
			assert.Equal(t, tc.wantInfly, r.UnderInFlight > 0, "got %d under-reports explained by in-flight deltas, want some: %v", r.UnderInFlight, tc.wantInfly)
			assert.LessOrEqual(t, r.UnderReports, r.UnderCapacity+r.UnderInFlight, "got %d under-reports but only %d+%d explanations", r.UnderReports, r.UnderCapacity, r.UnderInFlight)
			assert.Equal(t, r.OverFalsePositive+r.OverStale, r.OverReports, "got %d over-reports, %d false positives + %d stale", r.OverReports, r.OverFalsePositive, r.OverStale)
			assert.False(t, tc.cfg.Lag == 0 && r.OverStale != 0, "got %d stale over-reports without lag; want 0", r.OverStale)
		})
	}
}

// TestRun_MissingExplanationIsCaught proves the under-report check can fail:
// without in-flight tracking, the lag's under-reports are unexplained.
func TestRun_MissingExplanationIsCaught(t *testing.T) {
	cfg := pressured(3, CacheAware)
	cfg.ExpectedBlocks = 0 // no capacity omission to hide behind
	cfg.testSkipInflight = true
	r, err := Run(context.Background(), cfg, slice(t, 1500))
	require.NoError(t, err, "Run")
	require.NotEqual(t, uint64(0), r.UnderReports, "got %d unexplained of %d under-reports, want all of them (and some)", r.UnexplainedUnderReports, r.UnderReports)
	require.Equal(t, r.UnderReports, r.UnexplainedUnderReports, "got %d unexplained of %d under-reports, want all of them (and some)", r.UnexplainedUnderReports, r.UnderReports)
}

// TestRun_FullTraceTargets holds the targets on the whole trace at
// the default 3-DC and at 16 DCs: agreement ≥ 99.9%, no unexplained
// under-report, FPR within 1.5× of the theoretical bound.
func TestRun_FullTraceTargets(t *testing.T) {
	n := 1 << 30
	if testing.Short() { // the race detector makes the whole trace slow
		n = 1000
	}
	reqs := slice(t, n)
	for _, dcs := range []int{3, 16} {
		cfg := DefaultConfig()
		cfg.DataCenters = dcs
		if testing.Short() {
			cfg.FPRProbes = 100_000
		}
		r, err := Run(context.Background(), cfg, reqs)
		require.NoError(t, err, "dcs=%d: Run", dcs)
		assert.False(t, r.AgreementPct < 99.9 || r.UnexplainedUnderReports != 0, "dcs=%d: got agreement %.3f%%, %d unexplained under-reports; want ≥ 99.9%%, 0", dcs, r.AgreementPct, r.UnexplainedUnderReports)
		assert.False(t, !testing.Short() && (r.FPRRatio > 1.5 || r.FPRRatio < 1/1.5), "dcs=%d: got FPR %.3g vs bound %.3g (ratio %.2f) at load %.3f, want within 1.5×", dcs, r.FPR, r.FPRBound, r.FPRRatio, r.FilterLoad)
		assert.False(t, r.Requests != uint64(len(reqs)) || r.Events == 0 || r.Deltas == 0 || r.ProducerBytesPerBlock <= 0 || r.ConsumerBytes == 0, "dcs=%d: got %+v, want a populated report", dcs, r)
	}
}

func TestRun_CacheAwareBeatsRandom(t *testing.T) {
	reqs := slice(t, 2000)
	hit := map[Policy]float64{}
	for _, p := range []Policy{CacheAware, Random, RoundRobin} {
		cfg := DefaultConfig()
		cfg.Policy, cfg.BlocksPerRank, cfg.FPRProbes = p, 512, 1000
		r, err := Run(context.Background(), cfg, reqs)
		require.NoError(t, err, "%v: Run", p)
		hit[p] = r.HitRatePct
	}
	require.True(t, hit[CacheAware] > hit[Random]+5 && hit[CacheAware] > hit[RoundRobin]+5, "got hit rates %v, want cache-aware well above random and round-robin", hit)
}

// TestRun_WasmConsumerMatchesNative routes through the WebAssembly consumer:
// every accuracy figure equals the native consumer's, because the replay is
// deterministic and both consumers implement the same contract.
func TestRun_WasmConsumerMatchesNative(t *testing.T) {
	if testing.Short() {
		t.Skip("compiles the wasm module (~1 s)")
	}
	ctx := context.Background()
	rt, err := host.NewRuntime(ctx, host.NewConfig())
	require.NoError(t, err, "NewRuntime")
	defer rt.Close(ctx)
	reqs := slice(t, 600)
	cfg := pressured(3, CacheAware)
	native, err := Run(ctx, cfg, reqs)
	require.NoError(t, err, "native")
	var instances []*host.Instance
	var mu sync.Mutex
	cfg.NewConsumer = func(m consumer.Manifest) (client.Lanes, error) {
		in, err := rt.NewInstance(ctx, m)
		mu.Lock()
		instances = append(instances, in)
		mu.Unlock()
		return in, err
	}
	wasm, err := Run(ctx, cfg, reqs)
	require.NoError(t, err, "wasm")
	require.Len(t, instances, 1, "got %d wasm instances, want 1 (the consumer was not used)", len(instances))
	type acc struct{ agree, over, overB, under, underB, cap, infl, unexpl, hits, fprHits uint64 }
	pick := func(r *Report) acc {
		return acc{r.Agree, r.OverReports, r.OverBlocks, r.UnderReports, r.UnderBlocks, r.UnderCapacity,
			r.UnderInFlight, r.UnexplainedUnderReports, r.HitBlocks, uint64(r.FPR * float64(r.FPRProbes*r.DataCenters))}
	}
	g, w := pick(wasm), pick(native)
	require.Equal(t, w, g, "got wasm %+v, want native %+v", g, w)
	require.NotEqual(t, uint64(0), native.UnderReports, "the comparison saw no under-report; it would not notice a divergence")
}

func TestRun_Errors(t *testing.T) {
	ctx := context.Background()
	reqs := slice(t, 10)
	backwards := []workload.Request{{TimestampMs: 5, HashIDs: []uint64{1}}, {TimestampMs: 4, HashIDs: []uint64{2}}}
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	for _, tc := range []struct {
		name string
		ctx  context.Context
		cfg  func(*Config)
		reqs []workload.Request
		want error
	}{
		{"dcs=0", ctx, func(c *Config) { c.DataCenters = 0 }, reqs, ErrInvalidConfig},
		{"dcs=17", ctx, func(c *Config) { c.DataCenters = 17 }, reqs, ErrInvalidConfig},
		{"workers=0", ctx, func(c *Config) { c.WorkersPerDC = 0 }, reqs, ErrInvalidConfig},
		{"ranks=0", ctx, func(c *Config) { c.RanksPerWorker = 0 }, reqs, ErrInvalidConfig},
		{"blocks=0", ctx, func(c *Config) { c.BlocksPerRank = 0 }, reqs, ErrInvalidConfig},
		{"expected too large", ctx, func(c *Config) { c.ExpectedBlocks = 1 << 62 }, reqs, ErrInvalidConfig},
		{"policy=0", ctx, func(c *Config) { c.Policy = 0 }, reqs, ErrInvalidConfig},
		{"cadence=0", ctx, func(c *Config) { c.PublishEveryNEvents = 0 }, reqs, ErrInvalidConfig},
		{"delay=0", ctx, func(c *Config) { c.PublicationDelay = 0 }, reqs, ErrInvalidConfig},
		{"lag<0", ctx, func(c *Config) { c.Lag = -1 }, reqs, ErrInvalidConfig},
		{"speed<0", ctx, func(c *Config) { c.Speed = -1 }, reqs, ErrInvalidConfig},
		{"probes<0", ctx, func(c *Config) { c.FPRProbes = -1 }, reqs, ErrInvalidConfig},
		{"time goes backwards", ctx, func(c *Config) {}, backwards, ErrInvalidConfig},
		{"canceled", canceled, func(c *Config) {}, reqs, context.Canceled},
		{"consumer fails", ctx, func(c *Config) {
			c.NewConsumer = func(consumer.Manifest) (client.Lanes, error) { return nil, host.ErrClosed }
		}, reqs, host.ErrClosed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.FPRProbes = 10
			tc.cfg(&cfg)
			r, err := Run(tc.ctx, cfg, tc.reqs)
			require.ErrorIs(t, err, tc.want, "got %v, %v; want nil, %v", r, err, tc.want)
			require.Nil(t, r, "got %v, %v; want nil, %v", r, err, tc.want)
			var ce *ConfigError
			require.False(t, errors.Is(tc.want, ErrInvalidConfig) && (!errors.As(err, &ce) || ce.Field == ""), "got %T %v, want a *ConfigError naming the field", err, err)
		})
	}
}

func TestRun_SpeedFollowsTraceClock(t *testing.T) {
	reqs := []workload.Request{{TimestampMs: 0, HashIDs: []uint64{1, 2}}, {TimestampMs: 40, HashIDs: []uint64{1, 2, 3}}}
	cfg := DefaultConfig()
	cfg.Speed, cfg.FPRProbes = 2, 10 // 40 ms of trace at twice the speed: ≥ 20 ms
	start := time.Now()
	r, err := Run(context.Background(), cfg, reqs)
	require.NoError(t, err, "Run")
	el := time.Since(start)
	require.GreaterOrEqual(t, el, 20*time.Millisecond, "got %v wall for 40 ms of trace at speed 2, want ≥ 20 ms", el)
	require.Equal(t, uint64(2), r.Requests, "got %d requests, %d hit blocks; want 2, 2", r.Requests, r.HitBlocks)
	require.Equal(t, uint64(2), r.HitBlocks, "got %d requests, %d hit blocks; want 2, 2", r.Requests, r.HitBlocks)
}

func TestReadTrace_MalformedLineNamesIt(t *testing.T) {
	for _, tc := range []struct {
		name, text string
		line       int
	}{
		{"bad json", `{"timestamp": 0, "hash_ids": [1]}` + "\n" + `{"timestamp": 1, "hash_ids": [2,}` + "\n", 2},
		{"missing ids", "\n\n" + `{"timestamp": 3}` + "\n", 3},
		{"negative id", `{"timestamp": 0, "hash_ids": [-1]}`, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ReadTrace(strings.NewReader(tc.text))
			var te *workload.TraceError
			require.ErrorAs(t, err, &te, "got %v, want a *workload.TraceError at line %d", err, tc.line)
			require.Equal(t, tc.line, te.Line, "got %v, want a *workload.TraceError at line %d", err, tc.line)
			require.ErrorIs(t, err, workload.ErrMalformedTrace, "got %v, want a *workload.TraceError at line %d", err, tc.line)
			require.Contains(t, err.Error(), "line", "got message %q, want it to name the line", err)
		})
	}
	_, err := ReadTrace(strings.NewReader("\n"))
	require.ErrorIs(t, err, ErrEmptyTrace, "got %v for an empty trace, want ErrEmptyTrace", err)
}

func TestRepeat_ShiftsIDsAndTime(t *testing.T) {
	reqs := []workload.Request{{TimestampMs: 0, HashIDs: []uint64{0, 1}}, {TimestampMs: 9, HashIDs: []uint64{0, 7}}}
	got := Repeat(reqs, 3)
	require.Len(t, got, 6, "got %d requests, want 6", len(got))
	for p := range 3 {
		for i, r := range reqs {
			g := got[p*2+i]
			assert.Equal(t, r.TimestampMs+int64(p)*10, g.TimestampMs, "pass %d req %d: got timestamp %d, want %d", p, i, g.TimestampMs, r.TimestampMs+int64(p)*10)
			for j, id := range r.HashIDs {
				assert.Equal(t, id+uint64(p)*8, g.HashIDs[j], "pass %d req %d: got id %d, want %d", p, i, g.HashIDs[j], id+uint64(p)*8)
			}
		}
	}
	require.Equal(t, uint64(7), reqs[1].HashIDs[1], "Repeat modified its input")
	require.Len(t, Repeat(reqs, 1), 2, "Repeat(…, 1) changed the trace")
}

func TestParsePolicy_RoundTrips(t *testing.T) {
	require.Len(t, Policies(), 5)
	for _, p := range Policies() {
		got, err := ParsePolicy(p.String())
		require.NoError(t, err, p.String())
		assert.Equal(t, p, got)
		assert.NoError(t, func() error { c := DefaultConfig(); c.Policy = p; return c.Validate() }(), p.String())
	}
	_, err := ParsePolicy("best")
	assert.ErrorIs(t, err, ErrInvalidConfig)
	c := DefaultConfig()
	c.Policy = LoadOnly + 1
	assert.ErrorIs(t, c.Validate(), ErrInvalidConfig)
}

// TestConfig_ValidateRoutingAndLatency: a bad routing or latency field is a
// *ConfigError naming it.
func TestConfig_ValidateRoutingAndLatency(t *testing.T) {
	for name, mutate := range map[string]func(*Config){
		"negative weight":      func(c *Config) { c.Routing.OverlapWeight = -1 },
		"NaN temperature":      func(c *Config) { c.Routing.Temperature = math.NaN() },
		"negative balance":     func(c *Config) { c.Routing.BalanceRel = -0.5 },
		"zero block tokens":    func(c *Config) { c.Latency.BlockTokens = 0 },
		"zero prefill":         func(c *Config) { c.Latency.PrefillTokensPerSec = 0 },
		"NaN decode":           func(c *Config) { c.Latency.DecodeTokensPerSec = math.NaN() },
		"negative rtt":         func(c *Config) { c.Latency.RTT = -time.Millisecond },
		"short matrix":         func(c *Config) { c.Latency.RTTMatrix = [][]time.Duration{{0}} },
		"ragged matrix":        func(c *Config) { c.Latency.RTTMatrix = [][]time.Duration{{0, 0, 0}, {0}, {0, 0, 0}} },
		"negative matrix cell": func(c *Config) { c.Latency.RTTMatrix = [][]time.Duration{{0, -1, 0}, {0, 0, 0}, {0, 0, 0}} },
	} {
		c := DefaultConfig()
		mutate(&c)
		err := c.Validate()
		var ce *ConfigError
		require.ErrorAs(t, err, &ce, name)
		assert.Contains(t, []string{"routing", "latency"}, ce.Field, name)
	}
}

// TestRun_OddRequests: a request with no blocks, one repeating an id, and a
// request longer than a rank's whole cache are served without error, in both
// answer modes, and the exact mode stays exact.
func TestRun_OddRequests(t *testing.T) {
	long := make([]uint64, 300)
	for i := range long {
		long[i] = uint64(1000 + i)
	}
	reqs := []workload.Request{
		{TimestampMs: 0, HashIDs: []uint64{}},
		{TimestampMs: 1, HashIDs: []uint64{7, 7, 7}},
		{TimestampMs: 2, HashIDs: long},
		{TimestampMs: 2, HashIDs: long},
		{TimestampMs: 3, HashIDs: []uint64{7, 7}},
	}
	for _, exact := range []bool{false, true} {
		cfg := DefaultConfig()
		cfg.BlocksPerRank, cfg.Exact, cfg.FPRProbes = 64, exact, 10
		r, err := Run(context.Background(), cfg, reqs)
		require.NoError(t, err, "exact=%v: Run", exact)
		require.Equal(t, uint64(5), r.Requests, "exact=%v: got %+v", exact, r)
		require.Equal(t, uint64(0), r.UnexplainedUnderReports, "exact=%v: got %+v", exact, r)
		require.False(t, exact && (r.OverReports != 0 || r.UnderReports != 0), "exact=%v: got %+v", exact, r)
		// The last request finds the two leading blocks of the second. The
		// exact index also sends the second "long" request to the 64 blocks
		// its twin left; the filter cannot see them yet (same millisecond,
		// before the 1 ms timer), an explained in-flight under-report.
		want := uint64(2)
		if exact {
			want += 64
		} else {
			require.NotZero(t, r.UnderInFlight, "got no in-flight under-report for the back-to-back twins")
		}
		require.Equal(t, want, r.HitBlocks, "exact=%v: got %d hit blocks, want %d", exact, r.HitBlocks, want)
	}
}
