package grpcserver

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/client"
	"github.com/ckfrelay/ckfrelay/consumer"
	"github.com/ckfrelay/ckfrelay/internal/server"
	"github.com/ckfrelay/ckfrelay/internal/testing/streamtable"
	"github.com/ckfrelay/ckfrelay/wire"
)

// The router side of the contract against the real server: a client.Router
// over gRPC (package client's transport) follows random histories on two
// pools and every lane equals the relay's exact table, through a lagged
// (gap) subscription and a relay restart (a new producer key).

// e2eRelay is an in-process relay whose gRPC service can restart on the
// same address, as a relay process restarting would.
type e2eRelay struct {
	srv    *server.Server
	g      *Server
	http   string
	grpc   string
	served chan error
	ts     *httptest.Server
}

func startE2ERelay(t *testing.T, cfg server.Config, grpcAddr string, tune ...func(*Server)) *e2eRelay {
	t.Helper()
	log := slog.New(slog.DiscardHandler)
	srv, err := server.New(cfg, log)
	require.NoError(t, err)
	g, err := New(srv, log)
	require.NoError(t, err)
	for _, f := range tune {
		f(g) // before Serve: no stream reads it yet
	}
	ts := httptest.NewServer(srv.Handler())
	var ln net.Listener
	require.Eventually(t, func() bool { ln, err = net.Listen("tcp", grpcAddr); return err == nil }, 5*time.Second, 10*time.Millisecond)
	r := &e2eRelay{srv: srv, g: g, http: ts.URL, grpc: ln.Addr().String(), served: make(chan error, 1), ts: ts}
	go func() { r.served <- g.Serve(ln) }()
	t.Cleanup(r.stop)
	return r
}

func (r *e2eRelay) stop() {
	if r.ts == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = r.srv.Shutdown(ctx)
	_ = r.g.Shutdown(ctx)
	<-r.served
	r.ts.Close()
	r.ts = nil
}

// table waits until the pool has published every admitted event and its
// hub mirrors it, then returns the pool's table at that sequence, read from
// its HTTP stream.
func (r *e2eRelay) table(t *testing.T, pool string) (uint64, []uint64) {
	t.Helper()
	for _, p := range r.srv.KvPools() {
		if p.Spec().Name == pool {
			st, err := p.Stats(t.Context())
			require.NoError(t, err)
			require.Eventually(t, func() bool { return p.Hub().Stats().Sequence >= st.Sequence }, 10*time.Second, time.Millisecond)
			seq := p.Hub().Stats().Sequence
			return seq, streamtable.At(t, r.http, pool, 99, seq, 10*time.Second)
		}
	}
	require.FailNow(t, "no such pool", "%q", pool)
	return 0, nil
}

// gatedLanes holds every ApplyFrame while closed, so the router stops
// draining its stream and the relay lags it.
type gatedLanes struct {
	client.Lanes
	mu sync.RWMutex
}

func (g *gatedLanes) ApplyFrame(b []byte) (consumer.Result, error) {
	g.mu.RLock()
	defer g.mu.RUnlock()
	return g.Lanes.ApplyFrame(b)
}

func (g *gatedLanes) hold()    { g.mu.Lock() }
func (g *gatedLanes) release() { g.mu.Unlock() }

// history posts random stored chains, tail removals and clears to a pool.
type history struct {
	rng    *rand.Rand
	next   uint64
	chains [][]uint64 // external block hashes still stored, per chain
	worker []uint64
}

