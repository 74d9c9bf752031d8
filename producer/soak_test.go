package producer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/stretchr/testify/require"
)

// soakMember is one member's reference model, owned by one goroutine.
type soakMember struct {
	m     ckf.Member
	epoch uint64
	held  map[uint64]struct{} // external hash (== canonical here) → held
}

// soakSubscriber applies every delta to a plain table, checking that each
// stream is gapless, and resubscribes with a new lease after a lag.
type soakSubscriber struct {
	h        Handle
	table    []uint64
	seq      uint64
	lease    uint64
	lags     int
	deltas   int
	marker   ckf.DrainMarker
	ready    chan chan struct{}
	finished chan error
}

func (s *soakSubscriber) subscribe(ctx context.Context) (*Subscription, error) {
	s.lease++
	sub, err := s.h.Subscribe(ctx, testLease(s.lease))
	if err != nil {
		return nil, err
	}
	s.table = append(s.table[:0], sub.Snapshot.Words...)
	s.seq = sub.Snapshot.Sequence
	return sub, nil
}

func (s *soakSubscriber) run(ctx context.Context) {
	sub, err := s.subscribe(ctx)
	if err != nil {
		s.finished <- err
		return
	}
	for {
		select {
		case d, ok := <-sub.Deltas():
			if ok {
				if d.Lease != testLease(s.lease) || d.BaseSequence != s.seq || d.Sequence != s.seq+1 {
					s.finished <- fmt.Errorf("gap: got lease %d %d→%d, installed lease %d at %d",
						d.Lease.AssignmentEpoch, d.BaseSequence, d.Sequence, s.lease, s.seq)
					return
				}
				for _, im := range d.Images {
					s.table[im.Bucket] = im.Word
				}
				s.seq = d.Sequence
				s.deltas++
				continue
			}
			switch err := sub.Err(); {
			case errors.Is(err, ErrLagged):
				s.lags++
				if sub, err = s.subscribe(ctx); err != nil {
					s.finished <- err
					return
				}
			case errors.Is(err, ErrShuttingDown) && !errors.Is(err, ErrFenced):
				m, ok := sub.DrainMarker()
				if !ok {
					s.finished <- errors.New("shutdown without a drain marker")
					return
				}
				s.marker = m
				s.finished <- nil
				return
			default:
				s.finished <- fmt.Errorf("stream ended: %w", err)
				return
			}
		case ack := <-s.ready:
			close(ack) // a live stream is installed
		}
	}
}

