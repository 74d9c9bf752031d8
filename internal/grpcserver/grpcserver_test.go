package grpcserver

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/internal/server"
	"github.com/ckfrelay/ckfrelay/internal/testing/streamtable"
	"github.com/ckfrelay/ckfrelay/wire/cbi1"
	"github.com/ckfrelay/ckfrelay/wire/kvrelay"
	"github.com/ckfrelay/ckfrelay/wire/kvrelay/kvrelaypb"
)

// testRelay is an in-process relay with its HTTP API and its gRPC service
// on loopback sockets.
type testRelay struct {
	srv    *server.Server
	g      *Server
	http   string
	grpc   string
	client kvrelaypb.KvEventRelayClient
}

func testConfig() server.Config {
	return server.Config{
		HeartbeatInterval: server.Duration(20 * time.Millisecond),
		GRPC:              server.GRPCConfig{Listen: "127.0.0.1:0", LoadInterval: server.Duration(20 * time.Millisecond)},
		Pools: []server.PoolSpec{{Name: "dc-a", DCID: 1, ExpectedBlocks: 4096, PublishEveryNEvents: 1,
			KvRelay: server.KvPoolSpec{TotalKVBlocks: 10000, Models: []server.ModelSpec{
				{ID: "llama", Aliases: []string{"meta/llama"}}, {ID: "llama-sql", BaseModel: "llama", LoraAdapter: "sql"}}}}},
	}
}

func startRelay(t *testing.T, cfg server.Config, dial ...grpc.DialOption) *testRelay {
	t.Helper()
	log := slog.New(slog.DiscardHandler)
	srv, err := server.New(cfg, log)
	require.NoError(t, err)
	g, err := New(srv, log)
	require.NoError(t, err)
	ts := httptest.NewUnstartedServer(srv.Handler())
	if cfg.TLSCertFile != "" {
		ts.StartTLS()
	} else {
		ts.Start()
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	served := make(chan error, 1)
	go func() { served <- g.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		assert.NoError(t, srv.Shutdown(ctx))
		assert.NoError(t, g.Shutdown(ctx))
		assert.NoError(t, <-served)
		ts.Close()
	})
	if len(dial) == 0 {
		dial = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	dial = append(dial, grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(kvrelay.MaxMessageBytes)))
	conn, err := grpc.NewClient(ln.Addr().String(), dial...)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return &testRelay{srv: srv, g: g, http: ts.URL, grpc: ln.Addr().String(), client: kvrelaypb.NewKvEventRelayClient(conn)}
}

// storedJSON is a Stored event of n blocks rooted at seed for worker w.
func storedJSON(w, seed uint64, n int) string {
	var blocks []string
	for i := range n {
		blocks = append(blocks, fmt.Sprintf(`{"block_hash": %d, "tokens_hash": %d}`, seed*100000+uint64(i)+7, seed*100000+uint64(i)))
	}
	return fmt.Sprintf(`[{"worker_id": %d, "event": {"event_id": %d, "data": {"stored": {"parent_hash": null, "blocks": [%s]}}}}]`,
		w, seed, strings.Join(blocks, ","))
}

func (r *testRelay) post(t *testing.T, pool, body string) {
	t.Helper()
	resp, err := http.Post(r.http+"/v1/pools/"+pool+"/events?source_epoch=1", "application/json", strings.NewReader(body))
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusAccepted, resp.StatusCode, "%s", b)
}

// pool returns the hosted pool named name.
func (r *testRelay) pool(t *testing.T, name string) server.KvPool {
	for _, p := range r.srv.KvPools() {
		if p.Spec().Name == name {
			return p
		}
	}
	require.FailNow(t, "no such pool", "%q", name)
	return server.KvPool{}
}

func stamped[T kvrelay.Request](m T) T { kvrelay.StampRequest(m); return m }

func subscribeReq(id *kvrelaypb.ProducerIdentity) *kvrelaypb.SubscribeKvPoolRequest {
	return stamped(&kvrelaypb.SubscribeKvPoolRequest{SubscriberId: "test-router", ExpectedProducer: id})
}

// reason returns the code and the kv-relay-error-reason of a failed RPC.
func reason(err error, trailer metadata.MD) (codes.Code, kvrelaypb.RelayErrorReason) {
	return status.Code(err), kvrelay.TrailerReason(trailer)
}

// replica applies a SubscribeKvPool stream the way the contract's consumer
// does: snapshot chunks assembled and installed when complete, then
// contiguous deltas; heartbeats counted.
type replica struct {
	t          *testing.T
	want       *kvrelaypb.ProducerIdentity
	asm        cbi1.Assembler
	words      []uint64
	seq        uint64
	installed  bool
	snapshots  int
	deltas     int
	heartbeats int
}

