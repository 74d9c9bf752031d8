package ckf

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
)

// Batch is one publication: absolute images of the buckets whose words
// changed since the previous drain. A batch is never empty, its bucket indices
// are unique and < bucket count, a final removal is an explicit zero image,
// and it never splits one event, one clear or one relocation chain. The
// receiver owns Images.
type Batch struct {
	Images []BucketImage
}

// blockState is the exact record of one canonical block.
type blockState struct {
	owners   uint32 // lineage entries, over all members, mapping to this block
	resident bool   // the block's fingerprint is in the filter
}

// memberState is one member's lineage: external block hash → canonical hash.
type memberState struct {
	lineage map[uint64]uint64
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
	// PublicationBoundary is true when this event reached the cadence and the
	// window was drained (Batch may still be nil if nothing net-changed).
	PublicationBoundary bool
}

// Pool is the exact producer state of one pool (SPEC §4): per-member lineage,
// refcounted ownership of canonical blocks with residency, the cuckoo table
// they project into, and the dirty window drained into publication batches.
//
// A Pool is owned by one goroutine. The zero value is not usable; see [NewPool].
type Pool struct {
	cfg    Config
	format Format
	t      table
	dirty  dirtyWindow

	members map[Member]*memberState
	blocks  map[uint64]blockState

	pendingEvents uint64
	resident      uint64 // resident canonical blocks == occupied slots
	contributions uint64 // lineage entries over all members

	unknownRemovals  uint64
	parentNotFound   uint64
	capacityFailures uint64

	memberLimitRejections       uint64
	trackedBlockLimitRejections uint64

	scratch struct {
		canon []uint64
		owned []bool // owned[i]: the member already holds block i (Stored)
		fresh uint64 // blocks of the event the member does not hold yet
		seen  map[uint64]struct{}
		keys  []uint64
	}
}

// NewPool returns an empty pool for a validated configuration.
func NewPool(cfg Config) (*Pool, error) {
	f, err := cfg.Format()
	if err != nil {
		return nil, err
	}
	p := &Pool{
		cfg:     cfg,
		format:  f,
		t:       newTable(f.BucketCount, f.Seed, cfg.MaxKicks),
		dirty:   newDirtyWindow(f.BucketCount),
		members: make(map[Member]*memberState),
		blocks:  make(map[uint64]blockState),
	}
	return p, nil
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
	b := p.blocks[canonical]
	return b.owners, b.resident
}

