package wire

import (
	"encoding/binary"
	"math"
	"strconv"
)

// This file holds the minimal msgpack reader and appenders the codecs are
// built on. They work on a byte slice in memory, never allocate, and check
// every announced length against the bytes that remain before slicing, so a
// hostile length header can neither panic nor make anything allocate.
// See docs/RATIONALE.md "Why a hand-written msgpack reader in wire?".

// msgpack type bytes used here.
const (
	mpNil      = 0xc0
	mpFalse    = 0xc2
	mpTrue     = 0xc3
	mpBin8     = 0xc4
	mpBin16    = 0xc5
	mpBin32    = 0xc6
	mpExt8     = 0xc7
	mpExt16    = 0xc8
	mpExt32    = 0xc9
	mpFloat32  = 0xca
	mpFloat64  = 0xcb
	mpUint8    = 0xcc
	mpUint16   = 0xcd
	mpUint32   = 0xce
	mpUint64   = 0xcf
	mpInt8     = 0xd0
	mpInt16    = 0xd1
	mpInt32    = 0xd2
	mpInt64    = 0xd3
	mpFixExt1  = 0xd4
	mpFixExt2  = 0xd5
	mpFixExt4  = 0xd6
	mpFixExt8  = 0xd7
	mpFixExt16 = 0xd8
	mpStr8     = 0xd9
	mpStr16    = 0xda
	mpStr32    = 0xdb
	mpArray16  = 0xdc
	mpArray32  = 0xdd
	mpMap16    = 0xde
	mpMap32    = 0xdf
)

// maxSkipDepth bounds the nesting of values skipped inside RouterEvents
// (unknown fields), so a deeply nested input cannot exhaust the stack.
const maxSkipDepth = 32

// reader decodes msgpack values from b starting at off. field names the value
// being decoded, for errors.
type reader struct {
	b     []byte
	off   int
	field string // constant strings only: setting it must not allocate
	kind  Kind   // frame kind once known, for errors
}

func (r *reader) fail(kind error, detail string) *DecodeError {
	return &DecodeError{Kind: kind, Frame: r.kind, Offset: r.off, Field: r.field, Detail: detail}
}

func (r *reader) remaining() int { return len(r.b) - r.off }

// need fails with ErrTruncated unless n more bytes are present.
func (r *reader) need(n int) error {
	if n < 0 || n > r.remaining() {
		return r.fail(ErrTruncated, "")
	}
	return nil
}

func (r *reader) peek() (byte, error) {
	if r.off >= len(r.b) {
		return 0, r.fail(ErrTruncated, "")
	}
	return r.b[r.off], nil
}

func (r *reader) be(n int) uint64 {
	p := r.b[r.off : r.off+n]
	r.off += n
	switch n {
	case 1:
		return uint64(p[0])
	case 2:
		return uint64(binary.BigEndian.Uint16(p))
	case 4:
		return uint64(binary.BigEndian.Uint32(p))
	}
	return binary.BigEndian.Uint64(p)
}

// length reads an n-byte big-endian length that follows a type byte.
func (r *reader) length(n int) (int, error) {
	if err := r.need(n); err != nil {
		return 0, err
	}
	v := r.be(n)
	if v > math.MaxInt32 {
		// Larger than any frame limit and than a wasm address space.
		return 0, r.fail(ErrTruncated, "length beyond input")
	}
	return int(v), nil
}

// isNil consumes a nil and reports true, or consumes nothing.
func (r *reader) isNil() bool {
	if r.off < len(r.b) && r.b[r.off] == mpNil {
		r.off++
		return true
	}
	return false
}

// arrayLen reads an array header.
func (r *reader) arrayLen() (int, error) { return r.containerLen(0x90, mpArray16, mpArray32, "array") }

// expectArray reads an array header of exactly n elements.
func (r *reader) expectArray(n int) error {
	start := r.off
	got, err := r.arrayLen()
	if err != nil {
		return err
	}
	if got != n {
		r.off = start
		return r.fail(ErrMalformed, "want array of "+itoa(n)+" elements, got "+itoa(got))
	}
	return nil
}

// mapLen reads a map header.
func (r *reader) mapLen() (int, error) { return r.containerLen(0x80, mpMap16, mpMap32, "map") }

// containerLen reads an array or map header: a fix form (fix..fix+15), or a
// 16- or 32-bit length. On a wrong type it consumes nothing.
func (r *reader) containerLen(fix, c16, c32 byte, what string) (int, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	start := r.off
	r.off++
	switch {
	case c >= fix && c <= fix+0x0f:
		return int(c & 0x0f), nil
	case c == c16:
		return r.length(2)
	case c == c32:
		return r.length(4)
	}
	r.off = start
	return 0, r.fail(ErrMalformed, "want "+what+", got "+typeName(c))
}

