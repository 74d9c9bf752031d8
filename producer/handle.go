package producer

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/semaphore"

	"github.com/ckfrelay/ckfrelay/ckf"
)

// RankReplacement is the complete, replay-ordered Stored history (a tree
// dump) of one member at a source epoch. An empty Events list removes the
// member.
type RankReplacement struct {
	SourceEpoch uint64
	Member      ckf.Member
	Events      []ckf.RouterEvent
}

// ActorStats is a consistent view of one actor, taken between commands.
type ActorStats struct {
	Pool     ckf.Stats
	Members  []ckf.MemberCount // sorted by (worker_id, dp_rank)
	Sequence uint64            // the publisher's last sequence
	Lease    ckf.LaneLease     // valid when HasLease
	HasLease bool
	Fence    FenceReason

	StaleEventsDropped     uint64 // events from a superseded source epoch
	UnknownRemovalEvents   uint64 // events with at least one unknown removal
	CapacityOmissionEvents uint64 // events with a capacity omission (never a fault)
	PublishFailures        uint64 // publications refused by a fenced publisher or a lagging subscriber
	DegradedResets         uint64
	Faults                 uint64 // faults delivered to the fault channel

	// Source-epoch records (SPEC §7): all of them, those of members holding
	// nothing, and how many idle ones were pruned beyond
	// [Config.MaxIdleSourceEpochs].
	SourceEpochRecords     int
	IdleSourceEpochRecords int
	SourceEpochsPruned     uint64
}

// Handle is the way into one pool's actor. It is a small value: copy it and
// share it across goroutines freely. The zero Handle is not started; its
// methods return [ErrNotStarted].
//
// Every method that takes a context gives up when it is cancelled; work
// already queued still runs.
type Handle struct {
	a *actor
}

// Start builds the identity from scope and pool's format, starts the pool's
// actor goroutine and returns its handle and its fault channel (buffered
// [Config.FaultCapacity]; closed when the actor stops). The actor owns pool
// from now on: the caller must not touch it again.
//
// The fault channel must be drained: a full channel blocks the actor until
// it is read or the actor is fenced.
func Start(pool *ckf.Pool, scope Scope, cfg Config) (Handle, <-chan Fault, error) {
	a, err := newActor(pool, scope, cfg, 0)
	if err != nil {
		return Handle{}, nil, err
	}
	go a.run()
	return Handle{a: a}, a.faults, nil
}

// newActor returns the actor of pool, not running, whose publisher's last
// sequence is sequence.
func newActor(pool *ckf.Pool, scope Scope, cfg Config, sequence uint64) (*actor, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if pool == nil {
		return nil, configError("nil pool")
	}
	a := &actor{
		cfg:     cfg,
		log:     cfg.Logger,
		mb:      newMailbox(cfg.MailboxCapacity),
		permits: semaphore.NewWeighted(cfg.PayloadPermits),
		faults:  make(chan Fault, cfg.FaultCapacity),
		closing: make(chan struct{}),
		sealed:  make(chan struct{}),
		fence:   make(chan struct{}),
		stopped: make(chan struct{}),
		pool:    pool,
		epochs:  newSourceEpochs(cfg.MaxIdleSourceEpochs),
		timer:   time.NewTimer(time.Hour),
	}
	a.timer.Stop()
	id := scope.Identity(pool.Format())
	a.identity.Store(&id)
	if a.log == nil {
		a.log = slog.Default()
	}
	if cfg.Diagnostics {
		a.diag = &diagnostics{}
	}
	a.sink.maxHeld = heldDeltas(cfg.SubscriberBuffer)
	a.pub = NewPublisher(id, sequence, &a.sink)
	_, a.takesCursors = cfg.Journal.(CursorJournal)
	return a, nil
}

// Identity returns the producer identity stamped on the actor's stream.
func (h Handle) Identity() ckf.ProducerIdentity {
	if h.a == nil {
		return ckf.ProducerIdentity{}
	}
	return *h.a.identity.Load()
}

// MailboxDepth returns the number of commands admitted and not yet started
// (a racy gauge).
func (h Handle) MailboxDepth() int {
	if h.a == nil {
		return 0
	}
	return h.a.mb.depth()
}

