package ckf

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"
	"slices"
	"unsafe"
)

// Batch is one publication: absolute images of the buckets whose words
// changed since the previous drain. A batch is never empty, its bucket indices
// are unique and < bucket count, a final removal is an explicit zero image,
// and it never splits one event, one clear or one relocation chain. The
// receiver owns Images.
type Batch struct {
	Images []BucketImage
}

// memberState is one member's lineage: external block hash → canonical hash.
type memberState struct {
	lineage u64Map
}

// ApplyOutcome reports what one event did.
type ApplyOutcome struct {
	// FirstError is the event's first error (nil on success). A capacity
	// omission reports ErrCapacityExhausted while the rest of the event applies.
	FirstError error
	// Batch is the publication drained at this event, or nil.
	Batch *Batch
	// UnknownRemovals counts removals of hashes the member did not hold.
	UnknownRemovals int
	// MemberBlocks is the number of blocks the event's member holds after
	// the event ([Pool.MemberBlocks] then); 0 for a nil event.
	MemberBlocks int
	// PublicationBoundary is true when this event reached the cadence and the
	// window was drained (Batch may still be nil if nothing net-changed).
	PublicationBoundary bool
}

// Pool is the exact producer state of one pool (SPEC §4): per-member lineage,
// refcounted ownership of canonical blocks with residency, the cuckoo table
// they project into, and the dirty window drained into publication batches.
//
// A Pool is owned by one goroutine. [Pool.ApplyEvents] may use
// [Config.ApplyWorkers] goroutines inside one call; when it returns they
// touch nothing of the pool, and they return after polling briefly for the
// next call. The zero value is not usable; see [NewPool].
type Pool struct {
	// The fields a helper of ApplyEvents reads come first, apart from
	// those the caller's stage 3 writes for every event (the table, the
	// window, the counters): on one cache line, each write would send the
	// helper's next read to the caller's core (parallel.go).

	// members and blocks are sharded, members by member and blocks by
	// canonical hash, one shard of each per apply worker (one when the pool
	// applies sequentially): smaller tables, each doubling on its own.
	// ApplyEvents' stages do not rely on the split (parallel.go: stage 1
	// works per member, stage 2 per block shard). shardKey keys the shard
	// choice.
	members  []map[Member]*memberState
	blocks   []ownerShard // canonical → owners (lineage entries mapping to it), never 0
	shardKey uint64
	par      *parallel // ApplyEvents' workers, made on first parallel use
	cfg      Config
	format   Format
	// parallelMin and chunkBlocks are the constants of the same names;
	// tests lower them to send small batches through the workers, in
	// several chunks.
	parallelMin uint64
	chunkBlocks int
	_           cacheLinePad

	t     table
	dirty dirtyWindow
	// nonResident holds the tracked blocks whose fingerprint is not in the
	// filter (capacity omissions, SPEC §4.3): empty unless the table ran
	// out of room, so residency costs no lookup on the common path.
	nonResident map[uint64]struct{}

	pendingEvents uint64
	resident      uint64 // resident canonical blocks == occupied slots
	contributions uint64 // lineage entries over all members

	unknownRemovals  uint64
	parentNotFound   uint64
	capacityFailures uint64

	memberLimitRejections       uint64
	trackedBlockLimitRejections uint64

	scratch applyScratch
	// warmed takes the words the apply loads ahead of its lookups (see
	// u64Map.touch), so the compiler keeps the loads; nothing reads it.
	warmed uint64
}

// cacheLinePad keeps the fields before it and after it on different cache
// lines (64 bytes on the CPUs the relay runs on).
type cacheLinePad struct{ _ [64]byte }

// ownerShard is one shard of the owner counts, its header alone on a
// cache line: two shards' stage-2 tasks run on two goroutines at once, and
// each writes its own header (the array's allocation size is a multiple of
// 64, which Go's allocator aligns to 64).
type ownerShard struct {
	u64Map
	_ [64 - unsafe.Sizeof(u64Map{})%64]byte
}

// applyScratch is one goroutine's reusable buffers for canonicalisation and
// clears.
type applyScratch struct {
	canon []uint64
	owned []bool // owned[i]: the member already holds block i (Stored)
	fresh uint64 // blocks of the event the member does not hold yet
	seen  map[uint64]struct{}
	keys  []uint64
}

// NewPool returns an empty pool for a validated configuration.
func NewPool(cfg Config) (*Pool, error) {
	f, err := cfg.Format()
	if err != nil {
		return nil, err
	}
	return newEmptyPool(cfg, f, rand.Uint64()), nil
}

