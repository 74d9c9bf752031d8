package ckf

import (
	"math/bits"
	"unsafe"
)

// LaneRowHits is one probe of a lane-minor table of MaxLanes filters that
// share this addressing (SPEC §8.4: bucket i of lane l is words[i*16+l]): bit l
// of the result is set when lane l's bucket A or B of key holds key's
// fingerprint. words must hold bucketCount × 16 words (it panics otherwise,
// like an index out of range). On GOARCH=wasm it is one hand-written
// WebAssembly call (kernels_wasm.s); elsewhere [Addresser.Address] and 32
// [Bucket.Contains] tests.
func (ad Addresser) LaneRowHits(words []uint64, key uint64) uint16 {
	_ = words[(ad.mask+1)*MaxLanes-1] // every row the mask can reach
	return laneRowHitsArch(ad, words, key)
}

// laneRowHitsGo is the reference of LaneRowHits.
func laneRowHitsGo(ad Addresser, words []uint64, key uint64) uint16 {
	a := ad.Address(key)
	ra := words[a.A*MaxLanes : a.A*MaxLanes+MaxLanes : a.A*MaxLanes+MaxLanes]
	rb := words[a.B*MaxLanes : a.B*MaxLanes+MaxLanes : a.B*MaxLanes+MaxLanes]
	var m uint16
	for l := range MaxLanes {
		if Bucket(ra[l]).Contains(a.Fingerprint) || Bucket(rb[l]).Contains(a.Fingerprint) {
			m |= 1 << l
		}
	}
	return m
}

// KeyHash is the seed-only part of a key's addressing: its fingerprint and
// the two hashes that, masked by a table's bucket count, give its buckets.
// Tables that share a seed but not a bucket count (format groups of a
// consumer, SPEC §8.1) hash a key once and place it in each with
// [Addresser.RowHitsHashed].
type KeyHash struct {
	fp   uint16
	h    uint64 // bucket a before masking
	disp uint64 // displacement before masking
}

// HashKey returns the seed-only addressing of key under ad's seed.
func (ad Addresser) HashKey(key uint64) KeyHash {
	m := xxh3Hash8(key, ad.keyFlip)
	fp := uint16(m)
	if fp == 0 {
		fp = 1
	}
	return KeyHash{fp: fp, h: m >> 16, disp: xxh3Hash2(fp, ad.dispFlip)}
}

// SameSeed reports whether ad and other hash keys alike (the same seed),
// so one [KeyHash] serves both.
func (ad Addresser) SameSeed(other Addresser) bool {
	return ad.keyFlip == other.keyFlip && ad.dispFlip == other.dispFlip
}

// RowHits is [Addresser.LaneRowHits] for a lane-minor table of width lanes
// (1, 2, 4, 8 or 16; bucket i of lane l at words[i*width+l]): bit l of the
// result is set when lane l's bucket A or B holds key's fingerprint. Width
// 16 is LaneRowHits itself (one WebAssembly call in wasm builds); narrower
// rows read width words a bucket instead of 16. words must hold
// bucketCount × width words (it panics otherwise).
func (ad Addresser) RowHits(words []uint64, width int, key uint64) uint16 {
	if width == MaxLanes {
		return ad.LaneRowHits(words, key)
	}
	return ad.RowHitsHashed(words, width, ad.HashKey(key))
}

// RowHitsHashed is [Addresser.RowHits] for a key already hashed under ad's
// seed ([Addresser.HashKey], possibly by another Addresser with the same
// seed). It is branch-free over the slots (the zero-lane test of
// [Bucket.Contains] on every word, turned into a bit arithmetically), so
// the loads of several tables' rows overlap.
func (ad Addresser) RowHitsHashed(words []uint64, width int, kh KeyHash) uint16 {
	a, b := ad.Rows(width, kh)
	w := uint64(width)
	return HitsAt(words[a:a+w:a+w], words[b:b+w:b+w], kh)
}

// Rows returns the offsets (in words) of key's two rows in a lane-minor
// table of width lanes: row A at ra, row B at rb. With [HitsAt] it splits
// [Addresser.RowHitsHashed] in two, so a caller probing several tables can
// compute every address before the first load.
func (ad Addresser) Rows(width int, kh KeyHash) (ra, rb uint64) {
	a := kh.h & ad.mask
	d := kh.disp & ad.mask
	d |= (d - 1) >> 63 // 0 → 1, as displacement
	return a * uint64(width), (a ^ d) * uint64(width)
}

