package replica

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/internal/testing/natstest"
	"github.com/ckfrelay/ckfrelay/producer"
)

// Direct gets are answered by any NATS replica of a stream that was once
// caught up, also one that has fallen behind since (leaderget.go). These
// tests give a node a view of the records stream or the checkpoint index
// that answers as such a replica would — the state of a moment ago — while
// the stream's leader (the real server) has moved on.

// staleIndex answers the index's reads with an entry read earlier.
type staleIndex struct {
	jetstream.KeyValue
	entry jetstream.KeyValueEntry
}

func (s staleIndex) Get(context.Context, string) (jetstream.KeyValueEntry, error) {
	return s.entry, nil
}

// staleCheckpoints writes pool's chain of six records and checkpoints 2–5
// of it (the index "5,4": 2 and 3 deleted, the subject purged below 4) and
// returns a view of cs whose index reads answer from before 4 and 5 ("3,2").
func staleCheckpoints(t *testing.T, js jetstream.JetStream, s jetstream.Stream, cs *Checkpoints) *Checkpoints {
	t.Helper()
	ctx := t.Context()
	subject, _ := Subject("", "pool")
	app := NewAppender(js, s, subject, 1, 0, 0)
	require.NoError(t, app.Term(ctx, TermRecord{Node: "a"}))
	for i := range uint64(5) {
		require.NoError(t, app.Append(ctx, i, []Command{{Kind: KindCursor, Cursor: producer.Cursor{Source: "s", Seq: i}}}))
	}
	r, stop := startReplica(t, 64)
	img, err := r.h.ExportImage(ctx)
	require.NoError(t, err)
	stop()
	put := func(seq uint64) uint64 {
		_, below, err := cs.Put(ctx, "pool", &Checkpoint{Seq: seq, Term: 1, Image: img})
		require.NoError(t, err)
		return below
	}
	put(2)
	put(3)
	stale, err := cs.index.Get(ctx, "pool") // "3,2"
	require.NoError(t, err)
	put(4)
	require.NoError(t, Purge(ctx, s, subject, put(5))) // index "5,4"; 2 and 3 deleted; purged below 4
	view := *cs
	view.index = staleIndex{KeyValue: cs.index, entry: stale}
	return &view
}

// TestStartPool_StaleIndexIsNotStateLost: a replica's index read answered
// from before the last two checkpoints names two checkpoints that were
// deleted since, and the subject is purged below the newer ones. By those
// answers the state is lost; by the streams' leaders it is not: the
// replica loads the newest checkpoint instead of stopping for good.
func TestStartPool_StaleIndexIsNotStateLost(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := srv.JetStream(t)
	ctx := t.Context()
	cs, err := EnsureCheckpoints(ctx, js, CheckpointConfig{Replicas: 1})
	require.NoError(t, err)
	ls, err := OpenLeases(ctx, js, LeaseConfig{TTL: time.Second, Replicas: 1})
	require.NoError(t, err)
	s, err := EnsureStream(ctx, js, StreamConfig{Replicas: 1})
	require.NoError(t, err)
	view := staleCheckpoints(t, js, s, cs)
	n, err := NewNode(NodeConfig{Pool: "pool", Node: "x", JS: js, Stream: s, Leases: ls, Checkpoints: view,
		NewPool: func() (Pool, error) { panic("the subject is purged: nothing replays it") },
		PoolFromImage: func(img *producer.Image) (Pool, error) {
			r, stop, err := startReplicaImage(64, img)
			if err != nil {
				return Pool{}, err
			}
			return Pool{Handle: r.h, Recorder: r.rec, Close: stop}, nil
		}})
	require.NoError(t, err)
	p, from, err := n.startPool(ctx)
	require.NoError(t, err, "a stale index read was taken for a lost state")
	defer p.Close()
	assert.EqualValues(t, 5, from.seq, "the replica did not start from the newest checkpoint")

	// Once the checkpoints are really gone, the leaders say so too.
	require.NoError(t, cs.os.Delete(ctx, checkpointName("pool", 5)))
	require.NoError(t, cs.os.Delete(ctx, checkpointName("pool", 4)))
	_, _, err = n.startPool(ctx)
	require.ErrorIs(t, err, ErrStateLost)
}

// staleTail answers the subject's last message as the message at a stream
// sequence set by the test (0: the real last one).
type staleTail struct {
	jetstream.Stream
	at *atomic.Uint64
}

func (s staleTail) GetLastMsgForSubject(ctx context.Context, subject string) (*jetstream.RawStreamMsg, error) {
	if seq := s.at.Load(); seq != 0 {
		return s.Stream.GetMsg(ctx, seq)
	}
	return s.Stream.GetLastMsgForSubject(ctx, subject)
}

