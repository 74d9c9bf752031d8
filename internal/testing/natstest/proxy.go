package natstest

import (
	"io"
	"net"
	"sync"
	"testing"
)

// PausableProxy forwards TCP connections to a target; while paused it
// holds every byte in both directions without closing anything — to the
// client, a NATS node that died without a FIN (a machine lost, a
// partition) until its pings time out.
type PausableProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	cond   *sync.Cond
	paused bool
}

// StartPausableProxy listens on a loopback port and forwards each connection
// to target until the test ends.
func StartPausableProxy(t testing.TB, target string) *PausableProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("natstest: proxy: %v", err)
	}
	p := &PausableProxy{ln: ln, target: target}
	p.cond = sync.NewCond(&p.mu)
	var conns sync.WaitGroup
	t.Cleanup(func() {
		p.SetPaused(false)
		_ = ln.Close()
		conns.Wait()
	})
	var open []net.Conn
	var openMu sync.Mutex
	t.Cleanup(func() {
		openMu.Lock()
		defer openMu.Unlock()
		for _, c := range open {
			_ = c.Close()
		}
	})
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
			openMu.Lock()
			open = append(open, c, u)
			openMu.Unlock()
			conns.Add(2)
			go func() { defer conns.Done(); p.pipe(u, c) }()
			go func() { defer conns.Done(); p.pipe(c, u) }()
		}
	}()
	return p
}

// URL is the proxy's NATS URL.
func (p *PausableProxy) URL() string { return "nats://" + p.ln.Addr().String() }

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