// uint reads any msgpack integer whose value is in 0..max. Every integer
// width is accepted (a sender may use int64 for a small value); negative
// values and values above max are ErrMalformed.
func (r *reader) uint(max uint64) (uint64, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	start := r.off
	var v uint64
	switch {
	case c <= 0x7f:
		r.off++
		v = uint64(c)
	case c >= mpUint8 && c <= mpUint64:
		n := 1 << (c - mpUint8)
		if err := r.need(1 + n); err != nil {
			return 0, err
		}
		r.off++
		v = r.be(n)
	case c >= mpInt8 && c <= mpInt64:
		n := 1 << (c - mpInt8)
		if err := r.need(1 + n); err != nil {
			return 0, err
		}
		r.off++
		raw := r.be(n)
		shift := 64 - 8*uint(n)
		s := int64(raw<<shift) >> shift // sign-extend
		if s < 0 {
			r.off = start
			return 0, r.fail(ErrMalformed, "negative value "+itoa64(s))
		}
		v = uint64(s)
	case c >= 0xe0:
		return 0, r.fail(ErrMalformed, "negative value "+itoa64(int64(int8(c))))
	default:
		return 0, r.fail(ErrMalformed, "want integer, got "+typeName(c))
	}
	if v > max {
		r.off = start
		return 0, r.fail(ErrMalformed, "value "+utoa(v)+" exceeds "+utoa(max))
	}
	return v, nil
}

// int reads any msgpack integer that fits an int64.
func (r *reader) int() (int64, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	switch {
	case c >= 0xe0:
		r.off++
		return int64(int8(c)), nil
	case c >= mpInt8 && c <= mpInt64:
		n := 1 << (c - mpInt8)
		if err := r.need(1 + n); err != nil {
			return 0, err
		}
		r.off++
		raw := r.be(n)
		shift := 64 - 8*uint(n)
		return int64(raw<<shift) >> shift, nil
	}
	v, err := r.uint(math.MaxInt64)
	return int64(v), err
}

// bytesOf reads a bin (wantStr false) or str (wantStr true) value and returns
// a view of its payload inside r.b.
func (r *reader) bytesOf(wantStr bool) ([]byte, error) {
	c, err := r.peek()
	if err != nil {
		return nil, err
	}
	start := r.off
	r.off++
	n := -1
	if wantStr {
		switch {
		case c >= 0xa0 && c <= 0xbf:
			n = int(c & 0x1f)
		case c == mpStr8:
			n, err = r.length(1)
		case c == mpStr16:
			n, err = r.length(2)
		case c == mpStr32:
			n, err = r.length(4)
		}
	} else {
		switch c {
		case mpBin8:
			n, err = r.length(1)
		case mpBin16:
			n, err = r.length(2)
		case mpBin32:
			n, err = r.length(4)
		}
	}
	if err != nil {
		return nil, err
	}
	if n < 0 {
		r.off = start
		want := "bin"
		if wantStr {
			want = "str"
		}
		return nil, r.fail(ErrMalformed, "want "+want+", got "+typeName(c))
	}
	if err := r.need(n); err != nil {
		return nil, err
	}
	p := r.b[r.off : r.off+n : r.off+n]
	r.off += n
	return p, nil
}

func (r *reader) bin() ([]byte, error) { return r.bytesOf(false) }
func (r *reader) str() ([]byte, error) { return r.bytesOf(true) }

// skip consumes one value of any type, bounded in nesting depth.
func (r *reader) skip(depth int) error {
	if depth > maxSkipDepth {
		return r.fail(ErrMalformed, "nesting deeper than "+itoa(maxSkipDepth))
	}
	c, err := r.peek()
	if err != nil {
		return err
	}
	switch {
	case c <= 0x7f || c >= 0xe0 || c == mpNil || c == mpFalse || c == mpTrue:
		r.off++
		return nil
	case c >= 0xa0 && c <= 0xbf, c == mpStr8, c == mpStr16, c == mpStr32:
		_, err = r.str()
		return err
	case c == mpBin8, c == mpBin16, c == mpBin32:
		_, err = r.bin()
		return err
	case c >= mpUint8 && c <= mpUint64, c >= mpInt8 && c <= mpInt64:
		n := 1 + 1<<((c-mpUint8)&3)
		if err := r.need(n); err != nil {
			return err
		}
		r.off += n
		return nil
	case c == mpFloat32 || c == mpFloat64:
		n := 5
		if c == mpFloat64 {
			n = 9
		}
		if err := r.need(n); err != nil {
			return err
		}
		r.off += n
		return nil
	case c >= mpFixExt1 && c <= mpFixExt16:
		n := 2 + 1<<(c-mpFixExt1) // type byte + ext type + 1..16 data bytes
		if err := r.need(n); err != nil {
			return err
		}
		r.off += n
		return nil
	case c >= mpExt8 && c <= mpExt32:
		r.off++
		n, err := r.length(1 << (c - mpExt8))
		if err != nil {
			return err
		}
		if err := r.need(n + 1); err != nil {
			return err
		}
		r.off += n + 1
		return nil
	case c >= 0x90 && c <= 0x9f, c == mpArray16, c == mpArray32:
		n, err := r.arrayLen()
		if err != nil {
			return err
		}
		for range n {
			if err := r.skip(depth + 1); err != nil {
				return err
			}
		}
		return nil
	case c >= 0x80 && c <= 0x8f, c == mpMap16, c == mpMap32:
		n, err := r.mapLen()
		if err != nil {
			return err
		}
		for range 2 * n {
			if err := r.skip(depth + 1); err != nil {
				return err
			}
		}
		return nil
	}
	return r.fail(ErrMalformed, "reserved type byte 0xc1")
}

