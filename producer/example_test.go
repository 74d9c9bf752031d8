package producer_test

import (
	"context"
	"fmt"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/producer"
)

// A subscriber installs the snapshot, then applies each delta's absolute
// bucket images; after Shutdown its table equals the producer's.
func ExampleHandle_Subscribe() {
	cfg := ckf.DefaultConfig()
	cfg.ExpectedBlocks = 32
	pool, _ := ckf.NewPool(cfg)
	h, _, _ := producer.Start(pool, producer.Scope{ProducerIncarnation: 1}, producer.DefaultConfig())
	ctx := context.Background()

	sub, _ := h.Subscribe(ctx, ckf.LaneLease{ConsumerInstance: 7, AssignmentEpoch: 1})
	table := append([]uint64(nil), sub.Snapshot.Words...)

	ev := ckf.RouterEvent{WorkerID: 1, Kind: ckf.EventStored,
		Blocks: []ckf.StoredBlock{{BlockHash: 11, TokensHash: 11}}}
	_ = h.AdmitEvent(ctx, 0, ev)
	_ = h.Shutdown(ctx)

	for d := range sub.Deltas() {
		fmt.Printf("delta %d→%d with %d image(s)\n", d.BaseSequence, d.Sequence, len(d.Images))
		for _, im := range d.Images {
			table[im.Bucket] = im.Word
		}
	}
	m, _ := sub.DrainMarker()
	fmt.Println("stream ended:", sub.Err(), "at sequence", m.ExpectedSequence)
	// Output:
	// delta 0→1 with 1 image(s)
	// stream ended: producer: shutting down at sequence 1
}
