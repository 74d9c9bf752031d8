package consumer

import (
	"math"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/wire"
)

func TestConsumer_StaleSnapshotCannotRollBack(t *testing.T) {
	f := newFixture(t)
	l := f.ready(0, 1, 5)
	for _, seq := range []uint64{5, 3, 0} {
		before := f.table()
		f.want(f.c.InstallSnapshot(f.snapshot(0, l, seq, testWords(42, testBuckets))), IgnoredStaleOrDuplicate, NoFault)
		f.wantTable(before)
		s := f.status(0)
		require.True(t, s.Ready, "seq %d: ready", seq)
		require.Equal(t, uint64(5), s.InstalledSequence, "seq %d", seq)
	}
}

func TestConsumer_ForwardSnapshotOnReadyLaneDeactivatesWithoutWrites(t *testing.T) {
	f := newFixture(t)
	l := f.ready(0, 1, 5)
	before := f.table()
	r := f.c.InstallSnapshot(f.snapshot(0, l, 6, testWords(42, testBuckets)))
	f.want(r, Deactivated, SnapshotWhileReady)
	f.wantTable(before)
	s := f.status(0)
	require.False(t, s.Ready, "ready")
	require.False(t, s.Assigned, "assigned")
	require.Zero(t, f.c.ReadyMask(), "ready mask")
	// The lease is revoked: the same lease cannot reinstall.
	f.want(f.c.InstallSnapshot(f.snapshot(0, l, 6, testWords(42, testBuckets))), IgnoredForeignLease, NoFault)
	f.wantTable(before)
}

func TestConsumer_DuplicateAndStaleDeltasIgnoredWithoutWrites(t *testing.T) {
	f := newFixture(t)
	l := f.ready(0, 1, 5)
	f.want(f.c.ApplyDelta(f.delta(0, l, 5, 6, ckf.BucketImage{Bucket: 3, Word: 0xAAAA})), Applied, NoFault)
	before := f.table()
	for _, d := range []*ckf.Delta{
		f.delta(0, l, 5, 6, ckf.BucketImage{Bucket: 3, Word: 0xBBBB}), // duplicate sequence, other word
		f.delta(0, l, 4, 5, ckf.BucketImage{Bucket: 4, Word: 0xCCCC}), // stale
		f.delta(0, l, 0, 1, ckf.BucketImage{Bucket: 5, Word: 0xDDDD}),
	} {
		f.want(f.c.ApplyDelta(d), IgnoredStaleOrDuplicate, NoFault)
	}
	f.wantTable(before)
	s := f.status(0)
	require.True(t, s.Ready, "ready")
	require.Equal(t, uint64(6), s.InstalledSequence)
	require.Equal(t, uint64(3), s.Stats.FramesIgnored)
}

func TestConsumer_DeltaFaults(t *testing.T) {
	img := ckf.BucketImage{Bucket: 1, Word: 0x1234}
	tests := []struct {
		name  string
		base  uint64
		seq   uint64
		imgs  []ckf.BucketImage
		fault Fault
	}{
		{"forward gap", 7, 8, []ckf.BucketImage{img}, BaseSequenceMismatch},
		{"base behind installed", 4, 6, []ckf.BucketImage{img}, BaseSequenceMismatch},
		{"non-contiguous", 5, 7, []ckf.BucketImage{img}, NonContiguous},
		{"empty delta", 5, 6, nil, EmptyDelta},
		{"bucket out of range", 5, 6, []ckf.BucketImage{img, {Bucket: testBuckets, Word: 9}}, MalformedImages},
		{"bucket far out of range", 5, 6, []ckf.BucketImage{{Bucket: math.MaxUint32, Word: 9}}, MalformedImages},
		{"duplicate bucket", 5, 6, []ckf.BucketImage{img, {Bucket: 2, Word: 3}, {Bucket: 1, Word: 9}}, MalformedImages},
		// Check order: a gap wins over non-contiguity and malformed images.
		{"gap before non-contiguous", 6, 9, nil, BaseSequenceMismatch},
		{"non-contiguous before empty", 5, 9, nil, NonContiguous},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			l := f.ready(0, 1, 5)
			f.ready(1, 1, 9)
			before := f.table()
			f.want(f.c.ApplyDelta(f.delta(0, l, tc.base, tc.seq, tc.imgs...)), Deactivated, tc.fault)
			f.wantTable(before)
			got := f.c.ReadyMask()
			require.Equal(t, uint16(0b10), got, "got ready mask %#b, want only lane 1", got)
			s := f.status(0)
			require.Equal(t, tc.fault, s.LastFault)
			require.Equal(t, uint64(1), s.Stats.Deactivations)
			// The seen bitset must be clean again for the next delta.
			for i, w := range f.c.seen {
				require.Equal(t, uint64(0), w, "seen[%d] = %#x after rejection, want 0", i, w)
			}
		})
	}
}

