package client

import (
	"context"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/wire/cbi1"
	"github.com/ckfrelay/ckfrelay/wire/kvrelay"
	"github.com/ckfrelay/ckfrelay/wire/kvrelay/kvrelaypb"
)

// fakeKV is a scripted KvEventRelay server on loopback: the test sets the
// catalog and receives every SubscribeKvPool call, then sends its updates
// and ends it through the handler's own goroutine.
type fakeKV struct {
	kvrelaypb.UnimplementedKvEventRelayServer
	relay *kvrelaypb.RelayIdentity
	subs  chan *fakeSub

	mu      sync.Mutex
	cat     *kvrelaypb.KvPoolCatalogUpdate
	changed chan struct{}
	tokens  []string // authorization metadata seen
	types   []string // SubscribeKvPool calls' content-type
}

type fakeSub struct {
	req  *kvrelaypb.SubscribeKvPoolRequest
	send chan *kvrelaypb.FilterUpdate
	sent chan error
	end  chan kvrelaypb.RelayErrorReason
	done <-chan struct{}
}

func startFakeKV(t *testing.T) (*fakeKV, string) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	return startFakeKVOn(t, lis)
}

// startFakeKVOn is startFakeKV serving lis.
func startFakeKVOn(t *testing.T, lis net.Listener) (*fakeKV, string) {
	t.Helper()
	f := &fakeKV{relay: &kvrelaypb.RelayIdentity{DrtInstanceId: 1, RelayIncarnation: 2}, subs: make(chan *fakeSub, 16), changed: make(chan struct{})}
	srv := grpc.NewServer(grpc.MaxSendMsgSize(kvrelay.MaxMessageBytes))
	kvrelaypb.RegisterKvEventRelayServer(srv, f)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return f, lis.Addr().String()
}

// setCatalog publishes a complete catalog snapshot of pools.
func (f *fakeKV) setCatalog(rev uint64, pools ...*kvrelaypb.KvPoolDescriptor) {
	m := &kvrelaypb.KvPoolCatalogUpdate{Revision: rev, Snapshot: &kvrelaypb.KvPoolCatalogSnapshot{Pools: pools}}
	kvrelay.StampResponse(m, f.relay)
	f.mu.Lock()
	f.cat = m
	close(f.changed)
	f.changed = make(chan struct{})
	f.mu.Unlock()
}

func (f *fakeKV) WatchKvPoolCatalog(req *kvrelaypb.WatchKvPoolCatalogRequest, stream grpc.ServerStreamingServer[kvrelaypb.KvPoolCatalogUpdate]) error {
	if err := kvrelay.CheckRequest(req); err != nil {
		return kvrelay.Fail(stream.Context(), kvrelaypb.RelayErrorReason_RELAY_ERROR_REASON_CONTRACT_MISMATCH, "%v", err)
	}
	var last *kvrelaypb.KvPoolCatalogUpdate
	for {
		f.mu.Lock()
		cat, ch := f.cat, f.changed
		f.mu.Unlock()
		if cat != nil && cat != last {
			if err := stream.Send(cat); err != nil {
				return err
			}
			last = cat
		}
		select {
		case <-ch:
		case <-stream.Context().Done():
			return nil
		}
	}
}

func (f *fakeKV) SubscribeKvPool(req *kvrelaypb.SubscribeKvPoolRequest, stream grpc.ServerStreamingServer[kvrelaypb.FilterUpdate]) error {
	md, _ := metadata.FromIncomingContext(stream.Context())
	f.mu.Lock()
	f.tokens = append(f.tokens, md.Get("authorization")...)
	f.types = append(f.types, md.Get("content-type")...)
	f.mu.Unlock()
	s := &fakeSub{req: req, send: make(chan *kvrelaypb.FilterUpdate), sent: make(chan error), end: make(chan kvrelaypb.RelayErrorReason), done: stream.Context().Done()}
	f.subs <- s
	for {
		select {
		case m := <-s.send:
			s.sent <- stream.Send(m)
		case r := <-s.end:
			if r == kvrelaypb.RelayErrorReason_RELAY_ERROR_REASON_UNSPECIFIED {
				return nil // a clean end of stream
			}
			return kvrelay.Fail(stream.Context(), r, "scripted")
		case <-stream.Context().Done():
			return nil
		}
	}
}

