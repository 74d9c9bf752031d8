package kvrelay_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/wire/kvrelay"
	"github.com/ckfrelay/ckfrelay/wire/kvrelay/kvrelaypb"
)

func sampleIdentity() ckf.ProducerIdentity {
	id := ckf.ProducerIdentity{ProducerIncarnation: 7, LayoutGeneration: 3, Format: ckf.NewFormat(0x5EED, 1024)}
	id.Pool.DCID = 9
	id.Pool.Domain.CacheSemantics = ckf.ScopedDigest{Digest: [16]byte{1, 2, 3}, Source: ckf.DigestExplicit}
	id.Pool.Domain.RoutingScope = ckf.ScopedDigest{Digest: [16]byte{15: 0xff}, Source: ckf.DigestDefaultDerived}
	return id
}

func TestProducer_RoundTrip(t *testing.T) {
	id := sampleIdentity()
	p := kvrelay.ProducerToWire(id)
	assert.Equal(t, uint32(kvrelay.PoolIdentityVersion), p.GetPoolId().GetIdentityVersion())
	assert.Equal(t, kvrelaypb.IdentitySource_IDENTITY_SOURCE_EXPLICIT, p.GetPoolId().GetIndexerDomain().GetCacheSemantics().GetSource())
	assert.Equal(t, kvrelaypb.IdentitySource_IDENTITY_SOURCE_DEFAULT_DERIVED, p.GetPoolId().GetIndexerDomain().GetRoutingScope().GetSource())
	got, err := kvrelay.ProducerFromWire(p)
	require.NoError(t, err)
	assert.Equal(t, id, got)
}

func TestProducerFromWire_Rejects(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(p *kvrelaypb.ProducerIdentity)
		want   error
	}{
		{"no pool_id", func(p *kvrelaypb.ProducerIdentity) { p.PoolId = nil }, kvrelay.ErrMalformedIdentity},
		{"identity_version 0", func(p *kvrelaypb.ProducerIdentity) { p.PoolId.IdentityVersion = 0 }, kvrelay.ErrMalformedIdentity},
		{"identity_version 2", func(p *kvrelaypb.ProducerIdentity) { p.PoolId.IdentityVersion = 2 }, kvrelay.ErrUnsupportedIdentity},
		{"no domain", func(p *kvrelaypb.ProducerIdentity) { p.PoolId.IndexerDomain = nil }, kvrelay.ErrMalformedIdentity},
		{"no cache digest", func(p *kvrelaypb.ProducerIdentity) { p.PoolId.IndexerDomain.CacheSemantics = nil }, kvrelay.ErrMalformedIdentity},
		{"short digest", func(p *kvrelaypb.ProducerIdentity) { p.PoolId.IndexerDomain.RoutingScope.Digest = []byte{1} }, kvrelay.ErrMalformedIdentity},
		{"source unspecified", func(p *kvrelaypb.ProducerIdentity) {
			p.PoolId.IndexerDomain.RoutingScope.Source = kvrelaypb.IdentitySource_IDENTITY_SOURCE_UNSPECIFIED
		}, kvrelay.ErrMalformedIdentity},
		{"source unknown", func(p *kvrelaypb.ProducerIdentity) { p.PoolId.IndexerDomain.CacheSemantics.Source = 3 }, kvrelay.ErrUnsupportedIdentity},
		// Dynamo wire/identity.rs (7216a153) ZeroLayoutGeneration: malformed, checked
		// after the pool id and before the CKF format.
		{"layout_generation 0", func(p *kvrelaypb.ProducerIdentity) { p.LayoutGeneration = 0 }, kvrelay.ErrMalformedIdentity},
		{"layout_generation 0 and an unknown format", func(p *kvrelaypb.ProducerIdentity) {
			p.LayoutGeneration, p.CkfFormat.FormatVersion = 0, 2
		}, kvrelay.ErrMalformedIdentity},
		{"no format", func(p *kvrelaypb.ProducerIdentity) { p.CkfFormat = nil }, kvrelay.ErrMalformedIdentity},
		{"format version 2", func(p *kvrelaypb.ProducerIdentity) { p.CkfFormat.FormatVersion = 2 }, kvrelay.ErrUnsupportedIdentity},
		{"format version 257", func(p *kvrelaypb.ProducerIdentity) { p.CkfFormat.FormatVersion = 257 }, kvrelay.ErrUnsupportedIdentity},
		{"8-bit fingerprints", func(p *kvrelaypb.ProducerIdentity) { p.CkfFormat.FingerprintBits = 8 }, kvrelay.ErrUnsupportedIdentity},
		{"2 slots", func(p *kvrelaypb.ProducerIdentity) { p.CkfFormat.SlotsPerBucket = 2 }, kvrelay.ErrUnsupportedIdentity},
		{"1000 buckets", func(p *kvrelaypb.ProducerIdentity) { p.CkfFormat.BucketCount = 1000 }, kvrelay.ErrUnsupportedIdentity},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := kvrelay.ProducerToWire(sampleIdentity())
			c.mutate(p)
			_, err := kvrelay.ProducerFromWire(p)
			require.ErrorIs(t, err, c.want)
		})
	}
	_, err := kvrelay.ProducerFromWire(nil)
	require.ErrorIs(t, err, kvrelay.ErrMalformedIdentity)
	// Equality of converted identities is the key's equality.
	a, b := kvrelay.ProducerToWire(sampleIdentity()), kvrelay.ProducerToWire(sampleIdentity())
	b.LayoutGeneration++
	ia, _ := kvrelay.ProducerFromWire(a)
	ib, _ := kvrelay.ProducerFromWire(b)
	assert.NotEqual(t, ia, ib)
	assert.False(t, proto.Equal(a, b))
}
