package e2e

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/bits"
	"slices"
	"time"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/consumer"
	"github.com/ckfrelay/ckfrelay/producer"
	"github.com/ckfrelay/ckfrelay/wire"
)

const consumerInstance = 41

var testDomain = ckf.Domain{
	CacheSemantics: ckf.ScopedDigest{Digest: [16]byte{0xe2, 0xe0}, Source: ckf.DigestExplicit},
	RoutingScope:   ckf.ScopedDigest{Digest: [16]byte{0x0e, 0x2e}, Source: ckf.DigestDefaultDerived},
}

// tb is what the rig needs from *testing.T and *rapid.T.
type tb interface {
	Helper()
	Fatalf(format string, args ...any)
	Logf(format string, args ...any)
}

// rigConfig shapes one end-to-end run.
type rigConfig struct {
	Lanes              []int    // one pool per entry, on that consumer lane
	Cadence            []uint64 // PublishEveryNEvents per pool
	Members            int      // members per pool
	ExpectedBlocks     uint64   // sizes every pool's (shared) format
	Seed               uint64
	MaxKicks           int
	ChunkWords         int           // snapshot words per chunk frame
	PublicationDelay   time.Duration // the actor's sparse-tail timer
	VerificationWindow int
}

func (c rigConfig) String() string {
	return fmt.Sprintf("lanes=%v cadence=%v members=%d expected=%d seed=%#x kicks=%d chunk=%d delay=%v window=%d",
		c.Lanes, c.Cadence, c.Members, c.ExpectedBlocks, c.Seed, c.MaxKicks, c.ChunkWords, c.PublicationDelay, c.VerificationWindow)
}

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

// sentFrame is one frame on a link and what the consumer must answer to it.
type sentFrame struct {
	kind     wire.Kind
	sequence uint64 // delta / snapshot sequence, drain expected sequence, heartbeat last sequence
	last     bool   // the final chunk of a snapshot
}

// pool is one producer actor, its shadow, its model and its link to the
// consumer lane.
type pool struct {
	r           *rig
	idx         int
	lane        int
	id          ckf.PoolID
	cfg         ckf.Config
	incarnation uint64

	h      producer.Handle
	faults <-chan producer.Fault
	sub    *producer.Subscription
	lease  ckf.LaneLease
	shadow *ckf.Pool
	// mirror is the producer's table rebuilt from the subscription itself
	// (snapshot plus deltas as they leave the actor, before any encoding).
	mirror  []uint64
	lastSeq uint64 // sequence of the mirror
	running bool

	members     []*member
	nextEventID uint64

	// What the actor must report, from the model; reset with each new actor.
	wantFaults         []error
	wantStale          uint64
	wantUnknownEvents  uint64
	wantCapacityEvents uint64
	wantDegraded       uint64

	// The link: one byte stream, two writers (deltas and control frames with
	// a roomy limit, snapshot chunks with a small one) and one reader.
	buf   bytes.Buffer
	w     *wire.Writer
	snapW *wire.Writer
	rd    *wire.Reader
	queue []sentFrame

	// The lane as the consumer should see it.
	dropNext    bool // lose the next delta frame in transit
	lost        bool // a delta was lost since the lane's last snapshot
	deactivated bool // the consumer noticed and revoked the lease

	// Log of what happened, for scripted tests and failure messages.
	faultLog []consumer.Result
	dropped  int
}

// rig is one consumer and its pools.
type rig struct {
	t          tb
	ctx        context.Context
	cfg        rigConfig
	format     ckf.Format
	acfg       producer.Config
	cons       *consumer.Consumer
	pools      []*pool
	chunkLimit int
	order      uint64
	laneMask   uint16
	// settle, when set, waits until every actor has handled what was queued
	// (synctest.Wait inside a bubble), so pumps forward a deterministic set.
	settle func()

	// counters over the run, logged by the property
	checkpoints, queries, fullChains, partialChains, restarts, recoveries int
	capacityEvents, multiChunkSnapshots, timerDeltas                      int
}

