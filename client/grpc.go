package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/consumer"
	"github.com/ckfrelay/ckfrelay/wire"
	"github.com/ckfrelay/ckfrelay/wire/cbi1"
	"github.com/ckfrelay/ckfrelay/wire/kvrelay"
	"github.com/ckfrelay/ckfrelay/wire/kvrelay/kvrelaypb"
)

// GRPCConfig selects the gRPC transport (docs/deploy.md): the router follows
// any server of Dynamo's WAN contract, dynamo.kvrelay.v1.KvEventRelay —
// ckfrelay's relay (`relay serve --grpc-listen`) or Dynamo's own — with the
// contract's client rules (docs/wire.md §8.2):
//
//   - one WatchKvPoolCatalog stream per relay keeps the newest complete
//     catalog, whose pools are identified by their whole KvPoolId (indexer
//     domain and dc_id: a data center hosts one pool per domain, e.g. per
//     model); a target follows, in the data center its [Target.DCID] names,
//     the one pool the router's [Config.Select] matches ([Selection]; none
//     or several: not followed);
//   - each lane subscribes with SubscribeKvPool under the exact
//     expected_producer the catalog advertises, and its session ends when
//     the catalog withdraws or replaces that key;
//   - CBI1 snapshot chunks and deltas are checked (format, dc_id, sequences)
//     and re-encoded as wire v1 frames under the lane's own lease, so the
//     consumer's identity, gap and staleness checks (SPEC §8.3) keep their
//     meaning; every session starts from a fresh snapshot;
//   - a failed RPC's kv-relay-error-reason trailer (else its status code)
//     decides what follows ([RelayError]); a reason after which the
//     contract forbids an unchanged retry blocks the key until the catalog
//     offers another one;
//   - catalog entries with values this version does not know (identity
//     source or version, CKF format, hash format, worker role, model
//     target) are quarantined: their lanes stay retired ([ErrQuarantined]).
type GRPCConfig struct {
	// DialOptions are used to dial every relay address (Config.Relays:
	// any grpc.NewClient target, e.g. "127.0.0.1:7879"). Default: plaintext
	// (insecure.NewCredentials()); pass TLS credentials for a relay that
	// serves TLS. Config.AuthToken is added as a bearer token per RPC
	// either way. The connection's HTTP/2 receive windows are fixed at
	// 4 MiB (no BDP estimation; docs/RATIONALE.md "Why does the gRPC client
	// fix its HTTP/2 receive windows at 4 MiB?"); DialOptions come later
	// and may set others.
	DialOptions []grpc.DialOption
	// KeepaliveTime and KeepaliveTimeout are the HTTP/2 keepalive pings on
	// every relay connection: a ping after KeepaliveTime without traffic,
	// and the connection closed when its ack takes longer than
	// KeepaliveTimeout, so a relay whose connection died silently (no FIN,
	// no RST) is noticed within KeepaliveTime + KeepaliveTimeout, long
	// before the frame idle bound. Defaults [DefaultKeepaliveTime] and
	// [DefaultKeepaliveTimeout]; gRPC raises a KeepaliveTime under 10s to
	// 10s (and ckfrelay's relay refuses pings more often than that).
	KeepaliveTime, KeepaliveTimeout time.Duration
	// SubscriberID is the streams' subscriber_id, a diagnostic label
	// (non-empty, at most 128 UTF-8 bytes, no control characters). Default
	// "ckfrelay-router-<ConsumerInstance>".
	SubscriberID string
}

// Timing defaults of the gRPC transport (docs/deploy.md "What the client
// checks"). Dynamo's pool heartbeat is 10 s by default
// (lib/llm/src/kv_dc_relay/wan/grpc/config.rs pool_heartbeat_interval_ms
// @02dff6b8) and its relay announces no interval, so the frame idle bound
// sits three heartbeats past it; keepalive pings find a dead connection
// sooner.
const (
	// DynamoHeartbeat is Dynamo's default pool heartbeat interval.
	DynamoHeartbeat = 10 * time.Second
	// DefaultGRPCIdleTimeout is Config.IdleTimeout's default over gRPC.
	DefaultGRPCIdleTimeout = 3 * DynamoHeartbeat
	// DefaultKeepaliveTime and DefaultKeepaliveTimeout are GRPCConfig's
	// keepalive defaults: a dead connection is noticed within 20 s.
	DefaultKeepaliveTime    = 15 * time.Second
	DefaultKeepaliveTimeout = 5 * time.Second
)

