package ckf

import (
	"cmp"
	"errors"
	"math"
	"sync/atomic"
	"time"
)

// ApplyEvents applies evs in order and appends one outcome per event to dst:
// the pool and every outcome are exactly those of [Pool.ApplyEvent] called on
// each event in turn — the same words, batches, refcounts, statistics and
// errors (SPEC §4.3: the parallel apply is an implementation of the
// sequential semantics, not a relaxation of it).
//
// With [Config.ApplyWorkers] ≥ 2 a large enough batch is cut into chunks
// that go through three stages (docs/RATIONALE.md "Why a three-stage
// parallel apply?"):
//
//  1. per member: validation, canonicalisation and lineage, which yield
//     each event's ownership changes in order. Each member of a chunk is
//     one task, which any goroutine of the call may take, so the members
//     are balanced by the work left, not by a fixed split;
//  2. per chunk and block shard, in admission order: the owner counts,
//     which decide which change takes a block's first owner or its last.
//     Each shard of a chunk is one task; whichever goroutine gets to it
//     first takes it, once the same shard's task of the previous chunk is
//     done;
//  3. on the caller's goroutine, in admission order: the cuckoo table's
//     insertions, re-offers and removals, the dirty window and the drains.
//
// The caller drives: it publishes each chunk's tasks, finishes the ones no
// helper took, and takes a chunk through stages 2 and 3 while helper
// goroutines (ApplyWorkers − 1) take the next chunk's tasks and owner
// counts. It never waits for a helper that has not taken anything, so a
// helper that gets no core leaves the caller applying alone, at the staged
// work's cost (about 9% above the sequential apply's). The helpers are
// started by the first parallel call and linger between calls
// (lingerPolls), so that the next call does not wait for the runtime to
// start one on another core.
//
// Stage 1 decides alone only when no bound can refuse an event of the batch
// (MaxMembers, MaxTrackedBlocks, the owner-count ceiling): a batch that
// could reach one, or a small one, is applied event by event instead.
func (p *Pool) ApplyEvents(dst []ApplyOutcome, evs []RouterEvent) []ApplyOutcome {
	if len(p.members) == 1 || len(evs) == 0 || !p.parallelWorthIt(evs) {
		for i := range evs {
			dst = append(dst, p.ApplyEvent(&evs[i]))
		}
		return dst
	}
	return p.applyParallel(dst, evs)
}

// parallelMinBlocks is the smallest batch (in blocks) spread over workers:
// below it the goroutine hand-offs cost more than the work they share.
const parallelMinBlocks = 256

// parallelWorthIt reports whether evs is large enough to share and no event
// of it can be refused by a bound, whatever the order: then stage 1 needs no
// global count. The checks are upper bounds: every Stored block adds at most
// one lineage entry, every Stored event at most one member.
func (p *Pool) parallelWorthIt(evs []RouterEvent) bool {
	var blocks, adds, newMembers uint64
	for i := range evs {
		ev := &evs[i]
		blocks += uint64(ev.BlockCount())
		if ev.Kind != EventStored {
			continue
		}
		adds += uint64(len(ev.Blocks))
		if p.cfg.MaxMembers > 0 && p.member(ev.Member()) == nil {
			newMembers++
		}
	}
	if blocks < p.parallelMin {
		return false
	}
	// An owner count never exceeds the lineage entries.
	if p.contributions+adds > math.MaxUint32 {
		return false
	}
	if p.cfg.MaxTrackedBlocks > 0 && p.contributions+adds > p.cfg.MaxTrackedBlocks {
		return false
	}
	return p.cfg.MaxMembers == 0 || uint64(p.memberCount())+newMembers <= uint64(p.cfg.MaxMembers)
}

