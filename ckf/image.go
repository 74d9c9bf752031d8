package ckf

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
)

// ErrInvalidImage is wrapped by every [RestorePool] refusal: the image does
// not describe a pool this configuration could have reached.
var ErrInvalidImage = errors.New("ckf: invalid pool image")

// PoolCounters are a pool's counters that are not derived from its exact
// state: the lifetime statistics of [Stats] and the events pending toward
// the publication cadence.
type PoolCounters struct {
	PendingEvents               uint64
	UnknownRemovals             uint64
	ParentNotFound              uint64
	CapacityFailures            uint64
	MemberLimitRejections       uint64
	TrackedBlockLimitRejections uint64
	PhysicalTouches             uint64
	DistinctTouchedBuckets      uint64
	EmittedImages               uint64
	NetRevertedBuckets          uint64
}

// PoolImage is the whole state of a pool (issue #34's checkpoint): the
// filter words and the relocation generator's state — the words depend on
// insertion order, the generator and what capacity omitted, so neither
// follows from the exact state — the exact state itself (every member's
// lineage; owner counts and residency follow from the lineages and
// NonResident), the counters, and the dirty window (the buckets touched
// since the last drain with the word consumers last saw). A pool restored
// from it ([RestorePool]) applies every later event exactly as the
// original does: same words, same generator draws, same statistics.
type PoolImage struct {
	Format      Format
	Words       []uint64
	RNG         uint64          // the relocation generator's state
	Members     []MemberLineage // by (worker, rank); see SortLineages
	NonResident []uint64        // tracked canonical blocks the filter omitted, ascending
	// Window is the dirty window in first-touch order: each touched bucket
	// with the word it held before the first touch.
	Window   []BucketImage
	Counters PoolCounters
}

// Image returns the pool's whole state; it shares nothing with the pool.
// Cost: a copy of the words and of the lineages, O(tracked blocks). A
// member's blocks are in no particular order: [PoolImage.SortLineages]
// makes the image canonical (its owner may do that off the pool's
// goroutine).
func (p *Pool) Image() PoolImage {
	img := PoolImage{
		Format:  p.format,
		Words:   p.Words(),
		RNG:     p.t.rng.State(),
		Members: p.ExportLineage(),
		Counters: PoolCounters{
			PendingEvents:               p.pendingEvents,
			UnknownRemovals:             p.unknownRemovals,
			ParentNotFound:              p.parentNotFound,
			CapacityFailures:            p.capacityFailures,
			MemberLimitRejections:       p.memberLimitRejections,
			TrackedBlockLimitRejections: p.trackedBlockLimitRejections,
			PhysicalTouches:             p.dirty.physicalTouches,
			DistinctTouchedBuckets:      p.dirty.distinctTouchedBuckets,
			EmittedImages:               p.dirty.emittedImages,
			NetRevertedBuckets:          p.dirty.netRevertedBuckets,
		},
	}
	for c := range p.nonResident {
		img.NonResident = append(img.NonResident, c)
	}
	slices.Sort(img.NonResident)
	for _, w := range p.dirty.order {
		img.Window = append(img.Window, BucketImage{Bucket: uint32(w.bucket), Word: w.before})
	}
	return img
}

// SortLineages sorts every member's blocks by external hash: two images of
// equal pools are then equal.
func (img *PoolImage) SortLineages() {
	for _, l := range img.Members {
		slices.SortFunc(l.Blocks, func(a, b LineageEntry) int { return cmp.Compare(a.External, b.External) })
	}
}

