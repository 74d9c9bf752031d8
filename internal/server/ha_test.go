package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/internal/catalog"
	"github.com/ckfrelay/ckfrelay/internal/replica"
	"github.com/ckfrelay/ckfrelay/internal/testing/natstest"
	"github.com/ckfrelay/ckfrelay/wire"
)

func haConfig(url, node string) Config {
	cfg := testConfig()
	cfg.Pools = cfg.Pools[:1]
	// A lease that a loaded machine (the race detector, other tests)
	// renews in time: leadership must not move except where a test moves
	// it (a planned stop hands over at once, whatever the TTL).
	cfg.HA = HAConfig{NATSURL: url, NodeID: node, LeaseTTL: Duration(5 * time.Second), StreamReplicas: 1}
	return cfg
}

// haRelay is one in-process replica: the server and its HTTP front.
type haRelay struct {
	s  *Server
	ts *httptest.Server
}

// startHARelay starts a replica; before, if set, runs between New and the
// start of its replicas (tests install pause points there).
func startHARelay(t *testing.T, cfg Config, before func(*Server)) *haRelay {
	t.Helper()
	s, err := New(cfg, slog.New(slog.DiscardHandler))
	require.NoError(t, err, "New")
	ts := httptest.NewServer(s.Handler())
	if before != nil {
		before(s)
	}
	require.NoError(t, s.StartHA(ts.URL, ""))
	r := &haRelay{s: s, ts: ts}
	t.Cleanup(func() { r.stop() })
	return r
}

func (r *haRelay) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = r.s.Shutdown(ctx)
	r.ts.Close()
}

// ha returns the pool's catalog "ha" block.
func (r *haRelay) ha(t *testing.T, pool string) catalog.Pool {
	t.Helper()
	resp, err := http.Get(r.ts.URL + "/v1/pools")
	require.NoError(t, err)
	defer resp.Body.Close()
	var c catalog.Catalog
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&c))
	for _, p := range c.Pools {
		if p.Name == pool {
			return p
		}
	}
	require.Failf(t, "no pool", "%s", pool)
	return catalog.Pool{}
}

