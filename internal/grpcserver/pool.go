package grpcserver

import (
	"context"
	"errors"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/peer"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/internal/connlimit"
	"github.com/ckfrelay/ckfrelay/internal/hub"
	"github.com/ckfrelay/ckfrelay/internal/server"
	"github.com/ckfrelay/ckfrelay/wire/cbi1"
	"github.com/ckfrelay/ckfrelay/wire/kvrelay"
	"github.com/ckfrelay/ckfrelay/wire/kvrelay/kvrelaypb"
)

const (
	reasonContract    = kvrelaypb.RelayErrorReason_RELAY_ERROR_REASON_CONTRACT_MISMATCH
	reasonInvalid     = kvrelaypb.RelayErrorReason_RELAY_ERROR_REASON_INVALID_REQUEST
	reasonUnsupported = kvrelaypb.RelayErrorReason_RELAY_ERROR_REASON_UNSUPPORTED_FEATURE
	reasonNotFound    = kvrelaypb.RelayErrorReason_RELAY_ERROR_REASON_POOL_NOT_FOUND
	reasonProducer    = kvrelaypb.RelayErrorReason_RELAY_ERROR_REASON_PRODUCER_CHANGED
	reasonLimit       = kvrelaypb.RelayErrorReason_RELAY_ERROR_REASON_RESOURCE_LIMIT
	reasonLagged      = kvrelaypb.RelayErrorReason_RELAY_ERROR_REASON_SUBSCRIBER_LAGGED
	reasonUnavailable = kvrelaypb.RelayErrorReason_RELAY_ERROR_REASON_PUBLICATION_UNAVAILABLE
	reasonFenced      = kvrelaypb.RelayErrorReason_RELAY_ERROR_REASON_INVALID_PUBLICATION
	reasonInternal    = kvrelaypb.RelayErrorReason_RELAY_ERROR_REASON_INTERNAL
)

// findPool returns the hosted pool whose PoolId is id.
func (g *Server) findPool(id ckf.PoolID) (server.KvPool, bool) {
	for _, p := range g.relay.KvPools() {
		if p.Identity().Pool == id {
			return p, true
		}
	}
	return server.KvPool{}, false
}

// advertised returns the producer the published catalog advertises for the
// pool id, as Dynamo's relay resolves a subscription against its catalog.
func (g *Server) advertised(id ckf.PoolID) (ckf.ProducerIdentity, bool) {
	cat, _ := g.catalog.latest()
	for _, d := range cat.GetSnapshot().GetPools() {
		if p, err := producerFromWire(d.GetProducer()); err == nil && p.Pool == id {
			return p, true
		}
	}
	return ckf.ProducerIdentity{}, false
}

// SubscribeKvPool streams one pool's filter for the exact producer the
// request expects: its CBI1 snapshot chunks, then contiguous deltas, with
// heartbeats while idle. The snapshot and deltas are the pool's hub's, the
// fan-out the HTTP stream reads.
//
// Admission follows Dynamo's order, codes and reasons
// (wan/grpc/service.rs subscribe_kv_pool and its source's subscribe_pool
// @91ec3789; docs/deploy.md): the envelope, subscriber_id and
// expected_producer are checked; then the relay's total pool stream limit
// is taken (RESOURCE_LIMIT); then the pool is looked up in the published
// catalog (POOL_NOT_FOUND) and its advertised producer compared
// (PRODUCER_CHANGED); then the pool's hub admits the subscriber
// (RESOURCE_LIMIT at the per-pool limit, PUBLICATION_UNAVAILABLE when it is
// not publishing).
func (g *Server) SubscribeKvPool(req *kvrelaypb.SubscribeKvPoolRequest, stream grpc.ServerStreamingServer[kvrelaypb.FilterUpdate]) error {
	ctx := stream.Context()
	if err := kvrelay.CheckRequest(req); err != nil {
		return kvrelay.Fail(ctx, reasonContract, "%v", err)
	}
	if err := kvrelay.CheckSubscriberID(req.GetSubscriberId()); err != nil {
		return kvrelay.Fail(ctx, reasonInvalid, "%v", err)
	}
	want, err := producerFromWire(req.GetExpectedProducer())
	switch {
	case errors.Is(err, kvrelay.ErrUnsupportedIdentity):
		return kvrelay.Fail(ctx, reasonUnsupported, "%v", err)
	case err != nil:
		return kvrelay.Fail(ctx, reasonInvalid, "%v", err)
	}
	select {
	case g.poolSlots <- struct{}{}:
		defer func() { <-g.poolSlots }()
	default:
		return kvrelay.Fail(ctx, reasonLimit, "relay total pool stream limit %d reached", cap(g.poolSlots))
	}
	if pool, ok := g.findPool(want.Pool); ok {
		if hint, standby := pool.Leader(); standby {
			return notLeader(ctx, hint, "pool "+pool.Spec().Name)
		}
	}
	adv, ok := g.advertised(want.Pool)
	if !ok {
		return kvrelay.Fail(ctx, reasonNotFound, "unknown pool (dc_id %d in this indexer domain)", want.Pool.DCID)
	}
	if adv != want {
		return kvrelay.Fail(ctx, reasonProducer, "requested producer is no longer active (the catalog advertises incarnation %d layout %d); refresh the catalog",
			adv.ProducerIncarnation, adv.LayoutGeneration)
	}
	pool, ok := g.findPool(want.Pool)
	if !ok {
		return kvrelay.Fail(ctx, reasonUnavailable, "pool with dc_id %d stopped publishing; reconnect", want.Pool.DCID)
	}
	cache, release := g.deltaCache(pool.Hub())
	defer release()
	ps := &poolStream{g: g, pool: pool, want: want, stream: stream, ctx: ctx, cache: cache}
	return ps.run()
}

