package wire

import (
	"encoding/binary"
	"math"
	"slices"

	"github.com/ckfrelay/ckfrelay/ckf"
)

// Element counts of the v1 frame arrays (SPEC §9), including version and kind.
const (
	snapshotChunkElems = 9
	deltaElems         = 7
	drainElems         = 4
	heartbeatElems     = 6
	closeElems         = 4

	identityElems = 4
	poolIDElems   = 5
	formatElems   = 5
	leaseElems    = 3
)

// ImageBytes is the encoded size of one delta image: a little-endian u32
// bucket index followed by a little-endian u64 word.
const ImageBytes = 12

// AppendFrame appends the msgpack encoding of f (without the 4-byte length
// prefix a stream adds) to dst and returns the extended slice. Integers use
// their smallest msgpack encoding, so equal frames encode to equal bytes.
//
// It fails with an error wrapping [ErrInvalidFrame] when f.Kind is unknown,
// a digest source is not a defined [ckf.DigestSource], a chunk's
// ChunkCount is 0 or ChunkIndex ≥ ChunkCount, BucketOffset+len(Words)
// overflows, or a payload exceeds the 4 GiB a msgpack bin can hold; dst is
// then returned unchanged. AppendFrame does not enforce a frame limit (the
// [Writer] does) and does not validate the format or sequence numbers: those
// are the consumer's to judge (see docs/wire.md "What wire validates").
func AppendFrame(dst []byte, f *Frame) ([]byte, error) {
	start := len(dst)
	out, err := appendFrame(dst, f)
	if err != nil {
		return dst[:start], err
	}
	return out, nil
}

func appendFrame(b []byte, f *Frame) ([]byte, error) {
	switch f.Kind {
	case KindSnapshotChunk:
		c := &f.Snapshot
		if c.ChunkCount == 0 || c.ChunkIndex >= c.ChunkCount {
			return b, encodeError("chunk index %d of %d", c.ChunkIndex, c.ChunkCount)
		}
		if uint64(len(c.Words)) > math.MaxUint32/8 {
			return b, encodeError("%d words exceed one bin", len(c.Words))
		}
		if c.BucketOffset > math.MaxUint64-uint64(len(c.Words)) {
			return b, encodeError("bucket offset %d + %d words overflows", c.BucketOffset, len(c.Words))
		}
		b = appendArrayLen(b, snapshotChunkElems)
		b = append(b, Version, byte(KindSnapshotChunk))
		b, err := appendIdentity(b, &c.Identity)
		if err != nil {
			return b, err
		}
		b = appendLease(b, &c.Lease)
		b = appendUint(b, c.Sequence)
		b = appendUint(b, uint64(c.ChunkIndex))
		b = appendUint(b, uint64(c.ChunkCount))
		b = appendUint(b, c.BucketOffset)
		return appendWords(b, c.Words), nil
	case KindDelta:
		d := &f.Delta
		if uint64(len(d.Images)) > math.MaxUint32/ImageBytes {
			return b, encodeError("%d images exceed one bin", len(d.Images))
		}
		b = appendArrayLen(b, deltaElems)
		b = append(b, Version, byte(KindDelta))
		b, err := appendIdentity(b, &d.Identity)
		if err != nil {
			return b, err
		}
		b = appendLease(b, &d.Lease)
		b = appendUint(b, d.BaseSequence)
		b = appendUint(b, d.Sequence)
		return appendImages(b, d.Images), nil
	case KindDrainMarker:
		b = appendArrayLen(b, drainElems)
		b = append(b, Version, byte(KindDrainMarker))
		b = appendLease(b, &f.Drain.Lease)
		return appendUint(b, f.Drain.ExpectedSequence), nil
	case KindHeartbeat:
		h := &f.Heartbeat
		b = appendArrayLen(b, heartbeatElems)
		b = append(b, Version, byte(KindHeartbeat))
		b, err := appendIdentity(b, &h.Identity)
		if err != nil {
			return b, err
		}
		b = appendLease(b, &h.Lease)
		b = appendUint(b, h.LastSequence)
		return appendInt(b, h.UnixMicros), nil
	case KindClose:
		if uint64(len(f.Close.Reason)) > math.MaxUint32 || uint64(len(f.Close.Message)) > math.MaxUint32 {
			return b, encodeError("close text exceeds one str")
		}
		b = appendArrayLen(b, closeElems)
		b = append(b, Version, byte(KindClose))
		b = appendStr(b, string(f.Close.Reason))
		return appendStr(b, f.Close.Message), nil
	}
	return b, encodeError("unknown kind %v", f.Kind)
}

