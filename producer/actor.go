package producer

import (
	"errors"
	"log/slog"
	"runtime"
	"time"

	"github.com/ckfrelay/ckfrelay/ckf"
)

type commandKind uint8

const (
	cmdApply commandKind = iota + 1
	cmdReplace
	cmdReset
	cmdFlush
	cmdSubscribe
	cmdStats
	cmdBarrier
	cmdExport      // see journal.go
	cmdImage       // see image.go
	cmdReincarnate // see Handle.Reincarnate
	cmdPause       // test only: see pause_test.go
)

// command is one mailbox entry. An Apply command carries its events (one
// inline for AdmitEvent, so admitting one event allocates nothing) and no
// reply channel; the other kinds, rare, carry their arguments and reply in
// req, which keeps the entry the mailbox copies twice per command small.
type command struct {
	kind   commandKind
	single bool // cmdApply: the event is one, not evs
	epoch  uint64
	weight int64             // payload permits held, returned after the command
	evs    []ckf.RouterEvent // cmdApply: applied in order
	cursor *Cursor           // cmdApply: journalled after the events (cursor.go)
	req    *request          // every other kind
	one    ckf.RouterEvent   // cmdApply with single
}

// request is the arguments and the reply of a command other than Apply.
type request struct {
	member   ckf.Member
	degraded bool
	reps     []RankReplacement
	lease    ckf.LaneLease
	reply    chan reply // buffered 1
	pause    *pause
}

type reply struct {
	err   error
	sub   *Subscription
	stats ActorStats
	state *ExactState
	image *Image
}

// pause parks the actor inside a command until release closes (tests).
type pause struct {
	entered chan struct{}
	release chan struct{}
}

// run is the actor goroutine: it alone touches the pool and the publisher.
// Each wake-up takes every queued command and runs them in order.
func (a *actor) run() {
	defer close(a.stopped)
	var batch, rest []command
	fenced := false
	for !fenced {
		var closed bool
		batch, closed = a.mb.take(batch)
		switch {
		case len(batch) > 0:
			rest, fenced = a.runBatch(batch)
			a.pollTimer()
		case closed:
			// Admission is closed and the mailbox was drained.
			fenced = a.fenced()
		default:
			a.sinceYield, a.sink.handed = 0, 0 // parked: the others ran
			fenced = !a.wait()
		}
		if closed {
			break
		}
		a.armTimer()
		a.releaseApplied()
		if !fenced {
			a.yieldAfterBacklog(len(batch))
		}
	}
	a.releaseApplied()
	a.finish(fenced, rest)
}

// runBatch runs the commands the actor took, in order, and clears them. A
// fence wins over the rest: it stops the batch before the next command (or
// interrupts one), and the commands not run are returned for finish to
// refuse.
func (a *actor) runBatch(batch []command) (rest []command, fenced bool) {
	if a.diag != nil {
		a.diag.takes.Add(1)
		a.diag.taken.Add(uint64(len(batch)))
	}
	// The deltas of Apply commands of several events are held and handed
	// over together (streamSink). Any other command first hands over what
	// is held: a reply may be what the subscriber's owner waits for. A
	// command of one event hands its delta over at once, as before:
	// holding those made one event per command no faster where measured
	// (docs/RATIONALE.md "Why does the actor hand deltas over in groups?").
	defer a.sink.release()
	for i := range batch {
		if a.fenced() {
			return batch[i:], true
		}
		a.mb.unrun.Store(int64(len(batch) - i - 1))
		c := &batch[i]
		if c.kind == cmdApply && !c.single {
			a.sink.hold()
		} else {
			a.sink.release()
		}
		if !a.handle(c) {
			return batch[i+1:], true
		}
		a.yieldToTheSubscriber()
	}
	clear(batch) // drop the events and replies until the slice is filled again
	return nil, false
}

// yieldEvery is how many commands the actor runs without parking before it
// yields its thread (yieldAfterBacklog).
const yieldEvery = 256

// A backlogged actor never blocks (the mailbox always has work), and the
// sender it wakes at each take and the actor hand the thread to each other
// directly (Go runs a goroutine just woken next, on the waker's time
// slice), so with few threads the subscriber draining the deltas waited
// until its buffer overflowed: with GOMAXPROCS=1 and a 64-delta buffer the
// stream ended lagged, with the channel mailbox before as well
// (TestActor_BackloggedActorLetsTheSubscriberRun). So the actor yields its
// thread after yieldEvery commands run without parking, between two takes,
// and once it has handed the subscriber a quarter of its buffer, after any
// command.

