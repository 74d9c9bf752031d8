package client_test

import (
	"context"
	"fmt"
	"time"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/client"
	"github.com/ckfrelay/ckfrelay/consumer"
)

// ExampleConfig_Manifest follows two data centers of different sizes — so
// their pools have different filter formats — on one consumer, with the
// manifest the Config derives from the relays' catalogs: each lane takes
// its pool's format from its snapshot (and would follow a resize), so the
// router never hand-builds a manifest.
func ExampleConfig_Manifest() {
	tokens := []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	eastURL, stopEast := startRelay("dc-east", 1, 1024)
	defer stopEast()
	westURL, stopWest := startRelay("dc-west", 2, 1_000_000)
	defer stopWest()
	storeBlocks(eastURL, "dc-east", tokens[:12], 4) // 3 blocks
	storeBlocks(westURL, "dc-west", tokens[:4], 4)  // 1 block

	cfg := client.Config{
		Relays:           []client.Relay{{Addrs: []string{eastURL}}, {Addrs: []string{westURL}}},
		ConsumerInstance: 7,
		Targets:          []client.Target{{Pool: "dc-east", Lane: 0}, {Pool: "dc-west", Lane: 1, Relay: 1}},
	}
	ctx, cancel := context.WithCancel(context.Background())
	manifest, err := cfg.Manifest(ctx)
	if err != nil {
		panic(err)
	}
	lanes, err := client.NewNative(manifest) // or a wasm/host instance
	if err != nil {
		panic(err)
	}
	router, err := client.New(cfg, lanes)
	if err != nil {
		panic(err)
	}
	done := make(chan error, 1)
	go func() { done <- router.Run(ctx) }()
	defer func() { cancel(); <-done }()

	deadline := time.Now().Add(10 * time.Second)
	for lane := range 2 {
		for li := router.Lane(lane); !li.Ready || li.Sequence < 1; li = router.Lane(lane) {
			if time.Now().After(deadline) {
				fmt.Printf("lane %d did not converge: %+v\n", lane, li)
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	for lane := range 2 {
		st, _ := lanes.LaneStatus(lane)
		fmt.Printf("lane %d: %d buckets\n", lane, st.Format.BucketCount)
	}
	seq := ckf.AppendSequenceHashes(nil, ckf.AppendLocalBlockHashes(nil, tokens, 4, ckf.BaseSalt))
	var res consumer.QueryResult
	if err := router.QuerySequenceHashes(seq, &res); err != nil {
		panic(err)
	}
	fmt.Printf("dc-east caches %d blocks, dc-west %d\n", res.Depths[0], res.Depths[1])
	// Output:
	// lane 0: 512 buckets
	// lane 1: 524288 buckets
	// dc-east caches 3 blocks, dc-west 1
}
