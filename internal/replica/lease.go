package replica

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// The lease: one key per pool in a JetStream KV bucket whose TTL is the
// lease's. Create takes it (it succeeds only on an absent, deleted or
// expired key: nats.go v1.55.0 jetstream/kv.go Create publishes expecting
// subject sequence 0, or the delete/expiry marker's revision), Update with
// the held revision renews it (a stale revision fails: kv.go Update), and
// the bucket's LimitMarkerTTL makes the server leave a marker when the key
// expires, so standbys watch for it instead of polling. The value names the
// holder with a random token, so a renewal whose acknowledgement was lost
// is recognised by re-reading the key instead of being abandoned.

// DefaultLeaseBucket is the lease bucket's name.
const DefaultLeaseBucket = "CKFRELAY_HA_LEASE"

// LeaseConfig configures the lease bucket.
type LeaseConfig struct {
	Bucket string // default DefaultLeaseBucket
	// TTL is the lease: a leader that cannot renew for this long has lost
	// it. ≥ 100ms (the server's least MaxAge); default 3s.
	TTL time.Duration
	// Margin is subtracted from the leader's deadline: it covers the
	// difference between the relay's clock and the KV stream leader's
	// (the key expires by the latter's wall clock). Default TTL/5.
	Margin   time.Duration
	Replicas int // default 3
}

func (c LeaseConfig) withDefaults() LeaseConfig {
	if c.Bucket == "" {
		c.Bucket = DefaultLeaseBucket
	}
	if c.TTL == 0 {
		c.TTL = 3 * time.Second
	}
	if c.Margin == 0 {
		c.Margin = c.TTL / 5
	}
	if c.Replicas == 0 {
		c.Replicas = 3
	}
	return c
}

// Leases is the lease bucket.
type Leases struct {
	kv  jetstream.KeyValue
	cfg LeaseConfig
}

// OpenLeases creates the lease bucket, or opens the one that exists.
//
// An existing bucket's TTL is the lease: the server expires keys by it,
// whatever this replica was configured with. A replica started with a
// shorter ha.lease_ttl used to rewrite it, so the running leader's key
// expired at once while the leader, counting its own longer TTL, went on
// serving — two leaders until its next renewal (red-team HA F0). So an
// existing bucket's TTL wins: Leases counts with it (TTL reports it) and
// the margin scales with it when it was not set. The replica count is
// raised to the configured one, never lowered (one replica started with
// ha.stream_replicas 1 downgraded the whole group's bucket).
func OpenLeases(ctx context.Context, js jetstream.JetStream, cfg LeaseConfig) (*Leases, error) {
	marginSet := cfg.Margin != 0
	cfg = cfg.withDefaults()
	if cfg.TTL < 100*time.Millisecond || cfg.Margin < 0 || cfg.Margin >= cfg.TTL {
		return nil, fmt.Errorf("replica: lease ttl %v must be ≥ 100ms and margin %v within [0, ttl)", cfg.TTL, cfg.Margin)
	}
	want := jetstream.KeyValueConfig{
		Bucket:   cfg.Bucket,
		History:  1,
		TTL:      cfg.TTL,
		Storage:  jetstream.FileStorage,
		Replicas: cfg.Replicas,
		// The server keeps markers ≥ 1s (server/stream.go: "subject delete
		// marker TTL must be at least 1 second").
		LimitMarkerTTL: max(time.Second, cfg.TTL),
	}
	kv, err := openOrCreate(ctx,
		func(ctx context.Context) (jetstream.KeyValue, error) { return js.KeyValue(ctx, cfg.Bucket) },
		func(ctx context.Context) (jetstream.KeyValue, error) { return js.CreateKeyValue(ctx, want) })
	if err != nil {
		return nil, fmt.Errorf("replica: lease bucket %s: %w", cfg.Bucket, err)
	}
	st, err := kv.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("replica: lease bucket %s: %w", cfg.Bucket, err)
	}
	have := st.Config()
	if have.TTL < 100*time.Millisecond || have.LimitMarkerTTL == 0 {
		return nil, fmt.Errorf("replica: lease bucket %s has ttl %v and marker ttl %v: a lease needs a ttl ≥ 100ms and expiry markers; delete the bucket and let the relay create it",
			cfg.Bucket, have.TTL, have.LimitMarkerTTL)
	}
	if have.TTL != cfg.TTL {
		cfg.TTL = have.TTL
		if !marginSet || cfg.Margin >= cfg.TTL {
			cfg.Margin = cfg.TTL / 5
		}
	}
	if have.Replicas < cfg.Replicas {
		if err := raiseStreamReplicas(ctx, js, "KV_"+cfg.Bucket, cfg.Replicas); err != nil {
			return nil, fmt.Errorf("replica: lease bucket %s: raising its replicas to %d: %w", cfg.Bucket, cfg.Replicas, err)
		}
	}
	return &Leases{kv: kv, cfg: cfg}, nil
}

