package main

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/consumer"
	"github.com/ckfrelay/ckfrelay/wasm/abi"
	"github.com/ckfrelay/ckfrelay/wire"
)

func TestRegistry_ViewStaysInsideOneBuffer(t *testing.T) {
	var r registry
	a, b := r.alloc(16), r.alloc(100)
	pa := base(a)
	for _, tc := range []struct {
		name string
		p    uintptr
		n    uint64
		ok   bool
	}{
		{"whole buffer", pa, 16, true},
		{"interior", pa + 4, 12, true},
		{"one past the end", pa + 4, 13, false},
		{"zero length anywhere", 12345, 0, true},
		{"null pointer", 0, 1, false},
		{"huge length", pa, 1 << 40, false},
		{"start at end", pa + 16, 1, false},
		{"other buffer", base(b) + 99, 1, true},
	} {
		v, ok := r.view(tc.p, tc.n)
		if assert.Equal(t, tc.ok, ok, "%s: ok", tc.name) && ok {
			assert.Equal(t, tc.n, uint64(len(v)), "%s: length", tc.name)
		}
	}
	assert.Nil(t, r.alloc(abi.MaxAlloc+1), "alloc above MaxAlloc: got a buffer, want nil")
	_, ok := r.view(pa+2, 4) // leaves a among the cached buffers
	require.True(t, ok)
	assert.True(t, r.free(pa), "free of a base")
	assert.False(t, r.free(pa), "second free of a base")
	assert.False(t, r.free(base(b)+1), "free of an interior pointer")
	{
		_, ok := r.view(pa, 1)
		assert.False(t, ok, "view of a freed buffer: got ok")
	}
	assert.Equal(t, 1, r.live(), "live = %d, want 1", r.live())
}

func testManifest() consumer.Manifest {
	d := ckf.Domain{CacheSemantics: ckf.ScopedDigest{Digest: [16]byte{1}}}
	m := consumer.Manifest{ConsumerInstance: 1, Domain: d, Format: ckf.NewFormat(ckf.DefaultSeed, 16), VerificationWindow: 2}
	m.Lanes[2] = &ckf.PoolID{Domain: d, DCID: 2}
	return m
}

func TestGuest_NotConfigured(t *testing.T) {
	var g guest
	out := make([]byte, 256)
	for name, code := range map[string]abi.Code{
		"assign":   g.assign(nil),
		"retire":   g.retire(0),
		"apply":    g.apply([]byte{0x90}),
		"query":    g.query(abi.QueryLocalHashes, nil, 0, 0, 0, out),
		"contains": g.contains(1),
		"status":   g.laneStatus(0, out),
		"words":    g.laneWords(0, out),
		"stats":    g.stats(out),
	} {
		assert.Equal(t, abi.ErrNotConfigured, code, "%s: got %v, want NotConfigured", name, code)
	}
}

func TestGuest_ConfigureFailureKeepsConsumer(t *testing.T) {
	var g guest
	m := testManifest()
	{
		c := g.configure(abi.AppendManifest(nil, &m))
		require.Equal(t, abi.OK, c, "configure: got %v (%s)", c, g.lastErr)
	}
	before := g.c
	big := m
	big.Format = ckf.NewFormat(ckf.DefaultSeed, 1<<24)
	for _, tc := range []struct {
		name string
		b    []byte
		want abi.Code
	}{
		{"garbage", []byte{1, 2, 3}, abi.ErrManifestEncoding},
		{"no lanes", abi.AppendManifest(nil, &consumer.Manifest{VerificationWindow: 2, Format: m.Format}), abi.ErrInvalidManifest},
		{"table above 1 GiB", abi.AppendManifest(nil, &big), abi.ErrOutOfMemory},
	} {
		assert.Equal(t, tc.want, g.configure(tc.b), tc.name)
		assert.Same(t, before, g.c, "%s: consumer kept", tc.name)
		assert.NotEmpty(t, g.lastErr, "%s: message", tc.name)
	}
}

