// Package client is the router side of ckfrelay: it subscribes one consumer
// lane per pool (data center) to a relay's frame streams, feeds every frame
// to a consumer (native or WebAssembly), and keeps each lane converged. A
// router reads ckfrelay relays' HTTP streams ([Config.Relays]), their NATS
// JetStream broadcast ([NATSConfig]), or any server of Dynamo's
// dynamo.kvrelay.v1 gRPC contract, ckfrelay's or Dynamo's ([GRPCConfig]).
//
// Each stream is one [Session] under one lease: every frame is checked
// against the stream it came on before the consumer sees it (its lease, the
// snapshot's chunk order), so one stream can never write into another lane
// (docs/wire.md §3.1). On any deactivation, protocol error, close frame,
// disconnect, identity change, idle or snapshot timeout, or a lane the
// consumer lost (an instance reset), a lane retires, then re-subscribes with
// a higher assignment epoch and installs a fresh snapshot, with exponential
// backoff and full jitter; only a session that stayed up
// [Config.HealthySession] after installing its snapshot resets the backoff.
// Readiness is the consumer's, asked at each [Router.Lane] call. Staleness
// (the age of a lane's last frame) lets a router stop trusting a silent
// lane: relays send heartbeats while idle, so a healthy lane is never older
// than a few heartbeat intervals, and only frames that moved the lane keep
// a session alive.
//
// The consumer's manifest comes from the same [Config] ([Config.Manifest]):
// its lanes are the targets', each pool's identity is read from its relay's
// catalog, and no format is pinned unless a target pins one, so a lane
// follows its pool across a resize and pools of any sizes share one
// consumer (format groups, docs/SPEC.md §8.2). A pool serving a format the
// manifest pins against stops its lane with a [*FormatMismatchError]
// ([LaneInfo.Stopped]).
package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/consumer"
	"github.com/ckfrelay/ckfrelay/wire"
)

// Target is one pool a Router follows, on one physical lane.
type Target struct {
	Pool string // the relay's pool name (over gRPC only a label: see DCID)
	Lane int    // 0..15; must match the lane the consumer's manifest gives the pool
	// Relay is the index in Config.Relays of the relay that hosts the pool
	// (HTTP and gRPC; 0 with one relay). Unused over NATS.
	Relay int
	// DCID names the data center over gRPC, whose catalog names pools by
	// producer identity, not by name: of the relay's pools whose
	// ProducerIdentity.pool_id.dc_id is DCID, the target follows the one
	// Config.Select matches (one lane per data center). Unused over HTTP
	// and NATS.
	DCID uint64
	// Format, when set, pins the lane to one filter format (seed, bucket
	// count) in the manifest [Config.Manifest] builds: a pool serving
	// another then stops the lane with a [*FormatMismatchError]. Zero (the
	// default) pins none: the lane takes its pool's format from each
	// snapshot, so it follows the pool across a resize.
	Format ckf.Format
}

