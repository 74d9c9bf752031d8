package replica

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/internal/testing/natstest"
)

func openLeases(t *testing.T, ttl time.Duration) (*Leases, jetstream.KeyValue) {
	t.Helper()
	srv := natstest.Start(t, natstest.Options{})
	_, js := srv.JetStream(t)
	ls, err := OpenLeases(t.Context(), js, LeaseConfig{TTL: ttl, Replicas: 1})
	require.NoError(t, err)
	kv, err := js.KeyValue(t.Context(), DefaultLeaseBucket)
	require.NoError(t, err)
	return ls, kv
}

// TestLeaseExclusive: Create takes a free lease, a second Create is refused
// with the holder named, Update with the held revision renews without
// changing the term, and a renewal with a stale revision (a holder that
// lost track) is refused.
func TestLeaseExclusive(t *testing.T) {
	ls, kv := openLeases(t, 30*time.Second)
	ctx := t.Context()
	a, err := ls.Acquire(ctx, "pool-1", "node-a", "http://a:8080")
	require.NoError(t, err)
	assert.True(t, a.Valid())
	assert.Greater(t, a.Remaining(), 20*time.Second)

	_, err = ls.Acquire(ctx, "pool-1", "node-b", "http://b:8080")
	var held *HeldError
	require.ErrorAs(t, err, &held)
	assert.Equal(t, "node-a", held.Holder.Node)
	assert.Equal(t, "http://a:8080", held.Holder.Address)

	term := a.Term()
	require.NoError(t, a.Renew(ctx))
	require.NoError(t, a.Renew(ctx))
	assert.Equal(t, term, a.Term(), "renewals keep the term")

	// Another pool's lease is independent, and its term is later.
	b, err := ls.Acquire(ctx, "pool-2", "node-b", "")
	require.NoError(t, err)
	assert.Greater(t, b.Term(), term)

	// The stale-revision refusal the fencing relies on (kv.Update).
	_, err = kv.Update(ctx, "pool-1", []byte(`{"node":"x","token":"y"}`), term)
	require.ErrorIs(t, err, jetstream.ErrKeyRevisionMismatch)
}

// TestLeaseRenewalWithLostAck: a renewal that was stored but whose
// acknowledgement never came is recovered by re-reading the key (our token,
// a newer revision), not abandoned; one overwritten by another holder is
// ErrLost.
func TestLeaseRenewalWithLostAck(t *testing.T) {
	ls, kv := openLeases(t, 30*time.Second)
	ctx := t.Context()
	a, err := ls.Acquire(ctx, "p", "node-a", "")
	require.NoError(t, err)
	// Our renewal lands, its ack is lost: the key moved to a revision the
	// lease does not know, with our value.
	e, err := kv.Get(ctx, "p")
	require.NoError(t, err)
	_, err = kv.Update(ctx, "p", e.Value(), e.Revision())
	require.NoError(t, err)
	require.NoError(t, a.Renew(ctx), "the stored renewal is recognised")
	require.NoError(t, a.Renew(ctx), "and the lease renews on from its revision")

	// Someone else's value under the key: lost.
	e, err = kv.Get(ctx, "p")
	require.NoError(t, err)
	_, err = kv.Update(ctx, "p", []byte(`{"node":"thief","token":"00"}`), e.Revision())
	require.NoError(t, err)
	require.ErrorIs(t, a.Renew(ctx), ErrLost)
}

// TestLeaseExpiryFencesByTime: a holder that stops renewing (a SIGSTOPped
// leader) is past its own deadline — on CLOCK_BOOTTIME, with the margin —
// by the time a standby, woken by the server's expiry marker, has taken
// the lease; its later renewal is refused; the new term is larger. Release
// frees a lease at once.
func TestLeaseExpiryFencesByTime(t *testing.T) {
	const ttl = time.Second
	ls, _ := openLeases(t, ttl)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	a, err := ls.Acquire(ctx, "p", "node-a", "")
	require.NoError(t, err)

	free, stop, err := ls.WatchFree(ctx, "p")
	require.NoError(t, err)
	defer stop()
	start := time.Now()
	var b *Lease
	for b == nil {
		select {
		case <-free:
		case <-ctx.Done():
			require.Fail(t, "no expiry marker")
		}
		b, err = ls.Acquire(ctx, "p", "node-b", "")
		var held *HeldError
		if err != nil {
			require.ErrorAs(t, err, &held)
		}
	}
	took := time.Since(start)
	assert.False(t, a.Valid(), "the old holder still believes it leads after the new one took over")
	assert.Greater(t, b.Term(), a.Term())
	assert.GreaterOrEqual(t, took, ttl-ttl/5-50*time.Millisecond, "taken before the old lease could have expired")
	require.ErrorIs(t, a.Renew(ctx), ErrLost)
	t.Logf("takeover after %v (ttl %v)", took, ttl)

	// Release: the next holder need not wait for the TTL.
	require.NoError(t, b.Release(ctx))
	assert.False(t, b.Valid())
	select {
	case <-free:
	case <-ctx.Done():
		require.Fail(t, "no delete marker")
	}
	c, err := ls.Acquire(ctx, "p", "node-c", "")
	require.NoError(t, err)
	assert.Greater(t, c.Term(), b.Term())
}

// TestOpenLeases_KeepsTheGroupsTTL: a replica started with a shorter
// ha.lease_ttl than the group's does not rewrite the bucket's TTL — that
// expired the running leader's key at once while the leader, counting its
// own TTL, went on serving: two leaders (red-team HA F0). It leases with
// the bucket's TTL instead.
func TestOpenLeases_KeepsTheGroupsTTL(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := srv.JetStream(t)
	ctx := t.Context()
	long, err := OpenLeases(ctx, js, LeaseConfig{TTL: 30 * time.Second, Replicas: 1})
	require.NoError(t, err)
	held, err := long.Acquire(ctx, "pool", "leader", "")
	require.NoError(t, err)

	short, err := OpenLeases(ctx, js, LeaseConfig{TTL: time.Second, Replicas: 1})
	require.NoError(t, err)
	require.Equal(t, 30*time.Second, short.TTL(), "the newcomer does not lease with the group's TTL")
	require.Equal(t, 6*time.Second, short.cfg.Margin)
	// Past the newcomer's TTL the leader's key still stands.
	require.Never(t, func() bool {
		_, err := short.Acquire(ctx, "pool", "newcomer", "")
		return err == nil
	}, 2*time.Second, 100*time.Millisecond, "a second replica took a lease the first one still holds")
	require.True(t, held.Valid())
}
