package consumer

import (
	"encoding/binary"
	"math"
	"strconv"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/wire"
)

// current returns the lane a lease addresses when that lease is the lane's
// current one; otherwise l is nil and idx is the lane index (-1 when the
// lease names no lane).
func (c *Consumer) current(lease ckf.LaneLease) (idx int, l *lane) {
	if lease.PhysicalLane >= lanes {
		return -1, nil
	}
	idx = int(lease.PhysicalLane)
	cand := &c.lanes[idx]
	if !cand.assigned || cand.lease != lease || lease.ConsumerInstance != c.manifest.ConsumerInstance {
		return idx, nil
	}
	return idx, cand
}

// ignore records an outcome that changed nothing but the lane's counters.
func (c *Consumer) ignore(idx int, o Outcome) Result {
	r := Result{Outcome: o, Lane: idx}
	if idx >= 0 {
		l := &c.lanes[idx]
		l.stats.FramesIgnored++
		if l.ready {
			r.Sequence = l.installed
		}
	}
	return r
}

// deactivate faults lane idx: not ready, lease revoked, partial snapshot
// dropped. Nothing is written to the table.
func (c *Consumer) deactivate(idx int, f Fault) Result {
	l := &c.lanes[idx]
	c.setReady(idx, false)
	l.staging = false
	l.assigned = false
	l.installed = 0
	l.lastOutcome, l.lastFault = Deactivated, f
	l.stats.Deactivations++
	return Result{Outcome: Deactivated, Fault: f, Lane: idx}
}

// retry abandons a snapshot install on a lane that is not ready; the lease
// stays current so the producer may resend on it.
func (c *Consumer) retry(idx int, f Fault) Result {
	l := &c.lanes[idx]
	l.staging = false
	l.lastOutcome, l.lastFault = RetrySnapshot, f
	l.stats.SnapshotRetries++
	return Result{Outcome: RetrySnapshot, Fault: f, Lane: idx}
}

// fail deactivates a ready lane and asks a lane that is not ready to retry.
func (c *Consumer) fail(idx int, f Fault) Result {
	if c.lanes[idx].ready {
		return c.deactivate(idx, f)
	}
	return c.retry(idx, f)
}

func (c *Consumer) applied(idx int, o Outcome) Result {
	l := &c.lanes[idx]
	l.lastOutcome, l.lastFault = o, NoFault
	l.stats.FramesApplied++
	r := Result{Outcome: o, Lane: idx}
	if l.ready {
		r.Sequence = l.installed
	}
	return r
}

// InstallSnapshot installs a whole snapshot: one chunk of one. See
// [Consumer.ApplySnapshotChunk] for the rules. s.Words is only read.
func (c *Consumer) InstallSnapshot(s *ckf.Snapshot) Result {
	return c.installChunk(&s.Identity, s.Lease, s.Sequence, 0, 1, 0, wordSrc{words: s.Words})
}

// ApplySnapshotChunk installs one chunk of a snapshot (SPEC §8.3), checking
// in order:
//
//  1. the lease is not the lane's current one → IgnoredForeignLease;
//  2. the identity differs from the assigned one → Deactivated(WrongIdentity);
//  3. the chunk's shape: count 0 or index ≥ count → MalformedChunk; words
//     reaching past bucket_count, or a last chunk ending short of it →
//     WrongBucketCount; a chunk with no words (final or not) →
//     MalformedChunk, since every chunk carries at least one word. On a
//     ready lane these deactivate; on a lane that is not ready they are
//     RetrySnapshot on the same lease;
//  4. ready and sequence ≤ installed → IgnoredStaleOrDuplicate; ready and
//     newer → Deactivated(SnapshotWhileReady), nothing written;
//  5. not ready: chunk index 0 starts a snapshot, abandoning any partial
//     one, and must be at offset 0 (else RetrySnapshot(ChunkOverlap)); any
//     other chunk must continue the partial snapshot — the same sequence and
//     count, the next index, and the offset where the previous chunk ended.
//     Otherwise the partial snapshot is abandoned:
//     RetrySnapshot(ChunkSequenceMismatch, ChunkOutOfOrder or ChunkOverlap),
//     and the chunk is not written.
//
// An accepted chunk is written into the lane's own column, which queries do
// not read while the lane is not ready; the last chunk activates the lane at
// the snapshot's sequence (SnapshotInstalled), the others report
// SnapshotChunkAccepted. ch.Words is only read. Cost: O(len(ch.Words)).
func (c *Consumer) ApplySnapshotChunk(ch *wire.SnapshotChunk) Result {
	return c.installChunk(&ch.Identity, ch.Lease, ch.Sequence, ch.ChunkIndex, ch.ChunkCount, ch.BucketOffset, wordSrc{words: ch.Words})
}

