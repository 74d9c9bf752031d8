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
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/zeebo/xxh3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"

	"github.com/ckfrelay/ckfrelay/internal/hub"
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
	refusedConns                                                     atomic.Uint64 // connections closed at max_connections (listener.go)
	gate                                                             *gate

	catalog *feed[*kvrelaypb.KvPoolCatalogUpdate]
	load    *feed[*kvrelaypb.KvPoolLoadUpdate]
	serving *feed[*kvrelaypb.ServingLoadUpdate]

	// maxDeltaImages is cbi1.MaxDeltaImages; tests lower it.
	maxDeltaImages int

	// Each hub's shared delta encodings (shared.go), and how many deltas
	// were encoded: one per delta of the hub, whatever the subscribers.
	cachesMu     sync.Mutex
	caches       map[*hub.Hub]*deltaCache
	deltaEncodes atomic.Uint64

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
		servingSlots: make(chan struct{}, cfg.GRPC.MaxStreams),
		catalog:      newFeed[*kvrelaypb.KvPoolCatalogUpdate](loadHistory), load: newFeed[*kvrelaypb.KvPoolLoadUpdate](loadHistory),
		serving:        newFeed[*kvrelaypb.ServingLoadUpdate](loadHistory),
		maxDeltaImages: cbi1.MaxDeltaImages, caches: map[*hub.Hub]*deltaCache{}, stop: make(chan struct{}), loopDone: make(chan struct{})}
	g.gate = newGate(cfg.AuthToken, time.Duration(cfg.GRPC.FirstRequestTimeout), time.Duration(cfg.StreamWriteTimeout), cfg.GRPC.MaxPendingStreams)
	opts := []grpc.ServerOption{
		// Requests of this contract are under 1 KiB: a larger one is refused
		// from its 5-byte message header, before its body is buffered.
		grpc.MaxRecvMsgSize(maxRequestBytes), grpc.MaxSendMsgSize(kvrelay.MaxMessageBytes),
		// Fixed 64 KiB receive windows (grpc-go's minimum; they switch off
		// the BDP estimator, which would widen them to 16 MiB): what a peer
		// can make a stream buffer before its handler reads is bounded. The
		// relay receives only small requests, so nothing is slower.
		grpc.InitialWindowSize(receiveWindowBytes), grpc.InitialConnWindowSize(receiveWindowBytes),
		// SETTINGS_MAX_CONCURRENT_STREAMS: grpc-go refuses a stream beyond it
		// with RST_STREAM(REFUSED_STREAM) before it costs anything.
		grpc.MaxConcurrentStreams(uint32(cfg.GRPC.MaxStreamsPerConnection)),
		// Find dead transports, so a vanished subscriber frees its slot.
		// and close connections that finish no handshake, or carry no RPC.
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second,
			MaxConnectionIdle: time.Duration(cfg.GRPC.IdleTimeout)}),
		grpc.ConnectionTimeout(time.Duration(cfg.GRPC.HandshakeTimeout)),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		// Auth at HEADERS, the first-request deadline and connection
		// idleness (gate.go).
		grpc.InTapHandle(g.gate.tap), grpc.UnaryInterceptor(g.gate.unary), grpc.StreamInterceptor(g.gate.stream),
	}
	if cfg.TLSCertFile != "" {
		cert, err := tls.LoadX509KeyPair(cfg.TLSCertFile, cfg.TLSKeyFile)
		if err != nil {
			return nil, fmt.Errorf("grpcserver: tls: %w", err)
		}
		opts = append(opts, grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})))
	}
	if err := relay.RegisterMetrics(
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "ckfrelay_grpc_connections_refused_total",
			Help: "gRPC connections closed at once because grpc.max_connections were open."},
			func() float64 { return float64(g.refusedConns.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ckfrelay_grpc_connections_open",
			Help: "Open connections of the gRPC listener."},
			func() float64 { return float64(g.openConnections()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "ckfrelay_grpc_streams_cut_total",
			Help: "gRPC streams cancelled before their request arrived (grpc.first_request_timeout, grpc.max_pending_streams, shutdown)."},
			func() float64 { return float64(g.gate.cut.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "ckfrelay_grpc_streams_refused_total",
			Help: "gRPC streams refused at their HEADERS: missing or wrong bearer token, or the relay shutting down."},
			func() float64 { return float64(g.gate.refused.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "ckfrelay_grpc_streams_stalled_total",
			Help: "Admitted gRPC streams ended because one message was not sent within stream_write_timeout (the subscriber stopped reading)."},
			func() float64 { return float64(g.gate.stalled.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ckfrelay_grpc_streams_pending",
			Help: "gRPC streams whose request has not arrived yet."},
			func() float64 { return float64(g.gate.pendingLen()) })); err != nil {
		return nil, fmt.Errorf("grpcserver: metrics: %w", err)
	}
	g.grpc = grpc.NewServer(opts...)
	kvrelaypb.RegisterKvEventRelayServer(g.grpc, g)
	g.publishCatalog()
	g.publishLoad(context.Background())
	go g.loop()
	return g, nil
}

// Serve accepts connections on ln until Shutdown.
func (g *Server) Serve(ln net.Listener) error {
	err := g.grpc.Serve(g.listen(ln))
	if errors.Is(err, grpc.ErrServerStopped) {
		return nil
	}
	return err
}

// Shutdown ends the catalog, readiness and load streams with
// PUBLICATION_UNAVAILABLE, cancels every stream whose request has not
// arrived (never admitted, so nothing is lost), then stops the server
// gracefully within ctx (filter streams end with their pools, in the
// relay's Shutdown). Streams still open when ctx ends (subscribers that
// stopped reading) are cut, with a warning: the gRPC port serves no
// admitted work, so a slow peer is not a failed shutdown and the result is
// nil (docs/deploy.md, "Shutdown").
func (g *Server) Shutdown(ctx context.Context) error {
	g.stopOnce.Do(func() { close(g.stop) })
	<-g.loopDone
	g.gate.stop()
	done := make(chan struct{})
	go func() { g.grpc.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		g.log.Warn("grpc: shutdown grace over: cutting the streams still open (subscribers not reading)", "connections", g.openConnections())
		g.grpc.Stop()
		<-done
	}
	return nil
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
