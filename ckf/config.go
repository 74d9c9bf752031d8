package ckf

import (
	"fmt"
	"math"
	"math/bits"
	"runtime"
)

// Defaults and limits of SPEC §2.1.
const (
	// DefaultSeed is the filter seed used when none is configured.
	DefaultSeed uint64 = 0x5DEECE66D1B54A33
	// DefaultMaxKicks bounds the relocation chain of one insertion.
	DefaultMaxKicks = 500
	// MaxMaxKicks is the largest accepted MaxKicks.
	MaxMaxKicks = 4096
	// DefaultVerificationWindow is the consumer prefix-search verification window.
	DefaultVerificationWindow = 2
	// MaxVerificationWindow is the largest accepted verification window.
	MaxVerificationWindow = 8
	// MinBucketCount and MaxBucketCount bound a valid bucket count (both powers of two).
	MinBucketCount = 2
	MaxBucketCount = 1 << 24
)

// Config sizes and tunes one pool's filter. The zero value is not valid; start
// from [DefaultConfig].
type Config struct {
	// ExpectedBlocks is the number of distinct resident blocks the filter is
	// sized for (≈80% design load). Must be > 0.
	ExpectedBlocks uint64
	// Seed keys the addressing hashes and the relocation RNG.
	Seed uint64
	// MaxKicks bounds one insertion's relocation chain, 1..=4096.
	MaxKicks int
	// VerificationWindow is the consumer prefix-search window, 1..=8.
	VerificationWindow int
	// PublishEveryNEvents is the publication cadence in admitted events, > 0.
	PublishEveryNEvents uint64
	// MaxMembers bounds the members holding at least one block; 0 means no
	// bound. A Stored event that would add one more is refused whole with
	// [ErrMemberLimit]. [Config.WithSizedLimits] sets [DefaultMaxMembers].
	MaxMembers int
	// MaxTrackedBlocks bounds the tracked blocks — lineage entries over all
	// members, one per block a member holds, so also the distinct canonical
	// blocks — resident or not; 0 means no bound. A Stored event whose new
	// entries would exceed it is refused whole with [ErrTrackedBlockLimit].
	// [Config.WithSizedLimits] sizes it to the filter.
	MaxTrackedBlocks uint64
	// ApplyWorkers is how many goroutines [Pool.ApplyEvents] spreads a batch
	// over, 0..=[MaxApplyWorkers]; 0 and 1 apply on the caller's goroutine
	// alone. The worker count changes no result: a batch applied by any
	// number of workers leaves exactly the words, batches, refcounts and
	// errors of [Pool.ApplyEvent] called on each event in order (SPEC §4.3).
	ApplyWorkers int
}

// MaxApplyWorkers bounds [Config.ApplyWorkers]: the pool keeps one member
// and one refcount shard per worker.
const MaxApplyWorkers = 64

// DefaultApplyWorkersCap caps [DefaultApplyWorkers]: stage 3 of the
// parallel apply (the filter, the dirty window, the drains) and each
// chunk's prologue run on the caller alone, about a quarter of a batch's
// staged work, so helpers beyond three find nothing to take while the
// caller finishes them (docs/RATIONALE.md "Why is apply_workers GOMAXPROCS
// by default?").
const DefaultApplyWorkersCap = 4

// DefaultApplyWorkers is the relay's default [Config.ApplyWorkers]:
// GOMAXPROCS, at most [DefaultApplyWorkersCap]; 1 (the sequential apply)
// on a single-core process.
func DefaultApplyWorkers() int {
	return min(runtime.GOMAXPROCS(0), DefaultApplyWorkersCap)
}

// Defaults of the exact-state bounds (SPEC §4.6) that [Config.WithSizedLimits]
// fills in. The library's [DefaultConfig] leaves both bounds off.
const (
	// DefaultMaxMembers bounds the members holding blocks.
	DefaultMaxMembers = 16_384
	// DefaultTrackedBlocksPerSlot sizes MaxTrackedBlocks: this many tracked
	// blocks per filter slot (bucket_count × 4). Four leaves room for blocks
	// held by several members and for capacity omissions (blocks tracked but
	// not resident), while bounding the exact state at a fixed multiple of
	// the filter (about 40 bytes a tracked block: ≈ 320 MiB at the relay's
	// 524,288-bucket default in the worst case).
	DefaultTrackedBlocksPerSlot = 4
)

