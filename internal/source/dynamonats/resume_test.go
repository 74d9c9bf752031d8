package dynamonats

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/internal/testing/natstest"
	"github.com/ckfrelay/ckfrelay/producer"
)

// cursorKeeper is a pool's handle that keeps the cursors admissions carry,
// as a replicated pool's records do.
type cursorKeeper struct {
	producer.Handle
	mu      sync.Mutex
	cursors map[string]uint64
}

func (c *cursorKeeper) AdmitEventsAt(ctx context.Context, epoch uint64, evs []ckf.RouterEvent, cur producer.Cursor) error {
	c.mu.Lock()
	c.cursors[cur.Source] = cur.Seq
	c.mu.Unlock()
	return c.Handle.AdmitEventsAt(ctx, epoch, evs, cur)
}

func (c *cursorKeeper) list() []producer.Cursor {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []producer.Cursor
	for s, q := range c.cursors {
		out = append(out, producer.Cursor{Source: s, Seq: q})
	}
	return out
}

// TestSource_ResumeTakesMembersUpAfterTheirCursors: a new leader's source
// resumed from the records' cursors takes a member up where the records
// end — a redelivered message the records hold is dropped as seen, the
// next is admitted — with no reset: the member keeps every block. Met as a
// first contact instead (no Resume), the member was reset and its blocks
// dropped at every takeover (red-team HA F12).
func TestSource_ResumeTakesMembersUpAfterTheirCursors(t *testing.T) {
	ns := natstest.Start(t, natstest.Options{})
	const subject = "ns.dynamo.backend.kv-events"
	rp := startRealPool(t)
	keeper := &cursorKeeper{Handle: rp.h, cursors: map[string]uint64{}}
	nc, err := nats.Connect(ns.URL())
	require.NoError(t, err)
	defer nc.Close()
	pub := func(b []byte) { require.NoError(t, nc.Publish(subject, b)); require.NoError(t, nc.Flush()) }

	cfg := Config{URL: ns.URL(), Subject: subject}
	_, stop := runOn(t, cfg, keeper)
	for i := range uint64(3) {
		pub(envelope(t, 7, i, stored(1, i+1)))
	}
	require.Eventually(t, func() bool { return slices.Equal(rp.blocks(t, 1), []uint64{101, 102, 103}) }, 10*time.Second, time.Millisecond)
	stop() // the leader is deposed; the group's records hold sequences 0–2

	s2, err := New(cfg)
	require.NoError(t, err)
	s2.Resume(keeper.list())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = s2.Run(ctx, keeper) }()
	defer func() { cancel(); <-done }()
	require.Eventually(t, func() bool { return s2.Status().State == "live" }, 10*time.Second, time.Millisecond)

	pub(envelope(t, 7, 2, stored(1, 3))) // redelivered: already in the records
	pub(envelope(t, 7, 3, stored(1, 4)))
	require.Eventually(t, func() bool { return slices.Equal(rp.blocks(t, 1), []uint64{101, 102, 103, 104}) }, 10*time.Second, time.Millisecond,
		"the member lost blocks at the takeover: %v", rp.blocks(t, 1))
	require.NoError(t, rp.h.Flush(context.Background()))
	st := s2.Status()
	assert.Zero(t, st.Resets, "the resumed member was reset")
	assert.EqualValues(t, 1, st.Dropped, "the redelivered message was not dropped as seen")
	assert.Zero(t, rp.faults.Load())
}

// TestSource_OnePublisherCarriesSeveralRanks: Dynamo numbers a publisher's
// envelopes, and one worker's publisher carries all its dp ranks on that
// one sequence (lib/llm/src/kv_router/publisher/batching.rs @2f5ba727
// flushes a batch whenever the dp rank changes). Ranks alternating on one
// sequence are no gaps: every event is admitted, nothing reset. Counted per
// member (the code before), every envelope was a gap for its rank: 998
// degraded resets in 1,000 messages, 2 blocks left (red team R5).
func TestSource_OnePublisherCarriesSeveralRanks(t *testing.T) {
	rp := startRealPool(t)
	s, err := New(Config{URL: "nats://unused", Subject: "x"})
	require.NoError(t, err)
	ctx := context.Background()
	for seq := range uint64(20) {
		ev := stored(1, seq+1)
		ev.DPRank = uint32(seq % 2)
		require.NoError(t, s.handleCore(ctx, rp.h, envelope(t, 7, seq, ev)))
	}
	require.NoError(t, rp.h.Flush(ctx))
	assert.Len(t, rp.blocks(t, 1), 20)
	st := s.Status()
	assert.Zero(t, st.Gaps)
	assert.Zero(t, st.Resets)
	assert.Zero(t, rp.faults.Load())

	// A hole in that sequence may have carried either rank: both are reset.
	ev := stored(1, 100)
	require.NoError(t, s.handleCore(ctx, rp.h, envelope(t, 7, 21, ev)))
	require.NoError(t, rp.h.Flush(ctx))
	assert.Equal(t, []uint64{200}, rp.blocks(t, 1), "rank 1's blocks survived a hole that may have held its removals")
	st = s.Status()
	assert.EqualValues(t, 1, st.Gaps)
	assert.EqualValues(t, 2, st.Resets)
}

// TestSource_ResumeTakesThePublishersLatestCursor: the cursors of a
// publisher's members hold its sequences; the next leader's source
// continues after the latest of them, for both members.
func TestSource_ResumeTakesThePublishersLatestCursor(t *testing.T) {
	rp := startRealPool(t)
	ctx := context.Background()
	r0, r1 := ckf.Member{WorkerID: 1}, ckf.Member{WorkerID: 1, DPRank: 1}
	for _, m := range []ckf.Member{r0, r1} {
		require.NoError(t, rp.h.ResetRank(ctx, 1000, m, false))
		ev := stored(1, 1+uint64(m.DPRank))
		ev.DPRank = m.DPRank
		require.NoError(t, rp.h.AdmitEvents(ctx, 1000, []ckf.RouterEvent{ev}))
	}
	s, err := New(Config{URL: "nats://unused", Subject: "x"})
	require.NoError(t, err)
	s.Resume([]producer.Cursor{{Source: cursorSource(r0, 7), Seq: 4}, {Source: cursorSource(r1, 7), Seq: 5}})
	require.NoError(t, s.handleCore(ctx, rp.h, envelope(t, 7, 5, stored(1, 50)))) // in the records
	ev := stored(1, 6)
	ev.DPRank = 1
	require.NoError(t, s.handleCore(ctx, rp.h, envelope(t, 7, 6, ev)))
	require.NoError(t, rp.h.Flush(ctx))
	assert.Equal(t, []uint64{101, 102, 106}, rp.blocks(t, 1))
	st := s.Status()
	assert.Zero(t, st.Resets, "a resumed member was reset")
	assert.EqualValues(t, 1, st.Dropped)
	assert.Zero(t, rp.faults.Load())
}
