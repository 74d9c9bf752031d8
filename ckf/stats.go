package ckf

import (
	"math/bits"
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
	// Exact-state bounds (SPEC §4.6), lifetime: Stored events refused whole
	// by MaxMembers and by MaxTrackedBlocks.
	MemberLimitRejections       uint64
	TrackedBlockLimitRejections uint64

	// Publication.
	PendingEvents          uint64
	PhysicalTouches        uint64 // lifetime bucket writes
	DistinctTouchedBuckets uint64 // lifetime first touches per window
	EmittedImages          uint64 // lifetime images drained or diffed
	NetRevertedBuckets     uint64 // lifetime touched buckets that drained unchanged

	// Memory, in bytes.
	FilterBytes        uint64
	DirtyTrackingBytes uint64
	// ExactStateBytes estimates the heap of the exact state (lineage, block
	// and member maps) from their entry counts and Go's map growth. Maps
	// never shrink, so after mass removals the heap holds more.
	ExactStateBytes uint64
}

// Go's maps are swiss tables (internal/runtime/maps, Go 1.24 and later):
// groups of 8 slots, each group one 8-byte control word plus 8 key+value
// slots; a table holds at most 1024 slots, grows by doubling when 7/8 full,
// and beyond 1024 slots splits into more tables under a directory. A map of n
// entries grown by insertion therefore has about next_pow2(n·8/7) slots.
const (
	mapGroupSlots     = 8
	mapMaxTableSlots  = 1024
	mapHeaderBytes    = 48 // the map header
	mapTableBytes     = 48 // one table header (40 bytes in the 48-byte size class)
	mapDirectoryBytes = 8  // one directory pointer per table
)

// Sizes of the pool's member map slot and member record.
const (
	memberSlotBytes = uint64(unsafe.Sizeof(Member{})) + 8 // member → *memberState
	// memberStateBytes is a member record's allocation: the struct rounded
	// up to Go's size class (16-byte steps up to 128 bytes).
	memberStateBytes = (uint64(unsafe.Sizeof(memberState{})) + 15) &^ 15
)

// mapBytes estimates the heap bytes of a Go map of n entries with slots of
// slotBytes, grown by insertion. Maps never shrink, so after mass deletion
// the real figure is higher (the capacity of the map's peak stays).
func mapBytes(n int, slotBytes uint64) uint64 {
	if n == 0 {
		return mapHeaderBytes // the group array is allocated on first insert
	}
	groupBytes := uint64(8 + mapGroupSlots*slotBytes)
	if n <= mapGroupSlots {
		return mapHeaderBytes + groupBytes // a small map is one group, no table
	}
	need := (uint64(n)*8 + 6) / 7 // ⌈n·8/7⌉
	slots := uint64(1) << bits.Len64(need-1)
	tables := max(slots/mapMaxTableSlots, 1)
	groups := slots / mapGroupSlots
	return mapHeaderBytes + tables*(mapTableBytes+mapDirectoryBytes) + withSizeClassSlack(groups*groupBytes)
}

// withSizeClassSlack adds the allocator's rounding of a large block up to its
// size class: Go spaces classes above 1 KiB about 1/8 apart, so 1/16 is the
// expected waste (a full 1024-slot group array of 16-byte slots, 17,408
// bytes, takes 18,432: +5.9%).
func withSizeClassSlack(b uint64) uint64 { return b + b/16 }

// exactStateBytes estimates the heap held by the pool's exact state: every
// member's lineage table, the owner tables (both exact: their slot arrays),
// the member map and member records.
func (p *Pool) exactStateBytes() uint64 {
	var total uint64
	for i := range p.blocks {
		total += p.blocks[i].heapBytes()
	}
	for _, s := range p.members {
		total += mapBytes(len(s), memberSlotBytes)
	}
	for _, ms := range p.allMembers {
		total += memberStateBytes + ms.lineage.heapBytes()
	}
	return total
}

// Stats computes the pool's statistics. Cost O(buckets) for the occupancy scan.
func (p *Pool) Stats() Stats {
	slots, buckets := p.t.occupied()
	return Stats{
		Members:                     p.memberCount(),
		Contributions:               p.contributions,
		UniqueBlocks:                p.blockCount(),
		ResidentBlocks:              p.resident,
		UnknownRemovals:             p.unknownRemovals,
		ParentNotFound:              p.parentNotFound,
		CapacityFailures:            p.capacityFailures,
		OccupiedBuckets:             buckets,
		OccupiedSlots:               slots,
		MemberLimitRejections:       p.memberLimitRejections,
		TrackedBlockLimitRejections: p.trackedBlockLimitRejections,
		PendingEvents:               p.pendingEvents,
		PhysicalTouches:             p.dirty.physicalTouches,
		DistinctTouchedBuckets:      p.dirty.distinctTouchedBuckets,
		EmittedImages:               p.dirty.emittedImages,
		NetRevertedBuckets:          p.dirty.netRevertedBuckets,
		FilterBytes:                 uint64(len(p.t.words)) * 8,
		DirtyTrackingBytes:          p.dirty.bytes(),
		ExactStateBytes:             p.exactStateBytes(),
	}
}

// MemberCount is one member's number of lineage entries.
type MemberCount struct {
	Member Member
	Blocks int
}

// MemberCounts returns every member's block count sorted by (worker_id, dp_rank).
func (p *Pool) MemberCounts() []MemberCount {
	out := make([]MemberCount, 0, p.memberCount())
	for m, ms := range p.allMembers {
		out = append(out, MemberCount{Member: m, Blocks: ms.lineage.len()})
	}
	slices.SortFunc(out, func(a, b MemberCount) int { return a.Member.Compare(b.Member) })
	return out
}