func (rp *replica) apply(u *kvrelaypb.FilterUpdate) {
	t := rp.t
	require.NoError(t, kvrelay.CheckResponse(u))
	require.True(t, proto.Equal(rp.want, u.GetProducer()), "producer of every update")
	switch u.GetKind() {
	case kvrelaypb.FilterUpdateKind_FILTER_UPDATE_KIND_SNAPSHOT_CHUNK:
		var f cbi1.Frame
		require.NoError(t, cbi1.Decode(u.GetPayload(), &f))
		require.Equal(t, u.GetSequence(), f.Epoch)
		require.Equal(t, rp.want.GetPoolId().GetDcId(), f.DCID)
		done, err := rp.asm.Add(&f)
		require.NoError(t, err)
		if done {
			rp.words = append(rp.words[:0], rp.asm.Words()...)
			rp.seq, rp.installed = u.GetSequence(), true
			rp.snapshots++
		}
	case kvrelaypb.FilterUpdateKind_FILTER_UPDATE_KIND_DELTA:
		require.True(t, rp.installed, "a delta before the snapshot")
		var f cbi1.Frame
		require.NoError(t, cbi1.Decode(u.GetPayload(), &f))
		require.Equal(t, rp.seq, u.GetBaseSequence(), "contiguous")
		require.Equal(t, u.GetBaseSequence(), f.BaseEpoch)
		require.Equal(t, u.GetSequence(), f.Epoch)
		require.Equal(t, rp.seq+1, u.GetSequence())
		for _, im := range f.Images {
			rp.words[im.Bucket] = im.Word
		}
		rp.seq = u.GetSequence()
		rp.deltas++
	case kvrelaypb.FilterUpdateKind_FILTER_UPDATE_KIND_HEARTBEAT:
		require.True(t, rp.installed, "heartbeats start after the snapshot")
		require.Empty(t, u.GetPayload())
		require.Equal(t, rp.seq, u.GetSequence(), "a heartbeat does not advance the sequence")
		require.Equal(t, rp.seq, u.GetBaseSequence())
		rp.heartbeats++
	default:
		t.Fatalf("unknown kind %v", u.GetKind())
	}
}

func TestGetRelayInfo(t *testing.T) {
	r := startRelay(t, testConfig())
	info, err := r.client.GetRelayInfo(t.Context(), stamped(&kvrelaypb.RelayInfoRequest{}))
	require.NoError(t, err)
	require.NoError(t, kvrelay.CheckResponse(info))
	assert.Equal(t, r.srv.Incarnation(), info.GetRelay().GetRelayIncarnation())
	assert.NotZero(t, info.GetRelay().GetDrtInstanceId())

	var tr metadata.MD
	_, err = r.client.GetRelayInfo(t.Context(), &kvrelaypb.RelayInfoRequest{ContractMarker: kvrelay.ContractMarker + 1}, grpc.Trailer(&tr))
	code, why := reason(err, tr)
	assert.Equal(t, codes.FailedPrecondition, code)
	assert.Equal(t, reasonContract, why)
}

func TestWatchKvPoolCatalog_Descriptor(t *testing.T) {
	cfg := testConfig()
	cfg.Pools = append(cfg.Pools, server.PoolSpec{Name: "dc-b", DCID: 2, ExpectedBlocks: 4096, BlockSize: 64, HashFormat: "dynamo_eagle_v1",
		KvRelay: server.KvPoolSpec{Namespace: "prod", Roles: []string{"prefill", "decode"}}})
	r := startRelay(t, cfg)
	st, err := r.client.WatchKvPoolCatalog(t.Context(), stamped(&kvrelaypb.WatchKvPoolCatalogRequest{SubscriberId: "cat"}))
	require.NoError(t, err)
	u, err := st.Recv()
	require.NoError(t, err)
	require.NoError(t, kvrelay.CheckResponse(u))
	assert.Equal(t, uint64(1), u.GetRevision())
	pools := u.GetSnapshot().GetPools()
	require.Len(t, pools, 2)

	a := pools[0]
	id := r.pool(t, "dc-a").Identity()
	got, err := producerFromWire(a.GetProducer())
	require.NoError(t, err)
	assert.Equal(t, id, got, "the producer key is the pool's identity")
	assert.Equal(t, uint32(1), a.GetProducer().GetPoolId().GetIdentityVersion())
	assert.Equal(t, kvrelaypb.IdentitySource_IDENTITY_SOURCE_DEFAULT_DERIVED, a.GetProducer().GetPoolId().GetIndexerDomain().GetCacheSemantics().GetSource())
	assert.Equal(t, uint32(16), a.GetQuerySemantics().GetKvBlockSize(), "default block size")
	assert.Equal(t, kvrelaypb.KvQueryHashFormat_KV_QUERY_HASH_FORMAT_DYNAMO_STANDARD_V1, a.GetQuerySemantics().GetHashFormat())
	assert.Equal(t, []kvrelaypb.WorkerRole{kvrelaypb.WorkerRole_WORKER_ROLE_LEGACY}, a.GetPoolRoles())
	assert.Equal(t, "dynamo", a.GetServingEndpoint().GetNamespace())
	require.Len(t, a.GetRegistrations(), 2)
	assert.Equal(t, "llama", a.GetRegistrations()[0].GetTarget().GetBase().GetBaseModel())
	assert.Equal(t, []string{"meta/llama"}, a.GetRegistrations()[0].GetAliases())
	assert.Equal(t, "sql", a.GetRegistrations()[1].GetTarget().GetLora().GetAdapter())
	assert.Equal(t, "llama", a.GetRegistrations()[1].GetTarget().GetLora().GetBaseModel())

	b := pools[1]
	assert.Equal(t, uint64(2), b.GetProducer().GetPoolId().GetDcId())
	assert.Equal(t, uint32(64), b.GetQuerySemantics().GetKvBlockSize())
	assert.Equal(t, kvrelaypb.KvQueryHashFormat_KV_QUERY_HASH_FORMAT_DYNAMO_EAGLE_V1, b.GetQuerySemantics().GetHashFormat())
	assert.Equal(t, []kvrelaypb.WorkerRole{kvrelaypb.WorkerRole_WORKER_ROLE_PREFILL, kvrelaypb.WorkerRole_WORKER_ROLE_DECODE}, b.GetPoolRoles())
	assert.Equal(t, "prod", b.GetServingEndpoint().GetNamespace())
}

