package dynamonats

import (
	"bytes"
	"context"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/internal/source"
	"github.com/ckfrelay/ckfrelay/internal/testing/natstest"
	"github.com/ckfrelay/ckfrelay/producer"
	"github.com/ckfrelay/ckfrelay/wire"
)

// rawEnvelope encodes an envelope map with arbitrary field values (negative
// integers, floats), as a hostile publisher could.
func rawEnvelope(t *testing.T, fields map[string]any, evs ...ckf.RouterEvent) []byte {
	t.Helper()
	payload, err := wire.AppendRouterEventMsgpack(nil, &evs[0])
	require.NoError(t, err)
	m := map[string]any{"topic": "kv-events", "publisher_id": uint64(1), "sequence": uint64(0), "published_at": uint64(1), "payload": payload}
	for k, v := range fields {
		m[k] = v
	}
	b, err := msgpack.Marshal(m)
	require.NoError(t, err)
	return b
}

func bigEvent(worker uint64, blocks int) ckf.RouterEvent {
	ev := ckf.RouterEvent{WorkerID: worker, EventID: 1, Kind: ckf.EventStored}
	for i := range blocks {
		ev.Blocks = append(ev.Blocks, ckf.StoredBlock{BlockHash: uint64(i + 1), TokensHash: uint64(i + 1)})
	}
	return ev
}

// TestDecode_RejectsOutOfRangeEnvelopeValues: negative or non-integer
// publisher_id, sequence and published_at are typed errors, not huge
// unsigned numbers.
func TestDecode_RejectsOutOfRangeEnvelopeValues(t *testing.T) {
	for name, fields := range map[string]map[string]any{
		"sequence -1":          {"sequence": int64(-1)},
		"publisher_id -5":      {"publisher_id": int8(-5)},
		"published_at -2^63":   {"published_at": int64(math.MinInt64)},
		"sequence float":       {"sequence": 1.5},
		"publisher_id string":  {"publisher_id": "7"},
		"sequence -1 as int32": {"sequence": int32(-1)},
	} {
		_, evs, err := Decode(rawEnvelope(t, fields, stored(1, 1)), nil)
		assert.ErrorIs(t, err, ErrOutOfRange, name)
		assert.ErrorIs(t, err, ErrMalformed, name)
		assert.Empty(t, evs, name)
	}
	// Non-negative values of signed widths are fine (other msgpack writers
	// use them), as is the array form.
	env, _, err := Decode(rawEnvelope(t, map[string]any{"sequence": int64(5), "publisher_id": int8(9)}, stored(1, 1)), nil)
	require.NoError(t, err)
	assert.Equal(t, uint64(5), env.Sequence)
	assert.Equal(t, uint64(9), env.PublisherID)
	payload, err := wire.AppendRouterEventMsgpack(nil, &[]ckf.RouterEvent{stored(1, 1)}[0])
	require.NoError(t, err)
	arr, err := msgpack.Marshal([]any{"kv-events", uint64(3), uint64(4), uint64(1), payload})
	require.NoError(t, err)
	env, evs, err := Decode(arr, nil)
	require.NoError(t, err)
	assert.Equal(t, uint64(3), env.PublisherID)
	assert.Equal(t, uint64(4), env.Sequence)
	assert.Len(t, evs, 1)
	_, _, err = Decode(append(envelope(t, 1, 1, stored(1, 1)), 0xc0), nil)
	assert.ErrorIs(t, err, ErrMalformed, "trailing bytes")
}

// TestDecode_BlocksPerEventLimit: an event past max_blocks_per_event (4,096
// by default, as over HTTP) is refused in every payload form.
func TestDecode_BlocksPerEventLimit(t *testing.T) {
	big := bigEvent(1, 20000)
	single := envelope(t, 1, 0, big)
	batch := envelope(t, 1, 0, big, stored(2, 2))
	legacy, err := wire.AppendRouterEventsJSON(nil, []ckf.RouterEvent{big})
	require.NoError(t, err)
	legacy = legacy[1 : len(legacy)-1] // the bare object
	for name, msg := range map[string][]byte{"single": single, "batch": batch, "legacy JSON": legacy} {
		_, evs, err := Decode(msg, nil)
		assert.ErrorIs(t, err, wire.ErrLimitExceeded, name)
		assert.ErrorIs(t, err, ErrMalformed, name)
		assert.Empty(t, evs, name)
	}
	_, evs, err := DecodeLimited(envelope(t, 1, 0, bigEvent(1, 5)), nil, wire.BatchLimits{MaxEvents: 1, MaxBlocksPerEvent: 4})
	assert.ErrorIs(t, err, wire.ErrLimitExceeded, "the configured limit applies")
	assert.Empty(t, evs)
	_, evs, err = Decode(envelope(t, 1, 0, bigEvent(1, 4096)), nil)
	require.NoError(t, err, "at the limit")
	assert.Len(t, evs, 1)
}

