package client

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/wire/cbi1"
	"github.com/ckfrelay/ckfrelay/wire/kvrelay/kvrelaypb"
)

const (
	kindChunk     = kvrelaypb.FilterUpdateKind_FILTER_UPDATE_KIND_SNAPSHOT_CHUNK
	kindDelta     = kvrelaypb.FilterUpdateKind_FILTER_UPDATE_KIND_DELTA
	kindHeartbeat = kvrelaypb.FilterUpdateKind_FILTER_UPDATE_KIND_HEARTBEAT
)

// putDelta sends a CBI1 delta base → seq with images (no check of the lane).
func (f *fakeKV) putDelta(t *testing.T, s *fakeSub, base, seq uint64, images []ckf.BucketImage) {
	t.Helper()
	b, err := cbi1.EncodeDelta(testFormat, testPool.DCID, base, seq, images)
	require.NoError(t, err)
	s.put(t, f.update(testID, kindDelta, base, seq, b))
}

// putChunk sends chunk index of count at seq holding words from offset.
func (f *fakeKV) putChunk(t *testing.T, s *fakeSub, seq uint64, index, count uint32, offset uint64, words []uint64) {
	t.Helper()
	fr := cbi1.Frame{Header: cbi1.Header{Kind: cbi1.KindSnapshotChunk, Format: testFormat, DCID: testPool.DCID, Epoch: seq},
		ChunkIndex: index, ChunkCount: count, BucketOffset: offset, Words: words}
	b, err := cbi1.AppendFrame(nil, &fr)
	require.NoError(t, err)
	s.put(t, f.update(testID, kindChunk, seq, seq, b))
}

// tryPut sends m unless the stream already ended (the router may end it on
// the update before).
func (s *fakeSub) tryPut(m *kvrelaypb.FilterUpdate) {
	select {
	case s.send <- m:
		<-s.sent
	case <-s.done:
	}
}

// TestGRPC_IgnoredUpdateLeavesNoTranslationState (issue #30 item 3): a
// stale delta or a repeated snapshot chunk naming bucket 0, which the
// consumer would ignore, must not become the word an empty delta later
// writes into bucket 0. The session ends on it (sequences only move
// forward; one snapshot per session) and the lane is never seen at
// sequence 8 with the stale word.
func TestGRPC_IgnoredUpdateLeavesNoTranslationState(t *testing.T) {
	for _, tt := range []struct {
		name  string
		stale func(t *testing.T, f *fakeKV, s *fakeSub)
		want  error
	}{
		{"stale delta", func(t *testing.T, f *fakeKV, s *fakeSub) {
			f.putDelta(t, s, 2, 3, []ckf.BucketImage{{Bucket: 0, Word: 0xCCCC}})
		}, ErrInvalidPublication},
		{"snapshot chunk at the installed sequence", func(t *testing.T, f *fakeKV, s *fakeSub) {
			// A whole table in one chunk, so that only its sequence is stale.
			w := make([]uint64, testFormat.BucketCount)
			w[0] = 0xCCCC
			f.putChunk(t, s, 7, 0, 1, 0, w)
		}, ErrProtocol},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f, addr := startFakeKV(t)
			f.setCatalog(1, descriptor(testID))
			r, _ := startGRPCRouter(t, addr, func(c *Config) { c.IdleTimeout = -1 })
			s := f.next(t)
			words := randomWords(rand.New(rand.NewPCG(7, 8)), testFormat.BucketCount)
			words[0] = 0xBBBB
			f.sendSnapshot(t, s, testID, 5, words, 64)
			f.putDelta(t, s, 5, 6, []ckf.BucketImage{{Bucket: 1, Word: 11}})
			f.putDelta(t, s, 6, 7, []ckf.BucketImage{{Bucket: 2, Word: 12}})
			words[1], words[2] = 11, 12
			require.Eventually(t, func() bool { _, seq := laneWords(t, r); return seq == 7 }, 5*time.Second, time.Millisecond)
			tt.stale(t, f, s)
			empty, err := cbi1.EncodeDelta(testFormat, testPool.DCID, 7, 8, nil)
			require.NoError(t, err)
			s.tryPut(f.update(testID, kindDelta, 7, 8, empty))
			s.tryPut(f.update(testID, kindHeartbeat, 8, 8, nil))
			// Until the router resubscribes, the lane must never be at 8
			// with the stale word (today's bug: Ready at 8 holding 0xCCCC).
			var s2 *fakeSub
			for deadline := time.Now().Add(10 * time.Second); s2 == nil; {
				select {
				case s2 = <-f.subs:
					continue
				default:
				}
				if w, seq := laneWords(t, r); seq == 8 {
					require.Equal(t, uint64(0xBBBB), w[0], "bucket 0 at sequence 8")
				}
				require.False(t, time.Now().After(deadline), "no resubscribe within 10s")
				time.Sleep(time.Millisecond)
			}
			assert.Contains(t, r.Lane(0).LastError, tt.want.Error(), "why the session ended")
			// The next session converges on the relay's table.
			words[0] = 0xBBBB
			f.sendSnapshot(t, s2, testID, 8, words, 64)
			require.Eventually(t, func() bool { w, seq := laneWords(t, r); return seq == 8 && assert.ObjectsAreEqual(words, w) }, 5*time.Second, time.Millisecond)
		})
	}
}