// newEmptyPool returns an empty pool with shards keyed by shardKey.
func newEmptyPool(cfg Config, f Format, shardKey uint64) *Pool {
	n := max(cfg.ApplyWorkers, 1)
	p := &Pool{
		cfg:         cfg,
		format:      f,
		t:           newTable(f.BucketCount, f.Seed, cfg.MaxKicks),
		dirty:       newDirtyWindow(f.BucketCount),
		members:     make([]map[Member]*memberState, n),
		blocks:      make([]ownerShard, n),
		shardKey:    shardKey,
		nonResident: make(map[uint64]struct{}),
		parallelMin: parallelMinBlocks,
		chunkBlocks: chunkBlocks,
	}
	for i := range n {
		p.members[i] = make(map[Member]*memberState)
		p.blocks[i] = ownerShard{u64Map: newU64Map(0)}
	}
	return p
}

// shardOf maps h to one of n shards: a keyed SplitMix64 finalizer, then
// Lemire's multiply-shift. The key is random per pool, so a peer choosing
// hashes cannot pile its work onto one worker; shard choice changes no
// result, only which goroutine does the work.
func shardOf(h, key uint64, n int) int {
	if n == 1 {
		return 0
	}
	hi, _ := bits.Mul64(mix64(h, key), uint64(n))
	return int(hi)
}

func (p *Pool) memberShard(m Member) int {
	return shardOf(m.WorkerID^uint64(m.DPRank)*splitMixGamma, p.shardKey, len(p.members))
}

func (p *Pool) blockShard(c uint64) int { return shardOf(c, p.shardKey, len(p.blocks)) }

// member returns m's state, nil when m holds nothing.
func (p *Pool) member(m Member) *memberState { return p.members[p.memberShard(m)][m] }

// allMembers iterates every member holding blocks, shard by shard.
func (p *Pool) allMembers(yield func(Member, *memberState) bool) {
	for _, s := range p.members {
		for m, ms := range s {
			if !yield(m, ms) {
				return
			}
		}
	}
}

// memberCount returns the number of members holding blocks.
func (p *Pool) memberCount() int {
	n := 0
	for _, s := range p.members {
		n += len(s)
	}
	return n
}

// blockCount returns the number of tracked canonical blocks.
func (p *Pool) blockCount() int {
	n := 0
	for i := range p.blocks {
		n += p.blocks[i].len()
	}
	return n
}

// isResident reports whether a tracked block's fingerprint is in the filter.
func (p *Pool) isResident(c uint64) bool {
	if len(p.nonResident) == 0 {
		return true
	}
	_, omitted := p.nonResident[c]
	return !omitted
}

// Format returns the pool's format identity.
func (p *Pool) Format() Format { return p.format }

// Config returns the pool's configuration.
func (p *Pool) Config() Config { return p.cfg }

// Words returns a copy of the current bucket words.
func (p *Pool) Words() []uint64 { return slices.Clone(p.t.words) }

// Contains reports whether the filter answers present for a canonical hash.
func (p *Pool) Contains(canonical uint64) bool { return p.t.contains(canonical) }

// Owners returns the owner count and residency of a canonical hash.
func (p *Pool) Owners(canonical uint64) (owners uint32, resident bool) {
	n, _ := p.blocks[p.blockShard(canonical)].get(canonical)
	owners = uint32(n)
	return owners, owners > 0 && p.isResident(canonical)
}

// MemberBlocks returns the number of blocks member m holds (its lineage
// entries); 0 for a member the pool does not know.
func (p *Pool) MemberBlocks(m Member) int {
	if ms := p.member(m); ms != nil {
		return ms.lineage.len()
	}
	return 0
}

// HasPendingPublication reports whether the dirty window holds touched
// buckets (even ones that may net-revert); pending events that touched no
// bucket do not count (SPEC §4.5).
func (p *Pool) HasPendingPublication() bool { return !p.dirty.empty() }

// PendingEventCount returns the events admitted since the last drain.
func (p *Pool) PendingEventCount() uint64 { return p.pendingEvents }

