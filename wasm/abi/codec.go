package abi

import (
	"errors"
	"fmt"
	"math"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/consumer"
)

// The manifest and assignment encodings are msgpack, shaped like the wire v1
// frames (SPEC §9) so one decoder style serves both and a host that already
// encodes frames needs nothing new:
//
//	manifest   = [1, consumer_instance, domain, format, lanes, verification_window]
//	lanes      = array of exactly 16 × (nil | pool_id)
//	domain     = [sem_digest bin16, sem_source, scope_digest bin16, scope_source]
//	pool_id    = [sem_digest bin16, sem_source, scope_digest bin16, scope_source, dc_id]
//	format     = [format_version, seed, bucket_count, fingerprint_bits, slots_per_bucket]
//	assignment = [identity, lease]
//	identity   = [pool_id, producer_incarnation, layout_generation, format]
//	lease      = [consumer_instance, physical_lane, assignment_epoch]
//
// Integers may use any msgpack unsigned (or non-negative fixint) width;
// sources are 0 (default_derived) or 1 (explicit). Decoders reject trailing
// bytes, wrong array lengths and out-of-range values with [ErrEncoding].

// ManifestVersion is the first element of an encoded manifest.
const ManifestVersion = 1

// ErrEncoding is wrapped by every manifest or assignment decode failure.
var ErrEncoding = errors.New("abi: malformed encoding")

// AppendManifest appends the msgpack encoding of m to dst.
func AppendManifest(dst []byte, m *consumer.Manifest) []byte {
	b := appendArray(dst, 6)
	b = appendUint(b, ManifestVersion)
	b = appendUint(b, m.ConsumerInstance)
	b = appendArray(b, 4)
	b = appendDigest(b, m.Domain.CacheSemantics)
	b = appendDigest(b, m.Domain.RoutingScope)
	b = appendFormat(b, &m.Format)
	b = appendArray(b, len(m.Lanes))
	for _, p := range m.Lanes {
		if p == nil {
			b = append(b, 0xc0)
			continue
		}
		b = appendPool(b, p)
	}
	return appendUint(b, uint64(max(m.VerificationWindow, 0)))
}

// DecodeManifest decodes an encoding written by [AppendManifest]. It does not
// validate the manifest's meaning (see consumer.Manifest.Validate).
func DecodeManifest(data []byte) (consumer.Manifest, error) {
	var m consumer.Manifest
	r := &reader{b: data}
	r.array(6)
	if v := r.uint(math.MaxUint64); r.err == nil && v != ManifestVersion {
		r.fail("manifest version %d", v)
	}
	m.ConsumerInstance = r.uint(math.MaxUint64)
	r.array(4)
	m.Domain.CacheSemantics = r.digest()
	m.Domain.RoutingScope = r.digest()
	m.Format = r.format()
	r.array(len(m.Lanes))
	for i := range m.Lanes {
		if r.err == nil && r.off < len(r.b) && r.b[r.off] == 0xc0 {
			r.off++
			continue
		}
		p := r.pool()
		if r.err == nil {
			m.Lanes[i] = &p
		}
	}
	m.VerificationWindow = int(r.uint(math.MaxInt32))
	if err := r.end(); err != nil {
		return consumer.Manifest{}, err
	}
	return m, nil
}

// AppendAssignment appends the msgpack encoding of (identity, lease) to dst.
func AppendAssignment(dst []byte, id *ckf.ProducerIdentity, lease *ckf.LaneLease) []byte {
	b := appendArray(dst, 2)
	b = appendArray(b, 4)
	b = appendPool(b, &id.Pool)
	b = appendUint(b, id.ProducerIncarnation)
	b = appendUint(b, id.LayoutGeneration)
	b = appendFormat(b, &id.Format)
	b = appendArray(b, 3)
	b = appendUint(b, lease.ConsumerInstance)
	b = appendUint(b, uint64(lease.PhysicalLane))
	return appendUint(b, lease.AssignmentEpoch)
}

// DecodeAssignment decodes an encoding written by [AppendAssignment].
func DecodeAssignment(data []byte) (ckf.ProducerIdentity, ckf.LaneLease, error) {
	var id ckf.ProducerIdentity
	var l ckf.LaneLease
	r := &reader{b: data}
	r.array(2)
	r.array(4)
	id.Pool = r.pool()
	id.ProducerIncarnation = r.uint(math.MaxUint64)
	id.LayoutGeneration = r.uint(math.MaxUint64)
	id.Format = r.format()
	r.array(3)
	l.ConsumerInstance = r.uint(math.MaxUint64)
	l.PhysicalLane = uint8(r.uint(math.MaxUint8))
	l.AssignmentEpoch = r.uint(math.MaxUint64)
	if err := r.end(); err != nil {
		return ckf.ProducerIdentity{}, ckf.LaneLease{}, err
	}
	return id, l, nil
}