func (h *history) round(t *testing.T, base, pool string, n int) {
	t.Helper()
	var evs []ckf.RouterEvent
	for range n {
		switch op := h.rng.IntN(10); {
		case op < 6 || len(h.chains) == 0:
			w := uint64(h.rng.IntN(4))
			ev := ckf.RouterEvent{WorkerID: w, Kind: ckf.EventStored}
			var ext []uint64
			for range 1 + h.rng.IntN(8) {
				h.next++
				ext = append(ext, h.next^0xE7)
				ev.Blocks = append(ev.Blocks, ckf.StoredBlock{BlockHash: h.next ^ 0xE7, TokensHash: h.next})
			}
			evs = append(evs, ev)
			h.chains, h.worker = append(h.chains, ext), append(h.worker, w)
		case op < 9:
			i := h.rng.IntN(len(h.chains))
			if len(h.chains[i]) == 0 {
				continue
			}
			from := h.rng.IntN(len(h.chains[i]))
			evs = append(evs, ckf.RouterEvent{WorkerID: h.worker[i], Kind: ckf.EventRemoved, BlockHashes: slices.Clone(h.chains[i][from:])})
			h.chains[i] = h.chains[i][:from]
		default:
			w := uint64(h.rng.IntN(4))
			evs = append(evs, ckf.RouterEvent{WorkerID: w, Kind: ckf.EventCleared})
			for i := range h.chains {
				if h.worker[i] == w {
					h.chains[i] = nil
				}
			}
		}
	}
	for i := range evs {
		h.next++
		evs[i].EventID = h.next
	}
	body, err := wire.AppendRouterEventsJSON(nil, evs)
	require.NoError(t, err)
	resp, err := http.Post(base+"/v1/pools/"+pool+"/events?source_epoch=1", "application/json", bytes.NewReader(body))
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusAccepted, resp.StatusCode, "%s", b)
}

// requireLaneEquals waits until the router's lane holds exactly the relay
// pool's table at the relay's sequence.
func requireLaneEquals(t *testing.T, rl *e2eRelay, r *client.Router, pool string, lane int) {
	t.Helper()
	seq, want := rl.table(t, pool)
	var last string
	ok := assert.Eventually(t, func() bool {
		li := r.Lane(lane)
		if !li.Ready {
			last = fmt.Sprintf("lane %d not ready: %+v", lane, li)
			return false
		}
		got, gotSeq, err := r.AppendLaneWords(nil, lane)
		switch {
		case err != nil:
			last = err.Error()
		case gotSeq != seq:
			last = fmt.Sprintf("lane %d at %d, relay at %d (%s)", lane, gotSeq, seq, li.LastError)
		case !slices.Equal(got, want):
			last = fmt.Sprintf("lane %d at the relay's sequence %d but its words differ", lane, seq)
		default:
			return true
		}
		return false
	}, 20*time.Second, 5*time.Millisecond)
	require.True(t, ok, "router did not converge with %s: %s", pool, last)
}

