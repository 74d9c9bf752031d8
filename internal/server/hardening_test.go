package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/wire"
)

// serveReal runs s.Serve on a loopback listener (the http.Server settings:
// timeouts, connection bound, and TLS when cfg names a key pair) and returns
// its base URL (https:// under TLS, else http://) and address. Cleanup shuts
// it down and requires Serve to have returned nil.
func serveReal(t *testing.T, cfg Config) (*Server, string, string) {
	t.Helper()
	s, err := New(cfg, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.Shutdown(ctx)
		require.NoError(t, <-done, "Serve")
	})
	scheme := "http://"
	if cfg.TLSCertFile != "" {
		scheme = "https://"
	}
	return s, scheme + ln.Addr().String(), ln.Addr().String()
}

// serveOnce sends one request to h in process and returns the recorder.
func serveOnce(h http.Handler, method, target, ctype string, body []byte) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, target, bytes.NewReader(body))
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

func recCode(t *testing.T, rec *httptest.ResponseRecorder) string {
	t.Helper()
	var body map[string]any
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body), rec.Body.String())
	return errCode(body)
}

// allocatedBy returns the bytes allocated (by every goroutine) while f runs.
func allocatedBy(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

func TestServer_HostileBatchCostsWhatTheLimitsJustify(t *testing.T) {
	if testing.Short() {
		t.Skip("builds 16 MiB bodies")
	}
	cfg := testConfig()
	cfg.MaxEventsPerBatch, cfg.MaxBlocksPerEvent = 64, 64
	s, _ := startTestServer(t, cfg)
	h := s.Handler()

	// The largest batch the limits admit, as JSON: what a request may cost
	// beyond its body.
	full := make([]ckf.RouterEvent, cfg.MaxEventsPerBatch)
	for i := range full {
		full[i] = ckf.RouterEvent{WorkerID: 1, EventID: uint64(i), Kind: ckf.EventStored}
		for j := range cfg.MaxBlocksPerEvent {
			full[i].Blocks = append(full[i].Blocks, ckf.StoredBlock{BlockHash: uint64(i<<8 | j), TokensHash: uint64(j)})
		}
	}
	justified, err := wire.AppendRouterEventsJSON(nil, full)
	require.NoError(t, err)

	const size = 16 << 20 // the default max_request_bytes
	var b bytes.Buffer
	bodies := map[string]struct {
		ctype  string
		body   []byte
		status int
	}{}
	b.WriteByte('[')
	for b.Len() < size-8 {
		b.WriteString("{},")
	}
	b.WriteString("{}]")
	bodies["json: millions of empty objects"] = struct {
		ctype  string
		body   []byte
		status int
	}{"application/json", bytes.Clone(b.Bytes()), 400}
	b.Reset()
	ev := `{"worker_id":1,"event":{"event_id":1,"data":"cleared"}}`
	b.WriteByte('[')
	for b.Len() < size-len(ev)-8 {
		b.WriteString(ev + ",")
	}
	b.WriteString(ev + "]")
	bodies["json: too many events"] = struct {
		ctype  string
		body   []byte
		status int
	}{"application/json", bytes.Clone(b.Bytes()), 413}
	b.Reset()
	b.WriteString(`[{"worker_id":1,"event":{"event_id":1,"data":{"removed":{"block_hashes":[`)
	for b.Len() < size-16 {
		b.WriteString("7,")
	}
	b.WriteString("7]}}}}]")
	bodies["json: millions of hashes"] = struct {
		ctype  string
		body   []byte
		status int
	}{"application/json", bytes.Clone(b.Bytes()), 413}
	one, err := wire.AppendRouterEventsMsgpack(nil, []ckf.RouterEvent{{WorkerID: 1, Kind: ckf.EventRemoved, BlockHashes: []uint64{1}}})
	require.NoError(t, err)
	m := append(bytes.Clone(one[:len(one)-2]), 0xdd)
	const hashes = size - 64
	m = binary.BigEndian.AppendUint32(m, hashes)
	m = append(m, bytes.Repeat([]byte{0x07}, hashes)...)
	bodies["msgpack: millions of hashes"] = struct {
		ctype  string
		body   []byte
		status int
	}{"application/msgpack", m, 413}

	for name, c := range bodies {
		t.Run(name, func(t *testing.T) {
			var rec *httptest.ResponseRecorder
			n := allocatedBy(func() {
				rec = serveOnce(h, "POST", "/v1/pools/dc-a/events?source_epoch=1", c.ctype, c.body)
			})
			assert.Equal(t, c.status, rec.Code, rec.Body.String())
			// The body buffer itself (max_request_bytes bounds it) plus a
			// small multiple of what the limits justify.
			budget := uint64(len(c.body) + 4*len(justified))
			assert.LessOrEqual(t, n, budget, "a %d-byte hostile body allocated %d bytes (budget %d)", len(c.body), n, budget)
		})
	}
}

func TestServer_IngestConcurrencyIsBounded(t *testing.T) {
	cfg := testConfig()
	cfg.MaxConcurrentIngest = 1
	s, _ := startTestServer(t, cfg)
	h := s.Handler()

	// The first request holds the only slot while its body trickles in
	// (it takes the slot once its first byte has arrived).
	pr, pw := io.Pipe()
	first := make(chan *httptest.ResponseRecorder)
	go func() { _, _ = pw.Write([]byte(`[`)) }()
	go func() {
		req := httptest.NewRequest("POST", "/v1/pools/dc-a/events?source_epoch=1", pr)
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		first <- rec
	}()
	require.Eventually(t, func() bool { return len(s.ingestSlots) == 1 }, 5*time.Second, time.Millisecond)

	for _, path := range []string{"/v1/pools/dc-a/events?source_epoch=1", "/v1/pools/dc-a/ranks/reset"} {
		rec := serveOnce(h, "POST", path, "application/json", []byte(`[]`))
		assert.Equal(t, http.StatusServiceUnavailable, rec.Code)
		assert.Equal(t, CodeOverloaded, recCode(t, rec))
		assert.Equal(t, "1", rec.Header().Get("Retry-After"))
	}
	// Reads are not ingest: the catalog still answers.
	assert.Equal(t, http.StatusOK, serveOnce(h, "GET", "/v1/pools", "", nil).Code)

	_, err := pw.Write([]byte(`]`))
	require.NoError(t, err)
	require.NoError(t, pw.Close())
	assert.Equal(t, http.StatusAccepted, (<-first).Code)
	assert.Equal(t, http.StatusAccepted, serveOnce(h, "POST", "/v1/pools/dc-a/events?source_epoch=1", "application/json", []byte(`[]`)).Code,
		"the slot is free again")
}

// rawRequest writes req on a fresh connection to addr and returns the
// connection and a reader of its responses.
func rawRequest(t *testing.T, addr, req string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	_, err = io.WriteString(c, req)
	require.NoError(t, err)
	return c, bufio.NewReader(c)
}

func TestServer_TrickledBodyIsCut(t *testing.T) {
	cfg := testConfig()
	cfg.BodyReadTimeout = Duration(200 * time.Millisecond)
	cfg.MinBodyRate = 1024
	s, _, addr := serveReal(t, cfg)
	c, br := rawRequest(t, addr, "POST /v1/pools/dc-a/events?source_epoch=1 HTTP/1.1\r\nHost: x\r\n"+
		"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n[")
	// One byte, then silence (a client trickling 1 byte / 5 s is no faster).
	start := time.Now()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err, "the relay must answer a stalled body, not wait for it")
	body, _ := io.ReadAll(resp.Body)
	assert.Equal(t, http.StatusRequestTimeout, resp.StatusCode, string(body))
	assert.Contains(t, string(body), CodeRequestTimeout)
	assert.Less(t, time.Since(start), 3*time.Second)
	// The connection is closed after the 408.
	_, err = br.ReadByte()
	assert.ErrorIs(t, err, io.EOF)
	// The slot was released.
	assert.Zero(t, len(s.ingestSlots))
}