// MemberBlocks returns the number of blocks member m holds (its lineage
// entries); 0 for a member the pool does not know.
func (p *Pool) MemberBlocks(m Member) int {
	if ms := p.members[m]; ms != nil {
		return len(ms.lineage)
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
	// A nil event is bad input, not a programmer error the pool may panic on:
	// the relay feeds decoded network events straight through.
	if ev == nil {
		out.FirstError = &EventError{Kind: ErrMalformedEvent, Detail: "nil event"}
		return out
	}
	if ev.StorageTier > TierExternal {
		out.FirstError = &EventError{Kind: ErrUnsupportedResidencyDomain, Member: ev.Member(), Detail: "unknown storage tier"}
		return out
	}
	switch ev.Kind {
	case EventStored, EventRemoved:
		if ev.StorageTier != TierDevice {
			return out
		}
	case EventCleared:
	default:
		out.FirstError = &EventError{Kind: ErrMalformedEvent, Member: ev.Member(), Detail: "unknown event kind"}
		return out
	}
	p.pendingEvents++
	switch ev.Kind {
	case EventStored:
		out.FirstError = p.applyStored(ev)
	case EventRemoved:
		out.UnknownRemovals, out.FirstError = p.applyRemoved(ev)
	case EventCleared:
		out.FirstError = p.clearMember(ev.Member())
	}
	if p.pendingEvents >= p.cfg.PublishEveryNEvents {
		out.PublicationBoundary = true
		out.Batch = p.drain()
	}
	return out
}

// canonicalize validates a Stored event and fills p.scratch.canon with the
// canonical hash of each block, p.scratch.owned with whether the member
// already holds it and p.scratch.fresh with how many it does not (the one
// lineage lookup per block admission and commit then share). It commits
// nothing.
func (p *Pool) canonicalize(ev *RouterEvent, ms *memberState) error {
	m := ev.Member()
	canon := p.scratch.canon[:0]
	owned := p.scratch.owned[:0]
	p.scratch.fresh = 0
	var prev uint64
	if ev.HasParent {
		var ok bool
		if ms != nil {
			prev, ok = ms.lineage[ev.ParentHash]
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
		if p.scratch.seen == nil {
			p.scratch.seen = make(map[uint64]struct{}, len(ev.Blocks))
		}
		clear(p.scratch.seen)
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
			if old, held = ms.lineage[b.BlockHash]; held && old != c {
				return &EventError{Kind: ErrInvalidBlockSequence, Member: m, BlockHash: b.BlockHash,
					Detail: "external hash already maps to another canonical hash"}
			}
		}
		dup := false
		if useSet {
			_, dup = p.scratch.seen[b.BlockHash]
			p.scratch.seen[b.BlockHash] = struct{}{}
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
			p.scratch.fresh++
		}
		prev = c
	}
	p.scratch.canon, p.scratch.owned = canon, owned
	return nil
}

func (p *Pool) applyStored(ev *RouterEvent) error {
	m := ev.Member()
	ms := p.members[m]
	if err := p.canonicalize(ev, ms); err != nil {
		if errors.Is(err, ErrParentBlockNotFound) {
			p.parentNotFound++
		}
		return err
	}
	if len(ev.Blocks) == 0 {
		return nil
	}
	if err := p.admitLimits(ev, ms); err != nil {
		return err
	}
	if ms == nil {
		ms = &memberState{lineage: make(map[uint64]uint64, len(ev.Blocks))}
		p.members[m] = ms
	}
	var first error
	for i, b := range ev.Blocks {
		c := p.scratch.canon[i]
		st := p.blocks[c]
		newBlock := st.owners == 0
		if !p.scratch.owned[i] {
			if st.owners == math.MaxUint32 {
				first = cmp.Or(first, error(&EventError{Kind: ErrOwnershipDegreeOverflow, Member: m, BlockHash: b.BlockHash}))
				continue
			}
			ms.lineage[b.BlockHash] = c
			p.contributions++
			st.owners++
		}
		if !st.resident {
			if err := p.makeResident(c, newBlock); err != nil {
				first = cmp.Or(first, error(&EventError{Kind: ErrCapacityExhausted, Member: m, BlockHash: c}))
			} else {
				st.resident = true
			}
		}
		p.blocks[c] = st
	}
	return first
}

// admitLimits refuses, before anything commits, a Stored event that would
// take the pool past MaxMembers or MaxTrackedBlocks (SPEC §4.6).
func (p *Pool) admitLimits(ev *RouterEvent, ms *memberState) error {
	if ms == nil && p.cfg.MaxMembers > 0 && len(p.members) >= p.cfg.MaxMembers {
		p.memberLimitRejections++
		return &EventError{Kind: ErrMemberLimit, Member: ev.Member(),
			Detail: fmt.Sprintf("%d members hold blocks, max_members %d", len(p.members), p.cfg.MaxMembers)}
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

// makeResident puts canonical's fingerprint into the table: a full insertion
// with bounded relocation for a new block, or (reoffer) only an empty slot for
// a block already tracked as non-resident.
func (p *Pool) makeResident(canonical uint64, newBlock bool) error {
	if newBlock {
		if err := p.t.insert(canonical); err != nil {
			p.capacityFailures++
			return err
		}
	} else if !p.t.reoffer(canonical) {
		p.capacityFailures++
		return ErrCapacityExhausted
	}
	p.dirty.record(p.t.writes)
	p.resident++
	return nil
}

func (p *Pool) applyRemoved(ev *RouterEvent) (unknown int, first error) {
	m := ev.Member()
	ms := p.members[m]
	for _, h := range ev.BlockHashes {
		var c uint64
		var ok bool
		if ms != nil {
			c, ok = ms.lineage[h]
		}
		if !ok {
			unknown++
			p.unknownRemovals++
			continue
		}
		delete(ms.lineage, h)
		p.contributions--
		if err := p.release(m, c); err != nil && first == nil {
			first = err
		}
	}
	if ms != nil && len(ms.lineage) == 0 {
		delete(p.members, m)
	}
	return unknown, first
}

// release drops one ownership of canonical; the last owner's release removes a
// resident fingerprint.
func (p *Pool) release(m Member, canonical uint64) error {
	st := p.blocks[canonical]
	st.owners--
	if st.owners > 0 {
		p.blocks[canonical] = st
		return nil
	}
	delete(p.blocks, canonical)
	if !st.resident {
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
	ms := p.members[m]
	if ms == nil {
		return nil
	}
	keys := p.scratch.keys[:0]
	for h := range ms.lineage {
		keys = append(keys, h)
	}
	slices.Sort(keys)
	var first error
	for _, h := range keys {
		if err := p.release(m, ms.lineage[h]); err != nil && first == nil {
			first = err
		}
	}
	p.contributions -= uint64(len(keys))
	p.scratch.keys = keys[:0]
	delete(p.members, m)
	return first
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
