package replay

import (
	"bytes"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeExplainer answers fixed causes and records its calls.
type fakeExplainer struct {
	over, under Cause
	err         error
	calls       []string
}

func (f *fakeExplainer) ExplainOver(d, truth int) (Cause, error) {
	f.calls = append(f.calls, "over")
	return f.over, f.err
}

func (f *fakeExplainer) ExplainUnder(d, reported, truth int) (Cause, error) {
	f.calls = append(f.calls, "under")
	return f.under, f.err
}

func TestScorer_ObserveCounts(t *testing.T) {
	type obs struct {
		truth, reported []int
		chosen, served  int
		blocks          int
	}
	tests := []struct {
		name string
		ex   *fakeExplainer
		obs  []obs
		want Report
	}{
		{
			name: "exact answers agree",
			obs:  []obs{{[]int{3, 0, 1}, []int{3, 0, 1}, 0, 0, 4}},
			want: Report{Requests: 1, RequestBlocks: 4, Agree: 1, WarmRequests: 1, WarmAgree: 1, Lanes: 3,
				HitBlocks: 3, AgreementPct: 100, WarmAgreementPct: 100, HitRatePct: 75, Unclassified: true},
		},
		{
			name: "cold request agrees, hit where served",
			obs:  []obs{{[]int{0, 0}, []int{0, 0}, 1, 1, 5}},
			want: Report{Requests: 1, RequestBlocks: 5, Agree: 1, Lanes: 2, AgreementPct: 100, Unclassified: true},
		},
		{
			name: "over- and under-report, wrong pick, served elsewhere",
			obs:  []obs{{[]int{1, 4, 0}, []int{3, 2, 0}, 0, 2, 6}},
			want: Report{Requests: 1, RequestBlocks: 6, WarmRequests: 1, Lanes: 3, OverReports: 1, OverBlocks: 2,
				UnderReports: 1, UnderBlocks: 2, Unclassified: true},
		},
		{
			name: "a lane without an answer is not compared",
			obs:  []obs{{[]int{2, 5}, []int{2, -1}, 0, 0, 5}},
			want: Report{Requests: 1, RequestBlocks: 5, WarmRequests: 1, Lanes: 1, LanesNotReady: 1, HitBlocks: 2,
				HitRatePct: 40, Unclassified: true},
		},
		{
			name: "explainer classifies",
			ex:   &fakeExplainer{over: CauseFalsePositive, under: CauseCapacity | CauseInFlight | CauseUnexplained},
			obs: []obs{
				{[]int{1, 4, 0}, []int{3, 2, 0}, 1, 1, 6},
				{[]int{0, 2, 0}, []int{0, 2, 1}, 1, 1, 2},
			},
			want: Report{Requests: 2, RequestBlocks: 8, Agree: 2, WarmRequests: 2, WarmAgree: 2, Lanes: 6,
				OverReports: 2, OverBlocks: 3, OverFalsePositive: 2, UnderReports: 1, UnderBlocks: 2,
				UnderCapacity: 1, UnderInFlight: 1, UnexplainedUnderReports: 1, HitBlocks: 6,
				AgreementPct: 100, WarmAgreementPct: 100, HitRatePct: 75},
		},
		{
			name: "stale over-report",
			ex:   &fakeExplainer{over: CauseStale},
			obs:  []obs{{[]int{0}, []int{1}, 0, 0, 1}},
			want: Report{Requests: 1, RequestBlocks: 1, Agree: 1, Lanes: 1, OverReports: 1, OverBlocks: 1,
				OverStale: 1, AgreementPct: 100},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var ex Explainer
			if tt.ex != nil {
				ex = tt.ex
			}
			s, err := NewScorer(len(tt.obs[0].truth), ex)
			require.NoError(t, err)
			for _, o := range tt.obs {
				require.NoError(t, s.Observe(o.truth, o.reported, o.chosen, o.served, o.blocks, time.Microsecond), "Observe")
			}
			var got Report
			s.Fill(&got)
			tt.want.QueryP50Ns, tt.want.QueryP99Ns = 1000, 1000
			assert.Equal(t, tt.want, got, "got  %+v\nwant %+v", got, tt.want)
		})
	}
}

func TestScorer_ObserveRejectsMalformed(t *testing.T) {
	tests := []struct {
		name            string
		truth, reported []int
		chosen, served  int
		blocks          int
	}{
		{"short truth", []int{1}, []int{1, 1}, 0, 0, 1},
		{"short answers", []int{1, 1}, []int{1}, 0, 0, 1},
		{"chosen out of range", []int{1, 1}, []int{1, 1}, 2, 0, 1},
		{"served negative", []int{1, 1}, []int{1, 1}, 0, -1, 1},
		{"negative blocks", []int{1, 1}, []int{1, 1}, 0, 0, -1},
		{"negative truth", []int{1, -1}, []int{1, 1}, 0, 0, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, _ := NewScorer(2, nil)
			err := s.Observe(tt.truth, tt.reported, tt.chosen, tt.served, tt.blocks, 0)
			require.ErrorIs(t, err, ErrObservation, "got %v, want ErrObservation", err)
			var got Report
			s.Fill(&got)
			assert.Equal(t, Report{Unclassified: true}, got, "got %+v after a rejected observation, want nothing counted", got)
		})
	}
}

func TestNewScorer_RejectsDataCenters(t *testing.T) {
	for _, n := range []int{0, -1, 17} {
		_, err := NewScorer(n, nil)
		assert.ErrorIs(t, err, ErrInvalidConfig, "NewScorer(%d) = %v, want ErrInvalidConfig", n, err)
	}
}