// next waits for the next subscription.
func (f *fakeKV) next(t *testing.T) *fakeSub {
	t.Helper()
	select {
	case s := <-f.subs:
		return s
	case <-time.After(10 * time.Second):
		require.FailNow(t, "no SubscribeKvPool call")
		return nil
	}
}

// none asserts no subscription arrives within d.
func (f *fakeKV) none(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case s := <-f.subs:
		require.FailNow(t, "unexpected SubscribeKvPool", "for %v", s.req.GetExpectedProducer())
	case <-time.After(d):
	}
}

func (s *fakeSub) put(t *testing.T, m *kvrelaypb.FilterUpdate) {
	t.Helper()
	select {
	case s.send <- m:
		require.NoError(t, <-s.sent)
	case <-s.done:
		require.FailNow(t, "stream ended before the send")
	}
}

func (s *fakeSub) fail(t *testing.T, r kvrelaypb.RelayErrorReason) {
	t.Helper()
	select {
	case s.end <- r:
	case <-s.done:
	}
}

func descriptor(id ckf.ProducerIdentity) *kvrelaypb.KvPoolDescriptor {
	return &kvrelaypb.KvPoolDescriptor{Producer: kvrelay.ProducerToWire(id),
		ServingEndpoint: &kvrelaypb.DynamoEndpointId{Namespace: "dynamo", Component: "backend", Endpoint: "generate"},
		QuerySemantics:  &kvrelaypb.KvQuerySemantics{KvBlockSize: 16, HashFormat: kvrelaypb.KvQueryHashFormat_KV_QUERY_HASH_FORMAT_DYNAMO_STANDARD_V1},
		PoolRoles:       []kvrelaypb.WorkerRole{kvrelaypb.WorkerRole_WORKER_ROLE_LEGACY}}
}

func (f *fakeKV) update(id ckf.ProducerIdentity, kind kvrelaypb.FilterUpdateKind, base, seq uint64, payload []byte) *kvrelaypb.FilterUpdate {
	m := &kvrelaypb.FilterUpdate{Producer: kvrelay.ProducerToWire(id), Kind: kind, BaseSequence: base, Sequence: seq, Payload: payload,
		SendTsUs: uint64(time.Now().UnixMicro())}
	kvrelay.StampResponse(m, f.relay)
	return m
}

// sendSnapshot sends words at seq as CBI1 chunks of per buckets each (the
// decoder accepts offsets that are not multiples of 512 Ki).
func (f *fakeKV) sendSnapshot(t *testing.T, s *fakeSub, id ckf.ProducerIdentity, seq uint64, words []uint64, per int) {
	t.Helper()
	n := (len(words) + per - 1) / per
	for i := range n {
		fr := cbi1.Frame{Header: cbi1.Header{Kind: cbi1.KindSnapshotChunk, Format: id.Format, DCID: id.Pool.DCID, Epoch: seq},
			ChunkIndex: uint32(i), ChunkCount: uint32(n), BucketOffset: uint64(i * per), Words: words[i*per : min(len(words), (i+1)*per)]}
		b, err := cbi1.AppendFrame(nil, &fr)
		require.NoError(t, err)
		s.put(t, f.update(id, kvrelaypb.FilterUpdateKind_FILTER_UPDATE_KIND_SNAPSHOT_CHUNK, seq, seq, b))
	}
}

// sendDelta applies random images to words and sends them base → base+1.
func (f *fakeKV) sendDelta(t *testing.T, s *fakeSub, id ckf.ProducerIdentity, base uint64, words []uint64, rng *rand.Rand) {
	t.Helper()
	images := make([]ckf.BucketImage, 1+rng.IntN(5))
	for i := range images {
		images[i] = ckf.BucketImage{Bucket: uint32(rng.IntN(len(words))), Word: rng.Uint64()}
		words[images[i].Bucket] = images[i].Word
	}
	b, err := cbi1.EncodeDelta(id.Format, id.Pool.DCID, base, base+1, images)
	require.NoError(t, err)
	s.put(t, f.update(id, kvrelaypb.FilterUpdateKind_FILTER_UPDATE_KIND_DELTA, base, base+1, b))
}

func randomWords(rng *rand.Rand, n uint64) []uint64 {
	w := make([]uint64, n)
	for i := range w {
		w[i] = rng.Uint64()
	}
	return w
}

func startGRPCRouter(t *testing.T, addr string, mutate func(*Config)) (*Router, *Native) {
	t.Helper()
	return startGRPCRouterWith(t, addr, mutate, nil)
}

