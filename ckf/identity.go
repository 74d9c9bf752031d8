package ckf

import (
	"encoding/hex"
	"fmt"
)

// MaxLanes is the number of consumer lanes (data centers) one router tracks.
const MaxLanes = 16

// DigestSource says where a domain digest came from. Its numeric values are
// exchanged on the wire and must not change.
type DigestSource uint8

// Digest sources.
const (
	DigestDefaultDerived DigestSource = 0
	DigestExplicit       DigestSource = 1
)

func (s DigestSource) String() string {
	switch s {
	case DigestDefaultDerived:
		return "default_derived"
	case DigestExplicit:
		return "explicit"
	}
	return fmt.Sprintf("DigestSource(%d)", s)
}

// ScopedDigest is a 16-byte digest and its source. Equality includes the source.
type ScopedDigest struct {
	Digest [16]byte
	Source DigestSource
}

// ParseScopedDigest parses a digest as relay catalogs spell it: 32 hex
// digits and the source's name ("default_derived" or "explicit").
func ParseScopedDigest(hexDigest, source string) (ScopedDigest, error) {
	var d ScopedDigest
	b, err := hex.DecodeString(hexDigest)
	if err != nil || len(b) != len(d.Digest) {
		return d, fmt.Errorf("digest %q is not %d hex digits", hexDigest, 2*len(d.Digest))
	}
	copy(d.Digest[:], b)
	switch source {
	case DigestDefaultDerived.String():
		d.Source = DigestDefaultDerived
	case DigestExplicit.String():
		d.Source = DigestExplicit
	default:
		return d, fmt.Errorf("digest source %q", source)
	}
	return d, nil
}

// Domain is the routing domain pools are compared in: which cache semantics
// (model, tokenizer, block size) and which routing scope they belong to.
type Domain struct {
	CacheSemantics ScopedDigest
	RoutingScope   ScopedDigest
}

// PoolID names one pool (one data center) inside a domain.
type PoolID struct {
	Domain Domain
	DCID   uint64
}

// ProducerIdentity identifies one incarnation of one pool's producer and the
// format it publishes. Identities are compared only for full equality (==).
type ProducerIdentity struct {
	Pool                PoolID
	ProducerIncarnation uint64
	LayoutGeneration    uint64
	Format              Format
}

// LaneLease grants one consumer lane to one stream. Leases are equal only when
// all three fields are equal.
type LaneLease struct {
	ConsumerInstance uint64
	PhysicalLane     uint8 // 0..15
	AssignmentEpoch  uint64
}

// DrainMarker asserts that the stream under Lease ended at ExpectedSequence.
type DrainMarker struct {
	Lease            LaneLease
	ExpectedSequence uint64
}

// BucketImage is the absolute value of one bucket after a publication.
type BucketImage struct {
	Bucket uint32
	Word   uint64
}

// Delta is one sequenced publication: the images take a consumer from
// BaseSequence to Sequence (= BaseSequence+1).
type Delta struct {
	Identity     ProducerIdentity
	Lease        LaneLease
	BaseSequence uint64
	Sequence     uint64
	Images       []BucketImage
}

// Snapshot is a full table at Sequence; the first delta after it has base Sequence.
type Snapshot struct {
	Identity ProducerIdentity
	Lease    LaneLease
	Sequence uint64
	Words    []uint64
}
