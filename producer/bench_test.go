package producer

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// benchEvents returns a ring of Stored/Removed pairs over 64 members, four
// blocks per event: replaying the whole ring returns the pool to empty, so
// a benchmark can cycle it for any b.N at a steady load.
func benchEvents() (evs []ckf.RouterEvent, blocks int) {
	const members, rounds, perEvent = 64, 32, 4
	var tok uint64
	for r := range rounds {
		var stores []ckf.RouterEvent
		for m := range members {
			ev := ckf.RouterEvent{WorkerID: uint64(m), EventID: uint64(r), Kind: ckf.EventStored}
			var prev uint64
			for i := range perEvent {
				tok++
				c := tok
				if i > 0 {
					c = ckf.ChainHash(prev, tok)
				}
				ev.Blocks = append(ev.Blocks, ckf.StoredBlock{BlockHash: c, TokensHash: tok})
				prev = c
			}
			stores = append(stores, ev)
		}
		evs = append(evs, stores...)
		for _, s := range stores {
			rm := ckf.RouterEvent{WorkerID: s.WorkerID, EventID: s.EventID + 1, Kind: ckf.EventRemoved}
			for _, b := range s.Blocks {
				rm.BlockHashes = append(rm.BlockHashes, b.BlockHash)
			}
			evs = append(evs, rm)
		}
	}
	return evs, len(evs) * perEvent
}

func benchPoolConfig() ckf.Config {
	pc := ckf.DefaultConfig()
	pc.ExpectedBlocks = 1 << 16
	pc.PublishEveryNEvents = 16
	return pc
}

// startBenchActor starts an actor with a subscriber that drains every delta.
func startBenchActor(b *testing.B) (Handle, func()) {
	pool, err := ckf.NewPool(benchPoolConfig())
	require.NoError(b, err)
	cfg := DefaultConfig()
	cfg.SubscriberBuffer = 4096
	cfg.Logger = slog.New(slog.DiscardHandler)
	h, faults, err := Start(pool, testScope(), cfg)
	require.NoError(b, err)
	sub, err := h.Subscribe(context.Background(), testLease(1))
	require.NoError(b, err)
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		for range sub.Deltas() {
		}
	}()
	go func() {
		for f := range faults {
			assert.Fail(b, fmt.Sprintf("fault: %v", f))
		}
	}()
	return h, func() {
		assert.NoError(b, h.Shutdown(context.Background()))
		<-drained
		assert.ErrorIs(b, sub.Err(), ErrShuttingDown, "subscriber ended with")
	}
}

var benchSink ckf.ApplyOutcome

