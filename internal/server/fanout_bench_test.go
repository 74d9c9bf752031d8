//go:build unix

package server_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/client"
	"github.com/ckfrelay/ckfrelay/consumer"
	"github.com/ckfrelay/ckfrelay/internal/grpcserver"
	"github.com/ckfrelay/ckfrelay/internal/server"
	"github.com/ckfrelay/ckfrelay/internal/testing/natstest"
	"github.com/ckfrelay/ckfrelay/wire"
	"github.com/stretchr/testify/require"
)

// probeLanes reports when a probed key first becomes visible on its lanes.
type probeLanes struct {
	*client.Native
	key  atomic.Uint64
	seen chan struct{}
}

func (p *probeLanes) ApplyFrame(b []byte) (consumer.Result, error) {
	res, err := p.Native.ApplyFrame(b)
	p.probe()
	return res, err
}

// ApplyDecodedFrame is the gRPC transport's path (client.DecodedApplier).
func (p *probeLanes) ApplyDecodedFrame(f *wire.Frame) (consumer.Result, error) {
	res, err := p.Native.ApplyDecodedFrame(f)
	p.probe()
	return res, err
}

func (p *probeLanes) probe() {
	if k := p.key.Load(); k != 0 {
		if m, _ := p.Contains(k); m != 0 && p.key.CompareAndSwap(k, 0) {
			p.seen <- struct{}{}
		}
	}
}

// countingListener counts the bytes the relay writes to its HTTP (or gRPC)
// clients.
type countingListener struct {
	net.Listener
	out *atomic.Uint64
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return countingConn{Conn: c, out: l.out}, nil
}

type countingConn struct {
	net.Conn
	out *atomic.Uint64
}

