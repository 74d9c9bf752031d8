package server

import (
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"

	"github.com/ckfrelay/ckfrelay/internal/hub"
	"github.com/ckfrelay/ckfrelay/producer"
	"github.com/ckfrelay/ckfrelay/wire"
)

// Error codes of the HTTP API. They are part of the API and must not change.
const (
	CodeBadRequest       = "bad_request"
	CodeMalformedEvents  = "malformed_events"
	CodeUnknownPool      = "unknown_pool"
	CodeStaleEpoch       = "stale_source_epoch"
	CodeStaleLease       = "stale_lease_epoch"
	CodeTooLarge         = "too_large"
	CodeLimitExceeded    = "limit_exceeded"
	CodeUnauthorized     = "unauthorized"
	CodeUnsupportedMedia = "unsupported_media_type"
	CodeShuttingDown     = "shutting_down"
	CodeNotReady         = "not_ready"
	CodeTooMany          = "too_many_subscribers"
	CodeInvalidRanks     = "invalid_replacement"
	CodeInternal         = "internal"
	CodeNotFound         = "not_found"
	CodeMethodNotAllowed = "method_not_allowed"
	CodeOverloaded       = "overloaded"
	CodeRequestTimeout   = "request_timeout"
	CodeEpochOutOfRange  = "epoch_out_of_range"
	CodeInvalidEvent     = "invalid_event"
	CodeUnannounced      = "unannounced_source_epoch"
	// CodeNotLeader: a replicated pool's standby (ha.nats_url) serves no
	// ingest and no stream; the answer names the leader where known.
	CodeNotLeader = "not_leader"
)

// LeaderHeader names, on a standby's 503 not_leader answer, the HTTP base
// URL of the pool's leader.
const LeaderHeader = "Ckfrelay-Leader"

// apiError is an error with an HTTP status and a stable code.
type apiError struct {
	status  int
	code    string
	message string
	// admitted, when set, is how many events of the batch were admitted
	// before the error: the request failed part way through admission.
	admitted *int
	// closeConn answers with Connection: close: the request's framing is
	// lost (a malformed or cut body), or the client is not to keep the
	// connection (401).
	closeConn bool
	// leader, on a not_leader answer, is where the pool's leader serves.
	leader *LeaderHint
}

func (e *apiError) Error() string { return e.code + ": " + e.message }

func apiErr(status int, code, msg string) *apiError {
	return &apiError{status: status, code: code, message: msg}
}

// classify maps an error from the layers below to an API error.
func classify(err error) *apiError {
	var ae *apiError
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &ae):
		return ae
	case errors.As(err, &mbe):
		return apiErr(http.StatusRequestEntityTooLarge, CodeTooLarge, err.Error())
	case errors.Is(err, wire.ErrLimitExceeded):
		return apiErr(http.StatusRequestEntityTooLarge, CodeLimitExceeded, err.Error())
	case errors.Is(err, producer.ErrEpochOutOfRange):
		return apiErr(http.StatusBadRequest, CodeEpochOutOfRange, err.Error())
	case errors.Is(err, producer.ErrUnannouncedSourceEpoch):
		return apiErr(http.StatusBadRequest, CodeUnannounced, err.Error())
	case errors.As(err, new(*producer.AdmissionError)):
		return apiErr(http.StatusBadRequest, CodeInvalidEvent, err.Error())
	case isTimeout(err):
		return apiErr(http.StatusRequestTimeout, CodeRequestTimeout, err.Error())
	case errors.Is(err, producer.ErrStaleSourceEpoch):
		return apiErr(http.StatusConflict, CodeStaleEpoch, err.Error())
	case errors.Is(err, hub.ErrStaleEpoch):
		return apiErr(http.StatusConflict, CodeStaleLease, err.Error())
	case errors.Is(err, hub.ErrTooManySubscribers):
		return apiErr(http.StatusServiceUnavailable, CodeTooMany, err.Error())
	case errors.Is(err, hub.ErrNotReady):
		return apiErr(http.StatusServiceUnavailable, CodeNotReady, err.Error())
	case errors.Is(err, producer.ErrShuttingDown), errors.Is(err, hub.ErrClosed):
		return apiErr(http.StatusServiceUnavailable, CodeShuttingDown, err.Error())
	case errors.Is(err, wire.ErrMalformed), errors.Is(err, wire.ErrTruncated), errors.Is(err, wire.ErrTrailingBytes):
		return apiErr(http.StatusBadRequest, CodeMalformedEvents, err.Error())
	}
	return apiErr(http.StatusInternalServerError, CodeInternal, err.Error())
}

// isTimeout reports a read that hit its deadline.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

// writeError writes {"error": {"code": …, "message": …}}.
func (s *Server) writeError(w http.ResponseWriter, err error) {
	ae := classify(err)
	s.m.rejected.WithLabelValues(ae.code).Inc()
	switch ae.status {
	case http.StatusServiceUnavailable:
		w.Header().Set("Retry-After", "1")
	case http.StatusRequestTimeout:
		// The body was not read to its end: the connection cannot carry
		// another request.
		w.Header().Set("Connection", "close")
	}
	if ae.closeConn {
		w.Header().Set("Connection", "close")
	}
	body := map[string]any{"error": map[string]string{"code": ae.code, "message": ae.message}}
	if ae.leader != nil {
		w.Header().Set(LeaderHeader, ae.leader.URL)
		body["leader"] = map[string]string{"node": ae.leader.Node, "url": ae.leader.URL}
	}
	if ae.admitted != nil {
		body["admitted"] = *ae.admitted
	}
	writeJSON(w, ae.status, body)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
