package client_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/client"
	"github.com/ckfrelay/ckfrelay/consumer"
	"github.com/ckfrelay/ckfrelay/internal/server"
	"github.com/ckfrelay/ckfrelay/wire"
)

// Example follows one relay pool, the data center "dc-east", on lane 0 of an
// in-process consumer and asks how many leading blocks of a request that data
// center caches. The relay runs in this process (the project's own server
// behind httptest); in production Config.Relays names running `relay serve`s.
func Example() {
	// The relay hosts "dc-east" (dc_id 1, sized for 1,024 blocks, default
	// routing domain), and one of its engines stored the first 3 blocks of a
	// 4-block request (blocks of 4 tokens).
	tokens := []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	relayURL, stopRelay := startRelay("dc-east", 1, 1024)
	defer stopRelay()
	storeBlocks(relayURL, "dc-east", tokens[:12], 4)

	// The router's Config names the relay and the pool to follow on lane 0.
	cfg := client.Config{
		Relays:           []client.Relay{{Addrs: []string{relayURL}}},
		ConsumerInstance: 7,
		Targets:          []client.Target{{Pool: "dc-east", Lane: 0}},
	}
	// The consumer's manifest names every pool by the identity the relay
	// publishes in its catalog (routing domain and dc_id): the Config
	// derives it, pinning no format, so the lane takes its pool's format
	// from each snapshot and follows a resize.
	manifest, err := cfg.Manifest(context.Background())
	if err != nil {
		panic(err)
	}
	// The consumer runs in-process here; a *host.Instance (wasm/host) runs
	// the same consumer as WebAssembly behind the same client.Lanes.
	lanes, err := client.NewNative(manifest)
	if err != nil {
		panic(err)
	}
	router, err := client.New(cfg, lanes)
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- router.Run(ctx) }()
	defer func() { cancel(); <-done }()

	// Wait until the lane installed a snapshot and reached sequence 1: the
	// pool publishes every event, and the engine sent one.
	deadline := time.Now().Add(10 * time.Second)
	for lane := router.Lane(0); !lane.Ready || lane.Sequence < 1; lane = router.Lane(0) {
		if time.Now().After(deadline) {
			fmt.Printf("lane 0 did not converge: %+v\n", lane)
			return
		}
		time.Sleep(5 * time.Millisecond)
	}

	// A router hashes each request's tokens into canonical block hashes and
	// asks every followed data center how deep a prefix it holds.
	seq := ckf.AppendSequenceHashes(nil, ckf.AppendLocalBlockHashes(nil, tokens, 4, ckf.BaseSalt))
	var res consumer.QueryResult
	if err := router.QuerySequenceHashes(seq, &res); err != nil {
		panic(err)
	}
	fmt.Printf("dc-east caches %d of the request's %d blocks\n", res.Depths[0], res.Blocks)
	// Output: dc-east caches 3 of the request's 4 blocks
}

// startRelay serves one pool from the project's relay server behind httptest
// and waits until it is ready (its hub holds a snapshot).
func startRelay(pool string, dcID, expectedBlocks uint64) (url string, stop func()) {
	cfg := server.Config{Pools: []server.PoolSpec{{
		Name: pool, DCID: dcID, ExpectedBlocks: expectedBlocks, PublishEveryNEvents: 1,
	}}}.WithDefaults()
	srv, err := server.New(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		panic(err)
	}
	ts := httptest.NewServer(srv.Handler())
	stop = func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		ts.Close()
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		resp, err := http.Get(ts.URL + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return ts.URL, stop
			}
		}
		if time.Now().After(deadline) {
			stop()
			panic("relay not ready")
		}
	}
}

// storeBlocks posts what an engine reports when it stores the blocks of
// tokens: one Dynamo RouterEvent, as JSON, with each block's local hash.
func storeBlocks(url, pool string, tokens []uint32, blockSize int) {
	ev := ckf.RouterEvent{WorkerID: 1, EventID: 1, Kind: ckf.EventStored}
	for i, h := range ckf.AppendLocalBlockHashes(nil, tokens, blockSize, ckf.BaseSalt) {
		ev.Blocks = append(ev.Blocks, ckf.StoredBlock{BlockHash: 100 + uint64(i), TokensHash: h})
	}
	body, err := wire.AppendRouterEventsJSON(nil, []ckf.RouterEvent{ev})
	if err != nil {
		panic(err)
	}
	resp, err := http.Post(url+"/v1/pools/"+pool+"/events?source_epoch=1", "application/json", bytes.NewReader(body))
	if err != nil {
		panic(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		panic(fmt.Sprintf("store: %s", resp.Status))
	}
}
