package producer

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ckfrelay/ckfrelay/ckf"
)

var worker2 = ckf.Member{WorkerID: 2}

func diagOn(c *Config) { c.Diagnostics = true }

func replaceAsync(t *RecoveryTarget, epoch uint64, m ckf.Member, evs ...ckf.RouterEvent) <-chan error {
	done := make(chan error, 1)
	go func() { done <- t.ReplaceRank(context.Background(), epoch, m, evs) }()
	return done
}

func pending(t *testing.T, done <-chan error) {
	t.Helper()
	select {
	case err := <-done:
		t.Fatalf("replacement returned %v while it should be held", err)
	default:
	}
}

func rebuilds(t *testing.T, h Handle) uint64 {
	t.Helper()
	d, ok := h.Diagnostics()
	if !ok {
		t.Fatal("diagnostics off")
	}
	return d.Rebuilds
}

func TestRecoveryTarget_InitialRecoveriesShareOneRebuild(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, _ := startActor(t, actorOpts{mutate: diagOn})
		target := NewRecoveryTarget(h, nil, []ckf.Member{worker1, worker2})
		first := replaceAsync(target, 1, worker1, stored(worker1, 0, 1, 2))
		synctest.Wait()
		pending(t, first)
		if err := target.ReplaceRank(t.Context(), 1, worker2, []ckf.RouterEvent{stored(worker2, 0, 3)}); err != nil {
			t.Fatalf("second ReplaceRank: %v", err)
		}
		if err := <-first; err != nil {
			t.Fatalf("first ReplaceRank: %v", err)
		}
		s := mustStats(t, h)
		if s.Pool.UniqueBlocks != 3 || len(s.Members) != 2 {
			t.Fatalf("got unique %d members %d, want 3 and 2", s.Pool.UniqueBlocks, len(s.Members))
		}
		if n := rebuilds(t, h); n != 1 {
			t.Fatalf("rebuilds: got %d want 1", n)
		}
		if target.InitialWaveOpen() {
			t.Fatal("wave still open")
		}
	})
}

func TestRecoveryTarget_InitialDeadlineReleasesPartialWave(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, _ := startActor(t, actorOpts{mutate: diagOn})
		start := time.Now()
		target := NewRecoveryTarget(h, nil, []ckf.Member{worker1, worker2})
		if err := target.ReplaceRank(t.Context(), 1, worker1, []ckf.RouterEvent{stored(worker1, 0, 1)}); err != nil {
			t.Fatal(err)
		}
		if waited := time.Since(start); waited != DefaultInitialRecoveryDeadline {
			t.Fatalf("released after %v, want exactly %v", waited, DefaultInitialRecoveryDeadline)
		}
		// After the wave, a replacement goes through the quiet window alone.
		if err := target.ReplaceRank(t.Context(), 1, worker2, []ckf.RouterEvent{stored(worker2, 0, 2)}); err != nil {
			t.Fatal(err)
		}
		if n := rebuilds(t, h); n != 2 {
			t.Fatalf("rebuilds: got %d want 2", n)
		}
	})
}

func TestRecoveryTarget_CompleteInitialRecoveryReleasesWave(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, _ := startActor(t, actorOpts{mutate: diagOn})
		start := time.Now()
		target := NewRecoveryTarget(h, nil, []ckf.Member{worker1, worker2})
		first := replaceAsync(target, 1, worker1, stored(worker1, 0, 1))
		synctest.Wait()
		pending(t, first)
		target.CompleteInitialRecovery(worker2)
		if err := <-first; err != nil {
			t.Fatal(err)
		}
		if waited := time.Since(start); waited != 0 {
			t.Fatalf("released after %v, want at once", waited)
		}
	})
}

