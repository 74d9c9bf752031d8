package ckf

import (
	"maps"
	"slices"

	"github.com/stretchr/testify/require"
)

// choices is a source of bounded random decisions: rapid draws in the
// property test, fuzz bytes in the fuzz target. ok is false when the source
// is exhausted (fuzz input ran out).
type choices interface {
	intn(n int, label string) (v int, ok bool)
}

// modelPool is the reference model of SPEC §4: plain maps for the exact
// state, and refFilter (the plain SPEC §2 transcription in filter_test.go)
// for the physical table. The harness drives a Pool and the model with the
// same operations and checks after every step that they agree byte for byte.
type modelPool struct {
	lineage  map[Member]map[uint64]uint64 // member → external → canonical
	own      map[uint64]uint32            // canonical → owners
	resident map[uint64]bool
	ref      *refFilter
	history  map[Member][]RouterEvent // committed Stored events since the member's last reset, replay order
	pending  uint64
	unknown  uint64
	every    uint64
	cfg      Config
}

func newModel(cfg Config, buckets int) *modelPool {
	return &modelPool{
		lineage: map[Member]map[uint64]uint64{}, own: map[uint64]uint32{}, resident: map[uint64]bool{},
		ref:     newRefFilter(buckets, cfg.Seed, cfg.MaxKicks),
		history: map[Member][]RouterEvent{}, every: cfg.PublishEveryNEvents, cfg: cfg,
	}
}

// modelCanonicalize validates a Stored event against a lineage exactly as
// SPEC §4.3 words it and returns the canonical hashes, or the sentinel it
// fails with.
func modelCanonicalize(lin map[uint64]uint64, ev *RouterEvent) ([]uint64, error) {
	var prev uint64
	if ev.HasParent {
		c, ok := lin[ev.ParentHash]
		if !ok {
			return nil, ErrParentBlockNotFound
		}
		prev = c
	} else if ev.HasStartPosition && ev.StartPosition > 0 { // whatever the block count (decision 2)
		return nil, ErrInvalidBlockSequence
	}
	seen := map[uint64]bool{}
	var out []uint64
	for i, blk := range ev.Blocks {
		c := ChainHash(prev, blk.TokensHash)
		if i == 0 && !ev.HasParent {
			c = blk.TokensHash
		}
		if old, ok := lin[blk.BlockHash]; ok && old != c {
			return nil, ErrInvalidBlockSequence
		}
		if seen[blk.BlockHash] {
			return nil, ErrInvalidBlockSequence
		}
		seen[blk.BlockHash] = true
		out = append(out, c)
		prev = c
	}
	return out, nil
}

// owners recomputes refcounts from the lineage (a cross-check of own).
func (m *modelPool) owners() map[uint64]uint32 {
	out := map[uint64]uint32{}
	for _, lin := range m.lineage {
		for _, c := range lin {
			out[c]++
		}
	}
	return out
}

// store applies a Stored event of mem: validation first, then per block the
// ownership and the residency attempt (full insertion for a block's first
// owner, an empty-slot re-offer for a tracked non-resident block).
func (m *modelPool) store(mem Member, ev *RouterEvent) error {
	lin := m.lineage[mem]
	if lin == nil {
		lin = map[uint64]uint64{}
	}
	canon, err := modelCanonicalize(lin, ev)
	if err != nil {
		return err
	}
	if err := m.limits(lin, ev); err != nil {
		return err
	}
	for i, blk := range ev.Blocks {
		c := canon[i]
		newBlock := m.own[c] == 0
		if _, ok := lin[blk.BlockHash]; !ok {
			lin[blk.BlockHash] = c
			m.own[c]++
		}
		if m.resident[c] {
			continue
		}
		ad := m.ref.addr.Address(c)
		if newBlock {
			m.resident[c] = m.ref.insert(c)
		} else {
			m.resident[c] = m.ref.putEmpty(ad.A, ad.Fingerprint) || m.ref.putEmpty(ad.B, ad.Fingerprint)
		}
		if !m.resident[c] {
			delete(m.resident, c)
		}
	}
	if len(lin) > 0 {
		m.lineage[mem] = lin
	}
	return nil
}

