package server

import (
	"container/list"
	"crypto/tls"
	"net"
	"net/http"
	"sync"
	"syscall"
)

// boundedListener holds at most n connections at a time, and keeps an idle
// connection from costing a busy client its turn:
//
//   - At the bound, a new connection closes the longest-idle one (a
//     keep-alive connection between requests, or one that has not sent its
//     first request yet) and takes its place, so 4,096 idle connections
//     cannot keep /healthz or an authenticated client out. Only when every
//     connection is busy (streams, requests in progress) does the new one
//     wait, in the kernel's listen backlog behind the one Accept holds.
//   - One client address keeps at most maxIdlePerClient idle connections;
//     past it, its own longest-idle one is closed.
//
// Idleness comes from http.Server.ConnState (connState). It is
// golang.org/x/net/netutil.LimitListener's contract plus eviction, written
// here because that wrapper hides the socket, and a stream needs the
// socket's TCP_INFO to tell a stopped subscriber (see stall.go).
type boundedListener struct {
	net.Listener
	slots            chan struct{}
	done             chan struct{}
	closeOnce        sync.Once
	maxIdlePerClient int

	mu     sync.Mutex
	idle   list.List             // of *boundedConn, longest idle first
	byAddr map[string]*list.List // per client address, the same
	wake   chan struct{}         // a connection turned idle
}

func newBoundedListener(ln net.Listener, n, maxIdlePerClient int) *boundedListener {
	return &boundedListener{Listener: ln, slots: make(chan struct{}, n), done: make(chan struct{}),
		maxIdlePerClient: maxIdlePerClient, byAddr: map[string]*list.List{}, wake: make(chan struct{}, 1)}
}

func (l *boundedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	for {
		select {
		case l.slots <- struct{}{}:
			return l.track(c), nil
		default:
		}
		if victim := l.oldestIdle(""); victim != nil {
			_ = victim.Close() // frees its slot
			continue
		}
		select {
		case l.slots <- struct{}{}:
			return l.track(c), nil
		case <-l.wake:
		case <-l.done:
			_ = c.Close()
			return nil, net.ErrClosed
		}
	}
}

func (l *boundedListener) track(c net.Conn) *boundedConn {
	host, _, err := net.SplitHostPort(c.RemoteAddr().String())
	if err != nil {
		host = c.RemoteAddr().String()
	}
	bc := &boundedConn{Conn: c, l: l, addr: host}
	// A connection is idle until its first request arrives: one that never
	// sends one is the first to go under pressure.
	l.setIdle(bc, true)
	return bc
}

// idleLen returns how many connections are idle.
func (l *boundedListener) idleLen() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.idle.Len()
}

func (l *boundedListener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// oldestIdle unlinks and returns the longest-idle connection (of addr, when
// set), nil when there is none.
func (l *boundedListener) oldestIdle(addr string) *boundedConn {
	l.mu.Lock()
	defer l.mu.Unlock()
	var e *list.Element
	if addr == "" {
		e = l.idle.Front()
	} else if al := l.byAddr[addr]; al != nil {
		if f := al.Front(); f != nil {
			e = f.Value.(*list.Element)
		}
	}
	if e == nil {
		return nil
	}
	c := e.Value.(*boundedConn)
	l.unlinkLocked(c)
	return c
}

// setIdle records c's idleness; a connection turning idle may push its
// address past maxIdlePerClient and close that address's longest-idle one.
func (l *boundedListener) setIdle(c *boundedConn, idle bool) {
	var victim *boundedConn
	l.mu.Lock()
	switch {
	case idle && c.elem == nil && !c.closed:
		c.elem = l.idle.PushBack(c)
		al := l.byAddr[c.addr]
		if al == nil {
			al = &list.List{}
			l.byAddr[c.addr] = al
		}
		c.addrElem = al.PushBack(c.elem)
		if al.Len() > l.maxIdlePerClient {
			victim = al.Front().Value.(*list.Element).Value.(*boundedConn)
			l.unlinkLocked(victim)
		}
		select {
		case l.wake <- struct{}{}:
		default:
		}
	case !idle:
		l.unlinkLocked(c)
	}
	l.mu.Unlock()
	if victim != nil {
		_ = victim.Close()
	}
}

func (l *boundedListener) unlinkLocked(c *boundedConn) {
	if c.elem == nil {
		return
	}
	l.idle.Remove(c.elem)
	al := l.byAddr[c.addr]
	al.Remove(c.addrElem)
	if al.Len() == 0 {
		delete(l.byAddr, c.addr)
	}
	c.elem, c.addrElem = nil, nil
}

// connState is the http.Server's ConnState hook: it tells the listener
// which connections are idle.
func (l *boundedListener) connState(nc net.Conn, st http.ConnState) {
	if tc, ok := nc.(*tls.Conn); ok {
		nc = tc.NetConn()
	}
	c, ok := nc.(*boundedConn)
	if !ok {
		return
	}
	switch st {
	case http.StateIdle:
		l.setIdle(c, true)
	case http.StateActive, http.StateHijacked, http.StateClosed:
		l.setIdle(c, false)
	}
}

// boundedConn frees its slot on its first Close.
type boundedConn struct {
	net.Conn
	l              *boundedListener
	addr           string
	once           sync.Once
	closed         bool          // under l.mu
	elem, addrElem *list.Element // in l.idle and l.byAddr[addr] while idle; under l.mu
}

func (c *boundedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.l.mu.Lock()
		c.closed = true
		c.l.unlinkLocked(c)
		c.l.mu.Unlock()
		<-c.l.slots
	})
	return err
}

// SyscallConn exposes the socket underneath (for TCP_INFO).
func (c *boundedConn) SyscallConn() (syscall.RawConn, error) {
	sc, ok := c.Conn.(syscall.Conn)
	if !ok {
		return nil, errNoSocket
	}
	return sc.SyscallConn()
}