// parallel is ApplyEvents' reusable state. Within one call the goroutines
// coordinate through atomics: the caller publishes each chunk's stage-1 job
// in cur, any goroutine claims its tasks, ready counts the chunks through
// stage 1, and each chunk's owners state who takes its stage 2.
type parallel struct {
	chunks  []*chunk
	gor     []applyGoroutine // one per goroutine of the call: 1 the caller, the others helpers
	jobs    []job            // one per chunk, each used once per call
	cuts    []int            // the call's chunk ends
	groupOf map[Member]int32 // the prologue's member → group index, one chunk at a time
	cur     atomic.Pointer[job]
	ready   atomic.Int32 // chunks through stage 1
	// calls counts the calls: a lingering helper polls it for the next.
	calls atomic.Uint64
	// lingerFor is how many polls a helper lingers for after a call, set by
	// the caller between lingerMinPolls and lingerPolls (adaptLinger).
	lingerFor atomic.Int64
	// pollPs is 1 + the fastest a helper's linger has polled, in
	// picoseconds a poll (0: none measured yet): a linger's time over its
	// polls, the fastest because a linger that lost its thread to another
	// goroutine took longer than its polls.
	pollPs atomic.Int64
	stop   atomic.Bool // the call is not open: helpers leave it
	// hold, set by tests only, is called at the pause points below, so a
	// test can force one schedule: the helper held until the call is done
	// (the caller applies alone), or the caller held until the helper has
	// taken a job's every task and each chunk's owner counts.
	hold func(holdPoint)
	// linger, set by tests only, replaces a helper's polls for the next
	// call (lingered): it reports whether a call after seen came (the
	// helper joins it) or the helper leaves, so that a test decides when
	// a helper leaves instead of racing the poll count.
	linger func(seen uint64) bool
	// ran records, for tests, which goroutine took each stage-1 task and
	// stage 2 of each chunk in the last call (their gor index).
	ran struct{ members, owners []int8 }
	// started counts the helper goroutines started (tests).
	started int
}

// applyGoroutine is one goroutine's scratch; padded so that goroutines'
// words do not share a cache line.
type applyGoroutine struct {
	// What the other goroutines read (wakeAll, the end of a call), apart
	// from what only this one writes.
	id int8 // index in parallel.gor
	// parked is set by the goroutine before it blocks on wake, cleared by
	// whichever of it and a waker swaps it first; a waker that clears it
	// sends the one token the goroutine then takes.
	parked atomic.Bool
	wake   chan struct{}
	// alive (helpers): a goroutine runs this helper, in a call or
	// lingering after one; busy: it is in a call.
	alive, busy atomic.Bool
	// leftAt (helpers) is when the helper last left for want of a call
	// (monotonicNanos), read by the next call that has to start one
	// (adaptLinger).
	leftAt atomic.Int64
	_      cacheLinePad
	sc     applyScratch
	warmed uint64 // as Pool.warmed
	_      cacheLinePad
}

// job is stage 1 of one chunk: one task per member group, claimed by next,
// counted by done.
type job struct {
	ch   *chunk
	n    int32
	next atomic.Int32
	done atomic.Int32
	_    [64]byte
}

// chunk is a run of consecutive events of one batch on its way through the
// stages.
type chunk struct {
	recs   []eventRec
	groups []memberGroup
	// owners is stage 2 of the chunk, one task per block shard.
	owners []ownersTask
}

// ownersTask is stage 2 of one chunk for one block shard: the owner counts
// of the shard's blocks, in admission order. Its state is ownersFree, then
// ownersClaimed by the goroutine that applies it, then ownersDone.
type ownersTask struct {
	state atomic.Int32
	by    int8 // the goroutine that took it (tests)
	// edges has a bit per ownership change of the chunk (in admission
	// order; only the shard's are written): the change took the block's
	// first owner (opOwn) or its last (opRelease). Whole cache lines, so
	// that two shards' tasks do not write one line.
	edges []uint64
	_     [64]byte
}

const (
	ownersFree int32 = iota
	ownersClaimed
	ownersDone
)

// eventRec is one event of a parallel batch as the prologue sorts it:
// stage 1 writes its results in its group (memberGroup.outs[slot]), so
// that goroutines' tasks do not write the same lines.
type eventRec struct {
	ev    *RouterEvent
	err   error // admission's refusal
	admit bool  // counts toward the cadence and applies (admission)
	group int32
	slot  int32 // its index in the group's recs
}

// stageOut is what stage 1 found for one event.
type stageOut struct {
	err error // validation's
	// The event's ownership changes: its group's ops[opStart:opEnd].
	opStart, opEnd int32
	unknown        int
	memberBlocks   int
}

