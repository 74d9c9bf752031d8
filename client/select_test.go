package client

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/consumer"
	"github.com/ckfrelay/ckfrelay/wire/kvrelay"
	"github.com/ckfrelay/ckfrelay/wire/kvrelay/kvrelaypb"
)

func baseReg(model string, aliases ...string) *kvrelaypb.ModelRegistration {
	return &kvrelaypb.ModelRegistration{CanonicalModelId: model, Aliases: aliases,
		Target: &kvrelaypb.ModelTarget{Target: &kvrelaypb.ModelTarget_Base{Base: &kvrelaypb.BaseModelTarget{BaseModel: model}}}}
}

func loraReg(id, base, adapter string) *kvrelaypb.ModelRegistration {
	return &kvrelaypb.ModelRegistration{CanonicalModelId: id,
		Target: &kvrelaypb.ModelTarget{Target: &kvrelaypb.ModelTarget_Lora{Lora: &kvrelaypb.LoraModelTarget{BaseModel: base, Adapter: adapter}}}}
}

// modelPool is a catalog pool as a Dynamo relay describes one: namespace,
// roles and model registrations.
func modelPool(id ckf.ProducerIdentity, ns string, roles []kvrelaypb.WorkerRole, regs ...*kvrelaypb.ModelRegistration) *kvrelaypb.KvPoolDescriptor {
	d := descriptor(id)
	d.ServingEndpoint.Namespace = ns
	d.PoolRoles = roles
	d.Registrations = regs
	return d
}

var (
	aggregated = []kvrelaypb.WorkerRole{kvrelaypb.WorkerRole_WORKER_ROLE_AGGREGATED}
	prefill    = []kvrelaypb.WorkerRole{kvrelaypb.WorkerRole_WORKER_ROLE_PREFILL}
	decode     = []kvrelaypb.WorkerRole{kvrelaypb.WorkerRole_WORKER_ROLE_DECODE}
)

// domainOf returns a domain whose digests differ per model, as a Dynamo
// relay's indexer domains do (one per cache semantics × routing scope).
func domainOf(b byte) ckf.Domain {
	return ckf.Domain{CacheSemantics: ckf.ScopedDigest{Digest: [16]byte{b}, Source: ckf.DigestExplicit},
		RoutingScope: ckf.ScopedDigest{Digest: [16]byte{b, 1}, Source: ckf.DigestExplicit}}
}

func poolIdentity(d ckf.Domain, dc, incarnation uint64) ckf.ProducerIdentity {
	return ckf.ProducerIdentity{Pool: ckf.PoolID{Domain: d, DCID: dc}, ProducerIncarnation: incarnation, LayoutGeneration: 1, Format: testFormat}
}