// limits is SPEC §4.6 read literally: a Stored event with blocks from a
// member holding nothing needs a free member place, and its new lineage
// entries must fit the tracked-block bound.
func (m *modelPool) limits(lin map[uint64]uint64, ev *RouterEvent) error {
	if len(ev.Blocks) == 0 {
		return nil
	}
	if len(lin) == 0 && m.cfg.MaxMembers > 0 && len(m.lineage) >= m.cfg.MaxMembers {
		return ErrMemberLimit
	}
	if m.cfg.MaxTrackedBlocks == 0 {
		return nil
	}
	var tracked, added uint64
	for _, l := range m.lineage {
		tracked += uint64(len(l))
	}
	for _, blk := range ev.Blocks {
		if _, ok := lin[blk.BlockHash]; !ok {
			added++
		}
	}
	if tracked+added > m.cfg.MaxTrackedBlocks {
		return ErrTrackedBlockLimit
	}
	return nil
}

func (m *modelPool) release(c uint64) {
	m.own[c]--
	if m.own[c] > 0 {
		return
	}
	delete(m.own, c)
	if m.resident[c] {
		delete(m.resident, c)
		if !m.ref.remove(c) {
			panic("model: resident block missing from the reference filter")
		}
	}
}

// remove applies a Removed event and returns the unknown-removal count.
func (m *modelPool) remove(mem Member, hashes []uint64) (unknown int) {
	lin := m.lineage[mem]
	for _, x := range hashes {
		c, ok := lin[x]
		if !ok {
			unknown++
			continue
		}
		delete(lin, x)
		m.release(c)
	}
	if len(lin) == 0 {
		delete(m.lineage, mem)
	}
	m.unknown += uint64(unknown)
	return unknown
}

// clear releases mem's blocks in ascending external-hash order (the order
// the pool documents, which fixes the physical result).
func (m *modelPool) clear(mem Member) {
	lin := m.lineage[mem]
	for _, x := range slices.Sorted(maps.Keys(lin)) {
		m.release(lin[x])
	}
	delete(m.lineage, mem)
	delete(m.history, mem)
}

// replace rebuilds per SPEC §4.5: a new table with the RNG restarted, every
// retained member's blocks inserted in ascending canonical order, then each
// replacement's events in order. On a validation error m is untouched.
func (m *modelPool) replace(reps []RankReplacement) error {
	next := newModel(m.cfg, len(m.ref.slots))
	replaced := map[Member]bool{}
	for _, r := range reps {
		replaced[r.Member] = true
	}
	for mem, lin := range m.lineage {
		if replaced[mem] {
			continue
		}
		next.lineage[mem] = maps.Clone(lin)
		next.history[mem] = m.history[mem]
		for _, c := range lin {
			next.own[c]++
		}
	}
	for _, c := range slices.Sorted(maps.Keys(next.own)) {
		if next.ref.insert(c) {
			next.resident[c] = true
		}
	}
	for _, r := range reps {
		for i := range r.Events {
			if err := next.store(r.Member, &r.Events[i]); err != nil {
				return err
			}
		}
		if len(next.lineage[r.Member]) > 0 {
			next.history[r.Member] = r.Events
		}
	}
	next.unknown, next.pending = m.unknown, 0
	*m = *next
	return nil
}

// harness drives one Pool and its model, and keeps a consumer table built
// from the first barrier snapshot plus every batch the pool emitted.
type harness struct {
	t        fataler
	p        *Pool
	m        *modelPool
	consumer []uint64
	members  []Member
	steps    int
}

func newHarness(t fataler, cfg Config) *harness {
	p, err := NewPool(cfg)
	require.NoError(t, err, "NewPool(%+v)", cfg)
	tail, words := p.BarrierSnapshot()
	require.Nil(t, tail, "barrier snapshot of an empty pool has a tail")
	return &harness{
		t: t, p: p, m: newModel(cfg, len(words)), consumer: words,
		members: []Member{{1, 0}, {1, 1}, {2, 0}, {3, 7}},
	}
}