func (c countingConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.out.Add(uint64(n))
	return n, err
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func heapAlloc() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// BenchmarkFanout feeds one pool's frames to 64 routers, side by side in one
// run, through the relay's HTTP hub (one stream each), through NATS
// JetStream (the relay publishes once; an embedded nats-server fans out), or
// through the relay's gRPC service, Dynamo's dynamo.kvrelay.v1 contract
// (internal/grpcserver: one catalog stream and one SubscribeKvPool stream per
// router, CBI1 payloads, on the same hub and publisher lease as HTTP). One op
// is a batch of 16 Stored events of 4 new blocks, flushed; it ends when a
// probe router sees the batch's first block. Reported per op: freshness
// (admission to visible at the probe router, p50/p99) and process CPU per
// subscriber; once: live heap per subscriber after every router installed
// its snapshot. Everything runs in one process (relay, NATS server,
// routers), so CPU and heap include the routers' own work, the same for
// every transport but gRPC's, whose routers decode protobuf and CBI1 where
// the others decode wire v1 (client/grpc_codec.go, client/grpc.go); the
// rest of the difference is the transport's. relay-out-B/op is what the relay itself sends per op: every
// HTTP stream's bytes, its one NATS connection's, or every gRPC
// connection's (heartbeats, and over gRPC the catalog revisions, included).
func BenchmarkFanout(b *testing.B) {
	for _, transport := range []string{"http", "nats", "grpc"} {
		b.Run("transport="+transport+"/routers=64", func(b *testing.B) { benchFanout(b, transport, 64) })
	}
}

func benchFanout(b *testing.B, transport string, routers int) {
	const eventsPerBatch, blocksPerEvent = 16, 4
	// Every router subscribes from loopback: one client address, so its
	// share of the subscriber slots is all of them.
	cfg := server.Config{Pools: []server.PoolSpec{{Name: "p", DCID: 1, ExpectedBlocks: 1 << 14}}, MaxSubscribers: routers + 8,
		MaxSubscribersPerClient: routers + 8}
	var natsURL string
	if transport == "nats" {
		ns := natstest.Start(b, natstest.Options{})
		natsURL = ns.URL()
		cfg.NATS = server.NATSOut{URL: natsURL}
	}
	log := slog.New(slog.DiscardHandler)
	s, err := server.New(cfg, log)
	require.NoError(b, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(b, err)
	var httpOut, grpcOut atomic.Uint64
	go func() { _ = s.Serve(countingListener{Listener: ln, out: &httpOut}) }()
	var g *grpcserver.Server
	var gaddr string
	if transport == "grpc" {
		g, err = grpcserver.New(s, log)
		require.NoError(b, err)
		gln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(b, err)
		gaddr = gln.Addr().String()
		go func() { _ = g.Serve(countingListener{Listener: gln, out: &grpcOut}) }()
	}
	egress := func() uint64 {
		switch transport {
		case "nats":
			return s.NATSOutBytesForTest()
		case "grpc":
			return grpcOut.Load()
		}
		return httpOut.Load()
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = s.Shutdown(ctx)
		if g != nil {
			_ = g.Shutdown(ctx)
		}
	}()
	if transport == "nats" {
		for s.NATSStats()["p"].Snapshots == 0 {
			time.Sleep(time.Millisecond)
		}
	}
	cfg = s.Config()
	format, _ := cfg.Pools[0].Format()
	domain := cfg.Domain()
	heap0 := heapAlloc()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	var probe *probeLanes
	var rs []*client.Router
	for i := range routers {
		m := consumer.Manifest{ConsumerInstance: uint64(100 + i), Domain: domain, Format: format, VerificationWindow: 2}
		m.Lanes[0] = &ckf.PoolID{Domain: domain, DCID: 1}
		native, err := client.NewNative(m)
		require.NoError(b, err)
		var lanes client.Lanes = native
		if i == 0 {
			probe = &probeLanes{Native: native, seen: make(chan struct{}, 1)}
			lanes = probe
		}
		rc := client.Config{ConsumerInstance: uint64(100 + i), Targets: []client.Target{{Pool: "p", Lane: 0, DCID: 1}},
			HTTPClient: &http.Client{Transport: &http.Transport{}}}
		switch transport {
		case "nats":
			rc.NATS = &client.NATSConfig{URL: natsURL}
		case "grpc":
			rc.Relays, rc.GRPC = []client.Relay{{Addrs: []string{gaddr}}}, &client.GRPCConfig{} // a connection per router, as HTTP's transport per router
		default:
			rc.Relays = []client.Relay{{Addrs: []string{"http://" + ln.Addr().String()}}}
		}
		r, err := client.New(rc, lanes)
		require.NoError(b, err)
		rs = append(rs, r)
		wg.Add(1)
		go func() { defer wg.Done(); _ = r.Run(ctx) }()
	}
	for _, r := range rs {
		for !r.Lane(0).Ready {
			time.Sleep(time.Millisecond)
		}
	}
	heapPerSub := float64(heapAlloc()-heap0) / float64(routers)

	var next uint64 = 1
	fresh := make([]time.Duration, 0, b.N)
	ev := ckf.RouterEvent{Kind: ckf.EventStored}
	b.ResetTimer()
	cpu0, out0 := cpuTime(), egress()
	for range b.N {
		var first uint64
		for e := range eventsPerBatch {
			ev.WorkerID = uint64(e % 8)
			ev.Blocks = make([]ckf.StoredBlock, 0, blocksPerEvent) // admission queues the event: never reuse its slice
			for range blocksPerEvent {
				ev.Blocks = append(ev.Blocks, ckf.StoredBlock{BlockHash: next, TokensHash: next})
				next++
			}
			if e == 0 {
				first = ev.Blocks[0].TokensHash // a root: its canonical hash is its tokens hash
			}
			if err := s.AdmitForTest(ctx, "p", ev); err != nil {
				require.Fail(b, fmt.Sprint(err))
			}
		}
		t0 := time.Now()
		probe.key.Store(first)
		if err := s.FlushForTest(ctx, "p"); err != nil {
			require.Fail(b, fmt.Sprint(err))
		}
		select {
		case <-probe.seen:
		case <-time.After(30 * time.Second):
			require.FailNow(b, fmt.Sprintf("probe never saw the batch (%+v)", rs[0].Lane(0)))
		}
		fresh = append(fresh, time.Since(t0))
	}
	cpu, out := cpuTime()-cpu0, egress()-out0
	b.StopTimer()
	for i, r := range rs {
		if li := r.Lane(0); li.Resubscribes != 0 {
			b.Logf("router %d resubscribed %d times: %s", i, li.Resubscribes, li.LastError)
		}
	}
	slices.Sort(fresh)
	b.ReportMetric(float64(fresh[len(fresh)/2].Nanoseconds()), "fresh-p50-ns")
	b.ReportMetric(float64(fresh[len(fresh)*9/10].Nanoseconds()), "fresh-p90-ns")
	b.ReportMetric(float64(fresh[len(fresh)*99/100].Nanoseconds()), "fresh-p99-ns")
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N)/float64(routers), "cpu-ns/op/sub")
	b.ReportMetric(heapPerSub, "heap-B/sub")
	b.ReportMetric(float64(out)/float64(b.N), "relay-out-B/op")
}
