package server

import (
	"net"
	"sync"
	"syscall"
)

// boundedListener accepts at most n connections at a time: Accept waits
// for a slot, so connections beyond the bound wait in the kernel's listen
// backlog instead of costing a goroutine and buffers each. It is
// golang.org/x/net/netutil.LimitListener's contract, written here because
// that wrapper hides the socket, and a stream needs the socket's TCP_INFO to
// tell a stopped subscriber (see stall.go).
type boundedListener struct {
	net.Listener
	slots     chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

func newBoundedListener(ln net.Listener, n int) *boundedListener {
	return &boundedListener{Listener: ln, slots: make(chan struct{}, n), done: make(chan struct{})}
}

func (l *boundedListener) Accept() (net.Conn, error) {
	select {
	case l.slots <- struct{}{}:
	case <-l.done:
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.slots
		return nil, err
	}
	return &boundedConn{Conn: c, release: func() { <-l.slots }}, nil
}

func (l *boundedListener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// boundedConn frees its slot on its first Close.
type boundedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *boundedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
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
