package server

import (
	"context"

	"github.com/ckfrelay/ckfrelay/ckf"
)

// Hooks for the external test package (server_test), whose fan-out
// benchmark also serves the pools through internal/grpcserver, which
// imports this package.

// AdmitForTest admits ev into pool under source epoch 1, as a pool's
// source does, without the HTTP ingest path.
func (s *Server) AdmitForTest(ctx context.Context, pool string, ev ckf.RouterEvent) error {
	return s.pools[pool].admit(ctx, 1, ev)
}

// FlushForTest publishes what pool admitted so far.
func (s *Server) FlushForTest(ctx context.Context, pool string) error {
	return s.pools[pool].actor().Flush(ctx)
}

// NATSOutBytesForTest is what the relay's NATS connection has sent (0
// without NATS).
func (s *Server) NATSOutBytesForTest() uint64 {
	if s.nats == nil {
		return 0
	}
	return s.nats.nc.Stats().OutBytes
}