// memberGroup is one member's events in one chunk: a stage-1 task.
type memberGroup struct {
	m     Member
	shard int
	// before is the member's state when the chunk starts, ms when its
	// task is done (nil: the member holds nothing); the caller applies
	// the difference to the member shard.
	before, ms      *memberState
	ranBy           int8       // the goroutine that took the task (tests)
	recs            []int32    // indices into the chunk's recs, in order
	outs            []stageOut // one per rec
	ops             []ownOp
	unknownRemovals uint64
	parentNotFound  uint64
	contributions   int64
	_               [64]byte // groups are written by different goroutines
}

// ownOp is one ownership change of one canonical block.
type ownOp struct {
	c     uint64
	kind  uint8 // opOwn, opHeld or opRelease
	shard uint8 // c's block shard (MaxApplyWorkers fits)
}

const (
	opOwn     uint8 = iota + 1 // a new lineage entry: one more owner
	opHeld                     // a stored block the member already holds
	opRelease                  // a lineage entry removed: one owner less
)

// chunkBlocks is the size (in blocks) a batch is cut into: stages 2 and 3
// of one chunk run while a helper takes the next one through stage 1.
// The first chunk's stage 1 and the last one's stage 3 overlap little, so
// chunks are small; each costs a hand-off (docs/RATIONALE.md).
const chunkBlocks = 128

// keptChunks is how many chunk buffers a pool keeps between calls: an
// engine batch of 64 events of 16 blocks is 8 chunks; a larger batch's
// extra buffers are dropped after it, so what a pool retains does not
// follow the largest batch it ever applied.
const keptChunks = 16

func (p *Pool) applyParallel(dst []ApplyOutcome, evs []RouterEvent) []ApplyOutcome {
	workers := len(p.members)
	par := p.parallelState()
	// Chunk ends: every chunkBlocks blocks, and once more where a short
	// last chunk of at most chunkBlocks/4 starts: its stages 2 and 3 are
	// the part of the call no other goroutine overlaps.
	rest := 0
	for i := range evs {
		rest += evs[i].BlockCount()
	}
	cuts, blocks, tail := par.cuts[:0], 0, p.chunkBlocks/4
	for i := range evs[:len(evs)-1] {
		n := evs[i].BlockCount()
		blocks, rest = blocks+n, rest-n
		if blocks >= p.chunkBlocks || (rest <= tail && rest+n > tail) {
			cuts, blocks = append(cuts, i+1), 0
		}
	}
	cuts = append(cuts, len(evs))
	par.cuts = cuts
	for len(par.chunks) < len(cuts) {
		par.chunks = append(par.chunks, &chunk{owners: make([]ownersTask, len(p.blocks))})
	}
	if cap(par.jobs) < len(cuts) {
		par.jobs = make([]job, len(cuts))
	}
	par.jobs = par.jobs[:len(cuts)]
	for i := range par.jobs {
		par.jobs[i].next.Store(0)
		par.jobs[i].done.Store(0)
	}
	par.cur.Store(nil)
	par.ready.Store(0)
	par.ran.members, par.ran.owners = par.ran.members[:0], par.ran.owners[:0]
	// The call's state is reset before stop opens it to the helpers.
	par.stop.Store(false)
	par.calls.Add(1)
	restarted, now := false, monotonicNanos()
	for id := range workers {
		if g := &par.gor[id]; id != 1 && g.alive.CompareAndSwap(false, true) {
			if left := g.leftAt.Load(); left != 0 && !restarted {
				restarted = true
				par.adaptLinger(time.Duration(now - left))
			}
			par.started++
			go p.help(id)
		}
	}
	caller := &par.gor[1]
	lo := p.publish(0, evs, cuts, 0)
	// Chunk j's stage 1 is finished (its remaining tasks, its epilogue)
	// and chunk j+1's published before chunk j-1 goes through stages 2
	// and 3, so that a helper can take chunk j's owner counts and chunk
	// j+1's tasks meanwhile.
	for j := 0; j <= len(cuts); j++ {
		if j < len(cuts) {
			jb := &par.jobs[j]
			p.until(caller, func() bool { return jb.done.Load() >= jb.n }, nil)
			p.epilogue(par.chunks[j])
			par.ready.Store(int32(j + 1))
			par.wakeAll()
			if par.hold != nil {
				par.hold(holdReady)
			}
			if j+1 < len(cuts) {
				lo = p.publish(j+1, evs, cuts, lo)
			}
		}
		if j == 0 {
			continue
		}
		ch := par.chunks[j-1]
		// The owner counts of the chunks before j-1 are done (stage 3
		// of j-2 needed them): take the shards no helper has, then wait
		// for the others.
		for s := range ch.owners {
			if ch.owners[s].state.CompareAndSwap(ownersFree, ownersClaimed) {
				p.stageOwners(caller, ch, s)
			}
		}
		p.until(caller, ch.ownersDone, nil)
		dst = p.stageTable(ch, dst)
	}
	par.stop.Store(true)
	par.wakeAll()
	for id := range par.gor {
		if g := &par.gor[id]; id != 1 {
			p.until(caller, func() bool { return !g.busy.Load() }, noWork)
		}
	}
	for _, ch := range par.chunks[:len(cuts)] {
		if par.hold == nil {
			break
		}
		for i := range ch.groups {
			par.ran.members = append(par.ran.members, ch.groups[i].ranBy)
		}
		for s := range ch.owners {
			par.ran.owners = append(par.ran.owners, ch.owners[s].by)
		}
	}
	for i := range par.gor {
		p.warmed ^= par.gor[i].warmed
		par.gor[i].warmed = 0
	}
	for _, ch := range par.chunks[:len(cuts)] {
		clear(ch.recs) // drop the references to the caller's events
		ch.recs = ch.recs[:0]
		for s := range ch.owners {
			ch.owners[s].state.Store(ownersFree)
		}
	}
	if len(par.chunks) > keptChunks { // an outsized batch's buffers go with it
		clear(par.chunks[keptChunks:])
		par.chunks = par.chunks[:keptChunks]
		par.jobs = nil
	}
	return dst
}

