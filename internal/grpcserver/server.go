// Package grpcserver serves NVIDIA Dynamo's dynamo.kvrelay.v1.KvEventRelay
// gRPC contract from a running relay (internal/server): the relay identity,
// a revisioned pool catalog, each pool's filter as CBI1 snapshot chunks,
// deltas and heartbeats, complete pool-load windows, and what the relay
// knows of serving readiness and serving load (docs/deploy.md, docs/wire.md
// §8).
//
// The adapter keeps no mirror of its own: a filter stream is a subscription
// to the pool's hub, the same fan-out of the pool's one publisher lease that
// HTTP streams read, re-encoded as CBI1 (docs/RATIONALE.md "Why does the gRPC
// adapter subscribe to the HTTP stream's hub?").
//
// Source: Dynamo's lib/llm/src/kv_dc_relay/docs/grpc-contract.md and
// wan/grpc/protocol/relay.proto @d95e45a5, wan/grpc/protocol/README.md
// @7216a153 (facts only).
package grpcserver

import (
	"context"
	"crypto/subtle"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/zeebo/xxh3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/ckfrelay/ckfrelay/internal/server"
	"github.com/ckfrelay/ckfrelay/wire/cbi1"
	"github.com/ckfrelay/ckfrelay/wire/kvrelay"
	"github.com/ckfrelay/ckfrelay/wire/kvrelay/kvrelaypb"
)

// consumerBase is the top of the consumer instances the adapter's hub
// subscriptions use ("KVR1" in the high 32 bits, a per-stream counter
// below), so they never take over an HTTP consumer's lane in practice.
const consumerBase uint64 = uint64(kvrelay.ContractMarker) << 32

// loadHistory is how many windows (and catalog revisions) the adapter
// keeps for subscribers: a window stream that falls more than this many
// windows behind is closed SUBSCRIBER_LAGGED.
const loadHistory = 8

// Server is the KvEventRelay service of one relay. Create it with [New],
// run it with [Server.Serve], stop it with [Server.Shutdown] after the
// relay's own Shutdown (which ends every filter stream with the pools).
type Server struct {
	kvrelaypb.UnimplementedKvEventRelayServer

	relay *server.Server
	cfg   server.Config
	log   *slog.Logger
	id    *kvrelaypb.RelayIdentity
	grpc  *grpc.Server

	// Stream limits, one per streaming RPC.
	catalogSlots, poolSlots, readinessSlots, loadSlots, servingSlots chan struct{}
	consumers                                                        atomic.Uint64
	connSlots                                                        chan struct{} // one per open connection (listener.go)
	refusedConns                                                     atomic.Uint64 // connections closed at max_connections

	catalog *feed[*kvrelaypb.KvPoolCatalogUpdate]
	load    *feed[*kvrelaypb.KvPoolLoadUpdate]
	serving *feed[*kvrelaypb.ServingLoadUpdate]

	// maxDeltaImages is cbi1.MaxDeltaImages; tests lower it.
	maxDeltaImages int

	stop     chan struct{}
	stopOnce sync.Once
	loopDone chan struct{}
}

// New builds the service for relay (its configuration's GRPC section,
// TLS and bearer token) and starts the loop that publishes catalog
// revisions and load windows.
func New(relay *server.Server, log *slog.Logger) (*Server, error) {
	cfg := relay.Config()
	if log == nil {
		log = slog.Default()
	}
	instance := cfg.GRPC.InstanceID
	if instance == 0 {
		host, _ := os.Hostname()
		instance = xxh3.HashString(host + "|" + cfg.GRPC.Listen)
	}
	g := &Server{relay: relay, cfg: cfg, log: log,
		id:           &kvrelaypb.RelayIdentity{DrtInstanceId: instance, RelayIncarnation: relay.Incarnation()},
		catalogSlots: make(chan struct{}, cfg.GRPC.MaxStreams), poolSlots: make(chan struct{}, cfg.GRPC.MaxStreams),
		readinessSlots: make(chan struct{}, cfg.GRPC.MaxStreams), loadSlots: make(chan struct{}, cfg.GRPC.MaxStreams),
		servingSlots: make(chan struct{}, cfg.GRPC.MaxStreams), connSlots: make(chan struct{}, cfg.GRPC.MaxConnections),
		catalog: newFeed[*kvrelaypb.KvPoolCatalogUpdate](loadHistory), load: newFeed[*kvrelaypb.KvPoolLoadUpdate](loadHistory),
		serving:        newFeed[*kvrelaypb.ServingLoadUpdate](loadHistory),
		maxDeltaImages: cbi1.MaxDeltaImages, stop: make(chan struct{}), loopDone: make(chan struct{})}
	opts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(kvrelay.MaxMessageBytes), grpc.MaxSendMsgSize(kvrelay.MaxMessageBytes),
		// Find dead transports, so a vanished subscriber frees its slot.
		// and close connections that finish no handshake, or carry no RPC.
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second,
			MaxConnectionIdle: time.Duration(cfg.GRPC.IdleTimeout)}),
		grpc.ConnectionTimeout(time.Duration(cfg.GRPC.HandshakeTimeout)),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
	}
	if cfg.TLSCertFile != "" {
		cert, err := tls.LoadX509KeyPair(cfg.TLSCertFile, cfg.TLSKeyFile)
		if err != nil {
			return nil, fmt.Errorf("grpcserver: tls: %w", err)
		}
		opts = append(opts, grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})))
	}
	if cfg.AuthToken != "" {
		want := []byte(cfg.AuthToken)
		opts = append(opts,
			grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
				if err := checkToken(ctx, want); err != nil {
					return nil, err
				}
				return h(ctx, req)
			}),
			grpc.StreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
				if err := checkToken(ss.Context(), want); err != nil {
					return err
				}
				return h(srv, ss)
			}))
	}
	if err := relay.RegisterMetrics(
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "ckfrelay_grpc_connections_refused_total",
			Help: "gRPC connections closed at once because grpc.max_connections were open."},
			func() float64 { return float64(g.refusedConns.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ckfrelay_grpc_connections_open",
			Help: "Open connections of the gRPC listener."},
			func() float64 { return float64(len(g.connSlots)) })); err != nil {
		return nil, fmt.Errorf("grpcserver: metrics: %w", err)
	}
	g.grpc = grpc.NewServer(opts...)
	kvrelaypb.RegisterKvEventRelayServer(g.grpc, g)
	g.publishCatalog()
	g.publishLoad(context.Background())
	go g.loop()
	return g, nil
}

