package cbi1_test

import (
	"errors"
	"fmt"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/wire/cbi1"
)

// Example publishes a filter as a CBI1 snapshot and one delta, the way a
// relay fills FilterUpdate.payload, and installs them on the other side.
func Example() {
	filter, _ := ckf.NewFilter(32, ckf.DefaultSeed, 500)
	for key := range uint64(40) {
		_ = filter.Insert(key)
	}
	format := ckf.NewFormat(ckf.DefaultSeed, uint64(filter.BucketCount()))
	const dc = 7

	// Snapshot at sequence 1: ckf's table words are CBI1's words as they are.
	chunks, _ := cbi1.EncodeSnapshot(format, dc, 1, filter.Words())

	var (
		frame cbi1.Frame
		asm   cbi1.Assembler
		table []uint64
	)
	for _, payload := range chunks {
		if err := cbi1.Decode(payload, &frame); err != nil {
			panic(err)
		}
		if done, err := asm.Add(&frame); err != nil {
			panic(err)
		} else if done {
			table = append([]uint64(nil), asm.Words()...)
		}
	}

	// Delta 1 → 2 with two absolute images; a larger publication would be
	// refused with ErrDeltaTooLarge and sent as a snapshot instead.
	payload, _ := cbi1.EncodeDelta(format, dc, 1, 2, []ckf.BucketImage{
		{Bucket: 3, Word: uint64(ckf.Bucket(0).WithSlot(0, 0xBEEF))},
		{Bucket: 5, Word: 0x0001_0002_0003_0004},
	})
	if err := cbi1.Decode(payload, &frame); err != nil {
		panic(err)
	}
	if err := frame.CheckFormat(format); err != nil || frame.DCID != dc || frame.BaseEpoch != 1 {
		panic("not the stream we subscribed to")
	}
	for _, im := range frame.Images {
		table[im.Bucket] = im.Word
	}
	fmt.Printf("%d chunk(s), %d buckets, %d-byte delta\n", len(chunks), len(table), len(payload))
	fmt.Printf("bucket 3 slot 0 = %#x, bucket 5 = %#016x\n", ckf.Bucket(table[3]).Slot(0), table[5])

	payload[len(payload)-1] ^= 1
	err := cbi1.Decode(payload, &frame)
	fmt.Println(errors.Is(err, cbi1.ErrChecksum), err)
	// Output:
	// 1 chunk(s), 32 buckets, 84-byte delta
	// bucket 3 slot 0 = 0xbeef, bucket 5 = 0x0001000200030004
	// true cbi1: body checksum mismatch at offset 44 (body_checksum): header 0x59fa8af2, body 0xa8dd0837
}