// TestSubscribeKvPool_MatchesHTTPStream: the snapshot assembled from CBI1
// chunks plus the deltas after events equal the HTTP stream's table at the
// same sequence; heartbeats arrive while idle.
func TestSubscribeKvPool_MatchesHTTPStream(t *testing.T) {
	r := startRelay(t, testConfig())
	r.post(t, "dc-a", storedJSON(1, 1, 40))
	p := r.pool(t, "dc-a")
	require.Eventually(t, func() bool { return p.Hub().Stats().Sequence >= 1 }, 5*time.Second, time.Millisecond)

	want := producerToWire(p.Identity())
	st, err := r.client.SubscribeKvPool(t.Context(), subscribeReq(want))
	require.NoError(t, err)
	rp := &replica{t: t, want: want}
	for !rp.installed {
		u, err := st.Recv()
		require.NoError(t, err)
		rp.apply(u)
	}
	assert.Equal(t, streamtable.At(t, r.http, "dc-a", 99, rp.seq, 10*time.Second), rp.words, "snapshot")

	for i := range 5 {
		r.post(t, "dc-a", storedJSON(2, uint64(10+i), 30))
	}
	target := uint64(0)
	require.Eventually(t, func() bool {
		target = p.Hub().Stats().Sequence
		st, err := p.Stats(t.Context())
		return err == nil && st.Pool.PendingEvents == 0 && target == st.Sequence && target >= rp.seq+5
	}, 5*time.Second, time.Millisecond)
	for rp.seq < target || rp.heartbeats == 0 {
		u, err := st.Recv()
		require.NoError(t, err)
		rp.apply(u)
	}
	assert.GreaterOrEqual(t, rp.deltas, 5)
	assert.Equal(t, streamtable.At(t, r.http, "dc-a", 99, rp.seq, 10*time.Second), rp.words, "after deltas")
	// The HTTP stream leaves the hub when its handler sees the cancel; the
	// gRPC stream stays: it is a subscriber of the same hub.
	require.Eventually(t, func() bool { return p.Hub().Stats().Subscribers == 1 }, 5*time.Second, time.Millisecond)
}