// BenchmarkActorAdmit compares events/s and blocks/s through AdmitEvent and
// through AdmitEvents in batches of 64 (an engine batch; with a draining
// subscriber; the timer stops once the actor has applied and published
// everything) against direct Pool.ApplyEvent on the same events.
// The ring (benchEvents) is 4,096 events, 64 batches of 64.
func BenchmarkActorAdmit(b *testing.B) {
	evs, blocks := benchEvents()
	perEvent := float64(blocks) / float64(len(evs))
	// report adds the rates and the process's CPU per event since cpu0
	// (every goroutine's: the caller's admission, the actor's, the
	// subscriber's and the runtime's), which on the loaded 2-core machine
	// swings far less than the wall time.
	report := func(b *testing.B, cpu0 int64) {
		s := b.Elapsed().Seconds()
		b.ReportMetric(float64(b.N)/s, "events/s")
		b.ReportMetric(float64(b.N)*perEvent/s, "blocks/s")
		b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op")
	}
	b.Run("impl=pool", func(b *testing.B) {
		pool, err := ckf.NewPool(benchPoolConfig())
		require.NoError(b, err)
		b.ReportAllocs()
		b.ResetTimer()
		cpu0 := processCPU()
		for i := range b.N {
			ev := evs[i%len(evs)]
			benchSink = pool.ApplyEvent(&ev)
		}
		pool.Flush()
		b.StopTimer()
		report(b, cpu0)
	})
	b.Run("impl=actor", func(b *testing.B) {
		h, stop := startBenchActor(b)
		defer stop()
		ctx := context.Background()
		b.ReportAllocs()
		b.ResetTimer()
		cpu0 := processCPU()
		for i := range b.N {
			if err := h.AdmitEvent(ctx, 0, evs[i%len(evs)]); err != nil {
				require.Fail(b, fmt.Sprint(err))
			}
		}
		require.NoError(b, h.Flush(ctx)) // everything admitted is applied and published
		b.StopTimer()
		report(b, cpu0)
	})
	// Batches of 64: the events of the direct apply, which no one
	// allocates per event, so the ratio is the actor's cost alone (a
	// source decodes each engine batch into fresh events whether it hands
	// them to an actor or to a pool). The actor never changes an admitted
	// event, so the batches are sub-slices of the ring, re-admitted every
	// lap.
	b.Run("impl=actor-batch64", func(b *testing.B) {
		const batch = 64
		require.Zero(b, len(evs)%batch, "the ring is whole batches")
		h, stop := startBenchActor(b)
		defer stop()
		ctx := context.Background()
		b.ReportAllocs()
		b.ResetTimer()
		cpu0 := processCPU()
		for i := 0; i < b.N; i += batch {
			j := i % len(evs)
			if err := h.AdmitEvents(ctx, 0, evs[j:j+min(batch, b.N-i)]); err != nil {
				require.Fail(b, fmt.Sprint(err))
			}
		}
		require.NoError(b, h.Flush(ctx))
		b.StopTimer()
		report(b, cpu0)
	})
	// The same with the caller's allocation: every batch a fresh slice the
	// events are copied into (what the benchmark measured before
	// 2026-12-06, ≈ 100 B per event of garbage).
	b.Run("impl=actor-batch64-alloc", func(b *testing.B) {
		const batch = 64
		h, stop := startBenchActor(b)
		defer stop()
		ctx := context.Background()
		b.ReportAllocs()
		b.ResetTimer()
		cpu0 := processCPU()
		for i := 0; i < b.N; i += batch {
			n := min(batch, b.N-i)
			next := make([]ckf.RouterEvent, n)
			for j := range next {
				next[j] = evs[(i+j)%len(evs)]
			}
			if err := h.AdmitEvents(ctx, 0, next); err != nil {
				require.Fail(b, fmt.Sprint(err))
			}
		}
		require.NoError(b, h.Flush(ctx))
		b.StopTimer()
		report(b, cpu0)
	})
}

// BenchmarkActorLatency measures AdmitEvent latency at 50% of the maximum
// admission rate measured just before, in the same process.
func BenchmarkActorLatency(b *testing.B) {
	evs, _ := benchEvents()
	b.Run("rate=50pct", func(b *testing.B) {
		h, stop := startBenchActor(b)
		defer stop()
		ctx := context.Background()
		// Calibrate: the sustained rate over 100 ms of back-to-back admission.
		n, start := 0, time.Now()
		for time.Since(start) < 100*time.Millisecond {
			for range 256 {
				if err := h.AdmitEvent(ctx, 0, evs[n%len(evs)]); err != nil {
					require.Fail(b, fmt.Sprint(err))
				}
				n++
			}
		}
		require.NoError(b, h.Flush(ctx))
		maxRate := float64(n) / time.Since(start).Seconds()
		interval := time.Duration(float64(time.Second) / (maxRate / 2))
		lat := make([]time.Duration, b.N)
		b.ResetTimer()
		next := time.Now()
		for i := range b.N {
			for time.Now().Before(next) { // pace by spinning: sleeps are far coarser than the interval
			}
			t0 := time.Now()
			if err := h.AdmitEvent(ctx, 0, evs[(n+i)%len(evs)]); err != nil {
				require.Fail(b, fmt.Sprint(err))
			}
			lat[i] = time.Since(t0)
			next = next.Add(interval)
		}
		b.StopTimer()
		slices.Sort(lat)
		b.ReportMetric(maxRate, "max-events/s")
		b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
		b.ReportMetric(float64(lat[min(len(lat)-1, len(lat)*99/100)].Nanoseconds()), "p99-ns")
	})
}
