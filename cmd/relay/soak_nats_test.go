//go:build unix

package main

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/internal/server"
	"github.com/ckfrelay/ckfrelay/internal/source/dynamonats"
	"github.com/ckfrelay/ckfrelay/internal/testing/natstest"
)

// TestSoak_DynamoSourceBesideHostilePublishers runs the real relay with a
// Dynamo core-NATS source for CKFRELAY_SOAK_DURATION (default 60s; skipped
// under -short): a normal publisher (8 workers storing and later removing
// blocks, one envelope sequence) beside hostile ones on the same subject —
// negative envelope integers, events past max_blocks_per_event, a flood of
// distinct worker ids, garbage. It reports the normal publisher's delivered
// messages and the relay's peak RSS as BENCH lines, and fails if a normal
// message was lost, a hostile one reset a normal worker, or the peak RSS
// exceeds CKFRELAY_SOAK_RSS_BUDGET_MIB (default 512).
func TestSoak_DynamoSourceBesideHostilePublishers(t *testing.T) {
	if testing.Short() {
		t.Skip("soak: runs the relay binary for a minute")
	}
	duration := envDuration(t, "CKFRELAY_SOAK_DURATION", 60*time.Second)
	budget := int64(512)
	if v := envInt(t, "CKFRELAY_SOAK_RSS_BUDGET_MIB"); v > 0 {
		budget = v
	}
	ns := natstest.Start(t, natstest.Options{NoJetStream: true})
	const subject = "namespace.dynamo.component.backend.kv-events"
	cfg := server.Config{Listen: "127.0.0.1:0",
		Pools: []server.PoolSpec{{Name: "p", DCID: 1, ExpectedBlocks: 1 << 20, MaxMembers: 1024,
			Sources: []server.SourceSpec{{Engine: "dynamo", URL: ns.URL(), Subject: subject}}}}}
	rl := startRelay(t, "--config", writeConfig(t, cfg))
	pid := rl.cmd.Process.Pid
	require.Eventually(t, func() bool { st, _ := sourceOf(t, rl.base, "p"); return st.State == "live" }, 10*time.Second, 5*time.Millisecond)

	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var wg sync.WaitGroup
	var peak atomic.Int64
	go func() {
		for ctx.Err() == nil {
			if r := procStatus(pid, "VmRSS"); r > peak.Load() {
				peak.Store(r)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	conn := func() *nats.Conn {
		nc, err := nats.Connect(ns.URL())
		require.NoError(t, err)
		t.Cleanup(nc.Close)
		return nc
	}
	encode := func(publisher, seq uint64, evs ...ckf.RouterEvent) []byte {
		b, err := dynamonats.Encode(dynamonats.Envelope{Topic: "kv-events", PublisherID: publisher, Sequence: seq, PublishedAt: 1}, evs)
		require.NoError(t, err)
		return b
	}

	// The normal publisher: 8 workers, 16 events a message, a block stored
	// is removed 2,048 events later; paced so core NATS never drops.
	var normalMsgs, normalEvents atomic.Int64
	nc := conn()
	first := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		var seq, next uint64
		const window = 2048
		for ctx.Err() == nil {
			evs := make([]ckf.RouterEvent, 0, 16)
			for range 16 {
				next++
				w := next % 8
				if next%2 == 0 && next > window {
					old := next - window - 1
					evs = append(evs, ckf.RouterEvent{WorkerID: old % 8, EventID: next, Kind: ckf.EventRemoved, BlockHashes: []uint64{old}})
					continue
				}
				evs = append(evs, ckf.RouterEvent{WorkerID: w, EventID: next, Kind: ckf.EventStored,
					Blocks: []ckf.StoredBlock{{BlockHash: next, TokensHash: next}}})
			}
			if nc.Publish(subject, encode(1, seq, evs...)) != nil {
				return
			}
			if seq == 0 {
				_ = nc.Flush()
				close(first) // the normal workers are the source's first members
			}
			seq++
			normalMsgs.Add(1)
			normalEvents.Add(int64(len(evs)))
			time.Sleep(2 * time.Millisecond)
		}
		_ = nc.Flush()
	}()

	// Hostile publishers on the same subject.
	var hostile atomic.Int64
	hostileMsgs := func(i uint64) []byte {
		switch i % 4 {
		case 0: // a negative sequence and publisher id for a normal worker
			ev := ckf.RouterEvent{WorkerID: 1, EventID: 1, Kind: ckf.EventCleared}
			payload, _ := dynamonats.Encode(dynamonats.Envelope{}, []ckf.RouterEvent{ev})
			var env map[string]any
			_ = msgpack.Unmarshal(payload, &env)
			env["sequence"], env["publisher_id"] = int64(-1), int8(-5)
			b, _ := msgpack.Marshal(env)
			return b
		case 1: // 20,000 blocks in one event
			ev := ckf.RouterEvent{WorkerID: 5000 + i, EventID: i, Kind: ckf.EventStored}
			for j := range uint64(20000) {
				ev.Blocks = append(ev.Blocks, ckf.StoredBlock{BlockHash: i<<20 | j, TokensHash: j})
			}
			return encode(9000+i, 0, ev)
		case 2: // 1,000 distinct workers
			evs := make([]ckf.RouterEvent, 0, 1000)
			for j := range uint64(1000) {
				evs = append(evs, ckf.RouterEvent{WorkerID: 1<<32*(i+1) + j, EventID: j, Kind: ckf.EventCleared})
			}
			return encode(10000+i, 0, evs...)
		}
		return []byte{0xc1, 0xff, 0x00}
	}
	<-first
	for g := range uint64(2) {
		hc := conn()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; ctx.Err() == nil; i += 2 {
				if hc.Publish(subject, hostileMsgs(i)) != nil {
					return
				}
				hostile.Add(1)
				time.Sleep(20 * time.Millisecond)
			}
		}()
	}

	start := time.Now()
	time.AfterFunc(duration, stop)
	<-ctx.Done()
	wg.Wait()
	elapsed := time.Since(start)
	hwm := procStatus(pid, "VmHWM")
	// Every normal message is heard: the source's resets stay at zero and
	// the normal workers' events all arrive.
	var st struct{ events, gaps, resets, dropped, rejected uint64 }
	require.Eventually(t, func() bool {
		s, _ := sourceOf(t, rl.base, "p")
		st.events, st.gaps, st.resets, st.dropped, st.rejected = uint64(s.Events), uint64(s.Gaps), uint64(s.Resets), uint64(s.Dropped), uint64(s.Rejected)
		return st.events >= uint64(normalEvents.Load())
	}, 20*time.Second, 20*time.Millisecond, "the normal publisher's events never all arrived")
	peakRSS := max(hwm, peak.Load())
	require.NotZero(t, peakRSS, "no /proc: RSS not measured")
	t.Logf("dynamo soak %v: normal %d messages (%d events), hostile %d messages; source events %d, dropped %d, rejected %d, gaps %d, resets %d",
		elapsed.Round(time.Second), normalMsgs.Load(), normalEvents.Load(), hostile.Load(), st.events, st.dropped, st.rejected, st.gaps, st.resets)
	for _, l := range []string{
		fmt.Sprintf("BENCH relay_soak_dynamo_normal_msgs_per_s %.0f msgs/s", float64(normalMsgs.Load())/elapsed.Seconds()),
		fmt.Sprintf("BENCH relay_soak_dynamo_peak_rss_mib %d MiB", peakRSS>>20),
	} {
		t.Log(l)
		fmt.Println(l)
	}
	assert.Zero(t, st.gaps, "a hostile message made a gap")
	assert.Zero(t, st.resets, "a hostile message reset a worker")
	assert.Positive(t, st.rejected)
	assert.Positive(t, st.dropped)
	require.LessOrEqual(t, peakRSS>>20, budget, "the relay's peak RSS exceeds the soak budget")
}

// envInt reads an integer from the environment (0 when unset).
func envInt(t *testing.T, name string) int64 {
	var v int64
	if s := os.Getenv(name); s != "" {
		_, err := fmt.Sscan(s, &v)
		require.NoError(t, err, name)
	}
	return v
}
