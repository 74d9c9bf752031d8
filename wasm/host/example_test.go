package host_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/client"
	"github.com/ckfrelay/ckfrelay/consumer"
	"github.com/ckfrelay/ckfrelay/wasm/host"
	"github.com/ckfrelay/ckfrelay/wire"
)

// Example loads the embedded consumer module (built by
// `go run ./cmd/wasmbuild`), installs one pool's snapshot on lane 0 and asks
// how many leading blocks of a request it holds. client.NewNative would answer
// the same through the same interface.
func Example() {
	ctx := context.Background()
	// A file-backed compilation cache turns the ≈ 1 s compile into tens of
	// milliseconds for every later process.
	cache := filepath.Join(os.TempDir(), "ckfrelay-wazero-cache")
	rt, err := host.NewRuntime(ctx, host.NewConfig().WithCompilationCacheDir(cache))
	if err != nil {
		panic(err)
	}
	defer rt.Close(ctx)

	// One pool on lane 0, a 64-bucket filter holding a 3-block request.
	format := ckf.NewFormat(ckf.DefaultSeed, 64)
	pool := ckf.PoolID{DCID: 1}
	m := consumer.Manifest{ConsumerInstance: 1, Format: format, VerificationWindow: 2}
	m.Lanes[0] = &pool
	f, _ := ckf.NewFilter(64, ckf.DefaultSeed, ckf.DefaultMaxKicks)
	tokens := []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14}
	locals := ckf.AppendLocalBlockHashes(nil, tokens, 4, ckf.BaseSalt)
	for _, h := range ckf.AppendSequenceHashes(nil, locals) {
		_ = f.Insert(h)
	}

	var c client.Lanes
	c, err = rt.NewInstance(ctx, m)
	if err != nil {
		panic(err)
	}
	id := ckf.ProducerIdentity{Pool: pool, ProducerIncarnation: 1, LayoutGeneration: 1, Format: format}
	lease := ckf.LaneLease{ConsumerInstance: 1, PhysicalLane: 0, AssignmentEpoch: 1}
	if err := c.Assign(id, lease); err != nil {
		panic(err)
	}
	frame, _ := wire.AppendFrame(nil, &wire.Frame{Kind: wire.KindSnapshotChunk, Snapshot: wire.SnapshotChunk{
		Identity: id, Lease: lease, Sequence: 5, ChunkCount: 1, Words: f.Words()}})
	r, err := c.ApplyFrame(frame)
	fmt.Println(r, err)

	var res consumer.QueryResult
	err = c.QueryTokens(tokens, 4, ckf.BaseSalt, &res)
	fmt.Printf("mask %#x, lane 0 holds %d of %d blocks, %v\n", res.Mask, res.Depths[0], res.Blocks, err)
	// Output:
	// lane 0: SnapshotInstalled @5 <nil>
	// mask 0x1, lane 0 holds 3 of 3 blocks, <nil>
}
