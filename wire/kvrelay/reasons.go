package kvrelay

import (
	"context"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/ckfrelay/ckfrelay/wire/kvrelay/kvrelaypb"
)

// Reason is one row of the contract's error table: a RelayErrorReason, the
// gRPC code a server returns it with, and what a client does.
type Reason struct {
	Reason kvrelaypb.RelayErrorReason
	Code   codes.Code
	// Action is the contract's client action, in its words lightly edited.
	Action string
	// Backoff: the client may retry or reconnect, with bounded exponential
	// backoff (and jitter); otherwise an unchanged retry is wrong.
	Backoff bool
	// RefreshCatalog: the client refreshes the pool catalog before
	// subscribing again.
	RefreshCatalog bool
}

// Name is the reason's exact enum name, the value of the
// [ErrorReasonTrailer] trailer, e.g. "RELAY_ERROR_REASON_PRODUCER_CHANGED".
func (r Reason) Name() string { return r.Reason.String() }

// reasons is the contract's table (grpc-contract.md @d95e45a5, "Machine-Readable
// Errors"), indexed by reason number; entry 0 (UNSPECIFIED) is not a reason.
var reasons = [...]Reason{
	1:  {kvrelaypb.RelayErrorReason_RELAY_ERROR_REASON_CONTRACT_MISMATCH, codes.FailedPrecondition, "Stop retrying with this contract; use a compatible client/server major.", false, false},
	2:  {kvrelaypb.RelayErrorReason_RELAY_ERROR_REASON_INVALID_REQUEST, codes.InvalidArgument, "Fix the request; do not retry it unchanged.", false, false},
	3:  {kvrelaypb.RelayErrorReason_RELAY_ERROR_REASON_UNSUPPORTED_FEATURE, codes.FailedPrecondition, "Quarantine the requested pool; wait for supported semantics or upgrade.", false, false},
	4:  {kvrelaypb.RelayErrorReason_RELAY_ERROR_REASON_POOL_NOT_FOUND, codes.NotFound, "Refresh the catalog and drop withdrawn state; subscribe only to an advertised producer.", false, true},
	5:  {kvrelaypb.RelayErrorReason_RELAY_ERROR_REASON_PRODUCER_CHANGED, codes.FailedPrecondition, "Drop the old replica, refresh the catalog, and subscribe to the current key.", false, true},
	6:  {kvrelaypb.RelayErrorReason_RELAY_ERROR_REASON_RESOURCE_LIMIT, codes.ResourceExhausted, "Retry admission with bounded exponential backoff and jitter; reduce subscriptions if it persists.", true, false},
	7:  {kvrelaypb.RelayErrorReason_RELAY_ERROR_REASON_SUBSCRIBER_LAGGED, codes.ResourceExhausted, "Invalidate this stream's state and reopen from a full snapshot or window with backoff; other planes stay.", true, false},
	8:  {kvrelaypb.RelayErrorReason_RELAY_ERROR_REASON_SNAPSHOT_PROGRESS_TIMEOUT, codes.ResourceExhausted, "Discard the incomplete assembly, fix draining or backpressure, and reopen with backoff.", true, false},
	9:  {kvrelaypb.RelayErrorReason_RELAY_ERROR_REASON_PUBLICATION_UNAVAILABLE, codes.Unavailable, "Invalidate the affected stream state, refresh the catalog for pool streams, and reconnect with backoff.", true, true},
	10: {kvrelaypb.RelayErrorReason_RELAY_ERROR_REASON_INVALID_PUBLICATION, codes.FailedPrecondition, "Invalidate the replica and refresh the catalog; do not keep retrying the same fenced generation.", false, true},
	11: {kvrelaypb.RelayErrorReason_RELAY_ERROR_REASON_INTERNAL, codes.Internal, "Invalidate the affected stream state, refresh the catalog, and retry with backoff; surface persistent failures.", true, true},
}

// Reasons returns the contract's error table in reason-number order (a
// fresh copy).
func Reasons() []Reason { return append([]Reason(nil), reasons[1:]...) }