// HitsAt is the second half of [Addresser.RowHitsHashed]: the slots of the
// width-word rows ra and rb that hold kh's fingerprint.
func HitsAt(ra, rb []uint64, kh KeyHash) uint16 {
	fp := uint64(kh.fp) * laneLow
	rb = rb[:len(ra)]
	var m uint64
	for l := range ra {
		x, y := ra[l]^fp, rb[l]^fp
		z := ((x - laneLow) &^ x & laneHigh) | ((y - laneLow) &^ y & laneHigh)
		m |= ((z | -z) >> 63) << l
	}
	return uint16(m)
}

// searchGroup is one format group of a multi-group [PrefixSearch]: a
// lane-minor table of width slots (1, 2, 4, 8 or 16) with its addressing,
// its slot-to-lane maps and the lanes it serves, flattened into words the
// WebAssembly kernel reads at go_asm.h's offsets. [PrefixSearch.AddGroup]
// is the only constructor, so every field holds: words covers every row the
// mask reaches, shift = log2(width)+3 and width ≥ 1.
type searchGroup struct {
	words    *uint64 // row 0
	mask     uint64
	keyFlip  uint64
	dispFlip uint64
	shift    uint64 // a row's offset in bytes is its index << shift
	width    uint64
	sameSeed uint64 // 1: the previous group has this seed (reuse its key hash)
	members  uint64 // the lanes with a slot here
	maps     *[2][256]uint16
	// info is members | members<<16 | run<<32 | shift<<48, where run is,
	// for the first group of a run of same-seed groups, the lanes of the
	// whole run (0 for the others): a probe hashes the key at a run's first
	// group when it wants a lane of the run. The wasm probe reads all of
	// it in one load, and ORs bits 16..31 into its covered lanes.
	info uint64
}

// ResetGroups forgets the groups added by [PrefixSearch.AddGroup].
func (s *PrefixSearch) ResetGroups() {
	clear(s.formats)
	s.formats = s.formats[:0]
	s.runs = 0
}

// AddGroup adds a format group for [PrefixSearch.GroupHits] and
// [PrefixSearch.SearchGroups]: the lane-minor table words of width slots
// (bucket i of slot k at words[i*width+k]) under ad, whose slot hits map to
// lanes through maps (lanes of the slots 0..7 of a hit mask m at
// maps[0][m&0xff], of 8..15 at maps[1][m>>8]), serving the lanes of
// members. Groups of one seed share one key hash when added one after the
// other (the caller sorts them by seed). It panics when width is not 1, 2,
// 4, 8 or 16, words is shorter than ad's bucket count × width, maps is nil
// or MaxLanes groups are there already.
func (s *PrefixSearch) AddGroup(ad Addresser, words []uint64, width int, maps *[2][256]uint16, members uint16) {
	if width < 1 || width > MaxLanes || width&(width-1) != 0 || maps == nil || len(s.formats) == MaxLanes {
		panic("ckf: PrefixSearch.AddGroup: bad group")
	}
	_ = words[(ad.mask+1)*uint64(width)-1] // every row the mask can reach
	g := searchGroup{
		words: unsafe.SliceData(words), mask: ad.mask, keyFlip: ad.keyFlip, dispFlip: ad.dispFlip,
		shift: uint64(bits.TrailingZeros(uint(width))) + 3, width: uint64(width),
		members: uint64(members), maps: maps,
	}
	if n := len(s.formats); n > 0 && s.formats[n-1].keyFlip == g.keyFlip && s.formats[n-1].dispFlip == g.dispFlip {
		g.sameSeed = 1
	}
	g.info = g.members | g.members<<16 | g.shift<<48
	if g.sameSeed == 0 {
		g.info |= g.members << 32
		s.runs++
	} else {
		head := len(s.formats) - 1
		for s.formats[head].sameSeed != 0 {
			head--
		}
		s.formats[head].info |= g.members << 32
	}
	s.formats = append(s.formats, g)
}

// Groups returns the number of groups added.
func (s *PrefixSearch) Groups() int { return len(s.formats) }