// TestSource_MembersAreBounded: a flood of distinct worker ids tracks at
// most MaxMembers members; the rest are dropped and counted.
func TestSource_MembersAreBounded(t *testing.T) {
	s, err := New(Config{URL: "nats://unused", Subject: "x", MaxMembers: 4})
	require.NoError(t, err)
	rec := &recorder{}
	ctx := context.Background()
	evs := make([]ckf.RouterEvent, 0, 10)
	for w := range uint64(10) {
		evs = append(evs, stored(w, w))
	}
	require.NoError(t, s.handleCore(ctx, rec, envelope(t, 1, 0, evs...)))
	for w := range uint64(100) { // and one worker a message
		require.NoError(t, s.handleCore(ctx, rec, envelope(t, 2+w, 0, stored(1000+w, 1))))
	}
	assert.Len(t, s.members, 4)
	assert.Len(t, rec.snapshot(), 4, "only the tracked members' events are admitted")
	st := s.Status()
	assert.EqualValues(t, 106, st.Dropped)
	assert.Contains(t, st.LastError, "max_members 4")
	// A tracked member goes on as before.
	require.NoError(t, s.handleCore(ctx, rec, envelope(t, 1, 1, stored(0, 50))))
	assert.Len(t, rec.snapshot(), 5)
}

// TestSource_SequenceWrapIsExplicit: 2^64−1 is followed by 0 (in order, no
// gap); a redelivery of a pre-wrap sequence is a duplicate, not a gap.
func TestSource_SequenceWrapIsExplicit(t *testing.T) {
	s, err := New(Config{URL: "nats://unused", Subject: "x"})
	require.NoError(t, err)
	rec := &recorder{}
	ctx := context.Background()
	for i, seq := range []uint64{math.MaxUint64 - 1, math.MaxUint64, 0, math.MaxUint64, math.MaxUint64 - 1, 1} {
		require.NoError(t, s.handleCore(ctx, rec, envelope(t, 7, seq, stored(1, uint64(i)))))
	}
	calls := rec.snapshot()
	require.Len(t, calls, 4, "%v", calls)
	for _, c := range calls {
		assert.Regexp(t, `^admit `, c, "no reset: %v", calls)
	}
	st := s.Status()
	assert.Zero(t, st.Gaps)
	assert.EqualValues(t, 2, st.Dropped)
	// A real gap after the wrap is still one.
	require.NoError(t, s.handleCore(ctx, rec, envelope(t, 7, 5, stored(1, 9))))
	assert.EqualValues(t, 1, s.Status().Gaps)
}

// poolSink refuses a reset below the member's epoch, as the producer does.
type poolSink struct {
	mu     sync.Mutex
	epochs map[ckf.Member]uint64
	resets int
	admits int
}

func (p *poolSink) AdmitEvents(context.Context, uint64, []ckf.RouterEvent) error {
	p.mu.Lock()
	p.admits++
	p.mu.Unlock()
	return nil
}

func (p *poolSink) ResetRank(_ context.Context, epoch uint64, m ckf.Member, _ bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.resets++
	if cur := p.epochs[m]; epoch < cur {
		return &producer.StaleSourceEpochError{Member: m, Current: cur, Received: epoch}
	}
	p.epochs[m] = epoch
	return nil
}

func (p *poolSink) ReplaceRanks(context.Context, []producer.RankReplacement) error { return nil }

func (p *poolSink) counts() (int, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.resets, p.admits
}

// TestSource_StaleResetIsNotRedeliveredForever: on JetStream, a message
// whose reset the pool refuses as stale is answered by adopting the pool's
// higher epoch; one that can never be admitted (the pool's epoch at the
// ceiling) is terminated and counted, not Nak'd and redelivered forever.
func TestSource_StaleResetIsNotRedeliveredForever(t *testing.T) {
	ns := natstest.Start(t, natstest.Options{})
	const subject = "namespace.dynamo.component.backend.kv-events"
	_, js := ns.JetStream(t)
	ctx := context.Background()
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "kv", Subjects: []string{subject}})
	require.NoError(t, err)
	high, stuck := ckf.Member{WorkerID: 1}, ckf.Member{WorkerID: 2}
	sink := &poolSink{epochs: map[ckf.Member]uint64{high: 1 << 61, stuck: producer.MaxSourceEpoch}}
	// Each worker's second publisher restarts it: a reset.
	for _, msg := range [][]byte{
		envelope(t, 10, 0, stored(1, 1)), envelope(t, 11, 0, stored(1, 2)),
		envelope(t, 20, 0, stored(2, 1)), envelope(t, 21, 0, stored(2, 2)),
	} {
		_, err := js.Publish(ctx, subject, msg)
		require.NoError(t, err)
	}
	cfg := Config{URL: ns.URL(), Subject: subject, Stream: "kv", Durable: "relay"}
	s, err := New(cfg)
	require.NoError(t, err)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Run(rctx, sink) }()
	defer func() { cancel(); <-done }()
	cons, err := js.Consumer(ctx, "kv", "relay")
	require.Eventually(t, func() bool {
		if err != nil {
			cons, err = js.Consumer(ctx, "kv", "relay")
			return false
		}
		info, ierr := cons.Info(ctx)
		return ierr == nil && info.AckFloor.Stream == 4 && info.NumAckPending == 0
	}, 15*time.Second, 5*time.Millisecond, "every message settled")
	resets, admits := sink.counts()
	assert.Equal(t, 3, admits, "worker 1's both events and worker 2's first")
	sink.mu.Lock()
	assert.Equal(t, uint64(1<<61+1), sink.epochs[high], "worker 1 adopted the pool's epoch")
	sink.mu.Unlock()
	assert.EqualValues(t, 1, s.Status().Dropped, "the unadmittable message is counted")
	assert.Contains(t, s.Status().LastError, "refused for good")
	// Nothing is redelivered: the reset count stays where it is.
	info, err := cons.Info(ctx)
	require.NoError(t, err)
	assert.Zero(t, info.NumRedelivered)
	assert.Equal(t, 3, resets, "worker 1: stale then adopted; worker 2: one refused reset")
}

