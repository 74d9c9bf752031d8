package grpcserver

import (
	"context"
	"time"

	"google.golang.org/grpc"

	"github.com/ckfrelay/ckfrelay/internal/server"
	"github.com/ckfrelay/ckfrelay/wire/kvrelay"
	"github.com/ckfrelay/ckfrelay/wire/kvrelay/kvrelaypb"
)

// ranks returns a pool's observed and expected worker ranks. With engine
// sources, observed is the ranks they hear live and expected the ranks they
// declare (dp_ranks of a ZMQ source, the ranks a Dynamo NATS source has
// heard); without, both are the members holding blocks (HTTP posters are
// not known until they post). The pool's expected_ranks overrides expected.
func ranks(p server.KvPool, members int) (observed, expected uint32) {
	srcs := p.Sources()
	specs := p.Spec().Sources
	if len(srcs) == 0 {
		observed, expected = uint32(members), uint32(members)
	}
	for i, st := range srcs {
		for _, r := range st.Ranks {
			if r.State == "live" {
				observed++
			}
		}
		declared := uint32(len(st.Ranks))
		if i < len(specs) && specs[i].Engine != "dynamo" {
			declared = uint32(max(specs[i].DPRanks, 1))
		}
		expected += declared
	}
	if n := p.Spec().KvRelay.ExpectedRanks; n > 0 {
		expected = n
	}
	return observed, expected
}

// publishLoad publishes one pool-load and one serving-load window.
func (g *Server) publishLoad(ctx context.Context) {
	now := uint64(time.Now().UnixMilli())
	window := uint64(time.Duration(g.cfg.GRPC.LoadInterval).Milliseconds())
	_, seq := g.load.latest()
	lu := &kvrelaypb.KvPoolLoadUpdate{WindowSequence: seq + 1, ObservedMs: now, WindowMs: window}
	su := &kvrelaypb.ServingLoadUpdate{WindowSequence: seq + 1, ObservedMs: now, WindowMs: window}
	type key struct{ ns, model string }
	models := map[key]*kvrelaypb.ModelServingLoad{}
	var order []key
	for _, p := range g.livePools() {
		id := producerToWire(p.Identity())
		st, err := p.Stats(ctx)
		if err != nil {
			g.log.Warn("grpc: pool stats for the load window", "pool", p.Spec().Name, "err", err)
		} else {
			obs, exp := ranks(p, st.Pool.Members)
			lu.Pools = append(lu.Pools, &kvrelaypb.KvPoolLoadEntry{Producer: id, KvUsedBlocks: st.Pool.Contributions,
				TotalKvBlocks: p.Spec().KvRelay.TotalKVBlocks, KvObservedRanks: obs, KvExpectedRanks: exp})
		}
		// The relay hears no router scheduler: every pool, no data.
		su.Pools = append(su.Pools, &kvrelaypb.PoolServingLoad{Producer: id,
			Load:       &kvrelaypb.LoadView{Tokens: &kvrelaypb.TokenLoadStats{}, Status: kvrelaypb.DataStatus_DATA_STATUS_UNAVAILABLE},
			Deployment: &kvrelaypb.PoolDeploymentStatus{}})
		k := p.Spec().KvRelay
		for _, m := range k.Models {
			mk := key{k.Namespace, m.ID}
			ml, ok := models[mk]
			if !ok {
				// Nor any frontend: totals heard are zero, gauges unset.
				zero := uint64(0)
				ml = &kvrelaypb.ModelServingLoad{Namespace: k.Namespace, CanonicalModelId: m.ID,
					Load: &kvrelaypb.LoadView{Requests: &kvrelaypb.RequestLifecycleStats{},
						Tokens: &kvrelaypb.TokenLoadStats{InputTokensTotal: &zero, OutputTokensTotal: &zero},
						Status: kvrelaypb.DataStatus_DATA_STATUS_UNAVAILABLE},
					Deployment: &kvrelaypb.ModelDeploymentStatus{}}
				models[mk] = ml
				order = append(order, mk)
			}
			ml.Deployment.ServingPools = append(ml.Deployment.ServingPools, poolIDToWire(p.Identity().Pool))
		}
	}
	for _, k := range order {
		su.Models = append(su.Models, models[k])
	}
	kvrelay.StampResponse(lu, g.id)
	kvrelay.StampResponse(su, g.id)
	g.load.publish(lu)
	g.serving.publish(su)
}

// windows streams a feed's current window, then every newer one.
func windows[T any](ctx context.Context, f *feed[T], send func(T) error, what string) error {
	w, at := f.latest()
	for {
		if err := send(w); err != nil {
			return err
		}
		var err error
		if w, at, err = f.next(ctx, at, false); err != nil {
			return feedEnd(ctx, err, what)
		}
	}
}

// SubscribeKvPoolLoad streams complete pool-load windows: per live pool,
// kv_used_blocks from the exact state (blocks held summed over ranks),
// total_kv_blocks from the pool's configured capacity (0: unknown), and
// the observed and expected ranks (see ranks).
func (g *Server) SubscribeKvPoolLoad(req *kvrelaypb.SubscribeKvPoolLoadRequest, stream grpc.ServerStreamingServer[kvrelaypb.KvPoolLoadUpdate]) error {
	release, err := g.admit(stream.Context(), req, g.loadSlots, "pool load")
	if err != nil {
		return err
	}
	defer release()
	return windows(stream.Context(), g.load, stream.Send, "pool load")
}

// SubscribeServingLoad streams complete serving-load windows with what the
// relay knows: it hears neither router schedulers nor frontends, so every
// catalog pool and every registered model is present with status
// UNAVAILABLE, gauges unset and zero totals.
func (g *Server) SubscribeServingLoad(req *kvrelaypb.SubscribeServingLoadRequest, stream grpc.ServerStreamingServer[kvrelaypb.ServingLoadUpdate]) error {
	release, err := g.admit(stream.Context(), req, g.servingSlots, "serving load")
	if err != nil {
		return err
	}
	defer release()
	return windows(stream.Context(), g.serving, stream.Send, "serving load")
}
