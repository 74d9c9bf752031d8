package conformance

import (
	"fmt"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/consumer"
	"github.com/ckfrelay/ckfrelay/producer"
	"github.com/ckfrelay/ckfrelay/wire"
)

// Fixture is a set of real producers, one per lane, sharing one format, and
// the manifest of a consumer that serves them all: frames for tests, fuzzing
// and benchmarks outside this package. It is not safe for concurrent use.
type Fixture struct {
	Manifest consumer.Manifest
	src      [ckf.MaxLanes]*source
}

// NewFixture builds producers for lanes 0..lanes-1 of pools sized for
// expectedBlocks (SPEC §2.1 sizing decides bucket_count).
func NewFixture(expectedBlocks uint64, lanes int) (*Fixture, error) {
	cfg := ckf.DefaultConfig()
	cfg.ExpectedBlocks = expectedBlocks
	f := &Fixture{}
	for l := range lanes {
		p, err := ckf.NewPool(cfg)
		if err != nil {
			return nil, err
		}
		id := ckf.ProducerIdentity{Pool: genPool(l), ProducerIncarnation: 1, LayoutGeneration: 1, Format: p.Format()}
		s := &source{pool: p, sink: &collector{}, id: id, worker: uint64(l + 1)}
		s.pub = producer.NewPublisher(id, 0, s.sink)
		f.src[l] = s
		pool := genPool(l)
		f.Manifest.Lanes[l] = &pool
		f.Manifest.Format = p.Format()
	}
	f.Manifest.ConsumerInstance = genInstance
	f.Manifest.Domain = genDomain
	f.Manifest.VerificationWindow = consumer.DefaultVerificationWindow
	return f, nil
}

// Identity returns lane's producer identity.
func (f *Fixture) Identity(lane int) ckf.ProducerIdentity { return f.src[lane].id }

// Lease returns the lease of lane at epoch for the fixture's consumer.
func (f *Fixture) Lease(lane int, epoch uint64) ckf.LaneLease { return lease(lane, epoch) }

// Store stores tokens (blocks of blockSize) as one root Stored event on lane's
// pool, publishes, and returns the canonical sequence hashes.
func (f *Fixture) Store(lane int, tokens []uint32, blockSize int) []uint64 {
	s := f.src[lane]
	locals := ckf.AppendLocalBlockHashes(nil, tokens, blockSize, ckf.BaseSalt)
	ev := ckf.RouterEvent{WorkerID: s.worker, EventID: s.nextID, Kind: ckf.EventStored}
	s.nextID++
	for i, l := range locals {
		ev.Blocks = append(ev.Blocks, ckf.StoredBlock{BlockHash: l ^ uint64(i+1)<<56, TokensHash: l})
	}
	out := s.pool.ApplyEvent(&ev)
	if out.Batch != nil {
		_, _ = s.pub.Publish(out.Batch)
	}
	return ckf.AppendSequenceHashes(nil, locals)
}

// StoreKeys inserts canonical keys directly, as roots of one event each
// block (fast bulk fill for benchmarks); it publishes nothing that is not
// taken by the next Deltas call.
func (f *Fixture) StoreKeys(lane int, keys []uint64) {
	s := f.src[lane]
	ev := ckf.RouterEvent{WorkerID: s.worker, Kind: ckf.EventStored, Blocks: make([]ckf.StoredBlock, 1)}
	for _, k := range keys {
		ev.EventID = s.nextID
		s.nextID++
		ev.Blocks[0] = ckf.StoredBlock{BlockHash: k, TokensHash: k}
		out := s.pool.ApplyEvent(&ev)
		if out.Batch != nil {
			_, _ = s.pub.Publish(out.Batch)
		}
	}
}

// Subscribe cuts a barrier snapshot of lane for lease and returns it as
// encoded frame bodies, chunked to fit maxFrameBytes (≤ 0: the wire default).
func (f *Fixture) Subscribe(lane int, l ckf.LaneLease, maxFrameBytes int) ([][]byte, error) {
	snap := f.src[lane].subscribe(l)
	chunks, err := wire.SplitSnapshot(&snap, maxFrameBytes)
	if err != nil {
		return nil, err
	}
	out := make([][]byte, 0, len(chunks))
	for i := range chunks {
		b, err := wire.AppendFrame(nil, &wire.Frame{Kind: wire.KindSnapshotChunk, Snapshot: chunks[i]})
		if err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, nil
}

// Deltas returns lane's deltas published since the last call, decoded and
// as encoded frame bodies.
func (f *Fixture) Deltas(lane int) ([]ckf.Delta, [][]byte) {
	ds := f.src[lane].take()
	out := make([][]byte, len(ds))
	for i := range ds {
		out[i] = deltaFrame(&ds[i])
	}
	return ds, out
}

// Words returns a copy of lane's producer table.
func (f *Fixture) Words(lane int) []uint64 { return f.src[lane].pool.Words() }

// DrainFrame returns the encoded exact drain marker of lane's stream.
func (f *Fixture) DrainFrame(lane int) ([]byte, error) {
	dm, ok := f.src[lane].pub.ExactDrainMarker()
	if !ok {
		return nil, fmt.Errorf("conformance: lane %d has no lease", lane)
	}
	return wire.AppendFrame(nil, &wire.Frame{Kind: wire.KindDrainMarker, Drain: dm})
}