// yieldAfterBacklog yields after yieldEvery commands run without parking.
// It comes after the batch's permits are released, so the sender that runs
// in the actor's place can admit again.
func (a *actor) yieldAfterBacklog(n int) {
	a.sinceYield += n
	if a.sinceYield >= yieldEvery {
		a.yield()
	}
}

// yieldToTheSubscriber yields once the deltas handed over since the actor
// last parked or yielded fill a quarter of the subscriber's buffer: a yield
// per yieldEvery commands is not enough when every command publishes
// (TestActor_BackloggedActorLetsASubscriberOfEveryEventRun), nor when one
// take holds yieldEvery commands of many events each.
func (a *actor) yieldToTheSubscriber() {
	// The buffer's size from the configuration, not the channel's
	// capacity: the channel's header is on the subscriber's cache line.
	if a.sink.handed >= max(1, a.cfg.SubscriberBuffer/4) {
		a.yield()
	}
}

func (a *actor) yield() {
	a.sinceYield, a.sink.handed = 0, 0
	runtime.Gosched()
}

// wait parks the actor until a command arrives, the timer fires, admission
// closes or a fence. It returns false on a fence.
func (a *actor) wait() bool {
	select {
	case <-a.fence:
		return false
	case <-a.mb.ready:
	case <-a.timer.C:
		a.timerArmed = false
		a.publishPending()
	case <-a.sealed:
	}
	return true
}

// pollTimer publishes the pending tail if the timer fired while the actor
// was busy: a mailbox that never runs empty never parks the actor in wait.
func (a *actor) pollTimer() {
	if !a.timerArmed {
		return
	}
	select {
	case <-a.timer.C:
		a.timerArmed = false
		a.publishPending()
	default:
	}
}

// releaseApplied returns the permits of the Apply commands run since the
// last call: one semaphore hand-over per wake-up, not one per command (the
// semaphore's lock is the one admission takes).
func (a *actor) releaseApplied() {
	if a.unreleased > 0 {
		a.permits.Release(a.unreleased)
		a.unreleased = 0
	}
}

// armTimer keeps the publication timer armed exactly while a dirty tail is
// pending, so a sparse tail below the cadence is published after
// PublicationDelay.
func (a *actor) armTimer() {
	pending := a.pool.HasPendingPublication()
	switch {
	case pending && !a.timerArmed:
		a.timer.Reset(a.cfg.PublicationDelay)
		a.timerArmed = true
	case !pending && a.timerArmed:
		a.timer.Stop()
		a.timerArmed = false
	}
}

// finish publishes the tail (unless fenced), ends the stream, refuses rest
// (the commands of the last batch a fence kept from running) and what is
// left in the mailbox, and closes the fault channel.
func (a *actor) finish(fenced bool, rest []command) {
	a.timer.Stop()
	if fenced {
		a.sink.endCurrent(errFenced, nil)
	} else {
		a.publishPending()
		if m, ok := a.pub.ExactDrainMarker(); ok {
			a.sink.endCurrent(errStopped, &m)
		} else {
			a.sink.endCurrent(errStopped, nil)
		}
	}
	a.pub.RetireLease()
	// Fence and Shutdown both seal; after that the mailbox content is final.
	<-a.sealed
	err := a.stopErr()
	left, _ := a.mb.take(nil)
	for _, cs := range [][]command{rest, left} {
		for i := range cs {
			c := &cs[i]
			if c.weight > 0 {
				a.permits.Release(c.weight)
			}
			if c.req != nil {
				c.req.reply <- reply{err: err}
			}
		}
	}
	close(a.faults)
}

// handle runs one command. It returns false when a fence interrupted it.
func (a *actor) handle(c *command) bool {
	switch c.kind {
	case cmdApply:
		return a.apply(c) && a.journalCursor(c)
	case cmdReplace:
		c.req.reply <- reply{err: a.replace(c)}
		a.permits.Release(c.weight)
	case cmdReset:
		ok, err := a.reset(c)
		c.req.reply <- reply{err: err}
		return ok
	case cmdFlush:
		c.req.reply <- reply{err: a.publishPending()}
	case cmdSubscribe:
		sub, err := a.subscribe(c.req.lease)
		c.req.reply <- reply{sub: sub, err: err}
	case cmdStats:
		c.req.reply <- reply{stats: a.statsNow()}
	case cmdBarrier:
		c.req.reply <- reply{}
	case cmdExport:
		c.req.reply <- reply{state: a.exportState()}
	case cmdImage:
		c.req.reply <- reply{image: a.image()}
	case cmdReincarnate:
		a.reincarnate(c.epoch)
		c.req.reply <- reply{}
	case cmdPause:
		close(c.req.pause.entered)
		select {
		case <-c.req.pause.release:
		case <-a.fence:
			return false
		}
	}
	return true
}

