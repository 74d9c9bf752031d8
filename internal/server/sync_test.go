package server

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/internal/hub"
	"github.com/ckfrelay/ckfrelay/producer"
)

// slowPoolConfig has one pool that publishes only when asked: a tail waits an
// hour and no event count triggers a publication, so whatever is on its
// stream right after a 202 got there through the barrier.
func slowPoolConfig() Config {
	cfg := testConfig()
	cfg.Pools = []PoolSpec{{Name: "slow", DCID: 3, ExpectedBlocks: 4096, PublishEveryNEvents: 1 << 30,
		PublicationDelay: Duration(time.Hour)}}
	return cfg
}

// mirrorOf reads a hub subscription's snapshot and every delta already on
// its stream (Poll: no waiting) into a table.
func mirrorOf(t *testing.T, sub *hub.Subscription, words []uint64) (deltas int) {
	t.Helper()
	for {
		d, ok, err := sub.Poll()
		require.NoError(t, err)
		if !ok {
			return deltas
		}
		deltas++
		for _, im := range d.Images {
			words[im.Bucket] = im.Word
		}
	}
}

func holds(format ckf.Format, words []uint64, keys []uint64) bool {
	for _, k := range keys {
		ad := format.Addresser().Address(k)
		if !ckf.Bucket(words[ad.A]).Contains(ad.Fingerprint) && !ckf.Bucket(words[ad.B]).Contains(ad.Fingerprint) {
			return false
		}
	}
	return true
}

// After a ?sync=published 202 the pool's stream already carries the events;
// after a plain 202 it need not (here it does not: the pool publishes only
// when asked).
func TestServer_SyncPublishedAnswersOnceTheEventsAreOnTheStream(t *testing.T) {
	s, ts := startTestServer(t, slowPoolConfig())
	p := s.pools["slow"]
	format := p.actor().Identity().Format
	sub, err := p.mirror().Subscribe(ckf.LaneLease{ConsumerInstance: 5, AssignmentEpoch: 1})
	require.NoError(t, err)
	words := make([]uint64, format.BucketCount)
	_, err = sub.ReadSnapshot(0, words)
	require.NoError(t, err)

	plain, plainKeys := chainJSON(1, 1, 3)
	code, body := post(t, ts.URL+"/v1/pools/slow/events?source_epoch=1", "application/json", "["+plain+"]")
	require.Equal(t, http.StatusAccepted, code, "plain post: %v", body)
	assert.Zero(t, mirrorOf(t, sub, words), "a plain 202 promises admission only; this pool publishes when asked")

	synced, syncedKeys := chainJSON(2, 2, 4)
	code, body = post(t, ts.URL+"/v1/pools/slow/events?source_epoch=1&sync=published", "application/json", "["+synced+"]")
	require.Equal(t, http.StatusAccepted, code, "synced post: %v", body)
	assert.Equal(t, float64(1), body["admitted"], "admitted (%v)", body)
	assert.Positive(t, mirrorOf(t, sub, words), "deltas on the stream when the synced 202 arrived")
	assert.True(t, holds(format, words, syncedKeys), "the synced events are on the stream")
	assert.True(t, holds(format, words, plainKeys), "and so is everything admitted before them")

	// The same barrier on the rank endpoints: a reset's removals are on the
	// stream when its answer arrives.
	code, body = post(t, ts.URL+"/v1/pools/slow/ranks/reset?sync=published", "application/json",
		`{"worker_id": 2, "dp_rank": 0, "source_epoch": 2}`)
	require.Equal(t, http.StatusOK, code, "synced reset: %v", body)
	assert.Positive(t, mirrorOf(t, sub, words), "the reset's delta")
	assert.False(t, holds(format, words, syncedKeys[:1]), "worker 2's blocks are gone from the stream")
}

func TestServer_SyncParameterIsCheckedBeforeAdmission(t *testing.T) {
	s, ts := startTestServer(t, slowPoolConfig())
	ev, _ := chainJSON(1, 1, 3)
	for _, v := range []string{"admitted", "PUBLISHED", "1"} {
		code, body := post(t, ts.URL+"/v1/pools/slow/events?source_epoch=1&sync="+v, "application/json", "["+ev+"]")
		assert.Equal(t, http.StatusBadRequest, code, "sync=%s (%v)", v, body)
		assert.Equal(t, CodeBadRequest, errCode(body), "sync=%s", v)
		assert.Contains(t, body["error"].(map[string]any)["message"], `the only value is "published"`)
	}
	require.NoError(t, s.pools["slow"].actor().Flush(context.Background()))
	st, err := s.pools["slow"].actor().Stats(context.Background())
	require.NoError(t, err)
	assert.Zero(t, st.Pool.UniqueBlocks, "nothing admitted")
}