// TestSubscribeKvPool_Refusals: each request error carries its reason.
func TestSubscribeKvPool_Refusals(t *testing.T) {
	r := startRelay(t, testConfig())
	id := r.pool(t, "dc-a").Identity()
	cases := []struct {
		name string
		req  *kvrelaypb.SubscribeKvPoolRequest
		code codes.Code
		why  kvrelaypb.RelayErrorReason
	}{
		{"contract marker", &kvrelaypb.SubscribeKvPoolRequest{SubscriberId: "x", ExpectedProducer: producerToWire(id)}, codes.FailedPrecondition, reasonContract},
		{"subscriber id", stamped(&kvrelaypb.SubscribeKvPoolRequest{SubscriberId: "a\nb", ExpectedProducer: producerToWire(id)}), codes.InvalidArgument, reasonInvalid},
		{"no expected producer", subscribeReq(nil), codes.InvalidArgument, reasonInvalid},
		{"stale incarnation", subscribeReq(producerToWire(func() ckf.ProducerIdentity { s := id; s.ProducerIncarnation--; return s }())), codes.FailedPrecondition, reasonProducer},
		{"other layout", subscribeReq(producerToWire(func() ckf.ProducerIdentity { s := id; s.LayoutGeneration++; return s }())), codes.FailedPrecondition, reasonProducer},
		{"other seed", subscribeReq(producerToWire(func() ckf.ProducerIdentity { s := id; s.Format.Seed++; return s }())), codes.FailedPrecondition, reasonProducer},
		{"unknown pool", subscribeReq(producerToWire(func() ckf.ProducerIdentity { s := id; s.Pool.DCID = 99; return s }())), codes.NotFound, reasonNotFound},
		{"digest source", subscribeReq(producerToWire(func() ckf.ProducerIdentity { s := id; s.Pool.Domain.RoutingScope.Source = ckf.DigestExplicit; return s }())), codes.NotFound, reasonNotFound},
		{"identity version", subscribeReq(func() *kvrelaypb.ProducerIdentity { w := producerToWire(id); w.PoolId.IdentityVersion = 2; return w }()), codes.FailedPrecondition, reasonUnsupported},
		{"unknown identity source", subscribeReq(func() *kvrelaypb.ProducerIdentity {
			w := producerToWire(id)
			w.PoolId.IndexerDomain.CacheSemantics.Source = 7
			return w
		}()), codes.FailedPrecondition, reasonUnsupported},
		{"short digest", subscribeReq(func() *kvrelaypb.ProducerIdentity {
			w := producerToWire(id)
			w.PoolId.IndexerDomain.CacheSemantics.Digest = w.PoolId.IndexerDomain.CacheSemantics.Digest[:8]
			return w
		}()), codes.InvalidArgument, reasonInvalid},
		{"no format", subscribeReq(func() *kvrelaypb.ProducerIdentity { w := producerToWire(id); w.CkfFormat = nil; return w }()), codes.InvalidArgument, reasonInvalid},
		// Dynamo wire/identity.rs (7216a153): layout_generation 0 is malformed.
		{"layout generation 0", subscribeReq(func() *kvrelaypb.ProducerIdentity { w := producerToWire(id); w.LayoutGeneration = 0; return w }()), codes.InvalidArgument, reasonInvalid},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			st, err := r.client.SubscribeKvPool(t.Context(), c.req)
			require.NoError(t, err)
			_, err = st.Recv()
			code, why := reason(err, st.Trailer())
			assert.Equal(t, c.code, code, "%v", err)
			assert.Equal(t, c.why, why)
		})
	}
	assert.Zero(t, r.pool(t, "dc-a").Hub().Stats().Subscribers, "no refusal took a hub slot")
}

// TestSubscribeKvPool_Lagged: a subscriber that stops reading during its
// snapshot while the pool publishes past the delta log is closed
// SUBSCRIBER_LAGGED.
func TestSubscribeKvPool_Lagged(t *testing.T) {
	cfg := testConfig()
	cfg.SubscriberQueue = 2
	cfg.Pools[0].ExpectedBlocks = 1 << 21 // 2^20 buckets: two 4 MiB chunks
	// A 64 KiB window and no BDP growth (a fixed window disables it): the
	// server's Send of chunk 0 blocks until the client reads.
	r := startRelay(t, cfg, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(1<<16), grpc.WithInitialConnWindowSize(1<<16))
	p := r.pool(t, "dc-a")
	require.Equal(t, uint64(1<<20), p.Identity().Format.BucketCount)
	st, err := r.client.SubscribeKvPool(t.Context(), subscribeReq(producerToWire(p.Identity())))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return p.Hub().Stats().Subscribers == 1 }, 5*time.Second, time.Millisecond)
	for i := range 4 {
		r.post(t, "dc-a", storedJSON(1, uint64(i+1), 2))
	}
	require.Eventually(t, func() bool { return p.Hub().Stats().Subscribers == 0 }, 5*time.Second, time.Millisecond,
		"the hub ends the stalled subscription lagged")
	rp := &replica{t: t, want: producerToWire(p.Identity())}
	var n int
	for {
		u, err := st.Recv()
		if err != nil {
			code, why := reason(err, st.Trailer())
			assert.Equal(t, codes.ResourceExhausted, code, "%v", err)
			assert.Equal(t, reasonLagged, why)
			break
		}
		rp.apply(u)
		n++
	}
	// How much of the snapshot reached the client before the error depends
	// on HTTP/2 flow control and on whether the stream's first Send beat the
	// posts (measured: 0, 1 or both chunks under load); what is pinned is
	// that the stream ends SUBSCRIBER_LAGGED once the hub dropped it, after
	// at most the two snapshot chunks and the deltas the handler had taken.
	t.Logf("%d updates before the lagged close (installed %v)", n, rp.installed)
}

