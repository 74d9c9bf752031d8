package replica

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/internal/testing/natstest"
)

func clusterJS(t *testing.T, urls string) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(urls, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	return js
}

// startClusterNode is startNode on a JetStream cluster: the replica's own
// connection (first to its own NATS node) and R3 stream and bucket.
func startClusterNode(t *testing.T, js jetstream.JetStream, ls *Leases, id string) *testNode {
	t.Helper()
	s, err := EnsureStream(t.Context(), js, StreamConfig{Replicas: 3})
	require.NoError(t, err)
	tn := &testNode{changes: make(chan change, 16), done: make(chan error, 1)}
	n, err := NewNode(NodeConfig{
		Pool: "pool", Node: id, Address: "http://" + id, JS: js, Stream: s, Leases: ls,
		NewPool: func() (Pool, error) {
			r, stop := startReplica(t, 1024)
			tn.mu.Lock()
			tn.last = r
			tn.mu.Unlock()
			return Pool{Handle: r.h, Recorder: r.rec, Close: stop}, nil
		},
		OnChange: func(st Status, _ Pool, _ string) { tn.changes <- change{st, time.Now()} },
	})
	require.NoError(t, err)
	tn.n = n
	ctx, cancel := context.WithCancel(context.Background())
	tn.cancel = cancel
	go func() { tn.done <- n.Run(ctx) }()
	t.Cleanup(tn.kill)
	return tn
}

// clusterTTL is the lease in the cluster test: three nats-servers, two
// replicas and the race detector share two cores with other work, so a
// tighter lease makes leaders step down for want of CPU, not of NATS.
const clusterTTL = 3 * time.Second

// TestClusterTakeover runs the group on a real 3-node nats-server cluster
// (separate processes built from go.mod's version) with R3 records stream
// and lease bucket, where nats-server checks message ids before
// expectations and refuses concurrent expectations on one subject: ingest
// goes on while a NATS node is SIGKILLed (nothing acknowledged is lost: the
// standby converges on the leader's exact state and words), then the
// leader is killed and the standby leads with that state.
func TestClusterTakeover(t *testing.T) {
	if testing.Short() {
		// make test runs it in its plain pass (about 15 s with the
		// nats-server build cached), not again under -race -short.
		t.Skip("3-node nats-server cluster: not under -short")
	}
	nodes := natstest.StartCluster(t, natstest.BuildServer(t), 3)
	jsA := clusterJS(t, natstest.URLs(nodes[0], nodes))
	jsB := clusterJS(t, natstest.URLs(nodes[1], nodes))
	ctx := t.Context()
	// Right after start a peer may not be placeable yet ("no suitable
	// peers for placement"): retry through the API until R3 is possible.
	var lsA, lsB *Leases
	require.Eventually(t, func() bool {
		var err error
		if lsA, err = OpenLeases(ctx, jsA, LeaseConfig{TTL: clusterTTL, Replicas: 3}); err != nil {
			return false
		}
		_, err = EnsureStream(ctx, jsA, StreamConfig{Replicas: 3})
		return err == nil
	}, 30*time.Second, 200*time.Millisecond, "the cluster does not place R3")
	lsB, err := OpenLeases(ctx, jsB, LeaseConfig{TTL: clusterTTL, Replicas: 3})
	require.NoError(t, err)

	a := startClusterNode(t, jsA, lsA, "a")
	stA := a.waitRole(t, RoleLeader, 20*time.Second)
	b := startClusterNode(t, jsB, lsB, "b")
	b.waitRole(t, RoleStandby, 20*time.Second)

	// Ingest in the background while the third NATS node dies.
	var admitted atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			// The relay admits to whichever replica leads (a NATS node's
			// death may move the lease: the KV stream's leader may die).
			r := leaderOf(a, b)
			if r == nil {
				time.Sleep(time.Millisecond)
				continue
			}
			ev := ckf.RouterEvent{WorkerID: uint64(1 + i%4), EventID: uint64(i), Kind: ckf.EventStored,
				Blocks: []ckf.StoredBlock{{BlockHash: uint64(i), TokensHash: uint64(i)}}}
			if r.h.AdmitEvent(ctx, 1, ev) != nil {
				continue
			}
			admitted.Add(1)
			if i%64 == 0 {
				time.Sleep(time.Millisecond) // a steady load, not a flood
			}
		}
	})
	require.Eventually(t, func() bool { return admitted.Load() > 2000 }, 20*time.Second, 5*time.Millisecond)
	nodes[2].Kill()
	n := admitted.Load()
	require.Eventually(t, func() bool { return admitted.Load() > n+2000 }, 20*time.Second, 5*time.Millisecond,
		"ingest stalled after a NATS node died")
	close(stop)
	wg.Wait()
	// The group settles: one leads, the other follows its term and has
	// applied everything it appended.
	var leader, standby *testNode
	var want, got boundary
	require.Eventually(t, func() bool {
		leader, standby = a, b
		if b.n.Status().Role == RoleLeader {
			leader, standby = b, a
		}
		ls, ss := leader.n.Status(), standby.n.Status()
		if ls.Role != RoleLeader || ss.Role != RoleStandby || ss.Term != ls.Term {
			return false
		}
		// Positions only: the standby may still be applying, so its words
		// are read once it has caught up (the leader is idle by now).
		w, err1 := leader.replica().h.ExportState(ctx)
		g, err2 := standby.replica().h.ExportState(ctx)
		return err1 == nil && err2 == nil && w.JournalPosition == g.JournalPosition
	}, 30*time.Second, 20*time.Millisecond, "the group did not settle after a NATS node's death")
	want, got = leader.replica().at(t, ctx), standby.replica().at(t, ctx)
	require.Equal(t, want, got, "the standby's state differs after a NATS node died during ingest")
	t.Logf("%d events admitted; %s leads at stream sequence %d; rebuilds: a %d, b %d",
		admitted.Load(), leader.n.cfg.Node, leader.n.Status().Applied, a.n.Status().Rebuilds, b.n.Status().Rebuilds)
	stA = change{Status: leader.n.Status()}

	// Kill the leader: the survivor leads with everything appended. Under
	// load it may lose and retake the lease on the way; what counts is that
	// it ends up leading with the state.
	start := time.Now()
	leader.kill()
	first := standby.waitRole(t, RoleLeader, 30*time.Second)
	for first.Term <= stA.Term { // an earlier reign's change, still queued
		first = standby.waitRole(t, RoleLeader, 30*time.Second)
	}
	t.Logf("takeover after the leader's kill: %v (lease ttl %v)", time.Since(start), clusterTTL)
	assert.Greater(t, first.Term, stA.Term)
	require.Eventually(t, func() bool {
		if standby.n.Status().Role != RoleLeader {
			return false
		}
		st, err := standby.replica().h.ExportState(ctx)
		return err == nil && st.JournalPosition == want.state.JournalPosition
	}, 30*time.Second, 10*time.Millisecond, "the survivor does not lead with the old leader's journal position")
	require.Equal(t, want, standby.replica().at(t, ctx), "the new leader's state differs from the old leader's")
}

// leaderOf returns the pool of whichever node leads now (nil: none).
func leaderOf(nodes ...*testNode) *replica {
	for _, n := range nodes {
		if n.n.Status().Role == RoleLeader {
			return n.replica()
		}
	}
	return nil
}