// WithSizedLimits returns c with a zero MaxMembers set to [DefaultMaxMembers]
// and a zero MaxTrackedBlocks set to [DefaultTrackedBlocksPerSlot] × the
// filter's slots. A config whose ExpectedBlocks is invalid is returned
// unchanged ([Config.Validate] reports it).
func (c Config) WithSizedLimits() Config {
	if c.MaxMembers == 0 {
		c.MaxMembers = DefaultMaxMembers
	}
	if n, err := BucketCount(c.ExpectedBlocks); err == nil && c.MaxTrackedBlocks == 0 {
		c.MaxTrackedBlocks = n * uint64(SlotsPerBucket) * DefaultTrackedBlocksPerSlot
	}
	return c
}

// DefaultConfig returns the library defaults of SPEC §2.1 (expected blocks 1,
// cadence 1). The relay uses larger values.
func DefaultConfig() Config {
	return Config{
		ExpectedBlocks:      1,
		Seed:                DefaultSeed,
		MaxKicks:            DefaultMaxKicks,
		VerificationWindow:  DefaultVerificationWindow,
		PublishEveryNEvents: 1,
	}
}

// Validate checks the fields in SPEC order and returns the first failure,
// wrapped around [ErrInvalidConfig].
func (c Config) Validate() error {
	// The bucket-count overflow is a property of expected_blocks, the first
	// row of SPEC §2.1, so it is checked here rather than after the later
	// rows: a config with several bad fields must report expected_blocks.
	// BucketCount also rejects zero.
	if _, err := BucketCount(c.ExpectedBlocks); err != nil {
		return err
	}
	// Every seed is valid.
	if c.MaxKicks < 1 || c.MaxKicks > MaxMaxKicks {
		return configError(fmt.Sprintf("max_kicks %d outside 1..=%d", c.MaxKicks, MaxMaxKicks))
	}
	if c.VerificationWindow < 1 || c.VerificationWindow > MaxVerificationWindow {
		return configError(fmt.Sprintf("verification_window %d outside 1..=%d", c.VerificationWindow, MaxVerificationWindow))
	}
	if c.PublishEveryNEvents == 0 {
		return configError("publish_every_n_events must be > 0")
	}
	if c.MaxMembers < 0 {
		return configError(fmt.Sprintf("max_members %d must be ≥ 0 (0: no bound)", c.MaxMembers))
	}
	if c.ApplyWorkers < 0 || c.ApplyWorkers > MaxApplyWorkers {
		return configError(fmt.Sprintf("apply_workers %d outside 0..=%d", c.ApplyWorkers, MaxApplyWorkers))
	}
	return nil
}

// Format returns the format identity the configuration produces. It calls
// [Config.Validate] first.
func (c Config) Format() (Format, error) {
	if err := c.Validate(); err != nil {
		return Format{}, err
	}
	n, _ := BucketCount(c.ExpectedBlocks)
	return NewFormat(c.Seed, n), nil
}

// BucketCount returns next_pow2(max(2, floor((5n+15)/16))), the bucket count
// that holds n blocks at ≈80% load with four slots a bucket. It fails when the
// result would exceed [MaxBucketCount] or the arithmetic overflows.
func BucketCount(expectedBlocks uint64) (uint64, error) {
	if expectedBlocks == 0 {
		return 0, configError("expected_blocks must be > 0")
	}
	hi, lo := bits.Mul64(expectedBlocks, 5)
	lo, carry := bits.Add64(lo, 15, 0)
	if hi != 0 || carry != 0 {
		return 0, configError(fmt.Sprintf("expected_blocks %d overflows the bucket count", expectedBlocks))
	}
	want := max(lo/16, MinBucketCount)
	if want > MaxBucketCount {
		return 0, configError(fmt.Sprintf("expected_blocks %d needs more than %d buckets", expectedBlocks, MaxBucketCount))
	}
	return nextPow2(want), nil
}

func nextPow2(v uint64) uint64 {
	if v <= 1 {
		return 1
	}
	if v > math.MaxUint64/2+1 {
		return 0
	}
	return 1 << (64 - bits.LeadingZeros64(v-1))
}