// apply runs an Apply command: its events in order, each as if admitted
// alone. It returns false when a fence interrupted it.
func (a *actor) apply(c *command) bool {
	// The permits cover the whole command; they return once it has run,
	// whether every event applied or a fence stopped it part way, with the
	// rest of the wake-up's (releaseApplied).
	a.unreleased += c.weight
	if c.single {
		return a.applyOne(c.epoch, &c.one)
	}
	if len(c.evs) > 1 && a.pool.Config().ApplyWorkers > 1 && a.epochs.noPruneWithin(len(c.evs)) {
		return a.applyBatch(c)
	}
	for i := range c.evs {
		if !a.applyOne(c.epoch, &c.evs[i]) {
			return false
		}
	}
	return true
}

// applyOne runs one event of an Apply command. It returns false when a
// fence interrupted it.
func (a *actor) applyOne(epoch uint64, ev *ckf.RouterEvent) bool {
	v, r := a.admitEpoch(epoch, ev)
	if !v.applies() {
		return a.refused(v, epoch, ev)
	}
	return a.applied(epoch, ev, r, a.pool.ApplyEvent(ev), v == epochApplyFirst)
}

// applyBatch is apply with the command's events handed to the pool as one
// batch ([ckf.Pool.ApplyEvents], spread over its apply workers), with the
// same result event for event: every event's epoch verdict is taken first,
// which is the verdict it gets one by one because no settle within the
// command can prune a record (noPruneWithin) and only the first event of an
// unknown member sets its epoch; the pool applies the admitted events in
// order exactly as one by one; then each event's outcome is settled,
// journalled, published and faulted in order. A fence that interrupts a
// fault stops the walk there: the journal and the stream end where they end
// one by one (the pool, which a fenced actor discards, has applied the
// rest).
func (a *actor) applyBatch(c *command) bool {
	verdicts, recs := a.batch.verdicts[:0], a.batch.recs[:0]
	evs := c.evs
	all := true
	for i := range c.evs {
		v, r := a.admitEpoch(c.epoch, &c.evs[i])
		verdicts = append(verdicts, v)
		recs = append(recs, r)
		all = all && v.applies()
	}
	if !all {
		evs = a.batch.evs[:0]
		for i, v := range verdicts {
			if v.applies() {
				evs = append(evs, c.evs[i])
			}
		}
	}
	outs := a.pool.ApplyEvents(a.batch.outs[:0], evs)
	ok := true
	j := 0
	for i, v := range verdicts {
		ev := &c.evs[i]
		if !v.applies() {
			if ok = a.refused(v, c.epoch, ev); !ok {
				break
			}
			continue
		}
		if ok = a.applied(c.epoch, ev, recs[i], outs[j], v == epochApplyFirst); !ok {
			break
		}
		j++
	}
	a.batch.verdicts = verdicts
	clear(recs)
	a.batch.recs = recs[:0]
	clear(outs) // drop the batches
	a.batch.outs = outs[:0]
	if !all {
		clear(evs) // drop the references to the command's slices
		a.batch.evs = evs[:0]
	}
	return ok
}

// epochVerdict is what an admitted event's source epoch lets the actor do.
type epochVerdict uint8

const (
	epochApply       epochVerdict = iota // the member's recorded epoch
	epochApplyFirst                      // the member had no record: set now
	epochStale                           // older than the member's: dropped
	epochUnannounced                     // newer, without a reset or replacement: a fault
)

// applies reports whether the event goes to the pool.
func (v epochVerdict) applies() bool { return v == epochApply || v == epochApplyFirst }

// admitEpoch checks ev's source epoch against its member's, recording it
// for a member that has none. It returns the member's record (nil when the
// event does not apply), which applied settles without a second lookup.
func (a *actor) admitEpoch(epoch uint64, ev *ckf.RouterEvent) (epochVerdict, *epochRecord) {
	m := ev.Member()
	r := a.epochs.lookup(m)
	switch {
	case r == nil:
		return epochApplyFirst, a.epochs.set(m, epoch)
	case epoch < r.epoch:
		return epochStale, nil
	case epoch > r.epoch:
		return epochUnannounced, nil
	}
	return epochApply, r
}