func scrape(t *testing.T, r *haRelay) string {
	t.Helper()
	resp, err := http.Get(r.ts.URL + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(b)
}

func (r *haRelay) leading(pool string) bool { return r.s.pools[pool].gen().leading }

// waitLeader waits until exactly one of the relays leads pool and returns
// it and the other.
func waitLeader(t *testing.T, pool string, a, b *haRelay) (leader, standby *haRelay) {
	t.Helper()
	require.Eventually(t, func() bool { return a.leading(pool) != b.leading(pool) }, 10*time.Second, 5*time.Millisecond,
		"no single leader")
	leader, standby = b, a
	if a.leading(pool) {
		leader, standby = a, b
	}
	// The standby learns the leader from its term record.
	require.Eventually(t, func() bool {
		return standby.s.pools[pool].ha.node.Status().Term == leader.s.pools[pool].ha.node.Status().Term
	}, 10*time.Second, 5*time.Millisecond, "the standby never applied the leader's term record")
	return leader, standby
}

func postEvents(t *testing.T, base, pool, body string) (*http.Response, map[string]any) {
	t.Helper()
	resp, err := http.Post(base+"/v1/pools/"+pool+"/events?source_epoch=1", "application/json", strings.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp, out
}

// holdsKeys reports whether the relay's hub (what it serves) holds keys.
func holdsKeys(t *testing.T, r *haRelay, pool string, keys []uint64) bool {
	t.Helper()
	_, words, err := hubTable(r.s, pool)
	if err != nil {
		return false
	}
	return holds(r.s.pools[pool].actor().Identity().Format, words, keys)
}

func TestHA_StandbyRefersToTheLeaderAndTakesOver(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	a := startHARelay(t, haConfig(srv.URL(), "node-a"), nil)
	b := startHARelay(t, haConfig(srv.URL(), "node-b"), nil)
	leader, standby := waitLeader(t, "dc-a", a, b)
	lnode := map[*haRelay]string{a: "node-a", b: "node-b"}[leader]

	// The catalog says who leads, on both.
	lc, sc := leader.ha(t, "dc-a"), standby.ha(t, "dc-a")
	require.NotNil(t, lc.HA)
	require.NotNil(t, sc.HA)
	assert.Equal(t, "leader", lc.HA.Role)
	assert.Equal(t, "standby", sc.HA.Role)
	assert.Equal(t, lnode, sc.HA.Leader)
	assert.Equal(t, leader.ts.URL, sc.HA.LeaderAddress)
	assert.Equal(t, lc.HA.Term, sc.HA.Term)
	// Each term is a producer incarnation of its own, the term in the high bits.
	assert.Equal(t, uint64(lc.HA.Term), uint64(lc.Identity.ProducerIncarnation)>>32)

	// Metrics say the same.
	assert.Contains(t, scrape(t, leader), `ckfrelay_ha_leader{pool="dc-a"} 1`)
	assert.Contains(t, scrape(t, leader), `ckfrelay_ha_takeovers_total{pool="dc-a"} 1`)
	assert.Contains(t, scrape(t, standby), `ckfrelay_ha_leader{pool="dc-a"} 0`)
	assert.Contains(t, scrape(t, standby), `ckfrelay_ha_term{pool="dc-a"} `+strconv.FormatUint(uint64(lc.HA.Term), 10))

	// The standby admits nothing and serves no stream: 503 with the leader.
	ev, keys := chainJSON(1, 1, 3)
	resp, body := postEvents(t, standby.ts.URL, "dc-a", "["+ev+"]")
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	assert.Equal(t, CodeNotLeader, errCode(body))
	assert.Equal(t, leader.ts.URL, resp.Header.Get(LeaderHeader))
	assert.Equal(t, map[string]any{"node": lnode, "url": leader.ts.URL}, body["leader"])
	sresp, err := http.Get(standby.ts.URL + "/v1/pools/dc-a/stream?consumer=1&lane=0&epoch=1")
	require.NoError(t, err)
	sresp.Body.Close()
	assert.Equal(t, http.StatusServiceUnavailable, sresp.StatusCode)
	assert.Equal(t, leader.ts.URL, sresp.Header.Get(LeaderHeader))

	// The leader admits (202 once the record is stored) and serves it.
	resp, body = postEvents(t, leader.ts.URL, "dc-a", "["+ev+"]")
	require.Equal(t, http.StatusAccepted, resp.StatusCode, "%v", body)
	require.Eventually(t, func() bool { return holdsKeys(t, leader, "dc-a", keys) }, 5*time.Second, 5*time.Millisecond)
	// The standby applies the record.
	require.Eventually(t, func() bool {
		return standby.s.pools["dc-a"].ha.node.Status().Applied == leader.s.pools["dc-a"].ha.node.Status().Applied
	}, 5*time.Second, 5*time.Millisecond)

	// The leader goes (a planned stop: it resigns); the standby leads with
	// the admitted blocks and admits more.
	leader.stop()
	require.Eventually(t, func() bool { return standby.leading("dc-a") }, 5*time.Second, 5*time.Millisecond)
	require.Eventually(t, func() bool { return holdsKeys(t, standby, "dc-a", keys) }, 5*time.Second, 5*time.Millisecond)
	nc := standby.ha(t, "dc-a")
	assert.Greater(t, uint64(nc.HA.Term), uint64(lc.HA.Term))
	assert.NotEqual(t, lc.Identity.ProducerIncarnation, nc.Identity.ProducerIncarnation)
	ev2, keys2 := chainJSON(2, 2, 3)
	resp, body = postEvents(t, standby.ts.URL, "dc-a", "["+ev2+"]")
	require.Equal(t, http.StatusAccepted, resp.StatusCode, "%v", body)
	require.Eventually(t, func() bool { return holdsKeys(t, standby, "dc-a", keys2) }, 5*time.Second, 5*time.Millisecond)
}

// pausingJS holds the replica's appends (record publishes) while paused:
// the pause point between a leader's admission and its stored record.
type pausingJS struct {
	jetstream.JetStream
	mu      sync.Mutex
	paused  chan struct{} // closed on release; nil while not paused
	entered chan struct{} // receives when an append waits
}

func (p *pausingJS) pause() {
	p.mu.Lock()
	p.paused = make(chan struct{})
	p.mu.Unlock()
}

func (p *pausingJS) release() {
	p.mu.Lock()
	close(p.paused)
	p.paused = nil
	p.mu.Unlock()
}

func (p *pausingJS) PublishMsg(ctx context.Context, msg *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	p.mu.Lock()
	gate := p.paused
	p.mu.Unlock()
	if gate != nil && strings.HasPrefix(msg.Subject, replica.DefaultSubjectPrefix+".") {
		select {
		case p.entered <- struct{}{}:
		default:
		}
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return p.JetStream.PublishMsg(ctx, msg, opts...)
}

func TestHA_OutputsWaitForTheRecord(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	cfg := haConfig(srv.URL(), "node-a")
	cfg.HA.LeaseTTL = Duration(10 * time.Second) // the pause must not cost the lease
	pj := &pausingJS{entered: make(chan struct{}, 1)}
	r := startHARelay(t, cfg, func(s *Server) { pj.JetStream = s.ha.js; s.ha.js = pj })
	require.Eventually(t, func() bool { return r.leading("dc-a") }, 10*time.Second, 5*time.Millisecond)

	// A remote subscriber, and a request admitted while appends are held.
	sr, _ := openStream(t, r.ts.URL, "dc-a", 1, 0, 1)
	require.Equal(t, wire.KindSnapshotChunk, sr.next())
	pj.pause()
	ev, keys := chainJSON(1, 1, 3)
	// The request runs through the handler under a context the test ends:
	// a handler that would answer 202 before the record has done so by the
	// time the append is in flight (its admission came first).
	ctx, cancel := context.WithCancel(context.Background())
	req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/v1/pools/dc-a/events?source_epoch=1", strings.NewReader("["+ev+"]"))
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	handled := make(chan struct{})
	go func() { defer close(handled); r.s.Handler().ServeHTTP(rec, req) }()
	<-pj.entered // the append covering the request is in flight
	// The actor has applied the event (its stats say so) and published it ...
	p := r.s.pools["dc-a"]
	st, err := p.actor().Stats(t.Context())
	require.NoError(t, err)
	require.Equal(t, 3, st.Pool.UniqueBlocks)
	require.NoError(t, p.actor().Flush(t.Context()))
	// ... but neither the hub (every stream's source) holds it ...
	assert.False(t, holdsKeys(t, r, "dc-a", keys), "the hub holds what no stored record covers")
	// ... nor was it answered 202.
	cancel()
	<-handled
	assert.NotEqual(t, http.StatusAccepted, rec.Code, "answered 202 before the record was stored: %s", rec.Body)
	pj.release()
	require.Eventually(t, func() bool { return holdsKeys(t, r, "dc-a", keys) }, 5*time.Second, time.Millisecond)
	// The stream's subscriber gets it too, after the record.
	for !sr.contains(p.actor().Identity().Format, keys[0]) {
		sr.next()
	}
	// And a request answered normally gets its 202 once stored.
	ev2, _ := chainJSON(2, 2, 3)
	resp, body := postEvents(t, r.ts.URL, "dc-a", "["+ev2+"]")
	require.Equal(t, http.StatusAccepted, resp.StatusCode, "%v", body)
}

func TestHAConfig_Validate(t *testing.T) {
	base := func() Config {
		c := testConfig()
		c.HA = HAConfig{NATSURL: "nats://127.0.0.1:4222", NodeID: "a"}
		return c
	}
	for name, tc := range map[string]struct {
		edit func(*Config)
		want string
	}{
		"even replicas":           {func(c *Config) { c.HA.StreamReplicas = 2 }, "stream_replicas 2"},
		"too many replicas":       {func(c *Config) { c.HA.StreamReplicas = 7 }, "stream_replicas 7"},
		"negative replicas":       {func(c *Config) { c.HA.StreamReplicas = -1 }, "stream_replicas -1"},
		"short ttl":               {func(c *Config) { c.HA.LeaseTTL = Duration(time.Millisecond) }, "lease_ttl"},
		"long ttl":                {func(c *Config) { c.HA.LeaseTTL = Duration(time.Hour) }, "lease_ttl"},
		"bad node id":             {func(c *Config) { c.HA.NodeID = "a b" }, "node_id"},
		"data dir":                {func(c *Config) { c.DataDir = t.TempDir() }, "data_dir"},
		"advertise not a url":     {func(c *Config) { c.HA.Advertise = "10.0.0.1:7878" }, "advertise"},
		"advertise with query":    {func(c *Config) { c.HA.Advertise = "http://h:1/?x=1" }, "advertise"},
		"grpc not host:port":      {func(c *Config) { c.HA.AdvertiseGRPC = "h" }, "advertise_grpc"},
		"address too long":        {func(c *Config) { c.HA.AdvertiseGRPC = strings.Repeat("h", 1100) + ":1" }, "1024"},
		"no checkpoint records":   {func(c *Config) { c.HA.CheckpointRecords = -1 }, "checkpoint_records -1"},
		"tiny checkpoint bytes":   {func(c *Config) { c.HA.CheckpointBytes = 1000 }, "checkpoint_bytes 1000"},
		"huge checkpoint bytes":   {func(c *Config) { c.HA.CheckpointBytes = 1 << 40 }, "checkpoint_bytes"},
		"checkpoints without url": {func(c *Config) { c.HA = HAConfig{CheckpointRecords: 10} }, "checkpoint_* need ha.nats_url"},
		"ha fields without url": {func(c *Config) {
			c.HA.NATSURL = ""
		}, "need ha.nats_url"},
	} {
		t.Run(name, func(t *testing.T) {
			c := base()
			tc.edit(&c)
			err := c.WithDefaults().Validate()
			require.Error(t, err)
			assert.True(t, errors.Is(err, ErrInvalidConfig))
			assert.Contains(t, err.Error(), tc.want)
		})
	}
	c := base().WithDefaults()
	require.NoError(t, c.Validate())
	assert.Equal(t, 3, c.HA.StreamReplicas)
	assert.Equal(t, Duration(DefaultHALeaseTTL), c.HA.LeaseTTL)
	assert.Equal(t, 3, c.NATS.Replicas, "the fan-out follows ha.stream_replicas")
	assert.Equal(t, replica.DefaultCheckpointRecords, c.HA.CheckpointRecords)
	assert.Equal(t, int64(replica.DefaultCheckpointBytes), c.HA.CheckpointBytes)
	// Node ids default to the host name.
	c2 := base()
	c2.HA.NodeID = ""
	c2 = c2.WithDefaults()
	assert.NotEmpty(t, c2.HA.NodeID)
}

// A leader whose appends stop being stored loses its leadership; its NATS
// fan-out publisher stops (cancelled, no end frames) before the next leader
// publishes, and publishes nothing more while the new leader does.
func TestHA_DeposedLeadersFanOutStops(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	withFanOut := func(node string) Config {
		cfg := haConfig(srv.URL(), node)
		cfg.HA.LeaseTTL = Duration(time.Second) // a's unstored append must outlast it
		cfg.NATS = NATSOut{URL: srv.URL(), SnapshotInterval: Duration(time.Hour)}
		return cfg
	}
	pj := &pausingJS{entered: make(chan struct{}, 1)}
	a := startHARelay(t, withFanOut("node-a"), func(s *Server) { pj.JetStream = s.ha.js; s.ha.js = pj })
	require.Eventually(t, func() bool { return a.leading("dc-a") }, 10*time.Second, 5*time.Millisecond)
	b := startHARelay(t, withFanOut("node-b"), nil)
	require.Eventually(t, func() bool {
		st, ok := a.s.NATSStats()["dc-a"]
		return ok && st.Snapshots > 0 && st.Heartbeats > 0
	}, 10*time.Second, 5*time.Millisecond, "the leader's fan-out never published")
	require.NotContains(t, b.s.NATSStats(), "dc-a", "a standby runs no fan-out publisher")

	// a's appends are no longer stored: its next admission fences it.
	pj.pause()
	ev, _ := chainJSON(1, 1, 3)
	resp, body := postEvents(t, a.ts.URL, "dc-a", "["+ev+"]")
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "%v", body)
	assert.Equal(t, CodeNotLeader, errCode(body), "a 503 that says the events are not the group's")
	require.Eventually(t, func() bool {
		h := a.s.pools["dc-a"].ha
		h.mu.Lock()
		defer h.mu.Unlock()
		return !a.leading("dc-a") && h.lead == nil
	}, 10*time.Second, 5*time.Millisecond, "the deposed leader's publisher and sources did not return")
	deposed := a.s.NATSStats()["dc-a"]

	require.Eventually(t, func() bool { return b.leading("dc-a") }, 10*time.Second, 5*time.Millisecond, "b never took over")
	require.Eventually(t, func() bool {
		st, ok := b.s.NATSStats()["dc-a"]
		return ok && st.Heartbeats >= 3
	}, 10*time.Second, 5*time.Millisecond, "the new leader's fan-out never published")
	if !a.leading("dc-a") { // a may have become b's standby meanwhile, never a leader again while paused
		now := a.s.NATSStats()["dc-a"]
		assert.Equal(t, []uint64{deposed.Heartbeats, deposed.Deltas, deposed.Snapshots}, []uint64{now.Heartbeats, now.Deltas, now.Snapshots},
			"the deposed leader's publisher went on publishing")
	}
	pj.release()

	// No frame of the stream ended a's incarnation: no drain marker, no
	// close frame (either would deactivate router lanes that follow it).
	js, layout := poolJetStream(t, srv.URL(), "dc-a")
	st, err := js.Stream(t.Context(), layout.Stream)
	require.NoError(t, err)
	info, err := st.Info(t.Context())
	require.NoError(t, err)
	var f wire.Frame
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		m, err := st.GetMsg(t.Context(), seq)
		require.NoError(t, err)
		if m.Subject == layout.Pointer { // the snapshot pointer, not a frame
			continue
		}
		require.NoError(t, wire.DecodeFrame(m.Data, &f))
		assert.NotContains(t, []wire.Kind{wire.KindClose, wire.KindDrainMarker}, f.Kind, "frame %d", seq)
	}
}

// A term record's address comes from the stream: only an http(s) URL (and
// a host:port gRPC target) is passed on to clients, never a header or a
// trailer built from anything else.
func TestParseAdvertisement(t *testing.T) {
	for addr, want := range map[string]LeaderHint{
		"http://10.0.0.7:7878":             {Node: "n", URL: "http://10.0.0.7:7878"},
		"https://h:1?grpc=h%3A2":           {Node: "n", URL: "https://h:1", GRPC: "h:2"},
		advertisement("http://h:1", "h:2"): {Node: "n", URL: "http://h:1", GRPC: "h:2"},
		"http://h:1?grpc=not-a-target":     {Node: "n", URL: "http://h:1"},
		"h:1":                              {Node: "n"},
		"javascript:alert(1)":              {Node: "n"},
		"http://h:1/\r\nSet-Cookie: x=1":   {Node: "n"},
		"":                                 {Node: "n"},
		"ftp://h:1":                        {Node: "n"},
		"http://h:1#frag":                  {Node: "n", URL: "http://h:1"},
		"http://" + strings.Repeat("a", 900) + ":1": {Node: "n", URL: "http://" + strings.Repeat("a", 900) + ":1"},
	} {
		assert.Equal(t, want, parseAdvertisement("n", addr), "%q", addr)
	}
}

// A standby refers ingest before reading the body: a client announcing a
// large body gets its 503 while it has sent only the first bytes.
func TestHA_StandbyAnswersBeforeReadingTheBody(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	a := startHARelay(t, haConfig(srv.URL(), "node-a"), nil)
	b := startHARelay(t, haConfig(srv.URL(), "node-b"), nil)
	_, standby := waitLeader(t, "dc-a", a, b)
	pr, pw := io.Pipe()
	answered := make(chan struct{})
	go func() {
		_, _ = pw.Write([]byte("[" + strings.Repeat(" ", 64<<10))) // the first 64 KiB of 8 MiB
		<-answered
		_ = pw.CloseWithError(errors.New("client gave up"))
	}()
	req, err := http.NewRequest(http.MethodPost, standby.ts.URL+"/v1/pools/dc-a/events?source_epoch=1", pr)
	require.NoError(t, err)
	req.ContentLength = 8 << 20
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	close(answered)
	require.NoError(t, err, "no answer while the body was still being sent")
	resp.Body.Close()
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	assert.NotEmpty(t, resp.Header.Get(LeaderHeader))
}

// Two live relays configured with one node id: the one standing by says so
// (catalog duplicate_node_id, metric) once the other has renewed the lease
// under that id for two TTLs — a crashed predecessor's lease would expire.
func TestHA_DuplicateNodeIDIsReported(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	cfg := haConfig(srv.URL(), "same")
	cfg.HA.LeaseTTL = Duration(500 * time.Millisecond)
	a := startHARelay(t, cfg, nil)
	b := startHARelay(t, cfg, nil)
	leader, standby := waitLeader(t, "dc-a", a, b)
	assert.False(t, leader.ha(t, "dc-a").HA.DuplicateNodeID)
	require.Eventually(t, func() bool { return standby.ha(t, "dc-a").HA.DuplicateNodeID }, 10*time.Second, 50*time.Millisecond,
		"the standby never noticed the other relay under its node id")
	assert.Contains(t, scrape(t, standby), `ckfrelay_ha_duplicate_node_id{pool="dc-a"} 1`)
	assert.Contains(t, scrape(t, leader), `ckfrelay_ha_duplicate_node_id{pool="dc-a"} 0`)
}

// TestHA_LeaderPastItsDeadlineServesNothing: a relay resumed after a pause
// past its lease (SIGSTOP, a suspended VM) runs its handlers before its
// node's loop retires the leading generation. From the moment its own
// clock says the lease's deadline passed it opens no stream (HTTP 503
// not_leader, the gRPC side's Leader check) and ends the streams it has at
// their next heartbeat instead of saying its state is live. The node's
// clock is the only thing replaced: its loop still believes it leads.
func TestHA_LeaderPastItsDeadlineServesNothing(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	var expired atomic.Bool
	a := startHARelay(t, haConfig(srv.URL(), "node-a"), func(s *Server) {
		h := s.pools["dc-a"].ha
		h.leads = func() bool { return !expired.Load() && h.node.Leads() }
	})
	require.Eventually(t, func() bool { return a.leading("dc-a") }, 10*time.Second, 5*time.Millisecond)
	streamURL := func(epoch int) string {
		return fmt.Sprintf("%s/v1/pools/dc-a/stream?consumer=5&lane=0&epoch=%d", a.ts.URL, epoch)
	}
	open, err := http.Get(streamURL(1))
	require.NoError(t, err)
	defer open.Body.Close()
	require.Equal(t, http.StatusOK, open.StatusCode)
	_, standby := KvPool{s: a.s, p: a.s.pools["dc-a"]}.Leader()
	require.False(t, standby)

	expired.Store(true)
	require.True(t, a.leading("dc-a"), "the node's loop still marks the generation leading")
	resp, err := http.Get(streamURL(2))
	require.NoError(t, err)
	if resp.StatusCode == http.StatusOK {
		resp.Body.Close()
		require.Fail(t, "a leader past its deadline opened a stream")
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "%s", body)
	require.Contains(t, string(body), CodeNotLeader)
	_, standby = KvPool{s: a.s, p: a.s.pools["dc-a"]}.Leader()
	require.True(t, standby, "gRPC would still serve the pool")

	// The open stream ends at its next heartbeat (20 ms): reading it to
	// the end returns.
	done := make(chan error, 1)
	go func() { _, err := io.Copy(io.Discard, open.Body); done <- err }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		require.Fail(t, "the open stream went on after the deadline")
	}
}

