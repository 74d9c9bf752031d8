package wire

import (
	"encoding/binary"
	"errors"
	"io"
	"math"
)

// DefaultMaxFrameBytes is the default frame limit: the largest msgpack frame
// body (excluding the 4-byte length prefix) a [Reader] accepts and a
// [Writer] emits.
const DefaultMaxFrameBytes = 8 << 20

// LengthPrefixBytes is the size of the big-endian length that precedes every
// frame on a stream.
const LengthPrefixBytes = 4

// Writer writes length-prefixed frames to an io.Writer. The zero value is
// not usable; call [NewWriter]. A Writer is not safe for concurrent use.
//
// A Writer reuses its encoding buffer between frames, but keeps it only up to
// [RetainedBufferBytes]: a long-lived stream that once wrote a large frame
// (a snapshot chunk, a mass-removal delta) must not hold that much memory for
// the rest of its life.
type Writer struct {
	w     io.Writer
	limit int
	buf   []byte
	held  bool // Hold: keep buf whatever its size until Release
}

// RetainedBufferBytes is the largest encoding buffer a [Writer] keeps for
// its next frame; a larger one is released after its frame is written.
const RetainedBufferBytes = 256 << 10

// keep retains b's storage for the next frame when it is small enough, or
// while the writer holds its buffer.
func (w *Writer) keep(b []byte) {
	if w.held || cap(b) <= RetainedBufferBytes {
		w.buf = b[:0]
	} else {
		w.buf = nil
	}
}

// Hold makes buf (its capacity; it may be nil) the encoding buffer and keeps
// it, whatever it grows to, until [Writer.Release]: a run of large frames —
// a snapshot's chunks — then encodes into one buffer instead of allocating
// one per frame, and the caller can hand the buffer on to the next stream
// (a pool) instead of leaving it to the collector.
func (w *Writer) Hold(buf []byte) {
	w.buf, w.held = buf[:0], true
}

// Release ends [Writer.Hold] and returns the held buffer; the writer keeps
// no buffer of its own after it.
func (w *Writer) Release() []byte {
	b := w.buf
	w.buf, w.held = nil, false
	return b
}

// NewWriter returns a Writer that refuses frames larger than maxFrameBytes
// (≤ 0 means [DefaultMaxFrameBytes]; values above 2^32-1 are clamped to it,
// the largest length a prefix can carry).
func NewWriter(w io.Writer, maxFrameBytes int) *Writer {
	return &Writer{w: w, limit: clampLimit(maxFrameBytes)}
}

func clampLimit(n int) int {
	if n <= 0 {
		return DefaultMaxFrameBytes
	}
	if uint64(n) > math.MaxUint32 {
		return int(min(uint64(math.MaxUint32), uint64(math.MaxInt))) // MaxInt on 32-bit targets
	}
	return n
}

// MaxFrameBytes returns the writer's frame limit.
func (w *Writer) MaxFrameBytes() int { return w.limit }

// WriteFrame encodes f and writes its length prefix and body in one Write
// call. A frame whose body would exceed the limit is not written and the
// error wraps [ErrFrameTooLarge]; an unencodable frame returns the
// [ErrInvalidFrame] error of [AppendFrame]. Errors of the underlying writer
// are returned as they are; after one the stream position is unknown and the
// caller should close the stream.
func (w *Writer) WriteFrame(f *Frame) error {
	b := append(w.buf[:0], 0, 0, 0, 0)
	b, err := AppendFrame(b, f)
	defer w.keep(b)
	if err != nil {
		return err
	}
	n := len(b) - LengthPrefixBytes
	if n > w.limit {
		return &DecodeError{Kind: ErrFrameTooLarge, Frame: f.Kind, Detail: "frame of " + itoa(n) + " bytes exceeds limit " + itoa(w.limit)}
	}
	binary.BigEndian.PutUint32(b, uint32(n))
	_, err = w.w.Write(b)
	return err
}

