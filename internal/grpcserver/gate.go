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
	"github.com/ckfrelay/ckfrelay/wire/kvrelay"
	"github.com/ckfrelay/ckfrelay/wire/kvrelay/kvrelaypb"
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
//     admitted stream grpc.first_request_timeout after it was accepted;
//   - an admitted stream's every send must complete within
//     stream_write_timeout, or the stream is ended (SendMsg).
//
// gRPC's own MaxConnectionIdle counts a request-less stream as activity, and
// auth is per call, which is why these live here.
type gate struct {
	token        []byte // nil: no auth
	firstRequest time.Duration
	maxPending   int
	// sendTimeout bounds one message send of an admitted stream
	// (stream_write_timeout, as one frame write of an HTTP stream).
	sendTimeout time.Duration
	ln          atomic.Pointer[connlimit.Listener]

	mu       sync.Mutex
	pending  list.List // of *call, longest-pending first
	busy     map[*connlimit.Conn]int
	stopping bool

	cut     atomic.Uint64 // pending streams cancelled (deadline, bound, shutdown)
	refused atomic.Uint64 // streams refused at their HEADERS (auth, shutdown)
	stalled atomic.Uint64 // admitted streams cut because a send did not complete in sendTimeout
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

func newGate(token string, firstRequest, sendTimeout time.Duration, maxPending int) *gate {
	g := &gate{firstRequest: firstRequest, sendTimeout: sendTimeout, maxPending: maxPending, busy: map[*connlimit.Conn]int{}}
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
	s := &admittingStream{ServerStream: ss, g: g}
	defer s.stopWatch()
	return h(srv, s)
}

// admittingStream admits its call when its request message has been read,
// and bounds each of its sends.
type admittingStream struct {
	grpc.ServerStream
	g *gate

	// watch cancels the stream when a send has not completed within
	// gate.sendTimeout; made at the first send, re-armed by every send.
	watch   *time.Timer
	stalled atomic.Bool
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

// SendMsg sends m within gate.sendTimeout or ends the stream: a peer that
// stops reading lets HTTP/2 flow control block the send once its window and
// grpc-go's per-stream write quota are full, and nothing else would ever
// end the handler — its pool stream and hub slots (grpc.max_streams,
// max_subscribers, shared with HTTP) would stay taken while the connection
// answers keepalive pings. Cancelling the stream's context (the tap's)
// releases the blocked send; the handler then returns SUBSCRIBER_LAGGED, as
// an HTTP stream whose frame write missed stream_write_timeout is dropped.
func (s *admittingStream) SendMsg(m any) error {
	c, ok := s.Context().Value(callKey{}).(*call)
	if !ok || s.g.sendTimeout <= 0 {
		return s.ServerStream.SendMsg(m)
	}
	if s.watch == nil {
		s.watch = time.AfterFunc(s.g.sendTimeout, func() {
			s.stalled.Store(true)
			s.g.stalled.Add(1)
			// grpc-go ends a stream whose send failed with CANCELLED
			// itself (serverStream.SendMsg writes that status before the
			// handler's return could write another), so the reason goes
			// out as a trailer on it, set before the send is released.
			_ = grpc.SetTrailer(s.Context(), metadata.Pairs(kvrelay.ErrorReasonTrailer, lagged.Name()))
			c.cancel()
		})
	} else {
		s.watch.Reset(s.g.sendTimeout)
	}
	err := s.ServerStream.SendMsg(m)
	if !s.watch.Stop() && s.stalled.Load() {
		return status.Errorf(codes.Canceled, "a message was not sent within stream_write_timeout (%v): the subscriber stopped reading; resubscribe for a snapshot", s.g.sendTimeout)
	}
	return err
}

// lagged is the reason a stream cut for not reading carries.
var lagged, _ = kvrelay.LookupReason(kvrelaypb.RelayErrorReason_RELAY_ERROR_REASON_SUBSCRIBER_LAGGED)

func (s *admittingStream) stopWatch() {
	if s.watch != nil {
		s.watch.Stop()
	}
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
