package replica

import (
	"context"
	"fmt"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/producer"
)

// Apply applies a batch's commands to h in order, as the leader's actor
// applied them: consecutive events of one source epoch go in one admission
// (each is still applied and checked on its own), replacements and resets
// wait for their result. It returns once everything is queued; a barrier
// ([producer.Handle.ExportState], [producer.Handle.Stats]) waits for the
// application.
//
// Every command applied without a fault on the leader, whose state equalled
// the standby's at the batch's start, so a refusal here — or a fault on the
// standby's fault channel — means the replicas diverged: the caller must
// rebuild the pool (from a checkpoint and the stream), not go on.
func Apply(ctx context.Context, h producer.Handle, cmds []Command) error {
	for i := 0; i < len(cmds); {
		c := &cmds[i]
		var err error
		switch c.Kind {
		case KindAdmitted:
			j := i + 1
			for j < len(cmds) && cmds[j].Kind == KindAdmitted && cmds[j].SourceEpoch == c.SourceEpoch {
				j++
			}
			evs := make([]ckf.RouterEvent, j-i)
			for k := range evs {
				evs[k] = cmds[i+k].Event
			}
			err = h.AdmitEvents(ctx, c.SourceEpoch, evs)
			i = j
			if err != nil {
				return fmt.Errorf("replica: apply events: %w", err)
			}
			continue
		case KindReplaced:
			err = h.ReplaceRanks(ctx, c.Reps)
		case KindReset:
			err = h.ResetRank(ctx, c.SourceEpoch, c.Member, c.Degraded)
		case KindCursor:
			// Journalled by the standby's actor in the same place, so
			// journal positions stay equal; the node keeps the cursors.
			err = h.AdmitEventsAt(ctx, 0, nil, c.Cursor)
		default:
			err = fmt.Errorf("%w: command kind %q", ErrCorrupt, c.Kind)
		}
		if err != nil {
			return fmt.Errorf("replica: apply command %d (%c): %w", i, c.Kind, err)
		}
		i++
	}
	return nil
}
