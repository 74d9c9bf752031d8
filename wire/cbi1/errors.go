package cbi1

import (
	"errors"
	"fmt"
)

// Decode failure categories. Every error [Decode] and [Assembler.Add] return
// is an [*Error] wrapping exactly one of these (errors.Is works through it).
// The first seven follow the variants of Dynamo's codec error; callers
// should treat every one alike for stream purposes: the pool replica is
// invalid and the stream must be closed (Dynamo's contract: "unsupported
// CBI1 payload").
var (
	// ErrTruncated: the frame is shorter than the 48-byte header.
	ErrTruncated = errors.New("cbi1: frame shorter than the header")
	// ErrFrameTooLarge: the frame is longer than MaxFrameBytes. Checked
	// before anything else is read.
	ErrFrameTooLarge = errors.New("cbi1: frame too large")
	// ErrMagic: the first four bytes are not "CBI1".
	ErrMagic = errors.New("cbi1: bad magic")
	// ErrWireVersion: the wire version is not 1.
	ErrWireVersion = errors.New("cbi1: unsupported wire version")
	// ErrChecksum: the header's checksum is not the low 32 bits of the
	// body's XXH3-64.
	ErrChecksum = errors.New("cbi1: body checksum mismatch")
	// ErrFormat: the CKF format is not version 1 / 16 fingerprint bits / 4
	// slots with a bucket count that is a power of two in 2..=2^24, or it
	// differs from the format the caller expected.
	ErrFormat = errors.New("cbi1: unsupported or mismatched CKF format")
	// ErrFlags: the flags are neither 1 (snapshot chunk) nor 2 (delta).
	ErrFlags = errors.New("cbi1: unknown frame flags")
	// ErrMalformed: the body is not a valid snapshot chunk or delta: too
	// short, a length other than its counts imply, chunk_count 0,
	// chunk_index >= chunk_count, words outside the table, a bucket index
	// >= bucket_count.
	ErrMalformed = errors.New("cbi1: malformed body")
	// ErrLimitExceeded: a delta announces more than MaxDeltaImages images or
	// a chunk holds more than MaxChunkBuckets words.
	ErrLimitExceeded = errors.New("cbi1: frame limit exceeded")
	// ErrChunkSequence: a snapshot chunk out of order, from another epoch,
	// format or chunk count, or not contiguous with the previous one
	// ([Assembler]).
	ErrChunkSequence = errors.New("cbi1: snapshot chunk sequence violation")
	// ErrIncompleteCoverage: the last chunk arrived but the chunks do not
	// cover the table ([Assembler]).
	ErrIncompleteCoverage = errors.New("cbi1: snapshot chunks do not cover the table")
)

// Encoder failures: [AppendFrame] and the Encode functions wrap
// ErrInvalidFrame (and, for an oversized delta, also ErrDeltaTooLarge).
var (
	// ErrInvalidFrame: the frame cannot be encoded (invalid format, unknown
	// kind, chunk or image fields that a decoder would reject).
	ErrInvalidFrame = errors.New("cbi1: frame cannot be encoded")
	// ErrDeltaTooLarge: a delta with more than MaxDeltaImages images. The
	// publication must be sent as a snapshot instead.
	ErrDeltaTooLarge = errors.New("cbi1: delta has more than MaxDeltaImages images; send a snapshot")
)

// Error is the detailed form of a decode failure. Reason is one of the
// decode sentinels and errors.Is(err, Reason) holds.
type Error struct {
	Reason error  // ErrTruncated … ErrIncompleteCoverage
	Offset int    // byte offset in the frame of the field at fault (0 for whole-frame checks)
	Field  string // the field at fault, e.g. "chunk_index"; may be empty
	Detail string // short human-readable explanation; may be empty
}

func (e *Error) Error() string {
	s := fmt.Sprintf("%v at offset %d", e.Reason, e.Offset)
	if e.Field != "" {
		s += " (" + e.Field + ")"
	}
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	return s
}

// Unwrap returns the sentinel reason.
func (e *Error) Unwrap() error { return e.Reason }

func decodeErr(reason error, offset int, field, format string, args ...any) *Error {
	return &Error{Reason: reason, Offset: offset, Field: field, Detail: fmt.Sprintf(format, args...)}
}

func encodeErr(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidFrame}, args...)...)
}
