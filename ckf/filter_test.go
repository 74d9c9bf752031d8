package ckf

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// refFilter is a deliberately plain transcription of SPEC §2.5–§2.6 over
// [4]uint16 slot arrays: no packing, no write log, rollback by restoring a
// full copy. The production table must produce the same words.
type refFilter struct {
	slots    [][4]uint16
	addr     specAddresser
	rng      RNG
	maxKicks int
}

func newRefFilter(buckets int, seed uint64, maxKicks int) *refFilter {
	return &refFilter{slots: make([][4]uint16, buckets), addr: newSpecAddresser(seed, uint64(buckets)), rng: NewRNG(seed), maxKicks: maxKicks}
}

func (f *refFilter) putEmpty(bucket uint64, fp uint16) bool {
	for s := range 4 {
		if f.slots[bucket][s] == 0 {
			f.slots[bucket][s] = fp
			return true
		}
	}
	return false
}

func (f *refFilter) insert(key uint64) bool {
	ad := f.addr.Address(key)
	if f.putEmpty(ad.A, ad.Fingerprint) || f.putEmpty(ad.B, ad.Fingerprint) {
		return true
	}
	saved := slices.Clone(f.slots)
	cur := ad.A
	if f.rng.Next()&1 == 1 {
		cur = ad.B
	}
	carry := ad.Fingerprint
	for range f.maxKicks {
		s := f.rng.Next() & 3
		carry, f.slots[cur][s] = f.slots[cur][s], carry
		cur = f.addr.Alternate(cur, carry)
		if f.putEmpty(cur, carry) {
			return true
		}
	}
	f.slots = saved
	return false
}

func (f *refFilter) remove(key uint64) bool {
	ad := f.addr.Address(key)
	for _, bk := range []uint64{ad.A, ad.B} {
		for s := range 4 {
			if f.slots[bk][s] == ad.Fingerprint {
				f.slots[bk][s] = 0
				return true
			}
		}
	}
	return false
}

func (f *refFilter) words() []uint64 {
	out := make([]uint64, len(f.slots))
	for i, b := range f.slots {
		for s, fp := range b {
			out[i] |= uint64(fp) << (16 * s)
		}
	}
	return out
}

// keysWithA returns n distinct keys, starting the search at from, whose
// first candidate bucket is a.
func keysWithA(ad Addresser, a uint64, from uint64, n int) []uint64 {
	var out []uint64
	for k := from; len(out) < n; k++ {
		if ad.Address(k).A == a {
			out = append(out, k)
		}
	}
	return out
}

func mustFilter(t testing.TB, buckets int, seed uint64, maxKicks int) *Filter {
	t.Helper()
	f, err := NewFilter(buckets, seed, maxKicks)
	require.NoError(t, err, "NewFilter(%d, %#x, %d) error", buckets, seed, maxKicks)
	return f
}

func TestNewFilter_Errors(t *testing.T) {
	cases := []struct {
		name     string
		buckets  int
		maxKicks int
		want     error
	}{
		{"negative buckets", -2, 1, ErrInvalidFormat},
		{"zero buckets", 0, 1, ErrInvalidFormat},
		{"one bucket", 1, 1, ErrInvalidFormat},
		{"not power of two", 12, 1, ErrInvalidFormat},
		{"too many buckets", 1 << 25, 1, ErrInvalidFormat},
		{"zero kicks", 2, 0, ErrInvalidConfig},
		{"too many kicks", 2, MaxMaxKicks + 1, ErrInvalidConfig},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f, err := NewFilter(tc.buckets, DefaultSeed, tc.maxKicks)
			require.Nil(t, f, "NewFilter(%d, _, %d) = %v, %v; want nil, %v", tc.buckets, tc.maxKicks, f, err, tc.want)
			require.ErrorIs(t, err, tc.want, "NewFilter(%d, _, %d) = %v, %v; want nil, %v", tc.buckets, tc.maxKicks, f, err, tc.want)
		})
	}
	_, err := NewFilter(MaxBucketCount, DefaultSeed, MaxMaxKicks)
	require.NoError(t, err, "NewFilter(max, _, max) error = %v, want nil", err)
}