// TestRouter_FollowsRealRelayOverGRPC is the e2e property over gRPC: random
// histories on two pools, after each round every lane equals the relay's
// exact table; a lagged subscription (a gap) and a relay restart (a new
// incarnation, so a new catalog key) are recovered with fresh snapshots.
func TestRouter_FollowsRealRelayOverGRPC(t *testing.T) {
	cfg := testConfig()
	cfg.SubscriberQueue = 64
	cfg.Pools = append(cfg.Pools, server.PoolSpec{Name: "dc-b", DCID: 2, ExpectedBlocks: 4096, PublishEveryNEvents: 1})
	rl := startE2ERelay(t, cfg, "127.0.0.1:0")

	wcfg := cfg.WithDefaults()
	format, err := wcfg.Pools[0].Format()
	require.NoError(t, err)
	m := consumer.Manifest{ConsumerInstance: 31, Domain: wcfg.Domain(), Format: format, VerificationWindow: 2}
	var targets []client.Target
	for i, p := range wcfg.Pools {
		m.Lanes[i] = &ckf.PoolID{Domain: wcfg.Domain(), DCID: p.DCID}
		targets = append(targets, client.Target{Pool: p.Name, Lane: i, DCID: p.DCID})
	}
	native, err := client.NewNative(m)
	require.NoError(t, err)
	lanes := &gatedLanes{Lanes: native}
	// No idle timeout: while the lanes are held below, no frame moves the
	// lane for as long as the 1000 posts take (over 5 s in a loaded -race
	// run), and the router's own idle timer must not end the stream before
	// the relay lags it.
	r, err := client.New(client.Config{ConsumerInstance: 31, Targets: targets, MinBackoff: 5 * time.Millisecond, MaxBackoff: 50 * time.Millisecond,
		IdleTimeout: -1, Relays: []client.Relay{{Addrs: []string{rl.grpc}}}, GRPC: &client.GRPCConfig{
			// Small flow-control windows, so a router that stops reading
			// stalls the relay's sends and is lagged.
			DialOptions: []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()),
				grpc.WithInitialWindowSize(1 << 16), grpc.WithInitialConnWindowSize(1 << 16)}}}, lanes)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	hs := []*history{{rng: rand.New(rand.NewPCG(1, 1))}, {rng: rand.New(rand.NewPCG(2, 2)), next: 1 << 40}}
	rounds := 8
	if testing.Short() {
		rounds = 4
	}
	for round := range rounds {
		var before [2]uint64
		for lane, p := range wcfg.Pools {
			before[lane] = r.Lane(lane).Resubscribes
			hs[lane].round(t, rl.http, p.Name, 40)
			requireLaneEquals(t, rl, r, p.Name, lane)
		}
		if round != rounds/2+1 { // the round after a restart resubscribed
			for lane := range wcfg.Pools {
				assert.Equal(t, before[lane], r.Lane(lane).Resubscribes, "round %d: a healthy stream never resubscribes (deltas applied): %+v", round, r.Lane(lane))
			}
		}
		if round == 1 {
			// A gap: the router stops reading while the relay publishes
			// more than its queue holds; the relay ends the stream
			// SUBSCRIBER_LAGGED and the lane reopens from a snapshot.
			before := r.Lane(0).Resubscribes
			lanes.hold()
			for range 1000 {
				hs[0].round(t, rl.http, "dc-a", 1)
			}
			lanes.release()
			require.Eventually(t, func() bool { return r.Lane(0).Resubscribes > before }, 20*time.Second, time.Millisecond)
			assert.Contains(t, r.Lane(0).LastError, "SUBSCRIBER_LAGGED")
		}
		if round == rounds/2 {
			// A restart: a new relay incarnation on the same address; the
			// catalog advertises new keys and the lanes follow them.
			addr := rl.grpc
			rl.stop()
			rl = startE2ERelay(t, cfg, addr)
			for i := range hs {
				hs[i].chains, hs[i].worker = nil, nil
			}
		}
	}
	for lane, p := range wcfg.Pools {
		requireLaneEquals(t, rl, r, p.Name, lane)
	}
}

