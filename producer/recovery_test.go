package producer

import (
	"context"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/stretchr/testify/require"
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
		require.Fail(t, fmt.Sprintf("replacement returned %v while it should be held", err))
	default:
	}
}

func rebuilds(t *testing.T, h Handle) uint64 {
	t.Helper()
	d, ok := h.Diagnostics()
	require.True(t, ok, "diagnostics off")
	return d.Rebuilds
}

func TestRecoveryTarget_InitialRecoveriesShareOneRebuild(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, _ := startActor(t, actorOpts{mutate: diagOn})
		target := NewRecoveryTarget(h, nil, []ckf.Member{worker1, worker2})
		first := replaceAsync(target, 1, worker1, stored(worker1, 0, 1, 2))
		synctest.Wait()
		pending(t, first)
		require.NoError(t, target.ReplaceRank(t.Context(), 1, worker2, []ckf.RouterEvent{stored(worker2, 0, 3)}), "second ReplaceRank")
		require.NoError(t, <-first, "first ReplaceRank")
		s := mustStats(t, h)
		require.Equal(t, 3, s.Pool.UniqueBlocks, "got unique %d members %d, want 3 and 2", s.Pool.UniqueBlocks, len(s.Members))
		require.Len(t, s.Members, 2, "got unique %d members %d, want 3 and 2", s.Pool.UniqueBlocks, len(s.Members))
		n := rebuilds(t, h)
		require.Equal(t, uint64(1), n, "rebuilds: got %d want 1", n)
		require.False(t, target.InitialWaveOpen(), "wave still open")
	})
}

func TestRecoveryTarget_InitialDeadlineReleasesPartialWave(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, _ := startActor(t, actorOpts{mutate: diagOn})
		start := time.Now()
		target := NewRecoveryTarget(h, nil, []ckf.Member{worker1, worker2})
		require.NoError(t, target.ReplaceRank(t.Context(), 1, worker1, []ckf.RouterEvent{stored(worker1, 0, 1)}))
		waited := time.Since(start)
		require.Equal(t, DefaultInitialRecoveryDeadline, waited, "released after %v, want exactly %v", waited, DefaultInitialRecoveryDeadline)
		// After the wave, a replacement goes through the quiet window alone.
		require.NoError(t, target.ReplaceRank(t.Context(), 1, worker2, []ckf.RouterEvent{stored(worker2, 0, 2)}))
		n := rebuilds(t, h)
		require.Equal(t, uint64(2), n, "rebuilds: got %d want 2", n)
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
		require.NoError(t, <-first)
		waited := time.Since(start)
		require.Equal(t, time.Duration(0), waited, "released after %v, want at once", waited)
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
		require.NoError(t, <-a)
		require.NoError(t, <-b)
		waited := time.Since(arrival)
		require.Equal(t, DefaultRecoveryQuietWindow, waited, "batch ran %v after the last arrival, want the %v quiet window", waited, DefaultRecoveryQuietWindow)
		n := rebuilds(t, h)
		require.Equal(t, uint64(1), n, "rebuilds: got %d want 1", n)
		s := mustStats(t, h)
		require.Len(t, s.Members, 2, "members: got %d want 2", len(s.Members))
	})
}

func TestRecoveryTarget_EveryCallerSeesTheBatchResult(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, faults := startActor(t, actorOpts{})
		target := NewRecoveryTarget(h, nil, nil)
		good := replaceAsync(target, 1, worker1, stored(worker1, 0, 1))
		bad := replaceAsync(target, 1, worker2, stored(worker1, 0, 2)) // an event of another member
		for name, done := range map[string]<-chan error{"good": good, "bad": bad} {
			err := <-done
			require.ErrorIs(t, err, ckf.ErrInvalidReplacement, "%s caller: got %v want the batch's ckf.ErrInvalidReplacement", name, err)
		}
		s := mustStats(t, h)
		require.Equal(t, 0, s.Pool.UniqueBlocks, "a failed batch applied %d blocks", s.Pool.UniqueBlocks)
		noFault(t, faults)
	})
}

func TestRecoveryTarget_SameRankTwiceKeepsTheNewerEpoch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, _ := startActor(t, actorOpts{mutate: diagOn})
		target := NewRecoveryTarget(h, nil, nil)
		newer := replaceAsync(target, 3, worker1, stored(worker1, 0, 30))
		older := replaceAsync(target, 2, worker1, stored(worker1, 0, 20))
		require.NoError(t, <-newer)
		require.NoError(t, <-older)
		o, _ := h.a.poolOwnersForTest(t, 30)
		require.Equal(t, uint32(1), o, "owners of the newer dump's block: got %d want 1", o)
		o, _ = h.a.poolOwnersForTest(t, 20)
		require.Equal(t, uint32(0), o, "owners of the older dump's block: got %d want 0", o)
		// The recorded epoch is 3: epoch 2 is now stale.
		err := h.ResetRank(t.Context(), 2, worker1, false)
		require.ErrorIs(t, err, ErrStaleSourceEpoch, "ResetRank at epoch 2: got %v want ErrStaleSourceEpoch", err)
	})
}

func TestRecoveryTarget_RebuildPermitSerializesRebuilds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, _ := startActor(t, actorOpts{})
		permit := NewRebuildPermit()
		target := NewRecoveryTarget(h, permit, nil)
		require.True(t, permit.sem.TryAcquire(1), "fresh permit busy")
		done := replaceAsync(target, 1, worker1, stored(worker1, 0, 1))
		time.Sleep(time.Second) // far past the quiet window
		synctest.Wait()
		pending(t, done)
		permit.sem.Release(1)
		require.NoError(t, <-done)
	})
}

// poolOwnersForTest reads the pool through the actor (Stats orders it after
// every earlier command), then the owner count of canonical.
func (a *actor) poolOwnersForTest(t *testing.T, canonical uint64) (uint32, bool) {
	t.Helper()
	r, err := a.request(t.Context(), command{kind: cmdStats}, false)
	require.NoError(t, err)
	_ = r
	synctest.Wait() // the actor is idle: reading its pool cannot race
	return a.pool.Owners(canonical)
}
