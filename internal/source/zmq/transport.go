package zmq

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/transport"

	"github.com/ckfrelay/ckfrelay/internal/connlimit"
)

// guardedTCP names the source's own TCP transport for go-zeromq/zmq4; the
// source's SUB and replay DEALER sockets use it for tcp:// endpoints. It
// does three things the library's does not (docs/RATIONALE.md, "Why does
// the ZMQ source guard its peers inside its own transport?"):
//
//   - it runs each peer's side of the ZMTP handshake (greeting and READY)
//     itself, under a deadline, off the accept path: zmq4's accept loop
//     handshakes synchronously and without a deadline, so one silent
//     connection would lock every engine out; only connections whose peer
//     has completed its part reach zmq4, whose handshake then reads from
//     memory;
//   - it refuses, before zmq4 allocates, any frame header announcing more
//     than the source's max_message_bytes (zmq4 allocates what a header
//     announces: 2^40 bytes is an out-of-memory crash), and bounds the
//     frames of a message and the peers of a bound socket;
//   - it reads through a buffer: zmq4 reads each frame with io.ReadFull on
//     the bare connection (a 2-byte header, the rest of a long header, then
//     the body), so an engine message costs about seven read system calls,
//     and on the virtual machines measured here a system call is expensive
//     (the kernel's paravirtualised interrupt toggling was 20% of a `perf`
//     profile of BenchmarkIngest; zmq4's reads were 18% of the process's
//     CPU). Reading through a 64 KiB buffer takes one call for as many
//     messages as have arrived ("Why does the ZMQ source read through its
//     own buffered transport?").
//
// A refused peer's connection is closed, and counted through the guard the
// socket's context carries ([withGuard]).
const guardedTCP = "ckfrelay-tcp"

// readBufferSize holds a few typical engine batches (≈ 20–25 KB for 64
// events of 4 blocks); a larger body is read straight into its frame.
const readBufferSize = 64 << 10

func init() {
	if err := zmq4.RegisterTransport(guardedTCP, guardedTransport{transport.New("tcp")}); err != nil {
		panic(err) // only on a duplicate name: a programming error
	}
}

// subEndpoint is the endpoint the source's sockets dial or bind for ep:
// tcp:// endpoints go through guardedTCP; others (ipc, inproc) are kept.
func subEndpoint(ep string) string {
	if rest, ok := strings.CutPrefix(ep, "tcp://"); ok {
		return guardedTCP + "://" + rest
	}
	return ep
}

// peerGuard is what the transport enforces for one socket.
type peerGuard struct {
	own       zmq4.SocketType // the socket's type; the peer's must match it
	limits    frameLimits
	handshake time.Duration // bounds the peer's part of the handshake
	maxPeers  int           // connections of one bound socket, handshaking or open
	perClient int           // of those, from one client address
	// refuse is told of every connection dropped for its peer's fault
	// (nil: not counted).
	refuse func(error)
}

func (g *peerGuard) refused(err error) {
	if g.refuse != nil {
		g.refuse(err)
	}
}

type guardKey struct{}

// withGuard makes the sockets created with ctx enforce g (zmq4 hands the
// socket's context to the transport's Dial and Listen).
func withGuard(ctx context.Context, g peerGuard) context.Context {
	return context.WithValue(ctx, guardKey{}, &g)
}

// guardOf returns ctx's guard, or the defaults for a SUB socket.
func guardOf(ctx context.Context) *peerGuard {
	if g, ok := ctx.Value(guardKey{}).(*peerGuard); ok {
		return g
	}
	return &peerGuard{own: zmq4.Sub, limits: frameLimits{MaxMessage: DefaultMaxMessageBytes, MaxFrames: MaxFramesPerMessage},
		handshake: DefaultHandshakeTimeout, maxPeers: DefaultMaxPeers, perClient: DefaultMaxPeers}
}

type guardedTransport struct{ transport.Transport }

