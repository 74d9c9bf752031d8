package server

import (
	"bytes"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/producer"
	"github.com/ckfrelay/ckfrelay/wire"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// FramesContentType is the media type of a frame stream (SPEC §9).
const FramesContentType = "application/vnd.ckfrelay.frames"

// snapshotChunkBytes bounds one snapshot chunk frame on a stream (and so the
// encoding buffer a stream needs for it): 256 KiB is 32,749 buckets a chunk.
const snapshotChunkBytes = 256 << 10

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	routes := []struct {
		method, path string
		h            http.Handler
	}{
		{"GET", "/healthz", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
		})},
		{"GET", "/readyz", s.api(s.handleReady)},
		{"GET", "/metrics", promhttp.HandlerFor(s.m.reg, promhttp.HandlerOpts{})},
		{"GET", "/v1/pools", http.HandlerFunc(s.handleCatalog)},
		{"POST", "/v1/pools/{pool}/events", s.api(s.handleEvents)},
		{"POST", "/v1/pools/{pool}/ranks/replace", s.api(s.handleReplace)},
		{"POST", "/v1/pools/{pool}/ranks/reset", s.api(s.handleReset)},
		{"GET", "/v1/pools/{pool}/stream", s.api(s.handleStream)},
	}
	allowed := map[string][]string{}
	for _, rt := range routes {
		mux.Handle(rt.method+" "+rt.path, rt.h)
		allowed[rt.path] = append(allowed[rt.path], rt.method)
	}
	// The method-less pattern of each path answers other methods with a JSON
	// 405; without it the catch-all below would turn them into 404s.
	for path, methods := range allowed {
		allow := strings.Join(methods, ", ")
		mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Allow", allow)
			s.writeError(w, apiErr(http.StatusMethodNotAllowed, CodeMethodNotAllowed, r.Method+" "+r.URL.Path+" is not allowed; use "+allow))
		})
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.writeError(w, apiErr(http.StatusNotFound, CodeNotFound, "no such endpoint: "+r.Method+" "+r.URL.Path))
	})
	return s.auth(mux)
}

// api adapts a handler that returns its error: a non-nil error, which must
// come before anything is written, becomes the JSON error response.
func (s *Server) api(h func(http.ResponseWriter, *http.Request) error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := h(w, r); err != nil {
			s.writeError(w, err)
		}
	})
}

// auth requires the bearer token on every endpoint but /healthz.
func (s *Server) auth(next http.Handler) http.Handler {
	if s.cfg.AuthToken == "" {
		return next
	}
	want := []byte("Bearer " + s.cfg.AuthToken)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" && subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="ckfrelay"`)
			s.writeError(w, apiErr(http.StatusUnauthorized, CodeUnauthorized, "missing or wrong bearer token"))
			return
		}
		next.ServeHTTP(w, r)
	})
}

func (s *Server) pool(r *http.Request) (*hostedPool, error) {
	name := r.PathValue("pool")
	p, ok := s.pools[name]
	if !ok {
		return nil, apiErr(http.StatusNotFound, CodeUnknownPool, fmt.Sprintf("no pool %q", name))
	}
	return p, nil
}

func (s *Server) handleReady(w http.ResponseWriter, r *http.Request) error {
	if s.stopping.Load() {
		return apiErr(http.StatusServiceUnavailable, CodeShuttingDown, "relay is shutting down")
	}
	for _, p := range s.order {
		if !p.hub.Stats().Ready {
			return apiErr(http.StatusServiceUnavailable, CodeNotReady, "pool "+p.spec.Name+" has no snapshot yet")
		}
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
	return nil
}

func uintParam(r *http.Request, name string, required bool) (uint64, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		if required {
			return 0, apiErr(http.StatusBadRequest, CodeBadRequest, "query parameter "+name+" is required")
		}
		return 0, nil
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return 0, apiErr(http.StatusBadRequest, CodeBadRequest, fmt.Sprintf("query parameter %s=%q is not an unsigned integer", name, v))
	}
	return n, nil
}

// readBody reads a request body within the configured limit.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	return io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxRequestBytes))
}

// decodeEvents decodes a JSON or msgpack array of RouterEvents and checks the
// batch limits. Nothing is admitted unless the whole batch is valid.
func (s *Server) decodeEvents(contentType string, body []byte) ([]ckf.RouterEvent, error) {
	mt := "application/json"
	if contentType != "" {
		var err error
		if mt, _, err = mime.ParseMediaType(contentType); err != nil {
			return nil, apiErr(http.StatusUnsupportedMediaType, CodeUnsupportedMedia, err.Error())
		}
	}
	var evs []ckf.RouterEvent
	var err error
	switch mt {
	case "application/json":
		evs, err = wire.DecodeRouterEventsJSON(body, nil)
	case "application/msgpack", "application/x-msgpack", "application/vnd.msgpack":
		evs, err = wire.DecodeRouterEventsMsgpack(body, nil)
	default:
		return nil, apiErr(http.StatusUnsupportedMediaType, CodeUnsupportedMedia, "events must be application/json or application/msgpack, not "+mt)
	}
	if err != nil {
		return nil, apiErr(http.StatusBadRequest, CodeMalformedEvents, err.Error())
	}
	if err := s.checkEvents(evs); err != nil {
		return nil, err
	}
	return evs, nil
}

