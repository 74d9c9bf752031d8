package server

import (
	"context"
	"crypto/tls"
	"net"
	"time"
)

// connKey carries a request's connection in its context (http.Server's
// ConnContext), so a stream can ask the kernel about its socket.
type connKey struct{}

func withConn(ctx context.Context, c net.Conn) context.Context {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	return context.WithValue(ctx, connKey{}, c)
}

// sendProgress is what the kernel says about a stream socket's send side:
// bytes the peer acknowledged so far, and bytes written but not yet
// acknowledged or not yet sent (held back by the peer's closed window).
type sendProgress struct {
	acked   uint64
	pending uint64
}

// stallDetector tells a subscriber that stopped reading (SIGSTOPped, hung)
// from a slow one, for a stream whose heartbeats would otherwise fit in the
// socket buffers for hours: it is stalled when bytes have been pending the
// whole of timeout while the peer acknowledged nothing. A peer's kernel
// acknowledges what it buffers even when its process is stopped, so this
// fires only once the peer's receive window has closed; see
// docs/RATIONALE.md "Why does a stopped subscriber take a while to be dropped?".
// Where the kernel cannot tell (not Linux, not TCP), it never fires and the
// stream write timeout remains the bound.
type stallDetector struct {
	probe   func() (sendProgress, bool)
	timeout time.Duration
	acked   uint64
	since   time.Time // when bytes were first seen pending without progress; zero if not
}

func newStallDetector(ctx context.Context, timeout time.Duration) *stallDetector {
	d := &stallDetector{timeout: timeout}
	if c, ok := ctx.Value(connKey{}).(net.Conn); ok {
		d.probe = tcpProbe(c)
	}
	return d
}

// stalled samples the socket at now and reports whether the peer has made
// no progress for the whole timeout with bytes pending.
func (d *stallDetector) stalled(now time.Time) bool {
	if d.probe == nil {
		return false
	}
	p, ok := d.probe()
	if !ok {
		return false
	}
	if p.pending == 0 || p.acked != d.acked {
		d.acked, d.since = p.acked, time.Time{}
		return false
	}
	if d.since.IsZero() {
		d.since = now
		return false
	}
	return now.Sub(d.since) >= d.timeout
}