// startGRPCRouterWith is startGRPCRouter with before applied to the router
// before it runs (to set test hooks without racing Run).
func startGRPCRouterWith(t *testing.T, addr string, mutate func(*Config), before func(*Router)) (*Router, *Native) {
	t.Helper()
	n := newNative(t)
	cfg := Config{GRPC: &GRPCConfig{}, Relays: []Relay{{Addrs: []string{addr}}}, ConsumerInstance: testConsumer,
		Targets:    []Target{{Pool: "p", Lane: 0, DCID: testPool.DCID}},
		MinBackoff: 5 * time.Millisecond, MaxBackoff: 20 * time.Millisecond}
	if mutate != nil {
		mutate(&cfg)
	}
	r, err := New(cfg, n)
	require.NoError(t, err)
	if before != nil {
		before(r)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return r, n
}

// laneWords returns lane 0's words and sequence, or nil when it is not
// ready.
func laneWords(t *testing.T, r *Router) ([]uint64, uint64) {
	t.Helper()
	if !r.Lane(0).Ready {
		return nil, 0
	}
	w, seq, err := r.AppendLaneWords(nil, 0)
	require.NoError(t, err)
	return w, seq
}

// TestGRPC_FollowsCatalogKey: the lane subscribes under the catalog's exact
// key, installs a snapshot assembled from CBI1 chunks, applies deltas and
// heartbeats, and equals the relay's table at every step.
func TestGRPC_FollowsCatalogKey(t *testing.T) {
	f, addr := startFakeKV(t)
	f.setCatalog(1, descriptor(testID))
	r, _ := startGRPCRouter(t, addr, func(c *Config) { c.AuthToken = "s3cret" })
	s := f.next(t)
	require.NoError(t, kvrelay.CheckRequest(s.req))
	assert.True(t, proto.Equal(kvrelay.ProducerToWire(testID), s.req.GetExpectedProducer()), "expected_producer is the catalog's key")
	assert.Equal(t, "ckfrelay-router-7", s.req.GetSubscriberId())

	rng := rand.New(rand.NewPCG(1, 2))
	words := randomWords(rng, testFormat.BucketCount)
	f.sendSnapshot(t, s, testID, 5, words, 16)
	require.Eventually(t, func() bool { w, seq := laneWords(t, r); return seq == 5 && assert.ObjectsAreEqual(words, w) }, 5*time.Second, time.Millisecond, "%+v", r.Lane(0))
	for seq := uint64(5); seq < 25; seq++ {
		f.sendDelta(t, s, testID, seq, words, rng)
		s.put(t, f.update(testID, kvrelaypb.FilterUpdateKind_FILTER_UPDATE_KIND_HEARTBEAT, seq+1, seq+1, nil))
	}
	require.Eventually(t, func() bool { w, seq := laneWords(t, r); return seq == 25 && assert.ObjectsAreEqual(words, w) }, 5*time.Second, time.Millisecond, "%+v", r.Lane(0))
	// CBI1 allows an empty delta and repeated buckets (the last image wins);
	// both must apply as such, not deactivate the lane.
	empty, err := cbi1.EncodeDelta(testFormat, testPool.DCID, 25, 26, nil)
	require.NoError(t, err)
	s.put(t, f.update(testID, kvrelaypb.FilterUpdateKind_FILTER_UPDATE_KIND_DELTA, 25, 26, empty))
	dup := []ckf.BucketImage{{Bucket: 0, Word: 1}, {Bucket: 3, Word: 2}, {Bucket: 0, Word: 3}, {Bucket: 3, Word: 4}, {Bucket: 0, Word: 5}}
	words[0], words[3] = 5, 4
	b, err := cbi1.EncodeDelta(testFormat, testPool.DCID, 26, 27, dup)
	require.NoError(t, err)
	s.put(t, f.update(testID, kvrelaypb.FilterUpdateKind_FILTER_UPDATE_KIND_DELTA, 26, 27, b))
	require.Eventually(t, func() bool { w, seq := laneWords(t, r); return seq == 27 && assert.ObjectsAreEqual(words, w) }, 5*time.Second, time.Millisecond, "%+v", r.Lane(0))
	li := r.Lane(0)
	assert.True(t, li.Ready)
	assert.Zero(t, li.Resubscribes)
	f.mu.Lock()
	assert.Equal(t, []string{"Bearer s3cret"}, f.tokens)
	assert.Equal(t, []string{"application/grpc"}, f.types, "the router's own codec changes nothing on the wire")
	f.mu.Unlock()
}

// TestGRPC_GapResubscribesFromAFreshSnapshot: a delta that skips a sequence
// deactivates the lane (the consumer's gap check on the translated frame);
// the router opens a new stream and converges on its snapshot.
func TestGRPC_GapResubscribesFromAFreshSnapshot(t *testing.T) {
	f, addr := startFakeKV(t)
	f.setCatalog(1, descriptor(testID))
	r, _ := startGRPCRouter(t, addr, nil)
	s := f.next(t)
	rng := rand.New(rand.NewPCG(3, 4))
	words := randomWords(rng, testFormat.BucketCount)
	f.sendSnapshot(t, s, testID, 1, words, 64)
	require.Eventually(t, func() bool { return r.Lane(0).Ready }, 5*time.Second, time.Millisecond)
	f.sendDelta(t, s, testID, 2, words, rng) // 2 → 3 on a lane at 1: a gap
	s2 := f.next(t)
	assert.Contains(t, r.Lane(0).LastError, ErrDeactivated.Error())
	f.sendSnapshot(t, s2, testID, 3, words, 32)
	require.Eventually(t, func() bool { w, seq := laneWords(t, r); return seq == 3 && assert.ObjectsAreEqual(words, w) }, 5*time.Second, time.Millisecond)
	assert.Equal(t, uint64(1), r.Lane(0).Resubscribes)
}

// TestGRPC_HeartbeatOfAnotherSequenceEndsTheStream: a heartbeat whose
// sequence is not the installed one means a lost delta; the stream ends
// with Dynamo's reason (global_view_consumer/stream.rs) and a fresh
// subscription follows.
func TestGRPC_HeartbeatOfAnotherSequenceEndsTheStream(t *testing.T) {
	f, addr := startFakeKV(t)
	f.setCatalog(1, descriptor(testID))
	r, _ := startGRPCRouter(t, addr, nil)
	s := f.next(t)
	words := randomWords(rand.New(rand.NewPCG(5, 6)), testFormat.BucketCount)
	f.sendSnapshot(t, s, testID, 4, words, 64)
	require.Eventually(t, func() bool { return r.Lane(0).Ready }, 5*time.Second, time.Millisecond)
	s.put(t, f.update(testID, kvrelaypb.FilterUpdateKind_FILTER_UPDATE_KIND_HEARTBEAT, 5, 5, nil))
	f.next(t)
	assert.Contains(t, r.Lane(0).LastError, ErrInvalidPublication.Error())
	assert.Contains(t, r.Lane(0).LastError, "CKF heartbeat has unexpected payload or sequence")
}

// TestGRPC_DynamoConsumerChecks (issue #32 item 4): the checks Dynamo's
// consumer makes of every update (global_view_consumer/stream.rs
// process_update), each ending the stream with Dynamo's reason and a fresh
// subscription that converges.
func TestGRPC_DynamoConsumerChecks(t *testing.T) {
	chunk := func(f *fakeKV, seq uint64, index, count uint32, words []uint64) []byte {
		fr := cbi1.Frame{Header: cbi1.Header{Kind: cbi1.KindSnapshotChunk, Format: testFormat, DCID: testPool.DCID, Epoch: seq},
			ChunkIndex: index, ChunkCount: count, BucketOffset: uint64(index) * uint64(len(words)), Words: words}
		b, err := cbi1.AppendFrame(nil, &fr)
		require.NoError(t, err)
		return b
	}
	const (
		kChunk = kvrelaypb.FilterUpdateKind_FILTER_UPDATE_KIND_SNAPSHOT_CHUNK
		kBeat  = kvrelaypb.FilterUpdateKind_FILTER_UPDATE_KIND_HEARTBEAT
	)
	for _, tt := range []struct {
		name      string
		installed bool // send the whole snapshot at 4 first
		bad       func(f *fakeKV, words []uint64) []*kvrelaypb.FilterUpdate
		reason    string
	}{
		{"relay identity changes within the stream", true, func(f *fakeKV, _ []uint64) []*kvrelaypb.FilterUpdate {
			m := f.update(testID, kBeat, 4, 4, nil)
			m.Relay = &kvrelaypb.RelayIdentity{DrtInstanceId: f.relay.GetDrtInstanceId(), RelayIncarnation: f.relay.GetRelayIncarnation() + 1}
			return []*kvrelaypb.FilterUpdate{m}
		}, "relay incarnation changed within a CKF stream"},
		{"chunk base_sequence is not its sequence", false, func(f *fakeKV, words []uint64) []*kvrelaypb.FilterUpdate {
			return []*kvrelaypb.FilterUpdate{f.update(testID, kChunk, 3, 4, chunk(f, 4, 0, 1, words))}
		}, "snapshot chunk has mismatched base sequence"},
		{"heartbeat base_sequence is not its sequence", true, func(f *fakeKV, _ []uint64) []*kvrelaypb.FilterUpdate {
			return []*kvrelaypb.FilterUpdate{f.update(testID, kBeat, 3, 4, nil)}
		}, "CKF heartbeat has unexpected payload or sequence"},
		{"heartbeat before the snapshot completes", false, func(f *fakeKV, words []uint64) []*kvrelaypb.FilterUpdate {
			return []*kvrelaypb.FilterUpdate{f.update(testID, kChunk, 4, 4, chunk(f, 4, 0, 2, words[:32])), f.update(testID, kBeat, 4, 4, nil)}
		}, "CKF heartbeat has unexpected payload or sequence"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f, addr := startFakeKV(t)
			f.setCatalog(1, descriptor(testID))
			r, _ := startGRPCRouter(t, addr, func(c *Config) { c.IdleTimeout = -1 })
			s := f.next(t)
			words := randomWords(rand.New(rand.NewPCG(13, 14)), testFormat.BucketCount)
			if tt.installed {
				f.sendSnapshot(t, s, testID, 4, words, 64)
				require.Eventually(t, func() bool { return r.Lane(0).Ready }, 5*time.Second, time.Millisecond)
			}
			for _, m := range tt.bad(f, words) {
				s.tryPut(m)
			}
			s2 := f.next(t)
			li := r.Lane(0)
			assert.Contains(t, li.LastError, ErrInvalidPublication.Error())
			assert.Contains(t, li.LastError, tt.reason)
			assert.False(t, li.Ready)
			f.sendSnapshot(t, s2, testID, 9, words, 32)
			require.Eventually(t, func() bool { w, seq := laneWords(t, r); return seq == 9 && assert.ObjectsAreEqual(words, w) }, 5*time.Second, time.Millisecond)
		})
	}
}

