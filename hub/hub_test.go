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
