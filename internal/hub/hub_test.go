package hub

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const testBuckets = 16

var testIdentity = ckf.ProducerIdentity{
	Pool:                ckf.PoolID{DCID: 7},
	ProducerIncarnation: 1,
	Format:              ckf.NewFormat(ckf.DefaultSeed, testBuckets),
}

func lease(consumer uint64, lane uint8, epoch uint64) ckf.LaneLease {
	return ckf.LaneLease{ConsumerInstance: consumer, PhysicalLane: lane, AssignmentEpoch: epoch}
}

func newReadyHub(t *testing.T, cfg Config) *Hub {
	t.Helper()
	h, err := New(cfg)
	require.NoError(t, err)
	h.Install(ckf.Snapshot{Identity: testIdentity, Lease: lease(0, 0, 1), Sequence: 10, Words: make([]uint64, testBuckets)})
	return h
}

func delta(base uint64, images ...ckf.BucketImage) ckf.Delta {
	return ckf.Delta{Identity: testIdentity, Lease: lease(0, 0, 1), BaseSequence: base, Sequence: base + 1, Images: images}
}

func subscribe(t *testing.T, h *Hub, l ckf.LaneLease) *Subscription {
	t.Helper()
	s, err := h.Subscribe(l)
	require.NoError(t, err)
	return s
}

// readSnapshot reads s's whole snapshot, per words at a time.
func readSnapshot(t *testing.T, s *Subscription, per int) []uint64 {
	t.Helper()
	words := make([]uint64, s.Snapshot().Identity.Format.BucketCount)
	for off := 0; off < len(words); {
		n, err := s.ReadSnapshot(off, words[off:min(off+per, len(words))])
		require.NoError(t, err)
		off += n
	}
	return words
}

func TestHub_SubscribeBeforeInstallIsNotReady(t *testing.T) {
	h, err := New(DefaultConfig())
	require.NoError(t, err)
	_, err = h.Subscribe(lease(1, 0, 1))
	require.ErrorIs(t, err, ErrNotReady)
}

func TestHub_SnapshotThenRestampedContinuation(t *testing.T) {
	h := newReadyHub(t, DefaultConfig())
	require.NoError(t, h.Apply(delta(10, ckf.BucketImage{Bucket: 3, Word: 0xAB})))
	l := lease(42, 5, 9)
	sub := subscribe(t, h, l)
	snap := sub.Snapshot()
	assert.Equal(t, uint64(11), snap.Sequence)
	assert.Equal(t, l, snap.Lease)
	assert.Equal(t, testIdentity, snap.Identity)
	assert.Nil(t, snap.Words, "the words are read with ReadSnapshot")
	require.NoError(t, h.Apply(delta(11, ckf.BucketImage{Bucket: 3, Word: 0}, ckf.BucketImage{Bucket: 4, Word: 1})))
	// The snapshot is the state at its sequence, whatever happened since.
	words := readSnapshot(t, sub, 5)
	assert.Equal(t, uint64(0xAB), words[3])
	assert.Zero(t, words[4])
	_, err := sub.ReadSnapshot(0, words)
	require.ErrorIs(t, err, ErrSnapshotRead)
	d, err := sub.Next(context.Background())
	require.NoError(t, err)
	assert.Equal(t, uint64(11), d.BaseSequence)
	assert.Equal(t, uint64(12), d.Sequence)
	assert.Equal(t, l, d.Lease)
	assert.Len(t, d.Images, 2)
}

func TestHub_LaggedSubscriberIsClosedAndNeedsHigherEpoch(t *testing.T) {
	h := newReadyHub(t, Config{QueueDeltas: 2, MaxSubscribers: 4})
	slow := subscribe(t, h, lease(1, 0, 1))
	fast := subscribe(t, h, lease(2, 0, 1))
	readSnapshot(t, fast, testBuckets)
	for seq := uint64(10); seq < 13; seq++ {
		require.NoError(t, h.Apply(delta(seq, ckf.BucketImage{Bucket: 1, Word: seq})))
		_, err := fast.Next(context.Background())
		require.NoError(t, err, "fast subscriber")
	}
	_, err := slow.Next(context.Background())
	require.ErrorIs(t, err, ErrLagged, "never a silent skip")
	assert.Equal(t, 1, h.Stats().Subscribers, "slot freed")
	_, err = h.Subscribe(lease(1, 0, 1))
	require.ErrorIs(t, err, ErrStaleEpoch)
	again := subscribe(t, h, lease(1, 0, 2))
	assert.Equal(t, uint64(13), again.Snapshot().Sequence)
	assert.Equal(t, uint64(12), readSnapshot(t, again, 4)[1])
}