func newRig(t tb, cfg rigConfig) *rig {
	t.Helper()
	r := &rig{t: t, ctx: context.Background(), cfg: cfg}
	base := ckf.DefaultConfig()
	base.ExpectedBlocks = cfg.ExpectedBlocks
	base.Seed = cfg.Seed
	base.MaxKicks = cfg.MaxKicks
	base.VerificationWindow = cfg.VerificationWindow
	f, err := base.Format()
	if err != nil {
		t.Fatalf("format of %v: %v", cfg, err)
	}
	r.format = f
	r.acfg = producer.DefaultConfig()
	r.acfg.PublicationDelay = cfg.PublicationDelay
	r.acfg.FaultCapacity = 64
	// Deltas wait in the subscription between pumps; a run never publishes
	// this many between two pumps, so a lag would be a bug, not the test.
	r.acfg.SubscriberBuffer = 4096
	r.acfg.Logger = slog.New(slog.DiscardHandler)
	r.chunkLimit = wire.MaxSnapshotChunkOverhead + 8*cfg.ChunkWords
	if n, err := wire.ChunkWords(r.chunkLimit); err != nil || n != cfg.ChunkWords {
		t.Fatalf("ChunkWords(%d) = %d, %v; want %d", r.chunkLimit, n, err, cfg.ChunkWords)
	}

	m := consumer.Manifest{
		ConsumerInstance:   consumerInstance,
		Domain:             testDomain,
		Format:             f,
		VerificationWindow: cfg.VerificationWindow,
	}
	for i, lane := range cfg.Lanes {
		p := &pool{r: r, idx: i, lane: lane, id: ckf.PoolID{Domain: testDomain, DCID: 1000 + uint64(lane)}}
		p.cfg = base
		p.cfg.PublishEveryNEvents = cfg.Cadence[i]
		id := p.id
		m.Lanes[lane] = &id
		r.laneMask |= 1 << lane
		for k := range cfg.Members {
			p.members = append(p.members, &member{
				id:    ckf.Member{WorkerID: uint64(1 + k/2), DPRank: uint32(k % 2)},
				epoch: 1, held: make(map[uint64]*block), base: uint64(k+1) << 40, nextExt: uint64(k+1) << 40,
			})
		}
		// The delta limit: every image of the table at once, plus headers.
		limit := 512 + wire.ImageBytes*int(f.BucketCount)
		p.w = wire.NewWriter(&p.buf, limit)
		p.snapW = wire.NewWriter(&p.buf, r.chunkLimit)
		p.rd = wire.NewReader(&p.buf, max(limit, r.chunkLimit))
		p.lease = ckf.LaneLease{ConsumerInstance: consumerInstance, PhysicalLane: uint8(lane)}
		r.pools = append(r.pools, p)
	}
	c, err := consumer.New(m)
	if err != nil {
		t.Fatalf("consumer.New: %v", err)
	}
	r.cons = c
	for _, p := range r.pools {
		p.start()
		p.resubscribe()
	}
	return r
}

// close fences every actor still running, so a failed run leaks no goroutine.
func (r *rig) close() {
	for _, p := range r.pools {
		if p.running {
			_ = p.h.Fence(r.ctx)
			p.running = false
		}
	}
}

// start builds a fresh pool, its shadow and actor under the next incarnation.
func (p *pool) start() {
	t := p.r.t
	t.Helper()
	pl, err := ckf.NewPool(p.cfg)
	if err != nil {
		t.Fatalf("pool %d: NewPool: %v", p.idx, err)
	}
	if p.shadow, err = ckf.NewPool(p.cfg); err != nil {
		t.Fatalf("pool %d: NewPool (shadow): %v", p.idx, err)
	}
	p.incarnation++
	scope := producer.Scope{Pool: p.id, ProducerIncarnation: p.incarnation, LayoutGeneration: 1}
	if p.h, p.faults, err = producer.Start(pl, scope, p.r.acfg); err != nil {
		t.Fatalf("pool %d: Start: %v", p.idx, err)
	}
	p.running = true
	p.sub = nil
	p.wantFaults, p.wantStale, p.wantUnknownEvents, p.wantCapacityEvents, p.wantDegraded = nil, 0, 0, 0, 0
	for _, m := range p.members {
		m.epochKnown = false
	}
}

