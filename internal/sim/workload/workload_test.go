package workload

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
)

func TestTraceReader_Mooncake(t *testing.T) {
	f, err := os.Open("testdata/mooncake_head200.jsonl")
	require.NoError(t, err)
	defer f.Close()
	reqs, err := ReadTrace(f)
	require.NoError(t, err, "ReadTrace")
	got, want := len(reqs), 200
	require.Equal(t, want, got, "read %d requests, want %d", got, want)
	got, want = len(reqs[0].HashIDs), 79
	assert.Equal(t, want, got, "first request has %d blocks, want %d", got, want)
	assert.EqualValues(t, 40160, reqs[0].InputLength, "first request input length")
	assert.EqualValues(t, 6, reqs[0].OutputLength, "first request output length")
}

func TestTraceReader_MalformedLineNumbers(t *testing.T) {
	good := `{"timestamp": 1, "input_length": 512, "output_length": 1, "hash_ids": [1]}`
	cases := []struct {
		name  string
		input string
		line  int
	}{
		{"bad json", good + "\n{not json}\n", 2},
		{"missing hash_ids", good + "\n\n" + `{"timestamp": 2}` + "\n", 3},
		{"missing timestamp", `{"hash_ids": [1]}`, 1},
		{"negative id", good + "\n" + `{"timestamp": 2, "hash_ids": [-1]}`, 2},
		{"time goes back", `{"timestamp": 5, "hash_ids": []}` + "\n" + `{"timestamp": 4, "hash_ids": []}`, 2},
		{"negative length", `{"timestamp": 5, "input_length": -1, "hash_ids": []}`, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := ReadTrace(strings.NewReader(c.input))
			var te *TraceError
			require.ErrorAs(t, err, &te)
			assert.Equal(t, c.line, te.Line, "line of %v", err)
			assert.ErrorIs(t, err, ErrMalformedTrace)
		})
	}
}

// TestFleet_PoolMatchesGroundTruth replays trace requests through a small
// fleet into one ckf.Pool per data center and checks that the exact pool
// state equals the fleet's ground truth after every request: the events a
// rank emits are always valid (no unknown parent), and ownership equals
// what the ranks hold.
func TestFleet_PoolMatchesGroundTruth(t *testing.T) {
	f, err := os.Open("testdata/mooncake_head200.jsonl")
	require.NoError(t, err)
	defer f.Close()
	reqs, err := ReadTrace(f)
	require.NoError(t, err)
	fleet, err := NewFleet(FleetConfig{DataCenters: 3, WorkersPerDC: 2, RanksPerWorker: 2, BlocksPerRank: 300})
	require.NoError(t, err)
	pools := make([]*ckf.Pool, 3)
	for i := range pools {
		cfg := ckf.DefaultConfig()
		cfg.ExpectedBlocks = 4 * 300 * 2 // generous: no capacity omissions expected
		pools[i], err = ckf.NewPool(cfg)
		require.NoError(t, err)
	}
	var events []ckf.RouterEvent
	for n, req := range reqs {
		chain := Chain(req.HashIDs)
		locals := make([]uint64, len(req.HashIDs))
		for i, id := range req.HashIDs {
			locals[i] = TokensHash(id)
		}
		dc, r := n%3, (n/3)%fleet.Ranks()
		events = fleet.Serve(events[:0], dc, r, chain, locals)
		for i := range events {
			out := pools[dc].ApplyEvent(&events[i])
			require.NoError(t, out.FirstError, "request %d: pool rejected %v event", n, events[i].Kind)
		}
		got, want := pools[dc].Stats().UniqueBlocks, fleet.HeldBlocks(dc)
		require.Equal(t, want, got, "request %d dc %d: pool tracks %d unique blocks, fleet holds %d", n, dc, got, want)
		for i, c := range chain {
			owners, resident := pools[dc].Owners(c)
			held := fleet.dcs[dc].held[c]
			require.Equal(t, held, int(owners), "request %d block %d: pool owners (want the fleet's ranks holding it)", n, i)
			if held > 0 {
				require.True(t, resident, "request %d block %d: held but not resident", n, i)
			}
		}
		d := fleet.Depth(dc, chain)
		require.LessOrEqual(t, d, len(chain), "request %d: dc depth %d inconsistent with rank depth %d", n, d, fleet.RankDepth(dc, r, chain))
		require.GreaterOrEqual(t, d, fleet.RankDepth(dc, r, chain), "request %d: dc depth %d inconsistent with rank depth %d", n, d, fleet.RankDepth(dc, r, chain))
	}
}

func TestFleet_EvictionKeepsCapacity(t *testing.T) {
	fleet, err := NewFleet(FleetConfig{DataCenters: 1, WorkersPerDC: 1, RanksPerWorker: 1, BlocksPerRank: 10})
	require.NoError(t, err)
	g := NewSynthetic(DefaultSyntheticConfig())
	pool, _ := ckf.NewPool(ckf.Config{ExpectedBlocks: 64, Seed: ckf.DefaultSeed, MaxKicks: 500, VerificationWindow: 2, PublishEveryNEvents: 1})
	var events []ckf.RouterEvent
	for range 500 {
		req := g.Next()
		chain := Chain(req.HashIDs)
		locals := make([]uint64, len(req.HashIDs))
		for i, id := range req.HashIDs {
			locals[i] = TokensHash(id)
		}
		events = fleet.Serve(events[:0], 0, 0, chain, locals)
		for i := range events {
			out := pool.ApplyEvent(&events[i])
			require.NoError(t, out.FirstError, "pool rejected event")
		}
		got := fleet.HeldBlocks(0)
		require.LessOrEqual(t, got, 10, "rank holds %d blocks, capacity 10", got)
		got, want := pool.Stats().UniqueBlocks, fleet.HeldBlocks(0)
		require.Equal(t, want, got, "pool tracks %d blocks, fleet holds %d", got, want)
	}
}

func TestSynthetic_SharesPrefixes(t *testing.T) {
	g := NewSynthetic(DefaultSyntheticConfig())
	first := map[uint64]int{}
	for range 1000 {
		r := g.Next()
		first[r.HashIDs[0]]++
	}
	top := 0
	for _, n := range first {
		top = max(top, n)
	}
	assert.GreaterOrEqual(t, top, 100, "most popular system prompt starts %d of 1000 requests; want a Zipf head ≥ 100", top)
}
