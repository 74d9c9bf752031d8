package producer

import (
	"context"
	"sync"
	"time"

	"golang.org/x/sync/semaphore"

	"github.com/ckfrelay/ckfrelay/ckf"
)

// RebuildPermit serializes rank-replacement rebuilds, typically across all
// pools of one relay, so at most one off-side pool copy is being built at a
// time. Safe for concurrent use.
type RebuildPermit struct{ sem *semaphore.Weighted }

// NewRebuildPermit returns a permit that admits one rebuild at a time.
func NewRebuildPermit() *RebuildPermit { return &RebuildPermit{sem: semaphore.NewWeighted(1)} }

// maxQuietHolds bounds how long a stream of replacements can keep postponing
// its batch: at most this many quiet windows after the first arrival.
const maxQuietHolds = 20

// RecoveryTarget batches rank recovery for one pool's actor (SPEC §7):
//
//   - Rank replacements arriving within [Config.RecoveryQuietWindow] of each
//     other are coalesced into one [Handle.ReplaceRanks] (one rebuild); the
//     window restarts with each arrival, up to 20 windows after the first.
//   - At pool start, replacements of the expected ranks are held until every
//     expected rank has arrived or reported [RecoveryTarget.CompleteInitialRecovery],
//     or until [Config.InitialRecoveryDeadline] after the target was created,
//     so a cold start is one rebuild.
//   - A [RebuildPermit] serializes rebuilds.
//   - Every caller of a batch sees the batch's result. Two replacements of the
//     same rank in one batch collapse into the one with the higher source
//     epoch (the later on a tie); both callers see the batch's result.
//
// A RecoveryTarget is safe for concurrent use.
type RecoveryTarget struct {
	h        Handle
	permit   *RebuildPermit
	quiet    time.Duration
	deadline *time.Timer

	mu       sync.Mutex
	pending  []*pendingReplacement
	byMember map[ckf.Member]*pendingReplacement
	timer    *time.Timer // the quiet-window timer; nil when no flush is scheduled
	first    time.Time   // arrival that scheduled timer
	// expected is the open initial wave's ranks still to arrive; nil once
	// the wave is closed.
	expected map[ckf.Member]struct{}
}

type pendingReplacement struct {
	rep     RankReplacement
	waiters []chan error
}

// NewRecoveryTarget returns the recovery target of the actor behind h,
// configured like the actor ([Config.RecoveryQuietWindow],
// [Config.InitialRecoveryDeadline]). expected lists the ranks of the initial
// recovery wave; none means no wave. permit may be shared by several targets;
// nil gives the target a permit of its own.
func NewRecoveryTarget(h Handle, permit *RebuildPermit, expected []ckf.Member) *RecoveryTarget {
	if permit == nil {
		permit = NewRebuildPermit()
	}
	t := &RecoveryTarget{h: h, permit: permit, byMember: make(map[ckf.Member]*pendingReplacement)}
	cfg := DefaultConfig()
	if h.a != nil {
		cfg = h.a.cfg
	}
	t.quiet = cfg.RecoveryQuietWindow
	if len(expected) > 0 {
		t.expected = make(map[ckf.Member]struct{}, len(expected))
		for _, m := range expected {
			t.expected[m] = struct{}{}
		}
		t.deadline = time.AfterFunc(cfg.InitialRecoveryDeadline, t.expireInitialWave)
	}
	return t
}

// Handle returns the actor handle the target feeds.
func (t *RecoveryTarget) Handle() Handle { return t.h }

// AdmitEvents is [Handle.AdmitEvents].
func (t *RecoveryTarget) AdmitEvents(ctx context.Context, sourceEpoch uint64, evs []ckf.RouterEvent) error {
	return t.h.AdmitEvents(ctx, sourceEpoch, evs)
}

// ResetRank is [Handle.ResetRank].
func (t *RecoveryTarget) ResetRank(ctx context.Context, sourceEpoch uint64, m ckf.Member, degraded bool) error {
	return t.h.ResetRank(ctx, sourceEpoch, m, degraded)
}

// InitialWaveOpen reports whether the initial recovery wave still holds
// replacements.
func (t *RecoveryTarget) InitialWaveOpen() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.expected != nil
}

// ReplaceRank queues the replacement of member m's state with events (its
// complete Stored history) at sourceEpoch and waits for the result of the
// batch it joins. If ctx ends first the replacement stays queued and
// ReplaceRank returns ctx's error.
func (t *RecoveryTarget) ReplaceRank(ctx context.Context, sourceEpoch uint64, m ckf.Member, events []ckf.RouterEvent) error {
	done := make(chan error, 1)
	t.mu.Lock()
	if p := t.byMember[m]; p != nil {
		if sourceEpoch >= p.rep.SourceEpoch {
			p.rep = RankReplacement{SourceEpoch: sourceEpoch, Member: m, Events: events}
		}
		p.waiters = append(p.waiters, done)
	} else {
		p := &pendingReplacement{rep: RankReplacement{SourceEpoch: sourceEpoch, Member: m, Events: events}, waiters: []chan error{done}}
		t.pending = append(t.pending, p)
		t.byMember[m] = p
	}
	if t.expected != nil {
		delete(t.expected, m)
		if len(t.expected) == 0 {
			t.closeWaveLocked()
		}
	} else {
		t.scheduleLocked()
	}
	t.mu.Unlock()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// CompleteInitialRecovery reports that member m will send no replacement in
// the initial wave (it had nothing to recover, or recovered otherwise).
func (t *RecoveryTarget) CompleteInitialRecovery(m ckf.Member) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.expected == nil {
		return
	}
	delete(t.expected, m)
	if len(t.expected) == 0 {
		t.closeWaveLocked()
	}
}

func (t *RecoveryTarget) expireInitialWave() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.expected != nil {
		t.closeWaveLocked()
	}
}

// closeWaveLocked ends the initial wave and flushes what it held at once:
// the wave itself was the batching window.
func (t *RecoveryTarget) closeWaveLocked() {
	t.expected = nil
	if t.deadline != nil {
		t.deadline.Stop()
	}
	if len(t.pending) > 0 && t.timer == nil {
		t.first = time.Now()
		t.timer = time.AfterFunc(0, t.flush)
	}
}

// scheduleLocked (re)starts the quiet window after an arrival.
func (t *RecoveryTarget) scheduleLocked() {
	now := time.Now()
	if t.timer == nil {
		t.first = now
		t.timer = time.AfterFunc(t.quiet, t.flush)
		return
	}
	if now.Sub(t.first) < maxQuietHolds*t.quiet {
		t.timer.Reset(t.quiet)
	}
}

// flush takes the pending batch and runs it as one rebuild under the permit,
// then answers every waiter with the batch's result.
func (t *RecoveryTarget) flush() {
	t.mu.Lock()
	batch := t.pending
	t.pending = nil
	clear(t.byMember)
	t.timer = nil
	t.mu.Unlock()
	if len(batch) == 0 {
		return
	}
	reps := make([]RankReplacement, len(batch))
	for i, p := range batch {
		reps[i] = p.rep
	}
	err := t.rebuild(reps)
	for _, p := range batch {
		for _, w := range p.waiters {
			w <- err
		}
	}
}

func (t *RecoveryTarget) rebuild(reps []RankReplacement) error {
	if t.h.a == nil {
		return ErrNotStarted
	}
	// The holder's ReplaceRanks returns once the actor answers or stops, so
	// waiting for the permit is bounded.
	if err := t.permit.sem.Acquire(context.Background(), 1); err != nil {
		return err
	}
	defer t.permit.sem.Release(1)
	return t.h.ReplaceRanks(context.Background(), reps)
}
