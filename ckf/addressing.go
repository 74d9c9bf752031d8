package ckf

// altSeedMix is XORed into the seed for the alternate-bucket displacement hash.
const altSeedMix uint64 = 0x9E3779B97F4A7C15

// Addresser maps 64-bit keys to a fingerprint and two candidate buckets
// (SPEC §2.2). It is an immutable value, safe to share. The zero value is not
// usable; build one with [NewAddresser].
type Addresser struct {
	// keyFlip and dispFlip are the per-seed parts of the two XXH3 hashes
	// (see xxh3small.go), folded in once here instead of on every call.
	keyFlip  uint64
	dispFlip uint64
	mask     uint64
}

// NewAddresser returns the addressing of a table with bucketCount buckets
// (a power of two ≥ 2, not checked here) keyed by seed.
func NewAddresser(seed, bucketCount uint64) Addresser {
	return Addresser{
		keyFlip:  xxh3Flip8(seed),
		dispFlip: xxh3Flip2(seed ^ altSeedMix),
		mask:     bucketCount - 1,
	}
}

// Address is the placement of one key: its non-zero fingerprint and its two
// distinct candidate buckets.
type Address struct {
	Fingerprint uint16
	A, B        uint64
}

// Address computes (fp, a, b) for key. Cost: two small hashes, no memory access.
func (ad Addresser) Address(key uint64) Address {
	fp, a := ad.primary(key)
	return Address{Fingerprint: fp, A: a, B: a ^ ad.displacement(fp)}
}

// primary is the first half of Address: the fingerprint and bucket a. The
// table uses it to compute b only when a does not settle the operation.
func (ad Addresser) primary(key uint64) (fp uint16, a uint64) {
	m := xxh3Hash8(key, ad.keyFlip)
	fp = uint16(m)
	if fp == 0 {
		fp = 1
	}
	return fp, (m >> 16) & ad.mask
}

// Alternate returns the other candidate bucket of a fingerprint stored in
// bucket. It is an involution and never returns bucket itself.
func (ad Addresser) Alternate(bucket uint64, fp uint16) uint64 {
	return bucket ^ ad.displacement(fp)
}

func (ad Addresser) displacement(fp uint16) uint64 {
	d := xxh3Hash2(fp, ad.dispFlip) & ad.mask
	if d == 0 {
		d = 1
	}
	return d
}