func TestConsumer_ApplyDeltaWritesAbsoluteImages(t *testing.T) {
	f := newFixture(t)
	l := f.ready(2, 1, 0)
	f.want(f.c.ApplyDelta(f.delta(2, l, 0, 1, ckf.BucketImage{Bucket: 0, Word: 7}, ckf.BucketImage{Bucket: 63, Word: 0})), Applied, NoFault)
	got, _ := f.c.AppendLaneWords(nil, 2)
	want := testWords(2*1000, testBuckets)
	want[0], want[63] = 7, 0
	require.True(t, slices.Equal(got, want), "got lane words %x, want %x", got, want)
	s := f.status(2)
	require.Equal(t, uint64(1), s.InstalledSequence)
	require.Equal(t, uint64(2), s.Stats.ImagesApplied)
	require.Equal(t, uint64(1), s.Stats.DeltasApplied)
}

func TestConsumer_SequenceOverflowIsShadowedByStaleCheck(t *testing.T) {
	// SPEC §8.3 checks base+1 overflow after the stale and base checks; a lane
	// installed at MaxUint64 therefore treats every delta as stale.
	f := newFixture(t)
	l := f.ready(0, 1, math.MaxUint64)
	f.want(f.c.ApplyDelta(f.delta(0, l, math.MaxUint64, 0, ckf.BucketImage{Bucket: 1, Word: 1})), IgnoredStaleOrDuplicate, NoFault)
}

func TestConsumer_WrongIdentityUnderCurrentLeaseDeactivates(t *testing.T) {
	other := testIdentity(0, testBuckets)
	other.ProducerIncarnation++
	tests := []struct {
		name  string
		frame func(l ckf.LaneLease) *wire.Frame
	}{
		{"snapshot", func(l ckf.LaneLease) *wire.Frame {
			return &wire.Frame{Kind: wire.KindSnapshotChunk, Snapshot: wire.SnapshotChunk{Identity: other, Lease: l, Sequence: 9, ChunkCount: 1, Words: testWords(1, testBuckets)}}
		}},
		{"stale delta", func(l ckf.LaneLease) *wire.Frame {
			return &wire.Frame{Kind: wire.KindDelta, Delta: ckf.Delta{Identity: other, Lease: l, BaseSequence: 1, Sequence: 2}}
		}},
		{"heartbeat", func(l ckf.LaneLease) *wire.Frame {
			return &wire.Frame{Kind: wire.KindHeartbeat, Heartbeat: wire.Heartbeat{Identity: other, Lease: l, LastSequence: 5}}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			l := f.ready(0, 1, 5)
			before := f.table()
			f.want(f.c.ApplyFrame(tc.frame(l)), Deactivated, WrongIdentity)
			f.wantTable(before)
			s := f.status(0)
			require.False(t, s.Ready, "ready")
			require.False(t, s.Assigned, "assigned")
		})
	}
}

func TestConsumer_SupersededLeaseIgnoredWithoutHurtingReplacement(t *testing.T) {
	f := newFixture(t)
	old := f.ready(0, 1, 5)
	l := f.ready(0, 2, 3)
	before := f.table()
	st := f.status(0)
	for _, fr := range []*wire.Frame{
		{Kind: wire.KindSnapshotChunk, Snapshot: wire.SnapshotChunk{Identity: testIdentity(0, testBuckets), Lease: old, Sequence: 9, ChunkCount: 1, Words: testWords(1, testBuckets)}},
		{Kind: wire.KindDelta, Delta: *f.delta(0, old, 3, 4, ckf.BucketImage{Bucket: 1, Word: 1})},
		{Kind: wire.KindDrainMarker, Drain: ckf.DrainMarker{Lease: old, ExpectedSequence: 99}},
		{Kind: wire.KindHeartbeat, Heartbeat: wire.Heartbeat{Identity: testIdentity(0, testBuckets), Lease: old, LastSequence: 99}},
	} {
		f.want(f.c.ApplyFrame(fr), IgnoredForeignLease, NoFault)
	}
	f.wantTable(before)
	got := f.status(0)
	st.Stats.FramesIgnored += 4
	require.Equal(t, st, got, "got %+v, want %+v", got, st)
	f.want(f.c.ApplyDelta(f.delta(0, l, 3, 4, ckf.BucketImage{Bucket: 1, Word: 1})), Applied, NoFault)
}

