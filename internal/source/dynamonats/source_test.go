package dynamonats

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/internal/source"
	"github.com/ckfrelay/ckfrelay/internal/testing/natstest"
	"github.com/ckfrelay/ckfrelay/producer"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"
)

// recorder is a Sink that records the calls a source makes, in order.
type recorder struct {
	mu    sync.Mutex
	calls []string
}

func (r *recorder) add(s string) {
	r.mu.Lock()
	r.calls = append(r.calls, s)
	r.mu.Unlock()
}

func (r *recorder) AdmitEvents(_ context.Context, epoch uint64, evs []ckf.RouterEvent) error {
	for _, ev := range evs {
		r.add(fmt.Sprintf("admit w%d e%d id%d", ev.WorkerID, epoch%1000, ev.EventID))
	}
	return nil
}

func (r *recorder) ResetRank(_ context.Context, epoch uint64, m ckf.Member, degraded bool) error {
	r.add(fmt.Sprintf("reset w%d e%d degraded=%v", m.WorkerID, epoch%1000, degraded))
	return nil
}

func (r *recorder) ReplaceRanks(context.Context, []producer.RankReplacement) error {
	r.add("replace")
	return nil
}

func (r *recorder) snapshot() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.calls...)
}

func stored(worker, id uint64) ckf.RouterEvent {
	return ckf.RouterEvent{WorkerID: worker, EventID: id, Kind: ckf.EventStored,
		Blocks: []ckf.StoredBlock{{BlockHash: id + 100, TokensHash: id}}}
}

func envelope(t *testing.T, publisher, seq uint64, evs ...ckf.RouterEvent) []byte {
	t.Helper()
	b, err := Encode(Envelope{Topic: "kv-events", PublisherID: publisher, Sequence: seq, PublishedAt: 1}, evs)
	require.NoError(t, err)
	return b
}

func TestDecode_EnvelopeAndLegacyJSON(t *testing.T) {
	env, evs, err := Decode(envelope(t, 9, 4, stored(1, 5)), nil)
	require.NoError(t, err)
	assert.Equal(t, Envelope{Topic: "kv-events", PublisherID: 9, Sequence: 4, PublishedAt: 1, Payload: env.Payload, Enveloped: true}, env)
	require.Len(t, evs, 1)
	assert.EqualValues(t, uint64(5), evs[0].EventID)

	_, evs, err = Decode(envelope(t, 9, 5, stored(1, 6), stored(2, 7)), nil)
	require.NoError(t, err)
	assert.Len(t, evs, 2)

	env, evs, err = Decode([]byte(`{"worker_id": 3, "event": {"event_id": 8, "data": "cleared"}}`), nil)
	require.NoError(t, err)
	assert.False(t, env.Enveloped)
	assert.Equal(t, ckf.EventCleared, evs[0].Kind)

	for _, bad := range [][]byte{nil, {0xc1}, []byte(`{"worker_id": -1}`), envelope(t, 1, 1)[:5]} {
		_, _, err := Decode(bad, nil)
		assert.ErrorIs(t, err, ErrMalformed, "%x", bad)
	}
}

func FuzzDecode(f *testing.F) {
	b, _ := Encode(Envelope{PublisherID: 1, Sequence: 2}, []ckf.RouterEvent{stored(1, 2)})
	f.Add(b)
	b, _ = Encode(Envelope{PublisherID: 1, Sequence: 2}, []ckf.RouterEvent{stored(1, 2), stored(2, 3)})
	f.Add(b)
	f.Add([]byte(`{"worker_id": 3, "event": {"event_id": 8, "data": "cleared"}}`))
	// Hostile envelopes: negative integers, the array form, trailing bytes.
	neg, _ := msgpack.Marshal(map[string]any{"publisher_id": int8(-5), "sequence": int64(-1), "payload": []byte{0x80}})
	f.Add(neg)
	arr, _ := msgpack.Marshal([]any{"t", uint64(1), uint64(2), uint64(3), b})
	f.Add(arr)
	f.Add(append(append([]byte(nil), b...), 0xc0))
	// An unknown field nested past the skip bound (the red-team's stack
	// overflow, at a depth a fuzzer can mutate).
	f.Add(deepEnvelope(f, 4*maxSkipDepth))
	f.Fuzz(func(t *testing.T, data []byte) {
		env, evs, err := Decode(data, nil)
		if err != nil {
			require.Empty(t, evs)
			return
		}
		for i := range evs {
			require.LessOrEqual(t, evs[i].BlockCount(), DefaultLimits.MaxBlocksPerEvent)
		}
		require.LessOrEqual(t, len(evs), DefaultLimits.MaxEvents)
		if env.Enveloped {
			// What decodes re-encodes and decodes to the same events.
			again, err := Encode(env, evs)
			require.NoError(t, err)
			_, evs2, err := Decode(again, nil)
			require.NoError(t, err)
			require.Equal(t, len(evs), len(evs2))
		}
	})
}

func runSource(t *testing.T, cfg Config) (*Source, *recorder) {
	t.Helper()
	s, err := New(cfg)
	require.NoError(t, err)
	rec := &recorder{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Run(ctx, rec) }()
	t.Cleanup(func() { cancel(); <-done })
	require.Eventually(t, func() bool { return s.Status().State == "live" }, 10*time.Second, time.Millisecond)
	return s, rec
}

func waitCalls(t *testing.T, rec *recorder, n int) []string {
	t.Helper()
	require.Eventually(t, func() bool { return len(rec.snapshot()) >= n }, 10*time.Second, time.Millisecond,
		"calls: %v", rec.snapshot())
	return rec.snapshot()
}

