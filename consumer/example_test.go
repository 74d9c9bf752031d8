package consumer_test

import (
	"fmt"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/consumer"
)

// Example shows one lane's life: a producer pool stores a request's blocks,
// the consumer installs a barrier snapshot and then a delta, and a query
// reports how many leading blocks the pool holds.
func Example() {
	domain := ckf.Domain{CacheSemantics: ckf.ScopedDigest{Digest: [16]byte{1}}}
	pool := ckf.PoolID{Domain: domain, DCID: 1}
	format := ckf.NewFormat(0x5DEECE66D1B54A33, 64)
	m := consumer.Manifest{ConsumerInstance: 7, Domain: domain, Format: format, VerificationWindow: 2}
	m.Lanes[0] = &pool
	c, err := consumer.New(m)
	if err != nil {
		panic(err)
	}
	identity := ckf.ProducerIdentity{Pool: pool, ProducerIncarnation: 1, Format: format}
	lease := ckf.LaneLease{ConsumerInstance: 7, PhysicalLane: 0, AssignmentEpoch: 1}
	if err := c.Assign(identity, lease); err != nil {
		panic(err)
	}

	// A request of 4 blocks of 4 tokens; the producer holds its first 2 blocks.
	tokens := []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	locals := ckf.AppendLocalBlockHashes(nil, tokens, 4, ckf.BaseSalt)
	seq := ckf.AppendSequenceHashes(nil, locals)
	producer, _ := ckf.NewFilter(64, format.Seed, 500)
	for _, h := range seq[:2] {
		_ = producer.Insert(h)
	}
	r := c.InstallSnapshot(&ckf.Snapshot{Identity: identity, Lease: lease, Sequence: 10, Words: producer.Words()})
	fmt.Println(r)

	var res consumer.QueryResult
	_ = c.QueryTokens(tokens, 4, ckf.BaseSalt, &res)
	fmt.Println("depth after snapshot:", res.Depths[0], "of", res.Blocks)

	// The pool stores block 3: the delta carries the changed bucket's new word.
	before := producer.Words()
	_ = producer.Insert(seq[2])
	var images []ckf.BucketImage
	for b, w := range producer.Words() {
		if w != before[b] {
			images = append(images, ckf.BucketImage{Bucket: uint32(b), Word: w})
		}
	}
	fmt.Println(c.ApplyDelta(&ckf.Delta{Identity: identity, Lease: lease, BaseSequence: 10, Sequence: 11, Images: images}))
	_ = c.QueryTokens(tokens, 4, ckf.BaseSalt, &res)
	fmt.Println("depth after delta:", res.Depths[0], "of", res.Blocks)

	// A replayed delta is ignored.
	fmt.Println(c.ApplyDelta(&ckf.Delta{Identity: identity, Lease: lease, BaseSequence: 10, Sequence: 11, Images: images}))
	// Output:
	// lane 0: SnapshotInstalled @10
	// depth after snapshot: 2 of 4
	// lane 0: Applied @11
	// depth after delta: 3 of 4
	// lane 0: IgnoredStaleOrDuplicate @11
}