func TestConsumer_ForeignLeases(t *testing.T) {
	f := newFixture(t)
	l := f.ready(0, 1, 5)
	before := f.table()
	other := l
	other.ConsumerInstance++
	f.want(f.c.ApplyDelta(f.delta(0, other, 5, 6, ckf.BucketImage{Bucket: 1, Word: 1})), IgnoredForeignLease, NoFault)
	r := f.c.ApplyDelta(f.delta(0, testLease(200, 1), 5, 6, ckf.BucketImage{Bucket: 1, Word: 1}))
	require.Equal(t, IgnoredForeignLease, r.Outcome, "outcome")
	require.Equal(t, -1, r.Lane, "lane")
	f.want(f.c.ApplyDelta(f.delta(1, testLease(1, 1), 0, 1, ckf.BucketImage{Bucket: 1, Word: 1})), IgnoredForeignLease, NoFault) // never assigned
	f.want(f.c.ApplyDelta(f.delta(5, testLease(5, 1), 0, 1, ckf.BucketImage{Bucket: 1, Word: 1})), IgnoredForeignLease, NoFault) // unconfigured
	f.wantTable(before)
}

func TestConsumer_WrongBucketCount(t *testing.T) {
	t.Run("inactive lane retries on the same lease", func(t *testing.T) {
		f := newFixture(t)
		l := f.assign(0, 1)
		before := f.table()
		for _, n := range []uint64{testBuckets - 1, testBuckets + 1, 0} {
			f.want(f.c.InstallSnapshot(f.snapshot(0, l, 4, testWords(1, n))), RetrySnapshot, WrongBucketCount)
			f.wantTable(before)
			s := f.status(0)
			require.True(t, s.Assigned, "n=%d: assigned", n)
			require.False(t, s.Ready, "n=%d: ready", n)
			require.Equal(t, l, s.Lease, "n=%d: same lease", n)
		}
		f.want(f.c.InstallSnapshot(f.snapshot(0, l, 4, testWords(1, testBuckets))), SnapshotInstalled, NoFault)
		s := f.status(0)
		require.Equal(t, uint64(3), s.Stats.SnapshotRetries)
		require.Equal(t, uint64(4), s.InstalledSequence)
	})
	t.Run("ready lane deactivates", func(t *testing.T) {
		f := newFixture(t)
		l := f.ready(0, 1, 5)
		before := f.table()
		f.want(f.c.InstallSnapshot(f.snapshot(0, l, 4, testWords(1, testBuckets+1))), Deactivated, WrongBucketCount)
		f.wantTable(before)
	})
}

func TestConsumer_DrainMarker(t *testing.T) {
	f := newFixture(t)
	l := f.ready(0, 1, 5)
	f.want(f.c.ApplyDelta(f.delta(0, l, 5, 6, ckf.BucketImage{Bucket: 1, Word: 1})), Applied, NoFault)
	f.want(f.c.Drain(ckf.DrainMarker{Lease: testLease(0, 9), ExpectedSequence: 6}), IgnoredForeignLease, NoFault)
	f.want(f.c.Drain(ckf.DrainMarker{Lease: l, ExpectedSequence: 6}), DrainAcknowledged, NoFault)
	s := f.status(0)
	require.True(t, s.Ready, "ready")
	require.Equal(t, uint64(1), s.Stats.DrainsAcknowledged)
	// The final delta 6→7 was lost: the marker says 7.
	before := f.table()
	f.want(f.c.Drain(ckf.DrainMarker{Lease: l, ExpectedSequence: 7}), Deactivated, TerminalSequenceMismatch)
	f.wantTable(before)
	require.Equal(t, uint16(0), f.c.ReadyMask(), "got ready mask %#x, want 0", f.c.ReadyMask())

	t.Run("behind installed", func(t *testing.T) {
		f := newFixture(t)
		l := f.ready(0, 1, 5)
		f.want(f.c.Drain(ckf.DrainMarker{Lease: l, ExpectedSequence: 4}), Deactivated, TerminalSequenceMismatch)
	})
	t.Run("not ready", func(t *testing.T) {
		f := newFixture(t)
		l := f.assign(0, 1)
		f.want(f.c.Drain(ckf.DrainMarker{Lease: l, ExpectedSequence: 0}), Deactivated, TerminalSequenceMismatch)
	})
}