func appendIdentity(b []byte, id *ckf.ProducerIdentity) ([]byte, error) {
	d := &id.Pool.Domain
	if d.CacheSemantics.Source > ckf.DigestExplicit || d.RoutingScope.Source > ckf.DigestExplicit {
		return b, encodeError("digest source %v/%v", d.CacheSemantics.Source, d.RoutingScope.Source)
	}
	b = appendArrayLen(b, identityElems)
	b = appendPoolID(b, &id.Pool)
	b = appendUint(b, id.ProducerIncarnation)
	b = appendUint(b, id.LayoutGeneration)
	return appendFormat(b, &id.Format), nil
}

// appendDigests appends a domain's two (digest, source) pairs, the leading
// elements of a pool_id and the whole of a domain.
func appendDigests(b []byte, d *ckf.Domain) []byte {
	b = appendBinHeader(b, 16)
	b = append(b, d.CacheSemantics.Digest[:]...)
	b = appendUint(b, uint64(d.CacheSemantics.Source))
	b = appendBinHeader(b, 16)
	b = append(b, d.RoutingScope.Digest[:]...)
	return appendUint(b, uint64(d.RoutingScope.Source))
}

func appendPoolID(b []byte, p *ckf.PoolID) []byte {
	b = appendArrayLen(b, poolIDElems)
	b = appendDigests(b, &p.Domain)
	return appendUint(b, p.DCID)
}

func appendFormat(b []byte, fm *ckf.Format) []byte {
	b = appendArrayLen(b, formatElems)
	b = appendUint(b, uint64(fm.Version))
	b = appendUint(b, fm.Seed)
	b = appendUint(b, fm.BucketCount)
	b = appendUint(b, uint64(fm.FingerprintBits))
	return appendUint(b, uint64(fm.SlotsPerBucket))
}

func appendLease(b []byte, l *ckf.LaneLease) []byte {
	b = appendArrayLen(b, leaseElems)
	b = appendUint(b, l.ConsumerInstance)
	b = appendUint(b, uint64(l.PhysicalLane))
	return appendUint(b, l.AssignmentEpoch)
}

// appendWords appends words as one bin of little-endian u64s.
func appendWords(b []byte, words []uint64) []byte {
	n := 8 * len(words)
	b = appendBinHeader(b, n)
	b = slices.Grow(b, n)
	at := len(b)
	b = b[:at+n]
	p := b[at:]
	for i, w := range words {
		binary.LittleEndian.PutUint64(p[8*i:], w)
	}
	return b
}

// appendImages appends images as one bin of {u32 LE bucket, u64 LE word}.
func appendImages(b []byte, images []ckf.BucketImage) []byte {
	n := ImageBytes * len(images)
	b = appendBinHeader(b, n)
	b = slices.Grow(b, n)
	at := len(b)
	b = b[:at+n]
	p := b[at:]
	for i, im := range images {
		q := p[ImageBytes*i : ImageBytes*i+ImageBytes]
		binary.LittleEndian.PutUint32(q, im.Bucket)
		binary.LittleEndian.PutUint64(q[4:], im.Word)
	}
	return b
}

// DecodeFrame decodes exactly one frame (without a length prefix) from data
// into f. It fails with a [*DecodeError] on truncated, malformed or trailing
// input, an unknown version or an unknown kind, and then leaves f unchanged.
//
// # Aliasing and reuse
//
// f may be reused across calls: on success DecodeFrame sets f.Kind and
// overwrites only the field f.Kind selects; the fields of other kinds keep
// whatever they held (read only the selected one). Snapshot words are decoded
// into f.Snapshot.Words and delta images into f.Delta.Images, reusing their
// capacity, so a steady stream of frames decodes without allocating. The
// decoded frame never aliases data (the bin payloads are copied out), except
// through [Frame.Payload], which does. A Close
// frame's message is a new string (the defined reasons are not allocated).
//
// The only allocation is growth of Words/Images, bounded by len(data): a bin
// or array length larger than the bytes that remain is rejected before
// anything is allocated.
func DecodeFrame(data []byte, f *Frame) error { return decodeFrame(data, f, true) }