// refused handles an event its epoch keeps from the pool. It returns false
// when a fence interrupted the delivery of its fault.
func (a *actor) refused(v epochVerdict, epoch uint64, ev *ckf.RouterEvent) bool {
	m := ev.Member()
	if v == epochStale {
		a.stats.StaleEventsDropped++
		a.logs.stale.logf(a.log, "producer: dropping an event from a superseded source epoch",
			memberAttrs(m, epoch, ev.EventID)...)
		return true
	}
	d, _ := ckf.DispositionOf(ckf.SourceProtocolFailure)
	return a.fault(Fault{Member: m, SourceEpoch: epoch, EventID: ev.EventID,
		Category: FaultSourceProtocol, Disposition: d, Err: ErrUnannouncedSourceEpoch})
}

// applied settles one event the pool applied: its member's epoch record
// (r, the one admitEpoch returned), logs, publication, journal and fault.
// first says the event found its member without a record (admitEpoch set
// it). It returns false when a fence interrupted the delivery of its fault.
func (a *actor) applied(epoch uint64, ev *ckf.RouterEvent, r *epochRecord, out ckf.ApplyOutcome, first bool) bool {
	m := ev.Member()
	if r.deleted {
		// In a batch an earlier event of this member faulted and forgot
		// the record; one by one this event would have found the record a
		// later event set since, or set it again.
		if r = a.epochs.lookup(m); r == nil {
			r = a.epochs.set(m, epoch)
			first = true
		}
	}
	var d ckf.Disposition
	var cat FaultCategory
	isFault := false
	if out.FirstError != nil {
		d, _ = ckf.DispositionOf(ckf.FailurePointOf(out.FirstError))
		cat, isFault = CategoryOf(d.Action)
	}
	if isFault && first {
		// A faulted event is not journalled, so it must leave no trace in
		// the epochs either: a replica or a restart replaying the journal
		// would not have the record (or its idle position).
		a.epochs.forget(r)
	} else if !isFault {
		a.epochs.settle(r, out.MemberBlocks > 0)
	}
	if out.UnknownRemovals > 0 {
		a.stats.UnknownRemovalEvents++
		a.logs.unknown.logf(a.log, "producer: ignoring removals of blocks the member does not hold",
			append(memberAttrs(m, epoch, ev.EventID), slog.Int("unknown_removals", out.UnknownRemovals))...)
	}
	if out.Batch != nil {
		a.publish(out.Batch)
	} else if out.PublicationBoundary && a.diag != nil {
		a.diag.unchanged.Add(1)
	}
	if out.FirstError == nil {
		a.journalAdmitted(epoch, ev)
		return true
	}
	if !isFault {
		a.journalAdmitted(epoch, ev)
		// A capacity omission is a pre-commit, lossy-index omission: exact
		// state is kept and a later store re-offers the block. Never a fault.
		a.stats.CapacityOmissionEvents++
		a.logs.capacity.logf(a.log, "producer: capacity omission; the block stays tracked as non-resident",
			memberAttrs(m, epoch, ev.EventID)...)
		return true
	}
	return a.fault(Fault{Member: m, SourceEpoch: epoch, EventID: ev.EventID,
		Category: cat, Disposition: d, Err: out.FirstError})
}

// journalAdmitted hands an applied event to the journal, if any.
func (a *actor) journalAdmitted(epoch uint64, ev *ckf.RouterEvent) {
	if a.cfg.Journal != nil {
		a.cfg.Journal.Admitted(epoch, ev)
	}
}

// fault delivers f, blocking while the channel is full; a fence interrupts
// the wait (it returns false then).
func (a *actor) fault(f Fault) bool {
	// The owner may read the stream before the faults: hand it what is
	// held before waiting, as the deltas were handed over one by one.
	a.sink.handOver()
	select {
	case a.faults <- f:
		a.stats.Faults++
		return true
	case <-a.fence:
		return false
	}
}

func memberAttrs(m ckf.Member, epoch, eventID uint64) []any {
	return []any{slog.Uint64("worker_id", m.WorkerID), slog.Uint64("dp_rank", uint64(m.DPRank)),
		slog.Uint64("source_epoch", epoch), slog.Uint64("event_id", eventID)}
}

// publish hands one batch to the publisher. A lagging subscriber retires the
// lease as stalled; a fenced publisher drops the batch, which the next
// subscriber's barrier snapshot covers.
func (a *actor) publish(b *ckf.Batch) error {
	out, err := a.pub.Publish(b)
	if err != nil {
		if errors.Is(err, ErrLagged) {
			a.pub.RetireStalledLease()
		}
		a.stats.PublishFailures++
		a.logs.publish.logf(a.log, "producer: publication refused", slog.Any("error", err))
		return err
	}
	if a.diag != nil {
		if out.Published {
			a.diag.publications.Add(1)
		} else {
			a.diag.unchanged.Add(1)
		}
	}
	return nil
}

