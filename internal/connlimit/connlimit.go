// Package connlimit bounds a listener's open connections so that idle
// connections cannot lock busy clients out. The relay's HTTP listener
// (internal/server), its gRPC listener (internal/grpcserver) and a bound ZMQ
// source's transport (internal/source/zmq) share it; each tells the listener
// which of its connections are idle, from what its protocol knows
// (http.Server's ConnState; the gRPC adapter's admitted calls; a ZMQ peer's
// first whole message).
//
//   - At the bound, a new connection closes the longest-idle one (idle: it
//     carries no request or call in progress, or has not sent its first one
//     yet) and takes its place, so thousands of idle connections cannot keep
//     a health check or an authenticated client out. Only when every
//     connection is busy does the new one wait in the kernel's listen
//     backlog behind the one Accept holds ([Config.RefuseWhenBusy] closes it
//     at once instead).
//   - One client address keeps at most [Config.MaxIdlePerClient] idle
//     connections; past it, its own longest-idle one is closed. With
//     [Config.MaxPerClient] it holds at most that many in all.
//   - With [Config.BusyWithin], a connection that has not turned busy that
//     long after it was accepted is closed: a peer must start real work soon
//     after connecting.
//
// It is golang.org/x/net/netutil.LimitListener's contract plus eviction,
// written here because that wrapper hides the socket, and a stream needs the
// socket's TCP_INFO to tell a stopped subscriber ([Conn.SyscallConn]).
// A Listener is safe for concurrent use.
package connlimit

import (
	"container/list"
	"errors"
	"net"
	"sync"
	"syscall"
	"time"
)

// ErrNoSocket: the connection underneath has no socket ([Conn.SyscallConn]).
var ErrNoSocket = errors.New("connlimit: connection has no socket")

// Config is a Listener's bounds.
type Config struct {
	// MaxConns is how many connections may be open at once (≥ 1).
	MaxConns int
	// MaxIdlePerClient is how many idle connections one client address may
	// keep (≥ 1).
	MaxIdlePerClient int
	// MaxPerClient, when > 0, is how many connections (busy or idle) one
	// client address may hold: a new one past it closes that address's
	// longest-idle connection, or, when all of them are busy, is itself
	// closed (counted by OnRefused). Zero: no such bound.
	MaxPerClient int
	// RefuseWhenBusy closes a new connection at once when MaxConns are open
	// and none is idle, instead of waiting for one to close; OnRefused (if
	// set) is called for each.
	RefuseWhenBusy bool
	OnRefused      func()
	// OnEvicted, when set, is called for each idle connection the Listener
	// closes to make room (for a newcomer, or past MaxIdlePerClient).
	OnEvicted func()
	// BusyWithin closes a connection that has not turned busy this long
	// after it was accepted. Zero: no such deadline.
	BusyWithin time.Duration
}

// Listener is a net.Listener holding at most Config.MaxConns connections
// (see the package doc). Create it with [New].
type Listener struct {
	net.Listener
	cfg       Config
	slots     chan struct{}
	done      chan struct{}
	closeOnce sync.Once

	mu     sync.Mutex
	idle   list.List             // of *Conn, longest idle first
	byAddr map[string]*list.List // per client address, the same (of *list.Element in idle)
	conns  map[string]*Conn      // open connections by connKey
	open   map[string]int        // open connections per client address
	wake   chan struct{}         // a connection turned idle
}

// New wraps ln.
func New(ln net.Listener, cfg Config) *Listener {
	return &Listener{Listener: ln, cfg: cfg, slots: make(chan struct{}, cfg.MaxConns), done: make(chan struct{}),
		byAddr: map[string]*list.List{}, conns: map[string]*Conn{}, open: map[string]int{}, wake: make(chan struct{}, 1)}
}

// Accept returns the next connection, once a slot is free: at the bound it
// closes the longest-idle connection to make room, and when none is idle it
// waits for one (or refuses the new connection, with RefuseWhenBusy).
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if tracked, ok := l.admit(c); ok {
			return tracked, nil
		}
		if l.closed() {
			return nil, net.ErrClosed
		}
	}
}

// admit finds c a slot; false when c was closed instead.
func (l *Listener) admit(c net.Conn) (*Conn, bool) {
	if l.cfg.MaxPerClient > 0 {
		host := hostOf(c)
		for l.openOf(host) >= l.cfg.MaxPerClient {
			victim := l.oldestIdle(host)
			if victim == nil {
				l.refuse(c)
				return nil, false
			}
			l.evict(victim)
		}
	}
	for {
		select {
		case l.slots <- struct{}{}:
			return l.track(c), true
		default:
		}
		if victim := l.oldestIdle(""); victim != nil {
			l.evict(victim) // frees its slot
			continue
		}
		if l.cfg.RefuseWhenBusy {
			l.refuse(c)
			return nil, false
		}
		select {
		case l.slots <- struct{}{}:
			return l.track(c), true
		case <-l.wake:
		case <-l.done:
			_ = c.Close()
			return nil, false
		}
	}
}