// poolStream is one SubscribeKvPool stream.
type poolStream struct {
	g      *Server
	pool   server.KvPool
	want   ckf.ProducerIdentity
	stream grpc.ServerStreamingServer[kvrelaypb.FilterUpdate]
	ctx    context.Context
	sub    *hub.Subscription
	cache  *deltaCache // the hub's deltas, encoded once for all its streams
	last   uint64      // the sequence of the last snapshot or delta sent
	buf    []byte      // a snapshot chunk's CBI1 payload, reused up to retainedBufferBytes: Send has marshalled it when it returns
}

// Per-subscriber memory of a filter stream (docs/limits.md, "Memory").
const (
	// snapshotChunkBuckets is how many buckets one snapshot chunk carries
	// (30 KiB of words, well under cbi1.MaxChunkBuckets): a chunk's
	// FilterUpdate, with its CBI1 header and envelope, fits grpc-go's 32 KiB
	// buffer class, so a subscriber — reading or not — holds at most about
	// one chunk of its snapshot, never the table. Consumers assemble any
	// contiguous split (docs/wire.md §8.2).
	snapshotChunkBuckets = 3840
	// retainedBufferBytes is the largest encoding buffer a stream keeps
	// between messages; a larger one (a big delta) is dropped after its send.
	retainedBufferBytes = 64 << 10
)

func (ps *poolStream) run() error {
	defer func() {
		if ps.sub != nil {
			ps.sub.Cancel()
		}
	}()
	if err := ps.subscribe(); err != nil {
		return err
	}
	if err := ps.snapshot(); err != nil {
		return err
	}
	every := time.Duration(ps.g.cfg.HeartbeatInterval)
	hb := time.NewTimer(every)
	defer hb.Stop()
	for {
		wake := ps.sub.Wait()
		d, ok, err := ps.sub.Poll()
		switch {
		case ok:
			if err := ps.delta(d); err != nil {
				return err
			}
			hb.Reset(every)
			continue
		case err != nil:
			return ps.end(err)
		}
		select {
		case <-wake:
		case <-hb.C:
			// A deposed leader whose loop has not retired the pool yet
			// must not say by a heartbeat that its state is live.
			if hint, standby := ps.pool.Leader(); standby {
				return notLeader(ps.ctx, hint, "pool "+ps.pool.Spec().Name)
			}
			if err := ps.send(kvrelaypb.FilterUpdateKind_FILTER_UPDATE_KIND_HEARTBEAT, ps.last, ps.last, nil); err != nil {
				return err
			}
			hb.Reset(every)
		case <-ps.ctx.Done():
			return ps.ctx.Err()
		}
	}
}

// subscribe takes a hub subscription under a consumer instance of its own
// and checks that it serves the expected producer.
func (ps *poolStream) subscribe() error {
	if ps.sub != nil {
		ps.sub.Cancel()
		ps.sub = nil
	}
	lease := ckf.LaneLease{ConsumerInstance: consumerBase + ps.g.consumers.Add(1), AssignmentEpoch: 1}
	client := "" // charged to its address's max_subscribers_per_client share, as an HTTP stream is
	if p, ok := peer.FromContext(ps.ctx); ok && p.Addr != nil {
		client = connlimit.Client(p.Addr.String())
	}
	sub, err := ps.pool.Hub().SubscribeFrom(lease, client)
	switch {
	case errors.Is(err, hub.ErrTooManySubscribers):
		return kvrelay.Fail(ps.ctx, reasonLimit, "pool %q: subscriber limit reached (max_subscribers, shared with HTTP streams)", ps.pool.Spec().Name)
	case err != nil:
		return ps.end(err)
	}
	ps.sub = sub
	if got := sub.Snapshot().Identity; got != ps.want {
		return kvrelay.Fail(ps.ctx, reasonProducer, "pool %q now publishes incarnation %d layout %d; refresh the catalog",
			ps.pool.Spec().Name, got.ProducerIncarnation, got.LayoutGeneration)
	}
	return nil
}