func (a *actor) publishPending() error {
	if b := a.pool.Flush(); b != nil {
		return a.publish(b)
	}
	return nil
}

func (a *actor) staleEpoch(m ckf.Member, epoch uint64) error {
	if cur, ok := a.epochs.get(m); ok && epoch < cur {
		return &StaleSourceEpochError{Member: m, Current: cur, Received: epoch}
	}
	return nil
}

func (a *actor) replace(c *command) error {
	for _, r := range c.req.reps {
		if err := a.staleEpoch(r.Member, r.SourceEpoch); err != nil {
			return err
		}
	}
	var start time.Time
	if a.diag != nil {
		start = time.Now()
	}
	reps := make([]ckf.RankReplacement, len(c.req.reps))
	for i, r := range c.req.reps {
		reps[i] = ckf.RankReplacement{Member: r.Member, Events: r.Events}
	}
	b, err := a.pool.ReplaceRanks(reps)
	if a.diag != nil {
		a.diag.rebuilt(start)
	}
	if err != nil {
		return err
	}
	for _, r := range c.req.reps {
		a.epochs.settle(a.epochs.set(r.Member, r.SourceEpoch), a.pool.MemberBlocks(r.Member) > 0)
	}
	if a.cfg.Journal != nil {
		a.cfg.Journal.Replaced(c.req.reps)
	}
	// The swap committed: a publication problem is the stream's (the
	// publisher fences and the next subscriber's snapshot covers it), not
	// the replacement's.
	if b != nil {
		a.publish(b)
	} else if a.diag != nil {
		a.diag.unchanged.Add(1)
	}
	return nil
}

// reset removes a member's state (SPEC §7). ok is false when a fence
// interrupted the delivery of a fault; err is the caller's reply.
//
// An invariant violation met while removing is reported exactly like one
// met by a cleared event: the removal itself completes (the pool releases
// every block even after an error, so there is nothing left to retry), the
// batch is published, the epoch recorded, a ProducerInvariant fault is
// delivered and the caller gets the error: a failed acknowledgement.
func (a *actor) reset(c *command) (ok bool, err error) {
	if err := a.staleEpoch(c.req.member, c.epoch); err != nil {
		return true, err
	}
	b, err := a.pool.RemoveRank(c.req.member)
	if b != nil {
		a.publish(b)
	} else if a.diag != nil {
		a.diag.unchanged.Add(1)
	}
	a.epochs.settle(a.epochs.set(c.req.member, c.epoch), false)
	if a.cfg.Journal != nil {
		a.cfg.Journal.Reset(c.epoch, c.req.member, c.req.degraded)
	}
	if c.req.degraded {
		a.stats.DegradedResets++
		if a.diag != nil {
			a.diag.degradedResets.Add(1)
		}
	}
	if err == nil {
		return true, nil
	}
	d, _ := ckf.DispositionOf(ckf.FailurePointOf(err))
	if cat, isFault := CategoryOf(d.Action); isFault {
		return a.fault(Fault{Member: c.req.member, SourceEpoch: c.epoch, Category: cat, Disposition: d, Err: err}), err
	}
	return true, err
}

func (a *actor) subscribe(lease ckf.LaneLease) (*Subscription, error) {
	snap, err := a.pub.SnapshotAfterBarrier(a.pool, lease)
	if err != nil && !errors.Is(err, ErrSequenceExhausted) {
		// The old stream could not take its tail (it lagged). The publisher
		// is fenced now, so a second barrier skips the lost tail and its
		// snapshot covers it.
		if errors.Is(err, ErrLagged) {
			a.pub.RetireStalledLease()
		}
		a.stats.PublishFailures++
		snap, err = a.pub.SnapshotAfterBarrier(a.pool, lease)
	}
	if err != nil {
		return nil, err
	}
	a.sink.endCurrent(ErrSuperseded, nil)
	a.sink.cur = newStream(a.cfg.SubscriberBuffer)
	return &Subscription{Snapshot: snap, s: a.sink.cur}, nil
}

func (a *actor) statsNow() ActorStats {
	s := a.stats
	s.Pool = a.pool.Stats()
	s.Members = a.pool.MemberCounts()
	s.Sequence = a.pub.LastSequence()
	s.Lease, s.HasLease = a.pub.Lease()
	s.Fence = a.pub.FenceReason()
	s.SourceEpochRecords = len(a.epochs.rec)
	s.IdleSourceEpochRecords = a.epochs.idleLen
	s.SourceEpochsPruned = a.epochs.pruned
	return s
}
