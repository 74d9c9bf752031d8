package ckf

import (
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// recorded is a choice source that draws from rapid and remembers every
// draw; replay gives the same draws again.
type recorded struct {
	t     *rapid.T
	draws []int
}

func (r *recorded) intn(n int, label string) (int, bool) {
	v := rapid.IntRange(0, n-1).Draw(r.t, label)
	r.draws = append(r.draws, v)
	return v, true
}

type replay struct {
	draws []int
	at    int
}

// sortedImage is p's image, canonical.
func sortedImage(p *Pool) PoolImage {
	img := p.Image()
	img.SortLineages()
	return img
}

func (r *replay) intn(n int, _ string) (int, bool) {
	v := r.draws[r.at]
	r.at++
	return v, true
}

// TestPool_RestoredImageContinuesExactly is the checkpoint property of issue
// #34 at the pool: a random history (small tables: relocations and capacity
// omissions; limits; replacements, resets, flushes) runs on pool A; at a
// random step the image of A is restored into pool B, which takes A's place
// in a second run of the same history. From there on B is checked after
// every step against the model and the SPEC reference filter that replayed
// everything (words, generator state, lineages, owners, residency, pending
// count, what consumers hold), and at the end B and A have equal images
// and statistics, word for word.
func TestPool_RestoredImageContinuesExactly(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		cfg := DefaultConfig()
		cfg.ExpectedBlocks = rapid.SampledFrom([]uint64{1, 3, 7, 16, 40}).Draw(t, "expected")
		cfg.MaxKicks = rapid.IntRange(1, 30).Draw(t, "kicks")
		cfg.PublishEveryNEvents = rapid.Uint64Range(1, 5).Draw(t, "every")
		cfg.Seed = rapid.Uint64().Draw(t, "seed")
		cfg.MaxMembers = rapid.IntRange(0, 3).Draw(t, "maxMembers")
		cfg.MaxTrackedBlocks = rapid.SampledFrom([]uint64{0, 0, 3, 8, 20}).Draw(t, "maxTracked")
		cfg.ApplyWorkers = rapid.SampledFrom([]int{0, 2}).Draw(t, "workers")
		n := rapid.IntRange(1, 150).Draw(t, "steps")
		cut := rapid.IntRange(0, n).Draw(t, "checkpoint step")

		src := &recorded{t: t}
		a := newHarness(t, cfg)
		var img PoolImage
		for i := range n + 1 {
			if i == cut {
				img = sortedImage(a.p)
			}
			if i < n {
				a.step(src)
			}
		}

		b := newHarness(t, cfg)
		rp := &replay{draws: src.draws}
		for i := range n + 1 {
			if i == cut {
				p, err := RestorePool(cfg, &img)
				require.NoError(t, err)
				require.Equal(t, img, sortedImage(p), "a restored pool's image is the image")
				b.p = p
				b.check()
			}
			if i < n {
				b.step(rp)
			}
		}
		require.Equal(t, sortedImage(a.p), sortedImage(b.p), "image after the history")
		// The two memory estimates describe this process's allocations, not
		// the state: DirtyTrackingBytes the window's capacity (how large it
		// grew here), ExactStateBytes the maps of each shard, and shards are
		// keyed by a random per-process key.
		sa, sb := a.p.Stats(), b.p.Stats()
		sa.DirtyTrackingBytes, sb.DirtyTrackingBytes = 0, 0
		sa.ExactStateBytes, sb.ExactStateBytes = 0, 0
		require.Equal(t, sa, sb, "statistics after the history")
		a.finish()
		b.finish()
		require.Equal(t, sortedImage(a.p), sortedImage(b.p), "image after the final flush")
	})
}

// TestRestorePool_RefusesInconsistentImages: an image that does not fit the
// configuration or contradicts itself is refused with ErrInvalidImage.
func TestRestorePool_RefusesInconsistentImages(t *testing.T) {
	cfg := DefaultConfig()
	cfg.ExpectedBlocks = 64
	p, err := NewPool(cfg)
	require.NoError(t, err)
	m := Member{WorkerID: 1}
	for i := range uint64(20) {
		require.NoError(t, p.ApplyEvent(rootEv(m, b(100+i, 500+i))).FirstError)
	}
	good := p.Image()
	_, err = RestorePool(cfg, &good)
	require.NoError(t, err)

	clone := func() PoolImage {
		img := good
		img.Words = append([]uint64(nil), good.Words...)
		img.Members = append([]MemberLineage(nil), good.Members...)
		img.Members[0].Blocks = append([]LineageEntry(nil), good.Members[0].Blocks...)
		return img
	}
	other := cfg
	other.Seed++
	cases := map[string]func(*PoolImage) Config{
		"another format":    func(*PoolImage) Config { return other },
		"words missing":     func(i *PoolImage) Config { i.Words = i.Words[1:]; return cfg },
		"word cleared":      func(i *PoolImage) Config { clearFirstWord(i); return cfg },
		"extra fingerprint": func(i *PoolImage) Config { addFingerprint(i); return cfg },
		"member twice":      func(i *PoolImage) Config { i.Members = append(i.Members, i.Members[0]); return cfg },
		"external twice": func(i *PoolImage) Config {
			i.Members[0].Blocks[1].External = i.Members[0].Blocks[0].External
			return cfg
		},
		"empty member":        func(i *PoolImage) Config { i.Members[0].Blocks = nil; return cfg },
		"untracked omission":  func(i *PoolImage) Config { i.NonResident = []uint64{7}; return cfg },
		"window out of range": func(i *PoolImage) Config { i.Window = []BucketImage{{Bucket: uint32(len(i.Words))}}; return cfg },
		"window repeated":     func(i *PoolImage) Config { i.Window = []BucketImage{{Bucket: 1}, {Bucket: 1}}; return cfg },
		"member limit": func(*PoolImage) Config {
			c := cfg
			c.MaxMembers = 0
			c.MaxTrackedBlocks = 5
			return c
		},
	}
	for name, damage := range cases {
		t.Run(name, func(t *testing.T) {
			img := clone()
			c := damage(&img)
			_, err := RestorePool(c, &img)
			require.ErrorIs(t, err, ErrInvalidImage)
		})
	}
}

func clearFirstWord(img *PoolImage) {
	for i, w := range img.Words {
		if w != 0 {
			img.Words[i] = 0
			return
		}
	}
}

func addFingerprint(img *PoolImage) {
	for i, w := range img.Words {
		if s := Bucket(w).LowestEmpty(); s >= 0 {
			img.Words[i] = uint64(Bucket(w).WithSlot(s, 0xBEEF))
			return
		}
	}
}
