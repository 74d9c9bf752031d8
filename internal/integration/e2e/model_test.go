package e2e

// The model: what each member holds (its lineage, by external and canonical
// hash) and the operations that change it, each sent to the actor and mirrored
// on the shadow pool on the model's terms.

import (
	"cmp"
	"errors"
	"fmt"
	"slices"

	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/producer"
)

// block is one stored block of a member, as the model remembers it.
type block struct {
	ext       uint64
	parent    uint64 // external hash of the parent, when hasParent
	hasParent bool
	tokens    uint64
	canon     uint64
	path      []uint64 // canonical chain from the root to this block
	order     uint64   // global store order: replay order of a history
}

// member is the model of one worker rank of one pool.
type member struct {
	id         ckf.Member
	epoch      uint64
	epochKnown bool              // the actor has seen an event, reset or replacement
	held       map[uint64]*block // lineage: external hash → block
	base       uint64            // external hashes are base+1, base+2, … (base itself is never used)
	nextExt    uint64
}

// sorted returns the held blocks in store order.
func (m *member) sorted() []*block {
	bs := make([]*block, 0, len(m.held))
	for _, b := range m.held {
		bs = append(bs, b)
	}
	slices.SortFunc(bs, func(a, b *block) int { return cmp.Compare(a.order, b.order) })
	return bs
}

// history returns a replay-ordered Stored history of the member's lineage: one
// single-block event per kept block, parents first. A block is kept when keep
// says so and its parent (if any) was kept, since a tree dump cannot name a
// parent the rank no longer holds.
func (m *member) history(keep func(*block) bool) ([]ckf.RouterEvent, map[uint64]*block) {
	kept := make(map[uint64]*block)
	var evs []ckf.RouterEvent
	for _, b := range m.sorted() {
		if b.hasParent && kept[b.parent] == nil {
			continue
		}
		if !keep(b) {
			continue
		}
		kept[b.ext] = b
		evs = append(evs, ckf.RouterEvent{
			WorkerID: m.id.WorkerID, DPRank: m.id.DPRank, Kind: ckf.EventStored,
			HasParent: b.hasParent, ParentHash: b.parent,
			Blocks: []ckf.StoredBlock{{BlockHash: b.ext, TokensHash: b.tokens}},
		})
	}
	return evs, kept
}

// admit sends ev at epoch and mirrors it on the model's terms: a stale epoch
// is dropped silently, an unannounced newer one is a fault, anything else is
// applied to the shadow. wantErr is the error the model expects the event to
// report (nil for a valid event, which may still be a capacity omission).
// It reports whether the event applied.
func (p *pool) admit(m *member, epoch uint64, ev ckf.RouterEvent, wantErr error) (bool, ckf.ApplyOutcome) {
	t := p.r.t
	t.Helper()
	p.nextEventID++
	ev.EventID = p.nextEventID
	shadowEv := cloneEvent(ev)
	require.NoError(t, p.h.AdmitEvent(p.r.ctx, epoch, ev), "pool %d: AdmitEvent", p.idx)
	switch {
	case m.epochKnown && epoch < m.epoch:
		p.wantStale++
		return false, ckf.ApplyOutcome{}
	case m.epochKnown && epoch > m.epoch:
		p.wantFaults = append(p.wantFaults, producer.ErrUnannouncedSourceEpoch)
		return false, ckf.ApplyOutcome{}
	}
	known := m.epochKnown
	m.epoch, m.epochKnown = epoch, true
	out := p.shadow.ApplyEvent(&shadowEv)
	p.shadow.Flush() // the shadow publishes nothing; keep its window small
	switch {
	case wantErr != nil:
		require.ErrorIs(t, out.FirstError, wantErr, "pool %d: shadow event error (want the model's)", p.idx)
		p.wantFaults = append(p.wantFaults, wantErr)
		// A faulted first event of a member leaves no epoch record in the
		// pool (producer TestFaultedEventLeavesNoEpochRecord: no journal
		// carries it, so a replica or a restart would not have it).
		m.epochKnown = known
	case errors.Is(out.FirstError, ckf.ErrCapacityExhausted):
		p.wantCapacityEvents++
		p.r.capacityEvents++
	case out.FirstError != nil:
		require.Fail(t, fmt.Sprintf("pool %d: shadow event error %v, model expects none", p.idx, out.FirstError))
	}
	return true, out
}