// RestorePool returns a pool of configuration cfg in the state img
// describes. It checks, before anything is built, that the image fits the
// configuration (format, bounds) and is consistent: one lineage per member,
// no external hash twice, owner counts within uint32, every resident block's
// fingerprint in the words, as many occupied slots as resident blocks, every
// omitted block tracked, window buckets in range and distinct. A refusal
// wraps [ErrInvalidImage]. The image is not retained.
func RestorePool(cfg Config, img *PoolImage) (*Pool, error) {
	f, err := cfg.Format()
	if err != nil {
		return nil, err
	}
	if img.Format != f {
		return nil, imageError("format %+v, the configuration's is %+v", img.Format, f)
	}
	if uint64(len(img.Words)) != f.BucketCount {
		return nil, imageError("%d words for %d buckets", len(img.Words), f.BucketCount)
	}
	if cfg.MaxMembers > 0 && len(img.Members) > cfg.MaxMembers {
		return nil, imageError("%d members, max_members %d", len(img.Members), cfg.MaxMembers)
	}
	p := newEmptyPool(cfg, f, rand.Uint64())
	copy(p.t.words, img.Words)
	p.t.rng = RNG{state: img.RNG}
	for i, l := range img.Members {
		if i > 0 && img.Members[i-1].Member.Compare(l.Member) >= 0 {
			return nil, imageError("members out of order at worker %d rank %d", l.Member.WorkerID, l.Member.DPRank)
		}
		if len(l.Blocks) == 0 {
			return nil, imageError("worker %d rank %d holds no block", l.Member.WorkerID, l.Member.DPRank)
		}
		if err := p.restoreMember(l); err != nil {
			return nil, err
		}
	}
	if cfg.MaxTrackedBlocks > 0 && p.contributions > cfg.MaxTrackedBlocks {
		return nil, imageError("%d tracked blocks, max_tracked_blocks %d", p.contributions, cfg.MaxTrackedBlocks)
	}
	for i, c := range img.NonResident {
		if i > 0 && img.NonResident[i-1] >= c {
			return nil, imageError("omitted blocks out of order")
		}
		if owners, _ := p.Owners(c); owners == 0 {
			return nil, imageError("omitted block %#x has no owner", c)
		}
		p.nonResident[c] = struct{}{}
	}
	var bad error
	for _, s := range p.blocks {
		for c := range s {
			if p.isResident(c) {
				p.resident++
				if bad == nil && !p.t.contains(c) {
					bad = imageError("resident block %#x is not in the words", c)
				}
			}
		}
	}
	if bad != nil {
		return nil, bad
	}
	if slots, _ := p.t.occupied(); uint64(slots) != p.resident {
		return nil, imageError("%d occupied slots for %d resident blocks", slots, p.resident)
	}
	for _, w := range img.Window {
		if uint64(w.Bucket) >= f.BucketCount || p.dirty.stamp[w.Bucket] == p.dirty.gen {
			return nil, imageError("window bucket %d out of range or repeated", w.Bucket)
		}
		p.dirty.stamp[w.Bucket] = p.dirty.gen
		p.dirty.order = append(p.dirty.order, bucketWrite{bucket: uint64(w.Bucket), before: w.Word})
	}
	c := img.Counters
	p.pendingEvents = c.PendingEvents
	p.unknownRemovals, p.parentNotFound, p.capacityFailures = c.UnknownRemovals, c.ParentNotFound, c.CapacityFailures
	p.memberLimitRejections, p.trackedBlockLimitRejections = c.MemberLimitRejections, c.TrackedBlockLimitRejections
	p.dirty.physicalTouches, p.dirty.distinctTouchedBuckets = c.PhysicalTouches, c.DistinctTouchedBuckets
	p.dirty.emittedImages, p.dirty.netRevertedBuckets = c.EmittedImages, c.NetRevertedBuckets
	return p, nil
}

// restoreMember installs one member's lineage and the ownerships it holds,
// without touching the words (the image has them).
func (p *Pool) restoreMember(l MemberLineage) error {
	lin := make(map[uint64]uint64, len(l.Blocks))
	for _, e := range l.Blocks {
		if _, dup := lin[e.External]; dup {
			return imageError("worker %d rank %d holds external hash %#x twice", l.Member.WorkerID, l.Member.DPRank, e.External)
		}
		bs := p.blocks[p.blockShard(e.Canonical)]
		if bs[e.Canonical] == math.MaxUint32 {
			return imageError("block %#x has more than %d owners", e.Canonical, uint32(math.MaxUint32))
		}
		lin[e.External] = e.Canonical
		bs[e.Canonical]++
	}
	p.members[p.memberShard(l.Member)][l.Member] = &memberState{lineage: lin}
	p.contributions += uint64(len(lin))
	return nil
}

func imageError(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidImage, fmt.Sprintf(format, args...))
}