func (s *Server) checkEvents(evs []ckf.RouterEvent) error {
	if len(evs) > s.cfg.MaxEventsPerBatch {
		return apiErr(http.StatusRequestEntityTooLarge, CodeLimitExceeded, fmt.Sprintf("%d events in one batch, limit %d", len(evs), s.cfg.MaxEventsPerBatch))
	}
	for i := range evs {
		if n := evs[i].BlockCount(); n > s.cfg.MaxBlocksPerEvent {
			return apiErr(http.StatusRequestEntityTooLarge, CodeLimitExceeded, fmt.Sprintf("event %d names %d blocks, limit %d", i, n, s.cfg.MaxBlocksPerEvent))
		}
	}
	return nil
}

// handleEvents admits a batch of RouterEvents at one source epoch. The batch
// is decoded and checked whole before the first admission.
func (s *Server) handleEvents(w http.ResponseWriter, r *http.Request) error {
	p, err := s.pool(r)
	if err != nil {
		return err
	}
	epoch, err := uintParam(r, "source_epoch", true)
	if err != nil {
		return err
	}
	body, err := s.readBody(w, r)
	if err != nil {
		return err
	}
	evs, err := s.decodeEvents(r.Header.Get("Content-Type"), body)
	if err != nil {
		return err
	}
	if s.stopping.Load() {
		return apiErr(http.StatusServiceUnavailable, CodeShuttingDown, "relay is shutting down")
	}
	blocks := 0
	for i := range evs {
		if err := p.admit(r.Context(), epoch, evs[i]); err != nil {
			// Admission is per event: the first i events are in and stay
			// in. Say so in the body, so a client retries only the rest.
			ae := *classify(err)
			ae.message = fmt.Sprintf("%s (after admitting %d of %d events)", ae.message, i, len(evs))
			ae.admitted = &i
			return &ae
		}
		blocks += evs[i].BlockCount()
		s.m.events.WithLabelValues(p.spec.Name).Inc()
	}
	s.m.blocks.WithLabelValues(p.spec.Name).Add(float64(blocks))
	writeJSON(w, http.StatusAccepted, map[string]int{"admitted": len(evs)})
	return nil
}

type replaceRequest struct {
	Ranks []struct {
		WorkerID    *uint64         `json:"worker_id"`
		DPRank      uint32          `json:"dp_rank"`
		SourceEpoch *uint64         `json:"source_epoch"`
		Events      json.RawMessage `json:"events"`
	} `json:"ranks"`
}

// handleReplace replaces the exact state of one or more ranks (tree dumps) in
// one rebuild.
func (s *Server) handleReplace(w http.ResponseWriter, r *http.Request) error {
	p, err := s.pool(r)
	if err != nil {
		return err
	}
	var req replaceRequest
	if err := s.readJSON(w, r, &req); err != nil {
		return err
	}
	if len(req.Ranks) == 0 {
		return apiErr(http.StatusBadRequest, CodeBadRequest, "ranks must list at least one rank")
	}
	reps := make([]producer.RankReplacement, 0, len(req.Ranks))
	for i, rk := range req.Ranks {
		if rk.WorkerID == nil || rk.SourceEpoch == nil {
			return apiErr(http.StatusBadRequest, CodeBadRequest, fmt.Sprintf("ranks[%d]: worker_id and source_epoch are required", i))
		}
		var evs []ckf.RouterEvent
		if len(rk.Events) > 0 && string(rk.Events) != "null" {
			if evs, err = wire.DecodeRouterEventsJSON(rk.Events, nil); err != nil {
				return apiErr(http.StatusBadRequest, CodeMalformedEvents, fmt.Sprintf("ranks[%d].events: %v", i, err))
			}
		}
		if err := s.checkEvents(evs); err != nil {
			return err
		}
		reps = append(reps, producer.RankReplacement{SourceEpoch: *rk.SourceEpoch,
			Member: ckf.Member{WorkerID: *rk.WorkerID, DPRank: rk.DPRank}, Events: evs})
	}
	if err := p.handle.ReplaceRanks(r.Context(), reps); err != nil {
		if isPoolValidation(err) {
			return apiErr(http.StatusUnprocessableEntity, CodeInvalidRanks, err.Error())
		}
		return err
	}
	writeJSON(w, http.StatusOK, map[string]int{"replaced": len(reps)})
	return nil
}

// isPoolValidation reports a replacement the pool rejected as invalid.
func isPoolValidation(err error) bool {
	var ee *ckf.EventError
	return errors.As(err, &ee)
}

type resetRequest struct {
	WorkerID    *uint64 `json:"worker_id"`
	DPRank      uint32  `json:"dp_rank"`
	SourceEpoch *uint64 `json:"source_epoch"`
	Degraded    bool    `json:"degraded"`
}

// handleReset removes every block of one rank at a new source epoch.
func (s *Server) handleReset(w http.ResponseWriter, r *http.Request) error {
	p, err := s.pool(r)
	if err != nil {
		return err
	}
	var req resetRequest
	if err := s.readJSON(w, r, &req); err != nil {
		return err
	}
	if req.WorkerID == nil || req.SourceEpoch == nil {
		return apiErr(http.StatusBadRequest, CodeBadRequest, "worker_id and source_epoch are required")
	}
	m := ckf.Member{WorkerID: *req.WorkerID, DPRank: req.DPRank}
	if err := p.handle.ResetRank(r.Context(), *req.SourceEpoch, m, req.Degraded); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "reset"})
	return nil
}

// readJSON reads the body within the limit and decodes one JSON value into v.
// Unknown keys and trailing data are errors, so a misspelt field is never
// silently ignored.
func (s *Server) readJSON(w http.ResponseWriter, r *http.Request, v any) error {
	body, err := s.readBody(w, r)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return apiErr(http.StatusBadRequest, CodeBadRequest, "invalid JSON: "+err.Error())
	}
	if dec.More() {
		return apiErr(http.StatusBadRequest, CodeBadRequest, "invalid JSON: trailing data")
	}
	return nil
}
