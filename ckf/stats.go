package ckf

import (
	"slices"
	"unsafe"
)

// Stats is a point-in-time view of a pool (SPEC §4.5). Counters marked
// lifetime survive rank replacement.
type Stats struct {
	// Aggregation.
	Members          int    // members holding at least one block
	Contributions    uint64 // lineage entries over all members
	UniqueBlocks     int    // canonical blocks with at least one owner
	ResidentBlocks   uint64 // canonical blocks whose fingerprint is in the filter
	UnknownRemovals  uint64 // lifetime: removals of hashes the member did not hold
	ParentNotFound   uint64 // lifetime: Stored events rejected for an unknown parent
	CapacityFailures uint64 // lifetime: insertions or re-offers that found no room
	OccupiedBuckets  int
	OccupiedSlots    int

	// Publication.
	PendingEvents          uint64
	PhysicalTouches        uint64 // lifetime bucket writes
	DistinctTouchedBuckets uint64 // lifetime first touches per window
	EmittedImages          uint64 // lifetime images drained or diffed
	NetRevertedBuckets     uint64 // lifetime touched buckets that drained unchanged

	// Memory, in bytes.
	FilterBytes        uint64
	DirtyTrackingBytes uint64
	ExactStateBytes    uint64 // an estimate: map entries plus control overhead
}

// Per-entry cost estimates of Go's swiss-table maps: key+value slot plus one
// control byte, at the 7/8 maximum load.
const (
	lineageEntryBytes = (16 + 1) * 8 / 7
	blockEntryBytes   = (8 + int(unsafe.Sizeof(blockState{})) + 1) * 8 / 7
	memberEntryBytes  = 64
)

// Stats computes the pool's statistics. Cost O(buckets) for the occupancy scan.
func (p *Pool) Stats() Stats {
	slots, buckets := p.t.occupied()
	return Stats{
		Members:                len(p.members),
		Contributions:          p.contributions,
		UniqueBlocks:           len(p.blocks),
		ResidentBlocks:         p.resident,
		UnknownRemovals:        p.unknownRemovals,
		ParentNotFound:         p.parentNotFound,
		CapacityFailures:       p.capacityFailures,
		OccupiedBuckets:        buckets,
		OccupiedSlots:          slots,
		PendingEvents:          p.pendingEvents,
		PhysicalTouches:        p.dirty.physicalTouches,
		DistinctTouchedBuckets: p.dirty.distinctTouchedBuckets,
		EmittedImages:          p.dirty.emittedImages,
		NetRevertedBuckets:     p.dirty.netRevertedBuckets,
		FilterBytes:            uint64(len(p.t.words)) * 8,
		DirtyTrackingBytes:     p.dirty.bytes(),
		ExactStateBytes: p.contributions*lineageEntryBytes +
			uint64(len(p.blocks))*uint64(blockEntryBytes) +
			uint64(len(p.members))*memberEntryBytes,
	}
}

// MemberCount is one member's number of lineage entries.
type MemberCount struct {
	Member Member
	Blocks int
}

// MemberCounts returns every member's block count sorted by (worker_id, dp_rank).
func (p *Pool) MemberCounts() []MemberCount {
	out := make([]MemberCount, 0, len(p.members))
	for m, ms := range p.members {
		out = append(out, MemberCount{Member: m, Blocks: len(ms.lineage)})
	}
	slices.SortFunc(out, func(a, b MemberCount) int { return a.Member.Compare(b.Member) })
	return out
}
