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
	"time"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/internal/connlimit"
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
		{"POST", "/v1/pools/{pool}/events", s.api(s.syncPublished(s.ingest(s.handleEvents)))},
		{"POST", "/v1/pools/{pool}/ranks/replace", s.api(s.syncPublished(s.ingest(s.handleReplace)))},
		{"POST", "/v1/pools/{pool}/ranks/reset", s.api(s.syncPublished(s.ingest(s.handleReset)))},
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

// auth requires the bearer token on every endpoint but /healthz. The scheme
// name is case-insensitive (RFC 9110 §11.1); the token is compared in
// constant time.
func (s *Server) auth(next http.Handler) http.Handler {
	if s.cfg.AuthToken == "" {
		return next
	}
	want := []byte(s.cfg.AuthToken)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" && !bearerMatches(r.Header.Get("Authorization"), want) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="ckfrelay"`)
			// Close the connection: an unauthenticated peer keeps no
			// connection (and no slot of max_connections) open.
			ae := apiErr(http.StatusUnauthorized, CodeUnauthorized, "missing or wrong bearer token")
			ae.closeConn = true
			s.writeError(w, ae)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func bearerMatches(header string, want []byte) bool {
	scheme, token, ok := strings.Cut(header, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return false
	}
	return subtle.ConstantTimeCompare([]byte(strings.TrimLeft(token, " ")), want) == 1
}

// ingest bounds the request bodies read and decoded at once: a request past
// MaxConcurrentIngest is answered 503 overloaded (with Retry-After) before
// its body is read, so memory stays at most MaxConcurrentIngest bodies. A
// request takes its slot only once its body is arriving (awaitBody), so
// connections that announce a body and send nothing hold no slot. One
// client address holds at most MaxConcurrentIngestPerClient slots, so
// slow bodies from one address cannot hold them all (docs/RATIONALE.md,
// "Why does one client address get only a quarter of the ingest and
// subscriber slots?").
func (s *Server) ingest(h func(http.ResponseWriter, *http.Request) error) func(http.ResponseWriter, *http.Request) error {
	return func(w http.ResponseWriter, r *http.Request) error {
		if err := s.awaitBody(w, r); err != nil {
			return err
		}
		client := connlimit.Client(r.RemoteAddr)
		if !s.takeIngestShare(client) {
			return apiErr(http.StatusServiceUnavailable, CodeOverloaded,
				fmt.Sprintf("this client address already has %d ingest requests in progress (max_concurrent_ingest_per_client); retry later",
					s.cfg.MaxConcurrentIngestPerClient))
		}
		defer s.dropIngestShare(client)
		select {
		case s.ingestSlots <- struct{}{}:
			defer func() { <-s.ingestSlots }()
		default:
			return apiErr(http.StatusServiceUnavailable, CodeOverloaded,
				fmt.Sprintf("%d ingest requests already in progress; retry later", cap(s.ingestSlots)))
		}
		return h(w, r)
	}
}

// takeIngestShare counts an ingest request of client; false, counting
// nothing, when client holds its share already.
func (s *Server) takeIngestShare(client string) bool {
	s.ingestMu.Lock()
	defer s.ingestMu.Unlock()
	if s.ingestBy[client] >= s.cfg.MaxConcurrentIngestPerClient {
		return false
	}
	s.ingestBy[client]++
	return true
}

func (s *Server) dropIngestShare(client string) {
	s.ingestMu.Lock()
	defer s.ingestMu.Unlock()
	if s.ingestBy[client]--; s.ingestBy[client] <= 0 {
		delete(s.ingestBy, client)
	}
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
		// A standby is ready for what it does: name the leader, hold the
		// state and take over. One that cannot — its replica stopped, or
		// its records chain halts — is not.
		if p.ha != nil {
			if why := p.ha.failure(); why != "" {
				return apiErr(http.StatusServiceUnavailable, CodeNotReady, "pool "+p.spec.Name+"'s replica "+why)
			}
		}
		if g := p.gen(); g.leading && !g.hub.Stats().Ready {
			return apiErr(http.StatusServiceUnavailable, CodeNotReady, "pool "+p.spec.Name+" has no snapshot yet")
		}
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
	return nil
}

func uintParam(r *http.Request, name string, required bool) (uint64, error) {
	vs := r.URL.Query()[name]
	if len(vs) > 1 {
		// Which one counts would be a guess (the first here, the last in
		// another proxy): an epoch or a lane given twice is refused.
		return 0, apiErr(http.StatusBadRequest, CodeBadRequest, fmt.Sprintf("query parameter %s is given %d times", name, len(vs)))
	}
	v := ""
	if len(vs) == 1 {
		v = vs[0]
	}
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

// awaitBody waits, for at most BodyStartTimeout, until the first byte of
// r's body has arrived, and puts it back in front of the body. A request
// without a body returns at once. The wait for nothing is answered 408
// (Connection: close) without an ingest slot ever being taken.
func (s *Server) awaitBody(w http.ResponseWriter, r *http.Request) error {
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		return nil
	}
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Now().Add(time.Duration(s.cfg.BodyStartTimeout))) // best effort: a recorder has none
	var first [1]byte
	for {
		n, err := r.Body.Read(first[:])
		if n > 0 {
			r.Body = &prefixedBody{first: first[0], ReadCloser: r.Body}
			return nil
		}
		if err == io.EOF {
			return nil // an empty body: nothing to hold a slot for
		}
		if err != nil {
			if isTimeout(err) {
				ae := apiErr(http.StatusRequestTimeout, CodeRequestTimeout, fmt.Sprintf(
					"no body byte within body_start_timeout %s", time.Duration(s.cfg.BodyStartTimeout)))
				return ae
			}
			return bodyError(err)
		}
	}
}

