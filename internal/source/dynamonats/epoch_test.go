package dynamonats

import (
	"context"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/internal/source"
	"github.com/ckfrelay/ckfrelay/internal/testing/natstest"
	"github.com/ckfrelay/ckfrelay/producer"
)

// realPool is a real producer actor over a real pool, counting its faults.
type realPool struct {
	h      producer.Handle
	faults atomic.Int64
}

func startRealPool(t *testing.T) *realPool {
	t.Helper()
	cfg := ckf.DefaultConfig()
	cfg.ExpectedBlocks = 1 << 12
	pool, err := ckf.NewPool(cfg)
	require.NoError(t, err)
	h, faults, err := producer.Start(pool, producer.Scope{ProducerIncarnation: 1}, producer.DefaultConfig())
	require.NoError(t, err)
	rp := &realPool{h: h}
	go func() {
		for f := range faults {
			rp.faults.Add(1)
			t.Logf("fault: %v", f)
		}
	}()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = h.Shutdown(ctx)
	})
	return rp
}

// blocks returns the external block hashes member w holds, sorted.
func (rp *realPool) blocks(t *testing.T, w uint64) []uint64 {
	t.Helper()
	st, err := rp.h.ExportState(context.Background())
	require.NoError(t, err)
	var out []uint64
	for _, m := range st.Members {
		if m.Lineage.Member.WorkerID == w {
			for _, b := range m.Lineage.Blocks {
				out = append(out, b.External)
			}
		}
	}
	slices.Sort(out)
	return out
}

// runOn runs a source over sink until the test ends (or stop is called).
func runOn(t *testing.T, cfg Config, sink source.Sink) (*Source, func()) {
	t.Helper()
	s, err := New(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Run(ctx, sink) }()
	stop := func() { cancel(); <-done }
	t.Cleanup(stop)
	require.Eventually(t, func() bool { return s.Status().State == "live" }, 10*time.Second, time.Millisecond)
	return s, stop
}

// TestSource_MemberBackAfterTimeoutIsAdmitted: a member reset for silence
// past source_timeout and then heard again (same publisher, next sequence)
// is announced under a new epoch and its events are applied — not refused by
// the actor as an unannounced epoch while the source reads live.
func TestSource_MemberBackAfterTimeoutIsAdmitted(t *testing.T) {
	ns := natstest.Start(t, natstest.Options{})
	const subject = "ns.dynamo.backend.kv-events"
	rp := startRealPool(t)
	s, _ := runOn(t, Config{URL: ns.URL(), Subject: subject, SourceTimeout: 200 * time.Millisecond}, rp.h)
	nc, err := nats.Connect(ns.URL())
	require.NoError(t, err)
	defer nc.Close()
	pub := func(b []byte) { require.NoError(t, nc.Publish(subject, b)); require.NoError(t, nc.Flush()) }

	pub(envelope(t, 7, 0, stored(1, 1)))
	require.Eventually(t, func() bool { return slices.Equal(rp.blocks(t, 1), []uint64{101}) }, 10*time.Second, time.Millisecond)
	// Silent past source_timeout: the member is reset and forgotten.
	require.Eventually(t, func() bool { return s.Status().Resets >= 1 && len(rp.blocks(t, 1)) == 0 }, 10*time.Second, time.Millisecond)

	pub(envelope(t, 7, 1, stored(1, 2)))
	require.Eventually(t, func() bool { return slices.Equal(rp.blocks(t, 1), []uint64{102}) }, 10*time.Second, time.Millisecond,
		"the returning member's event is applied")
	require.NoError(t, rp.h.Flush(context.Background()))
	assert.Zero(t, rp.faults.Load(), "no event refused as an unannounced epoch")
	assert.Equal(t, "live", s.Status().State)
}

// TestSource_FirstContactAfterRelayRestartAnnouncesItsEpoch: a source that
// starts over a pool already holding a member (the relay restarted with
// --data-dir and recovered it) resets the member under a new epoch at first
// contact: the blocks the engine removed while the relay was away are not
// advertised any more, and the new events are applied.
func TestSource_FirstContactAfterRelayRestartAnnouncesItsEpoch(t *testing.T) {
	ns := natstest.Start(t, natstest.Options{})
	const subject = "ns.dynamo.backend.kv-events"
	rp := startRealPool(t)
	nc, err := nats.Connect(ns.URL())
	require.NoError(t, err)
	defer nc.Close()
	pub := func(b []byte) { require.NoError(t, nc.Publish(subject, b)); require.NoError(t, nc.Flush()) }

	cfg := Config{URL: ns.URL(), Subject: subject}
	_, stop := runOn(t, cfg, rp.h)
	for i := range uint64(3) {
		pub(envelope(t, 7, i, stored(1, i+1)))
	}
	require.Eventually(t, func() bool { return slices.Equal(rp.blocks(t, 1), []uint64{101, 102, 103}) }, 10*time.Second, time.Millisecond)
	stop() // the relay goes away; the pool keeps what it recovered

	// While away: the engine removed 1–3 (that message is lost with the
	// relay). Back: the engine stores 10.
	s2, _ := runOn(t, cfg, rp.h)
	pub(envelope(t, 7, 4, stored(1, 10)))
	require.Eventually(t, func() bool { return slices.Equal(rp.blocks(t, 1), []uint64{110}) }, 10*time.Second, time.Millisecond,
		"removed blocks are not advertised, the new one is: %v", rp.blocks(t, 1))
	require.NoError(t, rp.h.Flush(context.Background()))
	assert.Zero(t, rp.faults.Load())
	st := s2.Status()
	assert.Equal(t, "live", st.State)
	assert.EqualValues(t, 1, st.Resets, "first contact announced the member's epoch")
	assert.Zero(t, st.Restarts, "the relay restarted, not the engine")
}