// TestSource_CoreNATS: envelopes on core NATS are admitted; a duplicate is
// dropped; a gap in the publisher's sequence resets each of its members
// degraded; a restarted publisher (new publisher_id) resets the member
// under a newer epoch before its events.
func TestSource_CoreNATS(t *testing.T) {
	ns := natstest.Start(t, natstest.Options{})
	const subject = "namespace.dynamo.component.backend.kv-events"
	s, rec := runSource(t, Config{URL: ns.URL(), Subject: subject})
	nc, err := nats.Connect(ns.URL())
	require.NoError(t, err)
	defer nc.Close()
	pub := func(b []byte) { require.NoError(t, nc.Publish(subject, b)); require.NoError(t, nc.Flush()) }

	pub(envelope(t, 77, 0, stored(1, 1)))
	pub(envelope(t, 77, 1, stored(1, 2), stored(2, 3)))
	pub(envelope(t, 77, 1, stored(1, 2))) // duplicate
	pub(envelope(t, 77, 3, stored(1, 4))) // 2 lost
	pub(envelope(t, 88, 0, stored(1, 5))) // publisher restarted
	pub([]byte{0xc1})                     // malformed
	calls := waitCalls(t, rec, 8)
	require.Len(t, calls, 8, "%v", calls)
	assert.Regexp(t, `^admit w1 e\d+ id1$`, calls[0])
	assert.Regexp(t, `^admit w1 e\d+ id2$`, calls[1])
	assert.Regexp(t, `^admit w2 e\d+ id3$`, calls[2])
	// Sequence 2 may have carried either member: both are reset.
	assert.Regexp(t, `^reset w1 e\d+ degraded=true$`, calls[3])
	assert.Regexp(t, `^reset w2 e\d+ degraded=true$`, calls[4])
	assert.Regexp(t, `^admit w1 e\d+ id4$`, calls[5])
	assert.Regexp(t, `^reset w1 e\d+ degraded=false$`, calls[6])
	assert.Regexp(t, `^admit w1 e\d+ id5$`, calls[7])
	require.Eventually(t, func() bool { return s.Status().Rejected == 1 }, 5*time.Second, time.Millisecond)
	st := s.Status()
	assert.EqualValues(t, uint64(1), st.Dropped)
	assert.EqualValues(t, uint64(1), st.Gaps)
	assert.EqualValues(t, uint64(3), st.Resets)
}

// TestSource_EpochsGrowAcrossRestarts checks the epochs the sink sees with
// the real values: each reset's epoch exceeds the one before, and the
// events after it carry it.
func TestSource_EpochsGrowAcrossRestarts(t *testing.T) {
	s, err := New(Config{URL: "nats://unused", Subject: "x"})
	require.NoError(t, err)
	var epochs []uint64
	sink := epochSink{f: func(e uint64) { epochs = append(epochs, e) }}
	ctx := context.Background()
	for i, pubID := range []uint64{5, 6, 6, 7} {
		require.NoError(t, s.handleCore(ctx, sink, envelope(t, pubID, uint64(i), stored(1, uint64(i)))))
	}
	// admit(5) | reset(6) admit(6) | admit(6) | reset(7) admit(7)
	require.Len(t, epochs, 6)
	assert.Less(t, epochs[0], epochs[1])
	assert.Equal(t, epochs[1], epochs[2])
	assert.Equal(t, epochs[2], epochs[3])
	assert.Less(t, epochs[3], epochs[4])
	assert.Equal(t, epochs[4], epochs[5])
}

type epochSink struct{ f func(uint64) }

func (e epochSink) AdmitEvents(_ context.Context, epoch uint64, _ []ckf.RouterEvent) error {
	e.f(epoch)
	return nil
}
func (e epochSink) ResetRank(_ context.Context, epoch uint64, _ ckf.Member, _ bool) error {
	e.f(epoch)
	return nil
}
func (e epochSink) ReplaceRanks(context.Context, []producer.RankReplacement) error { return nil }

// TestSource_JetStreamDurable: a durable consumer reads what was published
// before the source started, and a second source on the same durable resumes
// after what the first acknowledged.
func TestSource_JetStreamDurable(t *testing.T) {
	ns := natstest.Start(t, natstest.Options{})
	const subject = "namespace.dynamo.component.backend.kv-events"
	_, js := ns.JetStream(t)
	ctx := context.Background()
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "namespace-dynamo-component-backend-kv-events", Subjects: []string{subject}})
	require.NoError(t, err)
	for i := range uint64(3) {
		_, err := js.Publish(ctx, subject, envelope(t, 9, i, stored(1, i)))
		require.NoError(t, err)
	}
	cfg := Config{URL: ns.URL(), Subject: subject, Stream: "namespace-dynamo-component-backend-kv-events", Durable: "ckfrelay"}
	s1, err := New(cfg)
	require.NoError(t, err)
	rec1 := &recorder{}
	ctx1, cancel1 := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = s1.Run(ctx1, rec1) }()
	waitCalls(t, rec1, 3)
	cons, err := js.Consumer(ctx, cfg.Stream, cfg.Durable)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.AckFloor.Stream == 3
	}, 10*time.Second, time.Millisecond)
	cancel1()
	<-done

	_, err = js.Publish(ctx, subject, envelope(t, 9, 3, stored(1, 3)))
	require.NoError(t, err)
	_, rec2 := runSource(t, cfg)
	calls := waitCalls(t, rec2, 1)
	assert.Regexp(t, `^admit w1 e\d+ id3$`, calls[0], "resumes after the acknowledged messages: %v", calls)
}

// handleCore handles one message as a core-NATS source does (no holding).
func (s *Source) handleCore(ctx context.Context, sink source.Sink, data []byte) error {
	_, err := s.handle(ctx, sink, data, false)
	return err
}