// prefixedBody is a body whose first byte awaitBody already read.
type prefixedBody struct {
	first byte
	done  bool
	io.ReadCloser
}

func (b *prefixedBody) Read(p []byte) (int, error) {
	if b.done || len(p) == 0 {
		return b.ReadCloser.Read(p)
	}
	p[0], b.done = b.first, true
	return 1, nil
}

// readBody reads a request body within the configured size limit and read
// deadline: the body must arrive within BodyReadTimeout plus one second per
// MinBodyRate bytes received, so a trickled or stalled body is cut (408)
// instead of holding a handler, a connection and an ingest slot.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	rc := http.NewResponseController(w)
	start := time.Now()
	grace := time.Duration(s.cfg.BodyReadTimeout)
	// Deadlines are best effort: a recorder (tests) has none.
	deadline := func(n int) {
		_ = rc.SetReadDeadline(start.Add(grace + time.Duration(int64(n)*int64(time.Second)/s.cfg.MinBodyRate)))
	}
	body := http.MaxBytesReader(w, r.Body, s.cfg.MaxRequestBytes)
	size := 512
	if r.ContentLength > 0 {
		size = int(min(r.ContentLength, s.cfg.MaxRequestBytes) + 1) // +1: see EOF without growing
	}
	buf := make([]byte, 0, size)
	for {
		deadline(len(buf))
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := body.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			_ = rc.SetReadDeadline(time.Time{})
			return buf, nil
		}
		if err != nil {
			// The deadline stays: the server then gives up on the unread
			// rest at once and closes the connection.
			return nil, bodyError(err)
		}
	}
}

// bodyError classifies a failed body read. The size limit (413) and the
// read deadline (408) keep their own answers; anything else the body
// reader says — a malformed chunked encoding, a body cut by the peer's FIN
// before its Content-Length or final chunk — is the client's fault: 400
// bad_request, and the connection is closed since its framing is lost.
func bodyError(err error) error {
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) || isTimeout(err) {
		return err
	}
	ae := apiErr(http.StatusBadRequest, CodeBadRequest, "reading the request body: "+err.Error())
	ae.closeConn = true
	return ae
}

// mediaType returns the request's media type, application/json when unset.
func mediaType(r *http.Request) (string, error) {
	ct := r.Header.Get("Content-Type")
	if ct == "" {
		return "application/json", nil
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return "", apiErr(http.StatusUnsupportedMediaType, CodeUnsupportedMedia, err.Error())
	}
	return mt, nil
}

func (s *Server) limits() wire.BatchLimits {
	return wire.BatchLimits{MaxEvents: s.cfg.MaxEventsPerBatch, MaxBlocksPerEvent: s.cfg.MaxBlocksPerEvent}
}

