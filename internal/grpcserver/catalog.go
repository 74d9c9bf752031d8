package grpcserver

import (
	"context"
	"errors"
	"slices"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/ckfrelay/ckfrelay/internal/server"
	"github.com/ckfrelay/ckfrelay/wire/kvrelay"
	"github.com/ckfrelay/ckfrelay/wire/kvrelay/kvrelaypb"
)

// roleToWire maps a configured role name (server.WorkerRoles) to its enum.
func roleToWire(r string) kvrelaypb.WorkerRole {
	if i := slices.Index(server.WorkerRoles, r); i >= 0 {
		return kvrelaypb.WorkerRole(i + 1)
	}
	return kvrelaypb.WorkerRole_WORKER_ROLE_UNSPECIFIED // refused by config validation
}

func rolesToWire(rs []string) []kvrelaypb.WorkerRole {
	out := make([]kvrelaypb.WorkerRole, len(rs))
	for i, r := range rs {
		out[i] = roleToWire(r)
	}
	return out
}

func endpointToWire(k server.KvPoolSpec) *kvrelaypb.DynamoEndpointId {
	return &kvrelaypb.DynamoEndpointId{Namespace: k.Namespace, Component: k.Component, Endpoint: k.Endpoint}
}

func registrationToWire(m server.ModelSpec) *kvrelaypb.ModelRegistration {
	t := &kvrelaypb.ModelTarget{Target: &kvrelaypb.ModelTarget_Base{Base: &kvrelaypb.BaseModelTarget{BaseModel: m.BaseModel}}}
	if m.LoraAdapter != "" {
		t.Target = &kvrelaypb.ModelTarget_Lora{Lora: &kvrelaypb.LoraModelTarget{BaseModel: m.BaseModel, Adapter: m.LoraAdapter}}
	}
	return &kvrelaypb.ModelRegistration{CanonicalModelId: m.ID, Target: t, Aliases: m.Aliases}
}

func hashFormatToWire(s string) kvrelaypb.KvQueryHashFormat {
	if s == server.HashFormatEagle {
		return kvrelaypb.KvQueryHashFormat_KV_QUERY_HASH_FORMAT_DYNAMO_EAGLE_V1
	}
	return kvrelaypb.KvQueryHashFormat_KV_QUERY_HASH_FORMAT_DYNAMO_STANDARD_V1
}

// livePools are the pools whose hub serves subscribers: the catalog's pools.
// A pool whose publication stopped (shutdown, fence) is withdrawn.
func (g *Server) livePools() []server.KvPool {
	var out []server.KvPool
	for _, p := range g.relay.KvPools() {
		if p.Hub().Stats().Ready {
			out = append(out, p)
		}
	}
	return out
}

// descriptor is a pool's KvPoolDescriptor.
func descriptor(p server.KvPool) *kvrelaypb.KvPoolDescriptor {
	spec := p.Spec()
	k := spec.KvRelay
	d := &kvrelaypb.KvPoolDescriptor{Producer: producerToWire(p.Identity()), ServingEndpoint: endpointToWire(k),
		QuerySemantics: &kvrelaypb.KvQuerySemantics{KvBlockSize: spec.QueryBlockSize(), HashFormat: hashFormatToWire(spec.HashFormat)},
		PoolRoles:      rolesToWire(k.Roles)}
	for _, m := range k.Models {
		d.Registrations = append(d.Registrations, registrationToWire(m))
	}
	return d
}

// publishCatalog publishes a new revision when the pools' descriptors
// changed (a pool withdrawn, a new producer identity).
func (g *Server) publishCatalog() {
	snap := &kvrelaypb.KvPoolCatalogSnapshot{}
	for _, p := range g.livePools() {
		snap.Pools = append(snap.Pools, descriptor(p))
	}
	prev, rev := g.catalog.latest()
	if prev != nil && proto.Equal(prev.GetSnapshot(), snap) {
		return
	}
	u := &kvrelaypb.KvPoolCatalogUpdate{Revision: rev + 1, Snapshot: snap}
	kvrelay.StampResponse(u, g.id)
	g.catalog.publish(u)
}

// WatchKvPoolCatalog streams complete catalog snapshots: the current one,
// then each new revision (revisions may be skipped when they come faster
// than the subscriber reads; each update is complete).
func (g *Server) WatchKvPoolCatalog(req *kvrelaypb.WatchKvPoolCatalogRequest, stream grpc.ServerStreamingServer[kvrelaypb.KvPoolCatalogUpdate]) error {
	ctx := stream.Context()
	release, err := g.admit(ctx, req, g.catalogSlots, "catalog")
	if err != nil {
		return err
	}
	defer release()
	u, at := g.catalog.latest()
	for {
		// A replica that leads none of its pools serves no catalog: the
		// client moves to the relay's next replica.
		if err := g.standby(ctx); err != nil {
			return err
		}
		if err := stream.Send(u); err != nil {
			return err
		}
		if u, at, err = g.catalog.next(ctx, at, true); err != nil {
			return feedEnd(ctx, err, "catalog")
		}
	}
}

