package ckf

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
