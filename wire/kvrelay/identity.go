package kvrelay

import (
	"errors"
	"fmt"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/wire/kvrelay/kvrelaypb"
)

// PoolIdentityVersion is KvPoolId.identity_version: the composition of cache
// semantics, routing scope and dc_id that v1 defines (Dynamo's
// POOL_IDENTITY_VERSION).
const PoolIdentityVersion = 1

// Identity conversion errors. The contract tells malformed known data
// (a server answers INVALID_REQUEST; a client quarantines the entry) from
// values this version does not support (UNSUPPORTED_FEATURE; a client
// quarantines the pool and never falls back to a default).
var (
	ErrMalformedIdentity   = errors.New("kvrelay: malformed producer identity")
	ErrUnsupportedIdentity = errors.New("kvrelay: unsupported producer identity")
)

// ProducerToWire returns id as the contract's ProducerIdentity, the
// subscription key. ckf's digest sources map to IdentitySource as 0
// (default-derived) → DEFAULT_DERIVED and 1 (explicit) → EXPLICIT.
func ProducerToWire(id ckf.ProducerIdentity) *kvrelaypb.ProducerIdentity {
	f := id.Format
	return &kvrelaypb.ProducerIdentity{
		PoolId: &kvrelaypb.KvPoolId{IdentityVersion: PoolIdentityVersion, DcId: id.Pool.DCID,
			IndexerDomain: &kvrelaypb.IndexerDomainId{
				CacheSemantics: digestToWire(id.Pool.Domain.CacheSemantics),
				RoutingScope:   digestToWire(id.Pool.Domain.RoutingScope)}},
		ProducerIncarnation: id.ProducerIncarnation,
		LayoutGeneration:    id.LayoutGeneration,
		CkfFormat: &kvrelaypb.CkfFormat{FormatVersion: uint32(f.Version), Seed: f.Seed, BucketCount: f.BucketCount,
			FingerprintBits: uint32(f.FingerprintBits), SlotsPerBucket: uint32(f.SlotsPerBucket)},
	}
}

func digestToWire(d ckf.ScopedDigest) *kvrelaypb.DigestIdentity {
	src := kvrelaypb.IdentitySource_IDENTITY_SOURCE_DEFAULT_DERIVED
	if d.Source == ckf.DigestExplicit {
		src = kvrelaypb.IdentitySource_IDENTITY_SOURCE_EXPLICIT
	}
	return &kvrelaypb.DigestIdentity{Digest: append([]byte(nil), d.Digest[:]...), Source: src}
}

// ProducerFromWire converts and validates a ProducerIdentity, every field of
// the frozen key, so that == on the result is the contract's key equality.
// Missing messages, an UNSPECIFIED identity source, identity_version 0, a
// digest that is not 16 bytes or layout_generation 0 are [ErrMalformedIdentity]; an identity source
// or identity_version this version does not know, or a CKF format ckf does
// not implement (version, fingerprint bits, slots, bucket count), is
// [ErrUnsupportedIdentity].
func ProducerFromWire(p *kvrelaypb.ProducerIdentity) (ckf.ProducerIdentity, error) {
	if p == nil {
		return ckf.ProducerIdentity{}, fmt.Errorf("%w: missing", ErrMalformedIdentity)
	}
	pid := p.GetPoolId()
	switch {
	case pid == nil:
		return ckf.ProducerIdentity{}, fmt.Errorf("%w: pool_id missing", ErrMalformedIdentity)
	case pid.GetIdentityVersion() == 0:
		return ckf.ProducerIdentity{}, fmt.Errorf("%w: pool_id.identity_version unset", ErrMalformedIdentity)
	case pid.GetIdentityVersion() != PoolIdentityVersion:
		return ckf.ProducerIdentity{}, fmt.Errorf("%w: pool_id.identity_version %d, this version knows %d",
			ErrUnsupportedIdentity, pid.GetIdentityVersion(), PoolIdentityVersion)
	case pid.GetIndexerDomain() == nil:
		return ckf.ProducerIdentity{}, fmt.Errorf("%w: pool_id.indexer_domain missing", ErrMalformedIdentity)
	}
	cache, err := digestFromWire("cache_semantics", pid.GetIndexerDomain().GetCacheSemantics())
	if err != nil {
		return ckf.ProducerIdentity{}, err
	}
	routing, err := digestFromWire("routing_scope", pid.GetIndexerDomain().GetRoutingScope())
	if err != nil {
		return ckf.ProducerIdentity{}, err
	}
	if p.GetLayoutGeneration() == 0 {
		// Dynamo wire/identity.rs (7216a153) ZeroLayoutGeneration, checked
		// between the pool id and the CKF format as there.
		return ckf.ProducerIdentity{}, fmt.Errorf("%w: layout_generation 0", ErrMalformedIdentity)
	}
	f := p.GetCkfFormat()
	if f == nil {
		return ckf.ProducerIdentity{}, fmt.Errorf("%w: ckf_format missing", ErrMalformedIdentity)
	}
	if f.GetFormatVersion() > 255 || f.GetFingerprintBits() > 255 || f.GetSlotsPerBucket() > 255 {
		return ckf.ProducerIdentity{}, fmt.Errorf("%w: ckf_format %+v", ErrUnsupportedIdentity, f)
	}
	format := ckf.Format{Version: uint8(f.GetFormatVersion()), Seed: f.GetSeed(), BucketCount: f.GetBucketCount(),
		FingerprintBits: uint8(f.GetFingerprintBits()), SlotsPerBucket: uint8(f.GetSlotsPerBucket())}
	if err := format.Validate(); err != nil {
		return ckf.ProducerIdentity{}, fmt.Errorf("%w: ckf_format: %v", ErrUnsupportedIdentity, err)
	}
	return ckf.ProducerIdentity{
		Pool:                ckf.PoolID{Domain: ckf.Domain{CacheSemantics: cache, RoutingScope: routing}, DCID: pid.GetDcId()},
		ProducerIncarnation: p.GetProducerIncarnation(),
		LayoutGeneration:    p.GetLayoutGeneration(),
		Format:              format,
	}, nil
}

func digestFromWire(field string, d *kvrelaypb.DigestIdentity) (ckf.ScopedDigest, error) {
	var out ckf.ScopedDigest
	if d == nil {
		return out, fmt.Errorf("%w: %s missing", ErrMalformedIdentity, field)
	}
	if len(d.GetDigest()) != len(out.Digest) {
		return out, fmt.Errorf("%w: %s digest of %d bytes, want %d", ErrMalformedIdentity, field, len(d.GetDigest()), len(out.Digest))
	}
	copy(out.Digest[:], d.GetDigest())
	switch d.GetSource() {
	case kvrelaypb.IdentitySource_IDENTITY_SOURCE_DEFAULT_DERIVED:
		out.Source = ckf.DigestDefaultDerived
	case kvrelaypb.IdentitySource_IDENTITY_SOURCE_EXPLICIT:
		out.Source = ckf.DigestExplicit
	case kvrelaypb.IdentitySource_IDENTITY_SOURCE_UNSPECIFIED:
		return out, fmt.Errorf("%w: %s source unspecified", ErrMalformedIdentity, field)
	default:
		return out, fmt.Errorf("%w: %s source %d", ErrUnsupportedIdentity, field, int32(d.GetSource()))
	}
	return out, nil
}