func TestSelection_Pick(t *testing.T) {
	llama, qwen := domainOf(10), domainOf(20)
	l1, q1, l2 := poolIdentity(llama, 1, 1), poolIdentity(qwen, 1, 1), poolIdentity(llama, 2, 1)
	bad := modelPool(poolIdentity(llama, 3, 1), "dynamo", aggregated, baseReg("llama"))
	bad.QuerySemantics.KvBlockSize = 0
	m := &kvrelaypb.KvPoolCatalogUpdate{Snapshot: &kvrelaypb.KvPoolCatalogSnapshot{Pools: []*kvrelaypb.KvPoolDescriptor{
		modelPool(l1, "dynamo", aggregated, baseReg("llama"), loraReg("llama-sql", "llama", "sql")),
		modelPool(q1, "dynamo", aggregated, baseReg("qwen")),
		modelPool(poolIdentity(qwen, 1, 2), "other", aggregated, baseReg("qwen")),     // another deployment
		modelPool(poolIdentity(domainOf(30), 1, 1), "dynamo", prefill, baseReg("ds")), // disaggregated
		modelPool(poolIdentity(domainOf(31), 1, 1), "dynamo", decode, baseReg("ds")),
		modelPool(l2, "dynamo", aggregated, baseReg("llama")),
		modelPool(poolIdentity(qwen, 2, 1), "dynamo", aggregated, baseReg("qwen")),
		modelPool(poolIdentity(qwen, 2, 2), "dynamo", []kvrelaypb.WorkerRole{kvrelaypb.WorkerRole_WORKER_ROLE_AGGREGATED, kvrelaypb.WorkerRole_WORKER_ROLE_DECODE}, baseReg("qwen")),
		bad,
		modelPool(poolIdentity(domainOf(40), 4, 1), "dynamo", []kvrelaypb.WorkerRole{kvrelaypb.WorkerRole_WORKER_ROLE_LEGACY}),
	}}}
	kvrelay.StampResponse(m, &kvrelaypb.RelayIdentity{DrtInstanceId: 1, RelayIncarnation: 1})
	cat, err := parseCatalog(m)
	require.NoError(t, err)
	sel := func(s Selection) Selection { s, err := s.withDefaults(); require.NoError(t, err); return s }
	for _, c := range []struct {
		name string
		sel  Selection
		dc   uint64
		want *ckf.ProducerIdentity
		err  error
	}{
		{"llama in dc 1", Selection{Model: "llama"}, 1, &l1, nil},
		{"llama in dc 2", Selection{Model: "llama"}, 2, &l2, nil},
		{"qwen in dc 1: the other namespace is not counted", Selection{Model: "qwen"}, 1, &q1, nil},
		{"qwen in the other namespace", Selection{Model: "qwen", Namespace: "other"}, 1, ptr(poolIdentity(qwen, 1, 2)), nil},
		{"a LoRA adapter of llama", Selection{Model: "llama", Adapter: "sql"}, 1, &l1, nil},
		{"the LoRA's canonical id is not a base model", Selection{Model: "llama-sql"}, 1, nil, ErrNotInCatalog},
		{"an adapter nobody registers", Selection{Model: "llama", Adapter: "x"}, 1, nil, ErrNotInCatalog},
		{"no model in dc 4", Selection{Model: "llama"}, 4, nil, ErrNotInCatalog},
		{"disaggregated: no aggregated pool", Selection{Model: "ds"}, 1, nil, ErrNotInCatalog},
		{"disaggregated: the prefill pool on request", Selection{Model: "ds", Role: RolePrefill}, 1, ptr(poolIdentity(domainOf(30), 1, 1)), nil},
		{"two aggregated qwen pools in dc 2", Selection{Model: "qwen"}, 2, nil, ErrAmbiguous},
		{"the one match is quarantined", Selection{Model: "llama"}, 3, nil, ErrQuarantined},
		{"zero selection, several pools", Selection{}, 1, nil, ErrAmbiguous},
		{"zero selection, one pool", Selection{}, 4, ptr(poolIdentity(domainOf(40), 4, 1)), nil},
	} {
		i, err := sel(c.sel).pick(cat, c.dc)
		if c.err != nil {
			assert.ErrorIs(t, err, c.err, c.name)
			continue
		}
		if assert.NoError(t, err, c.name) {
			assert.Equal(t, *c.want, cat[i].id, c.name)
		}
	}
	for _, s := range []Selection{{Namespace: "x"}, {Adapter: "a"}, {Role: RolePrefill}, {Model: "m", Role: 7}, {Model: " m"}} {
		_, err := s.withDefaults()
		assert.Error(t, err, "%+v", s)
	}
}

func ptr[T any](v T) *T { return &v }