// TestGRPC_InvalidPublicationClosesTheReplica: every contract violation in
// an update ends the session (the lane retires, nothing is applied, no
// frame is skipped) and the router reopens from a snapshot.
func TestGRPC_InvalidPublicationClosesTheReplica(t *testing.T) {
	f, addr := startFakeKV(t)
	f.setCatalog(1, descriptor(testID))
	r, _ := startGRPCRouter(t, addr, nil)
	rng := rand.New(rand.NewPCG(7, 8))
	words := randomWords(rng, testFormat.BucketCount)
	other := testID
	other.ProducerIncarnation++
	wrongDC := testID.Format
	good, err := cbi1.EncodeDelta(testID.Format, testPool.DCID, 1, 2, []ckf.BucketImage{{Bucket: 1, Word: 9}})
	require.NoError(t, err)
	corrupt := append([]byte(nil), good...)
	corrupt[len(corrupt)-1] ^= 1
	otherDC, err := cbi1.EncodeDelta(wrongDC, testPool.DCID+1, 1, 2, []ckf.BucketImage{{Bucket: 1, Word: 9}})
	require.NoError(t, err)
	otherFormat, err := cbi1.EncodeDelta(ckf.NewFormat(1, 64), testPool.DCID, 1, 2, []ckf.BucketImage{{Bucket: 1, Word: 9}})
	require.NoError(t, err)
	badMarker := f.update(testID, kvrelaypb.FilterUpdateKind_FILTER_UPDATE_KIND_DELTA, 1, 2, good)
	badMarker.ContractMarker++
	badVersion := f.update(testID, kvrelaypb.FilterUpdateKind_FILTER_UPDATE_KIND_DELTA, 1, 2, good)
	badVersion.ProtocolVersion = 2
	cases := map[string]*kvrelaypb.FilterUpdate{
		"unknown kind":       f.update(testID, 4, 1, 2, good),
		"unspecified kind":   f.update(testID, 0, 1, 2, good),
		"corrupt payload":    f.update(testID, kvrelaypb.FilterUpdateKind_FILTER_UPDATE_KIND_DELTA, 1, 2, corrupt),
		"another producer":   f.update(other, kvrelaypb.FilterUpdateKind_FILTER_UPDATE_KIND_DELTA, 1, 2, good),
		"another dc_id":      f.update(testID, kvrelaypb.FilterUpdateKind_FILTER_UPDATE_KIND_DELTA, 1, 2, otherDC),
		"another format":     f.update(testID, kvrelaypb.FilterUpdateKind_FILTER_UPDATE_KIND_DELTA, 1, 2, otherFormat),
		"sequence disagrees": f.update(testID, kvrelaypb.FilterUpdateKind_FILTER_UPDATE_KIND_DELTA, 1, 3, good),
		"base disagrees":     f.update(testID, kvrelaypb.FilterUpdateKind_FILTER_UPDATE_KIND_DELTA, 0, 2, good),
		"delta as a chunk":   f.update(testID, kvrelaypb.FilterUpdateKind_FILTER_UPDATE_KIND_SNAPSHOT_CHUNK, 1, 2, good),
		"heartbeat payload":  f.update(testID, kvrelaypb.FilterUpdateKind_FILTER_UPDATE_KIND_HEARTBEAT, 0, 1, good),
		"wrong marker":       badMarker,
		"wrong protocol":     badVersion,
	}
	for name, m := range cases {
		s := f.next(t)
		f.sendSnapshot(t, s, testID, 1, words, 64)
		require.Eventually(t, func() bool { return r.Lane(0).Ready }, 5*time.Second, time.Millisecond, name)
		resub := r.Lane(0).Resubscribes
		s.put(t, m)
		require.Eventually(t, func() bool { return r.Lane(0).Resubscribes > resub }, 5*time.Second, time.Millisecond, name)
		assert.False(t, r.Lane(0).Ready, "%s: the lane retired", name)
		assert.Contains(t, r.Lane(0).LastError, ErrInvalidPublication.Error(), name)
	}
}

