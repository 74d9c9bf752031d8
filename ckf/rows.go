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
