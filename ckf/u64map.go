package ckf

import (
	"math/bits"
	"math/rand/v2"
	"unsafe"
)

// u64Map is the exact state's hash table from a uint64 key to a uint64
// value: a member's lineage (external → canonical) and a shard's owner
// counts (canonical → owners). Open addressing with linear probing over
// 16-byte slots holding key and value inline, so a lookup costs one cache
// line in the common case where Go's swiss map costs a control word, a slot
// group and a table header (docs/RATIONALE.md "Why its own hash table for
// the exact state?"). Deletion shifts the following entries back instead of
// leaving tombstones, so probe lengths depend on the live entries alone.
//
// Key 0 marks an empty slot; the key 0 itself is kept beside the slots. The
// slot of a key is a SplitMix64 finalizer keyed by a random per-table seed:
// a peer choosing block hashes cannot aim them at one probe run. The table
// doubles when 3/4 full and never shrinks (as Go's maps); the zero value is
// an empty table that allocates on first insertion.
type u64Map struct {
	slots   []u64Slot // power-of-two length, nil until the first insertion
	used    int       // keys in slots (the zero key is not among them)
	seed    uint64
	shift   uint8 // 64 - log2(len(slots))
	hasZero bool
	zero    uint64 // the zero key's value, when hasZero
}

type u64Slot struct{ key, val uint64 }

// u64MapMinSlots is the smallest slot array: 128 bytes, two cache lines.
const u64MapMinSlots = 8

// The table grows before it is more than maxLoadNum/maxLoadDen full.
const (
	maxLoadNum = 3
	maxLoadDen = 4
)

// u64SlotBytes is one slot's size: key and value inline.
const u64SlotBytes = uint64(unsafe.Sizeof(u64Slot{}))

// newU64Map returns an empty table with room for hint keys before it grows.
func newU64Map(hint int) u64Map {
	m := u64Map{seed: rand.Uint64()}
	if hint > 0 {
		m.alloc(u64MapSlotsFor(hint))
	}
	return m
}

// u64MapSlotsFor is the slot count that holds n keys at most
// maxLoadNum/maxLoadDen full.
func u64MapSlotsFor(n int) int {
	need := (uint64(n)*maxLoadDen + maxLoadNum - 1) / maxLoadNum
	return max(u64MapMinSlots, 1<<bits.Len64(need-1))
}

func (m *u64Map) alloc(n int) {
	m.slots = make([]u64Slot, n)
	m.shift = uint8(64 - bits.TrailingZeros(uint(n)))
}

// home is k's first probe slot.
func (m *u64Map) home(k uint64) uint64 { return mix64(k, m.seed) >> m.shift }

// len returns the number of keys.
func (m *u64Map) len() int {
	if m.hasZero {
		return m.used + 1
	}
	return m.used
}

// get returns k's value and whether k is present.
func (m *u64Map) get(k uint64) (uint64, bool) {
	if k == 0 {
		return m.zero, m.hasZero
	}
	if m.used == 0 {
		return 0, false
	}
	mask := uint64(len(m.slots) - 1)
	for i := m.home(k); ; i = (i + 1) & mask {
		s := &m.slots[i]
		if s.key == k {
			return s.val, true
		}
		if s.key == 0 {
			return 0, false
		}
	}
}

// touch loads k's first probe slot and returns its key: a caller about to
// look up several keys touches them all first, so that the cache misses
// are in flight together (the loads do not depend on one another) rather
// than one after the other inside the lookups.
func (m *u64Map) touch(k uint64) uint64 {
	if m.used == 0 {
		return 0
	}
	return m.slots[m.home(k)].key
}

// put sets k's value, inserting k when absent.
func (m *u64Map) put(k, v uint64) {
	if k == 0 {
		m.zero, m.hasZero = v, true
		return
	}
	if m.slots != nil {
		mask := uint64(len(m.slots) - 1)
		for i := m.home(k); ; i = (i + 1) & mask {
			s := &m.slots[i]
			if s.key == k {
				s.val = v
				return
			}
			if s.key == 0 {
				if (m.used+1)*maxLoadDen <= len(m.slots)*maxLoadNum {
					s.key, s.val = k, v
					m.used++
					return
				}
				break // full enough: grow, then insert
			}
		}
	}
	m.grow()
	m.insertNew(k, v)
	m.used++
}

// insertNew stores a key known to be absent, with room for it.
func (m *u64Map) insertNew(k, v uint64) {
	mask := uint64(len(m.slots) - 1)
	i := m.home(k)
	for m.slots[i].key != 0 {
		i = (i + 1) & mask
	}
	m.slots[i] = u64Slot{key: k, val: v}
}

// grow doubles the slot array (or makes the first one) and re-inserts.
func (m *u64Map) grow() {
	old := m.slots
	m.alloc(max(u64MapMinSlots, 2*len(old)))
	for _, s := range old {
		if s.key != 0 {
			m.insertNew(s.key, s.val)
		}
	}
}

// del removes k and returns its value and whether it was present.
func (m *u64Map) del(k uint64) (uint64, bool) {
	if k == 0 {
		v, ok := m.zero, m.hasZero
		m.zero, m.hasZero = 0, false
		return v, ok
	}
	if m.used == 0 {
		return 0, false
	}
	mask := uint64(len(m.slots) - 1)
	i := m.home(k)
	for m.slots[i].key != k {
		if m.slots[i].key == 0 {
			return 0, false
		}
		i = (i + 1) & mask
	}
	v := m.slots[i].val
	// Backward shift: walk the run after the hole; an entry whose home is
	// not cyclically within (hole, its slot] moves into the hole.
	for j := (i + 1) & mask; m.slots[j].key != 0; j = (j + 1) & mask {
		h := m.home(m.slots[j].key)
		if (j > i && (h <= i || h > j)) || (j < i && h <= i && h > j) {
			m.slots[i] = m.slots[j]
			i = j
		}
	}
	m.slots[i] = u64Slot{}
	m.used--
	return v, true
}

// all iterates the keys and values in slot order (the zero key first).
func (m *u64Map) all(yield func(k, v uint64) bool) {
	if m.hasZero && !yield(0, m.zero) {
		return
	}
	for _, s := range m.slots {
		if s.key != 0 && !yield(s.key, s.val) {
			return
		}
	}
}

// heapBytes is the heap the table holds: its slot array (a power-of-two
// size, which Go's allocator serves without rounding).
func (m *u64Map) heapBytes() uint64 { return uint64(len(m.slots)) * u64SlotBytes }

// mix64 is a SplitMix64 finalizer of h keyed by key.
func mix64(h, key uint64) uint64 {
	z := h ^ key
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	return z ^ (z >> 31)
}