// TestGRPC_ReasonsDecideTheRetry: SUBSCRIBER_LAGGED and a clean end of
// stream reopen the same key; PRODUCER_CHANGED blocks it until the catalog
// advertises another key, which the lane then follows.
func TestGRPC_ReasonsDecideTheRetry(t *testing.T) {
	f, addr := startFakeKV(t)
	f.setCatalog(1, descriptor(testID))
	r, _ := startGRPCRouter(t, addr, nil)
	s := f.next(t)
	s.fail(t, kvrelaypb.RelayErrorReason_RELAY_ERROR_REASON_SUBSCRIBER_LAGGED)
	s = f.next(t)
	assert.True(t, proto.Equal(kvrelay.ProducerToWire(testID), s.req.GetExpectedProducer()))
	assert.Contains(t, r.Lane(0).LastError, "RELAY_ERROR_REASON_SUBSCRIBER_LAGGED")
	s.fail(t, kvrelaypb.RelayErrorReason_RELAY_ERROR_REASON_UNSPECIFIED)
	s = f.next(t)
	assert.Contains(t, r.Lane(0).LastError, ErrStreamClosed.Error())

	s.fail(t, kvrelaypb.RelayErrorReason_RELAY_ERROR_REASON_PRODUCER_CHANGED)
	f.none(t, 300*time.Millisecond) // 15+ backoff ceilings
	assert.Contains(t, r.Lane(0).LastError, ErrKeyBlocked.Error())
	next := testID
	next.ProducerIncarnation = 2
	f.setCatalog(2, descriptor(next))
	s = f.next(t)
	assert.True(t, proto.Equal(kvrelay.ProducerToWire(next), s.req.GetExpectedProducer()))
}