func TestScorer_ExplainerErrorIsReturned(t *testing.T) {
	boom := errors.New("boom")
	s, _ := NewScorer(1, &fakeExplainer{err: boom})
	{
		err := s.Observe([]int{2}, []int{1}, 0, 0, 2, 0)
		require.ErrorIs(t, err, boom, "got %v, want the explainer's error", err)
	}
}

func TestScorer_ProbeFPR(t *testing.T) {
	tests := []struct {
		name      string
		loads     []float64
		mask      func(i int) uint16
		fail      int // probe index whose Contains fails; -1 never
		probes    int
		wantFPR   float64
		wantBound float64
		wantErr   bool
	}{
		{"no hits", []float64{0.5, 0.5}, func(int) uint16 { return 0 }, -1, 100, 0, 1 - math.Pow(1-1.0/65535, 4), false},
		// Every 10th key is held by lane 0 and by lane 5, which does not
		// exist: only lane 0 counts.
		{"lanes beyond the count are ignored", []float64{0.25, 0.75}, func(i int) uint16 {
			if i%10 == 0 {
				return 1 | 1<<5
			}
			return 0
		}, -1, 100, 10.0 / 200, (1 - math.Pow(1-1.0/65535, 2) + 1 - math.Pow(1-1.0/65535, 6)) / 2, false},
		{"a failing probe stops", []float64{1, 1}, func(int) uint16 { return 3 }, 50, 100, 100.0 / 200,
			1 - math.Pow(1-1.0/65535, 8), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, _ := NewScorer(len(tt.loads), nil)
			i := 0
			err := s.ProbeFPR(func(uint64) (uint16, error) {
				defer func() { i++ }()
				if i == tt.fail {
					return 0, errors.New("lane gone")
				}
				return tt.mask(i), nil
			}, tt.loads, tt.probes, 1)
			require.Equal(t, tt.wantErr, (err != nil), "got error %v, want error: %v", err, tt.wantErr)
			var r Report
			s.Fill(&r)
			assert.False(t, r.FPR != tt.wantFPR || math.Abs(r.FPRBound-tt.wantBound) > 1e-15 || r.FPRProbes != tt.probes, "got FPR %v bound %v probes %d, want %v, %v, %d", r.FPR, r.FPRBound, r.FPRProbes, tt.wantFPR, tt.wantBound, tt.probes)
			assert.False(t, r.FPRBound > 0 && r.FPRRatio != r.FPR/r.FPRBound, "got ratio %v, want %v", r.FPRRatio, r.FPR/r.FPRBound)
		})
	}
	s, _ := NewScorer(2, nil)
	err := s.ProbeFPR(func(uint64) (uint16, error) { return 0, nil }, []float64{0.5}, 1, 1)
	assert.ErrorIs(t, err, ErrObservation, "ProbeFPR with one load for two lanes = %v, want ErrObservation", err)
}

func TestScorer_QueryWindowAndFreshness(t *testing.T) {
	s, _ := NewScorer(1, nil)
	for i := 1; i <= 100; i++ {
		_ = s.Observe([]int{0}, []int{0}, 0, 0, 0, time.Duration(i)*time.Microsecond)
	}
	p50, p99, mark := s.QueryWindow(0)
	assert.False(t, p50 != 51*time.Microsecond || p99 != 100*time.Microsecond || mark != 100, "got p50 %v p99 %v mark %d, want 51µs 100µs 100", p50, p99, mark)
	_ = s.Observe([]int{0}, []int{0}, 0, 0, 0, time.Millisecond)
	p50, _, mark = s.QueryWindow(mark)
	assert.False(t, p50 != time.Millisecond || mark != 101, "got window p50 %v mark %d, want 1ms over the last query, mark 101", p50, mark)
	s.ObserveFreshness(2 * time.Millisecond)
	s.ObserveFreshness(4 * time.Millisecond)
	var r Report
	s.Fill(&r)
	assert.False(t, r.FreshnessP50Ms != 4 || r.FreshnessP99Ms != 4 || s.Requests() != 101 || s.AgreementPct() != 100, "got freshness %v/%v, %d requests, agreement %v; want 4/4, 101, 100", r.FreshnessP50Ms, r.FreshnessP99Ms, s.Requests(), s.AgreementPct())
}

func TestWriteTable_UnmeasuredAndUnclassified(t *testing.T) {
	full := &Report{Policy: "cache-aware", UnexplainedUnderReports: 0, CapacityOmissions: 7, FPR: 1e-4, FPRBound: 1e-4, FPRRatio: 1}
	demo := &Report{Policy: "demo", Unclassified: true, OverReports: 2, OverBlocks: 5,
		Unmeasured: []string{"capacity_omissions", "rank_hit_rate_pct", "fpr"}}
	var buf bytes.Buffer
	require.NoError(t, WriteTable(&buf, full, demo))
	rows := map[string][]string{}
	for _, l := range strings.Split(buf.String(), "\n") {
		if label, rest, ok := strings.Cut(l, "  "); ok {
			rows[label] = strings.Fields(rest)
		}
	}
	for _, tc := range []struct{ row, want string }{
		{"capacity omissions", "7 n/a"},
		{"unexplained under-reports", "0 n/a"},
		{"cache hit rate (DC / rank)", "0.0% / 0.0% 0.0% / n/a"},
		{"false-positive rate", "0.0001 (bound 0.0001, 1.00×) n/a"},
		{"over-reports (lanes, blocks)", "0, 0 (fp 0, stale 0) 2, 5 (unclassified)"},
	} {
		got := strings.Join(rows[tc.row], " ")
		assert.Equal(t, tc.want, got, "row %q: got %q, want %q\n%s", tc.row, got, tc.want, buf.String())
	}
}
