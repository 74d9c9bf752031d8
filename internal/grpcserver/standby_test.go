package grpcserver

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	"github.com/ckfrelay/ckfrelay/internal/server"
	"github.com/ckfrelay/ckfrelay/internal/testing/natstest"
	"github.com/ckfrelay/ckfrelay/wire/kvrelay/kvrelaypb"
)

// A relay replica standing by for its pool (ha.nats_url) serves no catalog
// and no pool stream over gRPC: UNAVAILABLE with Dynamo's reason
// PUBLICATION_UNAVAILABLE, and the leader's gRPC target in the
// ckfrelay-leader trailer; the leader serves as without HA.
func TestStandbyAnswersUnavailableNamingTheLeader(t *testing.T) {
	ns := natstest.Start(t, natstest.Options{})
	cfg := func(node string) server.Config {
		c := testConfig()
		c.HA = server.HAConfig{NATSURL: ns.URL(), NodeID: node, LeaseTTL: server.Duration(5 * time.Second), StreamReplicas: 1}
		return c
	}
	a := startRelay(t, cfg("node-a"))
	require.NoError(t, a.srv.StartHA(a.http, a.grpc))
	require.Eventually(t, func() bool { _, standby := a.pool(t, "dc-a").Leader(); return !standby }, 10*time.Second, 5*time.Millisecond)
	b := startRelay(t, cfg("node-b"))
	require.NoError(t, b.srv.StartHA(b.http, b.grpc))
	require.Eventually(t, func() bool {
		hint, standby := b.pool(t, "dc-a").Leader()
		return standby && hint.Node == "node-a"
	}, 10*time.Second, 5*time.Millisecond)
	hint, _ := b.pool(t, "dc-a").Leader()
	assert.Equal(t, server.LeaderHint{Node: "node-a", URL: a.http, GRPC: a.grpc}, hint)

	var md metadata.MD
	cat, err := b.client.WatchKvPoolCatalog(t.Context(), stamped(&kvrelaypb.WatchKvPoolCatalogRequest{SubscriberId: "cat"}), grpc.Trailer(&md))
	require.NoError(t, err)
	_, err = cat.Recv()
	require.Error(t, err)
	code, why := reason(err, md)
	assert.Equal(t, codes.Unavailable, code)
	assert.Equal(t, reasonUnavailable, why)
	assert.Equal(t, []string{a.grpc}, md.Get(LeaderTrailer))
	assert.Equal(t, []string{"node-a"}, md.Get(LeaderNodeTrailer))

	id := producerToWire(a.pool(t, "dc-a").Identity())
	md = nil
	sub, err := b.client.SubscribeKvPool(t.Context(), subscribeReq(id), grpc.Trailer(&md))
	require.NoError(t, err)
	_, err = sub.Recv()
	require.Error(t, err)
	code, why = reason(err, md)
	assert.Equal(t, codes.Unavailable, code)
	assert.Equal(t, reasonUnavailable, why)
	assert.Equal(t, []string{a.grpc}, md.Get(LeaderTrailer))

	// The leader serves its catalog and the pool.
	require.Eventually(t, func() bool {
		cat, err := a.client.WatchKvPoolCatalog(t.Context(), stamped(&kvrelaypb.WatchKvPoolCatalogRequest{SubscriberId: "cat"}))
		if err != nil {
			return false
		}
		u, err := cat.Recv()
		return err == nil && len(u.GetSnapshot().GetPools()) == 1
	}, 10*time.Second, 5*time.Millisecond)
	sub, err = a.client.SubscribeKvPool(t.Context(), subscribeReq(id))
	require.NoError(t, err)
	u, err := sub.Recv()
	require.NoError(t, err)
	assert.NotNil(t, u)
}