func appendDigest(b []byte, d ckf.ScopedDigest) []byte {
	b = append(b, 0xc4, 16)
	b = append(b, d.Digest[:]...)
	return appendUint(b, uint64(d.Source))
}

func appendPool(b []byte, p *ckf.PoolID) []byte {
	b = appendArray(b, 5)
	b = appendDigest(b, p.Domain.CacheSemantics)
	b = appendDigest(b, p.Domain.RoutingScope)
	return appendUint(b, p.DCID)
}

func appendFormat(b []byte, f *ckf.Format) []byte {
	b = appendArray(b, 5)
	b = appendUint(b, uint64(f.Version))
	b = appendUint(b, f.Seed)
	b = appendUint(b, f.BucketCount)
	b = appendUint(b, uint64(f.FingerprintBits))
	return appendUint(b, uint64(f.SlotsPerBucket))
}

func appendArray(b []byte, n int) []byte {
	if n < 16 {
		return append(b, 0x90|byte(n))
	}
	return append(b, 0xdc, byte(n>>8), byte(n))
}

func appendUint(b []byte, v uint64) []byte {
	switch {
	case v < 128:
		return append(b, byte(v))
	case v <= math.MaxUint8:
		return append(b, 0xcc, byte(v))
	case v <= math.MaxUint16:
		return append(b, 0xcd, byte(v>>8), byte(v))
	case v <= math.MaxUint32:
		return append(b, 0xce, byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
	}
	return append(b, 0xcf, byte(v>>56), byte(v>>48), byte(v>>40), byte(v>>32),
		byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
}

// reader decodes the subset of msgpack the encodings use. The first failure
// sticks in err; later calls return zero values, so decoders read straight
// through and check once at the end.
type reader struct {
	b   []byte
	off int
	err error
}

func (r *reader) fail(format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf("%w at offset %d: %s", ErrEncoding, r.off, fmt.Sprintf(format, args...))
	}
}

func (r *reader) take(n int) []byte {
	if r.err != nil {
		return nil
	}
	if n < 0 || len(r.b)-r.off < n {
		r.fail("truncated")
		return nil
	}
	s := r.b[r.off : r.off+n]
	r.off += n
	return s
}

func (r *reader) be(n int) uint64 {
	var v uint64
	for _, c := range r.take(n) {
		v = v<<8 | uint64(c)
	}
	return v
}

func (r *reader) array(want int) {
	t := r.take(1)
	if t == nil {
		return
	}
	var n int
	switch c := t[0]; {
	case c&0xf0 == 0x90:
		n = int(c & 0x0f)
	case c == 0xdc:
		n = int(r.be(2))
	case c == 0xdd:
		n = int(r.be(4))
	default:
		r.off--
		r.fail("want array of %d, got type byte %#x", want, c)
		return
	}
	if r.err == nil && n != want {
		r.fail("want array of %d, got %d", want, n)
	}
}

func (r *reader) uint(limit uint64) uint64 {
	t := r.take(1)
	if t == nil {
		return 0
	}
	var v uint64
	switch c := t[0]; {
	case c < 0x80:
		v = uint64(c)
	case c == 0xcc:
		v = r.be(1)
	case c == 0xcd:
		v = r.be(2)
	case c == 0xce:
		v = r.be(4)
	case c == 0xcf:
		v = r.be(8)
	default:
		r.off--
		r.fail("want unsigned integer, got type byte %#x", c)
		return 0
	}
	if r.err == nil && v > limit {
		r.fail("integer %d above %d", v, limit)
		return 0
	}
	return v
}

func (r *reader) digest() ckf.ScopedDigest {
	var d ckf.ScopedDigest
	if h := r.take(2); h != nil && (h[0] != 0xc4 || h[1] != 16) {
		r.off -= 2
		r.fail("want bin16 digest")
	}
	copy(d.Digest[:], r.take(16))
	src := r.uint(math.MaxUint8)
	if r.err == nil && src > uint64(ckf.DigestExplicit) {
		r.fail("unknown digest source %d", src)
	}
	d.Source = ckf.DigestSource(src)
	return d
}

func (r *reader) pool() ckf.PoolID {
	var p ckf.PoolID
	r.array(5)
	p.Domain.CacheSemantics = r.digest()
	p.Domain.RoutingScope = r.digest()
	p.DCID = r.uint(math.MaxUint64)
	return p
}

func (r *reader) format() ckf.Format {
	var f ckf.Format
	r.array(5)
	f.Version = uint8(r.uint(math.MaxUint8))
	f.Seed = r.uint(math.MaxUint64)
	f.BucketCount = r.uint(math.MaxUint64)
	f.FingerprintBits = uint8(r.uint(math.MaxUint8))
	f.SlotsPerBucket = uint8(r.uint(math.MaxUint8))
	return f
}

func (r *reader) end() error {
	if r.err == nil && r.off != len(r.b) {
		r.fail("%d trailing bytes", len(r.b)-r.off)
	}
	return r.err
}