// TestSubscribeKvPool_OversizePublicationClosesSubscribers: a publication
// with more images than a CBI1 delta holds (here with the limit lowered to
// 8 images) closes every current subscriber UNAVAILABLE /
// PUBLICATION_UNAVAILABLE, as Dynamo's hub does (publication/hub.rs
// recover_snapshot; its test
// oversized_delta_resnapshots_and_closes_existing_subscribers): no second
// snapshot on the same stream. A new subscription starts from a snapshot at
// or past that publication, then goes on with deltas, and equals the HTTP
// stream's table.
func TestSubscribeKvPool_OversizePublicationClosesSubscribers(t *testing.T) {
	r := startRelay(t, testConfig())
	r.g.maxDeltaImages = 8
	p := r.pool(t, "dc-a")
	want := producerToWire(p.Identity())
	var streams []grpc.ServerStreamingClient[kvrelaypb.FilterUpdate]
	var replicas []*replica
	for range 2 {
		st, err := r.client.SubscribeKvPool(t.Context(), subscribeReq(want))
		require.NoError(t, err)
		rp := &replica{t: t, want: want}
		for !rp.installed {
			u, err := st.Recv()
			require.NoError(t, err)
			rp.apply(u)
		}
		streams, replicas = append(streams, st), append(replicas, rp)
	}
	r.post(t, "dc-a", storedJSON(1, 1, 64)) // one publication of ~64 images
	for i, st := range streams {
		for {
			u, err := st.Recv()
			if err != nil {
				code, why := reason(err, st.Trailer())
				assert.Equal(t, codes.Unavailable, code, "%v", err)
				assert.Equal(t, reasonUnavailable, why)
				break
			}
			require.NotEqual(t, kvrelaypb.FilterUpdateKind_FILTER_UPDATE_KIND_SNAPSHOT_CHUNK, u.GetKind(), "subscriber %d: no second snapshot on a stream", i)
			replicas[i].apply(u)
		}
		assert.Equal(t, 1, replicas[i].snapshots)
	}
	big := p.Hub().Stats().Sequence
	st, err := r.client.SubscribeKvPool(t.Context(), subscribeReq(want))
	require.NoError(t, err)
	rp := &replica{t: t, want: want}
	for !rp.installed {
		u, err := st.Recv()
		require.NoError(t, err)
		rp.apply(u)
	}
	assert.GreaterOrEqual(t, rp.seq, big, "the new snapshot includes the large publication")
	r.post(t, "dc-a", storedJSON(1, 2, 1)) // then a small one
	for rp.deltas == 0 {
		u, err := st.Recv()
		require.NoError(t, err)
		rp.apply(u)
	}
	assert.Equal(t, streamtable.At(t, r.http, "dc-a", 99, rp.seq, 10*time.Second), rp.words)
}

// TestSubscribeKvPool_AdmissionOrder: Dynamo's order (wan/grpc/service.rs
// subscribe_kv_pool): the relay's total pool stream limit is taken before
// the pool and producer are looked up, and the pool's own subscriber limit
// after them.
func TestSubscribeKvPool_AdmissionOrder(t *testing.T) {
	cfg := testConfig()
	cfg.GRPC.MaxStreams = 1
	cfg.MaxSubscribers = 1
	r := startRelay(t, cfg)
	p := r.pool(t, "dc-a")
	id := p.Identity()
	stale, unknown := id, id
	stale.ProducerIncarnation--
	unknown.Pool.DCID = 99
	refused := func(want ckf.ProducerIdentity) (codes.Code, kvrelaypb.RelayErrorReason) {
		st, err := r.client.SubscribeKvPool(t.Context(), subscribeReq(producerToWire(want)))
		require.NoError(t, err)
		_, err = st.Recv()
		require.Error(t, err)
		return reason(err, st.Trailer())
	}

	// The pool's one hub slot taken by an HTTP stream: the pool and
	// producer checks answer first, then the hub's limit.
	ctx, cancel := context.WithCancel(t.Context())
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.http+"/v1/pools/dc-a/stream?consumer=5&lane=0&epoch=1", nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Eventually(t, func() bool { return p.Hub().Stats().Subscribers == 1 }, 5*time.Second, time.Millisecond)
	code, why := refused(stale)
	assert.Equal(t, codes.FailedPrecondition, code)
	assert.Equal(t, reasonProducer, why)
	code, why = refused(unknown)
	assert.Equal(t, codes.NotFound, code)
	assert.Equal(t, reasonNotFound, why)
	code, why = refused(id)
	assert.Equal(t, codes.ResourceExhausted, code)
	assert.Equal(t, reasonLimit, why)
	cancel()
	resp.Body.Close()
	require.Eventually(t, func() bool { return p.Hub().Stats().Subscribers == 0 }, 5*time.Second, time.Millisecond)

	// The relay's one pool stream taken: every subscribe is refused
	// RESOURCE_LIMIT before its pool is looked up.
	st, err := r.client.SubscribeKvPool(t.Context(), subscribeReq(producerToWire(id)))
	require.NoError(t, err)
	_, err = st.Recv()
	require.NoError(t, err)
	for _, want := range []ckf.ProducerIdentity{stale, unknown, id} {
		code, why := refused(want)
		assert.Equal(t, codes.ResourceExhausted, code, "%+v", want.Pool)
		assert.Equal(t, reasonLimit, why)
	}
}