// ApplyEvent applies one event (SPEC §4.3) and, at a publication boundary,
// drains the window. Non-device Stored and Removed events are ignored without
// counting toward the cadence; Cleared from any tier clears the member's
// device state. A Stored event is validated whole before anything commits.
// A nil event, an unknown kind or an unknown tier is rejected with
// [ErrMalformedEvent] or [ErrUnsupportedResidencyDomain] and is not admitted
// (no cadence count, no change).
func (p *Pool) ApplyEvent(ev *RouterEvent) ApplyOutcome {
	var out ApplyOutcome
	admit, err := admission(ev)
	if !admit {
		out.FirstError = err
		if ev != nil {
			out.MemberBlocks = p.MemberBlocks(ev.Member())
		}
		return out
	}
	p.pendingEvents++
	switch ev.Kind {
	case EventStored:
		out.MemberBlocks, out.FirstError = p.applyStored(ev)
	case EventRemoved:
		out.MemberBlocks, out.UnknownRemovals, out.FirstError = p.applyRemoved(ev)
	case EventCleared:
		out.FirstError = p.clearMember(ev.Member())
	}
	if p.pendingEvents >= p.cfg.PublishEveryNEvents {
		out.PublicationBoundary = true
		out.Batch = p.drain()
	}
	return out
}

// admission decides whether ev is admitted (counts toward the cadence and
// applies): a nil event, an unknown tier or kind is refused with its error;
// a non-device Stored or Removed event is ignored (false, nil).
func admission(ev *RouterEvent) (bool, error) {
	// A nil event is bad input, not a programmer error the pool may panic on:
	// the relay feeds decoded network events straight through.
	if ev == nil {
		return false, &EventError{Kind: ErrMalformedEvent, Detail: "nil event"}
	}
	if ev.StorageTier > TierExternal {
		return false, &EventError{Kind: ErrUnsupportedResidencyDomain, Member: ev.Member(), Detail: "unknown storage tier"}
	}
	switch ev.Kind {
	case EventStored, EventRemoved:
		return ev.StorageTier == TierDevice, nil
	case EventCleared:
		return true, nil
	}
	return false, &EventError{Kind: ErrMalformedEvent, Member: ev.Member(), Detail: "unknown event kind"}
}

// canonicalize validates a Stored event of the member whose state is ms and
// fills sc.canon with the canonical hash of each block, sc.owned with whether
// the member already holds it and sc.fresh with how many it does not (the
// one lineage lookup per block admission and commit then share). It commits
// nothing.
func canonicalize(ev *RouterEvent, ms *memberState, sc *applyScratch) error {
	m := ev.Member()
	canon := sc.canon[:0]
	owned := sc.owned[:0]
	sc.fresh = 0
	var prev uint64
	if ev.HasParent {
		var ok bool
		if ms != nil {
			prev, ok = ms.lineage.get(ev.ParentHash)
		}
		if !ok {
			return &EventError{Kind: ErrParentBlockNotFound, Member: m, BlockHash: ev.ParentHash}
		}
	} else if ev.HasStartPosition && ev.StartPosition > 0 {
		// The header alone decides, whatever the block count (SPEC §4.3,
		// decision 2): an empty event is not a loophole for a header that
		// would be refused with blocks.
		var first uint64
		if len(ev.Blocks) > 0 {
			first = ev.Blocks[0].BlockHash
		}
		return &EventError{Kind: ErrInvalidBlockSequence, Member: m, BlockHash: first,
			Detail: "null parent with start_position > 0 cannot be canonicalized"}
	}
	useSet := len(ev.Blocks) > 16
	if useSet {
		if sc.seen == nil {
			sc.seen = make(map[uint64]struct{}, len(ev.Blocks))
		}
		clear(sc.seen)
	}
	for i, b := range ev.Blocks {
		var c uint64
		if i == 0 && !ev.HasParent {
			c = b.TokensHash
		} else {
			c = ChainHash(prev, b.TokensHash)
		}
		held := false
		if ms != nil {
			var old uint64
			if old, held = ms.lineage.get(b.BlockHash); held && old != c {
				return &EventError{Kind: ErrInvalidBlockSequence, Member: m, BlockHash: b.BlockHash,
					Detail: "external hash already maps to another canonical hash"}
			}
		}
		dup := false
		if useSet {
			_, dup = sc.seen[b.BlockHash]
			sc.seen[b.BlockHash] = struct{}{}
		} else {
			for _, e := range ev.Blocks[:i] {
				if e.BlockHash == b.BlockHash {
					dup = true
					break
				}
			}
		}
		if dup {
			return &EventError{Kind: ErrInvalidBlockSequence, Member: m, BlockHash: b.BlockHash,
				Detail: "duplicate external hash within one event"}
		}
		canon = append(canon, c)
		owned = append(owned, held)
		if !held {
			sc.fresh++
		}
		prev = c
	}
	sc.canon, sc.owned = canon, owned
	return nil
}