// Config configures a Router.
type Config struct {
	// Relays are the relays whose pools the targets name, each as its
	// replicas' addresses ([Relay]): http(s) base URLs by default, gRPC
	// targets when GRPC is set. Empty over NATS.
	Relays []Relay
	// NATS, when set, reads the relays' JetStream broadcast instead of
	// their HTTP streams (see [NATSConfig]).
	NATS *NATSConfig
	// GRPC, when set, follows dynamo.kvrelay.v1 KvEventRelay servers
	// (ckfrelay's or Dynamo's) at the Relays' addresses instead of HTTP
	// streams (see [GRPCConfig]).
	GRPC *GRPCConfig
	// Select is what the router routes for over gRPC — namespace, model
	// (base and adapter), worker role — and so which pool of each target's
	// data center it follows ([Selection]). Router-wide: a router routes
	// for one model. The zero Selection follows each data center's only
	// pool. Must be zero over HTTP and NATS, whose targets name pools.
	Select Selection
	// AuthToken is sent as a bearer token when set.
	AuthToken string
	// ConsumerInstance identifies this router's consumer in leases.
	ConsumerInstance uint64
	// Targets lists the pools to follow.
	Targets []Target
	// VerificationWindow is the prefix search's window in the manifest
	// [Config.Manifest] builds (SPEC §8.4, 1..8; default
	// consumer.DefaultVerificationWindow).
	VerificationWindow int
	// MinBackoff and MaxBackoff bound the resubscribe delay (defaults 50ms, 5s).
	MinBackoff, MaxBackoff time.Duration
	// HealthySession is how long a session must stay up after installing its
	// snapshot to count as healthy and reset the backoff; a shorter one counts
	// as a failure even though it installed, so a relay that drops streams
	// right after their snapshot (an oversize delta, a router that always
	// lags) gets snapshots at the backed-off rate, not one per MinBackoff.
	// Default (zero or negative) max(MaxBackoff, 1s): at least MaxBackoff, so
	// resetting can never resubscribe faster than a lane failing at the cap,
	// and at least a second, so a tiny MaxBackoff does not make every
	// installed session healthy.
	HealthySession time.Duration
	// IdleTimeout ends a session that received no frame that moved its
	// lane for this long, so a half-open connection (a relay that vanished
	// without a FIN) cannot pin a lane forever. Frames the consumer ignores
	// (stale or duplicate deltas) do not count; after the snapshot a
	// heartbeat at the lane's sequence does, so a quiet relay stays
	// followed. Relays heartbeat while idle: keep it at several heartbeat
	// intervals. Default 10s over HTTP and NATS (ckfrelay's relays
	// heartbeat every second by default); over gRPC
	// [DefaultGRPCIdleTimeout], three of Dynamo's default 10 s heartbeats,
	// which its relays do not announce (keepalive pings notice a dead
	// connection sooner: GRPCConfig.KeepaliveTime). Negative disables it.
	IdleTimeout time.Duration
	// SnapshotProgressTimeout bounds how long a session's snapshot may take
	// to install, from the stream's start: a relay that sends chunk 0 and
	// then stalls, trickles chunks, or never finishes must not pin a lane
	// out of routing (Dynamo's contract bounds snapshot progress on the
	// relay side too: SNAPSHOT_PROGRESS_TIMEOUT). While the snapshot
	// assembles only accepted chunks restart IdleTimeout; a heartbeat
	// between chunks ends the session ([ErrProtocol]). Default 60s: raise
	// it for tables that take longer to fetch (a 64 MiB table over a
	// 10 Mbit/s link takes about 54 s).
	SnapshotProgressTimeout time.Duration
	// MaxFrameBytes bounds one frame (default wire.DefaultMaxFrameBytes).
	MaxFrameBytes int
	// HTTPClient is used for streams (default: a client without timeout).
	HTTPClient *http.Client
	// Logger receives lane transitions (default: discard).
	Logger *slog.Logger
}

// LaneInfo is the state of one followed lane.
type LaneInfo struct {
	Pool          string
	Connected     bool          // a stream is open
	Ready         bool          // the consumer holds the lane ready under the session's lease (asked at the call)
	Epoch         uint64        // the current (or last) assignment epoch
	Sequence      uint64        // the last installed sequence
	LastFrame     time.Time     // when the last frame arrived (zero: never)
	Staleness     time.Duration // time since LastFrame at the call
	Resubscribes  uint64        // sessions started after the first
	FramesApplied uint64
	LastError     string // why the last session ended
	// Stopped, when set, is why the router stopped following the lane for
	// good: a [*FormatMismatchError] (the pool serves a format the
	// consumer's manifest does not allow), which no retry can fix. The
	// router's other lanes go on.
	Stopped error
}

// Router keeps a consumer's lanes converged with a relay.
type Router struct {
	cfg  Config
	log  *slog.Logger
	mu   sync.Mutex // serializes every call into lanes and guards info
	ls   Lanes
	info [ckf.MaxLanes]LaneInfo
	live [ckf.MaxLanes]*liveSession // the running session per lane (nil: none)
	nats *natsTransport             // nil: HTTP or gRPC
	grpc []*grpcTransport           // one per relay over gRPC; nil: HTTP or NATS
	http []*replicas                // one per relay over HTTP; nil: NATS or gRPC

	onBackoff func(lane int, ceil time.Duration) // test hook: before each resubscribe delay
}

// CheckRelayURL reports whether s is a usable relay base URL: http or https,
// with a host. The error says what to write instead, e.g. for
// "127.0.0.1:7878" to add "http://".
func CheckRelayURL(s string) error {
	u, err := url.Parse(s)
	if err != nil || u.Host == "" || u.Scheme == "" || u.Opaque != "" {
		if !strings.Contains(s, "://") {
			return fmt.Errorf("client: relay URL %q has no scheme: write \"http://%s\" (or https://)", s, s)
		}
		return fmt.Errorf("client: relay URL %q is not an http(s) URL with a host, e.g. \"http://127.0.0.1:7878\"", s)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("client: relay URL %q has scheme %q: the relay speaks http:// or https://", s, u.Scheme)
	}
	return nil
}