// parallelState returns the pool's ApplyEvents state, made on first use.
func (p *Pool) parallelState() *parallel {
	if p.par == nil {
		par := &parallel{gor: make([]applyGoroutine, len(p.members)), groupOf: make(map[Member]int32)}
		par.lingerFor.Store(lingerPolls)
		for i := range par.gor {
			par.gor[i].id, par.gor[i].wake = int8(i), make(chan struct{}, 1)
		}
		p.par = par
	}
	return p.par
}

// publish prepares chunk j from evs[lo:cuts[j]] (admission, grouping by
// member) and publishes its stage-1 job; it returns the chunk's end.
func (p *Pool) publish(j int, evs []RouterEvent, cuts []int, lo int) int {
	par := p.par
	ch := par.chunks[j]
	p.prologue(ch, evs[lo:cuts[j]])
	jb := &par.jobs[j]
	jb.ch, jb.n = ch, int32(len(ch.groups))
	par.cur.Store(jb)
	par.wakeAll()
	if par.hold != nil {
		par.hold(holdPublished)
	}
	return cuts[j]
}

// help is a helper goroutine: in each call it joins, until the caller is
// done, it takes stage-1 tasks and the owner counts (stage 2) of every
// ready chunk it can (see takeOwners). Between calls it polls for the next
// one for lingerPolls, then returns; the next call starts a new helper.
func (p *Pool) help(id int) {
	par := p.par
	g := &par.gor[id]
	var seen uint64 // the last call it looked at
	for {
		if c := par.calls.Load(); c != seen {
			seen = c
			p.joinCall(g)
			continue
		}
		if par.hold != nil {
			par.hold(holdIdle)
		}
		polls, from := par.lingerFor.Load(), monotonicNanos()
		if p.lingered(seen, polls) {
			continue
		}
		// Nothing came: leave, unless a call started after all and
		// found this helper still alive (so started none).
		now := monotonicNanos()
		par.notePollTime((now - from) * 1000 / polls)
		g.leftAt.Store(now)
		g.alive.Store(false)
		if par.hold != nil {
			par.hold(holdLeave)
		}
		if par.calls.Load() == seen || !g.alive.CompareAndSwap(false, true) {
			if par.hold != nil {
				par.hold(holdGone)
			}
			return
		}
	}
}