// Done is closed when the actor goroutine has stopped.
func (h Handle) Done() <-chan struct{} {
	if h.a == nil {
		return nil
	}
	return h.a.stopped
}

// Diagnostics returns the optional counters; ok is false when
// [Config.Diagnostics] is off. It does not go through the mailbox.
func (h Handle) Diagnostics() (d Diagnostics, ok bool) {
	if h.a == nil || h.a.diag == nil {
		return Diagnostics{}, false
	}
	return h.a.diag.snapshot(), true
}

// AdmitEvent admits one event of the member ev.Member() at sourceEpoch: it
// is [Handle.AdmitEvents] with that one event.
func (h Handle) AdmitEvent(ctx context.Context, sourceEpoch uint64, ev ckf.RouterEvent) error {
	a := h.a
	if a == nil {
		return ErrNotStarted
	}
	// The event travels inline in the mailbox entry: no slice to allocate.
	c := command{kind: cmdApply, single: true, epoch: sourceEpoch, one: ev}
	return a.admitCommand(ctx, &c)
}

// AdmitEvents admits evs, in order, at sourceEpoch, as one command: a source
// that hears events in batches (an engine's ZMQ batch) pays one mailbox
// send and one permit acquisition per batch instead of one per event. It
// acquires payload permits weighted by the events' block counts (min 1 each,
// the sum capped at [Config.PayloadPermits]), then queues the events and
// returns: it never waits for the mutation. A full mailbox or exhausted
// permits back-pressure the caller; nothing is dropped. After Shutdown or
// Fence it returns [ErrShuttingDown]; then none of evs was admitted.
//
// The actor takes ownership of evs and their slices. Per-member order is the
// order of the events and of AdmitEvents returns. Each event is applied and
// checked on its own, exactly as if admitted alone: an event from an older
// epoch than the member's is later dropped silently; one from a newer epoch
// without a reset or replacement is not applied and is reported as a fault.
func (h Handle) AdmitEvents(ctx context.Context, sourceEpoch uint64, evs []ckf.RouterEvent) error {
	return h.admit(ctx, sourceEpoch, evs, nil)
}

// admit queues an Apply command of evs and cursor (nil: none; with one, the
// command is queued even without events).
func (h Handle) admit(ctx context.Context, sourceEpoch uint64, evs []ckf.RouterEvent, cursor *Cursor) error {
	a := h.a
	if a == nil {
		return ErrNotStarted
	}
	if cursor != nil && !a.takesCursors {
		cursor = nil // no journal would see it: spare the actor
	}
	if len(evs) == 0 && cursor == nil {
		return nil
	}
	c := command{kind: cmdApply, epoch: sourceEpoch, evs: evs, cursor: cursor}
	return a.admitCommand(ctx, &c)
}

// admitCommand weighs the Apply command c, acquires its permits and queues
// it.
func (a *actor) admitCommand(ctx context.Context, c *command) error {
	var start time.Time
	if a.diag != nil {
		start = time.Now()
	}
	var w int64
	if c.single {
		w = int64(c.one.BlockCount())
	}
	for i := range c.evs {
		w += int64(c.evs[i].BlockCount())
	}
	w = min(w, a.cfg.PayloadPermits)
	if err := a.acquire(ctx, w); err != nil {
		return err
	}
	c.weight = w
	if err := a.send(ctx, c); err != nil {
		a.permits.Release(w)
		return err
	}
	if a.diag != nil {
		a.diag.mailboxWaited(start)
	}
	return nil
}

// ReplaceRanks replaces the exact state of the given members in one atomic
// rebuild (SPEC §4.5) and publishes the difference as one delta. A
// replacement whose epoch is older than the member's current one fails the
// whole batch with a [*StaleSourceEpochError] (an epoch above
// [MaxSourceEpoch] with [ErrEpochOutOfRange]) before anything is built; an
// invalid replacement fails with the pool's error and the old state intact.
// Neither is a fault. On success every member's epoch becomes its
// replacement's. It waits for the result.
func (h Handle) ReplaceRanks(ctx context.Context, reps []RankReplacement) error {
	a := h.a
	if a == nil {
		return ErrNotStarted
	}
	for i := range reps {
		if err := checkEpochRange(reps[i].SourceEpoch, reps[i].Member); err != nil {
			return err
		}
	}
	var w int64
	for i := range reps {
		for j := range reps[i].Events {
			w += int64(reps[i].Events[j].BlockCount())
		}
	}
	w = min(max(w, 1), a.cfg.PayloadPermits)
	if err := a.acquire(ctx, w); err != nil {
		return err
	}
	r, err := a.request(ctx, command{kind: cmdReplace, weight: w, req: &request{reps: reps}}, true)
	if err != nil {
		return err
	}
	return r.err
}