// decodeEvents decodes a JSON or msgpack array of RouterEvents under the
// batch limits, which apply while decoding. Nothing is admitted unless the
// whole batch is valid.
func (s *Server) decodeEvents(mt string, body []byte) ([]ckf.RouterEvent, error) {
	var evs []ckf.RouterEvent
	var err error
	switch mt {
	case "application/json":
		evs, err = wire.DecodeRouterEventsJSONLimited(body, nil, s.limits())
	case "application/msgpack", "application/x-msgpack", "application/vnd.msgpack":
		evs, err = wire.DecodeRouterEventsMsgpackLimited(body, nil, s.limits())
	default:
		return nil, apiErr(http.StatusUnsupportedMediaType, CodeUnsupportedMedia, "events must be application/json or application/msgpack, not "+mt)
	}
	switch {
	case errors.Is(err, wire.ErrLimitExceeded):
		return nil, apiErr(http.StatusRequestEntityTooLarge, CodeLimitExceeded, err.Error())
	case err != nil:
		return nil, apiErr(http.StatusBadRequest, CodeMalformedEvents, err.Error())
	}
	return evs, nil
}

// checkEpoch refuses a source epoch farther than MaxSourceEpochJump above
// member m's current one (above 0 for a member the pool does not know), or
// above producer.MaxSourceEpoch whatever the step: an epoch near 2^64 would
// leave the worker no higher epoch to announce.
func (s *Server) checkEpoch(p *hostedPool, m ckf.Member, epoch uint64) error {
	if epoch > producer.MaxSourceEpoch {
		return apiErr(http.StatusBadRequest, CodeEpochOutOfRange, fmt.Sprintf(
			"source epoch %d of worker %d rank %d is above the ceiling 2^62 (%d)", epoch, m.WorkerID, m.DPRank, uint64(producer.MaxSourceEpoch)))
	}
	base, _ := p.actor().SourceEpoch(m)
	if epoch > base && epoch-base > s.cfg.MaxSourceEpochJump {
		return apiErr(http.StatusBadRequest, CodeEpochOutOfRange, fmt.Sprintf(
			"source epoch %d of worker %d rank %d is more than max_source_epoch_jump %d above its current %d",
			epoch, m.WorkerID, m.DPRank, s.cfg.MaxSourceEpochJump, base))
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
	g, err := p.serving()
	if err != nil {
		return err
	}
	epoch, err := uintParam(r, "source_epoch", true)
	if err != nil {
		return err
	}
	mt, err := mediaType(r)
	if err != nil {
		return err
	}
	body, err := s.readBody(w, r)
	if err != nil {
		return err
	}
	evs, err := s.decodeEvents(mt, body)
	if err != nil {
		return err
	}
	for i := range evs {
		if err := s.checkEpoch(p, evs[i].Member(), epoch); err != nil {
			ae := *classify(err)
			ae.message = fmt.Sprintf("event %d: %s", i, ae.message)
			return &ae
		}
	}
	if err := g.handle.CheckEvents(epoch, evs); err != nil {
		return err
	}
	if s.stopping.Load() {
		return apiErr(http.StatusServiceUnavailable, CodeShuttingDown, "relay is shutting down")
	}
	admit := p.admit
	if g.rec != nil {
		// A replica admits into the generation that leads, never into a
		// standby's actor that replaced it meanwhile.
		admit = g.handle.AdmitEvent
	}
	blocks := 0
	for i := range evs {
		if err := admit(r.Context(), epoch, evs[i]); err != nil {
			// Admission is per event: the first i events are in and stay
			// in. Say so in the body, so a client retries only the rest —
			// a replica once they are in a stored record.
			if i > 0 {
				if rerr := p.awaitRecorded(r.Context(), g); rerr != nil {
					return rerr
				}
			}
			ae := *classify(err)
			ae.message = fmt.Sprintf("%s (after admitting %d of %d events)", ae.message, i, len(evs))
			ae.admitted = &i
			return &ae
		}
		blocks += evs[i].BlockCount()
		s.m.events.WithLabelValues(p.spec.Name).Inc()
	}
	s.m.blocks.WithLabelValues(p.spec.Name).Add(float64(blocks))
	if err := p.awaitRecorded(r.Context(), g); err != nil {
		return err
	}
	writeJSON(w, http.StatusAccepted, map[string]int{"admitted": len(evs)})
	return nil
}

// replaceRank is one entry of a replace request's "ranks".
type replaceRank struct {
	WorkerID    *uint64         `json:"worker_id"`
	DPRank      uint32          `json:"dp_rank"`
	SourceEpoch *uint64         `json:"source_epoch"`
	Events      json.RawMessage `json:"events"`
}

// readReplace reads {"ranks": [...]} one rank at a time, so a body of
// millions of ranks is refused at rank max_events_per_batch+1 (413) instead
// of being decoded whole first. Unknown keys are errors, as in readJSON.
func (s *Server) readReplace(w http.ResponseWriter, r *http.Request) ([]replaceRank, error) {
	body, err := s.readJSONBody(w, r)
	if err != nil {
		return nil, err
	}
	bad := func(err error) error {
		return apiErr(http.StatusBadRequest, CodeBadRequest, "invalid JSON: "+err.Error())
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	delim := func(want json.Delim) error {
		t, err := dec.Token()
		if err != nil {
			return bad(err)
		}
		if t != want {
			return bad(fmt.Errorf("want %v, got %v", want, t))
		}
		return nil
	}
	if err := delim('{'); err != nil {
		return nil, err
	}
	var ranks []replaceRank
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, bad(err)
		}
		if t != "ranks" {
			return nil, bad(fmt.Errorf("unknown field %v", t))
		}
		if ranks != nil {
			return nil, bad(errors.New("ranks given twice"))
		}
		if err := delim('['); err != nil {
			return nil, err
		}
		ranks = []replaceRank{}
		for dec.More() {
			if len(ranks) == s.cfg.MaxEventsPerBatch {
				return nil, apiErr(http.StatusRequestEntityTooLarge, CodeLimitExceeded,
					fmt.Sprintf("more than %d ranks in one replacement (max_events_per_batch)", s.cfg.MaxEventsPerBatch))
			}
			var rk replaceRank
			if err := dec.Decode(&rk); err != nil {
				return nil, bad(err)
			}
			ranks = append(ranks, rk)
		}
		if err := delim(']'); err != nil {
			return nil, err
		}
	}
	if err := delim('}'); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, apiErr(http.StatusBadRequest, CodeBadRequest, "invalid JSON: trailing data")
	}
	return ranks, nil
}

