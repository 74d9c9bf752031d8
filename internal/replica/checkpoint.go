package replica

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/producer"
)

// Checkpoints. A checkpoint is a pool's whole image ([producer.Image]: filter
// words, generator state, counters, exact state, source-epoch records and
// their idle order, publisher sequence, journal position) at a record
// boundary, with what a replica needs to follow the chain from there: the
// stream sequence and term of the record it includes, the term's leader,
// and the sources' cursors. A replica that loads one applies only the
// records after it; the subject below the older of the two kept
// checkpoints is purged, which bounds the stream.
//
// The encoding is binary, with the record codec's primitives (varints,
// little-endian hashes, counts checked against the bytes left before
// anything is allocated):
//
//	'K' 'C' version(1)
//	uvarint(seq) uvarint(term) str(leader node) str(leader address)
//	uvarint(journal position) uvarint(publisher sequence) uvarint(epochs pruned)
//	count cursor*            cursor: str(source) uvarint(seq)
//	format: version(1) u64(seed) uvarint(bucket count) bits(1) slots(1)
//	u64(generator state) uvarint(counter)×10
//	count u64(word)*
//	count (uvarint(bucket) u64(word before))*      the dirty window
//	count u64(omitted canonical)*
//	count member*            member: uvarint(worker) uvarint(rank) count (u64(external) u64(canonical))*
//	count epoch*             epoch: uvarint(worker) uvarint(rank) uvarint(epoch) idle(1)
//	u32(CRC-32C of everything before)
//
// A lineage entry is 16 bytes, as in package persist's exact-state
// checkpoint; a 2^24-bucket table is 128 MiB of words.

// ErrDamagedCheckpoint: a checkpoint does not decode, fails its checksum,
// or describes no pool the configuration could hold.
var ErrDamagedCheckpoint = errors.New("replica: damaged checkpoint")

// ErrStateLost: the pool's subject was purged below its first record and no
// checkpoint could be loaded — the group's state cannot be rebuilt, and a
// replica must not pretend otherwise by starting empty.
var ErrStateLost = errors.New("replica: state lost: the records were purged and no checkpoint loads")

const (
	ckptMagic0, ckptMagic1 = 'K', 'C'
	ckptVersion            = 1
	ckptCounters           = 10
)

// Checkpoint is a pool's image at a record boundary.
type Checkpoint struct {
	Seq     uint64 // stream sequence of the last message of the last record included
	Term    uint64 // the term at Seq (the next records are checked against it)
	Leader  TermRecord
	Cursors []producer.Cursor // by source
	Image   producer.Image
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// AppendCheckpoint appends c's encoding to b.
func AppendCheckpoint(b []byte, c *Checkpoint) []byte {
	start := len(b)
	img := &c.Image
	p := &img.Pool
	b = append(b, ckptMagic0, ckptMagic1, ckptVersion)
	b = binary.AppendUvarint(b, c.Seq)
	b = binary.AppendUvarint(b, c.Term)
	b = AppendTerm(b, c.Leader)
	b = binary.AppendUvarint(b, img.JournalPosition)
	b = binary.AppendUvarint(b, img.Sequence)
	b = binary.AppendUvarint(b, img.EpochsPruned)
	b = binary.AppendUvarint(b, uint64(len(c.Cursors)))
	for _, cu := range c.Cursors {
		b = binary.AppendUvarint(b, uint64(len(cu.Source)))
		b = append(b, cu.Source...)
		b = binary.AppendUvarint(b, cu.Seq)
	}
	f := p.Format
	b = append(b, f.Version)
	b = binary.LittleEndian.AppendUint64(b, f.Seed)
	b = binary.AppendUvarint(b, f.BucketCount)
	b = append(b, f.FingerprintBits, f.SlotsPerBucket)
	b = binary.LittleEndian.AppendUint64(b, p.RNG)
	for _, v := range counters(&p.Counters) {
		b = binary.AppendUvarint(b, *v)
	}
	b = binary.AppendUvarint(b, uint64(len(p.Words)))
	for _, w := range p.Words {
		b = binary.LittleEndian.AppendUint64(b, w)
	}
	b = binary.AppendUvarint(b, uint64(len(p.Window)))
	for _, w := range p.Window {
		b = binary.AppendUvarint(b, uint64(w.Bucket))
		b = binary.LittleEndian.AppendUint64(b, w.Word)
	}
	b = binary.AppendUvarint(b, uint64(len(p.NonResident)))
	for _, h := range p.NonResident {
		b = binary.LittleEndian.AppendUint64(b, h)
	}
	b = binary.AppendUvarint(b, uint64(len(p.Members)))
	for _, m := range p.Members {
		b = binary.AppendUvarint(b, m.Member.WorkerID)
		b = binary.AppendUvarint(b, uint64(m.Member.DPRank))
		b = binary.AppendUvarint(b, uint64(len(m.Blocks)))
		for _, e := range m.Blocks {
			b = binary.LittleEndian.AppendUint64(b, e.External)
			b = binary.LittleEndian.AppendUint64(b, e.Canonical)
		}
	}
	b = binary.AppendUvarint(b, uint64(len(img.Epochs)))
	for _, e := range img.Epochs {
		b = binary.AppendUvarint(b, e.Member.WorkerID)
		b = binary.AppendUvarint(b, uint64(e.Member.DPRank))
		b = binary.AppendUvarint(b, e.Epoch)
		if e.Idle {
			b = append(b, 1)
		} else {
			b = append(b, 0)
		}
	}
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b[start:], castagnoli))
}

