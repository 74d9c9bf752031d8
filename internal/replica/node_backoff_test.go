package replica

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/internal/testing/natstest"
)

// rebuildLog hands the back-off of every "rebuilding the pool" log line to
// the test, in order: what Run waits before its next rebuild.
type rebuildLog struct{ after chan time.Duration }

func (h rebuildLog) Enabled(context.Context, slog.Level) bool { return true }

func (h rebuildLog) Handle(_ context.Context, r slog.Record) error {
	if r.Message == "replica: rebuilding the pool from the stream" {
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "after" {
				h.after <- a.Value.Duration()
			}
			return true
		})
	}
	return nil
}

func (h rebuildLog) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h rebuildLog) WithGroup(string) slog.Handler      { return h }

// TestNodeRebuildBackOffStartsAnewAfterHealthyFollowing: a standby whose
// pool refuses a record (the replicas diverged) rebuilds with a back-off
// that doubles while rebuilds fail at once — but a standby that followed
// for healthyStandby before it failed starts again at the shortest one,
// not at a back-off left over from failures long ago (it doubled to 30 s
// across failures hours apart). The clock Run reads is the test's: the
// standby "followed for" 10 s without the test waiting for it.
func TestNodeRebuildBackOffStartsAnewAfterHealthyFollowing(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := srv.JetStream(t)
	ctx := t.Context()
	ls, err := OpenLeases(ctx, js, LeaseConfig{TTL: time.Minute, Replicas: 1})
	require.NoError(t, err)
	s, err := EnsureStream(ctx, js, StreamConfig{Replicas: 1})
	require.NoError(t, err)
	// Another replica leads for the whole test: its chain holds a term
	// record and a batch of one admitted event.
	_, err = ls.Acquire(ctx, "pool", "other", "")
	require.NoError(t, err)
	subject, _ := Subject("", "pool")
	app := NewAppender(js, s, subject, 1, 0, 0)
	require.NoError(t, app.Term(ctx, TermRecord{Node: "other"}))
	event := func(i uint64) []Command {
		return []Command{{Kind: KindAdmitted, SourceEpoch: 1, Event: ckf.RouterEvent{WorkerID: 3, EventID: i, Kind: ckf.EventStored,
			Blocks: []ckf.StoredBlock{{BlockHash: 300 + i, TokensHash: i}}}}}
	}
	require.NoError(t, app.Append(ctx, 0, event(0)))

	var (
		offset atomic.Int64 // added to the node's clock
		broken atomic.Int32 // pools still to start broken
		mu     sync.Mutex
		pools  []*replica
	)
	broken.Store(3)
	log := rebuildLog{after: make(chan time.Duration, 64)}
	tn := startNodeWith(t, srv, ls, "b", nil, 0, func(c *NodeConfig) {
		c.now = func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
		c.Logger = slog.New(log)
		c.NewPool = func() (Pool, error) {
			if broken.Add(-1) >= 0 {
				// A pool whose actor refuses every command: the first
				// batch replayed fails, and the standby rebuilds at once.
				return Pool{Recorder: NewRecorder(1 << 16)}, nil
			}
			r, stop, err := startReplicaImage(64, nil)
			if err != nil {
				return Pool{}, err
			}
			mu.Lock()
			pools = append(pools, r)
			mu.Unlock()
			return Pool{Handle: r.h, Recorder: r.rec, Close: stop}, nil
		}
	})
	next := func() time.Duration {
		t.Helper()
		select {
		case d := <-log.after:
			return d
		case <-time.After(10 * time.Second):
			require.FailNow(t, "no rebuild", "status %+v", tn.n.Status())
			return 0
		}
	}
	// Rebuilds that fail at once double the back-off.
	for _, want := range []time.Duration{minRebuildBackoff, 2 * minRebuildBackoff, 4 * minRebuildBackoff} {
		assert.Equal(t, want, next())
	}
	following := func() *replica {
		t.Helper()
		require.Eventually(t, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(pools) > 0 && tn.n.Status().Applied == app.Last()
		}, 10*time.Second, 5*time.Millisecond, "the standby does not follow the chain")
		mu.Lock()
		defer mu.Unlock()
		return pools[len(pools)-1]
	}
	// breakPool makes the following standby's pool refuse the next record,
	// and appends it.
	breakPool := func(r *replica, i uint64) {
		t.Helper()
		require.NoError(t, r.h.Shutdown(ctx))
		require.NoError(t, app.Append(ctx, i, event(i)))
	}

	// The fourth pool follows; by the node's clock it does so for
	// healthyStandby before its pool refuses a record: the back-off starts
	// anew (without the reset it would be 8 × the shortest).
	r := following()
	offset.Add(int64(healthyStandby))
	breakPool(r, 1)
	assert.Equal(t, minRebuildBackoff, next(), "a standby that followed for %v rebuilt after a back-off left from earlier failures", healthyStandby)

	// A standby that fails again soon after doubles it as before: the
	// reset is for a healthy run, not for every failure.
	r = following()
	breakPool(r, 2)
	assert.Equal(t, 2*minRebuildBackoff, next())
	following()
	assert.EqualValues(t, 5, tn.n.Status().Rebuilds)
}