// barrierPool is a pool whose hub the test feeds by hand: a real actor and
// hub without the relay's feeder goroutine.
func barrierPool(t *testing.T, s *Server) (p *hostedPool, admit func() []uint64) {
	t.Helper()
	cfg := ckf.DefaultConfig()
	cfg.ExpectedBlocks = 4096
	pool, err := ckf.NewPool(cfg)
	require.NoError(t, err)
	pcfg := producer.DefaultConfig()
	pcfg.PublicationDelay = time.Hour
	h, faults, err := producer.Start(pool, producer.Scope{Pool: ckf.PoolID{DCID: 9}, ProducerIncarnation: 1}, pcfg)
	require.NoError(t, err)
	go func() {
		for range faults {
		}
	}()
	t.Cleanup(func() { _ = h.Shutdown(context.Background()) })
	hb, err := hub.New(hub.DefaultConfig())
	require.NoError(t, err)
	p = &hostedPool{}
	p.cur.Store(&poolGen{handle: h, hub: hb, leading: true})
	return p, func() []uint64 {
		ev, keys := chainJSON(1, 1, 3)
		evs, err := s.decodeEvents("application/json", []byte("["+ev+"]"))
		require.NoError(t, err)
		require.NoError(t, h.AdmitEvent(context.Background(), 1, evs[0]))
		return keys
	}
}

func feed(hb *hub.Hub, sub *producer.Subscription) {
	for d := range sub.Deltas() {
		if hb.Apply(d) != nil {
			return
		}
	}
}

// The barrier's bound: a hub that does not reach the publisher's sequence
// within SyncPublishedTimeout is a 504 that says the request succeeded;
// once the hub is fed, the same barrier passes.
func TestServer_SyncPublishedTimesOutWhileTheStreamLags(t *testing.T) {
	s, _ := startTestServer(t, slowPoolConfig())
	p, admit := barrierPool(t, s)
	sub, err := p.actor().Subscribe(context.Background(), ckf.LaneLease{ConsumerInstance: hubConsumer, AssignmentEpoch: 1})
	require.NoError(t, err)
	p.mirror().Install(sub.Snapshot) // not fed: the flushed delta waits in sub
	admit()

	defer func(d time.Duration) { SyncPublishedTimeout = d }(SyncPublishedTimeout)
	SyncPublishedTimeout = 50 * time.Millisecond
	err = s.awaitPublished(context.Background(), p, []byte(`{"admitted":1}`))
	var ae *apiError
	require.True(t, errors.As(err, &ae), "%v", err)
	assert.Equal(t, http.StatusGatewayTimeout, ae.status)
	assert.Equal(t, CodePublishTimeout, ae.code)
	require.NotNil(t, ae.admitted)
	assert.Equal(t, 1, *ae.admitted)
	assert.True(t, strings.Contains(ae.message, "do not resend"), ae.message)

	SyncPublishedTimeout = 10 * time.Second
	go feed(p.mirror(), sub)
	require.NoError(t, s.awaitPublished(context.Background(), p, []byte(`{"admitted":1}`)))
	assert.Positive(t, p.mirror().Stats().Sequence)
}

// A publisher without a lease (the hub is resubscribing) drops publications;
// the barrier then waits for the hub's next snapshot and asks again, and
// passes only once the mirror holds the event.
func TestServer_SyncPublishedWaitsForTheHubsNextSnapshot(t *testing.T) {
	s, _ := startTestServer(t, slowPoolConfig())
	p, admit := barrierPool(t, s)
	keys := admit()
	done := make(chan error, 1)
	go func() { done <- s.awaitPublished(context.Background(), p, []byte(`{"admitted":1}`)) }()

	sub, err := p.actor().Subscribe(context.Background(), ckf.LaneLease{ConsumerInstance: hubConsumer, AssignmentEpoch: 1})
	require.NoError(t, err)
	p.mirror().Install(sub.Snapshot)
	go feed(p.mirror(), sub)
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		require.FailNow(t, "barrier never passed")
	}
	hs, err := p.mirror().Subscribe(ckf.LaneLease{ConsumerInstance: 1, AssignmentEpoch: 1})
	require.NoError(t, err)
	format := p.actor().Identity().Format
	words := make([]uint64, format.BucketCount)
	_, err = hs.ReadSnapshot(0, words)
	require.NoError(t, err)
	mirrorOf(t, hs, words)
	assert.True(t, holds(format, words, keys), "the mirror holds the event")
}
