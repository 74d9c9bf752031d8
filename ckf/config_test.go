package ckf

import (
	"errors"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestConfig_ValidateOrder(t *testing.T) {
	valid := DefaultConfig()
	cases := []struct {
		name    string
		mutate  func(*Config)
		wantErr string // substring of the first failure; "" means valid
	}{
		{"defaults", func(*Config) {}, ""},
		{"any seed is valid", func(c *Config) { c.Seed = 0 }, ""},
		{"max seed is valid", func(c *Config) { c.Seed = math.MaxUint64 }, ""},
		{"max_kicks lower bound", func(c *Config) { c.MaxKicks = 1 }, ""},
		{"max_kicks upper bound", func(c *Config) { c.MaxKicks = MaxMaxKicks }, ""},
		{"window bounds low", func(c *Config) { c.VerificationWindow = 1 }, ""},
		{"window bounds high", func(c *Config) { c.VerificationWindow = MaxVerificationWindow }, ""},
		{"relay default size", func(c *Config) { c.ExpectedBlocks = 1 << 20; c.PublishEveryNEvents = 16 }, ""},

		{"expected_blocks zero", func(c *Config) { c.ExpectedBlocks = 0 }, "expected_blocks"},
		{"max_kicks zero", func(c *Config) { c.MaxKicks = 0 }, "max_kicks"},
		{"max_kicks negative", func(c *Config) { c.MaxKicks = -1 }, "max_kicks"},
		{"max_kicks too large", func(c *Config) { c.MaxKicks = MaxMaxKicks + 1 }, "max_kicks"},
		{"window zero", func(c *Config) { c.VerificationWindow = 0 }, "verification_window"},
		{"window too large", func(c *Config) { c.VerificationWindow = MaxVerificationWindow + 1 }, "verification_window"},
		{"cadence zero", func(c *Config) { c.PublishEveryNEvents = 0 }, "publish_every_n_events"},
		{"expected_blocks overflow", func(c *Config) { c.ExpectedBlocks = math.MaxUint64 }, "expected_blocks"},
		{"expected_blocks beyond max buckets", func(c *Config) { c.ExpectedBlocks = 1 << 40 }, "expected_blocks"},

		// Several fields invalid: the first row of SPEC §2.1 wins.
		{"expected_blocks before max_kicks", func(c *Config) { c.ExpectedBlocks = 0; c.MaxKicks = 0 }, "expected_blocks"},
		{"max_kicks before window", func(c *Config) { c.MaxKicks = 0; c.VerificationWindow = 0 }, "max_kicks"},
		{"window before cadence", func(c *Config) { c.VerificationWindow = 9; c.PublishEveryNEvents = 0 }, "verification_window"},
		{"all invalid", func(c *Config) { *c = Config{} }, "expected_blocks"},
		// Regression: the bucket-count overflow is a property of
		// expected_blocks (the first row), so it must be reported before a
		// later row's failure.
		{"overflow before max_kicks", func(c *Config) { c.ExpectedBlocks = math.MaxUint64; c.MaxKicks = 0 }, "expected_blocks"},
		{"overflow before cadence", func(c *Config) { c.ExpectedBlocks = 1 << 40; c.PublishEveryNEvents = 0 }, "expected_blocks"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := valid
			tc.mutate(&c)
			err := c.Validate()
			if tc.wantErr == "" {
				require.NoError(t, err, "Validate() = %v, want nil", err)
				return
			}
			require.Error(t, err, "Validate() = nil, want error mentioning %q", tc.wantErr)
			assert.ErrorIs(t, err, ErrInvalidConfig, "errors.Is(%v, ErrInvalidConfig) = false, want true", err)
			assert.Contains(t, err.Error(), tc.wantErr, "Validate() = %q, want it to mention %q", err, tc.wantErr)
			_, ferr := c.Format()
			assert.ErrorIs(t, ferr, ErrInvalidConfig, "Format() error = %v, want ErrInvalidConfig", ferr)
			p, perr := NewPool(c)
			assert.False(t, p != nil || !errors.Is(perr, ErrInvalidConfig), "NewPool() = %v, %v, want nil, ErrInvalidConfig", p, perr)
		})
	}
}