// lingered polls for a call after seen, up to polls times; it reports
// whether one came. The bound is a poll count, not a clock: under
// testing/synctest the clock stands still while a goroutine runs, and a
// helper waiting for it to move would never let the bubble settle.
func (p *Pool) lingered(seen uint64, polls int64) bool {
	par := p.par
	if par.linger != nil {
		return par.linger(seen)
	}
	for range polls {
		if par.calls.Load() != seen {
			return true
		}
	}
	return false
}

// adaptLinger sets how long helpers linger from how long ago a helper left
// when a call has to start one again, against how long the longest linger
// (lingerPolls) takes on this host at the fastest poll measured: a call that came within it would have
// been caught by a longer linger, so the linger doubles (up to
// lingerPolls); one that came later would have found it gone anyway, so
// the linger shrinks by a quarter (down to lingerMinPolls: 17 such calls
// from the longest). It shrinks slower than it grows so that a stream
// whose caller lost its core once keeps its helpers. A relay fed a steady
// stream keeps its helpers; one fed a trickle (a batch every millisecond or
// slower) stops paying every helper's full linger after each batch
// (docs/RATIONALE.md "Why is apply_workers GOMAXPROCS by default?"). A
// linger that catches its call leaves the length as it is.
func (par *parallel) adaptLinger(sinceLeft time.Duration) {
	n, ps := par.lingerFor.Load(), par.pollPs.Load()
	if ps == 0 || sinceLeft <= time.Duration((ps-1)*lingerPolls/1000) {
		n = min(2*n, lingerPolls)
	} else {
		n = max(n-n/4, lingerMinPolls)
	}
	par.lingerFor.Store(n)
}

// notePollTime records a linger's picoseconds a poll if it is the fastest.
func (par *parallel) notePollTime(ps int64) {
	ps = max(ps, 0) + 1
	for {
		old := par.pollPs.Load()
		if old != 0 && old <= ps || par.pollPs.CompareAndSwap(old, ps) {
			return
		}
	}
}

// lingerMinPolls is the shortest linger (1/128 of lingerPolls, about a
// microsecond): at a trickle the helpers cost a goroutine start per call
// and a moment of polling, instead of lingerPolls each.
const lingerMinPolls = lingerPolls / 128

// monotonicNanos is a monotonic clock reading in nanoseconds (time.Since a
// fixed instant): the linger's adaptation compares two of them.
func monotonicNanos() int64 { return int64(time.Since(clockBase)) }

var clockBase = time.Now()

// lingerPolls is how long a helper polls for the next call before it
// returns: an engine batch's call follows the previous one within
// microseconds when events stream, and a helper that is still running
// takes the new call's first tasks at once, where a new goroutine waits
// for the runtime to wake a thread on the other core (tens to hundreds of
// microseconds measured, a third of a 64-event batch).
// Each poll is an atomic load of the call counter and a compare: 256 Ki
// polls took 75–150 µs on the 2-core VM measured (0.3–0.6 ns a poll;
// 2.6–3.9 ms under -race). 64 Ki (18–36 µs) missed the next call of a
// stream of 64-event batches in 43–50% of calls, 256 Ki in 3–6%.
// adaptLinger shortens it when calls come too seldom for it.
const lingerPolls = 256 * 1024

// joinCall is g's share of the current call, if it is still open: busy
// tells the caller to wait for g before it returns (set before stop is
// read, so either g sees stop or the caller sees busy).
func (p *Pool) joinCall(g *applyGoroutine) {
	par := p.par
	g.busy.Store(true)
	if !par.stop.Load() {
		if par.hold != nil {
			par.hold(holdHelper)
		}
		owned := 0 // the chunks below it have their owner counts claimed
		p.until(g, par.stop.Load, func() bool {
			if p.runTask(g) {
				return true
			}
			var took bool
			owned, took = p.takeOwners(g, owned, int(par.ready.Load()))
			return took
		})
	}
	g.busy.Store(false)
	par.wakeAll()
}

// noWork is until's work for a wait with nothing to take.
func noWork() bool { return false }