// refuse counts c as refused, then closes it: by the time the peer sees the
// close, the count includes it.
func (l *Listener) refuse(c net.Conn) {
	if l.cfg.OnRefused != nil {
		l.cfg.OnRefused()
	}
	_ = c.Close()
}

func (l *Listener) closed() bool {
	select {
	case <-l.done:
		return true
	default:
		return false
	}
}

func connKey(remote, local net.Addr) string {
	if remote == nil || local == nil {
		return ""
	}
	return remote.String() + " " + local.String()
}

// hostOf returns c's client address without the port.
func hostOf(c net.Conn) string { return Client(c.RemoteAddr().String()) }

// Client returns the client address that per-client bounds count by: the
// host of remote ("host:port", as net.Addr.String and
// http.Request.RemoteAddr give it), or remote itself when it has no port.
func Client(remote string) string {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		return remote
	}
	return host
}

func (l *Listener) openOf(host string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.open[host]
}

func (l *Listener) track(c net.Conn) *Conn {
	tc := &Conn{Conn: c, l: l, addr: hostOf(c), key: connKey(c.RemoteAddr(), c.LocalAddr())}
	l.mu.Lock()
	l.conns[tc.key] = tc
	l.open[tc.addr]++
	l.mu.Unlock()
	if l.cfg.BusyWithin > 0 {
		tc.deadline = time.AfterFunc(l.cfg.BusyWithin, func() {
			l.mu.Lock()
			late := !tc.everBusy
			l.mu.Unlock()
			if late {
				_ = tc.Close()
			}
		})
	}
	// A connection is idle until its first request arrives: one that never
	// sends one is the first to go under pressure.
	l.SetIdle(tc, true)
	return tc
}

// Lookup returns the open connection with these addresses (a connection's
// RemoteAddr and LocalAddr), nil if there is none. Protocol layers that see
// only the addresses (gRPC's peer information) find their connection with it.
func (l *Listener) Lookup(remote, local net.Addr) *Conn {
	k := connKey(remote, local)
	if k == "" {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.conns[k]
}

// Open returns how many connections are open.
func (l *Listener) Open() int { return len(l.slots) }

// IdleLen returns how many connections are idle.
func (l *Listener) IdleLen() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.idle.Len()
}

// Close stops accepting; open connections stay open.
func (l *Listener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// oldestIdle unlinks and returns the longest-idle connection (of addr, when
// set), nil when there is none.
func (l *Listener) oldestIdle(addr string) *Conn {
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
	c := e.Value.(*Conn)
	l.unlinkLocked(c)
	return c
}

// SetIdle records whether c is idle; a connection turning idle may push its
// address past MaxIdlePerClient and close that address's longest-idle one.
// A connection that turns busy once is safe from BusyWithin.
func (l *Listener) SetIdle(c *Conn, idle bool) {
	var victim *Conn
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
		if al.Len() > l.cfg.MaxIdlePerClient {
			victim = al.Front().Value.(*list.Element).Value.(*Conn)
			l.unlinkLocked(victim)
		}
		select {
		case l.wake <- struct{}{}:
		default:
		}
	case !idle:
		c.everBusy = true
		l.unlinkLocked(c)
	}
	l.mu.Unlock()
	if victim != nil {
		l.evict(victim)
	}
}

// evict closes an idle connection to make room.
func (l *Listener) evict(victim *Conn) {
	_ = victim.Close()
	if l.cfg.OnEvicted != nil {
		l.cfg.OnEvicted()
	}
}

func (l *Listener) unlinkLocked(c *Conn) {
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

// Conn is a connection of a Listener; it frees its slot on its first Close.
type Conn struct {
	net.Conn
	l        *Listener
	addr     string // the client's host
	key      string // connKey
	once     sync.Once
	deadline *time.Timer // BusyWithin; nil without

	// Under l.mu.
	closed, everBusy bool
	elem, addrElem   *list.Element // in l.idle and l.byAddr[addr] while idle
}

// Close closes the connection and frees its slot.
func (c *Conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		if c.deadline != nil {
			c.deadline.Stop()
		}
		c.l.mu.Lock()
		c.closed = true
		c.l.unlinkLocked(c)
		if c.l.conns[c.key] == c {
			delete(c.l.conns, c.key)
		}
		if c.l.open[c.addr]--; c.l.open[c.addr] <= 0 {
			delete(c.l.open, c.addr)
		}
		c.l.mu.Unlock()
		<-c.l.slots
	})
	return err
}

// SyscallConn exposes the socket underneath (for TCP_INFO).
func (c *Conn) SyscallConn() (syscall.RawConn, error) {
	sc, ok := c.Conn.(syscall.Conn)
	if !ok {
		return nil, ErrNoSocket
	}
	return sc.SyscallConn()
}
