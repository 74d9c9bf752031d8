package e2e

// The link: frames from a subscription cross a wire stream into the consumer
// lane, each with the answer the lane must give.

import (
	"fmt"
	"slices"

	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/client"
	"github.com/ckfrelay/ckfrelay/consumer"
	"github.com/ckfrelay/ckfrelay/producer"
	"github.com/ckfrelay/ckfrelay/wire"
)

// sentFrame is one frame on a link and what the consumer must answer to it.
type sentFrame struct {
	kind     wire.Kind
	sequence uint64 // delta / snapshot sequence, drain expected sequence, heartbeat last sequence
	last     bool   // the final chunk of a snapshot
}

// forward takes the deltas the subscription holds (all of them until the
// stream closes when wait is set, else those already buffered), checks that
// they continue the stream gaplessly, folds them into the mirror and writes
// them to the link.
func (p *pool) forward(sub *producer.Subscription, wait bool) {
	t := p.r.t
	t.Helper()
	for {
		var d ckf.Delta
		var ok bool
		if wait {
			d, ok = <-sub.Deltas()
		} else {
			select {
			case d, ok = <-sub.Deltas():
			default:
				return
			}
		}
		if !ok {
			return
		}
		require.Equal(t, p.h.Identity(), d.Identity, "pool %d: delta identity", p.idx)
		require.Equal(t, p.lease, d.Lease, "pool %d: delta lease", p.idx)
		require.Equal(t, p.lastSeq, d.BaseSequence, "pool %d: delta base sequence", p.idx)
		require.Equal(t, p.lastSeq+1, d.Sequence, "pool %d: delta sequence", p.idx)
		require.NotEmpty(t, d.Images, "pool %d: empty delta %d", p.idx, d.Sequence)
		for _, im := range d.Images {
			p.mirror[im.Bucket] = im.Word
		}
		p.lastSeq = d.Sequence
		f := wire.Frame{Kind: wire.KindDelta, Delta: d}
		require.NoError(t, p.w.WriteFrame(&f), "pool %d: WriteFrame(delta %d)", p.idx, d.Sequence)
		p.queue = append(p.queue, sentFrame{kind: wire.KindDelta, sequence: d.Sequence})
	}
}

// expect is what the consumer must answer to s given the lane's state.
func (p *pool) expect(s sentFrame) consumer.Result {
	switch {
	case s.kind == wire.KindSnapshotChunk && s.last:
		return consumer.Result{Outcome: consumer.SnapshotInstalled, Lane: p.lane, Sequence: s.sequence}
	case s.kind == wire.KindSnapshotChunk:
		return consumer.Result{Outcome: consumer.SnapshotChunkAccepted, Lane: p.lane}
	case p.deactivated:
		return consumer.Result{Outcome: consumer.IgnoredForeignLease, Lane: p.lane}
	}
	gap := map[wire.Kind]consumer.Fault{
		wire.KindDelta:       consumer.BaseSequenceMismatch,
		wire.KindDrainMarker: consumer.TerminalSequenceMismatch,
		wire.KindHeartbeat:   consumer.HeartbeatSequenceMismatch,
	}
	if p.lost {
		return consumer.Result{Outcome: consumer.Deactivated, Fault: gap[s.kind], Lane: p.lane}
	}
	ok := map[wire.Kind]consumer.Outcome{
		wire.KindDelta:       consumer.Applied,
		wire.KindDrainMarker: consumer.DrainAcknowledged,
		wire.KindHeartbeat:   consumer.HeartbeatObserved,
	}
	return consumer.Result{Outcome: ok[s.kind], Lane: p.lane, Sequence: s.sequence}
}

// deliver reads every frame on the link and applies it to the consumer,
// losing the next delta when dropNext is set, and checks each result.
func (p *pool) deliver() {
	t := p.r.t
	t.Helper()
	for len(p.queue) > 0 {
		s := p.queue[0]
		p.queue = p.queue[1:]
		body, err := p.rd.ReadRaw()
		require.NoError(t, err, "pool %d: ReadRaw (%v %d)", p.idx, s.kind, s.sequence)
		if s.kind == wire.KindDelta && p.dropNext {
			p.dropNext, p.lost = false, true
			p.dropped++
			continue
		}
		want := p.expect(s)
		// The frame goes through the router's session gate, as a router
		// applies it: the session ends on these two outcomes.
		got, err := p.sess.Apply(body)
		switch want.Outcome {
		case consumer.Deactivated:
			require.ErrorIs(t, err, client.ErrDeactivated, "pool %d: Apply(%v %d)", p.idx, s.kind, s.sequence)
		case consumer.IgnoredForeignLease:
			require.ErrorIs(t, err, client.ErrLeaseLost, "pool %d: Apply(%v %d)", p.idx, s.kind, s.sequence)
		default:
			require.NoError(t, err, "pool %d: Apply(%v %d)", p.idx, s.kind, s.sequence)
		}
		if want.Outcome == consumer.Deactivated || want.Outcome == consumer.IgnoredForeignLease {
			want.Sequence = got.Sequence // the lane's installed sequence is not the frame's
		}
		require.Equal(t, want, got, "pool %d lane %d: %v frame %d: got %v, want %v", p.idx, p.lane, s.kind, s.sequence, got, want)
		if got.Outcome == consumer.Deactivated {
			p.deactivated = true
			p.faultLog = append(p.faultLog, got)
			st := p.laneStatus()
			require.False(t, st.Ready, "pool %d: lane %d still ready after %v", p.idx, p.lane, got)
			require.False(t, st.Assigned, "pool %d: lane %d still assigned after %v", p.idx, p.lane, got)
		}
	}
	b, err := p.rd.ReadRaw()
	require.Error(t, err, "pool %d: %d unexpected bytes left on the link", p.idx, len(b))
	// ReadRaw's io.EOF is sticky; the link is fully read, so start a new reader.
	p.rd = wire.NewReader(&p.buf, p.rd.MaxFrameBytes())
}