// DecodeFrameView is [DecodeFrame] without converting the payload: for a
// snapshot chunk or delta it sets f.Snapshot.Words or f.Delta.Images to an
// empty slice (keeping their capacity) and leaves the little-endian payload
// in [Frame.Payload], which aliases data. A consumer that copies words
// straight into its own table (the wasm guest) uses it to avoid holding a
// third copy of a snapshot. All validation is the same as DecodeFrame's.
func DecodeFrameView(data []byte, f *Frame) error { return decodeFrame(data, f, false) }

func decodeFrame(data []byte, f *Frame, convert bool) error {
	r := reader{b: data}
	r.field = "frame"
	n, err := r.arrayLen()
	if err != nil {
		return err
	}
	if n < 2 {
		return r.fail(ErrMalformed, "frame array of "+itoa(n)+" elements")
	}
	r.field = "version"
	v, err := r.uint(math.MaxUint64)
	if err != nil {
		return err
	}
	if v != Version {
		r.off--
		return r.fail(ErrUnknownVersion, "version "+utoa(v))
	}
	r.field = "kind"
	kindAt := r.off
	k, err := r.uint(math.MaxUint64)
	if err != nil {
		return err
	}
	want := 0
	kind := Kind(k)
	if k > math.MaxUint8 {
		kind = 0 // not a Kind at all; never truncate it into one
	}
	switch kind {
	case KindSnapshotChunk:
		want = snapshotChunkElems
	case KindDelta:
		want = deltaElems
	case KindDrainMarker:
		want = drainElems
	case KindHeartbeat:
		want = heartbeatElems
	case KindClose:
		want = closeElems
	}
	if want == 0 {
		r.off = kindAt
		return r.fail(ErrUnknownKind, "kind "+utoa(k))
	}
	r.kind = kind
	if n != want {
		r.off = 0
		r.field = "frame"
		return r.fail(ErrMalformed, "want array of "+itoa(want)+" elements, got "+itoa(n))
	}
	switch kind {
	case KindSnapshotChunk:
		return decodeSnapshotChunk(&r, f, convert)
	case KindDelta:
		return decodeDelta(&r, f, convert)
	case KindDrainMarker:
		var d ckf.DrainMarker
		r.field = "lease"
		if err := r.lease(&d.Lease); err != nil {
			return err
		}
		r.field = "expected_sequence"
		if d.ExpectedSequence, err = r.uint(math.MaxUint64); err != nil {
			return err
		}
		if err := r.end(); err != nil {
			return err
		}
		f.Kind, f.Drain = kind, d
		f.raw = nil
		return nil
	case KindHeartbeat:
		var h Heartbeat
		if err := r.identity(&h.Identity); err != nil {
			return err
		}
		r.field = "lease"
		if err := r.lease(&h.Lease); err != nil {
			return err
		}
		r.field = "last_sequence"
		if h.LastSequence, err = r.uint(math.MaxUint64); err != nil {
			return err
		}
		r.field = "unix_micros"
		if h.UnixMicros, err = r.int(); err != nil {
			return err
		}
		if err := r.end(); err != nil {
			return err
		}
		f.Kind, f.Heartbeat = kind, h
		f.raw = nil
		return nil
	default: // KindClose
		r.field = "reason"
		reason, err := r.str()
		if err != nil {
			return err
		}
		r.field = "message"
		msg, err := r.str()
		if err != nil {
			return err
		}
		if err := r.end(); err != nil {
			return err
		}
		f.Kind, f.raw = kind, nil
		f.Close = Close{Reason: internReason(reason), Message: string(msg)}
		return nil
	}
}

func internReason(b []byte) CloseReason {
	for _, r := range [...]CloseReason{CloseShuttingDown, CloseLagged, CloseProducerChanged, CloseFenced, CloseInvalidRequest} {
		if string(r) == string(b) {
			return r
		}
	}
	return CloseReason(b)
}