func (t guardedTransport) Dial(ctx context.Context, d transport.Dialer, addr string) (net.Conn, error) {
	g := guardOf(ctx)
	c, err := t.Transport.Dial(ctx, d, addr)
	if err != nil {
		return nil, err
	}
	zc, err := handshake(ctx, c, g)
	if err != nil {
		if ctx.Err() == nil {
			g.refused(err)
		}
		return nil, err
	}
	return zc, nil
}

func (t guardedTransport) Listen(ctx context.Context, addr string) (net.Listener, error) {
	l, err := t.Transport.Listen(ctx, addr)
	if err != nil {
		return nil, err
	}
	g := guardOf(ctx)
	gl := &guardedListener{ctx: ctx, g: g, ready: make(chan net.Conn), done: make(chan struct{}), pending: map[net.Conn]struct{}{}}
	// connlimit holds the peer bound: at it, a newcomer closes the
	// longest-idle peer, one that has not sent a whole message yet (a
	// handshaking one included), so peers that connect and never publish
	// cannot lock the engines out; one address holds at most perClient
	// (docs/RATIONALE.md, "Why does a bound ZMQ source close its longest-idle
	// peer for a newcomer?").
	gl.cl = connlimit.New(l, connlimit.Config{MaxConns: g.maxPeers, MaxIdlePerClient: g.perClient,
		MaxPerClient: g.perClient, RefuseWhenBusy: true,
		OnRefused: func() { g.refused(refused("more than %d peers, none idle", g.maxPeers)) },
		OnEvicted: func() {
			g.refused(refused("closed for a newcomer: the longest-idle of %d peers (never published)", g.maxPeers))
		}})
	gl.Listener = gl.cl
	gl.wg.Go(gl.acceptLoop)
	return gl, nil
}

// handshake runs the peer's side of the ZMTP handshake on c: it sends the
// greeting zmq4 would send, then reads and checks the peer's greeting and
// READY command, all before g.handshake (or ctx) runs out. On success the
// returned conn replays what it read to zmq4; on failure c is closed.
func handshake(ctx context.Context, c net.Conn, g *peerGuard) (*zmtpConn, error) {
	deadline := time.Now().Add(g.handshake)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	fail := func(err error) (*zmtpConn, error) {
		_ = c.Close()
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			err = refused("handshake not completed within %v: %v", g.handshake, err)
		}
		return nil, err
	}
	if err := c.SetDeadline(deadline); err != nil {
		return fail(err)
	}
	if _, err := c.Write(ourGreeting[:]); err != nil {
		return fail(err)
	}
	r := bufio.NewReaderSize(c, readBufferSize)
	pre := make([]byte, greetingLen, greetingLen+64)
	if _, err := readFull(r, pre); err != nil {
		return fail(err)
	}
	if err := checkGreeting(pre); err != nil {
		return fail(err)
	}
	raw, body, err := readHandshakeFrame(r)
	if err != nil {
		return fail(err)
	}
	if err := checkReady(body, g.own); err != nil {
		return fail(err)
	}
	if !stop() {
		return fail(ctx.Err()) // ctx is done: its error is set
	}
	// A connection closed meanwhile (a newcomer evicted it) fails here: the
	// error must be returned, never a nil conn with a nil error.
	if err := c.SetDeadline(time.Time{}); err != nil {
		return fail(err)
	}
	return &zmtpConn{Conn: c, r: r, pre: append(pre, raw...), swallow: greetingLen,
		t: frameTracker{lim: g.limits}, g: g}, nil
}