// Errors of the gRPC transport.
var (
	// ErrNotInCatalog: the relay's catalog has no pool of the target's
	// data center that the selection matches, or no valid catalog was
	// received yet.
	ErrNotInCatalog = errors.New("client: grpc: pool not in the relay's catalog")
	// ErrQuarantined: the catalog entry holds a value this version does not
	// support or malformed data; its lane is not followed.
	ErrQuarantined = errors.New("client: grpc: catalog entry quarantined")
	// ErrKeyBlocked: the relay refused this producer key with a reason after
	// which the contract forbids retrying it unchanged; the lane waits for
	// the catalog to advertise another key.
	ErrKeyBlocked = errors.New("client: grpc: producer key refused, waiting for a catalog change")
	// ErrWithdrawn: the catalog withdrew or replaced the key a session
	// followed.
	ErrWithdrawn = errors.New("client: grpc: producer key withdrawn from the catalog")
	// ErrInvalidPublication: a FilterUpdate or its CBI1 payload broke the
	// contract (an unknown kind, a payload that does not decode, another
	// producer, format or dc_id, sequences that disagree).
	ErrInvalidPublication = errors.New("client: grpc: invalid publication")
)

// RelayError is an RPC the relay failed: the status error and the
// contract's disposition for it (the trailer's reason, else the status
// code's rule). errors.Is(err, ErrStreamClosed) holds for a stream that
// ended without status (a clean EOF, which the contract treats as a
// failure too).
type RelayError struct {
	RPC         string
	Err         error
	Disposition kvrelay.Reason
}

func (e *RelayError) Error() string {
	name := "no reason"
	if e.Disposition.Reason != kvrelaypb.RelayErrorReason_RELAY_ERROR_REASON_UNSPECIFIED {
		name = e.Disposition.Name()
	}
	return fmt.Sprintf("client: grpc: %s: %v (%s)", e.RPC, e.Err, name)
}

func (e *RelayError) Unwrap() error { return e.Err }

// blocksKey reports whether the contract forbids resubscribing to the same
// key after d: every reason without backoff (contract mismatch, invalid
// request, unsupported feature, pool not found, producer changed, invalid
// publication, and FAILED_PRECONDITION without a reason).
func blocksKey(d kvrelay.Reason) bool { return !d.Backoff }

// grpcTransport is a router's gRPC connection and catalog, shared by its
// lanes.
type grpcTransport struct {
	cfg   GRPCConfig
	token string
	addrs *replicas

	mu      sync.Mutex
	conn    *grpc.ClientConn // nil until first use and after a move to another replica
	connAt  int              // the replica index conn was dialed to
	sel     Selection        // the router's selection (Config.Select)
	catalog []catalogEntry   // the newest valid snapshot's pools
	catErr  error            // why there is no catalog (nil: one is installed)
	blocked map[int]ckf.ProducerIdentity
	active  map[int]*grpcSource
	changed chan struct{} // closed and replaced on every catalog change
}

func newGRPCTransport(cfg GRPCConfig, sel Selection, addrs []string, token string, consumer uint64) (*grpcTransport, error) {
	if cfg.KeepaliveTime <= 0 {
		cfg.KeepaliveTime = DefaultKeepaliveTime
	}
	if cfg.KeepaliveTimeout <= 0 {
		cfg.KeepaliveTimeout = DefaultKeepaliveTimeout
	}
	if cfg.SubscriberID == "" {
		cfg.SubscriberID = fmt.Sprintf("ckfrelay-router-%d", consumer)
	}
	if err := kvrelay.CheckSubscriberID(cfg.SubscriberID); err != nil {
		return nil, fmt.Errorf("client: grpc: %w", err)
	}
	return &grpcTransport{cfg: cfg, sel: sel, token: token, addrs: &replicas{addrs: addrs}, catErr: ErrNotInCatalog,
		blocked: map[int]ckf.ProducerIdentity{}, active: map[int]*grpcSource{}, changed: make(chan struct{})}, nil
}

