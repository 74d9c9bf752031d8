package replica

import (
	"context"
	"math"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/internal/testing/natstest"
)

// A group whose records subject was written or purged by something that
// is not one of its replicas (the red team's F2 and F3: NATS has no
// per-message authentication, so only permissions keep others off the
// subject — docs/deploy.md). What the replicas must still never do: lead
// a chain no standby can follow, or lead what is left of a purged subject
// as if it were the pool.

// startLedGroup starts a group on a fresh server — a leads with ten
// admitted events, b stands by converged on them — with a 1 s lease, and
// returns the records stream and the pool's subject.
func startLedGroup(t *testing.T) (jetstream.JetStream, jetstream.Stream, string, *testNode, *testNode) {
	t.Helper()
	srv := natstest.Start(t, natstest.Options{})
	_, js := srv.JetStream(t)
	ls, err := OpenLeases(t.Context(), js, LeaseConfig{TTL: time.Second, Replicas: 1})
	require.NoError(t, err)
	a := startNode(t, srv, ls, "a")
	a.waitRole(t, RoleLeader, 10*time.Second)
	b := startNode(t, srv, ls, "b")
	b.waitRole(t, RoleStandby, 10*time.Second)
	admit(t, a.replica(), 1, 0, 10)
	converged(t, a, b)
	s, err := js.Stream(t.Context(), DefaultStream)
	require.NoError(t, err)
	subject, _ := Subject("", "pool")
	return js, s, subject, a, b
}

// TestNodeDoesNotLeadBelowAForeignTerm: a forged term record far beyond
// any lease revision is on the chain. No replica appends a term record
// below it (a standby could never apply it: the group would look led and
// have no hot standby); both keep their state and say why in the log.
func TestNodeDoesNotLeadBelowAForeignTerm(t *testing.T) {
	ctx := t.Context()
	js, s, subject, a, b := startLedGroup(t)
	tail, err := Tail(ctx, s, subject)
	require.NoError(t, err)
	forger := NewAppender(js, s, subject, math.MaxInt64, tail, 0)
	require.NoError(t, forger.Term(ctx, TermRecord{Node: "evil", Address: "http://10.66.66.66:7878"}))
	forged := forger.Last()
	require.Eventually(t, func() bool { return b.n.Status().Applied == forged }, 5*time.Second, 5*time.Millisecond)

	// a's next append is refused (the subject moved); it steps down and
	// rebuilds, and neither it nor b may take over below the forged term.
	ev := a.replica()
	admit(t, ev, 2, 0, 1)
	a.waitRole(t, RoleStandby, 5*time.Second)
	require.Never(t, func() bool {
		return a.n.Status().Role == RoleLeader || b.n.Status().Role == RoleLeader
	}, 4*time.Second, 20*time.Millisecond, "a replica led below the chain's term")
	now, err := Tail(ctx, s, subject)
	require.NoError(t, err)
	assert.Equal(t, forged, now, "a record was appended after the forged term record")
	assert.Zero(t, b.n.Status().Rebuilds, "the standby threw its state away")
}

// TestNodeDoesNotLeadAPurgedSubject: the whole subject is purged under a
// running group (a JetStream API request by anyone who may make one). No
// replica leads the empty subject as the pool: each has applied records
// the subject no longer has, so each stops with ErrStateLost — loud, never
// an empty pool under a healthy-looking leader.
func TestNodeDoesNotLeadAPurgedSubject(t *testing.T) {
	ctx := t.Context()
	_, s, subject, a, b := startLedGroup(t)
	require.NoError(t, s.Purge(ctx, jetstream.WithPurgeSubject(subject)))
	admit(t, a.replica(), 2, 0, 1) // the leader's next append meets the purge

	for _, tn := range []*testNode{a, b} {
		select {
		case err := <-tn.done:
			require.ErrorIs(t, err, ErrStateLost, "node %s", tn.n.cfg.Node)
			tn.cancel = nil
		case <-time.After(15 * time.Second):
			require.Failf(t, "still running", "node %s did not stop on a purged subject: %+v", tn.n.cfg.Node, tn.n.Status())
		}
	}
	_, err := s.GetLastMsgForSubject(ctx, subject)
	require.ErrorIs(t, err, jetstream.ErrMsgNotFound, "a replica appended to the purged subject")
}