// TTL is the lease's time to live: the bucket's, which may differ from the
// one configured (OpenLeases).
func (ls *Leases) TTL() time.Duration { return ls.cfg.TTL }

// Holder is a lease's value: who holds it and where it serves.
type Holder struct {
	Node    string `json:"node"`
	Address string `json:"address,omitempty"`
	Token   string `json:"token"`
}

// HeldError: another replica holds the lease.
type HeldError struct {
	Holder   Holder
	Revision uint64 // of the holder's latest renewal
}

func (e *HeldError) Error() string {
	return fmt.Sprintf("replica: the lease is held by %s (%s), revision %d", e.Holder.Node, e.Holder.Address, e.Revision)
}

// ErrLost: the lease is no longer this holder's (it expired and another
// took it, or it was released).
var ErrLost = errors.New("replica: lease lost")

// Lease is one held lease. It is not safe for concurrent use: one
// goroutine renews it.
type Lease struct {
	ls    *Leases
	key   string
	value []byte
	token string
	term  uint64
	rev   uint64
	// deadline is when the holder stops acting as leader, on boottime: the
	// send time of the last renewal known to be stored + TTL − margin.
	deadline time.Duration
	// unacked is the send time of the earliest renewal whose outcome is
	// unknown (0: none): if one of them turns out stored, its expiry
	// counts from no earlier than this.
	unacked time.Duration
}

// Acquire takes pool's lease for node (serving at address) if it is free.
// A lease held by another returns a *HeldError.
func (ls *Leases) Acquire(ctx context.Context, pool, node, address string) (*Lease, error) {
	if !poolToken.MatchString(pool) {
		return nil, fmt.Errorf("replica: pool %q must match %s", pool, poolToken)
	}
	var tok [16]byte
	_, _ = rand.Read(tok[:])
	h := Holder{Node: node, Address: address, Token: hex.EncodeToString(tok[:])}
	value, err := json.Marshal(h)
	if err != nil {
		return nil, err
	}
	l := &Lease{ls: ls, key: pool, value: value, token: h.Token}
	send := boottime()
	rev, err := ls.kv.Create(ctx, pool, value)
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) {
			cur, rev, herr := ls.Holder(ctx, pool)
			if herr != nil {
				return nil, fmt.Errorf("replica: lease of %s is held, holder unreadable: %w", pool, herr)
			}
			return nil, &HeldError{Holder: cur, Revision: rev}
		}
		// The Create may have been stored with its acknowledgement lost.
		cur, term, herr := ls.Holder(ctx, pool)
		if herr != nil || cur.Token != h.Token {
			return nil, fmt.Errorf("replica: acquire lease of %s: %w", pool, err)
		}
		rev = term
	}
	l.term, l.rev = rev, rev
	l.deadline = send + ls.cfg.TTL - ls.cfg.Margin
	return l, nil
}

// Holder reads pool's current holder and the revision of its value (the
// term, for a key that has not been renewed since). A free lease returns
// jetstream.ErrKeyNotFound.
func (ls *Leases) Holder(ctx context.Context, pool string) (Holder, uint64, error) {
	e, err := ls.kv.Get(ctx, pool)
	if errors.Is(err, jetstream.ErrKeyDeleted) {
		err = jetstream.ErrKeyNotFound
	}
	if err != nil {
		return Holder{}, 0, err
	}
	var h Holder
	if err := json.Unmarshal(e.Value(), &h); err != nil {
		return Holder{}, 0, fmt.Errorf("replica: lease of %s holds %q: %w", pool, e.Value(), err)
	}
	return h, e.Revision(), nil
}