func counters(c *ckf.PoolCounters) [ckptCounters]*uint64 {
	return [ckptCounters]*uint64{&c.PendingEvents, &c.UnknownRemovals, &c.ParentNotFound, &c.CapacityFailures,
		&c.MemberLimitRejections, &c.TrackedBlockLimitRejections, &c.PhysicalTouches, &c.DistinctTouchedBuckets,
		&c.EmittedImages, &c.NetRevertedBuckets}
}

// DecodeCheckpoint decodes a checkpoint. Every failure wraps
// ErrDamagedCheckpoint; memory is bounded by a small multiple of len(b)
// (counts are checked against the bytes left first). It checks the
// encoding only: whether the image is consistent is [ckf.RestorePool]'s
// and [producer.StartImage]'s to say.
func DecodeCheckpoint(b []byte) (*Checkpoint, error) {
	c, err := decodeCheckpoint(b)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrDamagedCheckpoint, err)
	}
	return c, nil
}

func decodeCheckpoint(b []byte) (*Checkpoint, error) {
	if len(b) < 3+4 || b[0] != ckptMagic0 || b[1] != ckptMagic1 {
		return nil, errors.New("not a checkpoint")
	}
	if b[2] != ckptVersion {
		return nil, fmt.Errorf("version %d", b[2])
	}
	body := b[:len(b)-4]
	if sum := binary.LittleEndian.Uint32(b[len(b)-4:]); sum != crc32.Checksum(body, castagnoli) {
		return nil, errors.New("checksum mismatch")
	}
	d := decoder{b: body[3:]}
	c := &Checkpoint{Seq: d.uvarint(), Term: d.uvarint()}
	c.Leader = TermRecord{Node: d.str(), Address: d.str()}
	img := &c.Image
	img.JournalPosition = d.uvarint()
	img.Sequence = d.uvarint()
	img.EpochsPruned = d.uvarint()
	if n := d.count(2); n > 0 {
		c.Cursors = make([]producer.Cursor, n)
		for i := range c.Cursors {
			c.Cursors[i] = producer.Cursor{Source: d.str(), Seq: d.uvarint()}
		}
	}
	p := &img.Pool
	p.Format.Version = d.byte1()
	p.Format.Seed = d.u64()
	p.Format.BucketCount = d.uvarint()
	p.Format.FingerprintBits = d.byte1()
	p.Format.SlotsPerBucket = d.byte1()
	if d.err == nil {
		if err := p.Format.Validate(); err != nil {
			d.fail("%v", err)
		}
	}
	p.RNG = d.u64()
	for _, v := range counters(&p.Counters) {
		*v = d.uvarint()
	}
	n := d.count(8)
	if d.err == nil && uint64(n) != p.Format.BucketCount {
		d.fail("%d words for %d buckets", n, p.Format.BucketCount)
	}
	if d.err == nil {
		p.Words = make([]uint64, n)
		for i := range p.Words {
			p.Words[i] = d.u64()
		}
	}
	if n := d.count(9); n > 0 {
		p.Window = make([]ckf.BucketImage, n)
		for i := range p.Window {
			p.Window[i] = ckf.BucketImage{Bucket: d.u32(), Word: d.u64()}
		}
	}
	if n := d.count(8); n > 0 {
		p.NonResident = make([]uint64, n)
		for i := range p.NonResident {
			p.NonResident[i] = d.u64()
		}
	}
	if n := d.count(3); n > 0 {
		p.Members = make([]ckf.MemberLineage, 0, n)
		for range n {
			m := ckf.MemberLineage{Member: ckf.Member{WorkerID: d.uvarint(), DPRank: d.u32()}}
			k := d.count(16)
			if d.err != nil {
				break
			}
			m.Blocks = make([]ckf.LineageEntry, k)
			for i := range m.Blocks {
				m.Blocks[i] = ckf.LineageEntry{External: d.u64(), Canonical: d.u64()}
			}
			p.Members = append(p.Members, m)
		}
	}
	if n := d.count(4); n > 0 {
		img.Epochs = make([]producer.EpochImage, n)
		for i := range img.Epochs {
			e := producer.EpochImage{Member: ckf.Member{WorkerID: d.uvarint(), DPRank: d.u32()}, Epoch: d.uvarint()}
			switch d.byte1() {
			case 0:
			case 1:
				e.Idle = true
			default:
				d.fail("idle flag")
			}
			img.Epochs[i] = e
		}
	}
	if d.err == nil && len(d.b) != 0 {
		d.fail("trailing bytes")
	}
	if d.err != nil {
		return nil, d.err
	}
	return c, nil
}