// New returns a router over lanes. It does nothing until [Router.Run].
func New(cfg Config, lanes Lanes) (*Router, error) {
	if cfg.NATS != nil && cfg.GRPC != nil || len(cfg.Targets) == 0 {
		return nil, errors.New("client: at most one of NATS and GRPC (neither: HTTP), and at least one target, are required")
	}
	if err := checkRelays(&cfg); err != nil {
		return nil, err
	}
	sel, err := cfg.Select.withDefaults()
	if err != nil {
		return nil, err
	}
	if cfg.GRPC == nil && sel != (Selection{}) {
		return nil, errors.New("client: Select chooses gRPC catalog pools; HTTP and NATS targets name their pools")
	}
	cfg.Select = sel
	type relayDC struct {
		relay int
		dc    uint64
	}
	seen, dcs := map[int]bool{}, map[relayDC]bool{}
	for _, t := range cfg.Targets {
		if t.Lane < 0 || t.Lane >= ckf.MaxLanes || seen[t.Lane] || t.Pool == "" {
			return nil, fmt.Errorf("client: target %+v: lanes must be distinct in 0..15 and pools named", t)
		}
		if cfg.GRPC != nil && dcs[relayDC{t.Relay, t.DCID}] {
			return nil, fmt.Errorf("client: target %+v: over gRPC every target of a relay needs its own DCID", t)
		}
		seen[t.Lane], dcs[relayDC{t.Relay, t.DCID}] = true, true
	}
	if cfg.VerificationWindow == 0 {
		cfg.VerificationWindow = consumer.DefaultVerificationWindow
	}
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = 50 * time.Millisecond
	}
	if cfg.MaxBackoff < cfg.MinBackoff {
		cfg.MaxBackoff = max(5*time.Second, cfg.MinBackoff)
	}
	if cfg.HealthySession <= 0 {
		cfg.HealthySession = max(cfg.MaxBackoff, time.Second)
	}
	if cfg.IdleTimeout == 0 {
		cfg.IdleTimeout = 10 * time.Second
		if cfg.GRPC != nil {
			cfg.IdleTimeout = DefaultGRPCIdleTimeout
		}
	}
	if cfg.SnapshotProgressTimeout <= 0 {
		cfg.SnapshotProgressTimeout = DefaultSnapshotProgressTimeout
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = &http.Client{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	r := &Router{cfg: cfg, log: cfg.Logger, ls: lanes}
	switch {
	case cfg.NATS != nil:
		r.nats = newNATSTransport(*cfg.NATS)
	case cfg.GRPC != nil:
		for _, rl := range cfg.Relays {
			t, err := newGRPCTransport(*cfg.GRPC, cfg.Select, rl.Addrs, cfg.AuthToken, cfg.ConsumerInstance)
			if err != nil {
				return nil, err
			}
			r.grpc = append(r.grpc, t)
		}
	default:
		for _, rl := range cfg.Relays {
			r.http = append(r.http, &replicas{addrs: rl.Addrs})
		}
	}
	for _, t := range cfg.Targets {
		r.info[t.Lane].Pool = t.Pool
	}
	return r, nil
}

// Run follows every target until ctx ends. It always returns ctx's error.
func (r *Router) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	for _, g := range r.grpc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g.watchCatalog(ctx, r.cfg.MinBackoff, r.cfg.MaxBackoff, func(msg string, args ...any) { r.log.Info(msg, args...) })
		}()
	}
	for _, t := range r.cfg.Targets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.follow(ctx, t)
		}()
	}
	wg.Wait()
	if r.nats != nil {
		r.nats.close()
	}
	for _, g := range r.grpc {
		g.close()
	}
	return ctx.Err()
}

// QuerySequenceHashes answers, per ready lane, the cached prefix depth of a
// request's canonical block hashes. res is overwritten.
func (r *Router) QuerySequenceHashes(seq []uint64, res *consumer.QueryResult) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ls.QuerySequenceHashes(seq, res)
}

// Contains returns the ready lanes whose filter holds seqHash.
func (r *Router) Contains(seqHash uint64) (uint16, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ls.Contains(seqHash)
}