// unreachableStream is a real stream whose reads fail while cut is set, as
// they do for a replica partitioned from NATS.
type unreachableStream struct {
	jetstream.Stream
	cut *atomic.Bool
}

func (s unreachableStream) GetMsg(ctx context.Context, seq uint64, opts ...jetstream.GetMsgOpt) (*jetstream.RawStreamMsg, error) {
	if s.cut.Load() {
		return nil, context.DeadlineExceeded
	}
	return s.Stream.GetMsg(ctx, seq, opts...)
}

func (s unreachableStream) GetLastMsgForSubject(ctx context.Context, subject string) (*jetstream.RawStreamMsg, error) {
	if s.cut.Load() {
		return nil, context.DeadlineExceeded
	}
	return s.Stream.GetLastMsgForSubject(ctx, subject)
}

// TestNodeSaysItStoppedLeadingAtItsDeadline: a leader cut off from NATS
// stops leading at its lease deadline and says so in its status at once —
// not once its rebuild can read the stream again (the red team's F7: a
// partitioned leader reported itself the leader, on every dashboard, for as
// long as the partition lasted). No leader is named until a term record
// names the next one.
func TestNodeSaysItStoppedLeadingAtItsDeadline(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := srv.JetStream(t)
	ls, err := OpenLeases(t.Context(), js, LeaseConfig{TTL: time.Second, Replicas: 1})
	require.NoError(t, err)
	var cut atomic.Bool
	a := startNodeWith(t, srv, ls, "a", nil, 0, func(c *NodeConfig) { c.Stream = unreachableStream{Stream: c.Stream, cut: &cut} })
	a.waitRole(t, RoleLeader, 10*time.Second)
	cut.Store(true)
	a.paused.Store(true) // its renewals stall too
	c := a.waitRole(t, RoleStandby, 3*time.Second)
	assert.Empty(t, c.Leader, "a replica that stopped leading still names a leader")
	assert.Equal(t, RoleStandby, a.n.Status().Role)
	assert.False(t, a.n.Leads())
	// Why is in its status, not only in its log (a full JetStream's
	// refusals looked like nothing on the catalog: red-team HA F6).
	require.Eventually(t, func() bool { return strings.Contains(a.n.Status().LastError, "deadline") }, 3*time.Second, 5*time.Millisecond,
		"last error %q", a.n.Status().LastError)
}

// TestNodeLeaderStepsDownWhenItsLeaseKeyGoes: the lease key is deleted
// under a live leader (a foreign delete; the red team's F0 variant). The
// leader learns it from its watch and stops leading at once — not at its
// next renewal a third of the TTL later, while a standby may already lead.
func TestNodeLeaderStepsDownWhenItsLeaseKeyGoes(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := srv.JetStream(t)
	ls, err := OpenLeases(t.Context(), js, LeaseConfig{TTL: 30 * time.Second, Replicas: 1})
	require.NoError(t, err)
	a := startNode(t, srv, ls, "a")
	a.waitRole(t, RoleLeader, 10*time.Second)
	deleted := time.Now()
	require.NoError(t, ls.kv.Delete(t.Context(), "pool"))
	a.waitRole(t, RoleStandby, 3*time.Second) // renewals come every 10 s
	t.Logf("stepped down %v after the delete", time.Since(deleted))
	// The lease is free then, so the node may lead again at once under a
	// new term (a clean-clone CI run saw it within 30 ms): what tells the
	// step-down came from the watch is its reason.
	require.Eventually(t, func() bool { return strings.Contains(a.n.Status().LastError, "lease key was deleted or expired") },
		3*time.Second, 5*time.Millisecond, "last error %q", a.n.Status().LastError)
}