// TestGRPC_FollowsAMultiPoolRelay: a relay shaped like Dynamo's — data
// center 1 hosts the pools of two models (same dc_id, different indexer
// domains), data center 2 another — and a router routing for llama follows
// exactly llama's pools, one lane per data center, and follows a producer
// change of one without disturbing the other.
func TestGRPC_FollowsAMultiPoolRelay(t *testing.T) {
	llama, qwen := domainOf(10), domainOf(20)
	l1, q1, l2, q2 := poolIdentity(llama, 1, 1), poolIdentity(qwen, 1, 1), poolIdentity(llama, 2, 1), poolIdentity(qwen, 2, 1)
	pools := func(l1 ckf.ProducerIdentity) []*kvrelaypb.KvPoolDescriptor {
		return []*kvrelaypb.KvPoolDescriptor{
			modelPool(q1, "dynamo", aggregated, baseReg("qwen")), modelPool(l1, "dynamo", aggregated, baseReg("llama")),
			modelPool(q2, "dynamo", aggregated, baseReg("qwen")), modelPool(l2, "dynamo", aggregated, baseReg("llama")),
		}
	}
	f, addr := startFakeKV(t)
	f.setCatalog(1, pools(l1)...)
	m := consumer.Manifest{ConsumerInstance: testConsumer, Domain: llama, Format: testFormat, VerificationWindow: 2}
	m.Lanes[0], m.Lanes[1] = &l1.Pool, &l2.Pool
	n, err := NewNative(m)
	require.NoError(t, err)
	r := startRouter(t, Config{GRPC: &GRPCConfig{}, Relays: []Relay{{Addrs: []string{addr}}}, ConsumerInstance: testConsumer,
		Select:     Selection{Model: "llama"},
		Targets:    []Target{{Pool: "dc1", Lane: 0, DCID: 1}, {Pool: "dc2", Lane: 1, DCID: 2}},
		MinBackoff: 5 * time.Millisecond, MaxBackoff: 20 * time.Millisecond}, n)

	subs := map[uint64]*fakeSub{}
	for range 2 {
		s := f.next(t)
		id, err := kvrelay.ProducerFromWire(s.req.GetExpectedProducer())
		require.NoError(t, err)
		require.Equal(t, llama, id.Pool.Domain, "only llama's pools are followed")
		require.NotContains(t, subs, id.Pool.DCID, "one lane per data center")
		subs[id.Pool.DCID] = s
	}
	f.none(t, 100*time.Millisecond)
	rng := rand.New(rand.NewPCG(11, 12))
	w1, w2 := randomWords(rng, testFormat.BucketCount), randomWords(rng, testFormat.BucketCount)
	f.sendSnapshot(t, subs[1], l1, 3, w1, 16)
	f.sendSnapshot(t, subs[2], l2, 7, w2, 64)
	lane := func(i int) ([]uint64, uint64) {
		if !r.Lane(i).Ready {
			return nil, 0
		}
		w, seq, err := r.AppendLaneWords(nil, i)
		require.NoError(t, err)
		return w, seq
	}
	require.Eventually(t, func() bool { w, seq := lane(0); return seq == 3 && assert.ObjectsAreEqual(w1, w) }, 5*time.Second, time.Millisecond)
	require.Eventually(t, func() bool { w, seq := lane(1); return seq == 7 && assert.ObjectsAreEqual(w2, w) }, 5*time.Second, time.Millisecond)

	// llama's producer in data center 1 restarts: the catalog advertises
	// its new key; lane 0 moves to it, lane 1 keeps its stream.
	l1b := l1
	l1b.ProducerIncarnation = 2
	f.setCatalog(2, pools(l1b)...)
	s := f.next(t)
	assert.True(t, proto.Equal(kvrelay.ProducerToWire(l1b), s.req.GetExpectedProducer()))
	<-subs[1].done
	w1 = randomWords(rng, testFormat.BucketCount)
	f.sendSnapshot(t, s, l1b, 1, w1, 32)
	require.Eventually(t, func() bool { w, seq := lane(0); return seq == 1 && assert.ObjectsAreEqual(w1, w) }, 5*time.Second, time.Millisecond)
	f.sendDelta(t, subs[2], l2, 7, w2, rng)
	require.Eventually(t, func() bool { w, seq := lane(1); return seq == 8 && assert.ObjectsAreEqual(w2, w) }, 5*time.Second, time.Millisecond)
	assert.Zero(t, r.Lane(1).Resubscribes, "the other data center's lane was not disturbed")
	assert.Equal(t, uint64(1), r.Lane(0).Resubscribes)
}