// ResetRank removes every block of member m, publishes the result and
// records sourceEpoch as the member's epoch. An epoch older than the current
// one returns a [*StaleSourceEpochError], one above [MaxSourceEpoch]
// [ErrEpochOutOfRange]; either changes nothing. degraded marks
// a reset caused by a failed tree dump; such resets are counted. An indexer
// invariant violation met on the way fails the reset with an error matching
// [ckf.ErrIndexerInvariantViolation] and delivers the same ProducerInvariant
// fault a cleared event would; the member's state is removed regardless.
func (h Handle) ResetRank(ctx context.Context, sourceEpoch uint64, m ckf.Member, degraded bool) error {
	if err := checkEpochRange(sourceEpoch, m); err != nil {
		return err
	}
	r, err := h.a.request(ctx, command{kind: cmdReset, epoch: sourceEpoch, req: &request{member: m, degraded: degraded}}, false)
	if err != nil {
		return err
	}
	return r.err
}

// SourceEpoch returns member m's current source epoch as the actor last
// recorded it; ok is false for a member the actor has no epoch for. It does
// not go through the mailbox, so commands still queued are not reflected.
func (h Handle) SourceEpoch(m ckf.Member) (epoch uint64, ok bool) {
	if h.a == nil {
		return 0, false
	}
	epoch, ok = h.a.epochs.load(m)
	return epoch, ok
}

// AdmissionError names the event of a batch that [Handle.CheckEvents]
// refused. errors.Is matches Err's sentinels.
type AdmissionError struct {
	Index int   // the event's index in the batch
	Err   error // a *ckf.EventError, or ErrUnannouncedSourceEpoch
}

func (e *AdmissionError) Error() string { return fmt.Sprintf("event %d: %v", e.Index, e.Err) }

// Unwrap returns Err.
func (e *AdmissionError) Unwrap() error { return e.Err }

// CheckEvents checks a batch at sourceEpoch before admission, for what is
// known without the actor: a device-tier Stored event must be
// canonicalizable on its own (no duplicate block hash, no parentless root
// with start_position > 0: [ckf.ErrInvalidBlockSequence]), and an event of
// a member whose recorded epoch is older than sourceEpoch is an unannounced
// epoch change ([ErrUnannouncedSourceEpoch]). The first refusal is returned
// as an [*AdmissionError]. The actor checks both again when it applies an
// event (a concurrent reset may move an epoch in between); CheckEvents lets
// a caller refuse most bad events up front instead of admitting them only to
// have them dropped.
func (h Handle) CheckEvents(sourceEpoch uint64, evs []ckf.RouterEvent) error {
	var seen map[uint64]struct{}
	for i := range evs {
		ev := &evs[i]
		if ev.Kind != ckf.EventStored || ev.StorageTier != ckf.TierDevice || len(ev.Blocks) == 0 {
			continue
		}
		if !ev.HasParent && ev.HasStartPosition && ev.StartPosition > 0 {
			return &AdmissionError{Index: i, Err: &ckf.EventError{Kind: ckf.ErrInvalidBlockSequence, Member: ev.Member(),
				BlockHash: ev.Blocks[0].BlockHash, Detail: "root block with start_position > 0 cannot be canonicalized"}}
		}
		// Short events (the common case) compare pairwise; long ones use a
		// set, as the pool does.
		useSet := len(ev.Blocks) > 16
		if useSet {
			if seen == nil {
				seen = make(map[uint64]struct{}, len(ev.Blocks))
			}
			clear(seen)
		}
		for j, b := range ev.Blocks {
			dup := false
			if useSet {
				_, dup = seen[b.BlockHash]
				seen[b.BlockHash] = struct{}{}
			} else {
				for _, e := range ev.Blocks[:j] {
					dup = dup || e.BlockHash == b.BlockHash
				}
			}
			if dup {
				return &AdmissionError{Index: i, Err: &ckf.EventError{Kind: ckf.ErrInvalidBlockSequence, Member: ev.Member(),
					BlockHash: b.BlockHash, Detail: "duplicate external hash within one event"}}
			}
		}
	}
	if h.a == nil {
		return nil
	}
	for i := range evs {
		if cur, ok := h.a.epochs.load(evs[i].Member()); ok && sourceEpoch > cur {
			return &AdmissionError{Index: i, Err: fmt.Errorf("%w: worker %d rank %d is at epoch %d, the batch carries %d; reset or replace the rank first",
				ErrUnannouncedSourceEpoch, evs[i].WorkerID, evs[i].DPRank, cur, sourceEpoch)}
		}
	}
	return nil
}

