package replica

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/internal/testing/natstest"
)

// TestEnsure_RaisesReplicasNeverLowers: on a 3-node cluster, a group first
// started with one copy of everything and later with three gets three of
// every asset — the records stream, the lease bucket, the checkpoint store
// and its index (the checkpoint assets stayed at one: the store a rebuild
// needs lived on one NATS node) — and a replica started with one again
// lowers none of them.
func TestEnsure_RaisesReplicasNeverLowers(t *testing.T) {
	if testing.Short() {
		t.Skip("3-node nats-server cluster: not under -short")
	}
	nodes := natstest.StartCluster(t, natstest.BuildServer(t), 3)
	js := clusterJS(t, natstest.URLs(nodes[0], nodes))
	ctx := t.Context()
	ensure := func(replicas int) error {
		if _, err := EnsureStream(ctx, js, StreamConfig{Replicas: replicas}); err != nil {
			return err
		}
		if _, err := OpenLeases(ctx, js, LeaseConfig{TTL: time.Second, Replicas: replicas}); err != nil {
			return err
		}
		_, err := EnsureCheckpoints(ctx, js, CheckpointConfig{Replicas: replicas})
		return err
	}
	require.Eventually(t, func() bool { return ensure(1) == nil }, 30*time.Second, 200*time.Millisecond, "the cluster does not place R1")
	streams := []string{DefaultStream, "KV_" + DefaultLeaseBucket, "OBJ_" + DefaultCheckpointBucket, "KV_" + DefaultCheckpointBucket + "_INDEX"}
	replicas := func() map[string]int {
		got := map[string]int{}
		for _, name := range streams {
			s, err := js.Stream(ctx, name)
			require.NoError(t, err)
			got[name] = s.CachedInfo().Config.Replicas
		}
		return got
	}
	for _, name := range streams {
		assert.Equal(t, 1, replicas()[name], name)
	}
	require.NoError(t, ensure(3))
	for name, n := range replicas() {
		assert.Equal(t, 3, n, "%s was not raised to 3 copies", name)
	}
	require.NoError(t, ensure(1))
	for name, n := range replicas() {
		assert.Equal(t, 3, n, "%s was lowered", name)
	}
}