// takeOwners runs one stage-2 task of the ready chunks from..to-1, the
// first that is free and whose shard is done in the chunk before; it
// returns the chunk below which every task is claimed (by g or another
// goroutine), and whether g took one.
func (p *Pool) takeOwners(g *applyGoroutine, from, to int) (int, bool) {
	chunks := p.par.chunks
	for k := from; k < to; k++ {
		ch, claimed := chunks[k], true
		for s := range ch.owners {
			t := &ch.owners[s]
			if t.state.Load() != ownersFree {
				continue
			}
			if k > 0 && chunks[k-1].owners[s].state.Load() != ownersDone {
				claimed = false
				continue
			}
			if t.state.CompareAndSwap(ownersFree, ownersClaimed) {
				p.stageOwners(g, ch, s)
				return from, true
			}
		}
		if claimed && k == from {
			from++
		}
	}
	return from, false
}

// ownersDone reports whether every stage-2 task of ch is done.
func (ch *chunk) ownersDone() bool {
	for s := range ch.owners {
		if ch.owners[s].state.Load() != ownersDone {
			return false
		}
	}
	return true
}

// holdPoint is where a test's parallel.hold is called.
type holdPoint uint8

const (
	holdHelper    holdPoint = iota + 1 // a helper, before it takes anything
	holdPublished                      // the caller, after it published a job
	holdReady                          // the caller, after a chunk is ready
	holdIdle                           // a helper, after it left a call
	holdLeave                          // a helper that will return unless a call came
	holdGone                           // a helper, as it returns
)

// parkAfterPolls is how many times a waiting goroutine with no task to take
// polls before it blocks: a wait is usually shorter than a task (a few
// microseconds), and a futex wake-up costs about as much; a longer one
// (its partner lost its thread to another process) must not hold a core.
const parkAfterPolls = 2000

// until does work until cond holds, polling, then blocking when there is
// nothing to do. work (nil: take a stage-1 task) reports whether it did
// something. Every change a waiter may wait for (a job published, a job's
// last task done, a chunk ready, a chunk's owner counts done, the end)
// calls wakeAll, and a goroutine re-checks for work after it marks itself
// parked, so none sleeps through one.
func (p *Pool) until(g *applyGoroutine, cond func() bool, work func() bool) {
	if work == nil {
		work = func() bool { return p.runTask(g) }
	}
	for polls := 0; !cond(); {
		if work() {
			polls = 0
			continue
		}
		if polls++; polls < parkAfterPolls {
			continue
		}
		polls = 0
		g.parked.Store(true)
		if cond() || work() {
			if g.parked.CompareAndSwap(true, false) {
				polls = 0
				continue
			}
		}
		<-g.wake // a waker cleared parked: its token is sent or on the way
	}
}

// wakeAll unblocks every parked goroutine of the call.
func (par *parallel) wakeAll() {
	for i := range par.gor {
		if g := &par.gor[i]; g.parked.Load() && g.parked.CompareAndSwap(true, false) {
			g.wake <- struct{}{}
		}
	}
}

// runTask runs one unclaimed task of the current job, if there is one.
func (p *Pool) runTask(g *applyGoroutine) bool {
	jb := p.par.cur.Load()
	if jb == nil || jb.next.Load() >= jb.n {
		return false
	}
	i := jb.next.Add(1) - 1
	if i >= jb.n {
		return false
	}
	p.stageMember(g, jb.ch, &jb.ch.groups[i])
	jb.ch.groups[i].ranBy = g.id
	if jb.done.Add(1) == jb.n {
		p.par.wakeAll()
	}
	return true
}

// prologue fills ch with evs: admission, and one group per member in
// order of first appearance.
func (p *Pool) prologue(ch *chunk, evs []RouterEvent) {
	par := p.par
	clear(par.groupOf)
	ch.groups = ch.groups[:0]
	ch.recs = ch.recs[:0]
	for i := range evs {
		ev := &evs[i]
		admit, err := admission(ev)
		m := ev.Member()
		gi, ok := par.groupOf[m]
		if !ok {
			gi = int32(len(ch.groups))
			par.groupOf[m] = gi
			sh := p.memberShard(m)
			ms := p.members[sh][m]
			if len(ch.groups) < cap(ch.groups) {
				ch.groups = ch.groups[:gi+1]
			} else {
				ch.groups = append(ch.groups, memberGroup{})
			}
			grp := &ch.groups[gi]
			grp.m, grp.shard, grp.before, grp.ms = m, sh, ms, ms
			grp.recs, grp.ops = grp.recs[:0], grp.ops[:0]
		}
		grp := &ch.groups[gi]
		ch.recs = append(ch.recs, eventRec{ev: ev, admit: admit, err: err, group: gi, slot: int32(len(grp.recs))})
		grp.recs = append(grp.recs, int32(i))
	}
}

