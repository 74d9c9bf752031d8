package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"time"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/client/natsjs"
	"github.com/ckfrelay/ckfrelay/wire"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// NATSConfig selects the NATS transport (docs/deploy.md): instead of one HTTP
// stream per pool from the relay, a router reads what the relay broadcasts
// through JetStream — the newest snapshot from the pool's object store
// bucket, then the pool's frames stream from the sequence the snapshot names,
// with an ordered consumer. Every frame is stamped with the router's own lease
// before the consumer sees it, so the consumer's checks (SPEC §8.3) keep their
// meaning: a lost, reordered or foreign delta deactivates the lane and the
// router re-snapshots under a new epoch, exactly as on HTTP.
type NATSConfig struct {
	// URL of the NATS server(s), comma-separated; ignored when Conn is set.
	URL string
	// Options are used when the router connects to URL itself.
	Options []nats.Option
	// Conn is an existing connection to use (its owner closes it).
	Conn *nats.Conn
	// Prefix of the relay's subjects, streams and buckets (default "ckfrelay").
	Prefix string
	// Domain is the JetStream domain holding the relay's stream, when it is
	// not the connected server's own: a router on a leaf node in another
	// region reads the home region's JetStream through it.
	Domain string
	// SnapshotTimeout bounds loading one snapshot (default 30s). A load
	// also gives up after 2s plus 1s per 10 MiB of snapshot: a snapshot the
	// relay replaces while it is read stalls (its chunks are purged), and
	// the lane should retry with the new one, not wait out the bound.
	SnapshotTimeout time.Duration
}

// maxSnapshotObject bounds a snapshot object: the largest table (2^24
// buckets of 8 bytes) in chunk frames, with room for their headers.
const maxSnapshotObject = 8<<24 + 16<<20

// natsTransport is a router's NATS connection, shared by its lanes and made
// on first use (nats.go reconnects it by itself afterwards).
type natsTransport struct {
	cfg NATSConfig

	mu  sync.Mutex
	nc  *nats.Conn
	own bool // the router made nc and closes it
	js  jetstream.JetStream
}

func newNATSTransport(cfg NATSConfig) *natsTransport {
	if cfg.SnapshotTimeout <= 0 {
		cfg.SnapshotTimeout = 30 * time.Second
	}
	return &natsTransport{cfg: cfg}
}

func (t *natsTransport) jetStream() (jetstream.JetStream, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.js != nil {
		return t.js, nil
	}
	nc := t.cfg.Conn
	if nc == nil {
		opts := append([]nats.Option{nats.Name("ckfrelay-router"), nats.MaxReconnects(-1)}, t.cfg.Options...)
		var err error
		if nc, err = nats.Connect(t.cfg.URL, opts...); err != nil {
			return nil, fmt.Errorf("client: nats: %w", err)
		}
		t.own = true
	}
	var js jetstream.JetStream
	var err error
	if t.cfg.Domain != "" {
		js, err = jetstream.NewWithDomain(nc, t.cfg.Domain)
	} else {
		js, err = jetstream.New(nc)
	}
	if err != nil {
		if t.own {
			nc.Close()
		}
		return nil, fmt.Errorf("client: nats: %w", err)
	}
	t.nc, t.js = nc, js
	return js, nil
}

func (t *natsTransport) close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.own && t.nc != nil {
		t.nc.Close()
	}
	t.nc, t.js, t.own = nil, nil, false
}

// open loads pool's newest snapshot and starts an ordered consumer on its
// frames stream from the stream sequence the snapshot names.
func (t *natsTransport) open(ctx context.Context, pool string, lease ckf.LaneLease, maxFrameBytes int) (frameSource, error) {
	layout, err := natsjs.For(t.cfg.Prefix, pool)
	if err != nil {
		return nil, err
	}
	js, err := t.jetStream()
	if err != nil {
		return nil, err
	}
	snapshot, from, err := t.loadSnapshot(ctx, js, layout)
	if err != nil {
		return nil, err
	}
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: []string{layout.Subject}, DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: from}
	if from == 0 {
		cfg.DeliverPolicy = jetstream.DeliverAllPolicy
	}
	cons, err := js.OrderedConsumer(ctx, layout.Stream, cfg)
	if err != nil {
		return nil, fmt.Errorf("client: nats: consumer on %s: %w", layout.Stream, err)
	}
	msgs, err := cons.Messages()
	if err != nil {
		return nil, fmt.Errorf("client: nats: consumer on %s: %w", layout.Stream, err)
	}
	return &natsSource{ctx: ctx, lease: lease, snapshot: wire.NewReader(bytes.NewReader(snapshot), maxFrameBytes),
		msgs: msgs, stop: context.AfterFunc(ctx, msgs.Stop)}, nil
}