// applyStored applies a device Stored event; it returns the member's blocks
// after it and the event's first error.
func (p *Pool) applyStored(ev *RouterEvent) (memberBlocks int, first error) {
	m := ev.Member()
	shard := p.members[p.memberShard(m)]
	ms := shard[m]
	if ms != nil {
		memberBlocks = ms.lineage.len()
	}
	sc := &p.scratch
	if ms != nil {
		t := ms.lineage.touch(ev.ParentHash)
		for i := range ev.Blocks {
			t ^= ms.lineage.touch(ev.Blocks[i].BlockHash)
		}
		p.warmed ^= t
	}
	if err := canonicalize(ev, ms, sc); err != nil {
		if errors.Is(err, ErrParentBlockNotFound) {
			p.parentNotFound++
		}
		return memberBlocks, err
	}
	if len(ev.Blocks) == 0 {
		return memberBlocks, nil
	}
	if err := p.admitLimits(ev, ms); err != nil {
		return memberBlocks, err
	}
	if ms == nil {
		ms = &memberState{lineage: newU64Map(len(ev.Blocks))}
		shard[m] = ms
	}
	var t uint64
	for i, c := range sc.canon {
		if !sc.owned[i] {
			t ^= p.touchBlock(c)
		}
	}
	p.warmed ^= t
	for i, b := range ev.Blocks {
		c := sc.canon[i]
		if !sc.owned[i] {
			bs := &p.blocks[p.blockShard(c)]
			owners, _ := bs.get(c)
			if owners == math.MaxUint32 {
				first = cmp.Or(first, error(&EventError{Kind: ErrOwnershipDegreeOverflow, Member: m, BlockHash: b.BlockHash}))
				continue
			}
			ms.lineage.put(b.BlockHash, c)
			p.contributions++
			bs.put(c, owners+1)
			if owners == 0 {
				first = cmp.Or(first, p.place(m, c))
				continue
			}
		}
		first = cmp.Or(first, p.reofferOmitted(m, c))
	}
	return ms.lineage.len(), first
}

// touchBlock loads the lines an ownership change of c reads: its owner
// slot, its primary bucket's word and that bucket's dirty stamp (see
// u64Map.touch).
func (p *Pool) touchBlock(c uint64) uint64 {
	return p.blocks[p.blockShard(c)].touch(c) ^ p.touchBucket(c)
}

// touchBucket loads c's primary bucket word and dirty stamp.
func (p *Pool) touchBucket(c uint64) uint64 {
	_, a := p.t.addr.primary(c)
	return p.t.words[a] ^ uint64(p.dirty.stamp[a])
}

// place makes a block that just got its first owner resident (a full
// insertion with bounded relocation); on failure it is tracked as
// non-resident and the capacity omission is returned.
func (p *Pool) place(m Member, c uint64) error {
	if err := p.t.insert(c); err != nil {
		p.capacityFailures++
		p.nonResident[c] = struct{}{}
		return &EventError{Kind: ErrCapacityExhausted, Member: m, BlockHash: c}
	}
	p.madeResident()
	return nil
}

// reofferOmitted re-offers a tracked block that is not resident (only an
// empty slot, SPEC §4.3): a store of a block the filter omitted. A resident
// block is left alone.
func (p *Pool) reofferOmitted(m Member, c uint64) error {
	if p.isResident(c) {
		return nil
	}
	if !p.t.reoffer(c) {
		p.capacityFailures++
		return &EventError{Kind: ErrCapacityExhausted, Member: m, BlockHash: c}
	}
	delete(p.nonResident, c)
	p.madeResident()
	return nil
}

// madeResident records the table's writes of a successful placement.
func (p *Pool) madeResident() {
	p.dirty.record(p.t.writes)
	p.resident++
}

// admitLimits refuses, before anything commits, a Stored event that would
// take the pool past MaxMembers or MaxTrackedBlocks (SPEC §4.6).
func (p *Pool) admitLimits(ev *RouterEvent, ms *memberState) error {
	if ms == nil && p.cfg.MaxMembers > 0 && p.memberCount() >= p.cfg.MaxMembers {
		p.memberLimitRejections++
		return &EventError{Kind: ErrMemberLimit, Member: ev.Member(),
			Detail: fmt.Sprintf("%d members hold blocks, max_members %d", p.memberCount(), p.cfg.MaxMembers)}
	}
	if p.cfg.MaxTrackedBlocks == 0 {
		return nil
	}
	added := p.scratch.fresh
	if p.contributions+added > p.cfg.MaxTrackedBlocks {
		p.trackedBlockLimitRejections++
		return &EventError{Kind: ErrTrackedBlockLimit, Member: ev.Member(),
			Detail: fmt.Sprintf("%d tracked + %d new blocks exceed max_tracked_blocks %d", p.contributions, added, p.cfg.MaxTrackedBlocks)}
	}
	return nil
}

