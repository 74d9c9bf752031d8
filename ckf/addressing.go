package ckf

import (
	"encoding/binary"

	"github.com/zeebo/xxh3"
)

// altSeedMix is XORed into the seed for the alternate-bucket displacement hash.
const altSeedMix uint64 = 0x9E3779B97F4A7C15

// Addresser maps 64-bit keys to a fingerprint and two candidate buckets
// (SPEC §2.2). It is an immutable value, safe to share. The zero value is not
// usable; build one with [NewAddresser].
type Addresser struct {
	seed    uint64
	altSeed uint64
	mask    uint64
}

// NewAddresser returns the addressing of a table with bucketCount buckets
// (a power of two ≥ 2, not checked here) keyed by seed.
func NewAddresser(seed, bucketCount uint64) Addresser {
	return Addresser{seed: seed, altSeed: seed ^ altSeedMix, mask: bucketCount - 1}
}

// Address is the placement of one key: its non-zero fingerprint and its two
// distinct candidate buckets.
type Address struct {
	Fingerprint uint16
	A, B        uint64
}

// Address computes (fp, a, b) for key. Cost: two xxh3 hashes.
func (ad Addresser) Address(key uint64) Address {
	var buf [8]byte
	binary.LittleEndian.PutUint64(buf[:], key)
	m := xxh3.HashSeed(buf[:], ad.seed)
	fp := uint16(m)
	if fp == 0 {
		fp = 1
	}
	a := (m >> 16) & ad.mask
	return Address{Fingerprint: fp, A: a, B: a ^ ad.displacement(fp)}
}

// Alternate returns the other candidate bucket of a fingerprint stored in
// bucket. It is an involution and never returns bucket itself.
func (ad Addresser) Alternate(bucket uint64, fp uint16) uint64 {
	return bucket ^ ad.displacement(fp)
}

func (ad Addresser) displacement(fp uint16) uint64 {
	var buf [2]byte
	binary.LittleEndian.PutUint16(buf[:], fp)
	d := xxh3.HashSeed(buf[:], ad.altSeed) & ad.mask
	if d == 0 {
		d = 1
	}
	return d
}
