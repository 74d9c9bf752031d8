package demo

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/client"
	"github.com/ckfrelay/ckfrelay/internal/grpcserver"
	"github.com/ckfrelay/ckfrelay/internal/server"
)

// demoRelay is the demo's relay: one pool per data center, dc-0 … dc-N,
// serving HTTP on a loopback port (and, for --transport grpc, Dynamo's
// dynamo.kvrelay.v1 contract on another).
type demoRelay struct {
	srv      *server.Server
	cfg      server.Config // as the server completed it
	base     string        // http://host:port
	expected uint64        // blocks each pool's filter is sized for
	format   ckf.Format    // the pools' filter format, for the router's manifest
	// nats is the router's NATS config when --transport nats broadcasts the
	// pools through an embedded nats-server (nil for HTTP); stopNATS stops it.
	nats     *client.NATSConfig
	stopNATS func()
	// grpc is the relay's gRPC address when --transport grpc serves the
	// pools over dynamo.kvrelay.v1 beside HTTP ("" otherwise); gsrv serves
	// it.
	grpc   string
	gsrv   *grpcserver.Server
	served chan error // gsrv.Serve's result
}

// poolName names data center d's pool.
func poolName(d int) string { return fmt.Sprintf("dc-%d", d) }

// startDemoRelay builds the relay's config (each feed may add to its data
// center's pool spec), starts it on a loopback port and returns it running.
func startDemoRelay(o demoOptions, feeds []dcFeed) (*demoRelay, error) {
	expected := uint64(o.workers * o.ranks * o.blocksPerRank)
	cfg := server.Config{Listen: "127.0.0.1:0", HeartbeatInterval: server.Duration(200 * time.Millisecond)}
	for d := range o.dataCenters {
		spec := server.PoolSpec{Name: poolName(d), DCID: uint64(d + 1), ExpectedBlocks: expected, PublishEveryNEvents: 16}
		feeds[d].Configure(d, &spec)
		cfg.Pools = append(cfg.Pools, spec)
	}
	natsCfg, natsURL, stopNATS, err := demoNATS(o.transport)
	if err != nil {
		return nil, err
	}
	cfg.NATS.URL = natsURL
	quiet := slog.New(slog.DiscardHandler)
	srv, err := server.New(cfg, quiet)
	if err != nil {
		stopNATS()
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		stopNATS()
		return nil, err
	}
	go func() { _ = srv.Serve(ln) }()
	r := &demoRelay{srv: srv, cfg: srv.Config(), base: "http://" + ln.Addr().String(), expected: expected,
		nats: natsCfg, stopNATS: stopNATS}
	if o.transport == "grpc" {
		if err := r.serveGRPC(quiet); err != nil {
			r.close()
			return nil, err
		}
	}
	r.format, _ = ckf.Config{ExpectedBlocks: expected, Seed: ckf.DefaultSeed, MaxKicks: ckf.DefaultMaxKicks,
		VerificationWindow: ckf.DefaultVerificationWindow, PublishEveryNEvents: 1}.Format()
	return r, nil
}

// serveGRPC serves the relay's pools over gRPC on a loopback port, as
// `relay serve --grpc-listen` does: the same pools, hubs and publisher
// leases as the HTTP streams.
func (r *demoRelay) serveGRPC(log *slog.Logger) error {
	g, err := grpcserver.New(r.srv, log)
	if err != nil {
		return fmt.Errorf("demo: grpc: %w", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		_ = g.Shutdown(context.Background())
		return fmt.Errorf("demo: grpc: %w", err)
	}
	r.gsrv, r.grpc, r.served = g, ln.Addr().String(), make(chan error, 1)
	go func() { r.served <- g.Serve(ln) }()
	return nil
}

// close shuts the relay down, waiting at most 5 s for its streams.
func (r *demoRelay) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// The pools first (their HTTP and gRPC filter streams end with the
	// published tail), then the gRPC catalog and load streams.
	_ = r.srv.Shutdown(ctx)
	if r.gsrv != nil {
		_ = r.gsrv.Shutdown(ctx)
		<-r.served
	}
	r.stopNATS()
}
