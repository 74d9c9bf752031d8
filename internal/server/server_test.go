package server

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/producer"
	"github.com/ckfrelay/ckfrelay/wire"
)

func testConfig() Config {
	return Config{
		Pools: []PoolSpec{
			{Name: "dc-a", DCID: 1, ExpectedBlocks: 4096, PublishEveryNEvents: 1},
			{Name: "dc-b", DCID: 2, ExpectedBlocks: 4096},
		},
		HeartbeatInterval: Duration(20 * time.Millisecond),
		MaxEventsPerBatch: 8,
		MaxBlocksPerEvent: 64,
	}
}

func startTestServer(t *testing.T, cfg Config) (*Server, *httptest.Server) {
	t.Helper()
	s, err := New(cfg, slog.New(slog.DiscardHandler))
	require.NoError(t, err, "New")
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.Shutdown(ctx)
		ts.Close()
	})
	return s, ts
}

// chainEvents returns a Stored event of n blocks rooted at seed for worker w.
func chainJSON(w uint64, seed uint64, n int) (string, []uint64) {
	var blocks []string
	locals := make([]uint64, n)
	for i := range n {
		locals[i] = seed*1000 + uint64(i)
		blocks = append(blocks, fmt.Sprintf(`{"block_hash": %d, "tokens_hash": %d}`, seed*1000+uint64(i)+7, locals[i]))
	}
	ev := fmt.Sprintf(`{"worker_id": %d, "event": {"event_id": %d, "data": {"stored": {"parent_hash": null, "blocks": [%s]}}}}`,
		w, seed, strings.Join(blocks, ","))
	return ev, ckf.AppendSequenceHashes(nil, locals)
}