// Flush publishes the pending tail now and waits for it. It returns the
// publisher's error when the tail could not be published.
func (h Handle) Flush(ctx context.Context) error {
	r, err := h.a.request(ctx, command{kind: cmdFlush}, false)
	if err != nil {
		return err
	}
	return r.err
}

// Subscribe installs lease through a barrier snapshot (SPEC §6): the
// previous lease first receives its pending tail and its stream ends with
// [ErrSuperseded]; then the new subscription's snapshot and stream start
// exactly at the publisher's last sequence.
func (h Handle) Subscribe(ctx context.Context, lease ckf.LaneLease) (*Subscription, error) {
	r, err := h.a.request(ctx, command{kind: cmdSubscribe, req: &request{lease: lease}}, false)
	if err != nil {
		return nil, err
	}
	return r.sub, r.err
}

// Barrier returns once the actor has applied every command admitted before
// the call (and so journalled them, with a Journal), publishing nothing. It
// is what a caller that waits for its admissions' durability or
// replication needs, without Stats' cost (a scan of the whole table).
func (h Handle) Barrier(ctx context.Context) error {
	_, err := h.a.request(ctx, command{kind: cmdBarrier}, false)
	return err
}

// Stats returns the actor's statistics, taken between two commands.
func (h Handle) Stats(ctx context.Context) (ActorStats, error) {
	r, err := h.a.request(ctx, command{kind: cmdStats}, false)
	if err != nil {
		return ActorStats{}, err
	}
	return r.stats, nil
}

// Shutdown stops admission (later calls fail with [ErrShuttingDown]),
// lets the actor apply everything already admitted, publishes the tail,
// ends the subscriber's stream with a drain marker, retires the lease and
// waits for the actor to stop. A second Shutdown returns ErrShuttingDown.
// If the actor was fenced before it finished, Shutdown returns an error
// matching [ErrFenced]. If ctx ends first, the shutdown still completes in
// the background.
func (h Handle) Shutdown(ctx context.Context) error {
	a := h.a
	if a == nil {
		return ErrNotStarted
	}
	first := false
	a.shutdownOnce.Do(func() { first = true })
	if !first {
		return a.stopErr()
	}
	a.stopAdmission()
	select {
	case <-a.stopped:
	case <-ctx.Done():
		return ctx.Err()
	}
	if a.fenced() {
		return errFenced
	}
	return nil
}