// applyRemoved applies a device Removed event; it returns the member's
// blocks after it, the unknown removals and the first error.
func (p *Pool) applyRemoved(ev *RouterEvent) (memberBlocks, unknown int, first error) {
	m := ev.Member()
	shard := p.members[p.memberShard(m)]
	ms := shard[m]
	if ms == nil {
		unknown = len(ev.BlockHashes)
		p.unknownRemovals += uint64(unknown)
		return 0, unknown, nil
	}
	// Lineage first, then owners: releases touch neither the lineage nor
	// the counters above, so this order applies exactly what one pass
	// would, and each phase's lookups are independent of one another.
	var t uint64
	for _, h := range ev.BlockHashes {
		t ^= ms.lineage.touch(h)
	}
	canon := p.scratch.canon[:0]
	for _, h := range ev.BlockHashes {
		c, ok := ms.lineage.del(h)
		if !ok {
			unknown++
			p.unknownRemovals++
			continue
		}
		p.contributions--
		canon = append(canon, c)
		t ^= p.touchBlock(c)
	}
	p.warmed ^= t
	p.scratch.canon = canon
	for _, c := range canon {
		if err := p.release(m, c); err != nil && first == nil {
			first = err
		}
	}
	if memberBlocks = ms.lineage.len(); memberBlocks == 0 {
		delete(shard, m)
	}
	return memberBlocks, unknown, first
}

// release drops one ownership of canonical; the last owner's release removes a
// resident fingerprint.
func (p *Pool) release(m Member, canonical uint64) error {
	bs := &p.blocks[p.blockShard(canonical)]
	owners, _ := bs.get(canonical)
	if owners--; owners > 0 {
		bs.put(canonical, owners)
		return nil
	}
	bs.del(canonical)
	return p.unplace(m, canonical)
}

// unplace takes the fingerprint of a block whose last owner went out of the
// filter; a non-resident block only leaves the omitted set.
func (p *Pool) unplace(m Member, canonical uint64) error {
	if !p.isResident(canonical) {
		delete(p.nonResident, canonical)
		return nil
	}
	p.resident--
	if !p.t.remove(canonical) {
		return &EventError{Kind: ErrIndexerInvariantViolation, Member: m, BlockHash: canonical,
			Detail: "resident fingerprint missing from both buckets"}
	}
	p.dirty.record(p.t.writes)
	return nil
}

// clearMember removes all of m's lineage and ownership, in external-hash
// order so the physical result is deterministic.
func (p *Pool) clearMember(m Member) error {
	shard := p.members[p.memberShard(m)]
	ms := shard[m]
	if ms == nil {
		return nil
	}
	keys := sortedKeys(ms, &p.scratch)
	var first error
	for _, h := range keys {
		c, _ := ms.lineage.get(h)
		if err := p.release(m, c); err != nil && first == nil {
			first = err
		}
	}
	p.contributions -= uint64(len(keys))
	delete(shard, m)
	return first
}

// sortedKeys returns ms's external hashes in ascending order, in sc.keys.
func sortedKeys(ms *memberState, sc *applyScratch) []uint64 {
	keys := sc.keys[:0]
	for h := range ms.lineage.all {
		keys = append(keys, h)
	}
	slices.Sort(keys)
	sc.keys = keys
	return keys
}

func (p *Pool) drain() *Batch {
	p.pendingEvents = 0
	return p.dirty.drain(p.t.words)
}

// Flush drains the window regardless of cadence; nil when nothing net-changed.
func (p *Pool) Flush() *Batch { return p.drain() }

// BarrierSnapshot copies every bucket word first, then drains the pending
// tail. The copy equals the state after the tail: a consumer holding the
// previous stream plus tail, or the copy alone, holds the same words.
func (p *Pool) BarrierSnapshot() (tail *Batch, words []uint64) {
	words = slices.Clone(p.t.words)
	return p.drain(), words
}

// RemoveRank removes all of m's ownership, then drains unconditionally.
func (p *Pool) RemoveRank(m Member) (*Batch, error) {
	err := p.clearMember(m)
	return p.drain(), err
}