func decodeSnapshotChunk(r *reader, f *Frame, convert bool) error {
	var c SnapshotChunk
	if err := r.identity(&c.Identity); err != nil {
		return err
	}
	r.field = "lease"
	if err := r.lease(&c.Lease); err != nil {
		return err
	}
	var err error
	r.field = "sequence"
	if c.Sequence, err = r.uint(math.MaxUint64); err != nil {
		return err
	}
	r.field = "chunk_index"
	idx, err := r.uint(math.MaxUint32)
	if err != nil {
		return err
	}
	r.field = "chunk_count"
	countAt := r.off
	count, err := r.uint(math.MaxUint32)
	if err != nil {
		return err
	}
	if count == 0 || idx >= count {
		r.off = countAt
		return r.fail(ErrMalformed, "chunk index "+utoa(idx)+" of "+utoa(count))
	}
	c.ChunkIndex, c.ChunkCount = uint32(idx), uint32(count)
	r.field = "bucket_offset"
	if c.BucketOffset, err = r.uint(math.MaxUint64); err != nil {
		return err
	}
	r.field = "words"
	binAt := r.off
	raw, err := r.bin()
	if err != nil {
		return err
	}
	if len(raw)%8 != 0 {
		r.off = binAt
		return r.fail(ErrMalformed, "bin of "+itoa(len(raw))+" bytes is not a multiple of 8")
	}
	n := len(raw) / 8
	if c.BucketOffset > math.MaxUint64-uint64(n) {
		r.off = binAt
		return r.fail(ErrMalformed, "bucket offset + word count overflows")
	}
	if err := r.end(); err != nil {
		return err
	}
	// Commit: nothing above touched f.
	words := f.Snapshot.Words[:0]
	if convert {
		words = slices.Grow(words, n)[:n]
	}
	for i := range words {
		words[i] = binary.LittleEndian.Uint64(raw[8*i:])
	}
	c.Words = words
	f.Kind, f.Snapshot, f.raw = KindSnapshotChunk, c, raw
	return nil
}

func decodeDelta(r *reader, f *Frame, convert bool) error {
	var d ckf.Delta
	if err := r.identity(&d.Identity); err != nil {
		return err
	}
	r.field = "lease"
	if err := r.lease(&d.Lease); err != nil {
		return err
	}
	var err error
	r.field = "base_sequence"
	if d.BaseSequence, err = r.uint(math.MaxUint64); err != nil {
		return err
	}
	r.field = "sequence"
	if d.Sequence, err = r.uint(math.MaxUint64); err != nil {
		return err
	}
	r.field = "images"
	binAt := r.off
	raw, err := r.bin()
	if err != nil {
		return err
	}
	if len(raw)%ImageBytes != 0 {
		r.off = binAt
		return r.fail(ErrMalformed, "bin of "+itoa(len(raw))+" bytes is not a multiple of 12")
	}
	if err := r.end(); err != nil {
		return err
	}
	n := len(raw) / ImageBytes
	images := f.Delta.Images[:0]
	if convert {
		images = slices.Grow(images, n)[:n]
	}
	for i := range images {
		q := raw[ImageBytes*i : ImageBytes*i+ImageBytes]
		images[i] = ckf.BucketImage{Bucket: binary.LittleEndian.Uint32(q), Word: binary.LittleEndian.Uint64(q[4:])}
	}
	d.Images = images
	f.Kind, f.Delta, f.raw = KindDelta, d, raw
	return nil
}

func (r *reader) identity(id *ckf.ProducerIdentity) error {
	r.field = "identity"
	if err := r.expectArray(identityElems); err != nil {
		return err
	}
	if err := r.poolID(&id.Pool, &identityFields.pool); err != nil {
		return err
	}
	var err error
	r.field = "identity.producer_incarnation"
	if id.ProducerIncarnation, err = r.uint(math.MaxUint64); err != nil {
		return err
	}
	r.field = "identity.layout_generation"
	if id.LayoutGeneration, err = r.uint(math.MaxUint64); err != nil {
		return err
	}
	return r.format(&id.Format, &identityFields.format)
}