func TestActor_Soak(t *testing.T) {
	dur := 2 * time.Second
	if testing.Short() {
		dur = 200 * time.Millisecond
	}
	const goroutines, membersEach = 8, 4
	pc := ckf.DefaultConfig()
	pc.ExpectedBlocks = 1 << 14
	pc.PublishEveryNEvents = 16
	pool, err := ckf.NewPool(pc)
	require.NoError(t, err)
	cfg := DefaultConfig()
	cfg.SubscriberBuffer = 2 // tiny, so lag and resubscription happen too
	cfg.Logger = slog.New(slog.DiscardHandler)
	cfg.Diagnostics = true
	h, faults, err := Start(pool, testScope(), cfg)
	require.NoError(t, err)
	defer h.Fence(context.Background())
	target := NewRecoveryTarget(h, nil, nil)
	ctx := t.Context()

	var faultList []Fault
	faultsDone := make(chan struct{})
	go func() {
		defer close(faultsDone)
		for f := range faults {
			faultList = append(faultList, f)
		}
	}()
	sub := &soakSubscriber{h: h, ready: make(chan chan struct{}), finished: make(chan error, 1)}
	go sub.run(ctx)

	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	deadline := time.Now().Add(dur)
	models := make([][]*soakMember, goroutines)
	errs := make(chan error, goroutines)
	var wg sync.WaitGroup
	for g := range goroutines {
		for i := range membersEach {
			models[g] = append(models[g], &soakMember{m: ckf.Member{WorkerID: uint64(g*membersEach + i + 1), DPRank: uint32(i % 2)},
				held: make(map[uint64]struct{})})
		}
		wg.Add(1)
		go func(rng *rand.Rand, ms []*soakMember) {
			defer wg.Done()
			errs <- soakWorker(ctx, rng, target, ms, deadline)
		}(rand.New(rand.NewPCG(seed, uint64(g))), models[g])
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.NoError(t, h.Flush(ctx), "Flush")
	ack := make(chan struct{})
	select {
	case sub.ready <- ack:
		<-ack
	case err := <-sub.finished:
		require.Fail(t, fmt.Sprintf("subscriber: %v", err))
	}
	require.NoError(t, h.Shutdown(ctx), "Shutdown")
	require.NoError(t, <-sub.finished, "subscriber")
	<-faultsDone
	require.Empty(t, faultList, "%d faults", len(faultList))

	// The actor has stopped: its pool is ours to read.
	tail, words := h.a.pool.BarrierSnapshot()
	require.Nil(t, tail, "shutdown left a tail")
	require.True(t, slices.Equal(sub.table, words), "subscriber table differs from the final barrier snapshot")
	require.Equal(t, sub.marker.ExpectedSequence, sub.seq, "drain marker %+v, subscriber at lease %d sequence %d", sub.marker, sub.lease, sub.seq)
	require.Equal(t, testLease(sub.lease), sub.marker.Lease, "drain marker %+v, subscriber at lease %d sequence %d", sub.marker, sub.lease, sub.seq)

	// Ownership equals the reference model.
	owners := map[uint64]uint32{}
	want := map[ckf.Member]int{}
	for _, ms := range models {
		for _, m := range ms {
			if len(m.held) > 0 {
				want[m.m] = len(m.held)
			}
			for c := range m.held {
				owners[c]++
			}
		}
	}
	got := map[ckf.Member]int{}
	for _, mc := range h.a.pool.MemberCounts() {
		got[mc.Member] = mc.Blocks
	}
	require.Equal(t, fmt.Sprint(want), fmt.Sprint(got), "member counts:\n got %v\nwant %v", got, want)
	for c, n := range owners {
		o, resident := h.a.pool.Owners(c)
		require.Equal(t, n, o, "owners of %#x: got %d want %d", c, o, n)
		require.False(t, resident && !h.a.pool.Contains(c), "resident %#x missing from the filter", c)
	}
	st := h.a.pool.Stats()
	require.Len(t, owners, st.UniqueBlocks, "unique blocks: got %d want %d", st.UniqueBlocks, len(owners))
	d, _ := h.Diagnostics()
	t.Logf("%d deltas, %d lags, %d unique blocks, %d members, %d rebuilds, sequence %d",
		sub.deltas, sub.lags, st.UniqueBlocks, st.Members, d.Rebuilds, sub.seq)
}

// soakWorker drives its members with random events, resets and
// replacements until deadline, keeping the reference model in step.
func soakWorker(ctx context.Context, rng *rand.Rand, target *RecoveryTarget, ms []*soakMember, deadline time.Time) error {
	var eventID uint64
	for time.Now().Before(deadline) {
		m := ms[rng.IntN(len(ms))]
		eventID++
		switch r := rng.IntN(100); {
		case r < 65 && len(m.held) < 96:
			ev := ckf.RouterEvent{WorkerID: m.m.WorkerID, DPRank: m.m.DPRank, EventID: eventID, Kind: ckf.EventStored}
			var prev uint64
			if len(m.held) > 0 && rng.IntN(2) == 0 {
				prev = anyKey(rng, m.held)
				ev.HasParent, ev.ParentHash = true, prev
			}
			for i := range 1 + rng.IntN(4) {
				tok := uint64(1 + rng.IntN(64))
				c := tok
				if i > 0 || ev.HasParent {
					c = ckf.ChainHash(prev, tok)
				}
				ev.Blocks = append(ev.Blocks, ckf.StoredBlock{BlockHash: c, TokensHash: tok})
				prev = c
			}
			if err := target.AdmitEvents(ctx, m.epoch, []ckf.RouterEvent{ev}); err != nil {
				return err
			}
			for _, b := range ev.Blocks {
				m.held[b.BlockHash] = struct{}{}
			}
		case r < 85:
			ev := ckf.RouterEvent{WorkerID: m.m.WorkerID, DPRank: m.m.DPRank, EventID: eventID, Kind: ckf.EventRemoved}
			for range 1 + rng.IntN(3) {
				h := rng.Uint64() // usually unknown: a counted no-op
				if len(m.held) > 0 && rng.IntN(4) != 0 {
					h = anyKey(rng, m.held)
				}
				ev.BlockHashes = append(ev.BlockHashes, h)
				delete(m.held, h)
			}
			if err := target.AdmitEvents(ctx, m.epoch, []ckf.RouterEvent{ev}); err != nil {
				return err
			}
		case r < 92:
			ev := ckf.RouterEvent{WorkerID: m.m.WorkerID, DPRank: m.m.DPRank, EventID: eventID, Kind: ckf.EventCleared}
			if err := target.AdmitEvents(ctx, m.epoch, []ckf.RouterEvent{ev}); err != nil {
				return err
			}
			clear(m.held)
		case r < 96:
			m.epoch++
			if err := target.ResetRank(ctx, m.epoch, m.m, rng.IntN(2) == 0); err != nil {
				return fmt.Errorf("ResetRank: %w", err)
			}
			clear(m.held)
		default:
			m.epoch++
			var evs []ckf.RouterEvent
			next := map[uint64]struct{}{}
			for range rng.IntN(3) {
				tok := uint64(1 + rng.IntN(64))
				evs = append(evs, ckf.RouterEvent{WorkerID: m.m.WorkerID, DPRank: m.m.DPRank, Kind: ckf.EventStored,
					Blocks: []ckf.StoredBlock{{BlockHash: tok, TokensHash: tok}}})
				next[tok] = struct{}{}
			}
			if err := target.ReplaceRank(ctx, m.epoch, m.m, evs); err != nil {
				return fmt.Errorf("ReplaceRank: %w", err)
			}
			m.held = next
		}
	}
	return nil
}

func anyKey(rng *rand.Rand, set map[uint64]struct{}) uint64 {
	n := rng.IntN(len(set))
	for k := range set {
		if n == 0 {
			return k
		}
		n--
	}
	panic("unreachable")
}