func TestServer_IdleAndHeaderTimeoutsCloseConnections(t *testing.T) {
	cfg := testConfig()
	cfg.IdleTimeout = Duration(200 * time.Millisecond)
	cfg.ReadHeaderTimeout = Duration(200 * time.Millisecond)
	_, _, addr := serveReal(t, cfg)

	t.Run("idle keep-alive", func(t *testing.T) {
		c, br := rawRequest(t, addr, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
		require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
		resp, err := http.ReadResponse(br, nil)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		assert.Equal(t, http.StatusOK, resp.StatusCode)
		_, err = br.ReadByte()
		assert.ErrorIs(t, err, io.EOF, "an idle keep-alive connection must be closed")
	})
	t.Run("silent headers", func(t *testing.T) {
		c, br := rawRequest(t, addr, "GET /healthz HTTP/1.1\r\nHost: x\r\n")
		require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
		_, err := io.ReadAll(br) // whatever the server says, it must hang up
		assert.NoError(t, err, "the connection must end before the test's deadline")
	})
}

func TestServer_ConnectionsAreBounded(t *testing.T) {
	cfg := testConfig()
	cfg.MaxConnections = 2
	s, _, addr := serveReal(t, cfg)
	var held []net.Conn
	for range 2 {
		// Busy: a request whose body is still arriving.
		c, _ := rawRequest(t, addr, "POST /v1/pools/dc-a/events?source_epoch=1 HTTP/1.1\r\nHost: x\r\n"+
			"Content-Type: application/json\r\nContent-Length: 10\r\n\r\n[")
		held = append(held, c) // each holds one of the two
	}
	require.Eventually(t, func() bool { return len(s.ingestSlots) == 2 }, 5*time.Second, time.Millisecond)
	c, br := rawRequest(t, addr, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
	require.NoError(t, c.SetReadDeadline(time.Now().Add(300*time.Millisecond)))
	_, err := br.ReadByte()
	require.Error(t, err, "a third connection must not be served while two are busy")
	var ne net.Error
	require.ErrorAs(t, err, &ne)
	require.True(t, ne.Timeout())

	held[0].Close()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err, "served once a connection closed")
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
}

func TestServer_StreamOutlivesRequestTimeouts(t *testing.T) {
	cfg := testConfig()
	cfg.IdleTimeout = Duration(50 * time.Millisecond)
	cfg.ReadHeaderTimeout = Duration(50 * time.Millisecond)
	cfg.BodyReadTimeout = Duration(50 * time.Millisecond)
	cfg.HeartbeatInterval = Duration(10 * time.Millisecond)
	_, base, _ := serveReal(t, cfg)
	sr, resp := openStream(t, base, "dc-a", 1, 0, 1)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, wire.KindSnapshotChunk, sr.next())
	deadline := time.Now().Add(500 * time.Millisecond) // 10× every timeout above
	beats := 0
	for time.Now().Before(deadline) {
		if sr.next() == wire.KindHeartbeat {
			beats++
		}
	}
	assert.Greater(t, beats, 10)
}