// wordSrc is a chunk's words, either decoded or as the frame's raw
// little-endian payload (8 bytes a word), which is copied straight into the
// table so that no third copy of a snapshot is ever held.
type wordSrc struct {
	words []uint64
	raw   []byte
}

func (w wordSrc) len() uint64 {
	if w.raw != nil {
		return uint64(len(w.raw) / 8)
	}
	return uint64(len(w.words))
}

func (c *Consumer) installChunk(id *ckf.ProducerIdentity, lease ckf.LaneLease, seq uint64, index, count uint32, offset uint64, words wordSrc) Result {
	idx, l := c.current(lease)
	if l == nil {
		return c.ignore(idx, IgnoredForeignLease)
	}
	if *id != l.identity {
		return c.deactivate(idx, WrongIdentity)
	}
	n := words.len()
	bc := l.grp.bucketCount
	switch {
	case count == 0 || index >= count:
		return c.fail(idx, MalformedChunk)
	case offset > bc || n > bc-offset:
		return c.fail(idx, WrongBucketCount)
	case index == count-1 && offset+n != bc:
		return c.fail(idx, WrongBucketCount)
	case n == 0:
		return c.fail(idx, MalformedChunk)
	}
	if l.ready {
		if seq <= l.installed {
			return c.ignore(idx, IgnoredStaleOrDuplicate)
		}
		return c.deactivate(idx, SnapshotWhileReady)
	}
	// Chunk 0 always starts a snapshot: whatever is staged is abandoned, so
	// a producer's resend (of the same or a newer snapshot) is never lost
	// to the partial one it replaces (SPEC §8.3, decision 5).
	if index == 0 || !l.staging {
		switch {
		case index != 0:
			return c.retry(idx, ChunkOutOfOrder)
		case offset != 0:
			return c.retry(idx, ChunkOverlap)
		}
	} else {
		switch {
		case seq != l.stageSeq:
			return c.retry(idx, ChunkSequenceMismatch)
		case count != l.stageCount || index != l.stageNext:
			return c.retry(idx, ChunkOutOfOrder)
		case offset != l.stageCovered:
			return c.retry(idx, ChunkOverlap)
		}
	}
	// INVARIANT: every check has passed; from here on nothing can fail.
	c.writeColumn(idx, offset, words)
	l.staging = true
	l.stageSeq = seq
	l.stageCount = count
	l.stageNext = index + 1
	l.stageCovered = offset + n
	if index+1 < count {
		return c.applied(idx, SnapshotChunkAccepted)
	}
	l.staging = false
	l.installed = seq
	c.setReady(idx, true)
	l.stats.SnapshotsInstalled++
	return c.applied(idx, SnapshotInstalled)
}

// writeColumn stores words as buckets [offset, offset+len) of lane idx.
func (c *Consumer) writeColumn(idx int, offset uint64, src wordSrc) {
	n := int(src.len())
	if n == 0 {
		return
	}
	l := &c.lanes[idx]
	w := l.grp.width
	// Reslicing once lets the compiler drop the bounds check in the loops.
	col := l.grp.words[offset*uint64(w)+uint64(l.slot):]
	_ = col[(n-1)*w]
	if src.raw != nil {
		raw := src.raw[:8*n]
		for i := range n {
			col[i*w] = binary.LittleEndian.Uint64(raw[8*i:])
		}
		return
	}
	for i, word := range src.words {
		col[i*w] = word
	}
}