func post(t *testing.T, url, contentType, body string) (int, map[string]any) {
	t.Helper()
	resp, err := http.Post(url, contentType, strings.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out
}

func errCode(body map[string]any) string {
	e, _ := body["error"].(map[string]any)
	c, _ := e["code"].(string)
	return c
}

// streamReader reads frames of one stream into a table.
type streamReader struct {
	t     *testing.T
	r     *wire.Reader
	words []uint64
	seq   uint64
	f     wire.Frame
}

func openStream(t *testing.T, base, pool string, consumer, lane, epoch uint64) (*streamReader, *http.Response) {
	t.Helper()
	resp, err := http.Get(fmt.Sprintf("%s/v1/pools/%s/stream?consumer=%d&lane=%d&epoch=%d", base, pool, consumer, lane, epoch))
	require.NoError(t, err)
	t.Cleanup(func() { resp.Body.Close() })
	return &streamReader{t: t, r: wire.NewReader(resp.Body, 0)}, resp
}

// next reads one frame, applying snapshot chunks and deltas to the table.
func (s *streamReader) next() wire.Kind {
	s.t.Helper()
	require.NoError(s.t, s.r.ReadFrame(&s.f), "read frame")
	switch s.f.Kind {
	case wire.KindSnapshotChunk:
		c := s.f.Snapshot
		if s.words == nil {
			s.words = make([]uint64, c.Identity.Format.BucketCount)
		}
		copy(s.words[c.BucketOffset:], c.Words)
		s.seq = c.Sequence
	case wire.KindDelta:
		require.Equal(s.t, s.seq, s.f.Delta.BaseSequence, "delta base sequence vs the held sequence")
		for _, im := range s.f.Delta.Images {
			s.words[im.Bucket] = im.Word
		}
		s.seq = s.f.Delta.Sequence
	}
	return s.f.Kind
}

func (s *streamReader) contains(format ckf.Format, key uint64) bool {
	ad := format.Addresser().Address(key)
	return ckf.Bucket(s.words[ad.A]).Contains(ad.Fingerprint) || ckf.Bucket(s.words[ad.B]).Contains(ad.Fingerprint)
}

func TestServer_EventsReachRemoteSubscriber(t *testing.T) {
	s, ts := startTestServer(t, testConfig())
	sr, resp := openStream(t, ts.URL, "dc-a", 9, 0, 1)
	require.Equal(t, http.StatusOK, resp.StatusCode, "stream status")
	require.Equal(t, FramesContentType, resp.Header.Get("Content-Type"), "stream content type")
	require.Equal(t, wire.KindSnapshotChunk, sr.next(), "first frame")
	var chains [][]uint64
	for i := range 3 {
		ev, chain := chainJSON(uint64(i+1), uint64(i+1), 5)
		chains = append(chains, chain)
		code, body := post(t, ts.URL+"/v1/pools/dc-a/events?source_epoch=1", "application/json", "["+ev+"]")
		require.Equal(t, http.StatusAccepted, code, "post events: %v", body)
	}
	format := s.pools["dc-a"].actor().Identity().Format
	deadline := time.Now().Add(5 * time.Second)
	for {
		all := true
		for _, c := range chains {
			for _, h := range c {
				all = all && sr.words != nil && sr.contains(format, h)
			}
		}
		if all {
			break
		}
		require.False(t, time.Now().After(deadline), "remote subscriber never saw every stored block")
		sr.next()
	}
	occupied := 0
	for _, w := range sr.words {
		occupied += ckf.Bucket(w).Occupied()
	}
	assert.Equal(t, 15, occupied, "fingerprints in the remote table")
}

func TestServer_BadInputGetsClearErrorsAndChangesNothing(t *testing.T) {
	_, ts := startTestServer(t, testConfig())
	ev, _ := chainJSON(1, 1, 3)
	big, _ := chainJSON(1, 2, 65)
	nine := strings.TrimSuffix(strings.Repeat(ev+",", 9), ",")
	cases := []struct {
		name, method, path, ctype, body string
		status                          int
		code                            string
	}{
		{"bad json", "POST", "/v1/pools/dc-a/events?source_epoch=1", "application/json", `[{"worker_id": "x"}]`, 400, CodeMalformedEvents},
		{"not an array", "POST", "/v1/pools/dc-a/events?source_epoch=1", "application/json", `{}`, 400, CodeMalformedEvents},
		{"unknown pool", "POST", "/v1/pools/nope/events?source_epoch=1", "application/json", "[" + ev + "]", 404, CodeUnknownPool},
		{"missing epoch", "POST", "/v1/pools/dc-a/events", "application/json", "[" + ev + "]", 400, CodeBadRequest},
		{"bad epoch", "POST", "/v1/pools/dc-a/events?source_epoch=-1", "application/json", "[" + ev + "]", 400, CodeBadRequest},
		{"too many events", "POST", "/v1/pools/dc-a/events?source_epoch=1", "application/json", "[" + nine + "]", 413, CodeLimitExceeded},
		{"too many blocks", "POST", "/v1/pools/dc-a/events?source_epoch=1", "application/json", "[" + big + "]", 413, CodeLimitExceeded},
		{"media type", "POST", "/v1/pools/dc-a/events?source_epoch=1", "text/plain", "[]", 415, CodeUnsupportedMedia},
		{"bad msgpack", "POST", "/v1/pools/dc-a/events?source_epoch=1", "application/msgpack", "\x93\x01", 400, CodeMalformedEvents},
		{"lane out of range", "GET", "/v1/pools/dc-a/stream?consumer=1&lane=16&epoch=1", "", "", 400, CodeBadRequest},
		{"lease missing epoch", "GET", "/v1/pools/dc-a/stream?consumer=1&lane=0", "", "", 400, CodeBadRequest},
		{"reset missing worker", "POST", "/v1/pools/dc-a/ranks/reset", "application/json", `{"source_epoch": 1}`, 400, CodeBadRequest},
		{"reset unknown key", "POST", "/v1/pools/dc-a/ranks/reset", "application/json", `{"worker_id": 1, "source_epoch": 1, "x": 1}`, 400, CodeBadRequest},
		{"replace empty", "POST", "/v1/pools/dc-a/ranks/replace", "application/json", `{"ranks": []}`, 400, CodeBadRequest},
		{"replace non-stored", "POST", "/v1/pools/dc-a/ranks/replace", "application/json",
			`{"ranks": [{"worker_id": 1, "source_epoch": 1, "events": [{"worker_id": 1, "event": {"event_id": 1, "data": "cleared"}}]}]}`, 422, CodeInvalidRanks},
		{"no route", "GET", "/v2/nothing", "", "", 404, CodeNotFound},
		{"wrong method", "GET", "/v1/pools/dc-a/events", "", "", 405, CodeMethodNotAllowed},
		{"wrong method on catalog", "DELETE", "/v1/pools", "", "", 405, CodeMethodNotAllowed},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req, err := http.NewRequest(c.method, ts.URL+c.path, strings.NewReader(c.body))
			require.NoError(t, err)
			if c.ctype != "" {
				req.Header.Set("Content-Type", c.ctype)
			}
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			defer resp.Body.Close()
			var body map[string]any
			_ = json.NewDecoder(resp.Body).Decode(&body)
			assert.Equal(t, c.status, resp.StatusCode, "%s %s status (%v)", c.method, c.path, body)
			assert.Equal(t, c.code, errCode(body), "%s %s error code (%v)", c.method, c.path, body)
		})
	}
	// Nothing above changed the pool.
	resp, err := http.Get(ts.URL + "/v1/pools")
	require.NoError(t, err)
	defer resp.Body.Close()
	var cat struct {
		Pools []catalogPool `json:"pools"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&cat))
	require.NotEmpty(t, cat.Pools)
	st := cat.Pools[0].Stats
	require.NotNil(t, st, "catalog stats")
	assert.Equal(t, 0, st.UniqueBlocks, "pool changed by rejected requests: unique blocks")
	assert.Equal(t, 0, st.Members, "pool changed by rejected requests: members")
}

func TestServer_StaleEpochs(t *testing.T) {
	_, ts := startTestServer(t, testConfig())
	code, body := post(t, ts.URL+"/v1/pools/dc-a/ranks/reset", "application/json", `{"worker_id": 1, "source_epoch": 5}`)
	require.Equal(t, http.StatusOK, code, "reset at epoch 5: %v", body)
	code, body = post(t, ts.URL+"/v1/pools/dc-a/ranks/reset", "application/json", `{"worker_id": 1, "source_epoch": 3}`)
	assert.Equal(t, http.StatusConflict, code, "reset at older epoch: status (%v)", body)
	assert.Equal(t, CodeStaleEpoch, errCode(body), "reset at older epoch: error code (%v)", body)
	_, resp := openStream(t, ts.URL, "dc-a", 4, 2, 7)
	require.Equal(t, http.StatusOK, resp.StatusCode, "first stream")
	resp.Body.Close()
	resp2, err := http.Get(ts.URL + "/v1/pools/dc-a/stream?consumer=4&lane=2&epoch=7")
	require.NoError(t, err)
	defer resp2.Body.Close()
	var b map[string]any
	_ = json.NewDecoder(resp2.Body).Decode(&b)
	assert.Equal(t, http.StatusConflict, resp2.StatusCode, "same lease epoch again: status (%v)", b)
	assert.Equal(t, CodeStaleLease, errCode(b), "same lease epoch again: error code (%v)", b)
}

func TestServer_AuthOnEveryEndpointButHealth(t *testing.T) {
	cfg := testConfig()
	cfg.AuthToken = "s3cret"
	_, ts := startTestServer(t, cfg)
	for _, path := range []string{"/v1/pools", "/metrics", "/readyz", "/v1/pools/dc-a/stream?consumer=1&lane=0&epoch=1"} {
		resp, err := http.Get(ts.URL + path)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusUnauthorized, resp.StatusCode, "GET %s without token", path)
	}
	req, err := http.NewRequest("GET", ts.URL+"/v1/pools", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer s3cret")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode, "with token")
	resp, err = http.Get(ts.URL + "/healthz")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode, "healthz without token")
}

func TestServer_ShutdownEndsStreamsWithDrainMarkerAndClose(t *testing.T) {
	s, ts := startTestServer(t, testConfig())
	sr, _ := openStream(t, ts.URL, "dc-b", 1, 0, 1)
	sr.next() // snapshot
	ev, _ := chainJSON(3, 3, 4)
	code, body := post(t, ts.URL+"/v1/pools/dc-b/events?source_epoch=1", "application/json", "["+ev+"]")
	require.Equal(t, http.StatusAccepted, code, "post: %v", body)
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		done <- s.Shutdown(ctx)
	}()
	var marker *ckf.DrainMarker
	for {
		switch sr.next() {
		case wire.KindDrainMarker:
			m := sr.f.Drain
			marker = &m
		case wire.KindClose:
			require.Equal(t, wire.CloseShuttingDown, sr.f.Close.Reason, "close reason")
			require.NotNil(t, marker, "no drain marker before the close frame")
			assert.Equal(t, sr.seq, marker.ExpectedSequence, "drain marker's expected sequence vs the held sequence")
			assert.NotZero(t, sr.seq, "the admitted event's tail was never published before close")
			require.NoError(t, <-done, "Shutdown")
			return
		}
	}
}

func TestParsePoolFlag(t *testing.T) {
	p, err := ParsePoolFlag("east:dc=3,expected=1000,seed=0x10,cadence=4,delay=2ms,kicks=100")
	require.NoError(t, err)
	assert.Equal(t, "east", p.Name, "Name")
	assert.Equal(t, uint64(3), p.DCID, "DCID")
	assert.Equal(t, uint64(1000), p.ExpectedBlocks, "ExpectedBlocks")
	if assert.NotNil(t, p.Seed, "Seed") {
		assert.Equal(t, uint64(16), *p.Seed, "Seed")
	}
	assert.Equal(t, uint64(4), p.PublishEveryNEvents, "PublishEveryNEvents")
	assert.Equal(t, 2*time.Millisecond, time.Duration(p.PublicationDelay), "PublicationDelay")
	assert.Equal(t, 100, p.MaxKicks, "MaxKicks")
	for _, bad := range []string{"east", "east:expected=1", "east:dc=x", "east:dc=1,color=red", "east:dc=1,seed"} {
		_, err := ParsePoolFlag(bad)
		assert.ErrorIs(t, err, ErrInvalidConfig, "ParsePoolFlag(%q)", bad)
	}
}

func TestConfig_Validate(t *testing.T) {
	base := testConfig()
	cases := map[string]func(c *Config){
		"no pools":       func(c *Config) { c.Pools = nil },
		"dup name":       func(c *Config) { c.Pools[1].Name = "dc-a" },
		"dup dc":         func(c *Config) { c.Pools[1].DCID = 1 },
		"bad name":       func(c *Config) { c.Pools[0].Name = "DC A" },
		"half tls":       func(c *Config) { c.TLSCertFile = "x" },
		"kicks":          func(c *Config) { c.Pools[0].MaxKicks = 5000 },
		"tiny frame cap": func(c *Config) { c.MaxFrameBytes = 10 },
		"lease records":  func(c *Config) { c.MaxSubscribers, c.MaxLeaseRecords = 100, 50 },
	}
	for name, mutate := range cases {
		c := base
		c.Pools = append([]PoolSpec(nil), base.Pools...)
		mutate(&c)
		assert.ErrorIs(t, c.WithDefaults().Validate(), ErrInvalidConfig, name)
	}
	assert.NoError(t, base.WithDefaults().Validate(), "base config")
}

// Shutdown returns only after every pool's hub feeder and fault drainer
// ended, and closes every stream handler's subscription.
func TestServer_ShutdownEndsPoolGoroutines(t *testing.T) {
	cfg := testConfig()
	s, err := New(cfg, nil)
	require.NoError(t, err)
	ts := httptest.NewServer(s.Handler())
	defer ts.Close()
	sr, _ := openStream(t, ts.URL, "dc-a", 1, 0, 1)
	require.Equal(t, wire.KindSnapshotChunk, sr.next(), "first frame")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, s.Shutdown(ctx), "Shutdown")
	for _, p := range s.order {
		for name, done := range map[string]chan struct{}{"feeder": p.gen().feederDone, "fault drainer": p.gen().faultsDone} {
			select {
			case <-done:
			default:
				assert.Failf(t, "goroutine still running after Shutdown", "pool %s: %s", p.spec.Name, name)
			}
		}
		assert.Zero(t, p.mirror().Stats().Subscribers, "pool %s: subscribers after Shutdown", p.spec.Name)
	}
}

// TestServer_PartialAdmissionSaysHowMany: admission is per event, so a batch
// that fails part way (shutdown, a cancelled request) keeps what was
// admitted; the error body says how many, so a client resends only the rest.
func TestServer_PartialAdmissionSaysHowMany(t *testing.T) {
	s, ts := startTestServer(t, testConfig())
	p := s.pools["dc-a"]
	real := p.admit
	n := 0
	p.admit = func(ctx context.Context, epoch uint64, ev ckf.RouterEvent) error {
		if n++; n > 2 {
			return producer.ErrShuttingDown
		}
		return real(ctx, epoch, ev)
	}
	var evs []string
	for i := range 4 {
		ev, _ := chainJSON(uint64(10+i), uint64(10+i), 2)
		evs = append(evs, ev)
	}
	code, body := post(t, ts.URL+"/v1/pools/dc-a/events?source_epoch=1", "application/json", "["+strings.Join(evs, ",")+"]")
	assert.Equal(t, http.StatusServiceUnavailable, code, "status (%v)", body)
	assert.Equal(t, CodeShuttingDown, errCode(body), "error code (%v)", body)
	assert.Equal(t, float64(2), body["admitted"], "admitted events (%v)", body)
	require.NoError(t, p.actor().Flush(context.Background()))
	st, err := p.actor().Stats(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 4, st.Pool.UniqueBlocks, "pool blocks: want the 2 admitted events' 4")
}
