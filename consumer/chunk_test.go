package consumer

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/wire"
)

func chunk(lane int, l ckf.LaneLease, seq uint64, index, count uint32, offset uint64, words []uint64) *wire.SnapshotChunk {
	return &wire.SnapshotChunk{Identity: testIdentity(lane, testBuckets), Lease: l, Sequence: seq,
		ChunkIndex: index, ChunkCount: count, BucketOffset: offset, Words: words}
}

func TestConsumer_ChunkedSnapshotInstallsOnlyOnLastChunk(t *testing.T) {
	f := newFixture(t)
	l := f.assign(0, 1)
	words := testWords(11, testBuckets)
	key := uint64(0xC0FFEE)
	ad := f.c.addresser.Address(key)
	words[ad.A] = uint64(ad.Fingerprint) // lane 0 holds key
	parts := [][2]uint64{{0, 10}, {10, 40}, {40, 64}}
	for i, p := range parts {
		r := f.c.ApplySnapshotChunk(chunk(0, l, 8, uint32(i), 3, p[0], words[p[0]:p[1]]))
		if i < 2 {
			f.want(r, SnapshotChunkAccepted, NoFault)
			_, err := f.c.Contains(key)
			require.Same(t, ErrUnavailable, err, "after chunk %d: words invisible", i)
			s := f.status(0)
			require.True(t, s.SnapshotInProgress, "after chunk %d", i)
			require.Equal(t, uint32(i+1), s.ChunksStaged, "after chunk %d", i)
			require.Equal(t, uint32(3), s.ChunkCount, "after chunk %d", i)
		} else {
			f.want(r, SnapshotInstalled, NoFault)
		}
	}
	m, err := f.c.Contains(key)
	require.NoError(t, err)
	require.Equal(t, uint16(1), m, "mask: lane 0")
	got, _ := f.c.AppendLaneWords(nil, 0)
	require.True(t, slices.Equal(got, words), "got lane words %x, want %x", got, words)
}

func TestConsumer_ChunkViolationsAbandonPartialSnapshot(t *testing.T) {
	words := testWords(12, testBuckets)
	tests := []struct {
		name  string
		bad   func(c *Consumer, l ckf.LaneLease) Result // applied after chunk 0 of 4 (16 words each)
		fault Fault
	}{
		{"out of order", func(c *Consumer, l ckf.LaneLease) Result { return send(c, l, 2, 4, 32, 8) }, ChunkOutOfOrder},
		// A repeated chunk 0 restarts staging: TestConsumer_FirstChunkRestartsStaging.
		{"other count", func(c *Consumer, l ckf.LaneLease) Result { return send(c, l, 1, 5, 16, 8) }, ChunkOutOfOrder},
		{"overlapping", func(c *Consumer, l ckf.LaneLease) Result { return send(c, l, 1, 4, 8, 8) }, ChunkOverlap},
		{"hole", func(c *Consumer, l ckf.LaneLease) Result { return send(c, l, 1, 4, 20, 8) }, ChunkOverlap},
		{"other sequence", func(c *Consumer, l ckf.LaneLease) Result { return send(c, l, 1, 4, 16, 9) }, ChunkSequenceMismatch},
		{"past the table", func(c *Consumer, l ckf.LaneLease) Result {
			return c.ApplySnapshotChunk(chunk(0, l, 8, 1, 4, 16, testWords(1, 49)))
		}, WrongBucketCount},
		{"last chunk short", func(c *Consumer, l ckf.LaneLease) Result {
			return c.ApplySnapshotChunk(chunk(0, l, 8, 3, 4, 16, words[16:60]))
		}, WrongBucketCount},
		{"empty chunk", func(c *Consumer, l ckf.LaneLease) Result {
			return c.ApplySnapshotChunk(chunk(0, l, 8, 1, 4, 16, nil))
		}, MalformedChunk},
		{"index beyond count", func(c *Consumer, l ckf.LaneLease) Result { return send(c, l, 4, 4, 16, 8) }, MalformedChunk},
		{"delta before last chunk", func(c *Consumer, l ckf.LaneLease) Result {
			return c.ApplyDelta(&ckf.Delta{Identity: testIdentity(0, testBuckets), Lease: l, BaseSequence: 8, Sequence: 9,
				Images: []ckf.BucketImage{{Bucket: 1, Word: 1}}})
		}, DeltaDuringSnapshot},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			l := f.assign(0, 1)
			f.want(f.c.ApplySnapshotChunk(chunk(0, l, 8, 0, 4, 0, words[:16])), SnapshotChunkAccepted, NoFault)
			before := f.table()
			f.want(tc.bad(f.c, l), RetrySnapshot, tc.fault)
			f.wantTable(before) // the rejected chunk wrote nothing
			s := f.status(0)
			require.False(t, s.Ready, "ready")
			require.False(t, s.SnapshotInProgress, "snapshot in progress")
			require.True(t, s.Assigned, "assigned")
			require.Equal(t, tc.fault, s.LastFault)
			// The rest of the abandoned snapshot cannot complete it …
			f.want(f.c.ApplySnapshotChunk(chunk(0, l, 8, 1, 4, 16, words[16:32])), RetrySnapshot, ChunkOutOfOrder)
			// … but a fresh send on the same lease installs.
			for i := range 4 {
				r := f.c.ApplySnapshotChunk(chunk(0, l, 10, uint32(i), 4, uint64(16*i), words[16*i:16*(i+1)]))
				if i == 3 {
					f.want(r, SnapshotInstalled, NoFault)
				} else {
					f.want(r, SnapshotChunkAccepted, NoFault)
				}
			}
			s = f.status(0)
			require.True(t, s.Ready, "ready")
			require.Equal(t, uint64(10), s.InstalledSequence)
		})
	}
}

