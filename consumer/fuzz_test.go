package consumer

import (
	"encoding/binary"
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/wire"
)

// clone returns a deep copy of c's lane state and table (not query scratch).
func (c *Consumer) clone() *Consumer {
	d := &Consumer{manifest: c.manifest, window: c.window, ready: c.ready, lanes: c.lanes, seen: slices.Clone(c.seen)}
	copies := map[*group]*group{}
	for _, g := range c.groups {
		h := *g
		h.words = slices.Clone(g.words)
		copies[g] = &h
		d.groups = append(d.groups, &h)
	}
	for i := range d.lanes {
		if g := d.lanes[i].grp; g != nil {
			d.lanes[i].grp = copies[g]
		}
	}
	d.regroup()
	return d
}

// statuses returns every lane's status without its counters.
func statuses(c *Consumer) [lanes]LaneStatus {
	var s [lanes]LaneStatus
	for i := range lanes {
		s[i], _ = c.LaneStatus(i)
		s[i].Stats = LaneStats{}
	}
	return s
}

// fuzzConsumer returns a consumer with lane 0 ready at sequence 5 (epoch 1),
// lane 1 assigned and waiting for a snapshot (epoch 2), lane 2 mid-way
// through a 2-chunk snapshot at sequence 3 (epoch 3).
func fuzzConsumer(t testing.TB) *Consumer {
	c, err := New(testManifest(3, testBuckets))
	require.NoError(t, err)
	must := func(r Result, o Outcome) {
		require.Equal(t, o, r.Outcome, "setup: got %v, want %v", r, o)
	}
	for l, e := range []uint64{1, 2, 3} {
		require.NoError(t, c.Assign(testIdentity(l, testBuckets), testLease(l, e)))
	}
	must(c.InstallSnapshot(&ckf.Snapshot{Identity: testIdentity(0, testBuckets), Lease: testLease(0, 1), Sequence: 5, Words: testWords(1, testBuckets)}), SnapshotInstalled)
	must(c.ApplySnapshotChunk(chunk(2, testLease(2, 3), 3, 0, 2, 0, testWords(2, 32))), SnapshotChunkAccepted)
	return c
}

// fuzzSeeds returns encoded frames that exercise every kind on every lane.
func fuzzSeeds(t testing.TB) [][]byte {
	frames := []wire.Frame{
		{Kind: wire.KindDelta, Delta: ckf.Delta{Identity: testIdentity(0, testBuckets), Lease: testLease(0, 1), BaseSequence: 5, Sequence: 6,
			Images: []ckf.BucketImage{{Bucket: 1, Word: 2}, {Bucket: 63, Word: 0}}}},
		{Kind: wire.KindDelta, Delta: ckf.Delta{Identity: testIdentity(0, testBuckets), Lease: testLease(0, 1), BaseSequence: 5, Sequence: 6,
			Images: []ckf.BucketImage{{Bucket: 1, Word: 2}, {Bucket: 1, Word: 0}}}},
		{Kind: wire.KindDelta, Delta: ckf.Delta{Identity: testIdentity(2, testBuckets), Lease: testLease(2, 3), BaseSequence: 3, Sequence: 4,
			Images: []ckf.BucketImage{{Bucket: 1, Word: 2}}}},
		{Kind: wire.KindSnapshotChunk, Snapshot: *chunk(1, testLease(1, 2), 9, 0, 1, 0, testWords(3, testBuckets))},
		{Kind: wire.KindSnapshotChunk, Snapshot: *chunk(2, testLease(2, 3), 3, 1, 2, 32, testWords(4, 32))},
		{Kind: wire.KindSnapshotChunk, Snapshot: *chunk(2, testLease(2, 3), 3, 1, 2, 30, testWords(4, 34))},
		{Kind: wire.KindSnapshotChunk, Snapshot: *chunk(0, testLease(0, 1), 7, 0, 1, 0, testWords(3, testBuckets))},
		{Kind: wire.KindDrainMarker, Drain: ckf.DrainMarker{Lease: testLease(0, 1), ExpectedSequence: 5}},
		{Kind: wire.KindDrainMarker, Drain: ckf.DrainMarker{Lease: testLease(0, 1), ExpectedSequence: 6}},
		{Kind: wire.KindHeartbeat, Heartbeat: wire.Heartbeat{Identity: testIdentity(0, testBuckets), Lease: testLease(0, 1), LastSequence: 5, UnixMicros: 9}},
		{Kind: wire.KindClose, Close: wire.Close{Reason: wire.CloseLagged, Message: "slow"}},
	}
	var out [][]byte
	for i := range frames {
		b, err := wire.AppendFrame(nil, &frames[i])
		require.NoError(t, err, "seed %d", i)
		out = append(out, b)
	}
	return out
}

