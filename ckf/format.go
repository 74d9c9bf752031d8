package ckf

import "fmt"

// Format constants of SPEC §2.1. They are exchanged on the wire and must not change.
const (
	FormatVersion   uint8 = 1
	FingerprintBits uint8 = 16
	SlotsPerBucket  uint8 = 4
)

// Format is the self-describing identity of a filter layout, carried with
// every snapshot and delta. Two tables are interchangeable only when their
// formats are equal. The zero value is invalid.
type Format struct {
	Version         uint8
	Seed            uint64
	BucketCount     uint64
	FingerprintBits uint8
	SlotsPerBucket  uint8
}

// NewFormat returns the version-1 format for seed and bucketCount. It does not
// validate; call [Format.Validate].
func NewFormat(seed, bucketCount uint64) Format {
	return Format{
		Version:         FormatVersion,
		Seed:            seed,
		BucketCount:     bucketCount,
		FingerprintBits: FingerprintBits,
		SlotsPerBucket:  SlotsPerBucket,
	}
}

// Validate rejects any version, fingerprint width or slot count other than
// version 1 / 16 bits / 4 slots, and bucket counts that are not a power of
// two in 2..=2^24. Errors wrap [ErrInvalidFormat].
func (f Format) Validate() error {
	switch {
	case f.Version != FormatVersion:
		return formatError(fmt.Sprintf("unsupported format version %d", f.Version))
	case f.FingerprintBits != FingerprintBits:
		return formatError(fmt.Sprintf("unsupported fingerprint width %d bits", f.FingerprintBits))
	case f.SlotsPerBucket != SlotsPerBucket:
		return formatError(fmt.Sprintf("unsupported slots per bucket %d", f.SlotsPerBucket))
	case !ValidBucketCount(f.BucketCount):
		return formatError(fmt.Sprintf("bucket count %d is not a power of two in %d..=%d", f.BucketCount, MinBucketCount, MaxBucketCount))
	}
	return nil
}

// ValidBucketCount reports whether n is a power of two in 2..=2^24.
func ValidBucketCount(n uint64) bool {
	return n >= MinBucketCount && n <= MaxBucketCount && n&(n-1) == 0
}

// Addresser returns the addressing function of the format. The format must be valid.
func (f Format) Addresser() Addresser { return NewAddresser(f.Seed, f.BucketCount) }