// end fails with ErrTrailingBytes unless every byte was consumed.
func (r *reader) end() error {
	if r.off != len(r.b) {
		r.field = ""
		return r.fail(ErrTrailingBytes, itoa(r.remaining())+" bytes after the value")
	}
	return nil
}

func typeName(c byte) string {
	switch {
	case c <= 0x7f, c >= 0xe0, c >= mpUint8 && c <= mpInt64:
		return "integer"
	case c >= 0x80 && c <= 0x8f, c == mpMap16, c == mpMap32:
		return "map"
	case c >= 0x90 && c <= 0x9f, c == mpArray16, c == mpArray32:
		return "array"
	case c >= 0xa0 && c <= 0xbf, c == mpStr8, c == mpStr16, c == mpStr32:
		return "str"
	case c == mpNil:
		return "nil"
	case c == mpFalse, c == mpTrue:
		return "bool"
	case c >= mpBin8 && c <= mpBin32:
		return "bin"
	case c == mpFloat32, c == mpFloat64:
		return "float"
	case c == 0xc1:
		return "reserved 0xc1"
	}
	return "ext"
}

// Appenders. Integers use the smallest encoding (canonical form).

func appendArrayLen(b []byte, n int) []byte {
	switch {
	case n <= 15:
		return append(b, 0x90|byte(n))
	case n <= math.MaxUint16:
		return append(b, mpArray16, byte(n>>8), byte(n))
	}
	return binary.BigEndian.AppendUint32(append(b, mpArray32), uint32(n))
}

func appendMapLen(b []byte, n int) []byte {
	switch {
	case n <= 15:
		return append(b, 0x80|byte(n))
	case n <= math.MaxUint16:
		return append(b, mpMap16, byte(n>>8), byte(n))
	}
	return binary.BigEndian.AppendUint32(append(b, mpMap32), uint32(n))
}

func appendUint(b []byte, v uint64) []byte {
	switch {
	case v <= 0x7f:
		return append(b, byte(v))
	case v <= math.MaxUint8:
		return append(b, mpUint8, byte(v))
	case v <= math.MaxUint16:
		return append(b, mpUint16, byte(v>>8), byte(v))
	case v <= math.MaxUint32:
		return binary.BigEndian.AppendUint32(append(b, mpUint32), uint32(v))
	}
	return binary.BigEndian.AppendUint64(append(b, mpUint64), v)
}

func appendInt(b []byte, v int64) []byte {
	switch {
	case v >= 0:
		return appendUint(b, uint64(v))
	case v >= -32:
		return append(b, byte(int8(v)))
	case v >= math.MinInt8:
		return append(b, mpInt8, byte(int8(v)))
	case v >= math.MinInt16:
		return binary.BigEndian.AppendUint16(append(b, mpInt16), uint16(int16(v)))
	case v >= math.MinInt32:
		return binary.BigEndian.AppendUint32(append(b, mpInt32), uint32(int32(v)))
	}
	return binary.BigEndian.AppendUint64(append(b, mpInt64), uint64(v))
}

// appendBinHeader appends a bin header for n bytes (n <= MaxUint32).
func appendBinHeader(b []byte, n int) []byte {
	switch {
	case n <= math.MaxUint8:
		return append(b, mpBin8, byte(n))
	case n <= math.MaxUint16:
		return append(b, mpBin16, byte(n>>8), byte(n))
	}
	return binary.BigEndian.AppendUint32(append(b, mpBin32), uint32(n))
}

func appendStr(b []byte, s string) []byte {
	n := len(s)
	switch {
	case n <= 31:
		b = append(b, 0xa0|byte(n))
	case n <= math.MaxUint8:
		b = append(b, mpStr8, byte(n))
	case n <= math.MaxUint16:
		b = append(b, mpStr16, byte(n>>8), byte(n))
	default:
		b = binary.BigEndian.AppendUint32(append(b, mpStr32), uint32(n))
	}
	return append(b, s...)
}

func appendNil(b []byte) []byte { return append(b, mpNil) }

func itoa(v int) string     { return strconv.Itoa(v) }
func itoa64(v int64) string { return strconv.FormatInt(v, 10) }
func utoa(v uint64) string  { return strconv.FormatUint(v, 10) }