// client returns the stub of the relay's replica in use, dialing on first
// use and after a move.
func (t *grpcTransport) client() (kvrelaypb.KvEventRelayClient, error) {
	addr, i := t.addrs.current()
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.conn != nil && t.connAt != i {
		t.conn.Close() // moved: streams on the old replica end and resubscribe
		t.conn = nil
	}
	if t.conn == nil {
		opts := append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: t.cfg.KeepaliveTime, Timeout: t.cfg.KeepaliveTimeout, PermitWithoutStream: true}),
			grpc.WithInitialWindowSize(receiveWindowBytes), grpc.WithInitialConnWindowSize(receiveWindowBytes)},
			t.cfg.DialOptions...)
		cc, err := grpc.NewClient(addr, opts...)
		if err != nil {
			return nil, fmt.Errorf("client: grpc: %w", err)
		}
		t.conn, t.connAt = cc, i
	}
	return kvrelaypb.NewKvEventRelayClient(t.conn), nil
}

func (t *grpcTransport) close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.conn != nil {
		t.conn.Close()
	}
	t.conn = nil
}

// callCtx adds the bearer token to an RPC's context.
func (t *grpcTransport) callCtx(ctx context.Context) context.Context {
	if t.token == "" {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+t.token)
}

// callOpts raise the receive limit to the contract's 8 MiB (a full CBI1
// chunk exceeds gRPC's default 4 MiB) and collect the trailer.
func callOpts(trailer *metadata.MD) []grpc.CallOption {
	return []grpc.CallOption{grpc.MaxCallRecvMsgSize(kvrelay.MaxMessageBytes), grpc.Trailer(trailer)}
}

// watchCatalog keeps the catalog current until ctx ends: it (re)opens
// WatchKvPoolCatalog with backoff and installs every complete snapshot.
func (t *grpcTransport) watchCatalog(ctx context.Context, lo, hi time.Duration, log func(msg string, args ...any)) {
	failures := 0
	for ctx.Err() == nil {
		_, at := t.addrs.current()
		got, err := t.watchOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		if got {
			failures = 0
		} else {
			// This replica served no catalog (unreachable, refusing, or a
			// standby): try the relay's next one.
			t.addrs.failed(at)
		}
		log("catalog watch ended", "err", err)
		d := backoff(lo, hi, failures)
		failures++
		select {
		case <-time.After(d):
		case <-ctx.Done():
			return
		}
	}
}