// publish validates a batch and installs it in the consumer. Every image must
// change what the consumer holds: a drain emits only net changes.
func (h *harness) publish(b *Batch, what string) {
	h.t.Helper()
	checkBatch(h.t, b, uint64(len(h.consumer)))
	if b == nil {
		return
	}
	for _, im := range b.Images {
		require.NotEqual(h.t, h.consumer[im.Bucket], im.Word, "step %d %s: image for bucket %d repeats the consumer's word", h.steps, what, im.Bucket)
	}
	applyBatch(h.consumer, b)
}

// admitted counts one admitted event in the model's cadence and reports
// whether it is a publication boundary.
func (h *harness) admitted() bool {
	h.m.pending++
	if h.m.pending >= h.m.every {
		h.m.pending = 0
		return true
	}
	return false
}

func (h *harness) checkOutcome(out ApplyOutcome, boundary bool, what string) {
	h.t.Helper()
	require.Equal(h.t, boundary, out.PublicationBoundary, "step %d %s: PublicationBoundary", h.steps, what)
	if !boundary {
		require.Nil(h.t, out.Batch, "step %d %s: batch outside a publication boundary", h.steps, what)
	}
	h.publish(out.Batch, what)
}

// step draws and applies one operation. It returns false when the choice
// source is exhausted.
func (h *harness) step(c choices) bool {
	h.t.Helper()
	op, ok := c.intn(12, "op")
	if !ok {
		return false
	}
	mi, _ := c.intn(len(h.members), "member")
	m := h.members[mi]
	h.steps++
	switch op {
	case 0, 1, 2, 3: // device store
		ev := h.genStored(c, m)
		h.applyStored(ev)
	case 4: // non-device store or remove: ignored
		tier, _ := c.intn(3, "tier")
		ev := h.genStored(c, m)
		if op2, _ := c.intn(2, "kind"); op2 == 1 {
			ev = removedEv(m, h.genHashes(c, m)...)
		}
		ev.StorageTier = StorageTier(1 + tier)
		out := h.p.ApplyEvent(ev)
		require.Equal(h.t, ApplyOutcome{MemberBlocks: len(h.m.lineage[m])}, out, "step %d: non-device event outcome, want ignored", h.steps)
	case 5, 6: // device remove
		hashes := h.genHashes(c, m)
		unknown := h.m.remove(m, hashes)
		boundary := h.admitted()
		out := h.p.ApplyEvent(removedEv(m, hashes...))
		require.NoError(h.t, out.FirstError, "step %d remove %v", h.steps, hashes)
		require.Equal(h.t, unknown, out.UnknownRemovals, "step %d remove %v: unknown removals", h.steps, hashes)
		require.Equal(h.t, len(h.m.lineage[m]), out.MemberBlocks, "step %d remove: member blocks", h.steps)
		h.checkOutcome(out, boundary, "remove")
	case 7: // clear, from any tier
		tier, _ := c.intn(4, "tier")
		h.m.clear(m)
		boundary := h.admitted()
		out := h.p.ApplyEvent(onTier(clearedEv(m), StorageTier(tier)))
		require.NoError(h.t, out.FirstError, "step %d clear", h.steps)
		require.Zero(h.t, out.MemberBlocks, "step %d clear: member blocks", h.steps)
		h.checkOutcome(out, boundary, "clear")
	case 8: // rank replacement
		h.replace(c, m)
	case 9: // RemoveRank
		h.m.clear(m)
		h.m.pending = 0
		b, err := h.p.RemoveRank(m)
		require.NoError(h.t, err, "step %d RemoveRank", h.steps)
		h.publish(b, "remove rank")
	case 10: // flush
		h.m.pending = 0
		h.publish(h.p.Flush(), "flush")
	case 11: // barrier snapshot
		h.m.pending = 0
		tail, words := h.p.BarrierSnapshot()
		h.publish(tail, "barrier tail")
		require.Equal(h.t, h.consumer, words, "step %d: barrier snapshot differs from old stream + tail", h.steps)
	}
	h.check()
	return true
}