// forward takes the deltas the subscription holds (all of them until the
// stream closes when wait is set, else those already buffered), checks that
// they continue the stream gaplessly, folds them into the mirror and writes
// them to the link.
func (p *pool) forward(sub *producer.Subscription, wait bool) {
	t := p.r.t
	t.Helper()
	for {
		var d ckf.Delta
		var ok bool
		if wait {
			d, ok = <-sub.Deltas()
		} else {
			select {
			case d, ok = <-sub.Deltas():
			default:
				return
			}
		}
		if !ok {
			return
		}
		if d.Identity != p.h.Identity() || d.Lease != p.lease || d.BaseSequence != p.lastSeq || d.Sequence != p.lastSeq+1 {
			t.Fatalf("pool %d: got delta lease %d %d→%d, want lease %d %d→%d",
				p.idx, d.Lease.AssignmentEpoch, d.BaseSequence, d.Sequence, p.lease.AssignmentEpoch, p.lastSeq, p.lastSeq+1)
		}
		if len(d.Images) == 0 {
			t.Fatalf("pool %d: empty delta %d", p.idx, d.Sequence)
		}
		for _, im := range d.Images {
			p.mirror[im.Bucket] = im.Word
		}
		p.lastSeq = d.Sequence
		f := wire.Frame{Kind: wire.KindDelta, Delta: d}
		if err := p.w.WriteFrame(&f); err != nil {
			t.Fatalf("pool %d: WriteFrame(delta %d): %v", p.idx, d.Sequence, err)
		}
		p.queue = append(p.queue, sentFrame{kind: wire.KindDelta, sequence: d.Sequence})
	}
}

// expect is what the consumer must answer to s given the lane's state.
func (p *pool) expect(s sentFrame) consumer.Result {
	switch {
	case s.kind == wire.KindSnapshotChunk && s.last:
		return consumer.Result{Outcome: consumer.SnapshotInstalled, Lane: p.lane, Sequence: s.sequence}
	case s.kind == wire.KindSnapshotChunk:
		return consumer.Result{Outcome: consumer.SnapshotChunkAccepted, Lane: p.lane}
	case p.deactivated:
		return consumer.Result{Outcome: consumer.IgnoredForeignLease, Lane: p.lane}
	}
	gap := map[wire.Kind]consumer.Fault{
		wire.KindDelta:       consumer.BaseSequenceMismatch,
		wire.KindDrainMarker: consumer.TerminalSequenceMismatch,
		wire.KindHeartbeat:   consumer.HeartbeatSequenceMismatch,
	}
	if p.lost {
		return consumer.Result{Outcome: consumer.Deactivated, Fault: gap[s.kind], Lane: p.lane}
	}
	ok := map[wire.Kind]consumer.Outcome{
		wire.KindDelta:       consumer.Applied,
		wire.KindDrainMarker: consumer.DrainAcknowledged,
		wire.KindHeartbeat:   consumer.HeartbeatObserved,
	}
	return consumer.Result{Outcome: ok[s.kind], Lane: p.lane, Sequence: s.sequence}
}

// deliver reads every frame on the link and applies it to the consumer,
// losing the next delta when dropNext is set, and checks each result.
func (p *pool) deliver() {
	t := p.r.t
	t.Helper()
	for len(p.queue) > 0 {
		s := p.queue[0]
		p.queue = p.queue[1:]
		body, err := p.rd.ReadRaw()
		if err != nil {
			t.Fatalf("pool %d: ReadRaw (%v %d): %v", p.idx, s.kind, s.sequence, err)
		}
		if s.kind == wire.KindDelta && p.dropNext {
			p.dropNext, p.lost = false, true
			p.dropped++
			continue
		}
		want := p.expect(s)
		got, err := p.r.cons.ApplyFrameBytes(body)
		if err != nil {
			t.Fatalf("pool %d: ApplyFrameBytes(%v %d): %v", p.idx, s.kind, s.sequence, err)
		}
		if want.Outcome == consumer.Deactivated || want.Outcome == consumer.IgnoredForeignLease {
			want.Sequence = got.Sequence // the lane's installed sequence is not the frame's
		}
		if got != want {
			t.Fatalf("pool %d lane %d: %v frame %d: got %v, want %v", p.idx, p.lane, s.kind, s.sequence, got, want)
		}
		if got.Outcome == consumer.Deactivated {
			p.deactivated = true
			p.faultLog = append(p.faultLog, got)
			if st := p.laneStatus(); st.Ready || st.Assigned {
				t.Fatalf("pool %d: lane %d still ready=%v assigned=%v after %v", p.idx, p.lane, st.Ready, st.Assigned, got)
			}
		}
	}
	if b, err := p.rd.ReadRaw(); err == nil {
		t.Fatalf("pool %d: %d unexpected bytes left on the link", p.idx, len(b))
	}
	// ReadRaw's io.EOF is sticky; the link is fully read, so start a new reader.
	p.rd = wire.NewReader(&p.buf, p.rd.MaxFrameBytes())
}

