package ckf_test

import (
	"fmt"

	"github.com/ckfrelay/ckfrelay/ckf"
)

// ExampleFilter builds a standalone filter, inserts keys, and shows that a
// removal clears exactly one copy of a duplicate.
func ExampleFilter() {
	f, err := ckf.NewFilter(1024, ckf.DefaultSeed, ckf.DefaultMaxKicks)
	if err != nil {
		panic(err)
	}
	for _, key := range []uint64{1, 2, 3, 3} { // 3 twice: duplicates take two slots
		if err := f.Insert(key); err != nil {
			panic(err)
		}
	}
	fmt.Println("contains 2:", f.Contains(2), "slots:", f.Len())
	_ = f.Remove(3)
	fmt.Println("contains 3 after one removal:", f.Contains(3))
	_ = f.Remove(3)
	fmt.Println("contains 3 after two removals:", f.Contains(3), "slots:", f.Len())
	// Output:
	// contains 2: true slots: 4
	// contains 3 after one removal: true
	// contains 3 after two removals: false slots: 2
}

// ExamplePool_ApplyEvent stores a two-block prefix for one worker rank and
// publishes it; a router probing the canonical hash of the tokens finds it.
func ExamplePool_ApplyEvent() {
	cfg := ckf.DefaultConfig()
	cfg.ExpectedBlocks = 1024
	pool, err := ckf.NewPool(cfg)
	if err != nil {
		panic(err)
	}
	salt := ckf.Salt("", "")
	tokens := []uint32{101, 102, 103, 104, 105, 106, 107, 108, 109} // 2 full blocks of 4, 1 partial
	locals := ckf.AppendLocalBlockHashes(nil, tokens, 4, salt)

	out := pool.ApplyEvent(&ckf.RouterEvent{
		WorkerID: 7,
		Kind:     ckf.EventStored,
		Blocks: []ckf.StoredBlock{
			{BlockHash: 0xA, TokensHash: locals[0]}, // external hashes are opaque engine ids
			{BlockHash: 0xB, TokensHash: locals[1]},
		},
	})
	fmt.Println("error:", out.FirstError, "boundary:", out.PublicationBoundary, "images:", len(out.Batch.Images) > 0)

	for i, h := range ckf.AppendSequenceHashes(nil, locals) {
		owners, resident := pool.Owners(h)
		fmt.Printf("block %d: owners=%d resident=%v found=%v\n", i, owners, resident, pool.Contains(h))
	}
	fmt.Println(pool.MemberCounts())
	// Output:
	// error: <nil> boundary: true images: true
	// block 0: owners=1 resident=true found=true
	// block 1: owners=1 resident=true found=true
	// [{{7 0} 2}]
}

// ExampleAppendSequenceHashes chains local block hashes into the canonical
// sequence hashes the filter is keyed by (the SPEC §3 vector).
func ExampleAppendSequenceHashes() {
	locals := []uint64{0x0123456789ABCDEF, 0x1111222233334444, 0xDEADBEEFCAFEBABE}
	for _, h := range ckf.AppendSequenceHashes(nil, locals) {
		fmt.Printf("%#016x\n", h)
	}
	// Output:
	// 0x0123456789abcdef
	// 0x98e7e55f299cf592
	// 0x65d53b99c5252d19
}