// TestGRPC_WithdrawnKeyEndsTheSession: a catalog without the followed key
// ends the session and retires the lane.
func TestGRPC_WithdrawnKeyEndsTheSession(t *testing.T) {
	f, addr := startFakeKV(t)
	f.setCatalog(1, descriptor(testID))
	// The error a session ended with, read at its backoff: LastError alone
	// may already hold the next attempt's ("pool not in the catalog").
	ended := make(chan string, 64)
	r, _ := startGRPCRouterWith(t, addr, nil, func(r *Router) {
		r.onBackoff = func(lane int, _ time.Duration) {
			select {
			case ended <- r.Lane(lane).LastError:
			default:
			}
		}
	})
	s := f.next(t)
	f.sendSnapshot(t, s, testID, 1, make([]uint64, 64), 64)
	require.Eventually(t, func() bool { return r.Lane(0).Ready }, 5*time.Second, time.Millisecond)
	for len(ended) > 0 { // sessions that ended before this one
		<-ended
	}
	f.setCatalog(2)
	require.Eventually(t, func() bool { return !r.Lane(0).Ready }, 5*time.Second, time.Millisecond)
	select {
	case why := <-ended:
		assert.Contains(t, why, ErrWithdrawn.Error(), "the session ends because its key was withdrawn")
	case <-time.After(5 * time.Second):
		require.FailNow(t, "the withdrawn session never ended")
	}
	<-s.done
	f.none(t, 100*time.Millisecond)
}

