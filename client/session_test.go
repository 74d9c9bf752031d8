package client

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/consumer"
	"github.com/ckfrelay/ckfrelay/wire"
)

// A second pool on lane 1 beside testPool on lane 0.
var (
	poolB = ckf.PoolID{Domain: testDomain, DCID: 2}
	idB   = ckf.ProducerIdentity{Pool: poolB, ProducerIncarnation: 1, Format: testFormat}
)

func twoLaneManifest() consumer.Manifest {
	m := consumer.Manifest{ConsumerInstance: testConsumer, Domain: testDomain, Format: testFormat, VerificationWindow: 2}
	m.Lanes[0], m.Lanes[1] = &testPool, &poolB
	return m
}

func newTwoLaneNative(t *testing.T) *Native {
	t.Helper()
	n, err := NewNative(twoLaneManifest())
	require.NoError(t, err, "NewNative")
	return n
}

func laneLease(lane int, epoch uint64) ckf.LaneLease {
	return ckf.LaneLease{ConsumerInstance: testConsumer, PhysicalLane: uint8(lane), AssignmentEpoch: epoch}
}

// twoLanes collects the first stream of each of lanes 0 and 1, in whatever
// order the router opens them.
func twoLanes(t *testing.T, sessions <-chan session) (a, b session) {
	t.Helper()
	got := map[int]session{}
	for len(got) < 2 {
		s := nextSession(t, sessions)
		got[s.lane] = s
	}
	return got[0], got[1]
}

// nextSessionOn waits for the next stream of lane, failing after d (a
// router that never resubscribes is the bug these tests look for). Streams
// of other lanes that arrive meanwhile are dropped: use it only where no
// other lane resubscribes.
func nextSessionOn(t *testing.T, sessions <-chan session, lane int, d time.Duration) session {
	t.Helper()
	deadline := time.After(d)
	for {
		select {
		case s := <-sessions:
			if s.lane == lane {
				return s
			}
		case <-deadline:
			require.FailNow(t, "no new stream", "lane %d did not resubscribe within %v", lane, d)
			return session{}
		}
	}
}

func snapshotOn(lane int, id ckf.ProducerIdentity, epoch, seq uint64, w []uint64) ckf.Snapshot {
	return ckf.Snapshot{Identity: id, Lease: laneLease(lane, epoch), Sequence: seq, Words: w}
}