func cloneEvent(ev ckf.RouterEvent) ckf.RouterEvent {
	ev.Blocks = slices.Clone(ev.Blocks)
	ev.BlockHashes = slices.Clone(ev.BlockHashes)
	return ev
}

// storeChain stores n blocks with the given tokens under parent (a held
// external hash) or as a new root.
func (p *pool) storeChain(m *member, parent *block, tokens []uint64) {
	ev := ckf.RouterEvent{WorkerID: m.id.WorkerID, DPRank: m.id.DPRank, Kind: ckf.EventStored}
	var path []uint64
	if parent != nil {
		ev.HasParent, ev.ParentHash = true, parent.ext
		path = parent.path
	}
	var bs []*block
	for i, tok := range tokens {
		m.nextExt++
		var c uint64
		if i == 0 && parent == nil {
			c = tok
		} else {
			c = ckf.ChainHash(path[len(path)-1], tok)
		}
		path = append(slices.Clip(path), c)
		p.r.order++
		b := &block{ext: m.nextExt, tokens: tok, canon: c, path: path, order: p.r.order}
		if i > 0 {
			b.hasParent, b.parent = true, bs[i-1].ext
		} else if parent != nil {
			b.hasParent, b.parent = true, parent.ext
		}
		bs = append(bs, b)
		ev.Blocks = append(ev.Blocks, ckf.StoredBlock{BlockHash: b.ext, TokensHash: tok})
	}
	if ok, _ := p.admit(m, m.epoch, ev, nil); ok {
		for _, b := range bs {
			m.held[b.ext] = b
		}
	}
}

// restore stores a held block again (same external hash, same parent): no
// ownership changes, a non-resident block is re-offered.
func (p *pool) restore(m *member, b *block) {
	ev := ckf.RouterEvent{WorkerID: m.id.WorkerID, DPRank: m.id.DPRank, Kind: ckf.EventStored,
		HasParent: b.hasParent, ParentHash: b.parent,
		Blocks: []ckf.StoredBlock{{BlockHash: b.ext, TokensHash: b.tokens}}}
	p.admit(m, m.epoch, ev, nil)
}

// storeOrphan stores a block under a parent the member never stored: a
// ParentBlockNotFound fault, nothing committed.
func (p *pool) storeOrphan(m *member, tok uint64) {
	m.nextExt++
	ev := ckf.RouterEvent{WorkerID: m.id.WorkerID, DPRank: m.id.DPRank, Kind: ckf.EventStored,
		HasParent: true, ParentHash: m.nextExt,
		Blocks: []ckf.StoredBlock{{BlockHash: m.nextExt + 1, TokensHash: tok}}}
	m.nextExt++
	p.admit(m, m.epoch, ev, ckf.ErrParentBlockNotFound)
}

// storeOtherTier stores a root on the host tier: ignored by the pool.
func (p *pool) storeOtherTier(m *member, tok uint64) {
	m.nextExt++
	ev := ckf.RouterEvent{WorkerID: m.id.WorkerID, DPRank: m.id.DPRank, Kind: ckf.EventStored,
		StorageTier: ckf.TierHostPinned, Blocks: []ckf.StoredBlock{{BlockHash: m.nextExt, TokensHash: tok}}}
	p.admit(m, m.epoch, ev, nil)
}

// storeAtEpoch stores a root at another epoch than the member's: older is
// dropped silently, newer is an unannounced-epoch fault. Neither applies.
func (p *pool) storeAtEpoch(m *member, epoch, tok uint64) {
	m.nextExt++
	ev := ckf.RouterEvent{WorkerID: m.id.WorkerID, DPRank: m.id.DPRank, Kind: ckf.EventStored,
		Blocks: []ckf.StoredBlock{{BlockHash: m.nextExt, TokensHash: tok}}}
	ok, _ := p.admit(m, epoch, ev, nil)
	require.False(p.r.t, ok, "pool %d: the model applied an event at epoch %d (member at %d)", p.idx, epoch, m.epoch)
}

