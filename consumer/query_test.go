package consumer

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
)

// tokenLanes builds a consumer whose lane 0 holds the first d0 blocks of
// tokens and lane 1 the first d1, both hashed with salt.
func tokenLanes(t *testing.T, tokens []uint32, blockSize int, salt uint64, d0, d1 int) *Consumer {
	t.Helper()
	locals := ckf.AppendLocalBlockHashes(nil, tokens, blockSize, salt)
	seq := ckf.AppendSequenceHashes(nil, locals)
	var member [lanes][]bool
	for l, d := range []int{d0, d1} {
		member[l] = make([]bool, len(seq))
		for p := range d {
			member[l][p] = true
		}
	}
	c, _ := buildLanes(t, DefaultVerificationWindow, seq, member)
	return c
}

func TestConsumer_QueryForms(t *testing.T) {
	tokens := make([]uint32, 16*40+5) // 40 complete blocks and a partial one
	for i := range tokens {
		tokens[i] = uint32(i * 7)
	}
	salt := ckf.Salt("adapter", "")
	c := tokenLanes(t, tokens, 16, salt, 40, 13)
	locals := ckf.AppendLocalBlockHashes(nil, tokens, 16, salt)
	seq := ckf.AppendSequenceHashes(nil, locals)

	want := QueryResult{Mask: 0b11, Blocks: 40}
	want.Depths[0], want.Depths[1] = 40, 13
	check := func(name string, err error, res QueryResult) {
		t.Helper()
		res.Probes = 0
		require.NoError(t, err, name)
		require.Equal(t, want, res, name)
	}
	var res QueryResult
	check("Query", c.Query(locals, &res), res)
	check("QuerySequenceHashes", c.QuerySequenceHashes(seq, &res), res)
	check("QuerySequenceHashesLinear", c.QuerySequenceHashesLinear(seq, &res), res)
	check("QueryTokens", c.QueryTokens(tokens, 16, salt, &res), res)

	check("QueryTokensWith, no options", c.QueryTokensWith(tokens, 16, salt, ckf.HashOptions{}, &res), res)
	// A block's multimodal hashes change its key and every later one's.
	require.NoError(t, c.QueryTokensWith(tokens, 16, salt, ckf.HashOptions{MM: [][]uint64{5: {42}}}, &res), "mm")
	require.Equal(t, uint32(5), res.Depths[0], "mm at block 5: lane 0")
	require.Equal(t, uint32(5), res.Depths[1], "mm at block 5: lane 1")
	require.ErrorIs(t, c.QueryTokensWith(tokens, 0, salt, ckf.HashOptions{}, &res), ErrInvalidQuery)

	// Another salt (the base model) shares no block with the adapter's.
	require.NoError(t, c.QueryTokens(tokens, 16, ckf.BaseSalt, &res), "base salt")
	require.Equal(t, [lanes]uint32{}, res.Depths, "base salt: all depths 0")
	// A prefix of the request answers at most its own length.
	require.NoError(t, c.Query(locals[:10], &res), "prefix")
	require.Equal(t, uint32(10), res.Depths[0], "prefix: lane 0")
	require.Equal(t, uint32(10), res.Depths[1], "prefix: lane 1")
	require.Equal(t, 10, res.Blocks, "prefix: blocks")
	require.NoError(t, c.Query(nil, &res), "empty query")
	require.Zero(t, res.Blocks, "empty query: blocks")
	require.Equal(t, uint16(0b11), res.Mask, "empty query: mask")
	require.Zero(t, res.Probes, "empty query: probes")
	m, err := c.Contains(seq[20])
	require.NoError(t, err, "Contains(seq[20])")
	require.Equal(t, uint16(0b01), m, "Contains(seq[20])")
	m, err = c.Contains(seq[5])
	require.NoError(t, err, "Contains(seq[5])")
	require.Equal(t, uint16(0b11), m, "Contains(seq[5])")
}