func TestHub_EndCausesDrainQueuedDeltasFirst(t *testing.T) {
	cases := []struct {
		name string
		end  func(h *Hub)
		want error
	}{
		{"close", func(h *Hub) { h.Close(nil) }, ErrClosed},
		{"reinstall", func(h *Hub) {
			h.Install(ckf.Snapshot{Identity: testIdentity, Sequence: 0, Words: make([]uint64, testBuckets)})
		}, ErrProducerChanged},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newReadyHub(t, DefaultConfig())
			sub := subscribe(t, h, lease(1, 0, 1))
			readSnapshot(t, sub, testBuckets)
			require.NoError(t, h.Apply(delta(10, ckf.BucketImage{Bucket: 2, Word: 5})))
			c.end(h)
			d, err := sub.Next(context.Background())
			require.NoError(t, err)
			assert.Equal(t, uint64(11), d.Sequence, "the delta logged before the end")
			_, err = sub.Next(context.Background())
			require.ErrorIs(t, err, c.want)
		})
	}
}

func TestHub_BrokenStreamEndsSubscribersAndRefusesNew(t *testing.T) {
	bad := []ckf.Delta{
		delta(9),  // behind
		delta(11), // gap
		{Identity: testIdentity, BaseSequence: 10, Sequence: 12},
		{Identity: ckf.ProducerIdentity{ProducerIncarnation: 2}, BaseSequence: 10, Sequence: 11},
		delta(10, ckf.BucketImage{Bucket: testBuckets, Word: 1}),
	}
	for i, d := range bad {
		h := newReadyHub(t, DefaultConfig())
		sub := subscribe(t, h, lease(1, 0, 1))
		require.ErrorIs(t, h.Apply(d), ErrBrokenStream, "case %d", i)
		_, err := h.Subscribe(lease(2, 0, 1))
		require.ErrorIs(t, err, ErrNotReady, "case %d: subscribe after the break", i)
		_, err = sub.Next(context.Background())
		require.ErrorIs(t, err, ErrBrokenStream, "case %d: subscriber after the break", i)
	}
}

func TestHub_MaxSubscribersAndCancel(t *testing.T) {
	h := newReadyHub(t, Config{QueueDeltas: 1, MaxSubscribers: 2})
	a := subscribe(t, h, lease(1, 0, 1))
	subscribe(t, h, lease(2, 0, 1))
	_, err := h.Subscribe(lease(3, 0, 1))
	require.ErrorIs(t, err, ErrTooManySubscribers)
	a.Cancel()
	subscribe(t, h, lease(3, 0, 1))
}

// TestHub_hammer feeds random deltas while subscribers join, read their
// snapshots a few words at a time and apply deltas to their own tables. After
// Close every subscriber that was not lagged holds exactly the mirror's final
// words.
func TestHub_hammer(t *testing.T) {
	const subscribers, deltas = 8, 2000
	h := newReadyHub(t, Config{QueueDeltas: 64, MaxSubscribers: subscribers})
	var wg, subscribed sync.WaitGroup
	results := make(chan []uint64, subscribers)
	start := make(chan struct{})
	for i := range subscribers {
		wg.Add(1)
		subscribed.Add(1)
		go func() {
			defer wg.Done()
			<-start
			sub, err := h.Subscribe(lease(uint64(i), 0, 1))
			subscribed.Done()
			if !assert.NoError(t, err) {
				return
			}
			words, seq := make([]uint64, testBuckets), sub.Snapshot().Sequence
			for off := 0; off < len(words); {
				n, err := sub.ReadSnapshot(off, words[off:min(off+1+i, len(words))])
				if err != nil {
					assert.ErrorIs(t, err, ErrLagged)
					results <- nil
					return
				}
				off += n
			}
			for {
				d, err := sub.Next(context.Background())
				if errors.Is(err, ErrLagged) {
					results <- nil
					return
				}
				if err != nil {
					assert.ErrorIs(t, err, ErrClosed, "subscriber %d", i)
					results <- words
					return
				}
				assert.Equal(t, seq, d.BaseSequence, "subscriber %d", i)
				for _, im := range d.Images {
					words[im.Bucket] = im.Word
				}
				seq = d.Sequence
			}
		}()
	}
	close(start)
	rng := rand.New(rand.NewPCG(1, 2))
	want := make([]uint64, testBuckets)
	for seq := uint64(10); seq < 10+deltas; seq++ {
		im := ckf.BucketImage{Bucket: uint32(rng.IntN(testBuckets)), Word: rng.Uint64()}
		want[im.Bucket] = im.Word
		require.NoError(t, h.Apply(delta(seq, im)))
	}
	subscribed.Wait() // every subscriber joined somewhere in the stream
	h.Close(nil)
	wg.Wait()
	close(results)
	for words := range results {
		if words != nil {
			require.Equal(t, want, words, "a subscriber's table differs from the mirror")
		}
	}
}

