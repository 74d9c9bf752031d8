package server

import (
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/hub"
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
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", s.handleReady)
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.m.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /v1/pools", s.handleCatalog)
	mux.HandleFunc("POST /v1/pools/{pool}/events", s.handleEvents)
	mux.HandleFunc("POST /v1/pools/{pool}/ranks/replace", s.handleReplace)
	mux.HandleFunc("POST /v1/pools/{pool}/ranks/reset", s.handleReset)
	mux.HandleFunc("GET /v1/pools/{pool}/stream", s.handleStream)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.writeError(w, apiErr(http.StatusNotFound, "not_found", "no such endpoint: "+r.Method+" "+r.URL.Path))
	})
	return s.auth(mux)
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

func (s *Server) handleReady(w http.ResponseWriter, r *http.Request) {
	if s.stopping.Load() {
		s.writeError(w, apiErr(http.StatusServiceUnavailable, CodeShuttingDown, "relay is shutting down"))
		return
	}
	for _, p := range s.order {
		if !p.hub.Stats().Ready {
			s.writeError(w, apiErr(http.StatusServiceUnavailable, CodeNotReady, "pool "+p.spec.Name+" has no snapshot yet"))
			return
		}
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
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
func (s *Server) handleEvents(w http.ResponseWriter, r *http.Request) {
	p, err := s.pool(r)
	if err != nil {
		s.writeError(w, err)
		return
	}
	epoch, err := uintParam(r, "source_epoch", true)
	if err != nil {
		s.writeError(w, err)
		return
	}
	body, err := s.readBody(w, r)
	if err != nil {
		s.writeError(w, err)
		return
	}
	evs, err := s.decodeEvents(r.Header.Get("Content-Type"), body)
	if err != nil {
		s.writeError(w, err)
		return
	}
	if s.stopping.Load() {
		s.writeError(w, apiErr(http.StatusServiceUnavailable, CodeShuttingDown, "relay is shutting down"))
		return
	}
	blocks := 0
	for i := range evs {
		if err := p.handle.AdmitEvent(r.Context(), epoch, evs[i]); err != nil {
			ae := classify(err)
			ae.message = fmt.Sprintf("%s (after admitting %d of %d events)", ae.message, i, len(evs))
			s.writeError(w, ae)
			return
		}
		blocks += evs[i].BlockCount()
		s.m.events.WithLabelValues(p.spec.Name).Inc()
	}
	s.m.blocks.WithLabelValues(p.spec.Name).Add(float64(blocks))
	writeJSON(w, http.StatusAccepted, map[string]int{"admitted": len(evs)})
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
func (s *Server) handleReplace(w http.ResponseWriter, r *http.Request) {
	p, err := s.pool(r)
	if err != nil {
		s.writeError(w, err)
		return
	}
	body, err := s.readBody(w, r)
	if err != nil {
		s.writeError(w, err)
		return
	}
	var req replaceRequest
	if err := strictJSON(body, &req); err != nil {
		s.writeError(w, err)
		return
	}
	if len(req.Ranks) == 0 {
		s.writeError(w, apiErr(http.StatusBadRequest, CodeBadRequest, "ranks must list at least one rank"))
		return
	}
	reps := make([]producer.RankReplacement, 0, len(req.Ranks))
	for i, rk := range req.Ranks {
		if rk.WorkerID == nil || rk.SourceEpoch == nil {
			s.writeError(w, apiErr(http.StatusBadRequest, CodeBadRequest, fmt.Sprintf("ranks[%d]: worker_id and source_epoch are required", i)))
			return
		}
		var evs []ckf.RouterEvent
		if len(rk.Events) > 0 && string(rk.Events) != "null" {
			if evs, err = wire.DecodeRouterEventsJSON(rk.Events, nil); err != nil {
				s.writeError(w, apiErr(http.StatusBadRequest, CodeMalformedEvents, fmt.Sprintf("ranks[%d].events: %v", i, err)))
				return
			}
		}
		if err := s.checkEvents(evs); err != nil {
			s.writeError(w, err)
			return
		}
		reps = append(reps, producer.RankReplacement{SourceEpoch: *rk.SourceEpoch,
			Member: ckf.Member{WorkerID: *rk.WorkerID, DPRank: rk.DPRank}, Events: evs})
	}
	if err := p.handle.ReplaceRanks(r.Context(), reps); err != nil {
		if isPoolValidation(err) {
			err = apiErr(http.StatusUnprocessableEntity, CodeInvalidRanks, err.Error())
		}
		s.writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]int{"replaced": len(reps)})
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
func (s *Server) handleReset(w http.ResponseWriter, r *http.Request) {
	p, err := s.pool(r)
	if err != nil {
		s.writeError(w, err)
		return
	}
	body, err := s.readBody(w, r)
	if err != nil {
		s.writeError(w, err)
		return
	}
	var req resetRequest
	if err := strictJSON(body, &req); err != nil {
		s.writeError(w, err)
		return
	}
	if req.WorkerID == nil || req.SourceEpoch == nil {
		s.writeError(w, apiErr(http.StatusBadRequest, CodeBadRequest, "worker_id and source_epoch are required"))
		return
	}
	m := ckf.Member{WorkerID: *req.WorkerID, DPRank: req.DPRank}
	if err := p.handle.ResetRank(r.Context(), *req.SourceEpoch, m, req.Degraded); err != nil {
		s.writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "reset"})
}

func strictJSON(body []byte, v any) error {
	dec := json.NewDecoder(strings.NewReader(string(body)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return apiErr(http.StatusBadRequest, CodeBadRequest, "invalid JSON: "+err.Error())
	}
	if dec.More() {
		return apiErr(http.StatusBadRequest, CodeBadRequest, "invalid JSON: trailing data")
	}
	return nil
}

// handleStream serves one remote consumer lane: a chunked snapshot from the
// hub's mirror, then every delta re-stamped with the subscriber's lease,
// heartbeats while idle, and a close frame when the stream ends.
func (s *Server) handleStream(w http.ResponseWriter, r *http.Request) {
	p, err := s.pool(r)
	if err != nil {
		s.writeError(w, err)
		return
	}
	consumer, err := uintParam(r, "consumer", true)
	if err != nil {
		s.writeError(w, err)
		return
	}
	lane, err := uintParam(r, "lane", true)
	if err == nil && lane >= ckf.MaxLanes {
		err = apiErr(http.StatusBadRequest, CodeBadRequest, fmt.Sprintf("lane %d outside 0..%d", lane, ckf.MaxLanes-1))
	}
	if err != nil {
		s.writeError(w, err)
		return
	}
	epoch, err := uintParam(r, "epoch", true)
	if err != nil {
		s.writeError(w, err)
		return
	}
	lease := ckf.LaneLease{ConsumerInstance: consumer, PhysicalLane: uint8(lane), AssignmentEpoch: epoch}
	snap, sub, err := p.hub.Subscribe(lease)
	if err != nil {
		s.writeError(w, err)
		return
	}
	defer sub.Cancel()
	w.Header().Set("Content-Type", FramesContentType)
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	writeTimeout := time.Duration(s.cfg.StreamWriteTimeout)
	// Every write gets a deadline: a subscriber that stops reading must not
	// hold this goroutine, its snapshot or the shutdown forever.
	_ = rc.SetWriteDeadline(time.Now().Add(writeTimeout))
	// The snapshot goes out in chunks of at most snapshotChunkBytes through a
	// writer of its own: a wire.Writer keeps its largest encoding buffer, and
	// a whole-table buffer per idle subscriber is what a subscriber flood
	// would otherwise cost.
	if err := wire.NewWriter(w, min(s.cfg.MaxFrameBytes, snapshotChunkBytes)).WriteSnapshot(&snap); err != nil {
		return
	}
	fw := wire.NewWriter(w, s.cfg.MaxFrameBytes)
	_ = rc.Flush()
	last := snap.Sequence
	identity := snap.Identity
	snap.Words = nil // the shared table may be released while the stream lives on

	hb := time.NewTicker(time.Duration(s.cfg.HeartbeatInterval))
	defer hb.Stop()
	var f wire.Frame
	for {
		select {
		case d := <-sub.Deltas():
			_ = rc.SetWriteDeadline(time.Now().Add(writeTimeout))
			f = wire.Frame{Kind: wire.KindDelta, Delta: sub.Stamp(d)}
			if fw.WriteFrame(&f) != nil {
				return
			}
			last = d.Sequence
			// Coalesce flushes: write everything already queued first.
			if len(sub.Deltas()) == 0 {
				_ = rc.Flush()
			}
		case <-sub.Done():
			_ = rc.SetWriteDeadline(time.Now().Add(writeTimeout))
			s.endStream(p, fw, rc, sub, lease, last)
			return
		case <-hb.C:
			_ = rc.SetWriteDeadline(time.Now().Add(writeTimeout))
			f = wire.Frame{Kind: wire.KindHeartbeat, Heartbeat: wire.Heartbeat{Identity: identity, Lease: lease,
				LastSequence: last, UnixMicros: time.Now().UnixMicro()}}
			if fw.WriteFrame(&f) != nil {
				return
			}
			_ = rc.Flush()
		case <-r.Context().Done():
			return
		}
	}
}

// endStream writes what is still queued (unless the subscriber lagged), a
// drain marker when the pool shut down cleanly, and a close frame.
func (s *Server) endStream(p *hostedPool, fw *wire.Writer, rc *http.ResponseController, sub *hub.Subscription, lease ckf.LaneLease, last uint64) {
	cause := sub.Err()
	var f wire.Frame
	if !errors.Is(cause, hub.ErrLagged) {
		for {
			select {
			case d := <-sub.Deltas():
				f = wire.Frame{Kind: wire.KindDelta, Delta: sub.Stamp(d)}
				if fw.WriteFrame(&f) != nil {
					return
				}
				last = d.Sequence
				continue
			default:
			}
			break
		}
	}
	reason := wire.CloseProducerChanged
	switch {
	case errors.Is(cause, hub.ErrLagged):
		reason = wire.CloseLagged
		s.m.lagged.WithLabelValues(p.spec.Name).Inc()
	case errors.Is(cause, errShuttingDown):
		reason = wire.CloseShuttingDown
		f = wire.Frame{Kind: wire.KindDrainMarker, Drain: ckf.DrainMarker{Lease: lease, ExpectedSequence: last}}
		if fw.WriteFrame(&f) != nil {
			return
		}
	case errors.Is(cause, errFenced):
		reason = wire.CloseFenced
	}
	f = wire.Frame{Kind: wire.KindClose, Close: wire.Close{Reason: reason, Message: fmt.Sprint(cause)}}
	_ = fw.WriteFrame(&f)
	_ = rc.Flush()
}
