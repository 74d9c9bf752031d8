package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/consumer"
	"github.com/ckfrelay/ckfrelay/internal/server"
	"github.com/ckfrelay/ckfrelay/internal/testing/streamprobe"
	"github.com/ckfrelay/ckfrelay/wire"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// procStatus reads one kB field of /proc/<pid>/status (0 where there is none).
func procStatus(pid int, field string) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for l := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// envDuration reads a duration from the environment, or def.
func envDuration(t *testing.T, name string, def time.Duration) time.Duration {
	if v := os.Getenv(name); v != "" {
		d, err := time.ParseDuration(v)
		require.NoError(t, err, name)
		return d
	}
	return def
}

// TestSoak_MixedLoadWithHostileAndSlowClients runs the real relay for
// CKFRELAY_SOAK_DURATION (default 60s; skipped under -short) with, side by
// side: a normal load (two posters of 64-event batches that store and later
// remove blocks, so the exact state stays bounded), one consumer that
// measures freshness, 8 slow subscribers reading 1 MB/s, 8 stalled ones that
// never read, and hostile clients (malformed and oversized bodies, wrong
// content types, bad and stale stream requests, subscribe-and-drop churn
// under fresh consumer ids), and on a second pool's bound ZMQ source two
// emulated engines beside hostile peers (soak_zmq_test.go). It reports events/s, freshness p50/p99 and the
// relay's peak RSS as BENCH lines, and fails if the peak RSS exceeds
// CKFRELAY_SOAK_RSS_BUDGET_MIB (default 512).
func TestSoak_MixedLoadWithHostileAndSlowClients(t *testing.T) {
	if testing.Short() {
		t.Skip("soak: runs the relay binary for a minute")
	}
	duration := envDuration(t, "CKFRELAY_SOAK_DURATION", 60*time.Second)
	budget := int64(512)
	if v := os.Getenv("CKFRELAY_SOAK_RSS_BUDGET_MIB"); v != "" {
		var err error
		budget, err = strconv.ParseInt(v, 10, 64)
		require.NoError(t, err)
	}
	cfg := server.Config{Listen: "127.0.0.1:0", MaxSubscribers: 64, MaxSubscribersPerClient: 64, StreamWriteTimeout: server.Duration(3 * time.Second),
		HeartbeatInterval: server.Duration(250 * time.Millisecond),
		Pools:             []server.PoolSpec{{Name: "p", DCID: 1, ExpectedBlocks: 1 << 22}}} // 16 MiB table
	z, zpool := newZMQSoak(t)
	cfg.Pools = append(cfg.Pools, zpool)
	rl := startRelay(t, "--config", writeConfig(t, cfg))
	pid := rl.cmd.Process.Pid
	cfg = cfg.WithDefaults()
	format, err := cfg.Pools[0].Format()
	require.NoError(t, err)

	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var wg sync.WaitGroup
	var events, hostile, resubscribes atomic.Int64
	var peak atomic.Int64
	go func() { // sample RSS too, in case VmHWM is missing
		for ctx.Err() == nil {
			if r := procStatus(pid, "VmRSS"); r > peak.Load() {
				peak.Store(r)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()

	// Freshness: a native consumer applying every frame of one stream.
	m := consumer.Manifest{ConsumerInstance: 1, Domain: cfg.Domain(), Format: format, VerificationWindow: 2}
	m.Lanes[0] = &ckf.PoolID{Domain: cfg.Domain(), DCID: 1}
	c, err := consumer.New(m)
	require.NoError(t, err)
	probe := streamprobe.New(c)
	req, _ := http.NewRequestWithContext(ctx, "GET", rl.base+"/v1/pools/p/stream?consumer=1&lane=0&epoch=1", nil)
	resp, err := http.DefaultClient.Do(req)
	require.True(t, assertOK(t, err, resp), "the measuring consumer's stream")
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer resp.Body.Close()
		assert.NotErrorIs(t, probe.Run(resp.Body), streamprobe.ErrClosed, "the measuring consumer was closed")
	}()
	<-probe.Ready()

	// ZMQ: two engines and the hostile peers on pool z's bound source.
	z.start(t, rl.base, ctx.Done(), &wg)

	// Normal load: two posters, each its own workers; a block stored is
	// removed 4,096 events later.
	for g := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			hc := &http.Client{}
			var body []byte
			var next uint64
			const window = 4096
			for ctx.Err() == nil {
				evs := make([]ckf.RouterEvent, 0, 64)
				var firstLocal uint64
				for i := range 64 {
					next++
					id := uint64(g)<<48 | next
					if i%2 == 1 && next > window {
						old := uint64(g)<<48 | (next - window - 1) // a stored event's id (odd)
						evs = append(evs, ckf.RouterEvent{WorkerID: old % 8, EventID: id, Kind: ckf.EventRemoved,
							BlockHashes: []uint64{old << 4, old<<4 | 1, old<<4 | 2, old<<4 | 3}})
						continue
					}
					ev := ckf.RouterEvent{WorkerID: id % 8, EventID: id, Kind: ckf.EventStored}
					for j := range 4 {
						local := id*1_000_003 + uint64(j)
						if firstLocal == 0 {
							firstLocal = local
						}
						ev.Blocks = append(ev.Blocks, ckf.StoredBlock{BlockHash: id<<4 | uint64(j), TokensHash: local})
					}
					evs = append(evs, ev)
				}
				body, _ = wire.AppendRouterEventsJSON(body[:0], evs)
				req, _ := http.NewRequestWithContext(ctx, "POST", rl.base+"/v1/pools/p/events?source_epoch=1", bytes.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				if g == 0 { // probed before sending: the deltas may beat the 202; one in flight at a time
					probe.Probe(ckf.AppendSequenceHashes(nil, []uint64{firstLocal})[0], time.Now())
				}
				resp, err := hc.Do(req)
				if err != nil {
					return // the soak ended
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if !assert.Equal(t, http.StatusAccepted, resp.StatusCode, "events: %s", resp.Status) {
					return
				}
				events.Add(64)
			}
		}()
	}

	// Slow subscribers: read 64 KiB every 64 ms (1 MB/s), resubscribing
	// under a higher epoch whenever closed.
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 64<<10)
			for epoch := uint64(1); ctx.Err() == nil; epoch++ {
				req, _ := http.NewRequestWithContext(ctx, "GET", fmt.Sprintf("%s/v1/pools/p/stream?consumer=%d&lane=0&epoch=%d", rl.base, 200+i, epoch), nil)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					return
				}
				for ctx.Err() == nil {
					if _, err := io.ReadFull(resp.Body, buf); err != nil {
						break
					}
					time.Sleep(64 * time.Millisecond)
				}
				resp.Body.Close()
				resubscribes.Add(1)
			}
		}()
	}
	// Stalled subscribers: never read past the headers.
	for i := range 8 {
		conn, err := net.Dial("tcp", rl.addr)
		require.NoError(t, err)
		defer conn.Close()
		require.NoError(t, conn.(*net.TCPConn).SetReadBuffer(4096))
		_, err = fmt.Fprintf(conn, "GET /v1/pools/p/stream?consumer=%d&lane=0&epoch=1 HTTP/1.1\r\nHost: relay\r\n\r\n", 300+i)
		require.NoError(t, err)
	}

	// Hostile clients.
	garbage := bytes.Repeat([]byte("{},"), 1<<18) // 768 KiB of empty objects, no closing bracket
	hostileReqs := []func() (*http.Request, error){
		func() (*http.Request, error) {
			return http.NewRequest("POST", rl.base+"/v1/pools/p/events?source_epoch=1", bytes.NewReader(append([]byte("["), garbage...)))
		},
		func() (*http.Request, error) {
			r, err := http.NewRequest("POST", rl.base+"/v1/pools/p/events?source_epoch=1", strings.NewReader(`[{"worker_id": 1}]`))
			if err == nil {
				r.Header.Set("Content-Type", "text/plain")
			}
			return r, err
		},
		func() (*http.Request, error) {
			return http.NewRequest("POST", rl.base+"/v1/pools/p/events?source_epoch=x", strings.NewReader(`[]`))
		},
		func() (*http.Request, error) {
			return http.NewRequest("POST", rl.base+"/v1/pools/p/ranks/replace", strings.NewReader(`{"ranks": [{"worker_id": 1}]}`))
		},
		func() (*http.Request, error) {
			return http.NewRequest("GET", rl.base+"/v1/pools/p/stream?consumer=1&lane=99&epoch=1", nil)
		},
		func() (*http.Request, error) {
			return http.NewRequest("GET", rl.base+"/v1/pools/p/stream?consumer=1&lane=0&epoch=0", nil) // stale: the measuring lane
		},
		func() (*http.Request, error) {
			return http.NewRequest("GET", rl.base+"/v1/pools/nope/stream?consumer=1&lane=0&epoch=1", nil)
		},
	}
	for g := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; ctx.Err() == nil; n++ {
				req, err := hostileReqs[(n+g)%len(hostileReqs)]()
				if !assert.NoError(t, err) { // not require: this is not the test's goroutine
					return
				}
				resp, err := http.DefaultClient.Do(req.WithContext(ctx))
				if err != nil {
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				assert.GreaterOrEqual(t, resp.StatusCode, 400, "hostile request %d answered %s", (n+g)%len(hostileReqs), resp.Status)
				hostile.Add(1)
				time.Sleep(20 * time.Millisecond)
			}
		}()
	}
	// Churn: subscribe under a fresh consumer id, read a little, drop.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for c := uint64(10_000); ctx.Err() == nil; c++ {
			req, _ := http.NewRequestWithContext(ctx, "GET", fmt.Sprintf("%s/v1/pools/p/stream?consumer=%d&lane=3&epoch=1", rl.base, c), nil)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return
			}
			_, _ = io.ReadFull(resp.Body, make([]byte, 4096))
			resp.Body.Close()
			time.Sleep(50 * time.Millisecond)
		}
	}()

	start := time.Now()
	time.AfterFunc(duration, stop)
	<-ctx.Done()
	elapsed := time.Since(start)
	hwm := procStatus(pid, "VmHWM")
	wg.Wait()
	peakRSS := max(hwm, peak.Load())
	require.NotZero(t, peakRSS, "no /proc: RSS not measured")
	s, p50, p99 := probe.Freshness()
	require.NotEmpty(t, s, "no freshness sample")
	rate := float64(events.Load()) / elapsed.Seconds()
	zsent, zapplied, zst := z.finish(t, rl.base)
	cat := getCatalog(t, rl.base)["p"]
	t.Logf("soak %v: %d events, %d hostile requests, %d slow resubscribes, %d freshness samples, %d blocks tracked at the end",
		elapsed.Round(time.Second), events.Load(), hostile.Load(), resubscribes.Load(), len(s), cat.Stats.UniqueBlocks)
	for _, l := range []string{
		fmt.Sprintf("BENCH relay_soak_events_per_s %.0f events/s", rate),
		fmt.Sprintf("BENCH relay_soak_freshness_p50_ms %.2f ms", float64(p50.Microseconds())/1000),
		fmt.Sprintf("BENCH relay_soak_freshness_p99_ms %.2f ms", float64(p99.Microseconds())/1000),
		fmt.Sprintf("BENCH relay_soak_peak_rss_mib %d MiB", peakRSS>>20),
		fmt.Sprintf("BENCH relay_soak_zmq_engine_batches_sent %d batches", zsent),
		fmt.Sprintf("BENCH relay_soak_zmq_engine_batches_applied %d batches", zapplied),
		fmt.Sprintf("BENCH relay_soak_zmq_peers_refused %d peers", zst.PeersRefused),
		fmt.Sprintf("BENCH relay_soak_zmq_rank_batches_rejected %d batches", zst.RejectedByReason["ranks"]),
	} {
		t.Log(l)
		fmt.Println(l)
	}
	t.Logf("soak ZMQ: %d hostile connections, %d rank-flood batches; source state %s, %d batches applied, %d ranks tracked, gaps %d, rejected %v",
		z.attacks.Load(), z.floods.Load(), zst.State, zst.Batches, len(zst.Ranks), zst.Gaps, zst.RejectedByReason)
	require.Equal(t, zsent, zapplied, "every engine batch was applied")
	require.Positive(t, uint64(zst.PeersRefused), "the hostile peers were refused")
	require.Positive(t, uint64(zst.RejectedByReason["ranks"]), "the rank flood was rejected")
	require.LessOrEqual(t, len(zst.Ranks), 64, "ranks are bounded")
	require.LessOrEqual(t, peakRSS>>20, budget, "the relay's peak RSS exceeds the soak budget")
	require.Positive(t, rate)
}

func assertOK(t *testing.T, err error, resp *http.Response) bool {
	t.Helper()
	if !assert.NoError(t, err) {
		return false
	}
	return assert.Equal(t, http.StatusOK, resp.StatusCode, "stream: %s", resp.Status)
}