// DefaultCheckpointBucket is the checkpoints' object store bucket.
const DefaultCheckpointBucket = "CKFRELAY_HA_CKPT"

// DefaultMaxCheckpoint bounds a checkpoint a replica loads: 1 GiB holds
// the largest table (2^24 buckets, 128 MiB of words) and ~56 M lineage
// entries of 16 bytes. A pool tracking more (the default tracked-block
// bound of a 2^24-bucket table is 2^28 entries, 4 GiB) needs
// CheckpointConfig.MaxCheckpoint raised.
const DefaultMaxCheckpoint = 1 << 30

// CheckpointConfig configures the checkpoints' object store.
type CheckpointConfig struct {
	Bucket   string // default DefaultCheckpointBucket; the index is Bucket + "_INDEX"
	Replicas int    // default 3
	// MaxCheckpoint bounds a checkpoint loaded (0 means
	// DefaultMaxCheckpoint): a larger object is skipped as damaged.
	MaxCheckpoint int64
}

// Checkpoints stores pools' checkpoints in a JetStream object store, as
// "<pool>/ckpt-<seq>", the newest two per pool, and names the kept ones in
// an index (a KV bucket, one key per pool, updated by compare-and-set).
//
// Nothing here reads through a consumer: the index, an object's metadata
// and each of its chunks are single direct gets, which any current replica
// of the stream answers — also while the stream has no leader (a NATS
// node's death, a lost majority) — and each is bounded by its own context.
// The object store's List and Get run on consumers that wait for the
// stream's leader (docs/RATIONALE.md "Why does a rebuild read checkpoints
// by direct gets, not through the object store's listing?").
type Checkpoints struct {
	os     jetstream.ObjectStore
	stream jetstream.Stream // the object store's own stream (direct gets)
	bucket string
	index  jetstream.KeyValue
	max    int64
}

// CheckpointRequestTimeout bounds each request of a checkpoint's lookup
// (the index, an object's metadata, one chunk) whose context has no
// earlier deadline: NATS answers in milliseconds or, without a replica
// that can, not at all.
const CheckpointRequestTimeout = 2 * time.Second