func (p *pool) laneStatus() consumer.LaneStatus {
	p.r.t.Helper()
	st, err := p.r.cons.LaneStatus(p.lane)
	if err != nil {
		p.r.t.Fatalf("LaneStatus(%d): %v", p.lane, err)
	}
	return st
}

func (p *pool) laneWords() []uint64 {
	p.r.t.Helper()
	w, err := p.r.cons.AppendLaneWords(nil, p.lane)
	if err != nil {
		p.r.t.Fatalf("AppendLaneWords(%d): %v", p.lane, err)
	}
	return w
}

// healthy reports whether the lane should hold the producer's table.
func (p *pool) healthy() bool { return !p.lost && !p.deactivated }

// resubscribe takes a new lease: the producer cuts a barrier snapshot (the
// old stream gets its tail and ends superseded), the consumer assigns the
// new epoch and installs the snapshot chunk by chunk over the link.
func (p *pool) resubscribe() {
	t := p.r.t
	t.Helper()
	lease := p.lease
	lease.AssignmentEpoch++
	sub, err := p.h.Subscribe(p.r.ctx, lease)
	if err != nil {
		t.Fatalf("pool %d: Subscribe(epoch %d): %v", p.idx, lease.AssignmentEpoch, err)
	}
	snap := sub.Snapshot
	if old := p.sub; old != nil {
		p.forward(old, true) // closed by the Subscribe above
		if err := old.Err(); !errors.Is(err, producer.ErrSuperseded) {
			t.Fatalf("pool %d: old stream ended with %v, want ErrSuperseded", p.idx, err)
		}
		p.deliver()
		if snap.Sequence != p.lastSeq {
			t.Fatalf("pool %d: snapshot at %d, old stream at %d", p.idx, snap.Sequence, p.lastSeq)
		}
		if !slices.Equal(snap.Words, p.mirror) {
			t.Fatalf("pool %d: snapshot differs from the old stream's table in %s", p.idx, diffWords(snap.Words, p.mirror))
		}
		if p.healthy() {
			if w := p.laneWords(); !slices.Equal(w, snap.Words) {
				t.Fatalf("pool %d: lane %d differs from the producer's snapshot in %s", p.idx, p.lane, diffWords(w, snap.Words))
			}
		}
	}
	if snap.Lease != lease || snap.Identity != p.h.Identity() {
		t.Fatalf("pool %d: snapshot lease %+v identity %+v, want %+v %+v", p.idx, snap.Lease, snap.Identity, lease, p.h.Identity())
	}
	if sw := p.shadow.Words(); !slices.Equal(snap.Words, sw) {
		t.Fatalf("pool %d: producer snapshot differs from the shadow pool in %s", p.idx, diffWords(snap.Words, sw))
	}
	p.sub, p.lease = sub, lease
	p.mirror, p.lastSeq = slices.Clone(snap.Words), snap.Sequence

	if err := p.r.cons.Assign(p.h.Identity(), lease); err != nil {
		t.Fatalf("pool %d: Assign(epoch %d): %v", p.idx, lease.AssignmentEpoch, err)
	}
	if p.lost || p.deactivated {
		p.r.recoveries++
	}
	p.lost, p.deactivated, p.dropNext = false, false, false
	before := p.buf.Len()
	if err := p.snapW.WriteSnapshot(&snap); err != nil {
		t.Fatalf("pool %d: WriteSnapshot: %v", p.idx, err)
	}
	chunks := (len(snap.Words) + p.r.cfg.ChunkWords - 1) / p.r.cfg.ChunkWords
	if max := chunks * (wire.LengthPrefixBytes + p.r.chunkLimit); p.buf.Len()-before > max {
		t.Fatalf("pool %d: snapshot took %d bytes, more than %d chunks of ≤ %d", p.idx, p.buf.Len()-before, chunks, p.r.chunkLimit)
	}
	if chunks > 1 {
		p.r.multiChunkSnapshots++
	}
	for i := range chunks {
		p.queue = append(p.queue, sentFrame{kind: wire.KindSnapshotChunk, sequence: snap.Sequence, last: i == chunks-1})
	}
	p.deliver() // any chunk count mismatch fails here: too few never installs, too many leave bytes
	st := p.laneStatus()
	if !st.Ready || st.InstalledSequence != snap.Sequence || st.Lease != lease {
		t.Fatalf("pool %d: after install lane ready=%v at %d lease %+v, want ready at %d lease %+v",
			p.idx, st.Ready, st.InstalledSequence, st.Lease, snap.Sequence, lease)
	}
	if w := p.laneWords(); !slices.Equal(w, snap.Words) {
		t.Fatalf("pool %d: installed lane differs from the snapshot in %s", p.idx, diffWords(w, snap.Words))
	}
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
	if err := p.h.AdmitEvent(p.r.ctx, epoch, ev); err != nil {
		t.Fatalf("pool %d: AdmitEvent: %v", p.idx, err)
	}
	switch {
	case m.epochKnown && epoch < m.epoch:
		p.wantStale++
		return false, ckf.ApplyOutcome{}
	case m.epochKnown && epoch > m.epoch:
		p.wantFaults = append(p.wantFaults, producer.ErrUnannouncedSourceEpoch)
		return false, ckf.ApplyOutcome{}
	}
	m.epoch, m.epochKnown = epoch, true
	out := p.shadow.ApplyEvent(&shadowEv)
	p.shadow.Flush() // the shadow publishes nothing; keep its window small
	switch {
	case wantErr != nil:
		if !errors.Is(out.FirstError, wantErr) {
			t.Fatalf("pool %d: shadow event error %v, model expects %v", p.idx, out.FirstError, wantErr)
		}
		p.wantFaults = append(p.wantFaults, wantErr)
	case errors.Is(out.FirstError, ckf.ErrCapacityExhausted):
		p.wantCapacityEvents++
		p.r.capacityEvents++
	case out.FirstError != nil:
		t.Fatalf("pool %d: shadow event error %v, model expects none", p.idx, out.FirstError)
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
	if ok, _ := p.admit(m, epoch, ev, nil); ok {
		p.r.t.Fatalf("pool %d: the model applied an event at epoch %d (member at %d)", p.idx, epoch, m.epoch)
	}
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
	if out.UnknownRemovals != unknown {
		t.Fatalf("pool %d: shadow counted %d unknown removals, model %d", p.idx, out.UnknownRemovals, unknown)
	}
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
		if !errors.As(err, &se) || !errors.Is(err, producer.ErrStaleSourceEpoch) || se.Current != m.epoch || se.Received != epoch {
			t.Fatalf("pool %d: ResetRank at stale epoch %d (member at %d): got %v", p.idx, epoch, m.epoch, err)
		}
		return
	}
	if err != nil {
		t.Fatalf("pool %d: ResetRank(%d): %v", p.idx, epoch, err)
	}
	if _, err := p.shadow.RemoveRank(m.id); err != nil {
		t.Fatalf("pool %d: shadow RemoveRank: %v", p.idx, err)
	}
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
		if !errors.Is(err, producer.ErrStaleSourceEpoch) {
			t.Fatalf("pool %d: ReplaceRanks with a stale epoch: got %v, want ErrStaleSourceEpoch", p.idx, err)
		}
		return
	}
	if err != nil {
		t.Fatalf("pool %d: ReplaceRanks: %v", p.idx, err)
	}
	if _, err := p.shadow.ReplaceRanks(shadowReps); err != nil {
		t.Fatalf("pool %d: shadow ReplaceRanks: %v", p.idx, err)
	}
	for i, m := range ms {
		m.held = kept[i]
		m.epoch, m.epochKnown = epochs[i], true
	}
}