func TestServer_EpochsCannotLockOut(t *testing.T) {
	_, ts := startTestServer(t, testConfig())
	ev, _ := chainJSON(1, 1, 2)
	u := ts.URL + "/v1/pools/dc-a/events?source_epoch="

	// A source epoch at the top of the range is refused, not recorded ...
	code, body := post(t, u+strconv.FormatUint(math.MaxUint64, 10), "application/json", "["+ev+"]")
	assert.Equal(t, http.StatusBadRequest, code)
	assert.Equal(t, CodeEpochOutOfRange, errCode(body))
	for _, path := range []string{"/v1/pools/dc-a/ranks/reset"} {
		code, body := post(t, ts.URL+path, "application/json", `{"worker_id": 1, "source_epoch": 18446744073709551615}`)
		assert.Equal(t, http.StatusBadRequest, code)
		assert.Equal(t, CodeEpochOutOfRange, errCode(body))
	}
	code, body = post(t, ts.URL+"/v1/pools/dc-a/ranks/replace", "application/json",
		`{"ranks": [{"worker_id": 1, "source_epoch": 18446744073709551615, "events": []}]}`)
	assert.Equal(t, http.StatusBadRequest, code)
	assert.Equal(t, CodeEpochOutOfRange, errCode(body))

	// ... so the worker's own epochs still work.
	code, body = post(t, u+"1", "application/json", "["+ev+"]")
	require.Equal(t, http.StatusAccepted, code, body)
	code, body = post(t, ts.URL+"/v1/pools/dc-a/ranks/reset", "application/json", `{"worker_id": 1, "source_epoch": 2}`)
	require.Equal(t, http.StatusOK, code, body)
	// Within max_source_epoch_jump of the current epoch is fine.
	code, body = post(t, ts.URL+"/v1/pools/dc-a/ranks/reset", "application/json",
		fmt.Sprintf(`{"worker_id": 1, "source_epoch": %d}`, uint64(2+DefaultSourceEpochJump)))
	require.Equal(t, http.StatusOK, code, body)

	// A lease epoch far ahead of the clock is refused; a clock reading works.
	resp, err := http.Get(ts.URL + "/v1/pools/dc-a/stream?consumer=9&lane=0&epoch=18446744073709551615")
	require.NoError(t, err)
	var b map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&b)
	resp.Body.Close()
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	assert.Equal(t, CodeEpochOutOfRange, errCode(b))
	_, resp = openStream(t, ts.URL, "dc-a", 9, 0, uint64(time.Now().UnixNano()))
	assert.Equal(t, http.StatusOK, resp.StatusCode)
}