// send applies an 8-word chunk of unrelated words to lane 0 of c.
func send(c *Consumer, l ckf.LaneLease, index, count uint32, offset, seq uint64) Result {
	return c.ApplySnapshotChunk(chunk(0, l, seq, index, count, offset, testWords(99, 8)))
}

func TestConsumer_FirstChunkMustStartTheTable(t *testing.T) {
	f := newFixture(t)
	l := f.assign(0, 1)
	f.want(f.c.ApplySnapshotChunk(chunk(0, l, 8, 1, 2, 32, testWords(1, 32))), RetrySnapshot, ChunkOutOfOrder)
	f.want(f.c.ApplySnapshotChunk(chunk(0, l, 8, 0, 2, 8, testWords(1, 8))), RetrySnapshot, ChunkOverlap)
	f.want(f.c.ApplySnapshotChunk(chunk(0, l, 8, 0, 0, 0, testWords(1, 8))), RetrySnapshot, MalformedChunk)
}

func TestConsumer_ChunkOnReadyLane(t *testing.T) {
	f := newFixture(t)
	l := f.ready(0, 1, 5)
	before := f.table()
	f.want(f.c.ApplySnapshotChunk(chunk(0, l, 5, 0, 2, 0, testWords(1, 32))), IgnoredStaleOrDuplicate, NoFault)
	f.wantTable(before)
	f.want(f.c.ApplySnapshotChunk(chunk(0, l, 6, 0, 2, 0, testWords(1, 32))), Deactivated, SnapshotWhileReady)
	f.wantTable(before)
}

// TestConsumer_AppendLaneWordsNotReady: a lane that is not ready — assigned
// with half a snapshot staged, unassigned, or deactivated — has no words to
// give: a *LaneError matching ErrUnavailable, and dst comes back unchanged
// (before, the half-staged column was returned with no error).
func TestConsumer_AppendLaneWordsNotReady(t *testing.T) {
	f := newFixture(t)
	words := testWords(5, testBuckets)
	l := f.assign(0, 1)
	f.want(f.c.ApplySnapshotChunk(chunk(0, l, 3, 0, 2, 0, words[:testBuckets/2])), SnapshotChunkAccepted, NoFault)
	dst := []uint64{42}
	for _, step := range []string{"half staged", "retired"} {
		got, err := f.c.AppendLaneWords(dst, 0)
		require.ErrorIs(t, err, ErrUnavailable, step)
		var le *LaneError
		require.ErrorAs(t, err, &le, step)
		require.Equal(t, 0, le.Lane, step)
		require.Equal(t, []uint64{42}, got, "%s: dst unchanged", step)
		require.NoError(t, f.c.Retire(0))
	}
	got, err := f.c.AppendLaneWords(dst, 3)
	require.ErrorIs(t, err, ErrUnavailable, "an unconfigured lane")
	require.Equal(t, []uint64{42}, got)
	f.ready(1, 1, 7)
	got, err = f.c.AppendLaneWords(dst[:0:0], 1)
	require.NoError(t, err, "a ready lane")
	require.Len(t, got, testBuckets)
}