// flush publishes the actor's pending tail.
func (p *pool) flush() {
	if err := p.h.Flush(p.r.ctx); err != nil {
		p.r.t.Fatalf("pool %d: Flush: %v", p.idx, err)
	}
}

// pump moves what the subscription holds over the link into the consumer.
func (p *pool) pump() {
	p.r.t.Helper()
	if p.r.settle != nil {
		p.r.settle()
	}
	p.forward(p.sub, false)
	p.deliver()
}

// checkFaults compares the faults the actor reported with the model's.
// When closed is set the actor has stopped and the channel is read to its end.
func (p *pool) checkFaults(closed bool) {
	t := p.r.t
	t.Helper()
	var got []producer.Fault
	for {
		var f producer.Fault
		var ok bool
		if closed {
			f, ok = <-p.faults
		} else {
			select {
			case f, ok = <-p.faults:
			default:
			}
		}
		if !ok {
			break
		}
		got = append(got, f)
	}
	if len(got) != len(p.wantFaults) {
		t.Fatalf("pool %d: got %d faults %v, want %d %v", p.idx, len(got), got, len(p.wantFaults), p.wantFaults)
	}
	for i, f := range got {
		if !errors.Is(f.Err, p.wantFaults[i]) {
			t.Fatalf("pool %d: fault %d: got %v, want %v", p.idx, i, f, p.wantFaults[i])
		}
	}
	p.wantFaults = p.wantFaults[:0]
}