func TestBucketCount_Examples(t *testing.T) {
	cases := []struct {
		n, want uint64
	}{
		{1, 2}, {2, 2}, {7, 4}, {16, 8}, {32, 16}, {1000, 512},
		{1_048_576, 524_288},
		// floor((5n+15)/16) exactly a power of two stays put.
		{51, 16},                       // (255+15)/16 = 16
		{52, 32},                       // (260+15)/16 = 17 → 32
		{(1<<24*16 - 15) / 5, 1 << 24}, // largest n that fits 2^24 buckets
	}
	for _, tc := range cases {
		got, err := BucketCount(tc.n)
		assert.False(t, err != nil || got != tc.want, "BucketCount(%d) = %d, %v; want %d, nil", tc.n, got, err, tc.want)
	}
}

func TestBucketCount_Errors(t *testing.T) {
	cases := []struct {
		name string
		n    uint64
	}{
		{"zero", 0},
		{"just beyond max buckets", (1<<24*16-15)/5 + 4},
		{"5n overflows", math.MaxUint64/5 + 1},
		{"5n+15 overflows", (math.MaxUint64 - 10) / 5},
		{"max", math.MaxUint64},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := BucketCount(tc.n)
			require.ErrorIs(t, err, ErrInvalidConfig, "BucketCount(%d) = %d, %v; want ErrInvalidConfig", tc.n, got, err)
			assert.Equal(t, uint64(0), got, "BucketCount(%d) = %d on error, want 0", tc.n, got)
		})
	}
}

func TestConfig_Format(t *testing.T) {
	c := DefaultConfig()
	c.ExpectedBlocks = 1000
	c.Seed = 42
	f, err := c.Format()
	require.NoError(t, err, "Format() error")
	want := Format{Version: 1, Seed: 42, BucketCount: 512, FingerprintBits: 16, SlotsPerBucket: 4}
	require.Equal(t, want, f, "Format() = %+v, want %+v", f, want)
	{
		err := f.Validate()
		require.NoError(t, err, "Format().Validate() = %v, want nil", err)
	}
}

func TestDefaultConfig_Values(t *testing.T) {
	got := DefaultConfig()
	want := Config{ExpectedBlocks: 1, Seed: 0x5DEECE66D1B54A33, MaxKicks: 500, VerificationWindow: 2, PublishEveryNEvents: 1}
	require.Equal(t, want, got, "DefaultConfig() = %+v, want %+v", got, want)
}

func TestFormat_Validate(t *testing.T) {
	good := NewFormat(DefaultSeed, 1024)
	cases := []struct {
		name    string
		mutate  func(*Format)
		wantErr bool
	}{
		{"valid", func(*Format) {}, false},
		{"min buckets", func(f *Format) { f.BucketCount = 2 }, false},
		{"max buckets", func(f *Format) { f.BucketCount = 1 << 24 }, false},
		{"version 0", func(f *Format) { f.Version = 0 }, true},
		{"version 2", func(f *Format) { f.Version = 2 }, true},
		{"8-bit fingerprints", func(f *Format) { f.FingerprintBits = 8 }, true},
		{"2 slots", func(f *Format) { f.SlotsPerBucket = 2 }, true},
		{"zero buckets", func(f *Format) { f.BucketCount = 0 }, true},
		{"one bucket", func(f *Format) { f.BucketCount = 1 }, true},
		{"not a power of two", func(f *Format) { f.BucketCount = 1000 }, true},
		{"too many buckets", func(f *Format) { f.BucketCount = 1 << 25 }, true},
		{"huge", func(f *Format) { f.BucketCount = math.MaxUint64 }, true},
		{"zero value", func(f *Format) { *f = Format{} }, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := good
			tc.mutate(&f)
			err := f.Validate()
			require.Equal(t, tc.wantErr, err != nil, "Validate(%+v) = %v, want error %v", f, err, tc.wantErr)
			require.False(t, tc.wantErr && !errors.Is(err, ErrInvalidFormat), "errors.Is(%v, ErrInvalidFormat) = false, want true", err)
		})
	}
}

func TestValidBucketCount_Table(t *testing.T) {
	for n := uint64(0); n <= 70; n++ {
		want := n == 2 || n == 4 || n == 8 || n == 16 || n == 32 || n == 64
		got := ValidBucketCount(n)
		assert.Equal(t, want, got, "ValidBucketCount(%d) = %v, want %v", n, got, want)
	}
}