// deepEnvelope is an envelope map whose unknown key "zz" holds depth nested
// one-element arrays around a nil, before the known fields.
func deepEnvelope(t testing.TB, depth int) []byte {
	t.Helper()
	payload, err := wire.AppendRouterEventMsgpack(nil, &[]ckf.RouterEvent{stored(1, 1)}[0])
	require.NoError(t, err)
	b := append([]byte{0x86, 0xa2, 'z', 'z'}, bytes.Repeat([]byte{0x91}, depth)...)
	b = append(b, 0xc0)
	rest, err := msgpack.Marshal(map[string]any{"topic": "kv-events", "publisher_id": uint64(1), "sequence": uint64(0), "published_at": uint64(1), "payload": payload})
	require.NoError(t, err)
	return append(b, rest[1:]...) // the known fields without their map header
}

// TestDecode_DeeplyNestedUnknownFieldIsMalformed: a value under a key the
// envelope does not know is skipped with a bound on its nesting. Before,
// the library's recursive Skip ran 16 M levels deep and the relay died of a
// stack overflow (fatal, not a panic: nothing recovers it) on one NATS
// message; at the default 1 MiB max_payload each such message cost
// +80 MiB of stack and was admitted.
func TestDecode_DeeplyNestedUnknownFieldIsMalformed(t *testing.T) {
	env, evs, err := Decode(deepEnvelope(t, maxSkipDepth), nil)
	require.NoError(t, err, "nesting at the bound is skipped")
	assert.Equal(t, uint64(1), env.PublisherID)
	assert.Len(t, evs, 1)
	for _, depth := range []int{maxSkipDepth + 1, 1 << 20, 1 << 24} {
		_, evs, err := Decode(deepEnvelope(t, depth), nil)
		assert.ErrorIs(t, err, ErrMalformed, "depth %d", depth)
		assert.ErrorIs(t, err, source.ErrNestedTooDeep, "depth %d", depth)
		assert.Empty(t, evs)
	}
}

// TestSource_ForgedSequenceDoesNotSilenceAPublisher: one forged envelope
// under a publisher's id with sequence 2^62 is a gap (a degraded reset, as
// any gap), and the real publisher's next message, 2^62 behind, is another
// — not a duplicate. Before, every later message of the publisher was
// dropped as seen before, for good, while the source read live.
func TestSource_ForgedSequenceDoesNotSilenceAPublisher(t *testing.T) {
	s, err := New(Config{URL: "nats://unused", Subject: "x"})
	require.NoError(t, err)
	rec := &recorder{}
	ctx := context.Background()
	for i := range uint64(20) {
		require.NoError(t, s.handleCore(ctx, rec, envelope(t, 111, i, stored(7, i))))
	}
	require.NoError(t, s.handleCore(ctx, rec, envelope(t, 111, 1<<62, stored(7, 99))))
	for i := uint64(20); i < 40; i++ {
		require.NoError(t, s.handleCore(ctx, rec, envelope(t, 111, i, stored(7, i))))
	}
	var admitted, degraded int
	for _, c := range rec.snapshot() {
		switch {
		case strings.HasPrefix(c, "admit "):
			admitted++
		case strings.Contains(c, "degraded=true"):
			degraded++
		}
	}
	assert.Equal(t, 41, admitted, "every honest message and the forged one are admitted")
	assert.Equal(t, 2, degraded, "the forged jump and the way back are gaps")
	st := s.Status()
	assert.EqualValues(t, 2, st.Gaps)
	assert.Zero(t, st.Dropped)

	// Redeliveries within the window are still duplicates.
	for i := uint64(30); i < 40; i++ {
		require.NoError(t, s.handleCore(ctx, rec, envelope(t, 111, i, stored(7, i))))
	}
	assert.EqualValues(t, 10, s.Status().Dropped)
	assert.EqualValues(t, 2, s.Status().Gaps)
}