// epilogue merges stage 1's results into the pool: the member shards and
// the counters.
func (p *Pool) epilogue(ch *chunk) {
	for i := range ch.groups {
		g := &ch.groups[i]
		p.unknownRemovals += g.unknownRemovals
		p.parentNotFound += g.parentNotFound
		p.contributions = uint64(int64(p.contributions) + g.contributions)
		g.unknownRemovals, g.parentNotFound, g.contributions = 0, 0, 0
		if g.ms != g.before {
			if g.ms == nil {
				delete(p.members[g.shard], g.m)
			} else {
				p.members[g.shard][g.m] = g.ms
			}
		}
		g.before, g.ms = nil, nil
	}
}

// stageMember is stage 1 for one member: its events of the chunk, in
// order, validated and applied to its lineage; their ownership changes are
// queued for stages 2 and 3.
func (p *Pool) stageMember(g *applyGoroutine, ch *chunk, grp *memberGroup) {
	ms := grp.ms
	grp.outs = grp.outs[:0]
	for _, ri := range grp.recs {
		r := &ch.recs[ri]
		out := stageOut{opStart: int32(len(grp.ops))}
		if r.admit {
			switch r.ev.Kind {
			case EventStored:
				ms, out.err = p.memberStored(g, grp, ms, r.ev)
			case EventRemoved:
				ms, out.unknown = p.memberRemoved(g, grp, ms, r.ev)
			case EventCleared:
				ms = p.memberCleared(g, grp, ms)
			}
		}
		out.opEnd = int32(len(grp.ops))
		if ms != nil {
			out.memberBlocks = ms.lineage.len()
		}
		grp.outs = append(grp.outs, out)
	}
	grp.ms = ms
}

// memberStored is applyStored's lineage part; it returns the member's state
// after the event. No bound can refuse the event (parallelWorthIt), so only
// validation can.
func (p *Pool) memberStored(g *applyGoroutine, grp *memberGroup, ms *memberState, ev *RouterEvent) (*memberState, error) {
	if ms != nil { // as applyStored: the lineage lines first
		t := ms.lineage.touch(ev.ParentHash)
		for i := range ev.Blocks {
			t ^= ms.lineage.touch(ev.Blocks[i].BlockHash)
		}
		g.warmed ^= t
	}
	sc := &g.sc
	if err := canonicalize(ev, ms, sc); err != nil {
		if errors.Is(err, ErrParentBlockNotFound) {
			grp.parentNotFound++
		}
		return ms, err
	}
	if len(ev.Blocks) == 0 {
		return ms, nil
	}
	if ms == nil {
		ms = &memberState{lineage: newU64Map(len(ev.Blocks))}
	}
	for i, b := range ev.Blocks {
		c := sc.canon[i]
		kind := opHeld
		if !sc.owned[i] {
			ms.lineage.put(b.BlockHash, c)
			grp.contributions++
			kind = opOwn
		}
		grp.ops = append(grp.ops, ownOp{c: c, kind: kind, shard: uint8(p.blockShard(c))})
	}
	return ms, nil
}

// memberRemoved is applyRemoved's lineage part; it returns the member's
// state after the event and the unknown removals.
func (p *Pool) memberRemoved(g *applyGoroutine, grp *memberGroup, ms *memberState, ev *RouterEvent) (_ *memberState, unknown int) {
	if ms == nil {
		grp.unknownRemovals += uint64(len(ev.BlockHashes))
		return nil, len(ev.BlockHashes)
	}
	var t uint64
	for _, h := range ev.BlockHashes {
		t ^= ms.lineage.touch(h)
	}
	g.warmed ^= t
	for _, h := range ev.BlockHashes {
		c, ok := ms.lineage.del(h)
		if !ok {
			unknown++
			grp.unknownRemovals++
			continue
		}
		grp.contributions--
		grp.ops = append(grp.ops, ownOp{c: c, kind: opRelease, shard: uint8(p.blockShard(c))})
	}
	if ms.lineage.len() == 0 {
		return nil, unknown
	}
	return ms, unknown
}

