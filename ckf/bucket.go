package ckf

import "math/bits"

// Bucket is one packed bucket: four 16-bit fingerprint slots in a uint64,
// slot i in bits [16i, 16i+16), slot 0 least significant (SPEC §2.3). A zero
// slot is empty. The zero Bucket is an empty bucket.
type Bucket uint64

const (
	laneLow  uint64 = 0x0001_0001_0001_0001
	laneHigh uint64 = 0x8000_8000_8000_8000
)

// Slot returns the fingerprint in slot i (0..3).
func (b Bucket) Slot(i int) uint16 { return uint16(uint64(b) >> (16 * (uint(i) & 3))) }

// WithSlot returns b with slot i (0..3) set to fp.
func (b Bucket) WithSlot(i int, fp uint16) Bucket {
	shift := 16 * (uint(i) & 3)
	return Bucket(uint64(b)&^(0xFFFF<<shift) | uint64(fp)<<shift)
}

// Contains reports whether any slot equals fp, with a SWAR zero-lane test:
// x has a zero 16-bit lane iff (x - 0x0001…) & ^x & 0x8000… is non-zero. A
// borrow can only mark lanes above a real zero lane, so "any lane" is exact.
// fp must be non-zero (an empty slot is not a member).
func (b Bucket) Contains(fp uint16) bool {
	x := uint64(b) ^ (uint64(fp) * laneLow)
	return (x-laneLow)&^x&laneHigh != 0
}

// containsScalar is the slot-by-slot reference for Contains.
func (b Bucket) containsScalar(fp uint16) bool {
	for i := range 4 {
		if b.Slot(i) == fp {
			return true
		}
	}
	return false
}

// Find returns the lowest slot holding fp, or -1. It uses the zero-lane test
// of Contains: the lowest marked lane is always a real match (a borrow only
// marks lanes above one), so its position is exact.
func (b Bucket) Find(fp uint16) int {
	x := uint64(b) ^ (uint64(fp) * laneLow)
	m := (x - laneLow) &^ x & laneHigh
	if m == 0 {
		return -1
	}
	return bits.TrailingZeros64(m) >> 4
}

// findScalar is the slot-by-slot reference for Find.
func (b Bucket) findScalar(fp uint16) int {
	for i := range 4 {
		if b.Slot(i) == fp {
			return i
		}
	}
	return -1
}

// LowestEmpty returns the lowest empty slot, or -1 when the bucket is full.
func (b Bucket) LowestEmpty() int { return b.Find(0) }

// Occupied returns the number of non-empty slots.
func (b Bucket) Occupied() int {
	n := 0
	for i := range 4 {
		if b.Slot(i) != 0 {
			n++
		}
	}
	return n
}
