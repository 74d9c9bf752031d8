//go:build unix

package main

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/internal/server"
	"github.com/ckfrelay/ckfrelay/internal/source/dynamonats"
	"github.com/ckfrelay/ckfrelay/internal/testing/natstest"
	"github.com/ckfrelay/ckfrelay/producer"
	"github.com/ckfrelay/ckfrelay/wire"
)

func dynStored(worker, hash uint64, blocks int) ckf.RouterEvent {
	ev := ckf.RouterEvent{WorkerID: worker, EventID: hash, Kind: ckf.EventStored}
	for i := range uint64(blocks) {
		ev.Blocks = append(ev.Blocks, ckf.StoredBlock{BlockHash: hash<<20 | i, TokensHash: hash<<20 | i})
	}
	return ev
}

// TestE2E_HostileDynamoPublisher: the relay binary with a Dynamo JetStream
// source, against a publisher that sends negative envelope integers, an
// event past max_blocks_per_event and a flood of distinct workers, and a
// member whose epoch a bridge pushed to the ceiling: nothing of it is
// admitted or resets a member, the source tracks at most max_members, and
// the unadmittable message is terminated, not redelivered forever, with the
// source reading failing while that member's epoch is refused.
func TestE2E_HostileDynamoPublisher(t *testing.T) {
	ns := natstest.Start(t, natstest.Options{})
	const subject = "namespace.dynamo.component.backend.kv-events"
	_, js := ns.JetStream(t)
	ctx := context.Background()
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "kv", Subjects: []string{subject}})
	require.NoError(t, err)
	cfg := server.Config{Listen: "127.0.0.1:0", MaxSourceEpochJump: 1 << 63,
		Pools: []server.PoolSpec{{Name: "p", DCID: 1, ExpectedBlocks: 1 << 16, MaxMembers: 64, PublishEveryNEvents: 1,
			Sources: []server.SourceSpec{{Engine: "dynamo", URL: ns.URL(), Subject: subject, Stream: "kv", Durable: "relay"}}}}}
	rl := startRelay(t, "--config", writeConfig(t, cfg))
	pub := func(b []byte) {
		t.Helper()
		_, err := js.Publish(ctx, subject, b)
		require.NoError(t, err)
	}
	env := func(publisher, seq uint64, evs ...ckf.RouterEvent) []byte {
		b, err := dynamonats.Encode(dynamonats.Envelope{Topic: "kv-events", PublisherID: publisher, Sequence: seq, PublishedAt: 1}, evs)
		require.NoError(t, err)
		return b
	}
	raw := func(fields map[string]any) []byte {
		ev := dynStored(1, 99, 1)
		payload, err := wire.AppendRouterEventMsgpack(nil, &ev)
		require.NoError(t, err)
		m := map[string]any{"topic": "kv-events", "publisher_id": uint64(1), "sequence": uint64(1), "published_at": uint64(1), "payload": payload}
		for k, v := range fields {
			m[k] = v
		}
		b, err := msgpack.Marshal(m)
		require.NoError(t, err)
		return b
	}
	settled := func(n uint64) {
		t.Helper()
		require.Eventually(t, func() bool {
			cons, err := js.Consumer(ctx, "kv", "relay")
			if err != nil {
				return false
			}
			info, err := cons.Info(ctx)
			return err == nil && info.AckFloor.Stream == n && info.NumAckPending == 0
		}, 20*time.Second, 10*time.Millisecond, "the first %d messages settled", n)
	}

	pub(env(1, 0, dynStored(1, 1, 1), dynStored(5, 5, 1)))
	settled(1)
	_, blocks := sourceOf(t, rl.base, "p")
	require.Equal(t, 2, blocks)

	pub(raw(map[string]any{"sequence": int64(-1)}))    // read as 2^64−1 it was a gap: worker 1 reset
	pub(raw(map[string]any{"publisher_id": int8(-5)})) // another publisher: worker 1 reset
	pub(env(1, 1, dynStored(3, 3, 20000)))             // past max_blocks_per_event
	settled(4)
	st, blocks := sourceOf(t, rl.base, "p")
	assert.Equal(t, 2, blocks, "no hostile message changed the pool")
	assert.EqualValues(t, 3, st.Rejected)
	assert.Zero(t, st.Gaps)
	assert.Zero(t, st.Resets)

	// 10,000 distinct workers: the source tracks 64 at most (the pool's
	// max_members), the rest are dropped and counted.
	for i := range uint64(200) {
		evs := make([]ckf.RouterEvent, 0, 50)
		for j := range uint64(50) {
			evs = append(evs, dynStored(1000+i*50+j, 1000+i*50+j, 1))
		}
		pub(env(1000+i, 0, evs...))
	}
	settled(204)
	st, blocks = sourceOf(t, rl.base, "p")
	assert.EqualValues(t, 10000-62, st.Dropped, "two of the 64 are workers 1 and 5")
	assert.Equal(t, 64, blocks)

	// A bridge left worker 5 above the source's epochs, and worker 1 at the
	// ceiling. Their publisher restarts: worker 5's reset adopts the pool's
	// epoch; worker 1's can never succeed and is terminated.
	for w, epoch := range map[uint64]uint64{5: uint64(time.Now().UnixNano()) + 1<<50, 1: producer.MaxSourceEpoch} {
		code, body := postJSON(t, rl.base+"/v1/pools/p/ranks/reset", fmt.Sprintf(`{"worker_id": %d, "source_epoch": %d}`, w, epoch))
		require.Equal(t, http.StatusOK, code, body)
	}
	pub(env(2, 0, dynStored(5, 6, 1)))
	pub(env(3, 0, dynStored(1, 7, 1)))
	settled(206)
	st, blocks = sourceOf(t, rl.base, "p")
	assert.Equal(t, 62+1, blocks, "worker 5's new block is in; worker 1 has none")
	assert.EqualValues(t, 10000-62+1, st.Dropped)
	cons, err := js.Consumer(ctx, "kv", "relay")
	require.NoError(t, err)
	info, err := cons.Info(ctx)
	require.NoError(t, err)
	assert.Zero(t, info.NumRedelivered, "nothing is redelivered")
	// Worker 1's epoch is refused for good: the source says so instead of
	// reading live (docs/ingest.md "Worker identity and source epochs").
	assert.Equal(t, "failing", st.State)
	assert.Contains(t, st.LastError, "refused for good")
}