// checkStats compares the actor's view with the shadow and the model.
func (p *pool) checkStats(st producer.ActorStats) {
	t := p.r.t
	t.Helper()
	sh := p.shadow.Stats()
	type agg struct {
		Members                                                     int
		Contributions                                               uint64
		UniqueBlocks                                                int
		ResidentBlocks, UnknownRemovals, ParentNotFound, CapFailure uint64
		OccupiedBuckets, OccupiedSlots                              int
	}
	of := func(s ckf.Stats) agg {
		return agg{s.Members, s.Contributions, s.UniqueBlocks, s.ResidentBlocks, s.UnknownRemovals,
			s.ParentNotFound, s.CapacityFailures, s.OccupiedBuckets, s.OccupiedSlots}
	}
	if of(st.Pool) != of(sh) {
		t.Fatalf("pool %d: actor pool stats %+v, shadow %+v", p.idx, of(st.Pool), of(sh))
	}
	// The model's ownership, independently of ckf.
	var want []ckf.MemberCount
	owners := map[uint64]uint32{}
	var contributions uint64
	for _, m := range p.members {
		if len(m.held) > 0 {
			want = append(want, ckf.MemberCount{Member: m.id, Blocks: len(m.held)})
		}
		for _, b := range m.held {
			owners[b.canon]++
			contributions++
		}
	}
	slices.SortFunc(want, func(a, b ckf.MemberCount) int { return a.Member.Compare(b.Member) })
	if !slices.Equal(st.Members, want) {
		t.Fatalf("pool %d: actor members %v, model %v", p.idx, st.Members, want)
	}
	if st.Pool.Contributions != contributions || st.Pool.UniqueBlocks != len(owners) {
		t.Fatalf("pool %d: actor contributions %d unique %d, model %d %d",
			p.idx, st.Pool.Contributions, st.Pool.UniqueBlocks, contributions, len(owners))
	}
	for c, n := range owners {
		if got, _ := p.shadow.Owners(c); got != n {
			t.Fatalf("pool %d: shadow owners of %#x = %d, model %d", p.idx, c, got, n)
		}
	}
	if st.Pool.OccupiedSlots != int(st.Pool.ResidentBlocks) {
		t.Fatalf("pool %d: %d occupied slots for %d resident blocks", p.idx, st.Pool.OccupiedSlots, st.Pool.ResidentBlocks)
	}
	if st.StaleEventsDropped != p.wantStale || st.UnknownRemovalEvents != p.wantUnknownEvents ||
		st.CapacityOmissionEvents != p.wantCapacityEvents || st.DegradedResets != p.wantDegraded {
		t.Fatalf("pool %d: actor stale %d unknown %d capacity %d degraded %d, model %d %d %d %d", p.idx,
			st.StaleEventsDropped, st.UnknownRemovalEvents, st.CapacityOmissionEvents, st.DegradedResets,
			p.wantStale, p.wantUnknownEvents, p.wantCapacityEvents, p.wantDegraded)
	}
	if st.PublishFailures != 0 || st.Fence != producer.NotFenced {
		t.Fatalf("pool %d: %d publish failures, fence %v", p.idx, st.PublishFailures, st.Fence)
	}
}

// checkpoint brings the lane up to date and compares it with the producer:
// flush, forward, heartbeat at the producer's last sequence, then mirror ==
// shadow and lane == mirror. A lost delta is detected by now (gap or
// heartbeat) and recovered by a new lease; resub forces a new lease anyway.
func (p *pool) checkpoint(resub bool) {
	t := p.r.t
	t.Helper()
	p.flush()
	p.pump()
	st, err := p.h.Stats(p.r.ctx)
	if err != nil {
		t.Fatalf("pool %d: Stats: %v", p.idx, err)
	}
	if st.Sequence != p.lastSeq || !st.HasLease || st.Lease != p.lease {
		t.Fatalf("pool %d: actor at %d lease %+v (has %v), stream at %d lease %+v",
			p.idx, st.Sequence, st.Lease, st.HasLease, p.lastSeq, p.lease)
	}
	p.checkFaults(false)
	p.checkStats(st)
	p.heartbeat(st.Sequence)
	p.compare(st.Pool.ResidentBlocks)
	if resub || p.lost {
		if p.lost && !p.deactivated {
			t.Fatalf("pool %d: a lost delta went unnoticed past a heartbeat", p.idx)
		}
		p.resubscribe()
	}
}