func TestConsumer_AssignmentEpochsIncreaseAcrossRetire(t *testing.T) {
	f := newFixture(t)
	f.ready(0, 3, 5)
	require.NoError(t, f.c.Retire(0), "Retire")
	s := f.status(0)
	require.False(t, s.Ready, "ready")
	require.False(t, s.Assigned, "assigned")
	require.True(t, s.HasEpoch, "has epoch")
	require.Equal(t, uint64(3), s.LastEpoch)
	for _, epoch := range []uint64{3, 2, 0} {
		err := f.c.Assign(testIdentity(0, testBuckets), testLease(0, epoch))
		require.ErrorIs(t, err, ErrStaleAssignmentEpoch, "epoch %d", epoch)
	}
	f.assign(0, 4)
	// Deactivation keeps the epoch too.
	f.want(f.c.Drain(ckf.DrainMarker{Lease: testLease(0, 4), ExpectedSequence: 1}), Deactivated, TerminalSequenceMismatch)
	require.ErrorIs(t, f.c.Assign(testIdentity(0, testBuckets), testLease(0, 4)), ErrStaleAssignmentEpoch)
	f.assign(0, 5)
}

func TestConsumer_AssignErrors(t *testing.T) {
	id := testIdentity(0, testBuckets)
	otherFormat := id
	otherFormat.Format = ckf.NewFormat(testSeed+1, testBuckets)
	tests := []struct {
		name  string
		id    ckf.ProducerIdentity
		lease ckf.LaneLease
		want  error
	}{
		{"wrong consumer", id, ckf.LaneLease{ConsumerInstance: testInstance + 1, PhysicalLane: 0, AssignmentEpoch: 9}, ErrWrongConsumer},
		{"unconfigured lane", testIdentity(5, testBuckets), testLease(5, 9), ErrWrongLane},
		{"lane out of range", id, testLease(16, 9), ErrWrongLane},
		{"wrong pool", testIdentity(1, testBuckets), testLease(0, 9), ErrWrongPool},
		{"format mismatch", otherFormat, testLease(0, 9), ErrFormatMismatch},
		{"stale epoch", id, testLease(0, 2), ErrStaleAssignmentEpoch},
		// Order: the consumer is checked before the lane, the lane before the pool.
		{"wrong consumer and lane", id, ckf.LaneLease{ConsumerInstance: 1, PhysicalLane: 16}, ErrWrongConsumer},
		{"wrong pool and stale epoch", testIdentity(1, testBuckets), testLease(0, 1), ErrWrongPool},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			f.ready(0, 2, 5)
			before, st := f.table(), f.status(0)
			err := f.c.Assign(tc.id, tc.lease)
			var le *LaneError
			require.ErrorIs(t, err, tc.want)
			require.ErrorAs(t, err, &le)
			f.wantTable(before)
			require.Equal(t, st, f.status(0), "lane 0 untouched")
		})
	}
}

func TestConsumer_AssignClearsReadinessAndPartialSnapshot(t *testing.T) {
	f := newFixture(t)
	f.ready(0, 1, 5)
	l := f.assign(0, 2)
	s := f.status(0)
	require.False(t, s.Ready, "ready")
	require.True(t, s.Assigned, "assigned")
	require.Zero(t, s.InstalledSequence, "installed sequence")
	require.Zero(t, f.c.ReadyMask(), "ready mask")
	f.want(f.c.ApplyDelta(f.delta(0, l, 0, 1, ckf.BucketImage{Bucket: 1, Word: 1})), AwaitingSnapshot, NoFault)
	words := testWords(3, testBuckets)
	f.want(f.c.ApplySnapshotChunk(chunk(0, l, 7, 0, 2, 0, words[:32])), SnapshotChunkAccepted, NoFault)
	l3 := f.assign(0, 3)
	{
		s := f.status(0)
		require.False(t, s.SnapshotInProgress, "got %+v, want the partial snapshot discarded", s)
	}
	// The second chunk of the discarded snapshot is foreign now; under the
	// new lease it would be out of order.
	f.want(f.c.ApplySnapshotChunk(chunk(0, l, 7, 1, 2, 32, words[32:])), IgnoredForeignLease, NoFault)
	f.want(f.c.ApplySnapshotChunk(chunk(0, l3, 7, 1, 2, 32, words[32:])), RetrySnapshot, ChunkOutOfOrder)
}

