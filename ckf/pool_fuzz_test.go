package ckf

import "testing"

// byteChoices decodes fuzz input into decisions, one byte each (two when n
// exceeds 256). It reports exhaustion so a short input is a short history.
type byteChoices struct{ data []byte }

func (b *byteChoices) intn(n int, _ string) (int, bool) {
	if len(b.data) == 0 {
		return 0, false
	}
	v := int(b.data[0])
	b.data = b.data[1:]
	if n > 256 && len(b.data) > 0 {
		v = v<<8 | int(b.data[0])
		b.data = b.data[1:]
	}
	return v % n, true
}

// FuzzPoolApplyEvent decodes the input into a tiny pool configuration and a
// short history of stores, removes, clears, replacements, resets, flushes and
// snapshots, and checks after every step that nothing panics and every
// invariant of the model harness holds (see harness.check).
func FuzzPoolApplyEvent(f *testing.F) {
	f.Add([]byte{0, 0, 0})
	f.Add([]byte{0, 3, 1, 0, 0, 4, 1, 1, 2, 2, 3, 3, 4, 4, 0, 5, 0, 2, 1, 1, 7, 0, 0})
	f.Add([]byte{1, 1, 2, 0, 1, 3, 5, 1, 5, 2, 5, 3, 5, 4, 0, 8, 1, 3, 9, 1, 10, 0, 11, 2})
	f.Add([]byte("store remove clear replace flush snapshot: a longer history to start from"))
	long := make([]byte, 512) // a long pseudo-random history
	for i := range long {
		long[i] = byte(i*7919>>3) ^ byte(i)
	}
	f.Add(long)
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < 3 {
			return
		}
		cfg := DefaultConfig()
		cfg.ExpectedBlocks = []uint64{1, 3, 7, 16}[data[0]%4]
		cfg.MaxKicks = 1 + int(data[1]%16)
		cfg.PublishEveryNEvents = 1 + uint64(data[2]%4)
		cfg.Seed = uint64(data[0]) * 0x9E3779B97F4A7C15
		cfg.MaxMembers = int(data[1]>>4) % 4                         // 0: no bound
		cfg.MaxTrackedBlocks = []uint64{0, 3, 8, 20}[(data[2]>>4)%4] // 0: no bound
		h := newHarness(t, cfg)
		c := &byteChoices{data: data[3:]}
		for range 64 {
			if !h.step(c) {
				break
			}
		}
		h.finish()
	})
}