func TestGuest_ApplyDecodeErrorDetail(t *testing.T) {
	var g guest
	m := testManifest()
	g.configure(abi.AppendManifest(nil, &m))
	frame, err := wire.AppendFrame(nil, &wire.Frame{Kind: wire.KindDrainMarker, Drain: ckf.DrainMarker{Lease: ckf.LaneLease{PhysicalLane: 2}}})
	require.NoError(t, err)
	c := g.apply(frame[:len(frame)-1])
	assert.Equal(t, abi.ErrFrameTruncated, c, "truncated")
	assert.Equal(t, -1, g.last.Result.Lane, "truncated: lane")
	assert.Equal(t, c, g.last.Code, "truncated: recorded code")
	c = g.apply(frame)
	assert.Equal(t, abi.Code(consumer.IgnoredForeignLease), c, "drain on an unassigned lane")
	assert.Equal(t, 2, g.last.Result.Lane, "drain on an unassigned lane: lane")
	assert.Equal(t, uint8(wire.KindDrainMarker), g.last.Kind, "drain on an unassigned lane: kind")
	l := g.frameLane(frame)
	assert.Equal(t, 2, l, "frameLane = %d, want 2", l)
	l = g.frameLane(frame[:3])
	assert.Equal(t, -1, l, "frameLane of a truncated frame = %d, want -1", l)
}

func TestGuest_QueryArguments(t *testing.T) {
	var g guest
	m := testManifest()
	g.configure(abi.AppendManifest(nil, &m))
	out := make([]byte, abi.QueryRecordSize)
	tq := abi.AppendTokenQuery(nil, make([]uint32, 9), ckf.HashOptions{Eagle: true, MM: [][]uint64{{1}, {2, 3}}})
	for _, tc := range []struct {
		name  string
		kind  int32
		in    []byte
		count int
		bs    int
		out   []byte
		want  abi.Code
	}{
		{"unknown kind", 4, nil, 0, 0, out, abi.ErrBadArgument},
		{"token query past the buffer", abi.QueryTokensWith, tq, len(tq) + 1, 4, out, abi.ErrBadArgument},
		{"token query cut short", abi.QueryTokensWith, tq[:len(tq)-8], len(tq) - 8, 4, out, abi.ErrBadArgument},
		{"token query, block size 0", abi.QueryTokensWith, tq, len(tq), 0, out, abi.ErrInvalidQuery},
		{"token query, no ready lane", abi.QueryTokensWith, tq, len(tq), 4, out, abi.ErrUnavailable},
		{"hashes past the buffer", abi.QueryLocalHashes, make([]byte, 15), 2, 0, out, abi.ErrBadArgument},
		{"tokens past the buffer", abi.QueryTokens, make([]byte, 7), 2, 4, out, abi.ErrBadArgument},
		{"record buffer too small", abi.QueryLocalHashes, nil, 0, 0, out[:79], abi.ErrBufferTooSmall},
		{"block size 0", abi.QueryTokens, make([]byte, 8), 2, 0, out, abi.ErrInvalidQuery},
		{"no ready lane", abi.QuerySequenceHashes, make([]byte, 8), 1, 0, out, abi.ErrUnavailable},
	} {
		c := g.query(tc.kind, tc.in, tc.count, tc.bs, 0, tc.out)
		assert.Equal(t, tc.want, c, "%s: got %v, want %v", tc.name, c, tc.want)
	}
	// The Unavailable record still says how many blocks were asked.
	var r consumer.QueryResult
	abi.ReadQueryRecord(out, &r)
	assert.Zero(t, r.Mask, "unavailable record: mask")
	assert.Equal(t, 1, r.Blocks, "unavailable record: blocks")
	require.Equal(t, abi.ErrUnavailable, g.query(abi.QueryTokensWith, tq, len(tq), 4, 0, out))
	abi.ReadQueryRecord(out, &r)
	assert.Equal(t, 2, r.Blocks, "unavailable token query record: blocks of 9 tokens in Eagle windows of 4+1")
	for _, l := range g.lists {
		assert.Nil(t, l, "no view of the host's buffer kept after the query")
	}
	words := make([]byte, 8*16)
	assert.Equal(t, abi.ErrUnavailable, g.laneWords(2, words), "lane words of a lane that is not ready")
	assert.Equal(t, make([]byte, 8*16), words, "lane words: nothing written")
	id := ckf.ProducerIdentity{Pool: *m.Lanes[2], ProducerIncarnation: 1, LayoutGeneration: 1, Format: m.Format}
	lease := ckf.LaneLease{ConsumerInstance: m.ConsumerInstance, PhysicalLane: 2, AssignmentEpoch: 1}
	require.Equal(t, abi.OK, g.assign(abi.AppendAssignment(nil, &id, &lease)))
	snap := make([]uint64, m.Format.BucketCount)
	for i := range snap {
		snap[i] = uint64(i + 1)
	}
	frame, err := wire.AppendFrame(nil, &wire.Frame{Kind: wire.KindSnapshotChunk, Snapshot: wire.SnapshotChunk{Identity: id, Lease: lease, Sequence: 1, ChunkCount: 1, Words: snap}})
	require.NoError(t, err)
	require.Equal(t, abi.Code(consumer.SnapshotInstalled), g.apply(frame))
	words = make([]byte, 8*len(snap))
	assert.Equal(t, abi.Code(len(snap)), g.laneWords(2, words), "lane words of the ready lane")
	assert.Equal(t, uint64(len(snap)), binary.LittleEndian.Uint64(words[8*(len(snap)-1):]), "last word")
	c := g.laneWords(2, words[:len(words)-8])
	assert.Equal(t, abi.ErrBufferTooSmall, c, "lane words short buffer: got %v, want BufferTooSmall", c)
}

