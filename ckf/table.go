package ckf

// bucketWrite records one bucket write: its index and the word before it.
type bucketWrite struct {
	bucket uint64
	before uint64
}

// table is the physical cuckoo table shared by [Filter] and [Pool]: bucket
// words, addressing, the persistent RNG and the kick bound. Successful
// mutations append their writes, in write order, to t.writes so the caller
// can feed a dirty window; failed ones leave words and t.writes unchanged.
type table struct {
	words    []uint64
	addr     Addresser
	rng      RNG
	maxKicks int
	// writes is scratch reused across calls; valid until the next mutation.
	writes []bucketWrite
}

func newTable(bucketCount, seed uint64, maxKicks int) table {
	return table{
		words:    make([]uint64, bucketCount),
		addr:     NewAddresser(seed, bucketCount),
		rng:      NewRNG(seed),
		maxKicks: maxKicks,
	}
}

// set writes word into bucket and logs the write. before is the bucket's
// current word, which every caller has just read: passing it saves a reload.
func (t *table) set(bucket uint64, before Bucket, word Bucket) {
	t.writes = append(t.writes, bucketWrite{bucket, uint64(before)})
	t.words[bucket] = uint64(word)
}

// placeEmpty writes fp into the lowest empty slot of bucket a, else of its
// alternate b, without relocation and without an RNG draw. It reports whether
// it found room; on false it also returns b, computed only then.
func (t *table) placeEmpty(fp uint16, a uint64) (b uint64, ok bool) {
	w := Bucket(t.words[a])
	if s := w.LowestEmpty(); s >= 0 {
		t.set(a, w, w.WithSlot(s, fp))
		return 0, true
	}
	b = t.addr.Alternate(a, fp)
	w = Bucket(t.words[b])
	if s := w.LowestEmpty(); s >= 0 {
		t.set(b, w, w.WithSlot(s, fp))
		return 0, true
	}
	return b, false
}

// insert places key per SPEC §2.5. On success t.writes holds the writes; on
// failure every write is undone in reverse order, t.writes is empty and the
// error is ErrCapacityExhausted. RNG draws are never rolled back.
func (t *table) insert(key uint64) error {
	t.writes = t.writes[:0]
	fp, a := t.addr.primary(key)
	b, ok := t.placeEmpty(fp, a)
	if ok {
		return nil
	}
	cur := a
	if t.rng.Next()&1 != 0 {
		cur = b
	}
	carry := fp
	for range t.maxKicks {
		s := int(t.rng.Next() & 3)
		w := Bucket(t.words[cur])
		victim := w.Slot(s)
		t.set(cur, w, w.WithSlot(s, carry))
		carry = victim
		cur = t.addr.Alternate(cur, victim)
		w = Bucket(t.words[cur])
		if e := w.LowestEmpty(); e >= 0 {
			t.set(cur, w, w.WithSlot(e, carry))
			return nil
		}
	}
	// INVARIANT: after rollback the words are byte-identical to before the call.
	for i := len(t.writes) - 1; i >= 0; i-- {
		t.words[t.writes[i].bucket] = t.writes[i].before
	}
	t.writes = t.writes[:0]
	return ErrCapacityExhausted
}

// reoffer places key only into an empty slot of its two buckets (no
// relocation, no RNG draw): the re-offer of a non-resident block (SPEC §4.3).
func (t *table) reoffer(key uint64) bool {
	t.writes = t.writes[:0]
	_, ok := t.placeEmpty(t.addr.primary(key))
	return ok
}

// remove clears the first slot equal to key's fingerprint, bucket a before b,
// lowest slot first. It reports false, writing nothing, when neither holds it.
func (t *table) remove(key uint64) bool {
	t.writes = t.writes[:0]
	fp, a := t.addr.primary(key)
	w := Bucket(t.words[a])
	if s := w.Find(fp); s >= 0 {
		t.set(a, w, w.WithSlot(s, 0))
		return true
	}
	b := t.addr.Alternate(a, fp)
	w = Bucket(t.words[b])
	if s := w.Find(fp); s >= 0 {
		t.set(b, w, w.WithSlot(s, 0))
		return true
	}
	return false
}

// contains reports whether key's fingerprint is in either candidate bucket.
// Bucket b is computed only when a misses.
func (t *table) contains(key uint64) bool {
	fp, a := t.addr.primary(key)
	return Bucket(t.words[a]).Contains(fp) || Bucket(t.words[t.addr.Alternate(a, fp)]).Contains(fp)
}

// occupied counts non-empty slots. Cost O(buckets).
func (t *table) occupied() (slots, buckets int) {
	for _, w := range t.words {
		if n := Bucket(w).Occupied(); n > 0 {
			slots += n
			buckets++
		}
	}
	return slots, buckets
}
