package hub

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/ckfrelay/ckfrelay/ckf"
)

var testIdentity = ckf.ProducerIdentity{
	Pool:                ckf.PoolID{DCID: 7},
	ProducerIncarnation: 1,
	Format:              ckf.NewFormat(ckf.DefaultSeed, 16),
}

func lease(consumer uint64, lane uint8, epoch uint64) ckf.LaneLease {
	return ckf.LaneLease{ConsumerInstance: consumer, PhysicalLane: lane, AssignmentEpoch: epoch}
}

func newReadyHub(t *testing.T, cfg Config) *Hub {
	t.Helper()
	h, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h.Install(ckf.Snapshot{Identity: testIdentity, Lease: lease(0, 0, 1), Sequence: 10, Words: make([]uint64, 16)})
	return h
}

func delta(base uint64, images ...ckf.BucketImage) ckf.Delta {
	return ckf.Delta{Identity: testIdentity, Lease: lease(0, 0, 1), BaseSequence: base, Sequence: base + 1, Images: images}
}

func TestHub_SubscribeBeforeInstallIsNotReady(t *testing.T) {
	h, _ := New(DefaultConfig())
	if _, _, err := h.Subscribe(lease(1, 0, 1)); !errors.Is(err, ErrNotReady) {
		t.Fatalf("Subscribe before Install: err = %v, want ErrNotReady", err)
	}
}

func TestHub_SnapshotThenRestampedContinuation(t *testing.T) {
	h := newReadyHub(t, DefaultConfig())
	if err := h.Apply(delta(10, ckf.BucketImage{Bucket: 3, Word: 0xAB})); err != nil {
		t.Fatal(err)
	}
	l := lease(42, 5, 9)
	snap, sub, err := h.Subscribe(l)
	if err != nil {
		t.Fatal(err)
	}
	if snap.Sequence != 11 || snap.Lease != l || snap.Identity != testIdentity || snap.Words[3] != 0xAB {
		t.Fatalf("snapshot = seq %d lease %+v word[3] %#x; want seq 11, the subscriber's lease, word 0xAB", snap.Sequence, snap.Lease, snap.Words[3])
	}
	if err := h.Apply(delta(11, ckf.BucketImage{Bucket: 3, Word: 0}, ckf.BucketImage{Bucket: 4, Word: 1})); err != nil {
		t.Fatal(err)
	}
	d, err := sub.Next(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if d.BaseSequence != 11 || d.Sequence != 12 || d.Lease != l || len(d.Images) != 2 {
		t.Fatalf("delta = %d→%d lease %+v, %d images; want 11→12 under the subscriber's lease, 2 images", d.BaseSequence, d.Sequence, d.Lease, len(d.Images))
	}
	// The snapshot is the subscriber's own copy.
	if snap.Words[3] != 0xAB {
		t.Fatalf("snapshot word changed under the subscriber: %#x", snap.Words[3])
	}
}

func TestHub_LaggedSubscriberIsClosedAndNeedsHigherEpoch(t *testing.T) {
	h := newReadyHub(t, Config{QueueDeltas: 2, MaxSubscribers: 4})
	_, slow, err := h.Subscribe(lease(1, 0, 1))
	if err != nil {
		t.Fatal(err)
	}
	_, fast, err := h.Subscribe(lease(2, 0, 1))
	if err != nil {
		t.Fatal(err)
	}
	for seq := uint64(10); seq < 13; seq++ {
		if err := h.Apply(delta(seq, ckf.BucketImage{Bucket: 1, Word: seq})); err != nil {
			t.Fatal(err)
		}
		if _, err := fast.Next(context.Background()); err != nil {
			t.Fatalf("fast subscriber: %v", err)
		}
	}
	if _, err := slow.Next(context.Background()); !errors.Is(err, ErrLagged) {
		t.Fatalf("slow subscriber Next: err = %v, want ErrLagged (never a silent skip)", err)
	}
	if got := h.Stats().Subscribers; got != 1 {
		t.Fatalf("subscribers after lag = %d, want 1 (slot freed)", got)
	}
	if _, _, err := h.Subscribe(lease(1, 0, 1)); !errors.Is(err, ErrStaleEpoch) {
		t.Fatalf("resubscribe with the same epoch: err = %v, want ErrStaleEpoch", err)
	}
	snap, _, err := h.Subscribe(lease(1, 0, 2))
	if err != nil {
		t.Fatalf("resubscribe with a higher epoch: %v", err)
	}
	if snap.Sequence != 13 || snap.Words[1] != 12 {
		t.Fatalf("fresh snapshot at %d word %d, want 13 and 12", snap.Sequence, snap.Words[1])
	}
}

func TestHub_EndCausesDrainQueuedDeltasFirst(t *testing.T) {
	cases := []struct {
		name string
		end  func(h *Hub)
		want error
	}{
		{"close", func(h *Hub) { h.Close(nil) }, ErrClosed},
		{"reinstall", func(h *Hub) {
			h.Install(ckf.Snapshot{Identity: testIdentity, Sequence: 0, Words: make([]uint64, 16)})
		}, ErrProducerChanged},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newReadyHub(t, DefaultConfig())
			_, sub, _ := h.Subscribe(lease(1, 0, 1))
			_ = h.Apply(delta(10, ckf.BucketImage{Bucket: 2, Word: 5}))
			c.end(h)
			d, err := sub.Next(context.Background())
			if err != nil || d.Sequence != 11 {
				t.Fatalf("first Next after end = (seq %d, %v), want the queued delta 11", d.Sequence, err)
			}
			if _, err := sub.Next(context.Background()); !errors.Is(err, c.want) {
				t.Fatalf("second Next = %v, want %v", err, c.want)
			}
		})
	}
}