// GroupHits returns, for the lanes of ready, which hold key in the added
// groups: the OR of each group's row hits (as [Addresser.RowHitsHashed])
// mapped to lanes, the key hashed once per run of same-seed groups; groups
// with no ready lane are not read. It is [PrefixSearch.GroupProbe] with
// want = ready, masked by ready.
func (s *PrefixSearch) GroupHits(key uint64, ready uint16) uint16 {
	hits, _ := s.GroupProbe(key, ready)
	return hits & ready
}

// GroupProbe reads only the groups with a lane in want: hits is which of
// those groups' lanes hold key, covered those groups' lanes (the lanes
// hits answers for; a lane of a group not read is 0 in both). The key is
// hashed once per run of same-seed groups, and only when one of the run's
// groups is read. A search that needs the answer of a few lanes at a
// position (a binary search settling one lane) then reads their groups'
// rows, not every group's (consumer's probe keeps which lanes each
// position answered). On GOARCH=wasm it is one hand-written WebAssembly
// call, the probe [PrefixSearch.SearchGroups] inlines.
func (s *PrefixSearch) GroupProbe(key uint64, want uint16) (hits, covered uint16) {
	if len(s.formats) == 0 {
		return 0, 0
	}
	return groupHitsArch(s.formats, key, want)
}

// groupHitsGo is GroupProbe in Go (every architecture but wasm, and the
// reference the wasm kernel is tested against): per group the two rows'
// words tested as [HitsAt] does, with the kernel's arithmetic — each word's
// zero-lane bits shifted onto bit slot+16k and the four 16-bit groups folded
// once — and without bounds checks (AddGroup checked every row the mask
// reaches), which the profile of a 4-group probe showed as its cost next to
// one 16-wide row (BENCHMARKS.md, "Format groups").
func groupHitsGo(gs []searchGroup, key uint64, want uint16) (hits, covered uint16) {
	var kh KeyHash
	var fp uint64
	for i := range gs {
		g := &gs[i]
		if uint16(g.info>>32)&want != 0 { // a run's first group, and the run is wanted
			kh = Addresser{keyFlip: g.keyFlip, dispFlip: g.dispFlip}.HashKey(key)
			fp = uint64(kh.fp) * laneLow
		}
		if uint16(g.members)&want == 0 {
			continue
		}
		a := kh.h & g.mask
		d := kh.disp & g.mask
		d |= (d - 1) >> 63 // 0 → 1, as displacement
		ra := unsafe.Add(unsafe.Pointer(g.words), a<<g.shift)
		rb := unsafe.Add(unsafe.Pointer(g.words), (a^d)<<g.shift)
		var z uint64
		if g.width < 4 {
			for l := range g.width {
				z |= slotZero(ra, rb, l, fp) >> (15 - l)
			}
		} else {
			for l := uint64(0); l < g.width; l += 4 { // four slots at a time, unrolled
				z |= slotZero(ra, rb, l, fp)>>(15-l) | slotZero(ra, rb, l+1, fp)>>(14-l) |
					slotZero(ra, rb, l+2, fp)>>(13-l) | slotZero(ra, rb, l+3, fp)>>(12-l)
			}
		}
		z |= z >> 32
		z |= z >> 16
		hits |= g.maps[0][uint8(z)] | g.maps[1][uint8(z>>8)]
		covered |= uint16(g.members)
	}
	return hits, covered
}

// slotZero returns the high bit of each 16-bit lane of slot l's words in
// rows ra and rb that equals fp's (fp broadcast to four lanes): non-zero
// exactly when either bucket holds the fingerprint (Bucket.Contains).
func slotZero(ra, rb unsafe.Pointer, l, fp uint64) uint64 {
	x := *(*uint64)(unsafe.Add(ra, 8*l)) ^ fp
	y := *(*uint64)(unsafe.Add(rb, 8*l)) ^ fp
	return (((x - laneLow) &^ x) | ((y - laneLow) &^ y)) & laneHigh
}

// SearchGroups runs s on the added groups (at least one) as
// [Addresser.SearchPrefix] runs it on one 16-wide table, each probe
// [PrefixSearch.GroupHits], and reports true, on GOARCH=wasm; elsewhere,
// or when s breaks SearchPrefix's contract or has no group, it does
// nothing and reports false.
func (s *PrefixSearch) SearchGroups() bool {
	return searchGroupsArch(s)
}
