package wire_test

import (
	"bytes"
	"fmt"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/wire"
)

// A producer writes a delta to a stream; a consumer reads it back into a
// reusable Frame.
func Example() {
	var id ckf.ProducerIdentity
	id.Pool.DCID = 3
	id.Format = ckf.NewFormat(0x5DEECE66D1B54A33, 1024)
	lease := ckf.LaneLease{ConsumerInstance: 1, PhysicalLane: 2, AssignmentEpoch: 1}

	var stream bytes.Buffer
	w := wire.NewWriter(&stream, 0)
	out := wire.Frame{Kind: wire.KindDelta, Delta: ckf.Delta{
		Identity: id, Lease: lease, BaseSequence: 4, Sequence: 5,
		Images: []ckf.BucketImage{{Bucket: 7, Word: 0x1234}},
	}}
	if err := w.WriteFrame(&out); err != nil {
		panic(err)
	}
	fmt.Println("stream bytes:", stream.Len())

	r := wire.NewReader(&stream, 0)
	var in wire.Frame
	if err := r.ReadFrame(&in); err != nil {
		panic(err)
	}
	d := in.Delta
	fmt.Printf("%v %d→%d lane %d dc %d images %+v\n", in.Kind, d.BaseSequence, d.Sequence, d.Lease.PhysicalLane, d.Identity.Pool.DCID, d.Images)
	// Output:
	// stream bytes: 86
	// delta 4→5 lane 2 dc 3 images [{Bucket:7 Word:4660}]
}

func ExampleDecodeRouterEventJSON() {
	ev, err := wire.DecodeRouterEventJSON([]byte(`{"worker_id":7,"event":{"event_id":1,"data":{"stored":{"parent_hash":null,"blocks":[{"block_hash":11,"tokens_hash":22}]}}}}`))
	fmt.Println(ev.Member(), ev.StorageTier, ev.Kind, ev.HasParent, ev.Blocks, err)
	// Output: {7 0} device stored false [{11 22}] <nil>
}