// TestHA_ReplicaThatLostItsRecordsIsNotReady: the pool's records subject
// is purged under a running leader (a JetStream API request). The replica
// stops with the records lost instead of leading what is left; it says so
// in the catalog's ha block and /readyz answers 503, so a supervisor sees
// it (it used to answer 200 and look like a healthy standby).
func TestHA_ReplicaThatLostItsRecordsIsNotReady(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	cfg := haConfig(srv.URL(), "node-a")
	cfg.HA.LeaseTTL = Duration(time.Second)
	a := startHARelay(t, cfg, nil)
	require.Eventually(t, func() bool { return a.leading("dc-a") }, 10*time.Second, 5*time.Millisecond)
	ev, _ := chainJSON(1, 1, 3)
	resp, body := postEvents(t, a.ts.URL, "dc-a", "["+ev+"]")
	require.Equal(t, http.StatusAccepted, resp.StatusCode, "%v", body)
	ready := func() int {
		r, err := http.Get(a.ts.URL + "/readyz")
		require.NoError(t, err)
		r.Body.Close()
		return r.StatusCode
	}
	require.Equal(t, http.StatusOK, ready())

	subject, err := replica.Subject("", "dc-a")
	require.NoError(t, err)
	require.NoError(t, a.s.ha.stream.Purge(t.Context(), jetstream.WithPurgeSubject(subject)))
	ev, _ = chainJSON(2, 1, 3)
	resp, body = postEvents(t, a.ts.URL, "dc-a", "["+ev+"]")
	require.NotEqual(t, http.StatusAccepted, resp.StatusCode, "%v", body)

	require.Eventually(t, func() bool { return ready() == http.StatusServiceUnavailable }, 15*time.Second, 20*time.Millisecond,
		"a replica whose records were purged is still ready")
	h := a.ha(t, "dc-a")
	require.NotNil(t, h.HA)
	assert.Contains(t, h.HA.Stopped, "state lost")
	assert.Equal(t, "standby", h.HA.Role)
}

