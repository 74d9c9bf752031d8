package grpcserver

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/ckfrelay/ckfrelay/internal/server"
	"github.com/ckfrelay/ckfrelay/wire/kvrelay"
)

// Trailers a standby replica (ha.nats_url) adds to its UNAVAILABLE answer:
// an extension of Dynamo's contract, which its clients ignore (they read
// the status and the error-reason trailer only). LeaderTrailer is the
// leader's gRPC target, LeaderNodeTrailer its node id.
const (
	LeaderTrailer     = "ckfrelay-leader"
	LeaderNodeTrailer = "ckfrelay-leader-node"
)

// notLeader is a standby's answer: UNAVAILABLE with Dynamo's reason
// PUBLICATION_UNAVAILABLE (its client invalidates the stream, refreshes
// the catalog and reconnects with backoff — to the next replica), plus
// where the leader serves when known.
func notLeader(ctx context.Context, hint server.LeaderHint, what string) error {
	var md metadata.MD
	if hint.GRPC != "" {
		md = metadata.Pairs(LeaderTrailer, hint.GRPC)
	}
	if hint.Node != "" {
		md = metadata.Join(md, metadata.Pairs(LeaderNodeTrailer, hint.Node))
	}
	if md != nil {
		_ = grpc.SetTrailer(ctx, md)
	}
	if hint.Node == "" {
		return kvrelay.Fail(ctx, reasonUnavailable, "%s stands by; no leader is known yet", what)
	}
	return kvrelay.Fail(ctx, reasonUnavailable, "%s stands by; its leader %s serves at %s", what, hint.Node, hint.GRPC)
}

// standby answers a request of a relay that leads none of its pools (nil
// when it leads one, or runs without HA).
func (g *Server) standby(ctx context.Context) error {
	hint, ok := g.relay.StandbyLeader()
	if !ok {
		return nil
	}
	return notLeader(ctx, hint, "this relay replica")
}