// EnsureCheckpoints creates the checkpoints' object store and its index,
// or opens the ones that exist, raising their replica counts to the
// configured one (never lowering them).
func EnsureCheckpoints(ctx context.Context, js jetstream.JetStream, c CheckpointConfig) (*Checkpoints, error) {
	if c.Bucket == "" {
		c.Bucket = DefaultCheckpointBucket
	}
	if c.Replicas == 0 {
		c.Replicas = 3
	}
	if c.MaxCheckpoint <= 0 {
		c.MaxCheckpoint = DefaultMaxCheckpoint
	}
	// An existing store and index are opened, not rewritten: an
	// operator's cap on them stays theirs (as EnsureStream keeps the
	// records stream's); their replica counts are raised, never lowered.
	os, err := openOrCreate(ctx,
		func(ctx context.Context) (jetstream.ObjectStore, error) { return js.ObjectStore(ctx, c.Bucket) },
		func(ctx context.Context) (jetstream.ObjectStore, error) {
			return js.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{
				Bucket: c.Bucket, Storage: jetstream.FileStorage, Replicas: c.Replicas,
				Description: "ckfrelay pool checkpoints (issue #34)",
			})
		})
	if err != nil {
		return nil, fmt.Errorf("replica: checkpoint store %s: %w", c.Bucket, err)
	}
	// The object store's stream is OBJ_<bucket> (NATS ADR-20); its
	// metadata and chunk subjects are read directly (AllowDirect is set by
	// the object store).
	st, err := js.Stream(ctx, "OBJ_"+c.Bucket)
	if err != nil {
		return nil, fmt.Errorf("replica: checkpoint store %s: %w", c.Bucket, err)
	}
	if raised, err := raiseReplicas(ctx, js, st.CachedInfo().Config, c.Replicas); err != nil {
		return nil, fmt.Errorf("replica: checkpoint store %s: raising its replicas to %d: %w", c.Bucket, c.Replicas, err)
	} else if raised != nil {
		st = raised
	}
	index := c.Bucket + "_INDEX"
	idx, err := openOrCreate(ctx,
		func(ctx context.Context) (jetstream.KeyValue, error) { return js.KeyValue(ctx, index) },
		func(ctx context.Context) (jetstream.KeyValue, error) {
			return js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
				Bucket: index, History: 1, Storage: jetstream.FileStorage, Replicas: c.Replicas,
				Description: "ckfrelay: the checkpoints each pool keeps (issue #34)",
			})
		})
	if err == nil {
		err = raiseStreamReplicas(ctx, js, "KV_"+index, c.Replicas)
	}
	if err != nil {
		return nil, fmt.Errorf("replica: checkpoint index %s: %w", index, err)
	}
	return &Checkpoints{os: os, stream: st, bucket: c.Bucket, index: idx, max: c.MaxCheckpoint}, nil
}

// indexBucket is the index's KV bucket.
func (s *Checkpoints) indexBucket() string { return s.bucket + "_INDEX" }

func checkpointName(pool string, seq uint64) string {
	return pool + "/ckpt-" + strconv.FormatUint(seq, 10)
}

// bounded gives ctx CheckpointRequestTimeout unless it ends earlier.
func bounded(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, CheckpointRequestTimeout)
}

// directGet runs get (a direct get: idempotent) within
// CheckpointRequestTimeout, asking again when an attempt has no answer
// after a quarter of it or finds no responder: a request routed to a NATS
// node that just died is lost, not late (the cluster test saw a 2 s
// timeout where the next attempt answered at once).
func directGet[T any](ctx context.Context, get func(context.Context) (T, error)) (T, error) {
	ctx, cancel := bounded(ctx)
	defer cancel()
	for {
		actx, acancel := context.WithTimeout(ctx, CheckpointRequestTimeout/4)
		v, err := get(actx)
		acancel()
		switch {
		case err == nil || ctx.Err() != nil:
			return v, err
		case errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout):
			// ask again at once
		case errors.Is(err, nats.ErrNoResponders), errors.Is(err, jetstream.ErrNoStreamResponse):
			select { // no replica answers direct gets yet: not a hot loop
			case <-time.After(50 * time.Millisecond):
			case <-ctx.Done():
				return v, err
			}
		default:
			return v, err
		}
	}
}