// TestHA_OwnLeaseIsNoDuplicateNodeID: the lease under this relay's node id
// with a token this relay acquired — a takeover it keeps failing, as in a
// halted chain — is not "another relay under this node id" (the red team
// saw that false alarm); only a token it never held is.
func TestHA_OwnLeaseIsNoDuplicateNodeID(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	cfg := haConfig(srv.URL(), "node-a")
	cfg.HA.LeaseTTL = Duration(time.Second)
	a := startHARelay(t, cfg, nil)
	require.Eventually(t, func() bool { return a.leading("dc-a") }, 10*time.Second, 5*time.Millisecond)
	h := a.s.pools["dc-a"].ha
	deadline := time.Now().Add(3 * time.Second) // past two TTLs of renewals
	for time.Now().Before(deadline) {
		h.tailMu.Lock()
		h.checkDuplicate(t.Context())
		h.tailMu.Unlock()
		require.False(t, h.duplicate.Load(), "the relay's own lease was reported as another relay's")
		time.Sleep(100 * time.Millisecond) // renewals happen every TTL/3; polling them
	}
}

// failingTail is the records stream with its tail reads failing while fail
// is set, as for a standby cut off from NATS.
type failingTail struct {
	jetstream.Stream
	fail *atomic.Bool
}

func (s failingTail) GetLastMsgForSubject(ctx context.Context, subject string) (*jetstream.RawStreamMsg, error) {
	if s.fail.Load() {
		return nil, context.DeadlineExceeded
	}
	return s.Stream.GetLastMsgForSubject(ctx, subject)
}

