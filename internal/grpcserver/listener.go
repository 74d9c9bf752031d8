package grpcserver

import (
	"net"
	"sync"
	"sync/atomic"
)

// boundedListener holds at most cap(slots) accepted connections open. One
// beyond that is closed at once instead of waiting for a slot: Accept never
// blocks on a full listener, so grpc-go keeps accepting (and closing) while
// the open connections finish their handshakes or idle out
// (GRPCConfig.HandshakeTimeout, IdleTimeout).
type boundedListener struct {
	net.Listener
	slots   chan struct{}
	refused *atomic.Uint64
}

func (l *boundedListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		select {
		case l.slots <- struct{}{}:
			return &slotConn{Conn: c, release: func() { <-l.slots }}, nil
		default:
			l.refused.Add(1)
			_ = c.Close()
		}
	}
}

// slotConn gives its slot back on the first Close.
type slotConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *slotConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// RefusedConnections is how many connections the listener closed at once
// because max_connections were open.
func (g *Server) RefusedConnections() uint64 { return g.refusedConns.Load() }