func readFull(r *bufio.Reader, p []byte) (int, error) {
	n := 0
	for n < len(p) {
		k, err := r.Read(p[n:])
		n += k
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// zmtpConn is a connection whose peer has completed its handshake: reads
// replay the handshake bytes, then pass through a buffer and the frame
// tracker; zmq4's greeting, already sent, is absorbed.
type zmtpConn struct {
	net.Conn
	r       *bufio.Reader
	pre     []byte // the peer's greeting and READY, not yet read by zmq4
	swallow int    // bytes of zmq4's greeting still to absorb
	t       frameTracker
	g       *peerGuard

	published func() // called once the peer has sent a whole message; nil when dialled
}

// peerError is a refusal as zmq4 sees it: a non-timeout net.Error, on
// which the library marks the connection closed and drops it, while its
// other connections go on.
type peerError struct{ error }

func (peerError) Timeout() bool   { return false }
func (peerError) Temporary() bool { return false }
func (e peerError) Unwrap() error { return e.error }

func (c *zmtpConn) Read(p []byte) (int, error) {
	if len(c.pre) > 0 {
		n := copy(p, c.pre)
		c.pre = c.pre[n:]
		return n, nil
	}
	if c.t.failure != nil {
		return 0, peerError{c.t.failure}
	}
	n, err := c.r.Read(p)
	if k, terr := c.t.scan(p[:n]); terr != nil {
		c.g.refused(terr)
		_ = c.Conn.Close()
		return k, peerError{terr}
	}
	if c.published != nil && c.t.done > 0 {
		c.published()
		c.published = nil
	}
	return n, err
}

// errGreetingDiffers means zmq4 sent a greeting other than ourGreeting: the
// library changed under the transport (a programming error, caught by the
// tests).
var errGreetingDiffers = errors.New("zmq source: the library's ZMTP greeting differs from the transport's")

func (c *zmtpConn) Write(p []byte) (int, error) {
	if c.swallow == 0 {
		return c.Conn.Write(p)
	}
	off := greetingLen - c.swallow
	k := min(len(p), c.swallow)
	if !bytes.Equal(p[:k], ourGreeting[off:off+k]) {
		return 0, errGreetingDiffers
	}
	c.swallow -= k
	if k == len(p) {
		return k, nil
	}
	n, err := c.Conn.Write(p[k:])
	return k + n, err
}

// guardedListener accepts in its own goroutine and handshakes each
// connection in another, handing zmq4's accept loop only the connections
// whose peer completed its handshake in time.
type guardedListener struct {
	net.Listener // cl
	cl           *connlimit.Listener
	ctx          context.Context
	g            *peerGuard
	ready        chan net.Conn
	done         chan struct{}
	wg           sync.WaitGroup

	mu      sync.Mutex
	pending map[net.Conn]struct{} // handshaking
	closed  bool
}

func (l *guardedListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ready:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *guardedListener) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	close(l.done)
	for c := range l.pending {
		_ = c.Close()
	}
	l.mu.Unlock()
	err := l.Listener.Close()
	l.wg.Wait()
	return err
}

func (l *guardedListener) acceptLoop() {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of descriptors or a like transient failure: let it pass.
			t := time.NewTimer(10 * time.Millisecond)
			select {
			case <-l.done:
				t.Stop()
				return
			case <-t.C:
			}
			continue
		}
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			_ = c.Close()
			continue
		}
		l.pending[c] = struct{}{}
		l.mu.Unlock()
		l.wg.Go(func() { l.serve(c) })
	}
}

// serve handshakes c and hands it to Accept.
func (l *guardedListener) serve(c net.Conn) {
	zc, err := handshake(l.ctx, c, l.g)
	l.mu.Lock()
	delete(l.pending, c)
	closed := l.closed
	l.mu.Unlock()
	if err != nil {
		// net.ErrClosed: closed for a newcomer (counted as evicted) or by Close.
		if !closed && l.ctx.Err() == nil && !errors.Is(err, net.ErrClosed) {
			l.g.refused(err)
		}
		return
	}
	if lc, ok := c.(*connlimit.Conn); ok {
		zc.published = func() { l.cl.SetIdle(lc, false) }
	}
	select {
	case l.ready <- zc:
	case <-l.done:
		_ = zc.Close()
	}
}
