package server

import (
	"crypto/tls"
	"net"
	"net/http"

	"github.com/ckfrelay/ckfrelay/internal/connlimit"
)

// newBoundedListener holds at most n connections at a time and keeps an idle
// connection from costing a busy client its turn (internal/connlimit: the
// longest-idle connection is closed at the bound, one client address keeps
// at most maxIdlePerClient idle ones; when every connection is busy a new
// one waits in the listen backlog). Idleness comes from http.Server's
// ConnState (connState).
func newBoundedListener(ln net.Listener, n, maxIdlePerClient int) *connlimit.Listener {
	return connlimit.New(ln, connlimit.Config{MaxConns: n, MaxIdlePerClient: maxIdlePerClient})
}

// connState returns the http.Server's ConnState hook that tells l which
// connections are idle.
func connState(l *connlimit.Listener) func(net.Conn, http.ConnState) {
	return func(nc net.Conn, st http.ConnState) {
		if tc, ok := nc.(*tls.Conn); ok {
			nc = tc.NetConn()
		}
		c, ok := nc.(*connlimit.Conn)
		if !ok {
			return
		}
		switch st {
		case http.StateIdle:
			l.SetIdle(c, true)
		case http.StateActive, http.StateHijacked, http.StateClosed:
			l.SetIdle(c, false)
		}
	}
}
