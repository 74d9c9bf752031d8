package grpcserver

import (
	"errors"
	"fmt"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/wire/kvrelay/kvrelaypb"
)

// PoolIdentityVersion is KvPoolId.identity_version: the composition of cache
// semantics, routing scope and dc_id (Dynamo's POOL_IDENTITY_VERSION, 1).
const PoolIdentityVersion = 1

// Identity errors of a request's expected_producer: malformed known data
// (INVALID_REQUEST) or values this version does not support
// (UNSUPPORTED_FEATURE).
var (
	errMalformedIdentity   = errors.New("malformed producer identity")
	errUnsupportedIdentity = errors.New("unsupported producer identity")
)

// sourceToWire maps ckf's digest sources (0 default-derived, 1 explicit) to
// the contract's IdentitySource (1, 2; 0 is UNSPECIFIED).
func sourceToWire(s ckf.DigestSource) kvrelaypb.IdentitySource {
	if s == ckf.DigestExplicit {
		return kvrelaypb.IdentitySource_IDENTITY_SOURCE_EXPLICIT
	}
	return kvrelaypb.IdentitySource_IDENTITY_SOURCE_DEFAULT_DERIVED
}

func digestToWire(d ckf.ScopedDigest) *kvrelaypb.DigestIdentity {
	return &kvrelaypb.DigestIdentity{Digest: append([]byte(nil), d.Digest[:]...), Source: sourceToWire(d.Source)}
}

// poolIDToWire is a pool's KvPoolId.
func poolIDToWire(p ckf.PoolID) *kvrelaypb.KvPoolId {
	return &kvrelaypb.KvPoolId{IdentityVersion: PoolIdentityVersion, DcId: p.DCID,
		IndexerDomain: &kvrelaypb.IndexerDomainId{CacheSemantics: digestToWire(p.Domain.CacheSemantics),
			RoutingScope: digestToWire(p.Domain.RoutingScope)}}
}

// producerToWire is a producer identity's ProducerIdentity, the
// subscription key.
func producerToWire(id ckf.ProducerIdentity) *kvrelaypb.ProducerIdentity {
	f := id.Format
	return &kvrelaypb.ProducerIdentity{PoolId: poolIDToWire(id.Pool), ProducerIncarnation: id.ProducerIncarnation,
		LayoutGeneration: id.LayoutGeneration,
		CkfFormat: &kvrelaypb.CkfFormat{FormatVersion: uint32(f.Version), Seed: f.Seed, BucketCount: f.BucketCount,
			FingerprintBits: uint32(f.FingerprintBits), SlotsPerBucket: uint32(f.SlotsPerBucket)}}
}

// sourceFromWire: UNSPECIFIED is malformed, a value this version does not
// know is unsupported.
func sourceFromWire(field string, s kvrelaypb.IdentitySource) (ckf.DigestSource, error) {
	switch s {
	case kvrelaypb.IdentitySource_IDENTITY_SOURCE_DEFAULT_DERIVED:
		return ckf.DigestDefaultDerived, nil
	case kvrelaypb.IdentitySource_IDENTITY_SOURCE_EXPLICIT:
		return ckf.DigestExplicit, nil
	case kvrelaypb.IdentitySource_IDENTITY_SOURCE_UNSPECIFIED:
		return 0, fmt.Errorf("%w: %s source unspecified", errMalformedIdentity, field)
	}
	return 0, fmt.Errorf("%w: %s source %d", errUnsupportedIdentity, field, int32(s))
}

func digestFromWire(field string, d *kvrelaypb.DigestIdentity) (ckf.ScopedDigest, error) {
	if d == nil {
		return ckf.ScopedDigest{}, fmt.Errorf("%w: %s missing", errMalformedIdentity, field)
	}
	var out ckf.ScopedDigest
	if len(d.GetDigest()) != len(out.Digest) {
		return out, fmt.Errorf("%w: %s digest of %d bytes, want %d", errMalformedIdentity, field, len(d.GetDigest()), len(out.Digest))
	}
	copy(out.Digest[:], d.GetDigest())
	src, err := sourceFromWire(field, d.GetSource())
	out.Source = src
	return out, err
}

// poolIDFromWire converts and validates a KvPoolId.
func poolIDFromWire(p *kvrelaypb.KvPoolId) (ckf.PoolID, error) {
	switch {
	case p == nil:
		return ckf.PoolID{}, fmt.Errorf("%w: pool_id missing", errMalformedIdentity)
	case p.GetIdentityVersion() == 0:
		return ckf.PoolID{}, fmt.Errorf("%w: identity_version unset", errMalformedIdentity)
	case p.GetIdentityVersion() != PoolIdentityVersion:
		return ckf.PoolID{}, fmt.Errorf("%w: identity_version %d, this relay has %d", errUnsupportedIdentity, p.GetIdentityVersion(), PoolIdentityVersion)
	case p.GetIndexerDomain() == nil:
		return ckf.PoolID{}, fmt.Errorf("%w: indexer_domain missing", errMalformedIdentity)
	}
	cache, err := digestFromWire("cache_semantics", p.GetIndexerDomain().GetCacheSemantics())
	if err != nil {
		return ckf.PoolID{}, err
	}
	routing, err := digestFromWire("routing_scope", p.GetIndexerDomain().GetRoutingScope())
	if err != nil {
		return ckf.PoolID{}, err
	}
	return ckf.PoolID{Domain: ckf.Domain{CacheSemantics: cache, RoutingScope: routing}, DCID: p.GetDcId()}, nil
}

// producerFromWire converts and validates a ProducerIdentity: every field of
// the frozen key, so that == on the result is the contract's key equality.
// A format field outside ckf's range cannot equal any identity this relay
// publishes; it is reported unsupported.
func producerFromWire(p *kvrelaypb.ProducerIdentity) (ckf.ProducerIdentity, error) {
	if p == nil {
		return ckf.ProducerIdentity{}, fmt.Errorf("%w: expected_producer missing", errMalformedIdentity)
	}
	pool, err := poolIDFromWire(p.GetPoolId())
	if err != nil {
		return ckf.ProducerIdentity{}, err
	}
	f := p.GetCkfFormat()
	if f == nil {
		return ckf.ProducerIdentity{}, fmt.Errorf("%w: ckf_format missing", errMalformedIdentity)
	}
	if f.GetFormatVersion() != uint32(ckf.FormatVersion) || f.GetFingerprintBits() > 255 || f.GetSlotsPerBucket() > 255 {
		return ckf.ProducerIdentity{}, fmt.Errorf("%w: ckf_format version %d, %d fingerprint bits, %d slots per bucket",
			errUnsupportedIdentity, f.GetFormatVersion(), f.GetFingerprintBits(), f.GetSlotsPerBucket())
	}
	return ckf.ProducerIdentity{Pool: pool, ProducerIncarnation: p.GetProducerIncarnation(), LayoutGeneration: p.GetLayoutGeneration(),
		Format: ckf.Format{Version: uint8(f.GetFormatVersion()), Seed: f.GetSeed(), BucketCount: f.GetBucketCount(),
			FingerprintBits: uint8(f.GetFingerprintBits()), SlotsPerBucket: uint8(f.GetSlotsPerBucket())}}, nil
}
