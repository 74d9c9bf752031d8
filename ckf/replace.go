package ckf

import (
	"errors"
	"fmt"
	"slices"
)

// RankReplacement is the complete, replay-ordered Stored history of one
// member (a tree dump). An empty Events list removes the member.
type RankReplacement struct {
	Member Member
	Events []RouterEvent
}

// ReplaceRanks atomically replaces the exact state of the given members
// (SPEC §4.5). It builds a new state off to the side with the RNG restarted,
// reinstalls every retained member, installs the replacements in order, then
// diffs the new table against what consumers hold (the pending window's
// originals, every other bucket's current value) and swaps.
//
// Events of a non-device tier are skipped, as [Pool.ApplyEvent] skips
// non-device Stored and Removed events: they change nothing, and a later
// event whose parent only they stored fails with ErrParentBlockNotFound. Any
// validation error (duplicate member, an event of another member, an unknown
// tier or kind, a device event that is not Stored, parent not found, invalid
// block sequence) returns it with the pool untouched. Capacity omissions during the rebuild
// are counted, not fatal. Lifetime statistics carry over. The returned batch
// is nil when the rebuild leaves every bucket as consumers hold it.
func (p *Pool) ReplaceRanks(reps []RankReplacement) (*Batch, error) {
	replaced := make(map[Member]bool, len(reps))
	for _, r := range reps {
		if replaced[r.Member] {
			return nil, &EventError{Kind: ErrInvalidReplacement, Member: r.Member, Detail: "duplicate member"}
		}
		replaced[r.Member] = true
		for i := range r.Events {
			ev := &r.Events[i]
			switch {
			case ev.Member() != r.Member:
				return nil, &EventError{Kind: ErrInvalidReplacement, Member: r.Member,
					Detail: fmt.Sprintf("event %d belongs to worker %d rank %d", i, ev.WorkerID, ev.DPRank)}
			case ev.StorageTier > TierExternal:
				return nil, &EventError{Kind: ErrUnsupportedResidencyDomain, Member: r.Member,
					Detail: fmt.Sprintf("event %d is on unknown tier %v", i, ev.StorageTier)}
			case ev.Kind < EventStored || ev.Kind > EventCleared:
				return nil, &EventError{Kind: ErrMalformedEvent, Member: r.Member,
					Detail: fmt.Sprintf("event %d has unknown kind %v", i, ev.Kind)}
			case ev.StorageTier == TierDevice && ev.Kind != EventStored:
				return nil, &EventError{Kind: ErrInvalidReplacement, Member: r.Member,
					Detail: fmt.Sprintf("event %d is %v, not stored", i, ev.Kind)}
			}
		}
	}

	next := newEmptyPool(p.cfg, p.format, p.shardKey)
	next.reinstall(p, replaced)
	for _, r := range reps {
		for i := range r.Events {
			if r.Events[i].StorageTier != TierDevice {
				continue // only device-tier blocks are routed on
			}
			if _, err := next.applyStored(&r.Events[i]); err != nil && !errors.Is(err, ErrCapacityExhausted) {
				return nil, err
			}
		}
	}

	held := p.dirty.heldWords(p.t.words)
	var images []BucketImage
	for b, w := range next.t.words {
		if w != held[b] {
			images = append(images, BucketImage{Bucket: uint32(b), Word: w})
		}
	}

	// Swap, carrying lifetime statistics over. The new window starts empty:
	// the diff above covers everything consumers have not seen.
	d := p.dirty
	d.reset()
	d.emittedImages += uint64(len(images))
	p.t = next.t
	p.dirty = d
	p.members = next.members
	p.blocks = next.blocks
	p.nonResident = next.nonResident
	p.resident = next.resident
	p.contributions = next.contributions
	p.capacityFailures += next.capacityFailures
	// A rebuild that hit a limit aborted above, so next counted none.
	p.pendingEvents = 0
	if len(images) == 0 {
		return nil, nil
	}
	return &Batch{Images: images}, nil
}

// reinstall copies every member of old not in skip into p, then makes each
// owned canonical resident, in ascending canonical order so rebuilds are
// deterministic.
func (p *Pool) reinstall(old *Pool, skip map[Member]bool) {
	for m, ms := range old.allMembers {
		if skip[m] {
			continue
		}
		lin := newU64Map(ms.lineage.len())
		for ext, c := range ms.lineage.all {
			lin.put(ext, c)
			bs := &p.blocks[p.blockShard(c)]
			n, _ := bs.get(c)
			bs.put(c, n+1)
		}
		p.members[p.memberShard(m)][m] = &memberState{lineage: lin}
		p.contributions += uint64(lin.len())
	}
	canon := make([]uint64, 0, p.blockCount())
	for i := range p.blocks {
		for c := range p.blocks[i].all {
			canon = append(canon, c)
		}
	}
	slices.Sort(canon)
	for _, c := range canon {
		if p.t.insert(c) != nil {
			p.capacityFailures++
			p.nonResident[c] = struct{}{}
			continue
		}
		p.resident++
	}
}