// TestHA_StandbyThatCannotReadTheTailSaysItsLagIsUnknown: a standby whose
// tail reads fail (cut off from NATS) reported lag 0 — its last good read —
// while it fell behind (red-team HA F7). It says lag_unknown instead.
func TestHA_StandbyThatCannotReadTheTailSaysItsLagIsUnknown(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	a := startHARelay(t, haConfig(srv.URL(), "node-a"), nil)
	require.Eventually(t, func() bool { return a.leading("dc-a") }, 10*time.Second, 5*time.Millisecond)
	var cut atomic.Bool
	b := startHARelay(t, haConfig(srv.URL(), "node-b"), func(s *Server) { s.ha.stream = failingTail{Stream: s.ha.stream, fail: &cut} })
	waitLeader(t, "dc-a", a, b)
	h := b.ha(t, "dc-a").HA
	require.NotNil(t, h)
	assert.False(t, h.LagUnknown, "%+v", h)

	cut.Store(true)
	require.Eventually(t, func() bool { return b.ha(t, "dc-a").HA.LagUnknown }, 10*time.Second, 50*time.Millisecond,
		"a standby that cannot read the tail still reports a known lag")
	cut.Store(false)
	require.Eventually(t, func() bool { return !b.ha(t, "dc-a").HA.LagUnknown }, 10*time.Second, 50*time.Millisecond)
}