// Snapshots share immutable generations of the mirror: subscribers that
// arrive while the log behind the newest generation is short start from it
// (however many deltas came in between), a generation is freed when its last
// reader has read it, and never more than SnapshotGenerations are live, so
// slow readers cost at most that many tables, not one each.
func TestHub_SnapshotGenerationsAreSharedAndBounded(t *testing.T) {
	h := newReadyHub(t, Config{QueueDeltas: 8, MaxSubscribers: 64, SnapshotGenerations: 2})
	tableBytes := int64(8 * testBuckets)
	seq := uint64(10)
	apply := func() {
		require.NoError(t, h.Apply(delta(seq, ckf.BucketImage{Bucket: uint32(seq % testBuckets), Word: seq})))
		seq++
	}
	var subs []*Subscription
	for i := range 40 { // a slow subscriber (it reads nothing) after every delta
		subs = append(subs, subscribe(t, h, lease(uint64(i), 0, 1)))
		apply()
		st := h.Stats()
		require.LessOrEqual(t, st.SnapshotGenerations, 2, "after %d slow subscribers", i+1)
		require.LessOrEqual(t, st.SnapshotBytes, 2*tableBytes)
	}
	// Each snapshot is exactly the mirror at its own sequence: replay.
	for _, s := range subs {
		if s.Err() != nil {
			require.ErrorIs(t, s.Err(), ErrLagged) // its generation's continuation left the log
			continue
		}
		words := readSnapshot(t, s, 3)
		at := s.Snapshot().Sequence
		for b := range words {
			// Bucket b was last written by delta base ≡ b (mod 16) at or before at.
			want := uint64(0)
			for q := uint64(10); q < at; q++ {
				if q%testBuckets == uint64(b) {
					want = q
				}
			}
			require.Equal(t, want, words[b], "snapshot at %d, bucket %d", at, b)
		}
	}
	st := h.Stats()
	assert.Zero(t, st.SnapshotGenerations, "every snapshot read or ended: no generation left")
	assert.Zero(t, st.SnapshotBytes)
	// Readers that took their snapshot go on from its sequence.
	for _, s := range subs {
		if s.Err() == nil {
			d, err := s.Next(context.Background())
			require.NoError(t, err)
			require.Equal(t, s.Snapshot().Sequence, d.BaseSequence)
		}
	}
}

// A subscriber closed lagged in the middle of its snapshot must not keep it:
// the generation goes at once, and reading on reports the end (the relay
// stops writing to it).
func TestHub_LaggedMidSnapshotReleasesItsGeneration(t *testing.T) {
	h := newReadyHub(t, Config{QueueDeltas: 2, MaxSubscribers: 4})
	sub := subscribe(t, h, lease(1, 0, 1))
	buf := make([]uint64, 4)
	_, err := sub.ReadSnapshot(0, buf)
	require.NoError(t, err)
	require.Equal(t, 1, h.Stats().SnapshotGenerations)
	for seq := uint64(10); seq < 13; seq++ {
		require.NoError(t, h.Apply(delta(seq, ckf.BucketImage{Bucket: 1, Word: seq})))
	}
	require.ErrorIs(t, sub.Err(), ErrLagged)
	st := h.Stats()
	assert.Zero(t, st.SnapshotGenerations)
	assert.Zero(t, st.SnapshotBytes)
	assert.Zero(t, st.LogDeltas, "nobody needs the log any more")
	_, err = sub.ReadSnapshot(4, buf)
	require.ErrorIs(t, err, ErrLagged)
}

