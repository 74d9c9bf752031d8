package wire

import (
	"github.com/ckfrelay/ckfrelay/ckf"
)

// The parts of a frame as standalone msgpack records, for encodings built
// from the same pieces (the consumer ABI's manifest and assignment,
// docs/abi.md §6): one codec, so a pool id, format, identity or lease is the
// same bytes wherever it appears and is read under the same rules (any
// integer width, exact array lengths, bounded lengths, typed errors).

// AppendIdentity appends a producer identity exactly as frames carry it. It
// fails with [ErrInvalidFrame] when a digest source is not defined.
func AppendIdentity(dst []byte, id *ckf.ProducerIdentity) ([]byte, error) {
	b, err := appendIdentity(dst, id)
	if err != nil {
		return dst, err
	}
	return b, nil
}

// AppendLease appends a lane lease exactly as frames carry it.
func AppendLease(dst []byte, l *ckf.LaneLease) []byte { return appendLease(dst, l) }

// AppendPoolID appends a pool id exactly as an identity carries it. Digest
// sources above [ckf.DigestExplicit] are written as they are (and rejected
// by [Decoder.PoolID]).
func AppendPoolID(dst []byte, p *ckf.PoolID) []byte { return appendPoolID(dst, p) }

// AppendDomain appends a routing domain as the array(4) of its (digest,
// source) pairs: a pool id without its dc_id.
func AppendDomain(dst []byte, d *ckf.Domain) []byte {
	return appendDigests(appendArrayLen(dst, 4), d)
}

// AppendFormat appends a filter format exactly as an identity carries it.
func AppendFormat(dst []byte, f *ckf.Format) []byte { return appendFormat(dst, f) }

// AppendArrayHeader appends a msgpack array header for n elements.
func AppendArrayHeader(dst []byte, n int) []byte { return appendArrayLen(dst, n) }

// AppendUint appends v in its smallest msgpack encoding.
func AppendUint(dst []byte, v uint64) []byte { return appendUint(dst, v) }

// AppendNil appends msgpack nil.
func AppendNil(dst []byte) []byte { return appendNil(dst) }

// Decoder reads a record composed of frame parts from one byte slice, under
// the frame decoder's rules (docs/wire.md §2.1). Every error is a
// [*DecodeError] (ErrTruncated, ErrMalformed, ErrTrailingBytes) naming the
// byte offset and the field. A Decoder never allocates beyond its results.
type Decoder struct{ r reader }

// NewDecoder returns a Decoder at the start of b.
func NewDecoder(b []byte) *Decoder { return &Decoder{r: reader{b: b}} }

// Array reads an array header of exactly n elements; field names it.
func (d *Decoder) Array(n int, field string) error {
	d.r.field = field
	return d.r.expectArray(n)
}

// Uint reads an integer in 0..max; field names it.
func (d *Decoder) Uint(max uint64, field string) (uint64, error) {
	d.r.field = field
	return d.r.uint(max)
}

// Offset returns how many bytes of b the Decoder has consumed.
func (d *Decoder) Offset() int { return d.r.off }

// Nil consumes a nil and reports true, or consumes nothing.
func (d *Decoder) Nil() bool { return d.r.isNil() }

// Identity reads a producer identity.
func (d *Decoder) Identity() (ckf.ProducerIdentity, error) {
	var id ckf.ProducerIdentity
	err := d.r.identity(&id)
	return id, err
}

// Lease reads a lane lease.
func (d *Decoder) Lease() (ckf.LaneLease, error) {
	var l ckf.LaneLease
	d.r.field = "lease"
	err := d.r.lease(&l)
	return l, err
}

// PoolID reads a pool id.
func (d *Decoder) PoolID() (ckf.PoolID, error) {
	var p ckf.PoolID
	err := d.r.poolID(&p, &standaloneFields.pool)
	return p, err
}

// Domain reads a domain written by [AppendDomain].
func (d *Decoder) Domain() (ckf.Domain, error) {
	var dom ckf.Domain
	names := &standaloneFields.domain
	d.r.field = names.self
	if err := d.r.expectArray(4); err != nil {
		return dom, err
	}
	err := d.r.digests(&dom, names)
	return dom, err
}

// Format reads a filter format.
func (d *Decoder) Format() (ckf.Format, error) {
	var f ckf.Format
	err := d.r.format(&f, &standaloneFields.format)
	return f, err
}

// End fails with ErrTrailingBytes unless every byte was read.
func (d *Decoder) End() error { return d.r.end() }