// The HA connection leaves a NATS server that hangs — alive for TCP, silent
// — within about 2 lease TTLs (three unanswered pings at TTL/2), not after
// nats.go's default of minutes.
func TestHA_ConnectionLeavesAHungServerWithinTheLease(t *testing.T) {
	ns := natstest.Start(t, natstest.Options{})
	proxy := natstest.StartPausableProxy(t, strings.TrimPrefix(ns.URL(), "nats://"))
	const ttl = 400 * time.Millisecond
	cfg := HAConfig{NATSURL: proxy.URL(), LeaseTTL: Duration(ttl)}
	disconnected := make(chan struct{}, 1)
	opts := append(haConnOptions(cfg), nats.DisconnectErrHandler(func(*nats.Conn, error) {
		select {
		case disconnected <- struct{}{}:
		default:
		}
	}))
	nc, err := nats.Connect(cfg.NATSURL, opts...)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	require.NoError(t, nc.Flush())
	proxy.SetPaused(true)
	paused := time.Now()
	select {
	case <-disconnected:
		t.Logf("left the hung server after %v (lease TTL %v)", time.Since(paused), ttl)
	case <-time.After(10 * ttl):
		require.Fail(t, "the HA connection stayed on a hung server", "after %v", 10*ttl)
	}
}