// TestGRPC_LaneWithoutAPoolAnswersNothing: a data center where nothing
// matches the selection (only qwen runs there) leaves its lane not ready:
// no words (a typed error) and no answers, while the other data center's
// lane answers.
func TestGRPC_LaneWithoutAPoolAnswersNothing(t *testing.T) {
	llama, qwen := domainOf(10), domainOf(20)
	q1, l2 := poolIdentity(qwen, 1, 1), poolIdentity(llama, 2, 1)
	f, addr := startFakeKV(t)
	f.setCatalog(1, modelPool(q1, "dynamo", aggregated, baseReg("qwen")), modelPool(l2, "dynamo", aggregated, baseReg("llama")))
	m := consumer.Manifest{ConsumerInstance: testConsumer, Domain: llama, Format: testFormat, VerificationWindow: 2}
	m.Lanes[0], m.Lanes[1] = &ckf.PoolID{Domain: llama, DCID: 1}, &l2.Pool
	n, err := NewNative(m)
	require.NoError(t, err)
	r := startRouter(t, Config{GRPC: &GRPCConfig{}, Relays: []Relay{{Addrs: []string{addr}}}, ConsumerInstance: testConsumer,
		Select:     Selection{Model: "llama"},
		Targets:    []Target{{Pool: "dc1", Lane: 0, DCID: 1}, {Pool: "dc2", Lane: 1, DCID: 2}},
		MinBackoff: 5 * time.Millisecond, MaxBackoff: 20 * time.Millisecond}, n)
	s := f.next(t)
	id, err := kvrelay.ProducerFromWire(s.req.GetExpectedProducer())
	require.NoError(t, err)
	require.Equal(t, l2, id)
	words := make([]uint64, testFormat.BucketCount)
	f.sendSnapshot(t, s, l2, 1, words, 64)
	require.Eventually(t, func() bool { return r.Lane(1).Ready }, 5*time.Second, time.Millisecond)
	require.Eventually(t, func() bool { return r.Lane(0).LastError != "" }, 5*time.Second, time.Millisecond)
	assert.Contains(t, r.Lane(0).LastError, ErrNotInCatalog.Error())
	assert.False(t, r.Lane(0).Ready)

	_, _, err = r.AppendLaneWords(nil, 0)
	require.ErrorIs(t, err, consumer.ErrUnavailable, "a lane that is not ready has no words")
	_, _, err = r.AppendLaneWords(nil, 1)
	require.NoError(t, err)
	var res consumer.QueryResult
	require.NoError(t, r.QuerySequenceHashes([]uint64{1, 2, 3}, &res))
	assert.Equal(t, uint16(1<<1), res.Mask, "only the ready lane answers")
}

// TestCatalogFollows: on one catalog stream the relay identity stays, the
// revision does not go backwards, and a repeated revision (Dynamo's catalog
// heartbeat) repeats its snapshot (global_view_consumer/coordinator.rs).
func TestCatalogFollows(t *testing.T) {
	upd := func(rev, incarnation uint64, pools ...*kvrelaypb.KvPoolDescriptor) *kvrelaypb.KvPoolCatalogUpdate {
		m := &kvrelaypb.KvPoolCatalogUpdate{Revision: rev, Snapshot: &kvrelaypb.KvPoolCatalogSnapshot{Pools: pools}}
		kvrelay.StampResponse(m, &kvrelaypb.RelayIdentity{DrtInstanceId: 1, RelayIncarnation: incarnation})
		return m
	}
	a, b := descriptor(testID), descriptor(poolIdentity(domainOf(9), 2, 1))
	prev := upd(5, 1, a)
	assert.NoError(t, catalogFollows(prev, upd(5, 1, descriptor(testID))), "a heartbeat: the same revision and snapshot")
	assert.NoError(t, catalogFollows(prev, upd(6, 1, a, b)))
	assert.ErrorContains(t, catalogFollows(prev, upd(4, 1, a)), "backwards")
	assert.ErrorContains(t, catalogFollows(prev, upd(5, 1, a, b)), "without advancing")
	assert.ErrorContains(t, catalogFollows(prev, upd(6, 2, a)), "relay incarnation changed")
}