// TestLoadReadinessServing: pool-load windows count the exact state's
// blocks; readiness and serving load report what the relay knows and never
// READY.
func TestLoadReadinessServing(t *testing.T) {
	r := startRelay(t, testConfig())
	r.post(t, "dc-a", storedJSON(1, 1, 5))
	r.post(t, "dc-a", storedJSON(2, 2, 7))
	id := producerToWire(r.pool(t, "dc-a").Identity())

	ls, err := r.client.SubscribeKvPoolLoad(t.Context(), stamped(&kvrelaypb.SubscribeKvPoolLoadRequest{SubscriberId: "load"}))
	require.NoError(t, err)
	var last uint64
	for {
		u, err := ls.Recv()
		require.NoError(t, err)
		require.NoError(t, kvrelay.CheckResponse(u))
		if last != 0 {
			require.Equal(t, last+1, u.GetWindowSequence(), "complete windows in order")
		}
		last = u.GetWindowSequence()
		require.Len(t, u.GetPools(), 1)
		e := u.GetPools()[0]
		require.True(t, proto.Equal(id, e.GetProducer()))
		assert.Equal(t, uint64(10000), e.GetTotalKvBlocks())
		if e.GetKvUsedBlocks() == 12 {
			assert.Equal(t, uint32(2), e.GetKvObservedRanks())
			assert.Equal(t, uint32(2), e.GetKvExpectedRanks())
			break
		}
	}

	rs, err := r.client.SubscribeServingReadiness(t.Context(), stamped(&kvrelaypb.SubscribeServingReadinessRequest{SubscriberId: "ready"}))
	require.NoError(t, err)
	for range 2 { // the snapshot and its heartbeat repeat
		u, err := rs.Recv()
		require.NoError(t, err)
		require.NoError(t, kvrelay.CheckResponse(u))
		require.Len(t, u.GetEntries(), 1)
		e := u.GetEntries()[0]
		assert.Equal(t, "llama", e.GetCanonicalModelId())
		assert.Equal(t, kvrelaypb.ServingReadinessState_SERVING_READINESS_STATE_UNKNOWN, e.GetState())
		assert.Empty(t, e.GetPresentRoles())
		assert.Empty(t, e.GetMissingRoles())
		require.Len(t, e.GetMembers(), 1)
		assert.True(t, proto.Equal(id.GetPoolId(), e.GetMembers()[0].GetPoolId()))
		require.Len(t, e.GetAdapters(), 1)
		assert.Equal(t, "llama-sql", e.GetAdapters()[0].GetCanonicalModelId())
		assert.Equal(t, kvrelaypb.ServingReadinessState_SERVING_READINESS_STATE_UNKNOWN, e.GetAdapters()[0].GetState())
	}

	ss, err := r.client.SubscribeServingLoad(t.Context(), stamped(&kvrelaypb.SubscribeServingLoadRequest{SubscriberId: "serving"}))
	require.NoError(t, err)
	u, err := ss.Recv()
	require.NoError(t, err)
	require.NoError(t, kvrelay.CheckResponse(u))
	require.Len(t, u.GetPools(), 1)
	pl := u.GetPools()[0].GetLoad()
	assert.Equal(t, kvrelaypb.DataStatus_DATA_STATUS_UNAVAILABLE, pl.GetStatus())
	assert.Nil(t, pl.GetRequests(), "a pool view has no request lifecycle")
	assert.Nil(t, pl.GetTokens().ActivePrefillTokens, "gauges unset unless complete")
	require.Len(t, u.GetModels(), 2)
	for _, m := range u.GetModels() {
		assert.Equal(t, kvrelaypb.DataStatus_DATA_STATUS_UNAVAILABLE, m.GetLoad().GetStatus())
		require.NotNil(t, m.GetLoad().GetTokens().InputTokensTotal, "totals always set")
		assert.Nil(t, m.GetLoad().GetRequests().RequestsGenerating)
	}
}