// loadSnapshot reads the snapshot object the pointer names and the stream
// sequence to consume from. The pointer is the last message on the pool's
// pointer subject, which only the publisher whose frames are the stream's
// tail can move, so a deposed relay's late snapshot is never the one loaded
// once the new one published; without a pointer (a relay before it) the
// single object "snapshot" is read. A pointer that does not verify (see
// [natsTransport.snapshotObject]) is skipped for the object of the
// incarnation whose frames are the stream's tail. A snapshot replaced (a
// refresh of the same incarnation) or deleted (a newer incarnation's took
// over) while it is read fails its digest check (or the timeout); the
// session then ends and the lane retries.
func (t *natsTransport) loadSnapshot(ctx context.Context, js jetstream.JetStream, layout natsjs.Layout) ([]byte, uint64, error) {
	gctx, cancel := context.WithTimeout(ctx, t.cfg.SnapshotTimeout)
	defer cancel()
	obs, err := js.ObjectStore(gctx, layout.Bucket)
	if err != nil {
		return nil, 0, fmt.Errorf("client: nats: snapshot bucket %s: %w", layout.Bucket, err)
	}
	name, incarnation, head, err := t.snapshotObject(gctx, js, obs, layout)
	if err != nil {
		return nil, 0, err
	}
	rctx, rcancel := context.WithTimeout(gctx, snapshotReadBudget(head.Size))
	defer rcancel()
	res, err := obs.Get(rctx, name)
	if err != nil {
		return nil, 0, fmt.Errorf("client: nats: snapshot in %s: %w", layout.Bucket, err)
	}
	defer res.Close()
	info, err := res.Info()
	if err != nil {
		return nil, 0, fmt.Errorf("client: nats: snapshot info: %w", err)
	}
	if info.Size > maxSnapshotObject {
		return nil, 0, fmt.Errorf("client: nats: snapshot object of %d bytes exceeds %d", info.Size, maxSnapshotObject)
	}
	from, err := strconv.ParseUint(info.Metadata[natsjs.MetaStreamSequence], 10, 64)
	if err != nil {
		return nil, 0, fmt.Errorf("client: nats: snapshot metadata %s: %w", natsjs.MetaStreamSequence, err)
	}
	if name != natsjs.SnapshotObject && info.Metadata[natsjs.MetaIncarnation] != strconv.FormatUint(incarnation, 10) {
		return nil, 0, fmt.Errorf("client: nats: snapshot %s says incarnation %q, the pointer %d", name, info.Metadata[natsjs.MetaIncarnation], incarnation)
	}
	data, err := io.ReadAll(io.LimitReader(res, int64(info.Size)+1))
	if err != nil {
		return nil, 0, fmt.Errorf("client: nats: reading the snapshot: %w", err)
	}
	if uint64(len(data)) != info.Size {
		return nil, 0, fmt.Errorf("client: nats: snapshot of %d bytes, object says %d", len(data), info.Size)
	}
	return data, from, nil
}

// snapshotObject returns the snapshot object to load, its incarnation and
// its info. It is the one the last pointer names, provided the pointer
// verifies: it parses, and the object exists with the pointer's sequence,
// incarnation and stream sequence as its metadata — what the relay writes
// before it moves the pointer. A pointer that does not verify is someone
// else's message on the pointer subject (docs/deploy.md: only the relay
// may publish there) or one whose object was refreshed since; routers
// used to fail every load until the relay's next pointer (up to
// snapshot_interval, 30 s by default, and for good against a writer that
// forges again after each). It is skipped for the object of the
// incarnation whose frame is the frames subject's last message (a delta
// or heartbeat names it): the relay's own, which a pointer of the same
// relay names too. That object is also preferred to a verified pointer of
// an older incarnation, once it exists. Without a pointer the legacy
// object "snapshot" is read.
func (t *natsTransport) snapshotObject(ctx context.Context, js jetstream.JetStream, obs jetstream.ObjectStore, layout natsjs.Layout) (string, uint64, *jetstream.ObjectInfo, error) {
	st, err := js.Stream(ctx, layout.Stream)
	if err != nil {
		return "", 0, nil, fmt.Errorf("client: nats: stream %s: %w", layout.Stream, err)
	}
	m, err := st.GetLastMsgForSubject(ctx, layout.Pointer)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		head, err := obs.GetInfo(ctx, natsjs.SnapshotObject)
		if err != nil {
			return "", 0, nil, fmt.Errorf("client: nats: snapshot %s in %s: %w", natsjs.SnapshotObject, layout.Bucket, err)
		}
		return natsjs.SnapshotObject, 0, head, nil
	}
	if err != nil {
		return "", 0, nil, fmt.Errorf("client: nats: snapshot pointer %s: %w", layout.Pointer, err)
	}
	p, perr := natsjs.ParsePointer(m.Header)
	if perr == nil {
		head, err := obs.GetInfo(ctx, p.Object)
		if err == nil && pointsAt(p, head) {
			// A pointer of an incarnation older than the frames' is stale:
			// the newer relay's object is not written yet (a takeover a
			// moment ago), or the pointer is a copy of a deposed
			// incarnation's whose late object is still in the bucket.
			// The newer object, once it exists, is the one to load.
			if inc, err := tailIncarnation(ctx, st, layout.Subject); err == nil && inc > p.Incarnation {
				name := natsjs.SnapshotObjectName(inc)
				if newer, err := obs.GetInfo(ctx, name); err == nil {
					return name, inc, newer, nil
				}
			}
			return p.Object, p.Incarnation, head, nil
		}
		if err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
			return "", 0, nil, fmt.Errorf("client: nats: snapshot %s in %s: %w", p.Object, layout.Bucket, err)
		}
		perr = fmt.Errorf("the snapshot pointer at stream sequence %d names %s, which does not hold it", m.Sequence, p.Object)
		if err != nil {
			perr = fmt.Errorf("the snapshot pointer at stream sequence %d names %s: %w", m.Sequence, p.Object, err)
		}
	}
	inc, err := tailIncarnation(ctx, st, layout.Subject)
	if err != nil {
		return "", 0, nil, fmt.Errorf("client: nats: %w; and no incarnation to fall back to: %w", perr, err)
	}
	name := natsjs.SnapshotObjectName(inc)
	head, err := obs.GetInfo(ctx, name)
	if err != nil {
		return "", 0, nil, fmt.Errorf("client: nats: %w; and the frames' incarnation's snapshot %s: %w", perr, name, err)
	}
	return name, inc, head, nil
}

