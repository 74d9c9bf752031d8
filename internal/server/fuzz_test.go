package server

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/wire"
)

// FuzzHandlers drives the ingest and stream handlers with arbitrary query
// strings, content types and bodies. Whatever comes in, a handler must not
// panic, must answer with a documented status, and every error must be the
// JSON error shape with a code; nothing may be a 500.
func FuzzHandlers(f *testing.F) {
	ev, _ := chainJSON(1, 1, 3)
	mp, _ := wire.AppendRouterEventsMsgpack(nil, []ckf.RouterEvent{{WorkerID: 2, EventID: 1, Kind: ckf.EventRemoved, BlockHashes: []uint64{1, 2}}})
	seeds := []struct {
		route uint8
		query string
		ctype uint8
		body  []byte
	}{
		{0, "source_epoch=1", 0, []byte("[" + ev + "]")},
		{0, "source_epoch=18446744073709551615", 0, []byte("[" + ev + "]")},
		{0, "source_epoch=1", 1, mp},
		{0, "source_epoch=x", 0, []byte(`[{}]`)},
		{0, "source_epoch=1", 0, []byte(`[{"worker_id":1,"event":{"event_id":2,"data":{"stored":{"parent_hash":null,"start_position":3,"blocks":[{"block_hash":1,"tokens_hash":1}]}}}}]`)},
		{1, "", 0, []byte(`{"ranks": [{"worker_id": 1, "source_epoch": 2, "events": [` + ev + `]}]}`)},
		{2, "", 0, []byte(`{"worker_id": 1, "source_epoch": 3, "degraded": true}`)},
		{2, "", 2, []byte(`{"worker_id": 1}`)},
		{3, "consumer=1&lane=0&epoch=1", 0, nil},
		{3, "consumer=1&lane=99&epoch=1", 0, nil},
		{3, "consumer=1&lane=0&epoch=18446744073709551615", 0, nil},
	}
	for _, s := range seeds {
		f.Add(s.route, s.query, s.ctype, s.body)
	}
	cfg := testConfig()
	cfg.MaxRequestBytes = 64 << 10
	s, err := New(cfg, slog.New(slog.DiscardHandler))
	require.NoError(f, err)
	f.Cleanup(func() { _ = s.Shutdown(context.Background()) })
	h := s.Handler()
	paths := []string{"/v1/pools/dc-a/events", "/v1/pools/dc-a/ranks/replace", "/v1/pools/dc-a/ranks/reset", "/v1/pools/dc-a/stream"}
	ctypes := []string{"application/json", "application/msgpack", "", "text/plain", "application/json; charset=utf-8", "multipart/x;;"}
	allowed := map[int]bool{200: true, 202: true, 400: true, 404: true, 405: true, 409: true, 413: true, 415: true, 422: true, 503: true}

	f.Fuzz(func(t *testing.T, route uint8, query string, ctype uint8, body []byte) {
		path := paths[int(route)%len(paths)]
		method := "POST"
		ctx := context.Background()
		if route%4 == 3 {
			method = "GET"
			// A granted stream ends as soon as its snapshot is written.
			c, cancel := context.WithCancel(ctx)
			cancel()
			ctx = c
		}
		req := httptest.NewRequestWithContext(ctx, method, "/", strings.NewReader(string(body)))
		req.URL.Path, req.URL.RawQuery = path, query
		if ct := ctypes[int(ctype)%len(ctypes)]; ct != "" {
			req.Header.Set("Content-Type", ct)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		// The messages pass req.URL and rec.Body (pointers, formatted only
		// on failure), so a passing iteration does not copy the body.
		require.Truef(t, allowed[rec.Code], "%s %v: undocumented status %d: %s", method, req.URL, rec.Code, rec.Body)
		if rec.Code >= 400 {
			var e struct {
				Error struct{ Code, Message string } `json:"error"`
			}
			require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &e), "%s %v: %d with body %s", method, req.URL, rec.Code, rec.Body)
			require.NotEmpty(t, e.Error.Code, "%s %v: %d with body %s", method, req.URL, rec.Code, rec.Body)
			require.NotEqual(t, CodeInternal, e.Error.Code, "%s %v: %d with body %s", method, req.URL, rec.Code, rec.Body)
		}
		if rec.Code == http.StatusOK && method == "GET" {
			require.Equal(t, FramesContentType, rec.Header().Get("Content-Type"), "stream answered 200")
		}
	})
}