// remove removes the given external hashes (held or not).
func (p *pool) remove(m *member, exts []uint64) {
	t := p.r.t
	t.Helper()
	ev := ckf.RouterEvent{WorkerID: m.id.WorkerID, DPRank: m.id.DPRank, Kind: ckf.EventRemoved, BlockHashes: exts}
	ok, out := p.admit(m, m.epoch, ev, nil)
	if !ok {
		return
	}
	unknown := 0
	for _, h := range exts {
		if m.held[h] == nil {
			unknown++
		}
		delete(m.held, h)
	}
	require.Equal(t, unknown, out.UnknownRemovals, "pool %d: shadow counted %d unknown removals, model %d", p.idx, out.UnknownRemovals, unknown)
	if unknown > 0 {
		p.wantUnknownEvents++
	}
}

// clearMember sends a Cleared event.
func (p *pool) clearMember(m *member) {
	ev := ckf.RouterEvent{WorkerID: m.id.WorkerID, DPRank: m.id.DPRank, Kind: ckf.EventCleared}
	if ok, _ := p.admit(m, m.epoch, ev, nil); ok {
		clear(m.held)
	}
}

// reset resets the member at epoch; an older epoch than the member's must be
// refused with a *StaleSourceEpochError and change nothing.
func (p *pool) reset(m *member, epoch uint64, degraded bool) {
	t := p.r.t
	t.Helper()
	err := p.h.ResetRank(p.r.ctx, epoch, m.id, degraded)
	if m.epochKnown && epoch < m.epoch {
		var se *producer.StaleSourceEpochError
		require.ErrorIs(t, err, producer.ErrStaleSourceEpoch, "pool %d: ResetRank at stale epoch %d (member at %d)", p.idx, epoch, m.epoch)
		require.ErrorAs(t, err, &se, "pool %d: ResetRank at stale epoch %d", p.idx, epoch)
		require.Equal(t, m.epoch, se.Current, "pool %d: stale epoch error: current", p.idx)
		require.Equal(t, epoch, se.Received, "pool %d: stale epoch error: received", p.idx)
		return
	}
	require.NoError(t, err, "pool %d: ResetRank(%d)", p.idx, epoch)
	_, err = p.shadow.RemoveRank(m.id)
	require.NoError(t, err, "pool %d: shadow RemoveRank", p.idx)
	clear(m.held)
	m.epoch, m.epochKnown = epoch, true
	if degraded {
		p.wantDegraded++
	}
}

// replace replaces the members' state with (a part of) their own
// replay-ordered histories at the given epochs in one atomic rebuild.
func (p *pool) replace(ms []*member, epochs []uint64, keep func(*block) bool) {
	t := p.r.t
	t.Helper()
	var reps []producer.RankReplacement
	var shadowReps []ckf.RankReplacement
	kept := make([]map[uint64]*block, len(ms))
	stale := false
	for i, m := range ms {
		evs, k := m.history(keep)
		kept[i] = k
		reps = append(reps, producer.RankReplacement{SourceEpoch: epochs[i], Member: m.id, Events: evs})
		sevs := make([]ckf.RouterEvent, len(evs))
		for j, ev := range evs {
			sevs[j] = cloneEvent(ev)
		}
		shadowReps = append(shadowReps, ckf.RankReplacement{Member: m.id, Events: sevs})
		stale = stale || (m.epochKnown && epochs[i] < m.epoch)
	}
	err := p.h.ReplaceRanks(p.r.ctx, reps)
	if stale {
		require.ErrorIs(t, err, producer.ErrStaleSourceEpoch, "pool %d: ReplaceRanks with a stale epoch", p.idx)
		return
	}
	require.NoError(t, err, "pool %d: ReplaceRanks", p.idx)
	_, err = p.shadow.ReplaceRanks(shadowReps)
	require.NoError(t, err, "pool %d: shadow ReplaceRanks", p.idx)
	for i, m := range ms {
		m.held = kept[i]
		m.epoch, m.epochKnown = epochs[i], true
	}
}