// pointsAt reports whether object info carries pointer p's fields.
func pointsAt(p natsjs.Pointer, info *jetstream.ObjectInfo) bool {
	return info.Metadata[natsjs.MetaSequence] == strconv.FormatUint(p.Sequence, 10) &&
		info.Metadata[natsjs.MetaIncarnation] == strconv.FormatUint(p.Incarnation, 10) &&
		info.Metadata[natsjs.MetaStreamSequence] == strconv.FormatUint(p.StreamSequence, 10)
}

// tailIncarnation returns the producer incarnation of the frames subject's
// last message, a delta or a heartbeat.
func tailIncarnation(ctx context.Context, st jetstream.Stream, subject string) (uint64, error) {
	m, err := st.GetLastMsgForSubject(ctx, subject)
	if err != nil {
		return 0, fmt.Errorf("the frames' last message: %w", err)
	}
	var f wire.Frame
	if err := wire.DecodeFrame(m.Data, &f); err != nil {
		return 0, fmt.Errorf("the frames' last message (stream sequence %d): %w", m.Sequence, err)
	}
	switch f.Kind {
	case wire.KindDelta:
		return f.Delta.Identity.ProducerIncarnation, nil
	case wire.KindHeartbeat:
		return f.Heartbeat.Identity.ProducerIncarnation, nil
	}
	return 0, fmt.Errorf("the frames' last message (stream sequence %d) is a %v frame, which names no incarnation", m.Sequence, f.Kind)
}

// snapshotReadBudget is how long reading a snapshot of size bytes may take
// before it counts as stalled: 2s plus 1s per 10 MiB.
func snapshotReadBudget(size uint64) time.Duration {
	return 2*time.Second + time.Duration(min(size, 1<<40)>>20)*time.Second/10
}

// natsSource yields the snapshot's chunk frames, then the stream's frames,
// each re-stamped with the lane's lease.
type natsSource struct {
	ctx      context.Context
	lease    ckf.LaneLease
	snapshot *wire.Reader // nil once exhausted
	msgs     jetstream.MessagesContext
	stop     func() bool
	frame    wire.Frame
	buf      []byte
}

// ReadRaw implements frameSource.
func (s *natsSource) ReadRaw() ([]byte, error) {
	if s.snapshot != nil {
		raw, err := s.snapshot.ReadRaw()
		if err == nil {
			return s.stamp(raw)
		}
		if !errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("client: nats: snapshot object: %w", err)
		}
		s.snapshot = nil
	}
	m, err := s.msgs.Next()
	if err != nil {
		if cerr := context.Cause(s.ctx); cerr != nil {
			return nil, cerr
		}
		return nil, fmt.Errorf("client: nats: %w", err)
	}
	return s.stamp(m.Data())
}

// stamp re-encodes a broadcast frame under the lane's lease.
func (s *natsSource) stamp(raw []byte) ([]byte, error) {
	if err := wire.DecodeFrame(raw, &s.frame); err != nil {
		return nil, err
	}
	switch s.frame.Kind {
	case wire.KindSnapshotChunk:
		s.frame.Snapshot.Lease = s.lease
	case wire.KindDelta:
		s.frame.Delta.Lease = s.lease
	case wire.KindDrainMarker:
		s.frame.Drain.Lease = s.lease
	case wire.KindHeartbeat:
		s.frame.Heartbeat.Lease = s.lease
	}
	var err error
	s.buf, err = wire.AppendFrame(s.buf[:0], &s.frame)
	return s.buf, err
}

// Close implements frameSource.
func (s *natsSource) Close() error {
	s.stop()
	s.msgs.Stop()
	return nil
}