func TestConsumer_Heartbeat(t *testing.T) {
	f := newFixture(t)
	l := f.assign(0, 1)
	hb := &wire.Heartbeat{Identity: testIdentity(0, testBuckets), Lease: l, LastSequence: 40, UnixMicros: 1234}
	f.want(f.c.Heartbeat(hb), HeartbeatObserved, NoFault) // not ready: recorded only
	f.want(f.c.InstallSnapshot(f.snapshot(0, l, 5, testWords(1, testBuckets))), SnapshotInstalled, NoFault)
	hb.LastSequence, hb.UnixMicros = 5, 5678
	f.want(f.c.Heartbeat(hb), HeartbeatObserved, NoFault)
	s := f.status(0)
	require.Equal(t, int64(5678), s.Stats.LastHeartbeatMicros)
	require.Equal(t, uint64(5), s.InstalledSequence)
	hb.LastSequence = 6 // the delta 5→6 never arrived
	f.want(f.c.Heartbeat(hb), Deactivated, HeartbeatSequenceMismatch)
}

func TestConsumer_CloseAndUnknownFrames(t *testing.T) {
	f := newFixture(t)
	f.ready(0, 1, 5)
	st := f.status(0)
	r := f.c.ApplyFrame(&wire.Frame{Kind: wire.KindClose, Close: wire.Close{Reason: wire.CloseLagged}})
	require.Equal(t, StreamClosed, r.Outcome, "outcome")
	require.Equal(t, -1, r.Lane, "lane")
	{
		r := f.c.ApplyFrame(&wire.Frame{Kind: 99})
		require.Equal(t, IgnoredUnknownKind, r.Outcome, "got %v, want IgnoredUnknownKind", r)
	}
	require.Equal(t, st, f.status(0))
}

func TestResult_FailurePointAndDisposition(t *testing.T) {
	tests := []struct {
		outcome Outcome
		point   ckf.FailurePoint
		action  ckf.RecoveryAction
		commit  ckf.CommitState
	}{
		{Deactivated, ckf.ConsumerGapOrMalformedBeforeWrite, ckf.DeactivateAndSnapshot, ckf.KnownUnchanged},
		{RetrySnapshot, ckf.InactiveSnapshotInstallFailure, ckf.RetrySnapshot, ckf.KnownUnchanged},
		{Applied, 0, 0, 0},
		{IgnoredForeignLease, 0, 0, 0},
		{IgnoredStaleOrDuplicate, 0, 0, 0},
		{AwaitingSnapshot, 0, 0, 0},
		{DrainAcknowledged, 0, 0, 0},
		{SnapshotInstalled, 0, 0, 0},
		{SnapshotChunkAccepted, 0, 0, 0},
	}
	for _, tc := range tests {
		r := Result{Outcome: tc.outcome}
		got := r.FailurePoint()
		assert.Equal(t, tc.point, got, "%v: got failure point %v, want %v", tc.outcome, got, tc.point)
		d, ok := r.Disposition()
		assert.False(t, ok != (tc.point != 0) || d.Action != tc.action || d.Commit != tc.commit, "%v: got disposition %+v ok=%v, want action %v commit %v", tc.outcome, d, ok, tc.action, tc.commit)
		assert.False(t, ok && (d.Domain != ckf.ConsumerLane || d.RecoveryDomain != ckf.ConsumerLane), "%v: got domains %v/%v, want ConsumerLane", tc.outcome, d.Domain, d.RecoveryDomain)
	}
}

func TestFault_StringsAreDistinct(t *testing.T) {
	seen := map[string]bool{}
	for f := NoFault; f <= HeartbeatSequenceMismatch; f++ {
		s := f.String()
		require.False(t, seen[s], "fault %d: got name %q, want a distinct name", f, s)
		require.NotEqual(t, "", s, "fault %d: got name %q, want a distinct name", f, s)
		require.False(t, s[0] == 'F' && s[:6] == "Fault(", "fault %d: got name %q, want a distinct name", f, s)
		seen[s] = true
	}
	for o := Applied; o <= IgnoredUnknownKind; o++ {
		s := o.String()
		require.False(t, seen[s], "outcome %d: got name %q, want a distinct name", o, s)
		require.False(t, len(s) > 8 && s[:8] == "Outcome(", "outcome %d: got name %q, want a distinct name", o, s)
		seen[s] = true
	}
}