func TestHub_BrokenStreamEndsSubscribersAndRefusesNew(t *testing.T) {
	h := newReadyHub(t, DefaultConfig())
	_, sub, _ := h.Subscribe(lease(1, 0, 1))
	bad := []ckf.Delta{
		delta(9),  // behind
		delta(11), // gap
		{Identity: testIdentity, BaseSequence: 10, Sequence: 12},
		{Identity: ckf.ProducerIdentity{ProducerIncarnation: 2}, BaseSequence: 10, Sequence: 11},
		delta(10, ckf.BucketImage{Bucket: 16, Word: 1}),
	}
	for i, d := range bad {
		h := newReadyHub(t, DefaultConfig())
		if err := h.Apply(d); !errors.Is(err, ErrBrokenStream) {
			t.Errorf("case %d: Apply = %v, want ErrBrokenStream", i, err)
		}
		if _, _, err := h.Subscribe(lease(1, 0, 1)); !errors.Is(err, ErrNotReady) {
			t.Errorf("case %d: Subscribe after break = %v, want ErrNotReady", i, err)
		}
	}
	if err := h.Apply(delta(11)); !errors.Is(err, ErrBrokenStream) {
		t.Fatalf("Apply gap = %v", err)
	}
	if _, err := sub.Next(context.Background()); !errors.Is(err, ErrBrokenStream) {
		t.Fatalf("subscriber after break: %v, want ErrBrokenStream", err)
	}
}

func TestHub_MaxSubscribersAndCancel(t *testing.T) {
	h := newReadyHub(t, Config{QueueDeltas: 1, MaxSubscribers: 2})
	_, a, _ := h.Subscribe(lease(1, 0, 1))
	_, _, _ = h.Subscribe(lease(2, 0, 1))
	if _, _, err := h.Subscribe(lease(3, 0, 1)); !errors.Is(err, ErrTooManySubscribers) {
		t.Fatalf("third subscriber: %v, want ErrTooManySubscribers", err)
	}
	a.Cancel()
	if _, _, err := h.Subscribe(lease(3, 0, 1)); err != nil {
		t.Fatalf("after cancel: %v", err)
	}
}

// TestHub_hammer feeds random deltas while subscribers join, read and apply
// them to their own tables. After Close every subscriber that was not lagged
// holds exactly the mirror's final words.
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
			snap, sub, err := h.Subscribe(lease(uint64(i), 0, 1))
			subscribed.Done()
			if err != nil {
				t.Errorf("subscribe: %v", err)
				return
			}
			words, seq := slices.Clone(snap.Words), snap.Sequence // snapshots are shared: copy to write
			for {
				d, err := sub.Next(context.Background())
				if errors.Is(err, ErrLagged) {
					results <- nil
					return
				}
				if err != nil {
					results <- words
					return
				}
				if d.BaseSequence != seq {
					t.Errorf("subscriber %d: delta base %d, held %d", i, d.BaseSequence, seq)
				}
				for _, im := range d.Images {
					words[im.Bucket] = im.Word
				}
				seq = d.Sequence
			}
		}()
	}
	close(start)
	rng := rand.New(rand.NewPCG(1, 2))
	want := make([]uint64, 16)
	for seq := uint64(10); seq < 10+deltas; seq++ {
		im := ckf.BucketImage{Bucket: uint32(rng.IntN(16)), Word: rng.Uint64()}
		want[im.Bucket] = im.Word
		if err := h.Apply(delta(seq, im)); err != nil {
			t.Fatal(err)
		}
	}
	subscribed.Wait() // every subscriber joined somewhere in the stream
	h.Close(nil)
	wg.Wait()
	close(results)
	for words := range results {
		if words != nil && !slices.Equal(words, want) {
			t.Fatalf("a subscriber's table differs from the mirror")
		}
	}
}

