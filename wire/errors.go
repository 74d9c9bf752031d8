package wire

import (
	"errors"
	"fmt"
)

// Decode error categories. Every error returned by a decoder or a [Reader]
// (other than a clean [io.EOF] between frames and errors of the underlying
// io.Reader) is a [*DecodeError] wrapping exactly one of these, so callers
// branch with errors.Is and read the detail with errors.As.
var (
	// ErrTruncated: the input ended inside a value, a frame header or a
	// frame body (more bytes were announced than present).
	ErrTruncated = errors.New("wire: truncated input")
	// ErrTrailingBytes: bytes remain after one complete frame or event.
	ErrTrailingBytes = errors.New("wire: trailing bytes")
	// ErrFrameTooLarge: a frame's length prefix exceeds the frame limit, or
	// an encoded frame would. Checked before anything is allocated.
	ErrFrameTooLarge = errors.New("wire: frame too large")
	// ErrUnknownVersion: the first element of a frame is not [Version].
	ErrUnknownVersion = errors.New("wire: unknown wire version")
	// ErrUnknownKind: the frame kind is not one of the five v1 kinds.
	ErrUnknownKind = errors.New("wire: unknown frame kind")
	// ErrMalformed: the input is well-delimited but not a valid frame or
	// event: a wrong msgpack type, array length or bin size, an integer out
	// of its field's range, an unknown enum value, a missing required field.
	ErrMalformed = errors.New("wire: malformed input")
	// ErrLimitExceeded: an event batch holds more events, or an event more
	// blocks (hashes), than the [BatchLimits] it was decoded under. Checked
	// while decoding, before the excess is allocated.
	ErrLimitExceeded = errors.New("wire: batch limit exceeded")
)

// ErrInvalidFrame is returned by the encoders when a [Frame] or event cannot
// be represented on the wire (unknown kind, unknown enum value, a payload
// larger than a msgpack bin can hold, more chunks than a uint32 counts).
var ErrInvalidFrame = errors.New("wire: frame cannot be encoded")

// DecodeError is the detailed form of a decode failure. Kind is one of the
// decode sentinels above and errors.Is(err, Kind) holds.
type DecodeError struct {
	Kind   error  // ErrTruncated, ErrTrailingBytes, ErrFrameTooLarge, ErrUnknownVersion, ErrUnknownKind, ErrMalformed or ErrLimitExceeded
	Frame  Kind   // the frame kind being decoded, 0 if not yet known (or for events)
	Offset int    // byte offset in the frame (or event document) where the problem was detected
	Field  string // dotted path of the field being decoded, e.g. "identity.format.seed"; may be empty
	Detail string // short human-readable explanation; may be empty
}

func (e *DecodeError) Error() string {
	s := fmt.Sprintf("%v at offset %d", e.Kind, e.Offset)
	if e.Frame != 0 {
		s += " in " + e.Frame.String() + " frame"
	}
	if e.Field != "" {
		s += " (" + e.Field + ")"
	}
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	return s
}

// Unwrap returns the sentinel kind.
func (e *DecodeError) Unwrap() error { return e.Kind }

func encodeError(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidFrame}, args...)...)
}

// ErrInvalidEvent is returned by the RouterEvent encoders for an event with
// an unknown kind or storage tier.
var ErrInvalidEvent = errors.New("wire: event cannot be encoded")

func eventError(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidEvent}, args...)...)
}
