package replica

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/internal/testing/natstest"
	"github.com/ckfrelay/ckfrelay/producer"
)

// rebuildBound is how long a replica may take, after the NATS node holding
// the checkpoints' stream leader died, to start its pool from a checkpoint.
// nats-server elects a new stream leader only after its Raft election
// timeout (4–9 s in v2.15): a rebuild that needs the stream's leader (a
// consumer, as the object store's listing and reads create) waits that
// long; one that reads the surviving replicas directly does not wait.
const rebuildBound = 3 * time.Second

// TestClusterCheckpointsOutliveANATSNode runs the group with checkpoints on
// a real 3-node nats-server cluster (R3 records stream, lease bucket and
// checkpoint store). A standby checkpoints and purges; then the NATS node
// holding the checkpoint store's stream leader is SIGKILLed and a new
// replica starts at once: it must start its pool from the newest
// checkpoint within rebuildBound and converge on the leader. Then a second
// NATS node dies (no majority): every replica must report standby within
// the lease TTL and a bound, whatever its rebuild waits on.
func TestClusterCheckpointsOutliveANATSNode(t *testing.T) {
	if testing.Short() {
		t.Skip("3-node nats-server cluster: not under -short")
	}
	nodes := natstest.StartCluster(t, natstest.BuildServer(t), 3)
	ctx := t.Context()
	var (
		js  [3]jetstream.JetStream
		ls  [3]*Leases
		cs  [3]*Checkpoints
		rec [3]jetstream.Stream
	)
	for i := range nodes {
		js[i] = clusterJS(t, natstest.URLs(nodes[i], nodes))
	}
	require.Eventually(t, func() bool {
		_, err := EnsureStream(ctx, js[0], StreamConfig{Replicas: 3})
		if err == nil {
			_, err = OpenLeases(ctx, js[0], LeaseConfig{TTL: clusterTTL, Replicas: 3})
		}
		if err == nil {
			_, err = EnsureCheckpoints(ctx, js[0], CheckpointConfig{Replicas: 3})
		}
		return err == nil
	}, 30*time.Second, 200*time.Millisecond, "the cluster does not place R3")
	for i := range nodes {
		var err error
		rec[i], err = EnsureStream(ctx, js[i], StreamConfig{Replicas: 3})
		require.NoError(t, err)
		ls[i], err = OpenLeases(ctx, js[i], LeaseConfig{TTL: clusterTTL, Replicas: 3})
		require.NoError(t, err)
		cs[i], err = EnsureCheckpoints(ctx, js[i], CheckpointConfig{Replicas: 3})
		require.NoError(t, err)
	}
	subject, _ := Subject("", "pool")

	a := startNodeOn(t, js[0], rec[0], ls[0], "a", cs[0], 3)
	a.waitRole(t, RoleLeader, 20*time.Second)
	b := startNodeOn(t, js[1], rec[1], ls[1], "b", cs[1], 3)
	b.waitRole(t, RoleStandby, 20*time.Second)

	// Rounds of acknowledged admissions until the standby has stored two
	// checkpoints and purged the subject below the older one.
	for round := 0; ; round++ {
		require.Less(t, round, 2000, "no two checkpoints and a purge after %d rounds", round)
		r := leaderOf(a, b)
		if r == nil {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		admit(t, r, uint64(1+round%3), 5*(round/3), 5)
		require.NoError(t, r.h.AdmitEventsAt(ctx, 1, nil, producer.Cursor{Source: fmt.Sprintf("engine-%d", 1+round%3), Seq: uint64(round)}))
		if seqs, err := cs[0].List(ctx, "pool"); err != nil || len(seqs) < 2 {
			continue
		}
		if first, err := FirstPrev(ctx, rec[0], subject); err == nil && first != 0 {
			break
		}
	}
	require.Eventually(t, func() bool { return !b.n.storing.Load() }, 10*time.Second, 10*time.Millisecond)
	seqs, err := cs[0].List(ctx, "pool")
	require.NoError(t, err)
	require.Len(t, seqs, 2)

	// The NATS node that leads the checkpoint store's stream dies; a new
	// replica, connected to another node, rebuilds at once.
	info, err := js[0].Stream(ctx, "OBJ_"+DefaultCheckpointBucket)
	require.NoError(t, err)
	si, err := info.Info(ctx)
	require.NoError(t, err)
	require.NotNil(t, si.Cluster)
	victim := -1
	for i, n := range nodes {
		if n.Name == si.Cluster.Leader {
			victim = i
		}
	}
	require.NotEqual(t, -1, victim, "the checkpoint store's stream leader %q is none of the nodes", si.Cluster.Leader)
	survivor := (victim + 1) % 3
	// A running group's followers answer direct gets; a stream's follower
	// joins once caught up (checked every 2 s), so wait for both
	// survivors on the checkpoint streams.
	streams := []string{"OBJ_" + DefaultCheckpointBucket}
	if _, err := js[0].Stream(ctx, "KV_"+DefaultCheckpointBucket+"_INDEX"); err == nil {
		streams = append(streams, "KV_"+DefaultCheckpointBucket+"_INDEX")
	}
	require.Eventually(t, func() bool {
		for i, n := range nodes {
			if i == victim {
				continue
			}
			for _, stream := range streams {
				if ok, err := n.ServesDirectGets(stream); err != nil || !ok {
					return false
				}
			}
		}
		return true
	}, 30*time.Second, 50*time.Millisecond, "the surviving nodes do not answer direct gets of the checkpoint streams")
	nodes[victim].Kill()
	start := time.Now()
	c := startNodeOn(t, js[survivor], rec[survivor], ls[survivor], "c", cs[survivor], 1<<20)
	st := c.waitRole(t, RoleStandby, 30*time.Second)
	took := time.Since(start)
	t.Logf("NATS node %s (the checkpoint store's stream leader) killed; the new replica started from checkpoint %d after %v",
		nodes[victim].Name, st.Loaded, took)
	require.Less(t, took, rebuildBound, "the rebuild waited on the checkpoint store's leaderless stream")
	require.GreaterOrEqual(t, st.Loaded, seqs[0], "the new replica did not start from the newest checkpoint")

	// It follows the tail to the leader's state (once the records stream
	// has a leader again, if it died too). NATS's elections after the
	// node's death may hand the lease to any replica, c too: then c took
	// over with the chain applied to its tail, and a replica that replayed
	// the records must converge on c's state.
	var leader, follower *testNode
	ok := assert.Eventually(t, func() bool {
		leader, follower = nil, nil
		for _, n := range []*testNode{a, b, c} {
			if n.n.Status().Role == RoleLeader {
				leader = n
			}
		}
		if leader == nil {
			return false
		}
		candidates := []*testNode{c}
		if leader == c {
			candidates = []*testNode{a, b}
		}
		w, err := leader.replica().h.ExportState(ctx)
		if err != nil {
			return false
		}
		for _, f := range candidates {
			g, err := f.replica().h.ExportState(ctx)
			if err == nil && w.JournalPosition == g.JournalPosition && f.n.Status().Term == leader.n.Status().Term {
				follower = f
				return true
			}
		}
		return false
	}, 60*time.Second, 20*time.Millisecond)
	if !ok {
		require.Failf(t, "not converged", "the replica started from a checkpoint did not converge: a %+v, b %+v, c %+v",
			a.n.Status(), b.n.Status(), c.n.Status())
	}
	want, got := leader.replica().at(t, ctx), follower.replica().at(t, ctx)
	want.image, got.image = replicated(want.image), replicated(got.image)
	require.Equal(t, want, got, "%s leads, %s follows", leader.n.cfg.Node, follower.n.cfg.Node)

	// A second NATS node dies: no majority. The leader cannot renew and
	// must say it stands by within its lease, although its rebuild cannot
	// read the checkpoint store.
	second := (victim + 2) % 3
	nodes[second].Kill()
	start = time.Now()
	require.Eventually(t, func() bool {
		return a.n.Status().Role == RoleStandby && b.n.Status().Role == RoleStandby && c.n.Status().Role == RoleStandby
	}, clusterTTL+3*time.Second, 10*time.Millisecond, "a replica still reports leader %v after the NATS majority was lost (a %v, b %v, c %v)",
		clusterTTL+3*time.Second, a.n.Status().Role, b.n.Status().Role, c.n.Status().Role)
	t.Logf("every replica reports standby %v after the majority was lost", time.Since(start))
}