// maxIndexed bounds the sequences an index value may name (two are kept;
// the bound only refuses garbage).
const maxIndexed = 16

// parseIndex reads an index value: the kept checkpoints' sequences,
// decimal, comma-separated, newest first.
func parseIndex(b []byte) ([]uint64, error) {
	if len(b) == 0 {
		return nil, nil
	}
	parts := strings.Split(string(b), ",")
	if len(parts) > maxIndexed {
		return nil, fmt.Errorf("%w: the index names %d checkpoints", ErrDamagedCheckpoint, len(parts))
	}
	seqs := make([]uint64, 0, len(parts))
	for _, p := range parts {
		seq, err := strconv.ParseUint(p, 10, 64)
		if err != nil || seq == 0 {
			return nil, fmt.Errorf("%w: index entry %q", ErrDamagedCheckpoint, p)
		}
		seqs = append(seqs, seq)
	}
	slices.SortFunc(seqs, func(a, b uint64) int { return cmp.Compare(b, a) })
	return slices.Compact(seqs), nil
}

func formatIndex(seqs []uint64) []byte {
	var b []byte
	for i, seq := range seqs {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendUint(b, seq, 10)
	}
	return b
}

// readIndex returns pool's kept checkpoints, newest first, and the index
// entry's revision (0: no entry).
func (s *Checkpoints) readIndex(ctx context.Context, pool string) ([]uint64, uint64, error) {
	e, err := directGet(ctx, func(ctx context.Context) (jetstream.KeyValueEntry, error) { return s.index.Get(ctx, pool) })
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("replica: checkpoint index of %s: %w", pool, err)
	}
	seqs, err := parseIndex(e.Value())
	return seqs, e.Revision(), err
}

// List returns the stream sequences of pool's kept checkpoints, newest
// first: one direct get of the index, bounded by CheckpointRequestTimeout.
func (s *Checkpoints) List(ctx context.Context, pool string) ([]uint64, error) {
	seqs, _, err := s.readIndex(ctx, pool)
	return seqs, err
}

// Get loads pool's checkpoint at seq. A damaged one (beyond the size bound,
// a digest mismatch, undecodable, naming another sequence, or deleted) is
// an error wrapping ErrDamagedCheckpoint. One whose metadata or chunks no
// replica answers within CheckpointRequestTimeout a request is another
// error: it may load later.
func (s *Checkpoints) Get(ctx context.Context, pool string, seq uint64) (*Checkpoint, error) {
	name := checkpointName(pool, seq)
	info, err := s.info(ctx, name)
	if err != nil {
		return nil, err
	}
	if int64(info.Size) > s.max {
		return nil, fmt.Errorf("%w: %s has %d bytes, the bound is %d", ErrDamagedCheckpoint, name, info.Size, s.max)
	}
	b, err := s.read(ctx, name, info)
	if err != nil {
		return nil, err
	}
	c, err := DecodeCheckpoint(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if c.Seq != seq {
		return nil, fmt.Errorf("%w: %s holds stream sequence %d", ErrDamagedCheckpoint, name, c.Seq)
	}
	return c, nil
}

// metaSubject is an object's metadata subject (ADR-20: the name in
// base64url, with padding).
func (s *Checkpoints) metaSubject(name string) string {
	return "$O." + s.bucket + ".M." + base64.URLEncoding.EncodeToString([]byte(name))
}

// info reads an object's metadata by one direct get.
func (s *Checkpoints) info(ctx context.Context, name string) (*jetstream.ObjectInfo, error) {
	m, err := directGet(ctx, func(ctx context.Context) (*jetstream.RawStreamMsg, error) {
		return s.stream.GetLastMsgForSubject(ctx, s.metaSubject(name))
	})
	if err != nil {
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			// The index names it but no replica answering has it: a
			// replica behind the index's, or an object lost — not proof
			// of damage, so the caller may retry.
			err = jetstream.ErrObjectNotFound
		}
		return nil, fmt.Errorf("replica: checkpoint %s: %w", name, err)
	}
	var info jetstream.ObjectInfo
	if err := json.Unmarshal(m.Data, &info); err != nil {
		return nil, fmt.Errorf("%w: %s: metadata: %w", ErrDamagedCheckpoint, name, err)
	}
	if info.Deleted {
		return nil, fmt.Errorf("%w: %s was deleted", ErrDamagedCheckpoint, name)
	}
	if info.NUID == "" || (info.Size > 0 && info.Chunks == 0) || uint64(info.Chunks) > info.Size {
		// Every chunk holds at least a byte: more chunks than bytes would
		// have the reader ask for up to 2^32 messages.
		return nil, fmt.Errorf("%w: %s: metadata names %d chunks for %d bytes", ErrDamagedCheckpoint, name, info.Chunks, info.Size)
	}
	return &info, nil
}