// memberCleared is clearMember's lineage part: releases in external-hash
// order.
func (p *Pool) memberCleared(g *applyGoroutine, grp *memberGroup, ms *memberState) *memberState {
	if ms == nil {
		return nil
	}
	keys := sortedKeys(ms, &g.sc)
	for _, h := range keys {
		c, _ := ms.lineage.get(h)
		grp.ops = append(grp.ops, ownOp{c: c, kind: opRelease, shard: uint8(p.blockShard(c))})
	}
	grp.contributions -= int64(len(keys))
	return nil
}

// stageOwners is stage 2 of ch for block shard s, in admission order:
// every ownership change of the shard's blocks applied to its owner count;
// the changes that take a block's first or last owner are marked in the
// task's edges for stage 3. The task must be claimed and the shard's task
// of the previous chunk done.
func (p *Pool) stageOwners(g *applyGoroutine, ch *chunk, s int) {
	task := &ch.owners[s]
	task.by = g.id
	n := 0
	for i := range ch.groups {
		n += len(ch.groups[i].ops)
	}
	words := (n + 63) / 64
	if cap(task.edges) < words {
		task.edges = make([]uint64, (words+7)/8*8)
	}
	edges := task.edges[:words]
	clear(edges)
	bs := &p.blocks[s]
	sh := uint8(s)
	at := 0 // the chunk's ownership changes before this event's
	for i := range ch.recs {
		r := &ch.recs[i]
		grp := &ch.groups[r.group]
		out := &grp.outs[r.slot]
		ops := grp.ops[out.opStart:out.opEnd]
		var t uint64
		for _, o := range ops {
			if o.shard == sh && o.kind != opHeld {
				t ^= bs.touch(o.c)
			}
		}
		g.warmed ^= t
		for j, o := range ops {
			if o.shard != sh || o.kind == opHeld {
				continue
			}
			n, _ := bs.get(o.c)
			edge := false
			if o.kind == opOwn {
				bs.put(o.c, n+1)
				edge = n == 0
			} else if n--; n > 0 {
				bs.put(o.c, n)
			} else {
				bs.del(o.c)
				edge = true
			}
			if edge {
				edges[(at+j)/64] |= 1 << ((at + j) % 64)
			}
		}
		at += len(ops)
	}
	task.state.Store(ownersDone)
	p.par.wakeAll()
}

// stageTable is stage 3, in admission order on the caller's goroutine:
// each event's table changes (applyStored's and release's), its cadence
// count and drain, and its outcome.
func (p *Pool) stageTable(ch *chunk, dst []ApplyOutcome) []ApplyOutcome {
	at := 0 // the chunk's ownership changes before this event's
	for i := range ch.recs {
		r := &ch.recs[i]
		grp := &ch.groups[r.group]
		so := &grp.outs[r.slot]
		out := ApplyOutcome{FirstError: cmp.Or(r.err, so.err), UnknownRemovals: so.unknown, MemberBlocks: so.memberBlocks}
		ops := grp.ops[so.opStart:so.opEnd]
		base := at
		edge := func(j int) bool {
			k := base + j
			return ch.owners[ops[j].shard].edges[k/64]&(1<<(k%64)) != 0
		}
		at += len(ops)
		if !r.admit {
			dst = append(dst, out)
			continue
		}
		p.pendingEvents++
		m := r.ev.Member()
		var t uint64
		for j, o := range ops {
			if o.kind != opHeld && edge(j) {
				t ^= p.touchBucket(o.c)
			}
		}
		p.warmed ^= t
		for j, o := range ops {
			switch {
			case o.kind == opOwn && edge(j):
				out.FirstError = cmp.Or(out.FirstError, p.place(m, o.c))
			case o.kind == opRelease:
				if edge(j) {
					if err := p.unplace(m, o.c); err != nil && out.FirstError == nil {
						out.FirstError = err
					}
				}
			default:
				out.FirstError = cmp.Or(out.FirstError, p.reofferOmitted(m, o.c))
			}
		}
		if p.pendingEvents >= p.cfg.PublishEveryNEvents {
			out.PublicationBoundary = true
			out.Batch = p.drain()
		}
		dst = append(dst, out)
	}
	return dst
}