// watchOnce runs one catalog stream; got reports whether it installed a
// snapshot.
func (t *grpcTransport) watchOnce(ctx context.Context) (got bool, err error) {
	cli, err := t.client()
	if err != nil {
		return false, err
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	req := &kvrelaypb.WatchKvPoolCatalogRequest{SubscriberId: t.cfg.SubscriberID}
	kvrelay.StampRequest(req)
	var trailer metadata.MD
	stream, err := cli.WatchKvPoolCatalog(t.callCtx(wctx), req, callOpts(&trailer)...)
	if err != nil {
		return false, relayError("WatchKvPoolCatalog", err, trailer)
	}
	var prev *kvrelaypb.KvPoolCatalogUpdate
	for {
		m, err := stream.Recv()
		if err != nil {
			return got, relayError("WatchKvPoolCatalog", err, stream.Trailer())
		}
		cat, err := parseCatalog(m)
		if err == nil && prev != nil {
			err = catalogFollows(prev, m)
		}
		prev = m
		if err != nil {
			// An invalid envelope or an ambiguous snapshot invalidates the
			// catalog plane: no view until a valid snapshot arrives.
			t.install(nil, err)
			return got, err
		}
		t.install(cat, nil)
		got = true
	}
}

// catalogFollows checks a catalog update against the one before it on the
// same stream, as Dynamo's consumer does (global_view_consumer/coordinator.rs
// @0092138f): the relay identity does not change within a stream, the
// revision does not go backwards, and a repeated revision repeats its
// snapshot. A violation ends the stream and its catalog.
func catalogFollows(prev, m *kvrelaypb.KvPoolCatalogUpdate) error {
	a, b := prev.GetRelay(), m.GetRelay()
	switch {
	case a.GetDrtInstanceId() != b.GetDrtInstanceId() || a.GetRelayIncarnation() != b.GetRelayIncarnation():
		return fmt.Errorf("client: grpc: catalog: relay incarnation changed within a connection epoch (%d/%d, then %d/%d)",
			a.GetDrtInstanceId(), a.GetRelayIncarnation(), b.GetDrtInstanceId(), b.GetRelayIncarnation())
	case m.GetRevision() < prev.GetRevision():
		return fmt.Errorf("client: grpc: catalog: revision moved backwards (%d, then %d)", prev.GetRevision(), m.GetRevision())
	case m.GetRevision() == prev.GetRevision() && !proto.Equal(prev.GetSnapshot(), m.GetSnapshot()):
		return fmt.Errorf("client: grpc: catalog: revision %d changed without advancing", m.GetRevision())
	}
	return nil
}

// relayError wraps an RPC failure with its disposition; a clean EOF counts
// as an unexpected end (no reason, reconnect with a snapshot).
func relayError(rpc string, err error, trailer metadata.MD) error {
	if errors.Is(err, io.EOF) {
		return &RelayError{RPC: rpc, Err: fmt.Errorf("%w: end of stream", ErrStreamClosed), Disposition: kvrelay.ForCode(codes.Unavailable)}
	}
	return &RelayError{RPC: rpc, Err: err, Disposition: kvrelay.Disposition(err, trailer)}
}

// install replaces the catalog (nil with the reason there is none), ends
// every session whose data center the selection no longer resolves to its
// key, and unblocks keys the catalog changed.
func (t *grpcTransport) install(cat []catalogEntry, why error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if cat != nil {
		t.catalog, t.catErr = cat, nil
	} else {
		t.catalog, t.catErr = nil, why
	}
	if cat != nil {
		for lane, key := range t.blocked {
			if i, err := t.sel.pick(cat, key.Pool.DCID); err != nil || cat[i].id != key {
				delete(t.blocked, lane)
			}
		}
		for _, s := range t.active {
			if i, err := t.sel.pick(cat, s.id.Pool.DCID); err != nil || cat[i].id != s.id {
				s.cancel(ErrWithdrawn)
			}
		}
	}
	close(t.changed)
	t.changed = make(chan struct{})
}

// open subscribes lane to the catalog's key for dcID.
func (t *grpcTransport) open(ctx context.Context, dcID uint64, lease ckf.LaneLease) (frameSource, error) {
	cli, err := t.client()
	if err != nil {
		return nil, err
	}
	lane := int(lease.PhysicalLane)
	t.mu.Lock()
	if t.catErr != nil {
		// No catalog yet (or an invalid one): wait for the watcher's next
		// install rather than fail at once, so a router's first sessions
		// do not race its first catalog.
		ch := t.changed
		t.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
		t.mu.Lock()
	}
	if t.catErr != nil {
		why := t.catErr
		t.mu.Unlock()
		return nil, fmt.Errorf("%w (%v)", ErrNotInCatalog, why)
	}
	i, err := t.sel.pick(t.catalog, dcID)
	if err != nil {
		t.mu.Unlock()
		return nil, err
	}
	e := t.catalog[i]
	if b, ok := t.blocked[lane]; ok && b == e.id {
		t.mu.Unlock()
		return nil, fmt.Errorf("%w: %+v", ErrKeyBlocked, e.id)
	}
	sctx, cancel := context.WithCancelCause(ctx)
	s := &grpcSource{t: t, lane: lane, ctx: sctx, cancel: cancel, id: e.id, lease: lease}
	t.active[lane] = s
	t.mu.Unlock()

	req := &kvrelaypb.SubscribeKvPoolRequest{SubscriberId: t.cfg.SubscriberID, ExpectedProducer: e.desc.GetProducer()}
	kvrelay.StampRequest(req)
	stream, err := cli.SubscribeKvPool(t.callCtx(sctx), req, append(callOpts(&s.trailer), grpc.ForceCodecV2(newUpdateCodec()))...)
	if err != nil {
		s.Close()
		return nil, s.fail(relayError("SubscribeKvPool", err, s.trailer))
	}
	s.stream = stream
	return s, nil
}

// grpcSource is one SubscribeKvPool stream, translated to wire v1 frames.
type grpcSource struct {
	t       *grpcTransport
	lane    int
	ctx     context.Context
	cancel  context.CancelCauseFunc
	stream  grpc.ServerStreamingClient[kvrelaypb.FilterUpdate]
	trailer metadata.MD
	msg     kvrelaypb.FilterUpdate // every update is received into it (updateCodec)
	id      ckf.ProducerIdentity
	lease   ckf.LaneLease

	cbi   cbi1.Frame
	frame wire.Frame
	buf   []byte
	imgs  []ckf.BucketImage // a delta's images, deduplicated
	seen  map[uint32]int    // bucket → index in imgs
	marks []uint64          // one bit per bucket of the format: finds repeated buckets without the map

	// word0 is bucket 0's word in the lane, as of the last frame the
	// consumer accepted; pend0 (when hasPend0) is the word the frame being
	// applied would give it, committed by accepted. A frame the consumer
	// ignores or refuses leaves word0 as it was.
	word0    uint64
	pend0    uint64
	hasPend0 bool

	// Sequences only move forward on a session: seq is the sequence of the
	// last snapshot chunk or delta translated (hasSeq: one was), and
	// lastDelta the last delta's CBI1 payload, so that a delta repeated at
	// that sequence is accepted only when it is the same delta.
	seq       uint64
	hasSeq    bool
	lastDelta []byte

	// Dynamo's consumer rules (checkDynamo): the relay identity the
	// stream started with, and whether its snapshot's last chunk came.
	relay    *kvrelaypb.RelayIdentity
	snapDone bool
}

// fail records a key the contract forbids retrying unchanged.
func (s *grpcSource) fail(err error) error {
	var re *RelayError
	if errors.As(err, &re) && blocksKey(re.Disposition) {
		s.t.mu.Lock()
		s.t.blocked[s.lane] = s.id
		s.t.mu.Unlock()
	}
	return err
}

// ReadFrame implements decodedSource: the next FilterUpdate, checked and
// translated to a wire v1 frame under the lane's lease, never encoded.
func (s *grpcSource) ReadFrame() (*wire.Frame, error) {
	m := &s.msg
	if err := s.stream.RecvMsg(m); err != nil {
		if cerr := context.Cause(s.ctx); cerr != nil {
			return nil, cerr
		}
		return nil, s.fail(relayError("SubscribeKvPool", err, s.stream.Trailer()))
	}
	s.hasPend0 = false // the previous frame's, if the consumer did not accept it
	if err := s.translate(m); err != nil {
		// The contract: invalidate the replica and close its stream; never
		// skip a frame. The session's end retires the lane.
		return nil, err
	}
	return &s.frame, nil
}

// ReadRaw implements frameSource: ReadFrame's frame encoded as a wire v1
// frame body (for a reader of bodies; the router uses ReadFrame).
func (s *grpcSource) ReadRaw() ([]byte, error) {
	f, err := s.ReadFrame()
	if err != nil {
		return nil, err
	}
	s.buf, err = wire.AppendFrame(s.buf[:0], f)
	return s.buf, err
}

// translate checks m and fills s.frame with its wire v1 equivalent.
func (s *grpcSource) translate(m *kvrelaypb.FilterUpdate) error {
	if err := kvrelay.CheckResponse(m); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidPublication, err)
	}
	id, err := kvrelay.ProducerFromWire(m.GetProducer())
	if err != nil || id != s.id {
		return fmt.Errorf("%w: update for producer %+v (%v), subscribed to %+v", ErrInvalidPublication, id, err, s.id)
	}
	if err := s.checkDynamo(m); err != nil {
		return err
	}
	switch m.GetKind() {
	case kvrelaypb.FilterUpdateKind_FILTER_UPDATE_KIND_HEARTBEAT:
		s.frame.Kind = wire.KindHeartbeat
		s.frame.Heartbeat = wire.Heartbeat{Identity: s.id, Lease: s.lease, LastSequence: m.GetSequence(),
			UnixMicros: int64(min(m.GetSendTsUs(), 1<<63-1))}
		return nil
	case kvrelaypb.FilterUpdateKind_FILTER_UPDATE_KIND_SNAPSHOT_CHUNK, kvrelaypb.FilterUpdateKind_FILTER_UPDATE_KIND_DELTA:
	default:
		return fmt.Errorf("%w: filter update kind %d", ErrInvalidPublication, int32(m.GetKind()))
	}
	f := &s.cbi
	if err := cbi1.DecodeFor(m.GetPayload(), s.id.Format, f); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidPublication, err)
	}
	switch {
	case f.DCID != s.id.Pool.DCID:
		return fmt.Errorf("%w: CBI1 dc_id %d, subscribed to %d", ErrInvalidPublication, f.DCID, s.id.Pool.DCID)
	case f.Epoch != m.GetSequence():
		return fmt.Errorf("%w: CBI1 epoch %d, update sequence %d", ErrInvalidPublication, f.Epoch, m.GetSequence())
	}
	if m.GetKind() == kvrelaypb.FilterUpdateKind_FILTER_UPDATE_KIND_SNAPSHOT_CHUNK {
		if f.Kind != cbi1.KindSnapshotChunk {
			return fmt.Errorf("%w: SNAPSHOT_CHUNK carries a CBI1 %v", ErrInvalidPublication, f.Kind)
		}
		if s.hasSeq && f.Epoch != s.seq {
			return fmt.Errorf("%w: snapshot chunk at sequence %d after sequence %d", ErrInvalidPublication, f.Epoch, s.seq)
		}
		s.seq, s.hasSeq = f.Epoch, true
		s.snapDone = f.ChunkIndex+1 == f.ChunkCount
		if f.BucketOffset == 0 && len(f.Words) > 0 {
			s.pend0, s.hasPend0 = f.Words[0], true
		}
		s.frame.Kind = wire.KindSnapshotChunk
		s.frame.Snapshot = wire.SnapshotChunk{Identity: s.id, Lease: s.lease, Sequence: f.Epoch,
			ChunkIndex: f.ChunkIndex, ChunkCount: f.ChunkCount, BucketOffset: f.BucketOffset, Words: f.Words}
		return nil
	}
	switch {
	case f.Kind != cbi1.KindDelta:
		return fmt.Errorf("%w: DELTA carries a CBI1 %v", ErrInvalidPublication, f.Kind)
	case f.BaseEpoch != m.GetBaseSequence():
		return fmt.Errorf("%w: CBI1 base_epoch %d, update base_sequence %d", ErrInvalidPublication, f.BaseEpoch, m.GetBaseSequence())
	case !s.hasSeq:
		return fmt.Errorf("%w: delta at sequence %d before any snapshot", ErrInvalidPublication, f.Epoch)
	case f.Epoch < s.seq:
		// A relay that restarted its sequence under the same identity:
		// the consumer would skip these as stale while the relay's table
		// moves on, so the lane would drift with no error.
		return fmt.Errorf("%w: delta at sequence %d after sequence %d (sequences go backwards)", ErrInvalidPublication, f.Epoch, s.seq)
	case f.Epoch == s.seq && !bytes.Equal(m.GetPayload(), s.lastDelta):
		return fmt.Errorf("%w: a different delta repeats sequence %d", ErrInvalidPublication, f.Epoch)
	}
	s.seq = f.Epoch
	s.lastDelta = append(s.lastDelta[:0], m.GetPayload()...)
	s.frame.Kind = wire.KindDelta
	s.frame.Delta = ckf.Delta{Identity: s.id, Lease: s.lease, BaseSequence: f.BaseEpoch, Sequence: f.Epoch, Images: s.images(f.Images)}
	return nil
}

