package serve

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"time"

	"github.com/ckfrelay/ckfrelay/internal/grpcserver"
	"github.com/ckfrelay/ckfrelay/internal/server"
)

// Run is `relay serve`: it parses args (with the environment and the config
// file), prints "listening on ADDR" (and "grpc listening on ADDR") on stdout
// once the listeners are bound, logs JSON on stderr, and serves until ctx is
// done or a server fails.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, level, err := parseConfig(args, stderr)
	if err != nil {
		return err
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: lvl}))
	srv, err := server.New(cfg, log)
	if err != nil {
		return err
	}
	for _, m := range srv.RouterMismatches() {
		log.Warn("pools of one domain cannot share a router: a router asks one request of all of them, so they must agree on block size and hash format",
			"pool", m.Pool, "first", m.First, "differ", m.Fields)
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		_ = srv.Shutdown(context.Background())
		return err
	}
	var gsrv *grpcserver.Server
	var gln net.Listener
	if cfg.GRPC.Listen != "" {
		if gsrv, err = grpcserver.New(srv, log); err == nil {
			gln, err = net.Listen("tcp", cfg.GRPC.Listen)
		}
		if err != nil {
			_ = ln.Close()
			if gsrv != nil {
				_ = gsrv.Shutdown(context.Background())
			}
			_ = srv.Shutdown(context.Background())
			return err
		}
	}
	// The replicas announce where they serve: the listeners are bound now.
	scheme := "http"
	if cfg.TLSCertFile != "" {
		scheme = "https"
	}
	grpcTarget := ""
	if gln != nil {
		grpcTarget = server.DefaultAdvertise("", gln.Addr())
	}
	if err := srv.StartHA(server.DefaultAdvertise(scheme, ln.Addr()), grpcTarget); err != nil {
		_ = ln.Close()
		if gsrv != nil {
			_ = gln.Close()
			_ = gsrv.Shutdown(context.Background())
		}
		_ = srv.Shutdown(context.Background())
		return err
	}
	log.Info("relay serving", "addr", ln.Addr().String(), "pools", len(cfg.Pools), "tls", cfg.TLSCertFile != "",
		"ha", cfg.HA.Enabled(), "node_id", cfg.HA.NodeID)
	fmt.Fprintf(stdout, "listening on %s\n", ln.Addr())
	errc := make(chan error, 2)
	go func() { errc <- srv.Serve(ln) }()
	if gsrv != nil {
		log.Info("relay serving dynamo.kvrelay.v1 over gRPC", "addr", gln.Addr().String())
		fmt.Fprintf(stdout, "grpc listening on %s\n", gln.Addr())
		go func() { errc <- gsrv.Serve(gln) }()
	}
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	log.Info("shutting down: draining pools and closing streams")
	sctx, cancel := context.WithTimeout(context.Background(), time.Duration(cfg.ShutdownGrace))
	defer cancel()
	// The pools first: their filter streams (HTTP and gRPC) end with the
	// published tail; then the gRPC catalog and load streams.
	err = srv.Shutdown(sctx)
	if gsrv != nil {
		if gerr := gsrv.Shutdown(sctx); gerr != nil && err == nil {
			err = gerr
		}
		if gerr := <-errc; gerr != nil && err == nil {
			err = gerr
		}
	}
	if err != nil {
		return err
	}
	return <-errc
}