// genStored draws a Stored event: a root or a child of one of the member's
// known external hashes (or an unknown parent), blocks with external hashes
// from a small space (so remaps and duplicates happen) and tokens from a small
// space (so members share canonical blocks).
func (h *harness) genStored(c choices, m Member) *RouterEvent {
	n, _ := c.intn(5, "blocks")
	blocks := make([]StoredBlock, n)
	for i := range blocks {
		ext, _ := c.intn(24, "ext")
		tok, _ := c.intn(6, "tokens")
		blocks[i] = b(uint64(ext+1), uint64(tok+1))
	}
	ev := rootEv(m, blocks...)
	kind, _ := c.intn(8, "parent")
	known := slices.Sorted(maps.Keys(h.m.lineage[m]))
	switch {
	case kind <= 3 && len(known) > 0:
		i, _ := c.intn(len(known), "parentIdx")
		ev.HasParent, ev.ParentHash = true, known[i]
	case kind == 4:
		ev.HasParent, ev.ParentHash = true, 1000 // never an external hash
	case kind == 5:
		ev.HasStartPosition, ev.StartPosition = true, 32
	}
	return ev
}

func (h *harness) genHashes(c choices, m Member) []uint64 {
	n, _ := c.intn(4, "removals")
	known := slices.Sorted(maps.Keys(h.m.lineage[m]))
	out := make([]uint64, 0, n)
	for range n {
		if pick, _ := c.intn(3, "known"); pick > 0 && len(known) > 0 {
			i, _ := c.intn(len(known), "idx")
			out = append(out, known[i])
		} else {
			x, _ := c.intn(30, "ext")
			out = append(out, uint64(x+1))
		}
	}
	return out
}

func (h *harness) applyStored(ev *RouterEvent) {
	h.t.Helper()
	m := ev.Member()
	wantErr := h.m.store(m, ev)
	if wantErr == nil && len(h.m.lineage[m]) > 0 {
		h.m.history[m] = append(h.m.history[m], *cloneEvent(ev))
	}
	boundary := h.admitted()
	out := h.p.ApplyEvent(ev)
	switch {
	case wantErr != nil:
		require.ErrorIs(h.t, out.FirstError, wantErr, "step %d store %+v", h.steps, ev)
	case out.FirstError != nil:
		require.ErrorIs(h.t, out.FirstError, ErrCapacityExhausted, "step %d store %+v: want nil or a capacity omission", h.steps, ev)
	}
	require.Equal(h.t, len(h.m.lineage[m]), out.MemberBlocks, "step %d store: member blocks", h.steps)
	h.checkOutcome(out, boundary, "store")
}

func cloneEvent(ev *RouterEvent) *RouterEvent {
	c := *ev
	c.Blocks = slices.Clone(ev.Blocks)
	c.BlockHashes = slices.Clone(ev.BlockHashes)
	return &c
}

// replace builds a replacement for m (and sometimes a second member) from
// the member's own replay-ordered history: all of it, a prefix, nothing, or
// with an event whose parent is unknown.
func (h *harness) replace(c choices, m Member) {
	h.t.Helper()
	members := []Member{m}
	if two, _ := c.intn(3, "two"); two == 0 {
		j, _ := c.intn(len(h.members), "second")
		if h.members[j] != m {
			members = append(members, h.members[j])
		}
	}
	var reps []RankReplacement
	for _, rm := range members {
		hist := h.m.history[rm]
		kind, _ := c.intn(6, "replacement")
		var evs []RouterEvent
		switch kind {
		case 0: // empty: removes the member
		case 1: // a prefix
			n, _ := c.intn(len(hist)+1, "prefix")
			evs = slices.Clone(hist[:n])
		case 2: // broken: an unknown parent at the end
			evs = append(slices.Clone(hist), *childEv(rm, 999, b(1, 1)))
		default:
			evs = slices.Clone(hist)
		}
		reps = append(reps, RankReplacement{Member: rm, Events: evs})
	}
	wantErr := h.m.replace(reps)
	before := viewOf(h.p)
	b, err := h.p.ReplaceRanks(reps)
	if wantErr != nil {
		require.ErrorIs(h.t, err, wantErr, "step %d ReplaceRanks", h.steps)
		require.Nil(h.t, b, "step %d ReplaceRanks: a batch with an error", h.steps)
		require.True(h.t, viewOf(h.p).equal(before), "step %d: failed ReplaceRanks changed the pool", h.steps)
		return
	}
	require.NoError(h.t, err, "step %d ReplaceRanks: the model accepts", h.steps)
	h.m.pending = 0
	h.publish(b, "replace")
}