// ApplyDelta applies one sequenced delta (SPEC §8.3), checking in order:
// lease (IgnoredForeignLease); identity (Deactivated(WrongIdentity)); a lane
// that is not ready (RetrySnapshot(DeltaDuringSnapshot) while chunks are
// staged, AwaitingSnapshot otherwise); sequence ≤ installed
// (IgnoredStaleOrDuplicate); base ≠ installed (BaseSequenceMismatch — a gap
// is never buffered); base+1 overflowing (SequenceOverflow); sequence ≠
// base+1 (NonContiguous); no image (EmptyDelta); an image bucket ≥
// bucket_count or a repeated bucket (MalformedImages). Every check runs
// before the first write; then each absolute word is stored and the lane is
// at d.Sequence. d.Images is only read. Cost: O(len(d.Images)).
func (c *Consumer) ApplyDelta(d *ckf.Delta) Result {
	return c.applyDelta(d, imageSrc{images: d.Images})
}

// imageSrc is a delta's images, either decoded or as the frame's raw payload
// ({u32 LE bucket, u64 LE word}, 12 bytes an image).
type imageSrc struct {
	images []ckf.BucketImage
	raw    []byte
}

func (s imageSrc) len() int {
	if s.raw != nil {
		return len(s.raw) / wire.ImageBytes
	}
	return len(s.images)
}

func (s imageSrc) at(i int) (bucket uint64, word uint64) {
	if s.raw != nil {
		q := s.raw[i*wire.ImageBytes : i*wire.ImageBytes+wire.ImageBytes]
		return uint64(binary.LittleEndian.Uint32(q)), binary.LittleEndian.Uint64(q[4:])
	}
	return uint64(s.images[i].Bucket), s.images[i].Word
}

// applyDelta runs the checks of ApplyDelta on d's header and images (d.Images
// is ignored; images is used instead).
func (c *Consumer) applyDelta(d *ckf.Delta, images imageSrc) Result {
	idx, l := c.current(d.Lease)
	if l == nil {
		return c.ignore(idx, IgnoredForeignLease)
	}
	if d.Identity != l.identity {
		return c.deactivate(idx, WrongIdentity)
	}
	if !l.ready {
		if l.staging {
			return c.retry(idx, DeltaDuringSnapshot)
		}
		return c.ignore(idx, AwaitingSnapshot)
	}
	switch {
	case d.Sequence <= l.installed:
		return c.ignore(idx, IgnoredStaleOrDuplicate)
	case d.BaseSequence != l.installed:
		return c.deactivate(idx, BaseSequenceMismatch)
	case d.BaseSequence == math.MaxUint64:
		// Unreachable after the two checks above (installed = MaxUint64
		// makes every delta stale); kept so the order matches SPEC §8.3.
		return c.deactivate(idx, SequenceOverflow)
	case d.Sequence != d.BaseSequence+1:
		return c.deactivate(idx, NonContiguous)
	case images.len() == 0:
		return c.deactivate(idx, EmptyDelta)
	}
	if !c.imagesValid(images, l.grp.bucketCount) {
		return c.deactivate(idx, MalformedImages)
	}
	// INVARIANT: every check has passed; from here on nothing can fail.
	col, stride := l.grp.words[l.slot:], uint64(l.grp.width)
	n := images.len()
	for i := range n {
		b, w := images.at(i)
		col[b*stride] = w
	}
	l.installed = d.Sequence
	l.stats.DeltasApplied++
	l.stats.ImagesApplied += uint64(n)
	return c.applied(idx, Applied)
}

// imagesValid reports whether every image names a distinct bucket below
// bucketCount (the lane's). It marks buckets in c.seen and clears them again,
// so the check costs O(len(images)) whatever the table size.
func (c *Consumer) imagesValid(images imageSrc, bucketCount uint64) bool {
	ok := true
	n := 0
	for i := range images.len() {
		b, _ := images.at(i)
		if b >= bucketCount {
			ok = false
			break
		}
		w, bit := b/64, uint64(1)<<(b%64)
		if c.seen[w]&bit != 0 {
			ok = false
			break
		}
		c.seen[w] |= bit
		n++
	}
	for i := range n {
		b, _ := images.at(i)
		c.seen[b/64] &^= 1 << (b % 64)
	}
	return ok
}

