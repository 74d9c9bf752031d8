package ckf

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/zeebo/xxh3"
	"pgregory.net/rapid"
)

func TestAddresser_GoldenVectors(t *testing.T) {
	ad := NewAddresser(0x123456789ABCDEF0, 1024)
	cases := []struct {
		key  uint64
		fp   uint16
		a, b uint64
	}{
		{0, 7750, 587, 372},
		{1, 64153, 348, 36},
		{0x0123456789ABCDEF, 45802, 865, 909},
		{0xFFFFFFFFFFFFFFFF, 31767, 112, 217},
	}
	for _, c := range cases {
		got := ad.Address(c.key)
		want := Address{Fingerprint: c.fp, A: c.a, B: c.b}
		assert.Equal(t, want, got, "Address(%#x) = %+v, want %+v", c.key, got, want)
		alt := ad.Alternate(got.A, got.Fingerprint)
		assert.Equal(t, c.b, alt, "Alternate(%d, %d) = %d, want %d", got.A, got.Fingerprint, alt, c.b)
	}
}

func TestAddresser_Invariants(t *testing.T) {
	cases := []struct {
		name        string
		seed        uint64
		bucketCount uint64
	}{
		{"golden", 0x123456789ABCDEF0, 1024},
		{"default seed min buckets", DefaultSeed, 2},
		{"default seed 4 buckets", DefaultSeed, 4},
		{"zero seed", 0, 1 << 16},
		{"max buckets", DefaultSeed, MaxBucketCount},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ad := NewAddresser(tc.seed, tc.bucketCount)
			for h := uint64(0); h <= 10000; h++ {
				got := ad.Address(h)
				require.NotEqual(t, uint16(0), got.Fingerprint, "Address(%d).Fingerprint = 0, want non-zero", h)
				require.NotEqual(t, got.B, got.A, "Address(%d) = %+v: a == b, want distinct buckets", h, got)
				require.Less(t, got.A, tc.bucketCount, "Address(%d) = %+v, want buckets < %d", h, got, tc.bucketCount)
				require.Less(t, got.B, tc.bucketCount, "Address(%d) = %+v, want buckets < %d", h, got, tc.bucketCount)
				alt := ad.Alternate(got.B, got.Fingerprint)
				require.Equal(t, got.A, alt, "Alternate(b=%d, %d) = %d, want a=%d", got.B, got.Fingerprint, alt, got.A)
				alt = ad.Alternate(got.A, got.Fingerprint)
				require.Equal(t, got.B, alt, "Alternate(a=%d, %d) = %d, want b=%d", got.A, got.Fingerprint, alt, got.B)
			}
		})
	}
}

func TestAddresser_AlternateIsInvolutionForEveryFingerprint(t *testing.T) {
	ad := NewAddresser(DefaultSeed, 64)
	for fp := 1; fp <= 0xFFFF; fp++ {
		for _, b := range []uint64{0, 1, 37, 63} {
			alt := ad.Alternate(b, uint16(fp))
			require.NotEqual(t, b, alt, "Alternate(%d, %d) = %d, want a different bucket < 64", b, fp, alt)
			require.Less(t, alt, uint64(64), "Alternate(%d, %d) = %d, want a different bucket < 64", b, fp, alt)
			back := ad.Alternate(alt, uint16(fp))
			require.Equal(t, b, back, "Alternate(Alternate(%d, %d)) = %d, want %d", b, fp, back, b)
		}
	}
}

func TestFormat_Addresser(t *testing.T) {
	f := NewFormat(0x123456789ABCDEF0, 1024)
	got, want := f.Addresser().Address(1), (Address{Fingerprint: 64153, A: 348, B: 36})
	require.Equal(t, want, got, "Format.Addresser().Address(1) = %+v, want %+v", got, want)
}

// specAddresser is a plain transcription of SPEC §2.2 over xxh3.HashSeed,
// independent of the specialised hashes and lazy alternate of [Addresser].
// The reference filter and the equivalence tests below use it.
type specAddresser struct{ seed, mask uint64 }

func newSpecAddresser(seed, bucketCount uint64) specAddresser {
	return specAddresser{seed: seed, mask: bucketCount - 1}
}

func (s specAddresser) Address(key uint64) Address {
	m := xxh3.HashSeed(binary.LittleEndian.AppendUint64(nil, key), s.seed)
	fp := uint16(m & 0xFFFF)
	if fp == 0 {
		fp = 1
	}
	a := (m >> 16) & s.mask
	return Address{Fingerprint: fp, A: a, B: s.Alternate(a, fp)}
}

func (s specAddresser) Alternate(bucket uint64, fp uint16) uint64 {
	d := xxh3.HashSeed(binary.LittleEndian.AppendUint16(nil, fp), s.seed^0x9E3779B97F4A7C15) & s.mask
	if d == 0 {
		d = 1
	}
	return bucket ^ d
}

func TestAddresser_MatchesSpec(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		seed := seedGen().Draw(t, "seed")
		bucketCount := uint64(1) << rapid.IntRange(1, 24).Draw(t, "log2 buckets")
		ad, spec := NewAddresser(seed, bucketCount), newSpecAddresser(seed, bucketCount)
		key := rapid.Uint64().Draw(t, "key")
		got, want := ad.Address(key), spec.Address(key)
		require.Equal(t, want, got, "Address(%#x) = %+v, want spec %+v", key, got, want)
		fp, a := ad.primary(key)
		want = spec.Address(key)
		require.Equal(t, want.Fingerprint, fp, "primary(%#x) = (%d, %d), want spec (%d, %d)", key, fp, a, want.Fingerprint, want.A)
		require.Equal(t, want.A, a, "primary(%#x) = (%d, %d), want spec (%d, %d)", key, fp, a, want.Fingerprint, want.A)
		fp = rapid.Uint16Min(1).Draw(t, "fp")
		bucket := rapid.Uint64Max(bucketCount-1).Draw(t, "bucket")
		{
			got, want := ad.Alternate(bucket, fp), spec.Alternate(bucket, fp)
			require.Equal(t, want, got, "Alternate(%d, %d) = %d, want spec %d", bucket, fp, got, want)
		}
	})
}