// TestSource_RefusedEpochReadsFailing: a member whose epoch the pool refuses
// for good (its recorded epoch at the ceiling) makes the source read
// failing, not live, and its events are not counted as admitted.
func TestSource_RefusedEpochReadsFailing(t *testing.T) {
	ns := natstest.Start(t, natstest.Options{})
	const subject = "ns.dynamo.backend.kv-events"
	rp := startRealPool(t)
	m := ckf.Member{WorkerID: 1}
	require.NoError(t, rp.h.ResetRank(context.Background(), producer.MaxSourceEpoch, m, false))
	s, _ := runOn(t, Config{URL: ns.URL(), Subject: subject}, rp.h)
	nc, err := nats.Connect(ns.URL())
	require.NoError(t, err)
	defer nc.Close()
	require.NoError(t, nc.Publish(subject, envelope(t, 7, 0, stored(1, 1))))
	require.NoError(t, nc.Flush())
	require.Eventually(t, func() bool { return s.Status().State == source.StateFailing }, 10*time.Second, time.Millisecond)
	st := s.Status()
	assert.Zero(t, st.Events, "nothing counted as admitted")
	assert.Contains(t, st.LastError, "refused for good")
	assert.Empty(t, rp.blocks(t, 1))
}

// TestSource_NATSReconnectIsNotARestart: the NATS server going away and
// coming back counts a reconnect, not an engine restart.
func TestSource_NATSReconnectIsNotARestart(t *testing.T) {
	ns := natstest.Start(t, natstest.Options{})
	s, _ := runSource(t, Config{URL: ns.URL(), Subject: "x"})
	ns.Restart()
	require.Eventually(t, func() bool { st := s.Status(); return st.Reconnects+st.Restarts > 0 && st.State == "live" },
		20*time.Second, 5*time.Millisecond)
	st := s.Status()
	assert.EqualValues(t, 1, st.Reconnects)
	assert.Zero(t, st.Restarts)
}

// gatedSink is a real pool whose Durable waits for the test's release.
type gatedSink struct {
	producer.Handle
	entered chan struct{}
	release chan struct{}
}

func (g *gatedSink) Durable(ctx context.Context) error {
	select {
	case g.entered <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-g.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// TestSource_JetStreamAcksOnlyWhatIsDurable: on JetStream a message is
// acknowledged only after the sink says the events it admitted are durable;
// until then the server holds it as pending (a crash now redelivers it).
func TestSource_JetStreamAcksOnlyWhatIsDurable(t *testing.T) {
	ns := natstest.Start(t, natstest.Options{})
	const subject = "ns.dynamo.backend.kv-events"
	_, js := ns.JetStream(t)
	ctx := context.Background()
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "kv", Subjects: []string{subject}})
	require.NoError(t, err)
	rp := startRealPool(t)
	sink := &gatedSink{Handle: rp.h, entered: make(chan struct{}), release: make(chan struct{})}
	_, err = js.Publish(ctx, subject, envelope(t, 7, 0, stored(1, 1)))
	require.NoError(t, err)
	runOn(t, Config{URL: ns.URL(), Subject: subject, Stream: "kv", Durable: "relay"}, sink)

	select {
	case <-sink.entered:
	case <-time.After(10 * time.Second):
		require.Fail(t, "the source never waited for durability before acknowledging")
	}
	assert.Equal(t, []uint64{101}, rp.blocks(t, 1), "admitted")
	cons, err := js.Consumer(ctx, "kv", "relay")
	require.NoError(t, err)
	info, err := cons.Info(ctx)
	require.NoError(t, err)
	assert.Zero(t, info.AckFloor.Stream, "not acknowledged before it is durable")
	assert.Equal(t, 1, info.NumAckPending)
	close(sink.release)
	require.Eventually(t, func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.AckFloor.Stream == 1 && info.NumAckPending == 0
	}, 10*time.Second, time.Millisecond, "acknowledged once durable")
}

// TestSource_JetStreamStopNaksWhatIsNotDurable: a source stopped while it
// waits for durability — a relay replica that lost its leadership (issue
// #34) — naks what it holds, so the next leader's source gets it at once
// instead of after AckWait (5 s).
func TestSource_JetStreamStopNaksWhatIsNotDurable(t *testing.T) {
	ns := natstest.Start(t, natstest.Options{})
	const subject = "ns.dynamo.backend.kv-events"
	_, js := ns.JetStream(t)
	ctx := context.Background()
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "kv", Subjects: []string{subject}})
	require.NoError(t, err)
	rp := startRealPool(t)
	sink := &gatedSink{Handle: rp.h, entered: make(chan struct{}), release: make(chan struct{})}
	_, err = js.Publish(ctx, subject, envelope(t, 7, 0, stored(1, 1)))
	require.NoError(t, err)
	cfg := Config{URL: ns.URL(), Subject: subject, Stream: "kv", Durable: "relay"}
	_, stop := runOn(t, cfg, sink)
	<-sink.entered
	stop()
	stopped := time.Now()

	// The next leader's source: it gets the message well before AckWait.
	next := startRealPool(t)
	runOn(t, cfg, next.h)
	require.Eventually(t, func() bool { return len(next.blocks(t, 1)) == 1 }, 10*time.Second, time.Millisecond)
	took := time.Since(stopped)
	assert.Less(t, took, 2*time.Second, "redelivered after %v: left to AckWait (5 s), not naked", took)
}
