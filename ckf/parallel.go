package ckf

import (
	"cmp"
	"errors"
	"math"
	"sync"
)

// ApplyEvents applies evs in order and appends one outcome per event to dst:
// the pool and every outcome are exactly those of [Pool.ApplyEvent] called on
// each event in turn — the same words, batches, refcounts, statistics and
// errors (SPEC §4.3: the parallel apply is an implementation of the
// sequential semantics, not a relaxation of it).
//
// With [Config.ApplyWorkers] ≥ 2 a large enough batch is spread over that
// many goroutines in three stages (docs/RATIONALE.md "Why a three-stage
// parallel apply?"):
//
//  1. per member, sharded by member: validation, canonicalisation and
//     lineage, which yield each event's ownership changes in order;
//  2. per canonical block, sharded by canonical hash: the refcounts, which
//     decide which change takes a block's first owner or its last;
//  3. on the caller's goroutine, in admission order: the cuckoo table's
//     insertions, re-offers and removals, the dirty window and the drains.
//
// Stage 1 decides alone only when no bound can refuse an event of the batch
// (MaxMembers, MaxTrackedBlocks, the owner-count ceiling): a batch that
// could reach one, or a small one, is applied event by event instead.
func (p *Pool) ApplyEvents(dst []ApplyOutcome, evs []RouterEvent) []ApplyOutcome {
	if len(p.members) == 1 || !p.parallelWorthIt(evs) {
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

// parallel is ApplyEvents' reusable state: two chunks (one in stage 3
// while the next goes through stages 1 and 2), one scratch per worker.
type parallel struct {
	chunks      [2]*chunk
	scratch     []applyScratch
	ready, free chan *chunk
}

// chunk is a run of consecutive events of one batch on its way through the
// stages: one record per event, one op arena per worker.
type chunk struct {
	recs    []eventRec
	workers []applyWorker
}

// eventRec is one event of a parallel batch as the stages pass it on.
type eventRec struct {
	ev     *RouterEvent
	admit  bool  // counts toward the cadence and applies (admission)
	err    error // admission's refusal, or stage 1's validation error
	mshard int
	// Stage 1: the ownership changes, workers[arena].ops[opStart:opEnd].
	arena          int
	opStart, opEnd int
	unknown        int
	memberBlocks   int
}

// applyWorker is one worker's ops and stage-1 counters in one chunk; the
// counters are merged into the pool after stage 1.
type applyWorker struct {
	ops             []ownOp
	unknownRemovals uint64
	parentNotFound  uint64
	contributions   int64
	warmed          uint64   // as Pool.warmed
	_               [64]byte // keep workers' counters on separate cache lines
}

// ownOp is one ownership change of one canonical block.
type ownOp struct {
	c      uint64
	kind   uint8 // opOwn, opHeld or opRelease
	bshard uint8
	// Stage 2's verdict: the change took the block's first owner (opOwn)
	// or its last (opRelease).
	edge bool
}

const (
	opOwn     uint8 = iota + 1 // a new lineage entry: one more owner
	opHeld                     // a stored block the member already holds
	opRelease                  // a lineage entry removed: one owner less
)

// chunkBlocks is the size (in blocks) a batch is cut into: stage 3 of one
// chunk runs while the workers take the next through stages 1 and 2.
const chunkBlocks = 256

func (p *Pool) applyParallel(dst []ApplyOutcome, evs []RouterEvent) []ApplyOutcome {
	n := len(p.members)
	if p.par == nil {
		par := &parallel{scratch: make([]applyScratch, n), ready: make(chan *chunk, 1), free: make(chan *chunk, 2)}
		for i := range par.chunks {
			par.chunks[i] = &chunk{workers: make([]applyWorker, n)}
		}
		p.par = par
	}
	par := p.par
	var cuts []int // chunk ends
	blocks := 0
	for i := range evs {
		if blocks += evs[i].BlockCount(); blocks >= p.chunkBlocks && i+1 < len(evs) {
			cuts, blocks = append(cuts, i+1), 0
		}
	}
	cuts = append(cuts, len(evs))
	if len(cuts) == 1 {
		ch := par.chunks[0]
		p.stagesOneTwo(ch, evs)
		dst = p.stageTable(ch, dst)
		ch.reset()
		return dst
	}
	// Stages 1 and 2 of chunk j+1 overlap stage 3 of chunk j: they share
	// nothing (stage 3 reads only the chunk's ops, the omitted set and the
	// table, which stages 1 and 2 never touch).
	for _, ch := range par.chunks {
		par.free <- ch
	}
	go func() {
		lo := 0
		for _, hi := range cuts {
			ch := <-par.free
			p.stagesOneTwo(ch, evs[lo:hi])
			par.ready <- ch
			lo = hi
		}
	}()
	for range cuts {
		ch := <-par.ready
		dst = p.stageTable(ch, dst)
		ch.reset()
		par.free <- ch
	}
	for range par.chunks { // both are back: leave the channel empty
		<-par.free
	}
	return dst
}

// stagesOneTwo takes evs through stages 1 and 2 in ch.
func (p *Pool) stagesOneTwo(ch *chunk, evs []RouterEvent) {
	for i := range evs {
		ev := &evs[i]
		admit, err := admission(ev)
		ch.recs = append(ch.recs, eventRec{ev: ev, admit: admit, err: err, mshard: p.memberShard(ev.Member())})
	}
	p.runWorkers(func(k int) { p.stageMembers(ch, k) })
	for k := range ch.workers {
		w := &ch.workers[k]
		p.unknownRemovals += w.unknownRemovals
		p.parentNotFound += w.parentNotFound
		p.contributions = uint64(int64(p.contributions) + w.contributions)
		w.unknownRemovals, w.parentNotFound, w.contributions = 0, 0, 0
	}
	p.runWorkers(func(k int) { p.stageOwners(ch, k) })
}

// reset empties ch for its next use, dropping its references to the
// caller's events.
func (ch *chunk) reset() {
	for k := range ch.workers {
		ch.workers[k].ops = ch.workers[k].ops[:0]
	}
	clear(ch.recs)
	ch.recs = ch.recs[:0]
}

// runWorkers runs stage(k) for every shard k, shard 0 on the caller's
// goroutine, and returns when all have.
func (p *Pool) runWorkers(stage func(k int)) {
	var wg sync.WaitGroup
	for k := 1; k < len(p.members); k++ {
		wg.Go(func() { stage(k) })
	}
	stage(0)
	wg.Wait()
}

// stageMembers is stage 1 for member shard k: every event of a member of
// the shard, in order, validated and applied to the lineage; its ownership
// changes are queued for stages 2 and 3.
func (p *Pool) stageMembers(ch *chunk, k int) {
	w := &ch.workers[k]
	sc := &p.par.scratch[k]
	shard := p.members[k]
	for i := range ch.recs {
		r := &ch.recs[i]
		if r.mshard != k {
			continue
		}
		m := r.ev.Member()
		r.arena, r.opStart = k, len(w.ops)
		if r.admit {
			switch r.ev.Kind {
			case EventStored:
				r.err = p.memberStored(w, sc, shard, r.ev)
			case EventRemoved:
				r.unknown = p.memberRemoved(w, shard, r.ev)
			case EventCleared:
				p.memberCleared(w, sc, shard, m)
			}
		}
		r.opEnd = len(w.ops)
		if ms := shard[m]; ms != nil {
			r.memberBlocks = ms.lineage.len()
		}
	}
}

// memberStored is applyStored's lineage part. No bound can refuse the event
// (parallelWorthIt), so only validation can.
func (p *Pool) memberStored(w *applyWorker, sc *applyScratch, shard map[Member]*memberState, ev *RouterEvent) error {
	m := ev.Member()
	ms := shard[m]
	if ms != nil { // as applyStored: the lineage lines first
		t := ms.lineage.touch(ev.ParentHash)
		for i := range ev.Blocks {
			t ^= ms.lineage.touch(ev.Blocks[i].BlockHash)
		}
		w.warmed ^= t
	}
	if err := canonicalize(ev, ms, sc); err != nil {
		if errors.Is(err, ErrParentBlockNotFound) {
			w.parentNotFound++
		}
		return err
	}
	if len(ev.Blocks) == 0 {
		return nil
	}
	if ms == nil {
		ms = &memberState{lineage: newU64Map(len(ev.Blocks))}
		shard[m] = ms
	}
	for i, b := range ev.Blocks {
		c := sc.canon[i]
		kind := opHeld
		if !sc.owned[i] {
			ms.lineage.put(b.BlockHash, c)
			w.contributions++
			kind = opOwn
		}
		w.ops = append(w.ops, ownOp{c: c, kind: kind, bshard: uint8(p.blockShard(c))})
	}
	return nil
}

// memberRemoved is applyRemoved's lineage part; it returns the unknown
// removals.
func (p *Pool) memberRemoved(w *applyWorker, shard map[Member]*memberState, ev *RouterEvent) (unknown int) {
	m := ev.Member()
	ms := shard[m]
	if ms != nil {
		var t uint64
		for _, h := range ev.BlockHashes {
			t ^= ms.lineage.touch(h)
		}
		w.warmed ^= t
	}
	for _, h := range ev.BlockHashes {
		var c uint64
		var ok bool
		if ms != nil {
			c, ok = ms.lineage.del(h)
		}
		if !ok {
			unknown++
			w.unknownRemovals++
			continue
		}
		w.contributions--
		w.ops = append(w.ops, ownOp{c: c, kind: opRelease, bshard: uint8(p.blockShard(c))})
	}
	if ms != nil && ms.lineage.len() == 0 {
		delete(shard, m)
	}
	return unknown
}

// memberCleared is clearMember's lineage part: releases in external-hash
// order.
func (p *Pool) memberCleared(w *applyWorker, sc *applyScratch, shard map[Member]*memberState, m Member) {
	ms := shard[m]
	if ms == nil {
		return
	}
	keys := sortedKeys(ms, sc)
	for _, h := range keys {
		c, _ := ms.lineage.get(h)
		w.ops = append(w.ops, ownOp{c: c, kind: opRelease, bshard: uint8(p.blockShard(c))})
	}
	w.contributions -= int64(len(keys))
	delete(shard, m)
}

// stageOwners is stage 2 for block shard k: every ownership change of a
// block of the shard, in admission order, applied to its refcount; the
// changes that take a block's first or last owner are marked for stage 3.
func (p *Pool) stageOwners(ch *chunk, k int) {
	bs := &p.blocks[k]
	var t uint64
	for i := range ch.recs {
		r := &ch.recs[i]
		ops := ch.workers[r.arena].ops[r.opStart:r.opEnd]
		for j := range ops {
			if int(ops[j].bshard) == k && ops[j].kind != opHeld {
				t ^= bs.touch(ops[j].c)
			}
		}
		for j := range ops {
			o := &ops[j]
			if int(o.bshard) != k {
				continue
			}
			switch o.kind {
			case opOwn:
				n, _ := bs.get(o.c)
				bs.put(o.c, n+1)
				o.edge = n == 0
			case opRelease:
				n, _ := bs.get(o.c)
				if n--; n > 0 {
					bs.put(o.c, n)
				} else {
					bs.del(o.c)
					o.edge = true
				}
			}
		}
	}
	ch.workers[k].warmed ^= t
}

// stageTable is stage 3, in admission order on the caller's goroutine:
// each event's table changes (applyStored's and release's), its cadence
// count and drain, and its outcome.
func (p *Pool) stageTable(ch *chunk, dst []ApplyOutcome) []ApplyOutcome {
	for i := range ch.recs {
		r := &ch.recs[i]
		out := ApplyOutcome{FirstError: r.err, UnknownRemovals: r.unknown, MemberBlocks: r.memberBlocks}
		if !r.admit {
			dst = append(dst, out)
			continue
		}
		p.pendingEvents++
		m := r.ev.Member()
		ops := ch.workers[r.arena].ops[r.opStart:r.opEnd]
		var t uint64
		for _, o := range ops {
			if o.edge {
				t ^= p.touchBucket(o.c)
			}
		}
		p.warmed ^= t
		for _, o := range ops {
			switch {
			case o.kind == opOwn && o.edge:
				out.FirstError = cmp.Or(out.FirstError, p.place(m, o.c))
			case o.kind == opRelease:
				if o.edge {
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