// checkDynamo makes the checks Dynamo's consumer makes of every update,
// in its order and with its reasons (global_view_consumer/stream.rs
// CkfStreamSession::process_update @33ca001d), after the envelope and
// producer: the relay identity is fixed for the life of a stream; a
// snapshot chunk's base_sequence is its sequence; a heartbeat has no
// payload, base_sequence = sequence, and comes only once the snapshot is
// complete, at the sequence installed. Each violation ends the stream
// (ErrInvalidPublication) and the lane subscribes afresh.
func (s *grpcSource) checkDynamo(m *kvrelaypb.FilterUpdate) error {
	r := m.GetRelay()
	if s.relay == nil {
		s.relay = &kvrelaypb.RelayIdentity{DrtInstanceId: r.GetDrtInstanceId(), RelayIncarnation: r.GetRelayIncarnation()}
	} else if r.GetDrtInstanceId() != s.relay.GetDrtInstanceId() || r.GetRelayIncarnation() != s.relay.GetRelayIncarnation() {
		return fmt.Errorf("%w: relay incarnation changed within a CKF stream (%d/%d, then %d/%d)", ErrInvalidPublication,
			s.relay.GetDrtInstanceId(), s.relay.GetRelayIncarnation(), r.GetDrtInstanceId(), r.GetRelayIncarnation())
	}
	switch m.GetKind() {
	case kvrelaypb.FilterUpdateKind_FILTER_UPDATE_KIND_SNAPSHOT_CHUNK:
		if m.GetBaseSequence() != m.GetSequence() {
			return fmt.Errorf("%w: snapshot chunk has mismatched base sequence (%d, sequence %d)", ErrInvalidPublication, m.GetBaseSequence(), m.GetSequence())
		}
	case kvrelaypb.FilterUpdateKind_FILTER_UPDATE_KIND_HEARTBEAT:
		if !s.snapDone {
			// Dynamo's reason, and the session rule it breaks (SPEC §9).
			return fmt.Errorf("%w: %w: CKF heartbeat has unexpected payload or sequence (sequence %d before the snapshot completed)",
				ErrInvalidPublication, ErrProtocol, m.GetSequence())
		}
		if len(m.GetPayload()) != 0 || m.GetBaseSequence() != m.GetSequence() || m.GetSequence() != s.seq {
			return fmt.Errorf("%w: CKF heartbeat has unexpected payload or sequence (%d bytes, base_sequence %d, sequence %d, installed %d)",
				ErrInvalidPublication, len(m.GetPayload()), m.GetBaseSequence(), m.GetSequence(), s.seq)
		}
	}
	return nil
}