// TestStreamLimitsAndSubscriberID: each streaming RPC has its own limit,
// answered RESOURCE_LIMIT; a bad subscriber_id is INVALID_REQUEST.
func TestStreamLimitsAndSubscriberID(t *testing.T) {
	cfg := testConfig()
	cfg.GRPC.MaxStreams = 1
	r := startRelay(t, cfg)
	ctx := t.Context()
	first, err := r.client.WatchKvPoolCatalog(ctx, stamped(&kvrelaypb.WatchKvPoolCatalogRequest{SubscriberId: "a"}))
	require.NoError(t, err)
	_, err = first.Recv()
	require.NoError(t, err)
	second, err := r.client.WatchKvPoolCatalog(ctx, stamped(&kvrelaypb.WatchKvPoolCatalogRequest{SubscriberId: "a"}))
	require.NoError(t, err)
	_, err = second.Recv()
	code, why := reason(err, second.Trailer())
	assert.Equal(t, codes.ResourceExhausted, code)
	assert.Equal(t, reasonLimit, why)

	load, err := r.client.SubscribeKvPoolLoad(ctx, stamped(&kvrelaypb.SubscribeKvPoolLoadRequest{SubscriberId: "b"}))
	require.NoError(t, err)
	_, err = load.Recv()
	require.NoError(t, err, "the load stream's limit is its own")

	bad, err := r.client.SubscribeServingLoad(ctx, stamped(&kvrelaypb.SubscribeServingLoadRequest{SubscriberId: strings.Repeat("x", 129)}))
	require.NoError(t, err)
	_, err = bad.Recv()
	code, why = reason(err, bad.Trailer())
	assert.Equal(t, codes.InvalidArgument, code)
	assert.Equal(t, reasonInvalid, why)
}

// TestTLSAndToken: with TLS and a bearer token, a client that trusts the
// certificate and sends the token gets through; one without the token is
// UNAUTHENTICATED, and a plaintext client does not connect.
func TestTLSAndToken(t *testing.T) {
	cfg := testConfig()
	cfg.TLSCertFile, cfg.TLSKeyFile, cfg.AuthToken = selfSigned(t, t.TempDir())
	roots := x509.NewCertPool()
	pemBytes, err := os.ReadFile(cfg.TLSCertFile)
	require.NoError(t, err)
	require.True(t, roots.AppendCertsFromPEM(pemBytes))
	creds := grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}))
	r := startRelay(t, cfg, creds)

	_, err = r.client.GetRelayInfo(t.Context(), stamped(&kvrelaypb.RelayInfoRequest{}))
	assert.Equal(t, codes.Unauthenticated, status.Code(err))
	ctx := metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer "+cfg.AuthToken)
	_, err = r.client.GetRelayInfo(ctx, stamped(&kvrelaypb.RelayInfoRequest{}))
	require.NoError(t, err)
	st, err := r.client.WatchKvPoolCatalog(ctx, stamped(&kvrelaypb.WatchKvPoolCatalogRequest{SubscriberId: "a"}))
	require.NoError(t, err)
	_, err = st.Recv()
	require.NoError(t, err)
	st, err = r.client.WatchKvPoolCatalog(metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer wrong"),
		stamped(&kvrelaypb.WatchKvPoolCatalogRequest{SubscriberId: "a"}))
	require.NoError(t, err)
	_, err = st.Recv()
	assert.Equal(t, codes.Unauthenticated, status.Code(err))

	plain, err := grpc.NewClient(r.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer plain.Close()
	_, err = kvrelaypb.NewKvEventRelayClient(plain).GetRelayInfo(ctx, stamped(&kvrelaypb.RelayInfoRequest{}))
	assert.Equal(t, codes.Unavailable, status.Code(err))
}

// selfSigned writes a certificate for 127.0.0.1 and its key to dir and
// returns their paths and a token.
func selfSigned(t *testing.T, dir string) (certFile, keyFile, token string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "ckfrelay test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	kder, err := x509.MarshalECPrivateKey(key)
	require.NoError(t, err)
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	require.NoError(t, os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	require.NoError(t, os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600))
	return certFile, keyFile, "s3cret-token"
}

