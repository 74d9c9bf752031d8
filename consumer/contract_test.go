package consumer

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/wire"
)

// Tests pinning the consumer decisions (marked **Decision** in SPEC §8.3, §9).

// TestConsumer_EveryChunkCarriesAWord: a chunk with no words is
// MalformedChunk wherever it stands, including a final chunk at offset =
// bucket_count that covers nothing (SPEC §9, decision: chunks are
// non-empty). The relay's splitter never emits one
// (TestSplitSnapshot_NeverEmitsAnEmptyChunk in wire).
func TestConsumer_EveryChunkCarriesAWord(t *testing.T) {
	words := testWords(3, testBuckets)
	tests := []struct {
		name   string
		chunks []*wire.SnapshotChunk
		fault  Fault // of the last chunk
	}{
		{"empty final chunk at bucket_count", []*wire.SnapshotChunk{
			chunk(0, testLease(0, 1), 8, 0, 2, 0, words),
			chunk(0, testLease(0, 1), 8, 1, 2, testBuckets, nil),
		}, MalformedChunk},
		{"empty first chunk", []*wire.SnapshotChunk{
			chunk(0, testLease(0, 1), 8, 0, 2, 0, nil),
		}, MalformedChunk},
		{"empty middle chunk", []*wire.SnapshotChunk{
			chunk(0, testLease(0, 1), 8, 0, 3, 0, words[:32]),
			chunk(0, testLease(0, 1), 8, 1, 3, 32, []uint64{}),
		}, MalformedChunk},
		{"empty single chunk", []*wire.SnapshotChunk{
			chunk(0, testLease(0, 1), 8, 0, 1, 0, nil),
		}, WrongBucketCount}, // a last chunk ending short of bucket_count
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t)
			f.assign(0, 1)
			last := len(tt.chunks) - 1
			for _, ch := range tt.chunks[:last] {
				f.want(f.c.ApplySnapshotChunk(ch), SnapshotChunkAccepted, NoFault)
			}
			f.want(f.c.ApplySnapshotChunk(tt.chunks[last]), RetrySnapshot, tt.fault)
			assert.False(t, f.status(0).Ready)
		})
	}
}

// TestConsumer_FirstChunkRestartsStaging: chunk 0 arriving while another
// snapshot is staged abandons the partial snapshot and starts staging from
// itself, whatever its sequence (SPEC §8.3, decision 5). Before, it was
// refused (ChunkSequenceMismatch / ChunkOutOfOrder) and the rest of the
// newer snapshot then failed as out of order: the whole resend was lost.
func TestConsumer_FirstChunkRestartsStaging(t *testing.T) {
	old := testWords(4, testBuckets)
	fresh := testWords(5, testBuckets)
	tests := []struct {
		name string
		seq  uint64 // of the resend; the abandoned snapshot is at 8
	}{
		{"newer snapshot", 9},
		{"same snapshot resent", 8},
		{"older sequence", 7},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t)
			l := f.assign(0, 1)
			f.want(f.c.ApplySnapshotChunk(chunk(0, l, 8, 0, 4, 0, old[:16])), SnapshotChunkAccepted, NoFault)
			f.want(f.c.ApplySnapshotChunk(chunk(0, l, 8, 1, 4, 16, old[16:32])), SnapshotChunkAccepted, NoFault)

			f.want(f.c.ApplySnapshotChunk(chunk(0, l, tt.seq, 0, 2, 0, fresh[:32])), SnapshotChunkAccepted, NoFault)
			s := f.status(0)
			require.True(t, s.SnapshotInProgress)
			assert.Equal(t, uint32(1), s.ChunksStaged)
			assert.Equal(t, uint32(2), s.ChunkCount)
			// The abandoned snapshot cannot continue …
			stray := ChunkOutOfOrder
			if tt.seq != 8 {
				stray = ChunkSequenceMismatch
			}
			f.want(f.c.ApplySnapshotChunk(chunk(0, l, 8, 2, 4, 32, old[32:48])), RetrySnapshot, stray)
			// … so resend the new one whole: it installs.
			f.want(f.c.ApplySnapshotChunk(chunk(0, l, tt.seq, 0, 2, 0, fresh[:32])), SnapshotChunkAccepted, NoFault)
			f.want(f.c.ApplySnapshotChunk(chunk(0, l, tt.seq, 1, 2, 32, fresh[32:])), SnapshotInstalled, NoFault)
			got, err := f.c.AppendLaneWords(nil, 0)
			require.NoError(t, err)
			assert.Equal(t, fresh, got)
			assert.Equal(t, tt.seq, f.status(0).InstalledSequence)
		})
	}
	t.Run("chunk 0 not at offset 0 still abandons", func(t *testing.T) {
		f := newFixture(t)
		l := f.assign(0, 1)
		f.want(f.c.ApplySnapshotChunk(chunk(0, l, 8, 0, 4, 0, old[:16])), SnapshotChunkAccepted, NoFault)
		f.want(f.c.ApplySnapshotChunk(chunk(0, l, 9, 0, 2, 8, fresh[:32])), RetrySnapshot, ChunkOverlap)
		assert.False(t, f.status(0).SnapshotInProgress)
	})
	t.Run("continuation follows the restarted snapshot directly", func(t *testing.T) {
		f := newFixture(t)
		l := f.assign(0, 1)
		f.want(f.c.ApplySnapshotChunk(chunk(0, l, 8, 0, 4, 0, old[:16])), SnapshotChunkAccepted, NoFault)
		f.want(f.c.ApplySnapshotChunk(chunk(0, l, 9, 0, 2, 0, fresh[:32])), SnapshotChunkAccepted, NoFault)
		f.want(f.c.ApplySnapshotChunk(chunk(0, l, 9, 1, 2, 32, fresh[32:])), SnapshotInstalled, NoFault)
		assert.Equal(t, uint64(9), f.status(0).InstalledSequence)
	})
}