// FuzzConsumer_ApplyFrameBytes applies arbitrary bytes to a configured
// consumer. It must never panic; a frame that does not decode, or that is
// ignored, leaves every lane and the table untouched; a fault leaves the
// table untouched; and the zero-copy path agrees exactly with decoding
// (wire.DecodeFrame) then ApplyFrame on a copy of the consumer.
func FuzzConsumer_ApplyFrameBytes(f *testing.F) {
	for _, s := range fuzzSeeds(f) {
		f.Add(s)
	}
	base := fuzzConsumer(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		c := base.clone()
		ref := base.clone()
		before := slices.Clone(c.words)
		st := statuses(c)
		r, err := c.ApplyFrameBytes(data)

		var fr wire.Frame
		refErr := wire.DecodeFrame(data, &fr)
		require.Equal(t, refErr == nil, err == nil, "ApplyFrameBytes error %v, DecodeFrame error %v", err, refErr)
		if err != nil {
			require.True(t, slices.Equal(before, c.words), "undecodable frame changed the consumer")
			require.Equal(t, st, statuses(c), "undecodable frame changed the consumer")
			return
		}
		want := ref.ApplyFrame(&fr)
		require.Equal(t, want, r, "ApplyFrameBytes got %v, ApplyFrame got %v", r, want)
		require.True(t, slices.Equal(ref.words, c.words), "zero-copy and decoded paths left different state")
		require.Equal(t, statuses(c), statuses(ref), "zero-copy and decoded paths left different state")
		require.Equal(t, c.ready, ref.ready, "zero-copy and decoded paths left different state")
		checkApplyInvariants(t, c, r, before, st)
	})
}

// FuzzConsumer_ApplyDelta drives the delta rules directly with arbitrary
// headers and images (the byte-level target rarely reaches deep semantics).
func FuzzConsumer_ApplyDelta(f *testing.F) {
	f.Add(uint8(0), uint64(1), uint64(5), uint64(6), []byte{1, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0})
	f.Add(uint8(2), uint64(3), uint64(3), uint64(4), []byte{})
	f.Add(uint8(0), uint64(1), uint64(4), uint64(6), []byte{64, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0})
	base := fuzzConsumer(f)
	f.Fuzz(func(t *testing.T, lane uint8, epoch, baseSeq, seq uint64, raw []byte) {
		c := base.clone()
		before := slices.Clone(c.words)
		st := statuses(c)
		d := ckf.Delta{Identity: testIdentity(int(lane%3), testBuckets), Lease: testLease(int(lane), epoch), BaseSequence: baseSeq, Sequence: seq}
		for i := 0; i+12 <= len(raw); i += 12 {
			d.Images = append(d.Images, ckf.BucketImage{Bucket: binary.LittleEndian.Uint32(raw[i:]), Word: binary.LittleEndian.Uint64(raw[i+4:])})
		}
		r := c.ApplyDelta(&d)
		checkApplyInvariants(t, c, r, before, st)
		if r.Outcome == Applied {
			for _, im := range d.Images {
				got := c.words[uint64(im.Bucket)*lanes+uint64(r.Lane)]
				require.Equal(t, im.Word, got, "bucket %d: got %#x, want %#x", im.Bucket, got, im.Word)
			}
		}
	})
}

func checkApplyInvariants(t *testing.T, c *Consumer, r Result, before []uint64, st [lanes]LaneStatus) {
	t.Helper()
	switch {
	case r.Outcome.Ignored():
		require.True(t, slices.Equal(before, c.words), "%v changed the consumer", r)
		require.Equal(t, st, statuses(c), "%v changed the consumer", r)
	case r.Outcome == Deactivated || r.Outcome == RetrySnapshot:
		require.True(t, slices.Equal(before, c.words), "%v wrote to the table", r)
		require.NotEqual(t, NoFault, r.Fault, "%v: want a fault and the lane not ready", r)
		require.Equal(t, uint16(0), c.ready&(1<<r.Lane), "%v: want a fault and the lane not ready", r)
	case r.Outcome == 0:
		require.Fail(t, "got no outcome")
	}
	for i := range lanes {
		require.Equal(t, (c.ready&(1<<i) != 0), c.lanes[i].ready, "lane %d: ready flag and ready mask disagree", i)
	}
	for _, w := range c.seen {
		require.Equal(t, uint64(0), w, "duplicate-check bitset left dirty")
	}
}

func TestConsumer_ApplyFrameBytesMatchesApplyFrame(t *testing.T) {
	for i, s := range fuzzSeeds(t) {
		c, ref := fuzzConsumer(t), fuzzConsumer(t)
		r, err := c.ApplyFrameBytes(s)
		require.NoError(t, err, "seed %d", i)
		var fr wire.Frame
		require.NoError(t, wire.DecodeFrame(s, &fr))
		require.Equal(t, ref.ApplyFrame(&fr), r, "seed %d", i)
		require.Equal(t, ref.words, c.words, "seed %d: tables", i)
	}
	// An undecodable frame is an error and changes nothing.
	c := fuzzConsumer(t)
	before := slices.Clone(c.words)
	_, err := c.ApplyFrameBytes([]byte{0x93, 1, 2})
	require.Error(t, err, "truncated frame")
	require.Equal(t, before, c.words, "truncated frame changed the table")
}

func TestConsumer_ApplyFrameBytesDoesNotAllocate(t *testing.T) {
	c := fuzzConsumer(t)
	fr := wire.Frame{Kind: wire.KindDelta, Delta: ckf.Delta{Identity: testIdentity(0, testBuckets), Lease: testLease(0, 1),
		Images: []ckf.BucketImage{{Bucket: 1, Word: 2}, {Bucket: 9, Word: 3}}}}
	var buf []byte
	seq := uint64(5)
	got := testing.AllocsPerRun(100, func() {
		fr.Delta.BaseSequence, fr.Delta.Sequence = seq, seq+1
		buf, _ = wire.AppendFrame(buf[:0], &fr)
		if r, err := c.ApplyFrameBytes(buf); err != nil || r.Outcome != Applied {
			require.Fail(t, fmt.Sprintf("got %v, %v, want Applied", r, err))
		}
		seq++
	})
	require.Equal(t, float64(0), got, "got %v allocations per frame, want 0", got)
}