// LookupReason returns the row of r, or false for UNSPECIFIED and values
// this version does not know.
func LookupReason(r kvrelaypb.RelayErrorReason) (Reason, bool) {
	if r <= 0 || int(r) >= len(reasons) {
		return Reason{}, false
	}
	return reasons[r], true
}

// ForCode returns the client's disposition for a status without a known
// reason (no trailer, an unknown or UNSPECIFIED one: the contract says to
// use the status code, never the message): FAILED_PRECONDITION refreshes
// identity and catalog without a blind retry; RESOURCE_EXHAUSTED and
// UNAVAILABLE reconnect with backoff (a pool stream restarts from a
// snapshot); INVALID_ARGUMENT needs a corrected request; anything else
// (including proxies' authentication errors and INTERNAL) invalidates the
// stream state and reconnects with backoff after refreshing the catalog.
func ForCode(c codes.Code) Reason {
	r := Reason{Reason: kvrelaypb.RelayErrorReason_RELAY_ERROR_REASON_UNSPECIFIED, Code: c}
	switch c {
	case codes.FailedPrecondition:
		r.Action, r.RefreshCatalog = "Refresh identity and catalog and verify the envelope; do not blindly retry an unchanged request.", true
	case codes.ResourceExhausted, codes.Unavailable:
		r.Action, r.Backoff = "Reconnect with backoff; a pool stream starts again with a new snapshot.", true
	case codes.InvalidArgument:
		r.Action = "Correct the request."
	default:
		r.Action, r.Backoff, r.RefreshCatalog = "Invalidate the affected stream state, refresh the catalog and reconnect with backoff.", true, true
	}
	return r
}

// TrailerReason reads the reason from a status's trailing metadata: the
// known, non-UNSPECIFIED RelayErrorReason whose exact name is the single
// value of [ErrorReasonTrailer], else UNSPECIFIED (absent, repeated,
// unknown or misspelt values are all "no reason").
func TrailerReason(trailer metadata.MD) kvrelaypb.RelayErrorReason {
	v := trailer.Get(ErrorReasonTrailer)
	if len(v) != 1 {
		return kvrelaypb.RelayErrorReason_RELAY_ERROR_REASON_UNSPECIFIED
	}
	n, ok := kvrelaypb.RelayErrorReason_value[v[0]]
	if r := kvrelaypb.RelayErrorReason(n); ok {
		if _, known := LookupReason(r); known {
			return r
		}
	}
	return kvrelaypb.RelayErrorReason_RELAY_ERROR_REASON_UNSPECIFIED
}

// Disposition is what a client does after an RPC failed with err and the
// trailer it received: the reason's row when the trailer names a known
// reason, else [ForCode] of err's status code.
func Disposition(err error, trailer metadata.MD) Reason {
	if r, ok := LookupReason(TrailerReason(trailer)); ok {
		return r
	}
	return ForCode(status.Code(err))
}

// Fail ends a server RPC with reason: it sets the [ErrorReasonTrailer]
// trailer on ctx's RPC (unary or streaming: the handler's ctx or
// stream.Context()) and returns the status error, with the reason's code and
// the diagnostic message, for the handler to return. An UNSPECIFIED or
// unknown reason is a programming error and becomes codes.Internal with
// RELAY_ERROR_REASON_INTERNAL.
func Fail(ctx context.Context, reason kvrelaypb.RelayErrorReason, format string, args ...any) error {
	r, ok := LookupReason(reason)
	if !ok {
		r = reasons[kvrelaypb.RelayErrorReason_RELAY_ERROR_REASON_INTERNAL]
		format = fmt.Sprintf("kvrelay: Fail with reason %d: ", int32(reason)) + format
	}
	// SetTrailer fails only outside an RPC (no transport stream in ctx);
	// the status error is still the right return value then.
	_ = grpc.SetTrailer(ctx, metadata.Pairs(ErrorReasonTrailer, r.Name()))
	return status.Errorf(r.Code, format, args...)
}