// Fence stops the actor at once: the unpublished tail is discarded, the
// subscriber's stream ends with [ErrFenced], queued work is refused and
// later calls fail. A fence interrupts an actor blocked on a full fault
// channel. It waits for the actor to stop (or ctx).
func (h Handle) Fence(ctx context.Context) error {
	a := h.a
	if a == nil {
		return ErrNotStarted
	}
	a.fenceOnce.Do(func() {
		a.fenceFlag.Store(true)
		close(a.fence)
	})
	a.stopAdmission()
	select {
	case <-a.stopped:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// actor is the state shared by handles and the actor goroutine. Fields below
// "owned by run" are touched only by the actor goroutine (and, after stopped
// is closed, by tests).
type actor struct {
	cfg Config
	// identity is the publisher's; Reincarnate replaces it (the actor
	// stores, handles load).
	identity     atomic.Pointer[ckf.ProducerIdentity]
	log          *slog.Logger
	mb           *mailbox
	permits      *semaphore.Weighted
	faults       chan Fault
	takesCursors bool // cfg.Journal is a CursorJournal
	diag         *diagnostics

	closing      chan struct{} // closed when admission stops (wakes blocked senders)
	sealed       chan struct{} // closed when no sender can still enqueue
	stopOnce     sync.Once
	shutdownOnce sync.Once
	fence        chan struct{} // closed by Fence, after fenceFlag is set
	fenceFlag    atomic.Bool
	fenceOnce    sync.Once
	stopped      chan struct{}

	// owned by run
	pool       *ckf.Pool
	pub        *Publisher
	sink       streamSink
	epochs     *sourceEpochs
	timer      *time.Timer
	timerArmed bool
	unreleased int64      // permits of commands run, not yet released (releaseApplied)
	sinceYield int        // commands run since the actor last parked or yielded
	stats      ActorStats // counters only; the rest is filled by statsNow
	batch      struct {   // applyBatch's reusable buffers
		verdicts []epochVerdict
		recs     []*epochRecord
		evs      []ckf.RouterEvent
		outs     []ckf.ApplyOutcome
	}
	logs struct{ unknown, capacity, stale, publish rateLimit }
}

// fenced reports whether Fence was called: one atomic load, cheap enough
// to check between every two commands.
func (a *actor) fenced() bool { return a.fenceFlag.Load() }

func (a *actor) stopErr() error {
	if a.fenced() {
		return errFenced
	}
	return errStopped
}

// stopAdmission closes admission once: blocked senders wake and fail, and
// once the mailbox is closed no sender can enqueue, so its content is final
// when sealed closes.
func (a *actor) stopAdmission() {
	a.stopOnce.Do(func() {
		close(a.closing)
		a.mb.close()
		close(a.sealed)
	})
}

// acquire takes w payload permits. The fast path does not allocate; the
// slow path also gives up when admission stops.
func (a *actor) acquire(ctx context.Context, w int64) error {
	if a.permits.TryAcquire(w) {
		return nil
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-a.closing:
			cancel()
		case <-ctx.Done():
		}
	}()
	if err := a.permits.Acquire(ctx, w); err != nil {
		select {
		case <-a.closing:
			return a.stopErr()
		default:
			return context.Cause(ctx)
		}
	}
	return nil
}

// send enqueues c, waiting for mailbox space (back-pressure) unless ctx ends
// or admission stops.
func (a *actor) send(ctx context.Context, c *command) error {
	if err := a.mb.put(ctx, c, a.closing); err != nil {
		if err == errMailboxClosed {
			return a.stopErr()
		}
		return err
	}
	return nil
}

// request sends a command that expects a reply and waits for it. Every
// command the actor receives is answered, by the handler or by the final
// discard, so the reply always arrives. permitsHeld says c.weight permits
// were acquired for it and must be returned if it is never queued.
func (a *actor) request(ctx context.Context, c command, permitsHeld bool) (reply, error) {
	if a == nil {
		return reply{}, ErrNotStarted
	}
	if c.req == nil {
		c.req = &request{}
	}
	c.req.reply = make(chan reply, 1)
	if err := a.send(ctx, &c); err != nil {
		if permitsHeld {
			a.permits.Release(c.weight)
		}
		return reply{}, err
	}
	select {
	case r := <-c.req.reply:
		return r, nil
	case <-ctx.Done():
		return reply{}, ctx.Err()
	}
}

// rateLimit lets a log line through the first time and then at powers of two.
type rateLimit struct{ n uint64 }

func (r *rateLimit) hit() (n uint64, first, log bool) {
	r.n++
	return r.n, r.n == 1, r.n&(r.n-1) == 0
}

func (r *rateLimit) logf(l *slog.Logger, msg string, attrs ...any) {
	n, first, ok := r.hit()
	if !ok {
		return
	}
	attrs = append(attrs, slog.Uint64("occurrences", n))
	if first {
		l.Warn(msg, attrs...)
	} else {
		l.Debug(msg, attrs...)
	}
}
