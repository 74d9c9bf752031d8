package natstest

import (
	"io"
	"net"
	"sync"
	"testing"
)

// PausableProxy forwards TCP connections to a target (a NATS server, or any
// TCP server such as a relay); while paused it holds every byte in both
// directions without closing anything — to the client, a peer that died
// without a FIN (a machine lost, a partition) until its pings time out —
// and Cut closes every connection, as a peer that reset them.
type PausableProxy struct {
	ln     net.Listener
	mu     sync.Mutex
	cond   *sync.Cond
	paused bool
	openMu sync.Mutex
	open   []net.Conn // both ends of each connection since the last Cut
}

// StartPausableProxy listens on a loopback port and forwards each connection
// to target until the test ends.
func StartPausableProxy(t testing.TB, target string) *PausableProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("natstest: proxy: %v", err)
	}
	p := &PausableProxy{ln: ln}
	p.cond = sync.NewCond(&p.mu)
	var conns sync.WaitGroup
	t.Cleanup(func() {
		p.SetPaused(false)
		_ = ln.Close()
		conns.Wait()
	})
	t.Cleanup(func() { p.Cut() }) // runs first: the pipes then end
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			p.openMu.Lock()
			p.open = append(p.open, c, u)
			p.openMu.Unlock()
			conns.Add(2)
			go func() { defer conns.Done(); p.pipe(u, c) }()
			go func() { defer conns.Done(); p.pipe(c, u) }()
		}
	}()
	return p
}

// Addr is the proxy's host:port.
func (p *PausableProxy) Addr() string { return p.ln.Addr().String() }

// URL is the proxy's NATS URL.
func (p *PausableProxy) URL() string { return "nats://" + p.Addr() }

// Cut closes every connection the proxy opened since the last Cut and
// returns how many there were; new connections are still accepted.
func (p *PausableProxy) Cut() int {
	p.openMu.Lock()
	defer p.openMu.Unlock()
	for _, c := range p.open {
		_ = c.Close()
	}
	n := len(p.open) / 2
	p.open = nil
	return n
}

// SetPaused holds (true) or releases (false) every byte in both directions.
func (p *PausableProxy) SetPaused(v bool) {
	p.mu.Lock()
	p.paused = v
	p.cond.Broadcast()
	p.mu.Unlock()
}

// pipe copies src to dst, holding what it read while paused.
func (p *PausableProxy) pipe(dst, src net.Conn) {
	defer dst.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			for p.paused {
				p.cond.Wait()
			}
			p.mu.Unlock()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if err != io.EOF {
				_ = src.Close()
			}
			return
		}
	}
}