func (p *pool) laneStatus() consumer.LaneStatus {
	p.r.t.Helper()
	st, err := p.r.cons.LaneStatus(p.lane)
	require.NoError(p.r.t, err, "LaneStatus(%d)", p.lane)
	return st
}

func (p *pool) laneWords() []uint64 {
	p.r.t.Helper()
	w, err := p.r.cons.AppendLaneWords(nil, p.lane)
	require.NoError(p.r.t, err, "AppendLaneWords(%d)", p.lane)
	return w
}

// healthy reports whether the lane should hold the producer's table.
func (p *pool) healthy() bool { return !p.lost && !p.deactivated }

// resubscribe takes a new lease: the producer cuts a barrier snapshot (the
// old stream gets its tail and ends superseded), the consumer assigns the
// new epoch and installs the snapshot chunk by chunk over the link.
func (p *pool) resubscribe() {
	t := p.r.t
	t.Helper()
	lease := p.lease
	lease.AssignmentEpoch++
	sub, err := p.h.Subscribe(p.r.ctx, lease)
	require.NoError(t, err, "pool %d: Subscribe(epoch %d)", p.idx, lease.AssignmentEpoch)
	snap := sub.Snapshot
	if old := p.sub; old != nil {
		p.forward(old, true) // closed by the Subscribe above
		require.ErrorIs(t, old.Err(), producer.ErrSuperseded, "pool %d: old stream's end", p.idx)
		p.deliver()
		require.Equal(t, p.lastSeq, snap.Sequence, "pool %d: snapshot at %d, old stream at %d", p.idx, snap.Sequence, p.lastSeq)
		if !slices.Equal(snap.Words, p.mirror) {
			require.Fail(t, fmt.Sprintf("pool %d: snapshot differs from the old stream's table in %s", p.idx, diffWords(snap.Words, p.mirror)))
		}
		if p.healthy() {
			if w := p.laneWords(); !slices.Equal(w, snap.Words) {
				require.Fail(t, fmt.Sprintf("pool %d: lane %d differs from the producer's snapshot in %s", p.idx, p.lane, diffWords(w, snap.Words)))
			}
		}
	}
	require.Equal(t, lease, snap.Lease, "pool %d: snapshot lease", p.idx)
	require.Equal(t, p.h.Identity(), snap.Identity, "pool %d: snapshot identity", p.idx)
	if sw := p.shadow.Words(); !slices.Equal(snap.Words, sw) {
		require.Fail(t, fmt.Sprintf("pool %d: producer snapshot differs from the shadow pool in %s", p.idx, diffWords(snap.Words, sw)))
	}
	p.sub, p.lease = sub, lease
	p.mirror, p.lastSeq = slices.Clone(snap.Words), snap.Sequence

	// A new session: its first chunk assigns the lane under the new lease.
	p.sess = client.NewSession(p.r.lanes, lease)
	if p.lost || p.deactivated {
		p.r.recoveries++
	}
	p.lost, p.deactivated, p.dropNext = false, false, false
	before := p.buf.Len()
	require.NoError(t, p.snapW.WriteSnapshot(&snap), "pool %d: WriteSnapshot", p.idx)
	chunks := (len(snap.Words) + p.r.cfg.ChunkWords - 1) / p.r.cfg.ChunkWords
	require.LessOrEqual(t, p.buf.Len()-before, chunks*(wire.LengthPrefixBytes+p.r.chunkLimit), "pool %d: snapshot took %d bytes, more than %d chunks of ≤ %d", p.idx, p.buf.Len()-before, chunks, p.r.chunkLimit)
	if chunks > 1 {
		p.r.multiChunkSnapshots++
	}
	for i := range chunks {
		p.queue = append(p.queue, sentFrame{kind: wire.KindSnapshotChunk, sequence: snap.Sequence, last: i == chunks-1})
	}
	p.deliver() // any chunk count mismatch fails here: too few never installs, too many leave bytes
	st := p.laneStatus()
	require.True(t, st.Ready, "pool %d: lane ready after install", p.idx)
	require.Equal(t, snap.Sequence, st.InstalledSequence, "pool %d: lane sequence after install", p.idx)
	require.Equal(t, lease, st.Lease, "pool %d: lane lease after install", p.idx)
	if w := p.laneWords(); !slices.Equal(w, snap.Words) {
		require.Fail(t, fmt.Sprintf("pool %d: installed lane differs from the snapshot in %s", p.idx, diffWords(w, snap.Words)))
	}
}

// flush publishes the actor's pending tail.
func (p *pool) flush() {
	require.NoError(p.r.t, p.h.Flush(p.r.ctx), "pool %d: Flush", p.idx)
}

// pump moves what the subscription holds over the link into the consumer.
func (p *pool) pump() {
	p.r.t.Helper()
	if p.r.settle != nil {
		p.r.settle()
	}
	p.forward(p.sub, false)
	p.deliver()
}

func (p *pool) heartbeat(seq uint64) {
	p.r.t.Helper()
	f := wire.Frame{Kind: wire.KindHeartbeat, Heartbeat: wire.Heartbeat{
		Identity: p.h.Identity(), Lease: p.lease, LastSequence: seq, UnixMicros: 1_700_000_000_000_000}}
	require.NoError(p.r.t, p.w.WriteFrame(&f), "pool %d: WriteFrame(heartbeat)", p.idx)
	p.queue = append(p.queue, sentFrame{kind: wire.KindHeartbeat, sequence: seq})
	p.deliver()
}
