package replica

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/internal/testing/natstest"
)

// A follower whose NATS node goes silent (its consumer with it) keeps
// answering its context: Next returns when the caller's context ends, not
// after the client library's own retries (nats.go's ordered consumer
// recreated the consumer with background contexts, 10 s a request, and
// ignored Next's context meanwhile — the cluster test's standby sat there
// for tens of seconds after a NATS node died). Once the node is back, the
// follower recreates its consumer after the last record it read and goes
// on with the chain, nothing skipped.
func TestFollowerAnswersItsContextWhenItsNodeGoesSilent(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := srv.JetStream(t)
	ctx := t.Context()
	s, err := EnsureStream(ctx, js, StreamConfig{Replicas: 1})
	require.NoError(t, err)
	subject, err := Subject("", "silent")
	require.NoError(t, err)

	proxy := natstest.StartPausableProxy(t, srv.URL()[len("nats://"):])
	nc, err := nats.Connect(proxy.URL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	fjs, err := jetstream.New(nc)
	require.NoError(t, err)

	app := NewAppender(js, s, subject, 1, 0, 0)
	require.NoError(t, app.Term(ctx, TermRecord{Node: "a"}))
	f, err := Follow(ctx, fjs, DefaultStream, subject, 0, 0, 0)
	require.NoError(t, err)
	t.Cleanup(f.Stop)
	rec, err := f.Next(ctx)
	require.NoError(t, err)
	require.NotNil(t, rec.Leader)

	proxy.SetPaused(true)
	require.NoError(t, app.Append(ctx, 0, storedCommand(1)))
	// Long enough for the missed heartbeats (2 × 500 ms) and a recreate
	// attempt, far shorter than nats.go's 10 s request timeout.
	const wait = 3 * time.Second
	wctx, cancel := context.WithTimeout(ctx, wait)
	start := time.Now()
	_, err = f.Next(wctx)
	cancel()
	took := time.Since(start)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Less(t, took, wait+time.Second, "Next ignored its context while its node was silent")

	proxy.SetPaused(false)
	rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	rec, err = f.Next(rctx)
	require.NoError(t, err, "the follower did not resume after its node came back")
	require.NotNil(t, rec.Batch)
	require.Equal(t, uint64(1), rec.Batch.Commands[0].Event.EventID)
	require.NoError(t, app.Append(ctx, 1, storedCommand(2)))
	rec, err = f.Next(rctx)
	require.NoError(t, err)
	require.Equal(t, uint64(2), rec.Batch.Commands[0].Event.EventID)
	require.Equal(t, app.Last(), f.Applied())
	require.Positive(t, f.Resets(), "the follower recreated its consumer")
}

// A consumer that stays silent while its NATS node is alive — its replica
// of the stream is behind, so it has nothing to deliver but keeps sending
// heartbeats — is abandoned once the stream's leader says the subject has
// records after the last one read, and the next consumer delivers them.
// A paused consumer is that silence on a single server: it sends its
// heartbeats and delivers nothing (nats-server v2.15.2 consumer.go,
// processWaiting beside loopAndGatherMsgs's pause check). Before the stall
// check, the cluster e2e test's standby sat 30 s at one stream sequence
// after a NATS node died while its leader went on appending.
func TestFollowerAbandonsAConsumerSilentWithRecordsToDeliver(t *testing.T) {
	ctx := t.Context()
	js, app, f := followedPastTermRecord(t, "stalled")

	// Quiet: an idle subject is not a stall.
	qctx, cancel := context.WithTimeout(ctx, followStallCheck+followStallCheck/2)
	_, err := f.Next(qctx)
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Zero(t, f.Resets(), "an idle consumer was abandoned")

	var stalled []uint64
	f.OnStall(func(tail, applied uint64) { stalled = append(stalled, tail, applied) })
	_, err = js.PauseConsumer(ctx, DefaultStream, f.cons.CachedInfo().Name, time.Now().Add(time.Hour))
	require.NoError(t, err)
	require.NoError(t, app.Append(ctx, 0, storedCommand(7)))

	// Read as a standby does: in calls shorter than followStallCheck (it
	// cancels its read every lease TTL to try the lease; a takeover's
	// catch-up has what is left of the lease).
	var rec Record
	for deadline := time.Now().Add(4 * followStallCheck); ; {
		rctx, cancel := context.WithTimeout(ctx, followStallCheck/4)
		rec, err = f.Next(rctx)
		cancel()
		if err == nil {
			break
		}
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.True(t, time.Now().Before(deadline), "the follower waited on a consumer that delivers nothing")
	}
	require.NotNil(t, rec.Batch)
	require.Equal(t, uint64(7), rec.Batch.Commands[0].Event.EventID)
	require.Equal(t, 1, f.Stalls())
	require.Equal(t, []uint64{app.Last(), app.Last() - 1}, stalled, "OnStall: the tail and the last message read")
	require.Equal(t, app.Last(), f.Applied())
}

// A reader that pauses longer than followStallCheck (a lease request that
// hangs, a failed takeover) finds what the consumer delivered meanwhile:
// the records are read, the healthy consumer is kept, no stall is counted.
// The red team's false stalls: 5 of 5 pauses of 2.5 s dropped a healthy
// consumer when the check ran before the read.
func TestFollowerThatPausedReadsWhatWasDeliveredBeforeCheckingForAStall(t *testing.T) {
	ctx := t.Context()
	_, app, f := followedPastTermRecord(t, "paused")

	require.NoError(t, app.Append(ctx, 0, storedCommand(9)))
	time.Sleep(followStallCheck + followStallCheck/4) // the reader's pause, the condition under test
	rctx, cancel := context.WithTimeout(ctx, followStallCheck)
	defer cancel()
	rec, err := f.Next(rctx)
	require.NoError(t, err)
	require.Equal(t, uint64(9), rec.Batch.Commands[0].Event.EventID)
	require.Zero(t, f.Stalls(), "a healthy consumer was taken for a stalled one")
	require.Zero(t, f.Resets())
}

// storedCommand is a batch of one admitted Stored event of worker 1 whose
// event id, block hash and tokens hash are all id.
func storedCommand(id uint64) []Command {
	return []Command{{Kind: KindAdmitted, SourceEpoch: 1, Event: ckf.RouterEvent{WorkerID: 1, EventID: id, Kind: ckf.EventStored,
		Blocks: []ckf.StoredBlock{{BlockHash: id, TokensHash: id}}}}}
}

// followedPastTermRecord starts a single NATS server, appends a term
// record on the pool's subject and returns a follower that has read it.
func followedPastTermRecord(t *testing.T, pool string) (jetstream.JetStream, *Appender, *Follower) {
	t.Helper()
	srv := natstest.Start(t, natstest.Options{})
	_, js := srv.JetStream(t)
	ctx := t.Context()
	s, err := EnsureStream(ctx, js, StreamConfig{Replicas: 1})
	require.NoError(t, err)
	subject, err := Subject("", pool)
	require.NoError(t, err)
	app := NewAppender(js, s, subject, 1, 0, 0)
	require.NoError(t, app.Term(ctx, TermRecord{Node: "a"}))
	f, err := Follow(ctx, js, DefaultStream, subject, 0, 0, 0)
	require.NoError(t, err)
	t.Cleanup(f.Stop)
	_, err = f.Next(ctx)
	require.NoError(t, err)
	return js, app, f
}
