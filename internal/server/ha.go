package server

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"regexp"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ckfrelay/ckfrelay/internal/catalog"
	"github.com/ckfrelay/ckfrelay/internal/hub"
	"github.com/ckfrelay/ckfrelay/internal/replica"
	"github.com/ckfrelay/ckfrelay/internal/source"
	"github.com/ckfrelay/ckfrelay/internal/source/dynamonats"
	"github.com/ckfrelay/ckfrelay/producer"
)

// HAConfig runs every pool of the relay as one replica of a group of hot
// standbys on NATS JetStream (internal/replica, docs/deploy.md "High
// availability"). Off while NATSURL is empty.
type HAConfig struct {
	// NATSURL names the NATS server(s) holding the records stream and the
	// lease bucket, comma-separated.
	NATSURL string `json:"nats_url,omitempty"`
	// NodeID is this replica's id, distinct within each pool's group (also
	// between two relays on one host). Default: the host name.
	NodeID string `json:"node_id,omitempty"`
	// Advertise is the HTTP base URL clients reach this replica at
	// ("http://10.0.0.7:7878"): standbys name the leader's. Default: the
	// listen address, with the host name for an unspecified host.
	Advertise string `json:"advertise,omitempty"`
	// AdvertiseGRPC is the gRPC target of this replica, named by standbys
	// in their gRPC trailer. Default: the gRPC listen address, as Advertise.
	AdvertiseGRPC string `json:"advertise_grpc,omitempty"`
	// LeaseTTL is the leadership lease: a leader that cannot renew it for
	// this long stops leading, and a standby takes over about this long
	// after the leader died. Default 3s; 100ms..5m.
	LeaseTTL Duration `json:"lease_ttl,omitempty"`
	// StreamReplicas is the replication of the records stream, the lease
	// bucket and (with nats.url) the fan-out stream: 1, 3 or 5. Default 3.
	StreamReplicas int `json:"stream_replicas,omitempty"`
	// CredsFile is a NATS credentials file, when the server requires one.
	CredsFile string `json:"creds_file,omitempty"`
	// CheckpointRecords and CheckpointBytes: a standby stores a checkpoint
	// of its pool (the whole pool image, in the object store
	// CKFRELAY_HA_CKPT, named in the KV bucket CKFRELAY_HA_CKPT_INDEX)
	// after this many records or bytes of records since its last one; a
	// rebuilding replica loads the newest and replays only the records
	// after it, and the pool's records below the older of its two kept
	// checkpoints are purged. Defaults 100,000 and 64 MiB.
	CheckpointRecords int   `json:"checkpoint_records,omitempty"`
	CheckpointBytes   int64 `json:"checkpoint_bytes,omitempty"`
}

// HA defaults.
const (
	DefaultHALeaseTTL       = 3 * time.Second
	DefaultHAStreamReplicas = 3
	// haMaxPending bounds the commands a leader's actor may journal ahead
	// of the appender: past it the actor waits for the append (back
	// pressure, docs/limits.md).
	haMaxPending = 1 << 16
	// Bounds of the checkpoint cadence (ha.checkpoint_records,
	// ha.checkpoint_bytes).
	maxCheckpointRecords = 1 << 30
	minCheckpointBytes   = 1 << 20
	maxCheckpointBytes   = 16 << 30
)

// Enabled reports whether HA is on.
func (h HAConfig) Enabled() bool { return h.NATSURL != "" }

var nodeIDPattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,128}$`)

func (h *HAConfig) withDefaults() {
	if !h.Enabled() {
		return
	}
	if h.NodeID == "" {
		if host, err := os.Hostname(); err == nil {
			h.NodeID = host
		}
	}
	setDefault(&h.LeaseTTL, Duration(DefaultHALeaseTTL))
	setDefault(&h.StreamReplicas, DefaultHAStreamReplicas)
	setDefault(&h.CheckpointRecords, replica.DefaultCheckpointRecords)
	setDefault(&h.CheckpointBytes, replica.DefaultCheckpointBytes)
}

// validate checks the defaulted HA block against the rest of c.
func (h HAConfig) validate(c Config) error {
	if !h.Enabled() {
		if h != (HAConfig{}) {
			return invalid("ha: node_id, advertise, lease_ttl, stream_replicas, creds_file and checkpoint_* need ha.nats_url")
		}
		return nil
	}
	switch {
	case !nodeIDPattern.MatchString(h.NodeID):
		return invalid("ha: node_id %q must match %s (set it when the host name does not)", h.NodeID, nodeIDPattern)
	case h.LeaseTTL < Duration(100*time.Millisecond) || h.LeaseTTL > Duration(5*time.Minute):
		return invalid("ha: lease_ttl %v outside 100ms..5m", time.Duration(h.LeaseTTL))
	case h.StreamReplicas != 1 && h.StreamReplicas != 3 && h.StreamReplicas != 5:
		// An even replica count tolerates no more failures than the odd
		// count below it and needs a larger majority.
		return invalid("ha: stream_replicas %d: want 1, 3 or 5", h.StreamReplicas)
	case h.CheckpointRecords < 1 || h.CheckpointRecords > maxCheckpointRecords:
		return invalid("ha: checkpoint_records %d outside 1..%d", h.CheckpointRecords, maxCheckpointRecords)
	case h.CheckpointBytes < minCheckpointBytes || h.CheckpointBytes > maxCheckpointBytes:
		// Below 1 MiB a standby would store a whole pool image for every
		// few records; above 16 GiB a rebuild replays more than any
		// checkpoint saves.
		return invalid("ha: checkpoint_bytes %d outside %d..%d", h.CheckpointBytes, int64(minCheckpointBytes), int64(maxCheckpointBytes))
	case c.DataDir != "":
		return invalid("ha: data_dir and ha.nats_url exclude each other: the replicated records stream is the pool's durable state (docs/RATIONALE.md \"Why does HA refuse a data dir?\")")
	}
	if h.Advertise != "" {
		u, err := url.Parse(h.Advertise)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || (u.Path != "" && u.Path != "/") {
			return invalid("ha: advertise %q: want an http(s) base URL such as http://10.0.0.7:7878", h.Advertise)
		}
	}
	if h.AdvertiseGRPC != "" {
		if _, _, err := net.SplitHostPort(h.AdvertiseGRPC); err != nil {
			return invalid("ha: advertise_grpc %q: want host:port", h.AdvertiseGRPC)
		}
	}
	if n := len(advertisement(h.Advertise, h.AdvertiseGRPC)); n > replica.MaxTermName {
		// The pair goes into the term record, which standbys refuse
		// beyond this: such a leader could never be followed.
		return invalid("ha: advertise and advertise_grpc make a %d-byte address; at most %d", n, replica.MaxTermName)
	}
	return nil
}

// LeaderHint is where a standby says its pool's leader serves.
type LeaderHint struct {
	Node string // the leader's node id ("" while no leader is known)
	URL  string // its HTTP base URL
	GRPC string // its gRPC target ("" when it serves no gRPC)
}

// advertisement is the address a replica announces in its term record: its
// HTTP base URL, with its gRPC target as the query parameter grpc.
func advertisement(httpURL, grpcTarget string) string {
	if grpcTarget == "" {
		return httpURL
	}
	return httpURL + "?grpc=" + url.QueryEscape(grpcTarget)
}

// parseAdvertisement splits a term record's address (see advertisement).
// An address another build wrote that does not parse is passed on as is.
func parseAdvertisement(node, addr string) LeaderHint {
	h := LeaderHint{Node: node}
	u, err := url.Parse(addr)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		// Not an address a client can use (a record written by hand, or
		// garbage): name the node only, pass no address on.
		return h
	}
	if g := u.Query().Get("grpc"); g != "" {
		if _, _, err := net.SplitHostPort(g); err == nil {
			h.GRPC = g
		}
	}
	u.RawQuery, u.Fragment = "", ""
	h.URL = u.String()
	return h
}

// DefaultAdvertise is the base URL of a listener's address: an unspecified
// host (":7878", "0.0.0.0:7878") is replaced by the host name.
func DefaultAdvertise(scheme string, addr net.Addr) string {
	host, port, err := net.SplitHostPort(addr.String())
	if err != nil {
		return scheme + "://" + addr.String()
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		if h, err := os.Hostname(); err == nil {
			host = h
		}
	}
	if scheme == "" {
		return net.JoinHostPort(host, port)
	}
	return scheme + "://" + net.JoinHostPort(host, port)
}

// haGroup is the relay's HA connection: the records stream and the lease
// bucket every pool's replica shares.
type haGroup struct {
	nc          *nats.Conn
	js          jetstream.JetStream
	stream      jetstream.Stream
	leases      *replica.Leases
	checkpoints *replica.Checkpoints
}

// openHA connects to ha.nats_url and creates or updates the records stream
// and the lease bucket. Unlike the fan-out, HA needs NATS to start: a
// replica that cannot reach the group can neither lead nor follow.
func openHA(cfg HAConfig) (*haGroup, error) {
	nc, err := nats.Connect(cfg.NATSURL, haConnOptions(cfg)...)
	if err != nil {
		return nil, fmt.Errorf("server: ha: nats: %w", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("server: ha: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := replica.EnsureStream(ctx, js, replica.StreamConfig{Replicas: cfg.StreamReplicas})
	if err == nil {
		var ls *replica.Leases
		ls, err = replica.OpenLeases(ctx, js, replica.LeaseConfig{TTL: time.Duration(cfg.LeaseTTL), Replicas: cfg.StreamReplicas})
		if err == nil {
			var cs *replica.Checkpoints
			cs, err = replica.EnsureCheckpoints(ctx, js, replica.CheckpointConfig{Replicas: cfg.StreamReplicas})
			if err == nil {
				return &haGroup{nc: nc, js: js, stream: st, leases: ls, checkpoints: cs}, nil
			}
		}
	}
	nc.Close()
	return nil, fmt.Errorf("server: ha: %w", err)
}

// haConnOptions are the HA connection's options. Its keep-alive follows
// the lease: a NATS server that hangs (alive for TCP, silent) is left for
// another after three unanswered pings, within about 2 lease TTLs (not
// sooner: a loaded host answering late must not make replicas reconnect). With
// nats.go's default (a ping every 2 minutes) a replica connected to a hung
// server could neither renew, follow nor take the lease for minutes: a red
// team's SIGSTOPped NATS node left a pool without a leader for 28 s of a
// 30 s hang, and the stall check could not help, its read going out on the
// same silent connection.
func haConnOptions(cfg HAConfig) []nats.Option {
	opts := []nats.Option{nats.Name("ckfrelay-ha"), nats.MaxReconnects(-1), nats.ReconnectWait(250 * time.Millisecond),
		nats.PingInterval(max(time.Duration(cfg.LeaseTTL)/2, 50*time.Millisecond)), nats.MaxPingsOutstanding(3)}
	if cfg.CredsFile != "" {
		opts = append(opts, nats.UserCredentials(cfg.CredsFile))
	}
	return opts
}

// haPool runs one pool's replica: a replica.Node whose pools are this
// hostedPool's generations. A standby's generation serves nothing; the
// leader's admits (HTTP ingest, its sources), publishes (hub, NATS
// fan-out) and answers only what a stored record covers.
type haPool struct {
	s    *Server
	p    *hostedPool
	node *replica.Node

	cancel   context.CancelFunc
	done     chan struct{} // Run returned
	stopping atomic.Bool

	takeovers atomic.Uint64

	mu   sync.Mutex
	lead *leadership // what the current term runs; nil while a standby

	tailMu  sync.Mutex
	tailSeq uint64
	tailAt  time.Time // last read attempt
	// tailReadAt: the last successful read.
	tailReadAt time.Time
	dupSince   time.Time // when a lease under our node id was first seen while standing by
	dupRev     uint64    // its revision then
	// duplicate: another live relay leads under this relay's node id.
	duplicate atomic.Bool

	// leads is the node's Leads (tests replace it): whether the lease's
	// deadline, on CLOCK_BOOTTIME, has not passed.
	leads func() bool

	// stopped is why the node's Run returned for good (nil while it runs).
	stopped atomic.Pointer[string]
}

// failure says why the replica cannot do its job — its node stopped, or
// its records chain halts — or "" when it can.
func (h *haPool) failure() string {
	if s := h.stopped.Load(); s != nil {
		return "stopped: " + *s
	}
	if h.node != nil {
		if st := h.node.Status(); st.Halted != "" {
			return "halted: " + st.Halted
		}
	}
	return ""
}

// leadsNow reports whether this replica leads its pool by its own clock. A
// generation marked leading outlives its lease by the moments the node's
// loop needs to notice a passed deadline — a relay resumed after SIGSTOP or
// a suspended VM runs its HTTP and gRPC handlers at once, beside that
// loop — so what only a leader serves checks the deadline itself: a
// deposed leader must not hand a router a snapshot that lacks what the new
// leader admitted, nor keep its stream alive with heartbeats.
func (h *haPool) leadsNow() bool {
	return h.leads != nil && h.leads()
}

// leadership is what one term of leadership runs besides the hub: the
// pool's sources and its NATS fan-out publisher.
type leadership struct {
	cancelPub, cancelSources context.CancelFunc
	pubDone                  chan struct{}
	sources                  []*runningSource
}

// closedHub is a standby generation's hub: never ready, it refuses every
// subscriber.
func closedHub(cfg Config) (*hub.Hub, error) {
	h, err := newHub(cfg)
	if err != nil {
		return nil, err
	}
	h.Close(errStandby)
	return h, nil
}

// errStandby: the replica stands by for its pool; the leader serves it.
var errStandby = errors.New("server: this replica stands by for the pool")

// newHAPool prepares pool spec's replica; startHA runs it once the
// listeners' addresses are known.
func (s *Server) newHAPool(spec PoolSpec) (*hostedPool, error) {
	p := newHostedPool(spec, s.log, s.m)
	hb, err := closedHub(s.cfg)
	if err != nil {
		return nil, err
	}
	// Until the node runs, the pool has no actor: a zero handle answers
	// ErrNotStarted.
	p.cur.Store(&poolGen{hub: hb})
	p.ha = &haPool{s: s, p: p, done: make(chan struct{})}
	return p, nil
}

// startHA starts every pool's replica, announcing httpURL (and grpcTarget)
// unless the configuration names the addresses.
func (s *Server) startHA(httpURL, grpcTarget string) error {
	if s.ha == nil {
		return nil
	}
	cfg := s.cfg.HA
	if cfg.Advertise != "" {
		httpURL = cfg.Advertise
	}
	if cfg.AdvertiseGRPC != "" {
		grpcTarget = cfg.AdvertiseGRPC
	}
	addr := advertisement(httpURL, grpcTarget)
	for _, p := range s.order {
		h := p.ha
		node, err := replica.NewNode(replica.NodeConfig{Pool: p.spec.Name, Node: cfg.NodeID, Address: addr,
			JS: s.ha.js, Stream: s.ha.stream, Leases: s.ha.leases, NewPool: h.newPool, OnChange: h.changed,
			Checkpoints: s.ha.checkpoints, PoolFromImage: h.poolFromImage,
			CheckpointRecords: cfg.CheckpointRecords, CheckpointBytes: cfg.CheckpointBytes,
			Logger: s.log})
		if err != nil {
			return fmt.Errorf("server: ha: pool %q: %w", p.spec.Name, err)
		}
		h.node = node
		if h.leads == nil {
			h.leads = node.Leads
		}
		ctx, cancel := context.WithCancel(context.Background())
		h.cancel = cancel
		go func() {
			defer close(h.done)
			if err := node.Run(ctx); err != nil && ctx.Err() == nil {
				msg := err.Error()
				h.stopped.Store(&msg)
				p.log.Error("replica stopped", "err", err)
			}
		}()
	}
	return nil
}

// newPool is the node's NewPool: a fresh, empty actor journalling into a
// recorder, serving nothing until it leads.
func (h *haPool) newPool() (replica.Pool, error) { return h.poolFromImage(nil) }

// poolFromImage is the node's PoolFromImage: newPool's actor, started from
// a checkpoint's image (nil: empty).
func (h *haPool) poolFromImage(img *producer.Image) (replica.Pool, error) {
	s := h.s
	rec := replica.NewRecorder(haMaxPending)
	g, err := h.p.startActor(s.cfg, s.cfg.PoolDomain(h.p.spec), s.incarnation, rec, img)
	if err != nil {
		return replica.Pool{}, err
	}
	if g.hub, err = closedHub(s.cfg); err != nil {
		_ = g.handle.Fence(context.Background())
		return replica.Pool{}, err
	}
	g.rec = rec
	h.p.cur.Store(g)
	return replica.Pool{Handle: g.handle, Recorder: rec, Close: func() { h.retire(g) }}, nil
}

// termIncarnation is the producer incarnation of a term: the term in the
// high 32 bits (it reads in the catalog), random low bits, so that a lease
// bucket created anew (terms count from 1 again) never repeats an
// incarnation routers saw.
func termIncarnation(term uint64) uint64 { return term<<32 | uint64(rand.Uint32()) }

// changed is the node's OnChange: it runs on the node's goroutine, before a
// new leader appends anything.
func (h *haPool) changed(st replica.Status, _ replica.Pool, reason string) {
	if st.Role != replica.RoleLeader {
		return // newPool published the standby generation
	}
	if err := h.becomeLeader(st); err != nil {
		// The actor stopped under us (shutdown): the node notices when it
		// next appends or the lease lapses.
		h.p.log.Error("replica: starting to serve as the leader", "term", st.Term, "err", err)
	}
}

func (h *haPool) becomeLeader(st replica.Status) error {
	s, p := h.s, h.p
	g := p.gen()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := g.handle.Reincarnate(ctx, termIncarnation(st.Term)); err != nil {
		return err
	}
	hb, err := newHub(s.cfg)
	if err != nil {
		return err
	}
	lg := &poolGen{handle: g.handle, hub: hb, rec: g.rec, leading: true, term: st.Term,
		feederDone: make(chan struct{}), faultsDone: g.faultsDone}
	if err := p.resubscribe(ctx, lg); err != nil {
		return err
	}
	p.cur.Store(lg)
	h.takeovers.Add(1)
	l := &leadership{}
	if s.nats != nil {
		pctx, stop := context.WithCancel(context.Background())
		l.cancelPub, l.pubDone = stop, make(chan struct{})
		if err := s.nats.start(p, hb, pctx, l.pubDone); err != nil {
			stop()
			close(l.pubDone)
			p.log.Error("replica: starting the NATS fan-out", "err", err)
		}
	}
	sctx, stopSources := context.WithCancel(context.Background())
	l.cancelSources = stopSources
	l.sources = s.runSources(sctx, p)
	h.mu.Lock()
	h.lead = l
	h.mu.Unlock()
	return nil
}

// retire is a generation's Close: the node stopped leading (or following)
// with it. The generation stops serving at once; the fan-out is cancelled
// without end frames (a deposed leader's late frame under its incarnation
// would deactivate router lanes), then the sources stop, then the actor is
// fenced — what it holds that no record covers is not the group's.
func (h *haPool) retire(g *poolGen) {
	p := h.p
	target := p.gen()
	if target.handle != g.handle {
		target = g // a standby's generation that never led
	}
	if target.leading {
		ng := *target
		ng.leading = false
		p.cur.Store(&ng)
	}
	h.stopLeadership()
	if h.stopping.Load() {
		target.hub.Close(errShuttingDown)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(h.s.cfg.ShutdownGrace))
	defer cancel()
	if err := p.stopGen(ctx, target, true); err != nil && !errors.Is(err, producer.ErrFenced) && !errors.Is(err, producer.ErrShuttingDown) {
		p.log.Warn("replica: stopping the pool's actor", "err", err)
	}
}

// stopLeadership cancels what the current term runs and waits for it.
func (h *haPool) stopLeadership() {
	h.mu.Lock()
	l := h.lead
	h.mu.Unlock()
	if l == nil {
		return
	}
	if l.cancelPub != nil {
		l.cancelPub()
		<-l.pubDone
	}
	l.cancelSources()
	for _, rs := range l.sources {
		<-rs.done
	}
	h.s.sources.set(h.p.spec.Name, nil)
	h.mu.Lock()
	h.lead = nil // only now: nil says the term's publisher and sources have returned
	h.mu.Unlock()
}

// stop is the relay's shutdown of a replicated pool: stop admitting, wait
// (bounded by ctx) until what was admitted is in a stored record, then
// resign, so a standby takes over at once instead of after the lease TTL.
func (h *haPool) stop(ctx context.Context) error {
	h.stopping.Store(true)
	if h.node == nil { // never started
		return nil
	}
	h.mu.Lock()
	l := h.lead
	h.mu.Unlock()
	if l != nil {
		l.cancelSources()
		for _, rs := range l.sources {
			<-rs.done
		}
	}
	if g := h.p.gen(); g.leading {
		if err := g.handle.Barrier(ctx); err == nil {
			_ = h.node.WaitAcked(ctx, g.rec.Position())
		}
	}
	h.node.Resign()
	select {
	case <-h.done:
		return nil
	case <-ctx.Done():
		h.cancel()
		return ctx.Err()
	}
}

// notLeader is a standby's answer to what only the leader serves.
func (h *haPool) notLeader() *apiError {
	st := h.node.Status()
	hint := parseAdvertisement(st.Leader, st.Address)
	msg := "this replica stands by for pool " + h.p.spec.Name
	if hint.URL != "" && st.Role != replica.RoleLeader {
		msg += "; its leader " + hint.Node + " serves at " + hint.URL
	} else {
		msg += "; no leader is known yet: retry"
	}
	ae := apiErr(503, CodeNotLeader, msg)
	if st.Role != replica.RoleLeader && hint.URL != "" {
		ae.leader = &hint
	}
	return ae
}

// serving returns the pool's current generation if it serves (always
// without HA), else a standby's not_leader error.
func (p *hostedPool) serving() (*poolGen, error) {
	g := p.gen()
	if g.leading && (p.ha == nil || p.ha.leadsNow()) {
		return g, nil
	}
	if p.ha == nil || p.ha.node == nil {
		return nil, apiErr(503, CodeNotLeader, "pool "+p.spec.Name+" is starting")
	}
	return nil, p.ha.notLeader()
}

// awaitRecorded holds a leader's answer until everything admitted before
// the call is in a stored record (at once without HA): the actor applies
// what was queued before a Barrier first, so the journal position read
// after it covers the caller's admissions.
func (p *hostedPool) awaitRecorded(ctx context.Context, g *poolGen) error {
	if g.rec == nil {
		return nil
	}
	if err := g.handle.Barrier(ctx); err != nil {
		return err
	}
	err := p.ha.node.WaitAcked(ctx, g.rec.Position())
	if errors.Is(err, replica.ErrNotLeader) {
		return apiErr(503, CodeNotLeader, "this replica stopped leading pool "+p.spec.Name+
			" before the request's commands were replicated: they are not the group's; resend them to the leader")
	}
	return err
}

// recordedSink is a leader's sink for its sources: Durable (a Dynamo
// JetStream source acknowledges only after it) waits for the stored record.
type recordedSink struct {
	producer.Handle
	p *hostedPool
	g *poolGen
}

var _ dynamonats.DurableSink = recordedSink{}

// Durable implements dynamonats.DurableSink.
func (r recordedSink) Durable(ctx context.Context) error { return r.p.awaitRecorded(ctx, r.g) }

// haLookupBudget bounds the NATS lookups of one pool's HA status (a
// standby's tail, the lease holder), whoever asks (the catalog, a metrics
// scrape): without a NATS majority they wait out their context, and the
// status must still answer — with the role, which is what tells an
// operator the pool stood down.
const haLookupBudget = 300 * time.Millisecond

// HAStatus is a replicated pool's status (the catalog's "ha" block); ok is
// false without HA. Its NATS lookups take at most haLookupBudget.
func (p *hostedPool) haStatus(ctx context.Context) (*catalog.HA, bool) {
	if p.ha == nil || p.ha.node == nil {
		return nil, false
	}
	ctx, cancel := context.WithTimeout(ctx, haLookupBudget)
	defer cancel()
	st := p.ha.node.Status()
	out := &catalog.HA{Role: st.Role.String(), Leader: st.Leader, LeaderAddress: parseAdvertisement(st.Leader, st.Address).URL,
		Term: catalog.U64(st.Term), Applied: catalog.U64(st.Applied), Takeovers: catalog.U64(p.ha.takeovers.Load()),
		Rebuilds: catalog.U64(st.Rebuilds), Halted: st.Halted, LastError: st.LastError}
	if s := p.ha.stopped.Load(); s != nil {
		out.Stopped = *s
	}
	if p.ha.s.ha != nil && p.ha.s.ha.checkpoints != nil {
		out.Checkpoint = &catalog.HACheckpoint{Loaded: catalog.U64(st.Loaded), Stored: catalog.U64(st.Checkpoint),
			PurgedBelow: catalog.U64(st.PurgedBelow)}
	}
	if st.Role == replica.RoleStandby {
		read, fresh := p.ha.tail(ctx)
		tail := max(st.Tail, read)
		out.Lag = catalog.U64(tail - min(tail, st.Applied))
		out.LagUnknown = !fresh
		out.DuplicateNodeID = p.ha.duplicate.Load()
	} else {
		p.ha.duplicate.Store(false)
	}
	return out, true
}

// tailTTL bounds how often the catalog and the metrics ask the stream for
// a standby's tail: a flood of catalog requests costs NATS at most one
// request per pool per tailTTL.
const tailTTL = time.Second

// tail returns the pool's last record's stream sequence, read at most once
// per tailTTL (0 when it was never read), and whether a read succeeded
// within the last tailStale: a standby cut off from NATS otherwise reported
// the lag of its last good read — 0 — while it fell behind. The same read
// checks the lease for a duplicate node id (see duplicate).
func (h *haPool) tail(ctx context.Context) (uint64, bool) {
	h.tailMu.Lock()
	defer h.tailMu.Unlock()
	if time.Since(h.tailAt) >= tailTTL {
		h.tailAt = time.Now()
		if subject, err := replica.Subject("", h.p.spec.Name); err == nil {
			if t, err := replica.Tail(ctx, h.s.ha.stream, subject); err == nil {
				h.tailSeq, h.tailReadAt = t, time.Now()
			}
		}
		h.checkDuplicate(ctx)
	}
	return h.tailSeq, !h.tailReadAt.IsZero() && time.Since(h.tailReadAt) < tailStale
}

// tailStale: a tail read older than this makes a standby's lag unknown.
const tailStale = 3 * tailTTL

// checkDuplicate (under tailMu, while standing by): a lease held under this
// replica's own node id is either its own crashed predecessor's, which
// expires within the TTL, or another live relay's configured with the same
// node id, which goes on being renewed. Past two TTLs of renewals it is the
// latter: say so (catalog, metric, an error log line) — the group cannot
// tell the two relays apart in its term records.
func (h *haPool) checkDuplicate(ctx context.Context) {
	holder, rev, err := h.s.ha.leases.Holder(ctx, h.p.spec.Name)
	switch {
	case err != nil || holder.Node != h.s.cfg.HA.NodeID || h.node.Acquired(holder.Token):
		// This relay's own lease (a takeover it is failing) is no
		// duplicate: only a token it never held is.
		h.dupSince, h.dupRev = time.Time{}, 0
		h.duplicate.Store(false)
	case h.dupSince.IsZero():
		h.dupSince, h.dupRev = time.Now(), rev
	case rev != h.dupRev && time.Since(h.dupSince) > 2*h.s.ha.leases.TTL():
		if !h.duplicate.Swap(true) {
			h.p.log.Error("replica: another relay leads this pool under this relay's node id: give every replica its own --node-id",
				"node_id", h.s.cfg.HA.NodeID, "holder_address", holder.Address)
		}
	}
}

// Leader reports, for a pool this relay stands by for, where its leader
// serves; ok is false when the relay serves the pool (or runs no HA).
func (k KvPool) Leader() (hint LeaderHint, ok bool) {
	if _, err := k.p.serving(); err == nil {
		return LeaderHint{}, false
	}
	if k.p.ha == nil || k.p.ha.node == nil {
		return LeaderHint{}, true
	}
	st := k.p.ha.node.Status()
	if st.Role == replica.RoleLeader {
		return LeaderHint{}, true
	}
	return parseAdvertisement(st.Leader, st.Address), true
}

// haCollector exports each replicated pool's role, term, takeovers, lag and
// rebuilds at scrape time.
type haCollector struct {
	pools                                        func() []*hostedPool
	role, term, takeovers, lag, replErrors, dups *prometheus.Desc
}

func newHACollector(pools func() []*hostedPool) *haCollector {
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, []string{"pool"}, nil)
	}
	return &haCollector{pools: pools,
		role:       d("ckfrelay_ha_leader", "1 while this replica leads the pool, 0 while it stands by."),
		term:       d("ckfrelay_ha_term", "The pool's current term (lease revision) as this replica knows it."),
		takeovers:  d("ckfrelay_ha_takeovers_total", "Times this replica became the pool's leader."),
		lag:        d("ckfrelay_ha_lag_records", "A standby's distance to the pool's last record (stream sequences; 0 on the leader)."),
		replErrors: d("ckfrelay_ha_replication_errors_total", "Pools discarded and rebuilt from the records stream: a lost lease, a refused or unstored append, a broken chain."),
		dups:       d("ckfrelay_ha_duplicate_node_id", "1 while another live relay leads the pool under this relay's node id (a misconfiguration)."),
	}
}

func (c *haCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.role, c.term, c.takeovers, c.lag, c.replErrors, c.dups} {
		ch <- d
	}
}

func (c *haCollector) Collect(ch chan<- prometheus.Metric) {
	for _, p := range c.pools() {
		st, ok := p.haStatus(context.Background())
		if !ok {
			continue
		}
		name := p.spec.Name
		leader := 0.0
		if st.Role == replica.RoleLeader.String() {
			leader = 1
		}
		ch <- prometheus.MustNewConstMetric(c.role, prometheus.GaugeValue, leader, name)
		ch <- prometheus.MustNewConstMetric(c.term, prometheus.GaugeValue, float64(st.Term), name)
		ch <- prometheus.MustNewConstMetric(c.takeovers, prometheus.CounterValue, float64(st.Takeovers), name)
		ch <- prometheus.MustNewConstMetric(c.lag, prometheus.GaugeValue, float64(st.Lag), name)
		ch <- prometheus.MustNewConstMetric(c.replErrors, prometheus.CounterValue, float64(st.Rebuilds), name)
		dup := 0.0
		if st.DuplicateNodeID {
			dup = 1
		}
		ch <- prometheus.MustNewConstMetric(c.dups, prometheus.GaugeValue, dup, name)
	}
}

// runSources starts pool p's sources, admitting into its current
// generation, until ctx ends.
func (s *Server) runSources(ctx context.Context, p *hostedPool) []*runningSource {
	var out []*runningSource
	sink := p.sink()
	for _, spec := range p.spec.Sources {
		src, err := newSource(spec, p.spec, s.cfg, s.log.With("pool", p.spec.Name))
		if err != nil { // validated at start
			p.log.Error("source", "err", err)
			continue
		}
		if r, ok := src.(resumer); ok && p.ha != nil && p.ha.node != nil {
			// A new leader's engines resume after what the group holds.
			r.Resume(p.ha.node.Cursors())
		}
		rs := &runningSource{pool: p.spec.Name, src: src, done: make(chan struct{})}
		go func(sink source.Sink) {
			defer close(rs.done)
			if err := src.Run(ctx, sink); err != nil && ctx.Err() == nil {
				p.log.Error("source stopped", "source", src.Status().Name, "err", err)
			}
		}(sink)
		out = append(out, rs)
	}
	s.sources.set(p.spec.Name, out)
	return out
}

// resumer is a source that can start after the cursors the records carry
// (the ZMQ source: each engine rank after its last admitted sequence; the
// Dynamo source: each member after its publisher's last admitted envelope).
type resumer interface{ Resume([]producer.Cursor) }

// StandbyLeader reports, for a relay with HA that leads none of its pools,
// where the first pool's leader serves: a replica answering only standby
// errors sends a client to that leader. ok is false when the relay leads a
// pool or runs without HA.
func (s *Server) StandbyLeader() (hint LeaderHint, ok bool) {
	if s.ha == nil {
		return LeaderHint{}, false
	}
	for _, p := range s.order {
		if p.gen().leading {
			return LeaderHint{}, false
		}
	}
	hint, _ = KvPool{p: s.order[0], s: s}.Leader()
	return hint, true
}