// Snapshots share one table until the next delta, which copies it: a flood of
// subscribers costs one copy, and a lent snapshot never changes under its
// reader.
func TestHub_SnapshotsShareTheTableCopyOnWrite(t *testing.T) {
	h := newReadyHub(t, Config{QueueDeltas: 4, MaxSubscribers: 4})
	s1, _, err := h.Subscribe(lease(1, 0, 1))
	if err != nil {
		t.Fatal(err)
	}
	s2, _, err := h.Subscribe(lease(2, 0, 1))
	if err != nil {
		t.Fatal(err)
	}
	if &s1.Words[0] != &s2.Words[0] {
		t.Error("two snapshots at one sequence hold two copies, want one shared table")
	}
	before := slices.Clone(s1.Words)
	if err := h.Apply(delta(s1.Sequence, ckf.BucketImage{Bucket: 3, Word: 0xfeed})); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(s1.Words, before) {
		t.Error("a delta applied after the snapshot changed the lent words")
	}
	s3, sub3, err := h.Subscribe(lease(3, 0, 1))
	if err != nil {
		t.Fatal(err)
	}
	if s3.Words[3] != 0xfeed || &s3.Words[0] == &s1.Words[0] {
		t.Errorf("snapshot after the delta: word 3 = %#x, shared with the old one %v; want 0xfeed in a new table", s3.Words[3], &s3.Words[0] == &s1.Words[0])
	}
	// The shared delta reaches each subscriber under its own lease.
	if err := h.Apply(delta(s3.Sequence, ckf.BucketImage{Bucket: 4, Word: 1})); err != nil {
		t.Fatal(err)
	}
	d, err := sub3.Next(context.Background())
	if err != nil || d.Lease != lease(3, 0, 1) {
		t.Errorf("Next = %+v, %v; want the delta under lease 3/0/1", d.Lease, err)
	}
}

// A router whose idle timeout fired on a half-open connection resubscribes
// under a higher epoch: the zombie stream of that (consumer, lane) ends at
// once with ErrSuperseded and frees its slot; other lanes are untouched.
func TestHub_HigherEpochSupersedesTheLaneStream(t *testing.T) {
	h := newReadyHub(t, Config{QueueDeltas: 4, MaxSubscribers: 4})
	_, old, err := h.Subscribe(lease(1, 0, 1))
	if err != nil {
		t.Fatal(err)
	}
	_, otherLane, _ := h.Subscribe(lease(1, 1, 1))
	_, otherConsumer, _ := h.Subscribe(lease(2, 0, 1))
	if err := h.Apply(delta(10, ckf.BucketImage{Bucket: 1, Word: 1})); err != nil {
		t.Fatal(err)
	}
	snap, cur, err := h.Subscribe(lease(1, 0, 2))
	if err != nil {
		t.Fatalf("resubscribe under a higher epoch: %v", err)
	}
	select {
	case <-old.Done():
	default:
		t.Fatal("the older stream of the lane is still live after a newer lease was granted")
	}
	if !errors.Is(old.Err(), ErrSuperseded) {
		t.Fatalf("older stream ended with %v, want ErrSuperseded", old.Err())
	}
	// Its lease is fenced: the delta still queued is not handed out.
	if _, err := old.Next(context.Background()); !errors.Is(err, ErrSuperseded) {
		t.Fatalf("Next on the superseded stream = %v, want ErrSuperseded at once", err)
	}
	if got := h.Stats().Subscribers; got != 3 {
		t.Fatalf("subscribers = %d, want 3 (the zombie's slot is freed)", got)
	}
	for _, s := range []*Subscription{otherLane, otherConsumer} {
		if s.Err() != nil {
			t.Fatalf("lease %+v ended with %v; only the same (consumer, lane) is superseded", s.Lease(), s.Err())
		}
	}
	if err := h.Apply(delta(11)); err != nil {
		t.Fatal(err)
	}
	if d, err := cur.Next(context.Background()); err != nil || d.BaseSequence != snap.Sequence {
		t.Fatalf("new stream Next = (%d→%d, %v), want the delta after its snapshot at %d", d.BaseSequence, d.Sequence, err, snap.Sequence)
	}
	// A refused (stale) request supersedes nothing.
	if _, _, err := h.Subscribe(lease(1, 0, 2)); !errors.Is(err, ErrStaleEpoch) {
		t.Fatalf("same epoch again: %v, want ErrStaleEpoch", err)
	}
	if cur.Err() != nil {
		t.Fatalf("a stale request ended the live stream: %v", cur.Err())
	}
}

