// Package abi pins the numbers and byte layouts shared by the WebAssembly
// consumer module (wasm/guest) and its hosts (wasm/host, the Node runner, any
// host in another language): status codes, query kinds, the fixed-layout
// records the module writes into caller memory, and the msgpack encodings of
// a manifest and of an assignment. docs/abi.md is the prose form of this
// package; every number here is exchanged across the module boundary and must
// not change once released.
//
// The package imports only ckf and consumer (for the Go types it encodes), so
// the guest stays small and a host need not link wazero to build arguments.
package abi

import (
	"errors"
	"fmt"

	"github.com/ckfrelay/ckfrelay/consumer"
	"github.com/ckfrelay/ckfrelay/wire"
)

// Version is the ABI version reported by the abi_version export. It changes
// only when an export's signature or a record layout changes incompatibly.
const Version = 1

// Code is the status an export returns. Non-negative values are successes
// whose meaning depends on the export (an outcome, a mask, a length);
// negative values are the errors below. The numbers cross the module
// boundary and must not change.
type Code int32

// Status codes.
const (
	OK Code = 0

	// Call errors: the host misused the ABI; nothing changed.
	ErrNotConfigured  Code = -1 // configure has not succeeded yet
	ErrBadArgument    Code = -2 // a pointer/length outside memory, an unknown kind, a negative size
	ErrInternal       Code = -3 // a panic inside the module was recovered; state is unchanged or the call reports its own detail
	ErrOutOfMemory    Code = -4 // an allocation above the module's limit was refused
	ErrBufferTooSmall Code = -5 // the output buffer cannot hold the result

	// Manifest errors (configure). Detail in last_error.
	ErrInvalidManifest  Code = -10 // the manifest failed validation (consumer.ErrInvalidManifest)
	ErrManifestEncoding Code = -11 // the manifest bytes do not decode

	// Assignment and lane errors (assign, retire, lane_status).
	ErrWrongConsumer        Code = -20
	ErrWrongLane            Code = -21
	ErrWrongPool            Code = -22
	ErrFormatMismatch       Code = -23
	ErrStaleAssignmentEpoch Code = -24
	ErrAssignmentEncoding   Code = -25 // the identity+lease bytes do not decode

	// Query errors.
	ErrUnavailable  Code = -30 // no lane is ready
	ErrInvalidQuery Code = -31 // block size ≤ 0 and the like

	// Frame decode errors (apply): the frame was rejected before reaching any
	// lane; nothing changed.
	ErrFrameTruncated      Code = -40
	ErrFrameTrailingBytes  Code = -41
	ErrFrameTooLarge       Code = -42
	ErrFrameUnknownVersion Code = -43
	ErrFrameUnknownKind    Code = -44
	ErrFrameMalformed      Code = -45
)

var codeNames = map[Code]string{
	OK:                      "OK",
	ErrNotConfigured:        "NotConfigured",
	ErrBadArgument:          "BadArgument",
	ErrInternal:             "Internal",
	ErrOutOfMemory:          "OutOfMemory",
	ErrBufferTooSmall:       "BufferTooSmall",
	ErrInvalidManifest:      "InvalidManifest",
	ErrManifestEncoding:     "ManifestEncoding",
	ErrWrongConsumer:        "WrongConsumer",
	ErrWrongLane:            "WrongLane",
	ErrWrongPool:            "WrongPool",
	ErrFormatMismatch:       "FormatMismatch",
	ErrStaleAssignmentEpoch: "StaleAssignmentEpoch",
	ErrAssignmentEncoding:   "AssignmentEncoding",
	ErrUnavailable:          "Unavailable",
	ErrInvalidQuery:         "InvalidQuery",
	ErrFrameTruncated:       "FrameTruncated",
	ErrFrameTrailingBytes:   "FrameTrailingBytes",
	ErrFrameTooLarge:        "FrameTooLarge",
	ErrFrameUnknownVersion:  "FrameUnknownVersion",
	ErrFrameUnknownKind:     "FrameUnknownKind",
	ErrFrameMalformed:       "FrameMalformed",
}