// TestFilter_InsertLowestEmptySlotNoDraw: with room, insertion writes the
// lowest empty slot of a, then of b, and draws nothing from the RNG.
func TestFilter_InsertLowestEmptySlotNoDraw(t *testing.T) {
	f := mustFilter(t, 2, DefaultSeed, 10)
	ad := f.t.addr
	keys := keysWithA(ad, 0, 0, 5) // five keys whose first bucket is 0 (so b = 1)
	rng0 := f.t.rng.State()
	for i, k := range keys {
		require.NoError(t, f.Insert(k), "Insert(%d) error", k)
		fp := ad.Address(k).Fingerprint
		if i < 4 {
			got := Bucket(f.t.words[0]).Slot(i)
			require.Equal(t, fp, got, "key %d: bucket a slot %d = %#x, want %#x", i, i, got, fp)
			require.Equal(t, uint64(0), f.t.words[1], "key %d: bucket b = %#x, want untouched 0 while a has room", i, f.t.words[1])
		} else {
			got := Bucket(f.t.words[1]).Slot(0)
			require.Equal(t, fp, got, "fifth key: bucket b slot 0 = %#x, want %#x (a full, b next)", got, fp)
		}
	}
	got := f.t.rng.State()
	require.Equal(t, rng0, got, "RNG state = %#x after inserts with room, want unchanged %#x", got, rng0)
	// Free slot 1 of a: the next key with a = 0 must take slot 1, not b's slot 1.
	require.NoError(t, f.Remove(keys[1]), "Remove error")
	k := keysWithA(ad, 0, keys[4]+1, 1)[0]
	require.NoError(t, f.Insert(k), "Insert error")
	{
		got, want := Bucket(f.t.words[0]).Slot(1), ad.Address(k).Fingerprint
		require.Equal(t, want, got, "refilled slot 1 of a = %#x, want %#x", got, want)
	}
}

// TestFilter_CapacityRollback: a failed bounded relocation leaves the words
// byte-identical, keeps the draws it made and reports ErrCapacityExhausted.
func TestFilter_CapacityRollback(t *testing.T) {
	const kicks = 7
	f := mustFilter(t, 2, DefaultSeed, kicks)
	for k := uint64(100); k < 108; k++ { // 2 buckets × 4 slots: every key fits until full
		err := f.Insert(k)
		require.NoError(t, err, "Insert(%d) error = %v, want room", k, err)
	}
	before := f.Words()
	want := f.t.rng
	for range 1 + kicks { // one start draw, one victim draw per kick
		want.Next()
	}
	err := f.Insert(999)
	require.ErrorIs(t, err, ErrCapacityExhausted, "Insert into a full table error = %v, want ErrCapacityExhausted", err)
	got := f.Words()
	require.True(t, slices.Equal(got, before), "words after failed insert = %#x, want byte-identical %#x", got, before)
	require.Empty(t, f.t.writes, "write log after failure has %d entries, want 0", len(f.t.writes))
	{
		got := f.t.rng.State()
		require.Equal(t, want.State(), got, "RNG state after failure = %#x, want %#x (draws are not rolled back)", got, want.State())
	}
	require.Equal(t, 8, f.Len(), "Len, LoadFactor = %d, %v; want 8, 1", f.Len(), f.LoadFactor())
	require.Equal(t, float64(1), f.LoadFactor(), "Len, LoadFactor = %d, %v; want 8, 1", f.Len(), f.LoadFactor())
	for k := uint64(100); k < 108; k++ {
		require.True(t, f.Contains(k), "Contains(%d) = false after failed insert, want true", k)
	}
}

// TestFilter_RelocationWriteLog: a relocating insertion reports every write
// as (bucket, value before) in write order, so replaying the befores in
// reverse restores the previous words.
func TestFilter_RelocationWriteLog(t *testing.T) {
	f := mustFilter(t, 16, 3, 500)
	relocated := 0
	for k := uint64(0); k < 64 && relocated < 5; k++ {
		prev := f.Words()
		if err := f.Insert(k); err != nil {
			continue
		}
		w := f.t.writes
		if len(w) > 1 {
			relocated++
		}
		cur := f.Words()
		// Forward replay: each write's before must be the then-current word;
		// its after is the next write's before of that bucket, or the final word.
		sim := slices.Clone(prev)
		for i, wr := range w {
			require.Equal(t, sim[wr.bucket], wr.before, "key %d: write %d to bucket %d reports before %#x, want the then-current %#x", k, i, wr.bucket, wr.before, sim[wr.bucket])
			after := cur[wr.bucket]
			for _, later := range w[i+1:] {
				if later.bucket == wr.bucket {
					after = later.before
					break
				}
			}
			sim[wr.bucket] = after
		}
		require.True(t, slices.Equal(sim, cur), "key %d: forward replay of writes gives %#x, want %#x", k, sim, cur)
		undo := slices.Clone(cur)
		for i := len(w) - 1; i >= 0; i-- {
			undo[w[i].bucket] = w[i].before
		}
		require.True(t, slices.Equal(undo, prev), "key %d: undoing %d writes gives %#x, want %#x", k, len(w), undo, prev)
		for b := range cur {
			require.False(t, cur[b] != prev[b] && !slices.ContainsFunc(w, func(x bucketWrite) bool { return x.bucket == uint64(b) }), "key %d: bucket %d changed without a reported write", k, b)
		}
	}
	require.NotEqual(t, 0, relocated, "no insertion relocated; the test did not exercise the kick path")
}