// images returns a CBI1 delta's images as a wire v1 delta takes them. CBI1
// applies images in order, the last of a bucket winning, and allows an
// empty delta; a wire v1 delta names each bucket once and holds at least
// one image (SPEC §8.3). So repeated buckets keep their last image, and an
// empty delta becomes bucket 0 rewritten with the word it already has
// (tracked from the snapshot and every delta since that the consumer
// accepted), which changes nothing and advances the sequence as the empty
// delta does.
func (s *grpcSource) images(in []ckf.BucketImage) []ckf.BucketImage {
	if len(in) == 0 {
		return append(s.imgs[:0], ckf.BucketImage{Bucket: 0, Word: s.word0})
	}
	out := in
	if len(in) > 1 && s.repeats(in) {
		if s.seen == nil {
			s.seen = map[uint32]int{}
		}
		clear(s.seen)
		out = s.imgs[:0]
		for _, im := range in {
			if i, dup := s.seen[im.Bucket]; dup {
				out[i].Word = im.Word
				continue
			}
			s.seen[im.Bucket] = len(out)
			out = append(out, im)
		}
		s.imgs = out
	}
	for _, im := range out {
		if im.Bucket == 0 {
			s.pend0, s.hasPend0 = im.Word, true
		}
	}
	return out
}