// Term is the lease's term: the revision Create stored. Revisions are
// sequences of the bucket's stream, so a later acquisition's term is larger.
func (l *Lease) Term() uint64 { return l.term }

// Token is the holder's random token.
func (l *Lease) Token() string { return l.token }

// Valid reports whether the holder may still act as leader: now (on
// CLOCK_BOOTTIME) is before its deadline.
func (l *Lease) Valid() bool { return boottime() < l.deadline }

// Remaining is how long the holder may still act as leader (≤ 0: not).
func (l *Lease) Remaining() time.Duration { return l.deadline - boottime() }

// Renew extends the lease. A renewal whose outcome is unknown (a timeout)
// returns the error and keeps the deadline; one that was stored without its
// acknowledgement is recognised by re-reading the key (the token is ours,
// the revision moved). ErrLost means another holds it or it is gone: stop
// acting as leader now.
func (l *Lease) Renew(ctx context.Context) error {
	send := boottime()
	if l.unacked == 0 {
		l.unacked = send
	}
	rev, err := l.ls.kv.Update(ctx, l.key, l.value, l.rev)
	if err == nil {
		// This very renewal was stored: no earlier one can have been
		// (each expected the same revision).
		l.rev, l.deadline, l.unacked = rev, send+l.ls.cfg.TTL-l.ls.cfg.Margin, 0
		return nil
	}
	cur, curRev, herr := l.ls.Holder(ctx, l.key)
	switch {
	case errors.Is(herr, jetstream.ErrKeyNotFound):
		return fmt.Errorf("%w: the key of %s expired or was deleted", ErrLost, l.key)
	case herr != nil:
		return fmt.Errorf("replica: renew lease of %s: %w (re-read: %v)", l.key, err, herr)
	case cur.Token != l.token:
		return fmt.Errorf("%w: %s holds %s now", ErrLost, cur.Node, l.key)
	case curRev != l.rev:
		// One of our renewals was stored, its acknowledgement lost; it was
		// sent no earlier than the earliest unacknowledged one.
		l.rev, l.deadline, l.unacked = curRev, l.unacked+l.ls.cfg.TTL-l.ls.cfg.Margin, 0
		return nil
	}
	return fmt.Errorf("replica: renew lease of %s: %w", l.key, err)
}

// Release deletes the key if this lease still holds it, so a standby takes
// over at once instead of after the TTL. The holder stops acting as leader
// before calling it.
func (l *Lease) Release(ctx context.Context) error {
	l.deadline = 0
	return l.ls.kv.Delete(ctx, l.key, jetstream.LastRevision(l.rev))
}

// WatchFree returns a channel that receives whenever pool's lease is free:
// at once if it is, then at every delete or expiry marker. Call stop when
// done.
func (ls *Leases) WatchFree(ctx context.Context, pool string) (free <-chan struct{}, stop func(), err error) {
	w, err := ls.kv.Watch(ctx, pool)
	if err != nil {
		return nil, nil, fmt.Errorf("replica: watch lease of %s: %w", pool, err)
	}
	ch := make(chan struct{}, 1)
	done := make(chan struct{})
	go func() {
		held := false
		for {
			select {
			case <-done:
				return
			case e, ok := <-w.Updates():
				if !ok {
					return
				}
				switch {
				case e == nil: // the initial values are delivered
					if held {
						continue
					}
				case e.Operation() == jetstream.KeyValuePut:
					held = true
					continue
				default: // a delete, or the expiry marker (a purge)
					held = false
				}
				select {
				case ch <- struct{}{}:
				default:
				}
			}
		}
	}()
	// Stop unsubscribes the watch's consumer, a request that waits for a
	// JetStream answer (seconds without a NATS majority): it must not hold
	// up a leader's step-down or a standby's next move.
	return ch, func() { close(done); go func() { _ = w.Stop() }() }, nil
}
