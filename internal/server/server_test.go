package server

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/internal/producer"
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
	s, err := New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
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
	if err != nil {
		t.Fatal(err)
	}
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
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return &streamReader{t: t, r: wire.NewReader(resp.Body, 0)}, resp
}

// next reads one frame, applying snapshot chunks and deltas to the table.
func (s *streamReader) next() wire.Kind {
	s.t.Helper()
	if err := s.r.ReadFrame(&s.f); err != nil {
		s.t.Fatalf("read frame: %v", err)
	}
	switch s.f.Kind {
	case wire.KindSnapshotChunk:
		c := s.f.Snapshot
		if s.words == nil {
			s.words = make([]uint64, c.Identity.Format.BucketCount)
		}
		copy(s.words[c.BucketOffset:], c.Words)
		s.seq = c.Sequence
	case wire.KindDelta:
		if s.f.Delta.BaseSequence != s.seq {
			s.t.Fatalf("delta base %d, held %d", s.f.Delta.BaseSequence, s.seq)
		}
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
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != FramesContentType {
		t.Fatalf("stream: status %d type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	if k := sr.next(); k != wire.KindSnapshotChunk {
		t.Fatalf("first frame %v, want snapshot chunk", k)
	}
	var chains [][]uint64
	for i := range 3 {
		ev, chain := chainJSON(uint64(i+1), uint64(i+1), 5)
		chains = append(chains, chain)
		if code, body := post(t, ts.URL+"/v1/pools/dc-a/events?source_epoch=1", "application/json", "["+ev+"]"); code != http.StatusAccepted {
			t.Fatalf("post events: %d %v", code, body)
		}
	}
	format := s.pools["dc-a"].handle.Identity().Format
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
		if time.Now().After(deadline) {
			t.Fatal("remote subscriber never saw every stored block")
		}
		sr.next()
	}
	occupied := 0
	for _, w := range sr.words {
		occupied += ckf.Bucket(w).Occupied()
	}
	if occupied != 15 {
		t.Fatalf("remote table holds %d fingerprints, want 15", occupied)
	}
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
			req, _ := http.NewRequest(c.method, ts.URL+c.path, strings.NewReader(c.body))
			if c.ctype != "" {
				req.Header.Set("Content-Type", c.ctype)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var body map[string]any
			_ = json.NewDecoder(resp.Body).Decode(&body)
			if resp.StatusCode != c.status || errCode(body) != c.code {
				t.Fatalf("%s %s: %d %q, want %d %q (%v)", c.method, c.path, resp.StatusCode, errCode(body), c.status, c.code, body)
			}
		})
	}
	// Nothing above changed the pool.
	resp, err := http.Get(ts.URL + "/v1/pools")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var cat struct {
		Pools []catalogPool `json:"pools"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&cat); err != nil {
		t.Fatal(err)
	}
	if st := cat.Pools[0].Stats; st == nil || st.UniqueBlocks != 0 || st.Members != 0 {
		t.Fatalf("pool changed by rejected requests: %+v", st)
	}
}

func TestServer_StaleEpochs(t *testing.T) {
	_, ts := startTestServer(t, testConfig())
	if code, body := post(t, ts.URL+"/v1/pools/dc-a/ranks/reset", "application/json", `{"worker_id": 1, "source_epoch": 5}`); code != 200 {
		t.Fatalf("reset at epoch 5: %d %v", code, body)
	}
	code, body := post(t, ts.URL+"/v1/pools/dc-a/ranks/reset", "application/json", `{"worker_id": 1, "source_epoch": 3}`)
	if code != http.StatusConflict || errCode(body) != CodeStaleEpoch {
		t.Fatalf("reset at older epoch: %d %v, want 409 %s", code, body, CodeStaleEpoch)
	}
	_, resp := openStream(t, ts.URL, "dc-a", 4, 2, 7)
	if resp.StatusCode != 200 {
		t.Fatalf("first stream: %d", resp.StatusCode)
	}
	resp.Body.Close()
	resp2, err := http.Get(ts.URL + "/v1/pools/dc-a/stream?consumer=4&lane=2&epoch=7")
	if err != nil {
		t.Fatal(err)
	}
	defer resp2.Body.Close()
	var b map[string]any
	_ = json.NewDecoder(resp2.Body).Decode(&b)
	if resp2.StatusCode != http.StatusConflict || errCode(b) != CodeStaleLease {
		t.Fatalf("same lease epoch again: %d %v, want 409 %s", resp2.StatusCode, b, CodeStaleLease)
	}
}

func TestServer_AuthOnEveryEndpointButHealth(t *testing.T) {
	cfg := testConfig()
	cfg.AuthToken = "s3cret"
	_, ts := startTestServer(t, cfg)
	for _, path := range []string{"/v1/pools", "/metrics", "/readyz", "/v1/pools/dc-a/stream?consumer=1&lane=0&epoch=1"} {
		resp, err := http.Get(ts.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("GET %s without token: %d, want 401", path, resp.StatusCode)
		}
	}
	req, _ := http.NewRequest("GET", ts.URL+"/v1/pools", nil)
	req.Header.Set("Authorization", "Bearer s3cret")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("with token: %d", resp.StatusCode)
	}
	resp, _ = http.Get(ts.URL + "/healthz")
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("healthz without token: %d", resp.StatusCode)
	}
}

func TestServer_ShutdownEndsStreamsWithDrainMarkerAndClose(t *testing.T) {
	s, ts := startTestServer(t, testConfig())
	sr, _ := openStream(t, ts.URL, "dc-b", 1, 0, 1)
	sr.next() // snapshot
	ev, _ := chainJSON(3, 3, 4)
	if code, body := post(t, ts.URL+"/v1/pools/dc-b/events?source_epoch=1", "application/json", "["+ev+"]"); code != 202 {
		t.Fatalf("post: %d %v", code, body)
	}
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
			if sr.f.Close.Reason != wire.CloseShuttingDown {
				t.Fatalf("close reason %q, want shutting_down", sr.f.Close.Reason)
			}
			if marker == nil || marker.ExpectedSequence != sr.seq {
				t.Fatalf("drain marker %+v, held sequence %d", marker, sr.seq)
			}
			if sr.seq == 0 {
				t.Fatal("the admitted event's tail was never published before close")
			}
			if err := <-done; err != nil {
				t.Fatalf("Shutdown: %v", err)
			}
			return
		}
	}
}

func TestParsePoolFlag(t *testing.T) {
	p, err := ParsePoolFlag("east:dc=3,expected=1000,seed=0x10,cadence=4,delay=2ms,kicks=100")
	if err != nil {
		t.Fatal(err)
	}
	if p.Name != "east" || p.DCID != 3 || p.ExpectedBlocks != 1000 || *p.Seed != 16 || p.PublishEveryNEvents != 4 ||
		time.Duration(p.PublicationDelay) != 2*time.Millisecond || p.MaxKicks != 100 {
		t.Fatalf("parsed %+v", p)
	}
	for _, bad := range []string{"east", "east:expected=1", "east:dc=x", "east:dc=1,color=red", "east:dc=1,seed"} {
		if _, err := ParsePoolFlag(bad); err == nil {
			t.Errorf("ParsePoolFlag(%q) accepted", bad)
		}
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
		if err := c.WithDefaults().Validate(); err == nil {
			t.Errorf("%s: Validate accepted", name)
		}
	}
	if err := base.WithDefaults().Validate(); err != nil {
		t.Fatalf("base config: %v", err)
	}
}

// Shutdown returns only after every pool's hub feeder and fault drainer
// ended, and closes every stream handler's subscription.
func TestServer_ShutdownEndsPoolGoroutines(t *testing.T) {
	cfg := testConfig()
	s, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(s.Handler())
	defer ts.Close()
	sr, _ := openStream(t, ts.URL, "dc-a", 1, 0, 1)
	if k := sr.next(); k != wire.KindSnapshotChunk {
		t.Fatalf("first frame %v, want a snapshot chunk", k)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	for _, p := range s.order {
		for name, done := range map[string]chan struct{}{"feeder": p.feederDone, "fault drainer": p.faultsDone} {
			select {
			case <-done:
			default:
				t.Errorf("pool %s: %s still running after Shutdown", p.spec.Name, name)
			}
		}
		if n := p.hub.Stats().Subscribers; n != 0 {
			t.Errorf("pool %s: %d subscribers after Shutdown", p.spec.Name, n)
		}
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
	if code != http.StatusServiceUnavailable || errCode(body) != CodeShuttingDown || body["admitted"] != float64(2) {
		t.Fatalf("got %d %v, want 503 shutting_down with admitted 2", code, body)
	}
	if err := p.handle.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	st, err := p.handle.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.Pool.UniqueBlocks != 4 {
		t.Fatalf("pool holds %d blocks, want the 2 admitted events' 4", st.Pool.UniqueBlocks)
	}
}