// TestRouter_FrameUnderAnotherLaneLeaseEndsOnlyItsSession (issue #30 item
// 1): dc-a's stream carries a delta (or a drain marker) under lane 1's
// lease and dc-b's identity. It must not reach lane 1: dc-a's session ends
// with ErrProtocol, lane 1 stays ready on dc-b's own stream and takes
// dc-b's delta at that sequence.
func TestRouter_FrameUnderAnotherLaneLeaseEndsOnlyItsSession(t *testing.T) {
	for _, kind := range []wire.Kind{wire.KindDelta, wire.KindDrainMarker} {
		t.Run(kind.String(), func(t *testing.T) {
			url, sessions, _ := fakeRelay(t)
			r := startRouter(t, Config{Relays: []Relay{{Addrs: []string{url}}}, ConsumerInstance: testConsumer,
				Targets:    []Target{{Pool: "a", Lane: 0}, {Pool: "b", Lane: 1}},
				MinBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond, IdleTimeout: -1}, newTwoLaneNative(t))
			a, b := twoLanes(t, sessions)
			snapA, snapB := snapshotOn(0, testID, a.epoch, 5, words(1)), snapshotOn(1, idB, b.epoch, 5, words(2))
			a.write(t, func(w *wire.Writer) error { return w.WriteSnapshot(&snapA) })
			b.write(t, func(w *wire.Writer) error { return w.WriteSnapshot(&snapB) })
			waitFor(t, func() bool { return r.Lane(0).Ready && r.Lane(1).Ready })

			// dc-a's relay speaks for lane 1.
			hostile := wire.Frame{Kind: kind}
			if kind == wire.KindDelta {
				hostile.Delta = ckf.Delta{Identity: idB, Lease: laneLease(1, b.epoch), BaseSequence: 5, Sequence: 6,
					Images: []ckf.BucketImage{{Bucket: 3, Word: 0xAAAA}}}
			} else {
				hostile.Drain = ckf.DrainMarker{Lease: laneLease(1, b.epoch), ExpectedSequence: 4}
			}
			a.frame(t, hostile)
			next := nextSessionOn(t, sessions, 0, 10*time.Second)
			assert.Contains(t, r.Lane(0).LastError, ErrProtocol.Error(), "lane 0's session ended on the foreign frame")

			// dc-b's own delta at 6 applies; lane 1 holds dc-b's table only.
			b.frame(t, wire.Frame{Kind: wire.KindDelta, Delta: ckf.Delta{Identity: idB, Lease: laneLease(1, b.epoch), BaseSequence: 5, Sequence: 6,
				Images: []ckf.BucketImage{{Bucket: 3, Word: 0xBBBB}}}})
			b.frame(t, wire.Frame{Kind: wire.KindHeartbeat, Heartbeat: wire.Heartbeat{Identity: idB, Lease: laneLease(1, b.epoch), LastSequence: 6}})
			waitFor(t, func() bool { li := r.Lane(1); return li.Sequence == 6 || !li.Ready })
			want := words(2)
			want[3] = 0xBBBB
			li := r.Lane(1)
			require.True(t, li.Ready, "lane 1 after dc-a's foreign %v: %+v", kind, li)
			got, seq, err := r.AppendLaneWords(nil, 1)
			require.NoError(t, err)
			assert.Equal(t, uint64(6), seq)
			assert.Equal(t, want, got, "lane 1 holds dc-b's table")
			assert.Zero(t, li.Resubscribes, "lane 1 resubscribes")
			assert.Greater(t, next.epoch, a.epoch, "lane 0's next epoch")
		})
	}
}

// TestNextEpoch_LanesAreNotGuessableFromEachOther (issue #30 item 1):
// epochs drawn at one instant (two lanes starting together) share the
// clock's high bits but not the random low ones, stay within 2^24 ns of the
// clock (a relay's max_lease_epoch_lead) and always exceed the last.
func TestNextEpoch_LanesAreNotGuessableFromEachOther(t *testing.T) {
	now := time.Unix(1_800_000_000, 123_456_789)
	const mask = 1<<epochRandomBits - 1
	seen := map[uint64]bool{}
	for range 1000 {
		e := nextEpoch(0, now)
		require.Equal(t, uint64(now.UnixNano())&^mask, e&^mask, "epoch %#x: high bits are the clock's", e)
		seen[e] = true
	}
	assert.Greater(t, len(seen), 990, "distinct epochs of 1000 drawn at one instant")
	last := uint64(now.UnixNano()) | mask
	assert.Equal(t, last+1, nextEpoch(last, now), "never at or below the last epoch")
	later := now.Add(time.Second)
	assert.Greater(t, nextEpoch(0, later), last, "a later clock gives a higher epoch (router restarts)")
}