// repeats reports whether images name a bucket twice, with one bit per
// bucket of the format (the lane's table holds 64 per bucket), so that a
// delta without repeats — every one a relay of this project sends — costs
// no map. A bucket outside the format reports no repeat: the consumer
// refuses the delta whole (MalformedImages) whatever else it holds.
func (s *grpcSource) repeats(images []ckf.BucketImage) bool {
	n := s.id.Format.BucketCount
	if uint64(len(s.marks)) < (n+63)/64 {
		s.marks = make([]uint64, (n+63)/64)
	}
	found, marked := false, 0
	for _, im := range images {
		b := uint64(im.Bucket)
		if b >= n {
			found = false
			break
		}
		w, bit := b/64, uint64(1)<<(b%64)
		if s.marks[w]&bit != 0 {
			found = true
			break
		}
		s.marks[w] |= bit
		marked++
	}
	for _, im := range images[:marked] {
		s.marks[im.Bucket/64] = 0
	}
	return found
}

// accepted implements acceptor: bucket 0's word of the frame just applied
// becomes the lane's only when the consumer wrote (or staged) the frame.
func (s *grpcSource) accepted(res consumer.Result) {
	switch res.Outcome {
	case consumer.Applied, consumer.SnapshotChunkAccepted, consumer.SnapshotInstalled:
		if s.hasPend0 {
			s.word0 = s.pend0
		}
	}
	s.hasPend0 = false
}

// Close implements frameSource.
func (s *grpcSource) Close() error {
	s.cancel(nil)
	s.t.mu.Lock()
	if s.t.active[s.lane] == s {
		delete(s.t.active, s.lane)
	}
	s.t.mu.Unlock()
	return nil
}

// receiveWindowBytes is the HTTP/2 receive window of a relay connection and
// of each of its streams. A fixed window switches off grpc-go's BDP
// estimator, which otherwise answers a sparse stream's data with a ping
// (and the relay with its ack) for nearly every message: two more frames,
// syscalls and wake-ups per delta on both sides. 4 MiB lets a relay send a
// full CBI1 delta or a burst of chunks without waiting for the router's
// window updates (the BDP estimator would grow to 16 MiB).
const receiveWindowBytes = 4 << 20