func (p *pool) heartbeat(seq uint64) {
	p.r.t.Helper()
	f := wire.Frame{Kind: wire.KindHeartbeat, Heartbeat: wire.Heartbeat{
		Identity: p.h.Identity(), Lease: p.lease, LastSequence: seq, UnixMicros: 1_700_000_000_000_000}}
	if err := p.w.WriteFrame(&f); err != nil {
		p.r.t.Fatalf("pool %d: WriteFrame(heartbeat): %v", p.idx, err)
	}
	p.queue = append(p.queue, sentFrame{kind: wire.KindHeartbeat, sequence: seq})
	p.deliver()
}

// compare checks mirror == shadow, and lane == mirror when the lane is
// healthy; resident is the actor's resident block count, which must equal
// the lane's occupied slots.
func (p *pool) compare(resident uint64) {
	t := p.r.t
	t.Helper()
	if sw := p.shadow.Words(); !slices.Equal(p.mirror, sw) {
		t.Fatalf("pool %d: the producer's stream differs from the shadow pool in %s", p.idx, diffWords(p.mirror, sw))
	}
	st := p.laneStatus()
	if !p.healthy() {
		if st.Ready {
			t.Fatalf("pool %d: lane %d ready after a lost delta", p.idx, p.lane)
		}
		return
	}
	if !st.Ready || st.InstalledSequence != p.lastSeq {
		t.Fatalf("pool %d: lane ready=%v at %d, want ready at %d", p.idx, st.Ready, st.InstalledSequence, p.lastSeq)
	}
	w := p.laneWords()
	if !slices.Equal(w, p.mirror) {
		t.Fatalf("pool %d: lane %d differs from the producer's table in %s", p.idx, p.lane, diffWords(w, p.mirror))
	}
	if n := occupiedSlots(w); uint64(n) != resident {
		t.Fatalf("pool %d: lane holds %d fingerprints, producer %d resident blocks", p.idx, n, resident)
	}
}

// shutdown stops the actor gracefully: the stream's tail and a drain marker
// cross the link, and a healthy lane must acknowledge exactly the last
// sequence and hold the producer's final table.
func (p *pool) shutdown() {
	t := p.r.t
	t.Helper()
	if err := p.h.Shutdown(p.r.ctx); err != nil {
		t.Fatalf("pool %d: Shutdown: %v", p.idx, err)
	}
	p.running = false
	p.forward(p.sub, true)
	if err := p.sub.Err(); !errors.Is(err, producer.ErrShuttingDown) || errors.Is(err, producer.ErrFenced) {
		t.Fatalf("pool %d: stream ended with %v, want a graceful ErrShuttingDown", p.idx, err)
	}
	m, ok := p.sub.DrainMarker()
	if !ok || m.Lease != p.lease || m.ExpectedSequence != p.lastSeq {
		t.Fatalf("pool %d: drain marker %+v (ok %v), want lease %+v at %d", p.idx, m, ok, p.lease, p.lastSeq)
	}
	f := wire.Frame{Kind: wire.KindDrainMarker, Drain: m}
	if err := p.w.WriteFrame(&f); err != nil {
		t.Fatalf("pool %d: WriteFrame(drain): %v", p.idx, err)
	}
	p.queue = append(p.queue, sentFrame{kind: wire.KindDrainMarker, sequence: m.ExpectedSequence})
	lost := p.lost
	p.deliver()
	p.checkFaults(true)
	if lost && !p.deactivated {
		t.Fatalf("pool %d: a lost delta went unnoticed past the drain marker", p.idx)
	}
	st := p.laneStatus()
	if p.healthy() && st.Stats.DrainsAcknowledged == 0 {
		t.Fatalf("pool %d: drain acknowledged but not counted", p.idx)
	}
	p.compare(uint64(p.shadow.Stats().ResidentBlocks))
}

// restart shuts the actor down and starts the pool's next incarnation from
// every member's replayed history (one rebuild), then resubscribes: the
// consumer sees a new identity and installs its snapshot.
func (p *pool) restart() {
	t := p.r.t
	t.Helper()
	p.shutdown()
	epochs := make([]uint64, len(p.members))
	for i, m := range p.members {
		epochs[i] = m.epoch
	}
	p.start()
	p.replace(p.members, epochs, func(*block) bool { return true })
	p.sub = nil
	p.resubscribe()
	p.r.restarts++
}