// AppendLaneWords appends a ready lane's bucket words to dst and returns them
// with the sequence they are at, read atomically with respect to the lane's
// stream (for audits: compare against a relay snapshot at that sequence).
func (r *Router) AppendLaneWords(dst []uint64, lane int) ([]uint64, uint64, error) {
	if lane < 0 || lane >= ckf.MaxLanes {
		return dst, 0, fmt.Errorf("client: lane %d outside 0..%d", lane, ckf.MaxLanes-1)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	words, err := r.ls.AppendLaneWords(dst, lane)
	return words, r.info[lane].Sequence, err
}

// Lane returns the state of a lane; a lane outside 0..15 reads as the zero
// LaneInfo. Ready is the consumer's answer at the call, never a recorded
// one: a lane the consumer lost (an instance reset, a deactivation) is not
// Ready even before its session notices.
func (r *Router) Lane(lane int) LaneInfo {
	if lane < 0 || lane >= ckf.MaxLanes {
		return LaneInfo{}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	li := r.info[lane]
	li.Ready = false
	if live := r.live[lane]; live != nil && live.s.Installed() {
		st, err := r.ls.LaneStatus(lane)
		li.Ready = err == nil && st.Ready && st.Assigned && st.Lease == live.s.Lease()
	}
	if !li.LastFrame.IsZero() {
		li.Staleness = time.Since(li.LastFrame)
	}
	return li
}

// follow runs sessions for one target until ctx ends.
func (r *Router) follow(ctx context.Context, t Target) {
	var epoch uint64
	failures := 0
	for ctx.Err() == nil {
		epoch = nextEpoch(epoch, time.Now())
		installedAt, err := r.session(ctx, t, epoch)
		lived := time.Duration(-1) // how long it lived after installing; -1: it never did
		if !installedAt.IsZero() {
			lived = time.Since(installedAt)
		}
		stopping := ctx.Err() != nil
		var mismatch *FormatMismatchError
		stopped := !stopping && errors.As(err, &mismatch)
		r.mu.Lock()
		// A lane nobody maintains must not answer: retire it even when the
		// router is stopping, but count a resubscribe only when one follows.
		_ = r.ls.Retire(t.Lane)
		li := &r.info[t.Lane]
		li.Connected = false
		if stopped {
			// The manifest refuses the pool's format: every retry would be
			// refused the same way (docs/RATIONALE.md "Why does a pinned
			// format's mismatch stop the lane?").
			li.LastError, li.Stopped = err.Error(), mismatch
			r.mu.Unlock()
			r.log.Warn("lane stopped", "pool", t.Pool, "lane", t.Lane, "err", err)
			<-ctx.Done() // Run still follows the other lanes until ctx ends
			return
		}
		if !stopping {
			li.Resubscribes++
			if err != nil {
				li.LastError = err.Error()
			}
		}
		r.mu.Unlock()
		if stopping {
			return
		}
		r.log.Info("lane resubscribing", "pool", t.Pool, "lane", t.Lane, "err", err)
		failures = nextFailures(failures, lived, r.cfg.HealthySession)
		ceil := backoffCeil(r.cfg.MinBackoff, r.cfg.MaxBackoff, failures)
		if r.onBackoff != nil {
			r.onBackoff(t.Lane, ceil)
		}
		d := jitter(ceil)
		failures++
		select {
		case <-time.After(d):
		case <-ctx.Done():
			return
		}
	}
}

// epochRandomBits is how many low bits of an assignment epoch are random.
const epochRandomBits = 24

// DefaultSnapshotProgressTimeout is Config.SnapshotProgressTimeout's default.
const DefaultSnapshotProgressTimeout = 60 * time.Second

// nextEpoch returns a lane's next assignment epoch after last: the clock in
// Unix nanoseconds with its low epochRandomBits bits drawn at random, and
// never less than last+1. The clock part makes epochs grow across router
// restarts with the same consumer instance (a relay refuses an epoch at or
// below one it granted that lane) and keeps them within a relay's
// max_lease_epoch_lead of its clock; the random part, drawn per lane and
// session, means one lane's epoch says nothing about another's (see
// docs/RATIONALE.md "Why are lane epochs the clock with random low bits?").
func nextEpoch(last uint64, now time.Time) uint64 {
	const mask = 1<<epochRandomBits - 1
	e := uint64(now.UnixNano())&^mask | rand.Uint64()&mask
	return max(last+1, e)
}

// nextFailures returns the failure count the next resubscribe delay is drawn
// from, given the count so far and how long the session that just ended
// lived after installing its snapshot (negative: it installed none). Only a
// session that installed and then lived at least healthy resets it:
// installing alone proves little when the relay drops the stream right after.
func nextFailures(failures int, lived, healthy time.Duration) int {
	if lived >= 0 && lived >= healthy {
		return 0
	}
	return failures
}

// backoff returns a full-jitter delay: uniform in [0, min(max, min·2^n)].
func backoff(lo, hi time.Duration, n int) time.Duration {
	return jitter(backoffCeil(lo, hi, n))
}

// backoffCeil returns min(hi, lo·2^n).
func backoffCeil(lo, hi time.Duration, n int) time.Duration {
	if n < 30 && lo<<n < hi {
		return lo << n
	}
	return hi
}

// jitter returns a delay uniform in [0, ceil].
func jitter(ceil time.Duration) time.Duration {
	return time.Duration(rand.Int64N(int64(ceil) + 1))
}

// Session end causes.
var (
	// ErrDeactivated: the consumer deactivated the lane (gap, wrong identity, …).
	ErrDeactivated = errors.New("client: lane deactivated")
	// ErrStreamClosed: the relay sent a close frame.
	ErrStreamClosed = errors.New("client: stream closed by relay")
	// ErrIdle: no frame (not even a heartbeat) arrived within IdleTimeout.
	ErrIdle = errors.New("client: stream idle")
)

// liveSession is a session the router runs, as its other sessions see it:
// an instance reset seen by one ends every session whose lease the consumer
// no longer holds.
type liveSession struct {
	s      *Session
	cancel context.CancelCauseFunc
}

// session opens one stream and runs a [Session] on it until something ends
// it. installedAt is when its snapshot was installed (zero: never); follow
// judges from it whether the session was healthy.
//
// Liveness: the idle timer restarts only on frames that moved the lane (an
// accepted chunk, an applied delta, a heartbeat at the lane's sequence, an
// acknowledged drain), never on ignored ones; and the snapshot must be
// installed within SnapshotProgressTimeout of the stream's start.
func (r *Router) session(ctx context.Context, t Target, epoch uint64) (installedAt time.Time, err error) {
	sctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var idle *time.Timer
	if r.cfg.IdleTimeout > 0 {
		idle = time.AfterFunc(r.cfg.IdleTimeout, func() { cancel(ErrIdle) })
		defer idle.Stop()
	}
	progress := time.AfterFunc(r.cfg.SnapshotProgressTimeout, func() { cancel(ErrSnapshotTimeout) })
	defer progress.Stop()
	defer func() {
		// A read that failed because a timer fired or another session saw
		// this one's lease go reports that cause, not the transport's
		// "context canceled".
		if err == nil {
			return
		}
		switch cause := context.Cause(sctx); {
		case errors.Is(cause, ErrIdle):
			err = fmt.Errorf("%w: no frame for %v (%v)", ErrIdle, r.cfg.IdleTimeout, err)
		case errors.Is(cause, ErrSnapshotTimeout):
			err = fmt.Errorf("%w: not installed %v after the stream opened (%v)", ErrSnapshotTimeout, r.cfg.SnapshotProgressTimeout, err)
		case errors.Is(cause, ErrLeaseLost) && !errors.Is(err, ErrLeaseLost):
			err = fmt.Errorf("%w (%v)", cause, err)
		}
	}()
	lease := ckf.LaneLease{ConsumerInstance: r.cfg.ConsumerInstance, PhysicalLane: uint8(t.Lane), AssignmentEpoch: epoch}
	var fr frameSource
	switch {
	case r.nats != nil:
		fr, err = r.nats.open(sctx, t.Pool, lease, r.cfg.MaxFrameBytes)
	case r.grpc != nil:
		fr, err = r.grpc[t.Relay].open(sctx, t.DCID, lease)
	default:
		fr, err = r.openHTTP(sctx, t, epoch)
	}
	if err != nil {
		return time.Time{}, err
	}
	defer fr.Close()
	live := &liveSession{s: NewSession(r.ls, lease), cancel: cancel}
	r.mu.Lock()
	r.live[t.Lane] = live
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.live[t.Lane] = nil
		r.mu.Unlock()
	}()
	acc, _ := fr.(acceptor)
	dec, _ := fr.(decodedSource)
	for {
		var raw []byte
		var f *wire.Frame
		if dec != nil {
			f, err = dec.ReadFrame()
		} else {
			raw, err = fr.ReadRaw()
		}
		if err != nil {
			return installedAt, err
		}
		r.mu.Lock()
		assigned := live.s.Assigned()
		var res consumer.Result
		if f != nil {
			res, err = live.s.ApplyDecoded(f)
		} else {
			res, err = live.s.Apply(raw)
		}
		li := &r.info[t.Lane]
		li.LastFrame = time.Now()
		if !assigned && live.s.Assigned() {
			li.Connected, li.Epoch = true, epoch
		}
		if err != nil {
			// This session ends. If the consumer failed (an instance reset
			// unassigns every lane), every session whose lease is gone must
			// end too, not only this one: ask the consumer.
			r.endLostSessionsLocked()
		}
		moved := err == nil && !res.Outcome.Ignored()
		if moved {
			li.FramesApplied++
			if acc != nil {
				acc.accepted(res)
			}
		}
		if res.Outcome == consumer.SnapshotInstalled && installedAt.IsZero() {
			installedAt = li.LastFrame
			progress.Stop()
		}
		if res.Lane == t.Lane {
			li.Sequence = res.Sequence
		}
		r.mu.Unlock()
		if err != nil {
			return installedAt, err
		}
		if moved && idle != nil {
			idle.Reset(r.cfg.IdleTimeout)
		}
	}
}

// endLostSessionsLocked ends every running session whose lease the consumer
// no longer holds (after an instance reset, every assigned one). r.mu is
// held.
func (r *Router) endLostSessionsLocked() {
	for lane, live := range r.live {
		if live == nil || !live.s.Assigned() {
			continue
		}
		st, err := r.ls.LaneStatus(lane)
		if err != nil || !st.Assigned || st.Lease != live.s.Lease() {
			live.cancel(fmt.Errorf("%w: lane %d under epoch %d", ErrLeaseLost, lane, live.s.Lease().AssignmentEpoch))
		}
	}
}

// frameSource yields one session's frame bodies: an HTTP stream, or the NATS
// transport's snapshot and stream. A body is valid until the next read.
type frameSource interface {
	ReadRaw() ([]byte, error)
	Close() error
}

// decodedSource is a frameSource that decodes another encoding (gRPC's
// CBI1): it yields the translated frame itself, which the session checks
// and installs without a wire v1 encoding in between (Session.ApplyDecoded).
// The frame is valid until the next read.
type decodedSource interface {
	ReadFrame() (*wire.Frame, error)
}

// acceptor is a frameSource that keeps state across frames (the gRPC
// translation): it learns which frames the consumer accepted, so that it
// keeps nothing from a frame the consumer ignored or refused.
type acceptor interface {
	accepted(res consumer.Result)
}

// httpSource is a relay's HTTP frame stream.
type httpSource struct {
	*wire.Reader
	body io.Closer
}

func (h httpSource) Close() error { return h.body.Close() }

// openHTTP opens the stream for t under epoch at its relay's replica in use;
// a replica that cannot serve it (unreachable, or any answer but 200: a
// standby, a relay not ready) moves t's relay to its next replica for the
// next attempt.
func (r *Router) openHTTP(ctx context.Context, t Target, epoch uint64) (src frameSource, err error) {
	rs := r.http[t.Relay]
	base, i := rs.current()
	defer func() {
		if err != nil && ctx.Err() == nil {
			rs.failed(i)
		}
	}()
	u := fmt.Sprintf("%s/v1/pools/%s/stream?consumer=%d&lane=%d&epoch=%d",
		strings.TrimRight(base, "/"), url.PathEscape(t.Pool), r.cfg.ConsumerInstance, t.Lane, epoch)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	if r.cfg.AuthToken != "" {
		req.Header.Set("Authorization", "Bearer "+r.cfg.AuthToken)
	}
	resp, err := r.cfg.HTTPClient.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		resp.Body.Close()
		return nil, fmt.Errorf("client: %s: %s", resp.Status, strings.TrimSpace(string(b)))
	}
	return httpSource{Reader: wire.NewReader(resp.Body, r.cfg.MaxFrameBytes), body: resp.Body}, nil
}
