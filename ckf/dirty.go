package ckf

// dirtyWindow remembers, per bucket touched since the last drain, the word
// consumers last saw (first touch wins), in first-touch order (SPEC §4.4).
//
// Membership is a generation stamp per bucket instead of a map: O(1) with no
// hashing on the hot path, 4 bytes per bucket.
type dirtyWindow struct {
	stamp []uint32 // stamp[b] == gen ⇔ bucket b is in the window
	gen   uint32
	order []bucketWrite // (bucket, original) in first-touch order

	physicalTouches        uint64
	distinctTouchedBuckets uint64
	emittedImages          uint64
	netRevertedBuckets     uint64
}

func newDirtyWindow(bucketCount uint64) dirtyWindow {
	return dirtyWindow{stamp: make([]uint32, bucketCount), gen: 1}
}

// record adds writes (in write order) to the window.
func (d *dirtyWindow) record(writes []bucketWrite) {
	for _, w := range writes {
		d.physicalTouches++
		if d.stamp[w.bucket] == d.gen {
			continue
		}
		d.stamp[w.bucket] = d.gen
		d.order = append(d.order, w)
		d.distinctTouchedBuckets++
	}
}

// heldWords returns the words consumers hold: the current words with every
// window bucket replaced by its original.
func (d *dirtyWindow) heldWords(words []uint64) []uint64 {
	held := make([]uint64, len(words))
	copy(held, words)
	for _, w := range d.order {
		held[w.bucket] = w.before
	}
	return held
}

func (d *dirtyWindow) empty() bool { return len(d.order) == 0 }

// drain emits an image for every window bucket whose word differs from its
// original (net reversions vanish) and clears the window. It returns nil when
// nothing changed.
func (d *dirtyWindow) drain(words []uint64) *Batch {
	var images []BucketImage
	for _, w := range d.order {
		cur := words[w.bucket]
		if cur == w.before {
			d.netRevertedBuckets++
			continue
		}
		if images == nil {
			images = make([]BucketImage, 0, len(d.order))
		}
		images = append(images, BucketImage{Bucket: uint32(w.bucket), Word: cur})
	}
	d.reset()
	if len(images) == 0 {
		return nil
	}
	d.emittedImages += uint64(len(images))
	return &Batch{Images: images}
}

// reset forgets the window without emitting.
func (d *dirtyWindow) reset() {
	d.order = d.order[:0]
	d.gen++
	if d.gen == 0 { // wrapped: old stamps could alias the new generation
		clear(d.stamp)
		d.gen = 1
	}
}

func (d *dirtyWindow) bytes() uint64 {
	return uint64(cap(d.stamp))*4 + uint64(cap(d.order))*16
}