// The log holds only what the furthest-behind subscriber needs, and nothing
// without subscribers.
func TestHub_LogKeepsOnlyWhatSubscribersNeed(t *testing.T) {
	h := newReadyHub(t, Config{QueueDeltas: 100, MaxSubscribers: 4})
	for seq := uint64(10); seq < 20; seq++ {
		require.NoError(t, h.Apply(delta(seq, ckf.BucketImage{Bucket: 1, Word: seq})))
	}
	assert.Zero(t, h.Stats().LogDeltas)
	sub := subscribe(t, h, lease(1, 0, 1))
	readSnapshot(t, sub, testBuckets)
	for seq := uint64(20); seq < 25; seq++ {
		require.NoError(t, h.Apply(delta(seq, ckf.BucketImage{Bucket: 1, Word: seq})))
	}
	assert.Equal(t, 5, h.Stats().LogDeltas)
	for range 3 {
		_, err := sub.Next(context.Background())
		require.NoError(t, err)
	}
	require.NoError(t, h.Apply(delta(25)))
	st := h.Stats()
	assert.Equal(t, 3, st.LogDeltas, "23→24, 24→25 and 25→26 are still unread")
	assert.Positive(t, st.LogBytes)
}

// The shared log is bounded in bytes too: a burst of large deltas lags the
// subscribers that fall behind it, whatever the delta count.
func TestHub_LogBytesBound(t *testing.T) {
	big := make([]ckf.BucketImage, 1000)
	h := newReadyHub(t, Config{QueueDeltas: 1 << 20, QueueBytes: 64 << 10, MaxSubscribers: 4})
	sub := subscribe(t, h, lease(1, 0, 1))
	seq := uint64(10)
	for ; sub.Err() == nil; seq++ {
		require.NoError(t, h.Apply(delta(seq, big...)))
		require.LessOrEqual(t, h.Stats().LogBytes, int64(64<<10))
	}
	require.ErrorIs(t, sub.Err(), ErrLagged)
	assert.Equal(t, uint64(15), seq, "four 16 KB deltas fit in 64 KiB, the fifth (14→15) does not")
}

// TestHub_SlowSnapshotReaderCatchesUp: a reader that takes its snapshot a
// word at a time while the pool publishes, here 40 deltas per word read
// (640 over the snapshot, far more than a per-subscriber queue of 64 ever
// held), finds every delta since in the shared log and converges to the
// mirror. The interleaving is the test's own: no goroutines, no timing.
func TestHub_SlowSnapshotReaderCatchesUp(t *testing.T) {
	h := newReadyHub(t, Config{QueueDeltas: 1024, MaxSubscribers: 4})
	sub := subscribe(t, h, lease(1, 0, 1))
	rng := rand.New(rand.NewPCG(3, 4))
	want := make([]uint64, testBuckets)
	seq := uint64(10)
	publish := func(n int) {
		for range n {
			im := ckf.BucketImage{Bucket: uint32(rng.IntN(testBuckets)), Word: rng.Uint64()}
			want[im.Bucket] = im.Word
			require.NoError(t, h.Apply(delta(seq, im)))
			seq++
		}
	}
	words := make([]uint64, testBuckets)
	for off := range testBuckets {
		_, err := sub.ReadSnapshot(off, words[off:off+1])
		require.NoError(t, err)
		publish(40)
	}
	at := sub.Snapshot().Sequence
	for {
		d, ok, err := sub.Poll()
		require.NoError(t, err)
		if !ok {
			break
		}
		require.Equal(t, at, d.BaseSequence)
		for _, im := range d.Images {
			words[im.Bucket] = im.Word
		}
		at = d.Sequence
		if at%7 == 0 {
			publish(1) // the pool goes on while it catches up
		}
	}
	assert.Equal(t, seq, at)
	assert.Equal(t, want, words)
}

