package grpcserver

import (
	"container/list"
	"context"
	"crypto/subtle"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	"github.com/ckfrelay/ckfrelay/internal/connlimit"
)

// gate is what a stream must pass between its HEADERS and its handler, and
// what tells the listener which connections are busy (docs/limits.md, "gRPC").
//
// A stream is pending from its HEADERS until its request message has
// arrived whole (with END_STREAM: grpc-go waits for it before calling a
// server-streaming handler) and its handler runs; then it is admitted. A
// pending stream costs the relay a goroutine and the request bytes
// received so far, and gives it nothing, so:
//
//   - with a bearer token configured, a stream without it is refused at its
//     HEADERS (tap), before grpc-go starts a goroutine for it;
//   - a stream still pending grpc.first_request_timeout after its HEADERS
//     is cancelled (the peer sees CANCELLED);
//   - at grpc.max_pending_streams the longest-pending stream is cancelled to
//     make room (an honest client's request follows its HEADERS within a
//     round trip, so it is never the longest-pending);
//   - a connection is busy while one of its streams is admitted and not
//     ended, idle otherwise: the listener closes the longest-idle connection
//     at grpc.max_connections and an address's longest-idle one past
//     grpc.max_idle_per_client, and closes a connection that has had no
//     admitted stream grpc.first_request_timeout after it was accepted.
//
// gRPC's own MaxConnectionIdle counts a request-less stream as activity, and
// auth is per call, which is why these live here.
type gate struct {
	token        []byte // nil: no auth
	firstRequest time.Duration
	maxPending   int
	ln           atomic.Pointer[connlimit.Listener]

	mu       sync.Mutex
	pending  list.List // of *call, longest-pending first
	busy     map[*connlimit.Conn]int
	stopping bool

	cut     atomic.Uint64 // pending streams cancelled (deadline, bound, shutdown)
	refused atomic.Uint64 // streams refused at their HEADERS (auth, shutdown)
}

// call is one stream's passage through the gate.
type call struct {
	cancel   context.CancelFunc
	conn     *connlimit.Conn // nil if the listener does not know it
	elem     *list.Element   // in gate.pending while pending; under gate.mu
	admitted bool            // under gate.mu
	timer    *time.Timer
}

type callKey struct{}

func newGate(token string, firstRequest time.Duration, maxPending int) *gate {
	g := &gate{firstRequest: firstRequest, maxPending: maxPending, busy: map[*connlimit.Conn]int{}}
	if token != "" {
		g.token = []byte(token)
	}
	return g
}

// tap is grpc.InTapHandle: it runs on the connection's reader for each new
// stream's HEADERS, so it only checks and books.
func (g *gate) tap(ctx context.Context, info *tap.Info) (context.Context, error) {
	if g.token != nil && !tokenOK(info.Header, g.token) {
		g.refused.Add(1)
		return nil, status.Error(codes.Unauthenticated, "missing or wrong bearer token")
	}
	ctx, cancel := context.WithCancel(ctx)
	c := &call{cancel: cancel}
	if ln := g.ln.Load(); ln != nil {
		if p, ok := peer.FromContext(ctx); ok {
			c.conn = ln.Lookup(p.Addr, p.LocalAddr)
		}
	}
	var victim *call
	g.mu.Lock()
	if g.stopping {
		g.mu.Unlock()
		cancel()
		g.refused.Add(1)
		return nil, status.Error(codes.Unavailable, "relay shutting down")
	}
	c.elem = g.pending.PushBack(c)
	if g.pending.Len() > g.maxPending {
		victim = g.pending.Remove(g.pending.Front()).(*call)
		victim.elem = nil
	}
	g.mu.Unlock()
	if victim != nil {
		g.cut.Add(1)
		victim.cancel()
	}
	c.timer = time.AfterFunc(g.firstRequest, func() { g.expire(c) })
	context.AfterFunc(ctx, func() { g.done(c) })
	return context.WithValue(ctx, callKey{}, c), nil
}

// expire cancels c if it is still pending.
func (g *gate) expire(c *call) {
	g.mu.Lock()
	pending := c.elem != nil
	if pending {
		g.pending.Remove(c.elem)
		c.elem = nil
	}
	g.mu.Unlock()
	if pending {
		g.cut.Add(1)
		c.cancel()
	}
}

// admit marks the stream of ctx admitted: its request is in and its handler
// runs. It returns false if the stream was cancelled while pending.
func (g *gate) admit(ctx context.Context) bool {
	c, ok := ctx.Value(callKey{}).(*call)
	if !ok {
		return true
	}
	c.timer.Stop()
	g.mu.Lock()
	defer g.mu.Unlock()
	if c.elem == nil {
		return c.admitted
	}
	g.pending.Remove(c.elem)
	c.elem, c.admitted = nil, true
	if c.conn != nil {
		g.busy[c.conn]++
		if g.busy[c.conn] == 1 {
			g.ln.Load().SetIdle(c.conn, false)
		}
	}
	return true
}

// done runs when the stream has ended.
func (g *gate) done(c *call) {
	c.timer.Stop()
	g.mu.Lock()
	defer g.mu.Unlock()
	if c.elem != nil {
		g.pending.Remove(c.elem)
		c.elem = nil
	}
	if c.admitted && c.conn != nil {
		c.admitted = false
		if g.busy[c.conn]--; g.busy[c.conn] == 0 {
			delete(g.busy, c.conn)
			g.ln.Load().SetIdle(c.conn, true)
		}
	}
}

// stop refuses new streams and cancels every pending one: they were never
// admitted, so cutting them at once loses nothing and lets shutdown finish.
func (g *gate) stop() {
	g.mu.Lock()
	g.stopping = true
	var cut []*call
	for e := g.pending.Front(); e != nil; e = e.Next() {
		c := e.Value.(*call)
		c.elem = nil
		cut = append(cut, c)
	}
	g.pending.Init()
	g.mu.Unlock()
	for _, c := range cut {
		g.cut.Add(1)
		c.cancel()
	}
}

// pendingLen returns how many streams are pending.
func (g *gate) pendingLen() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.pending.Len()
}

// unary and stream are the interceptors that admit a call once its handler
// runs (a unary handler runs after its request was read; a streaming one
// reads its request first, so the wrapped stream admits after RecvMsg).
func (g *gate) unary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if !g.admit(ctx) {
		return nil, status.Error(codes.Canceled, "request not received in time")
	}
	return h(ctx, req)
}

func (g *gate) stream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	return h(srv, &admittingStream{ServerStream: ss, g: g})
}

// admittingStream admits its call when its request message has been read.
type admittingStream struct {
	grpc.ServerStream
	g *gate
}

func (s *admittingStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if !s.g.admit(s.Context()) {
		return status.Error(codes.Canceled, "request not received in time")
	}
	return nil
}

// tokenOK reports whether md carries "authorization: Bearer <token>" (scheme
// case-insensitive, token compared in constant time). A failure is
// UNAUTHENTICATED without a reason trailer: the contract leaves
// authentication to a proxy, and clients act on the status code.
func tokenOK(md metadata.MD, want []byte) bool {
	for _, v := range md.Get("authorization") {
		scheme, tok, ok := strings.Cut(v, " ")
		if ok && strings.EqualFold(scheme, "Bearer") && subtle.ConstantTimeCompare([]byte(strings.TrimLeft(tok, " ")), want) == 1 {
			return true
		}
	}
	return false
}