// Drain checks a drain marker (SPEC §8.3): a foreign lease is ignored; a
// ready lane at exactly m.ExpectedSequence acknowledges; anything else (a
// lost final delta, a lane not ready) is Deactivated(TerminalSequenceMismatch).
func (c *Consumer) Drain(m ckf.DrainMarker) Result {
	idx, l := c.current(m.Lease)
	if l == nil {
		return c.ignore(idx, IgnoredForeignLease)
	}
	if l.ready && l.installed == m.ExpectedSequence {
		l.stats.DrainsAcknowledged++
		return c.applied(idx, DrainAcknowledged)
	}
	return c.deactivate(idx, TerminalSequenceMismatch)
}

// Heartbeat records a heartbeat: a foreign lease is ignored; another identity
// deactivates (WrongIdentity); on a ready lane a last sequence other than the
// installed one means a delta was lost and deactivates
// (HeartbeatSequenceMismatch); otherwise the time is recorded in the lane's
// stats (HeartbeatObserved). Sequences never advance.
func (c *Consumer) Heartbeat(h *wire.Heartbeat) Result {
	idx, l := c.current(h.Lease)
	if l == nil {
		return c.ignore(idx, IgnoredForeignLease)
	}
	if h.Identity != l.identity {
		return c.deactivate(idx, WrongIdentity)
	}
	if l.ready && h.LastSequence != l.installed {
		return c.deactivate(idx, HeartbeatSequenceMismatch)
	}
	l.stats.LastHeartbeatMicros = h.UnixMicros
	return c.applied(idx, HeartbeatObserved)
}

// ApplyFrame dispatches one decoded frame to [Consumer.ApplySnapshotChunk],
// [Consumer.ApplyDelta], [Consumer.Drain] or [Consumer.Heartbeat]. A close
// frame names no lease and changes nothing (StreamClosed); an unknown kind is
// IgnoredUnknownKind. The frame's slices are only read.
func (c *Consumer) ApplyFrame(f *wire.Frame) Result {
	switch f.Kind {
	case wire.KindSnapshotChunk:
		return c.ApplySnapshotChunk(&f.Snapshot)
	case wire.KindDelta:
		return c.ApplyDelta(&f.Delta)
	case wire.KindDrainMarker:
		return c.Drain(f.Drain)
	case wire.KindHeartbeat:
		return c.Heartbeat(&f.Heartbeat)
	case wire.KindClose:
		return Result{Outcome: StreamClosed, Lane: -1}
	}
	return Result{Outcome: IgnoredUnknownKind, Lane: -1}
}

// ApplyFrameBytes decodes one frame (the msgpack body, without the 4-byte
// length prefix) and applies it like [Consumer.ApplyFrame]. A frame that does
// not decode returns the wire error (a *wire.DecodeError) and changes
// nothing; so does a body over [MaxInputBytes] (wire.ErrFrameTooLarge, as in
// the WebAssembly module). Snapshot words and delta images are read straight from data into
// the table, so a snapshot is never held three times (frame, scratch,
// table). data is only read and not retained. Decoding reuses a frame owned
// by the consumer: steady-state applies do not allocate.
func (c *Consumer) ApplyFrameBytes(data []byte) (Result, error) {
	if len(data) > MaxInputBytes {
		return Result{Lane: -1}, &wire.DecodeError{Kind: wire.ErrFrameTooLarge,
			Detail: "frame of " + strconv.Itoa(len(data)) + " bytes exceeds the consumer's " + strconv.Itoa(MaxInputBytes)}
	}
	f := &c.frame
	if err := wire.DecodeFrameView(data, f); err != nil {
		return Result{Lane: -1}, err
	}
	var r Result
	switch f.Kind {
	case wire.KindSnapshotChunk:
		ch := &f.Snapshot
		r = c.installChunk(&ch.Identity, ch.Lease, ch.Sequence, ch.ChunkIndex, ch.ChunkCount, ch.BucketOffset, wordSrc{raw: nonNil(f.Payload())})
	case wire.KindDelta:
		r = c.applyDelta(&f.Delta, imageSrc{raw: nonNil(f.Payload())})
	default:
		r = c.ApplyFrame(f)
	}
	// Drop the frame's references into data: the consumer must not retain it.
	*f = wire.Frame{}
	return r, nil
}

// nonNil keeps an empty payload distinguishable from "no raw payload".
func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}
