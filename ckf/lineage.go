package ckf

import (
	"cmp"
	"slices"
)

// LineageEntry is one block a member holds: its external block hash and the
// canonical hash it maps to.
type LineageEntry struct {
	External, Canonical uint64
}

// MemberLineage is one member's exact lineage: every block it holds.
type MemberLineage struct {
	Member Member
	Blocks []LineageEntry
}

// ExportLineage returns every member's lineage, members in (worker, rank)
// order, for a store that persists the exact state across a crash. The
// result shares nothing with the pool. Owner counts and residency follow
// from the lineages: [MemberLineage.Events] re-creates them.
func (p *Pool) ExportLineage() []MemberLineage {
	out := make([]MemberLineage, 0, p.memberCount())
	for m, ms := range p.allMembers {
		l := MemberLineage{Member: m, Blocks: make([]LineageEntry, 0, ms.lineage.len())}
		for ext, canon := range ms.lineage.all {
			l.Blocks = append(l.Blocks, LineageEntry{External: ext, Canonical: canon})
		}
		out = append(out, l)
	}
	slices.SortFunc(out, func(a, b MemberLineage) int {
		return cmp.Or(cmp.Compare(a.Member.WorkerID, b.Member.WorkerID), cmp.Compare(a.Member.DPRank, b.Member.DPRank))
	})
	return out
}

// Events returns device Stored events that re-create l's lineage through
// [Pool.ReplaceRanks]: one root event per block, because a root block's
// canonical hash is its tokens hash (SPEC §4.3), so no chain needs to be
// known. The events share one backing array of blocks.
func (l MemberLineage) Events() []RouterEvent {
	blocks := make([]StoredBlock, len(l.Blocks))
	evs := make([]RouterEvent, len(l.Blocks))
	for i, e := range l.Blocks {
		blocks[i] = StoredBlock{BlockHash: e.External, TokensHash: e.Canonical}
		evs[i] = RouterEvent{WorkerID: l.Member.WorkerID, DPRank: l.Member.DPRank, Kind: EventStored, Blocks: blocks[i : i+1 : i+1]}
	}
	return evs
}