func (c Code) String() string {
	if n, ok := codeNames[c]; ok {
		return n
	}
	return fmt.Sprintf("Code(%d)", int32(c))
}

// codeSentinels maps each error code to the sentinel of the package that
// defines the condition natively, so errors from the module and from the
// native consumer match the same errors.Is targets.
var codeSentinels = map[Code]error{
	ErrInvalidManifest:      consumer.ErrInvalidManifest,
	ErrManifestEncoding:     consumer.ErrInvalidManifest,
	ErrWrongConsumer:        consumer.ErrWrongConsumer,
	ErrWrongLane:            consumer.ErrWrongLane,
	ErrWrongPool:            consumer.ErrWrongPool,
	ErrFormatMismatch:       consumer.ErrFormatMismatch,
	ErrStaleAssignmentEpoch: consumer.ErrStaleAssignmentEpoch,
	ErrUnavailable:          consumer.ErrUnavailable,
	ErrInvalidQuery:         consumer.ErrInvalidQuery,
	ErrFrameTruncated:       wire.ErrTruncated,
	ErrFrameTrailingBytes:   wire.ErrTrailingBytes,
	ErrFrameTooLarge:        wire.ErrFrameTooLarge,
	ErrFrameUnknownVersion:  wire.ErrUnknownVersion,
	ErrFrameUnknownKind:     wire.ErrUnknownKind,
	ErrFrameMalformed:       wire.ErrMalformed,
}

// Sentinel returns the consumer or wire sentinel a code stands for, or nil
// for codes that exist only at the ABI (bad argument, internal, …).
func (c Code) Sentinel() error { return codeSentinels[c] }

// CodeOf maps an error from the consumer, wire or ckf packages to its code;
// errors it does not know map to [ErrInternal]. A nil error is [OK].
func CodeOf(err error) Code {
	if err == nil {
		return OK
	}
	// Most specific first: a ManifestError matches ErrInvalidManifest too.
	order := []Code{
		ErrWrongConsumer, ErrWrongLane, ErrWrongPool, ErrFormatMismatch, ErrStaleAssignmentEpoch,
		ErrUnavailable, ErrInvalidQuery,
		ErrFrameTruncated, ErrFrameTrailingBytes, ErrFrameTooLarge, ErrFrameUnknownVersion,
		ErrFrameUnknownKind, ErrFrameMalformed,
		ErrInvalidManifest,
	}
	for _, c := range order {
		if errors.Is(err, codeSentinels[c]) {
			return c
		}
	}
	return ErrInternal
}

// Query kinds: what the input array of the query export holds.
const (
	QueryLocalHashes    = 0 // u64 LE local block hashes; chained inside the module
	QuerySequenceHashes = 1 // u64 LE canonical sequence hashes
	QueryTokens         = 2 // u32 LE token ids, hashed in blocks of block_size with salt
	// QueryTokensWith is QueryTokens with per-block multimodal hashes and
	// Eagle windows: the input is count bytes in the token query layout
	// (query.go, [ParseTokenQuery]). Modules before it answer BadArgument.
	QueryTokensWith = 3
)

// Record sizes, in bytes, of the fixed layouts the module writes into caller
// memory. Offsets are documented in docs/abi.md and mirrored by the
// Encode/Decode functions in record.go.
const (
	QueryRecordSize = 80
	ResultSize      = 32
	LaneStatusSize  = 168
	StatsSize       = 48
)

// MaxAlloc is the largest single buffer the alloc export hands out. A larger
// request returns 0 instead of running the module out of memory (which would
// trap: the Go runtime's out-of-memory is fatal, not a recoverable panic).
// It is consumer.MaxInputBytes, the input cap the native consumer keeps
// too, so a host refuses a larger frame (FrameTooLarge) or query
// (InvalidQuery) before allocating, with the native consumer's errors.
const MaxAlloc = consumer.MaxInputBytes

// MaxTableBytes bounds the transposed table a manifest may ask for
// (bucket_count × 128 bytes): 2^23 buckets = 1 GiB. A wasm32 Go program
// cannot hold much more than that alongside its frames.
const MaxTableBytes = 1 << 30