// TestRegistry_QueryViewsRemembersBuffers: the query export checks the last
// query's buffers inline (within on queryIn and queryOut) and falls back to
// queryViews, which must check like view, remember the buffers it found,
// and forget them when one is freed.
func TestRegistry_QueryViewsRemembersBuffers(t *testing.T) {
	var r registry
	in, out, other := r.alloc(64), r.alloc(80), r.alloc(32)
	pin, pout := base(in), base(out)

	a, b, ok := r.queryViews(pin+8, 16, pout, 80)
	require.True(t, ok)
	assert.Equal(t, in[8:24], a)
	assert.Equal(t, out[:80], b)
	assert.Equal(t, pin, base(r.queryIn), "input buffer remembered")
	assert.Equal(t, pout, base(r.queryOut), "record buffer remembered")

	for _, tc := range []struct {
		name   string
		p      uintptr
		n      uint64
		q      uintptr
		m      uint64
		ok     bool
		length uint64
	}{
		{"input past its buffer", pin + 8, 57, pout, 80, false, 0},
		{"record past its buffer", pin, 8, pout + 1, 80, false, 0},
		{"input spanning two buffers", pin + 60, 8, pout, 80, false, 0},
		{"empty input anywhere", 12345, 0, pout, 80, true, 0},
		{"input in another buffer", base(other), 32, pout, 80, true, 32},
		{"null record", pin, 8, 0, 80, false, 0},
	} {
		a, _, ok := r.queryViews(tc.p, tc.n, tc.q, tc.m)
		if assert.Equal(t, tc.ok, ok, tc.name) && ok {
			assert.Equal(t, tc.length, uint64(len(a)), tc.name)
		}
	}

	require.True(t, r.free(pin))
	assert.Nil(t, r.queryIn, "free forgets the remembered input buffer")
	assert.Nil(t, r.queryOut, "free forgets the remembered record buffer")
	_, _, ok = r.queryViews(pin, 8, pout, 80)
	assert.False(t, ok, "a freed input buffer")
}

// TestGuest_AssignRefusesTablesPastTheLimit: with no format pinned, lanes
// assigned ever larger formats would grow the tables past MaxTableBytes (a
// fatal out-of-memory in wasm32): the assignment that would is refused with
// OutOfMemory before any table grows, and the lane is untouched.
func TestGuest_AssignRefusesTablesPastTheLimit(t *testing.T) {
	var g guest
	m := testManifest()
	m.Format = ckf.Format{}
	for l := range m.Lanes {
		p := ckf.PoolID{Domain: m.Domain, DCID: uint64(500 + l)}
		m.Lanes[l] = &p
	}
	require.Equal(t, abi.OK, g.configure(abi.AppendManifest(nil, &m)))
	assign := func(l int, buckets uint64) abi.Code {
		id := ckf.ProducerIdentity{Pool: *m.Lanes[l], ProducerIncarnation: 1, LayoutGeneration: 1, Format: ckf.NewFormat(uint64(l), buckets)}
		lease := ckf.LaneLease{ConsumerInstance: m.ConsumerInstance, PhysicalLane: uint8(l), AssignmentEpoch: 1}
		return g.assign(abi.AppendAssignment(nil, &id, &lease))
	}
	// 2^23 buckets is 64 MiB a lane in its own format: 16 of them is 1 GiB.
	for l := range 15 {
		require.Equal(t, abi.OK, assign(l, 1<<23), "lane %d", l)
	}
	require.Equal(t, uint64(15<<26), g.c.Stats().TableBytes)
	require.Equal(t, abi.ErrOutOfMemory, assign(15, 1<<24), "a 128 MiB lane past 1 GiB")
	s, err := g.c.LaneStatus(15)
	require.NoError(t, err)
	require.False(t, s.HasEpoch, "the refused lane is untouched")
	require.Equal(t, uint64(15<<26), g.c.Stats().TableBytes, "no table grew")
	require.Equal(t, abi.OK, assign(15, 1<<23), "exactly 1 GiB fits")
}