// TestNodeTakeoverReadsAStaleTailFromTheLeader: the standby applied every
// record through its consumer, but the tail read of its takeover is
// answered by a replica a few records behind — below what it applied,
// which is what a purged subject looks like. It must not stop with
// ErrStateLost: the stream's leader says the subject is whole, and the
// standby takes over with the state it holds.
func TestNodeTakeoverReadsAStaleTailFromTheLeader(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := srv.JetStream(t)
	ls, err := OpenLeases(t.Context(), js, LeaseConfig{TTL: time.Second, Replicas: 1})
	require.NoError(t, err)
	a := startNode(t, srv, ls, "a")
	a.waitRole(t, RoleLeader, 10*time.Second)
	var at atomic.Uint64
	b := startNodeWith(t, srv, ls, "b", nil, 0, func(c *NodeConfig) { c.Stream = staleTail{Stream: c.Stream, at: &at} })
	b.waitRole(t, RoleStandby, 10*time.Second)
	admit(t, a.replica(), 1, 0, 20)
	want, _ := converged(t, a, b)
	require.Greater(t, b.n.Status().Applied, uint64(2))
	at.Store(2) // the tail as it was at the term record's batch

	a.kill()
	b.waitRole(t, RoleLeader, 10*time.Second)
	require.Equal(t, want, b.replica().at(t, t.Context()), "the new leader lost or changed state in the takeover")
}

// TestStartPool_StaleIndexWithoutLeadersIsNotStateLost runs the stale
// index on a real 3-node cluster that then loses two nodes: the surviving
// node answers direct gets (the subject purged, the checkpoints the stale
// index names deleted), but no stream has a leader to confirm the verdict.
// The rebuild fails without ErrStateLost — Run retries, and once the
// leaders are back they say the state is whole — instead of stopping the
// replica for good.
func TestStartPool_StaleIndexWithoutLeadersIsNotStateLost(t *testing.T) {
	if testing.Short() {
		t.Skip("3-node nats-server cluster: not under -short")
	}
	nodes := natstest.StartCluster(t, natstest.BuildServer(t), 3)
	js := clusterJS(t, nodes[0].URL) // the node that survives
	ctx := t.Context()
	var (
		cs  *Checkpoints
		ls  *Leases
		s   jetstream.Stream
		err error
	)
	require.Eventually(t, func() bool {
		if s, err = EnsureStream(ctx, js, StreamConfig{Replicas: 3}); err == nil {
			if ls, err = OpenLeases(ctx, js, LeaseConfig{TTL: clusterTTL, Replicas: 3}); err == nil {
				cs, err = EnsureCheckpoints(ctx, js, CheckpointConfig{Replicas: 3})
			}
		}
		return err == nil
	}, 30*time.Second, 200*time.Millisecond, "the cluster does not place R3")
	subject, _ := Subject("", "pool")
	view := staleCheckpoints(t, js, s, cs)
	n, err := NewNode(NodeConfig{Pool: "pool", Node: "x", JS: js, Stream: s, Leases: ls, Checkpoints: view,
		NewPool:       func() (Pool, error) { panic("the subject is purged: nothing replays it") },
		PoolFromImage: func(*producer.Image) (Pool, error) { panic("no checkpoint loads here") }})
	require.NoError(t, err)
	// The surviving node answers the direct gets of what the others know:
	// the subject purged below 4, the checkpoints the stale index names
	// deleted.
	for _, stream := range []string{DefaultStream, "OBJ_" + DefaultCheckpointBucket, "KV_" + DefaultCheckpointBucket + "_INDEX"} {
		require.Eventually(t, func() bool { ok, err := nodes[0].ServesDirectGets(stream); return err == nil && ok },
			30*time.Second, 100*time.Millisecond, "%s answers no direct gets on %s", nodes[0].Name, stream)
	}
	require.Eventually(t, func() bool {
		_, err := cs.Get(ctx, "pool", 3)
		prev, perr := FirstPrev(ctx, s, subject)
		return errors.Is(err, ErrDamagedCheckpoint) && perr == nil && prev == 3
	}, 10*time.Second, 20*time.Millisecond, "the surviving node did not see the deletes and the purge")
	nodes[1].Kill()
	nodes[2].Kill()
	// A node that led a stream goes on answering as its leader until its
	// Raft group notices the lost quorum: wait until the survivor knows no
	// leader for any of them (else the rebuild reads the whole state from
	// a leader, as it should, and this test tests nothing).
	for _, stream := range []string{DefaultStream, "OBJ_" + DefaultCheckpointBucket, "KV_" + DefaultCheckpointBucket + "_INDEX"} {
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			leader, err := nodes[0].StreamLeader(stream)
			require.NoError(c, err)
			assert.Empty(c, leader, "%s still leads %s", leader, stream)
		}, 30*time.Second, 50*time.Millisecond)
	}

	_, _, err = n.startPool(ctx)
	require.Error(t, err)
	require.NotErrorIs(t, err, ErrStateLost, "a verdict no stream leader confirmed")
	t.Logf("without leaders: %v", err)
}