// TestSubscribeKvPool_SubscribersShareOneEncoding: each delta is encoded
// once (CBI1 and protobuf) whatever the number of filter streams on its
// pool, and every stream receives the same bytes, send_ts_us included.
func TestSubscribeKvPool_SubscribersShareOneEncoding(t *testing.T) {
	r := startRelay(t, testConfig())
	r.post(t, "dc-a", storedJSON(1, 1, 40))
	p := r.pool(t, "dc-a")
	quiet := func(min uint64) uint64 {
		var at uint64
		require.Eventually(t, func() bool {
			at = p.Hub().Stats().Sequence
			st, err := p.Stats(t.Context())
			return err == nil && st.Pool.PendingEvents == 0 && at == st.Sequence && at >= min
		}, 5*time.Second, time.Millisecond)
		return at
	}
	base := quiet(1)

	want := producerToWire(p.Identity())
	const subscribers = 4
	streams := make([]grpc.ServerStreamingClient[kvrelaypb.FilterUpdate], subscribers)
	replicas := make([]*replica, subscribers)
	for i := range streams {
		st, err := r.client.SubscribeKvPool(t.Context(), subscribeReq(want))
		require.NoError(t, err)
		streams[i], replicas[i] = st, &replica{t: t, want: want}
		for !replicas[i].installed {
			u, err := st.Recv()
			require.NoError(t, err)
			replicas[i].apply(u)
		}
		require.Equal(t, base, replicas[i].seq, "every stream starts at the quiet pool's sequence")
	}
	before := r.g.deltaEncodes.Load()
	for i := range 5 {
		r.post(t, "dc-a", storedJSON(2, uint64(10+i), 30))
	}
	target := quiet(base + 5)
	deltas := map[uint64]*kvrelaypb.FilterUpdate{} // sequence → the first stream's update
	for i, st := range streams {
		rp := replicas[i]
		for rp.seq < target {
			u, err := st.Recv()
			require.NoError(t, err)
			rp.apply(u)
			if u.GetKind() != kvrelaypb.FilterUpdateKind_FILTER_UPDATE_KIND_DELTA {
				continue
			}
			if first, ok := deltas[u.GetSequence()]; ok {
				assert.True(t, proto.Equal(first, u), "stream %d: delta %d differs from the first stream's (send_ts_us %d, first %d)",
					i, u.GetSequence(), u.GetSendTsUs(), first.GetSendTsUs())
			} else {
				deltas[u.GetSequence()] = u
			}
		}
		assert.Equal(t, replicas[0].words, rp.words, "stream %d's table", i)
	}
	require.Len(t, deltas, int(target-base), "one delta per sequence")
	assert.Equal(t, uint64(len(deltas)), r.g.deltaEncodes.Load()-before,
		"%d deltas to %d streams: encodings", len(deltas), subscribers)
}

// TestSubscribeKvPool_SharedEncodingsAreBounded: a subscriber that stops
// reading while the pool moves on does not make the shared encodings grow:
// at most sharedDeltas entries within sharedDeltaBytes beside the newest,
// and the cache goes with the pool's last stream.
func TestSubscribeKvPool_SharedEncodingsAreBounded(t *testing.T) {
	r := startRelay(t, testConfig())
	r.post(t, "dc-a", storedJSON(1, 1, 40))
	p := r.pool(t, "dc-a")
	require.Eventually(t, func() bool { return p.Hub().Stats().Sequence >= 1 }, 5*time.Second, time.Millisecond)
	want := producerToWire(p.Identity())
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var streams []grpc.ServerStreamingClient[kvrelaypb.FilterUpdate]
	for range 2 {
		st, err := r.client.SubscribeKvPool(ctx, subscribeReq(want))
		require.NoError(t, err)
		streams = append(streams, st)
	}
	reader := &replica{t: t, want: want}
	for !reader.installed {
		u, err := streams[0].Recv()
		require.NoError(t, err)
		reader.apply(u)
	}
	// streams[1] never reads. 3 × sharedDeltas deltas of 30 blocks each.
	for i := range 3 * sharedDeltas {
		before := p.Hub().Stats().Sequence
		r.post(t, "dc-a", storedJSON(2, uint64(10+i), 30))
		// Wait for this post's own publication, so the next post cannot
		// share it (a 202 comes before the publication).
		require.Eventually(t, func() bool { return p.Hub().Stats().Sequence > before }, 5*time.Second, time.Millisecond)
		seq := p.Hub().Stats().Sequence
		for reader.seq < seq {
			u, err := streams[0].Recv()
			require.NoError(t, err)
			reader.apply(u)
		}
	}
	r.g.cachesMu.Lock()
	cache := r.g.caches[p.Hub()]
	r.g.cachesMu.Unlock()
	require.NotNil(t, cache)
	cache.mu.Lock()
	n, bytes := len(cache.entries), cache.bytes
	cache.mu.Unlock()
	assert.LessOrEqual(t, n, sharedDeltas, "entries")
	assert.LessOrEqual(t, bytes, sharedDeltaBytes, "bytes held")
	assert.Greater(t, reader.deltas, 2*sharedDeltas, "deltas (posts may share a publication): enough to need eviction")

	cancel()
	require.Eventually(t, func() bool {
		r.g.cachesMu.Lock()
		defer r.g.cachesMu.Unlock()
		return len(r.g.caches) == 0
	}, 5*time.Second, time.Millisecond, "the cache goes with the pool's last stream")
}
