package ckf

import (
	"fmt"
	"slices"
)

// Filter is a standalone cuckoo filter in the ckfrelay format: 16-bit
// fingerprints, four slots per 64-bit bucket, bounded relocation with full
// rollback. A pure sequence of Insert and Remove calls produces the same bucket
// words as Dynamo's producer for the same (seed, bucket count, max kicks).
//
// Remove deletes by fingerprint, so removing a key that was never inserted may
// delete another key with the same fingerprint and buckets; [Pool] avoids this
// by deciding deletions from exact ownership. A Filter is not safe for
// concurrent use.
type Filter struct {
	t     table
	count int
}

// NewFilter returns an empty filter. bucketCount must be a power of two in
// 2..=2^24 and maxKicks in 1..=4096.
func NewFilter(bucketCount int, seed uint64, maxKicks int) (*Filter, error) {
	if bucketCount < 0 || !ValidBucketCount(uint64(bucketCount)) {
		return nil, formatError(fmt.Sprintf("bucket count %d is not a power of two in %d..=%d", bucketCount, MinBucketCount, MaxBucketCount))
	}
	if maxKicks < 1 || maxKicks > MaxMaxKicks {
		return nil, configError(fmt.Sprintf("max_kicks %d outside 1..=%d", maxKicks, MaxMaxKicks))
	}
	return &Filter{t: newTable(uint64(bucketCount), seed, maxKicks)}, nil
}

// Insert adds key. Duplicates are allowed: each insert takes a slot. On
// failure it returns ErrCapacityExhausted and the words are unchanged (the
// relocation RNG has advanced). Failure does not prove the table is full.
func (f *Filter) Insert(key uint64) error {
	if err := f.t.insert(key); err != nil {
		return err
	}
	f.count++
	return nil
}

// Remove clears exactly one copy of key's fingerprint (bucket a before b,
// lowest slot first). It returns ErrBlockNotFound when neither bucket holds it.
func (f *Filter) Remove(key uint64) error {
	if !f.t.remove(key) {
		return ErrBlockNotFound
	}
	f.count--
	return nil
}

// Contains reports whether key may be present. No false negatives for
// inserted keys; false positives at ≈ 8/65536 at full load.
func (f *Filter) Contains(key uint64) bool { return f.t.contains(key) }

// Len returns the number of occupied slots.
func (f *Filter) Len() int { return f.count }

// BucketCount returns the number of buckets.
func (f *Filter) BucketCount() int { return len(f.t.words) }

// Words returns a copy of the bucket words.
func (f *Filter) Words() []uint64 { return slices.Clone(f.t.words) }

// LoadFactor returns occupied slots / total slots.
func (f *Filter) LoadFactor() float64 { return float64(f.count) / float64(4*len(f.t.words)) }