// pairKey names a fingerprint copy by its fingerprint and unordered bucket pair.
type pairKey struct {
	fp     uint16
	lo, hi uint64
}

func (h *harness) check() {
	h.t.Helper()
	p, m, step := h.p, h.m, h.steps
	// Exact lineage per member.
	require.Equal(h.t, len(m.lineage), p.memberCount(), "step %d: members", step)
	var contributions uint64
	for mem, lin := range m.lineage {
		ms := p.member(mem)
		require.NotNil(h.t, ms, "step %d: member %+v missing", step, mem)
		require.Equal(h.t, lin, maps.Collect(ms.lineage.all), "step %d: member %+v lineage", step, mem)
		contributions += uint64(len(lin))
	}
	// Ownership refcounts.
	owners := m.owners()
	require.Equal(h.t, m.own, owners, "step %d: model bookkeeping broke", step)
	// Byte-for-byte: the pool's table and RNG equal the SPEC transcription
	// driven by the same logical history, and residency agrees per block.
	require.Equal(h.t, m.ref.words(), p.t.words, "step %d: words against the reference", step)
	require.Equal(h.t, m.ref.rng.State(), p.t.rng.State(), "step %d: RNG state against the reference", step)
	require.Equal(h.t, len(owners), p.blockCount(), "step %d: tracked blocks", step)
	want := map[pairKey]int{}
	resident := 0
	for c, n := range owners {
		got, res := p.Owners(c)
		require.Equal(h.t, n, got, "step %d: owners of %#x", step, c)
		require.Equal(h.t, m.resident[c], res, "step %d: residency of %#x", step, c)
		if !res {
			continue
		}
		resident++
		require.True(h.t, p.Contains(c), "step %d: resident %#x not found (false negative)", step, c)
		ad := p.t.addr.Address(c)
		want[pairKey{ad.Fingerprint, min(ad.A, ad.B), max(ad.A, ad.B)}]++
	}
	// The table is exactly the projection of the resident blocks: every
	// fingerprint copy sits in one of its two buckets, once per resident block.
	got := map[pairKey]int{}
	for bk, w := range p.t.words {
		for s := range 4 {
			fp := Bucket(w).Slot(s)
			if fp == 0 {
				continue
			}
			alt := p.t.addr.Alternate(uint64(bk), fp)
			got[pairKey{fp, min(uint64(bk), alt), max(uint64(bk), alt)}]++
		}
	}
	require.Equal(h.t, want, got, "step %d: table fingerprints against the resident projection", step)
	s := p.Stats()
	require.Equal(h.t, resident, s.OccupiedSlots, "step %d: occupied slots", step)
	require.Equal(h.t, uint64(resident), s.ResidentBlocks, "step %d: ResidentBlocks", step)
	require.Equal(h.t, len(m.lineage), s.Members, "step %d: Stats.Members", step)
	require.Equal(h.t, contributions, s.Contributions, "step %d: Stats.Contributions", step)
	require.Equal(h.t, len(owners), s.UniqueBlocks, "step %d: Stats.UniqueBlocks", step)
	require.Equal(h.t, m.unknown, s.UnknownRemovals, "step %d: Stats.UnknownRemovals", step)
	require.Equal(h.t, m.pending, p.PendingEventCount(), "step %d: PendingEventCount", step)
	// Consumer = first snapshot + every batch: equal to what the pool says
	// consumers hold, and to the words whenever nothing is pending.
	require.Equal(h.t, p.dirty.heldWords(p.t.words), h.consumer, "step %d: consumer table differs from the producer's published view", step)
	if !p.HasPendingPublication() {
		require.Equal(h.t, p.t.words, h.consumer, "step %d: nothing pending, yet consumer differs from the words", step)
	}
}

// finish flushes and requires the consumer to equal the producer's bytes.
func (h *harness) finish() {
	h.t.Helper()
	h.m.pending = 0
	h.publish(h.p.Flush(), "final flush")
	require.Equal(h.t, h.p.Words(), h.consumer, "after the final flush the consumer differs from Pool.Words()")
	h.check()
}