// TestGRPC_QuarantinesUnknownValues: an entry with a value this version does
// not know is not followed; a later valid entry is.
func TestGRPC_QuarantinesUnknownValues(t *testing.T) {
	for name, mutate := range map[string]func(d *kvrelaypb.KvPoolDescriptor){
		"hash format":      func(d *kvrelaypb.KvPoolDescriptor) { d.QuerySemantics.HashFormat = 3 },
		"unspecified hash": func(d *kvrelaypb.KvPoolDescriptor) { d.QuerySemantics.HashFormat = 0 },
		"block size 0":     func(d *kvrelaypb.KvPoolDescriptor) { d.QuerySemantics.KvBlockSize = 0 },
		"worker role":      func(d *kvrelaypb.KvPoolDescriptor) { d.PoolRoles = append(d.PoolRoles, 6) },
		"no roles":         func(d *kvrelaypb.KvPoolDescriptor) { d.PoolRoles = nil },
		"identity source":  func(d *kvrelaypb.KvPoolDescriptor) { d.Producer.PoolId.IndexerDomain.RoutingScope.Source = 3 },
		"identity version": func(d *kvrelaypb.KvPoolDescriptor) { d.Producer.PoolId.IdentityVersion = 2 },
		"ckf format":       func(d *kvrelaypb.KvPoolDescriptor) { d.Producer.CkfFormat.FormatVersion = 2 },
		"layout gen 0":     func(d *kvrelaypb.KvPoolDescriptor) { d.Producer.LayoutGeneration = 0 },
		"model target unset": func(d *kvrelaypb.KvPoolDescriptor) {
			d.Registrations = []*kvrelaypb.ModelRegistration{{CanonicalModelId: "m"}}
		},
		// Malformed in Dynamo's validate_pool_descriptor (wire/identity.rs).
		"role twice": func(d *kvrelaypb.KvPoolDescriptor) {
			d.PoolRoles = []kvrelaypb.WorkerRole{kvrelaypb.WorkerRole_WORKER_ROLE_AGGREGATED, kvrelaypb.WorkerRole_WORKER_ROLE_AGGREGATED}
		},
		"alias twice": func(d *kvrelaypb.KvPoolDescriptor) {
			d.Registrations = []*kvrelaypb.ModelRegistration{baseReg("m", "a", "a")}
		},
		"empty alias": func(d *kvrelaypb.KvPoolDescriptor) {
			d.Registrations = []*kvrelaypb.ModelRegistration{baseReg("m", "")}
		},
		"empty model id":  func(d *kvrelaypb.KvPoolDescriptor) { d.Registrations = []*kvrelaypb.ModelRegistration{baseReg("")} },
		"padded model id": func(d *kvrelaypb.KvPoolDescriptor) { d.Registrations = []*kvrelaypb.ModelRegistration{baseReg(" m")} },
		"empty base model": func(d *kvrelaypb.KvPoolDescriptor) {
			d.Registrations = []*kvrelaypb.ModelRegistration{loraReg("m", "", "x")}
		},
		"empty adapter": func(d *kvrelaypb.KvPoolDescriptor) {
			d.Registrations = []*kvrelaypb.ModelRegistration{loraReg("m", "m", "")}
		},
		"no endpoint":     func(d *kvrelaypb.KvPoolDescriptor) { d.ServingEndpoint = nil },
		"empty namespace": func(d *kvrelaypb.KvPoolDescriptor) { d.ServingEndpoint.Namespace = "" },
		"empty component": func(d *kvrelaypb.KvPoolDescriptor) { d.ServingEndpoint.Component = "" },
		"padded endpoint": func(d *kvrelaypb.KvPoolDescriptor) { d.ServingEndpoint.Endpoint = "generate\n" },
	} {
		t.Run(name, func(t *testing.T) {
			f, addr := startFakeKV(t)
			d := descriptor(testID)
			mutate(d)
			f.setCatalog(1, d)
			r, _ := startGRPCRouter(t, addr, nil)
			f.none(t, 100*time.Millisecond)
			require.Eventually(t, func() bool { return r.Lane(0).LastError != "" }, 5*time.Second, time.Millisecond)
			assert.Contains(t, r.Lane(0).LastError, ErrQuarantined.Error())
			f.setCatalog(2, descriptor(testID))
			f.next(t)
		})
	}
}