// TestConsumer_HeartbeatCarriesTheStreamSequence: last_sequence is the
// sequence of the last snapshot or delta this stream delivered on this
// lease (SPEC §9, decision 6). On a ready lane anything else means a lost
// delta (or a producer stamping another sequence) and deactivates; a lane
// that is not ready only records the time.
func TestConsumer_HeartbeatCarriesTheStreamSequence(t *testing.T) {
	tests := []struct {
		name    string
		ready   bool
		last    uint64 // the lane is at 5 when ready
		outcome Outcome
		fault   Fault
	}{
		{"ready, stream sequence", true, 5, HeartbeatObserved, NoFault},
		{"ready, behind the stream", true, 4, Deactivated, HeartbeatSequenceMismatch},
		{"ready, ahead of the stream (a lost delta)", true, 6, Deactivated, HeartbeatSequenceMismatch},
		{"not ready, any sequence", false, 1234, HeartbeatObserved, NoFault},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t)
			var l ckf.LaneLease
			if tt.ready {
				l = f.ready(0, 1, 5)
			} else {
				l = f.assign(0, 1)
			}
			r := f.c.Heartbeat(&wire.Heartbeat{Identity: testIdentity(0, testBuckets), Lease: l, LastSequence: tt.last, UnixMicros: -7})
			f.want(r, tt.outcome, tt.fault)
			if tt.fault == NoFault {
				assert.Equal(t, int64(-7), f.status(0).Stats.LastHeartbeatMicros, "unix_micros is an i64; any sign")
			}
		})
	}
}

// TestConsumer_LaneAfterDrainAcknowledged: a drain acknowledgement changes
// nothing but the lane's last outcome (SPEC §8.3, decision 7): the lane
// stays ready at the drained sequence under the same lease, queries keep
// answering from its words, a repeated marker acknowledges again, and the
// frame rules go on as before — a delta continuing the sequence applies, a
// marker for another sequence deactivates. Only the host's next Assign (or
// Retire) ends it.
func TestConsumer_LaneAfterDrainAcknowledged(t *testing.T) {
	f := newFixture(t)
	l := f.ready(0, 1, 5)
	key := uint64(0xFEED)
	ad := f.c.addresser.Address(key)
	f.want(f.c.ApplyDelta(f.delta(0, l, 5, 6, ckf.BucketImage{Bucket: uint32(ad.A), Word: uint64(ad.Fingerprint)})), Applied, NoFault)

	f.want(f.c.Drain(ckf.DrainMarker{Lease: l, ExpectedSequence: 6}), DrainAcknowledged, NoFault)
	s := f.status(0)
	assert.True(t, s.Ready)
	assert.True(t, s.Assigned)
	assert.Equal(t, l, s.Lease)
	assert.Equal(t, uint64(6), s.InstalledSequence)
	assert.Equal(t, DrainAcknowledged, s.LastOutcome)
	m, err := f.c.Contains(key)
	require.NoError(t, err)
	assert.Equal(t, uint16(1), m)

	f.want(f.c.Drain(ckf.DrainMarker{Lease: l, ExpectedSequence: 6}), DrainAcknowledged, NoFault)
	f.want(f.c.ApplyDelta(f.delta(0, l, 6, 7, ckf.BucketImage{Bucket: uint32(ad.A), Word: 0})), Applied, NoFault)
	f.want(f.c.Drain(ckf.DrainMarker{Lease: l, ExpectedSequence: 6}), Deactivated, TerminalSequenceMismatch)
}