// checkToken requires "authorization: Bearer <token>" (scheme
// case-insensitive, token compared in constant time). A failure is
// UNAUTHENTICATED without a reason trailer: the contract leaves
// authentication to a proxy, and clients act on the status code.
func checkToken(ctx context.Context, want []byte) error {
	md, _ := metadata.FromIncomingContext(ctx)
	for _, v := range md.Get("authorization") {
		scheme, tok, ok := strings.Cut(v, " ")
		if ok && strings.EqualFold(scheme, "Bearer") && subtle.ConstantTimeCompare([]byte(strings.TrimLeft(tok, " ")), want) == 1 {
			return nil
		}
	}
	return status.Error(codes.Unauthenticated, "missing or wrong bearer token")
}

// Serve accepts connections on ln until Shutdown.
func (g *Server) Serve(ln net.Listener) error {
	err := g.grpc.Serve(&boundedListener{Listener: ln, slots: g.connSlots, refused: &g.refusedConns})
	if errors.Is(err, grpc.ErrServerStopped) {
		return nil
	}
	return err
}

// Shutdown ends the catalog, readiness and load streams with
// PUBLICATION_UNAVAILABLE, then stops the server gracefully within ctx
// (filter streams end with their pools, in the relay's Shutdown).
func (g *Server) Shutdown(ctx context.Context) error {
	g.stopOnce.Do(func() { close(g.stop) })
	<-g.loopDone
	done := make(chan struct{})
	go func() { g.grpc.GracefulStop(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		g.grpc.Stop()
		<-done
		return ctx.Err()
	}
}

// loop publishes catalog revisions and load windows every load interval.
func (g *Server) loop() {
	defer close(g.loopDone)
	t := time.NewTicker(time.Duration(g.cfg.GRPC.LoadInterval))
	defer t.Stop()
	for {
		select {
		case <-g.stop:
			g.catalog.close()
			g.load.close()
			g.serving.close()
			return
		case <-t.C:
			g.publishCatalog()
			ctx, cancel := context.WithTimeout(context.Background(), time.Duration(g.cfg.GRPC.LoadInterval))
			g.publishLoad(ctx)
			cancel()
		}
	}
}

// admit checks a streaming request's envelope and subscriber_id, and takes a
// slot of the RPC's stream limit; release gives it back.
func (g *Server) admit(ctx context.Context, req interface {
	kvrelay.Request
	GetSubscriberId() string
}, slots chan struct{}, what string) (release func(), err error) {
	if err := kvrelay.CheckRequest(req); err != nil {
		return nil, kvrelay.Fail(ctx, kvrelaypb.RelayErrorReason_RELAY_ERROR_REASON_CONTRACT_MISMATCH, "%v", err)
	}
	if err := kvrelay.CheckSubscriberID(req.GetSubscriberId()); err != nil {
		return nil, kvrelay.Fail(ctx, kvrelaypb.RelayErrorReason_RELAY_ERROR_REASON_INVALID_REQUEST, "%v", err)
	}
	select {
	case slots <- struct{}{}:
		return func() { <-slots }, nil
	default:
		return nil, kvrelay.Fail(ctx, kvrelaypb.RelayErrorReason_RELAY_ERROR_REASON_RESOURCE_LIMIT,
			"relay %s stream limit %d reached", what, cap(slots))
	}
}

// GetRelayInfo answers the protocol version and the relay's identity.
func (g *Server) GetRelayInfo(ctx context.Context, req *kvrelaypb.RelayInfoRequest) (*kvrelaypb.RelayInfo, error) {
	if err := kvrelay.CheckRequest(req); err != nil {
		return nil, kvrelay.Fail(ctx, kvrelaypb.RelayErrorReason_RELAY_ERROR_REASON_CONTRACT_MISMATCH, "%v", err)
	}
	info := &kvrelaypb.RelayInfo{}
	kvrelay.StampResponse(info, g.id)
	return info, nil
}

// unavailable is the end of a catalog, readiness or load stream at shutdown.
func unavailable(ctx context.Context, what string) error {
	return kvrelay.Fail(ctx, kvrelaypb.RelayErrorReason_RELAY_ERROR_REASON_PUBLICATION_UNAVAILABLE, "relay shutting down: %s publication stopped", what)
}