// snapshot sends the subscription's snapshot as CBI1 chunks of at most
// snapshotChunkBuckets buckets, copying one chunk at a time out of the hub's
// shared generation.
func (ps *poolStream) snapshot() error {
	snap := ps.sub.Snapshot()
	f := snap.Identity.Format
	total := int(f.BucketCount)
	count := (total + snapshotChunkBuckets - 1) / snapshotChunkBuckets
	words := make([]uint64, min(total, snapshotChunkBuckets))
	for i := range count {
		off := i * snapshotChunkBuckets
		n, err := ps.sub.ReadSnapshot(off, words[:min(total-off, snapshotChunkBuckets)])
		if err != nil {
			return ps.end(err)
		}
		frame := cbi1.Frame{Header: cbi1.Header{Kind: cbi1.KindSnapshotChunk, Format: f, DCID: snap.Identity.Pool.DCID, Epoch: snap.Sequence},
			ChunkIndex: uint32(i), ChunkCount: uint32(count), BucketOffset: uint64(off), Words: words[:n]}
		if ps.buf, err = cbi1.AppendFrame(ps.buf[:0], &frame); err != nil {
			return kvrelay.Fail(ps.ctx, reasonInternal, "encode snapshot chunk: %v", err)
		}
		if err := ps.send(kvrelaypb.FilterUpdateKind_FILTER_UPDATE_KIND_SNAPSHOT_CHUNK, snap.Sequence, snap.Sequence, ps.buf); err != nil {
			return err
		}
	}
	ps.last = snap.Sequence
	return nil
}

// delta sends one delta. A publication with more images than a CBI1 delta
// holds ends the stream PUBLICATION_UNAVAILABLE, as Dynamo's hub does
// (publication/hub.rs run_hub_loop → recover_snapshot @2f5ba727): the hub's
// snapshot is already past it, every current gRPC subscriber sees the same
// publication and is closed, and each reconnects to a new snapshot. Sending
// a second snapshot on the same stream is no rule of the contract.
func (ps *poolStream) delta(d ckf.Delta) error {
	if len(d.Images) > ps.g.maxDeltaImages {
		ps.g.log.Info("grpc: publication exceeds a CBI1 delta; closing the stream for a new snapshot", "pool", ps.pool.Spec().Name,
			"images", len(d.Images), "sequence", d.Sequence)
		return kvrelay.Fail(ps.ctx, reasonUnavailable, "pool %q: publication of %d images at sequence %d exceeds a CBI1 delta (%d); publication subscription requires a fresh snapshot",
			ps.pool.Spec().Name, len(d.Images), d.Sequence, ps.g.maxDeltaImages)
	}
	msg, err := ps.prepare(&d)
	if err != nil {
		return kvrelay.Fail(ps.ctx, reasonInternal, "encode delta: %v", err)
	}
	if err := ps.stream.SendMsg(msg); err != nil {
		return err
	}
	ps.last = d.Sequence
	return nil
}

func (ps *poolStream) send(kind kvrelaypb.FilterUpdateKind, base, seq uint64, payload []byte) error {
	u := &kvrelaypb.FilterUpdate{Producer: producerToWire(ps.want), BaseSequence: base, Sequence: seq,
		SendTsUs: uint64(time.Now().UnixMicro()), Kind: kind, Payload: payload}
	kvrelay.StampResponse(u, ps.g.id)
	err := ps.stream.Send(u)
	if cap(ps.buf) > retainedBufferBytes {
		ps.buf = nil
	}
	return err
}

// end maps why the hub subscription ended (or was refused) to the
// contract's reason.
func (ps *poolStream) end(cause error) error {
	name := ps.pool.Spec().Name
	switch {
	case errors.Is(cause, hub.ErrLagged):
		return kvrelay.Fail(ps.ctx, reasonLagged, "pool %q: subscriber fell behind the relay's delta log; resubscribe for a snapshot", name)
	case errors.Is(cause, server.ErrPoolFenced):
		return kvrelay.Fail(ps.ctx, reasonFenced, "pool %q: producer fenced", name)
	case errors.Is(cause, hub.ErrProducerChanged), errors.Is(cause, hub.ErrBrokenStream), errors.Is(cause, hub.ErrNotReady),
		errors.Is(cause, hub.ErrClosed), errors.Is(cause, server.ErrPoolShuttingDown):
		return kvrelay.Fail(ps.ctx, reasonUnavailable, "pool %q: publication restarting or stopped (%v); reconnect", name, cause)
	case errors.Is(cause, context.Canceled) && ps.ctx.Err() != nil:
		return ps.ctx.Err()
	}
	return kvrelay.Fail(ps.ctx, reasonInternal, "pool %q: %v", name, cause)
}
