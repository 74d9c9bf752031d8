package main

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/client"
	"github.com/ckfrelay/ckfrelay/internal/server"
	"github.com/ckfrelay/ckfrelay/internal/testing/natstest"
)

// haRole is a relay's catalog "ha" block for pool ("" when it has none).
func haRole(t *testing.T, base, pool string) (role, leader string, term uint64) {
	t.Helper()
	p := getCatalog(t, base)[pool]
	if p.HA == nil {
		return "", "", 0
	}
	return p.HA.Role, p.HA.Leader, uint64(p.HA.Term)
}

// Two relay processes with the same pool on one nats-server: one leads, the
// other answers ingest 503 with the leader's address; the leader is killed
// (SIGKILL) and the other leads with what was admitted, admits more, and a
// router given both addresses follows without a restart.
func TestE2E_HAStandbyTakesOverAfterKill(t *testing.T) {
	ns := natstest.Start(t, natstest.Options{})
	cfg := server.Config{Listen: "127.0.0.1:0", Pools: []server.PoolSpec{{Name: "dc-a", DCID: 1, ExpectedBlocks: 65536}},
		HA: server.HAConfig{NATSURL: ns.URL(), LeaseTTL: server.Duration(2 * time.Second), StreamReplicas: 1}}
	file := writeConfig(t, cfg)
	relays := map[string]*relay{
		"relay-a": startRelay(t, "--config", file, "--node-id", "relay-a"),
		"relay-b": startRelay(t, "--config", file, "--node-id", "relay-b"),
	}
	var leader, standby *relay
	var leaderID string
	require.Eventually(t, func() bool {
		ra, _, ta := haRole(t, relays["relay-a"].base, "dc-a")
		rb, lb, tb := haRole(t, relays["relay-b"].base, "dc-a")
		switch {
		case ta != tb || ta == 0:
			return false
		case ra == "leader" && rb == "standby":
			leader, standby, leaderID = relays["relay-a"], relays["relay-b"], lb
		case rb == "leader" && ra == "standby":
			leader, standby, leaderID = relays["relay-b"], relays["relay-a"], lb
		default:
			return false
		}
		return true
	}, 15*time.Second, 10*time.Millisecond, "no single leader")
	require.Equal(t, leader, relays[leaderID], "the standby names the leader")

	// The standby refers ingest to the leader.
	resp, err := http.Post(standby.base+"/v1/pools/dc-a/events?source_epoch=1", "application/json", strings.NewReader(`[]`))
	require.NoError(t, err)
	var body struct {
		Error  struct{ Code string }
		Leader struct{ Node, URL string }
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
	resp.Body.Close()
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	assert.Equal(t, "not_leader", body.Error.Code)
	assert.Equal(t, leader.base, resp.Header.Get(server.LeaderHeader))
	assert.Equal(t, leaderID, body.Leader.Node)

	// A router that knows both replicas, the standby first: it moves to
	// the leader.
	pools := []string{"dc-a"}
	rt, err := client.New(client.Config{Relays: []client.Relay{{Addrs: []string{standby.base, leader.base}}}, ConsumerInstance: 77,
		Targets: []client.Target{{Pool: "dc-a", Lane: 0}}, MinBackoff: 5 * time.Millisecond, MaxBackoff: 100 * time.Millisecond,
		IdleTimeout: 5 * time.Second}, wasmLanes(t, leader.base, pools))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = rt.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	postBurst(t, leader.base, "dc-a", 500, 4)
	converge(t, rt, leader.base, "dc-a", 0)
	before := getCatalog(t, leader.base)["dc-a"]
	require.Positive(t, before.Stats.UniqueBlocks)

	// SIGKILL the leader: the standby leads within the lease TTL plus a
	// little, with every admitted block, under a new incarnation.
	killed := time.Now()
	leader.kill()
	require.Eventually(t, func() bool {
		role, _, _ := haRole(t, standby.base, "dc-a")
		return role == "leader"
	}, 10*time.Second, 10*time.Millisecond, "the standby did not take over")
	took := time.Since(killed)
	t.Logf("takeover after SIGKILL: %v (lease ttl 2s)", took)
	assert.Less(t, took, 5*time.Second)
	after := getCatalog(t, standby.base)["dc-a"]
	assert.Equal(t, before.Stats.UniqueBlocks, after.Stats.UniqueBlocks, "the new leader holds every admitted block")
	assert.Equal(t, before.Stats.Members, after.Stats.Members)
	assert.NotEqual(t, before.Identity.ProducerIncarnation, after.Identity.ProducerIncarnation, "each term is a new incarnation")

	// It admits, and the router follows it without a restart.
	postBurst(t, standby.base, "dc-a", 200, 4)
	converge(t, rt, standby.base, "dc-a", 0)
	assert.Greater(t, getCatalog(t, standby.base)["dc-a"].Stats.UniqueBlocks, before.Stats.UniqueBlocks)
}