// checkQueries asks the consumer for every chain a member holds: where the
// producer holds the whole chain resident the lane must report exactly its
// length (the query is that long, so no false positive can add to it),
// and a resident prefix must never be under-reported, by the fast search or
// the linear reference, even when a suffix of random blocks follows it.
// Every resident canonical hash must be in Contains' mask.
func (r *rig) checkQueries() {
	t := r.t
	t.Helper()
	if got := r.cons.ReadyMask(); got != r.laneMask {
		t.Fatalf("ready mask %#x, want %#x", got, r.laneMask)
	}
	chains := map[uint64][]uint64{}
	for _, p := range r.pools {
		for _, m := range p.members {
			for _, b := range m.held {
				chains[b.canon] = b.path
			}
		}
	}
	leaves := make([]uint64, 0, len(chains))
	for c := range chains {
		leaves = append(leaves, c)
	}
	slices.Sort(leaves)
	var fast, lin consumer.QueryResult
	for _, leaf := range leaves {
		path := chains[leaf]
		ext := append(slices.Clip(path), ckf.ChainHash(leaf, 0xe2e1), ckf.ChainHash(ckf.ChainHash(leaf, 0xe2e1), 0xe2e2))
		for _, q := range [][]uint64{path, ext} {
			if err := r.cons.QuerySequenceHashes(q, &fast); err != nil {
				t.Fatalf("QuerySequenceHashes: %v", err)
			}
			if err := r.cons.QuerySequenceHashesLinear(q, &lin); err != nil {
				t.Fatalf("QuerySequenceHashesLinear: %v", err)
			}
			r.queries++
			if fast.Mask != r.laneMask || lin.Mask != r.laneMask {
				t.Fatalf("query masks %#x / %#x, want %#x", fast.Mask, lin.Mask, r.laneMask)
			}
			for _, p := range r.pools {
				resident := 0
				for _, c := range path {
					if _, ok := p.shadow.Owners(c); !ok {
						break
					}
					resident++
				}
				df, dl := int(fast.Depths[p.lane]), int(lin.Depths[p.lane])
				if df < resident || dl < resident {
					t.Fatalf("pool %d lane %d: chain of %d blocks (query %d) with %d resident: fast depth %d, linear %d (false negative)",
						p.idx, p.lane, len(path), len(q), resident, df, dl)
				}
				if len(q) == len(path) && resident == len(path) {
					r.fullChains++
					if df != len(path) || dl != len(path) {
						t.Fatalf("pool %d lane %d: fully resident chain of %d: fast depth %d, linear %d", p.idx, p.lane, len(path), df, dl)
					}
				} else if len(q) == len(path) && resident > 0 {
					r.partialChains++
				}
			}
		}
	}
	for _, p := range r.pools {
		for _, m := range p.members {
			for _, b := range m.held {
				if _, res := p.shadow.Owners(b.canon); !res {
					continue
				}
				mask, err := r.cons.Contains(b.canon)
				if err != nil || mask&(1<<p.lane) == 0 {
					t.Fatalf("pool %d: resident %#x not in lane %d: mask %#x, %v", p.idx, b.canon, p.lane, mask, err)
				}
			}
		}
	}
}

// checkpoint runs a checkpoint on every pool (kind per pool: 0 check, 1 new
// lease, 2 restart) and then the query checks over all lanes.
func (r *rig) checkpoint(kinds []int) {
	r.t.Helper()
	for i, p := range r.pools {
		switch kinds[i] {
		case 0:
			p.checkpoint(false)
		case 1:
			p.checkpoint(true)
		case 2:
			p.restart()
		}
	}
	r.checkpoints++
	r.checkQueries()
}

// occupiedSlots counts the non-zero 16-bit slots of words.
func occupiedSlots(words []uint64) int {
	n := 0
	for _, w := range words {
		for i := range 4 {
			if w>>(16*i)&0xffff != 0 {
				n++
			}
		}
	}
	return n
}

// diffWords describes where two tables differ.
func diffWords(got, want []uint64) string {
	if len(got) != len(want) {
		return fmt.Sprintf("length: got %d words, want %d", len(got), len(want))
	}
	n, first := 0, -1
	for i := range got {
		if got[i] != want[i] {
			if first < 0 {
				first = i
			}
			n++
		}
	}
	if first < 0 {
		return "no bucket"
	}
	return fmt.Sprintf("%d buckets; first bucket %d: got %#016x, want %#016x (%d bits differ)",
		n, first, got[first], want[first], bits.OnesCount64(got[first]^want[first]))
}
