package consumer

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
)

const (
	testInstance = 77
	testSeed     = 0x5DEECE66D1B54A33
	testBuckets  = 64
)

var testDomain = ckf.Domain{
	CacheSemantics: ckf.ScopedDigest{Digest: [16]byte{1, 2, 3}, Source: ckf.DigestExplicit},
	RoutingScope:   ckf.ScopedDigest{Digest: [16]byte{9, 8, 7}, Source: ckf.DigestDefaultDerived},
}

func testPool(dc uint64) ckf.PoolID { return ckf.PoolID{Domain: testDomain, DCID: dc} }

// testManifest configures lanes 0..nLanes-1 with pools dc=100+lane.
func testManifest(nLanes int, buckets uint64) Manifest {
	m := Manifest{
		ConsumerInstance:   testInstance,
		Domain:             testDomain,
		Format:             ckf.NewFormat(testSeed, buckets),
		VerificationWindow: DefaultVerificationWindow,
	}
	for i := range nLanes {
		p := testPool(100 + uint64(i))
		m.Lanes[i] = &p
	}
	return m
}

func testIdentity(lane int, buckets uint64) ckf.ProducerIdentity {
	return ckf.ProducerIdentity{
		Pool:                testPool(100 + uint64(lane)),
		ProducerIncarnation: 5,
		LayoutGeneration:    1,
		Format:              ckf.NewFormat(testSeed, buckets),
	}
}

func testLease(lane int, epoch uint64) ckf.LaneLease {
	return ckf.LaneLease{ConsumerInstance: testInstance, PhysicalLane: uint8(lane), AssignmentEpoch: epoch}
}

// testWords returns n non-zero pseudo-random words derived from seed.
func testWords(seed uint64, n uint64) []uint64 {
	r := ckf.NewRNG(seed)
	w := make([]uint64, n)
	for i := range w {
		w[i] = r.Next() | 1
	}
	return w
}

// fixture is a consumer with three configured lanes of testBuckets buckets.
type fixture struct {
	t *testing.T
	c *Consumer
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	c, err := New(testManifest(3, testBuckets))
	require.NoError(t, err, "New")
	return &fixture{t: t, c: c}
}

func (f *fixture) assign(lane int, epoch uint64) ckf.LaneLease {
	f.t.Helper()
	l := testLease(lane, epoch)
	require.NoError(f.t, f.c.Assign(testIdentity(lane, testBuckets), l), "Assign(lane %d, epoch %d)", lane, epoch)
	return l
}

func (f *fixture) snapshot(lane int, lease ckf.LaneLease, seq uint64, words []uint64) *ckf.Snapshot {
	return &ckf.Snapshot{Identity: testIdentity(lane, testBuckets), Lease: lease, Sequence: seq, Words: words}
}

func (f *fixture) delta(lane int, lease ckf.LaneLease, base, seq uint64, images ...ckf.BucketImage) *ckf.Delta {
	return &ckf.Delta{Identity: testIdentity(lane, testBuckets), Lease: lease, BaseSequence: base, Sequence: seq, Images: images}
}

// ready assigns lane at epoch and installs a snapshot at seq.
func (f *fixture) ready(lane int, epoch, seq uint64) ckf.LaneLease {
	f.t.Helper()
	l := f.assign(lane, epoch)
	f.want(f.c.InstallSnapshot(f.snapshot(lane, l, seq, testWords(uint64(lane)*1000+seq, testBuckets))), SnapshotInstalled, NoFault)
	return l
}

func (f *fixture) want(r Result, o Outcome, fault Fault) {
	f.t.Helper()
	require.Equal(f.t, o, r.Outcome, "outcome of %v", r)
	require.Equal(f.t, fault, r.Fault, "fault of %v", r)
}

func (f *fixture) status(lane int) LaneStatus {
	f.t.Helper()
	s, err := f.c.LaneStatus(lane)
	require.NoError(f.t, err, "LaneStatus(%d)", lane)
	return s
}

func (f *fixture) table() []uint64 { return slices.Clone(f.c.words) }

func (f *fixture) wantTable(before []uint64) {
	f.t.Helper()
	require.True(f.t, slices.Equal(before, f.c.words), "table changed, want it untouched")
}