// A router whose idle timeout fired on a half-open connection resubscribes
// under a higher epoch: the zombie stream of that (consumer, lane) ends at
// once with ErrSuperseded and frees its slot; other lanes are untouched.
func TestHub_HigherEpochSupersedesTheLaneStream(t *testing.T) {
	h := newReadyHub(t, Config{QueueDeltas: 4, MaxSubscribers: 4})
	old := subscribe(t, h, lease(1, 0, 1))
	otherLane := subscribe(t, h, lease(1, 1, 1))
	otherConsumer := subscribe(t, h, lease(2, 0, 1))
	require.NoError(t, h.Apply(delta(10, ckf.BucketImage{Bucket: 1, Word: 1})))
	cur := subscribe(t, h, lease(1, 0, 2))
	select {
	case <-old.Done():
	default:
		require.Fail(t, "the older stream of the lane is still live after a newer lease was granted")
	}
	require.ErrorIs(t, old.Err(), ErrSuperseded)
	// Its lease is fenced: the delta still logged is not handed out.
	_, err := old.Next(context.Background())
	require.ErrorIs(t, err, ErrSuperseded)
	assert.Equal(t, 3, h.Stats().Subscribers, "the zombie's slot is freed")
	for _, s := range []*Subscription{otherLane, otherConsumer} {
		require.NoError(t, s.Err(), "lease %+v: only the same (consumer, lane) is superseded", s.Lease())
	}
	require.NoError(t, h.Apply(delta(11)))
	d, err := cur.Next(context.Background())
	require.NoError(t, err)
	require.Equal(t, cur.Snapshot().Sequence, d.BaseSequence)
	// A refused (stale) request supersedes nothing.
	_, err = h.Subscribe(lease(1, 0, 2))
	require.ErrorIs(t, err, ErrStaleEpoch)
	require.NoError(t, cur.Err())
}

// At the subscriber limit, the lane's own zombie must not block its
// replacement: its slot passes to the new lease.
func TestHub_SupersedeAtTheSubscriberLimit(t *testing.T) {
	h := newReadyHub(t, Config{QueueDeltas: 1, MaxSubscribers: 1})
	old := subscribe(t, h, lease(1, 0, 1))
	_, err := h.Subscribe(lease(2, 0, 1))
	require.ErrorIs(t, err, ErrTooManySubscribers)
	subscribe(t, h, lease(1, 0, 2))
	require.ErrorIs(t, old.Err(), ErrSuperseded)
}

// Lease records are keyed by client-chosen ids: subscribe-then-cancel under
// fresh consumer ids must not grow them past MaxLeaseRecords. Records of live
// subscriptions survive pruning (stale epochs stay refused, superseding still
// works); idle ones are forgotten all at once.
func TestHub_LeaseRecordsAreBounded(t *testing.T) {
	const maxRecords = 8
	h := newReadyHub(t, Config{QueueDeltas: 1, MaxSubscribers: 2, MaxLeaseRecords: maxRecords})
	live := subscribe(t, h, lease(0, 0, 5))
	subscribe(t, h, lease(1, 0, 9)).Cancel()
	for c := uint64(100); c < 10_100; c++ {
		subscribe(t, h, lease(c, 3, 1)).Cancel()
		require.LessOrEqual(t, h.Stats().LeaseRecords, maxRecords, "after %d subscribe-then-cancel calls", c-99)
	}
	_, err := h.Subscribe(lease(0, 0, 5))
	require.ErrorIs(t, err, ErrStaleEpoch, "the live lane's record survives")
	subscribe(t, h, lease(0, 0, 6))
	require.ErrorIs(t, live.Err(), ErrSuperseded)
	// The idle lane's epoch was forgotten: the hub grants a lower one (the
	// consumer, which refuses non-increasing epochs itself, keeps the lane
	// consistent).
	subscribe(t, h, lease(1, 0, 1))
}

func TestConfig_Validate(t *testing.T) {
	require.NoError(t, DefaultConfig().Validate())
	for name, c := range map[string]Config{
		"lease records below subscribers": {QueueDeltas: 1, MaxSubscribers: 4, MaxLeaseRecords: 3},
		"no queue":                        {MaxSubscribers: 1},
		"negative bytes":                  {QueueDeltas: 1, QueueBytes: -1, MaxSubscribers: 1},
		"negative generations":            {QueueDeltas: 1, SnapshotGenerations: -1, MaxSubscribers: 1},
		"no subscribers":                  {QueueDeltas: 1},
	} {
		require.Error(t, c.Validate(), name)
	}
	h, err := New(Config{QueueDeltas: 1, MaxSubscribers: 1 << 17})
	require.NoError(t, err)
	assert.Equal(t, 1<<17, h.cfg.MaxLeaseRecords, "zero MaxLeaseRecords: max(default, MaxSubscribers)")
	assert.Equal(t, int64(DefaultQueueBytes), h.cfg.QueueBytes)
	assert.Equal(t, DefaultSnapshotGenerations, h.cfg.SnapshotGenerations)
}