// TestRouter_FollowsMultiPoolRelayOverGRPC is the e2e property over gRPC
// against a relay shaped like Dynamo's: data center 1 hosts the pools of two
// models (one dc_id, two indexer domains), data center 2 one of them. A
// router routing for llama follows exactly llama's two pools, one lane per
// data center, and after every round of random histories (on all three
// pools) each lane equals its pool's exact table. A publication too large
// for a CBI1 delta ends llama's data-center-1 stream PUBLICATION_UNAVAILABLE;
// that lane alone resubscribes and converges.
func TestRouter_FollowsMultiPoolRelayOverGRPC(t *testing.T) {
	agg := server.KvPoolSpec{Roles: []string{"aggregated"}}
	model := func(k server.KvPoolSpec, id string) server.KvPoolSpec {
		k.Models = []server.ModelSpec{{ID: id}}
		return k
	}
	cfg := server.Config{HeartbeatInterval: server.Duration(20 * time.Millisecond), SubscriberQueue: 64,
		GRPC: server.GRPCConfig{Listen: "127.0.0.1:0", LoadInterval: server.Duration(20 * time.Millisecond)},
		Pools: []server.PoolSpec{
			{Name: "llama-1", DCID: 1, ExpectedBlocks: 4096, PublishEveryNEvents: 1, CacheSemantics: "llama", KvRelay: model(agg, "llama")},
			{Name: "qwen-1", DCID: 1, ExpectedBlocks: 4096, PublishEveryNEvents: 1, CacheSemantics: "qwen", KvRelay: model(agg, "qwen")},
			{Name: "llama-2", DCID: 2, ExpectedBlocks: 4096, PublishEveryNEvents: 1, CacheSemantics: "llama", KvRelay: model(agg, "llama")},
		}}
	const maxImages = 256
	rl := startE2ERelay(t, cfg, "127.0.0.1:0", func(g *Server) { g.maxDeltaImages = maxImages })

	wcfg := cfg.WithDefaults()
	format, err := wcfg.Pools[0].Format()
	require.NoError(t, err)
	llama := wcfg.PoolDomain(wcfg.Pools[0])
	m := consumer.Manifest{ConsumerInstance: 32, Domain: llama, Format: format, VerificationWindow: 2}
	m.Lanes[0], m.Lanes[1] = &ckf.PoolID{Domain: llama, DCID: 1}, &ckf.PoolID{Domain: llama, DCID: 2}
	native, err := client.NewNative(m)
	require.NoError(t, err)
	r, err := client.New(client.Config{ConsumerInstance: 32, Select: client.Selection{Model: "llama"},
		Targets:    []client.Target{{Pool: "dc1", Lane: 0, DCID: 1}, {Pool: "dc2", Lane: 1, DCID: 2}},
		MinBackoff: 5 * time.Millisecond, MaxBackoff: 50 * time.Millisecond, IdleTimeout: 5 * time.Second,
		Relays: []client.Relay{{Addrs: []string{rl.grpc}}}, GRPC: &client.GRPCConfig{}}, native)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	followed := map[string]int{"llama-1": 0, "llama-2": 1}
	hs := map[string]*history{"llama-1": {rng: rand.New(rand.NewPCG(1, 1))}, "qwen-1": {rng: rand.New(rand.NewPCG(2, 2)), next: 1 << 40},
		"llama-2": {rng: rand.New(rand.NewPCG(3, 3)), next: 2 << 40}}
	rounds := 6
	if testing.Short() {
		rounds = 3
	}
	for range rounds {
		for _, p := range wcfg.Pools {
			hs[p.Name].round(t, rl.http, p.Name, 40)
		}
		for name, lane := range followed {
			requireLaneEquals(t, rl, r, name, lane)
		}
	}
	// One publication larger than a CBI1 delta may hold, on llama-1.
	before0, before1 := r.Lane(0).Resubscribes, r.Lane(1).Resubscribes
	var blocks []string
	for i := range 3 * maxImages {
		blocks = append(blocks, fmt.Sprintf(`{"block_hash": %d, "tokens_hash": %d}`, 3<<40+i, 3<<40+i))
	}
	body := fmt.Sprintf(`[{"worker_id": 9, "event": {"event_id": 1, "data": {"stored": {"parent_hash": null, "blocks": [%s]}}}}]`, strings.Join(blocks, ","))
	resp, err := http.Post(rl.http+"/v1/pools/llama-1/events?source_epoch=2", "application/json", strings.NewReader(body))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusAccepted, resp.StatusCode)
	require.Eventually(t, func() bool { return r.Lane(0).Resubscribes > before0 }, 20*time.Second, time.Millisecond)
	assert.Contains(t, r.Lane(0).LastError, "PUBLICATION_UNAVAILABLE")
	for name, lane := range followed {
		requireLaneEquals(t, rl, r, name, lane)
	}
	assert.Equal(t, before1, r.Lane(1).Resubscribes, "the other data center's lane was not disturbed")
}