func TestFilter_DuplicatesAndSingleCopyRemoval(t *testing.T) {
	f := mustFilter(t, 2, DefaultSeed, 10)
	k := keysWithA(f.t.addr, 1, 0, 1)[0]
	fp := uint64(f.t.addr.Address(k).Fingerprint)
	for range 5 { // four copies fill a = 1, the fifth goes to b = 0
		require.NoError(t, f.Insert(k), "Insert duplicate error")
	}
	want := []uint64{fp, fp | fp<<16 | fp<<32 | fp<<48}
	got := f.Words()
	require.True(t, slices.Equal(got, want), "words after 5 copies = %#x, want %#x", got, want)
	steps := []struct {
		name string
		want []uint64
	}{
		{"first removal clears a slot 0", []uint64{fp, fp<<16 | fp<<32 | fp<<48}},
		{"second clears a slot 1", []uint64{fp, fp<<32 | fp<<48}},
		{"third clears a slot 2", []uint64{fp, fp << 48}},
		{"fourth clears a slot 3", []uint64{fp, 0}},
		{"fifth falls back to b", []uint64{0, 0}},
	}
	for _, s := range steps {
		require.NoError(t, f.Remove(k), "%s: Remove error", s.name)
		got := f.Words()
		require.True(t, slices.Equal(got, s.want), "%s: words = %#x, want %#x", s.name, got, s.want)
	}
	require.False(t, f.Contains(k), "Contains after removing every copy = true, want false")
	err := f.Remove(k)
	require.ErrorIs(t, err, ErrBlockNotFound, "Remove of absent key error = %v, want ErrBlockNotFound", err)
	require.Equal(t, 0, f.Len(), "Len() = %d, want 0", f.Len())
}

func TestFilter_WordsIsACopy(t *testing.T) {
	f := mustFilter(t, 4, DefaultSeed, 10)
	require.NoError(t, f.Insert(1))
	w := f.Words()
	clear(w)
	require.True(t, f.Contains(1), "clearing the Words() copy changed the filter")
	require.Equal(t, 4, f.BucketCount(), "BucketCount() = %d, want 4", f.BucketCount())
}

// TestFilter_MatchesSpecReference drives random insert/remove streams through
// Filter and the plain SPEC transcription and requires identical words,
// results and RNG state after every step — the bit-compatibility claim.
func TestFilter_MatchesSpecReference(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		buckets := 1 << rapid.IntRange(1, 6).Draw(t, "log2buckets")
		kicks := rapid.IntRange(1, 40).Draw(t, "kicks")
		seed := rapid.Uint64().Draw(t, "seed")
		f, err := NewFilter(buckets, seed, kicks)
		require.NoError(t, err, "NewFilter error")
		ref := newRefFilter(buckets, seed, kicks)
		var live []uint64
		n := rapid.IntRange(1, 6*buckets).Draw(t, "ops")
		for i := range n {
			if len(live) > 0 && rapid.IntRange(0, 3).Draw(t, "op") == 0 {
				j := rapid.IntRange(0, len(live)-1).Draw(t, "victim")
				k := live[j]
				live = slices.Delete(live, j, j+1)
				gotErr, want := f.Remove(k), ref.remove(k)
				require.Equal(t, want, (gotErr == nil), "op %d Remove(%#x) = %v, reference %v (a live key must be removable)", i, k, gotErr, want)
				require.True(t, want, "op %d Remove(%#x) = %v, reference %v (a live key must be removable)", i, k, gotErr, want)
			} else {
				k := rapid.Uint64Range(0, 3*uint64(buckets)).Draw(t, "key") // small space: duplicates happen
				gotErr, want := f.Insert(k), ref.insert(k)
				require.Equal(t, want, (gotErr == nil), "op %d Insert(%#x) = %v, reference ok=%v", i, k, gotErr, want)
				if want {
					live = append(live, k)
				} else {
					require.ErrorIs(t, gotErr, ErrCapacityExhausted, "op %d Insert error = %v, want ErrCapacityExhausted", i, gotErr)
				}
			}
			got, want := f.Words(), ref.words()
			require.True(t, slices.Equal(got, want), "op %d: words %#x, reference %#x", i, got, want)
			require.Equal(t, ref.rng.State(), f.t.rng.State(), "op %d: RNG state %#x, reference %#x", i, f.t.rng.State(), ref.rng.State())
			require.Len(t, live, f.Len(), "op %d: Len() = %d, want %d", i, f.Len(), len(live))
			for _, k := range live {
				require.True(t, f.Contains(k), "op %d: Contains(%#x) = false for a live key (false negative)", i, k)
			}
		}
	})
}
