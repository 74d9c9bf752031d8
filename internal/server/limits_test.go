package server

import (
	"encoding/json"
	"io"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
)

// TestConfig_ExactStateBoundsDefaultToTheFilter: a pool's max_members and
// max_tracked_blocks default to sizes derived from its filter and reach
// the pool's ckf config; set values, JSON keys and flag keys are kept
// (SPEC §4.6).
func TestConfig_ExactStateBoundsDefaultToTheFilter(t *testing.T) {
	c := Config{Pools: []PoolSpec{{Name: "a", DCID: 1}, {Name: "b", DCID: 2, ExpectedBlocks: 1000, MaxMembers: 3, MaxTrackedBlocks: 50}}}.WithDefaults()
	require.NoError(t, c.Validate())
	a, b := c.Pools[0], c.Pools[1]
	assert.Equal(t, ckf.DefaultMaxMembers, a.MaxMembers)
	assert.Equal(t, uint64(524_288*4*ckf.DefaultTrackedBlocksPerSlot), a.MaxTrackedBlocks)
	assert.Equal(t, 3, b.MaxMembers)
	assert.Equal(t, uint64(50), b.MaxTrackedBlocks)
	cc := b.ckfConfig()
	assert.Equal(t, 3, cc.MaxMembers)
	assert.Equal(t, uint64(50), cc.MaxTrackedBlocks)

	p, err := ParsePoolFlag("east:dc=3,members=7,tracked=0x100")
	require.NoError(t, err)
	assert.Equal(t, 7, p.MaxMembers)
	assert.Equal(t, uint64(256), p.MaxTrackedBlocks)

	bad := Config{Pools: []PoolSpec{{Name: "a", DCID: 1, MaxMembers: -1}}}.WithDefaults()
	require.ErrorIs(t, bad.Validate(), ErrInvalidConfig)
}

// TestConfig_ApplyWorkersDefaultToGOMAXPROCS: a pool's apply_workers
// defaults to GOMAXPROCS capped at ckf.DefaultApplyWorkersCap
// (docs/RATIONALE.md "Why is apply_workers GOMAXPROCS by default?"), 1 in a
// single-core process, and reaches the pool's ckf config; a set value, the
// JSON key and the flag key are kept; a count outside 1..=64 is refused.
func TestConfig_ApplyWorkersDefaultToGOMAXPROCS(t *testing.T) {
	for _, procs := range []int{1, 2, 3, ckf.DefaultApplyWorkersCap, ckf.DefaultApplyWorkersCap + 1, 64} {
		prev := runtime.GOMAXPROCS(procs)
		c := Config{Pools: []PoolSpec{{Name: "a", DCID: 1}, {Name: "b", DCID: 2, ApplyWorkers: 3}}}.WithDefaults()
		runtime.GOMAXPROCS(prev)
		require.NoError(t, c.Validate())
		want := min(procs, ckf.DefaultApplyWorkersCap)
		assert.Equal(t, want, c.Pools[0].ApplyWorkers, "GOMAXPROCS %d", procs)
		assert.Equal(t, want, c.Pools[0].ckfConfig().ApplyWorkers, "GOMAXPROCS %d", procs)
		assert.Equal(t, 3, c.Pools[1].ckfConfig().ApplyWorkers, "GOMAXPROCS %d", procs)
	}

	var fromJSON PoolSpec
	require.NoError(t, json.Unmarshal([]byte(`{"name":"j","dc_id":1,"apply_workers":5}`), &fromJSON))
	assert.Equal(t, 5, fromJSON.ApplyWorkers)
	p, err := ParsePoolFlag("east:dc=3,workers=7")
	require.NoError(t, err)
	assert.Equal(t, 7, p.ApplyWorkers)

	for _, n := range []int{-1, ckf.MaxApplyWorkers + 1} {
		bad := Config{Pools: []PoolSpec{{Name: "a", DCID: 1, ApplyWorkers: n}}}.WithDefaults()
		require.ErrorIs(t, bad.Validate(), ErrInvalidConfig, "apply_workers %d", n)
	}
}

// TestServer_MemberBoundRefusesOneMoreWorker: with max_members 1 a second
// worker's events are refused by the pool, counted as a Resource fault and
// named in the catalog; the first worker's state is intact.
func TestServer_MemberBoundRefusesOneMoreWorker(t *testing.T) {
	cfg := testConfig()
	cfg.Pools[0].MaxMembers = 1
	s, ts := startTestServer(t, cfg)
	for _, w := range []uint64{1, 2} {
		ev, _ := chainJSON(w, w, 2)
		code, body := post(t, ts.URL+"/v1/pools/dc-a/events?source_epoch=1", "application/json", "["+ev+"]")
		require.Equal(t, http.StatusAccepted, code, "%v", body)
	}
	p := s.pools["dc-a"]
	require.NotNil(t, p)
	require.Eventually(t, func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return strings.Contains(p.lastFault, "max_members")
	}, 5*time.Second, 5*time.Millisecond)
	st, err := p.actor().Stats(t.Context())
	require.NoError(t, err)
	assert.Equal(t, 1, st.Pool.Members)
	assert.Equal(t, uint64(1), st.Pool.MemberLimitRejections)

	resp, err := http.Get(ts.URL + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	assert.Contains(t, string(body), `ckfrelay_exact_state_limit_rejections_total{limit="max_members",pool="dc-a"} 1`)
	assert.Contains(t, string(body), `ckfrelay_exact_state_limit_rejections_total{limit="max_tracked_blocks",pool="dc-a"} 0`)
	assert.Contains(t, string(body), `ckfrelay_source_epochs_pruned_total{pool="dc-a"} 0`)
}
