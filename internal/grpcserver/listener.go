package grpcserver

import (
	"net"
	"time"

	"github.com/ckfrelay/ckfrelay/internal/connlimit"
)

// Bounds of what one stream may make the relay buffer (docs/limits.md).
const (
	// maxRequestBytes is the largest request message the relay reads: every
	// request of the contract is under 1 KiB; the rest leaves room for
	// fields a newer contract may add.
	maxRequestBytes = 16 << 10
	// receiveWindowBytes is every stream's and connection's HTTP/2 receive
	// window (grpc-go's minimum).
	receiveWindowBytes = 64 << 10
)

// listen wraps ln in the relay's connection bound (internal/connlimit, the
// HTTP listener's mechanism): at grpc.max_connections the longest-idle
// connection is closed for a new one, and when every connection is busy the
// new one is closed at once (a blocked Accept would let peers holding busy
// connections lock every router out while they last), counted in
// ckfrelay_grpc_connections_refused_total; an address keeps at most
// grpc.max_idle_per_client idle connections and grpc.max_connections_per_client
// in all (its longest-idle one makes room, else the new one is closed); a
// connection with no admitted call grpc.first_request_timeout after it was
// accepted is closed. The gate says which connections are busy.
func (g *Server) listen(ln net.Listener) *connlimit.Listener {
	cl := connlimit.New(ln, connlimit.Config{MaxConns: g.cfg.GRPC.MaxConnections, MaxIdlePerClient: g.cfg.GRPC.MaxIdlePerClient,
		MaxPerClient: g.cfg.GRPC.MaxConnectionsPerClient, RefuseWhenBusy: true, OnRefused: func() { g.refusedConns.Add(1) }, BusyWithin: time.Duration(g.cfg.GRPC.FirstRequestTimeout)})
	g.gate.ln.Store(cl)
	return cl
}

// openConnections returns how many connections the listener holds open.
func (g *Server) openConnections() int {
	if ln := g.gate.ln.Load(); ln != nil {
		return ln.Open()
	}
	return 0
}

// RefusedConnections is how many connections the listener closed at once
// because max_connections were open and busy.
func (g *Server) RefusedConnections() uint64 { return g.refusedConns.Load() }