// feedEnd ends a catalog, readiness or load stream.
func feedEnd(ctx context.Context, err error, what string) error {
	switch {
	case errors.Is(err, errFeedLagged):
		return kvrelay.Fail(ctx, reasonLagged, "%s subscriber lagged more than %d windows; resubscribe", what, loadHistory)
	case errors.Is(err, errFeedClosed):
		return unavailable(ctx, what)
	}
	return err
}

// readiness builds what the relay knows of serving readiness: one entry per
// (namespace, base model) its pools register, in state UNKNOWN. The relay
// hears KV events, not worker liveness or frontends, so it never reports
// READY or UNAVAILABLE; members and declared roles come from configuration.
// LoRA registrations are adapters of their base model's entry, also UNKNOWN.
func (g *Server) readiness(rev uint64) *kvrelaypb.ServingReadinessUpdate {
	type key struct{ ns, model string }
	entries := map[key]*kvrelaypb.TopologyEntry{}
	var order []key
	entry := func(k key) *kvrelaypb.TopologyEntry {
		e, ok := entries[k]
		if !ok {
			e = &kvrelaypb.TopologyEntry{Namespace: k.ns, CanonicalModelId: k.model,
				State: kvrelaypb.ServingReadinessState_SERVING_READINESS_STATE_UNKNOWN}
			entries[k] = e
			order = append(order, k)
		}
		return e
	}
	declared := map[key]map[kvrelaypb.WorkerRole]int{}
	for _, p := range g.livePools() {
		k := p.Spec().KvRelay
		for _, m := range k.Models {
			e := entry(key{k.Namespace, m.BaseModel})
			if m.LoraAdapter != "" {
				if !slices.ContainsFunc(e.Adapters, func(a *kvrelaypb.AdapterReadiness) bool { return a.CanonicalModelId == m.ID }) {
					e.Adapters = append(e.Adapters, &kvrelaypb.AdapterReadiness{CanonicalModelId: m.ID,
						State: kvrelaypb.ServingReadinessState_SERVING_READINESS_STATE_UNKNOWN})
				}
				continue
			}
			ep := endpointToWire(k)
			if slices.ContainsFunc(e.Members, func(mb *kvrelaypb.TopologyMember) bool { return proto.Equal(mb.Endpoint, ep) }) {
				continue
			}
			e.Members = append(e.Members, &kvrelaypb.TopologyMember{Endpoint: ep, Roles: rolesToWire(k.Roles), PoolId: poolIDToWire(p.Identity().Pool)})
			kk := key{k.Namespace, m.BaseModel}
			if declared[kk] == nil {
				declared[kk] = map[kvrelaypb.WorkerRole]int{}
			}
			for _, r := range rolesToWire(k.Roles) {
				declared[kk][r]++
				if r == kvrelaypb.WorkerRole_WORKER_ROLE_LEGACY {
					e.LegacyFallbackActive = true
				}
			}
		}
	}
	u := &kvrelaypb.ServingReadinessUpdate{Revision: rev}
	for _, k := range order {
		e := entries[k]
		if len(e.Members) == 0 {
			continue // only LoRA registrations of a base model no pool registers: no member to report
		}
		for _, r := range []kvrelaypb.WorkerRole{kvrelaypb.WorkerRole_WORKER_ROLE_PREFILL, kvrelaypb.WorkerRole_WORKER_ROLE_DECODE} {
			if declared[k][r] > 1 {
				e.DuplicateRoleEndpoints = append(e.DuplicateRoleEndpoints, r)
			}
		}
		u.Entries = append(u.Entries, e)
	}
	kvrelay.StampResponse(u, g.id)
	return u
}

// SubscribeServingReadiness streams the readiness snapshot (see readiness)
// and repeats it every heartbeat interval; a new revision follows a change
// of the catalog's pools.
func (g *Server) SubscribeServingReadiness(req *kvrelaypb.SubscribeServingReadinessRequest, stream grpc.ServerStreamingServer[kvrelaypb.ServingReadinessUpdate]) error {
	ctx := stream.Context()
	release, err := g.admit(ctx, req, g.readinessSlots, "readiness")
	if err != nil {
		return err
	}
	defer release()
	_, rev := g.catalog.latest()
	every := time.Duration(g.cfg.HeartbeatInterval)
	for {
		if err := stream.Send(g.readiness(rev)); err != nil {
			return err
		}
		wctx, cancel := context.WithTimeout(ctx, every)
		_, at, err := g.catalog.next(wctx, rev, true)
		cancel()
		switch {
		case err == nil:
			rev = at
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.Is(err, context.DeadlineExceeded): // the heartbeat: the same revision again
		default:
			return feedEnd(ctx, err, "readiness")
		}
	}
}
