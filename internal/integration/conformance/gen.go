package conformance

import (
	"fmt"
	"strconv"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/consumer"
	"github.com/ckfrelay/ckfrelay/producer"
	"github.com/ckfrelay/ckfrelay/wasm/abi"
	"github.com/ckfrelay/ckfrelay/wire"
)

// The generator drives real producers (ckf.Pool + producer.Publisher) and
// encodes their output with wire.AppendFrame. Faulty frames are real frames
// with one field edited before encoding. Each step declares the outcome the
// SPEC §8.3 rule prescribes; the model below tracks, per lane, only what the
// declared outcomes imply (ready, installed sequence, the words installed)
// so expected depths and digests never come from the consumer under test.

const (
	genBuckets   = 64  // bucket_count of every scenario: small files, same rules
	genExpected  = 200 // expected_blocks giving 64 buckets
	genBlockSize = 4   // tokens per block in the stored requests
	genInstance  = 7   // consumer_instance of every manifest
)

var genDomain = ckf.Domain{
	CacheSemantics: ckf.ScopedDigest{Digest: [16]byte{0xc0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, Source: ckf.DigestExplicit},
	RoutingScope:   ckf.ScopedDigest{Digest: [16]byte{0x5c, 0xd, 0xe, 0xf}, Source: ckf.DigestDefaultDerived},
}

var genFormat = ckf.NewFormat(ckf.DefaultSeed, genBuckets)

func genPool(lane int) ckf.PoolID { return ckf.PoolID{Domain: genDomain, DCID: uint64(100 + lane)} }

// source is one pool's producer: exact state, publisher, and the deltas its
// sink received.
type source struct {
	pool   *ckf.Pool
	pub    *producer.Publisher
	sink   *collector
	id     ckf.ProducerIdentity
	worker uint64
	nextID uint64
}

type collector struct{ deltas []ckf.Delta }

func (c *collector) Enqueue(d ckf.Delta) error { c.deltas = append(c.deltas, d); return nil }

func newSource(lane int, incarnation uint64) *source {
	s := newSourceOf(lane, incarnation, ckf.DefaultSeed, genExpected)
	if s.id.Format != genFormat {
		panic(fmt.Sprintf("generator format %+v, pool format %+v", genFormat, s.id.Format))
	}
	return s
}

// newSourceOf is a producer of its own format: seed and the bucket count
// of expected blocks (200 → 64 buckets, 400 → 128, 800 → 256, 1600 → 512).
func newSourceOf(lane int, incarnation, seed, expected uint64) *source {
	cfg := ckf.DefaultConfig()
	cfg.ExpectedBlocks = expected
	cfg.Seed = seed
	p, err := ckf.NewPool(cfg)
	if err != nil {
		panic(err) // a constant config: a failure is a generator bug
	}
	id := ckf.ProducerIdentity{Pool: genPool(lane), ProducerIncarnation: incarnation, LayoutGeneration: 1, Format: p.Format()}
	s := &source{pool: p, sink: &collector{}, id: id, worker: uint64(lane + 1)}
	s.pub = producer.NewPublisher(id, 0, s.sink)
	return s
}

// store stores the complete blocks of tokens as one root Stored event and
// publishes the resulting batch; it returns the canonical sequence hashes.
func (s *source) store(tokens []uint32) []uint64 {
	locals := ckf.AppendLocalBlockHashes(nil, tokens, genBlockSize, ckf.BaseSalt)
	ev := ckf.RouterEvent{WorkerID: s.worker, EventID: s.nextID, Kind: ckf.EventStored}
	s.nextID++
	for i, l := range locals {
		ev.Blocks = append(ev.Blocks, ckf.StoredBlock{BlockHash: l ^ uint64(i+1)<<56, TokensHash: l})
	}
	s.apply(&ev)
	return ckf.AppendSequenceHashes(nil, locals)
}

// localsWith returns the local hashes of the complete blocks of tokens
// hashed with a salt and hash options (namespace, multimodal hashes, Eagle
// windows): ckf.LocalBlockHashMM over each block's window (Dynamo's
// compute_block_hash_for_seq).
func localsWith(tokens []uint32, salt uint64, o ckf.HashOptions) []uint64 {
	w := genBlockSize
	if o.Eagle {
		w++
	}
	var locals []uint64
	for i := range ckf.BlockCount(len(tokens), genBlockSize, o.Eagle) {
		var mm []uint64
		if i < len(o.MM) {
			mm = o.MM[i]
		}
		locals = append(locals, ckf.LocalBlockHashMM(tokens[i*genBlockSize:i*genBlockSize+w], mm, salt))
	}
	return locals
}

// storeWith is store for blocks hashed by localsWith.
func (s *source) storeWith(tokens []uint32, salt uint64, o ckf.HashOptions) {
	ev := ckf.RouterEvent{WorkerID: s.worker, EventID: s.nextID, Kind: ckf.EventStored}
	s.nextID++
	for i, l := range localsWith(tokens, salt, o) {
		ev.Blocks = append(ev.Blocks, ckf.StoredBlock{BlockHash: l ^ uint64(i+1)<<56, TokensHash: l})
	}
	s.apply(&ev)
}

// remove removes the blocks stored by store(tokens) from index from on.
func (s *source) remove(tokens []uint32, from int) {
	locals := ckf.AppendLocalBlockHashes(nil, tokens, genBlockSize, ckf.BaseSalt)
	ev := ckf.RouterEvent{WorkerID: s.worker, EventID: s.nextID, Kind: ckf.EventRemoved}
	s.nextID++
	for i := from; i < len(locals); i++ {
		ev.BlockHashes = append(ev.BlockHashes, locals[i]^uint64(i+1)<<56)
	}
	s.apply(&ev)
}

func (s *source) apply(ev *ckf.RouterEvent) {
	out := s.pool.ApplyEvent(ev)
	if out.FirstError != nil {
		panic(fmt.Sprintf("generator event failed: %v", out.FirstError))
	}
	if out.Batch != nil {
		if _, err := s.pub.Publish(out.Batch); err != nil {
			panic(err)
		}
	}
}

// take returns the deltas published since the last take.
func (s *source) take() []ckf.Delta {
	d := s.sink.deltas
	s.sink.deltas = nil
	return d
}

// subscribe cuts a barrier snapshot for lease (publishing any tail on the
// old lease first, which take then returns).
func (s *source) subscribe(lease ckf.LaneLease) ckf.Snapshot {
	snap, err := s.pub.SnapshotAfterBarrier(s.pool, lease)
	if err != nil {
		panic(err)
	}
	return snap
}

// laneModel is what the declared outcomes imply about one lane.
type laneModel struct {
	format    ckf.Format // the lane's format: its last assignment's
	ready     bool
	assigned  bool
	installed uint64
	lastEpoch uint64
	words     []uint64 // the lane's column as the consumer must hold it
	staging   bool
	lastOut   consumer.Outcome
	lastFault consumer.Fault
}

type builder struct {
	s     Scenario
	m     consumer.Manifest
	lanes [ckf.MaxLanes]laneModel
}

// newBuilder configures lanes with genFormat pinned to all (a version-1
// manifest).
func newBuilder(name, desc string, lanes ...int) *builder {
	return newBuilderFormat(name, desc, genFormat, lanes...)
}

// newBuilderFormat configures lanes with format f pinned to all, or with
// no pin (f zero: a version-2 manifest, each lane's format its
// assignment's).
func newBuilderFormat(name, desc string, f ckf.Format, lanes ...int) *builder {
	m := consumer.Manifest{ConsumerInstance: genInstance, Domain: genDomain, Format: f,
		VerificationWindow: consumer.DefaultVerificationWindow}
	for _, l := range lanes {
		p := genPool(l)
		m.Lanes[l] = &p
	}
	b := &builder{m: m}
	b.s = Scenario{Name: name, Description: desc, Manifest: abi.AppendManifest(nil, &m)}
	for _, l := range lanes {
		b.lanes[l].format = f
		b.lanes[l].words = make([]uint64, f.BucketCount)
	}
	return b
}

// pin pins lane l to format f in the manifest (re-encoded).
func (b *builder) pin(l int, f ckf.Format) {
	b.m.LaneFormats[l] = f
	b.lanes[l].format = f
	b.lanes[l].words = make([]uint64, f.BucketCount)
	b.s.Manifest = abi.AppendManifest(nil, &b.m)
}

func lease(lane int, epoch uint64) ckf.LaneLease {
	return ckf.LaneLease{ConsumerInstance: genInstance, PhysicalLane: uint8(lane), AssignmentEpoch: epoch}
}

func (b *builder) step(st Step) { b.s.Steps = append(b.s.Steps, st) }

// assign adds an assign step expecting code; on success the model follows.
func (b *builder) assign(note string, id ckf.ProducerIdentity, l ckf.LaneLease, code abi.Code) {
	b.step(Step{Op: OpAssign, Note: note, Assignment: abi.AppendAssignment(nil, &id, &l), Want: Want{Code: int32(code)}})
	if code == abi.OK {
		lm := &b.lanes[l.PhysicalLane]
		lm.ready, lm.assigned, lm.staging, lm.installed, lm.lastEpoch = false, true, false, 0, l.AssignmentEpoch
		if lm.format != id.Format {
			lm.format, lm.words = id.Format, make([]uint64, id.Format.BucketCount)
		}
	}
}

func (b *builder) retire(lane int, code abi.Code) {
	b.step(Step{Op: OpRetire, Note: "retire", Lane: lane, Want: Want{Code: int32(code)}})
	if code == abi.OK {
		lm := &b.lanes[lane]
		lm.ready, lm.assigned, lm.staging, lm.installed = false, false, false, 0
	}
}

func encode(f *wire.Frame) []byte {
	b, err := wire.AppendFrame(nil, f)
	if err != nil {
		panic(err)
	}
	return b
}

// applyWant adds an apply step of frame with the declared outcome and fault
// for lane; words are the snapshot words or nil. The model follows the
// outcome; the expected sequence is the model's installed sequence after it.
func (b *builder) apply(note string, frame []byte, lane int, o consumer.Outcome, f consumer.Fault, install func(lm *laneModel)) {
	w := Want{Code: int32(o), Outcome: uint8(o), Fault: uint8(f), ResLane: lane}
	if lane >= 0 && lane < ckf.MaxLanes {
		lm := &b.lanes[lane]
		switch o {
		case consumer.Applied, consumer.SnapshotInstalled, consumer.SnapshotChunkAccepted:
			install(lm)
		case consumer.Deactivated:
			lm.ready, lm.assigned, lm.staging, lm.installed = false, false, false, 0
		case consumer.RetrySnapshot:
			lm.staging = false
		}
		switch o {
		case consumer.Applied, consumer.SnapshotInstalled, consumer.SnapshotChunkAccepted, consumer.DrainAcknowledged,
			consumer.HeartbeatObserved, consumer.Deactivated, consumer.RetrySnapshot:
			lm.lastOut, lm.lastFault = o, f
		}
		if lm.ready {
			w.Sequence = U64(lm.installed)
		}
	}
	b.step(Step{Op: OpApply, Note: note, Frame: frame, Want: w})
}

// snapshot applies a whole snapshot expected to install.
func (b *builder) snapshot(note string, snap ckf.Snapshot) {
	f := wire.Frame{Kind: wire.KindSnapshotChunk, Snapshot: wire.SnapshotChunk{Identity: snap.Identity, Lease: snap.Lease,
		Sequence: snap.Sequence, ChunkCount: 1, Words: snap.Words}}
	words := append([]uint64(nil), snap.Words...)
	b.apply(note, encode(&f), int(snap.Lease.PhysicalLane), consumer.SnapshotInstalled, consumer.NoFault, func(lm *laneModel) {
		copy(lm.words, words)
		lm.ready, lm.installed, lm.staging = true, snap.Sequence, false
	})
}

func deltaFrame(d *ckf.Delta) []byte {
	return encode(&wire.Frame{Kind: wire.KindDelta, Delta: *d})
}

// delta applies a delta expected to be Applied.
func (b *builder) delta(note string, d ckf.Delta) {
	images := append([]ckf.BucketImage(nil), d.Images...)
	b.apply(note, deltaFrame(&d), int(d.Lease.PhysicalLane), consumer.Applied, consumer.NoFault, func(lm *laneModel) {
		for _, im := range images {
			lm.words[im.Bucket] = im.Word
		}
		lm.installed = d.Sequence
	})
}

// rejected applies a frame expected to change nothing on its lane, then
// checks the lane's words are what they were.
func (b *builder) rejected(note string, frame []byte, lane int, o consumer.Outcome, f consumer.Fault) {
	b.apply(note, frame, lane, o, f, nil)
	if lane >= 0 && lane < ckf.MaxLanes && b.m.Lanes[lane] != nil {
		b.words(lane)
	}
}

// malformed applies bytes that must not decode.
func (b *builder) malformed(note string, frame []byte, code abi.Code) {
	b.step(Step{Op: OpApply, Note: note, Frame: frame, Want: Want{Code: int32(code), ResLane: -1}})
}

// words checks a lane's column; a lane that is not ready has none to give
// (its column may be stale or half staged): Unavailable.
func (b *builder) words(lane int) {
	if !b.lanes[lane].ready {
		b.step(Step{Op: OpWords, Note: "lane not ready: no words", Lane: lane, Want: Want{Code: int32(abi.ErrUnavailable)}})
		return
	}
	b.step(Step{Op: OpWords, Note: "lane words unchanged by the model", Lane: lane, Want: Want{SHA256: WordsDigest(b.lanes[lane].words)}})
}

func (b *builder) status(lane int) {
	lm := &b.lanes[lane]
	w := Want{Ready: lm.ready, Assigned: lm.assigned, LastEpoch: U64(lm.lastEpoch), Staging: lm.staging,
		LastOut: uint8(lm.lastOut), LastFault: uint8(lm.lastFault), Seed: U64(lm.format.Seed), BucketCount: U64(lm.format.BucketCount)}
	if lm.ready {
		w.Installed = U64(lm.installed)
	}
	b.step(Step{Op: OpStatus, Note: "status", Lane: lane, Want: w})
}

// depths computes the linear-reference prefix depth of seq on every ready
// lane of the model.
func (b *builder) depths(seq []uint64) (mask uint16, depths []uint32) {
	depths = make([]uint32, ckf.MaxLanes)
	for l := range b.lanes {
		lm := &b.lanes[l]
		if !lm.ready {
			continue
		}
		mask |= 1 << l
		ad := lm.format.Addresser()
		for _, h := range seq {
			a := ad.Address(h)
			if !ckf.Bucket(lm.words[a.A]).Contains(a.Fingerprint) && !ckf.Bucket(lm.words[a.B]).Contains(a.Fingerprint) {
				break
			}
			depths[l]++
		}
	}
	return mask, depths
}

func (b *builder) queryWant(seq []uint64) Want {
	mask, d := b.depths(seq)
	w := Want{Code: int32(mask), Mask: mask, Depths: d, Blocks: len(seq)}
	if mask == 0 {
		w.Code = int32(abi.ErrUnavailable)
	}
	return w
}

// queries adds the same request as tokens, local hashes and sequence hashes,
// plus a contains of its first block.
func (b *builder) queries(note string, tokens []uint32) {
	locals := ckf.AppendLocalBlockHashes(nil, tokens, genBlockSize, ckf.BaseSalt)
	seq := ckf.AppendSequenceHashes(nil, locals)
	w := b.queryWant(seq)
	b.step(Step{Op: OpQuery, Note: note + " (tokens)", Kind: abi.QueryTokens, Tokens: tokens, BlockSize: genBlockSize,
		Salt: U64(ckf.BaseSalt), Want: w})
	b.step(Step{Op: OpQuery, Note: note + " (local hashes)", Kind: abi.QueryLocalHashes, Hashes: u64s(locals), Want: w})
	b.step(Step{Op: OpQuery, Note: note + " (sequence hashes)", Kind: abi.QuerySequenceHashes, Hashes: u64s(seq), Want: w})
	if len(seq) > 0 {
		mask, d := b.depths(seq[:1])
		var hit uint16
		for l := range d {
			if d[l] > 0 {
				hit |= 1 << l
			}
		}
		code := int32(hit)
		if mask == 0 {
			code = int32(abi.ErrUnavailable)
		}
		b.step(Step{Op: OpContains, Note: note + " (contains first block)", Hash: U64(seq[0]), Want: Want{Code: code}})
	}
}

func u64s(v []uint64) []U64 {
	out := make([]U64, len(v))
	for i, x := range v {
		out[i] = U64(x)
	}
	return out
}

// request returns n blocks of deterministic tokens starting at base.
func request(base uint32, blocks int) []uint32 {
	t := make([]uint32, blocks*genBlockSize)
	for i := range t {
		t[i] = base + uint32(i)*2654435761
	}
	return t
}

// Generate builds every scenario. It is deterministic: the same code gives
// the same files.
func Generate() []Scenario {
	return []Scenario{
		genNormalFlow(),
		genIgnoreRules(),
		genFaults(),
		genChunkedSnapshot(),
		genLaneRecovery(),
		genMalformedFrames(),
		genAssignErrors(),
		genTokenOptions(),
		genMixedFormats(),
		genLaneFormatChange(),
		genSixteenFormats(),
	}
}

// genMixedFormats: lanes of different formats in one consumer (a version-2
// manifest pinning none but lane 6): two bucket counts of the default seed
// (two groups sharing a key hash), another seed, and a group of two lanes.
func genMixedFormats() Scenario {
	b := newBuilderFormat("mixed_formats", "a version-2 manifest: lanes of 64, 256 and 512 buckets and two seeds in one consumer (format groups), one lane pinned; queries, deltas, words and status per lane", ckf.Format{}, 0, 1, 2, 3, 6)
	srcs := map[int]*source{
		0: newSourceOf(0, 1, ckf.DefaultSeed, 200),
		1: newSourceOf(1, 1, ckf.DefaultSeed, 800),
		2: newSourceOf(2, 1, 7, 1600),
		3: newSourceOf(3, 1, ckf.DefaultSeed, 200),
		6: newSourceOf(6, 1, 7, 400),
	}
	b.pin(6, srcs[6].id.Format)
	reqA, reqB := request(31000, 8), request(47000, 6)
	for l, d := range map[int]int{0: 8, 1: 5, 2: 3, 3: 0, 6: 7} {
		srcs[l].store(reqA[:d*genBlockSize])
	}
	srcs[3].store(reqB)
	srcs[1].store(reqB[:2*genBlockSize])
	b.queries("before any lane is ready", reqA)
	for _, l := range []int{0, 1, 2, 3, 6} {
		b.assign(fmt.Sprintf("lane %d: %d buckets, seed %#x", l, srcs[l].id.Format.BucketCount, srcs[l].id.Format.Seed), srcs[l].id, lease(l, 1), abi.OK)
		b.status(l)
	}
	wrong := srcs[6].id
	wrong.Format = ckf.NewFormat(7, 64)
	b.assign("lane 6 is pinned: another format", wrong, lease(6, 2), abi.ErrFormatMismatch)
	for _, l := range []int{0, 1, 2, 3, 6} {
		b.snapshot(fmt.Sprintf("lane %d snapshot", l), srcs[l].subscribe(lease(l, 1)))
	}
	b.queries("request A on five lanes of four formats", reqA)
	b.queries("request B", reqB)
	srcs[2].store(reqA[:7*genBlockSize])
	srcs[0].remove(reqA, 6)
	for _, l := range []int{0, 2} {
		for _, d := range srcs[l].take() {
			b.delta(fmt.Sprintf("lane %d delta", l), d)
		}
	}
	b.queries("request A after deltas", reqA)
	for _, l := range []int{0, 1, 2, 3, 6} {
		b.status(l)
		b.words(l)
	}
	b.retire(1, abi.OK)
	b.queries("after retiring lane 1", reqA)
	return b.s
}

// genLaneFormatChange: one lane follows a pool that is resized (a new
// producer incarnation with another bucket count) and resubscribes in the
// new format, then in a third one; the other lanes' answers never change,
// and frames of the old format's lease are ignored.
func genLaneFormatChange() Scenario {
	b := newBuilderFormat("lane_format_change", "a lane changes format across resubscribes (64 → 512 → 128 buckets, then another seed) while lanes of the old format keep answering; the old lease's frames are ignored", ckf.Format{}, 0, 1, 2)
	s0, s1, s2 := newSourceOf(0, 1, ckf.DefaultSeed, 200), newSourceOf(1, 1, ckf.DefaultSeed, 200), newSourceOf(2, 1, ckf.DefaultSeed, 200)
	req := request(90210, 7)
	s0.store(req[:6*genBlockSize])
	s1.store(req[:4*genBlockSize])
	s2.store(req)
	for l, s := range []*source{s0, s1, s2} {
		b.assign(fmt.Sprintf("lane %d", l), s.id, lease(l, 1), abi.OK)
		b.snapshot(fmt.Sprintf("lane %d snapshot", l), s.subscribe(lease(l, 1)))
	}
	b.queries("one group of three lanes", req)
	s1.store(req[:5*genBlockSize])
	stale := s1.take()
	epoch := uint64(1)
	for i, next := range []struct{ seed, expected uint64 }{{ckf.DefaultSeed, 1600}, {ckf.DefaultSeed, 400}, {7, 400}} {
		epoch++
		r := newSourceOf(1, uint64(10+i), next.seed, next.expected)
		r.store(req[:(2+i)*genBlockSize])
		b.assign(fmt.Sprintf("lane 1 resubscribes at %d buckets, seed %#x", r.id.Format.BucketCount, r.id.Format.Seed), r.id, lease(1, epoch), abi.OK)
		b.status(1)
		b.words(1)
		b.queries("lane 1 between formats: not ready", req)
		b.snapshot("lane 1 snapshot in its new format", r.subscribe(lease(1, epoch)))
		b.status(1)
		b.words(1)
		b.queries("lane 1 in its new format", req)
		for _, d := range stale {
			b.rejected("a delta of lane 1's first lease: ignored", deltaFrame(&d), 1, consumer.IgnoredForeignLease, consumer.NoFault)
		}
		r.store(req[:(3+i)*genBlockSize])
		for _, d := range r.take() {
			b.delta("lane 1 delta in its new format", d)
		}
		b.queries("after lane 1's delta", req)
	}
	b.words(0)
	b.words(2)
	return b.s
}

// genSixteenFormats: 16 lanes in 16 formats (four seeds × four bucket
// counts): 16 groups of one lane each.
func genSixteenFormats() Scenario {
	all := make([]int, ckf.MaxLanes)
	for i := range all {
		all[i] = i
	}
	b := newBuilderFormat("sixteen_formats", "16 lanes in 16 formats (seeds × 64, 128, 256, 512 buckets): 16 format groups of one lane; every lane's own depth", ckf.Format{}, all...)
	seeds := []uint64{ckf.DefaultSeed, 7, 1 << 40, 0xfeed}
	req := request(123456, 18)
	for l := range ckf.MaxLanes {
		s := newSourceOf(l, uint64(l+1), seeds[l%4], 200<<(l/4))
		s.store(req[:(l+2)*genBlockSize])
		b.assign(fmt.Sprintf("lane %d", l), s.id, lease(l, 1), abi.OK)
		b.snapshot(fmt.Sprintf("lane %d snapshot", l), s.subscribe(lease(l, 1)))
		if l%5 == 0 {
			b.queries(fmt.Sprintf("%d lanes ready", l+1), req)
		}
	}
	b.queries("all 16 lanes", req)
	for l := range ckf.MaxLanes {
		b.status(l)
	}
	b.words(15)
	return b.s
}

func genNormalFlow() Scenario {
	b := newBuilder("normal_flow", "two lanes: assign, snapshot, deltas, queries by tokens/local/sequence hashes, contains, heartbeat, drain, close", 0, 3)
	s0, s3 := newSource(0, 11), newSource(3, 33)
	reqA, reqB := request(1000, 6), request(5000, 9)
	s0.store(reqA)
	s3.store(reqA[:3*genBlockSize])
	s3.store(reqB)
	b.queries("before any lane is ready", reqA)
	b.assign("lane 0", s0.id, lease(0, 1), abi.OK)
	b.assign("lane 3", s3.id, lease(3, 1), abi.OK)
	b.status(0)
	b.snapshot("lane 0 snapshot", s0.subscribe(lease(0, 1)))
	b.queries("only lane 0 ready", reqA)
	b.snapshot("lane 3 snapshot", s3.subscribe(lease(3, 1)))
	b.queries("request A on both lanes", reqA)
	b.queries("request B on both lanes", reqB)
	s0.store(reqB[:5*genBlockSize])
	s3.remove(reqB, 4)
	for _, d := range s0.take() {
		b.delta("lane 0 delta", d)
	}
	for _, d := range s3.take() {
		b.delta("lane 3 delta", d)
	}
	b.queries("request B after deltas", reqB)
	b.queries("empty request", nil)
	b.queries("partial block only", reqA[:genBlockSize-1])
	for _, bs := range []int64{0, -1, -1 << 32, -(1<<32 - 16)} {
		b.step(Step{Op: OpQuery, Note: "token block size " + strconv.FormatInt(bs, 10), Kind: abi.QueryTokens, Tokens: reqA, BlockSize: bs,
			Salt: U64(ckf.BaseSalt), Want: Want{Code: int32(abi.ErrInvalidQuery)}})
	}
	// Any positive block size is valid; one above the token count leaves no
	// complete block. The module's i32 argument must not wrap one ≥ 2^31
	// (2^32+16 is not 16) on any host.
	for _, bs := range []int64{int64(len(reqA)) + 1, 1<<31 - 1, 1 << 31, 1<<32 - 1, 1 << 32, 1<<32 + genBlockSize} {
		b.step(Step{Op: OpQuery, Note: "token block size " + strconv.FormatInt(bs, 10) + ": no complete block", Kind: abi.QueryTokens, Tokens: reqA,
			BlockSize: bs, Salt: U64(ckf.BaseSalt), Want: b.queryWant(nil)})
		b.step(Step{Op: OpQuery, Note: "token query (kind 3), block size " + strconv.FormatInt(bs, 10) + ": no complete block", Kind: abi.QueryTokensWith,
			Tokens: reqA, BlockSize: bs, Salt: U64(ckf.BaseSalt), MM: [][]U64{{1}}, Want: b.queryWant(nil)})
	}
	b.status(0)
	b.status(3)
	b.words(0)
	b.words(3)
	hb := wire.Frame{Kind: wire.KindHeartbeat, Heartbeat: wire.Heartbeat{Identity: s0.id, Lease: lease(0, 1),
		LastSequence: s0.pub.LastSequence(), UnixMicros: 1_700_000_000_000_000}}
	b.apply("heartbeat at the installed sequence", encode(&hb), 0, consumer.HeartbeatObserved, consumer.NoFault, nil)
	dm, _ := s3.pub.ExactDrainMarker()
	b.apply("drain marker at the installed sequence", encode(&wire.Frame{Kind: wire.KindDrainMarker, Drain: dm}), 3,
		consumer.DrainAcknowledged, consumer.NoFault, nil)
	b.apply("close frame", encode(&wire.Frame{Kind: wire.KindClose, Close: wire.Close{Reason: wire.CloseShuttingDown, Message: "bye"}}),
		-1, consumer.StreamClosed, consumer.NoFault, nil)
	b.retire(3, abi.OK)
	b.queries("after retiring lane 3", reqB)
	b.status(3)
	return b.s
}

func genIgnoreRules() Scenario {
	b := newBuilder("ignore_rules", "frames that must change nothing: foreign leases, stale and duplicate sequences, deltas before a snapshot", 0, 1)
	s0 := newSource(0, 5)
	req := request(77, 5)
	s0.store(req)
	b.assign("lane 0", s0.id, lease(0, 2), abi.OK)
	s0.store(request(900, 2)) // published with no lease: dropped by the publisher
	snap := s0.subscribe(lease(0, 2))
	// A delta before the snapshot: the lane is assigned but not ready.
	s0.store(request(300, 3))
	early := s0.take()
	b.rejected("delta before any snapshot", deltaFrame(&early[0]), 0, consumer.AwaitingSnapshot, consumer.NoFault)
	b.snapshot("snapshot", snap)
	b.delta("first delta", early[0])
	b.rejected("duplicate delta", deltaFrame(&early[0]), 0, consumer.IgnoredStaleOrDuplicate, consumer.NoFault)
	stale := snap
	b.rejected("stale snapshot on a ready lane", encode(&wire.Frame{Kind: wire.KindSnapshotChunk, Snapshot: wire.SnapshotChunk{
		Identity: stale.Identity, Lease: stale.Lease, Sequence: stale.Sequence, ChunkCount: 1, Words: stale.Words}}),
		0, consumer.IgnoredStaleOrDuplicate, consumer.NoFault)
	s0.store(request(400, 2))
	next := s0.take()[0]
	for _, tc := range []struct {
		note string
		l    ckf.LaneLease
		lane int
	}{
		{"older epoch", lease(0, 1), 0},
		{"newer epoch not assigned", lease(0, 3), 0},
		{"another consumer instance", ckf.LaneLease{ConsumerInstance: genInstance + 1, PhysicalLane: 0, AssignmentEpoch: 2}, 0},
		{"configured but unassigned lane", lease(1, 2), 1},
		{"unconfigured lane", lease(5, 2), 5},
		{"lane index 16", lease(16, 2), -1},
		{"lane index 255", lease(255, 2), -1},
	} {
		d := next
		d.Lease = tc.l
		b.rejected("foreign lease: "+tc.note, deltaFrame(&d), tc.lane, consumer.IgnoredForeignLease, consumer.NoFault)
	}
	b.words(0)
	b.delta("the real next delta still applies", next)
	b.queries("request", req)
	b.status(0)
	return b.s
}

func genFaults() Scenario {
	b := newBuilder("faults", "every deactivating fault of SPEC §8.3, each on a ready lane and each followed by re-assignment with a new epoch and a fresh snapshot", 2)
	s := newSource(2, 9)
	req := request(31337, 8)
	s.store(req)
	epoch := uint64(1)
	ready := func() {
		b.assign("assign new epoch", s.id, lease(2, epoch), abi.OK)
		b.snapshot("fresh snapshot", s.subscribe(lease(2, epoch)))
	}
	salt := uint32(0)
	nextDelta := func() ckf.Delta {
		salt++
		s.store(request(salt*1000+17, 2))
		d := s.take()
		return d[len(d)-1]
	}
	fault := func(note string, frame []byte, f consumer.Fault) {
		b.rejected(note, frame, 2, consumer.Deactivated, f)
		b.status(2)
		b.queries("after "+note, req)
		epoch++
		ready()
	}
	ready()
	d := nextDelta()
	b.delta("a good delta", d)

	d = nextDelta()
	bad := d
	bad.Identity.ProducerIncarnation++
	fault("delta with another producer identity", deltaFrame(&bad), consumer.WrongIdentity)

	d1, d2 := nextDelta(), nextDelta()
	_ = d1
	fault("gap: delta skips one sequence", deltaFrame(&d2), consumer.BaseSequenceMismatch)

	d = nextDelta()
	bad = d
	bad.Sequence = d.Sequence + 1
	fault("sequence is not base+1", deltaFrame(&bad), consumer.NonContiguous)

	d = nextDelta()
	bad = d
	bad.Images = nil
	fault("delta without images", deltaFrame(&bad), consumer.EmptyDelta)

	d = nextDelta()
	bad = d
	bad.Images = append([]ckf.BucketImage(nil), d.Images...)
	bad.Images = append(bad.Images, ckf.BucketImage{Bucket: genBuckets, Word: 1})
	fault("image bucket ≥ bucket_count", deltaFrame(&bad), consumer.MalformedImages)

	d = nextDelta()
	bad = d
	bad.Images = append([]ckf.BucketImage(nil), d.Images...)
	bad.Images = append(bad.Images, ckf.BucketImage{Bucket: d.Images[0].Bucket, Word: 0xdead})
	fault("duplicate image bucket", deltaFrame(&bad), consumer.MalformedImages)

	s.store(request(4242, 3))
	s.take()
	newer := s.subscribe(lease(2, epoch))
	fault("newer snapshot on a ready lane", encode(&wire.Frame{Kind: wire.KindSnapshotChunk, Snapshot: wire.SnapshotChunk{
		Identity: newer.Identity, Lease: newer.Lease, Sequence: newer.Sequence + 1, ChunkCount: 1, Words: newer.Words}}),
		consumer.SnapshotWhileReady)

	dm, _ := s.pub.ExactDrainMarker()
	dm.ExpectedSequence++
	fault("drain marker past the installed sequence", encode(&wire.Frame{Kind: wire.KindDrainMarker, Drain: dm}), consumer.TerminalSequenceMismatch)

	hb := wire.Frame{Kind: wire.KindHeartbeat, Heartbeat: wire.Heartbeat{Identity: s.id, Lease: lease(2, epoch),
		LastSequence: s.pub.LastSequence() + 5, UnixMicros: 1}}
	fault("heartbeat with another last sequence", encode(&hb), consumer.HeartbeatSequenceMismatch)

	// SequenceOverflow is not reachable: it needs base == installed ==
	// MaxUint64, and then every sequence is ≤ installed, which the earlier
	// IgnoredStaleOrDuplicate rule catches (docs/RATIONALE.md "Why is
	// `SequenceOverflow` a fault kind that cannot happen?").
	b.words(2)
	return b.s
}

func genChunkedSnapshot() Scenario {
	b := newBuilder("chunked_snapshot", "a snapshot in 4 chunks: invisible until the last chunk; out-of-order, overlapping, other-sequence or empty chunks and a delta mid-snapshot abandon it (RetrySnapshot on the same lease); chunk 0 always restarts staging", 1, 4)
	s1, s4 := newSource(1, 3), newSource(4, 4)
	req := request(2024, 7)
	s1.store(req)
	s4.store(req)
	b.assign("lane 4", s4.id, lease(4, 1), abi.OK)
	b.snapshot("lane 4 whole snapshot", s4.subscribe(lease(4, 1)))
	b.assign("lane 1", s1.id, lease(1, 1), abi.OK)
	snap := s1.subscribe(lease(1, 1))
	const limit = wire.MaxSnapshotChunkOverhead + 8*16 // 16 words a chunk
	chunks, err := wire.SplitSnapshot(&snap, limit)
	if err != nil || len(chunks) != 4 {
		panic(fmt.Sprintf("split: %d chunks, %v", len(chunks), err))
	}
	frame := func(ch wire.SnapshotChunk) []byte {
		return encode(&wire.Frame{Kind: wire.KindSnapshotChunk, Snapshot: ch})
	}
	accept := func(note string, ch wire.SnapshotChunk, last bool) {
		words := append([]uint64(nil), ch.Words...)
		o := consumer.SnapshotChunkAccepted
		if last {
			o = consumer.SnapshotInstalled
		}
		b.apply(note, frame(ch), 1, o, consumer.NoFault, func(lm *laneModel) {
			copy(lm.words[ch.BucketOffset:], words)
			lm.staging = !last
			if last {
				lm.ready, lm.installed = true, ch.Sequence
			}
		})
	}
	retry := func(note string, ch wire.SnapshotChunk, f consumer.Fault) {
		b.apply(note, frame(ch), 1, consumer.RetrySnapshot, f, nil)
		b.status(1)
	}
	retry("first chunk is not chunk 0", chunks[1], consumer.ChunkOutOfOrder)
	accept("chunk 0", chunks[0], false)
	b.queries("chunk 0 staged: lane 1 invisible", req)
	b.status(1)
	b.words(1) // a lane that is not ready has no words to give: Unavailable
	retry("chunk 2 after chunk 0", chunks[2], consumer.ChunkOutOfOrder)
	accept("chunk 0 again", chunks[0], false)
	other := chunks[1]
	other.Sequence++
	retry("chunk of another sequence", other, consumer.ChunkSequenceMismatch)
	accept("chunk 0 again", chunks[0], false)
	overlap := chunks[1]
	overlap.BucketOffset--
	overlap.Words = snap.Words[overlap.BucketOffset : overlap.BucketOffset+16]
	retry("overlapping chunk", overlap, consumer.ChunkOverlap)
	accept("chunk 0 again", chunks[0], false)
	accept("chunk 1", chunks[1], false)
	s1.store(request(8080, 2))
	mid := s1.take()
	b.apply("delta before the last chunk", deltaFrame(&mid[0]), 1, consumer.RetrySnapshot, consumer.DeltaDuringSnapshot, nil)
	short := chunks[3]
	short.Words = short.Words[:len(short.Words)-1]
	accept("chunk 0 again", chunks[0], false)
	accept("chunk 1", chunks[1], false)
	accept("chunk 2", chunks[2], false)
	retry("last chunk ends short of bucket_count", short, consumer.WrongBucketCount)
	accept("chunk 0 again", chunks[0], false)
	emptyEnd := chunks[3]
	emptyEnd.ChunkIndex, emptyEnd.ChunkCount, emptyEnd.BucketOffset, emptyEnd.Words = 4, 5, uint64(len(snap.Words)), nil
	retry("an empty chunk is malformed, even a final one at bucket_count", emptyEnd, consumer.MalformedChunk)
	accept("chunk 0 again", chunks[0], false)
	accept("chunk 1", chunks[1], false)
	accept("chunk 0 mid-snapshot restarts staging from it", chunks[0], false)
	newer := chunks[0]
	newer.Sequence++
	accept("chunk 0 of a newer snapshot mid-snapshot restarts from it", newer, false)
	retry("the abandoned snapshot cannot continue", chunks[1], consumer.ChunkSequenceMismatch)
	zero := chunks[0]
	zero.ChunkCount = 0
	// wire refuses to encode count 0, so this frame is hand-edited below.
	_ = zero
	accept("chunk 0 again", chunks[0], false)
	accept("chunk 1", chunks[1], false)
	accept("chunk 2", chunks[2], false)
	accept("chunk 3 installs", chunks[3], true)
	b.queries("after install", req)
	b.delta("the delta sent mid-snapshot applies now", mid[0])
	b.queries("after the delta", req)
	b.words(1)
	b.status(1)
	return b.s
}

func genLaneRecovery() Scenario {
	b := newBuilder("lane_recovery", "a gap deactivates the lane; the old epoch is refused; a new epoch and a barrier snapshot restore it, and the stream continues from N to N+1", 6)
	s := newSource(6, 1)
	req := request(9, 10)
	s.store(req[:4*genBlockSize])
	b.assign("lane 6 epoch 4", s.id, lease(6, 4), abi.OK)
	b.snapshot("snapshot", s.subscribe(lease(6, 4)))
	s.store(req[:7*genBlockSize])
	s.store(request(55, 3))
	s.store(request(66, 2))
	ds := s.take()
	if len(ds) != 3 {
		panic(fmt.Sprintf("lane_recovery: %d deltas, want 3", len(ds)))
	}
	b.delta("delta", ds[0])
	b.rejected("gap", deltaFrame(&ds[2]), 6, consumer.Deactivated, consumer.BaseSequenceMismatch)
	b.queries("lane 6 deactivated", req)
	b.rejected("in-order delta under the revoked lease is foreign now", deltaFrame(&ds[1]), 6, consumer.IgnoredForeignLease, consumer.NoFault)
	b.assign("same epoch again", s.id, lease(6, 4), abi.ErrStaleAssignmentEpoch)
	b.assign("older epoch", s.id, lease(6, 3), abi.ErrStaleAssignmentEpoch)
	b.retire(6, abi.OK)
	b.assign("epoch after retire must still grow", s.id, lease(6, 4), abi.ErrStaleAssignmentEpoch)
	b.assign("epoch 5", s.id, lease(6, 5), abi.OK)
	b.status(6)
	b.snapshot("barrier snapshot for epoch 5", s.subscribe(lease(6, 5)))
	b.queries("recovered", req)
	s.store(req)
	for _, d := range s.take() {
		b.delta("continuation N→N+1", d)
	}
	b.queries("after continuation", req)
	b.words(6)
	// A relay restart: new incarnation, same pool.
	s2 := newSource(6, 2)
	s2.store(req[:2*genBlockSize])
	b.assign("new incarnation epoch 6", s2.id, lease(6, 6), abi.OK)
	b.snapshot("snapshot of the new incarnation", s2.subscribe(lease(6, 6)))
	b.queries("new incarnation", req)
	b.status(6)
	return b.s
}

func genMalformedFrames() Scenario {
	b := newBuilder("malformed_frames", "bytes that do not decode as a v1 frame are rejected with a decode code and change no lane", 0)
	s := newSource(0, 1)
	req := request(123, 4)
	s.store(req)
	b.assign("lane 0", s.id, lease(0, 1), abi.OK)
	b.snapshot("snapshot", s.subscribe(lease(0, 1)))
	s.store(request(321, 2))
	d := s.take()[0]
	good := deltaFrame(&d)
	b.malformed("empty input", nil, abi.ErrFrameTruncated)
	b.malformed("truncated delta", good[:len(good)-3], abi.ErrFrameTruncated)
	b.malformed("trailing byte", append(append([]byte(nil), good...), 0), abi.ErrFrameTrailingBytes)
	v2 := append([]byte(nil), good...)
	v2[1] = 2 // [version, kind, …]: fixint version 1 → 2
	b.malformed("wire version 2", v2, abi.ErrFrameUnknownVersion)
	k9 := append([]byte(nil), good...)
	k9[2] = 9
	b.malformed("frame kind 9", k9, abi.ErrFrameUnknownKind)
	b.malformed("not an array", []byte{0xc0}, abi.ErrFrameMalformed)
	b.malformed("array of one", []byte{0x91, 0x01}, abi.ErrFrameMalformed)
	b.malformed("string where the version goes", []byte{0x92, 0xa1, 'x', 0x02}, abi.ErrFrameMalformed)
	// A payload whose bin length is not a multiple of the image size.
	odd := append([]byte(nil), good...)
	if i := len(odd) - 12*len(d.Images) - 1; odd[i-1] == 0xc4 && int(odd[i]) == 12*len(d.Images) {
		odd[i]--
		odd = odd[:len(odd)-1]
		b.malformed("image payload not a multiple of 12 bytes", odd, abi.ErrFrameMalformed)
	}
	b.words(0)
	b.delta("the good delta still applies", d)
	b.queries("request", req)
	return b.s
}

func genAssignErrors() Scenario {
	b := newBuilder("assign_errors", "assign checks in SPEC order: consumer instance, lane, pool, format, epoch; errors leave the lane untouched", 0, 1)
	s0, s1 := newSource(0, 1), newSource(1, 1)
	s0.store(request(1, 3))
	b.assign("lane 0", s0.id, lease(0, 3), abi.OK)
	b.snapshot("snapshot", s0.subscribe(lease(0, 3)))
	other := ckf.LaneLease{ConsumerInstance: genInstance + 1, PhysicalLane: 0, AssignmentEpoch: 9}
	b.assign("another consumer instance", s0.id, other, abi.ErrWrongConsumer)
	b.assign("unconfigured lane", s0.id, lease(9, 9), abi.ErrWrongLane)
	b.assign("lane index 16", s0.id, lease(16, 9), abi.ErrWrongLane)
	b.assign("pool of lane 1 on lane 0", s1.id, lease(0, 9), abi.ErrWrongPool)
	wf := s0.id
	wf.Format.Seed++
	b.assign("other format seed", wf, lease(0, 9), abi.ErrFormatMismatch)
	wf = s0.id
	wf.Format.BucketCount *= 2
	b.assign("other bucket count", wf, lease(0, 9), abi.ErrFormatMismatch)
	b.assign("stale epoch", s0.id, lease(0, 2), abi.ErrStaleAssignmentEpoch)
	b.assign("wrong consumer wins over stale epoch", s0.id, ckf.LaneLease{ConsumerInstance: 1, PhysicalLane: 0, AssignmentEpoch: 1}, abi.ErrWrongConsumer)
	b.status(0)
	b.queries("lane 0 still ready", request(1, 3))
	b.retire(9, abi.ErrWrongLane)
	b.retire(16, abi.ErrWrongLane)
	b.retire(-1, abi.ErrWrongLane)
	b.step(Step{Op: OpStatus, Note: "status of lane 16", Lane: 16, Want: Want{Code: int32(abi.ErrWrongLane)}})
	b.step(Step{Op: OpStatus, Note: "status of lane -1", Lane: -1, Want: Want{Code: int32(abi.ErrWrongLane)}})
	b.step(Step{Op: OpWords, Note: "words of lane -1", Lane: -1, Want: Want{Code: int32(abi.ErrWrongLane)}})
	b.step(Step{Op: OpStatus, Note: "status of unconfigured lane 9", Lane: 9, Want: Want{}})
	return b.s
}

// queryWith adds a QueryTokensWith step whose expected depths are the
// model's for the sequence hashes of blocks stored with the same inputs
// (storeWith's rule, not the consumer's).
func (b *builder) queryWith(note string, tokens []uint32, bs int, salt uint64, o ckf.HashOptions) {
	var mm [][]U64
	for _, l := range o.MM {
		mm = append(mm, u64s(l))
	}
	st := Step{Op: OpQuery, Note: note, Kind: abi.QueryTokensWith, Tokens: tokens, BlockSize: int64(bs), Salt: U64(salt), MM: mm, Eagle: o.Eagle}
	if bs <= 0 {
		st.Want = Want{Code: int32(abi.ErrInvalidQuery)}
		b.step(st)
		return
	}
	st.Want = b.queryWant(ckf.AppendSequenceHashes(nil, localsWith(tokens, salt, o)))
	b.step(st)
}

func genTokenOptions() Scenario {
	b := newBuilder("token_options", "query by tokens with a cache namespace (salt), per-block multimodal hashes and Eagle windows (kind 3)", 0, 1)
	s0, s1 := newSource(0, 21), newSource(1, 22)
	tenant := ckf.Salt("", "tenant-a")
	reqM := request(4242, 5)
	images := ckf.HashOptions{MM: [][]uint64{nil, {0xfeedface, 0x1234}, nil, {0xabcdef0123456789}}}
	s0.storeWith(reqM, tenant, images)
	s1.store(reqM) // the same tokens, base model, no images
	reqE := request(777, 4)
	reqE = append(reqE, 99) // an Eagle window reaches one token past its block
	eagle := ckf.HashOptions{Eagle: true}
	s1.storeWith(reqE, ckf.BaseSalt, eagle)

	b.queryWith("before any lane is ready", reqM, genBlockSize, tenant, images)
	b.assign("lane 0", s0.id, lease(0, 1), abi.OK)
	b.assign("lane 1", s1.id, lease(1, 1), abi.OK)
	b.snapshot("lane 0 snapshot", s0.subscribe(lease(0, 1)))
	b.snapshot("lane 1 snapshot", s1.subscribe(lease(1, 1)))

	b.queryWith("tenant, the stored images", reqM, genBlockSize, tenant, images)
	swapped := ckf.HashOptions{MM: [][]uint64{nil, {0x1234, 0xfeedface}, nil, {0xabcdef0123456789}}}
	b.queryWith("tenant, a block's images in another order (sorted before hashing)", reqM, genBlockSize, tenant, swapped)
	extra := ckf.HashOptions{MM: append(append([][]uint64(nil), images.MM...), nil, nil, []uint64{7})}
	b.queryWith("tenant, lists past the last block (ignored)", reqM, genBlockSize, tenant, extra)
	b.queryWith("tenant, no images", reqM, genBlockSize, tenant, ckf.HashOptions{})
	b.step(Step{Op: OpQuery, Note: "tenant, kind 2 (no options)", Kind: abi.QueryTokens, Tokens: reqM, BlockSize: genBlockSize,
		Salt: U64(tenant), Want: b.queryWant(ckf.AppendSequenceHashes(nil, localsWith(reqM, tenant, ckf.HashOptions{})))})
	other := ckf.HashOptions{MM: [][]uint64{nil, {0xfeedface, 0x1234}, nil, {0xabcdef0123456788}}}
	b.queryWith("tenant, another image in block 3", reqM, genBlockSize, tenant, other)
	b.queryWith("base model, the stored images", reqM, genBlockSize, ckf.BaseSalt, images)
	b.queryWith("another namespace, the stored images", reqM, genBlockSize, ckf.Salt("", "tenant-b"), images)
	b.queryWith("Eagle windows", reqE, genBlockSize, ckf.BaseSalt, eagle)
	b.queryWith("Eagle windows, the last window one token short", reqE[:len(reqE)-1], genBlockSize, ckf.BaseSalt, eagle)
	b.queryWith("the Eagle request without Eagle windows", reqE, genBlockSize, ckf.BaseSalt, ckf.HashOptions{})
	b.queryWith("Eagle windows and images", reqE, genBlockSize, ckf.BaseSalt, ckf.HashOptions{Eagle: true, MM: [][]uint64{nil, {5}}})
	b.queryWith("empty request", nil, genBlockSize, tenant, images)
	b.queryWith("block size 0", reqM, 0, tenant, images)
	b.queryWith("block size -1", reqM, -1, tenant, eagle)
	b.words(0)
	b.words(1)
	return b.s
}