func catalogOf(t *testing.T, base string) []catalogPool {
	t.Helper()
	resp, err := http.Get(base + "/v1/pools")
	require.NoError(t, err)
	defer resp.Body.Close()
	var cat struct {
		Pools []catalogPool `json:"pools"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&cat))
	return cat.Pools
}

func metricsText(t *testing.T, base string) string {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(b)
}

func TestServer_InvalidEventsRefusedBeforeAdmission(t *testing.T) {
	_, ts := startTestServer(t, testConfig())
	u := ts.URL + "/v1/pools/dc-a/events?source_epoch="
	good, _ := chainJSON(1, 1, 2)
	dup := `{"worker_id": 1, "event": {"event_id": 2, "data": {"stored": {"parent_hash": null, "blocks": [` +
		`{"block_hash": 5, "tokens_hash": 6}, {"block_hash": 5, "tokens_hash": 7}]}}}}`
	root := `{"worker_id": 1, "event": {"event_id": 3, "data": {"stored": {"parent_hash": null, "start_position": 16, "blocks": [` +
		`{"block_hash": 8, "tokens_hash": 9}]}}}}`
	tests := []struct {
		name, body    string
		code, mention string
	}{
		{"duplicate block hash", "[" + good + "," + dup + "]", CodeInvalidEvent, "event 1"},
		{"root with start_position", "[" + good + "," + good + "," + root + "]", CodeInvalidEvent, "event 2"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, body := post(t, u+"1", "application/json", tc.body)
			assert.Equal(t, http.StatusBadRequest, code)
			assert.Equal(t, tc.code, errCode(body))
			assert.Contains(t, fmt.Sprint(body), tc.mention)
		})
	}
	st := catalogOf(t, ts.URL)[0].Stats
	require.NotNil(t, st)
	assert.Zero(t, st.Members, "refused batches admitted nothing")

	// Epoch 1 is recorded by the first admitted event; a batch at epoch 2
	// nobody announced is refused, naming the event.
	code, body := post(t, u+"1", "application/json", "["+good+"]")
	require.Equal(t, http.StatusAccepted, code, body)
	require.Eventually(t, func() bool { return catalogOf(t, ts.URL)[0].Stats.Members == 1 }, 5*time.Second, time.Millisecond)
	other, _ := chainJSON(2, 2, 1)
	code, body = post(t, u+"2", "application/json", "["+other+","+good+"]")
	assert.Equal(t, http.StatusBadRequest, code)
	assert.Equal(t, CodeUnannounced, errCode(body))
	assert.Contains(t, fmt.Sprint(body), "event 1")
}

func TestServer_DroppedEventsAreCounted(t *testing.T) {
	_, ts := startTestServer(t, testConfig())
	code, body := post(t, ts.URL+"/v1/pools/dc-a/ranks/reset", "application/json", `{"worker_id": 1, "source_epoch": 5}`)
	require.Equal(t, http.StatusOK, code, body)
	ev, _ := chainJSON(1, 1, 2)
	code, body = post(t, ts.URL+"/v1/pools/dc-a/events?source_epoch=4", "application/json", "["+ev+","+ev+","+ev+"]")
	require.Equal(t, http.StatusAccepted, code, body) // late events of a replaced incarnation
	require.Eventually(t, func() bool { return catalogOf(t, ts.URL)[0].Stats.StaleEventsDropped == 3 }, 5*time.Second, time.Millisecond)
	assert.Contains(t, metricsText(t, ts.URL), `ckfrelay_events_dropped_total{pool="dc-a",reason="stale_source_epoch"} 3`)
}

// lockedBuffer is a log sink safe for concurrent writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func TestServer_FaultLogsAreRateLimitedCountsExact(t *testing.T) {
	var logs lockedBuffer
	s, err := New(testConfig(), slog.New(slog.NewTextHandler(&logs, nil)))
	require.NoError(t, err)
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(func() {
		_ = s.Shutdown(context.Background())
		ts.Close()
	})
	// A Stored event naming a parent the worker never stored: a
	// SourceProtocol fault only the actor can see.
	orphan := `{"worker_id": 1, "event": {"event_id": 1, "data": {"stored": {"parent_hash": 99, "blocks": [{"block_hash": 1, "tokens_hash": 2}]}}}}`
	batch := "[" + strings.TrimSuffix(strings.Repeat(orphan+",", 8), ",") + "]"
	const faults = 64
	for range faults / 8 {
		code, body := post(t, ts.URL+"/v1/pools/dc-a/events?source_epoch=1", "application/json", batch)
		require.Equal(t, http.StatusAccepted, code, body)
	}
	require.Eventually(t, func() bool {
		return strings.Contains(metricsText(t, ts.URL), `ckfrelay_faults_total{category="SourceProtocol",pool="dc-a"} 64`)
	}, 5*time.Second, time.Millisecond)
	assert.EqualValues(t, faults, catalogOf(t, ts.URL)[0].Stats.Faults)
	// First, 2nd, 4th, …, 64th: 7 lines for 64 faults.
	assert.Equal(t, 7, strings.Count(logs.String(), `msg="pool fault"`))
}

func TestServer_MetricsHaveRuntimeCollectors(t *testing.T) {
	_, ts := startTestServer(t, testConfig())
	text := metricsText(t, ts.URL)
	for _, name := range []string{"go_goroutines", "go_memstats_heap_alloc_bytes", "process_resident_memory_bytes", "process_open_fds"} {
		assert.Contains(t, text, "\n"+name+" ", name)
	}
}

func TestServer_RecoveryCommandsNeedJSON(t *testing.T) {
	_, ts := startTestServer(t, testConfig())
	for _, path := range []string{"/v1/pools/dc-a/ranks/reset", "/v1/pools/dc-a/ranks/replace"} {
		for _, ctype := range []string{"", "text/plain", "application/msgpack", "application/json; charset=utf-8"} {
			req, err := http.NewRequest("POST", ts.URL+path, strings.NewReader(`{"worker_id": 1, "source_epoch": 1, "ranks": []}`))
			require.NoError(t, err)
			if ctype != "" {
				req.Header.Set("Content-Type", ctype)
			}
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			var body map[string]any
			_ = json.NewDecoder(resp.Body).Decode(&body)
			resp.Body.Close()
			if strings.HasPrefix(ctype, "application/json") {
				assert.NotEqual(t, http.StatusUnsupportedMediaType, resp.StatusCode, "%s %q", path, ctype)
				continue
			}
			assert.Equal(t, http.StatusUnsupportedMediaType, resp.StatusCode, "%s %q", path, ctype)
			assert.Equal(t, CodeUnsupportedMedia, errCode(body))
		}
	}
}

func TestServer_BearerSchemeIsCaseInsensitive(t *testing.T) {
	cfg := testConfig()
	cfg.AuthToken = "s3cret"
	_, ts := startTestServer(t, cfg)
	for header, want := range map[string]int{
		"Bearer s3cret": 200, "bearer s3cret": 200, "BEARER s3cret": 200, "bEaReR  s3cret": 200,
		"Bearer s3cre": 401, "Bearer s3crett": 401, "Basic s3cret": 401, "Bearers3cret": 401, "s3cret": 401, "": 401,
	} {
		req, err := http.NewRequest("GET", ts.URL+"/v1/pools", nil)
		require.NoError(t, err)
		if header != "" {
			req.Header.Set("Authorization", header)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, want, resp.StatusCode, "Authorization: %q", header)
	}
}

func TestConfig_AuthTokenFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "token")
	require.NoError(t, os.WriteFile(file, []byte("  t0ken\n"), 0o600))
	cfg := testConfig()
	cfg.AuthTokenFile = file
	_, ts := startTestServer(t, cfg)
	req, err := http.NewRequest("GET", ts.URL+"/v1/pools", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer t0ken")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	resp, err = http.Get(ts.URL + "/v1/pools")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)

	empty := filepath.Join(dir, "empty")
	require.NoError(t, os.WriteFile(empty, []byte("\n"), 0o600))
	for name, mutate := range map[string]func(*Config){
		"missing file": func(c *Config) { c.AuthTokenFile = filepath.Join(dir, "nope") },
		"empty file":   func(c *Config) { c.AuthTokenFile = empty },
		"both":         func(c *Config) { c.AuthTokenFile, c.AuthToken = file, "x" },
	} {
		cfg := testConfig()
		mutate(&cfg)
		_, err := New(cfg, nil)
		assert.ErrorIs(t, err, ErrInvalidConfig, name)
	}
}

func TestServer_HostileReplaceIsRefusedEarly(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a 16 MiB body")
	}
	s, _ := startTestServer(t, testConfig()) // max_events_per_batch 8: at most 8 ranks
	var b bytes.Buffer
	b.WriteString(`{"ranks": [`)
	for b.Len() < 16<<20-8 {
		b.WriteString(`{},`)
	}
	b.WriteString(`{}]}`)
	var rec *httptest.ResponseRecorder
	n := allocatedBy(func() {
		rec = serveOnce(s.Handler(), "POST", "/v1/pools/dc-a/ranks/replace", "application/json", b.Bytes())
	})
	assert.Equal(t, http.StatusRequestEntityTooLarge, rec.Code, rec.Body.String())
	assert.Equal(t, CodeLimitExceeded, recCode(t, rec))
	// The body buffer plus a little: not one struct per listed rank.
	assert.LessOrEqual(t, n, uint64(b.Len()+1<<20), "allocated %d bytes for a %d-byte body", n, b.Len())

	// Within the bound, ranks are read as before.
	rec = serveOnce(s.Handler(), "POST", "/v1/pools/dc-a/ranks/replace", "application/json",
		[]byte(`{"ranks": [{"worker_id": 1, "source_epoch": 1, "events": []}, {"worker_id": 2, "source_epoch": 1}]}`))
	assert.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	for _, body := range []string{`{"ranks": [], "x": 1}`, `{"ranks": []} []`, `[]`, `{"ranks": [{"worker_id": 1, "source_epoch": 1, "nope": 1}]}`} {
		rec = serveOnce(s.Handler(), "POST", "/v1/pools/dc-a/ranks/replace", "application/json", []byte(body))
		assert.Equal(t, http.StatusBadRequest, rec.Code, body)
	}
}

// A stream or ingest parameter given twice is refused: which one counts
// would differ between this server (the first) and a proxy in front of it
// (some take the last), so a lane or an epoch could be read two ways.
func TestServer_RepeatedParametersAreRefused(t *testing.T) {
	_, ts := startTestServer(t, testConfig())
	for _, q := range []string{"consumer=9&consumer=10&lane=0&epoch=5", "consumer=9&lane=0&lane=1&epoch=5", "consumer=9&lane=0&epoch=5&epoch=6"} {
		resp, err := http.Get(ts.URL + "/v1/pools/dc-a/stream?" + q)
		require.NoError(t, err)
		var b map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&b)
		resp.Body.Close()
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode, q)
		assert.Equal(t, CodeBadRequest, errCode(b), q)
	}
	ev, _ := chainJSON(1, 1, 2)
	code, body := post(t, ts.URL+"/v1/pools/dc-a/events?source_epoch=1&source_epoch=2", "application/json", "["+ev+"]")
	assert.Equal(t, http.StatusBadRequest, code)
	assert.Equal(t, CodeBadRequest, errCode(body))
	code, body = post(t, ts.URL+"/v1/pools/dc-a/events?source_epoch=1", "application/json", "["+ev+"]")
	assert.Equal(t, http.StatusAccepted, code, body)
}