// At the subscriber limit, the lane's own zombie must not block its
// replacement: its slot passes to the new lease.
func TestHub_SupersedeAtTheSubscriberLimit(t *testing.T) {
	h := newReadyHub(t, Config{QueueDeltas: 1, MaxSubscribers: 1})
	_, old, err := h.Subscribe(lease(1, 0, 1))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := h.Subscribe(lease(2, 0, 1)); !errors.Is(err, ErrTooManySubscribers) {
		t.Fatalf("another lane at the limit: %v, want ErrTooManySubscribers", err)
	}
	if _, _, err := h.Subscribe(lease(1, 0, 2)); err != nil {
		t.Fatalf("the same lane under a higher epoch at the limit: %v, want its slot", err)
	}
	if !errors.Is(old.Err(), ErrSuperseded) {
		t.Fatalf("older stream: %v, want ErrSuperseded", old.Err())
	}
}

// Lease records are keyed by client-chosen ids: subscribe-then-cancel under
// fresh consumer ids must not grow them past MaxLeaseRecords. Records of live
// subscriptions survive pruning (stale epochs stay refused, superseding still
// works); idle ones are forgotten all at once.
func TestHub_LeaseRecordsAreBounded(t *testing.T) {
	const maxRecords = 8
	h := newReadyHub(t, Config{QueueDeltas: 1, MaxSubscribers: 2, MaxLeaseRecords: maxRecords})
	_, live, err := h.Subscribe(lease(0, 0, 5))
	if err != nil {
		t.Fatal(err)
	}
	_, idle, _ := h.Subscribe(lease(1, 0, 9))
	idle.Cancel()
	for c := uint64(100); c < 10_100; c++ {
		_, s, err := h.Subscribe(lease(c, 3, 1))
		if err != nil {
			t.Fatalf("subscribe %d: %v", c, err)
		}
		s.Cancel()
		if n := h.Stats().LeaseRecords; n > maxRecords {
			t.Fatalf("after %d subscribe-then-cancel calls: %d lease records, want ≤ %d", c-99, n, maxRecords)
		}
	}
	if _, _, err := h.Subscribe(lease(0, 0, 5)); !errors.Is(err, ErrStaleEpoch) {
		t.Fatalf("live lane's record lost: same epoch again = %v, want ErrStaleEpoch", err)
	}
	if _, _, err := h.Subscribe(lease(0, 0, 6)); err != nil || !errors.Is(live.Err(), ErrSuperseded) {
		t.Fatalf("after pruning: higher epoch = %v, older stream %v; want a grant that supersedes it", err, live.Err())
	}
	// The idle lane's epoch was forgotten: the hub grants a lower one (the
	// consumer, which refuses non-increasing epochs itself, keeps the lane
	// consistent).
	if _, _, err := h.Subscribe(lease(1, 0, 1)); err != nil {
		t.Fatalf("idle lane after pruning: %v, want its record forgotten", err)
	}
}

func TestConfig_MaxLeaseRecords(t *testing.T) {
	if err := (Config{QueueDeltas: 1, MaxSubscribers: 4, MaxLeaseRecords: 3}).Validate(); err == nil {
		t.Error("MaxLeaseRecords below MaxSubscribers validated")
	}
	if err := DefaultConfig().Validate(); err != nil {
		t.Errorf("DefaultConfig: %v", err)
	}
	h, err := New(Config{QueueDeltas: 1, MaxSubscribers: 1 << 17})
	if err != nil {
		t.Fatal(err)
	}
	if h.cfg.MaxLeaseRecords != 1<<17 {
		t.Errorf("zero MaxLeaseRecords: cap %d, want max(default, MaxSubscribers)", h.cfg.MaxLeaseRecords)
	}
}