// Field names for errors: constant strings, so setting r.field never
// allocates. A pool_id and a format read inside a frame's identity are named
// from it; read alone (a consumer manifest, see records.go), from themselves.
type poolFieldNames struct{ self, sem, semSource, scope, scopeSource, dcID string }
type formatFieldNames struct{ self, version, seed, bucketCount, fingerprintBits, slotsPerBucket string }

var identityFields = struct {
	pool   poolFieldNames
	format formatFieldNames
}{
	poolFieldNames{"identity.pool_id", "identity.pool_id.sem_digest", "identity.pool_id.sem_source",
		"identity.pool_id.scope_digest", "identity.pool_id.scope_source", "identity.pool_id.dc_id"},
	formatFieldNames{"identity.format", "identity.format.format_version", "identity.format.seed",
		"identity.format.bucket_count", "identity.format.fingerprint_bits", "identity.format.slots_per_bucket"},
}

var standaloneFields = struct {
	pool   poolFieldNames
	domain poolFieldNames
	format formatFieldNames
}{
	poolFieldNames{"pool_id", "pool_id.sem_digest", "pool_id.sem_source", "pool_id.scope_digest", "pool_id.scope_source", "pool_id.dc_id"},
	poolFieldNames{"domain", "domain.sem_digest", "domain.sem_source", "domain.scope_digest", "domain.scope_source", ""},
	formatFieldNames{"format", "format.format_version", "format.seed", "format.bucket_count", "format.fingerprint_bits", "format.slots_per_bucket"},
}

func (r *reader) digests(d *ckf.Domain, names *poolFieldNames) error {
	if err := r.scopedDigest(&d.CacheSemantics, names.sem, names.semSource); err != nil {
		return err
	}
	return r.scopedDigest(&d.RoutingScope, names.scope, names.scopeSource)
}

func (r *reader) poolID(p *ckf.PoolID, names *poolFieldNames) error {
	r.field = names.self
	if err := r.expectArray(poolIDElems); err != nil {
		return err
	}
	if err := r.digests(&p.Domain, names); err != nil {
		return err
	}
	var err error
	r.field = names.dcID
	p.DCID, err = r.uint(math.MaxUint64)
	return err
}

func (r *reader) format(fm *ckf.Format, names *formatFieldNames) error {
	r.field = names.self
	if err := r.expectArray(formatElems); err != nil {
		return err
	}
	var v uint64
	var err error
	r.field = names.version
	if v, err = r.uint(math.MaxUint8); err != nil {
		return err
	}
	fm.Version = uint8(v)
	r.field = names.seed
	if fm.Seed, err = r.uint(math.MaxUint64); err != nil {
		return err
	}
	r.field = names.bucketCount
	if fm.BucketCount, err = r.uint(math.MaxUint64); err != nil {
		return err
	}
	r.field = names.fingerprintBits
	if v, err = r.uint(math.MaxUint8); err != nil {
		return err
	}
	fm.FingerprintBits = uint8(v)
	r.field = names.slotsPerBucket
	if v, err = r.uint(math.MaxUint8); err != nil {
		return err
	}
	fm.SlotsPerBucket = uint8(v)
	return nil
}

func (r *reader) scopedDigest(s *ckf.ScopedDigest, digestField, sourceField string) error {
	r.field = digestField
	at := r.off
	p, err := r.bin()
	if err != nil {
		return err
	}
	if len(p) != len(s.Digest) {
		r.off = at
		return r.fail(ErrMalformed, "digest of "+itoa(len(p))+" bytes, want 16")
	}
	copy(s.Digest[:], p)
	r.field = sourceField
	v, err := r.uint(uint64(ckf.DigestExplicit))
	if err != nil {
		return err
	}
	s.Source = ckf.DigestSource(v)
	return nil
}

func (r *reader) lease(l *ckf.LaneLease) error {
	if err := r.expectArray(leaseElems); err != nil {
		return err
	}
	var err error
	if l.ConsumerInstance, err = r.uint(math.MaxUint64); err != nil {
		return err
	}
	v, err := r.uint(math.MaxUint8)
	if err != nil {
		return err
	}
	l.PhysicalLane = uint8(v)
	l.AssignmentEpoch, err = r.uint(math.MaxUint64)
	return err
}