func TestConsumer_QueryErrors(t *testing.T) {
	f := newFixture(t)
	var res QueryResult
	res.Depths[3] = 9
	err := f.c.Query([]uint64{1, 2}, &res)
	require.ErrorIs(t, err, ErrUnavailable)
	require.Zero(t, res.Mask, "a failed query clears the mask")
	require.Equal(t, [lanes]uint32{}, res.Depths, "a failed query clears the depths")
	_, err = f.c.Contains(1)
	require.ErrorIs(t, err, ErrUnavailable, "Contains")
	f.ready(1, 1, 1)
	for name, err := range map[string]error{
		"block size 0":     f.c.QueryTokens([]uint32{1, 2}, 0, ckf.BaseSalt, &res),
		"block size -1":    f.c.QueryTokens([]uint32{1, 2}, -1, ckf.BaseSalt, &res),
		"nil result":       f.c.Query([]uint64{1}, nil),
		"nil result (seq)": f.c.QuerySequenceHashes([]uint64{1}, nil),
	} {
		assert.ErrorIs(t, err, ErrInvalidQuery, "%s", name)
	}
	require.NoError(t, f.c.QueryTokens([]uint32{1, 2, 3}, 4, ckf.BaseSalt, &res), "only a partial block")
	require.Zero(t, res.Blocks, "only a partial block: blocks")
	require.Equal(t, uint16(0b10), res.Mask, "only a partial block: mask")
}

func TestConsumer_QueriesDoNotAllocate(t *testing.T) {
	tokens := make([]uint32, 16*256)
	for i := range tokens {
		tokens[i] = uint32(i)
	}
	c := tokenLanes(t, tokens, 16, ckf.BaseSalt, 200, 31)
	locals := ckf.AppendLocalBlockHashes(nil, tokens, 16, ckf.BaseSalt)
	seq := ckf.AppendSequenceHashes(nil, locals)
	var res QueryResult
	for name, fn := range map[string]func(){
		"Query":               func() { _ = c.Query(locals, &res) },
		"QuerySequenceHashes": func() { _ = c.QuerySequenceHashes(seq, &res) },
		"QueryTokens":         func() { _ = c.QueryTokens(tokens, 16, ckf.BaseSalt, &res) },
		"Contains":            func() { _, _ = c.Contains(seq[3]) },
	} {
		fn() // grow the scratch once
		got := testing.AllocsPerRun(50, fn)
		assert.Equal(t, float64(0), got, "%s: got %v allocations per run, want 0", name, got)
		assert.False(t, res.Depths[0] != 200 && name != "Contains", "%s: got depth %d, want 200", name, res.Depths[0])
	}
}

func TestConsumer_ApplyDoesNotAllocate(t *testing.T) {
	f := newFixture(t)
	l := f.ready(0, 1, 0)
	d := f.delta(0, l, 0, 1, ckf.BucketImage{Bucket: 1, Word: 2}, ckf.BucketImage{Bucket: 9, Word: 3})
	got := testing.AllocsPerRun(100, func() {
		if r := f.c.ApplyDelta(d); r.Outcome != Applied {
			require.Fail(t, fmt.Sprintf("got %v, want Applied", r))
		}
		d.BaseSequence++
		d.Sequence++
	})
	require.Equal(t, float64(0), got, "got %v allocations per delta, want 0", got)
}

func TestConsumer_StatsCountQueriesAndProbes(t *testing.T) {
	f := newFixture(t)
	f.ready(0, 1, 1)
	var res QueryResult
	_ = f.c.QuerySequenceHashes([]uint64{1, 2, 3}, &res)
	_, _ = f.c.Contains(5)
	s := f.c.Stats()
	require.Equal(t, Stats{Queries: 2, Probes: uint64(res.Probes) + 1, BucketCount: testBuckets, TableBytes: testBuckets * 16 * 8, Groups: 1, ReadyMask: 1}, s)
}