// TestRouter_SnapshotThatNeverCompletes (issue #30 item 5): chunk 0 of 2
// then only heartbeats, chunk 0 again, or chunk 0 then silence: the session
// ends (ErrProtocol, or ErrSnapshotTimeout after SnapshotProgressTimeout)
// and the lane resubscribes instead of staying out of routing.
func TestRouter_SnapshotThatNeverCompletes(t *testing.T) {
	for _, tt := range []struct {
		name string
		then func(t *testing.T, s session, chunks []wire.SnapshotChunk)
		want error
	}{
		{"heartbeat between chunks", func(t *testing.T, s session, _ []wire.SnapshotChunk) {
			s.frame(t, wire.Frame{Kind: wire.KindHeartbeat, Heartbeat: wire.Heartbeat{Identity: testID, Lease: lease(s.epoch), LastSequence: 5}})
		}, ErrProtocol},
		{"chunk 0 again", func(t *testing.T, s session, chunks []wire.SnapshotChunk) {
			s.frame(t, wire.Frame{Kind: wire.KindSnapshotChunk, Snapshot: chunks[0]})
		}, ErrProtocol},
		{"silence", func(*testing.T, session, []wire.SnapshotChunk) {}, ErrSnapshotTimeout},
	} {
		t.Run(tt.name, func(t *testing.T) {
			url, sessions, _ := fakeRelay(t)
			r := startRouter(t, Config{Relays: []Relay{{Addrs: []string{url}}}, ConsumerInstance: testConsumer, Targets: []Target{{Pool: "p", Lane: 0}},
				MinBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond, IdleTimeout: -1,
				SnapshotProgressTimeout: 200 * time.Millisecond}, newNative(t))
			s := nextSession(t, sessions)
			snap := snapshotOn(0, testID, s.epoch, 5, words(1))
			chunks, err := wire.SplitSnapshot(&snap, wire.MaxSnapshotChunkOverhead+8*32) // 2 chunks of 32 words
			require.NoError(t, err)
			require.Len(t, chunks, 2)
			s.frame(t, wire.Frame{Kind: wire.KindSnapshotChunk, Snapshot: chunks[0]})
			tt.then(t, s, chunks)
			nextSessionOn(t, sessions, 0, 10*time.Second)
			li := r.Lane(0)
			assert.Contains(t, li.LastError, tt.want.Error(), "why the session ended")
			assert.False(t, li.Ready)
		})
	}
}

// TestRouter_LivenessCountsOnlyFramesThatMoveTheLane (issue #30 items 4–5):
// after the snapshot, heartbeats at the lane's sequence keep a quiet relay
// followed past many IdleTimeouts; a stream of stale deltas, which the
// consumer ignores, does not, and the session ends ErrIdle.
func TestRouter_LivenessCountsOnlyFramesThatMoveTheLane(t *testing.T) {
	const idle = 300 * time.Millisecond
	url, sessions, _ := fakeRelay(t)
	r := startRouter(t, Config{Relays: []Relay{{Addrs: []string{url}}}, ConsumerInstance: testConsumer, Targets: []Target{{Pool: "p", Lane: 0}},
		MinBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond, IdleTimeout: idle}, newNative(t))
	s := nextSession(t, sessions)
	snap := snapshotOn(0, testID, s.epoch, 5, words(1))
	s.write(t, func(w *wire.Writer) error { return w.WriteSnapshot(&snap) })
	hb := wire.Frame{Kind: wire.KindHeartbeat, Heartbeat: wire.Heartbeat{Identity: testID, Lease: lease(s.epoch), LastSequence: 5}}
	for end := time.Now().Add(5 * idle); time.Now().Before(end); {
		s.frame(t, hb)
		time.Sleep(idle / 10) // a heartbeat interval well inside IdleTimeout
	}
	li := r.Lane(0)
	require.True(t, li.Ready, "a quiet relay that heartbeats stays followed: %+v", li)
	require.Zero(t, li.Resubscribes)

	stale := wire.Frame{Kind: wire.KindDelta, Delta: ckf.Delta{Identity: testID, Lease: lease(s.epoch), BaseSequence: 3, Sequence: 4,
		Images: []ckf.BucketImage{{Bucket: 1, Word: 7}}}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		for ctx.Err() == nil {
			select {
			case s.ops <- func(w *wire.Writer) error { return w.WriteFrame(&stale) }:
				<-s.errs
			case <-s.done:
				return
			case <-ctx.Done():
				return
			}
			time.Sleep(idle / 10)
		}
	}()
	nextSessionOn(t, sessions, 0, 10*time.Second)
	assert.Contains(t, r.Lane(0).LastError, ErrIdle.Error(), "ignored frames are no sign of life")
}
