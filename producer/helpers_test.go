package producer

import (
	"testing"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/stretchr/testify/require"
)

func testScope() Scope {
	dom := ckf.Domain{
		CacheSemantics: ckf.ScopedDigest{Digest: [16]byte{1}, Source: ckf.DigestExplicit},
		RoutingScope:   ckf.ScopedDigest{Digest: [16]byte{3}, Source: ckf.DigestExplicit},
	}
	return Scope{Pool: ckf.PoolID{Domain: dom, DCID: 2}, ProducerIncarnation: 4, LayoutGeneration: 1}
}

func testLease(epoch uint64) ckf.LaneLease {
	return ckf.LaneLease{ConsumerInstance: 5, PhysicalLane: 0, AssignmentEpoch: epoch}
}

// newTestPool returns a pool sized for expected blocks with the given cadence.
func newTestPool(t testing.TB, expected, cadence uint64) *ckf.Pool {
	t.Helper()
	cfg := ckf.DefaultConfig()
	cfg.ExpectedBlocks = expected
	cfg.PublishEveryNEvents = cadence
	p, err := ckf.NewPool(cfg)
	require.NoError(t, err, "NewPool")
	return p
}

var worker1 = ckf.Member{WorkerID: 1}

// stored returns a root Stored event whose external hashes equal the token
// hashes, the shape the seed's tests use.
func stored(m ckf.Member, eventID uint64, hashes ...uint64) ckf.RouterEvent {
	ev := ckf.RouterEvent{WorkerID: m.WorkerID, DPRank: m.DPRank, EventID: eventID, Kind: ckf.EventStored}
	for _, h := range hashes {
		ev.Blocks = append(ev.Blocks, ckf.StoredBlock{BlockHash: h, TokensHash: h})
	}
	return ev
}

func removed(m ckf.Member, eventID uint64, hashes ...uint64) ckf.RouterEvent {
	return ckf.RouterEvent{WorkerID: m.WorkerID, DPRank: m.DPRank, EventID: eventID, Kind: ckf.EventRemoved, BlockHashes: hashes}
}

// recordingSink records deltas and fails while fail is set.
type recordingSink struct {
	deltas []ckf.Delta
	fail   error
}

func (s *recordingSink) Enqueue(d ckf.Delta) error {
	if s.fail != nil {
		return s.fail
	}
	s.deltas = append(s.deltas, d)
	return nil
}

var _ Sink = (*recordingSink)(nil)

// applyBatch applies ev to pool and returns the batch it drained, failing the
// test when none was drained.
func applyBatch(t *testing.T, pool *ckf.Pool, ev ckf.RouterEvent) *ckf.Batch {
	t.Helper()
	out := pool.ApplyEvent(&ev)
	require.NoError(t, out.FirstError, "ApplyEvent")
	require.NotNil(t, out.Batch, "ApplyEvent drained no batch")
	return out.Batch
}