// TestGRPC_SequencesOnlyMoveForward (issue #30 item 4): a relay that
// restarts its sequence under the same identity, or sends another delta at
// the sequence it just sent, ends the session with ErrInvalidPublication;
// an identical repeat is ignored but is no sign of life, so a stream of
// them ends the session at IdleTimeout.
func TestGRPC_SequencesOnlyMoveForward(t *testing.T) {
	for _, tt := range []struct {
		name string
		then func(t *testing.T, f *fakeKV, s *fakeSub)
		want error
	}{
		{"sequence restarts", func(t *testing.T, f *fakeKV, s *fakeSub) {
			for seq := uint64(1); seq < 5; seq++ {
				b, err := cbi1.EncodeDelta(testFormat, testPool.DCID, seq, seq+1, []ckf.BucketImage{{Bucket: uint32(seq), Word: seq}})
				require.NoError(t, err)
				s.tryPut(f.update(testID, kindDelta, seq, seq+1, b))
			}
		}, ErrInvalidPublication},
		{"another delta at the last sequence", func(t *testing.T, f *fakeKV, s *fakeSub) {
			f.putDelta(t, s, 11, 12, []ckf.BucketImage{{Bucket: 9, Word: 99}})
		}, ErrInvalidPublication},
		{"identical repeats only", func(t *testing.T, f *fakeKV, s *fakeSub) {
			b, err := cbi1.EncodeDelta(testFormat, testPool.DCID, 11, 12, []ckf.BucketImage{{Bucket: 3, Word: 33}})
			require.NoError(t, err)
			go func() {
				for {
					select {
					case s.send <- f.update(testID, kindDelta, 11, 12, b):
						<-s.sent
					case <-s.done:
						return
					}
					time.Sleep(10 * time.Millisecond)
				}
			}()
		}, ErrIdle},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f, addr := startFakeKV(t)
			f.setCatalog(1, descriptor(testID))
			r, _ := startGRPCRouter(t, addr, func(c *Config) { c.IdleTimeout = 300 * time.Millisecond })
			s := f.next(t)
			words := randomWords(rand.New(rand.NewPCG(9, 10)), testFormat.BucketCount)
			f.sendSnapshot(t, s, testID, 10, words, 64)
			f.putDelta(t, s, 10, 11, []ckf.BucketImage{{Bucket: 1, Word: 1}})
			f.putDelta(t, s, 11, 12, []ckf.BucketImage{{Bucket: 3, Word: 33}})
			require.Eventually(t, func() bool { _, seq := laneWords(t, r); return seq == 12 }, 5*time.Second, time.Millisecond)
			tt.then(t, f, s)
			f.next(t)
			assert.Contains(t, r.Lane(0).LastError, tt.want.Error(), "why the session ended")
		})
	}
}

// TestGRPC_SnapshotThatNeverCompletes (issue #30 item 5, gRPC): chunk 0 of
// 2 then heartbeats, or chunk 0 again, ends the session; chunk 0 then
// silence ends it at SnapshotProgressTimeout.
func TestGRPC_SnapshotThatNeverCompletes(t *testing.T) {
	for _, tt := range []struct {
		name string
		then func(t *testing.T, f *fakeKV, s *fakeSub, words []uint64)
		want error
	}{
		{"heartbeat between chunks", func(t *testing.T, f *fakeKV, s *fakeSub, _ []uint64) {
			s.put(t, f.update(testID, kindHeartbeat, 5, 5, nil))
		}, ErrProtocol},
		{"chunk 0 again", func(t *testing.T, f *fakeKV, s *fakeSub, words []uint64) {
			f.putChunk(t, s, 5, 0, 2, 0, words[:32])
		}, ErrProtocol},
		{"silence", func(*testing.T, *fakeKV, *fakeSub, []uint64) {}, ErrSnapshotTimeout},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f, addr := startFakeKV(t)
			f.setCatalog(1, descriptor(testID))
			r, _ := startGRPCRouter(t, addr, func(c *Config) {
				c.IdleTimeout, c.SnapshotProgressTimeout = -1, 200*time.Millisecond
			})
			s := f.next(t)
			words := randomWords(rand.New(rand.NewPCG(11, 12)), testFormat.BucketCount)
			f.putChunk(t, s, 5, 0, 2, 0, words[:32])
			tt.then(t, f, s, words)
			f.next(t)
			li := r.Lane(0)
			assert.Contains(t, li.LastError, tt.want.Error(), "why the session ended")
			assert.False(t, li.Ready)
		})
	}
}
