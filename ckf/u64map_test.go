package ckf

import (
	"maps"
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// TestU64Map_MatchesGoMap: random puts, gets and deletes (the zero key
// included, keys from a small space so probe runs collide, wrap around the
// slot array and shift back on deletion) leave the table holding exactly
// what a Go map holds, after every operation.
func TestU64Map_MatchesGoMap(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		m := newU64Map(rapid.IntRange(0, 20).Draw(t, "hint"))
		want := map[uint64]uint64{}
		keys := rapid.SliceOfN(rapid.Uint64(), 1, 64).Draw(t, "keys")
		keys = append(keys, 0)
		for i := range rapid.IntRange(1, 400).Draw(t, "ops") {
			k := rapid.SampledFrom(keys).Draw(t, "key")
			switch rapid.IntRange(0, 2).Draw(t, "op") {
			case 0:
				m.put(k, uint64(i))
				want[k] = uint64(i)
			case 1:
				v, ok := m.del(k)
				wv, wok := want[k]
				require.Equal(t, [2]any{wv, wok}, [2]any{v, ok}, "del %#x", k)
				delete(want, k)
			case 2:
				v, ok := m.get(k)
				wv, wok := want[k]
				require.Equal(t, [2]any{wv, wok}, [2]any{v, ok}, "get %#x", k)
			}
			require.Equal(t, len(want), m.len(), "len")
			require.Equal(t, want, maps.Collect(m.all), "contents")
			for _, k := range keys {
				v, ok := m.get(k)
				wv, wok := want[k]
				require.Equal(t, [2]any{wv, wok}, [2]any{v, ok}, "get %#x after op %d", k, i)
			}
			require.LessOrEqual(t, m.used*maxLoadDen, len(m.slots)*maxLoadNum, "load above the maximum")
		}
	})
}

// TestU64Map_HeapBytesIsTheSlotArray: the table's own account of its heap
// is what the allocator hands out for it, at every power-of-two size.
func TestU64Map_HeapBytesIsTheSlotArray(t *testing.T) {
	for _, n := range []int{1, 6, 7, 100, 1000, 100000} {
		m := newU64Map(0)
		for k := range uint64(n) {
			m.put(k+1, k)
		}
		require.Equal(t, uint64(u64MapSlotsFor(n))*16, m.heapBytes(), "%d keys", n)
		require.Equal(t, uint64(cap(m.slots))*16, m.heapBytes(), "%d keys", n)
	}
}

// TestU64Map_ChosenKeysDoNotPileUp: keys a peer could choose to collide
// under an unkeyed slot function (equal low bits, equal high bits, a
// stride) spread like random ones: no probe run grows long, so no lookup
// walks far (attack class: algorithmic complexity).
func TestU64Map_ChosenKeysDoNotPileUp(t *testing.T) {
	const n = 1 << 16
	for name, key := range map[string]func(i uint64) uint64{
		"same low bits":  func(i uint64) uint64 { return (i + 1) << 32 },
		"same high bits": func(i uint64) uint64 { return i + 1 },
		"stride 2^20":    func(i uint64) uint64 { return (i + 1) << 20 },
	} {
		m := newU64Map(0)
		for i := range uint64(n) {
			m.put(key(i), i)
		}
		mask := uint64(len(m.slots) - 1)
		longest := 0
		for i, s := range m.slots {
			if s.key != 0 {
				longest = max(longest, int((uint64(i)-m.home(s.key))&mask)+1)
			}
		}
		// Random keys at this load give runs of a few dozen at most; a
		// pile-up of n keys would give n.
		require.Less(t, longest, 100, "%s: longest probe %d over %d keys", name, longest, n)
	}
}
