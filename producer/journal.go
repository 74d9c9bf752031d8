package producer

import (
	"cmp"
	"context"
	"slices"

	"github.com/ckfrelay/ckfrelay/ckf"
)

// Journal receives, in the order the actor applies them, the commands that
// changed the pool's exact state — admitted events that passed their source
// epoch check and applied without a fault (a capacity omission is no fault),
// committed rank replacements and resets — so a store can replay them after
// a crash. Its methods run on the actor goroutine between two commands: they
// must be quick (queue, do not write), and may block only to apply
// back-pressure. The arguments are the actor's: they must not be modified.
// Admitted's ev points into the actor's mailbox, which is reused after the
// call: copy the event (the struct; its Blocks and BlockHashes stay valid
// and unchanged after the call, as do Replaced's reps: the actor never
// changes an admitted event).
type Journal interface {
	Admitted(sourceEpoch uint64, ev *ckf.RouterEvent)
	Replaced(reps []RankReplacement)
	Reset(sourceEpoch uint64, m ckf.Member, degraded bool)
	// Position is the number of commands journalled so far; an
	// [ExactState] records it so that a store replays only what came after.
	Position() uint64
}

// ExactState is a pool's exact state between two commands: each member's
// source epoch and lineage (the relay's filter follows from them), and the
// journal position it includes.
type ExactState struct {
	Members         []MemberState // sorted by (worker_id, dp_rank)
	JournalPosition uint64
}

// MemberState is one member's source epoch and the blocks it holds.
type MemberState struct {
	SourceEpoch uint64
	Lineage     ckf.MemberLineage
}

// Replacements returns the rank replacements that re-create s in a fresh
// actor ([Handle.ReplaceRanks]): one per member, under its source epoch.
func (s ExactState) Replacements() []RankReplacement {
	reps := make([]RankReplacement, len(s.Members))
	for i, m := range s.Members {
		reps[i] = RankReplacement{SourceEpoch: m.SourceEpoch, Member: m.Lineage.Member, Events: m.Lineage.Events()}
	}
	return reps
}

// ExportState returns the pool's exact state, taken on the actor between two
// commands; it costs the actor O(tracked blocks) once.
func (h Handle) ExportState(ctx context.Context) (ExactState, error) {
	r, err := h.a.request(ctx, command{kind: cmdExport}, false)
	if err != nil {
		return ExactState{}, err
	}
	return *r.state, nil
}

// exportState runs on the actor goroutine.
func (a *actor) exportState() *ExactState {
	var st ExactState
	if a.cfg.Journal != nil {
		st.JournalPosition = a.cfg.Journal.Position()
	}
	held := make(map[ckf.Member]bool, len(a.epochs.rec))
	for _, l := range a.pool.ExportLineage() {
		held[l.Member] = true
		e, _ := a.epochs.get(l.Member)
		st.Members = append(st.Members, MemberState{SourceEpoch: e, Lineage: l})
	}
	// Members that hold nothing keep their (not yet pruned) epoch: a stale
	// event stays stale.
	for m, r := range a.epochs.rec {
		if !held[m] {
			st.Members = append(st.Members, MemberState{SourceEpoch: r.epoch, Lineage: ckf.MemberLineage{Member: m}})
		}
	}
	slices.SortFunc(st.Members, func(x, y MemberState) int {
		a, b := x.Lineage.Member, y.Lineage.Member
		return cmp.Or(cmp.Compare(a.WorkerID, b.WorkerID), cmp.Compare(a.DPRank, b.DPRank))
	})
	return &st
}

// Reincarnate makes the actor publish as a new producer incarnation from
// now on: a replicated pool's standby that becomes its group's leader
// (internal/replica) publishes each term as a new incarnation, so consumers
// re-snapshot instead of splicing one leader's sequence onto another's. The
// current subscription ends superseded and the publisher restarts at
// sequence 0; the pool's exact state and words are unchanged (a new
// subscriber's barrier snapshot carries them).
func (h Handle) Reincarnate(ctx context.Context, incarnation uint64) error {
	if h.a == nil {
		return ErrNotStarted
	}
	_, err := h.a.request(ctx, command{kind: cmdReincarnate, epoch: incarnation}, false)
	return err
}

// reincarnate runs Reincarnate on the actor. The unpublished tail is
// dropped: it belongs to the old incarnation, and the new one's first
// subscriber gets a snapshot that covers it.
func (a *actor) reincarnate(incarnation uint64) {
	a.pool.Flush()
	id := *a.identity.Load()
	id.ProducerIncarnation = incarnation
	a.identity.Store(&id)
	a.sink.endCurrent(ErrSuperseded, nil)
	a.pub = NewPublisher(id, 0, &a.sink)
}