// read reads an object's chunks, one direct get each (the next message on
// its chunk subject), and checks their count, size and SHA-256 digest.
func (s *Checkpoints) read(ctx context.Context, name string, info *jetstream.ObjectInfo) ([]byte, error) {
	want, err := jetstream.DecodeObjectDigest(info.Digest)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: digest %q: %w", ErrDamagedCheckpoint, name, info.Digest, err)
	}
	subject := "$O." + s.bucket + ".C." + info.NUID
	// The size is bounded (MaxCheckpoint), but it is the metadata's word:
	// memory grows with the chunks actually read.
	b := make([]byte, 0, min(info.Size, 1<<26))
	h := sha256.New()
	next := uint64(1)
	for range info.Chunks {
		m, err := directGet(ctx, func(ctx context.Context) (*jetstream.RawStreamMsg, error) {
			return s.stream.GetMsg(ctx, next, jetstream.WithGetMsgSubject(subject))
		})
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil, fmt.Errorf("%w: %s: %d of %d chunks", ErrDamagedCheckpoint, name, len(b), info.Size)
		}
		if err != nil {
			return nil, fmt.Errorf("replica: checkpoint %s: %w", name, err)
		}
		if len(m.Data) == 0 || uint64(len(b)+len(m.Data)) > info.Size {
			return nil, fmt.Errorf("%w: %s: an empty chunk or chunks beyond its %d bytes", ErrDamagedCheckpoint, name, info.Size)
		}
		b = append(b, m.Data...)
		h.Write(m.Data)
		next = m.Sequence + 1
	}
	if uint64(len(b)) != info.Size || !bytes.Equal(h.Sum(nil), want) {
		return nil, fmt.Errorf("%w: %s: %w", ErrDamagedCheckpoint, name, jetstream.ErrDigestMismatch)
	}
	return b, nil
}

// maxIndexAttempts bounds Put's compare-and-set rounds on the index (two
// standbys checkpointing at once).
const maxIndexAttempts = 8