func TestRecoveryTarget_QuietWindowCoalescesReplacements(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, _ := startActor(t, actorOpts{mutate: diagOn})
		target := NewRecoveryTarget(h, nil, nil)
		a := replaceAsync(target, 1, worker1, stored(worker1, 0, 1))
		time.Sleep(3 * time.Millisecond)
		synctest.Wait()
		pending(t, a)
		arrival := time.Now()
		b := replaceAsync(target, 1, worker2, stored(worker2, 0, 2))
		if err := <-a; err != nil {
			t.Fatal(err)
		}
		if err := <-b; err != nil {
			t.Fatal(err)
		}
		if waited := time.Since(arrival); waited != DefaultRecoveryQuietWindow {
			t.Fatalf("batch ran %v after the last arrival, want the %v quiet window", waited, DefaultRecoveryQuietWindow)
		}
		if n := rebuilds(t, h); n != 1 {
			t.Fatalf("rebuilds: got %d want 1", n)
		}
		if s := mustStats(t, h); len(s.Members) != 2 {
			t.Fatalf("members: got %d want 2", len(s.Members))
		}
	})
}

func TestRecoveryTarget_EveryCallerSeesTheBatchResult(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, faults := startActor(t, actorOpts{})
		target := NewRecoveryTarget(h, nil, nil)
		good := replaceAsync(target, 1, worker1, stored(worker1, 0, 1))
		bad := replaceAsync(target, 1, worker2, stored(worker1, 0, 2)) // an event of another member
		for name, done := range map[string]<-chan error{"good": good, "bad": bad} {
			if err := <-done; !errors.Is(err, ckf.ErrInvalidReplacement) {
				t.Fatalf("%s caller: got %v want the batch's ckf.ErrInvalidReplacement", name, err)
			}
		}
		if s := mustStats(t, h); s.Pool.UniqueBlocks != 0 {
			t.Fatalf("a failed batch applied %d blocks", s.Pool.UniqueBlocks)
		}
		noFault(t, faults)
	})
}

func TestRecoveryTarget_SameRankTwiceKeepsTheNewerEpoch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, _ := startActor(t, actorOpts{mutate: diagOn})
		target := NewRecoveryTarget(h, nil, nil)
		newer := replaceAsync(target, 3, worker1, stored(worker1, 0, 30))
		older := replaceAsync(target, 2, worker1, stored(worker1, 0, 20))
		if err := <-newer; err != nil {
			t.Fatal(err)
		}
		if err := <-older; err != nil {
			t.Fatal(err)
		}
		if o, _ := h.a.poolOwnersForTest(t, 30); o != 1 {
			t.Fatalf("owners of the newer dump's block: got %d want 1", o)
		}
		if o, _ := h.a.poolOwnersForTest(t, 20); o != 0 {
			t.Fatalf("owners of the older dump's block: got %d want 0", o)
		}
		// The recorded epoch is 3: epoch 2 is now stale.
		if err := h.ResetRank(t.Context(), 2, worker1, false); !errors.Is(err, ErrStaleSourceEpoch) {
			t.Fatalf("ResetRank at epoch 2: got %v want ErrStaleSourceEpoch", err)
		}
	})
}

func TestRecoveryTarget_RebuildPermitSerializesRebuilds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, _ := startActor(t, actorOpts{})
		permit := NewRebuildPermit()
		target := NewRecoveryTarget(h, permit, nil)
		if !permit.sem.TryAcquire(1) {
			t.Fatal("fresh permit busy")
		}
		done := replaceAsync(target, 1, worker1, stored(worker1, 0, 1))
		time.Sleep(time.Second) // far past the quiet window
		synctest.Wait()
		pending(t, done)
		permit.sem.Release(1)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	})
}

// poolOwnersForTest reads the pool through the actor (Stats orders it after
// every earlier command), then the owner count of canonical.
func (a *actor) poolOwnersForTest(t *testing.T, canonical uint64) (uint32, bool) {
	t.Helper()
	r, err := a.request(t.Context(), command{kind: cmdStats}, false)
	if err != nil {
		t.Fatal(err)
	}
	_ = r
	synctest.Wait() // the actor is idle: reading its pool cannot race
	return a.pool.Owners(canonical)
}