// WriteRaw writes one already-encoded frame body with its length prefix,
// after checking it against the limit. It does not decode the body.
func (w *Writer) WriteRaw(body []byte) error {
	if len(body) > w.limit {
		return &DecodeError{Kind: ErrFrameTooLarge, Detail: "frame of " + itoa(len(body)) + " bytes exceeds limit " + itoa(w.limit)}
	}
	b := binary.BigEndian.AppendUint32(w.buf[:0], uint32(len(body)))
	b = append(b, body...)
	defer w.keep(b)
	_, err := w.w.Write(b)
	return err
}

// Reader reads length-prefixed frames from an io.Reader. The zero value is
// not usable; call [NewReader]. A Reader is not safe for concurrent use.
//
// After an error that leaves the stream out of step (a truncated frame, an
// oversize length prefix, an error of the underlying reader) every later call
// returns the same error. A frame that was read completely but failed to
// decode does not: the next call reads the next frame.
type Reader struct {
	r     io.Reader
	limit int
	buf   []byte
	hdr   [LengthPrefixBytes]byte
	err   error // sticky
	off   int64 // stream offset of the next frame's prefix
}

// NewReader returns a Reader that rejects frames larger than maxFrameBytes
// (≤ 0 means [DefaultMaxFrameBytes]). The limit is checked against the length
// prefix before any buffer is grown, so a hostile prefix cannot make the
// Reader allocate more than the limit.
func NewReader(r io.Reader, maxFrameBytes int) *Reader {
	return &Reader{r: r, limit: clampLimit(maxFrameBytes)}
}

// MaxFrameBytes returns the reader's frame limit.
func (r *Reader) MaxFrameBytes() int { return r.limit }

// ReadRaw reads the next frame body and returns it without decoding. The
// slice is owned by the Reader and valid until the next call. At a clean end
// of stream (no byte of a next prefix) it returns io.EOF; an end inside a
// prefix or a body is a [*DecodeError] wrapping [ErrTruncated]; a zero
// length is [ErrMalformed]; a length above the limit is [ErrFrameTooLarge].
// Offsets in these errors are stream offsets.
func (r *Reader) ReadRaw() ([]byte, error) {
	if r.err != nil {
		return nil, r.err
	}
	n, err := io.ReadFull(r.r, r.hdr[:])
	if err != nil {
		if err == io.EOF {
			r.err = io.EOF
		} else if errors.Is(err, io.ErrUnexpectedEOF) {
			r.err = &DecodeError{Kind: ErrTruncated, Offset: int(r.off) + n, Field: "length prefix"}
		} else {
			r.err = err
		}
		return nil, r.err
	}
	size := binary.BigEndian.Uint32(r.hdr[:])
	if uint64(size) > uint64(r.limit) {
		r.err = &DecodeError{Kind: ErrFrameTooLarge, Offset: int(r.off), Field: "length prefix",
			Detail: "frame of " + utoa(uint64(size)) + " bytes exceeds limit " + itoa(r.limit)}
		return nil, r.err
	}
	if size == 0 {
		// Consumed completely, so the stream stays in step.
		r.off += LengthPrefixBytes
		return nil, &DecodeError{Kind: ErrMalformed, Offset: int(r.off) - LengthPrefixBytes, Field: "length prefix", Detail: "empty frame"}
	}
	if cap(r.buf) < int(size) {
		r.buf = make([]byte, size)
	}
	body := r.buf[:size]
	m, err := io.ReadFull(r.r, body)
	if err != nil {
		if err == io.EOF || errors.Is(err, io.ErrUnexpectedEOF) {
			r.err = &DecodeError{Kind: ErrTruncated, Offset: int(r.off) + LengthPrefixBytes + m,
				Detail: "frame body of " + utoa(uint64(size)) + " bytes ended after " + itoa(m)}
		} else {
			r.err = err
		}
		return nil, r.err
	}
	r.off += LengthPrefixBytes + int64(size)
	return body, nil
}

// ReadFrame reads and decodes the next frame into f (see [DecodeFrame] for
// reuse and aliasing; [Frame.Payload] aliases the Reader's buffer until the
// next call). It returns io.EOF at a clean end of stream. A decode error is a
// [*DecodeError] whose Offset is relative to the frame body; f is then
// unchanged and the Reader stays usable.
func (r *Reader) ReadFrame(f *Frame) error {
	body, err := r.ReadRaw()
	if err != nil {
		return err
	}
	return DecodeFrame(body, f)
}