// handleReplace replaces the exact state of one or more ranks (tree dumps) in
// one rebuild.
func (s *Server) handleReplace(w http.ResponseWriter, r *http.Request) error {
	p, err := s.pool(r)
	if err != nil {
		return err
	}
	g, err := p.serving()
	if err != nil {
		return err
	}
	ranks, err := s.readReplace(w, r)
	if err != nil {
		return err
	}
	if len(ranks) == 0 {
		return apiErr(http.StatusBadRequest, CodeBadRequest, "ranks must list at least one rank")
	}
	reps := make([]producer.RankReplacement, 0, len(ranks))
	for i, rk := range ranks {
		if rk.WorkerID == nil || rk.SourceEpoch == nil {
			return apiErr(http.StatusBadRequest, CodeBadRequest, fmt.Sprintf("ranks[%d]: worker_id and source_epoch are required", i))
		}
		var evs []ckf.RouterEvent
		if len(rk.Events) > 0 && string(rk.Events) != "null" {
			if evs, err = s.decodeEvents("application/json", rk.Events); err != nil {
				ae := *classify(err)
				ae.message = fmt.Sprintf("ranks[%d].events: %s", i, ae.message)
				return &ae
			}
		}
		m := ckf.Member{WorkerID: *rk.WorkerID, DPRank: rk.DPRank}
		if err := s.checkEpoch(p, m, *rk.SourceEpoch); err != nil {
			return err
		}
		reps = append(reps, producer.RankReplacement{SourceEpoch: *rk.SourceEpoch, Member: m, Events: evs})
	}
	if err := g.handle.ReplaceRanks(r.Context(), reps); err != nil {
		if isPoolValidation(err) {
			return apiErr(http.StatusUnprocessableEntity, CodeInvalidRanks, err.Error())
		}
		return err
	}
	if err := p.awaitRecorded(r.Context(), g); err != nil {
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
	g, err := p.serving()
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
	if err := s.checkEpoch(p, m, *req.SourceEpoch); err != nil {
		return err
	}
	if err := g.handle.ResetRank(r.Context(), *req.SourceEpoch, m, req.Degraded); err != nil {
		return err
	}
	if err := p.awaitRecorded(r.Context(), g); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "reset"})
	return nil
}

// readJSON reads the body within the limit and decodes one JSON value into v.
// Unknown keys and trailing data are errors, so a misspelt field is never
// silently ignored.
func (s *Server) readJSON(w http.ResponseWriter, r *http.Request, v any) error {
	body, err := s.readJSONBody(w, r)
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

// readJSONBody checks that the request is application/json and reads its
// body.
func (s *Server) readJSONBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	if mt, err := mediaType(r); err != nil {
		return nil, err
	} else if mt != "application/json" || r.Header.Get("Content-Type") == "" {
		return nil, apiErr(http.StatusUnsupportedMediaType, CodeUnsupportedMedia, "the body must be application/json")
	}
	return s.readBody(w, r)
}