// TestGRPC_AmbiguousOrInvalidCatalog: two entries with the target's dc_id
// are not followed; a duplicate producer key invalidates the whole
// snapshot.
func TestGRPC_AmbiguousOrInvalidCatalog(t *testing.T) {
	f, addr := startFakeKV(t)
	other := testID
	other.ProducerIncarnation = 9
	f.setCatalog(1, descriptor(testID), descriptor(other))
	r, _ := startGRPCRouter(t, addr, nil)
	f.none(t, 100*time.Millisecond)
	require.Eventually(t, func() bool { return r.Lane(0).LastError != "" }, 5*time.Second, time.Millisecond)
	assert.Contains(t, r.Lane(0).LastError, ErrAmbiguous.Error())

	_, err := parseCatalog(func() *kvrelaypb.KvPoolCatalogUpdate {
		m := &kvrelaypb.KvPoolCatalogUpdate{Snapshot: &kvrelaypb.KvPoolCatalogSnapshot{Pools: []*kvrelaypb.KvPoolDescriptor{descriptor(testID), descriptor(testID)}}}
		kvrelay.StampResponse(m, f.relay)
		return m
	}())
	require.ErrorContains(t, err, "twice")
	_, err = parseCatalog(&kvrelaypb.KvPoolCatalogUpdate{Snapshot: &kvrelaypb.KvPoolCatalogSnapshot{}})
	require.ErrorIs(t, err, kvrelay.ErrContractMismatch)
}

func TestNew_GRPCTargetsNeedDistinctDCs(t *testing.T) {
	x := []Relay{{Addrs: []string{"x"}}}
	_, err := New(Config{GRPC: &GRPCConfig{}, Relays: x, Targets: []Target{{Pool: "a", Lane: 0, DCID: 1}, {Pool: "b", Lane: 1, DCID: 1}}}, nil)
	require.Error(t, err)
	_, err = New(Config{GRPC: &GRPCConfig{}, NATS: &NATSConfig{}, Relays: x, Targets: []Target{{Pool: "a"}}}, nil)
	require.Error(t, err)
	_, err = New(Config{GRPC: &GRPCConfig{}, Targets: []Target{{Pool: "a"}}}, nil)
	require.Error(t, err, "gRPC needs a relay address")
	_, err = New(Config{GRPC: &GRPCConfig{SubscriberID: "a\nb"}, Relays: x, Targets: []Target{{Pool: "a"}}}, nil)
	require.ErrorIs(t, err, kvrelay.ErrInvalidSubscriberID)
}

// A relay listed as two replicas whose first refuses connections (a replica
// whose machine is gone): the catalog watch moves to the second, and the lane
// follows the pool there.
func TestGRPC_MovesToTheReplicaThatServes(t *testing.T) {
	gone, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	goneAddr := gone.Addr().String()
	require.NoError(t, gone.Close())
	f, addr := startFakeKV(t)
	f.setCatalog(1, descriptor(testID))
	r, _ := startGRPCRouter(t, addr, func(c *Config) { c.Relays = []Relay{{Addrs: []string{goneAddr, addr}}} })
	s := f.next(t)
	words := randomWords(rand.New(rand.NewPCG(3, 4)), testFormat.BucketCount)
	f.sendSnapshot(t, s, testID, 5, words, 16)
	require.Eventually(t, func() bool { w, seq := laneWords(t, r); return seq == 5 && assert.ObjectsAreEqual(words, w) }, 5*time.Second, time.Millisecond, "%+v", r.Lane(0))
}
