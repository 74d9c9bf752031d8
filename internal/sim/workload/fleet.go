package workload

import (
	"container/list"
	"encoding/binary"
	"fmt"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/zeebo/xxh3"
)

// TokensHash is the stable local block hash the simulation gives a trace block
// id: XXH3_64(LE8(id), seed ckf.BaseSalt). Equal ids give equal hashes, so
// requests sharing leading ids share canonical prefixes.
func TokensHash(id uint64) uint64 {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], id)
	return xxh3.HashSeed(b[:], ckf.BaseSalt)
}

// Chain returns the canonical sequence hashes of a request's blocks.
func Chain(ids []uint64) []uint64 {
	locals := make([]uint64, len(ids))
	for i, id := range ids {
		locals[i] = TokensHash(id)
	}
	return ckf.AppendSequenceHashes(locals[:0:0], locals)
}

// FleetConfig sizes a simulated fleet.
type FleetConfig struct {
	DataCenters    int // 1..16
	WorkersPerDC   int // ≥ 1
	RanksPerWorker int // ≥ 1
	BlocksPerRank  int // LRU capacity of one rank, ≥ 1
}

// Validate checks the configuration.
func (c FleetConfig) Validate() error {
	switch {
	case c.DataCenters < 1 || c.DataCenters > ckf.MaxLanes:
		return fmt.Errorf("workload: data centers %d outside 1..=%d", c.DataCenters, ckf.MaxLanes)
	case c.WorkersPerDC < 1:
		return fmt.Errorf("workload: workers per data center %d < 1", c.WorkersPerDC)
	case c.RanksPerWorker < 1:
		return fmt.Errorf("workload: ranks per worker %d < 1", c.RanksPerWorker)
	case c.BlocksPerRank < 1:
		return fmt.Errorf("workload: blocks per rank %d < 1", c.BlocksPerRank)
	}
	return nil
}

// Fleet simulates the worker ranks of several data centers. Each rank holds a
// finite LRU cache of blocks and, when it serves a request, emits the events a
// real engine would: Removed for evicted blocks, then one parent-chained Stored
// event for the blocks it had to compute. The fleet also keeps the exact
// ground truth: which canonical blocks each data center holds.
type Fleet struct {
	cfg   FleetConfig
	dcs   []*dataCenter
	event uint64
}

type dataCenter struct {
	ranks []*rank
	held  map[uint64]int // canonical → number of ranks holding it
}

type rank struct {
	member ckf.Member
	lru    *list.List               // front = most recent; values are *cached
	blocks map[uint64]*list.Element // canonical → element
}

type cached struct {
	canonical uint64
	external  uint64
}

// NewFleet returns an empty fleet. Worker ids are dc*1000+worker, so members
// are unique across data centers.
func NewFleet(cfg FleetConfig) (*Fleet, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	f := &Fleet{cfg: cfg}
	for d := range cfg.DataCenters {
		dc := &dataCenter{held: make(map[uint64]int)}
		for w := range cfg.WorkersPerDC {
			for r := range cfg.RanksPerWorker {
				dc.ranks = append(dc.ranks, &rank{
					member: ckf.Member{WorkerID: uint64(d*1000 + w), DPRank: uint32(r)},
					lru:    list.New(),
					blocks: make(map[uint64]*list.Element),
				})
			}
		}
		f.dcs = append(f.dcs, dc)
	}
	return f, nil
}

// Config returns the fleet's configuration.
func (f *Fleet) Config() FleetConfig { return f.cfg }

// Ranks returns the number of ranks in each data center.
func (f *Fleet) Ranks() int { return f.cfg.WorkersPerDC * f.cfg.RanksPerWorker }

// Member returns the member of rank r of data center dc.
func (f *Fleet) Member(dc, r int) ckf.Member { return f.dcs[dc].ranks[r].member }

// external is the engine's opaque block id: stable per (worker, canonical)
// but different across workers, as with vLLM and SGLang.
func external(m ckf.Member, canonical uint64) uint64 {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], canonical)
	return xxh3.HashSeed(b[:], m.WorkerID<<32|uint64(m.DPRank))
}

// Depth returns the exact number of leading blocks of chain that data center
// dc holds on some rank (the union over its ranks): what an exact relay would
// answer.
func (f *Fleet) Depth(dc int, chain []uint64) int {
	held := f.dcs[dc].held
	for i, c := range chain {
		if held[c] == 0 {
			return i
		}
	}
	return len(chain)
}

// RankDepth returns the leading blocks of chain rank r of dc holds.
func (f *Fleet) RankDepth(dc, r int, chain []uint64) int {
	rk := f.dcs[dc].ranks[r]
	for i, c := range chain {
		if _, ok := rk.blocks[c]; !ok {
			return i
		}
	}
	return len(chain)
}

// Serve makes rank r of data center dc serve a request whose canonical chain
// is chain, and appends the events it emits to dst. The rank reuses its
// cached prefix, evicts least-recently-used blocks outside that prefix to make
// room, and stores as many missing blocks as fit.
func (f *Fleet) Serve(dst []ckf.RouterEvent, dc, r int, chain []uint64, locals []uint64) []ckf.RouterEvent {
	d := f.dcs[dc]
	rk := d.ranks[r]
	k := 0
	for k < len(chain) {
		e, ok := rk.blocks[chain[k]]
		if !ok {
			break
		}
		rk.lru.MoveToFront(e)
		k++
	}
	room := f.cfg.BlocksPerRank - k
	n := min(len(chain)-k, max(room, 0))
	if n == 0 {
		return dst
	}
	// Evict from the LRU tail as if all n blocks were new: the prefix was just
	// touched, so it sits at the front and survives as long as n ≤ capacity-k.
	if over := rk.lru.Len() + n - f.cfg.BlocksPerRank; over > 0 {
		ev := ckf.RouterEvent{WorkerID: rk.member.WorkerID, DPRank: rk.member.DPRank, Kind: ckf.EventRemoved, EventID: f.nextID()}
		for range over {
			back := rk.lru.Back()
			c := back.Value.(*cached)
			rk.lru.Remove(back)
			delete(rk.blocks, c.canonical)
			if d.held[c.canonical]--; d.held[c.canonical] == 0 {
				delete(d.held, c.canonical)
			}
			ev.BlockHashes = append(ev.BlockHashes, c.external)
		}
		dst = append(dst, ev)
	}
	st := ckf.RouterEvent{WorkerID: rk.member.WorkerID, DPRank: rk.member.DPRank, Kind: ckf.EventStored, EventID: f.nextID()}
	if k > 0 {
		st.HasParent = true
		st.ParentHash = external(rk.member, chain[k-1])
	}
	st.Blocks = make([]ckf.StoredBlock, 0, n)
	for i := k; i < k+n; i++ {
		ext := external(rk.member, chain[i])
		st.Blocks = append(st.Blocks, ckf.StoredBlock{BlockHash: ext, TokensHash: locals[i]})
		// A block past the first miss may still be cached (its ancestor was
		// evicted first): the engine stores it again under the same id.
		if e, ok := rk.blocks[chain[i]]; ok {
			rk.lru.MoveToFront(e)
			continue
		}
		rk.blocks[chain[i]] = rk.lru.PushFront(&cached{canonical: chain[i], external: ext})
		d.held[chain[i]]++
	}
	return append(dst, st)
}

func (f *Fleet) nextID() uint64 { f.event++; return f.event }

// HeldBlocks returns the number of distinct canonical blocks data center dc holds.
func (f *Fleet) HeldBlocks(dc int) int { return len(f.dcs[dc].held) }