// Put stores c as pool's checkpoint at c.Seq, names it in the index with
// the newest other one (compare-and-set: replicas checkpointing at once
// keep the two newest of all), and deletes what the index no longer names.
// It returns the encoded size and the sequence below which pool's subject
// may be purged: the older kept checkpoint's (0: nothing may be purged
// yet). The newest is not that bound, so that a damaged newest checkpoint
// still has its older one and the records after it. ctx bounds it all.
func (s *Checkpoints) Put(ctx context.Context, pool string, c *Checkpoint) (size int, purgeBelow uint64, err error) {
	b := AppendCheckpoint(nil, c)
	if _, err := s.os.Put(ctx, jetstream.ObjectMeta{Name: checkpointName(pool, c.Seq)}, bytes.NewReader(b)); err != nil {
		return len(b), 0, fmt.Errorf("replica: store checkpoint: %w", err)
	}
	var kept, dropped []uint64
	for attempt := 0; ; attempt++ {
		old, rev, err := s.readIndex(ctx, pool)
		if errors.Is(err, ErrDamagedCheckpoint) {
			old = nil // a garbage index is replaced; what it named leaks
		} else if err != nil {
			return len(b), 0, err
		}
		all := slices.Compact(slices.SortedFunc(slices.Values(append(old, c.Seq)), func(a, b uint64) int { return cmp.Compare(b, a) }))
		kept, dropped = all[:min(2, len(all))], all[min(2, len(all)):]
		if slices.Equal(kept, old) {
			break // another replica stored this sequence already
		}
		ictx, cancel := bounded(ctx)
		if rev == 0 {
			_, err = s.index.Create(ictx, pool, formatIndex(kept))
		} else {
			_, err = s.index.Update(ictx, pool, formatIndex(kept), rev)
		}
		cancel()
		if err == nil {
			break
		}
		if !errors.Is(err, jetstream.ErrKeyExists) || attempt+1 == maxIndexAttempts {
			// The object is stored but not named: delete it, or it leaks.
			_ = s.os.Delete(ctx, checkpointName(pool, c.Seq))
			return len(b), 0, fmt.Errorf("replica: checkpoint index of %s: %w", pool, err)
		}
	}
	for _, seq := range dropped {
		if err := s.os.Delete(ctx, checkpointName(pool, seq)); err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
			return len(b), 0, fmt.Errorf("replica: delete checkpoint: %w", err)
		}
	}
	if len(kept) >= 2 {
		purgeBelow = kept[1]
	}
	return len(b), purgeBelow, nil
}

// Sweep deletes pool's checkpoint objects below stream sequence below
// (Put's purge bound, the older kept checkpoint) and returns how many: an
// object is stored before the index names it, so a replica that died in
// between left one no index names, and nothing else deletes it (one
// checkpoint's image, up to 128 MiB of words). Put names only the two
// newest checkpoints it has seen, and the index's kept sequences only
// grow, so no object below the older kept one is ever named again — a
// concurrent Put of one deletes it itself. Objects above it are left: one
// may be another replica's, stored and about to be named. It lists the
// bucket, which waits for the store's stream leader: ctx bounds it.
func (s *Checkpoints) Sweep(ctx context.Context, pool string, below uint64) (int, error) {
	objs, err := s.os.List(ctx)
	if errors.Is(err, jetstream.ErrNoObjectsFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("replica: listing checkpoints: %w", err)
	}
	deleted := 0
	for _, o := range objs {
		digits, ok := strings.CutPrefix(o.Name, pool+"/ckpt-")
		if !ok {
			continue
		}
		seq, err := strconv.ParseUint(digits, 10, 64)
		if err != nil || seq >= below {
			continue
		}
		if err := s.os.Delete(ctx, o.Name); err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
			return deleted, fmt.Errorf("replica: delete checkpoint: %w", err)
		}
		deleted++
	}
	return deleted, nil
}

// Purge purges subject of s below stream sequence seq (the message at seq
// stays: the subject's last sequence never falls back, so an empty replica's
// term record can never succeed).
func Purge(ctx context.Context, s jetstream.Stream, subject string, seq uint64) error {
	if seq <= 1 {
		return nil
	}
	if err := s.Purge(ctx, jetstream.WithPurgeSubject(subject), jetstream.WithPurgeSequence(seq)); err != nil {
		return fmt.Errorf("replica: purge %s below %d: %w", subject, seq, err)
	}
	return nil
}

// FirstPrev returns the predecessor named by the first message left on
// subject (0 when the chain starts there or the subject is empty): a
// replica without a checkpoint can rebuild only from a chain that starts
// at 0.
func FirstPrev(ctx context.Context, s jetstream.Stream, subject string) (uint64, error) {
	return firstPrev(s.GetMsg(ctx, 1, jetstream.WithGetMsgSubject(subject)))
}

// firstPrev is the predecessor named by a subject's first message read as
// m (0 when the subject has none).
func firstPrev(m *jetstream.RawStreamMsg, err error) (uint64, error) {
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	h, err := DecodeMessage(m.Data)
	if err != nil {
		return 0, fmt.Errorf("stream sequence %d: %w", m.Sequence, err)
	}
	return h.Prev, nil
}
